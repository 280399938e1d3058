"""Whether the stages of a choice fit its GPUs at a slowest stage time theta (`stages_fit_dp`): per
(stage, block count) the fewest GPUs per replica of each GPU type within theta, then a dynamic
program over the stages on the blocks placed and the GPUs used (`_replica_dp`), one type counted
exactly and the others merged into one resource, or weighted by their share of the work. Every
test is a relaxation, so "does not fit" rules theta out; `bottleneck.py` bisects on it."""
from __future__ import annotations

import math

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, check_deadline
from hetplan.formulations.joint.tables import (_class_tables, _gpus_per_group, _pair_layout, _per_inputs_cache,
    _shared_for)
from hetplan.formulations.joint.bounds.parts import (_gpu_rate_usd_per_s, _gpus_per_type, _minplus_padded_index,
    _work_by_type)


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
              times_s: np.ndarray, extras_s: tuple[np.ndarray, np.ndarray] | None = None,
              zones: np.ndarray | None = None) -> np.ndarray:
    """(..., types, M): for stage times `times_s` (..., C, M) the least TP of each type at every
    pair within theta_s and extra_cap_s (inf: none), under the in-zone rule of `_gpus_per_replica`;
    a stack of time arrays (`_region_units`) in one pass. `extras_s`: the (in one zone, spanning
    zones) extras to test against the cap, broadcast against `times_s` (the class tables' by
    default); `zones` (..., Z): which zones the in-zone rule may count (all by default)."""
    tab = _class_tables(inp)
    order, tp, starts, has, per_zone = _classes_by_type(inp, types)
    extra_in_s, extra_span_s = extras_s or (tab.extra_in_s, tab.extra_span_s)
    if zones is not None:
        per_zone = per_zone * zones[..., None]

    def least(mask: np.ndarray) -> np.ndarray:  # (..., C, M) allowed -> (..., types, M) least TP per pair
        out = np.full((*mask.shape[:-2], len(types), mask.shape[-1]), np.inf)
        if starts:
            out[..., has, :] = np.minimum.reduceat(np.where(mask[..., order, :], tp, np.inf), starts, axis=-2)
        return out

    ok = tab.fits & (times_s <= theta_s)
    if extra_cap_s < math.inf:
        in_zone = ok & (extra_in_s <= extra_cap_s)
        # the most replicas one zone holds, each type at its least TP (GPUs // inf = 0: none)
        most = (per_zone[..., :, :, None] // least(in_zone)[..., None, :, :]).sum(axis=-2).max(axis=-2, initial=0.0)
        ok = (in_zone & (most >= inp.D)[..., None, :]) | (ok & (extra_span_s <= extra_cap_s))
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
    rate_a, rate_b = _gpu_rate_usd_per_s(inp, left), _gpu_rate_usd_per_s(inp, right)
    if table["last"] is None:  # the DP's row only where no plan of whole stages within the limits settles it
        if any((inp.max_gpus is None or a + b <= inp.max_gpus)
               and a * rate_a + b * rate_b <= max_rate_usd_per_s * (1 + 1e-12) for a, b in table["plans"]):
            return len(right) < 2 or _weighted(inp, table, need, gpus, right, cap_a)
        table["last"] = _replica_dp(_stage_entries(inp, table["w_a"], table["w_b"]), inp.U - 2, cap_a + 1, D)
    last = table["last"]  # last[a]: fewest right-GPUs with a left-GPUs
    ok = last <= cap_b
    if inp.max_gpus is not None:
        ok &= last + np.arange(cap_a + 1) <= inp.max_gpus
    if max_rate_usd_per_s < math.inf:
        with np.errstate(invalid="ignore"):  # inf GPUs x a price: not ok anyway
            rate = np.arange(cap_a + 1) * rate_a + last * rate_b
        ok &= rate <= max_rate_usd_per_s * (1 + 1e-12)
    if not ok.any():
        return False
    return len(right) < 2 or _weighted(inp, table, need, gpus, right, cap_a)


def _weighted(inp: JointInputs, table: dict, need: dict, gpus: dict, right: list[str], cap_a: int) -> bool:
    """`_weighted_right_fits` of a table, the same for every rate: asked once."""
    if table["weighted"] is None:
        table["weighted"] = _weighted_right_fits(inp, need, gpus, right, table["w_a"], cap_a)
    return table["weighted"]


def _two_resource_table(inp: JointInputs, need: dict, gpus: dict, left: list[str], right: list[str]) -> dict:
    """The rate-free part of `_two_resource_dp`, once per (GPUs-per-replica table, split): "units",
    the fewest units of D GPUs when the right resource serves no pair, else "plans", the (left,
    right) GPUs of plans of whole stages within both resources (`_priced`), and "last",
    `_replica_dp`'s last row (all inf where the prices rule every plan out; else None until a
    question that no plan settles, when `_two_resource_dp` computes it); "w_a", "w_b" the
    resources' GPUs per replica; "weighted" the answer of `_weighted_right_fits` once asked (None
    before)."""
    key = (tuple(need[g].tobytes() for g in sorted(need)), tuple(left), tuple(right))
    cache = _per_inputs_cache(inp, "two_resource")
    if key not in cache:
        none = np.full(len(_pair_layout(inp).pairs), np.inf)
        w_a = np.min([need[g] for g in left], axis=0) if left else none
        w_b = np.min([need[g] for g in right], axis=0) if right else none
        entry = {"w_a": w_a, "w_b": w_b, "units": None, "last": None, "plans": [], "weighted": None}
        cap_a = sum(gpus[g] for g in left)
        if not np.isfinite(w_b).any():
            entry["units"] = _least_units_dp(inp, w_a)
        else:
            out, entry["plans"] = _priced(inp, w_a, w_b, cap_a, sum(gpus[g] for g in right))
            if out:
                entry["last"] = np.full(cap_a + 1, np.inf)
        cache[key] = entry
    return cache[key]


def _priced(inp: JointInputs, w_a: np.ndarray, w_b: np.ndarray, cap_a: float, cap_b: float
            ) -> tuple[bool, list[tuple[float, float]]]:
    """What prices on the right resource's GPUs tell of `_replica_dp`'s fit, without it: (out,
    plans). A plan with x_i replicas of stage i on the left (w_a GPUs each) and D - x_i on the right
    (w_b each) uses A <= cap_a and B <= cap_b GPUs, so for any lam >= 0, D sum_i min(w_a, lam
    w_b)(i, n_i) <= A + lam B <= cap_a + lam cap_b, and the least left side over the block counts is
    a one-resource DP (`_price_dp`); `out` when some lam breaks it: then no plan fits. Else each
    price's least plan puts every stage wholly on its cheaper side, a plan of the DP's space:
    `plans`, the (A, B) of those within both resources, each a fit (the DP would find it). The
    prices are the ratios w_a / w_b of the pairs (TP degrees: powers of 2), where the left side
    bends, PRICES of them at most. Measured (Sailor's OPT-350M on 2 zones x (128 A100 + 128 V100),
    a search in one process): of 2,283 tables 1,176 are priced out and 616 hold such a plan; the
    prices took 0.315 s and the other 491 DPs 0.265 s, where the 1,107 DPs without plans took 0.556 s
    (on OPT-350M over 32 A100 + 96 V100, where fewer hold one: 0.131 + 0.271 -> 0.210 + 0.226 s)."""
    both = np.isfinite(w_a) & np.isfinite(w_b)
    lams = np.unique(w_a[both] / w_b[both])
    if lams.size == 0:
        return False, []
    if lams.size > PRICES:  # spread over the range
        lams = lams[np.linspace(0, lams.size - 1, PRICES).round().astype(int)]
    units, a, b = _price_dp(inp, w_a, w_b, lams)
    if (units * inp.D > (cap_a + lams * cap_b) * (1 + 1e-12)).any():
        return True, []
    return False, [(x, y) for x, y in zip(a.tolist(), b.tolist()) if x <= cap_a and y <= cap_b]


def _price_dp(inp: JointInputs, w_a: np.ndarray, w_b: np.ndarray, lams: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per price lam: the least sum over the stages of min(w_a, lam w_b)(i, n_i) over the block
    counts (`_stages_minplus`, a row per price), and the left and right GPUs (D replicas a stage, on
    its cheaper side) of the plan that reaches it."""
    L, P, D = inp.U - 2, inp.P, inp.D
    lay = _pair_layout(inp)
    left = w_a[None, :] <= lams[:, None] * w_b[None, :]  # (prices, pairs)
    least, picks = _stages_minplus(inp, np.where(left, w_a[None, :], lams[:, None] * w_b[None, :]), picks=True)
    gpus_a, gpus_b = np.zeros((len(lams), P, L + 1)), np.zeros((len(lams), P, L + 1))
    gpus_a[:, lay.stage, lay.count] = np.where(left, D * w_a[None, :], 0.0)
    gpus_b[:, lay.stage, lay.count] = np.where(left, 0.0, D * w_b[None, :])
    at = np.arange(len(lams))
    used_a, used_b, s = np.zeros(len(lams)), np.zeros(len(lams)), np.full(len(lams), L)
    for i in range(P - 1, -1, -1):  # the plan back from L blocks placed
        n = picks[i][at, s]
        used_a += gpus_a[at, i, n]
        used_b += gpus_b[at, i, n]
        s = s - n
    ok = np.isfinite(least)
    return least, np.where(ok, used_a, np.inf), np.where(ok, used_b, np.inf)


def _stages_minplus(inp: JointInputs, cost: np.ndarray, picks: bool = False) -> tuple[np.ndarray, list]:
    """The min-plus dynamic program over stages on the blocks placed, for each row of `cost` (B,
    pairs): stage i holding n blocks costs cost[., pair (i, n)] (inf: not allowed). (B,) the least
    total over the layouts of the L blocks, and with `picks`, per stage the (B, s) block count of
    the best way to s blocks placed (the read-back's), else []."""
    L, P = inp.U - 2, inp.P
    lay, N = _pair_layout(inp), L + 1
    per_stage = np.full((len(cost), P, N), np.inf)
    per_stage[:, lay.stage, lay.count] = cost
    prev = _minplus_padded_index(N)
    best = np.full((len(cost), N + 1), np.inf)  # column N stays inf (where prev points for s < n)
    best[:, 0] = 0.0
    chosen = []
    for i in range(P):
        cand = best[:, prev] + per_stage[:, i, None, :]  # (B, s, n)
        if picks:
            chosen.append(cand.argmin(axis=2))
        best[:, :N] = cand.min(axis=2)
    return best[:, L], chosen


PRICES = 7  # the most prices `_priced` tries


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
    takes w[pair (i, n)] units (inf: not allowed): `_stages_minplus` on one row (one resource, so
    no GPU axis is needed)."""
    return float(_stages_minplus(inp, w[None, :])[0][0])


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
