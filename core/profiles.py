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
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

from hetplan.errors import EstimatorError, InstanceError
from hetplan.instance import read_structured

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
    """All units' times at one (microbatch, tp); update_s is the whole model's optimizer step."""

    microbatch: int
    tp: int
    units: tuple[UnitTime, ...]
    update_s: float
    overhead_s: float = 0.0  # per-microbatch time outside the units (Metis' fb_sync); informational


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
    source: str = ""  # file or directory it was read from, for error messages

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
            values = [m.update_s, m.overhead_s] + [v for u in m.units for v in (u.fwd_s, u.bwd_s)]
            if any(not math.isfinite(v) or v < 0 for v in values):
                raise InstanceError("times must be finite and >= 0",
                                    f"{where}: microbatch {m.microbatch}, tp {m.tp}")

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

    # -- hetplan format --
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu_type": self.gpu_type, "model": self.model, "source": self.source}
        out["times"] = [
            {"microbatch": m.microbatch, "tp": m.tp, "update_s": m.update_s, "overhead_s": m.overhead_s,
             "fwd_s": [u.fwd_s for u in m.units], "bwd_s": [u.bwd_s for u in m.units]}
            for m in self.times
        ]
        out["memory"] = [_memory_to_dict(m) for m in self.memory]
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
        return cls(gpu_type=gpu_type, times=tuple(times), memory=tuple(memory),
                   model=str(model) if model is not None else None, source=str(data.get("source") or ""))


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
        return cls(tuple(GpuProfile.from_dict(p, f"{where}: profiles[{i}]") for i, p in enumerate(items)))

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "ProfileSet":
        path = Path(path)
        return cls.from_dict(read_structured(path), str(path))


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


def _time_from_dict(data: Any, where: str) -> TimeMeasurement:
    data = _mapping(data, where)
    fwd = _numbers(_get(data, "fwd_s", where, list), f"{where}.fwd_s")
    bwd = _numbers(_get(data, "bwd_s", where, list), f"{where}.bwd_s", len(fwd))
    return TimeMeasurement(
        microbatch=_positive_int(data.get("microbatch"), f"{where}.microbatch"),
        tp=_positive_int(data.get("tp"), f"{where}.tp"),
        units=tuple(UnitTime(f, b) for f, b in zip(fwd, bwd)),
        update_s=_number(data.get("update_s"), f"{where}.update_s"),
        overhead_s=_number(data.get("overhead_s", 0.0), f"{where}.overhead_s"),
    )


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
    return ProfileSet((profiles.get(gpu_type),))
