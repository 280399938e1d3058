"""Sailor's plan format <-> hetplan plans.

Sailor's planner (`SailorPlanner.get_sorted_plans`, eth-easl/sailor cf2c8e3) returns
`{"mbs": b, "pipeline_list": [{"num_stages": P, "layers_per_stage": [[units]], "dp": [D_i],
"tmp_per_stage": [[ [[[gpu, gpus_per_node, zone]], tp] per replica ] per stage]}]}` and its simulator
(`convert_homogeneous`) runs m = ceil(B / (b x D_0)) microbatches of b sequences per replica. A hetplan
plan says the same with `micro_batch_size` b, a replica per entry and `batch_rounding: ceil`.
"""
from __future__ import annotations

from typing import Any, Mapping

from hetplan.errors import PlanError
from hetplan.instance import Instance
from hetplan.plan import Plan, Replica, Stage


def is_sailor_plan(data: Any) -> bool:
    """Whether a parsed plan file is in Sailor's format (recognised by its keys)."""
    return isinstance(data, Mapping) and "pipeline_list" in data and "mbs" in data


def _replica(entry: Any, where: str) -> Replica:
    try:
        vms, tp = entry
        if len(vms) != 1:
            raise PlanError(f"a replica on {len(vms)} VMs (Metis' TP across nodes) has no hetplan form; "
                            f"TP stays inside a node", where)
        gpu, _, zone = vms[0]
        return Replica(gpu_type=str(gpu), tp=int(tp), zone=str(zone))
    except PlanError:
        raise
    except (TypeError, ValueError) as exc:
        raise PlanError(f"expected [[[gpu_type, gpus_per_node, zone]], tp], got {entry!r} ({exc})", where) from None


def plan_from_sailor(data: Mapping[str, Any], instance: Instance, name: str = "") -> Plan:
    """The hetplan plan of a Sailor plan dict (one pipeline; every stage with the same replica count)."""
    pipelines = data.get("pipeline_list")
    if not isinstance(pipelines, list) or len(pipelines) != 1:
        raise PlanError("a Sailor plan here has exactly one pipeline (as Sailor's planner emits)", "pipeline_list")
    pipe = pipelines[0]
    try:
        mbs = int(data["mbs"])
        layers, tmp, dp = pipe["layers_per_stage"], pipe["tmp_per_stage"], list(pipe["dp"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"missing or bad key {exc}; a Sailor plan has mbs and pipeline_list[0] with "
                        f"layers_per_stage, tmp_per_stage, dp", "pipeline_list[0]") from None
    if not (len(layers) == len(tmp) == len(dp)):
        raise PlanError(f"{len(layers)} stages of layers, {len(tmp)} of replicas, {len(dp)} dp degrees", "pipeline_list[0]")
    stages = []
    for i, (units, reps) in enumerate(zip(layers, tmp)):
        where = f"pipeline_list[0].tmp_per_stage[{i}]"
        if dp[i] != len(reps):
            raise PlanError(f"dp {dp[i]} but {len(reps)} replicas", where)
        if list(units) != list(range(units[0], units[0] + len(units))):
            raise PlanError(f"layers {units} are not contiguous", f"pipeline_list[0].layers_per_stage[{i}]")
        stages.append(Stage(layer_start=units[0], layer_end=units[-1] + 1,
                            replicas=tuple(_replica(r, f"{where}[{j}]") for j, r in enumerate(reps))))
    if len(set(dp)) != 1:
        raise PlanError(f"stages with different replica counts {dp}: Sailor's simulator then gives each replica "
                        f"a full microbatch on every stage, which no hetplan plan describes", "pipeline_list[0].dp")
    batch = instance.workload.global_batch_size
    return Plan(name=name, instance=instance.name, num_microbatches=-(-batch // (mbs * dp[0])), micro_batch_size=mbs,
                batch_rounding="ceil", stages=tuple(stages), metadata={"source": "sailor"})


def plan_to_sailor(plan: Plan, instance: Instance) -> dict[str, Any]:
    """Sailor's plan dict of a hetplan plan whose replicas all take the same microbatch (gpus_per_node
    written as the TP degree, as Sailor's planner does)."""
    shares = plan.distinct_shares()
    if len(shares) != 1:
        raise PlanError(f"Sailor's format has one microbatch size; this plan's replicas take {sorted(shares)}", "stages")
    tmp = []
    for i, stage in enumerate(plan.stages):
        row = []
        for j, rep in enumerate(stage.replicas):
            zone = rep.zone or (instance.node_by_id[rep.node].zone if rep.node in instance.node_by_id else None)
            if zone is None:
                raise PlanError("a replica needs a zone or a node", f"stages[{i}].replicas[{j}]")
            row.append([[[rep.gpu_type, rep.tp, zone]], rep.tp])
        tmp.append(row)
    return {"mbs": shares.pop(), "pipeline_list": [{
        "num_stages": len(plan.stages),
        "layers_per_stage": [list(range(s.layer_start, s.layer_end)) for s in plan.stages],
        "tmp_per_stage": tmp, "dp": [len(s.replicas) for s in plan.stages]}]}
