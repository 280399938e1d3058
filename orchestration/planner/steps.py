"""One refinement step of an outer choice: its next bound (medium, strong, strongest) and, where allowed,
the stage-DP heuristic. A step's result depends only on the step, so the search may take it in either
process (helper.py)."""
from __future__ import annotations

from dataclasses import dataclass


from hetplan.formulations import joint
from hetplan.orchestration.planner.options import Combo
from hetplan.orchestration.planner.inputs import _Tables, with_sync_table


def _refine(inp: joint.JointInputs, tables: _Tables, step: "_Step", objective: str, max_cost: float | None,
            min_its: float | None) -> tuple[float, tuple | None, bool]:
    """One refinement step of a queued choice: (its bound at the next level, the heuristics' plan
    (objective, solution) or None, whether the stage DP ran). The DP runs (when `step.dp_allowed`) on
    the first choices the strong bound keeps, after it (measured on GPT-Neo, 2 x 256 GPUs: once
    the incumbent was the optimum, the bound ruled out 15 of the 16 choices the DP had run on
    before it, 2.0 s of DPs). With Sailor's composition (`_decides_sooner`) the strong bound first
    only decides whether the target rules the choice out; where it does not, the choice holds a
    plan better than the target, the bound would try every split of a cell for nothing, and the
    DP's plan goes first: the bound then runs at that plan's objective less the gap (measured:
    Sailor's GPT-Neo-2.7B on 32 A100 + 96 V100, P5 b1 D16, one process, the step 1.08 -> 0.41 s).
    The DP runs on the same choices either way. A function of its arguments alone, so the helper
    process gives the same answer as the main one."""
    level, lb, target = step.level, step.lb, step.target
    inp = with_sync_table(inp, tables)  # the all-reduce times enter all
    if level == 1 and step.dp_allowed and _decides_sooner(inp, objective, target, min_its):
        lb = max(lb, _tight_bound(inp, objective, min_its, target, decide=True))
        if lb >= target:
            return lb, None, False
        # the choice stays: the DP's plan first, then the bound at the target that plan sets
        found = _best_heuristic(inp, objective, max_cost, min_its)
        if found is not None:
            target = min(target, found[0] * (1 - step.gap))
        return max(lb, _tight_bound(inp, objective, min_its, target)), found, True
    if level < 2 or target is not None:
        lb = max(lb, _tight_bound(inp, objective, min_its, target, exact=level >= 1, strongest=level == 2,
                                  max_cost=max_cost))
    if level == 1 and step.dp_allowed and lb < float("inf") and (target is None or lb < target):
        return lb, _best_heuristic(inp, objective, max_cost, min_its), True
    return lb, None, False


def _decides_sooner(inp: joint.JointInputs, objective: str, target: float | None, min_its: float | None) -> bool:
    """Whether `_tight_bound` at the target is the strong time bound alone and starts with Sailor's
    send-aware bound, which `decide` lets stop at its first cell under the target
    (`joint.time_lower_bound_tight_s`), with no budget that can bind at the target (the inputs'
    own, `joint.binding_budget_usd`)."""
    return (objective == "max_throughput" and target is not None and min_its is None
            and joint.binding_budget_usd(inp, target) is None and joint.send_aware_applies(inp))


@dataclass(frozen=True)
class _Step:
    """One refinement step of a queued choice, all that `_refine` depends on besides the inputs:
    two processes computing the same step get the same result. The medium bound (level 0) does not
    read the target, so its steps carry none."""
    combo: Combo
    level: int
    lb: float
    target: float | None
    dp_allowed: bool
    gap: float = 0.0  # the search's relative gap: a plan the step's DP finds lowers the target by it


def _order(step: _Step) -> tuple:
    """A step's place in the search's queue (its key there)."""
    return (step.lb, step.combo.P, step.combo.D, step.combo.b, step.level)


def _tight_bound(inp: joint.JointInputs, objective: str, min_its: float | None, target: float | None = None,
                 exact: bool = True, strongest: bool = False, max_cost: float | None = None,
                 decide: bool = False) -> float:
    """The medium (`exact=False`: Hall counts, no DP) or strong (`exact=True`: dynamic programs over
    stages, `joint.stages_fit_dp`) bounds of one outer choice; +inf when it is infeasible by them.
    `target` (an objective value to rule out, e.g. from the incumbent) lets the search stop early.
    For min cost the time bound only has to rule out the minimum throughput; the strong time bound
    is skipped when the cost bounds alone reach the target (it costs more than they do).
    `strongest` (max throughput, with a target): the replica-level DPs of the time bound too.
    Max throughput under a budget `max_cost`: the strong bound also reads the stage times the
    budget affords (`joint.budget_time_lower_bound_s`). `decide`: see `joint.time_lower_bound_tight_s`."""
    floor_s = None if min_its is None else 1 / min_its
    if objective != "min_cost":
        t_lb = joint.time_lower_bound_tight_s(inp, exact, target, strongest, decide)
        if (max_cost is not None and exact and t_lb < float("inf") and (target is None or t_lb < target)
                and joint.binding_budget_usd(inp, target) is not None):
            t_lb = max(t_lb, joint.budget_time_lower_bound_s(inp, max_cost))
        return float("inf") if t_lb == float("inf") or (floor_s is not None and t_lb > floor_s) else t_lb
    t_lb = joint.time_lower_bound_tight_s(inp, False, floor_s)
    if t_lb == float("inf") or (floor_s is not None and t_lb > floor_s):
        return float("inf")
    cost = joint.cost_lower_bound_usd(inp, exact, t_lb, target)  # with a target, runs of thetas first
    if not exact or (target is not None and cost >= target):
        return cost
    t_lb = joint.time_lower_bound_tight_s(inp, True, floor_s)
    if t_lb == float("inf") or (floor_s is not None and t_lb > floor_s):
        return float("inf")
    return max(cost, t_lb * joint.rate_lower_bound_usd_per_s(inp))


def _best_heuristic(inp: joint.JointInputs, objective: str, max_cost: float | None,
                    min_its: float | None, dp: bool = True) -> tuple[float, joint.JointSolution] | None:
    """The best of the speed-first and cost-first greedy and (with `dp`, blocks form) the stage DP
    heuristic that meets the limits, with its objective."""
    best = None
    for order in ("speed", "cost"):
        g = joint.greedy(inp, order)
        if g is None:
            continue
        obj = joint.objective_within_limits(inp, g, objective, max_cost, min_its)
        if obj is not None:
            best = joint.better(best, (obj, g))
    if dp:
        found = joint.dp_heuristic(inp, objective, max_cost, min_its, joint.bottleneck_lower_bound_s(inp))
        best = joint.better(best, found)
    return joint.polish(inp, best, objective, max_cost, min_its)
