"""The typed plan: stages with contiguous layer ranges, each with replicas that may differ.

Batch semantics (Zorse-style uneven microbatches, seed 001 sec. 4.2):
an iteration processes `global_batch_size` sequences as `num_microbatches` pipeline steps. In each
step one *global microbatch* of G = global_batch_size / num_microbatches sequences flows through
every stage; stage s splits it over its replicas, replica r taking `microbatch_share` sequences,
so sum_r share(s, r) = G on every stage. Between stages whose splits differ, sequences are
redistributed by contiguous sample ranges (`sample_ranges`). Homogeneous DP = D with microbatch
size b is the special case share = b for all D replicas, G = D * b.

Layer units: 0 = embedding, 1..L = transformer blocks, L + 1 = head (final norm + LM head);
a stage holds units [layer_start, layer_end).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetplan.catalog import Int, ModelArch
from hetplan.errors import InstanceError, PlanError
from hetplan.instance import Instance, format_validation_error, kind_of, read_structured

_STRICT = ConfigDict(frozen=True, extra="forbid")


class Replica(BaseModel):
    """One replica of a stage: a TP group of `tp` GPUs of one type on one node."""

    model_config = _STRICT
    gpu_type: str
    tp: Int = Field(default=1, ge=1)
    zone: str | None = Field(default=None, description="required unless `node` is given")
    node: str | None = Field(default=None, description="node id '<group>-<k>'; assigned first-fit if absent")
    gpus: tuple[int, ...] | None = Field(default=None, description="local GPU indices on the node, len = tp")
    microbatch_share: Int | None = Field(default=None, ge=1, description="sequences of each global microbatch")

    @model_validator(mode="after")
    def _gpus_need_node(self) -> "Replica":
        # Placement would pick a node first fit and overwrite the indices without a word.
        if self.gpus is not None and self.node is None:
            raise ValueError("'gpus' are local indices on a node: give 'node' too, or neither")
        return self


class Stage(BaseModel):
    model_config = _STRICT
    layer_start: Int = Field(ge=0)
    layer_end: Int = Field(gt=0, description="exclusive")
    replicas: tuple[Replica, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _non_empty(self) -> "Stage":
        if self.layer_end <= self.layer_start:
            raise ValueError(f"empty layer range [{self.layer_start}, {self.layer_end})")
        return self

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


class Plan(BaseModel):
    model_config = _STRICT
    name: str = ""
    instance: str | None = None
    schedule: Literal["1F1B", "GPipe"] = "1F1B"
    num_microbatches: Int = Field(ge=1, description="pipeline steps (gradient accumulation) per iteration")
    micro_batch_size: Int | None = Field(default=None, ge=1, description="share of replicas that give none")
    batch_rounding: Literal["exact", "ceil"] = Field(
        default="exact", description="exact: global microbatch x num_microbatches = global_batch_size; ceil: "
        "num_microbatches = ceil(global_batch_size / global microbatch), Sailor's rule, which may overshoot")
    stages: tuple[Stage, ...] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def share(self, stage: int, replica: int) -> int:
        rep = self.stages[stage].replicas[replica]
        if rep.microbatch_share is not None:
            return rep.microbatch_share
        if self.micro_batch_size is None:
            raise PlanError("replica has no microbatch_share and the plan no micro_batch_size",
                            f"stages[{stage}].replicas[{replica}]")
        return self.micro_batch_size

    def shares(self, stage: int) -> list[int]:
        return [self.share(stage, r) for r in range(len(self.stages[stage].replicas))]

    def distinct_shares(self) -> set[int]:
        """The microbatch shares the plan's replicas take (one value: a uniform microbatch size)."""
        return {b for s in range(len(self.stages)) for b in self.shares(s)}

    @property
    def global_microbatch(self) -> int:
        return sum(self.shares(0))

    @property
    def num_gpus(self) -> int:
        return sum(r.tp for s in self.stages for r in s.replicas)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_defaults=False), indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


_PLAN_KEYS = "a plan must be a mapping with keys schedule, num_microbatches, stages, ..."


def plan_from_dict(data: Any) -> Plan:
    if not isinstance(data, dict):
        raise PlanError(_PLAN_KEYS)
    try:
        return Plan(**data)
    except ValidationError as exc:
        raise PlanError(format_validation_error(exc)) from None
    except TypeError as exc:  # e.g. a key that is not a string
        raise PlanError(str(exc)) from None


def load_plan(path: str | Path) -> Plan:
    """Load a plan file; a bundled plan may be named without its path. Every failure is a PlanError."""
    path = Path(path)
    if not path.exists():
        from hetplan.bundled import bundled_plan_path

        try:
            path = bundled_plan_path(str(path))
        except InstanceError as exc:  # the lookup is shared with instances; this is about a plan
            raise PlanError(str(exc)) from None
    data = read_structured(path, PlanError)
    if not isinstance(data, dict):
        raise PlanError(f"{_PLAN_KEYS}; got {kind_of(data)}", str(path))
    return plan_from_dict(data)


def sample_ranges(shares: list[int]) -> list[tuple[int, int]]:
    """Contiguous [start, end) sample ranges of a global microbatch for replicas with these shares."""
    out, start = [], 0
    for s in shares:
        out.append((start, start + s))
        start += s
    return out


def redistribution(src_shares: list[int], dst_shares: list[int]) -> list[tuple[int, int, int]]:
    """(src replica, dst replica, sequences) moved between consecutive stages, by range overlap.

    Both share lists tile the same global microbatch in order, so one merge walk over the two
    lists of ranges finds every overlap: linear in the replicas (a double loop took 10-21 s on a
    plan of 4,096 replicas)."""
    moves: list[tuple[int, int, int]] = []
    i = j = 0
    a0 = b0 = 0  # starts of the current source and destination ranges
    while i < len(src_shares) and j < len(dst_shares):
        a1, b1 = a0 + src_shares[i], b0 + dst_shares[j]
        n = min(a1, b1) - max(a0, b0)
        if n > 0:
            moves.append((i, j, n))
        if a1 <= b1:
            i, a0 = i + 1, a1
        else:
            j, b0 = j + 1, b1
    return moves


# ---- validation against an instance --------------------------------------------------------------
@dataclass(frozen=True)
class Worker:
    """One GPU process of a plan: the rank table row (rank order: stage, replica, TP rank)."""

    rank: int
    stage: int
    replica: int
    tp_rank: int
    node_id: str
    local_gpu: int
    gpu_type: str
    zone: str
    region: str


def validate_plan(instance: Instance, plan: Plan) -> Plan:
    """Check a plan against an instance and return it with every replica placed on GPUs.

    Raises PlanError naming the offending field: layers not covered exactly once, inconsistent
    batch split, a TP degree that does not split the model, unknown node or GPU type, TP across
    nodes, a GPU used twice, more GPUs than exist.
    """
    _check_layers(instance, plan)
    _check_batch(instance, plan)
    placed = _place(instance, plan)
    _check_tp(instance, plan)  # after placement: a TP group larger than its node is the first thing to say
    return placed


def tp_indivisible(arch: ModelArch, tp: int) -> list[str]:
    """The model sizes a TP degree does not divide, e.g. ['num_heads 16'] for tp 3 (empty: it splits).

    Tensor parallelism splits attention heads, KV heads and MLP hidden units evenly over the group
    (Megatron's layout, and the runtime's). The vocabulary is not required to split: Megatron pads
    it to a multiple of the degree."""
    sizes = {"num_heads": arch.num_heads, "ffn_hidden_size": arch.ffn_hidden_size}
    if arch.num_kv_heads is not None:
        sizes["num_kv_heads"] = arch.num_kv_heads
    return [f"{name} {value}" for name, value in sizes.items() if value % tp]


def _check_tp(instance: Instance, plan: Plan) -> None:
    arch = instance.model_arch
    for i, stage in enumerate(plan.stages):
        for j, rep in enumerate(stage.replicas):
            bad = tp_indivisible(arch, rep.tp)
            if bad:
                raise PlanError(f"tp={rep.tp} does not divide {' and '.join(bad)} of {arch.name}; "
                                f"tensor parallelism splits them evenly", f"stages[{i}].replicas[{j}].tp")


def _check_layers(instance: Instance, plan: Plan) -> None:
    units = instance.model_arch.num_units
    expected = 0
    for i, stage in enumerate(plan.stages):
        if stage.layer_start != expected:
            what = "overlaps the previous stage" if stage.layer_start < expected else "leaves a gap"
            raise PlanError(f"layer_start {stage.layer_start} {what} (expected {expected}); "
                            f"layers must be covered exactly once in order", f"stages[{i}].layer_start")
        expected = stage.layer_end
    if expected != units:
        raise PlanError(f"stages cover layer units [0, {expected}) but the model has {units} "
                        f"(embedding + {units - 2} blocks + head)", "stages")


def _check_batch(instance: Instance, plan: Plan) -> None:
    g0 = plan.global_microbatch
    for i in range(len(plan.stages)):
        gi = sum(plan.shares(i))
        if gi != g0:
            raise PlanError(f"microbatch shares sum to {gi}, stage 0's to {g0}: every stage must split "
                            f"the same global microbatch", f"stages[{i}]")
    batch = instance.workload.global_batch_size
    if plan.batch_rounding == "ceil":
        if plan.num_microbatches != -(-batch // g0):
            raise PlanError(f"num_microbatches {plan.num_microbatches} != ceil(global_batch_size {batch} / global "
                            f"microbatch {g0}) = {-(-batch // g0)} (batch_rounding ceil)", "num_microbatches")
        return
    if g0 * plan.num_microbatches != batch:
        raise PlanError(f"global microbatch {g0} x num_microbatches {plan.num_microbatches} = "
                        f"{g0 * plan.num_microbatches} != global_batch_size {batch}", "num_microbatches")


def _place(instance: Instance, plan: Plan) -> Plan:
    free: dict[str, list[int]] = {n.node_id: list(range(n.num_gpus)) for n in instance.nodes}
    # Explicit placements first, so first-fit never takes a GPU a later replica names.
    for i, stage in enumerate(plan.stages):
        for j, rep in enumerate(stage.replicas):
            if rep.node is not None:
                _claim_explicit(instance, rep, free, f"stages[{i}].replicas[{j}]")
    order = placement_order(instance.nodes)
    stages = []
    for i, stage in enumerate(plan.stages):
        reps = []
        for j, rep in enumerate(stage.replicas):
            field = f"stages[{i}].replicas[{j}]"
            if rep.node is None:
                rep = _claim_first_fit(instance, rep, free, field, order)
            elif rep.gpus is None:
                rep = _claim_on_node(rep, free, field)
            reps.append(rep)
        stages.append(stage.model_copy(update={"replicas": tuple(reps)}))
    return plan.model_copy(update={"stages": tuple(stages)})


def placement_order(nodes):
    """The order first fit tries nodes in: the cheapest first (spot beside on-demand nodes of one
    type and zone: the planner prices a type and zone at its least price, planner.inputs `_quotas`,
    and a replica placed on the dearer node first cost a min-cost plan 7.5 % more), then the
    widest (the model's all-reduce floors pack a stage's replicas on as few nodes as hold them:
    two replicas first fit on two 1-GPU nodes beside a free 2-GPU node made a plan the model put
    at 0.0048 s run 0.29 s over a 1 GB/s network), then the instance's order."""
    return sorted(nodes, key=lambda n: (n.price_per_gpu_hour_usd, -n.num_gpus))


def _claim_explicit(instance: Instance, rep: Replica, free: dict[str, list[int]], field: str) -> None:
    node = instance.node_by_id.get(rep.node)
    if node is None:
        raise PlanError(f"unknown node {rep.node!r}", f"{field}.node")
    if node.gpu_type != rep.gpu_type:
        raise PlanError(f"node {node.node_id} has {node.gpu_type}, not {rep.gpu_type}", f"{field}.gpu_type")
    if rep.zone is not None and rep.zone != node.zone:
        raise PlanError(f"node {node.node_id} is in zone {node.zone}, not {rep.zone}", f"{field}.zone")
    if rep.tp > node.num_gpus:
        raise PlanError(f"tp={rep.tp} exceeds the {node.num_gpus} GPUs of node {node.node_id}: TP stays inside a node",
                        f"{field}.tp")
    gpus = list(rep.gpus) if rep.gpus is not None else None
    if gpus is None:
        if len(free[node.node_id]) < rep.tp:
            raise PlanError(f"node {node.node_id} has {len(free[node.node_id])} free GPUs, replica needs {rep.tp}", field)
        return  # GPUs picked in the second pass from what is left on this node
    if len(gpus) != rep.tp:
        raise PlanError(f"{len(gpus)} GPU indices given for tp={rep.tp}", f"{field}.gpus")
    for g in gpus:
        if g not in free[node.node_id]:
            why = "out of range" if not 0 <= g < node.num_gpus else "already used by another replica"
            raise PlanError(f"GPU {node.node_id}:{g} is {why}", f"{field}.gpus")
        free[node.node_id].remove(g)


def _claim_on_node(rep: Replica, free: dict[str, list[int]], field: str) -> Replica:
    left = free[rep.node]
    if len(left) < rep.tp:
        raise PlanError(f"node {rep.node} has {len(left)} free GPUs left, replica needs {rep.tp}", field)
    gpus = tuple(left[: rep.tp])
    del left[: rep.tp]
    return rep.model_copy(update={"gpus": gpus, "zone": rep.zone})


def _claim_first_fit(instance: Instance, rep: Replica, free: dict[str, list[int]], field: str,
                     order: list) -> Replica:
    """The first node of `order` (`_place`: the cheapest first) with `rep.tp` free GPUs."""
    if rep.gpu_type not in instance.gpu_types:
        raise PlanError(f"GPU type {rep.gpu_type!r} is not in the cluster (has {instance.gpu_types})", f"{field}.gpu_type")
    if rep.zone is None:
        raise PlanError("a replica needs a zone or a node", f"{field}.zone")
    zones = sorted({g.zone for g in instance.cluster.node_groups})
    if rep.zone not in zones:  # else "no node ... has 1 free GPUs left", as if the zone were full
        raise PlanError(f"zone {rep.zone!r} is not in the cluster (has {zones})", f"{field}.zone")
    for node in order:
        if node.gpu_type == rep.gpu_type and node.zone == rep.zone and len(free[node.node_id]) >= rep.tp:
            gpus = tuple(free[node.node_id][: rep.tp])
            del free[node.node_id][: rep.tp]
            return rep.model_copy(update={"node": node.node_id, "gpus": gpus})
    alike = [n for n in instance.nodes if n.gpu_type == rep.gpu_type and n.zone == rep.zone]
    if not alike:
        raise PlanError(f"the cluster has no {rep.gpu_type} node in {rep.zone}", field)
    widest = max(n.num_gpus for n in alike)
    if rep.tp > widest:  # not a shortage: a TP group stays on one node
        raise PlanError(f"tp={rep.tp} exceeds the {widest} GPUs of every {rep.gpu_type} node in {rep.zone}: TP stays "
                        f"inside a node", f"{field}.tp")
    have = sum(len(free[n.node_id]) for n in alike)
    why = ("the plan uses more GPUs than exist" if have < rep.tp else
           "they are split over nodes, and TP stays inside a node")
    raise PlanError(f"no node of {rep.gpu_type} in {rep.zone} has {rep.tp} free GPUs left ({have} free in total "
                    f"there): {why}", field)


def placed_gpus(rep: Replica) -> tuple[int, ...]:
    if rep.node is None or rep.gpus is None:
        raise PlanError("replica is not placed; call validate_plan first")
    return rep.gpus


def workers(instance: Instance, plan: Plan) -> list[Worker]:
    """The rank table of a placed plan: ranks in (stage, replica, TP rank) order."""
    out = []
    for i, stage in enumerate(plan.stages):
        for j, rep in enumerate(stage.replicas):
            node = instance.node_by_id[rep.node]
            for t, gpu in enumerate(placed_gpus(rep)):
                out.append(Worker(len(out), i, j, t, node.node_id, gpu, rep.gpu_type, node.zone, node.region))
    return out
