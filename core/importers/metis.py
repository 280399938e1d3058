"""Read Metis (USENIX ATC'24, "Metis: Fast Automatic Distributed Training on Heterogeneous GPUs";
github.com/SamsungLabs/Metis) per-layer profiles into a hetplan ProfileSet.

Metis writes one JSON file per (device type, TP degree, microbatch size), named
`DeviceType.<gpu>_tp<k>_bs<b>.json` (<gpu> is a word without '_' separators such as `A100`):

    model.model_name, model.num_layers                 number of layer units (embedding + blocks + head)
    model.parameters.parameters_per_layer_bytes[u]     parameter bytes of unit u, whole model (no TP split)
    execution_time.layer_compute_total_ms[u]           forward + backward of unit u, one microbatch, ms
    execution_time.optimizer_time_ms                   optimizer step on one GPU at this TP degree, ms
    execution_time.forward_backward_time_ms            whole fwd+bwd, ms (the rest over the units is
                                                       Metis' "fb_sync"; kept as overhead_s)
    execution_memory.layer_memory_total_mb[u]          memory of unit u on one GPU, MiB

Conversions (choices made here, documented because Metis' files do not carry them):
* Metis measures forward and backward together; they are split with `fwd_fraction` (default 1/3,
  i.e. backward = 2 x forward, the usual FLOP ratio of a transformer layer without recomputation).
* parameters per GPU = parameters_per_layer_bytes / tp, as Metis' own cost model divides them.
* optimizer_time_ms is taken as measured (Metis' loader doubles it; we do not).
* Optional memory lists whose length differs from num_layers (Metis' own samples have such files)
  are dropped with a warning rather than guessed at.
"""
from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any, Mapping

from hetplan.errors import InstanceError
from hetplan.instance import read_structured
from hetplan.profiles import GpuProfile, MemoryMeasurement, ProfileSet, TimeMeasurement, UnitMemory, UnitTime

DEFAULT_FWD_FRACTION = 1.0 / 3.0
MIB = 1024**2
_FILE_NAME = re.compile(r"^DeviceType\.(?P<gpu>\w+?)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json$")


def parse_metis_filename(name: str) -> tuple[str, int, int] | None:
    """'DeviceType.A100_tp2_bs4.json' -> ('A100', 2, 4); None for any other name."""
    m = _FILE_NAME.match(name)
    return (m["gpu"], int(m["tp"]), int(m["bs"])) if m else None


def _get(data: Any, path: Path, *keys: str) -> Any:
    """data[k0][k1]...; InstanceError naming the file and the first missing key."""
    for depth, key in enumerate(keys):
        if not isinstance(data, Mapping) or key not in data:
            raise InstanceError(f"missing key {key!r}", f"{path}: {'.'.join(keys[:depth + 1])}")
        data = data[key]
    return data


def _numbers(value: Any, path: Path, key: str) -> list[float]:
    if not isinstance(value, list) or not value:
        raise InstanceError(f"expected a non-empty list of numbers, got {value!r}", f"{path}: {key}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InstanceError(f"expected a number >= 0, got {v!r}", f"{path}: {key}[{i}]")
        out.append(float(v))
    return out


def _number(value: Any, path: Path, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InstanceError(f"expected a number >= 0, got {value!r}", f"{path}: {key}")
    return float(value)


def _sub(data: Any, *keys: str) -> Any:
    """data[k0][k1]... or None where a level is missing or not a mapping (optional fields)."""
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def read_metis_file(path: str | Path, fwd_fraction: float = DEFAULT_FWD_FRACTION
                    ) -> tuple[str, TimeMeasurement, MemoryMeasurement | None, str | None]:
    """One Metis file -> (device name, time measurement, memory measurement or None, model name)."""
    path = Path(path)
    parsed = parse_metis_filename(path.name)
    if parsed is None:
        raise InstanceError("file name must look like DeviceType.<gpu>_tp<k>_bs<b>.json", str(path))
    # a string from the instance's options (metis_fwd_fraction: half) raised TypeError at the `<`
    if isinstance(fwd_fraction, bool) or not isinstance(fwd_fraction, (int, float)) or not 0 < fwd_fraction < 1:
        raise InstanceError(f"must lie strictly between 0 and 1, got {fwd_fraction!r}", "fwd_fraction")
    gpu, tp, bs = parsed
    if tp < 1 or bs < 1:
        raise InstanceError("tp and bs in the file name must be >= 1", str(path))
    data = read_structured(path)
    layers_ms = _numbers(_get(data, path, "execution_time", "layer_compute_total_ms"), path,
                         "execution_time.layer_compute_total_ms")
    num_layers = _get(data, path, "model", "num_layers")
    if num_layers != len(layers_ms):
        raise InstanceError(f"says {num_layers!r} layer units, but execution_time.layer_compute_total_ms has "
                            f"{len(layers_ms)}", f"{path}: model.num_layers")
    optimizer_ms = _number(_get(data, path, "execution_time", "optimizer_time_ms"), path,
                           "execution_time.optimizer_time_ms")
    fb_ms = _sub(data, "execution_time", "forward_backward_time_ms")
    overhead_s = 0.0
    if fb_ms is not None:
        overhead_s = max(0.0, _number(fb_ms, path, "execution_time.forward_backward_time_ms") - sum(layers_ms)) / 1e3
    units = tuple(UnitTime(fwd_s=t / 1e3 * fwd_fraction, bwd_s=t / 1e3 * (1 - fwd_fraction)) for t in layers_ms)
    time = TimeMeasurement(microbatch=bs, tp=tp, units=units, update_s=optimizer_ms / 1e3, overhead_s=overhead_s)
    memory = _memory(data, path, tp, bs, len(layers_ms))
    model = _sub(data, "model", "model_name")
    return gpu, time, memory, (str(model) if model is not None else None)


def _memory(data: Mapping[str, Any], path: Path, tp: int, bs: int, n: int) -> MemoryMeasurement | None:
    params = _sub(data, "model", "parameters", "parameters_per_layer_bytes")
    totals = _sub(data, "execution_memory", "layer_memory_total_mb")
    columns: dict[str, list[float]] = {}
    for key, field, raw, scale in (("params_bytes", "model.parameters.parameters_per_layer_bytes", params, 1.0 / tp),
                                   ("total_bytes", "execution_memory.layer_memory_total_mb", totals, float(MIB))):
        if raw is None:
            continue
        values = _numbers(raw, path, field)
        if len(values) != n:
            warnings.warn(f"{path}: {field} has {len(values)} entries for {n} layer units; ignored", stacklevel=3)
            continue
        columns[key] = [v * scale for v in values]
    if not columns:
        return None
    units = tuple(UnitMemory(**{k: v[i] for k, v in columns.items()}) for i in range(n))
    return MemoryMeasurement(microbatch=bs, tp=tp, units=units)


def read_metis_dir(directory: str | Path, fwd_fraction: float = DEFAULT_FWD_FRACTION,
                   device_names: Mapping[str, str] | None = None) -> ProfileSet:
    """Every DeviceType.*.json of a directory -> one GpuProfile per device type.

    device_names maps Metis device names to hetplan GPU types ({'A100': 'A100-40'}); unmapped
    devices keep their Metis name. A single file path is accepted too.
    """
    directory = Path(directory)
    if directory.is_file():
        files = [directory]
    elif directory.is_dir():
        files = sorted(p for p in directory.iterdir() if parse_metis_filename(p.name))
    else:
        raise InstanceError(f"not found: {directory}")
    if not files:
        raise InstanceError("no DeviceType.<gpu>_tp<k>_bs<b>.json files", str(directory))
    by_gpu: dict[str, list[tuple[TimeMeasurement, MemoryMeasurement | None, str | None]]] = {}
    for f in files:
        gpu, time, memory, model = read_metis_file(f, fwd_fraction)
        by_gpu.setdefault(gpu, []).append((time, memory, model))
    names = dict(device_names or {})
    profiles = []
    for gpu, items in sorted(by_gpu.items()):
        items.sort(key=lambda it: (it[0].tp, it[0].microbatch))
        models = {m for _, _, m in items if m is not None}
        profiles.append(GpuProfile(
            gpu_type=names.get(gpu, gpu), times=tuple(t for t, _, _ in items),
            memory=tuple(m for _, m, _ in items if m is not None),
            model=models.pop() if len(models) == 1 else None, source=f"{directory} (DeviceType.{gpu})"))
    return ProfileSet(tuple(profiles))


def _normal(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def match_device(devices: list[str], gpu_type: str) -> str | None:
    """The Metis device name meant by a hetplan GPU type: equal up to case and punctuation, else the
    longest device name the GPU type starts with ('A100' for 'A100-40'), else the only device."""
    target = _normal(gpu_type)
    exact = [d for d in devices if _normal(d) == target]
    if exact:
        return exact[0]
    prefixes = sorted((d for d in devices if target.startswith(_normal(d))), key=len, reverse=True)
    if prefixes:
        return prefixes[0]
    return devices[0] if len(devices) == 1 else None


def read_metis_profile_for(path: str | Path, gpu_type: str,
                           fwd_fraction: float = DEFAULT_FWD_FRACTION) -> GpuProfile:
    """The profile of the Metis device matching `gpu_type` (see match_device), labelled gpu_type."""
    profiles = read_metis_dir(path, fwd_fraction)
    device = match_device(profiles.gpu_types, gpu_type)
    if device is None:
        raise InstanceError(f"no Metis device matches GPU type {gpu_type!r}; devices: {profiles.gpu_types}",
                            str(path))
    return profiles.get(device).relabel(gpu_type)
