"""Instance files: the cluster, the training workload, the objective, constraints and events.

An instance is a YAML or JSON file validated by the pydantic models below; `instances/schema.json`
is their JSON Schema (regenerate it with `hetplan schema -o instances/schema.json`).
Units are in the field names: `_GBps` = 1e9 bytes per second, `_s` = seconds, `_usd` = US dollars.
"""
from __future__ import annotations

import csv
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from hetplan.catalog import GpuSpec, Int, LinkSpec, ModelArch, PositiveInt, gpu_catalog, model_presets
from hetplan.errors import InstanceError, PlanError

# allow_inf_nan=False: an infinite bandwidth or price would be accepted and turn into "cost inf" or a
# zero transfer time downstream; no field of an instance means anything at infinity.
_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class NodeGroup(BaseModel):
    """`count` identical nodes, each with `gpus_per_node` GPUs of one type, in one zone."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    gpu_type: str
    gpus_per_node: Int = Field(gt=0, le=64)
    count: Int = Field(ge=0, description="number of nodes of this kind (its quota)")
    zone: str = Field(min_length=1)
    region: str | None = Field(default=None, description="defaults to the zone without its last '-x' part")
    price_per_gpu_hour_usd: float = Field(ge=0)
    intra_node: LinkSpec | None = Field(default=None, description="defaults to the catalogue's link")

    @property
    def region_name(self) -> str:
        return self.region or region_of(self.zone)


def region_of(zone: str) -> str:
    """Cloud convention: zone 'us-central1-a' lies in region 'us-central1'."""
    head, sep, _ = zone.rpartition("-")
    return head if sep and head else zone


class ZonePairLink(BaseModel):
    """Bandwidth between two specific zones (overrides the inter-zone / inter-region class)."""

    model_config = _STRICT
    zones: tuple[str, str]
    bandwidth_GBps: float = Field(gt=0)
    latency_s: float = Field(ge=0, default=0.0)


class EgressPrice(BaseModel):
    model_config = _STRICT
    zones: tuple[str, str]
    usd_per_GB: float = Field(ge=0)


class Egress(BaseModel):
    """Price per GB leaving a zone (Sailor's C_comm); traffic inside a zone is free."""

    model_config = _STRICT
    inter_zone_usd_per_GB: float = Field(ge=0, default=0.01)
    inter_region_usd_per_GB: float = Field(ge=0, default=0.02)
    pairs: list[EgressPrice] = Field(default_factory=list)


class Channel(BaseModel):
    """One physical channel of a multi-edge link (e.g. NVLink and PCIe between the same GPUs)."""

    model_config = _STRICT
    name: str
    bandwidth_GBps: float = Field(gt=0)
    latency_s: float = Field(ge=0, default=0.0)
    concurrent: bool = Field(default=True, description="may carry traffic while its siblings do")


class MultiEdgeLink(BaseModel):
    """Several channels between two devices, named 'NODE_ID:GPU_INDEX' (or node ids for all GPUs)."""

    model_config = _STRICT
    endpoints: tuple[str, str]
    channels: list[Channel] = Field(min_length=1)


class Network(BaseModel):
    model_config = _STRICT
    inter_node: LinkSpec = LinkSpec(kind="ethernet", bandwidth_GBps=12.5, latency_s=2e-5)
    inter_zone: LinkSpec = LinkSpec(kind="ethernet", bandwidth_GBps=5.0, latency_s=5e-4)
    inter_region: LinkSpec = LinkSpec(kind="wan", bandwidth_GBps=1.0, latency_s=2e-2)
    zone_pairs: list[ZonePairLink] = Field(default_factory=list)
    egress: Egress = Egress()
    multi_edge: list[MultiEdgeLink] = Field(default_factory=list)


class Cluster(BaseModel):
    model_config = _STRICT
    # An empty list is refused by Instance with "no GPUs" (like all counts 0), not by min_length,
    # so both ways of having no GPU get the same message; the schema still says at least one.
    node_groups: list[NodeGroup] = Field(json_schema_extra={"minItems": 1})
    network: Network = Network()
    gpu_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per GPU type, catalogue fields to replace; a new name adds a GPU type "
        "(a type that only a hetplan profile of workload.profiles was measured on is added from its device section)"
    )


class ProfileRef(BaseModel):
    """Measured per-layer times for one GPU type, read by the profile time estimator."""

    model_config = _STRICT
    gpu_type: str
    path: str = Field(description="relative to the instance file")
    format: Literal["sailor", "metis", "hetplan"] = "hetplan"


class ModelRef(BaseModel):
    """A preset name plus optional overrides, or a complete architecture (preset omitted)."""

    model_config = _STRICT
    preset: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    arch: ModelArch | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "ModelRef":
        if (self.preset is None) == (self.arch is None):
            raise ValueError("give exactly one of 'preset' or 'arch'")
        if self.preset is not None and self.preset not in model_presets():
            raise ValueError(f"unknown model preset {self.preset!r}; known: {sorted(model_presets())}")
        return self

    def resolve(self) -> ModelArch:
        if self.arch is not None:
            return self.arch
        base = model_presets()[self.preset]
        return ModelArch(**{**base.model_dump(), **self.overrides})


class Workload(BaseModel):
    model_config = _STRICT
    model: ModelRef
    global_batch_size: Int = Field(gt=0, description="sequences per iteration; never changed by the planner")
    precision: Literal["fp16", "bf16", "fp32"] = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    zero_stage: Literal[0, 1, 2, 3] = 0
    recompute: Literal["none", "selective", "full"] = "none"
    flash_attention: bool = Field(default=False, description="if true, no s^2 attention activations are kept")
    profiles: list[ProfileRef] = Field(default_factory=list)

    @field_validator("model", mode="before")
    @classmethod
    def _preset_shorthand(cls, value: Any) -> Any:
        return {"preset": value} if isinstance(value, str) else value


class Objective(BaseModel):
    model_config = _STRICT
    kind: Literal["max_throughput", "min_cost"] = "max_throughput"


# Limits (budget, throughput floor) are met up to this relative tolerance. The simulator's check
# and the planner both read it, so a plan at a limit up to rounding meets it in both.
LIMIT_REL_TOL = 1e-9


def relaxed_limits(max_cost_usd: float | None, min_iters_per_s: float | None) -> tuple[float | None, float | None]:
    """The budget and the throughput floor as the tolerance lets them be met (None stays None)."""
    return (None if max_cost_usd is None else max_cost_usd * (1 + LIMIT_REL_TOL),
            None if min_iters_per_s is None else min_iters_per_s * (1 - LIMIT_REL_TOL))


class Constraints(BaseModel):
    model_config = _STRICT
    max_cost_per_iteration_usd: float | None = Field(default=None, gt=0)
    min_throughput_iters_per_s: float | None = Field(default=None, gt=0)
    max_gpus: PositiveInt | None = None
    allowed_gpu_types: list[str] | None = None
    allowed_zones: list[str] | None = None

    def allows(self, gpu_type: str, zone: str) -> bool:
        """Whether GPUs of `gpu_type` in `zone` may be used (allowed_gpu_types / allowed_zones; None: any)."""
        return (self.allowed_gpu_types is None or gpu_type in self.allowed_gpu_types) and (
            self.allowed_zones is None or zone in self.allowed_zones)


class AvailabilityEvent(BaseModel):
    model_config = _STRICT
    time_s: float = Field(ge=0)
    zone: str
    gpu_type: str
    available_gpus: Int = Field(ge=0)


class BandwidthEvent(BaseModel):
    """A link class (intra_node, inter_node, inter_zone, inter_region) or a zone pair changes bandwidth."""

    model_config = _STRICT
    time_s: float = Field(ge=0)
    link: Literal["intra_node", "inter_node", "inter_zone", "inter_region", "zone_pair"]
    zones: tuple[str, str] | None = None
    bandwidth_GBps: float = Field(gt=0)

    @model_validator(mode="after")
    def _zones_for_pairs(self) -> "BandwidthEvent":
        if (self.link == "zone_pair") != (self.zones is not None):
            raise ValueError("'zones' is required for link 'zone_pair' and only there")
        return self


class Events(BaseModel):
    model_config = _STRICT
    availability: list[AvailabilityEvent] = Field(default_factory=list)
    bandwidth: list[BandwidthEvent] = Field(default_factory=list)
    trace_csv: str | None = Field(default=None, description="Sailor-format availability trace, relative path")


# A preset names a whole estimator set; a protocol named beside it overrides the preset's choice.
# "sailor": Sailor's validated simulator (SOSP'25 sec. 4.3) on Sailor's own inputs, estimators/sailor.py.
ESTIMATOR_PRESETS: dict[str, dict[str, str]] = {
    "default": {"time": "analytic", "memory": "analytic", "comm": "alpha_beta", "cost": "cloud",
                "iteration": "hetplan"},
    "sailor": {"time": "sailor", "memory": "sailor", "comm": "sailor", "cost": "cloud", "iteration": "sailor"},
}


class EstimatorChoice(BaseModel):
    """Estimator plug-ins by name (see `hetplan.estimators.registry`), with their options; `preset`
    fills the protocols not named, `iteration` picks how the simulator composes them."""

    model_config = _STRICT
    preset: Literal["default", "sailor"] = "default"
    time: str = "analytic"
    memory: str = "analytic"
    comm: str = "alpha_beta"
    cost: str = "cloud"
    iteration: Literal["hetplan", "sailor"] = "hetplan"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") not in ESTIMATOR_PRESETS:
            return data  # the field validator names a bad preset
        return {**ESTIMATOR_PRESETS[data["preset"]], **data}

    @model_validator(mode="after")
    def _sailor_iteration_reads_sailor_figures(self) -> "EstimatorChoice":
        # Sailor's iteration composes what only Sailor's estimators give: its model info (parameters and
        # activations per TP) and its optimizer step per GPU (simulator/sailor.py)
        if self.iteration == "sailor" and (self.time, self.memory) != ("sailor", "sailor"):
            raise ValueError(f"iteration 'sailor' needs time: sailor and memory: sailor (got time: {self.time}, "
                             f"memory: {self.memory}; preset: sailor sets all of them)")
        return self


# ---- checks shared by the validators -------------------------------------------------------------
def _numbers(value: Any, path: str) -> Iterator[tuple[str, float]]:
    """(dotted path, number) of every float or int inside `value` (models, mappings, sequences)."""
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        yield path, value
        return
    if isinstance(value, BaseModel):
        items = [(f"{path}.{k}" if path else k, getattr(value, k)) for k in type(value).model_fields]
    elif isinstance(value, dict):
        items = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return
    for sub_path, sub in items:
        yield from _numbers(sub, sub_path)


def _reject_non_finite(value: Any, path: str) -> None:
    """ValueError naming the first inf or NaN float inside `value`."""
    for where, number in _numbers(value, path):
        if not math.isfinite(number):
            raise ValueError(f"{where}: must be a finite number, got {number}")


# Ranges past which a figure is a typo, not a cluster: 1e308 USD per GPU-hour makes every cost inf,
# 1e-20 GB/s makes the MILP's coefficients too small for HiGHS. Keyed by the end of the field's name.
SANE_RANGES: dict[str, tuple[float, float, str]] = {
    "bandwidth_GBps": (1e-6, 1e6, "GB/s"),
    "latency_s": (0.0, 60.0, "s"),
    "price_per_gpu_hour_usd": (0.0, 1e6, "USD per GPU-hour"),
    "usd_per_GB": (0.0, 1e6, "USD per GB"),
    "memory_gib": (1e-6, 1e6, "GiB"),  # 1e300 GiB overflowed the byte count (an int)
    "tflops": (1e-9, 1e9, "TFLOP/s"),
    "time_s": (0.0, 1e9, "s"),  # 31 years; an event at 1e300 s printed a 300-digit number of hours
    "effective_s": (0.0, 1e9, "s"),
}
MAX_TOTAL_GPUS = 1_000_000  # the planner's tables grow with the GPUs; beyond this it would not answer


def check_sane_ranges(value: Any) -> None:
    """ValueError naming the first figure outside `SANE_RANGES` (a link, a price, a GPU, a time)."""
    for where, number in _numbers(value, ""):
        field = where.rsplit(".", 1)[-1]
        key = next((k for k in SANE_RANGES if field.endswith(k)), None)
        if key is not None and not SANE_RANGES[key][0] <= number <= SANE_RANGES[key][1]:
            lo, hi, unit = SANE_RANGES[key]
            raise ValueError(f"{where}: {number:g} {unit} is outside [{lo:g}, {hi:g}], the range hetplan accepts")


def _check_zone_pairs(pairs: list[tuple[str, str]], zones: set[str], field: str) -> None:
    """Each pair once: the estimators would disagree on which of two entries for a pair wins."""
    seen: dict[frozenset[str], int] = {}
    for i, (a, b) in enumerate(pairs):
        _check_pair(a, b, zones, f"{field}[{i}].zones")
        first = seen.setdefault(frozenset((a, b)), i)
        if first != i:
            raise ValueError(f"{field}[{i}].zones: {a} <-> {b} is already given by {field}[{first}]")


def _check_pair(a: str, b: str, zones: set[str], field: str) -> None:
    """Two different zones of the cluster: inside one zone the inter-node link applies and traffic
    is free, so a pair of one zone would be silently ignored."""
    unknown = sorted({a, b} - zones)
    if unknown:
        raise ValueError(f"{field}: {unknown} not in the cluster (has {sorted(zones)})")
    if a == b:
        raise ValueError(f"{field}: both ends are {a}; a pair joins two different zones")


def _check_endpoint(endpoint: str, gpus: dict[str, int], field: str) -> None:
    """A node id ('<group>-<index>', all its GPUs) or one GPU of it ('<node id>:<GPU index>'). Checked
    at load although only `opsched` reads these links: a typo fails where it is written."""
    node, colon, index = endpoint.rpartition(":")
    ok = node in gpus and index.isdigit() and int(index) < gpus[node] if colon else endpoint in gpus
    if not ok:
        raise ValueError(f"{field}: unknown device or node {endpoint!r} (a node id or 'NODE_ID:GPU_INDEX'; nodes "
                         f"are '<group>-<index>': {', '.join(sorted(gpus)[:4])}{', ...' if len(gpus) > 4 else ''})")


def _get_path(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _unknown_gpu_types(data: dict[str, Any]) -> set[str]:
    """GPU types of the node groups that neither the catalogue nor cluster.gpu_overrides define."""
    groups = _get_path(data, "cluster", "node_groups")
    overrides = _get_path(data, "cluster", "gpu_overrides")
    known = set(gpu_catalog()) | set(overrides if isinstance(overrides, dict) else {})
    types = {g.get("gpu_type") for g in groups if isinstance(g, dict)} if isinstance(groups, list) else set()
    return {t for t in types if isinstance(t, str) and t not in known}


def _profiled_device(ref: dict[str, Any], base_dir: str | None, field: str) -> dict[str, Any]:
    """gpu_overrides fields of the device a hetplan profile file was measured on."""
    from hetplan.errors import HetplanError
    from hetplan.profiles import device_gpu_fields, load_hetplan_profile

    if not isinstance(ref.get("path"), str):
        raise ValueError(f"{field}.path: expected a file path")
    path = Path(base_dir or ".") / ref["path"]
    try:
        return device_gpu_fields(load_hetplan_profile(path, ref["gpu_type"]).profiles[0])
    except HetplanError as exc:
        raise ValueError(f"{field}: GPU type {ref['gpu_type']!r} is defined by no catalogue entry and no "
                         f"gpu_overrides, and its profile cannot define it: {exc}") from None


class Instance(BaseModel):
    model_config = _STRICT
    name: str
    description: str = ""
    cluster: Cluster
    workload: Workload
    objective: Objective = Objective()
    constraints: Constraints = Constraints()
    events: Events = Events()
    estimators: EstimatorChoice = EstimatorChoice()
    # the folder of the instance file, for its relative paths: the loader's, never the file's
    base_dir: SkipJsonSchema[str | None] = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _finite_input(cls, data: Any) -> Any:
        # Before field validation, so that NaN is not reported as "should be >= 0" and the
        # catalogue's models (links, GPU overrides), whose config allows inf, are covered too.
        _reject_non_finite(data, "")
        return data

    @model_validator(mode="before")
    @classmethod
    def _profiled_gpu_types(cls, data: Any) -> Any:
        """A node group's GPU type that is in neither the catalogue nor cluster.gpu_overrides, but that a
        hetplan profile of workload.profiles was measured on, gets its gpu_overrides entry from the
        profile's device section (`hetplan.profiles.device_gpu_fields`)."""
        if not isinstance(data, dict):
            return data
        wanted = _unknown_gpu_types(data)
        refs = _get_path(data, "workload", "profiles")
        if not wanted or not isinstance(refs, list):
            return data
        filled = {}
        for i, ref in enumerate(refs):
            if isinstance(ref, dict) and ref.get("gpu_type") in wanted and ref.get("format", "hetplan") == "hetplan":
                filled[ref["gpu_type"]] = _profiled_device(ref, data.get("base_dir"), f"workload.profiles[{i}]")
        if not filled:
            return data
        cluster = dict(data["cluster"])
        cluster["gpu_overrides"] = {**filled, **(cluster.get("gpu_overrides") or {})}
        return {**data, "cluster": cluster}

    @model_validator(mode="after")
    def _cross_checks(self) -> "Instance":
        _reject_non_finite(self, "")  # a string such as "inf" becomes a float in a catalogue model
        self._check_node_groups()
        check_sane_ranges(self)
        self._check_gpu_types()
        zones = {g.zone for g in self.cluster.node_groups}
        types = {g.gpu_type for g in self.cluster.node_groups}
        self._check_network(zones)
        self._check_constraints(zones, types)
        self._check_events(zones, types)
        self._check_trace()
        self._check_model(types)
        return self

    def _check_node_groups(self) -> None:
        groups = self.cluster.node_groups
        if not groups:
            raise ValueError("cluster.node_groups: no GPUs: the list is empty; give at least one node group")
        if not any(g.count for g in groups):
            raise ValueError(f"cluster.node_groups: no GPUs: every node group has count 0 "
                             f"({', '.join(g.name for g in groups)})")
        total = sum(g.count * g.gpus_per_node for g in groups)
        if total > MAX_TOTAL_GPUS:  # before anything lists the nodes one by one
            raise ValueError(f"cluster.node_groups: {total:,} GPUs in all; hetplan plans clusters of at most "
                             f"{MAX_TOTAL_GPUS:,}")
        first_by_name: dict[str, int] = {}
        region_by_zone: dict[str, tuple[str, int]] = {}
        for i, g in enumerate(groups):
            if g.name in first_by_name:  # node ids are '<group>-<k>': a repeated name repeats them
                raise ValueError(f"cluster.node_groups[{i}].name: {g.name!r} is already the name of "
                                 f"cluster.node_groups[{first_by_name[g.name]}]; names must be unique")
            first_by_name[g.name] = i
            region, first = region_by_zone.setdefault(g.zone, (g.region_name, i))
            if region != g.region_name:  # links and egress are priced by region: one zone, one region
                raise ValueError(f"cluster.node_groups[{i}].region: zone {g.zone} is in region {region} "
                                 f"(cluster.node_groups[{first}]), not {g.region_name}")

    def _check_gpu_types(self) -> None:
        known = set(gpu_catalog()) | set(self.cluster.gpu_overrides)
        for i, group in enumerate(self.cluster.node_groups):
            if group.gpu_type not in known:
                raise ValueError(
                    f"cluster.node_groups[{i}].gpu_type: unknown GPU type {group.gpu_type!r}; "
                    f"known: {sorted(known)} (or define it under cluster.gpu_overrides)"
                )
        for name in self.cluster.gpu_overrides:
            try:
                spec = self._gpu_spec(name)
            except ValidationError as exc:
                raise ValueError(f"cluster.gpu_overrides.{name}: {_first_error(exc)}") from None
            _reject_non_finite(spec, f"cluster.gpu_overrides.{name}")

    def _check_network(self, zones: set[str]) -> None:
        net = self.cluster.network
        # Not egress.pairs: a price table (Sailor's) lists every zone of a provider, in both
        # directions, and prices nothing that is not used.
        _check_zone_pairs([p.zones for p in net.zone_pairs], zones, "cluster.network.zone_pairs")
        gpus = {f"{g.name}-{k}": g.gpus_per_node for g in self.cluster.node_groups for k in range(g.count)}
        for i, link in enumerate(net.multi_edge):
            for end in link.endpoints:
                _check_endpoint(end, gpus, f"cluster.network.multi_edge[{i}].endpoints")

    def _check_constraints(self, zones: set[str], types: set[str]) -> None:
        for field, values, known in (("allowed_gpu_types", self.constraints.allowed_gpu_types, types),
                                     ("allowed_zones", self.constraints.allowed_zones, zones)):
            if values is not None and not values:  # [] would allow nothing: solve then finds no GPU
                raise ValueError(f"constraints.{field}: an empty list allows nothing; leave it out to allow all")
            self._check_subset(values, known, f"constraints.{field}")

    def _check_events(self, zones: set[str], types: set[str]) -> None:
        have = self.gpus_by_type_zone()
        for i, ev in enumerate(self.events.availability):
            field = f"events.availability[{i}]"
            self._check_subset([ev.zone], zones, f"{field}.zone")
            self._check_subset([ev.gpu_type], types, f"{field}.gpu_type")
            count = have.get((ev.gpu_type, ev.zone), 0)
            if ev.available_gpus > count:
                raise ValueError(f"{field}.available_gpus: {ev.available_gpus} GPUs of {ev.gpu_type} in zone "
                                 f"{ev.zone}, but the cluster has {count} there")
        for i, bw in enumerate(self.events.bandwidth):
            if bw.zones is not None:
                _check_pair(*bw.zones, zones, f"events.bandwidth[{i}].zones")

    def _check_trace(self) -> None:
        """The trace is read now, not first by `replay`: a typo in its path or a bad row would
        otherwise pass `validate` and `solve` and only fail hours later."""
        if self.events.trace_csv is None:
            return
        path = self.resolve_path(self.events.trace_csv)
        where = "relative to the instance file" if self.base_dir else "relative to the working directory"
        if not path.exists():
            raise ValueError(f"events.trace_csv: file not found: {path} ({self.events.trace_csv!r} is {where})")
        try:
            events = read_trace_csv(path)
        except InstanceError as exc:
            raise ValueError(f"events.trace_csv: {exc}") from None
        have = self.gpus_by_type_zone()
        unknown = sorted({f"{e.gpu_type}_{e.zone}" for e in events if (e.gpu_type, e.zone) not in have})
        if unknown:
            raise ValueError(f"events.trace_csv: {path}: columns {unknown} are no (GPU type, zone) of the cluster "
                             f"(has {sorted(f'{g}_{z}' for g, z in have)})")

    def _check_model(self, types: set[str]) -> None:
        try:
            arch = self.workload.model.resolve()
        except ValidationError as exc:  # a bad override: name it, not pydantic's multi-line report
            raise ValueError(f"workload.model.overrides: {_first_error(exc)}") from None
        if arch.hidden_size % arch.num_heads:
            raise ValueError("workload.model: hidden_size must be divisible by num_heads")
        if arch.num_heads % arch.kv_heads:  # grouped-query attention: query heads share KV heads evenly
            raise ValueError(f"workload.model: num_heads {arch.num_heads} must be divisible by "
                             f"num_kv_heads {arch.kv_heads}")
        if self.workload.precision == "bf16":
            no_bf16 = sorted(t for t in types if self._gpu_spec(t).peak_bf16_tflops is None)
            if no_bf16:
                raise ValueError(
                    f"workload.precision: bf16 is not supported by {no_bf16}; use fp16 for this cluster"
                )

    @staticmethod
    def _check_subset(values: list[str] | None, known: set[str], field: str) -> None:
        unknown = sorted(set(values or []) - known)
        if unknown:
            raise ValueError(f"{field}: {unknown} not in the cluster (has {sorted(known)})")

    def _gpu_spec(self, gpu_type: str) -> GpuSpec:
        base = gpu_catalog().get(gpu_type)
        fields = {**(base.model_dump() if base else {"name": gpu_type}), **self.cluster.gpu_overrides.get(gpu_type, {})}
        return GpuSpec(**fields)

    def gpus_by_type_zone(self) -> dict[tuple[str, str], int]:
        """(GPU type, zone) -> GPUs of the cluster (every node up)."""
        out: dict[tuple[str, str], int] = {}
        for g in self.cluster.node_groups:
            out[(g.gpu_type, g.zone)] = out.get((g.gpu_type, g.zone), 0) + g.count * g.gpus_per_node
        return out

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "Instance":
        """A copy whose resolved views (nodes, GPU specs, model) are recomputed from its own fields:
        pydantic copies the instance __dict__, where cached properties live."""
        copy = super().model_copy(update=update, deep=deep)
        for name in _CACHED_VIEWS:
            copy.__dict__.pop(name, None)
        return copy

    # ---- resolved views used downstream -------------------------------------------------------
    def gpu(self, gpu_type: str) -> GpuSpec:
        """The catalogue entry of a GPU type with this instance's overrides applied."""
        return self._gpu_specs[gpu_type]

    @cached_property
    def _gpu_specs(self) -> dict[str, GpuSpec]:
        return {g.gpu_type: self._gpu_spec(g.gpu_type) for g in self.cluster.node_groups}

    @cached_property
    def model_arch(self) -> ModelArch:
        return self.workload.model.resolve()

    @cached_property
    def nodes(self) -> tuple["Node", ...]:
        """Every node of the cluster, ids '<group>-<index>' in file order."""
        out = []
        for group in self.cluster.node_groups:
            link = group.intra_node or self.gpu(group.gpu_type).intra_node
            for k in range(group.count):
                out.append(Node(f"{group.name}-{k}", group.name, group.gpu_type, group.gpus_per_node,
                                group.zone, group.region_name, group.price_per_gpu_hour_usd, link))
        return tuple(out)

    @cached_property
    def node_by_id(self) -> dict[str, "Node"]:
        return {n.node_id: n for n in self.nodes}

    @property
    def gpu_types(self) -> list[str]:
        return sorted({g.gpu_type for g in self.cluster.node_groups})

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.cluster.node_groups)

    def resolve_path(self, relative: str) -> Path:
        return Path(self.base_dir or ".") / relative


_CACHED_VIEWS = ("_gpu_specs", "model_arch", "nodes", "node_by_id")


@dataclass(frozen=True)
class Node:
    """One physical node, as expanded from a node group."""

    node_id: str
    group: str
    gpu_type: str
    num_gpus: int
    zone: str
    region: str
    price_per_gpu_hour_usd: float
    intra_node: LinkSpec


# ---- loading ----------------------------------------------------------------------------------
def field_path(loc: tuple) -> str:
    """pydantic's error location as hetplan names fields everywhere else: `node_groups[1].count`
    (its own form, `node_groups.1.count`, beside ours in other messages read as two notations)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_line(err: dict) -> str:
    """One pydantic error as `field: problem`, without pydantic's prefix for a ValueError of ours."""
    loc = field_path(err["loc"])
    msg = _one_line(err["msg"].removeprefix("Value error, "))
    return f"{loc}: {msg}" if loc else msg


def _first_error(exc: ValidationError) -> str:
    return _error_line(exc.errors()[0])


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming the field by its dotted path. A list too short only
    because its items failed (pydantic reports a tuple with a bad item as empty too) is left out:
    the items' own errors say what is wrong."""
    errors = exc.errors()
    inner = [tuple(e["loc"]) for e in errors]
    lines = []
    for err in errors:
        loc_t = tuple(err["loc"])
        if err["type"] == "too_short" and any(len(o) > len(loc_t) and o[:len(loc_t)] == loc_t for o in inner):
            continue
        lines.append(_error_line(err))
    return "; ".join(lines)


@contextmanager
def file_errors(path: Path, error: type[InstanceError] | type[PlanError] = InstanceError) -> Iterator[None]:
    """Every reason a file cannot be read (missing, a directory, no permission, not UTF-8 text)
    becomes one `error` naming the file instead of a traceback."""
    if not path.exists():
        raise error(f"file not found: {path}")
    if path.is_dir():
        raise error("is a directory, not a file", str(path))
    try:
        yield
    except UnicodeDecodeError as exc:
        raise error(f"not a UTF-8 text file (undecodable byte at offset {exc.start}); expected YAML, "
                    f"JSON or CSV text", str(path)) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}", str(path)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last one: a
    second `count:` in a node group would silently replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: keys given beside it override the merged ones, as YAML says
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: the base class names it
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _unique_json_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) < len(pairs):  # the same for JSON (Python's json keeps the last)
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {twice!r} is given twice")
    return out


# A YAML file whose aliases expand past this many values, and past ten per character of its text, is
# refused: each check then walks the expansion (nine levels of nine aliases: 4.9e8 values from 1.1 kB)
MAX_EXPANDED_VALUES = 1_000_000


def _expanded_values(data: Any) -> int:
    """How many values `data` holds once every alias is written out: each list or mapping counted
    once by identity (an alias is the same object), so it takes the time of the file, not of its
    expansion. ValueError where an alias sits inside what it names (it would expand forever)."""
    sizes: dict[int, int | None] = {}  # None: being counted

    def size(value: Any) -> int:
        if not isinstance(value, (list, dict)):
            return 1
        if id(value) not in sizes:
            sizes[id(value)] = None
            items = value.values() if isinstance(value, dict) else value
            sizes[id(value)] = 1 + sum(size(v) for v in items)
        if sizes[id(value)] is None:
            raise ValueError("an alias sits inside the list or mapping it names")
        return sizes[id(value)]
    return size(data)


def read_structured(path: Path, error: type[InstanceError] | type[PlanError] = InstanceError) -> Any:
    """Parse a YAML or JSON file; syntax errors (with their position), keys given twice and
    unreadable files become one `error` naming the file."""
    with file_errors(path, error):
        text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_json_keys)
        data = yaml.load(text, Loader=_UniqueKeyLoader)
        if (values := _expanded_values(data)) > MAX_EXPANDED_VALUES and values > 10 * len(text):
            raise error(f"YAML aliases expand this file to {values:.3g} values (from {len(text):,} characters); "
                        f"write them out, or repeat them less", str(path))
        return data
    except json.JSONDecodeError as exc:
        raise error(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"invalid YAML{where}: {_one_line(problem)}", str(path)) from None
    except (ValueError, RecursionError) as exc:  # YAML timestamps such as 2024-13-40; nesting too deep
        raise error(f"invalid {'JSON' if path.suffix == '.json' else 'YAML'}: {_one_line(str(exc))}",
                    str(path)) from None


def read_trace_csv(path: Path, changes_only: bool = False) -> list[AvailabilityEvent]:
    """A Sailor availability trace (`importers.sailor.read_availability_trace`); a file that cannot
    be read or parsed (missing, not text, bad header, bad row) is one InstanceError naming it."""
    from hetplan.importers.sailor import read_availability_trace  # it imports this module

    with file_errors(path):
        try:
            return read_availability_trace(path, changes_only=changes_only)
        except csv.Error as exc:  # e.g. a NUL byte
            raise InstanceError(f"malformed CSV: {exc}", str(path)) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def kind_of(data: Any) -> str:
    """How a parsed file that should be a mapping looks instead, for error messages."""
    return "an empty file" if data is None else f"a {type(data).__name__}"


_INSTANCE_KEYS = "an instance must be a mapping with keys name, cluster, workload, ..."


def instance_from_dict(data: Any, base_dir: str | None = None) -> Instance:
    if not isinstance(data, dict):
        raise InstanceError(f"{_INSTANCE_KEYS}; got {kind_of(data)}")
    if "base_dir" in data:
        raise InstanceError("base_dir: not a field of instance files (relative paths are read from the file's "
                            "folder); remove it")
    try:
        return Instance(**data, base_dir=base_dir)
    except ValidationError as exc:
        raise InstanceError(format_validation_error(exc)) from None
    except TypeError as exc:  # e.g. a duplicated keyword
        raise InstanceError(str(exc)) from None


def load_instance(path: str | Path) -> Instance:
    """Load and validate an instance file; a bundled instance may be named without its path."""
    path = Path(path)
    if not path.exists():
        from hetplan.bundled import bundled_instance_path

        path = bundled_instance_path(str(path))
    data = read_structured(path)
    if not isinstance(data, dict):
        raise InstanceError(f"{_INSTANCE_KEYS}; got {kind_of(data)}", str(path))
    return instance_from_dict(data, base_dir=str(path.parent.resolve()))


def instance_json_schema() -> dict[str, Any]:
    schema = Instance.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hetplan instance"
    return schema
