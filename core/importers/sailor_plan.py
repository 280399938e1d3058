"""Sailor's plan format <-> hetplan plans.

Sailor's planner (`SailorPlanner.get_sorted_plans`, eth-easl/sailor cf2c8e3) returns
`{"mbs": b, "pipeline_list": [{"num_stages": P, "layers_per_stage": [[units]], "dp": [D_i],
"tmp_per_stage": [[ [[[gpu, gpus_per_node, zone]], tp] per replica ] per stage]}]}` and its simulator
(`convert_homogeneous`) runs m = ceil(B / (b x D_0)) microbatches of b sequences per replica. A hetplan
plan says the same with `micro_batch_size` b, a replica per entry and `batch_rounding: ceil`.
"""
from __future__ import annotations

import reprlib
import warnings
from typing import Any, Mapping

from hetplan.errors import PlanError, RefusedError
from hetplan.instance import Instance
from hetplan.plan import Plan, Replica, Stage


def is_sailor_plan(data: Any) -> bool:
    """Whether a parsed plan file is in Sailor's format (recognised by its keys)."""
    return isinstance(data, Mapping) and "pipeline_list" in data and "mbs" in data


# What each key holds, for the message when one is missing or of the wrong kind.
_SHAPE = "a Sailor plan has mbs and pipeline_list[0] with layers_per_stage, tmp_per_stage, dp"
_REPLICA = "[[[gpu_type, gpus_per_node, zone]], tp]"


def _short(value: Any) -> str:
    return reprlib.repr(value)  # a whole plan pasted into one error line would bury the problem


def _positive_int(value: Any, where: str) -> int:
    # strict: bool is an int in Python, and "4" or 4.5 would be silently rounded by int()
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"must be a positive integer, got {_short(value)}", where)
    return value


def _list(value: Any, where: str, what: str) -> list:
    if not isinstance(value, (list, tuple)) or not value:  # JSON and YAML give lists; Python callers tuples too
        raise PlanError(f"expected a non-empty list of {what}, got {_short(value)}", where)
    return list(value)


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise PlanError(f"expected a non-empty string, got {_short(value)}", where)
    return value


def _replica(entry: Any, where: str) -> Replica:
    if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[0], (list, tuple)):
        raise PlanError(f"expected {_REPLICA}, got {_short(entry)}", where)
    vms, tp = entry
    if len(vms) != 1:
        raise PlanError(f"a replica on {len(vms)} VMs (Metis' TP across nodes) has no hetplan form; "
                        f"TP stays inside a node", where)
    if not isinstance(vms[0], (list, tuple)) or len(vms[0]) != 3:
        raise PlanError(f"expected [gpu_type, gpus_per_node, zone], got {_short(vms[0])}", f"{where}[0][0]")
    gpu, _, zone = vms[0]
    return Replica(gpu_type=_name(gpu, f"{where}[0][0][0]"), tp=_positive_int(tp, f"{where}[1]"),
                   zone=_name(zone, f"{where}[0][0][2]"))


def _layer_range(units: Any, where: str) -> tuple[int, int]:
    """[first, last + 1) of a stage's layer indices, which must be contiguous integers >= 0."""
    units = _list(units, where, "layer indices")
    for j, unit in enumerate(units):
        if isinstance(unit, bool) or not isinstance(unit, int) or unit < 0:
            raise PlanError(f"expected a layer index >= 0, got {_short(unit)}", f"{where}[{j}]")
    if units != list(range(units[0], units[0] + len(units))):
        raise PlanError(f"layers {_short(units)} are not contiguous", where)
    return units[0], units[-1] + 1


def _pipeline(data: Mapping[str, Any]) -> tuple[list, list, list[int]]:
    """layers_per_stage, tmp_per_stage and dp of the one pipeline, checked for kind and length."""
    pipelines = data.get("pipeline_list")
    if not isinstance(pipelines, (list, tuple)) or len(pipelines) != 1:
        raise PlanError("a Sailor plan here has exactly one pipeline (as Sailor's planner emits)", "pipeline_list")
    pipe = pipelines[0]
    if not isinstance(pipe, Mapping):
        raise PlanError(f"expected a mapping; {_SHAPE}", "pipeline_list[0]")
    missing = [k for k in ("layers_per_stage", "tmp_per_stage", "dp") if k not in pipe]
    if missing:
        raise PlanError(f"missing; {_SHAPE}", f"pipeline_list[0].{missing[0]}")
    layers = _list(pipe["layers_per_stage"], "pipeline_list[0].layers_per_stage", "stages (lists of layers)")
    tmp = _list(pipe["tmp_per_stage"], "pipeline_list[0].tmp_per_stage", "stages (lists of replicas)")
    dp = [_positive_int(d, f"pipeline_list[0].dp[{i}]")
          for i, d in enumerate(_list(pipe["dp"], "pipeline_list[0].dp", "replica counts"))]
    if not (len(layers) == len(tmp) == len(dp)):
        raise PlanError(f"{len(layers)} stages of layers, {len(tmp)} of replicas, {len(dp)} dp degrees",
                        "pipeline_list[0]")
    # optional (Sailor writes it, hand-made files may not); when given it must agree, not be ignored
    if "num_stages" in pipe and _positive_int(pipe["num_stages"], "pipeline_list[0].num_stages") != len(layers):
        raise PlanError(f"{pipe['num_stages']} but layers_per_stage has {len(layers)} stages",
                        "pipeline_list[0].num_stages")
    return layers, tmp, dp


def _stage(i: int, units: Any, reps: Any, dp: int) -> Stage:
    where = f"pipeline_list[0].tmp_per_stage[{i}]"
    if dp != len(_list(reps, where, "replicas")):
        raise PlanError(f"dp {dp} but {len(reps)} replicas", where)
    start, end = _layer_range(units, f"pipeline_list[0].layers_per_stage[{i}]")
    return Stage(layer_start=start, layer_end=end,
                 replicas=tuple(_replica(r, f"{where}[{j}]") for j, r in enumerate(reps)))


def plan_from_sailor(data: Mapping[str, Any], instance: Instance, name: str = "") -> Plan:
    """The hetplan plan of a Sailor plan dict (one pipeline; every stage with the same replica count).
    Every key is checked for kind and range first: PlanError names the offending one by its path."""
    mbs = _positive_int(data.get("mbs"), "mbs")
    layers, tmp, dp = _pipeline(data)
    stages = tuple(_stage(i, units, reps, dp[i]) for i, (units, reps) in enumerate(zip(layers, tmp)))
    if len(set(dp)) != 1:
        raise PlanError(f"stages with different replica counts {dp}: Sailor's simulator then gives each replica "
                        f"a full microbatch on every stage, which no hetplan plan describes", "pipeline_list[0].dp")
    batch = instance.workload.global_batch_size
    # where b x D divides B, ceil is exact: say so, and every simulator scores the plan (exact is the
    # rule of hetplan's own; a plan exported from it came back refused as needing Sailor's)
    rounding = "exact" if batch % (mbs * dp[0]) == 0 else "ceil"
    return Plan(name=name, instance=instance.name, num_microbatches=-(-batch // (mbs * dp[0])), micro_batch_size=mbs,
                batch_rounding=rounding, stages=stages, metadata={"source": "sailor"})


def plan_to_sailor(plan: Plan, instance: Instance) -> dict[str, Any]:
    """Sailor's plan dict of a hetplan plan whose replicas all take the same microbatch (gpus_per_node
    written as the TP degree, as Sailor's planner does)."""
    shares = plan.distinct_shares()
    if len(shares) != 1:  # a valid plan the format cannot say: refused, as a launch target refuses one
        raise RefusedError(f"Sailor's format has one microbatch size; this plan's replicas take {sorted(shares)}",
                           "stages")
    if plan.schedule != "1F1B":  # read back, it is 1F1B: other memory and time (helper-11: 46 of 78 said nothing)
        warnings.warn(f"Sailor's format has no schedule and Sailor runs 1F1B: this {plan.schedule} plan is read "
                      f"back as 1F1B")
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
