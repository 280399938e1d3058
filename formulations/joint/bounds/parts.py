"""Lower bounds on the parts of an iteration that every other bound composes: the transfer
floors (c_node, the links, Sailor's sends and receives per class), the all-reduce and the update
(sigma, mu, and `extra_lower_bound_s` on their sum), the upper bound on T for big-M, the rate of
the GPUs, and the small helpers the bounds share (the restriction of the inputs to one region,
the first true of a monotone predicate). Each public function states its bound and why it holds."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import replace
from typing import Iterator

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, check_deadline, model_coef
from hetplan.formulations.joint.composition import (first_stage_sends, iteration_time_s, replica_rate_usd_per_s,
    worker_bytes)
from hetplan.formulations.joint.tables import (_cached_for, _class_tables, _gpus_per_group, _most_replicas,
    _pair_layout, _per_table, _shared_for, block_counts, blocks_identical, class_extras_s, class_pools)


def time_upper_bound_s(inp: JointInputs) -> float:
    """T for the slowest imaginable assignment: a valid upper bound for the big-M on T."""
    worst_step = sum(max(inp.step_s[k][l] for k in range(inp.K)) for l in range(inp.U))
    tables = [inp.sync_table or {}, inp.span_sync_table or {}, inp.repeat_sync_table or {}]
    worst_sync = max([model_coef(v) for tab in tables for v in tab.values()] + [0.0]) + inp.tied_worst_s
    worst_c = (max(inp.p2p_s(link) for link in (inp.node, inp.zone, inp.region)) * max(inp.P - 1, 0)
               + 2 * max([*inp.send_floor_s, *(v for row in inp.send_away_s for v in row)], default=0.0)
               * inp.P)  # Sailor's sends: each <= c / 2 + its largest floor
    worst_upd = sum(max(inp.upd_s[k][l] for k in range(inp.K)) for l in range(inp.U)) + max(inp.upd_fixed_s, default=0.0)
    return (inp.m + inp.P - 1) * (worst_step + worst_c) + worst_sync + worst_upd


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


def _gpus_per_type(inp: JointInputs) -> dict[str, int]:
    """GPU type -> GPUs available over all its zones (pools of one quota share its GPUs)."""
    return _shared_for(inp, "gpus", _make_gpus_per_type)


def _make_gpus_per_type(inp: JointInputs) -> dict[str, int]:
    gpus: dict[str, int] = {}
    for per_type in _gpus_per_group(inp, "zone").values():
        for g, n in per_type.items():
            gpus[g] = gpus.get(g, 0) + n
    return gpus


def _replicas(gpus: dict[str, int], min_tp: dict[str, int], max_gpus: int | None) -> int:
    budget = max_gpus if max_gpus is not None else math.inf
    count = 0
    for t, g in sorted((t, g) for g, t in min_tp.items()):  # smallest TP first: most replicas under a cap
        take = int(min(gpus[g] // t, budget // t))
        count, budget = count + take, budget - take * t
    return count


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


def _gpu_rate_usd_per_s(inp: JointInputs, types: list[str]) -> float:
    """The least USD per second of one GPU of any of `types` (inf for none)."""
    return min((replica_rate_usd_per_s(p) / p.tp for p in inp.pools if p.gpu_type in types), default=math.inf)


def send_aware_applies(inp: JointInputs) -> bool:
    """Whether `sailor_send_aware_time_bound_s` bounds the choice (Sailor's composition, a
    pipeline, blocks form), and so whether the strong bound starts with it at a target."""
    return inp.sailor and inp.P > 1 and blocks_identical(inp)


def _extra_values_s(inp: JointInputs) -> np.ndarray:
    """The distinct finite all-reduce + update values of the class tables (`_ClassTables.extra_in_s`
    and `extra_span_s`; inf: a placement that does not exist) and, with several regions, of each
    region's (`_region_extras_s`), ascending: the caps the cells of `sync_aware_time_bound_s` and
    `_send_aware_cells` are cut at. A plan's largest all-reduce + update value, each stage's taken
    in its own region, is one of them: its cell's cap admits it in the regions' test too."""
    def make(inp: JointInputs) -> np.ndarray:
        tab = _class_tables(inp)
        per_region = [] if len(inp.regions) < 2 else [
            a.ravel() for pair in _region_extras_s(inp).values() for a in pair]
        caps = np.unique(np.concatenate([tab.extra_in_s.ravel(), tab.extra_span_s.ravel(), *per_region]))
        return caps[np.isfinite(caps)]
    return _cached_for(inp, "extra_values", make)


def _region_extras_s(inp: JointInputs) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Region index -> (C, M) all-reduce + update floors of a stage in that region, in one zone and
    spanning zones (`_ClassTables.extra_in_s`, `extra_span_s`), each the least over the class's
    pools in the region: a stage's pools lie in its region (H5), and its all-reduce is at least
    the floor of every pool it uses. The class tables take the least over every region (measured:
    Sailor's OPT-350M on 64 + 64 A100 in two regions, P3 b2 D32, a last stage of TP 1 with 5 blocks:
    0.5501 s in us-central1, 0.5843 s in us-west1; the least let `_regions_fit` place it in us-west1
    under a cap of 0.5501 s, in a plan whose all-reduce there takes 0.5813 s)."""
    def make(inp: JointInputs) -> dict:
        tab = _class_tables(inp)
        out = {}
        for j, region in enumerate(inp.regions):
            out[j] = class_extras_s(inp, class_pools(inp, tab.classes, region), tab.upd_s)[2:]
        return out
    return _cached_for(inp, "region_extras", make)


def _spread(values: np.ndarray, count: int) -> list[float]:
    """At most `count` of the ascending `values`, evenly spread over their indices (first and last
    included): the grid of a cell split."""
    return np.unique(values[np.linspace(0, values.size - 1, min(count, values.size)).round().astype(int)]).tolist()


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
    return np.array([min((per_pool(k) for k in ks), default=math.inf)
                     for ks in class_pools(inp, _class_tables(inp).classes, region)])


def _sailor_class_receives_s(inp: JointInputs) -> np.ndarray:
    """(C,): the least receive floor of class c's pools (what a send to a stage that c serves takes
    at least)."""
    return _send_figures(inp)[2]


def _region_inputs(inp: JointInputs) -> dict[str, "JointInputs"]:
    """region -> these inputs with only the pools of that region (cached: their own bound caches
    live as long as these inputs)."""
    return _cached_for(inp, "regions", lambda inp: {r: in_region(inp, r) for r in inp.regions})


def in_region(inp: JointInputs, region: str) -> JointInputs:
    """The same outer choice with only `region`'s pools: every [k] row and the all-reduce tables
    re-indexed (tests/test_cost_model_agreement.py checks that no [k] field is left out: a
    tied_pool_s left whole once put another region's floors on these pools, and the bound of a
    choice rose above its optimum)."""
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
                   tied_pool_s=pick(inp.tied_pool_s) if inp.tied_pool_s else (),
                   tied_pair_s={(new_index[k], new_index[k2]): v for (k, k2), v in inp.tied_pair_s.items()
                                if k in new_index and k2 in new_index} or None if inp.tied_pair_s else None,
                   stat_bytes=pick(inp.stat_bytes), act_bytes=pick(inp.act_bytes), cap_bytes=pick(inp.cap_bytes),
                   sync_table=table(inp.sync_table), span_sync_table=table(inp.span_sync_table),
                   repeat_sync_table=table(inp.repeat_sync_table))


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


@functools.lru_cache(maxsize=16)
def _minplus_padded_index(N: int) -> np.ndarray:
    """prev[s, n] = s - n where s >= n, else N: one stage's min-plus step as a gather from a table
    whose row N is inf (no mask needed). Cached: callers only read it."""
    s_idx, n_idx = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    out = np.where(s_idx >= n_idx, s_idx - n_idx, N)
    out.setflags(write=False)
    return out


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


def rate_lower_bound_usd_per_s(inp: JointInputs) -> float:
    """rate >= P D x the cheapest replica's USD per second (every stage has D replicas)."""
    return inp.P * inp.D * min(replica_rate_usd_per_s(p) for p in inp.pools)
