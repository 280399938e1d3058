"""The bottleneck bound (`bottleneck_lower_bound_s`): the least slowest stage time theta at which
the blocks can be covered by the pools' GPUs, first by Hall counts per block (`blocks_coverable`,
no DP), refined with the stage DP of `stage_fit.py` when `exact`."""
from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, ULP_SLACK, check_deadline, slack_below
from hetplan.formulations.joint.composition import worker_bytes
from hetplan.formulations.joint.tables import (_cached_for, _class_tables, _per_inputs_cache, blocks_identical,
                                               first_block_generic)
from hetplan.formulations.joint.bounds.parts import _first_true_from, _gpus_per_type, _position_extras, _replicas
from hetplan.formulations.joint.bounds.work import _theta_work_bound_s
from hetplan.formulations.joint.bounds.stage_fit import stages_fit_dp


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
    if stages[-1] < inp.P - 1 - first_block_generic(inp):
        return 0.0  # every stage but the last (and the first, `block_counts`) needs a block: too few hold one
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
    # a level's count depends on its (T, P) matrix alone, and a bound's bisection meets the same
    # matrices again (measured: large_5type_2k, a 10 s search in one process, 5,789 of 8,075)
    cache = _per_inputs_cache(inp, "hall_counts")
    keys = [tp[:, v, :].tobytes() for v in range(tp.shape[1])]
    todo = [v for v, key in enumerate(keys) if key not in cache]
    if todo:
        cache.update(zip((keys[v] for v in todo), _priced_counts(inp, tab, types, tp[:, todo, :]).tolist()))
    return np.array([cache[key] for key in keys])


def _priced_counts(inp: JointInputs, tab: "_CoverableTables", types: list[str], tp: np.ndarray) -> np.ndarray:
    """`_hall_counts` by the prices of `_hall_prices`, for the (T, V, P) smallest eligible TPs `tp`."""
    D = inp.D
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
    times = times[times >= slack_below(hall)].tolist()
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
