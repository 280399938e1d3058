"""Operator scheduling on a heterogeneous multi-edge device graph (paper 004 sec. 3.2), as a MILP.

The operators of one or more models are placed on devices, started and ended; every data edge
that crosses devices is sent over one channel of the (multi-edge) link between them, with its own
start and end. Linear throughout, so SCIP and HiGHS both solve it. Times inside the model are in
milliseconds (better scaled than seconds for the solvers); `decode` returns seconds.

Sets
    V                operators (all models), in topological order; V_i those of model i
    I                models, weight w_i > 0
    D                devices; D_v subset of D: devices whose memory holds v's footprint alone
    E                data edges k = (u, v), size S_k bytes
    R_k              routes of edge k: (j, l, c) with j in D_u, l in D_v, j != l and c a channel of
                     the link j-l (the direction j -> l is its own resource: links are full duplex)
    P_dev            unordered pairs {u, v} not ordered by the DAG that may share a device
    P_tx             unordered edge pairs {a, b} not ordered by the DAG (a's consumer is not b's
                     producer or one of its ancestors, nor the reverse) whose routes share a direction
                     (j, l); two routes conflict when they use the same channel of that direction or
                     either channel is non-concurrent (`hetplan.formulations.opsched_replay.channels_conflict`)
Parameters
    p_vd             roofline time of v on d (004 eq. 1-2), ms
    T_kr             latency_c + S_k / bandwidth_c, ms (004 T_comm(size, l_alpha))
    f_v              footprint: Mem_op(v) + sum of Mem_data(u, v) over v's inputs, bytes (eq. 6)
    M_d              device memory, bytes
    rel_v, tail_v    longest path of minimum operator times before v / after v, ms
    H_i              horizon of model i: from an incumbent of objective G (greedy by default),
                     H_i = (G - sum_{i' != i} w_i' LB_i') / w_i, capped by the serial bound
                     sum_v max_d p_vd + sum_k max_r T_kr; LB_i = max_{v in V_i} rel_v + min_d p_vd.
                     Any optimal schedule fits inside it, so the big-M values below are valid.
Variables
    x[v, d]          binary, v runs on d
    start_ms[v], end_ms[v]                  in [rel_v, H_i - tail_v]
    route[k, j, l, c]                       binary, edge k is sent j -> l over channel c
    stay[k, d]       in [0, 1], u and v both on d (edge k needs no transfer)
    tx_start_ms[k], tx_end_ms[k]            transfer start / end (equal when the edge stays)
    before[u, v]     binary for (u, v) and (v, u) of each pair in P_dev: u ends before v starts
    tx_before[a, b]  binary for (a, b) and (b, a) of each pair in P_tx
    makespan_ms[i]   completion time of model i
Constraints
    assign[v]        sum_d x[v, d] = 1
    duration[v]      end_ms[v] = start_ms[v] + sum_d p_vd x[v, d]
    route_out[k, j]  sum_{(j, l, c) in R_k} route[k, j, l, c] + stay[k, j] = x[u, j]
    route_in[k, l]   sum_{(j, l, c) in R_k} route[k, j, l, c] + stay[k, l] = x[v, l]
                     (a transportation linearization of route = x[u, j] x[v, l]: exact for
                     binary x; a pair without a link admits no route, so u, v cannot sit there)
    tx_ready[k]      tx_start_ms[k] >= end_ms[u]                                     (eq. 5)
    tx_len[k]        tx_end_ms[k] = tx_start_ms[k] + sum_r T_kr route[k, r]
    data_ready[k]    start_ms[v] >= tx_end_ms[k]                                     (eq. 4)
    dev_order[u, v]  start_ms[v] >= end_ms[u] - Mdev_uv (1 - before[u, v])    (both orientations)
    dev_share[u,v,d] before[u, v] + before[v, u] >= x[u, d] + x[v, d] - 1
    dev_one[u, v]    before[u, v] + before[v, u] <= 1
    tx_order[a, b]   tx_start_ms[b] >= tx_end_ms[a] - Mtx_ab (1 - tx_before[a, b])
    tx_share[a,b,r]  tx_before[a, b] + tx_before[b, a] >= route[a, r] + sum_{r' in R_b conflicting r} route[b, r'] - 1
    tx_one[a, b]     tx_before[a, b] + tx_before[b, a] <= 1                            (eq. 7)
    memory[d]        sum_v f_v x[v, d] <= M_d                                          (eq. 6)
    span[i, v]       makespan_ms[i] >= end_ms[v] for the sinks v of model i
    device_load[i,d] makespan_ms[i] >= sum_{v in V_i} p_vd x[v, d]   (valid cut: a device runs
                     one operator at a time)
Objective
    minimize sum_i w_i makespan_ms[i]                                                  (eq. 3)
with Mdev_uv = ub(end_ms[u]) - lb(start_ms[v]) and Mtx_ab = ub(tx_end_ms[a]) - lb(tx_start_ms[b]),
the tightest values the variable bounds allow.

`greedy` is the warm start: HEFT list scheduling (upward-rank priority, earliest finish time over
devices, insertion into device and channel idle gaps, the earliest-finishing channel per transfer),
004 sec. 3.3's "greedy initialization". orchestration/drivers/opsched.py solves the model
(`solve_schedule`) and holds `reschedule_after_bandwidth_change`, the dynamic-bandwidth step: the old schedule re-timed under the new bandwidth versus a re-solve warm-started from it.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.errors import InfeasibleError
from hetplan.formulations.opsched_graph import Channel, DeviceGraph, OpGraph
from hetplan.formulations.opsched_replay import (
    OpSlot, Schedule, TransferSlot, channels_conflict, replay, transfer_time_s,
)

MS_PER_S = 1e3
Route = tuple[str, str, str]  # (src device, dst device, channel)


# ---- precomputed tables shared by build, greedy and decode --------------------------------------
@dataclass(frozen=True)
class Tables:
    """Everything the model, the greedy and the decoder need, computed once from the inputs."""

    ops: tuple[str, ...]  # topological order
    devices: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    model_of: dict[str, str]
    weights: dict[str, float]
    time_s: dict[tuple[str, str], float]  # (op, device) -> roofline s, allowed pairs only
    allowed: dict[str, tuple[str, ...]]  # op -> devices that can hold it
    footprint_bytes: dict[str, float]
    routes: dict[tuple[str, str], tuple[tuple[Route, float], ...]]  # edge -> ((route, time s), ...)
    channel: dict[Route, Channel]
    topo_index: dict[str, int]

    def conflicts(self, r1: Route, r2: Route) -> bool:
        """Same direction of one link and conflicting channels (the replayer's rule)."""
        return r1[:2] == r2[:2] and channels_conflict(self.channel[r1], self.channel[r2])


def tables(graph: OpGraph, devices: DeviceGraph) -> Tables:
    ops = graph.topo_order
    dev_names = tuple(devices.device_names())
    footprint = {op.name: op.mem_bytes for op in graph.operators}
    for e in graph.edges:
        footprint[e.dst] += e.size_bytes
    allowed = {}
    time_s = {}
    for v in ops:
        fits = tuple(d for d in dev_names if footprint[v] <= devices.memory_bytes(d))
        if not fits:
            raise InfeasibleError(f"memory (eq. 6): operator {v!r} needs {footprint[v]:.4g} bytes with its inputs, "
                                  f"more than any device holds")
        allowed[v] = fits
        for d in fits:
            time_s[(v, d)] = devices.op_time_s(graph.op_by_name[v], d)
    routes = {}
    channel: dict[Route, Channel] = {}
    for e in graph.edges:
        opts = []
        for j in allowed[e.src]:
            for l in allowed[e.dst]:
                if j == l:
                    continue
                for ch in devices.channels(j, l):
                    r = (j, l, ch.name)
                    channel[r] = ch
                    opts.append((r, transfer_time_s(e.size_bytes, ch)))
        key = (e.src, e.dst)
        both = footprint[e.src] + footprint[e.dst]
        if not opts and not any(both <= devices.memory_bytes(d) for d in allowed[e.dst]):
            raise InfeasibleError(f"links / memory (eq. 6): edge {key} cannot cross devices (no linked pair holds "
                                  f"its operators) and no device holds both ({both:.4g} bytes)")
        routes[key] = tuple(opts)
    return Tables(ops=ops, devices=dev_names, edges=tuple((e.src, e.dst) for e in graph.edges),
                  model_of={op.name: op.model for op in graph.operators}, weights=dict(graph.model_weights),
                  time_s=time_s, allowed=allowed, footprint_bytes=footprint, routes=routes,
                  channel=channel, topo_index={v: i for i, v in enumerate(ops)})


# ---- bounds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bounds:
    """Time windows in ms: start_ms[v] in [rel[v], horizon[i] - tail[v] - pmin[v]]."""

    pmin_ms: dict[str, float]
    rel_ms: dict[str, float]
    tail_ms: dict[str, float]
    lower_ms: dict[str, float]  # LB_i per model
    horizon_ms: dict[str, float]  # H_i per model

    def start_ub(self, t: Tables, v: str) -> float:
        return self.horizon_ms[t.model_of[v]] - self.tail_ms[v] - self.pmin_ms[v]

    def end_ub(self, t: Tables, v: str) -> float:
        return self.horizon_ms[t.model_of[v]] - self.tail_ms[v]


def bounds(graph: OpGraph, t: Tables, incumbent_objective_ms: float | None) -> Bounds:
    pmin = {v: min(t.time_s[(v, d)] for d in t.allowed[v]) * MS_PER_S for v in t.ops}
    rel: dict[str, float] = {}
    for v in t.ops:
        rel[v] = max((rel[u] + pmin[u] for u in graph.preds[v]), default=0.0)
    tail: dict[str, float] = {}
    for v in reversed(t.ops):
        tail[v] = max((pmin[w] + tail[w] for w in graph.succs[v]), default=0.0)
    lower = {m: 0.0 for m in t.weights}
    for v in t.ops:
        lower[t.model_of[v]] = max(lower[t.model_of[v]], rel[v] + pmin[v])
    serial = sum(max(t.time_s[(v, d)] for d in t.allowed[v]) for v in t.ops) * MS_PER_S
    serial += sum(max((tt for _, tt in t.routes[k]), default=0.0) for k in t.edges) * MS_PER_S
    horizon = {}
    for m, w in t.weights.items():
        h = serial
        if incumbent_objective_ms is not None:
            rest = sum(t.weights[o] * lower[o] for o in t.weights if o != m)
            h = min(h, (incumbent_objective_ms - rest) / w)
        # a little slack so the incumbent itself stays feasible after rounding
        horizon[m] = max(h, lower[m]) * (1 + 1e-7) + 1e-9
    return Bounds(pmin, rel, tail, lower, horizon)


# ---- the model -----------------------------------------------------------------------------------
def build(graph: OpGraph, devices: DeviceGraph, incumbent: Schedule | None = None) -> pyo.ConcreteModel:
    """The MILP of the module docstring. `incumbent` (default: the greedy schedule) sets the
    horizon and hence every big-M; it is kept on the model as `model.opsched_incumbent`."""
    t0 = time.perf_counter()
    t = tables(graph, devices)
    if incumbent is None:
        incumbent = greedy(graph, devices, t)
    replayed = replay(incumbent, graph, devices)  # its earliest timing: it then fits the horizon
    incumbent, inc_obj_ms = replayed.schedule, replayed.objective_s * MS_PER_S
    bd = bounds(graph, t, inc_obj_ms)
    m = pyo.ConcreteModel(name="opsched")
    _variables(m, graph, t, bd)
    _assignment_constraints(m, graph, t, devices)
    _timing_constraints(m, graph, t)
    _device_order(m, graph, t, bd)
    _transfer_order(m, graph, t, bd)
    _objective(m, graph, t)
    m.opsched_tables = t
    m.opsched_bounds = bd
    m.opsched_graph = graph
    m.opsched_devices = devices
    m.opsched_incumbent = incumbent
    m.opsched_build_s = time.perf_counter() - t0
    return m


def _variables(m: pyo.ConcreteModel, graph: OpGraph, t: Tables, bd: Bounds) -> None:
    m.x = pyo.Var([(v, d) for v in t.ops for d in t.allowed[v]], domain=pyo.Binary)
    m.start_ms = pyo.Var(list(t.ops), bounds=lambda _, v: (bd.rel_ms[v], bd.start_ub(t, v)))
    m.end_ms = pyo.Var(list(t.ops), bounds=lambda _, v: (bd.rel_ms[v] + bd.pmin_ms[v], bd.end_ub(t, v)))
    m.route = pyo.Var([(u, v, *r) for (u, v) in t.edges for r, _ in t.routes[(u, v)]], domain=pyo.Binary)
    m.stay = pyo.Var([(u, v, d) for (u, v) in t.edges for d in t.allowed[u] if d in t.allowed[v]], bounds=(0, 1))

    def tx_bounds(_, u, v):
        return bd.rel_ms[u] + bd.pmin_ms[u], bd.start_ub(t, v)

    m.tx_start_ms = pyo.Var(list(t.edges), bounds=tx_bounds)
    m.tx_end_ms = pyo.Var(list(t.edges), bounds=tx_bounds)
    m.makespan_ms = pyo.Var(list(t.weights), bounds=lambda _, i: (bd.lower_ms[i], bd.horizon_ms[i]))


def _assignment_constraints(m: pyo.ConcreteModel, graph: OpGraph, t: Tables, devices: DeviceGraph) -> None:
    m.assign = pyo.Constraint(list(t.ops), rule=lambda m, v: sum(m.x[v, d] for d in t.allowed[v]) == 1)
    out_routes: dict[tuple, list] = defaultdict(list)
    in_routes: dict[tuple, list] = defaultdict(list)
    for (u, v) in t.edges:
        for r, _ in t.routes[(u, v)]:
            out_routes[(u, v, r[0])].append(m.route[u, v, *r])
            in_routes[(u, v, r[1])].append(m.route[u, v, *r])

    def stay(u, v, d):
        return m.stay[u, v, d] if (u, v, d) in m.stay else 0

    m.route_out = pyo.Constraint(
        [(u, v, j) for (u, v) in t.edges for j in t.allowed[u]],
        rule=lambda m, u, v, j: sum(out_routes[(u, v, j)]) + stay(u, v, j) == m.x[u, j])
    m.route_in = pyo.Constraint(
        [(u, v, l) for (u, v) in t.edges for l in t.allowed[v]],
        rule=lambda m, u, v, l: sum(in_routes[(u, v, l)]) + stay(u, v, l) == m.x[v, l])
    binding = [d for d in t.devices
               if sum(t.footprint_bytes[v] for v in t.ops if d in t.allowed[v]) > devices.memory_bytes(d)]
    m.memory = pyo.Constraint(binding, rule=lambda m, d: sum(
        t.footprint_bytes[v] / 1e9 * m.x[v, d] for v in t.ops if d in t.allowed[v]) <= devices.memory_bytes(d) / 1e9)


def _timing_constraints(m: pyo.ConcreteModel, graph: OpGraph, t: Tables) -> None:
    m.duration = pyo.Constraint(list(t.ops), rule=lambda m, v: m.end_ms[v] == m.start_ms[v] + sum(
        t.time_s[(v, d)] * MS_PER_S * m.x[v, d] for d in t.allowed[v]))
    m.tx_ready = pyo.Constraint(list(t.edges), rule=lambda m, u, v: m.tx_start_ms[u, v] >= m.end_ms[u])
    m.tx_len = pyo.Constraint(list(t.edges), rule=lambda m, u, v: m.tx_end_ms[u, v] == m.tx_start_ms[u, v] + sum(
        tt * MS_PER_S * m.route[u, v, *r] for r, tt in t.routes[(u, v)]))
    m.data_ready = pyo.Constraint(list(t.edges), rule=lambda m, u, v: m.start_ms[v] >= m.tx_end_ms[u, v])


def device_pairs(graph: OpGraph, t: Tables) -> list[tuple[str, str]]:
    """P_dev: unordered operator pairs not ordered by the DAG that may share a device."""
    out = []
    for i, u in enumerate(t.ops):
        for v in t.ops[i + 1:]:
            if not graph.related(u, v) and set(t.allowed[u]) & set(t.allowed[v]):
                out.append((u, v))
    return out


def transfer_pairs(graph: OpGraph, t: Tables) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """P_tx: unordered edge pairs whose transfers may overlap on conflicting routes. Two edges that
    can use the same direction of a link can always collide there (on one channel), so the test
    is a shared direction."""
    directions = {k: {r[:2] for r, _ in t.routes[k]} for k in t.edges}
    out = []
    for i, a in enumerate(t.edges):
        for b in t.edges[i + 1:]:
            if directions[a] & directions[b] and not _edges_ordered(graph, a, b):
                out.append((a, b))
    return out


def _edges_ordered(graph: OpGraph, a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Transfer a ends before b can start when a's consumer is b's producer or precedes it."""
    return (a[1] == b[0] or b[0] in graph.descendants[a[1]]
            or b[1] == a[0] or a[0] in graph.descendants[b[1]])


def _device_order(m: pyo.ConcreteModel, graph: OpGraph, t: Tables, bd: Bounds) -> None:
    pairs = device_pairs(graph, t)
    m.before = pyo.Var([(u, v) for u, v in pairs] + [(v, u) for u, v in pairs], domain=pyo.Binary)

    def big_m(u, v):
        return max(0.0, bd.end_ub(t, u) - bd.rel_ms[v])

    m.dev_order = pyo.Constraint(list(m.before.index_set()), rule=lambda m, u, v: (
        m.start_ms[v] >= m.end_ms[u] - big_m(u, v) * (1 - m.before[u, v])))
    m.dev_share = pyo.Constraint(
        [(u, v, d) for u, v in pairs for d in t.allowed[u] if d in t.allowed[v]],
        rule=lambda m, u, v, d: m.before[u, v] + m.before[v, u] >= m.x[u, d] + m.x[v, d] - 1)
    m.dev_one = pyo.Constraint(pairs, rule=lambda m, u, v: m.before[u, v] + m.before[v, u] <= 1)


def _transfer_order(m: pyo.ConcreteModel, graph: OpGraph, t: Tables, bd: Bounds) -> None:
    pairs = transfer_pairs(graph, t)
    keys = [(*a, *b) for a, b in pairs] + [(*b, *a) for a, b in pairs]
    m.tx_before = pyo.Var(keys, domain=pyo.Binary)

    def big_m(u1, v1, u2, v2):
        return max(0.0, bd.start_ub(t, v1) - (bd.rel_ms[u2] + bd.pmin_ms[u2]))

    m.tx_order = pyo.Constraint(keys, rule=lambda m, u1, v1, u2, v2: (
        m.tx_start_ms[u2, v2] >= m.tx_end_ms[u1, v1] - big_m(u1, v1, u2, v2) * (1 - m.tx_before[u1, v1, u2, v2])))
    by_direction: dict[tuple[str, str], dict[tuple[str, str], list[Route]]] = {}
    for k in t.edges:
        groups: dict[tuple[str, str], list[Route]] = defaultdict(list)
        for r, _ in t.routes[k]:
            groups[r[:2]].append(r)
        by_direction[k] = groups
    share = []
    for a, b in pairs:
        for direction in by_direction[a].keys() & by_direction[b].keys():
            for r1 in by_direction[a][direction]:
                partners = [r2 for r2 in by_direction[b][direction] if t.conflicts(r1, r2)]
                share.append((a, b, r1, partners))
    m.tx_share = pyo.Constraint(range(len(share)), rule=lambda m, i: (
        m.tx_before[(*share[i][0], *share[i][1])] + m.tx_before[(*share[i][1], *share[i][0])]
        >= m.route[(*share[i][0], *share[i][2])] + sum(m.route[(*share[i][1], *r2)] for r2 in share[i][3]) - 1))
    m.tx_one = pyo.Constraint(range(len(pairs)), rule=lambda m, i: (
        m.tx_before[(*pairs[i][0], *pairs[i][1])] + m.tx_before[(*pairs[i][1], *pairs[i][0])] <= 1))


def _objective(m: pyo.ConcreteModel, graph: OpGraph, t: Tables) -> None:
    m.span = pyo.Constraint([(i, v) for i in t.weights for v in graph.sinks(i)],
                            rule=lambda m, i, v: m.makespan_ms[i] >= m.end_ms[v])
    m.device_load = pyo.Constraint([(i, d) for i in t.weights for d in t.devices], rule=lambda m, i, d: (
        m.makespan_ms[i] >= sum(t.time_s[(v, d)] * MS_PER_S * m.x[v, d]
                                for v in t.ops if t.model_of[v] == i and d in t.allowed[v])))
    m.objective = pyo.Objective(expr=sum(w * m.makespan_ms[i] for i, w in t.weights.items()), sense=pyo.minimize)


# ---- decode and warm start ------------------------------------------------------------------------
def decode(model: pyo.ConcreteModel) -> Schedule:
    """The schedule held by the model's variables (after a solve), times in seconds."""
    t: Tables = model.opsched_tables
    ops = {}
    for v in t.ops:
        d = max(t.allowed[v], key=lambda d: pyo.value(model.x[v, d], exception=False) or 0.0)
        ops[v] = OpSlot(d, pyo.value(model.start_ms[v]) / MS_PER_S, pyo.value(model.end_ms[v]) / MS_PER_S)
    transfers = {}
    for (u, v) in t.edges:
        if ops[u].device == ops[v].device:
            continue
        cands = [r for r, _ in t.routes[(u, v)] if r[:2] == (ops[u].device, ops[v].device)]
        r = max(cands, key=lambda r: pyo.value(model.route[u, v, *r], exception=False) or 0.0)
        transfers[(u, v)] = TransferSlot(r[0], r[1], r[2], pyo.value(model.tx_start_ms[u, v]) / MS_PER_S,
                                         pyo.value(model.tx_end_ms[u, v]) / MS_PER_S)
    return Schedule(ops, transfers)


def warm_start_values(model: pyo.ConcreteModel, schedule: Schedule) -> ComponentMap:
    """A complete variable assignment reproducing `schedule` (which must fit the model's horizon),
    as a ComponentMap var -> value (Pyomo variables are not hashable)."""
    t: Tables = model.opsched_tables
    dev = schedule.assignment()
    key = {v: (schedule.ops[v].start_s, t.topo_index[v]) for v in t.ops}
    vals = ComponentMap()
    for (v, d) in model.x:
        vals[model.x[v, d]] = 1.0 if dev[v] == d else 0.0
    for v in t.ops:
        start = schedule.ops[v].start_s * MS_PER_S
        vals[model.start_ms[v]] = start
        vals[model.end_ms[v]] = start + t.time_s[(v, dev[v])] * MS_PER_S
    end_ms = {v: vals[model.end_ms[v]] for v in t.ops}
    chosen = schedule.channel_choice()
    for idx in model.route:
        vals[model.route[idx]] = 1.0 if chosen.get(idx[:2]) == tuple(idx[2:]) else 0.0
    for (u, v, d) in model.stay:
        vals[model.stay[u, v, d]] = 1.0 if dev[u] == dev[v] == d else 0.0
    for (u, v) in t.edges:
        tr = schedule.transfers.get((u, v))
        if tr is None:
            vals[model.tx_start_ms[u, v]] = vals[model.tx_end_ms[u, v]] = end_ms[u]
        else:
            length = dict(t.routes[(u, v)])[chosen[(u, v)]] * MS_PER_S
            vals[model.tx_start_ms[u, v]] = max(tr.start_s * MS_PER_S, end_ms[u])
            vals[model.tx_end_ms[u, v]] = vals[model.tx_start_ms[u, v]] + length
    for (u, v) in model.before:
        vals[model.before[u, v]] = 1.0 if dev[u] == dev[v] and key[u] < key[v] else 0.0
    for (u1, v1, u2, v2) in model.tx_before:
        a, b = chosen.get((u1, v1)), chosen.get((u2, v2))
        clash = a is not None and b is not None and t.conflicts(a, b)
        first = clash and (schedule.transfers[(u1, v1)].start_s, t.topo_index[u1], t.topo_index[v1]) < (
            schedule.transfers[(u2, v2)].start_s, t.topo_index[u2], t.topo_index[v2])
        vals[model.tx_before[u1, v1, u2, v2]] = 1.0 if first else 0.0
    for i in t.weights:
        last = max(end_ms[v] for v in t.ops if t.model_of[v] == i)
        vals[model.makespan_ms[i]] = max(last, model.makespan_ms[i].lb)
    return vals


# ---- greedy: HEFT list scheduling ----------------------------------------------------------------
def _earliest_gap(busy: Sequence[tuple[float, float]], ready: float, length: float) -> float:
    """Earliest t >= ready such that [t, t + length) overlaps none of the busy intervals."""
    t = ready
    for s, e in sorted(busy):
        if e <= t:
            continue
        if t + length <= s:
            break
        t = max(t, e)
    return t


def upward_rank(graph: OpGraph, t: Tables) -> dict[str, float]:
    """HEFT upward rank: mean execution time plus the longest mean-cost path to a sink."""
    mean_p = {v: sum(t.time_s[(v, d)] for d in t.allowed[v]) / len(t.allowed[v]) for v in t.ops}
    mean_c = {k: (sum(tt for _, tt in t.routes[k]) / len(t.routes[k]) if t.routes[k] else 0.0) for k in t.edges}
    rank: dict[str, float] = {}
    for v in reversed(t.ops):
        rank[v] = mean_p[v] + max((mean_c[(v, w)] + rank[w] for w in graph.succs[v]), default=0.0)
    return rank


def _list_schedule(graph: OpGraph, devices: DeviceGraph, t: Tables, priority: Mapping[str, float],
                   fixed: Mapping[str, str] | None = None) -> Schedule | None:
    """List scheduling in priority order (must be topological); `fixed` pins operators to devices."""
    order = sorted(t.ops, key=lambda v: (-priority[v], t.topo_index[v]))
    dev_busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    route_busy: dict[Route, list[tuple[float, float]]] = defaultdict(list)
    mem_used: dict[str, float] = defaultdict(float)
    ops: dict[str, OpSlot] = {}
    transfers: dict[tuple[str, str], TransferSlot] = {}
    for v in order:
        best = None
        for d in ((fixed[v],) if fixed else t.allowed[v]):
            if mem_used[d] + t.footprint_bytes[v] > devices.memory_bytes(d):
                continue
            cand = _try_device(graph, t, v, d, ops, dev_busy, route_busy)
            if cand is not None and (best is None or cand[0] < best[0] - 1e-15):
                best = cand
        if best is None:
            return None
        finish, d, start, booked = best
        ops[v] = OpSlot(d, start, finish)
        dev_busy[d].append((start, finish))
        mem_used[d] += t.footprint_bytes[v]
        for k, (r, s, e) in booked.items():
            transfers[k] = TransferSlot(r[0], r[1], r[2], s, e)
            route_busy[r].append((s, e))
    return Schedule(ops, transfers)


def _try_device(graph: OpGraph, t: Tables, v: str, d: str, ops: Mapping[str, OpSlot],
                dev_busy: Mapping[str, list], route_busy: Mapping[Route, list]):
    """Earliest finish of v on d, booking each input's transfer on its earliest-finishing channel."""
    ready = 0.0
    booked: dict[tuple[str, str], tuple[Route, float, float]] = {}
    tentative: dict[Route, list[tuple[float, float]]] = defaultdict(list)
    for u in sorted(graph.preds[v], key=lambda u: ops[u].end_s):
        src = ops[u].device
        if src == d:
            ready = max(ready, ops[u].end_s)
            continue
        best = None
        for r, tt in t.routes[(u, v)]:
            if r[:2] != (src, d):
                continue
            busy = [iv for r2 in set(route_busy) | set(tentative) if t.conflicts(r, r2)
                    for iv in (*route_busy.get(r2, ()), *tentative.get(r2, ()))]
            s = _earliest_gap(busy, ops[u].end_s, tt)
            if best is None or s + tt < best[2] - 1e-15:
                best = (r, s, s + tt)
        if best is None:
            return None  # no link between the two devices
        booked[(u, v)] = best
        tentative[best[0]].append((best[1], best[2]))
        ready = max(ready, best[2])
    p = t.time_s[(v, d)]
    start = _earliest_gap(dev_busy.get(d, ()), ready, p)
    return start + p, d, start, booked


def greedy(graph: OpGraph, devices: DeviceGraph, t: Tables | None = None) -> Schedule:
    """HEFT warm start; with several models, also ranks weighted by model weight, keeping the best."""
    t = t or tables(graph, devices)
    rank = upward_rank(graph, t)
    priorities = [rank]
    if len(t.weights) > 1:
        priorities.append({v: rank[v] * t.weights[t.model_of[v]] for v in t.ops})
    best, best_obj = None, float("inf")
    for prio in priorities:
        sched = _list_schedule(graph, devices, t, prio)
        if sched is not None and sched.objective_s(graph) < best_obj:
            best, best_obj = sched, sched.objective_s(graph)
    if best is None:
        raise InfeasibleError("memory (eq. 6): the greedy placement ran out of device memory or links; "
                              "the instance may still be feasible, give an incumbent schedule to build()")
    return best


def repair(graph: OpGraph, devices: DeviceGraph, schedule: Schedule) -> Schedule | None:
    """Keep a schedule's assignment, list-schedule its operators again in their old start order on
    `devices`, re-choosing every transfer's channel (e.g. around a channel whose bandwidth dropped);
    None if the assignment no longer fits."""
    t = tables(graph, devices)
    if any(schedule.ops[v].device not in t.allowed[v] for v in t.ops):
        return None
    priority = {v: -schedule.ops[v].start_s for v in t.ops}  # earlier start first: topological
    return _list_schedule(graph, devices, t, priority, fixed=schedule.assignment())


@dataclass(frozen=True)
class WarmStart:
    schedule: Schedule
    values: ComponentMap  # var -> value
    objective_s: float


def greedy_warm_start(model: pyo.ConcreteModel) -> WarmStart:
    """The model's incumbent (the greedy schedule unless build() got another) as a schedule and as
    a variable assignment for `hetplan.solvers.solve(..., warm_start=...)`."""
    sched = model.opsched_incumbent
    return WarmStart(sched, warm_start_values(model, sched), sched.objective_s(model.opsched_graph))


