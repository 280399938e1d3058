"""The cheap bound (`time_lower_bound_s`): the GPUs' work over the slowest stage. Every unit runs on
D replicas and a replica of stage i on pool k is busy t_k step_i(k) GPU-seconds of at most t_k tau_i,
so the work of all units, spread over every GPU as a fluid, bounds the slowest stage; with several
regions, the least of that bound per region and over a crossing. The queue's first key."""
from __future__ import annotations

import math

from hetplan.formulations.joint.inputs import JointInputs
from hetplan.formulations.joint.composition import boundary_s, iteration_time_s
from hetplan.formulations.joint.tables import _shared_for
from hetplan.formulations.joint.bounds.parts import (_c_node_s, _fastest_work_s, _gpus_per_type, _region_inputs,
    _replicas, _work_by_type, fluid_gpu_seconds_s, sailor_transfer_floor_s)


def time_lower_bound_s(inp: JointInputs) -> float:
    """T >= sum_i tau_i + (m-1) theta with sum_i tau_i >= max(F, theta_w) and theta >= theta_w =
    max(F / P, D x `fluid_gpu_seconds_s`), F = sum_l min_k step[k,l]: a replica on pool k of stage i
    is busy t_k step_i(k) GPU-seconds of at most t_k tau_i, and every unit runs on D replicas, so the
    GPUs' work bounds the slowest stage (`fluid_gpu_seconds_s`), which is one of the tau_i.
    With several regions, the least of this bound per region and `_crossing_work_bound_s`.
    With Sailor's composition plus `sailor_transfer_floor_s`."""
    return _regional_work_bound_s(inp) + sailor_transfer_floor_s(inp)


def _regional_work_bound_s(inp: JointInputs) -> float:
    """A stage's replicas sit in one region (H5), so a plan either lies in one region r, where the
    work bound of r's pools alone holds (fewer GPUs, so a larger bound; none if r has too few GPUs
    for the P D replicas, `_holds_replicas`), or has a boundary between
    regions (P > 1: `_crossing_work_bound_s`). Measured, large_5type_2k (Llama-7B, the H100s in the
    smaller region): most choices' cheap bound from 0.59 s to the central region's."""
    out = _work_bound_s(inp)
    if len(inp.regions) < 2:
        return out
    regional = min(_work_bound_s(sub) if _holds_replicas(sub) else math.inf for sub in _region_inputs(inp).values())
    return max(out, regional if inp.P == 1 else min(regional, _crossing_work_bound_s(inp)))


def _holds_replicas(inp: JointInputs) -> bool:
    """Whether these pools have GPUs for the P D replicas, each of at least its type's least TP."""
    min_tp: dict[str, int] = {}
    for p in inp.pools:
        min_tp[p.gpu_type] = min(min_tp.get(p.gpu_type, p.tp), p.tp)
    return bool(inp.pools) and _replicas(_gpus_per_type(inp), min_tp, inp.max_gpus) >= inp.P * inp.D


def _crossing_work_bound_s(inp: JointInputs) -> float:
    """A plan with a boundary between regions: that boundary takes c = c_region (dr = 1 forces dz = 1:
    every pair crosses), every other one at least c_node, and theta >= c / 2 (theta >= c_i / 2; in
    Sailor's composition too: milp.py). T >= max(F, theta_w) + (m - 1) theta + sum_i c_i with theta >=
    the work bound as well. The sum of stage times is at least the work bound (some stage is that
    slow), not c / 2: theta >= c / 2 is a boundary's, and the stages may all be faster (a random
    campaign's P3 b1 D1 over two regions: sum tau 0.0185 s, c / 2 = 0.0242 s, the bound 0.0968 s
    above the choice's best plan, 0.0949 s)."""
    cross = boundary_s(inp, 1, 1, 1)
    stage = _theta_work_bound_s(inp)
    theta = max(stage, cross / 2)
    links = (inp.P - 2) * _c_node_s(inp) + cross
    return iteration_time_s(inp.m, max(_fastest_work_s(inp), stage), links, theta, 0.0)


def _work_bound_s(inp: JointInputs) -> float:
    """sum tau >= max(F, theta_w) with theta_w the work bound on the slowest stage time (itself
    one of the stage times): with m = 1 (D b = B) the work term alone is what is left."""
    theta = _theta_work_bound_s(inp)
    return iteration_time_s(inp.m, max(_fastest_work_s(inp), theta), 0.0, theta, 0.0)


def _theta_work_bound_s(inp: JointInputs) -> float:
    """theta >= max(F / P, D x `fluid_gpu_seconds_s`) (see `time_lower_bound_s`): the GPU types'
    per-unit GPU-seconds (the least over their TP degrees), their GPUs available and max_gpus."""
    per_replica = _shared_for(inp, "fluid_work", lambda inp: fluid_gpu_seconds_s(
        _work_by_type(inp), _gpus_per_type(inp), inp.max_gpus))
    return max(_fastest_work_s(inp) / inp.P, inp.D * per_replica)
