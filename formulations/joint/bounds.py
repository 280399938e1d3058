"""Lower bounds on the iteration time and cost of every plan of one outer choice. Each composes
lower bounds on the parts of an iteration with composition.py's functions (nondecreasing in every
part, so the result is a lower bound); each public function states its bound and why it is valid
in its docstring; tests/test_planner.py and
tests/test_cost_model_agreement.py check them against enumeration on small instances."""
from __future__ import annotations

import bisect
import contextlib
import contextvars
import functools
import itertools
import math
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, ULP_SLACK, check_deadline, model_coef
from hetplan.formulations.joint.composition import (boundary_s, first_stage_sends, iteration_cost_usd,
    iteration_time_s, replica_rate_usd_per_s, theta_for_time_s, worker_bytes)
from hetplan.formulations.joint.tables import (_cached_for, _class_tables, _gpus_per_group,
    _ClassTables, _most_replicas, _pair_layout, _per_inputs_cache, _per_table, _shared_for, _sync_by_pool, block_counts,
    blocks_identical)


def time_upper_bound_s(inp: JointInputs) -> float:
    """T for the slowest imaginable assignment: a valid upper bound for the big-M on T."""
    worst_step = sum(max(inp.step_s[k][l] for k in range(inp.K)) for l in range(inp.U))
    tables = [inp.sync_table or {}, inp.span_sync_table or {}, inp.repeat_sync_table or {}]
    worst_tied = max(map(max, inp.tied_pool_s), default=0.0)
    worst_sync = max([model_coef(v) for tab in tables for v in tab.values()] + [0.0]) + worst_tied
    worst_c = (max(inp.p2p_s(link) for link in (inp.node, inp.zone, inp.region)) * max(inp.P - 1, 0)
               + 2 * max([*inp.send_floor_s, *(v for row in inp.send_away_s for v in row)], default=0.0)
               * inp.P)  # Sailor's sends: each <= c / 2 + its largest floor
    worst_upd = sum(max(inp.upd_s[k][l] for k in range(inp.K)) for l in range(inp.U)) + max(inp.upd_fixed_s, default=0.0)
    return (inp.m + inp.P - 1) * (worst_step + worst_c) + worst_sync + worst_upd


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
    Sailor's composition too: milp.py). T >= max(F, theta) + (m - 1) theta + sum_i c_i with theta >=
    the work bound as well."""
    cross = boundary_s(inp, 1, 1)
    theta = max(_theta_work_bound_s(inp), cross / 2)
    links = (inp.P - 2) * _c_node_s(inp) + cross
    return iteration_time_s(inp.m, max(_fastest_work_s(inp), theta), links, theta, 0.0)


def _work_bound_s(inp: JointInputs) -> float:
    """sum tau >= max(F, theta_w) with theta_w the work bound on the slowest stage time (itself
    one of the stage times): with m = 1 (D b = B) the work term alone is what is left."""
    theta = _theta_work_bound_s(inp)
    return iteration_time_s(inp.m, max(_fastest_work_s(inp), theta), 0.0, theta, 0.0)


def sailor_transfer_floor_s(inp: JointInputs) -> float:
    """What Sailor's composition adds to the hetplan composition's T on the same inputs, at least
    (0 for the hetplan composition or one stage). Every send A_i, G_i (`sailor_p2p`) is at least
    the half of its boundary h = c / 2 and at least e = max(c_min / 2, the least send floor), c_min
    the least boundary time. For every plan:
      theta_sailor >= theta + e: where theta = tau_j, p_j >= a send of j >= e; where theta = h_i,
        stage i + 1 sends G >= h_i and another send >= e (a middle stage), or G twice (the last);
      sum_i p_i >= sum_i c_i + G_{P-1} (P <= 3), + A_0 + G_{P-1} (P > 3).
    So every bound on the hetplan composition's T plus (m - 1) e + (e or 2 e) bounds Sailor's
    (the bounds' targets are taken back by as much: `time_lower_bound_tight_s`)."""
    if not inp.sailor or inp.P == 1:
        return 0.0
    half = _sailor_send_floor_s(inp)  # every send is at least half the least boundary and the least floor
    return iteration_time_s(inp.m, 0.0, first_stage_sends(inp.P) * half, half, 0.0)


def _fastest_work_s(inp: JointInputs) -> float:
    """F: one microbatch through every unit, each on its fastest pool."""
    return _shared_for(inp, "fastest_work", lambda inp: sum(min(inp.step_s[k][l] for k in range(inp.K))
                                                            for l in range(inp.U)))


def _theta_work_bound_s(inp: JointInputs) -> float:
    """theta >= max(F / P, D x `fluid_gpu_seconds_s`) (see `time_lower_bound_s`): the GPU types'
    per-unit GPU-seconds (the least over their TP degrees), their GPUs available and max_gpus."""
    per_replica = _shared_for(inp, "fluid_work", lambda inp: fluid_gpu_seconds_s(
        _work_by_type(inp), _gpus_per_type(inp), inp.max_gpus))
    return max(_fastest_work_s(inp) / inp.P, inp.D * per_replica)


def fluid_gpu_seconds_s(work_by_type: dict[str, list[float]], gpus: dict[str, int],
                        max_gpus: int | None = None) -> float:
    """A lower bound on theta / D, the slowest stage time per replica, from the work alone.

    c[g][l] >= 0 is the least GPU-seconds one microbatch of unit l takes on GPU type g (step time
    x TP), n_g its GPUs available. Every replica of a stage is busy at most theta per microbatch, so
    the GPU-seconds that type g's replicas spend, sum over the units they hold of c[g][l], are at
    most u_g theta, u_g <= n_g the GPUs of type g the plan uses (sum_g u_g <= max_gpus). Each unit
    is held by D replicas in all: with f[l][g] the share of them on g, D sum_l f[l][g] c[g][l] <=
    u_g theta. Weighting type g by 1 / C_g (C_g = sum_l c[g][l], one microbatch through the whole
    model on g) and summing over g (weak LP duality):
        theta sum_g u_g / C_g >= D sum_l sum_g f[l][g] c[g][l] / C_g >= D sum_l min_g c[g][l] / C_g,
    and sum_g u_g / C_g is at most its greedy maximum (the fastest types first, up to max_gpus).
    On one GPU type this is D W / N; on several it counts a slow GPU as the fraction of a fast one
    that it is (measured: Llama-7B on large_5type_2k, theta >= D / 3,476 s per microbatch of one
    sample against D / 10,369 s from D W / N with every GPU as fast as an H100 at TP 1)."""
    whole = {g: sum(row) for g, row in work_by_type.items() if sum(row) > 0}
    if not whole:
        return 0.0
    units = len(next(iter(work_by_type.values())))
    need = sum(min(work_by_type[g][l] / whole[g] for g in whole) for l in range(units))
    left, rate = (max_gpus if max_gpus is not None else math.inf), 0.0
    for g in sorted(whole, key=whole.__getitem__):  # the fastest (least GPU-seconds) first
        take = min(gpus.get(g, 0), left)
        rate, left = rate + take / whole[g], left - take
    return need / rate if rate > 0 else math.inf


def _work_by_type(inp: JointInputs) -> dict[str, list[float]]:
    """c[g][l] of `fluid_gpu_seconds_s` for these pools: per GPU type and unit, the least GPU-seconds
    (step time x TP) over the type's pools."""
    return _shared_for(inp, "work_by_type", lambda inp: least_work_by_type(
        (p.gpu_type, [inp.step_s[k][l] * p.tp for l in range(inp.U)]) for k, p in enumerate(inp.pools)))


def least_work_by_type(rows) -> dict[str, list[float]]:
    """GPU type -> per-unit least of the rows (gpu type, per-unit GPU-seconds of one of its TP
    degrees or zones): the c[g][l] of `fluid_gpu_seconds_s`."""
    out: dict[str, list[float]] = {}
    for g, row in rows:
        out[g] = [min(a, b) for a, b in zip(out[g], row)] if g in out else list(row)
    return out


def _position_extras(inp: JointInputs, k: int, i: int) -> tuple[float, float]:
    """(seconds, bytes) stage position i adds on pool k besides its generic blocks: the embedding
    (and unit 1's difference from a generic block, only where it is lighter) on stage 0, the head
    on the last stage."""
    t = mem = 0.0
    nf = inp.in_flight(i)
    unit = lambda l: (inp.step_s[k][l], worker_bytes(inp.stat_bytes[k][l], inp.act_bytes[k][l], nf))  # noqa: E731
    if i == 0:
        t0, m0 = unit(0)
        t1, m1 = unit(1)
        tg, mg = unit(2)
        t, mem = t0 + min(0.0, t1 - tg), m0 + min(0.0, m1 - mg)
    if i == inp.P - 1:
        th, mh = unit(inp.U - 1)
        t, mem = t + th, mem + mh
    return t, mem


def blocks_coverable(inp: JointInputs, theta_s: float) -> float:
    """An upper bound on the transformer blocks P stages of D replicas can hold when no stage may
    take longer than theta_s per microbatch (relaxation: zones merged, quotas per GPU type).

    At stage position i a replica of class c holds at most cap[c,i] blocks: what fits in theta_s
    and in memory with min(P - i, m) microbatches in flight, after the embedding (i = 0) or head
    (i = P - 1). A stage holds no more than its worst replica. For a level v, the positions whose
    stage can hold >= v blocks need D replicas each of classes with cap >= v there, and at most
    N(v) positions can have that at once (`_hall_counts`). Total blocks <= sum_v (v - v_next) N(v)
    (layer-cake sum over the capacity levels)."""
    check_deadline()
    tab = _coverable_tables(inp)
    by_time = np.floor((theta_s - tab.extra_s) / tab.block_s[:, None] + 1e-9)
    caps = np.maximum(-1, np.minimum(np.minimum(by_time, tab.by_mem), inp.U - 2)).astype(np.int64)  # (K, P)
    work = _work_bound(inp, caps, tab.gpus)
    levels = np.unique(caps[caps > 0])[::-1]
    if levels.size == 0:
        return 0.0
    stages = _hall_counts(inp, tab, caps, levels)
    if stages[-1] < inp.P - 1:
        return 0.0  # every stage but the last needs a block: too few replicas that hold one
    widths = levels - np.append(levels[1:], 0)
    return min(float((widths * stages).sum()), work)


def _hall_counts(inp: JointInputs, tab: "_CoverableTables", caps: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """N(v) for each level: an upper bound on how many stage positions can each get D replicas of
    classes holding >= v blocks there, at once. A set S of positions can only be served if some
    x[j, g] >= 0 (replicas of type g at position j, each taking tp[g, j] GPUs, the type's
    smallest eligible TP there) has sum_g x[j, g] = D and sum_j tp[g, j] x[j, g] <= GPUs of g.
    For any prices lam_g >= 0 that implies D sum_{j in S} w_j <= sum_g lam_g GPUs_g with
    w_j = min_g lam_g tp[g, j] (Farkas), so |S| is at most the number of the cheapest w_j that fit
    the budget; N(v) is the least such count over a set of prices (`_hall_prices`: the ratios of
    the TP degrees, where the dual's vertices lie). With one GPU type this is exact: the positions
    needing the fewest GPUs per replica. It needs no order among the positions (the ends, with
    the embedding and the head, need not be more or less generous than the middle ones).
    With one position (P = 1) the count is exact: 1 when the GPUs make D replicas at each type's
    smallest eligible TP (`_replicas`, smallest TP first under max_gpus), which every price's
    test accepts too, so it is never weaker."""
    D = inp.D
    types = list(tab.pools_of_type)
    eligible = caps[None, :, :] >= levels[:, None, None]  # (V, K, P)
    tp = np.stack([np.where(eligible[:, ks, :], tab.tp[ks][None, :, None].astype(float), np.inf).min(axis=1)
                   for ks in tab.pools_of_type.values()])  # (T, V, P): smallest eligible TP, inf if none
    if tp.shape[2] == 1:
        return np.array([int(_replicas(tab.gpus, {g: int(t) for g, t in zip(types, tp[:, v, 0]) if np.isfinite(t)},
                                       inp.max_gpus) >= D) for v in range(tp.shape[1])])
    lams = _hall_prices(inp)  # (L, T + 1): a price per type, then one on every GPU (max_gpus)
    held = np.array([tab.gpus[g] for g in types] + [inp.max_gpus or 0], dtype=float)
    budget = lams @ held  # (L,)
    per_gpu = lams[:, :-1] + lams[:, -1:]  # (L, T)
    # positions share few TP columns: price each distinct column once (L x T x C, not L x T x V x P)
    cols, where = np.unique(tp.reshape(tp.shape[0], -1), axis=1, return_inverse=True)
    finite = np.isfinite(cols)
    w_col = np.where(finite[None], per_gpu[:, :, None] * np.where(finite, cols, 0.0)[None], np.inf).min(axis=1)
    w = w_col[:, where.reshape(-1)].reshape(lams.shape[0], tp.shape[1], tp.shape[2])
    cum = np.cumsum(np.sort(w, axis=2), axis=2)  # (L, V, P)
    fit = D * cum <= budget[:, None, None] * (1 + 1e-12)
    return fit.sum(axis=2).min(axis=0)


def _hall_prices(inp: JointInputs) -> np.ndarray:
    """Prices for `_hall_counts`: per type 0 or a ratio of two TP degrees (the first nonzero one
    1), and a price on every GPU alone when max_gpus caps them (any prices give a valid count).
    A function of the number of types, the TP degrees and max_gpus alone, so computed once for all."""
    return _make_hall_prices(len({p.gpu_type for p in inp.pools}), tuple(sorted({p.tp for p in inp.pools})),
                             inp.max_gpus is not None)


@functools.lru_cache(maxsize=64)
def _make_hall_prices(T: int, tps: tuple[int, ...], capped: bool) -> np.ndarray:
    ratios = sorted({a / b for a in tps for b in tps})
    rows = []
    for head in range(T):  # lam = (0, .., 0, 1, free ...)
        tails = np.array(np.meshgrid(*[[0.0] + ratios] * (T - head - 1), indexing="ij")).reshape(T - head - 1, -1).T \
            if T - head - 1 else np.zeros((1, 0))
        for tail in tails:
            rows.append([0.0] * head + [1.0] + list(tail) + [0.0])
    if capped:
        rows.append([0.0] * T + [1.0])
    prices = np.array(rows)
    prices.setflags(write=False)  # shared by every caller
    return prices


@dataclass(frozen=True)
class _CoverableTables:
    block_s: np.ndarray  # (K,) seconds of one generic block
    extra_s: np.ndarray  # (K, P) seconds a position adds (`_position_extras`)
    by_mem: np.ndarray  # (K, P) blocks that fit in memory at each position
    tp: np.ndarray  # (K,)
    gpus: dict  # GPU type -> GPUs (zones merged)
    pools_of_type: dict  # GPU type -> pool indices


def _coverable_tables(inp: JointInputs) -> _CoverableTables:
    """The theta-independent parts of `blocks_coverable`, computed once per inputs (a bound search
    calls it ~10 times on the same inputs)."""
    return _cached_for(inp, "coverable", _make_coverable_tables)


def _gpus_per_type(inp: JointInputs) -> dict[str, int]:
    """GPU type -> GPUs available over all its zones (pools of one quota share its GPUs)."""
    return _shared_for(inp, "gpus", _make_gpus_per_type)


def _make_gpus_per_type(inp: JointInputs) -> dict[str, int]:
    gpus: dict[str, int] = {}
    for per_type in _gpus_per_group(inp, "zone").values():
        for g, n in per_type.items():
            gpus[g] = gpus.get(g, 0) + n
    return gpus


def _make_coverable_tables(inp: JointInputs) -> _CoverableTables:
    gpus = _gpus_per_type(inp)
    extra = np.zeros((inp.K, inp.P))
    by_mem = np.zeros((inp.K, inp.P))
    for k in range(inp.K):
        for i in range(inp.P):
            et, em = _position_extras(inp, k, i)
            per_blk = worker_bytes(inp.stat_bytes[k][2], inp.act_bytes[k][2], inp.in_flight(i))
            extra[k, i] = et
            by_mem[k, i] = math.floor((inp.cap_bytes[k] - em) / per_blk) if per_blk > 0 else inp.U
    block = np.array([inp.step_s[k][2] for k in range(inp.K)])
    block = np.where(block > 0, block, np.inf)  # a free block: time never limits (caps cut at U - 2)
    types = sorted({p.gpu_type for p in inp.pools})
    return _CoverableTables(block, extra, by_mem, np.array([p.tp for p in inp.pools], dtype=np.int64), gpus,
                            {g: np.array([k for k, p in enumerate(inp.pools) if p.gpu_type == g]) for g in types})


def _work_bound(inp: JointInputs, caps: np.ndarray, gpus: dict[str, int]) -> float:
    """A stage holds no more blocks than the mean capacity of its D replicas, so all stages hold at
    most (1 / D) sum over replicas of their capacity; a GPU type gives the most in total at the TP
    degree with the most capacity per GPU (at any position: an overestimate). caps: (K, P) blocks."""
    best: dict[str, float] = {}
    top = np.maximum(caps.max(axis=1), 0)
    for k, p in enumerate(inp.pools):
        best[p.gpu_type] = max(best.get(p.gpu_type, 0.0), (gpus[p.gpu_type] // p.tp) * int(top[k]))
    return sum(best.values()) / inp.D


def _replicas(gpus: dict[str, int], min_tp: dict[str, int], max_gpus: int | None) -> int:
    budget = max_gpus if max_gpus is not None else math.inf
    count = 0
    for t, g in sorted((t, g) for g, t in min_tp.items()):  # smallest TP first: most replicas under a cap
        take = int(min(gpus[g] // t, budget // t))
        count, budget = count + take, budget - take * t
    return count


def bottleneck_lower_bound_s(inp: JointInputs, exact: bool = False, theta_hint_s: float | None = None) -> float:
    key = (exact, theta_hint_s)
    cache = _per_inputs_cache(inp, "bottleneck")
    if key not in cache:
        cache[key] = _bottleneck_lower_bound_s(inp, exact, theta_hint_s)
    return cache[key]


def _bottleneck_lower_bound_s(inp: JointInputs, exact: bool, theta_hint_s: float | None) -> float:
    """The least theta (slowest stage time per microbatch) for which `blocks_coverable` reaches
    the L = U - 2 blocks; +inf when no theta does (too few replicas or memory). With `exact`, from
    there the least stage time that `stages_fit_dp` accepts. `theta_hint_s` (the theta a caller
    needs to rule out, e.g. from an incumbent) saves DP calls: when the DP rejects every time below
    the hint, the first time at or above it is returned (a valid bound, maybe not the least)."""
    hall = _cached_for(inp, "hall_theta", _hall_theta_s)  # the medium and the strong bound share it
    if math.isinf(hall) or not exact or not blocks_identical(inp):
        return hall
    # the DP's answer changes only at actual stage times, so search those at or above Hall's answer
    times = np.unique(_class_tables(inp).time_s)
    times = times[times >= hall].tolist()
    fits = lambda c: stages_fit_dp(inp, c)  # noqa: E731
    if not times:
        return math.inf
    hi = len(times) - 1
    if theta_hint_s is not None:
        below = [j for j, t in enumerate(times) if t < theta_hint_s]
        if not below:
            return times[0]
        if not fits(times[below[-1]]):  # nothing below the hint fits: that is all the caller needs
            return times[below[-1] + 1] if below[-1] + 1 < len(times) else math.inf
        hi = below[-1]
    elif not fits(times[hi]):
        return math.inf
    return times[_first_true_from(fits, times, 0, hi)]  # the answer is usually a few times up


def _hall_theta_s(inp: JointInputs) -> float:
    """max(the least candidate stage time at which `blocks_coverable` reaches the L blocks, the work
    bound of `_theta_work_bound_s`), inf if no time reaches them. Both bound the slowest
    stage time of every plan; taking the larger one lets the search start at the work bound: the
    Hall count is only needed above it (usually a probe or two, where bisecting over every
    candidate took about eight)."""
    L = inp.U - 2
    pairs = sorted({(k, _position_extras(inp, k, i)[0]) for k in range(inp.K) for i in {0, inp.P - 1}} | {
        (k, 0.0) for k in range(inp.K)})
    # every stage time a class can have: n blocks plus what its position adds
    block = np.array([inp.step_s[k][2] for k, _ in pairs])
    extra = np.array([e for _, e in pairs])
    # n x block + extra rounds differently from the class tables' prefix sums of the same units (1 ulp
    # above them was seen): a candidate a hair lower keeps every stage time it stands for at or above it
    cands = np.unique(np.arange(L + 1)[None, :] * block[:, None] + extra[:, None]) * (1 - ULP_SLACK)
    cands = cands[cands != 0.0].tolist()
    if not cands or blocks_coverable(inp, cands[-1]) < L:
        return math.inf
    work = _theta_work_bound_s(inp)
    fits = lambda c: blocks_coverable(inp, c) >= L  # noqa: E731  monotone in c
    below = bisect.bisect_right(cands, work) - 1  # the last candidate <= the work bound
    if below >= 0 and fits(cands[below]):
        return work  # the Hall time is at most the work bound
    return cands[_first_true_from(fits, cands, below + 1)]  # the answer is usually close above


def _first_true_from(pred, cands, lo: int, hi: int | None = None) -> int:
    """The first index in [lo, hi] where the monotone `pred` holds (hi, default the last, must
    hold): exponential steps up from lo, then bisection. For searches whose answer is usually a
    few candidates above where they start, and whose every probe is costly."""
    hi = len(cands) - 1 if hi is None else hi
    failed, probe, step = lo - 1, lo, 1
    while not pred(cands[probe]):
        check_deadline()  # every probe is costly (a DP or a Hall count)
        failed, probe, step = probe, min(probe + step, hi), step * 2
    return _first_true(pred, cands, failed + 1, probe)


def _first_true(pred, cands: list[float], lo: int, hi: int | None = None, steps: int | None = None) -> int:
    """The first index in [lo, hi] where the monotone `pred` holds (hi, default the last, must hold).
    With `steps`, stop after that many bisection steps: the index returned is then a lower end
    (pred is false below it), which is all a lower bound needs."""
    hi = len(cands) - 1 if hi is None else hi
    for _ in range(len(cands) if steps is None else steps):
        if lo >= hi:
            break
        mid = (lo + hi) // 2
        check_deadline()
        if pred(cands[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def stages_fit_dp(inp: JointInputs, theta_s: float, extra_cap_s: float = math.inf,
                  times_s: np.ndarray | None = None, max_rate_usd_per_s: float = math.inf) -> bool:
    """Exact test of a relaxation: can P stages of D replicas hold every block with no stage slower
    than theta_s per microbatch, with GPUs counted per type (zones merged, regions ignored)?

    A replica of type g on stage i holding n blocks needs w_g(i, n) GPUs: the smallest TP of g whose
    class runs the stage within theta_s and fits it in memory (`_class_figures`). With two types A
    and B, a dynamic program over stages keeps, for every (blocks placed s, A-GPUs used a), the
    fewest B-GPUs: best'[s + n, a + x w_A] = min(best[s, a] + (D - x) w_B), x = 0..D replicas of A.
    More types are merged pairwise into two resources (a merged type takes the smaller w and the
    sum of the GPUs), which only relaxes further; every merge is a valid test, so all are tried.
    A merged resource is also tested with its GPUs weighted by speed (`_weighted_right_fits`):
    merged by count, a slow GPU stands in for a fast one.
    Unlike the Hall count of `blocks_coverable`, this sees that GPUs a stage takes are gone for the
    others (measured: it rejects outer choices that the MILP needed 0.1-0.5 s each to reject).
    With `extra_cap_s`, a class may serve a stage only if its all-reduce + update there
    (`_ClassTables.extra_in_s`, `extra_span_s`) is within the cap (used by `sync_aware_time_bound_s`).
    `times_s` (C, M): what a class's stage takes instead of its compute time (`_sailor_stage_times_s`).
    `max_rate_usd_per_s`: the GPUs' rate is at most that, each GPU at its type's least price (a
    merged resource at its types' least), so the test stays a relaxation."""
    # The answer only grows with theta_s: a larger theta admits a superset of classes, so every
    # fewest-GPUs entry (and under a cap, every zone's replica count) is at most what it was, and a
    # placement that fit still fits. One answer per side settles every theta beyond it (a bound's
    # bisections ask ~10^5 thetas in a search, two thirds of them settled so on sailor two_regions).
    # It grows with the cap too (a larger cap admits a superset of classes, in a zone and across
    # zones), so an answer at one cap settles the other caps on its side as well.
    key = (None if times_s is None else times_s.tobytes(), max_rate_usd_per_s)
    return _monotone_in_theta_and_cap(inp, "fits_dp_theta", key, theta_s, extra_cap_s,
                                      lambda: _stages_fit_dp(inp, theta_s, extra_cap_s, times_s, max_rate_usd_per_s))


def _monotone_in_theta_and_cap(inp: JointInputs, name: str, key, theta_s: float, cap_s: float,
                               test) -> bool:
    """`test()` for a feasibility test that only grows with theta_s and with the cap: per `key`
    and cap, the least theta known to fit and the largest known not to; an answer at a cap at most
    this one that fits at a theta at most this one settles it, as does one at a cap at least this
    one that fails at a theta at least this one (measured: Sailor's OPT-350M on 2 zones x (128 A100
    + 128 V100), P6 b2 D32's strongest bound at the search's target computed 2,561 `stages_fit_dp`
    answers instead of 6,539, 1.39 -> 0.74 s, the same bound)."""
    per_cap = _per_inputs_cache(inp, name).setdefault(key, {})
    known = per_cap.setdefault(cap_s, [math.inf, -math.inf])
    if theta_s >= known[0] or theta_s <= known[1]:
        return theta_s >= known[0]
    for cap, (fit_from, fail_to) in per_cap.items():
        if cap <= cap_s and theta_s >= fit_from:
            fits = True
            break
        if cap >= cap_s and theta_s <= fail_to:
            fits = False
            break
    else:
        fits = test()
    known[0 if fits else 1] = theta_s
    return fits


def _stages_fit_dp(inp: JointInputs, theta_s: float, extra_cap_s: float, times_s: np.ndarray | None,
                   max_rate_usd_per_s: float) -> bool:
    """`stages_fit_dp` at one theta, its answer not known from another."""
    gpus = _gpus_per_type(inp)
    types = sorted(gpus)
    need = _gpus_per_replica(inp, theta_s, types, extra_cap_s, times_s)
    if need is None:
        return False
    # thetas (and the bounds that test them) that give the same GPUs per replica give the same answer
    key = (tuple(need[g].tobytes() for g in types), max_rate_usd_per_s)
    cache = _per_inputs_cache(inp, "fits_dp")
    if key not in cache:
        # and the answer only grows as the GPUs per replica fall: GPUs per replica at most those of
        # an answer that fits fit too, at least those of one that fails fail too (measured: Sailor's
        # OPT-350M on 2 zones x (128 A100 + 128 V100), P6 b2 D32's strongest bound, 282 of 876 DPs)
        row = np.concatenate([need[g] for g in types])
        fit, fail = _per_inputs_cache(inp, "fits_dp_rows").setdefault(max_rate_usd_per_s, (_Rows(), _Rows()))
        if fit.any_at_least(row):
            cache[key] = True
        elif fail.any_at_most(row):
            cache[key] = False
        else:
            splits = [(types[:1], types[1:])] if len(types) <= 2 else [
                ([a], [t for t in types if t != a]) for a in types]
            cache[key] = all(_two_resource_dp(inp, need, gpus, left, right, max_rate_usd_per_s)
                             for left, right in splits)
            (fit if cache[key] else fail).add(row)
    return cache[key]


class _Rows:
    """Rows of one length, added one at a time, asked whether one of them is elementwise at least
    (or at most) a given row: one numpy pass over a buffer that doubles as it fills. Its free rows
    hold NaN, which settles nothing (every comparison with it is false), should a row ever be
    counted before it is written (one thread computes a choice's bounds at a time)."""

    def __init__(self) -> None:
        self.buf: np.ndarray | None = None
        self.n = 0

    def add(self, row: np.ndarray) -> None:
        if self.buf is None or self.n == len(self.buf):
            grown = np.full((max(8, 2 * self.n), row.size), np.nan)
            if self.n:
                grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        self.buf[self.n] = row
        self.n += 1

    def any_at_least(self, row: np.ndarray) -> bool:
        return self.n > 0 and bool((self.buf[:self.n] >= row).all(axis=1).any())

    def any_at_most(self, row: np.ndarray) -> bool:
        return self.n > 0 and bool((self.buf[:self.n] <= row).all(axis=1).any())


def _gpus_per_replica(inp: JointInputs, theta_s: float, types: list[str], extra_cap_s: float = math.inf,
                      times_s: np.ndarray | None = None, all_stages: bool = False) -> dict[str, np.ndarray] | None:
    """g -> (M,) fewest GPUs per replica of type g at every (stage i, n blocks) pair of
    `_pair_layout` within theta_s and with its all-reduce + update within extra_cap_s (inf when
    none); None when some stage has no feasible block count at all (with `all_stages`, the arrays
    whatever they hold). Under a cap, a class may serve a
    stage by its in-zone value (`_ClassTables.extra_in_s`) only if some zone has GPUs for D replicas of such
    classes; otherwise the stage spans zones and its classes must meet the cap by their spanning
    value (`_ClassTables.extra_span_s`)."""
    lay = _pair_layout(inp)
    need = _least_tp(inp, theta_s, tuple(types), extra_cap_s, _class_tables(inp).time_s if times_s is None else times_s)
    if not all_stages and not np.all(np.bincount(lay.stage[np.isfinite(need).any(axis=0)], minlength=inp.P) > 0):
        return None
    return dict(zip(types, need))


def _least_tp(inp: JointInputs, theta_s: float, types: tuple[str, ...], extra_cap_s: float,
              times_s: np.ndarray) -> np.ndarray:
    """(..., types, M): for stage times `times_s` (..., C, M) the least TP of each type at every
    pair within theta_s and extra_cap_s (inf: none), under the in-zone rule of `_gpus_per_replica`;
    a stack of time arrays (`_region_units`) in one pass."""
    tab = _class_tables(inp)
    order, tp, starts, has, per_zone = _classes_by_type(inp, types)

    def least(mask: np.ndarray) -> np.ndarray:  # (..., C, M) allowed -> (..., types, M) least TP per pair
        out = np.full((*mask.shape[:-2], len(types), mask.shape[-1]), np.inf)
        if starts:
            out[..., has, :] = np.minimum.reduceat(np.where(mask[..., order, :], tp, np.inf), starts, axis=-2)
        return out

    ok = tab.fits & (times_s <= theta_s)
    if extra_cap_s < math.inf:
        in_zone = ok & (tab.extra_in_s <= extra_cap_s)
        # the most replicas one zone holds, each type at its least TP (GPUs // inf = 0: none)
        most = (per_zone[:, :, None] // least(in_zone)[..., None, :, :]).sum(axis=-2).max(axis=-2, initial=0.0)
        ok = (in_zone & (most >= inp.D)[..., None, :]) | (ok & (tab.extra_span_s <= extra_cap_s))
    return least(ok)


def _classes_by_type(inp: JointInputs, types: tuple[str, ...]) -> tuple:
    """The class rows of `_class_tables` grouped by GPU type in `types` order, for one
    np.minimum.reduceat per mask in `_gpus_per_replica` (a search asks it ~10^5 times): (row order,
    (C', 1) their TPs, each non-empty group's first position, per type whether it has classes,
    (zones, types) the GPUs of each type in each zone)."""
    cache = _per_inputs_cache(inp, "classes_by_type")
    if types not in cache:
        classes = _class_tables(inp).classes
        groups = [[j for j, c in enumerate(classes) if c[0] == g] for g in types]
        order = [j for ix in groups for j in ix]
        has = np.array([bool(ix) for ix in groups], dtype=bool)
        starts = np.cumsum([0] + [len(ix) for ix in groups])[:-1][has]
        tp = np.array([classes[j][1] for j in order], dtype=float)[:, None]
        per_zone = np.array([[per.get(g, 0) for g in types] for per in _gpus_per_group(inp, "zone").values()],
                            dtype=float).reshape(-1, len(types))
        cache[types] = (np.array(order, dtype=int), tp, starts.tolist(), has, per_zone)
    return cache[types]


def _gpu_rate_usd_per_s(inp: JointInputs, types: list[str]) -> float:
    """The least USD per second of one GPU of any of `types` (inf for none)."""
    return min((replica_rate_usd_per_s(p) / p.tp for p in inp.pools if p.gpu_type in types), default=math.inf)


def _two_resource_dp(inp: JointInputs, need: dict, gpus: dict, left: list[str], right: list[str],
                     max_rate_usd_per_s: float = math.inf) -> bool:
    """One split of `stages_fit_dp`: the GPUs of `left` counted exactly, those of `right` as one
    resource. The DP's table does not depend on the rate cap, which only tests its entries
    (`_two_resource_table`: the budget's searches ask with many rates for one table)."""
    D = inp.D
    cap_a = sum(gpus[g] for g in left)
    cap_b = sum(gpus[g] for g in right)
    table = _two_resource_table(inp, need, gpus, left, right)
    if table["units"] is not None:  # the left resource alone: the fewest GPUs decide
        cap = cap_a if inp.max_gpus is None else min(cap_a, inp.max_gpus)
        if max_rate_usd_per_s < math.inf:
            cap = min(cap, math.floor(max_rate_usd_per_s / _gpu_rate_usd_per_s(inp, left) * (1 + 1e-12)))
        return table["units"] <= cap // D
    last = table["last"]  # last[a]: fewest right-GPUs with a left-GPUs
    ok = last <= cap_b
    if inp.max_gpus is not None:
        ok &= last + np.arange(cap_a + 1) <= inp.max_gpus
    if max_rate_usd_per_s < math.inf:
        with np.errstate(invalid="ignore"):  # inf GPUs x a price: not ok anyway
            rate = np.arange(cap_a + 1) * _gpu_rate_usd_per_s(inp, left) + last * _gpu_rate_usd_per_s(inp, right)
        ok &= rate <= max_rate_usd_per_s * (1 + 1e-12)
    if not ok.any():
        return False
    if len(right) >= 2 and table["weighted"] is None:  # the same for every rate: asked once
        table["weighted"] = _weighted_right_fits(inp, need, gpus, right, table["w_a"], cap_a)
    return len(right) < 2 or table["weighted"]


def _two_resource_table(inp: JointInputs, need: dict, gpus: dict, left: list[str], right: list[str]) -> dict:
    """The rate-free part of `_two_resource_dp`, once per (GPUs-per-replica table, split): "units",
    the fewest units of D GPUs when the right resource serves no pair, else "last" (`_replica_dp`'s
    last row); "w_a" the left's GPUs per replica; "weighted" the answer of `_weighted_right_fits`
    once asked (None before)."""
    key = (tuple(need[g].tobytes() for g in sorted(need)), tuple(left), tuple(right))
    cache = _per_inputs_cache(inp, "two_resource")
    if key not in cache:
        none = np.full(len(_pair_layout(inp).pairs), np.inf)
        w_a = np.min([need[g] for g in left], axis=0) if left else none
        w_b = np.min([need[g] for g in right], axis=0) if right else none
        entry = {"w_a": w_a, "units": None, "last": None, "weighted": None}
        if not np.isfinite(w_b).any():
            entry["units"] = _least_units_dp(inp, w_a)
        else:
            entry["last"] = _replica_dp(_stage_entries(inp, w_a, w_b), inp.U - 2, sum(gpus[g] for g in left) + 1,
                                        inp.D)
        cache[key] = entry
    return cache[key]


def _stage_entries(inp: JointInputs, w_a: np.ndarray, w_b: np.ndarray) -> list:
    """Per stage, `_replica_dp`'s entries: the block counts grouped by their (w_a, w_b)."""
    lay = _pair_layout(inp)
    starts = np.searchsorted(lay.stage, np.arange(inp.P + 1))
    stages = []
    for i in range(inp.P):
        by_need: dict[tuple[float, float], list[tuple[int, float]]] = {}  # block counts with the same GPUs per replica
        at = slice(starts[i], starts[i + 1])
        for wa, wb, n in zip(w_a[at].tolist(), w_b[at].tolist(), lay.count[at].tolist()):
            by_need.setdefault((wa, wb), []).append((n, 0.0))
        stages.append(list(by_need.items()))
    return stages


def _weighted_right_fits(inp: JointInputs, need: dict, gpus: dict, right: list[str], w_a: np.ndarray,
                         cap_a: int) -> bool:
    """The right resource of `_two_resource_dp` with its types weighted: for any weights lam_g >= 0,
    a plan's replicas x_ig of stage i on type g meet sum_i x_ig w_g(i) <= n_g for every g, so
    sum_g lam_g n_g >= sum_i sum_g lam_g w_g(i) x_ig >= sum_i (min_g lam_g w_g(i)) (replicas of i on
    the right): the DP with w_b = min_g lam_g w_g and the capacity sum_g lam_g n_g is a relaxation
    too. lam_g = 1 / (GPU-seconds of one microbatch through the model on g) (`_merge_weights`)
    counts each GPU as the share of the work it can do, where the plain merge (lam = 1) lets a slow
    type's GPUs stand in for a fast one's (measured: large_5type_2k, Llama-7B, P4 b2 D128 in
    us-central1, the least slowest stage the test accepts from 0.128 to 0.153 s)."""
    lam = _merge_weights(inp)
    top = max(lam[g] for g in right)
    w_b = np.min([need[g] * (lam[g] / top) for g in right], axis=0)
    cap_b = sum(gpus[g] * (lam[g] / top) for g in right)
    last = _replica_dp(_stage_entries(inp, w_a, w_b), inp.U - 2, cap_a + 1, inp.D)
    return bool((last <= cap_b * (1 + 1e-9)).any())  # float sums of weights: no plan lost to rounding


def _merge_weights(inp: JointInputs) -> dict[str, float]:
    """GPU type -> 1 / its least GPU-seconds of one microbatch through every unit (the C_g of
    `fluid_gpu_seconds_s`; 1 for a type whose work is free)."""
    return _shared_for(inp, "merge_weights", lambda inp: {
        g: 1.0 / sum(row) if sum(row) > 0 else 1.0 for g, row in _work_by_type(inp).items()})


def _replica_dp(stages: list[list[tuple[tuple[float, float], list[tuple[int, float]]]]], L: int, width: int,
                D: int) -> np.ndarray:
    """out[a] = the least value of placing all L blocks on the stages in order, a = the left-resource
    GPUs used (< width): stage i adds, for an entry ((w_a, w_b), [(n, add)...]) of stages[i] and one (n, add),
    n blocks and best[s + n, a + x w_a] = min(best[s, a] + (D - x) w_b + add) over x = 0..D
    (`_stage_contrib`). Rows are kept to the band of block counts that the stages before can reach
    and the stages after can complete to L (`block_bands`), and columns to those the stages before
    can reach: outside them every value is inf or cannot reach row L, so the result is the full DP's."""
    stages = [[(key, per_n) for key, per_n in ch if not (math.isinf(key[0]) and math.isinf(key[1]))]
              for ch in stages]  # an entry neither resource serves adds nothing
    if not all(stages):
        return np.full(width, np.inf)
    bands = block_bands([[n for _, per_n in ch for n, _ in per_n] for ch in stages], L)
    best = np.full((L + 1, width), np.inf)
    best[0, 0] = 0.0
    cols = 1  # columns of `best` that may be finite
    for i, choices in enumerate(stages):
        check_deadline()  # a stage's step: up to ~10 ms on 10,000 GPUs
        (r0, r1), (q0, q1) = bands[i], bands[i + 1]
        new = np.full_like(best, np.inf)
        if q0 > q1:
            return new[L]
        reach = cols
        for (wa, wb), per_n in choices:
            w = cols if math.isinf(wa) else min(width, cols + D * int(wa))
            contrib = _stage_contrib(best[r0:r1 + 1, :w], wa, wb, D)  # the same for every n: only the rows shift
            reach = max(reach, w)
            for n, add in per_n:
                lo, hi = max(q0, r0 + n), min(q1, r0 + n + len(contrib) - 1)
                if lo > hi:
                    continue
                part = contrib[lo - r0 - n:hi - r0 - n + 1]
                target = new[lo:hi + 1, :w]
                np.minimum(target, part + add if add else part, out=target)
        best, cols = new, reach
    return best[L]


def block_bands(counts: list[list[int]], L: int) -> list[tuple[int, int]]:
    """Per stage boundary (before stage 0 .. after the last), the rows of blocks placed that the
    stages before can reach and the stages after can complete to L, stage i taking one of
    counts[i] blocks: outside them no state lies on a plan, so a DP over stages skips them and
    every state inside keeps the value of the full DP (`_replica_dp`, `stage_dp.stage_dp`)."""
    lo_n = [min(ns) for ns in counts]
    hi_n = [max(ns) for ns in counts]
    out, lo, hi = [(0, 0)], 0, 0
    for i in range(len(counts)):
        lo = max(lo + lo_n[i], L - sum(hi_n[i + 1:]))
        hi = min(hi + hi_n[i], L - sum(lo_n[i + 1:]))
        out.append((lo, hi))
    return out


def _least_units_dp(inp: JointInputs, w: np.ndarray) -> float:
    """The fewest units of D GPUs P stages need to hold the L blocks when stage i with n blocks
    takes w[pair (i, n)] units (inf: not allowed): a min-plus dynamic program over stages on the
    blocks placed (one resource, so no GPU axis is needed)."""
    L, P = inp.U - 2, inp.P
    lay = _pair_layout(inp)
    N = L + 1
    per_stage = np.full((P, N), np.inf)
    per_stage[lay.stage, lay.count] = w
    prev = _minplus_padded_index(N)
    best = np.full(N + 1, np.inf)  # best[s]: fewest units with s blocks placed; best[N] stays inf
    best[0] = 0.0
    for i in range(P):
        best[:N] = (best[prev] + per_stage[i][None, :]).min(axis=1)
    return float(best[L])


def _stage_contrib(best: np.ndarray, wa: float, wb: float, D: int) -> np.ndarray:
    """out[s, a'] = min over x = 0..D of best[s, a' - x wa] + (D - x) wb: one stage with x replicas
    on the left resource (wa GPUs each) and D - x on the right (wb each); the caller shifts s by the
    stage's block count. With j = (a' - r) / wa on each residue class r mod wa, the inner min is
    D wb - J wb + min_{J - D <= j <= J} (best_j + j wb): a running minimum along j, one array
    operation instead of D + 1. At least one of wa, wb is finite (`_replica_dp` drops the others)."""
    rows, width = best.shape
    if math.isinf(wa):  # all D replicas on the right
        return best + D * wb
    if math.isinf(wb):  # all D on the left: shift by D wa
        out = np.full_like(best, np.inf)
        shift = int(D * wa)
        if shift < width:
            out[:, shift:] = best[:, :width - shift]
        return out
    wa = int(wa)
    J = -(-width // wa)
    if J * wa == width:  # (always with wa = 1, the commonest)
        padded = best
    else:
        padded = np.full((rows, J * wa), np.inf)
        padded[:, :width] = best
    j = np.arange(J)[None, :, None]
    shaped = padded.reshape(rows, J, wa) + j * wb  # a new array: the running minimum may overwrite it
    if D >= J - 1:  # the window [J - D, J] is the whole prefix
        low = np.minimum.accumulate(shaped, axis=1, out=shaped)
    else:
        low = _window_min(shaped, D + 1)
    low += D * wb - j * wb
    return low.reshape(rows, J * wa)[:, :width]


def _window_min(a: np.ndarray, width: int) -> np.ndarray:
    """out[:, j] = min(a[:, max(0, j - width + 1) : j + 1]) along axis 1, in O(log width) array
    operations: windows of 2^k by doubling, then two overlapping ones cover any width. `a` is
    overwritten (numpy buffers the overlapping operands of each step)."""
    span = 1
    while 2 * span <= width:
        np.minimum(a[:, span:], a[:, :-span], out=a[:, span:])
        span *= 2
    rest = width - span  # a covers windows of `span`; shift by the rest to cover `width`
    if rest > 0:
        np.minimum(a[:, rest:], a[:, :-rest], out=a[:, rest:])
    return a


def time_lower_bound_tight_s(inp: JointInputs, exact: bool = False, target_s: float | None = None,
                             strongest: bool = False, decide: bool = False) -> float:
    """T >= sum_i tau_i + sum_i c_i + (m - 1) theta + sigma + mu, each term bounded alone: sum tau >=
    F (every unit on its fastest pool), c_i >= c_node, theta >= the larger of
    `bottleneck_lower_bound_s` (with `exact`: its dynamic-programming refinement), F / P and D W / N
    (`time_lower_bound_s`) and the link time / 2, sigma and mu as in `_rest_lower_bound_s`.
    With `exact` (blocks form), also `sync_aware_time_bound_s`, which bounds theta and sigma + mu
    together. `target_s` (a T the caller wants to rule out) lets the exact search stop early: the
    result is then a valid bound that is >= target_s whenever the DP can prove it.
    With several regions, `exact` also splits the plans by the regions they use
    (`region_split_time_bound_s`). `strongest` (with `exact` and a target) adds the replica-level
    DPs on the sum of stage times (`capped_sum_tau_s`) where a cell falls short of the target.
    With Sailor's composition plus `sailor_transfer_floor_s`, and `sailor_send_aware_time_bound_s`,
    which goes first when there is a target: it alone rules out most choices there, and the merged
    bound's DPs are then spared (measured, Sailor's OPT-350M on 128 A100 + 384 V100, one process:
    the merged bound first, 127 strong steps in 11.0 s, 41 of them settled by the send-aware bound
    after it; a search of 11.6 s, 6.7 s with the send-aware bound first).
    `decide` (with a target, not `strongest`): the send-aware bound counts only where it reaches
    the target (`sailor_send_aware_rules_out_s`), which it tells sooner where it does not: the
    result is still a bound, weaker than without `decide` only where it stays under the target."""
    strongest = strongest and target_s is not None  # without a target it would lift every cell
    sends = exact and send_aware_applies(inp)
    first = -math.inf
    if sends and target_s is not None:
        if decide:
            ruled_out = sailor_send_aware_rules_out_s(inp, target_s)
            first = -math.inf if ruled_out is None else ruled_out
        else:
            first = sailor_send_aware_time_bound_s(inp, target_s, receivers=strongest)
        if first >= target_s:
            return first
    shift = sailor_transfer_floor_s(inp)  # the bounds below are the hetplan composition's
    out = _time_lower_bound_merged_s(inp, exact, None if target_s is None else target_s - shift, strongest)
    if exact and len(inp.regions) > 1 and out < math.inf and (target_s is None or out + shift < target_s):
        out = max(out, region_split_time_bound_s(inp, out, None if target_s is None else target_s - shift,
                                                 strongest))
    out = max(out + shift, first)
    if sends and target_s is None and out < math.inf:  # (with a target it came first)
        out = max(out, sailor_send_aware_time_bound_s(inp))
    if sends and len(inp.regions) > 1 and out < math.inf and (target_s is None or out < target_s):
        out = max(out, sailor_region_split_bound_s(inp, target_s, strongest))
    return out


def send_aware_applies(inp: JointInputs) -> bool:
    """Whether `sailor_send_aware_time_bound_s` bounds the choice (Sailor's composition, a
    pipeline, blocks form), and so whether the strong bound starts with it at a target."""
    return inp.sailor and inp.P > 1 and blocks_identical(inp)


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
    members = [[k for k, p in enumerate(inp.pools) if (p.gpu_type, p.tp) == c] for c in tab.classes]

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


def _extra_values_s(inp: JointInputs) -> np.ndarray:
    """The distinct finite all-reduce + update values of the class tables (`_ClassTables.extra_in_s`
    and `extra_span_s`; inf: a placement that does not exist), ascending: the caps the cells of
    `sync_aware_time_bound_s` and `_send_aware_cells` are cut at."""
    def make(inp: JointInputs) -> np.ndarray:
        tab = _class_tables(inp)
        caps = np.unique(np.concatenate([tab.extra_in_s.ravel(), tab.extra_span_s.ravel()]))
        return caps[np.isfinite(caps)]
    return _cached_for(inp, "extra_values", make)


def _spread(values: np.ndarray, count: int) -> list[float]:
    """At most `count` of the ascending `values`, evenly spread over their indices (first and last
    included): the grid of a cell split."""
    return np.unique(values[np.linspace(0, values.size - 1, min(count, values.size)).round().astype(int)]).tolist()


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
                         bulk_fits=None, span: tuple[int, int] | None = None) -> float:
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
    cell gets only the send lift, and before
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
    all of them by default."""
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
        out = _lifted_send_cell_s(inp, test, cands, rest, sum_tau + transfers, cap, target, excess_s=send_excess_s)
        if out >= target:  # spares what follows: a replica-level DP, or up to 127 DP tests a cell
            return out
        if budget:
            return max(out, _send_aware_cell_s(inp, test, cands, rest, sum_tau + transfers, 0.0, target))
        return max(out, _lifted_send_cell_s(inp, test, cands, rest, lifted(cap), cap, target, excess_s=send_excess_s))

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
                                                    send_excess_s, span=(a, b)))
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


def _lifted_send_cell_s(inp: JointInputs, fits, cands: list[float], rest: float, stages_s: float, cap: float,
                        target_s: float, depth: int = LIFT_SPLITS, excess_s: float = 0.0) -> float:
    """A cell of `_split_cells_bound_s` (m > 1, a target), its stages and sends at least `stages_s`,
    lifted where the slowest stage time caps them: a plan whose theta lies in [cands[l], cands[h]]
    (cands: stage times with sends) has every tau_i + p_i <= cands[h], so sum_i (tau_i + p_i) >=
    `capped_sum_tau_s`(cands[h], cap, strong, sends) and T >= that + (m - 1) cands[l] + rest. The
    range of thetas that could beat the target with `stages_s` is halved (at most `depth` times)
    where a part's bound falls short. The fast classes that a small theta needs cannot serve every
    stage, so the stages they leave run slower and their sends count (measured: Sailor's OPT-350M
    on 2 zones of 128 A100 + 128 V100, P6 b2 D32: 1.2767 s before, 1.3192 s with it; the MILP's
    optimum is 1.3734 s). `excess_s` is added to those sums (`_split_cells_bound_s`)."""
    def time_at(stages: float, j: int) -> float:
        return iteration_time_s(inp.m, stages, 0.0, cands[j] if j < len(cands) else math.inf, rest)

    hi = _last_beating(inp, cands, rest, stages_s, 0.0, target_s)
    if hi < 0 or not fits(cands[hi]):
        return time_at(stages_s, hi + 1)

    def part(lo: int, up: int, d: int) -> float:
        out = time_at(max(stages_s, capped_sum_tau_s(inp, cands[up], cap, sends=True) + excess_s), lo)
        if out < target_s:  # the replica-level DPs only where the units DP falls short
            out = time_at(max(stages_s, capped_sum_tau_s(inp, cands[up], cap, True, sends=True) + excess_s), lo)
        if out >= target_s or d == 0 or lo == up:
            return out
        mid = (lo + up) // 2
        left = part(lo, mid, d - 1)
        return max(out, min(left, part(mid + 1, up, 0 if left < target_s else d - 1)))

    return min(part(_first_true_from(fits, cands, 0, hi), hi, depth), time_at(stages_s, hi + 1))


def _sailor_send_floor_s(inp: JointInputs) -> float:
    """e of `sailor_transfer_floor_s`: every send is at least half the least boundary and the least
    send floor."""
    return max(min(inp.p2p_s(link) for link in (inp.node, inp.zone, inp.region)) / 2,
               min(inp.send_floor_s, default=0.0))


def _sailor_stage_times_s(inp: JointInputs) -> np.ndarray:
    """(C, M): a class's compute time on each (stage, blocks) pair plus the least its stage's sends
    take when it serves the stage (`sailor_send_aware_time_bound_s`)."""
    def make(inp: JointInputs) -> np.ndarray:
        tab, lay = _class_tables(inp), _pair_layout(inp)
        sends = np.where(lay.stage == 0, first_stage_sends(inp.P), 2)[None, :]
        return tab.time_s + sends * _sailor_class_sends_s(inp)[:, None]
    return _cached_for(inp, "sailor_stage_times", make)


def _sailor_class_sends_s(inp: JointInputs) -> np.ndarray:
    """(C,): the least one send of a stage class c serves takes: max(c_node / 2, the least send
    floor of c's pools)."""
    return _send_figures(inp)[0]


def _send_figures(inp: JointInputs, region: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C,) three times, over the class's pools (in `region`, or all; inf for a class with none
    there): the least one send of a stage it serves takes (`_sailor_class_sends_s`), the least one
    over a boundary between regions takes (`_sailor_crossing_sends_s`: also at least c_region / 2
    and the pools' floors to another region), and the least receive floor of its pools
    (`_sailor_class_receives_s`)."""
    def make(inp: JointInputs) -> tuple:
        own = np.maximum(_least_per_class(inp, inp.send_floor, region), _c_node_s(inp) / 2)
        away = _least_per_class(inp, lambda k: max(inp.send_floor(k), inp.send_away(k)[1]), region)
        return (own, np.maximum(np.maximum(away, own), inp.p2p_s(inp.region) / 2),
                _least_per_class(inp, inp.recv_floor, region))
    return _cached_for(inp, f"send_figures_{region}", make)


def _least_per_class(inp: JointInputs, per_pool, region: str | None = None) -> np.ndarray:
    """(C,): the least of `per_pool(k)` over the pools k of each class (GPU type, TP) of
    `_class_tables`: what every pool of the class takes at least; with `region`, over the class's
    pools in that region only (inf for a class with none there)."""
    return np.array([min((per_pool(k) for k, p in enumerate(inp.pools)
                          if (p.gpu_type, p.tp) == c and region in (None, p.region)), default=math.inf)
                     for c in _class_tables(inp).classes])


def _sailor_class_receives_s(inp: JointInputs) -> np.ndarray:
    """(C,): the least receive floor of class c's pools (what a send to a stage that c serves takes
    at least)."""
    return _send_figures(inp)[2]


def sailor_region_split_bound_s(inp: JointInputs, target_s: float | None = None, strongest: bool = False) -> float:
    """Sailor's composition with several regions: a plan lies in one region r, and then its T is at
    least the whole bound of the inputs cut down to r's pools (`in_region`, with its send-aware
    bound), or it crosses regions, and then T >= `sailor_crossing_time_bound_s`. The least of
    these bounds every plan; the bounds of the merged inputs miss both (measured: Sailor's GPT-Neo
    on 5 zones x 32 A100, P7 b2 D16: the merged send-aware bound is 10.41 s, us-central1 alone
    12.93 s, and the optimum, 13.04 s, crosses to us-west1 at a 1-block stage)."""
    return _least_over_regions(inp, sailor_crossing_time_bound_s(inp, target_s, receivers=strongest), target_s,
                               lambda sub, target: time_lower_bound_tight_s(sub, True, target, strongest))


def _least_over_regions(inp: JointInputs, crossing_s: float, target_s: float | None, bound_in) -> float:
    """min(crossing_s, `bound_in(sub, target)` of each region's inputs `sub`): the plans that cross
    regions and those inside each one (a region's target is lowered to the least so far: beyond
    it, that region's bound changes nothing)."""
    out = crossing_s
    for sub in _region_inputs(inp).values():
        if target_s is not None and out < target_s:
            target_s = out
        out = min(out, bound_in(sub, target_s))
    return out


def sailor_crossing_time_bound_s(inp: JointInputs, target_s: float | None = None, receivers: bool = False) -> float:
    """Sailor's composition, the plans that use two regions. A stage sits in one region (H5), so
    some boundaries j cross regions: c_j = c_region, and both sends over j (`sailor_p2p`,
    evaluation.sailor_sends), stage j's activation A_j and stage j + 1's gradient G_j, take at
    least x_c = max(c_region / 2, the send floors of class c, its least floor to another region)
    (`_sailor_crossing_sends_s`). A stage's time with its sends is then at least its compute plus
    x_c per crossing send and its class's floor per other send (`_sailor_crossing_times_s`), and
    theta is at least the least time at which the send-aware DP (`sailor_send_aware_time_bound_s`)
    fits the blocks with those times for some set of crossings. Two cases cover every plan:
      - its ends lie in different regions: one crossing j or more, and the tied-embedding
        all-reduce crosses regions too, sigma + mu >= tied(region) + mu (evaluate's `tied_at`);
      - its ends lie in one region: two crossings j < j' or more.
    The transfers: sum p >= (P - 1 - n) c_node + 2 n min_c x_c + the ends' extra sends, n = 1 or 2.
    Where the cells lift the sum of stage times with sends at their classes' own floors
    (`_lifted_send_cell_s`), the 2 n sends over the crossings or more (the first stage's activation
    and the last stage's gradient count twice in Sailor's p) add at least min_c (x_c - their own
    floor) each (measured: Sailor's OPT-350M on 64 + 64 A100 in two regions, P4 b2 D16, whose plan
    that the cells pictured, two TP 2 stages a region, pays 0.0324 and 0.0329 s over the crossing
    where its class's floor is 0.0051 s: the choice's bound from 3.172 s to 3.217 s, the target)."""
    times, x = _sailor_stage_times_s(inp), float(_sailor_crossing_sends_s(inp).min())
    excess = float((_sailor_crossing_sends_s(inp) - _sailor_class_sends_s(inp)).min())
    sum_tau, sync_update = sum_tau_lower_bound_s(inp), _sync_update_lower_bound_s(inp)
    ends = first_stage_sends(inp.P) * _sailor_send_floor_s(inp)
    cases = [([(j,) for j in range(inp.P - 1)], 1, inp.tied_s[2] + _mu_lower_bound_s(inp))]
    if inp.P > 2:
        cases.append((list(itertools.combinations(range(inp.P - 1), 2)), 2, 0.0))
    out = math.inf
    for crossings, n, rest_floor in cases:
        per_set = [_sailor_crossing_times_s(inp, c) for c in crossings]
        # every stage time a fit test may take: a plan's slowest one is then a candidate
        tested = [*per_set] if len(inp.regions) != 2 else [
            *per_set, *_crossing_variants_s(inp).values(),
            *(v for family in (_regions_receiver_cases_s(inp) if receivers else ()) for case in family for v in case.values())]
        cands = np.unique(np.concatenate([times[np.isfinite(times)]] + [t[np.isfinite(t)] for t in tested]))
        cands = cands[cands >= bottleneck_lower_bound_s(inp, exact=False)].tolist()
        if not cands:
            continue
        transfers = (inp.P - 1 - n) * _c_node_s(inp) + 2 * n * x + ends
        fits = _crossing_fit(inp, _times_fit(inp, *per_set), ends_apart=n == 1, receivers=receivers)
        out = min(out, _split_cells_bound_s(inp, fits, cands, sum_tau, transfers, sync_update,
                                            target_s if target_s is None else min(target_s, out), rest_floor,
                                            lift=True, send_excess_s=2 * n * excess))
    return out


def _crossing_fit(inp: JointInputs, fits, ends_apart: bool, receivers: bool = False):
    """`fits(theta, cap, rate)` and, with two regions, `_regions_fit`: both hold for every plan of
    the case (a stage's times with its crossing sends in `fits`, the regions' GPUs in the other)."""
    if len(inp.regions) != 2:
        return fits
    return lambda t, cap, rate=math.inf: fits(t, cap, rate) and _regions_fit(inp, t, cap, ends_apart, receivers)


def _regions_fit(inp: JointInputs, theta_s: float, extra_cap_s: float, ends_apart: bool,
                 receivers: bool = False) -> bool:
    """Whether the blocks fit P stages of D replicas over two regions with a boundary between them
    (ends in different regions, or in one region with two crossings or more), every stage within
    theta_s with its sends: a stage sits in one region (H5), next to a crossing its sends over it
    take at least x_c (`_sailor_crossing_sends_s`), elsewhere its class's floor, and the stages of
    a region share its GPUs. A dynamic program over stages whose state is (blocks placed, units of
    D GPUs used in region 0, the regions of this stage and the next, crossings so far odd, any),
    its value the fewest units used in region 1; a replica of stage i with n blocks in region r
    takes the fewest GPUs of any type of r that serves (i, n) within theta_s and extra_cap_s
    (`_gpus_per_replica`, types merged within a region: a relaxation). `stages_fit_dp` counts
    GPUs per type with the regions merged, so it lets a small region's stages take GPUs of the
    large one (measured: Sailor's GPT-Neo on 4 x 32 A100 in us-central1 + 32 in us-west1, P5 b2
    D16, whose stages in us-west1 share 32 GPUs: the least slowest stage of the plans with their
    ends in different regions from 0.1663 to 0.1767 s, `sailor_crossing_time_bound_s` against the
    target 12.992 s from 12.550 to 12.982 s; P6 b1 D16 and P4 b1 D32 reach the target). Monotone
    in theta_s and the cap like `stages_fit_dp`: the answers are kept the same way
    (`_monotone_in_theta_and_cap`).
    `receivers`: also, for every family of `_regions_receiver_cases_s`, some case of it fits."""
    if receivers:  # the plain test first: its answers are kept on their own
        return _regions_fit(inp, theta_s, extra_cap_s, ends_apart) and _monotone_in_theta_and_cap(
            inp, "regions_fit", (ends_apart, True), theta_s, extra_cap_s,
            lambda: _every_family_fits(inp, _regions_receiver_cases_s(inp),
                                       lambda case: _regions_fit_dp(inp, theta_s, extra_cap_s, ends_apart, case)))
    return _monotone_in_theta_and_cap(
        inp, "regions_fit", (ends_apart, False), theta_s, extra_cap_s,
        lambda: _regions_fit_dp(inp, theta_s, extra_cap_s, ends_apart, _crossing_variants_s(inp)))


def _every_family_fits(inp: JointInputs, families: list[list], fits) -> bool:
    """Whether some case of every family fits (`fits(case)`). The same answer in any order, so the
    family that failed last is tried first, and in each family the case that fitted last: the
    next theta of a bisection mostly fails or fits the same way (measured: Sailor's GPT-Neo on 5
    zones x 32 A100, P7 b2 D16's strongest bound at the search's target, 1,724 regions DPs
    instead of 6,996, 2.18 -> 0.69 s; on 2 regions x 64 A100, P3 b2 D32, 429 instead of 2,132,
    0.29 -> 0.13 s; the same bounds)."""
    order = _per_inputs_cache(inp, "family_order")
    families_first = order.setdefault(id(families), list(range(len(families))))
    for pos, f in enumerate(families_first):
        cases_first = order.setdefault((id(families), f), list(range(len(families[f]))))
        hit = next((k for k in cases_first if fits(families[f][k])), None)
        if hit is None:
            families_first.insert(0, families_first.pop(pos))
            return False
        cases_first.insert(0, cases_first.pop(cases_first.index(hit)))
    return True


def _regions_receiver_cases_s(inp: JointInputs) -> list[list[dict]]:
    """Families of cases of the regions' stage times (`_crossing_variants_s`, per region and
    crossing) where a stage's sends also wait for their receivers, as `_sailor_receiver_cases_s`
    does with the regions merged: a send is at least the receive floor of every pool the receiving
    stage uses (evaluation.sailor_sends). Per level phi of the classes' least receive floors in
    each region, one case: the family's sending stage pays its sends to the receivers at
    max(figure, phi) (a middle stage: one of its two sends, the least of both ways), and the
    receiving stages are served only by the classes whose floor in their region is <= phi. A plan
    fits the case of phi = the largest floor among its receivers' classes, so some case of each
    family fits it. Families: stage 0 (its activation sends wait for stage 1), stage P - 1 (its
    two gradient sends wait for stage P - 2), each middle stage i (stages i - 1 and i + 1). Asked at
    the strongest level only (`sailor_crossing_time_bound_s` with `receivers`). Measured: Sailor's
    GPT-Neo on 5 zones x 32 A100, P7 b2 D16, whose plan the test pictured without them has TP 2
    stages beside TP 1 ones (a send to those takes at least TP 1's receive floor, 0.0224 s, not
    its own 0.0119 s): the strongest bound 12.937 -> 12.992 s, at the search's target, in 3.3 s,
    where the choice's MILP took 18 s."""
    def make(inp: JointInputs) -> list[list[dict]]:
        tab, lay, P = _class_tables(inp), _pair_layout(inp), inp.P
        a_times, g_times = _send_counts(inp)
        figures, variants = _region_send_figures(inp), _crossing_variants_s(inp)
        owns = np.concatenate([f[0][np.isfinite(f[0])] for f in figures.values()])
        recvs = np.unique(np.concatenate([f[2][np.isfinite(f[2])] for f in figures.values()]))
        least_own = owns.min() if owns.size else -np.inf
        levels = np.concatenate([recvs[recvs <= least_own][-1:], recvs[recvs > least_own]]).tolist()

        def case(sender: int, receivers: tuple[int, ...], phi: float) -> dict:
            out = {}
            on = lay.stage == sender
            for j, before, after in itertools.product(range(len(inp.regions)), (False, True), (False, True)):
                own, cross, recv = figures[j]
                a_fig, g_fig = (cross if after else own)[:, None], (cross if before else own)[:, None]
                times = variants[j, before, after].copy()
                if sender == 0:
                    sends = a_times[on][None, :] * np.maximum(a_fig, phi)
                elif sender == P - 1:
                    sends = g_times[on][None, :] * np.maximum(g_fig, phi)
                else:  # one of its two sends waits: the least of both ways
                    sends = np.minimum(np.maximum(a_fig, phi) + g_fig, a_fig + np.maximum(g_fig, phi))
                times[:, on] = tab.time_s[:, on] + sends
                times[np.ix_(recv > phi, np.isin(lay.stage, receivers))] = np.inf
                out[j, before, after] = times
            return out

        senders = [(0, (1,)), (P - 1, (P - 2,))] + [(i, (i - 1, i + 1)) for i in range(1, P - 1)]
        return [[case(i, r, phi) for phi in levels] for i, r in senders]
    return _cached_for(inp, "regions_receiver_cases", make)


def _crossing_variants_s(inp: JointInputs) -> dict[tuple[int, bool, bool], np.ndarray]:
    """(region index, crossing before the stage, crossing after it) -> (C, M) stage times with
    sends of a stage in that region, every stage's incoming / outgoing boundary between regions or
    not (`_with_crossing_sends`), each send at least the floors of the class's pools in that region:
    a stage's pools lie in its region (H5), and its sends are at least every one of its pools'
    floors (evaluation.sailor_sends). The floors differ by region (measured: Sailor's GPT-Neo on
    5 zones x 32 A100, TP 1 to another region: 0.0766-0.1083 s from us-central1, 0.0943 s from
    us-west1; the least over both regions let `_regions_fit` fit P6 b2 D16 at a slowest stage of
    0.1707 s, where the plan it pictured runs 0.1832 s)."""
    def make(inp: JointInputs) -> dict:
        a_times, g_times = _send_counts(inp)
        return {(j, before, after): _with_crossing_sends(inp, a_times * after + g_times * before, x, other)
                for j, (other, x, _) in _region_send_figures(inp).items()
                for before, after in itertools.product((False, True), repeat=2)}
    return _cached_for(inp, "crossing_variants", make)


def _region_send_figures(inp: JointInputs) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Region index -> `_send_figures` over the class's pools in that region."""
    return {j: _send_figures(inp, region) for j, region in enumerate(inp.regions)}


def _regions_fit_dp(inp: JointInputs, theta_s: float, extra_cap_s: float, ends_apart: bool, variants: dict) -> bool:
    """`_regions_fit` at one theta with the stage times `variants` ((region index, crossing before,
    crossing after) -> (C, M)), its answer not known from another (thetas that give the same GPUs
    per replica give the same answer)."""
    units = dict(zip(variants, _region_units(inp, theta_s, extra_cap_s, variants)))
    key = (b"".join(units[k].tobytes() for k in sorted(units)), ends_apart)
    cache = _per_inputs_cache(inp, "regions_fit_dp")
    if key not in cache:
        cache[key] = _two_regions_dp(inp, units, ends_apart)
    return cache[key]


def _region_units(inp: JointInputs, theta_s: float, extra_cap_s: float, variants: dict) -> np.ndarray:
    """(V, M): per variant (region index j, ...) of `variants` and pair, the fewest units of D GPUs
    a replica takes of any type of region j within theta_s and extra_cap_s: `_gpus_per_replica`
    for every variant at once (the regions' tests ask it thousands of times a search)."""
    cache = _per_inputs_cache(inp, "region_units")
    if id(variants) not in cache:  # the dict is kept with its arrays: its id is not reused meanwhile
        types = sorted(_gpus_per_type(inp))
        per_region = _gpus_per_group(inp, "region")
        own = np.array([[g in per_region.get(inp.regions[j], {}) for g in types] for j, *_ in variants])
        cache[id(variants)] = (variants, np.stack(list(variants.values())), own, tuple(types))
    _, times, own, types = cache[id(variants)]
    return np.where(own[:, :, None], _least_tp(inp, theta_s, types, extra_cap_s, times), np.inf).min(axis=1)


def _two_regions_dp(inp: JointInputs, units: dict, ends_apart: bool) -> bool:
    """The dynamic program of `_regions_fit` over `units` (`_regions_fit_dp`). The states that
    share the regions of the stage before and this one read the same units, so their tables are
    stacked and each transition is one gather over all of them (half the time of a loop over
    states and unit values: c_gptneo_a100_5zones_32each's 897 DPs, 2.3 -> 1.2 s)."""
    lay, D, L = _pair_layout(inp), inp.D, inp.U - 2
    per_region = _gpus_per_group(inp, "region")
    caps = [sum(per_region.get(r, {}).values()) // D for r in inp.regions]  # units of D GPUs
    if inp.max_gpus is not None:
        caps = [min(c, inp.max_gpus // D) for c in caps]
    width = caps[0] + 1
    prev = _minplus_padded_index(L + 1)  # prev[s, n] = s - n, or the inf row L + 1
    starts = np.searchsorted(lay.stage, np.arange(inp.P + 1))
    start = np.full((L + 1, width), np.inf)
    start[0, 0] = 0.0
    # (region of the stage before, of this one, crossings so far odd, any) -> (blocks, units of
    # region 0) -> the fewest units of region 1
    states = {(r, r, False, False): start for r in (0, 1)}
    for i in range(inp.P):
        check_deadline()
        at = slice(starts[i], starts[i + 1])
        groups: dict = {}
        for (before, here, odd, crossed), best in states.items():
            groups.setdefault((before, here), []).append(((odd, crossed), best))
        new: dict = {}
        for (before, here), members in groups.items():
            stack = np.full((len(members), L + 2, width + 1), np.inf)  # with an inf row and column
            for j, (_, best) in enumerate(members):
                stack[j, :L + 1, :width] = best
            for after in ((0, 1) if i < inp.P - 1 else (here,)):
                u_row = units[here, before != here, after != here][at]
                ok = np.isfinite(u_row)
                if not ok.any():
                    continue
                rows, u = prev[:, lay.count[at][ok]], u_row[ok].astype(int)  # (L + 1, k), (k,)
                if here == 0:  # region 0's units move the column: from w - u, or the inf column
                    src = np.arange(width)[None, :] - u[:, None]
                    reach = stack[:, rows[:, :, None], np.where(src >= 0, src, width)[None]].min(axis=2)
                else:  # region 1's units add to the value
                    reach = (stack[:, rows, :width] + u[None, None, :, None]).min(axis=2)
                cross = after != here
                for j, ((odd, crossed), _) in enumerate(members):
                    key = (here, after, odd ^ cross, crossed or cross)
                    if key in new:
                        np.minimum(new[key], reach[j], out=new[key])
                    else:
                        new[key] = reach[j]
        states = new
    for (_, _, odd, crossed), best in states.items():
        if odd == ends_apart and crossed:
            ok = best[L] <= caps[1]
            if inp.max_gpus is not None:
                ok &= best[L] + np.arange(width) <= inp.max_gpus // D
            if ok.any():
                return True
    return False


def _sailor_crossing_sends_s(inp: JointInputs) -> np.ndarray:
    """(C,): x_c of `sailor_crossing_time_bound_s`, the least a send of class c over a boundary
    between regions takes."""
    return _send_figures(inp)[1]


def _sailor_crossing_times_s(inp: JointInputs, crossings: tuple[int, ...]) -> np.ndarray:
    """(C, M): `_sailor_stage_times_s` where the boundaries `crossings` lie between regions: stage
    i's sends are A_i (twice for the first stage when P > 3) and G_{i-1} (twice for the last),
    each at least x_c (`_sailor_crossing_sends_s`) over a crossing and its class's floor
    otherwise."""
    cache = _per_inputs_cache(inp, "sailor_crossing_times")
    if crossings not in cache:
        i, (a_times, g_times) = _pair_layout(inp).stage, _send_counts(inp)
        crossed = list(crossings)
        cache[crossings] = _with_crossing_sends(inp, a_times * np.isin(i, crossed) + g_times * np.isin(i - 1, crossed))
    return cache[crossings]


def _send_counts(inp: JointInputs) -> tuple[np.ndarray, np.ndarray]:
    """(M,) twice: how many sends of its activation A_i and of its gradient G_{i-1} the stage of
    each (stage, blocks) pair pays in Sailor's composition (`sailor_p2p`)."""
    i, P = _pair_layout(inp).stage, inp.P
    return (np.where(i == 0, first_stage_sends(P), np.where(i == P - 1, 0, 1)),
            np.where(i == P - 1, 2, np.where(i == 0, 0, 1)))


def _with_crossing_sends(inp: JointInputs, crossing_sends: np.ndarray, x: np.ndarray | None = None,
                         other: np.ndarray | None = None) -> np.ndarray:
    """(C, M) stage times with sends where `crossing_sends` (M,) of each pair's sends go over a
    boundary between regions (x_c each, default `_sailor_crossing_sends_s`) and the others at the
    class's floor (`other`, default `_sailor_class_sends_s`)."""
    a_times, g_times = _send_counts(inp)
    x = _sailor_crossing_sends_s(inp) if x is None else x
    other = _sailor_class_sends_s(inp) if other is None else other
    return (_class_tables(inp).time_s + crossing_sends[None, :] * x[:, None]
            + (a_times + g_times - crossing_sends)[None, :] * other[:, None])


def region_split_time_bound_s(inp: JointInputs, merged_s: float, target_s: float | None = None,
                              strongest: bool = False) -> float:
    """The bounds above merge every region, but a stage's replicas sit in one region (H5) and a
    boundary between regions costs c_region. A plan either
      - lies in one region r: T >= the bound of the inputs cut down to r's pools (`in_region`);
      - uses several regions with the first and last stage in one region: then it crosses a region
        boundary at least twice, T >= merged_s + 2 (c_region - c_node), and its slowest stage
        or boundary is at least c_region / 2 (theta >= c[i] / 2), T >= sum tau + (m - 1) theta +
        rest + 2 (c_region - c_node) with that theta;
      - or puts its ends in different regions: one crossing, and the tied-embedding all-reduce
        crosses regions too, T >= sum tau + (P - 1) c_node + (c_region - c_node) + (m - 1) theta
        + tied(region) + mu, each term bounded alone; and T >= merged_s + (c_region - c_node)
        (merged_s holds with the boundaries at c_node and grows with them one for one).
    The least of these is a bound (measured: OPT-350M on 5 zones in 2 regions, P5 b1 D64, the
    merged bound is 1.50 s, the optimum 1.654 s: the small region can hold one stage only at the
    cost of two crossings)."""
    return _least_over_regions(inp, min(_crossing_bounds_s(inp, merged_s)), target_s,
                               lambda sub, target: _time_lower_bound_merged_s(sub, True, target, strongest))


def _crossing_bounds_s(inp: JointInputs, merged_s: float) -> tuple[float, float]:
    """(T of the plans whose ends lie in different regions, T of the plans over several regions
    whose ends lie in one) at least, as `region_split_time_bound_s` states them."""
    c_node, c_region = inp.p2p_s(inp.node), inp.p2p_s(inp.region)
    hop = c_region - c_node
    theta = max(_theta_work_bound_s(inp), bottleneck_lower_bound_s(inp, True), c_region / 2)
    sum_tau = sum_tau_lower_bound_s(inp)
    ends_apart = max(merged_s + hop, iteration_time_s(inp.m, sum_tau, (inp.P - 1) * c_node + hop, theta,
                                                      inp.tied_s[2] + _mu_lower_bound_s(inp)))
    # two crossings: their boundaries take c_region, so theta >= c_region / 2 there too (measured:
    # OPT-350M, 5 zones x 80 A100, P13 b2 D16, m = 64: 1.52 s -> 2.57 s, above the 1.98 s of the
    # plans inside one region; the MILPs of P13-P16 D16 each stopped at their 5 s limit)
    two_hops = max(merged_s, iteration_time_s(inp.m, sum_tau, _links_lower_bound_s(inp), theta,
                                              _sync_update_lower_bound_s(inp))) + 2 * hop
    return ends_apart, two_hops


def _region_inputs(inp: JointInputs) -> dict[str, "JointInputs"]:
    """region -> these inputs with only the pools of that region (cached: their own bound caches
    live as long as these inputs)."""
    return _cached_for(inp, "regions", lambda inp: {r: in_region(inp, r) for r in inp.regions})


def in_region(inp: JointInputs, region: str) -> JointInputs:
    """The same outer choice with only `region`'s pools (the all-reduce table re-indexed)."""
    keep = [k for k, p in enumerate(inp.pools) if p.region == region]
    new_index = {k: j for j, k in enumerate(keep)}
    pick = lambda rows: tuple(rows[k] for k in keep)  # noqa: E731
    def table(tab: dict | None) -> dict | None:
        return None if tab is None else {(new_index[k], pos, n): v for (k, pos, n), v in tab.items() if k in new_index}
    return replace(inp, pools=pick(inp.pools), step_s=pick(inp.step_s), upd_s=pick(inp.upd_s),
                   upd_fixed_s=pick(inp.upd_fixed_s) if inp.upd_fixed_s else (),
                   send_floor_s=pick(inp.send_floor_s) if inp.send_floor_s else (),
                   recv_floor_s=pick(inp.recv_floor_s) if inp.recv_floor_s else (),
                   send_away_s=pick(inp.send_away_s) if inp.send_away_s else (),
                   stat_bytes=pick(inp.stat_bytes), act_bytes=pick(inp.act_bytes), cap_bytes=pick(inp.cap_bytes),
                   sync_table=table(inp.sync_table), span_sync_table=table(inp.span_sync_table),
                   repeat_sync_table=table(inp.repeat_sync_table))


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
                            grid: int = 8, strongest: bool = False) -> float:
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
    (`_lifted_cell_s`; only for cells within 10 % below the target when there is one)."""
    tab = _class_tables(inp)
    sum_tau = sum_tau_lower_bound_s(inp)
    links = _links_lower_bound_s(inp)
    caps = _extra_values_s(inp).tolist()
    thetas = np.unique(tab.time_s)
    thetas = thetas[thetas >= theta_lo_s].tolist()
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
        out = iteration_time_s(inp.m, sum_tau, links, thetas[j] if j < len(thetas) else math.inf, s_lo)
        if target_s is not None and not 0.9 * target_s <= out < target_s:
            return out  # reached, or too far below for the DPs to lift it there (a min-cost floor)
        goal = None if target_s is None else target_s - links - s_lo
        return max(out, _lifted_cell_s(inp, thetas, j, cap, sum_tau, goal, 8 if target_s is not None else 3,
                                       strongest) + links + s_lo)

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
            if below < 0 or not fits(thetas[below]):
                best = min(best, cell(below + 1, s_lo, cap))
                continue
            hi = min(hi, below)
        elif not fits(thetas[hi]):
            continue  # this cell holds no plan at all (theta*(cap) is beyond every stage time)
        lo = _first_true(fits, thetas, 0, hi, steps=3 if target_s is None else 1)
        best = min(best, cell(lo, s_lo, cap))
    return best


def _lifted_cell_s(inp: JointInputs, thetas: list[float], j: int, cap: float, sum_tau: float,
                   goal: float | None = None, depth: int = 6, strong: bool = False) -> float:
    """min over the plans with theta >= thetas[j] and every extra <= cap of sum tau + (m - 1) theta.
    A plan's slowest stage takes one of `thetas`; if that is among thetas[lo:hi], its sum tau is
    >= `capped_sum_tau_s`(thetas[hi - 1], cap) and its theta >= thetas[lo]. The range is halved
    (at most `depth` times) until each part's bound reaches `goal` (the value the caller needs).
    `strong`: a part the plain DP leaves below the goal also gets the replica-level DPs."""
    def bound(lo: int, hi: int, d: int) -> float:
        def at(stages_s: float) -> float:  # the stages and the bottleneck's part of T
            return iteration_time_s(inp.m, stages_s, 0.0, thetas[lo], 0.0)
        out = at(max(sum_tau, capped_sum_tau_s(inp, thetas[hi - 1], cap)))
        if strong and (goal is None or out < goal):
            out = max(out, at(capped_sum_tau_s(inp, thetas[hi - 1], cap, True)))
        if d == 0 or hi - lo == 1 or (goal is not None and out >= goal):
            return out
        mid = (lo + hi) // 2
        left = bound(lo, mid, d - 1)
        # short of the goal on the left: the node is too, so the right half gets no halving
        right = bound(mid, hi, 0 if goal is not None and left < goal else d - 1)
        return max(out, min(left, right))

    return bound(j, len(thetas), depth) if j < len(thetas) else math.inf


def extra_lower_bound_s(inp: JointInputs) -> float:
    """A lower bound on sigma + mu that sees the GPU quotas (blocks form), without a DP. Stage i
    with n blocks needs D replicas of classes whose extra value is at most s: s_need(i, n) is the
    least s for which the GPUs allow that (each type at its smallest such TP), either in one zone
    with the in-zone values (`_ClassTables.extra_in_s`) or over all zones with the spanning values
    (`_ClassTables.extra_span_s`). Every stage holds some count and some stage holds >= ceil(L / P)
    blocks, so sigma + mu >= max(max_i min_n s_need(i, n), min_{i, n >= ceil(L/P)} s_need(i, n))."""
    return _cached_for(inp, "extra_lb", _make_extra_lower_bound)


def _make_extra_lower_bound(inp: JointInputs) -> float:
    tab, lay = _class_tables(inp), _pair_layout(inp)
    gpus = _gpus_per_type(inp)
    zones = _gpus_per_group(inp, "zone")
    n_big = -(-(inp.U - 2) // inp.P)
    pair_at = {pair: j for j, pair in enumerate(lay.pairs)}

    def least_s(extra: np.ndarray, j: int, enough) -> float:
        """The least extra value at which the classes fitting pair j allow D replicas."""
        min_tp: dict[str, int] = {}
        col = extra[:, j]
        for ci in np.argsort(col, kind="stable").tolist():  # ties in class order, as sorted (value, class)
            if not tab.fits[ci, j]:
                continue
            g, t = tab.classes[ci]
            min_tp[g] = min(min_tp.get(g, t), t)
            if enough(min_tp):
                return float(col[ci])
        return math.inf

    def s_need(i: int, n: int) -> float:
        j = pair_at[i, n]
        return min(least_s(tab.extra_in_s, j, lambda tp: _most_replicas(zones, tp) >= inp.D),
                   least_s(tab.extra_span_s, j, lambda tp: _replicas(gpus, tp, inp.max_gpus) >= inp.D))

    # s_need grows with n (a class's extra grows, fewer classes fit): only the least count matters
    counts = [block_counts(inp, i) for i in range(inp.P)]
    every = max(s_need(i, c.start) for i, c in enumerate(counts))
    big = min((s_need(i, max(n_big, c.start)) for i, c in enumerate(counts) if max(n_big, c.start) in c),
              default=math.inf)
    return max(every, big)


def sum_tau_lower_bound_s(inp: JointInputs) -> float:
    """A lower bound on sum_i tau_i that sees the GPU quotas (blocks form; F otherwise), by
    Lagrangian relaxation: with a price lam_g >= 0 per GPU of type g (and lam_0 on every GPU under
    max_gpus), sum tau >= min over plans of sum_i [tau_i + sum of the prices of stage i's GPUs]
    - sum_g lam_g gpus_g - lam_0 max_gpus, and the min splits by stage: stage i with n blocks and
    straggler class r costs time[r,i,n] + D x (the cheapest replica among classes no slower than r
    that fit), then a min-plus DP over stages places the L blocks. Any prices give a valid bound;
    a few rounds of coordinate search over a grid of prices pick good ones. F (every unit on its
    fastest pool) misses that the fastest class cannot serve every stage: on GPT-Neo, 3 x 256
    GPUs, P3 b1 D256, F = 0.070 s where the optimum's sum tau is 0.286 s."""
    return _cached_for(inp, "sum_tau", lambda inp: max(_fastest_work_s(inp), _sum_tau_prices(inp)[0])
                       if blocks_identical(inp) else _fastest_work_s(inp))


@dataclass(frozen=True)
class _ClassArrays:
    """Per (stage, block count, class) figures as arrays, for the sum-of-stage-times DPs."""
    time_s: np.ndarray  # (P, N, C) stage seconds, inf where the class does not fit or n is not allowed
    extra_s: np.ndarray  # (P, N, C) the least of `_ClassTables.extra_in_s` and `_ClassTables.extra_span_s`
    extra_hi_s: np.ndarray  # (P, N, C) the larger of the two that a placement exists for
    tp: np.ndarray  # (C,)
    gpu_of: np.ndarray  # (C,) index into types
    types: list[str]
    held: np.ndarray  # (types + 1,) GPUs per type, then min(all GPUs, max_gpus)


def _class_arrays(inp: JointInputs, sends: bool = False) -> _ClassArrays:
    """`sends` (Sailor's composition): each stage time with the least its stage's sends take
    (`_sailor_stage_times_s`), a lower bound on tau_i + p_i where the class serves stage i."""
    if sends:  # only the stage times differ
        return _cached_for(inp, "class_arrays_sends", lambda inp: replace(
            _class_arrays(inp), time_s=_by_stage(inp, _sailor_stage_times_s(inp), np.inf)))
    return _cached_for(inp, "class_arrays", _make_class_arrays)


def _by_stage(inp: JointInputs, values: np.ndarray, missing: float) -> np.ndarray:
    """(C, M) per class and (stage, blocks) pair -> (P, N, C), `missing` where the class does not fit."""
    tab, lay = _class_tables(inp), _pair_layout(inp)
    out = np.full((inp.P, inp.U - 1, len(tab.classes)), missing)
    out[lay.stage, lay.count, :] = np.where(tab.fits, values, missing).T
    return out


def _make_class_arrays(inp: JointInputs) -> _ClassArrays:
    tab = _class_tables(inp)
    gpus = _gpus_per_type(inp)
    types = sorted(gpus)
    spread = functools.partial(_by_stage, inp)
    total = sum(gpus.values()) if inp.max_gpus is None else min(sum(gpus.values()), inp.max_gpus)
    return _ClassArrays(spread(tab.time_s, np.inf), spread(np.minimum(tab.extra_in_s, tab.extra_span_s), np.inf),
                        spread(np.maximum(*(np.where(np.isfinite(e), e, -np.inf)  # inf: no such placement
                                            for e in (tab.extra_in_s, tab.extra_span_s))), -np.inf),
                        np.array([c[1] for c in tab.classes], dtype=float),
                        np.array([types.index(c[0]) for c in tab.classes]), types,
                        np.array([gpus[g] for g in types] + [total], dtype=float))


def _sum_tau_prices(inp: JointInputs) -> tuple[float, np.ndarray]:
    """(the Lagrangian bound of `sum_tau_lower_bound_s`, the prices that reach it)."""
    return _cached_for(inp, "sum_tau_prices", _make_sum_tau_prices)


class _ByStageTime:
    """Classes of every (stage, block count) sorted by stage time (inf: not allowed there)."""

    def __init__(self, t: np.ndarray):
        self.order = np.argsort(t, axis=2, kind="stable")
        self.t_sorted = np.take_along_axis(t, self.order, axis=2)
        self.finite = np.isfinite(self.t_sorted)

    def costs(self, arr: _ClassArrays, lams: np.ndarray, D: int) -> np.ndarray:
        """(B, P, N, C): the r-th class as straggler costs its stage time + D x the price of the
        cheapest replica among classes no slower than r, at prices lams (B, types + 1)."""
        per_gpu = (lams[:, arr.gpu_of] + lams[:, -1:]) * arr.tp  # (B, C) price of one replica per class
        price = np.where(self.finite, per_gpu[:, self.order], np.inf)  # in each (stage, count)'s time order
        return self.t_sorted + D * np.minimum.accumulate(price, axis=3)


def _make_sum_tau_prices(inp: JointInputs) -> tuple[float, np.ndarray]:
    arr = _class_arrays(inp)
    L, P = inp.U - 2, inp.P
    N = L + 1
    by_time = _ByStageTime(arr.time_s)
    # lam[g] per type; lam[-1] on every GPU, against min(all GPUs, max_gpus): single-type prices
    # alone cannot leave lam = 0 when another type is as fast
    prev = _minplus_padded_index(N)

    def values(lams: np.ndarray) -> np.ndarray:  # (B, types + 1) prices -> (B,) dual values
        check_deadline()
        stage = by_time.costs(arr, lams, inp.D).min(axis=3)  # (B, P, N)
        best = np.full((lams.shape[0], N + 1), np.inf)  # column N stays inf: where prev points for s < n
        best[:, 0] = 0.0
        for i in range(P):
            best[:, :N] = (best[:, prev] + stage[:, i, None, :]).min(axis=2)  # (B, s, n) -> (B, s)
        return best[:, L] - lams @ arr.held

    lam = np.zeros(len(arr.types) + 1)
    best_value = float(values(lam[None])[0])
    if not np.isfinite(best_value):
        return math.inf, lam
    unit = max(float(np.min(by_time.t_sorted[..., 0][by_time.finite[..., 0]])), 1e-12) / inp.D
    steps = np.array([0.0] + [unit * 2.0 ** k for k in range(-4, 9)])
    coords = [lam.size - 1] + list(range(lam.size - 1))
    if lam.size == 2 and arr.held[0] == arr.held[-1]:
        coords = coords[:1]  # one type and no GPU cap: both prices are one price on the same GPUs
    for _ in range(3):  # coordinate search over a grid of prices, all trials of a coordinate at once
        improved = False
        for g in coords:
            trials = np.repeat(lam[None], steps.size, axis=0)
            trials[:, g] = steps
            vals = values(trials)
            j = int(np.argmax(vals))
            if vals[j] > best_value + 1e-15:
                best_value, lam, improved = float(vals[j]), trials[j], True
        if not improved:
            break
    return best_value, lam


@functools.lru_cache(maxsize=16)
def _minplus_padded_index(N: int) -> np.ndarray:
    """prev[s, n] = s - n where s >= n, else N: one stage's min-plus step as a gather from a table
    whose row N is inf (no mask needed). Cached: callers only read it."""
    s_idx, n_idx = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    out = np.where(s_idx >= n_idx, s_idx - n_idx, N)
    out.setflags(write=False)
    return out


def capped_sum_tau_s(inp: JointInputs, theta_cap_s: float = math.inf, extra_cap_s: float = math.inf,
                     strong: bool = False, sends: bool = False) -> float:
    """A lower bound on sum_i tau_i over the plans whose stages all run within theta_cap_s and whose
    (stage, class) extras (`_ClassTables.extra_in_s`, or `_ClassTables.extra_span_s` where smaller) are within
    extra_cap_s (blocks form). A DP over (blocks placed, GPUs used in units of D) keeps the GPU
    total exact: a stage whose straggler is class r holds D replicas of classes no slower than r,
    so at least D x (the least TP among them) GPUs, a whole number of units, and the units of all
    stages fit min(all GPUs, max_gpus) / D. The per-type quotas enter by Lagrangian prices: those
    `sum_tau_lower_bound_s` found and none, the larger result counts. The caps are what make this
    strong: with theta at its bound, the fast (high-TP) classes cannot take every block, and the
    GPUs they need are gone for the other stages (measured: GPT-Neo on 256 A100, P5 b1 D32, sum tau
    >= 0.090 s uncapped, 0.145 s at the bottleneck bound, the optimum's sum tau).

    `strong` also takes `_replica_sum_tau_s` for every split of the GPU types into one type and
    the rest, which sees the quota of that type exactly (measured: A100 + V100, 32 + 96 GPUs,
    P5 b1 D16, at the optimum's theta and extras: 0.627 s here, 0.882 s with it, the optimum's).

    `sends` (Sailor's composition): the same over the stage times with their sends
    (`_class_arrays`), a lower bound on sum_i (tau_i + p_i) over the plans whose theta (which is
    at least every tau_i + p_i there) is within theta_cap_s."""
    arr = _class_arrays(inp, sends)
    allowed = np.isfinite(arr.time_s) & (arr.time_s <= theta_cap_s) & (arr.extra_s <= extra_cap_s)
    # the caps act through the (stage, blocks, class) triples they allow alone: the searches ask
    # with many caps that allow the same ones (measured: 28 % of the replica DPs' time repeated)
    return _capped_sum_tau_kept(inp, allowed, np.packbits(allowed).tobytes(), strong, sends)


def _capped_sum_tau_kept(inp: JointInputs, allowed: np.ndarray, packed: bytes, strong: bool,
                         sends: bool = False) -> float:
    """`capped_sum_tau_s` once per (allowed classes, `packed` their bits, strong, sends); the
    strong one starts from the plain one of the same classes."""
    cache = _per_inputs_cache(inp, "capped_sum_tau")
    key = (packed, strong, sends)
    if key not in cache:
        out = _capped_sum_tau_kept(inp, allowed, packed, False, sends) if strong else \
            _capped_sum_tau_s(inp, allowed, sends)
        if strong and out < math.inf:
            types = _class_arrays(inp).types
            for g in (types if len(types) > 2 else types[:1]):
                out = max(out, _replica_sum_tau_s(inp, allowed, g, sends))
        cache[key] = out
    return cache[key]


def _capped_sum_tau_s(inp: JointInputs, allowed: np.ndarray, sends: bool = False) -> float:
    """`capped_sum_tau_s` without `strong`, with the classes its caps allow (`allowed`)."""
    arr = _class_arrays(inp, sends)
    t = np.where(allowed, arr.time_s, np.inf)
    L, P, D = inp.U - 2, inp.P, inp.D
    N = L + 1
    by_time = _ByStageTime(t)
    if not by_time.finite[..., 0].any(axis=1).all():
        return math.inf  # some stage has no allowed count
    least_tp = np.minimum.accumulate(np.where(by_time.finite, arr.tp[by_time.order], np.inf), axis=2)  # (P, N, C)
    units = sorted({int(u) for u in arr.tp})
    V = min(int(arr.held[-1] // D), P * units[-1])  # more units than P stages can take never bind
    # with one GPU type the unit axis counts its GPUs exactly (V D <= its GPUs and the cap), and a
    # price on them subtracts at least what it adds (every plan pays <= price x V D): no prices
    prices = [] if len(arr.types) == 1 else [_sum_tau_prices(inp)[1]]
    lams = np.stack([np.zeros_like(arr.held), *prices])  # (1 or 2, types + 1)
    cost_r = by_time.costs(arr, lams, D)  # (1 or 2, P, N, C)
    # cost[u]: a stage taking u units: the best straggler whose least TP is <= u
    cost = [np.where(least_tp <= u, cost_r, np.inf).min(axis=3) for u in units]  # (1 or 2, P, N) each
    prev = _minplus_padded_index(N)
    # best[., s, v]: s blocks placed on v units; row N stays inf (where prev points for s < n)
    best = np.full((len(lams), N + 1, V + 1), np.inf)
    best[:, 0, 0] = 0.0
    allowed = [np.isfinite(c).any(axis=0) for c in cost]  # (P, N) per unit: the counts a stage may take
    for i in range(P):
        check_deadline()
        new = np.full_like(best, np.inf)
        for u, c, ok_u in zip(units, cost, allowed):
            if u > V:
                continue
            ns = np.flatnonzero(ok_u[i])  # only the counts allowed here
            if ns.size == 0:
                continue
            cand = best[:, prev[:, ns], : V + 1 - u] + c[:, i, ns][:, None, :, None]  # (., s, n, v)
            np.minimum(new[:, :N, u:], cand.min(axis=2), out=new[:, :N, u:])
        best = new
    values = best[:, L, :].min(axis=1) - lams @ arr.held
    return float(values.max())


def _replica_sum_tau_s(inp: JointInputs, allowed: np.ndarray, left: str, sends: bool = False) -> float:
    """A lower bound on sum tau over the classes `allowed` (by the caps of `capped_sum_tau_s`) that
    counts the GPUs of type `left` exactly, replica by replica, and prices the GPUs of the other
    types (merged into one) at mu per GPU (Lagrangian: any mu >= 0 gives a bound; the dual is
    concave in mu, searched on a doubling grid). A stage with n blocks whose slowest class takes tau
    holds x replicas of `left` at the least TP w_a among its classes no slower than tau, and D - x
    of the others at their least such TP w_b, in any mix: best'[s + n, a + x w_a] = min(best[s, a] +
    tau + mu (D - x) w_b) over x = 0..D (`_stage_contrib`), a <= the GPUs of `left`; the bound is
    min_a best[L, a] - mu (the other GPUs)."""
    arr = _class_arrays(inp, sends)
    t = np.where(allowed, arr.time_s, np.inf)
    gpus = _gpus_per_type(inp)
    in_left = arr.gpu_of == arr.types.index(left)
    cap_a, cap_b = gpus[left], sum(v for g, v in gpus.items() if g != left)
    L, D = inp.U - 2, inp.D
    stages = [_replica_stage_choices(inp, t[i], i, in_left, arr.tp) for i in range(inp.P)]

    def value(mu: float) -> float:
        priced = [[((wa, mu * wb if wb < math.inf else wb), per_n) for (wa, wb), per_n in choices.items()]
                  for choices in stages]
        return float(_replica_dp(priced, L, cap_a + 1, D).min()) - mu * cap_b

    finite = t[np.isfinite(t)]
    if finite.size == 0:
        return math.inf
    unit = float(finite.min()) / D
    out, last = value(0.0), -math.inf
    for k in range(0, 16, 2):  # rises, then flat or falling (concave in mu)
        v = value(unit * 2.0 ** k)
        out = max(out, v)
        if v <= last + 1e-12 * abs(last):
            break
        last = v
    return out


def _replica_stage_choices(inp: JointInputs, t_i: np.ndarray, i: int, in_left: np.ndarray,
                           tp: np.ndarray) -> dict[tuple[float, float], list[tuple[int, float]]]:
    """(w_a, w_b) -> [(n, least tau with those GPUs per replica)] for stage i (`_replica_sum_tau_s`):
    with the classes of each n sorted by time, a stage time tau allows a prefix of them, and w_a,
    w_b are running minima of the TP degrees along it (one per distinct tau: the last of its ties)."""
    ns = list(block_counts(inp, i))
    rows = t_i[ns]  # (K, C)
    order = np.argsort(rows, axis=1, kind="stable")
    ts = np.take_along_axis(rows, order, axis=1)
    tps, lefts = tp[order], in_left[order]
    w_a = np.minimum.accumulate(np.where(lefts, tps, np.inf), axis=1)
    w_b = np.minimum.accumulate(np.where(lefts, np.inf, tps), axis=1)
    last = np.isfinite(ts) & np.concatenate([ts[:, 1:] != ts[:, :-1], np.ones((len(ns), 1), bool)], axis=1)
    rs, ks = np.nonzero(last)  # by n, then by tau ascending
    out: dict[tuple[float, float], dict[int, float]] = {}
    for r, wa, wb, tau in zip(rs.tolist(), w_a[rs, ks].tolist(), w_b[rs, ks].tolist(), ts[rs, ks].tolist()):
        out.setdefault((wa, wb), {}).setdefault(ns[r], tau)
    return {key: list(per_n.items()) for key, per_n in out.items()}


def _c_node_s(inp: JointInputs) -> float:
    """One boundary's transfer inside a zone: the least c_i (0 with one stage)."""
    return inp.p2p_s(inp.node) if inp.P > 1 else 0.0


def _rest_lower_bound_s(inp: JointInputs) -> float:
    """sum_i c_i + sigma + mu >= `_links_lower_bound_s` + `_sync_update_lower_bound_s`."""
    return _links_lower_bound_s(inp) + _sync_update_lower_bound_s(inp)


def _links_lower_bound_s(inp: JointInputs) -> float:
    """sum_i c_i >= (P - 1) c_node (every boundary costs at least the one inside a zone)."""
    return (inp.P - 1) * _c_node_s(inp)


def _sync_update_lower_bound_s(inp: JointInputs) -> float:
    """sigma + mu >= the larger of `_sigma_lower_bound_s` + `_mu_lower_bound_s` and (blocks form)
    `extra_lower_bound_s`; within `extra_floor_scope(f)`, at least f."""
    return max(_sync_update_base_s(inp), _EXTRA_FLOOR.get())


# sigma + mu of the plans the time bounds speak of (`extra_floor_scope`); a scope rather than a
# parameter for the reason the deadline is one (inputs.py): the bounds reach `_sync_update_lower_bound_s`
# many levels deep, and every cached figure below it is kept free of the floor (`_sync_update_base_s`)
_EXTRA_FLOOR: contextvars.ContextVar[float] = contextvars.ContextVar("hetplan_extra_floor", default=0.0)


@contextlib.contextmanager
def extra_floor_scope(floor_s: float) -> Iterator[None]:
    """Within the block every time bound holds for the plans whose sigma + mu is at least floor_s:
    the time bounds floor sigma + mu by `_sync_update_lower_bound_s` (joined by max with floors of
    their own, as the rest of each cell of `_split_cells_bound_s`), and for those plans floor_s is a
    floor too. Figures cached on the inputs are computed from `_sync_update_base_s`, outside it."""
    token = _EXTRA_FLOOR.set(floor_s)
    try:
        yield
    finally:
        _EXTRA_FLOOR.reset(token)


def extra_ceiling_s(inp: JointInputs, target_s: float) -> float:
    """The least F among the choice's all-reduce + update values (`_extra_values_s`) such that every
    plan with sigma + mu >= F has T >= target_s (inf when no value does): the strong bound under
    `extra_floor_scope(F)` reaches the target. The bound only grows with F (each cell's rest is
    max(its own, F)), so a bisection (`_first_true`) finds it in ~log2 of the values' count; each F
    returned was tested, so a bound that took another path at some F leaves the result valid. A MILP with the
    target as cutoff may then add the row sigma + mu <= F (`milp.build(extra_ceiling_s=)`): the
    plans it leaves out are ruled out here. On the choice's own inputs the bounds' DP tests (which do
    not read sigma + mu) are mostly cached already. Measured, HiGHS alone after the choice's
    strongest bound at the target: Sailor's GPT-Neo on 5 zones x 32 A100 at 12.992 s, P3 b2 D32, P4
    b2 D32, P5 / P6 / P7 b2 D16: F = 3.14, 3.01, 1.32, 1.64, 1.47 s in 0.02-0.09 s each, no plan
    below the target proven in 1.56, 1.39, 2.93, 11.15, 17.38 s with the row against 1.19, 1.75,
    5.65, 11.08, 21.21 s without; OPT-350M on 2 zones of 128 A100 + 128 V100 at 1.37125 s, P6 b2
    D32 and P4 b4 D32: 6.73 and 0.67 s against 7.04 and 2.39 s. Branch and bound moves with any
    change to a model (as a bound on sigma alone, sigma <= F, the same seven took 40.5 s against
    50.8 s without in another run, P7 22.44 s, P6 7.09 s), so read the sums: 41.8 s with the row
    against 50.3 s without."""
    vals = _extra_values_s(inp).tolist()

    def reaches(floor_s: float) -> bool:
        with extra_floor_scope(floor_s):
            return time_lower_bound_tight_s(inp, True, target_s, decide=True) >= target_s

    if not vals or not reaches(vals[-1]):
        return math.inf
    return vals[_first_true(reaches, vals, 0)]


def _sync_update_base_s(inp: JointInputs) -> float:
    """`_sync_update_lower_bound_s` over every plan, whatever the scope (`extra_floor_scope`)."""
    sync_update = _sigma_lower_bound_s(inp) + _mu_lower_bound_s(inp)
    if blocks_identical(inp):
        sync_update = max(sync_update, extra_lower_bound_s(inp))
    return sync_update


def _sigma_lower_bound_s(inp: JointInputs) -> float:
    """Some stage holds >= ceil(L / P) blocks (>= 1/P of the gradients). With `sync_table` (the
    model's all-reduce times, possibly intra-node), the least table entry with that many blocks;
    otherwise the model's ring over the inter-node link at the largest TP."""
    if inp.sync_table is not None:
        n_big = -(-(inp.U - 2) // inp.P)
        tables = [inp.sync_table] + ([inp.span_sync_table] if inp.span_sync_table else [])
        return min(_per_table(tab, ("least_from", n_big), lambda: min(
            (v for (_, _, n), v in tab.items() if n >= n_big), default=0.0)) for tab in tables)
    return 0.0  # without the table (layer units that differ) the model has no all-reduce floor


def _mu_lower_bound_s(inp: JointInputs) -> float:
    """mu >= 1/P of the cheapest update (some stage holds >= 1/P of the units' update work), plus
    the least fixed step (`upd_fixed_s`): the pools serving that stage take theirs too."""
    per_unit = _shared_for(inp, "least_update", lambda inp: sum(min(inp.upd_s[k][l] for k in range(inp.K))
                                                                for l in range(inp.U))) / inp.P
    return per_unit + min(inp.upd_fixed_s, default=0.0)  # every stage's pools take their fixed step


def stage_time_cap_s(inp: JointInputs, t_max_s: float) -> float:
    """The slowest a stage may be in a plan with T <= t_max_s: T >= m tau_i + (the other stages' tau)
    + rest >= m tau_i + `_rest_lower_bound_s`, since (m - 1) theta >= (m - 1) tau_i. Stage choices
    slower than this are dropped from the model (they cannot beat the cutoff)."""
    return (t_max_s - _rest_lower_bound_s(inp)) / inp.m


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


def rate_lower_bound_usd_per_s(inp: JointInputs) -> float:
    """rate >= P D x the cheapest replica's USD per second (every stage has D replicas)."""
    return inp.P * inp.D * min(replica_rate_usd_per_s(p) for p in inp.pools)
