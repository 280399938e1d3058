"""Single-process reference training: the whole model, no parallelism, the whole global batch.

Runs the same synthetic data and the same initial weights as any plan of the same model, with
loss = mean over the global batch of the per-sequence mean token cross-entropy, one backward
over the full batch, one optimizer step per iteration. A distributed run of any valid plan
must end with the same parameters (up to floating-point reassociation).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hetplan.runtime.data import SyntheticTokens
from hetplan.runtime.execute import DTYPES, _make_optimizer
from hetplan.runtime.model import ModelConfig, StageModule


@dataclass(frozen=True)
class ReferenceResult:
    losses: list[float]
    params: dict[str, torch.Tensor]  # key 'unit/name' -> full tensor


def reference_train(cfg: ModelConfig, *, global_batch_size: int, steps: int, optimizer: str = "adam",
                    lr: float = 1e-3, seed: int = 0, dtype: str = "float64", start_iteration: int = 0,
                    threads: int | None = 1) -> ReferenceResult:
    """`threads` caps torch's intra-op threads while it runs (tiny models on a shared CPU are
    hundreds of times slower with spinning OpenMP workers); None leaves the setting alone."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(cfg, global_batch_size, steps, optimizer, lr, seed, dtype, start_iteration)
    finally:
        torch.set_num_threads(before)


def _train(cfg: ModelConfig, global_batch_size: int, steps: int, optimizer: str, lr: float, seed: int, dtype: str,
           start_iteration: int) -> ReferenceResult:
    model = StageModule(cfg, 0, cfg.num_units, seed=seed, dtype=DTYPES[dtype])
    params = model.logical_params()
    opt = _make_optimizer(optimizer, [p for _, p in params], lr)
    data = SyntheticTokens(cfg.vocab_size, cfg.seq_len, seed)
    losses = []
    for it in range(start_iteration, start_iteration + steps):
        tokens = data.batch(it, 0, global_batch_size)
        opt.zero_grad(set_to_none=True)
        loss = model(tokens[:, :-1], tokens[:, 1:], 1.0 / global_batch_size)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return ReferenceResult(losses, {i.key: p.detach().clone() for i, p in params})


def assemble_dump(dump_dir: str | Path) -> dict[str, dict[tuple[int, int], torch.Tensor]]:
    """Full parameters from an executor `--dump-params` directory: key -> {(stage, replica): tensor},
    each replica's TP shards concatenated along their split dimension."""
    shards: dict[str, dict[tuple[int, int], dict[int, torch.Tensor]]] = {}
    dims: dict[str, int | None] = {}
    for path in sorted(Path(dump_dir).glob("rank*.pt")):
        dump = torch.load(path, weights_only=False)
        r = dump["rank"]
        for key, value in dump["params"].items():
            shards.setdefault(key, {}).setdefault((r["stage"], r["replica"]), {})[r["tp_rank"]] = value
            dims[key] = dump["shard_dims"][key]
    out: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
    for key, replicas in shards.items():
        for holder, by_tp in replicas.items():
            parts = [by_tp[k] for k in sorted(by_tp)]
            out.setdefault(key, {})[holder] = parts[0] if dims[key] is None else torch.cat(parts, dim=dims[key])
    return out
