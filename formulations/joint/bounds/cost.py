"""Lower bounds on the cost of an iteration (`cost_lower_bound_usd`): the GPUs' rate times the time
bound, and the cells of theta where the least rate and the least time at that theta are taken
together (`theta_interval_cost_bound_usd`); and the time bound under a budget
(`budget_time_lower_bound_s`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, check_deadline
from hetplan.formulations.joint.composition import iteration_cost_usd, iteration_time_s, replica_rate_usd_per_s
from hetplan.formulations.joint.tables import _cached_for, _class_tables, block_counts, blocks_identical
from hetplan.formulations.joint.bounds.parts import (_fastest_work_s, _least_per_class, _links_lower_bound_s,
    _sailor_stage_times_s, _spread, _sync_update_base_s, rate_lower_bound_usd_per_s)
from hetplan.formulations.joint.bounds.bottleneck import bottleneck_lower_bound_s
from hetplan.formulations.joint.bounds.sum_tau import sum_tau_lower_bound_s
from hetplan.formulations.joint.bounds.tight import time_lower_bound_tight_s


def cost_lower_bound_usd(inp: JointInputs, exact: bool = False, time_lb_s: float | None = None,
                         target_usd: float | None = None) -> float:
    """cost >= rate x T >= the larger of rate_LB x T_LB and the cheapest work: with 1F1B, T >= m tau_i
    ((m - 1) theta + sum tau >= m tau_i) and tau_i >= the stage's step time on each of its replicas,
    so rate x T >= sum_i sum_{r in i} price_r t_r m step_r(i) / 3600
    >= m D sum_l min_k price_k t_k step[k,l] / 3600. `time_lb_s`: a time bound the caller already has.
    `target_usd` (exact only): a cost to rule out (`cost_lower_bound_dp_usd`)."""
    work = inp.m * inp.D * sum(min(replica_rate_usd_per_s(p) * inp.step_s[k][l] for k, p in enumerate(inp.pools))
                               for l in range(inp.U))
    t_lb = time_lower_bound_tight_s(inp, exact) if time_lb_s is None else time_lb_s
    out = max(iteration_cost_usd(rate_lower_bound_usd_per_s(inp), t_lb, 0.0), work)
    return max(out, cost_lower_bound_dp_usd(inp, target_usd)) if exact else out


def cost_lower_bound_dp_usd(inp: JointInputs, target_usd: float | None = None) -> float:
    """cost >= rate x T. Let theta be the plan's slowest stage time (one of the class stage times
    of `_class_figures`); then T >= A + S with A = (m - 1) theta + `_rest_lower_bound_s` and
    S = sum tau, and every stage runs within theta. Per theta, dynamic programs over stages (blocks
    placed; GPU quotas ignored) give R0, the least rate of P stages of D replicas holding the L
    blocks with classes that run their stage within theta and fit it in memory, and S0, the least
    sum of stage times of such stages (also >= theta and `sum_tau_lower_bound_s`). Since
    (rate - R0)(S - S0) >= 0,
        rate (A + S) >= [R0 S + (A + S0) rate] - R0 S0,
    and the bracket is a sum over stages (stage i with straggler class r costs R0 tau_i +
    (A + S0) D price, price the cheapest class no slower than r), so a third DP minimises it:
        cost >= min over theta in [theta_LB, cap] of max(R0 (A + S0), that minimum).
    theta_LB from `bottleneck_lower_bound_s(exact=True)` (GPU counts), cap from a minimum
    throughput (`stage_time_cap_s`). Every replica pays for the bottleneck, not for its own stage
    time, which the per-unit bound of `cost_lower_bound_usd` misses; the coupled DP sees that a
    stage run fast costs more per second (measured: OPT-350M on 2 zones x (128 A100 + 128 V100),
    P2 b2 D64, min cost under 0.2 it/s: 0.4388 -> 0.4637 USD, above the 0.4480 optimum of P1, where
    the MILP had found no plan in 34 s). Blocks form only. In Sailor's composition a stage's time is
    its compute plus the least its own sends take (`_sailor_stage_times_s`: theta >= tau_i + p_i,
    T = sum (tau_i + p_i) + (m - 1) theta + sigma + mu, so A holds no boundary term).
    With `target_usd` (a cost to rule out) the same bound over runs of thetas comes first
    (`theta_interval_cost_bound_usd`); when it reaches the target it is the answer, a valid bound
    at or above the target, and the per-theta DPs are not run."""
    if not blocks_identical(inp):
        return cost_lower_bound_usd(inp)
    if target_usd is not None:  # (a choice's strong cost bound is asked again at its later steps)
        coarse = _cached_for(inp, "theta_runs", theta_interval_cost_bound_usd)
        if coarse >= target_usd:
            return coarse
    _, cost_usd, _ = _per_theta_bounds(inp)
    return float(np.min(cost_usd)) if cost_usd.size else math.inf


# runs of thetas per cell in `theta_interval_cost_bound_usd` (measured: the 244 strong cost bounds
# with a target of Sailor's d_fig11 min-cost search, each on inputs with empty caches, best of 3:
# the medium bounds alone take 0.81 s; with 2 runs they rule out 172 of the 244 in 1.99 s, with 4
# 230 in 1.76 s, with 8 240 in 1.87 s, with 16 241 in 2.17 s; with the per-theta DPs 243 in 6.20 s)
THETA_RUNS = 8


def theta_interval_cost_bound_usd(inp: JointInputs, runs: int = THETA_RUNS) -> float:
    """`cost_lower_bound_dp_usd` over runs of thetas instead of each theta: a cell's candidate
    thetas (`_ThetaCells`) at or above the Hall bottleneck bound are cut into `runs` runs of
    consecutive values, [lo, hi] each. A plan of the cell whose slowest stage time theta lies in a
    run has every stage within hi, so its rate is at least R0(hi) and its S at least S0(hi), the DPs
    over the classes within hi (a superset of those within theta), and its A at least A(lo); both
    bounds of `cost_lower_bound_dp_usd` hold with these values in place of the per-theta ones
    (the inequality (rate - R0)(S - S0) >= 0 needs only R0 <= rate and S0 <= S). So the least over
    the runs bounds every plan, with `runs` DP columns per cell where the per-theta bound has one
    per theta. S0 is also >= lo and F (`_fastest_work_s`; the quota-aware sum-tau bound costs more
    than these runs do). Blocks form only."""
    cells = _theta_cells(inp)
    lo_s = bottleneck_lower_bound_s(inp, exact=False)
    cell_of, lo, hi = [], [], []
    for k, own in enumerate(cells.thetas(lo_s)):
        edges = np.linspace(0, own.size, min(runs, own.size) + 1).round().astype(int)
        cell_of += [k] * (edges.size - 1)
        lo.append(own[edges[:-1]])
        hi.append(own[edges[1:] - 1])
    if not cell_of:
        return math.inf
    cost_usd, _ = _column_bounds(inp, cells, np.array(cell_of), np.concatenate(lo), np.concatenate(hi),
                                 _fastest_work_s(inp))
    return float(np.min(cost_usd))


def budget_time_lower_bound_s(inp: JointInputs, max_cost_usd: float) -> float:
    """T of the plans that cost at most `max_cost_usd`: a plan whose slowest stage time is theta
    (one of the class stage times, at least `bottleneck_lower_bound_s`) costs at least the bound
    `cost_lower_bound_dp_usd` computes at theta and takes T >= A + S0 there (its docstring), so
        T >= min over the thetas whose cost bound is within the budget of A + S0,
    +inf when none is: a max-throughput search under a budget sees which stage times it can afford
    (the fast ones need more or dearer replicas). Blocks form only (0 otherwise)."""
    if not blocks_identical(inp):
        return 0.0
    _, cost_usd, time_s = _per_theta_bounds(inp)
    ok = cost_usd <= max_cost_usd
    return float(np.min(time_s[ok])) if ok.any() else math.inf


def _per_theta_bounds(inp: JointInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thetas, cost bound, time bound A + S0) per candidate slowest stage time theta
    (`cost_lower_bound_dp_usd`), computed once per inputs."""
    return _cached_for(inp, "per_theta", _make_per_theta_bounds)


def _make_per_theta_bounds(inp: JointInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(theta, cost bound, time bound A + S0) per cell of the plans' largest all-reduce + update
    (`_ThetaCells`) and candidate slowest stage time theta of the cell at or above
    `bottleneck_lower_bound_s(exact=True)`: each a DP column of `_column_bounds` with lo = hi =
    theta; all cells and thetas in one array, so each DP runs once."""
    cells = _theta_cells(inp)
    own = cells.thetas(bottleneck_lower_bound_s(inp, exact=True))
    theta = np.concatenate(own)  # (one entry per cell: `_extra_cells` gives one at least)
    cell_of = np.repeat(np.arange(len(own)), [x.size for x in own])
    cost_usd, bound_s = _column_bounds(inp, cells, cell_of, theta, theta, sum_tau_lower_bound_s(inp))
    return theta, cost_usd, bound_s


@dataclass(frozen=True)
class _ThetaCells:
    """The per-inputs part of the per-theta cost bound. Cells of the plans' largest all-reduce +
    update E (`_extra_cells`): a plan whose stages' least extras (`_ClassTables`: the least of in
    one zone and spanning) all lie below a cell's cap and reach its floor uses only classes below
    the cap on every stage and has sigma + mu >= the floor; the cells cover every plan, so the
    least over cells bounds every plan (measured: Sailor's A100 x 128, OPT-350M under 0.3 USD, P3 b2
    D32: a plan that cheap has TP 1 on every stage, whose all-reduce is slow; the budget bound went
    from 2.68 s to none). `t` (K, M, C): the stage time of each class a cell allows on each pair
    (inf where it does not fit or its extra reaches the cap); `rate` (C,): USD/s of D replicas of
    the class at its cheapest pool; `cheapest` (K, M, C): the least rate among the classes the cell
    allows on the pair that are no slower; `rate_upto` (K, M, C): the least rate of the j + 1
    fastest classes a cell allows on the pair; `rest` (K,): the rest of T with the cell's floor;
    `cap` (K,): the slowest stage time under a throughput floor (`stage_time_cap_s`), inf without."""
    t: np.ndarray
    rate: np.ndarray
    cheapest: np.ndarray
    rate_upto: np.ndarray
    rest: np.ndarray
    cap: np.ndarray

    def rates_within(self, thetas: np.ndarray) -> np.ndarray:
        """(K, M, theta): the least rate of the classes a cell allows on a pair within each of the
        ascending thetas (inf: none), without the (K, M, theta, C) comparison: sorted by stage
        time, the classes within theta are the first `_count_within` ones."""
        within = _count_within(self.t, thetas)
        return np.where(within > 0, np.take_along_axis(self.rate_upto, np.maximum(within - 1, 0), axis=2), math.inf)

    def thetas(self, lo_s: float) -> list[np.ndarray]:
        """Per cell its candidate thetas: its own classes' stage times within [lo_s, its cap] (another
        cell's may lie where none of its plans has its slowest stage)."""
        return [own[(lo_s <= own) & (own <= cap)] for own, cap in
                ((np.unique(tk[np.isfinite(tk)]), cap) for tk, cap in zip(self.t, self.cap))]


def _theta_cells(inp: JointInputs) -> _ThetaCells:
    return _cached_for(inp, "theta_cells", _make_theta_cells)


def _make_theta_cells(inp: JointInputs) -> _ThetaCells:
    sync_update = _sync_update_base_s(inp)  # cached: over every plan, whatever the scope
    rest = _links_lower_bound_s(inp) + sync_update
    tab = _class_tables(inp)  # (C, M) arrays, classes sorted as `time_classes`
    stage_s = tab.time_s
    if inp.sailor and inp.P > 1:  # a stage's sends join its time; sum p takes the boundaries' place
        stage_s, rest = _sailor_stage_times_s(inp), sync_update
    least_extra = np.minimum(tab.extra_in_s, tab.extra_span_s)
    cells = _extra_cells(inp, least_extra[tab.fits], sync_update)
    rate = inp.D * _least_per_class(inp, lambda k: replica_rate_usd_per_s(inp.pools[k]))
    times, extras = np.where(tab.fits, stage_s, math.inf).T, least_extra.T  # (M, C)
    t = np.stack([np.where(extras < cap, times, math.inf) for _, cap in cells])
    # per pair and class: the cheapest replica among classes no slower (within theta, as it is)
    cheapest = np.where(t[:, :, None, :] <= t[:, :, :, None], rate, math.inf).min(axis=3)
    order = np.argsort(t, axis=2, kind="stable")
    rate_upto = np.minimum.accumulate(np.take_along_axis(np.broadcast_to(rate, t.shape), order, axis=2), axis=2)
    rests = np.array([rest + max(0.0, floor - sync_update) for floor, _ in cells])
    # T >= m x theta + the cell's rest: a throughput floor caps its thetas (`stage_time_cap_s`)
    cap = (1 / inp.min_iters_per_s - rests) / inp.m if inp.min_iters_per_s else np.full(len(cells), math.inf)
    return _ThetaCells(t, rate, cheapest, rate_upto, rests, cap)


def _column_bounds(inp: JointInputs, cells: _ThetaCells, cell_of: np.ndarray, lo_s: np.ndarray, hi_s: np.ndarray,
                   sum_tau_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(cost bound, time bound A + S0) of the plans of cell cell_of[j] whose slowest stage time lies
    in [lo_s[j], hi_s[j]], per column j (`cost_lower_bound_dp_usd`, `theta_interval_cost_bound_usd`):
    dynamic programs over stages give R0 and S0 over the classes within hi, A is taken at lo;
    `sum_tau_s` is a lower bound on S. inf where no stages hold the blocks so."""
    # per column and pair: the least stage time and the least rate of the classes within hi
    least_t = cells.t.min(axis=2)[cell_of]
    stage_time = np.where(least_t <= hi_s[:, None], least_t, math.inf)
    his, at = np.unique(hi_s, return_inverse=True)
    stage_rate = cells.rates_within(his)[cell_of, :, at]
    r0 = _pairs_dp(inp, stage_rate.T)
    s0 = np.maximum(_pairs_dp(inp, stage_time.T), np.maximum(lo_s, sum_tau_s))
    a = iteration_time_s(inp.m, 0.0, 0.0, lo_s, cells.rest[cell_of])
    simple = r0 * (a + s0)
    t = cells.t[cell_of]  # (J, M, C)
    with np.errstate(invalid="ignore"):  # inf - inf where no plan lies in the column: those stay inf below
        weight = r0[:, None, None] * t + (a + s0)[:, None, None] * cells.cheapest[cell_of]
        joint_w = np.where(t <= hi_s[:, None, None], weight, math.inf)
        coupled = _pairs_dp(inp, joint_w.min(axis=2).T) - r0 * s0
    keep = np.isfinite(simple)
    cost_usd = np.where(keep, np.maximum(simple, np.nan_to_num(coupled, nan=-np.inf)), np.inf)
    return cost_usd, np.where(keep, a + s0, np.inf)


def _count_within(t: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """(K, M, theta): how many of the C entries t[k, m, :] are <= each of the ascending thetas,
    without the (K, M, theta, C) comparison: entry c is within from index searchsorted(thetas, c) on."""
    K, M = t.shape[:2]
    first = np.searchsorted(thetas, t, side="left")  # (K, M, C); len(thetas) where never
    counts = np.zeros((K, M, thetas.size + 1), dtype=np.int64)
    np.add.at(counts, (np.arange(K)[:, None, None], np.arange(M)[None, :, None], first), 1)
    return np.cumsum(counts, axis=2)[:, :, :thetas.size]


def _extra_cells(inp: JointInputs, least_extra: np.ndarray, sync_update: float,
                 count: int = 4) -> list[tuple[float, float]]:
    """(floor, cap) cells of a plan's largest least extra E over its stages: [-inf, g_1) with no
    floor beyond `sync_update` (sigma + mu >= it anyway), [g_j, g_j+1), ..., [g_q, inf), the g_j
    spread over the finite values of `least_extra` (the least extras of the fitting (class, stage,
    blocks) triples) above `sync_update`."""
    values = np.unique(least_extra[(sync_update < least_extra) & (least_extra < math.inf)])
    if inp.m <= 1 or values.size == 0:
        return [(sync_update, math.inf)]
    grid = _spread(values, count)
    return list(zip([sync_update] + grid, grid + [math.inf]))


def _pairs_dp(inp: JointInputs, weight: np.ndarray) -> np.ndarray:
    """The least sum over the P stages of weight[(i, n), theta] (rows in `_pair_layout` order) over
    the block counts n_i that hold the L blocks, per theta."""
    L = inp.U - 2
    # blocks placed along the first axis: a shift by n blocks is a contiguous block of rows
    best = np.full((L + 1, weight.shape[1]), np.inf)
    best[0] = 0.0
    tmp = np.empty_like(best)
    rows = iter(range(weight.shape[0]))
    for i in range(inp.P):
        check_deadline()
        new = np.full_like(best, np.inf)
        for n in block_counts(inp, i):
            part = tmp[:L + 1 - n]
            np.add(best[:L + 1 - n], weight[next(rows)], out=part)
            np.minimum(new[n:], part, out=new[n:])
        best = new
    return best[L]
