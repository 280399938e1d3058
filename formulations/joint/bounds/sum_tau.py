"""Bounds on the sum of the stage times (`sum_tau_lower_bound_s`, `capped_sum_tau_s`): the least sum
of the stages' compute times over the layouts whose every stage meets a cap on its time (and on
its all-reduce + update), by a min-plus DP over stages on the blocks placed, and at the strongest
level by replica-level DPs that count the GPUs too."""
from __future__ import annotations

import functools
import math
from typing import Callable
from dataclasses import dataclass, replace

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, check_deadline
from hetplan.formulations.joint.tables import (_cached_for, _class_tables, _pair_layout, _per_inputs_cache,
    block_counts, blocks_identical)
from hetplan.formulations.joint.bounds.parts import (_fastest_work_s, _gpu_rate_usd_per_s, _gpus_per_type,
    _minplus_padded_index, _sailor_stage_times_s)
from hetplan.formulations.joint.bounds.stage_fit import _replica_dp


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


def capped_sum_tau_s(inp: JointInputs, theta_cap_s: float = math.inf, extra_cap_s: float = math.inf,
                     strong: bool = False, sends: bool = False, reaches: Callable[[float], bool] | None = None
                     ) -> float:
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
    at least every tau_i + p_i there) is within theta_cap_s.

    `reaches(sum)` (with `strong`): whether a sum is all the caller needs, monotone in the sum; the
    search stops at its first bound that reaches it (the plain DP's, then each split's per price
    mu), which is then returned: a bound still, maybe below what the whole search gives."""
    allowed = _allowed(inp, theta_cap_s, extra_cap_s, sends)
    # the caps act through the (stage, blocks, class) triples they allow alone: the searches ask
    # with many caps that allow the same ones (measured: 28 % of the replica DPs' time repeated)
    return _capped_sum_tau_kept(inp, allowed, np.packbits(allowed).tobytes(), strong, sends, reaches)


def _capped_sum_tau_kept(inp: JointInputs, allowed: np.ndarray, packed: bytes, strong: bool,
                         sends: bool = False, reaches: Callable[[float], bool] | None = None) -> float:
    """`capped_sum_tau_s` once per (allowed classes, `packed` their bits, strong, sends); the
    strong one starts from the plain one. Only a search that ran to its end is kept: where the
    whole bound does not reach what a caller's `reaches` asks (a monotone test), neither does any
    earlier bound of its search, which then runs to the end as well; where it does, the search
    runs again to its first bound that reaches, from the replica DPs' kept rows. So a bound never
    depends on what was asked before (the helper process and the main one agree)."""
    cache = _per_inputs_cache(inp, "capped_sum_tau")
    key = (packed, strong, sends)
    got = cache.get(key)
    if got is not None and (reaches is None or not reaches(got)):
        return got
    out = _capped_sum_tau_kept(inp, allowed, packed, False, sends) if strong else \
        _capped_sum_tau_s(inp, allowed, sends)
    if strong and out < math.inf and (reaches is None or not reaches(out)):
        out = max(out, _replica_splits_s(inp, allowed, sends, reaches=reaches))
    if not strong or reaches is None or not reaches(out):
        cache[key] = out
    return out


def _allowed(inp: JointInputs, theta_cap_s: float, extra_cap_s: float, sends: bool) -> np.ndarray:
    """The (class, pair) entries of `_class_arrays` within the caps on a stage's time and extra."""
    arr = _class_arrays(inp, sends)
    return np.isfinite(arr.time_s) & (arr.time_s <= theta_cap_s) & (arr.extra_s <= extra_cap_s)


def _replica_splits_s(inp: JointInputs, allowed: np.ndarray, sends: bool, max_rate_usd_per_s: float = math.inf,
                      reaches: Callable[[float], bool] | None = None) -> float:
    """The largest `_replica_sum_tau_s` over the splits of the GPU types into one type and the
    rest (with two types, one split: the other is the same two resources); with `reaches`, the
    first that reaches it."""
    types = _class_arrays(inp, sends).types
    out = -math.inf
    for g in types if len(types) > 2 else types[:1]:
        out = max(out, _replica_sum_tau_s(inp, allowed, g, sends, max_rate_usd_per_s, reaches))
        if reaches is not None and reaches(out):
            break
    return out


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


def budget_sum_tau_s(inp: JointInputs, theta_cap_s: float, extra_cap_s: float, max_rate_usd_per_s: float,
                     sends: bool = False, reaches: Callable[[float], bool] | None = None) -> float:
    """A lower bound on sum_i tau_i over the plans within the caps of `capped_sum_tau_s` whose GPUs
    cost at most `max_rate_usd_per_s` (a budget over a bound on T: cost >= rate x T). The replica
    DPs of `capped_sum_tau_s(strong=True)` with the rate in their capacity: a plan holding at least
    a GPUs of the exact type (at its least price p_a) and b of the others (p_b the least of theirs)
    has b <= min(their GPUs, (rate - a p_a) / p_b), so the Lagrangian term of the others' GPUs takes
    that capacity per a (`_replica_sum_tau_s`). Without it a tight budget goes unseen: the fast
    stages a small sum needs are dear (measured: Sailor's OPT-350M on 32 A100 + 96 V100 under 0.5
    USD, P3 b4 D16, stage times with sends within 0.2923 s: 0.625 s without the rate, 0.846 s at the
    optimum's rate, whose sum is 0.858 s). `reaches`: as in `capped_sum_tau_s`."""
    return _replica_splits_s(inp, _allowed(inp, theta_cap_s, extra_cap_s, sends), sends, max_rate_usd_per_s, reaches)


def _replica_sum_tau_s(inp: JointInputs, allowed: np.ndarray, left: str, sends: bool = False,
                       max_rate_usd_per_s: float = math.inf, reaches: Callable[[float], bool] | None = None
                       ) -> float:
    """A lower bound on sum tau over the classes `allowed` (by the caps of `capped_sum_tau_s`) that
    counts the GPUs of type `left` exactly, replica by replica, and prices the GPUs of the other
    types (merged into one) at mu per GPU (Lagrangian: any mu >= 0 gives a bound; the dual is
    concave in mu, searched on a doubling grid). A stage with n blocks whose slowest class takes tau
    holds x replicas of `left` at the least TP w_a among its classes no slower than tau, and D - x
    of the others at their least such TP w_b, in any mix: best'[s + n, a + x w_a] = min(best[s, a] +
    tau + mu (D - x) w_b) over x = 0..D (`_stage_contrib`), a <= the GPUs of `left`; the bound is
    min_a best[L, a] - mu room(a), room(a) the other GPUs, or fewer where `max_rate_usd_per_s`
    leaves less for them (`budget_sum_tau_s`; a with no room left holds no plan). `reaches`: the
    search of mu stops at the first bound that reaches it (`capped_sum_tau_s`)."""
    arr = _class_arrays(inp, sends)
    gpus = _gpus_per_type(inp)
    others = [g for g in gpus if g != left]
    cap_a = gpus[left]
    a = np.arange(cap_a + 1)
    room = np.full(cap_a + 1, float(sum(gpus[g] for g in others)))
    if max_rate_usd_per_s < math.inf:  # (1 + 1e-12): no plan lost to rounding
        left_over = max_rate_usd_per_s * (1 + 1e-12) - a * _gpu_rate_usd_per_s(inp, [left])
        room = (np.minimum(room, np.floor(left_over / _gpu_rate_usd_per_s(inp, others) + 1e-9)) if others
                else np.where(left_over >= 0, room, -1.0))  # one type: a alone must fit the rate
    key = (np.packbits(allowed).tobytes(), left, sends)
    cache = _per_inputs_cache(inp, "replica_sum_tau")  # the DP's rows per mu: the rate only reads them
    if key not in cache:
        t = np.where(allowed, arr.time_s, np.inf)
        in_left = arr.gpu_of == arr.types.index(left)
        finite = t[np.isfinite(t)]
        cache[key] = ({}, [_replica_stage_choices(inp, t[i], i, in_left, arr.tp) for i in range(inp.P)],
                      float(finite.min()) / inp.D if finite.size else math.inf)
    rows, stages, unit = cache[key]
    if unit == math.inf:
        return math.inf

    def value(mu: float) -> float:
        if mu not in rows:
            priced = [[((wa, mu * wb if wb < math.inf else wb), per_n) for (wa, wb), per_n in choices.items()]
                      for choices in stages]
            rows[mu] = _replica_dp(priced, inp.U - 2, cap_a + 1, inp.D)
        return float(np.min(np.where(room >= 0, rows[mu] - mu * np.maximum(room, 0), np.inf)))

    out, last = value(0.0), -math.inf
    for k in range(0, 16, 2):  # rises, then flat or falling (concave in mu)
        if reaches is not None and reaches(out):
            break
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
