"""The sync-aware bound (`sync_aware_time_bound_s`): theta and sigma + mu bounded together. A plan
whose all-reduce + update stays under a cap must place every stage where its all-reduce is that
fast, which raises the least theta the stage DP admits; the bound takes the least T over cells
of the cap. `_time_lower_bound_merged_s` composes it with the other parts (every region merged)."""
from __future__ import annotations

import math

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, slack_below
from hetplan.formulations.joint.composition import iteration_time_s, theta_for_time_s
from hetplan.formulations.joint.tables import _class_tables, blocks_identical
from hetplan.formulations.joint.bounds.parts import (_c_node_s, _extra_values_s, _fastest_work_s, _first_true,
    _links_lower_bound_s, _sync_update_lower_bound_s, extra_lower_bound_s)
from hetplan.formulations.joint.bounds.work import _theta_work_bound_s, _work_bound_s
from hetplan.formulations.joint.bounds.stage_fit import stages_fit_dp
from hetplan.formulations.joint.bounds.bottleneck import bottleneck_lower_bound_s
from hetplan.formulations.joint.bounds.sum_tau import _class_arrays, capped_sum_tau_s, sum_tau_lower_bound_s


def _time_lower_bound_merged_s(inp: JointInputs, exact: bool, target_s: float | None,
                               strongest: bool = False) -> float:
    if not inp.pools:
        return math.inf
    if inp.U < 4:
        return _work_bound_s(inp)
    # the bottleneck first, with F for the sum of stage times: with a target it alone rules out
    # most choices (measured: 60 of the 67 that reached the strong bound on GPT-Neo, 32 A100 + 96
    # V100), and the Lagrangian sum-tau bound costs five times as much; a hint from the smaller F
    # base is larger, so the theta found is at least the one a hint from the full base gives
    links, sync_update = _links_lower_bound_s(inp), _sync_update_lower_bound_s(inp)
    fastest = _fastest_work_s(inp)
    hint = None if target_s is None or inp.m <= 1 else theta_for_time_s(inp.m, target_s, fastest, links, sync_update)
    slowest = max(_theta_work_bound_s(inp), bottleneck_lower_bound_s(inp, exact, hint))  # a stage time
    theta = max(slowest, _c_node_s(inp) / 2)  # theta >= c_i / 2 as well
    if math.isinf(theta):
        return math.inf
    out = iteration_time_s(inp.m, fastest, links, theta, sync_update)
    if not exact or (target_s is not None and out >= target_s):
        return out
    out = iteration_time_s(inp.m, sum_tau_lower_bound_s(inp), links, theta, sync_update)
    if exact and blocks_identical(inp) and (target_s is None or out < target_s):
        # its theta_lo_s filters the stage times, so it takes the stage-time bound alone
        out = max(out, sync_aware_time_bound_s(inp, slowest, target_s, strongest=strongest))
    return out


def sync_aware_time_bound_s(inp: JointInputs, theta_lo_s: float, target_s: float | None = None,
                            grid: int = 8, strongest: bool = False, theta_floor_s: float = 0.0) -> float:
    """T >= sum tau + (P - 1) c_node + (m - 1) theta + s (sum tau >= `sum_tau_lower_bound_s`), where s = the largest extra value (`_ClassTables`) of
    the plan's (stage, class) pairs (<= sigma + mu) and theta its slowest stage: the DP
    (`stages_fit_dp`) must fit the blocks with both caps. This sees what the separate terms of
    `time_lower_bound_tight_s` miss: a cheap all-reduce needs a high TP, and D replicas at a high
    TP may not exist (measured, GPT-Neo on 3 x 256 GPUs, P3 b1 D256: sigma + mu >= 0.073 s alone,
    0.30 s here; the optimum has 0.44 s).

    theta*(s), the least feasible theta with cap s, does not grow with s. The s axis is cut at a
    few grid values s_0 < ... < s_q (s_0 = `extra_lower_bound_s`); a plan whose largest
    extra lies in [s_j, s_j+1) fits with cap s'_j (the largest extra value below s_j+1), so
    T >= sum tau + links + (m - 1) theta*(s'_j) + s_j (`iteration_time_s`), and the bound is the
    least over the cells (the last cell has no cap: theta*(inf) >= theta_lo_s, the caller's
    bottleneck bound). With `target_s`, a cell is only tested at the theta that would beat the target (one DP call), and the grid
    ends where s alone reaches it; a feasible cell's theta*(s'_j) is bisected a few steps only
    (its lower end is a valid bound). A cell's theta is also at least the fastest (stage, class)
    pair whose extra reaches s_j, and sum tau is lifted to the least under the cell's caps
    (`_lifted_cell_s`; only for cells within 10 % below the target when there is one).
    `theta_floor_s`: what every plan's theta is at least besides its slowest stage (a boundary:
    theta >= c_i / 2, `composition.bottleneck_terms`); each cell's theta is at least it, a floor
    that no stage time needs to reach (`region_split_time_bound_s`: the plans over two regions)."""
    tab = _class_tables(inp)
    sum_tau = sum_tau_lower_bound_s(inp)
    links = _links_lower_bound_s(inp)
    caps = _extra_values_s(inp).tolist()
    thetas = np.unique(tab.time_s)
    thetas = thetas[thetas >= slack_below(theta_lo_s)].tolist()
    s_first = extra_lower_bound_s(inp)
    if not thetas or not caps or s_first > caps[-1]:
        return math.inf

    arr = _class_arrays(inp)

    def cell(j: int, s_lo: float, cap: float) -> float:
        """T over the plans with theta >= thetas[j] and largest extra in [s_lo, cap]: such a plan
        has a (stage, class) pair with extra >= s_lo, and its slowest stage is no faster."""
        slowest = arr.time_s[arr.extra_hi_s >= s_lo]
        j = max(j, _first_true(lambda t: t >= float(slowest.min()), thetas + [math.inf], 0)) if slowest.size \
            else len(thetas)
        out = iteration_time_s(inp.m, sum_tau, links, max(thetas[j], theta_floor_s) if j < len(thetas) else math.inf,
                               s_lo)
        if target_s is not None and not 0.9 * target_s <= out < target_s:
            return out  # reached, or too far below for the DPs to lift it there (a min-cost floor)
        goal = None if target_s is None else target_s - links - s_lo
        return max(out, _lifted_cell_s(inp, thetas, j, cap, sum_tau, goal, 8 if target_s is not None else 3,
                                       strongest, theta_floor_s) + links + s_lo)

    no_cap = cell(0, 0.0, math.inf)  # + s for s >= the last grid value
    s_end = caps[-1] if target_s is None else min(caps[-1], target_s - no_cap)
    if inp.m <= 1 or s_first >= s_end:
        return no_cap + s_first
    j0 = _first_true(lambda c: c >= s_first, caps, 0)
    # grid values: extras between s_first and s_end, evenly spread in value
    marks = [s_first + (s_end - s_first) * q / grid for q in range(grid + 1)]
    cells = sorted({caps[_first_true(lambda c: c >= v, caps, j0)] for v in marks})
    cells[0] = min(cells[0], s_first)  # the first cell starts at the bound itself
    best = cell(0, cells[-1], math.inf)
    hi = len(thetas) - 1
    for s_lo, s_next in zip(cells, cells[1:]):
        cap = caps[_first_true(lambda c: c >= s_next, caps, j0) - 1]  # largest extra < s_next
        fits = lambda t, cap=cap: stages_fit_dp(inp, t, cap)  # noqa: E731
        if target_s is not None:
            need = theta_for_time_s(inp.m, target_s, sum_tau, links, s_lo)  # theta must be below this to beat it
            below = _first_true(lambda t: t >= need, thetas + [math.inf], 0) - 1
            if below < 0 or theta_floor_s >= need or not fits(thetas[below]):
                best = min(best, cell(0 if theta_floor_s >= need else below + 1, s_lo, cap))  # (below >= -1)
                continue
            hi = min(hi, below)
        elif not fits(thetas[hi]):
            continue  # this cell holds no plan at all (theta*(cap) is beyond every stage time)
        lo = _first_true(fits, thetas, 0, hi, steps=3 if target_s is None else 1)
        best = min(best, cell(lo, s_lo, cap))
    return best


def _lifted_cell_s(inp: JointInputs, thetas: list[float], j: int, cap: float, sum_tau: float,
                   goal: float | None = None, depth: int = 6, strong: bool = False,
                   theta_floor_s: float = 0.0) -> float:
    """min over the plans with theta >= thetas[j] and every extra <= cap of sum tau + (m - 1) theta.
    A plan's slowest stage takes one of `thetas`; if that is among thetas[lo:hi], its sum tau is
    >= `capped_sum_tau_s`(thetas[hi - 1], cap) and its theta >= thetas[lo]. The range is halved
    (at most `depth` times) until each part's bound reaches `goal` (the value the caller needs).
    `strong`: a part the plain DP leaves below the goal also gets the replica-level DPs. Theta is
    at least `theta_floor_s` too (`sync_aware_time_bound_s`)."""
    def bound(lo: int, hi: int, d: int) -> float:
        def at(stages_s: float) -> float:  # the stages and the bottleneck's part of T
            return iteration_time_s(inp.m, stages_s, 0.0, max(thetas[lo], theta_floor_s), 0.0)
        out = at(max(sum_tau, capped_sum_tau_s(inp, thetas[hi - 1], cap)))
        if strong and (goal is None or out < goal):
            out = max(out, at(capped_sum_tau_s(inp, thetas[hi - 1], cap, True,
                                               reaches=None if goal is None else lambda s: at(s) >= goal)))
        if d == 0 or hi - lo == 1 or (goal is not None and out >= goal):
            return out
        mid = (lo + hi) // 2
        left = bound(lo, mid, d - 1)
        # short of the goal on the left: the node is too, so the right half gets no halving
        right = bound(mid, hi, 0 if goal is not None and left < goal else d - 1)
        return max(out, min(left, right))

    return bound(j, len(thetas), depth) if j < len(thetas) else math.inf
