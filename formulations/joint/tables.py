"""Stage-cost tables of the compact (identical blocks) form: per (time class, stage, block count)
the stage time, memory fit, all-reduce and update figures, built once per outer choice with numpy
and read by the MILP rows, the bounds and the heuristics alike, plus the per-inputs caches that
keep them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs
from hetplan.formulations.joint.composition import worker_bytes

if TYPE_CHECKING:  # only `stage_sum`'s annotation names Pyomo: the bounds and heuristics run without it
    import pyomo.environ as pyo


def _per_inputs_cache(inp: JointInputs, name: str) -> dict:
    """A dict kept on these very inputs: a search asks for the same bounds and tables of one outer
    choice several times (it lives as long as the inputs do; hashing them would cost more)."""
    return inp._cache.setdefault(name, {})


def _cached_for(inp: JointInputs, name: str, make):
    """make(inp), computed once per inputs object (`_per_inputs_cache`)."""
    cache = _per_inputs_cache(inp, name)
    if name not in cache:
        cache[name] = make(inp)
    return cache[name]


# per-inputs caches that are small to send to another process and slow to recompute (the class
# tables are large and quick to rebuild; the region sub-inputs carry caches of their own)
_PORTABLE_CACHES = ("hall_theta", "bottleneck", "coverable", "extra_lb", "sum_tau", "sum_tau_prices",
                    "capped_sum_tau")


def cache_export(inp: JointInputs) -> dict:
    """The portable part of the bounds computed for these inputs (`cache_import` takes it into
    another copy of the same inputs, e.g. in another process)."""
    return {name: dict(inp._cache[name]) for name in _PORTABLE_CACHES if name in inp._cache}


def cache_import(inp: JointInputs, caches: dict) -> None:
    """Add `cache_export` of a copy of these very inputs to their caches (every entry is a function
    of the inputs alone, so both copies hold the same values for the same keys)."""
    for name, entries in caches.items():
        inp._cache.setdefault(name, {}).update(entries)


def _shared_for(inp: JointInputs, name: str, make):
    """make(inp) for a figure of the rows alone (`JointInputs.shared`), computed once for every
    outer choice that shares them (the depths P of one (b, D) in the planner)."""
    cache = _shared_cache(inp)
    if name not in cache:
        cache[name] = make(inp)
    return cache[name]


def _shared_cache(inp: JointInputs) -> dict:
    """`inp.shared` when it belongs to these very rows (the first inputs to use it record them),
    else a cache of these inputs alone: a copy made with dataclasses.replace keeps the dict, and
    with other rows it must not read what the original computed."""
    mine = inp._cache.get("shared")  # decided once per inputs (they are immutable)
    if mine is None:
        rows = (inp.pools, inp.step_s, inp.upd_s, inp.stat_bytes, inp.act_bytes, inp.cap_bytes, inp.grad_bytes)
        owner = inp.shared.setdefault("rows", rows)  # held here, so no other object can take their ids
        mine = inp._cache["shared"] = inp.shared if all(a is b for a, b in zip(owner, rows)) else {}
    return mine


def _least_tp(classes) -> dict[str, int]:
    """GPU type -> the smallest TP among these (type, TP) classes."""
    out: dict[str, int] = {}
    for g, t in classes:
        out[g] = min(out.get(g, t), t)
    return out


def blocks_identical(inp: JointInputs, rel_tol: float = 1e-9) -> bool:
    """True when units 2..U-2 (every transformer block but the first) have the same figures on every
    pool: then a stage is described by its block count alone (`stage_units`)."""
    cache = _shared_cache(inp).setdefault("identical", {})  # a figure of the rows alone (`_shared_for`)
    if rel_tol not in cache:
        cache[rel_tol] = _blocks_identical(inp, rel_tol, first=2)
    return cache[rel_tol]


def first_block_generic(inp: JointInputs) -> bool:
    """True when unit 1 (the first block) also has the figures of the others (`blocks_identical`): then
    stage 0 may hold the embedding alone, since stage 1's blocks 1..n look like any n blocks. The
    presets' blocks are alike; Sailor's profiles time the first block apart (its step and activation
    differ), so there stage 0 keeps it."""
    cache = _shared_cache(inp)  # a figure of the rows alone, as `blocks_identical`
    if "first_block_generic" not in cache:
        cache["first_block_generic"] = blocks_identical(inp) and _blocks_identical(inp, 1e-9, first=1)
    return cache["first_block_generic"]


def _blocks_identical(inp: JointInputs, rel_tol: float, first: int) -> bool:
    """Units first..U-2 alike on every pool (unit 2 the reference)."""
    if inp.U < 4:
        return False

    def same(rows) -> bool:
        arr = np.asarray(rows, dtype=float)
        ref = arr[:, 2:3]
        return bool(np.all(np.abs(arr[:, first:inp.U - 1] - ref) <= rel_tol * np.maximum(np.abs(ref), 1e-30)))

    return all(same(rows) for rows in (inp.step_s, inp.upd_s, inp.stat_bytes, inp.act_bytes, (inp.grad_bytes,)))


def block_counts(inp: JointInputs, i: int) -> range:
    """Block counts n stage i may hold in the compact form: stage 0 holds the embedding and at least
    one block unless the first block is like the others (`first_block_generic`: then possibly none),
    middle stages at least one block, the last stage the head and possibly no block."""
    L, P = inp.U - 2, inp.P
    if P == 1:
        return range(L, L + 1)
    least = [0 if first_block_generic(inp) else 1] + [1] * (P - 2) + [0]
    return range(least[i], L - (sum(least) - least[i]) + 1)


def offers_counts(inp: JointInputs, counts: list[int]) -> bool:
    """Whether stages holding `counts` blocks lie in the compact form (each count one `block_counts`
    offers its stage)."""
    return all(n in block_counts(inp, i) for i, n in enumerate(counts))


def position(inp: JointInputs, i: int) -> str:
    """Stages whose units look alike: "only" (P = 1), "first", "last" or "middle"."""
    return "only" if inp.P == 1 else ("first" if i == 0 else ("last" if i == inp.P - 1 else "middle"))


def stage_units(inp: JointInputs, i: int, n: int) -> range:
    """Units whose figures equal those of stage i holding n blocks (stage 0: the actual ones)."""
    if inp.P == 1:
        return range(0, inp.U)
    if i == 0:
        return range(0, 1 + n)
    if i == inp.P - 1:
        return range(inp.U - 1 - n, inp.U)
    first = 1 if first_block_generic(inp) else 2  # a middle stage may hold all L blocks when it may hold the first
    return range(first, first + n)


def stage_sum(m: pyo.ConcreteModel, inp: JointInputs, i: int, per_unit) -> pyo.Expression:
    """sum over the units of stage i of `per_unit[l]`, as a linear expression in either layer form."""
    if m.layers == "blocks":
        return sum(sum(per_unit[l] for l in stage_units(inp, i, n)) * m.nb[i, n]
                   for n in block_counts(inp, i) if (i, n) in m.nb)
    return sum(per_unit[l] * m.y[i, l] for l in m.L)


def time_classes(inp: JointInputs) -> list[tuple[str, int]]:
    """Pools of one GPU type and TP degree hold the same memory figures and run every unit alike but
    for the link their TP all-reduces take (a zone's fastest of the type): a class's time is the
    least of its pools' (`_make_class_tables`)."""
    return sorted({(p.gpu_type, p.tp) for p in inp.pools})


def _class_figures(inp: JointInputs) -> tuple[dict, dict]:
    """time[(r, i, n)] stage seconds per microbatch on class r, fits[(r, i, n)] memory fits a worker."""
    return _cached_for(inp, "figures", lambda inp: _class_tables(inp).as_dicts("time_s", "fits"))


@dataclass(frozen=True)
class _PairLayout:
    """Every (stage i, block count n) pair of the compact form for one (P, U), in stage order, with
    the unit range [lo, hi) of `stage_units` and the position index (0 first/only, 1 middle, 2 last)."""
    pairs: list  # [(i, n)]
    stage: np.ndarray
    count: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pos: np.ndarray
    positions: tuple  # position names by index


_LAYOUTS: dict[tuple[int, int, bool], _PairLayout] = {}


_KEYS: dict[tuple, list] = {}


def _pair_layout(inp: JointInputs) -> _PairLayout:
    """The pairs of `block_counts` and their `stage_units`, shared by every choice with this P, U and
    first block."""
    key = (inp.P, inp.U, first_block_generic(inp))
    if key not in _LAYOUTS:
        pairs = [(i, n) for i in range(inp.P) for n in block_counts(inp, i)]
        ranges = [stage_units(inp, i, n) for i, n in pairs]
        names = ("only",) if inp.P == 1 else ("first", "middle", "last")
        pos = [names.index(position(inp, i)) for i, _ in pairs]
        _LAYOUTS[key] = _PairLayout(pairs, *(np.array(v, dtype=np.int64) for v in (
            [i for i, _ in pairs], [n for _, n in pairs], [u.start for u in ranges], [u.stop for u in ranges], pos)),
            names)
    return _LAYOUTS[key]


def _table_keys(classes: list, inp: JointInputs) -> list:
    """[(r, i, n)] for every class and pair, class-major: the keys of the class dicts."""
    key = (tuple(classes), inp.P, inp.U, first_block_generic(inp))
    if key not in _KEYS:
        if len(_KEYS) > 64:  # one search needs a few per P; the lists are large and long-lived
            _KEYS.clear()
        _KEYS[key] = [(c, i, n) for c in classes for i, n in _pair_layout(inp).pairs]
    return _KEYS[key]


@dataclass(frozen=True)
class _ClassTables:
    """Per (class r, pair (i, n)) arrays (C, M) of the class figures, computed with numpy for every
    pair at once (the dict views of `_class_figures`, `_class_sync_update` and `_class_extras`
    are built from them)."""
    classes: list
    keys: list
    time_s: np.ndarray
    fits: np.ndarray
    sync_s: np.ndarray
    upd_s: np.ndarray
    # a lower bound on sync[i] + update of stage i holding n blocks when class r serves it and the
    # stage sits in one zone, so sigma + mu >= max over the plan's (stage, class) pairs (sigma >=
    # sync[i], mu >= the update of every class on every stage); inf where no zone holds D replicas
    extra_in_s: np.ndarray
    # the same for a stage that spans zones: its all-reduce is also at least the ring over the
    # inter-zone link (the model's sync_zone row), and an end stage that spans puts the tied
    # embedding across zones (ez >= span); equal to extra_in_s with one zone
    extra_span_s: np.ndarray

    def as_dicts(self, *names: str) -> tuple[dict, ...]:
        return tuple(dict(zip(self.keys, getattr(self, name).ravel().tolist())) for name in names)


def _class_tables(inp: JointInputs) -> _ClassTables:
    return _cached_for(inp, "class_tables", _make_class_tables)


def _prefix_rows(rows) -> np.ndarray:
    """(R, U + 1) running sums of each row, from 0 (cumsum adds in order, as a loop would)."""
    arr = np.asarray(rows, dtype=float)
    return np.concatenate([np.zeros((arr.shape[0], 1)), np.cumsum(arr, axis=1)], axis=1)


def _make_class_tables(inp: JointInputs) -> _ClassTables:
    lay = _pair_layout(inp)
    classes = time_classes(inp)
    members = class_pools(inp, classes)
    rep = [ks[0] for ks in members]

    def over_pairs(rows) -> np.ndarray:  # (C, M) stage sums of a per-unit figure
        pre = _prefix_rows([rows[k] for k in rep])
        return pre[:, lay.hi] - pre[:, lay.lo]

    # a class's pools share every figure but their step: a pool's TP all-reduces run on its zone's
    # fastest link (planner.inputs `_Tables.tp_link`), so the class takes the least of its pools' (seed
    # 50 of helper-12's campaign: the first pool's, a 16 GB/s zone's, put the bound 4.3 % above the optimum)
    pre = _prefix_rows(inp.step_s)
    by_pool = pre[:, lay.hi] - pre[:, lay.lo]
    time_s = np.array([by_pool[ks].min(axis=0) for ks in members])
    nf = np.array([inp.in_flight(i) for i in range(inp.P)])[lay.stage]
    cap = np.array([inp.cap_bytes[k] for k in rep])[:, None]
    fits = worker_bytes(over_pairs(inp.stat_bytes), over_pairs(inp.act_bytes), nf) <= cap
    upd_s = over_pairs(inp.upd_s) + np.array([inp.upd_fixed(k) for k in rep])[:, None]
    in_zone_s, span_s, extra_in, extra_span = class_extras_s(inp, members, upd_s)
    sync_s = np.minimum(in_zone_s, span_s)  # a floor wherever the stage sits
    return _ClassTables(classes, _table_keys(classes, inp), time_s, fits, sync_s, upd_s, extra_in, extra_span)


def class_pools(inp: JointInputs, classes: list, region: str | None = None) -> list[list[int]]:
    """Per time class (GPU type, TP) of `classes`, the indices of its pools (in `region` only, when
    given)."""
    return [[k for k, p in enumerate(inp.pools) if (p.gpu_type, p.tp) == c and region in (None, p.region)]
            for c in classes]


def class_extras_s(inp: JointInputs, members: list[list[int]], upd_s: np.ndarray) -> tuple[np.ndarray, ...]:
    """(C, M) arrays (all-reduce in one zone, all-reduce spanning zones, `_ClassTables.extra_in_s`,
    `extra_span_s`) of classes whose pools are `members` (per class, its pools; the floors are the
    least over them; with the all-reduce tables, inf for a class with none), `upd_s` their updates."""
    lay = _pair_layout(inp)
    C, M = len(members), len(lay.pairs)
    in_zone_s = span_s = np.zeros((C, M))  # without the tables (layer units that differ): no floor

    def least(grid: np.ndarray) -> np.ndarray:
        return np.stack([grid[ks].min(axis=0) if ks else np.full(M, np.inf) for ks in members])
    if inp.sync_table is not None:
        in_zone_s = span_s = least(_sync_by_pool(inp, lay, inp.sync_table))
    if inp.span_sync_table is not None:
        span_s = least(_sync_by_pool(inp, lay, inp.span_sync_table))
    ends = (lay.stage == 0) | (lay.stage == inp.P - 1)
    # an end stage pays the tied embedding's all-reduce at least at the floor of every pool serving it
    # (the MILP's tied_pool rows): per class, the least over its pools
    ends_tied = [_ends_tied_s(inp, floors) for floors in inp.tied_pool_s] or [(0.0, 0.0)] * inp.K
    tied = np.array([[min((ends_tied[k][j] for k in ks), default=0.0) for j in (0, 1)] for ks in members])
    extra_in = in_zone_s + upd_s + np.where(ends, tied[:, :1], 0.0)
    if len(inp.zones) == 1:
        extra_span = extra_in
    else:
        extra_span = span_s + upd_s + np.where(ends, tied[:, 1:], 0.0)
    return in_zone_s, span_s, extra_in, extra_span


def _sync_by_pool(inp: JointInputs, lay: _PairLayout, table: dict) -> np.ndarray:
    """(K, M) an all-reduce table's entry of every pool at every pair. The planner hands one table
    to every choice with its (D, pools, P), so the grid is kept beside the table it was read from
    (`_per_table`); rebuilding it per choice took 1.9 of 7 s on opt350-2zones-small-mincost."""
    return _per_table(table, ("sync_by_pool", inp.P, inp.U), lambda: _make_sync_by_pool(inp, lay, table))


_TABLE_FIGURES: dict[tuple, tuple] = {}


def _per_table(table: dict, what: tuple, make):
    """make(), a figure of an all-reduce table alone (and `what`), computed once per table object:
    the planner hands one table to many outer choices. The entry holds the table, so its id is not
    reused while the entry lives."""
    key = (id(table), *what)
    hit = _TABLE_FIGURES.get(key)
    if hit is None or hit[0] is not table:
        if len(_TABLE_FIGURES) > 4096:  # a search uses a few hundred; later searches bring new tables
            _TABLE_FIGURES.clear()
        hit = _TABLE_FIGURES[key] = (table, make())
    return hit[1]


def _make_sync_by_pool(inp: JointInputs, lay: _PairLayout, table: dict) -> np.ndarray:
    N = inp.U - 1
    grid = np.full((inp.K, len(lay.positions), N), np.inf)
    for (k, pos, n), v in table.items():
        if pos in lay.positions:
            grid[k, lay.positions.index(pos), n] = v
    return grid[:, lay.pos, lay.count]


def _class_extras(inp: JointInputs) -> dict:
    """extra[(r, i, n)] for the heuristics: sync[i] + update of stage i holding n blocks when class
    r serves it, in one zone (`_ClassTables.extra_in_s`), or spanning zones where no zone holds D
    replicas of it (`extra_span_s`). sync: the least of the class's pools in the all-reduce table
    (the ring over the inter-node link without one) plus, on the first and last stage, the least
    tied-embedding all-reduce floor of the class's pools the GPUs allow (`_ends_tied_s`); update:
    the class's optimizer step of those units."""
    return _cached_for(inp, "extras", _make_class_extras)


def _make_class_extras(inp: JointInputs) -> dict:
    # a class no zone holds D replicas of (inf in one zone) can only serve a stage spanning zones
    tab = _class_tables(inp)
    extra = np.where(np.isfinite(tab.extra_in_s), tab.extra_in_s, tab.extra_span_s)
    return dict(zip(tab.keys, extra.ravel().tolist()))


def _ends_tied_s(inp: JointInputs, floors: tuple[float, float, float]) -> tuple[float, float]:
    """(least tied-embedding all-reduce of the first and last stage when both sit in one zone each,
    the same when one of them spans zones) for a pool with these (node, zone, region) floors
    (`tied_pool_s`). Both ends in one zone need 2 D replicas there, both in one region 2 D
    replicas there; when no zone (region) has GPUs for that, the all-reduce crosses zones
    (regions) in every plan (ez = 1, er = 1 in the model: `ends_forced`)."""
    if inp.P <= 1:
        return 0.0, 0.0
    t_node, t_zone, t_region = floors
    # a wider placement may be the faster one: a node's PCIe (T4: 8 GB/s) below the network
    # between regions (seed 79 of a campaign with inter_region at 20 GB/s: the merged bound of
    # P3 b1 D1 was 0.0342 s against 0.0336 s for its best plan, whose ends were in two regions)
    t_zone = min(t_zone, t_region)
    t_node = min(t_node, t_zone)
    ez, er = ends_forced(inp)
    far = t_region if er else t_zone
    return (far if ez else min(t_node, far)), far


def ends_forced(inp: JointInputs) -> tuple[bool, bool]:
    """(ez, er) forced to 1: no zone (region) has GPUs for the 2 D replicas of the first and last
    stage, each type counted at its smallest TP (P > 1)."""
    if inp.P <= 1:
        return False, False
    min_tp = _least_tp(time_classes(inp))
    return (_most_replicas(_gpus_per_group(inp, "zone"), min_tp) < 2 * inp.D,
            _most_replicas(_gpus_per_group(inp, "region"), min_tp) < 2 * inp.D)


def _gpus_per_group(inp: JointInputs, attr: str) -> dict[str, dict[str, int]]:
    """zone (attr="zone") or region -> GPU type -> GPUs there."""
    def make(inp: JointInputs) -> dict:
        out: dict[str, dict[str, int]] = {}
        for p in {p.quota_key: p for p in inp.pools}.values():
            per = out.setdefault(getattr(p, attr), {})
            per[p.gpu_type] = per.get(p.gpu_type, 0) + p.avail_gpus
        return out
    return _shared_for(inp, f"gpus_per_{attr}", make)


def _most_replicas(groups: dict[str, dict[str, int]], min_tp: dict[str, int]) -> int:
    """The most replicas any one group (zone or region) holds with type g at TP min_tp[g]."""
    return max((sum(gpus[g] // t for g, t in min_tp.items() if g in gpus) for gpus in groups.values()), default=0)


def _class_sync_update(inp: JointInputs) -> tuple[dict, dict]:
    """sync[(r, i, n)]: the least all-reduce of stage i holding n blocks over the pools of class r
    (the table, or the ring over the inter-node link), tied embedding not included;
    upd[(r, i, n)]: the class's optimizer step of those units."""
    return _cached_for(inp, "sync_update", lambda inp: _class_tables(inp).as_dicts("sync_s", "upd_s"))
