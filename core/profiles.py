"""Measured profiles: per-layer-unit times (and optionally memory) of one GPU type, and sets of them.

A `GpuProfile` holds, for one GPU type, one `TimeMeasurement` per measured (microbatch, TP degree):
the forward and backward seconds of every layer unit (0 = embedding, 1..L = blocks, L + 1 = head) on
one GPU of a TP group, plus `update_s`, the optimizer step of the *whole* model on that GPU. Memory
measurements (`MemoryMeasurement`) are optional and carry, per unit, the parameters one GPU holds and
the bytes of activations one microbatch keeps alive. A `ProfileSet` holds several GPU types.

The importers (`hetplan.importers.sailor`, `hetplan.importers.metis`) build these from other tools'
files; the native "hetplan" JSON format below round-trips them exactly:

    {"format": "hetplan-profiles", "version": 1,
     "profiles": [{"gpu_type": "A100-40", "model": "OPT-350", "source": "...",
                   "times": [{"microbatch": 1, "tp": 1, "update_s": 0.0029,
                              "fwd_s": [...one per unit...], "bwd_s": [...]}],
                   "memory": [{"microbatch": 1, "tp": 1, "params_per_gpu": [...],
                               "activation_bytes": [...], ...}]}]}

A memory column that is absent (or null) means "not measured". `BandwidthFit` is the other measured
quantity hetplan imports: Sailor's fitted message-size -> bandwidth curve of one link.

Optional keys written by `hetplan profile` (hetplan.runtime.profiler; every one may be absent, files without
them stay valid, the version stays 1):

* times[i].tp_comm_fwd_s / tp_comm_bwd_s: per unit, the seconds of the unit's TP collectives alone
  (already included in fwd_s / bwd_s), measured on the same tensor shapes;
* profiles[i].device: the measured device (`DeviceInfo`): name, kind cpu | cuda, memory_bytes, threads,
  dtype, torch version, achieved_tflops; a profile may so define a new GPU type for an instance;
* profiles[i].optimizer and optimizer_state_bytes_per_param: the optimizer the profile stepped and the
  bytes of state it kept per parameter element after one step (Adam on fp32: 8);
* profiles[i].links: {name: `LinkFit`}, alpha-beta fits of point-to-point and all-reduce times
  between local processes (name "intra_node").

`instances/profile_schema.json` is the JSON Schema of the format (`profile_json_schema()`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, astuple, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

from hetplan.errors import EstimatorError, InstanceError
from hetplan.instance import read_structured

# a layer unit's time per microbatch past which a profile is a typo (a day), not a measurement: 1e300
# printed an inf iteration time with exit 0
MAX_UNIT_S = 86_400.0

FORMAT_NAME = "hetplan-profiles"
FORMAT_VERSION = 1


# ---- per-unit records --------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitTime:
    """Seconds of one layer unit for one microbatch on one GPU of a TP group."""

    fwd_s: float
    bwd_s: float


@dataclass(frozen=True)
class UnitMemory:
    """Memory facts of one layer unit on one GPU of a TP group; None = not measured.

    params_per_gpu: parameter elements this GPU holds (after the TP split).
    params_bytes: bytes of those parameters as stored by the profiler.
    activation_bytes: activations kept for the backward pass, one microbatch of the measurement's size.
    output_bytes: the unit's output tensor for one microbatch (what a pipeline stage sends on).
    total_bytes: measured total footprint of the unit (Metis' per-layer memory).
    """

    params_per_gpu: float | None = None
    params_bytes: float | None = None
    activation_bytes: float | None = None
    output_bytes: float | None = None
    total_bytes: float | None = None


_MEMORY_COLUMNS = tuple(f.name for f in fields(UnitMemory))


@dataclass(frozen=True)
class TimeMeasurement:
    """All units' times at one (microbatch, tp); update_s is the whole model's optimizer step.

    tp_comm: per unit, the time of its TP collectives alone (part of units' times); None = not measured.
    """

    microbatch: int
    tp: int
    units: tuple[UnitTime, ...]
    update_s: float
    overhead_s: float = 0.0  # per-microbatch time outside the units (Metis' fb_sync); informational
    tp_comm: tuple[UnitTime, ...] | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """The device a profile was measured on (written by `hetplan profile`).

    memory_bytes: what one worker may use: GPU memory on CUDA, the machine's RAM on a CPU.
    achieved_tflops: forward FLOP/s the blocks reached at TP 1 and the largest microbatch
    (Megatron's FLOP count, estimators/model_stats.py); None when not measured.
    """

    name: str
    kind: str  # "cpu" | "cuda"
    memory_bytes: float
    threads: int | None = None
    dtype: str | None = None
    torch_version: str | None = None
    achieved_tflops: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "cuda"):
            raise InstanceError(f"device kind must be cpu or cuda, got {self.kind!r}", "device.kind")
        if not math.isfinite(self.memory_bytes) or self.memory_bytes <= 0:
            raise InstanceError(f"must be a finite number > 0, got {self.memory_bytes!r}", "device.memory_bytes")
        if self.achieved_tflops is not None and not (math.isfinite(self.achieved_tflops) and self.achieved_tflops > 0):
            raise InstanceError(f"must be > 0, got {self.achieved_tflops!r}", "device.achieved_tflops")


@dataclass(frozen=True)
class LinkFit:
    """alpha-beta fits of measured transfer times between processes of one machine.

    Point-to-point: t(n) = latency_s + n / (bandwidth_GBps * 1e9) for n bytes.
    All-reduce of n bytes over `processes` members (ring volume 2 (p - 1) / p n):
    t(n) = allreduce_latency_s + 2 (p - 1) / p * n / (allreduce_bandwidth_GBps * 1e9).
    message_bytes, p2p_s, allreduce_s: the measured points (medians) the fits were made from.
    """

    latency_s: float
    bandwidth_GBps: float
    allreduce_latency_s: float | None = None
    allreduce_bandwidth_GBps: float | None = None
    processes: int = 2
    message_bytes: tuple[float, ...] = ()
    p2p_s: tuple[float, ...] = ()
    allreduce_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class MemoryMeasurement:
    microbatch: int
    tp: int
    units: tuple[UnitMemory, ...]


# ---- one GPU type ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuProfile:
    """Every measurement of one GPU type for one model."""

    gpu_type: str
    times: tuple[TimeMeasurement, ...]
    memory: tuple[MemoryMeasurement, ...] = ()
    model: str | None = None
    source: str = field(default="", compare=False)  # file or directory it was read from, for error messages
    device: DeviceInfo | None = None
    optimizer: str | None = None  # "adam" | "sgd": the optimizer update_s and the state figure belong to
    optimizer_state_bytes_per_param: float | None = None
    links: tuple[tuple[str, LinkFit], ...] = ()  # (link name, fit), e.g. ("intra_node", ...)

    def __post_init__(self) -> None:
        where = self.source or f"profile of {self.gpu_type}"
        if not self.times:
            raise InstanceError("no time measurements", where)
        counts = {len(m.units) for m in self.times} | {len(m.units) for m in self.memory}
        if len(counts) != 1:
            raise InstanceError(f"measurements disagree on the number of layer units: {sorted(counts)}", where)
        if next(iter(counts)) < 1:
            raise InstanceError("a measurement has no layer units", where)
        for kind, items in (("times", self.times), ("memory", self.memory)):
            keys = [(m.microbatch, m.tp) for m in items]
            dupes = sorted({k for k in keys if keys.count(k) > 1})
            if dupes:
                raise InstanceError(f"repeated (microbatch, tp) measurements {dupes}", f"{where}: {kind}")
            bad = [k for k in keys if k[0] < 1 or k[1] < 1]
            if bad:
                raise InstanceError(f"microbatch and tp must be >= 1, got {bad}", f"{where}: {kind}")
        for m in self.times:
            comm = m.tp_comm or ()
            values = [m.update_s, m.overhead_s] + [v for u in m.units + comm for v in (u.fwd_s, u.bwd_s)]
            if any(not math.isfinite(v) or not 0 <= v <= MAX_UNIT_S for v in values):
                raise InstanceError(f"times must be finite, >= 0 and at most {MAX_UNIT_S:g} s",
                                    f"{where}: microbatch {m.microbatch}, tp {m.tp}")
            if not any(u.fwd_s + u.bwd_s > 0 for u in m.units):  # rates are work / time downstream
                raise InstanceError("every unit takes 0 s: a measurement needs some time",
                                    f"{where}: microbatch {m.microbatch}, tp {m.tp}")
            if m.tp_comm is not None and len(m.tp_comm) != len(m.units):
                raise InstanceError(f"tp_comm has {len(m.tp_comm)} units, the times {len(m.units)}",
                                    f"{where}: microbatch {m.microbatch}, tp {m.tp}")
        for m in self.memory:
            values = [v for u in m.units for v in astuple(u) if v is not None]
            if any(not math.isfinite(v) or v < 0 for v in values):
                raise InstanceError("memory figures must be finite and >= 0",
                                    f"{where}: memory at microbatch {m.microbatch}, tp {m.tp}")

    # -- lookups --
    @property
    def num_units(self) -> int:
        return len(self.times[0].units)

    @cached_property
    def _times_by_key(self) -> dict[tuple[int, int], TimeMeasurement]:
        return {(m.microbatch, m.tp): m for m in self.times}

    @property
    def tp_degrees(self) -> list[int]:
        return sorted({m.tp for m in self.times})

    def microbatches(self, tp: int) -> list[int]:
        """Measured microbatch sizes at TP degree tp, ascending."""
        return sorted(m.microbatch for m in self.times if m.tp == tp)

    def time(self, microbatch: int, tp: int) -> TimeMeasurement | None:
        return self._times_by_key.get((microbatch, tp))

    def memory_at(self, tp: int, microbatch: int | None = None) -> MemoryMeasurement | None:
        """Memory measured at tp (and microbatch, if given; else the smallest measured one)."""
        found = sorted((m for m in self.memory if m.tp == tp and microbatch in (None, m.microbatch)),
                       key=lambda m: m.microbatch)
        return found[0] if found else None

    # -- derived copies --
    def with_memory(self, memory: Iterable[MemoryMeasurement]) -> "GpuProfile":
        return replace(self, memory=tuple(memory))

    def relabel(self, gpu_type: str) -> "GpuProfile":
        """The same measurements under another GPU type name (e.g. Metis 'A100' -> 'A100-40')."""
        return replace(self, gpu_type=gpu_type)

    def link(self, name: str) -> LinkFit | None:
        return dict(self.links).get(name)

    # -- hetplan format --
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu_type": self.gpu_type, "model": self.model, "source": self.source}
        out["times"] = [_time_to_dict(m) for m in self.times]
        out["memory"] = [_memory_to_dict(m) for m in self.memory]
        # the optional keys only when set, so files of importers and old files look as before
        if self.device is not None:
            out["device"] = {k: v for k, v in asdict(self.device).items() if v is not None}
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer
        if self.optimizer_state_bytes_per_param is not None:
            out["optimizer_state_bytes_per_param"] = self.optimizer_state_bytes_per_param
        if self.links:
            out["links"] = {name: _link_to_dict(fit) for name, fit in self.links}
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> "GpuProfile":
        data = _mapping(data, where)
        gpu_type = _get(data, "gpu_type", where, str)
        times = [_time_from_dict(t, f"{where}.times[{i}]")
                 for i, t in enumerate(_get(data, "times", where, list))]
        memory = [_memory_from_dict(m, f"{where}.memory[{i}]")
                  for i, m in enumerate(data.get("memory") or [])]
        model = data.get("model")
        state = data.get("optimizer_state_bytes_per_param")
        optimizer = data.get("optimizer")
        if optimizer is not None and optimizer not in ("adam", "sgd"):
            raise InstanceError(f"expected adam or sgd, got {optimizer!r}", f"{where}.optimizer")
        links = _mapping(data.get("links") or {}, f"{where}.links")
        return cls(gpu_type=gpu_type, times=tuple(times), memory=tuple(memory),
                   # where it was read from: the file's own "source" is free text (the profiler writes
                   # what it measured), which named no file in error messages
                   model=str(model) if model is not None else None, source=where,
                   device=_device_from_dict(data["device"], f"{where}.device") if data.get("device") else None,
                   optimizer=optimizer,
                   optimizer_state_bytes_per_param=None if state is None else _non_negative(
                       state, f"{where}.optimizer_state_bytes_per_param"),
                   links=tuple((str(k), _link_from_dict(v, f"{where}.links.{k}")) for k, v in links.items()))


# ---- several GPU types ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProfileSet:
    """Profiles of several GPU types (one each); all must describe the same number of units."""

    profiles: tuple[GpuProfile, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [p.gpu_type for p in self.profiles]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InstanceError(f"more than one profile for GPU types {dupes}", "profiles")
        units = {p.gpu_type: p.num_units for p in self.profiles}
        if len(set(units.values())) > 1:
            raise InstanceError(f"profiles disagree on the number of layer units: {units}", "profiles")

    @property
    def gpu_types(self) -> list[str]:
        return sorted(p.gpu_type for p in self.profiles)

    def __contains__(self, gpu_type: object) -> bool:
        return any(p.gpu_type == gpu_type for p in self.profiles)

    def get(self, gpu_type: str) -> GpuProfile:
        for p in self.profiles:
            if p.gpu_type == gpu_type:
                return p
        raise EstimatorError(f"no profile for GPU type {gpu_type!r}; profiles exist for {self.gpu_types}")

    def merged(self, other: "ProfileSet | GpuProfile") -> "ProfileSet":
        extra = other.profiles if isinstance(other, ProfileSet) else (other,)
        return ProfileSet(self.profiles + tuple(extra))

    # -- hetplan format --
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "profiles": [p.to_dict() for p in self.profiles]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "profiles") -> "ProfileSet":
        data = _mapping(data, where)
        fmt = data.get("format", FORMAT_NAME)
        if fmt != FORMAT_NAME:
            raise InstanceError(f"unknown format {fmt!r}, expected {FORMAT_NAME!r}", f"{where}: format")
        version = data.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise InstanceError(f"unsupported version {version!r}, expected {FORMAT_VERSION}", f"{where}: version")
        items = _get(data, "profiles", where, list)
        if not items:
            raise InstanceError("no profile in the list", f"{where}: profiles")
        return cls(tuple(GpuProfile.from_dict(p, f"{where}: profiles[{i}]") for i, p in enumerate(items)))

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    def to_text(self, path: str | Path) -> str:
        """The file content for `path`: JSON for a .json name, else YAML (both read back exactly)."""
        if Path(path).suffix == ".json":
            return json.dumps(self.to_dict(), indent=1) + "\n"
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120)

    @classmethod
    def from_json(cls, path: str | Path) -> "ProfileSet":
        path = Path(path)
        return cls.from_dict(read_structured(path), str(path))


# ---- a profiled device as a GPU type of an instance ------------------------------------------------
# Figures a profile does not measure, for a GPU type it defines (documented assumptions):
DEVICE_DEFAULT_TFLOPS = 1.0  # peak when the profile has no achieved_tflops
DEVICE_DEFAULT_MEMORY_BANDWIDTH_GBps = {"cpu": 20.0, "cuda": 1000.0}  # a DDR4 socket / an HBM GPU, order of magnitude
DEVICE_DEFAULT_INTRA_NODE = {"kind": "other", "bandwidth_GBps": 1.0, "latency_s": 1e-4}  # no link measured


def device_gpu_fields(profile: GpuProfile) -> dict[str, Any]:
    """GpuSpec fields (hetplan.catalog) of the device a profile was measured on, for an instance whose
    node groups use a GPU type that only the profile defines (hetplan.instance fills
    cluster.gpu_overrides with them; the instance's own entries win).

    memory: the device's; peak TFLOP/s (fp16 = bf16 = fp32): the blocks' achieved forward rate with
    default_mfu 1 (the analytic estimator then reproduces the measured block rate), else
    DEVICE_DEFAULT_TFLOPS with mfu 0.5; intra_node: the measured point-to-point fit if any, else
    DEVICE_DEFAULT_INTRA_NODE; memory bandwidth: DEVICE_DEFAULT_MEMORY_BANDWIDTH_GBps.
    """
    device = profile.device
    if device is None:
        raise InstanceError(f"the profile of {profile.gpu_type} has no device section, so it cannot define the "
                            "GPU type; add it under cluster.gpu_overrides", profile.source or profile.gpu_type)
    tflops = device.achieved_tflops or DEVICE_DEFAULT_TFLOPS
    link = profile.link("intra_node")
    intra = ({"kind": "other", "bandwidth_GBps": link.bandwidth_GBps, "latency_s": link.latency_s}
             if link is not None else dict(DEVICE_DEFAULT_INTRA_NODE))
    return {"peak_fp16_tflops": tflops, "peak_bf16_tflops": tflops, "peak_fp32_tflops": tflops,
            "memory_gib": device.memory_bytes / 1024**3,
            "memory_bandwidth_GBps": DEVICE_DEFAULT_MEMORY_BANDWIDTH_GBps[device.kind],
            "default_mfu": 1.0 if device.achieved_tflops else 0.5, "intra_node": intra}


# ---- Sailor's fitted link bandwidth -----------------------------------------------------------------
@dataclass(frozen=True)
class BandwidthFit:
    """Bandwidth of a link as a function of message size (Sailor, seed 000 sec. 4.1 "Cluster profiling":
    measured with NCCL collectives over message sizes, fitted by a polynomial).

    bandwidth_GBps(x) = c0 * x^2 + c1 * x + c2 with x = log2(nbytes / 1e6), capped at max_Bps / 1e9.
    Outside the range the fit was made for, the raw quadratic misbehaves (negative below ~1 MB, falling
    after its vertex when c0 < 0), so two guards keep bandwidth physical: x is raised to at least 0
    (messages under 1 MB get the 1 MB bandwidth, their time is then latency-dominated anyway), and a
    concave fit is held at its maximum beyond the vertex (bandwidth never drops as messages grow).
    """

    c0: float
    c1: float
    c2: float
    max_Bps: float

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in (self.c0, self.c1, self.c2, self.max_Bps)) or self.max_Bps <= 0:
            raise InstanceError(f"bad bandwidth fit {self}: coefficients must be finite and max_Bps > 0")

    def raw_GBps(self, x: float) -> float:
        """The polynomial itself, no guards (what the file describes)."""
        return self.c0 * x * x + self.c1 * x + self.c2

    def bandwidth_Bps(self, nbytes: float) -> float:
        x = math.log2(nbytes / 1e6) if nbytes > 0 else 0.0
        x = max(x, 0.0)
        if self.c0 < 0:
            x = min(x, -self.c1 / (2 * self.c0))
        bw = min(self.raw_GBps(x) * 1e9, self.max_Bps)
        # c2 > 0 in every Sailor file; the floor only protects against a hand-written bad fit.
        return max(bw, 1e-3 * self.max_Bps)

    @property
    def peak_Bps(self) -> float:
        """Highest bandwidth the guarded curve reaches (used where no message size is known)."""
        if self.c0 < 0:
            vertex = max(-self.c1 / (2 * self.c0), 0.0)
            return max(min(self.raw_GBps(vertex) * 1e9, self.max_Bps), 1e-3 * self.max_Bps)
        if self.c0 == 0 and self.c1 <= 0:
            return max(min(self.c2 * 1e9, self.max_Bps), 1e-3 * self.max_Bps)
        return self.max_Bps  # grows without bound: the cap is reached


# ---- parsing helpers (shared with the importers) -------------------------------------------------
def _mapping(data: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InstanceError(f"expected a mapping, got {type(data).__name__}", where)
    return data


def _get(data: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in data:
        raise InstanceError(f"missing key {key!r}", where)
    value = data[key]
    if not isinstance(value, kind):
        raise InstanceError(f"expected {kind.__name__}, got {type(value).__name__}", f"{where}.{key}")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InstanceError(f"expected a finite number, got {value!r}", where)
    return float(value)


def _non_negative(value: Any, where: str) -> float:
    number = _number(value, where)
    if number < 0:
        raise InstanceError(f"expected a number >= 0, got {value!r}", where)
    return number


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InstanceError(f"expected an integer >= 1, got {value!r}", where)
    return value


def _numbers(value: Any, where: str, length: int | None = None) -> list[float]:
    if not isinstance(value, list):
        raise InstanceError(f"expected a list of numbers, got {type(value).__name__}", where)
    if length is not None and len(value) != length:
        raise InstanceError(f"expected {length} values, got {len(value)}", where)
    return [_number(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _time_to_dict(m: TimeMeasurement) -> dict[str, Any]:
    out = {"microbatch": m.microbatch, "tp": m.tp, "update_s": m.update_s, "overhead_s": m.overhead_s,
           "fwd_s": [u.fwd_s for u in m.units], "bwd_s": [u.bwd_s for u in m.units]}
    if m.tp_comm is not None:
        out["tp_comm_fwd_s"] = [u.fwd_s for u in m.tp_comm]
        out["tp_comm_bwd_s"] = [u.bwd_s for u in m.tp_comm]
    return out


def _time_from_dict(data: Any, where: str) -> TimeMeasurement:
    data = _mapping(data, where)
    columns = ["fwd_s", "bwd_s"]
    if data.get("tp_comm_fwd_s") is not None or data.get("tp_comm_bwd_s") is not None:
        columns += ["tp_comm_fwd_s", "tp_comm_bwd_s"]
    values = {c: _numbers(_get(data, c, where, list), f"{where}.{c}") for c in columns}
    if len({len(v) for v in values.values()}) > 1:  # which list is short is not known: say all lengths
        lengths = ", ".join(f"{c} {len(v)}" for c, v in values.items())
        raise InstanceError(f"one value per layer unit in each list, got {lengths}", where)
    fwd, bwd = values["fwd_s"], values["bwd_s"]
    tp_comm = None
    if "tp_comm_fwd_s" in values:
        tp_comm = tuple(UnitTime(f, b) for f, b in zip(values["tp_comm_fwd_s"], values["tp_comm_bwd_s"]))
    return TimeMeasurement(
        microbatch=_positive_int(data.get("microbatch"), f"{where}.microbatch"),
        tp=_positive_int(data.get("tp"), f"{where}.tp"),
        units=tuple(UnitTime(f, b) for f, b in zip(fwd, bwd)),
        update_s=_number(data.get("update_s"), f"{where}.update_s"),
        overhead_s=_number(data.get("overhead_s", 0.0), f"{where}.overhead_s"),
        tp_comm=tp_comm,
    )


def _device_from_dict(data: Any, where: str) -> DeviceInfo:
    data = _mapping(data, where)
    unknown = sorted(set(data) - {f.name for f in fields(DeviceInfo)})
    if unknown:
        raise InstanceError(f"unknown keys {unknown}", where)
    threads = data.get("threads")
    tflops = data.get("achieved_tflops")
    return DeviceInfo(
        name=_get(data, "name", where, str), kind=_get(data, "kind", where, str),
        memory_bytes=_number(data.get("memory_bytes"), f"{where}.memory_bytes"),
        threads=None if threads is None else _positive_int(threads, f"{where}.threads"),
        dtype=None if data.get("dtype") is None else str(data["dtype"]),
        torch_version=None if data.get("torch_version") is None else str(data["torch_version"]),
        achieved_tflops=None if tflops is None else _number(tflops, f"{where}.achieved_tflops"))


def _link_to_dict(fit: LinkFit) -> dict[str, Any]:
    out = asdict(fit)
    for key in ("message_bytes", "p2p_s", "allreduce_s"):
        out[key] = list(out[key])
    return {k: v for k, v in out.items() if v is not None}


def _link_from_dict(data: Any, where: str) -> LinkFit:
    data = _mapping(data, where)

    def optional(key: str) -> float | None:
        return None if data.get(key) is None else _number(data[key], f"{where}.{key}")

    fit = LinkFit(latency_s=_number(data.get("latency_s"), f"{where}.latency_s"),
                  bandwidth_GBps=_number(data.get("bandwidth_GBps"), f"{where}.bandwidth_GBps"),
                  allreduce_latency_s=optional("allreduce_latency_s"),
                  allreduce_bandwidth_GBps=optional("allreduce_bandwidth_GBps"),
                  processes=_positive_int(data.get("processes", 2), f"{where}.processes"),
                  message_bytes=tuple(_numbers(data.get("message_bytes", []), f"{where}.message_bytes")),
                  p2p_s=tuple(_numbers(data.get("p2p_s", []), f"{where}.p2p_s")),
                  allreduce_s=tuple(_numbers(data.get("allreduce_s", []), f"{where}.allreduce_s")))
    if fit.bandwidth_GBps <= 0 or fit.latency_s < 0:
        raise InstanceError("bandwidth_GBps must be > 0 and latency_s >= 0", where)
    # the all-reduce fit too: a bandwidth of 0 or a negative latency was accepted and scored plans
    if (fit.allreduce_bandwidth_GBps is not None and fit.allreduce_bandwidth_GBps <= 0) or (
            fit.allreduce_latency_s is not None and fit.allreduce_latency_s < 0):
        raise InstanceError("allreduce_bandwidth_GBps must be > 0 and allreduce_latency_s >= 0", where)
    return fit


def _memory_to_dict(m: MemoryMeasurement) -> dict[str, Any]:
    out: dict[str, Any] = {"microbatch": m.microbatch, "tp": m.tp}
    for col in _MEMORY_COLUMNS:
        values = [getattr(u, col) for u in m.units]
        if any(v is not None for v in values):
            out[col] = values
    out["num_units"] = len(m.units)
    return out


def _memory_from_dict(data: Any, where: str) -> MemoryMeasurement:
    data = _mapping(data, where)
    n = _positive_int(data.get("num_units"), f"{where}.num_units")
    columns: dict[str, list[float | None]] = {}
    for col in _MEMORY_COLUMNS:
        raw = data.get(col)
        if raw is None:
            columns[col] = [None] * n
            continue
        if not isinstance(raw, list) or len(raw) != n:
            raise InstanceError(f"expected a list of {n} values (or null)", f"{where}.{col}")
        columns[col] = [None if v is None else _number(v, f"{where}.{col}[{i}]") for i, v in enumerate(raw)]
    units = tuple(UnitMemory(**{col: columns[col][i] for col in _MEMORY_COLUMNS}) for i in range(n))
    return MemoryMeasurement(microbatch=_positive_int(data.get("microbatch"), f"{where}.microbatch"),
                             tp=_positive_int(data.get("tp"), f"{where}.tp"), units=units)


def load_hetplan_profile(path: str | Path, gpu_type: str | None = None) -> ProfileSet:
    """Read a hetplan-format file; with gpu_type, keep only that GPU (EstimatorError if absent)."""
    profiles = ProfileSet.from_json(path)
    if gpu_type is None:
        return profiles
    if gpu_type not in profiles:
        raise EstimatorError(f"{path}: no profile for GPU type {gpu_type!r}; the file has {profiles.gpu_types}")
    return ProfileSet((profiles.get(gpu_type),))


# ---- JSON Schema of the format (instances/profile_schema.json) ------------------------------------
def _number_list(description: str, nullable: bool = False) -> dict[str, Any]:
    item: dict[str, Any] = {"type": ["number", "null"]} if nullable else {"type": "number"}
    return {"type": "array", "items": item, "description": description}


def profile_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the hetplan-profiles format; `hetplan profile-schema` writes it."""
    seconds = _number_list("seconds per layer unit (0 = embedding, 1..L = blocks, L + 1 = head)")
    time = {"type": "object", "required": ["microbatch", "tp", "update_s", "fwd_s", "bwd_s"],
            "additionalProperties": False, "properties": {
                "microbatch": {"type": "integer", "minimum": 1}, "tp": {"type": "integer", "minimum": 1},
                "update_s": {"type": "number", "minimum": 0, "description": "optimizer step, whole model"},
                "overhead_s": {"type": "number", "minimum": 0},
                "fwd_s": seconds, "bwd_s": seconds,
                "tp_comm_fwd_s": _number_list("seconds of each unit's TP collectives in its forward"),
                "tp_comm_bwd_s": _number_list("seconds of each unit's TP collectives in its backward")}}
    memory_props: dict[str, Any] = {"microbatch": {"type": "integer", "minimum": 1},
                                    "tp": {"type": "integer", "minimum": 1},
                                    "num_units": {"type": "integer", "minimum": 1}}
    for col in _MEMORY_COLUMNS:
        memory_props[col] = {"oneOf": [_number_list(f"{col} per layer unit", nullable=True), {"type": "null"}]}
    memory = {"type": "object", "required": ["microbatch", "tp", "num_units"], "additionalProperties": False,
              "properties": memory_props}
    device = {"type": "object", "required": ["name", "kind", "memory_bytes"], "additionalProperties": False,
              "properties": {"name": {"type": "string"}, "kind": {"enum": ["cpu", "cuda"]},
                             "memory_bytes": {"type": "number", "exclusiveMinimum": 0},
                             "threads": {"type": "integer", "minimum": 1}, "dtype": {"type": "string"},
                             "torch_version": {"type": "string"},
                             "achieved_tflops": {"type": "number", "exclusiveMinimum": 0}}}
    link = {"type": "object", "required": ["latency_s", "bandwidth_GBps"], "additionalProperties": False,
            "properties": {"latency_s": {"type": "number", "minimum": 0},
                           "bandwidth_GBps": {"type": "number", "exclusiveMinimum": 0},
                           "allreduce_latency_s": {"type": "number", "minimum": 0},
                           "allreduce_bandwidth_GBps": {"type": "number", "exclusiveMinimum": 0},
                           "processes": {"type": "integer", "minimum": 2},
                           "message_bytes": _number_list("message sizes measured, bytes"),
                           "p2p_s": _number_list("point-to-point seconds (median) per message size"),
                           "allreduce_s": _number_list("all-reduce seconds (median) per message size")}}
    profile = {"type": "object", "required": ["gpu_type", "times"], "additionalProperties": False,
               "properties": {"gpu_type": {"type": "string"}, "model": {"type": ["string", "null"]},
                              "source": {"type": ["string", "null"]},
                              "times": {"type": "array", "minItems": 1, "items": time},
                              "memory": {"type": ["array", "null"], "items": memory},
                              "device": device, "optimizer": {"enum": ["adam", "sgd"]},
                              "optimizer_state_bytes_per_param": {"type": "number", "minimum": 0},
                              "links": {"type": "object", "additionalProperties": link}}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "hetplan profiles",
            "type": "object", "required": ["profiles"], "additionalProperties": False,
            "properties": {"format": {"const": FORMAT_NAME}, "version": {"const": FORMAT_VERSION},
                           "profiles": {"type": "array", "items": profile}}}
