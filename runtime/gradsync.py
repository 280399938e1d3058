"""Gradient synchronisation per layer unit across the replicas that hold it.

Every replica computes gradients of (sum of per-sequence losses of its share) / global batch,
so the full-batch gradient is the plain *sum* over replicas and microbatches. This equals
weighting each replica's mean-loss gradient by share / global microbatch (Zorse sec. 4.2: uneven
microbatches need share-proportional weights; folding the weight into the loss makes it exact).

The spec's entries (see spec.GradSyncSpec) are bucketed by (mode, groups), so one collective
carries all units that share a holder set:

* sharded: holders share a TP degree; TP rank k all-reduces its flat shard buffer with the other
  holders' TP ranks k.
* gather: TP degrees differ (e.g. a V100 TP=2 and an A100 TP=1 replica of one stage); each
  replica gathers its shards to full gradients on TP rank 0, the leaders all-reduce full
  gradients, and TP rank 0 scatters every rank its shards (replicated parameters included).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hetplan.errors import PlanError
from hetplan.runtime.model import ParamInfo, TPContext
from hetplan.runtime.spec import GradSyncSpec, LaunchSpec, RankSpec


@dataclass
class Bucket:
    mode: str
    groups: tuple[str, ...]
    items: list[tuple[ParamInfo, nn.Parameter]]


def _matches(entry: GradSyncSpec, info: ParamInfo) -> bool:
    if entry.params:
        return info.key in entry.params
    return info.unit in entry.units and info.key not in entry.exclude


def _is_holder(entry: GradSyncSpec, me: RankSpec) -> bool:
    return any(h.stage == me.stage and h.replica == me.replica for h in entry.holders)


def plan_buckets(spec: LaunchSpec, me: RankSpec, params: list[tuple[ParamInfo, nn.Parameter]]) -> list[Bucket]:
    """Which of this rank's parameters are reduced by which collective; checks coverage."""
    buckets: dict[tuple[str, tuple[str, ...]], Bucket] = {}
    count: dict[str, int] = {}
    needs_sync = me.dp_size > 1
    for entry in spec.grad_sync:
        if not _is_holder(entry, me):
            continue
        for info, param in params:
            if _matches(entry, info):
                count[info.key] = count.get(info.key, 0) + 1
                bucket = buckets.setdefault((entry.mode, entry.groups), Bucket(entry.mode, entry.groups, []))
                bucket.items.append((info, param))
    for info, _ in params:
        n = count.get(info.key, 0)
        if n > 1 or (n == 0 and needs_sync):
            raise PlanError(f"parameter {info.key} of rank {me.rank} is covered by {n} gradient sync entries; "
                            f"expected exactly one", "grad_sync")
    for bucket in buckets.values():
        bucket.items.sort(key=lambda ip: (ip[0].unit, ip[0].name))
    return list(buckets.values())


def _grads(items) -> list[torch.Tensor]:
    out = []
    for _, p in items:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        out.append(p.grad)
    return out


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
    offset = 0
    for t in targets:
        n = t.numel()
        t.copy_(flat[offset: offset + n].view_as(t))
        offset += n


class GradSync:
    def __init__(self, me: RankSpec, buckets: list[Bucket], groups: dict[str, object], tp: TPContext):
        self.me, self.buckets, self.groups, self.tp = me, buckets, groups, tp

    def sync(self) -> None:
        for bucket in self.buckets:
            if bucket.mode == "sharded":
                self._sharded(bucket)
            else:
                self._gather(bucket)

    def _sharded(self, bucket: Bucket) -> None:
        grads = _grads(bucket.items)
        flat = _flatten(grads)
        dist.all_reduce(flat, group=self.groups[bucket.groups[self.me.tp_rank]])
        _unflatten_into(flat, grads)

    def _gather(self, bucket: Bucket) -> None:
        grads = _grads(bucket.items)
        local = _flatten(grads)
        tp, leader = self.tp, self.me.tp_rank == 0
        if tp.active:
            parts = [torch.empty_like(local) for _ in range(tp.size)] if leader else None
            dist.gather(local, parts, group=tp.group, group_dst=0)
        else:
            parts = [local]
        if leader:
            full = self._merge(parts, bucket.items, grads)
            dist.all_reduce(full, group=self.groups[bucket.groups[0]])
            outs = self._split(full, bucket.items, tp.size)
        if tp.active:
            dist.scatter(local, outs if leader else None, group=tp.group, group_src=0)
        else:
            local = outs[0]
        _unflatten_into(local, grads)

    @staticmethod
    def _merge(parts: list[torch.Tensor], items, grads: list[torch.Tensor]) -> torch.Tensor:
        """Full gradients, flattened, from the TP ranks' flat shard buffers."""
        pieces, offset = [], 0
        for (info, _), g in zip(items, grads):
            n = g.numel()
            shards = [p[offset: offset + n].view_as(g) for p in parts]
            offset += n
            pieces.append(shards[0] if info.shard_dim is None else torch.cat(shards, dim=info.shard_dim))
        return _flatten(pieces)

    @staticmethod
    def _split(full: torch.Tensor, items, tp_size: int) -> list[torch.Tensor]:
        """Per TP rank, the flat buffer of its shards of the full gradients."""
        per_rank: list[list[torch.Tensor]] = [[] for _ in range(tp_size)]
        offset = 0
        for info, _ in items:
            n = 1
            for d in info.full_shape:
                n *= d
            value = full[offset: offset + n].view(info.full_shape)
            offset += n
            for k in range(tp_size):
                per_rank[k].append(value if info.shard_dim is None else value.chunk(tp_size, dim=info.shard_dim)[k])
        return [_flatten(ts) for ts in per_rank]
