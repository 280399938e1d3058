"""Sailor's send-aware bound (`sailor_send_aware_time_bound_s`): Sailor's iteration charges every
stage's sends (activations forward, gradients back) at its pools' floors, so the slowest stage time
with its sends and the sum of the stage times bound T together. The bound splits the plans into
cells of theta and of the all-reduce + update cap, tests each cell with the stage DP
(`stage_fit.py`), lifts the sum of the stage times in a cell (`sum_tau.py`), and under a budget
rules cells out by their least cost (`binding_budget_usd`)."""
from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import replace

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs
from hetplan.formulations.joint.composition import first_stage_sends, iteration_time_s, theta_for_time_s
from hetplan.formulations.joint.tables import (_ClassTables, _cached_for, _class_tables, _pair_layout, _shared_for,
    _sync_by_pool, class_pools)
from hetplan.formulations.joint.bounds.parts import (_extra_values_s, _fastest_work_s, _first_true_from,
    _gpu_rate_usd_per_s, _gpus_per_type, _links_lower_bound_s, _sailor_class_receives_s, _sailor_class_sends_s,
    _sailor_send_floor_s, _sailor_stage_times_s, _spread, _sync_update_lower_bound_s)
from hetplan.formulations.joint.bounds.stage_fit import stages_fit_dp
from hetplan.formulations.joint.bounds.bottleneck import bottleneck_lower_bound_s
from hetplan.formulations.joint.bounds.sum_tau import budget_sum_tau_s, capped_sum_tau_s, sum_tau_lower_bound_s


def sailor_send_aware_time_bound_s(inp: JointInputs, target_s: float | None = None,
                                   receivers: bool = False) -> float:
    """Sailor's composition: a stage's bottleneck time is its compute plus its own sends,
    theta >= tau_i + p_i, and p_i >= k_i x (the send floor of every pool the stage uses, and c_node
    / 2), k_i = 2 for a middle or last stage, 1 or 2 (P > 3) for the first (`sailor_p2p`). So every
    class c serving stage i with n blocks has time[c, i, n] + k_i max(c_node / 2, sf_c) <= theta,
    sf_c the least send floor of c's pools (`_sailor_stage_times_s`), and theta is at least the
    least time at which `stages_fit_dp` fits the blocks with those times. Then
        T >= sum tau + sum p + (m - 1) theta + sigma + mu
    with sum p >= (P - 1) c_node + (e or 2 e) (`sailor_transfer_floor_s`). The floor common to all
    stages that `sailor_transfer_floor_s` adds misses that a slow sender (TP 1: ~4x slower fits)
    slows its own stage only (measured: Sailor's OPT-350M on 128 A100, the strong bound of P3 b4
    D16 from 2.337 to 2.388 s, the choice's optimum 2.674 s; of P4 b4 D16 from 2.375 to 2.516 s).
    `target_s`: stops at the first stage time that rules it out. `receivers`: the DP fits the
    families of cases of `_sailor_receiver_cases_s` instead (each case a DP test, so the search asks
    for them only in a choice's strongest bound). Blocks form only."""
    return _sailor_send_aware_s(inp, target_s, receivers, False)


def sailor_send_aware_rules_out_s(inp: JointInputs, target_s: float) -> float | None:
    """`sailor_send_aware_time_bound_s(inp, target_s)` when it is at least `target_s`, else None,
    known sooner: the cells are taken in the same order, and the first that falls short of the
    target answers None. A cell falls short wherever the choice holds a plan better than the
    target, and then it tries every split of its range, so the rest of the bound is spared
    (measured: Sailor's GPT-Neo-2.7B on 32 A100 + 96 V100, P5 b1 D16, which holds a plan 0.4 %
    under the target of 31.19 s: the bound takes 0.79 s, and 0.14 s at the target its plan sets)."""
    out = _sailor_send_aware_s(inp, target_s, False, True)
    return out if out >= target_s else None


def _sailor_send_aware_s(inp: JointInputs, target_s: float | None, receivers: bool, decide: bool) -> float:
    """`sailor_send_aware_time_bound_s`; `decide` (with a target): stops at the first cell below
    it (`_split_cells_bound_s`), so a result below the target is no bound."""
    families = _sailor_receiver_cases_s(inp) if receivers else [[_sailor_stage_times_s(inp)]]
    times = [case for family in families for case in family]
    sync_update = _sync_update_lower_bound_s(inp)
    transfers = _links_lower_bound_s(inp) + first_stage_sends(inp.P) * _sailor_send_floor_s(inp)
    cands = np.unique(np.concatenate([t[np.isfinite(t)] for t in times]))
    cands = cands[cands >= bottleneck_lower_bound_s(inp, exact=False)].tolist()
    if not cands:
        return math.inf
    fits = _families_fit(inp, families)
    if target_s is not None and inp.m > 1 and binding_budget_usd(inp, target_s) is None:
        # one DP test with F for sum tau and no cap first: it settles most choices without the
        # Lagrangian sum-tau bound and the cells (measured: Sailor's GPT-Neo-2.7B on 32 A100 + 96
        # V100, one process, 71 of 93 choices; the search 6.5 -> 3.6 s). Not under a budget, where
        # the test is a bisection by ranges of up to 127 DP tests, which the cells then repeat with
        # the stronger sum (32 A100 + 96 V100 under 0.5 USD: 17.7 and 18.4 s with it, 16.7 and 16.9 s
        # without; the same code both sides read 19.1, 19.9 / 18.4, 19.0 s: a difference within noise)
        ruled = _cell_rules_out_s(inp, lambda t, rate=math.inf: fits(t, math.inf, rate), cands, sync_update,
                                  _fastest_work_s(inp) + transfers, 0.0, target_s)
        if ruled is not None:
            return ruled
    # the bulk's inputs (their raised class tables) only past that test: it settles most choices
    bulk = _bulk_inputs(inp) if receivers and target_s is not None and inp.m > 1 else None
    bulk_fits = None if bulk is None else _families_fit(bulk, families)
    return _split_cells_bound_s(inp, fits, cands, sum_tau_lower_bound_s(inp), transfers, sync_update, target_s,
                                lift=True, decide=decide, bulk_fits=bulk_fits)


# A cell of the send-aware bound is split again with the bulk's test (`_bulk_inputs`,
# `_split_cells_bound_s`) only where its bound without it falls short of the target by less than
# this share. Measured (`_tight_bound(..., strongest=True)` at the search's target, one process):
# Sailor's OPT-350M on 2 zones x (128 A100 + 128 V100), P6 b2 D32 1.36191 s in 1.13 s without the
# bulk, 1.37131 s in 1.41 s with it at 2 % and in 1.47 s at 100 % (target 1.37125 s); on 32 A100 +
# 96 V100 under 0.5 USD, P3 b4 D16, 4.94991 s in 0.44 s at 2 %, 4.97064 s in 1.55 s at 100 %
# (target 5.43439 s: short either way).
BULK_WITHIN = 0.02


def _bulk_inputs(inp: JointInputs) -> JointInputs | None:
    """Sailor's all-reduce waits for the slowest pair of replicas: a stage that holds two replicas
    or more of one group (a zone's GPU type) pays at least `repeat_sync_table`'s entry of every
    pool of that group it uses (evaluation.evaluate, the MILP's sync_repeat rows). With G groups
    and D > G, at most G - 1 of a stage's D replicas sit alone in their group (G alone would be
    all of them), so at least D - G + 1 pay that floor. These inputs test those replicas alone:
    D - G + 1 replicas a stage, each class's all-reduce + update raised to max(its floor, its
    pools' least repeat entry) + update (+ the tied embedding at the ends, as
    `_ClassTables.extra_in_s` / `extra_span_s` add it). A plan fits them wherever it fits the
    inputs (its other replicas' GPUs left out: a relaxation). None without the repeat table or
    with D <= G. Measured: Sailor's OPT-350M on 2 zones of 128 A100 + 128 V100, P6 b2 D32, where
    a V100 TP 4 first stage of 3 blocks pays 0.1856 s (its table floor 0.1350 s): with them the
    strongest bound 1.3619 -> 1.3713 s, above the search's target 1.3712 s, so its MILP (5.3 s)
    is not needed; P4 b4 D32 1.3660 -> 1.3713 s (its 0.7 s MILP neither)."""
    def make(inp: JointInputs) -> JointInputs | None:
        groups = len({(p.zone, p.gpu_type) for p in inp.pools})
        if inp.repeat_sync_table is None or inp.sync_table is None or inp.D <= groups:
            return None
        bulk = replace(inp, D=inp.D - groups + 1)
        _cached_for(bulk, "class_tables", lambda _: _with_repeat_floors(inp))
        return bulk
    return _cached_for(inp, "bulk_inputs", make)


def _with_repeat_floors(inp: JointInputs) -> _ClassTables:
    """`_class_tables(inp)` with each class's all-reduce floors (in one zone, spanning zones) raised
    to at least its pools' least `repeat_sync_table` entry (`_bulk_inputs`)."""
    tab, lay = _class_tables(inp), _pair_layout(inp)
    members = class_pools(inp, tab.classes)

    def least(table: dict) -> np.ndarray:  # (C, M): per class, its pools' least entry
        grid = _sync_by_pool(inp, lay, table)
        return np.stack([grid[ks].min(axis=0) for ks in members])

    repeat, in_zone = least(inp.repeat_sync_table), least(inp.sync_table)
    span = in_zone if inp.span_sync_table is None else least(inp.span_sync_table)
    return replace(tab, extra_in_s=tab.extra_in_s + np.maximum(repeat - in_zone, 0.0),
                   extra_span_s=tab.extra_span_s + np.maximum(repeat - span, 0.0))


def _also_in_bulk(fits, bulk_fits, values: np.ndarray):
    """fits(theta, cap, rate) of both tests, for the cells of `_split_cells_bound_s`. A cell there
    caps the class tables' extras at cap = values[b - 1] (the next value, values[b], is not in it);
    taken as the plans whose largest figure s (of the class tables' extras and the bulk's raised
    ones alike) lies in [values[a], values[b]), their sigma + mu is still >= values[a], their
    extras are <= cap, and the bulk's raised extras are < values[b]: that test is capped there
    (no cap for the last cell). The plain test first (its DP answers are cached)."""
    def fits_both(t: float, cap: float, rate: float = math.inf) -> bool:
        if not fits(t, cap, rate):
            return False
        above = values[np.searchsorted(values, cap, side="right"):]
        return bulk_fits(t, float(np.nextafter(above[0], -np.inf)) if above.size else math.inf, rate)
    return fits_both


def _sailor_receiver_cases_s(inp: JointInputs) -> list[list[np.ndarray]]:
    """Families of cases of the stage times with their sends (`_sailor_stage_times_s`) where a
    stage's sends also wait for their receivers: a send to stage j is at least the receive floor of
    every pool j uses (evaluation.sailor_sends). Per level phi of the classes' least receive floors
    r_c, one (C, M) case: the sending stage's classes at their compute plus their sends with the
    ones to the receivers at max(own send, phi), and the receiving stages served only by the
    classes with r_c <= phi. A plan fits the case of phi = the largest r_c among its receivers'
    classes (at its own theta), so in every family some case fits it, and theta is at least the
    least stage time at which some case of each family fits (`_families_fit`). The families:
    stage 0 (its k_0 activation sends wait for stage 1), stage P - 1 (both its gradient sends wait
    for stage P - 2; with P = 3 one family with stage 0's, as both receivers are stage 1), and each
    middle stage i (one of its two sends waits for the larger receiver of stages i - 1 and i + 1).
    Levels at or below every class's own send lift no stage, so of those only the largest (the
    loosest on the receivers) is kept. Measured: Sailor's OPT-350M, 2 zones of 128 A100 + 128
    V100, P6 b2 D32: the optimum's V100 TP 4 first stage (send floor 0.00354 s) sends at the A100
    TP 2 receiver's 0.00497 s; 32 A100 + 96 V100, P3 b2 D16 (optimum 4.96317 s, theta 0.13318 s,
    sigma + mu 0.44419 s): the least theta of the plans on single-class stages with sigma + mu <=
    0.4432 s is 0.13933 s by enumeration, 0.13671 s by the DP with stage 0's family alone,
    0.13933 s with all (`_families_fit` joins them where a family alone fits). Every joined case
    up front (a case per pair of levels) cost as much time as the MILPs it spared (b_OPT-350_a32_v96:
    0 MILPs instead of 2, the same 9 s search)."""
    def make(inp: JointInputs) -> list[list[np.ndarray]]:
        tab, lay = _class_tables(inp), _pair_layout(inp)
        plain, send, recv = _sailor_stage_times_s(inp), _sailor_class_sends_s(inp), _sailor_class_receives_s(inp)
        levels = np.unique(recv)
        low = levels[levels <= send.min()]
        levels = np.concatenate([low[-1:], levels[levels > send.min()]]).tolist()
        P = inp.P

        def family(lifted: dict[int, tuple[int, int]], receivers: tuple[int, ...]) -> list[np.ndarray]:
            """lifted: stage -> (its sends that wait for the receivers, its other sends)."""
            at = np.isin(lay.stage, receivers)
            cases = []
            for phi in levels:
                case = plain.copy()
                for i, (waiting, other) in lifted.items():
                    on = lay.stage == i
                    case[:, on] = tab.time_s[:, on] + (waiting * np.maximum(send, phi) + other * send)[:, None]
                case[np.ix_(recv > phi, at)] = np.inf
                cases.append(case)
            return cases

        first = {0: (first_stage_sends(P), 0)}
        if P == 3:
            families = [family({**first, 2: (2, 0)}, (1,))]
        else:
            families = [family(first, (1,)), family({P - 1: (2, 0)}, (P - 2,))]
        return families + [family({i: (1, 1)}, (i - 1, i + 1)) for i in range(1, P - 1)]
    return _cached_for(inp, "sailor_receiver_cases", make)


JOINED_CASES = 16  # the most joined cases `_families_fit` tests at one theta


def _families_fit(inp: JointInputs, families: list[list[np.ndarray]]):
    """fits(theta, cap, rate): some case of every family fits (`stages_fit_dp`), and one plan fits
    them together. Each family holds a case that a given plan fits, so the plan also fits their
    elementwise max, the joined case; a joined case fits only if each of its cases does, so only
    the joins of cases that fit alone are tested, and only when they are at most JOINED_CASES
    (beyond, the families' separate answer stands: still a relaxation). Separately each family may
    fit with a plan of its own: Sailor's OPT-350M on 32 A100 + 96 V100, P3 b2 D16, the families
    fit at theta 0.13073 s, joined at 0.13318 s, the optimum's (by enumeration of single-class
    stages; HiGHS finds no plan with theta <= 0.1330 s), and the choice's strongest bound goes from
    4.87181 to 4.91365 s, above the search's target."""
    joined: dict[tuple[int, ...], np.ndarray] = {}

    def fits(t: float, cap: float, rate: float = math.inf) -> bool:
        alone = []
        for family in families:
            idx = [j for j, ts in enumerate(family)
                   if stages_fit_dp(inp, t, cap, times_s=ts, max_rate_usd_per_s=rate)]
            if not idx:
                return False
            alone.append(idx)
        if len(families) == 1 or math.prod(map(len, alone)) > JOINED_CASES:
            return True
        for pick in itertools.product(*alone):
            if pick not in joined:
                joined[pick] = functools.reduce(np.maximum, (family[j] for family, j in zip(families, pick)))
            if stages_fit_dp(inp, t, cap, times_s=joined[pick], max_rate_usd_per_s=rate):
                return True
        return False
    return fits


def _times_fit(inp: JointInputs, *times: np.ndarray):
    """fits(theta, cap, rate): `stages_fit_dp` with one of the per-class stage time arrays `times`."""
    return lambda t, cap, rate=math.inf: any(stages_fit_dp(inp, t, cap, times_s=ts, max_rate_usd_per_s=rate)
                                             for ts in times)


def _send_aware_cell_bounds(inp: JointInputs, fits, cands: list[float], sum_tau: float, sync_update: float,
                            transfers: float, rest_floor: float = 0.0) -> list[tuple]:
    """(floor, cap, bound on T of the plans of that cell) for each cell of `_send_aware_cells`, no
    target: `fits(theta, cap, rate)` as in `_split_cells_bound_s`."""
    return [(floor, cap, _send_aware_cell_s(inp, lambda t, rate=math.inf, cap=cap: fits(t, cap, rate), cands,
                                            max(sync_update, floor, rest_floor), sum_tau + transfers, 0.0, None))
            for floor, cap in _send_aware_cells(inp, sync_update)]


def _send_aware_cells(inp: JointInputs, sync_update: float, count: int = 4) -> list[tuple[float, float]]:
    """(floor, cap) cells of a plan's largest extra s (`_ClassTables.extra_in_s` or `extra_span_s`
    of each stage's class and placement: sigma + mu >= s): the plans with s in [g_j, g_j+1) fit
    `stages_fit_dp` with the cap g'_j (the largest extra value below g_j+1) and have sigma + mu >=
    g_j; the first cell starts at -inf (floor `sync_update`), the last has no cap."""
    caps = _extra_values_s(inp)
    values = caps[caps > sync_update]
    if inp.m <= 1 or values.size == 0:
        return [(sync_update, math.inf)]
    grid = _spread(values, count)
    below = [float(caps[np.searchsorted(caps, g) - 1]) for g in grid]  # the largest extra < g (caps[0] <= sync_update < g)
    return list(zip([sync_update] + grid, below + [math.inf]))


def _send_aware_cell_s(inp: JointInputs, fits, cands: list[float], rest: float, sum_tau: float, transfers: float,
                       target_s: float | None) -> float:
    """T >= sum tau + transfers + (m - 1) theta + rest over the plans of one cell, theta the least
    candidate stage time at which `fits(theta)` (a `stages_fit_dp` test within the cell's cap, with
    per-class stage times: `sailor_send_aware_time_bound_s`, `sailor_crossing_time_bound_s`); with
    `target_s`, the first time that rules it out."""
    hi = len(cands) - 1
    if target_s is not None and inp.m > 1:
        out = _cell_rules_out_s(inp, fits, cands, rest, sum_tau, transfers, target_s)
        if out is not None:
            return out
        hi = _last_beating(inp, cands, rest, sum_tau, transfers, target_s)
        if hi < 0:
            return iteration_time_s(inp.m, sum_tau, transfers, cands[0], rest)
        if binding_budget_usd(inp, target_s) is not None:  # the least slowest stage the budget affords, by ranges
            time_at = _cell_time_at(inp, cands, rest, sum_tau, transfers)
            ok, bad = -1, hi  # cands[..ok] hold no plan within the budget; cands[..bad] may
            while bad - ok > 1:
                mid = (ok + bad) // 2
                if _range_ruled_out(inp, fits, cands, time_at, 0, mid, BUDGET_SPLITS):
                    ok = mid
                else:
                    bad = mid
            return time_at(ok + 1)
    elif not fits(cands[hi]):
        return math.inf
    theta = cands[_first_true_from(fits, cands, 0, hi)]
    return iteration_time_s(inp.m, sum_tau, transfers, theta, rest)


def _cell_rules_out_s(inp: JointInputs, fits, cands: list[float], rest: float, sum_tau: float, transfers: float,
                      target_s: float) -> float | None:
    """A DP test of a cell of `_send_aware_cell_s` against `target_s` (m > 1): a bound >= target_s
    on its plans when the blocks do not fit at the last candidate stage time that would beat the
    target, else None. Under a budget (`JointInputs.max_cost_usd`), cost >= rate x T, so a plan whose
    slowest stage takes one of cands[lo..hi] has T >= the cell's T at cands[lo] and a rate of at most
    the budget over that: `_range_ruled_out` tests the range so, halving it where it fits."""
    below = _last_beating(inp, cands, rest, sum_tau, transfers, target_s)
    if below < 0:
        return None
    if binding_budget_usd(inp, target_s) is None:
        if fits(cands[below]):
            return None
    elif not _range_ruled_out(inp, fits, cands, _cell_time_at(inp, cands, rest, sum_tau, transfers), 0, below,
                              BUDGET_SPLITS):
        return None
    theta = cands[below + 1] if below + 1 < len(cands) else math.inf
    return iteration_time_s(inp.m, sum_tau, transfers, theta, rest)


def _last_beating(inp: JointInputs, cands: list[float], rest: float, sum_tau: float, transfers: float,
                  target_s: float) -> int:
    """The index of the last candidate stage time at which a cell's T would beat `target_s` (-1: none)."""
    return bisect.bisect_left(cands, theta_for_time_s(inp.m, target_s, sum_tau, transfers, rest)) - 1


def _cell_time_at(inp: JointInputs, cands: list[float], rest: float, sum_tau: float, transfers: float):
    """j -> a cell's T with its slowest stage at cands[j]."""
    return lambda j: iteration_time_s(inp.m, sum_tau, transfers, cands[j], rest)


def binding_budget_usd(inp: JointInputs, target_s: float | None) -> float | None:
    """The budget (`JointInputs.max_cost_usd`) as the bounds that rule out `target_s` see it, None
    where it cannot bind there. Those bounds read a budget only as a cap on the rate of their DP
    tests' plans: cost >= rate x T, and a plan that beats the target has T < target_s, so its rate
    is below max_cost_usd / target_s. No DP plan has a rate above `_dp_rate_ceiling_usd_per_s`, so
    where that cap reaches it the capped tests answer as the budget-free ones, and the budget-free
    bound (at least as strong: its cells get the plain test and the compute-only lift) is valid
    for the plans within the budget too. Sailor's OPT-350M on 2 zones of 128 A100 + 128 V100 under
    1.2 USD: the ceiling is 0.4646 USD/s, so at the search's target of 1.3712 s the budget caps no
    DP plan (0.637 USD at most), and its bounds now take what they take without it."""
    budget = inp.max_cost_usd
    if budget is None or target_s is None or budget < target_s * _dp_rate_ceiling_usd_per_s(inp) * (1 + 1e-9):
        return budget
    return None


def _dp_rate_ceiling_usd_per_s(inp: JointInputs) -> float:
    """The largest rate a plan of the DP tests can have: every GPU of the inputs at its type's least
    price (`_two_resource_dp` prices a resource's GPUs at its types' least, and holds them within
    the resource's GPUs: a merged resource's GPUs times its least price is at most this sum)."""
    return _shared_for(inp, "dp_rate_ceiling", lambda inp: sum(
        n * _gpu_rate_usd_per_s(inp, [g]) for g, n in _gpus_per_type(inp).items()))


BUDGET_SPLITS = 6  # halvings of `_range_ruled_out`: at most 2^(BUDGET_SPLITS + 1) - 1 DP tests


def _range_ruled_out(inp: JointInputs, fits, cands: list[float], time_at, lo: int, hi: int, depth: int) -> bool:
    """Whether no plan within the budget has its slowest stage among cands[lo..hi]: such a plan
    fits at cands[hi] with a rate <= max_cost_usd / time_at(lo) (T >= time_at(lo))."""
    if not fits(cands[hi], inp.max_cost_usd / time_at(lo)):
        return True
    if depth == 0 or lo == hi:
        return False
    mid = (lo + hi) // 2
    return (_range_ruled_out(inp, fits, cands, time_at, lo, mid, depth - 1)
            and _range_ruled_out(inp, fits, cands, time_at, mid + 1, hi, depth - 1))


SPLIT_TESTS = 48  # DP tests `_split_cells_bound_s` may spend on splitting cells against a target


def _split_cells_bound_s(inp: JointInputs, fits, cands: list[float], sum_tau: float, transfers: float,
                         sync_update: float, target_s: float | None, rest_floor: float = 0.0,
                         lift: bool = False, decide: bool = False, send_excess_s: float = 0.0,
                         bulk_fits=None, span: tuple[int, int] | None = None, stage_sum=None) -> float:
    """min over cells of `_send_aware_cell_s`, `fits(theta, cap)`. A cell is a range [a, b) of the
    ascending extra values v (`_extra_values_s`): the plans whose largest extra s is one of v[a..b-1]
    have sigma + mu >= max(v[a], sync_update, rest_floor) and fit within the cap v[b-1] (none for the
    last). Without a target, the cells of `_send_aware_cells`. With one, the whole range is split in
    halves wherever a cell's one test (`_cell_rules_out_s`) cannot rule the target out, so the
    cells are fine exactly where the plans' trade-off between theta and sigma is close to the
    target (measured: Sailor's GPT-Neo, 5 zones x 32 A100, P7 b2 D16, whose optimum has sigma =
    1.34 s: a fixed grid of 4, 8, 16 cells gives 10.41, 10.93, 11.14 s). After SPLIT_TESTS tests the
    cells left are bounded whole. `lift`: where a cell's test does not rule the target out, its
    stage times with their sends are lifted under a cap on the slowest (`_lifted_send_cell_s`);
    where that falls short too, its sum of stage times is lifted to the least under its cap
    (`capped_sum_tau_s`, strong: GPU counts and the types' quotas; sum tau_i over compute times, the
    sends stay in `transfers`; measured: Sailor's GPT-Neo on 128 A100 + 384 V100, P10 b1 D16: sum
    tau >= 0.326 s alone, the optimum's 0.508 s) and the send lift runs again from there. That
    order spares the compute-only lift's replica-level DP in most cells (measured: Sailor's
    OPT-350M on 128 A100 + 384 V100, 341 of those DPs in a search, none after). Under a budget the
    cell gets only the send lift (with the budget's cap on the GPUs' rate), and before
    its bisection by ranges (`_send_aware_cell_s`, up to 127 DP tests a step), which it then
    spares where it rules the target out. (The compute-only lift under a budget had cost more
    than it gave: 32 A100 + 96 V100 under 0.5 USD went from gap 1.0 % in 24 s to 6.6 % at the
    limit of benchmarks/sailor_real.py --time-limit 30.)
    `decide` (with a target): returns at the first cell whose bound falls short of the target, its
    value then only saying that the target is not ruled out (`sailor_send_aware_rules_out_s`).
    `send_excess_s`: what every plan's sends take beyond their classes' own floors at least (the
    sends over a boundary between regions: `sailor_crossing_time_bound_s`), added to the send
    lift's sums of stage times with sends.
    `bulk_fits` (with a target): the test of `_bulk_inputs`; a final cell whose bound falls short
    of the target by less than BULK_WITHIN is split again, as the whole range is, with both tests
    (`_also_in_bulk`), and keeps the larger bound. `span`: the range (a, b) of extra values split,
    all of them by default. `stage_sum(theta_cap, cap)`: another lower bound on the sum of stage
    times with sends of the plans within those caps, for the send lift (`_lifted_send_cell_s`)."""
    def cell(floor: float, cap: float) -> tuple:  # (fits within the cap, the cell's rest, the cap)
        return lambda t, rate=math.inf: fits(t, cap, rate), max(sync_update, rest_floor, floor), cap

    def of(a: int, b: int) -> tuple:  # the cell of the plans whose largest extra is one of vals[a..b-1]
        return cell(vals[a], vals[b - 1] if b < len(vals) else math.inf)

    def lifted(cap: float) -> float:
        return max(sum_tau, capped_sum_tau_s(inp, math.inf, cap, True)) + transfers

    def bound(test_rest: tuple, target: float | None) -> float:
        test, rest, cap = test_rest
        if not (lift and target is not None and inp.m > 1):
            return _send_aware_cell_s(inp, test, cands, rest, sum_tau + transfers, 0.0, target)
        budget = binding_budget_usd(inp, target) is not None
        if not budget:  # the plain test first (under a budget it is the costly bisection by ranges)
            ruled = _cell_rules_out_s(inp, test, cands, rest, sum_tau + transfers, 0.0, target)
            if ruled is not None:
                return ruled
        out = _lifted_send_cell_s(inp, test, cands, rest, sum_tau + transfers, cap, target, excess_s=send_excess_s,
                                  stage_sum=stage_sum)
        if out >= target:  # spares what follows: a replica-level DP, or up to 127 DP tests a cell
            return out
        if budget:
            return max(out, _send_aware_cell_s(inp, test, cands, rest, sum_tau + transfers, 0.0, target))
        return max(out, _lifted_send_cell_s(inp, test, cands, rest, lifted(cap), cap, target, excess_s=send_excess_s,
                                            stage_sum=stage_sum))

    vals = _extra_values_s(inp)
    if target_s is None:
        return min(b for _, _, b in _send_aware_cell_bounds(inp, fits, cands, sum_tau, sync_update, transfers,
                                                            rest_floor))
    if inp.m <= 1 or vals.size == 0:
        return min(bound(cell(floor, cap), target_s) for floor, cap in _send_aware_cells(inp, sync_update))
    out, tests, stack = math.inf, 0, [span or (0, len(vals))]
    while stack:
        a, b = stack.pop()
        test, rest, cap = of(a, b)
        if b - a == 1 or tests >= SPLIT_TESTS:
            target = min(target_s, out)
            got = bound((test, rest, cap), target)
            if bulk_fits is not None and target * (1 - BULK_WITHIN) <= got < target:
                got = max(got, _split_cells_bound_s(inp, _also_in_bulk(fits, bulk_fits, vals), cands, sum_tau,
                                                    transfers, sync_update, target, rest_floor, lift, decide,
                                                    send_excess_s, span=(a, b), stage_sum=stage_sum))
            out = min(out, got)
            if decide and out < target_s:
                return out
            continue
        tests += 1
        ruled = _cell_rules_out_s(inp, test, cands, rest, sum_tau + transfers, 0.0, min(target_s, out))
        if ruled is not None:
            out = min(out, ruled)
        else:
            stack += [((a + b) // 2, b), (a, (a + b) // 2)]
    return out


LIFT_SPLITS = 6  # halvings of `_lifted_send_cell_s`'s range of slowest stage times
BUDGET_LIFTS = 2  # rounds of `_lifted_send_cell_s`'s rate cap and sum under a budget


def _lifted_send_cell_s(inp: JointInputs, fits, cands: list[float], rest: float, stages_s: float, cap: float,
                        target_s: float, depth: int = LIFT_SPLITS, excess_s: float = 0.0, stage_sum=None) -> float:
    """A cell of `_split_cells_bound_s` (m > 1, a target), its stages and sends at least `stages_s`,
    lifted where the slowest stage time caps them: a plan whose theta lies in [cands[l], cands[h]]
    (cands: stage times with sends) has every tau_i + p_i <= cands[h], so sum_i (tau_i + p_i) >=
    `capped_sum_tau_s`(cands[h], cap, strong, sends) and T >= that + (m - 1) cands[l] + rest. The
    range of thetas that could beat the target with `stages_s` is halved (at most `depth` times)
    where a part's bound falls short. The fast classes that a small theta needs cannot serve every
    stage, so the stages they leave run slower and their sends count (measured: Sailor's OPT-350M
    on 2 zones of 128 A100 + 128 V100, P6 b2 D32: 1.2767 s before, 1.3192 s with it; the MILP's
    optimum is 1.3734 s). `excess_s` is added to those sums (`_split_cells_bound_s`); where they fall
    short, `stage_sum(cands[h], cap)` (a lower bound on the same sum, none by default) is tried too.
    Under a budget that binds at the target, such a plan costs at least rate x T with T at least
    the part's bound, so its rate is at most the budget over that bound, and the sum is at least
    `budget_sum_tau_s` at that rate; a larger sum lowers the rate again (BUDGET_LIFTS rounds;
    measured: Sailor's OPT-350M on 32 A100 + 96 V100 under 0.5 USD, P3 b4 D16: the choice's
    strongest bound 5.1366 -> 5.4347 s, over the search's target of 5.4344 s, so its MILP (1.5 s)
    no longer runs)."""
    def time_at(stages: float, j: int) -> float:
        return iteration_time_s(inp.m, stages, 0.0, cands[j] if j < len(cands) else math.inf, rest)

    hi = _last_beating(inp, cands, rest, stages_s, 0.0, target_s)
    if hi < 0 or not fits(cands[hi]):
        return time_at(stages_s, hi + 1)

    budget = binding_budget_usd(inp, target_s)

    def part(lo: int, up: int, d: int) -> float:
        def reaches(sum_s: float) -> bool:  # whether a sum of stage times rules the part out
            return time_at(sum_s + excess_s, lo) >= target_s

        stages = max(stages_s, capped_sum_tau_s(inp, cands[up], cap, sends=True) + excess_s)
        if time_at(stages, lo) < target_s:  # the replica-level DPs only where the units DP falls short
            stages = max(stages, capped_sum_tau_s(inp, cands[up], cap, True, sends=True, reaches=reaches) + excess_s)
        if time_at(stages, lo) < target_s and stage_sum is not None:
            stages = max(stages, stage_sum(cands[up], cap))
        for _ in range(BUDGET_LIFTS if budget is not None else 0):
            if time_at(stages, lo) >= target_s:
                break
            rate = budget / time_at(stages, lo)
            lifted = budget_sum_tau_s(inp, cands[up], cap, rate, sends=True, reaches=reaches) + excess_s
            if lifted <= stages:
                break
            stages = lifted
        out = time_at(stages, lo)
        if out >= target_s or d == 0 or lo == up:
            return out
        mid = (lo + up) // 2
        left = part(lo, mid, d - 1)
        return max(out, min(left, part(mid + 1, up, 0 if left < target_s else d - 1)))

    return min(part(_first_true_from(fits, cands, 0, hi), hi, depth), time_at(stages_s, hi + 1))
