"""Layer-wise checkpoints: per layer unit, per TP shard, parameters and optimizer state.

Layout (AutoHet sec. IV, seed 002: layer-wise checkpoints let a new plan with other stage
boundaries or TP degrees pick up exactly the layers it needs):

    DIR/meta.json                      iteration, model, optimizer, TP degree per unit
    DIR/unit_0007/tp0of2.pt            {param name: {value, shard_dim, full_shape, state}}
    DIR/unit_0007/tp1of2.pt

Replica 0 of every stage writes its units (each TP rank its own shard file, so saving needs no
gather). Loading merges a unit's shard files into full tensors and cuts the shard the loading
rank needs: TP split (1 -> 2) and merge (2 -> 1) fall out of the same code. Optimizer state
tensors shaped like their parameter are sharded the same way; scalars (Adam's step) are copied.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from hetplan.errors import PlanError
from hetplan.runtime.model import ParamInfo, TPContext, shard_of

META = "meta.json"


def step_dir(root: Path, iteration: int) -> Path:
    """Where a run that checkpoints every few steps (RunOptions.checkpoint_every) puts the
    checkpoint taken once `iteration` iterations are done: one folder per step, so a new plan
    with other TP degrees never mixes its shard files with an older plan's."""
    return root / f"step_{iteration:08d}"


def _complete(root: Path) -> list[Path]:
    """The complete per-step checkpoints under `root`, oldest first (meta.json is written last,
    after every rank's shards)."""
    return sorted(d for d in root.glob("step_*") if (d / META).exists())


def latest(root: Path) -> Path | None:
    """The newest complete, undamaged per-step checkpoint under `root`, or None: a shard cut short
    (a crash or a full disk after meta.json was written, a copy gone wrong) made every rank fail
    on loading it, while the step before it (`prune` keeps two) was intact."""
    good = [d for d, why in _checked(root) if why is None]
    return good[-1] if good else None


def damaged(root: Path) -> list[tuple[Path, str]]:
    """The complete per-step checkpoints newer than `latest(root)` and why each is passed over."""
    checked = _checked(root)
    good = [d for d, why in checked if why is None]
    return [(d, why) for d, why in checked if why is not None and (not good or d.name > good[-1].name)]


def _checked(root: Path) -> list[tuple[Path, str | None]]:
    """Each complete per-step checkpoint, oldest first, with its `damage` (None: intact), read once."""
    return [(d, damage(d)) for d in _complete(root)]


def damage(root: Path) -> str | None:
    """What is wrong with the shard files meta.json lists (name and size, written once every rank
    had written its files), or None; a checkpoint whose meta.json lists none is not checked, nor
    is one whose meta.json cannot be read (`read_meta` says that)."""
    try:
        files = json.loads((root / META).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    for name, size in (files or {}).items():
        try:
            have = (root / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if have != size:
            return f"{name} has {have} bytes, {size} were written"
    return None


def shard_sizes(root: Path) -> dict[str, int]:
    """Every shard file under `root` the writing host sees, by path relative to `root`."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.glob("unit_*/tp*of*.pt"))}


def set_aside(root: Path, log: Callable[[str], None]) -> None:
    """Rename the damaged checkpoints newer than the newest intact one to damaged_step_*, saying
    so: a run resumed before them writes those steps again, into clean folders."""
    for d, why in damaged(root):
        aside = d.with_name(f"damaged_{d.name}")
        if aside.exists():
            shutil.rmtree(aside, ignore_errors=True)
        d.rename(aside)
        log(f"{d} is damaged ({why}); resuming from the step before it, {d.name} set aside as {aside.name}")


def prune(root: Path, keep: int = 2) -> None:
    """Delete all but the newest `keep` complete per-step checkpoints (and unfinished older ones)."""
    done = _complete(root)
    if not done:
        return
    kept = set(done[-keep:]) if keep > 0 else set()
    for d in root.glob("step_*"):
        if d not in kept and d.name < done[-1].name:
            shutil.rmtree(d, ignore_errors=True)


def unit_dir(root: Path, unit: int) -> Path:
    return root / f"unit_{unit:04d}"


def save_rank(root: Path, layer_start: int, layer_end: int, tp: TPContext,
              params: list[tuple[ParamInfo, nn.Parameter]], optimizer: torch.optim.Optimizer) -> list[Path]:
    """Write this rank's shards of the units it owns (a tied LM head copy is saved as unit 0 by
    the embedding's stage, not again here)."""
    by_unit: dict[int, dict[str, Any]] = {}
    for info, p in params:
        if not layer_start <= info.unit < layer_end:
            continue
        state = {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v)
                 for k, v in optimizer.state.get(p, {}).items()}
        by_unit.setdefault(info.unit, {})[info.name] = {
            "value": p.detach().cpu().clone(), "shard_dim": info.shard_dim,
            "full_shape": list(info.full_shape), "state": state}
    written = []
    for unit, entries in by_unit.items():
        d = unit_dir(root, unit)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"tp{tp.rank}of{tp.size}.pt"
        torch.save(entries, path)
        written.append(path)
    return written


def write_meta(root: Path, iteration: int, model: dict[str, Any], optimizer: str, tp_of_unit: dict[int, int],
               save_s: float | None = None, dtype: str | None = None, files: dict[str, int] | None = None) -> None:
    """`save_s`: how long the ranks took to write their shards (a supervisor counts it as downtime
    when the checkpoint was taken to stop); `dtype`: the run's parameter dtype (float32, ...);
    `files`: the shard files' sizes (`shard_sizes`), which `latest` checks."""
    meta = {"format": 1, "iteration": iteration, "model": model, "optimizer": optimizer,
            "tp_of_unit": {str(u): t for u, t in sorted(tp_of_unit.items())}}
    if dtype is not None:
        meta["dtype"] = dtype
    if files is not None:
        meta["files"] = files
    if save_s is not None:
        meta["save_s"] = save_s
    (root / META).write_text(json.dumps(meta, indent=2) + "\n")


def read_meta(root: Path) -> dict[str, Any]:
    path = root / META
    if not path.exists():
        raise PlanError(f"no checkpoint at {root} ({META} missing)", "load_checkpoint")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # a truncated file (a crash mid-write, a full disk)
        raise PlanError(f"{path} is not a checkpoint's metadata ({exc}); remove that step's folder or use "
                        f"another --checkpoint-dir", "--checkpoint-dir") from None
    if not isinstance(meta, dict):
        raise PlanError(f"{path} is not a checkpoint's metadata (a {type(meta).__name__})", "--checkpoint-dir")
    return meta


def check_meta(meta: dict[str, Any], root: Path, model: dict[str, Any], optimizer: str, option: str) -> None:
    """Refuse to resume from the checkpoint at `root` (its meta.json read: `meta`) with another model
    or optimizer than the one that wrote it, naming `option`: every rank would fail on loading it,
    and a supervisor restarted them 50 times. Fields meta.json does not record (older checkpoints)
    are not compared."""
    recorded = meta.get("model") if isinstance(meta.get("model"), dict) else {}
    differ = [f"{k} {recorded[k]!r} (this run: {v!r})" for k, v in model.items() if k in recorded and recorded[k] != v]
    if differ:
        raise PlanError(f"{root} holds a checkpoint of another model: {', '.join(differ)}; give the same model "
                        f"options or another folder", option)
    if meta.get("optimizer") and meta["optimizer"] != optimizer:
        raise PlanError(f"{root} holds a checkpoint written with optimizer {meta['optimizer']}, this run uses "
                        f"{optimizer}; resume with {meta['optimizer']} or use another folder", option)


def dtype_note(meta: dict[str, Any], root: Path, dtype: str) -> str | None:
    """A line when the checkpoint's parameters were written in another dtype than `dtype` (they
    are converted on loading: a float64 run resumed under float32 silently lost its precision, and
    its losses left an uninterrupted run's). None when they agree or meta.json does not say."""
    wrote = meta.get("dtype")
    if not wrote or wrote == dtype:
        return None
    return (f"{root} was written in {wrote}; this run trains in {dtype}, so its values are converted "
            f"(resume with --dtype {wrote} to continue as it was)")


def _full(shards: list[dict[str, Any]], name: str, field: str | None) -> Any:
    first = shards[0][name]
    pick = (lambda e: e["value"]) if field is None else (lambda e: e["state"][field])
    value = pick(first)
    if not torch.is_tensor(value) or first["shard_dim"] is None or value.dim() == 0:
        return value
    return torch.cat([pick(s[name]) for s in shards], dim=first["shard_dim"])


def _load_shard(path: Path) -> dict[str, Any]:
    """One shard file; PlanError naming it when it is missing or not a checkpoint (torch's own message
    for a truncated or overwritten file ends on a link to its documentation, naming no file)."""
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise PlanError(f"{path} is missing", "load_checkpoint") from None
    except Exception as exc:  # noqa: BLE001 - pickle, zip and runtime errors of a damaged file
        # the type only: torch's text for a damaged file advises loading it with weights_only=False
        raise PlanError(f"{path} is not a readable checkpoint shard (damaged or truncated: "
                        f"{type(exc).__name__})", "load_checkpoint") from None


def load_rank(root: Path, tp: TPContext, params: list[tuple[ParamInfo, nn.Parameter]],
              optimizer: torch.optim.Optimizer) -> int:
    """Fill this rank's parameters and optimizer state from a checkpoint; returns its iteration."""
    meta = read_meta(root)
    check_meta(meta, root, {}, type(optimizer).__name__.lower(), "optimizer")  # a rank run without the CLI's check
    cache: dict[int, list[dict[str, Any]]] = {}
    for info, p in params:
        if info.unit not in cache:
            t = meta["tp_of_unit"].get(str(info.unit))
            if t is None:
                raise PlanError(f"checkpoint {root} has no layer unit {info.unit}", "load_checkpoint")
            cache[info.unit] = [_load_shard(unit_dir(root, info.unit) / f"tp{k}of{t}.pt") for k in range(t)]
        shards = cache[info.unit]
        if info.name not in shards[0]:
            raise PlanError(f"checkpoint unit {info.unit} has no parameter {info.name}", "load_checkpoint")
        full = _full(shards, info.name, None)
        if tuple(full.shape) != info.full_shape:
            raise PlanError(f"checkpoint parameter {info.key} has shape {tuple(full.shape)}, the model "
                            f"{info.full_shape}", "load_checkpoint")
        with torch.no_grad():
            p.copy_(shard_of(full, info.shard_dim, tp))
        state = {}
        for field in shards[0][info.name]["state"]:
            value = _full(shards, info.name, field)
            if torch.is_tensor(value) and value.shape == full.shape:
                value = shard_of(value, info.shard_dim, tp).to(device=p.device, dtype=p.dtype).clone()
            state[field] = value
        if state:
            optimizer.state[p] = state
    return int(meta["iteration"])
