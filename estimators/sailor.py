"""Sailor-fidelity estimators (preset "sailor"): Sailor's validated simulator on Sailor's own inputs.

Sailor (SOSP'25, seed 000, sec. 4.3) scores a plan with `Planner/simulations/runtime_simulator.py`
and `profiling/profile_utils.py` (eth-easl/sailor at cf2c8e3, ../shared/reference/sailor/src). These
plug-ins state its per-layer, per-worker and per-link figures; simulator/sailor.py composes them
into an iteration the way that simulator does. Inputs: Sailor's profile.json per GPU type (workload
profiles, format sailor), its llm_info.json and its zone bandwidth table (options below).

* time "sailor": a layer's fwd / bwd seconds are the profile's entry at exactly (microbatch, TP); a
  pair the profile lacks is an error (Sailor raises KeyError, or silently counts 0 s when only the TP
  is missing). The optimizer step is the profile's update entry at (microbatch, TP): the whole
  model's step, taken as is for every stage (`update_at_s`).
* memory "sailor" (`get_memory_footprint_on_gpu`): per GPU, params(tp) x (8 Adam state, 4 with SGD
  + 4 fp32 model + 4 gradients + 4 communication buffer + 4 DeepSpeed copy) + act_mem(tp) x microbatch
  x float bytes x in-flight microbatches + 4.76e9 (kernels) + 300e6. Feasibility (`check_config_fits`)
  counts the same parameters and activations with 2e9 (TP 1) or 3e9 (TP > 1) instead of 5.06e9:
  `MemoryBreakdown.fit_bytes`. params and act_mem are llm_info's element counts per GPU at that TP.
* comm "sailor": bandwidth_GBps(x) = c0 x^2 + c1 x + c2, x = log2(bytes / 1e6), straight from the
  zone table at (src zone, src GPU, src GPUs, dst zone, dst GPU, dst GPUs), no cap and no latency
  (`get_time_on_config`); a pair is always read from the zone table, on one node too.
  - p2p(a, b, n) = n / 1e9 / bw(n), GPUs per endpoint = its TP group (`Endpoint.gpus`; Sailor takes
    min(tp, gpus_per_node), and its plans have gpus_per_node = tp).
  - all-reduce of n bytes over D members: DeepSpeed buckets of 5e8 bytes, each 2 (D - 1) x
    n_bucket / D / bw(n_bucket / D) (`estimate_ar_time`), read for each neighbour pair (j, j+1) of
    the members' order at one GPU per endpoint; the slowest pair's total counts (`estimate_sync_time`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

from hetplan.catalog import LinkSpec
from hetplan.errors import EstimatorError
from hetplan.estimators.base import Endpoint, LayerTime, MemoryBreakdown, NodeKind, bottleneck_floor_s, least_nodes
from hetplan.estimators.model_stats import DTYPE_BYTES
from hetplan.estimators.profile_time import ProfileTimeEstimator, own_options
from hetplan.estimators.sailor_network import ZoneKey
from hetplan.profiles import BandwidthFit, UnitMemory

# runtime_simulator.get_memory_footprint_on_gpu / check_config_fits (cf2c8e3): bytes per parameter
# element and the framework overheads.
ADAM_BYTES_PER_PARAM = 8 + 4 + 4 + 4 + 4  # Adam state, fp32 model, gradients, comm buffer, DeepSpeed copy
SGD_BYTES_PER_PARAM = 4 + 4 + 4 + 4 + 4
FOOTPRINT_OVERHEAD_BYTES = 4.76e9 + 300e6
FIT_OVERHEAD_BYTES = {True: 2.0e9, False: 3.0e9}  # keyed by tp == 1
DEEPSPEED_BUCKET_BYTES = 5e8  # sailor_planner/constants.py MEMORY_BUCKET_DEEPSPEED_SIZE
P2P_GRADIENT_RULES = ("first_output", "input")


# ---- llm_info: element counts per unit and TP --------------------------------------------------------
LLM_INFO_BYTES_PER_FLOAT = 4  # llm_info's *_bytes are its *_floats x 4 (../shared/reference/sailor/README.md)


@dataclass(frozen=True)
class SailorModelInfo:
    """llm_info.json of one model ({tp: units}, as `importers.sailor.read_llm_info` reads it) and the
    float size of the run. Sailor's simulator multiplies llm_info's element counts by the float size.

    p2p_gradient: which size Sailor's p2p rule gives the gradient a stage sends back.
    "first_output" (Sailor's code): the output of the stage's first unit; when a stage holds the head
    alone this is the logits (vocab x seq floats). "input": the stage's input, i.e. the previous
    unit's output (what a pipeline really sends back; a correction, off by default).
    """

    units_by_tp: Mapping[int, tuple[UnitMemory, ...]]
    float_bytes: int
    p2p_gradient: str = "first_output"

    def counts(self, tp: int) -> tuple[UnitMemory, ...]:
        if tp not in self.units_by_tp:
            raise EstimatorError(f"sailor: llm_info has no TP degree {tp}; it has {sorted(self.units_by_tp)}")
        return self.units_by_tp[tp]

    def params(self, tp: int, units: range) -> float:
        """Parameter elements per GPU of `units` at TP degree tp."""
        counts = self.counts(tp)
        return sum(counts[u].params_per_gpu for u in units)

    def act_mem_floats(self, tp: int, units: range) -> float:
        """Activation elements `units` keep for backward, microbatch 1, at TP degree tp."""
        counts = self.counts(tp)
        return sum(counts[u].activation_bytes for u in units) / LLM_INFO_BYTES_PER_FLOAT

    def param_bytes(self, units: range) -> float:
        """Full (TP 1) parameter bytes of `units`: what Sailor all-reduces and prices."""
        return self.params(1, units) * self.float_bytes

    def output_bytes(self, unit: int, microbatch: int) -> float:
        return self.counts(1)[unit].output_bytes / LLM_INFO_BYTES_PER_FLOAT * self.float_bytes * microbatch

    def gradient_bytes(self, first_unit: int, microbatch: int) -> float:
        """Bytes a stage starting at `first_unit` sends back (see p2p_gradient)."""
        unit = first_unit if self.p2p_gradient == "first_output" else max(first_unit - 1, 0)
        return self.output_bytes(unit, microbatch)


def _required(opts: Mapping[str, Any], key: str, what: str) -> Any:
    if not opts.get(key):
        raise EstimatorError(f"sailor: option {key!r} ({what}) is required; `hetplan import sailor` writes it")
    return opts[key]


def model_info_from_instance(instance: Any, options: Mapping[str, Any] | None) -> SailorModelInfo:
    opts = own_options(options, "sailor")
    rule = opts.get("p2p_gradient", "first_output")
    if rule not in P2P_GRADIENT_RULES:
        raise EstimatorError(f"sailor: option p2p_gradient must be one of {P2P_GRADIENT_RULES}, got {rule!r}")
    from hetplan.importers.sailor import read_llm_info

    measured = read_llm_info(instance.resolve_path(_required(opts, "llm_info", "Sailor's llm_info.json")),
                             _required(opts, "sailor_model", "the model's name in llm_info, e.g. OPT-350"))
    units = instance.model_arch.num_units
    for m in measured:
        if len(m.units) != units:
            raise EstimatorError(f"sailor: llm_info has {len(m.units)} layer units at TP {m.tp}, the model {units}")
    return SailorModelInfo({m.tp: m.units for m in measured}, DTYPE_BYTES[instance.workload.precision], rule)


# ---- time ----------------------------------------------------------------------------------------------
class SailorTime(ProfileTimeEstimator):
    """TimeEstimator "sailor": profile entries at exactly (microbatch, TP), see the module docstring."""

    name = "sailor"

    def _estimate(self, profile, unit: int, b: int, tp: int) -> LayerTime:
        measured = profile.time(b, tp)
        if measured is None:
            raise EstimatorError(f"sailor: the profile of {profile.gpu_type} has no entry at microbatch {b}, TP {tp} "
                                 f"(measured microbatches at TP {tp}: {profile.microbatches(tp)}); Sailor's "
                                 f"simulator cannot score it either")
        u = measured.units[unit]
        return LayerTime(u.fwd_s, u.bwd_s)

    def covers(self, gpu_type: str, microbatch: int, tp: int) -> bool:
        """Whether the profile has the entry (microbatch, TP): the planner leaves the others out, as
        Sailor's planner only tries profiled microbatch sizes and TP degrees."""
        return gpu_type in self.profiles and self.profiles.get(gpu_type).time(microbatch, tp) is not None

    def update_at_s(self, gpu_type: str, microbatch: int, tp: int) -> float:
        """The profile's whole-model optimizer step at (microbatch, TP), as Sailor takes it per stage."""
        measured = self._profile(gpu_type, tp).time(microbatch, tp)
        if measured is None:
            raise EstimatorError(f"sailor: the profile of {gpu_type} has no entry at microbatch {microbatch}, TP {tp}")
        return measured.update_s


# ---- memory --------------------------------------------------------------------------------------------
class SailorMemory:
    """MemoryEstimator "sailor" (module docstring); `info` holds llm_info for the iteration model."""

    name = "sailor"
    OPTIONS: tuple[str, ...] = ("p2p_gradient", "llm_info", "sailor_model")  # the estimators.options keys it reads

    def __init__(self, info: SailorModelInfo, capacity_bytes: Mapping[str, float], optimizer: str = "adam"):
        self.info = info
        self.capacity_bytes = dict(capacity_bytes)
        self.bytes_per_param = ADAM_BYTES_PER_PARAM if optimizer == "adam" else SGD_BYTES_PER_PARAM

    @classmethod
    def from_instance(cls, instance: Any, options: Mapping[str, Any] | None = None) -> "SailorMemory":
        return cls(model_info_from_instance(instance, options),
                   {g: instance.gpu(g).memory_bytes for g in instance.gpu_types}, instance.workload.optimizer)

    def worker_memory(self, gpu_type: str, units: range, tp: int, microbatch: int, dp: int,
                      in_flight: int) -> MemoryBreakdown:
        params = self.info.params(tp, units)
        activations = self.info.act_mem_floats(tp, units) * microbatch * self.info.float_bytes * in_flight
        model = self.bytes_per_param * params
        if gpu_type not in self.capacity_bytes:
            raise EstimatorError(f"sailor: no memory capacity for GPU type {gpu_type!r}")
        # fp32 model + DeepSpeed copy, gradients + comm buffer, optimizer state: the rest
        return MemoryBreakdown(params_bytes=8 * params, grads_bytes=8 * params,
                               optimizer_bytes=(self.bytes_per_param - 16) * params,
                               activations_bytes=activations, overhead_bytes=FOOTPRINT_OVERHEAD_BYTES,
                               capacity_bytes=self.capacity_bytes[gpu_type],
                               fit_bytes=model + activations + FIT_OVERHEAD_BYTES[tp == 1])


# ---- communication -------------------------------------------------------------------------------------
def sailor_time_s(nbytes: float, fit: BandwidthFit) -> float:
    """`get_time_on_config`: nbytes / 1e9 / raw polynomial at x = log2(nbytes / 1e6); 0 for no bytes."""
    if nbytes <= 0:
        return 0.0
    bw_GBps = fit.raw_GBps(math.log2(nbytes / 1e6))
    if bw_GBps <= 0:
        raise EstimatorError(f"sailor: the bandwidth fit {fit} gives {bw_GBps:.3g} GB/s at {nbytes:.3g} bytes")
    return nbytes / 1e9 / bw_GBps


def bucketed_allreduce_s(nbytes: float, members: int, fit: BandwidthFit,
                         bucket_bytes: float = DEEPSPEED_BUCKET_BYTES) -> float:
    """`get_ar_time_with_buckets` over `estimate_ar_time`: full buckets, then the rest."""
    if members <= 1 or nbytes <= 0:
        return 0.0
    full, rest = divmod(nbytes, bucket_bytes)
    per_bucket = _full_bucket_s(members, fit, bucket_bytes)
    last = 2 * (members - 1) * sailor_time_s(rest / members, fit) if rest > 0 else 0.0
    return full * per_bucket + last


@functools.lru_cache(maxsize=4096)
def _full_bucket_s(members: int, fit: BandwidthFit, bucket_bytes: float) -> float:
    """One full bucket's all-reduce: the same for every size (the planner's all-reduce floors ask
    ~10^5 sizes of a few fits and member counts)."""
    return 2 * (members - 1) * sailor_time_s(bucket_bytes / members, fit)


class SailorComm:
    """CommEstimator "sailor" (module docstring)."""

    name = "sailor"
    OPTIONS: tuple[str, ...] = ("bandwidth_file", "bucket_bytes")  # the estimators.options keys it reads

    def __init__(self, zone_fits: Mapping[ZoneKey, BandwidthFit], nodes: Mapping[str, str],
                 bucket_bytes: float = DEEPSPEED_BUCKET_BYTES):
        self.zone_fits = dict(zone_fits)  # read raw (BandwidthFit.raw_GBps), as Sailor does
        self.nodes = dict(nodes)  # node id -> GPU type
        self.bucket_bytes = bucket_bytes

    @classmethod
    def from_instance(cls, instance: Any, options: Mapping[str, Any] | None = None) -> "SailorComm":
        from hetplan.importers.sailor import read_zone_bandwidths, zone_table_gap

        opts = own_options(options, cls.name)
        path = instance.resolve_path(_required(opts, "bandwidth_file", "Sailor's multizone_bandwidths_het.json"))
        fits = read_zone_bandwidths(path)
        if why := zone_table_gap(fits, {(n.gpu_type, n.zone) for n in instance.nodes}, path):
            raise EstimatorError(f"sailor: {why}")  # else the planner silently keeps such GPUs to one node
        return cls(fits, {n.node_id: n.gpu_type for n in instance.nodes},
                   float(opts.get("bucket_bytes", DEEPSPEED_BUCKET_BYTES)))

    def _key(self, a: Endpoint, b: Endpoint, count_a: int = 1, count_b: int = 1) -> ZoneKey:
        """The zone table's key for a -> b (it may lack it)."""
        return (a.zone, self._gpu(a), count_a, b.zone, self._gpu(b), count_b)

    def _entry(self, a: Endpoint, b: Endpoint, count_a: int, count_b: int) -> ZoneKey:
        """The zone table's key for a -> b; an error when the table lacks it."""
        key = self._key(a, b, count_a, count_b)
        if key not in self.zone_fits:
            raise EstimatorError(f"sailor: the zone bandwidth table has no entry (src zone, GPU, GPUs, dst zone, "
                                 f"GPU, GPUs) = {key}")
        return key

    def _gpu(self, e: Endpoint) -> str:
        """The GPU type of the node `e` sits on; an error when it is not a node of the instance."""
        if e.node_id not in self.nodes:
            raise EstimatorError(f"sailor: endpoint {e} is not on a node of the instance")
        return self.nodes[e.node_id]

    def fit(self, a: Endpoint, b: Endpoint, count_a: int = 1, count_b: int = 1) -> BandwidthFit:
        return self.zone_fits[self._entry(a, b, count_a, count_b)]

    def link(self, a: Endpoint, b: Endpoint) -> LinkSpec:
        peak = self.fit(a, b, a.gpus or 1, b.gpus or 1).max_Bps
        return LinkSpec(kind="ethernet" if a.region == b.region else "wan", bandwidth_GBps=peak / 1e9, latency_s=0.0)

    def p2p_time_s(self, a: Endpoint, b: Endpoint, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return sailor_time_s(nbytes, self.fit(a, b, a.gpus or 1, b.gpus or 1))

    def allreduce_floor_s(self, nodes: list[tuple[Endpoint, int]], members: int, sizes: list[float],
                          spans: str = "node", min_nodes: int = 1) -> list[float]:
        """A lower bound on `allreduce_time_s` of each size over every list of `members` endpoints drawn
        from `nodes` (endpoint, most members it holds) that spans as `spans` says (estimators.base.SPANS).
        The time is the slowest neighbour pair (j, j + 1), so `bottleneck_floor_s` bounds it from the
        pairs of node kinds (zone, region, GPU type: alike here), each at the faster of its two
        directions; a pair the zone table lacks cannot be simulated, so no plan has it."""
        if members <= 1:
            return [0.0] * len(sizes)
        if least_nodes([slots for _, slots in nodes], members) is None:
            return [math.inf] * len(sizes)
        kinds: dict = {}  # nodes alike (zone, region, GPU type) give the same keys: one pair per kind pair
        for e, slots in nodes:
            kind = kinds.setdefault(self._kind(e), [e, 0, 0, 0])
            kind[1], kind[2], kind[3] = kind[1] + 1, max(kind[2], slots), kind[3] + slots
        rows = list(kinds.values())
        pairs = {}  # (i, j) -> the zone table's keys of its two directions
        for i, (a, count, most, _) in enumerate(rows):
            for j in range(i, len(rows)):
                b = rows[j][0]
                if (i == j and count < 2 and most < 2) or (spans == "node" and a.zone != b.zone):
                    continue
                keys = [k for k in {self._key(a, b), self._key(b, a)} if k in self.zone_fits]
                if keys:
                    pairs[i, j] = keys
        groups = [NodeKind(e.zone, e.region, total) for e, _, _, total in rows]
        return [bottleneck_floor_s(groups, members, spans, {ij: self._least_allreduce_s(n, members, keys)
                                                            for ij, keys in pairs.items()}) for n in sizes]

    def repeat_floor_s(self, nodes: list[tuple[Endpoint, int]], like: Endpoint, members: int,
                       sizes: list[float]) -> list[float]:
        """A lower bound on `allreduce_time_s` of each size over every list of `members` endpoints
        drawn from `nodes` in which two or more sit on nodes alike `like` (zone, region, GPU type:
        kind g). Two of them are side by side (a pair g -> g) or apart, and then the first is
        followed by another kind (g -> h) and the next preceded by one (h' -> g): the slowest pair
        is at least min(t(g, g), max(least t(g, h), least t(h', g))). Measured (Sailor's A100s in
        us-central1-a and -b, 32 replicas each, 64 members): the Kruskal floor reads b -> a, 0.3873 s;
        every order takes 0.3978 s or more, and this bound is 0.3978 s."""
        if members <= 1:
            return [0.0] * len(sizes)
        g = self._kind(like)
        kinds = {self._kind(e): e for e, _ in nodes}
        ends = kinds.pop(g, like)
        present = lambda keys: [k for k in keys if k in self.zone_fits]  # noqa: E731
        own = present([self._key(ends, ends)])
        out_of = present([self._key(ends, e) for e in kinds.values()])
        into = present([self._key(e, ends) for e in kinds.values()])

        def least(keys: list[ZoneKey], n: float) -> float:
            return self._least_allreduce_s(n, members, keys) if keys else math.inf
        if members == 2:  # two of g are the whole list: side by side
            return [least(own, n) for n in sizes]
        return [min(least(own, n), max(least(out_of, n), least(into, n))) for n in sizes]

    def _kind(self, e: Endpoint) -> tuple[str, str, str]:
        """Nodes alike for the zone table (zone, region, GPU type): their pairs read the same fits."""
        return (e.zone, e.region, self._gpu(e))

    def _least_allreduce_s(self, nbytes: float, members: int, fits) -> float:
        try:
            return min(bucketed_allreduce_s(nbytes, members, self.zone_fits[k], self.bucket_bytes) for k in fits)
        except EstimatorError:  # some fit gives no bandwidth at a bucket's size (the rest of a few bytes)
            return 0.0  # no floor: a valid one, and such a plan cannot be simulated anyway

    def pair_allreduce_s(self, a: Endpoint, b: Endpoint, nbytes: float, members: int) -> float:
        """The all-reduce of `members` endpoints when a -> b is its slowest neighbour pair."""
        return bucketed_allreduce_s(nbytes, members, self.fit(a, b), self.bucket_bytes)

    def allreduce_time_s(self, members: list[Endpoint], nbytes: float) -> float:
        d = len(members)
        if d <= 1 or nbytes <= 0:
            return 0.0
        return max(self.pair_allreduce_s(members[j], members[j + 1], nbytes, d) for j in range(d - 1))
