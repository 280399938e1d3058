"""Read the data files of Sailor (SOSP'25, seed 000; github.com/eth-easl/sailor) into hetplan types.

Files and what they become (layout of Sailor's repository, mirrored by ../shared/reference/sailor):

| file | reader | result |
|---|---|---|
| profiles/<model>/<gpu>/profile.json `{mbs: {tp: {unit: [fwd_s, bwd_s, update_s]}}}` | read_sailor_profile | GpuProfile |
| model/llm_info.json `{model: {tp: {unit: {params_floats, act_*_floats/bytes}}}}` | read_llm_info | MemoryMeasurement per tp (microbatch 1) |
| training/*.json (global batch, hidden, heads, layers, vocab, optimizer) | read_training_config | workload fields |
| network/multizone_bandwidths*.json `[sz][sg][sc][dz][dg][dc] = [[c0,c1,c2], max_Bps]` | read_zone_bandwidths | {(sz, sg, sc, dz, dg, dc): BandwidthFit} |
| network/intra_node_bandwidths.json `[gpu][count]` | read_intra_node_bandwidths | {(gpu, count): BandwidthFit} |
| network/network_coeffs_all_homo.json `[inter|intra][gpu][count]` | read_homo_network_coeffs | {(kind, gpu, count): BandwidthFit} |
| network/communication_cost_gcp_usd_per_GB.json `[src][dst] = usd/GB` | read_egress_prices | hetplan.instance.Egress |
| cluster/quotas_dict.json + basic_cluster_config.json | read_node_groups | list of NodeGroup dicts |
| cluster/gpu_trace_*.csv (`,Timestamp,<GPU>_<zone>,...`) | read_availability_trace | list of AvailabilityEvent |

`sailor_instance_dict(reference_dir, model=...)` puts them together into an instance dict that
`hetplan.instance.instance_from_dict` accepts. Every malformed file raises InstanceError whose field
names the file and the key path inside it (e.g. `.../profile.json: 1.1.3`).

Units: Sailor's profile times are seconds per microbatch for one GPU of a TP group; llm_info counts are
elements per GPU after the TP split for microbatch 1 (its *_bytes fields are 4 bytes per element).
"""
from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

from hetplan.catalog import GIB
from hetplan.errors import InstanceError
from hetplan.instance import AvailabilityEvent, Egress, EgressPrice, read_structured, region_of
from hetplan.profiles import (BandwidthFit, GpuProfile, MemoryMeasurement, TimeMeasurement, UnitMemory,
                              UnitTime)

# Sailor's model names -> hetplan presets (core/data/models.yaml).
SAILOR_MODEL_PRESETS: dict[str, str] = {"OPT-350": "OPT-350M", "GPT-Neo-2.7": "GPT-Neo-2.7B"}

# USD per GPU-hour in Sailor's simulator (Planner/simulations/constants.py GPU_PRICES at cf2c8e3, the
# same in every zone; the README of ../shared/reference/sailor quotes 3.67-3.74 and 2.80-2.86).
SAILOR_GPU_PRICES_USD_PER_HOUR: dict[str, float] = {"A100-40": 3.673385, "V100-16": 2.859998}


# ---- small parsing helpers ---------------------------------------------------------------------
def _where(path: Path, *keys: object) -> str:
    return f"{path}: {'.'.join(str(k) for k in keys)}" if keys else str(path)


def _load(path: str | Path) -> tuple[Path, Any]:
    path = Path(path)
    return path, read_structured(path)


def _mapping(value: Any, path: Path, *keys: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not value:
        kind = "an empty mapping" if isinstance(value, Mapping) else type(value).__name__
        raise InstanceError(f"expected a non-empty mapping, got {kind}", _where(path, *keys))
    return value


def _int_key(key: str, path: Path, *keys: object) -> int:
    """A mapping key that must spell an integer >= 1 (microbatch size, TP degree, GPU count)."""
    try:
        value = int(key)
    except (TypeError, ValueError):
        raise InstanceError(f"expected an integer key, got {key!r}", _where(path, *keys, key)) from None
    if value < 1:
        raise InstanceError(f"expected an integer >= 1, got {key!r}", _where(path, *keys, key))
    return value


def _number(value: Any, path: Path, *keys: object, minimum: float = -math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InstanceError(f"expected a finite number, got {value!r}", _where(path, *keys))
    if value < minimum:
        raise InstanceError(f"expected a number >= {minimum:g}, got {value!r}", _where(path, *keys))
    return float(value)


def _unit_indices(layers: Mapping[str, Any], path: Path, *keys: object) -> list[str]:
    """Unit keys '0'..'N-1' in order; a gap or a non-integer key is an error."""
    try:
        indices = sorted(int(k) for k in layers)
    except ValueError:
        bad = next(k for k in layers if not k.lstrip("-").isdigit())
        raise InstanceError(f"expected a layer-unit index, got {bad!r}", _where(path, *keys, bad)) from None
    if indices != list(range(len(indices))):
        missing = sorted(set(range(max(indices) + 1)) - set(indices))
        raise InstanceError(f"layer units must be 0..{len(indices) - 1} without gaps; missing {missing}",
                            _where(path, *keys))
    return [str(i) for i in indices]


# ---- profiles ------------------------------------------------------------------------------------
def read_sailor_profile(path: str | Path, gpu_type: str | None = None, model: str | None = None,
                        llm_info: str | Path | None = None) -> GpuProfile:
    """Parse a Sailor profile.json; gpu_type / model default to the parent / grandparent folder names.

    Sailor stores the whole-model update time in every unit's third entry; it is the same for all
    units of a measurement, and the largest one is kept should they ever differ.
    With `llm_info`, the memory of `model` is attached (see read_llm_info).
    """
    path, data = _load(path)
    gpu_type = gpu_type or path.parent.name
    model = model or path.parent.parent.name
    times = []
    for mbs_key, by_tp in _mapping(data, path).items():
        mbs = _int_key(mbs_key, path)
        for tp_key, layers in _mapping(by_tp, path, mbs_key).items():
            tp = _int_key(tp_key, path, mbs_key)
            layers = _mapping(layers, path, mbs_key, tp_key)
            units, updates = [], []
            for unit_key in _unit_indices(layers, path, mbs_key, tp_key):
                entry = layers[unit_key]
                if not isinstance(entry, list) or len(entry) != 3:
                    raise InstanceError(f"expected [fwd_s, bwd_s, update_s], got {entry!r}",
                                        _where(path, mbs_key, tp_key, unit_key))
                # each figure >= 0 here: a negative update would hide behind the max below
                fwd, bwd, upd = (_number(v, path, mbs_key, tp_key, unit_key, i, minimum=0.0)
                                 for i, v in enumerate(entry))
                units.append(UnitTime(fwd, bwd))
                updates.append(upd)
            times.append(TimeMeasurement(microbatch=mbs, tp=tp, units=tuple(units), update_s=max(updates)))
    times.sort(key=lambda m: (m.tp, m.microbatch))
    profile = GpuProfile(gpu_type=gpu_type, times=tuple(times), model=model, source=str(path))
    if llm_info is not None:
        memory = read_llm_info(llm_info, model)
        _check_units(profile, memory, Path(llm_info), model)
        profile = profile.with_memory(memory)
    return profile


def _check_units(profile: GpuProfile, memory: list[MemoryMeasurement], path: Path, model: str) -> None:
    for m in memory:
        if len(m.units) != profile.num_units:
            raise InstanceError(
                f"{len(m.units)} layer units, but the profile {profile.source} has {profile.num_units}",
                _where(path, model, m.tp))


_LLM_INFO_FIELDS = ("params_floats", "act_mem_bytes", "act_output_bytes")


def read_llm_info(path: str | Path, model: str) -> list[MemoryMeasurement]:
    """Sailor's llm_info.json for one model: per tp, per unit, parameters per GPU and activation bytes
    (microbatch 1). params_bytes / activation_bytes / output_bytes are taken from the *_bytes fields."""
    path, data = _load(path)
    models = _mapping(data, path)
    if model not in models:
        raise InstanceError(f"model {model!r} not in the file; it has {sorted(models)}", _where(path, model))
    out = []
    for tp_key, layers in _mapping(models[model], path, model).items():
        tp = _int_key(tp_key, path, model)
        layers = _mapping(layers, path, model, tp_key)
        units = []
        for unit_key in _unit_indices(layers, path, model, tp_key):
            info = _mapping(layers[unit_key], path, model, tp_key, unit_key)
            for key in _LLM_INFO_FIELDS:
                if key not in info:
                    raise InstanceError(f"missing key {key!r}", _where(path, model, tp_key, unit_key))

            def num(key: str) -> float | None:
                if key not in info:
                    return None
                # element counts and bytes: a negative one gave negative memory downstream
                return _number(info[key], path, model, tp_key, unit_key, key, minimum=0.0)

            units.append(UnitMemory(params_per_gpu=num("params_floats"), params_bytes=num("params_bytes"),
                                    activation_bytes=num("act_mem_bytes"), output_bytes=num("act_output_bytes")))
        out.append(MemoryMeasurement(microbatch=1, tp=tp, units=tuple(units)))
    return sorted(out, key=lambda m: m.tp)


# ---- export (the inverse of read_sailor_profile / read_llm_info) ---------------------------------------
def sailor_profile_dict(profile: GpuProfile) -> dict[str, Any]:
    """A GpuProfile as Sailor's profile.json: {mbs: {tp: {unit: [fwd_s, bwd_s, update_s]}}}; Sailor
    repeats the whole-model update time in every unit's entry."""
    out: dict[str, Any] = {}
    for m in sorted(profile.times, key=lambda m: (m.microbatch, m.tp)):
        out.setdefault(str(m.microbatch), {})[str(m.tp)] = {
            str(u): [unit.fwd_s, unit.bwd_s, m.update_s] for u, unit in enumerate(m.units)}
    return out


def sailor_llm_info_dict(profile: GpuProfile, model: str) -> dict[str, Any] | None:
    """The memory measured at microbatch 1 as llm_info.json {model: {tp: {unit: {...}}}}, or None when
    there is none. Sailor's *_floats are its *_bytes / 4 (profile_utils.py at cf2c8e3 divides by 4
    whatever the dtype); act_input of a unit is the previous unit's output (0 for the embedding)."""
    by_tp: dict[str, Any] = {}
    for m in sorted(profile.memory, key=lambda m: m.tp):
        if m.microbatch != 1 or any(u.params_per_gpu is None or u.activation_bytes is None
                                    or u.output_bytes is None for u in m.units):
            continue
        units = {}
        for i, u in enumerate(m.units):
            params_bytes = u.params_bytes if u.params_bytes is not None else 4 * u.params_per_gpu
            input_bytes = m.units[i - 1].output_bytes if i else 0.0
            units[str(i)] = {"params_floats": u.params_per_gpu, "act_output_floats": u.output_bytes / 4,
                             "act_input_floats": input_bytes / 4, "act_mem_floats": u.activation_bytes / 4,
                             "params_bytes": params_bytes, "act_output_bytes": u.output_bytes,
                             "act_input_bytes": input_bytes, "act_mem_bytes": u.activation_bytes}
        by_tp[str(m.tp)] = units
    return {model: by_tp} if by_tp else None


def write_sailor_profile(profile: GpuProfile, path: str | Path) -> list[Path]:
    """Write profile.json at `path` and, when memory was measured at microbatch 1, llm_info.json beside
    it (read them back with read_sailor_profile(path, llm_info=...)). Returns the files written."""
    import json

    from hetplan.files import write_atomic

    path = Path(path)
    written = [write_atomic(path, json.dumps(sailor_profile_dict(profile), indent=2) + "\n", "--output")]
    info = sailor_llm_info_dict(profile, profile.model or "model")
    if info is not None:
        written.append(write_atomic(path.parent / "llm_info.json", json.dumps(info, indent=2) + "\n", "--output"))
    return written


# ---- training configuration ---------------------------------------------------------------------
_TRAINING_INTS = ("global_batch_size", "hidden_size", "sequence_length", "num_layers", "vocab_size", "heads")
SAILOR_READS = ("num_layers", "hidden_size", "seq_len")  # of a training file's model fields (as hetplan names them)


def read_training_config(path: str | Path, model_preset: str | None = None) -> dict[str, Any]:
    """A training/*.json file -> hetplan workload fields (model, global_batch_size, optimizer).

    The model becomes a preset (SAILOR_MODEL_PRESETS, or `model_preset`) with overrides wherever the
    file differs from it in a field Sailor reads (`SAILOR_READS`: layers, hidden size, sequence
    length). Its `heads` and `vocab_size` are never read by Sailor's planner or simulator (at
    eth-easl/sailor as in ../shared/reference/sailor/src), whose model is llm_info.json; for a preset
    they are checked as numbers but not applied: GPT-Neo-2.7's file says 32 heads and a 128,256
    vocabulary, which made the imported model 3.18e9 parameters against llm_info's 2.65e9 (its
    embedding unit, 134,021,120 floats, is a 50,304-token vocabulary: the preset's 50,257, padded).
    An unknown model becomes a full architecture from every field, ffn_hidden_size = 4 * hidden_size.
    """
    from hetplan.catalog import model_presets

    path, data = _load(path)
    data = _mapping(data, path)
    for key in _TRAINING_INTS + ("model",):
        if key not in data:
            raise InstanceError(f"missing key {key!r}", str(path))
    ints = {}
    for key in _TRAINING_INTS:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InstanceError(f"expected an integer >= 1, got {value!r}", _where(path, key))
        ints[key] = value
    if "num_all_layers" in data and data["num_all_layers"] != ints["num_layers"] + 2:
        raise InstanceError(f"expected num_layers + 2 = {ints['num_layers'] + 2}, got {data['num_all_layers']!r}",
                            _where(path, "num_all_layers"))
    optimizer = str(data.get("optimizer", "Adam")).lower()
    if optimizer not in ("adam", "sgd"):
        raise InstanceError(f"unsupported optimizer {data['optimizer']!r} (adam or sgd)", _where(path, "optimizer"))
    arch = {"num_layers": ints["num_layers"], "hidden_size": ints["hidden_size"], "num_heads": ints["heads"],
            "vocab_size": ints["vocab_size"], "seq_len": ints["sequence_length"]}
    name = str(data["model"])
    preset = model_preset or SAILOR_MODEL_PRESETS.get(name)
    if preset is not None:
        if preset not in model_presets():
            raise InstanceError(f"unknown model preset {preset!r}; known: {sorted(model_presets())}", "model_preset")
        base = model_presets()[preset].model_dump()
        overrides = {k: v for k, v in arch.items() if k in SAILOR_READS and base[k] != v}
        model: dict[str, Any] = {"preset": preset, "overrides": overrides}
    else:
        family = {"gpt2": "gpt", "opt": "opt", "llama": "llama"}.get(str(data.get("type", "gpt2")).lower(), "gpt")
        model = {"arch": {"name": name, "family": family, "ffn_hidden_size": 4 * ints["hidden_size"], **arch}}
    return {"model": model, "global_batch_size": ints["global_batch_size"], "optimizer": optimizer}


# ---- network ---------------------------------------------------------------------------------------
def _fit(value: Any, path: Path, *keys: object) -> BandwidthFit:
    ok = (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list) and len(value[0]) == 3)
    if not ok:
        raise InstanceError(f"expected [[c0, c1, c2], max_bytes_per_s], got {value!r}", _where(path, *keys))
    c0, c1, c2 = (_number(v, path, *keys, 0, i) for i, v in enumerate(value[0]))
    cap = _number(value[1], path, *keys, 1)
    if cap <= 0:
        raise InstanceError(f"max bytes/s must be > 0, got {cap}", _where(path, *keys, 1))
    return BandwidthFit(c0, c1, c2, cap)


def read_zone_bandwidths(path: str | Path) -> dict[tuple[str, str, int, str, str, int], BandwidthFit]:
    """multizone_bandwidths(_het).json -> {(src_zone, src_gpu, src_count, dst_zone, dst_gpu, dst_count): fit}.
    Counts are GPUs per VM (1/2/4, 8 for some consumer GPUs)."""
    path, data = _load(path)
    out = {}
    for sz, by_sg in _mapping(data, path).items():
        for sg, by_sc in _mapping(by_sg, path, sz).items():
            for sc, by_dz in _mapping(by_sc, path, sz, sg).items():
                src_count = _int_key(sc, path, sz, sg)
                for dz, by_dg in _mapping(by_dz, path, sz, sg, sc).items():
                    for dg, by_dc in _mapping(by_dg, path, sz, sg, sc, dz).items():
                        for dc, value in _mapping(by_dc, path, sz, sg, sc, dz, dg).items():
                            dst_count = _int_key(dc, path, sz, sg, sc, dz, dg)
                            out[(sz, sg, src_count, dz, dg, dst_count)] = _fit(value, path, sz, sg, sc, dz, dg, dc)
    return out


def zone_table_gaps(fits: Mapping[tuple[str, str, int, str, str, int], BandwidthFit],
                    groups: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (GPU type, zone) pairs of `groups` for which the zone table has no entry between two nodes
    of that type in that zone. Nodes there could talk to no other node, so every plan would keep to
    one node of them: a typo in a zone, not a cluster anyone means (Sailor's simulator raises
    KeyError on such a pair: runtime_simulator.py, get_network_coeffs)."""
    have = {(k[1], k[0]) for k in fits if k[0] == k[3] and k[1] == k[4]}
    return sorted(set(groups) - have)


def zone_table_gap(fits: Mapping[tuple[str, str, int, str, str, int], BandwidthFit],
                   groups: Iterable[tuple[str, str]], path: str | Path) -> str | None:
    """One sentence naming the first gap of `groups` (zone_table_gaps) and where the table of `path`
    has that GPU; None when there is none."""
    gaps = zone_table_gaps(fits, groups)
    if not gaps:
        return None
    gpu, zone = gaps[0]
    zones = sorted({k[0] for k in fits if k[1] == gpu and k[0] == k[3] and k[4] == gpu})
    more = f"; also {', '.join(f'{g}@{z}' for g, z in gaps[1:])}" if len(gaps) > 1 else ""
    return (f"{Path(path).name} has no bandwidth between {gpu} nodes in zone {zone!r}, so they could reach no "
            f"other node (it has {gpu} in {zones or 'no zone'}){more}")


def read_intra_node_bandwidths(path: str | Path) -> dict[tuple[str, int], BandwidthFit]:
    """intra_node_bandwidths.json -> {(gpu, gpus_in_collective): fit}."""
    path, data = _load(path)
    return {(gpu, _int_key(count, path, gpu)): _fit(value, path, gpu, count)
            for gpu, by_count in _mapping(data, path).items()
            for count, value in _mapping(by_count, path, gpu).items()}


def read_homo_network_coeffs(path: str | Path) -> dict[tuple[str, str, int], BandwidthFit]:
    """network_coeffs_all_homo.json -> {('inter' | 'intra', gpu, count): fit}."""
    path, data = _load(path)
    out = {}
    for kind, by_gpu in _mapping(data, path).items():
        if kind not in ("inter", "intra"):
            raise InstanceError(f"expected 'inter' or 'intra', got {kind!r}", _where(path, kind))
        for gpu, by_count in _mapping(by_gpu, path, kind).items():
            for count, value in _mapping(by_count, path, kind, gpu).items():
                out[(kind, gpu, _int_key(count, path, kind, gpu))] = _fit(value, path, kind, gpu, count)
    return out


def read_egress_prices(path: str | Path) -> Egress:
    """communication_cost_*_usd_per_GB.json -> Egress with one price per ordered zone pair.

    Every off-diagonal entry becomes a pair (a non-zero diagonal too); the class defaults
    inter_zone / inter_region are the most common price among same-region / cross-region pairs, for
    zones the table does not list.
    """
    path, data = _load(path)
    pairs, same_region, cross_region = [], [], []
    for src, row in _mapping(data, path).items():
        for dst, price in _mapping(row, path, src).items():
            usd = _number(price, path, src, dst)
            if usd < 0:
                raise InstanceError(f"a price must be >= 0, got {usd}", _where(path, src, dst))
            if src == dst and usd == 0:
                continue
            pairs.append(EgressPrice(zones=(src, dst), usd_per_GB=usd))
            if src != dst:
                (same_region if region_of(src) == region_of(dst) else cross_region).append(usd)
    defaults = Egress()
    mode = lambda xs, d: Counter(xs).most_common(1)[0][0] if xs else d  # noqa: E731
    return Egress(inter_zone_usd_per_GB=mode(same_region, defaults.inter_zone_usd_per_GB),
                  inter_region_usd_per_GB=mode(cross_region, defaults.inter_region_usd_per_GB), pairs=pairs)


# ---- cluster ---------------------------------------------------------------------------------------
def read_cluster_config(path: str | Path) -> dict[str, dict[str, float]]:
    """basic_cluster_config.json -> {gpu: {"gpus_per_node": int, "mem_per_gpu_bytes": int}} (its
    top-level "zone" entry is a default zone and is skipped)."""
    path, data = _load(path)
    out = {}
    for gpu, spec in _mapping(data, path).items():
        if gpu == "zone":
            continue
        spec = _mapping(spec, path, gpu)
        for key in ("gpus_per_node", "mem_per_gpu"):
            if key not in spec:
                raise InstanceError(f"missing key {key!r}", _where(path, gpu))
        per_node = spec["gpus_per_node"]
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise InstanceError(f"expected an integer >= 1, got {per_node!r}", _where(path, gpu, "gpus_per_node"))
        mem = _number(spec["mem_per_gpu"], path, gpu, "mem_per_gpu")
        out[gpu] = {"gpus_per_node": per_node, "mem_per_gpu_bytes": mem}
    return out


def read_quotas(path: str | Path) -> dict[tuple[str, str], int]:
    """quotas_dict.json -> {(gpu, zone): number of GPUs}."""
    path, data = _load(path)
    out = {}
    for gpu, by_zone in _mapping(data, path).items():
        for zone, count in _mapping(by_zone, path, gpu).items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InstanceError(f"expected an integer >= 0, got {count!r}", _where(path, gpu, zone))
            out[(gpu, zone)] = count
    return out


def group_name(gpu_type: str, zone: str) -> str:
    """Node group name for a (GPU type, zone), spelled like Sailor's trace columns."""
    return f"{gpu_type}_{zone}"


def node_groups_from_gpu_counts(gpu_counts: Mapping[tuple[str, str], int], cluster_config: Mapping[str, Mapping],
                                prices: Mapping[str, float], where: str = "quotas") -> list[dict[str, Any]]:
    """{(gpu, zone): GPUs} -> NodeGroup dicts with nodes of the configured size; a partial node is
    dropped (Sailor rents whole VMs)."""
    groups = []
    for (gpu, zone), gpus in gpu_counts.items():
        if gpu not in cluster_config:
            raise InstanceError(f"GPU type {gpu!r} has no entry in the cluster config (it has "
                                f"{sorted(cluster_config)})", f"{where}: {gpu}")
        if gpu not in prices:
            raise InstanceError(f"no price per GPU-hour for {gpu!r}; pass prices={{...}} (known: {sorted(prices)})",
                                f"{where}: {gpu}")
        per_node = int(cluster_config[gpu]["gpus_per_node"])
        groups.append({"name": group_name(gpu, zone), "gpu_type": gpu, "gpus_per_node": per_node,
                       "count": gpus // per_node, "zone": zone, "price_per_gpu_hour_usd": float(prices[gpu])})
    return groups


def read_node_groups(quotas_path: str | Path, cluster_config_path: str | Path,
                     prices: Mapping[str, float] | None = None, gpu_types: Iterable[str] | None = None,
                     zones: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """quotas_dict.json + basic_cluster_config.json -> NodeGroup dicts, one per (GPU type, zone) with a
    quota, `count` = quota // gpus_per_node; optionally restricted to some GPU types / zones."""
    quotas = read_quotas(quotas_path)
    keep = _keep(gpu_types, zones)
    return node_groups_from_gpu_counts({k: v for k, v in quotas.items() if keep(*k)},
                                       read_cluster_config(cluster_config_path),
                                       SAILOR_GPU_PRICES_USD_PER_HOUR if prices is None else prices,
                                       where=str(quotas_path))


def _keep(gpu_types: Iterable[str] | None, zones: Iterable[str] | None):
    gpu_set = None if gpu_types is None else set(gpu_types)
    zone_set = None if zones is None else set(zones)
    return lambda gpu, zone: (gpu_set is None or gpu in gpu_set) and (zone_set is None or zone in zone_set)


# ---- availability traces --------------------------------------------------------------------------
def _split_column(column: str, path: Path) -> tuple[str, str]:
    gpu, sep, zone = column.rpartition("_")  # zones have no '_', GPU names might
    if not sep or not gpu or not zone:
        raise InstanceError(f"expected a column named <GPU>_<zone>, got {column!r}", _where(path, column))
    return gpu, zone


def read_availability_trace(path: str | Path, changes_only: bool = False) -> list[AvailabilityEvent]:
    """A Sailor trace CSV (`,Timestamp,<GPU>_<zone>,...`, one row per timestamp) -> AvailabilityEvents,
    one per row and column, with time_s relative to the first row. changes_only=True keeps the first
    row and then only the counts that changed."""
    path = Path(path)
    if not path.exists():
        raise InstanceError(f"file not found: {path}")
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if any(cell.strip() for cell in r)]
    if len(rows) < 2:
        raise InstanceError("expected a header and at least one row", str(path))
    header = [h.strip() for h in rows[0]]
    lowered = [h.lower() for h in header]
    if "timestamp" not in lowered:
        raise InstanceError(f"missing column 'Timestamp' (columns: {header})", _where(path, "Timestamp"))
    t_col = lowered.index("timestamp")
    gpu_cols = [(i, *_split_column(h, path)) for i, h in enumerate(header) if i != t_col and h]
    if not gpu_cols:
        raise InstanceError("no <GPU>_<zone> columns", str(path))
    events: list[AvailabilityEvent] = []
    last: dict[int, int] = {}
    t0 = prev = None
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise InstanceError(f"expected {len(header)} cells, got {len(row)}", _where(path, f"line {line}"))
        t = _cell_float(row[t_col], path, line, header[t_col])
        if prev is not None and t < prev:
            raise InstanceError(f"time goes backwards ({t} after {prev})", _where(path, f"line {line}", "Timestamp"))
        t0 = t if t0 is None else t0
        prev = t
        for i, gpu, zone in gpu_cols:
            value = _cell_float(row[i], path, line, header[i])
            if value < 0 or value != int(value):
                raise InstanceError(f"expected a GPU count, got {row[i]!r}", _where(path, f"line {line}", header[i]))
            count = int(value)
            if changes_only and last.get(i) == count:
                continue
            last[i] = count
            events.append(AvailabilityEvent(time_s=t - t0, zone=zone, gpu_type=gpu, available_gpus=count))
    return events


def _cell_float(cell: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise InstanceError(f"expected a number, got {cell!r}", _where(path, f"line {line}", column)) from None
    if not math.isfinite(value):
        raise InstanceError(f"expected a finite number, got {cell!r}", _where(path, f"line {line}", column))
    return value


# ---- a whole instance ------------------------------------------------------------------------------
def check_zone_table(reference_dir: str | Path, groups: Iterable[tuple[str, str]], field: str) -> None:
    """Refuse (GPU type, zone) pairs that Sailor's zone bandwidth table lacks (zone_table_gap)."""
    path = Path(reference_dir) / "network" / "multizone_bandwidths_het.json"
    if why := zone_table_gap(read_zone_bandwidths(path), groups, path):
        raise InstanceError(why, field)


def find_training_config(reference_dir: str | Path, model: str) -> Path:
    """The training/*.json whose "model" field is `model`."""
    folder = Path(reference_dir) / "training"
    found = []
    for candidate in sorted(folder.glob("*.json")):
        data = read_structured(candidate)
        if isinstance(data, Mapping):
            found.append(str(data.get("model")))
            if data.get("model") == model:
                return candidate
    raise InstanceError(f"no training config for model {model!r} in {folder} (models there: {found})", "model")


def sailor_instance_dict(reference_dir: str | Path, model: str = "OPT-350", *,
                         gpu_types: Iterable[str] | None = None, zones: Iterable[str] | None = None,
                         trace: str | Path | None = None, name: str | None = None,
                         prices: Mapping[str, float] | None = None, model_preset: str | None = None,
                         global_batch_size: int | None = None, objective: str = "max_throughput",
                         constraints: Mapping[str, Any] | None = None, use_sailor_estimators: bool = True,
                         memory_from_config: bool = True, gpu_counts: Mapping[tuple[str, str], int] | None = None,
                         preset: str | None = None, counts_field: str = "cluster") -> dict[str, Any]:
    """Assemble a hetplan instance dict from a folder laid out like Sailor's data (profiles/, model/,
    training/, network/, cluster/).

    The cluster: without a trace, one node group per (GPU type, zone) quota; with `trace` (a path, or
    a name such as "2zones_2gpus" for cluster/gpu_trace_<name>.csv), the trace's (GPU, zone) columns
    sized by their largest count, plus its events. Only GPU types with a profile of `model` are used
    unless `gpu_types` names them. Network egress prices come from the GCP table; profiles are
    referenced by absolute path (format sailor); with `use_sailor_estimators` the instance selects the
    "profile" time estimator and the "sailor_poly" comm estimator with their file options.
    `memory_from_config` sets each GPU's memory to the bytes in basic_cluster_config.json.
    `gpu_counts` ({(GPU type, zone): GPUs}) gives the cluster instead of the quotas or a trace; errors
    in it name `counts_field` (the CLI's `--cluster`).
    preset "sailor": Sailor's simulator as it scored its evaluation (estimators/sailor.py): fp32, the
    catalogue's GPU memory (40 / 16 GiB, as its GPU_MEMORY_GB), its prices, the sailor estimators.
    """
    ref = Path(reference_dir).resolve()
    prices = SAILOR_GPU_PRICES_USD_PER_HOUR if prices is None else prices
    profiled = sorted(p.parent.name for p in (ref / "profiles" / model).glob("*/profile.json"))
    if not profiled:
        raise InstanceError(f"no profiles for model {model!r} under {ref / 'profiles'}", "model")
    wanted = profiled if gpu_types is None else list(gpu_types)
    missing = sorted(set(wanted) - set(profiled))
    if missing:
        raise InstanceError(f"no profile of {model!r} for {missing} (profiled: {profiled})", "gpu_types")
    keep = _keep(wanted, zones)
    cluster_config = read_cluster_config(ref / "cluster" / "basic_cluster_config.json")

    events: list[AvailabilityEvent] = []
    if gpu_counts is not None:
        bad = sorted(f"{g}@{z}" for g, z in gpu_counts if not keep(g, z))
        if bad:
            raise InstanceError(f"no profile of {model!r} for {bad} (profiled: {profiled})", counts_field)
        check_zone_table(ref, gpu_counts, counts_field)
        for (g, z), n in gpu_counts.items():  # quotas drop a partial VM; counts asked for are refused
            per_node = int(cluster_config.get(g, {}).get("gpus_per_node", 1))
            if n % per_node:
                raise InstanceError(f"{g}@{z}={n}: Sailor rents {g} in VMs of {per_node} GPUs; give a multiple of "
                                    f"{per_node}", counts_field)
        groups = node_groups_from_gpu_counts(dict(gpu_counts), cluster_config, prices, where=counts_field)
    elif trace is not None:
        trace_path = Path(trace) if Path(trace).suffix == ".csv" else ref / "cluster" / f"gpu_trace_{trace}.csv"
        events = [e for e in read_availability_trace(trace_path) if keep(e.gpu_type, e.zone)]
        if not events:
            raise InstanceError(f"no column of the trace matches GPU types {wanted} and zones {zones}",
                                str(trace_path))
        peak: dict[tuple[str, str], int] = {}
        for e in events:
            peak[(e.gpu_type, e.zone)] = max(peak.get((e.gpu_type, e.zone), 0), e.available_gpus)
        # whole nodes that can hold the trace's largest count
        per_node = {gpu: int(cluster_config[gpu]["gpus_per_node"]) for gpu, _ in peak if gpu in cluster_config}
        sized = {k: -(-v // per_node[k[0]]) * per_node[k[0]] if k[0] in per_node else v for k, v in peak.items()}
        groups = node_groups_from_gpu_counts(sized, cluster_config, prices, where=str(trace_path))
    else:
        quotas_path = ref / "cluster" / "quotas_dict.json"
        quotas = {k: v for k, v in read_quotas(quotas_path).items() if keep(*k)}
        groups = node_groups_from_gpu_counts(quotas, cluster_config, prices, where=str(quotas_path))
    groups = [g for g in groups if g["count"] > 0]
    if not groups:
        where = "any zone" if zones is None else f"zones {sorted(zones)}"
        raise InstanceError(f"no whole VM of {wanted} in {where}", "cluster")
    used = sorted({g["gpu_type"] for g in groups})
    present = {(g["gpu_type"], g["zone"]) for g in groups}
    events = [e for e in events if (e.gpu_type, e.zone) in present]  # columns that never had a GPU

    workload = read_training_config(find_training_config(ref, model), model_preset)
    if global_batch_size is not None:
        workload["global_batch_size"] = global_batch_size
    # V100s have no bf16; Sailor trains in fp16 mixed precision, its evaluation's simulator in fp32
    workload["precision"] = "fp32" if preset == "sailor" else "fp16"
    workload["profiles"] = [{"gpu_type": g, "path": str(ref / "profiles" / model / g / "profile.json"),
                             "format": "sailor"} for g in used]
    cluster: dict[str, Any] = {
        "node_groups": groups,
        "network": {"egress": read_egress_prices(ref / "network" / "communication_cost_gcp_usd_per_GB.json")
                    .model_dump()},
    }
    if memory_from_config and preset != "sailor":
        cluster["gpu_overrides"] = {g: {"memory_gib": cluster_config[g]["mem_per_gpu_bytes"] / GIB} for g in used}
    out: dict[str, Any] = {
        "name": name or f"sailor_{model}_{'_'.join(used)}",
        "description": f"Sailor data ({ref}): model {model}, GPUs {used}",
        "cluster": cluster,
        "workload": workload,
        "objective": {"kind": objective},
        "constraints": dict(constraints or {}),
        "events": {"availability": [e.model_dump() for e in events]},
    }
    if preset == "sailor":
        out["estimators"] = {"preset": "sailor", "options": {
            "llm_info": str(ref / "model" / "llm_info.json"), "sailor_model": model,
            "bandwidth_file": str(ref / "network" / "multizone_bandwidths_het.json")}}
    elif use_sailor_estimators:
        out["estimators"] = {"time": "profile", "comm": "sailor_poly", "options": {
            "llm_info": str(ref / "model" / "llm_info.json"), "sailor_model": model,
            "bandwidth_file": str(ref / "network" / "multizone_bandwidths_het.json"),
            "intra_node_file": str(ref / "network" / "intra_node_bandwidths.json")}}
    return out
