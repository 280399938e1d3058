"""Discrete-event replay and validation of operator schedules on a multi-edge device graph.

A *schedule* (paper 004, sec. 3.2.2) places every operator on a device with a start and end time,
and sends every cross-device data dependency (u, v) over one channel of the link between the two
devices, with its own start and end time. This module

* `check(...)` verifies a timed schedule against every constraint of 004 sec. 3.2.4 and returns the
  violations (an empty list means feasible):
  - durations: an operator lasts at least its execution time on its device, a transfer at least
    latency + bytes / bandwidth of its channel;
  - data dependency (eq. 4): v starts after u ends and after the transfer (u, v) ends;
  - communication precedence (eq. 5): the transfer (u, v) starts after u ends;
  - device exclusivity: two operators on one device never overlap;
  - channel exclusivity (eq. 7 with one transfer at full rate per channel): two transfers on the
    same channel of the same direction never overlap, and a channel marked non-concurrent never
    overlaps any sibling channel of its link in that direction;
  - memory (eq. 6): resident bytes of the operators on a device, plus the bytes of their inputs
    (Mem_data(u, v) is held on the consumer's device), fit the device;
  - the channel exists between the two devices.
* `replay(...)` keeps a schedule's decisions (assignment, channel per transfer, the order of the
  operators on each device and of conflicting transfers) and re-times it: every item starts as soon
  as its predecessors (data, and the previous item on each resource it holds) have finished. This
  is the earliest (semi-active) timing of that order, so it is used to score solver output exactly
  and to evaluate a kept schedule after a bandwidth change (the device graph carries the new
  bandwidths, or `bandwidth_GBps` overrides them per channel).

Links are full duplex: bandwidths are per direction (as `hetplan.catalog.LinkSpec`), so the two
directions of one channel are separate resources. A transfer occupies only its channel, not the
devices' compute. Times are seconds, sizes bytes, bandwidths GB/s (1e9 bytes per second).

The replayer lives in the core package because it is a simulator; it reads the operator graph and
the device graph through the small protocols below, so it imports nothing from `formulations`.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, Sequence

from hetplan.errors import PlanError

EdgeKey = tuple[str, str]  # (source operator, destination operator)
ChannelKey = tuple[str, str, str]  # (device a, device b, channel name); either device order


# ---- what the replayer reads ------------------------------------------------------------------
class OperatorLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def mem_bytes(self) -> float: ...


class DataEdgeLike(Protocol):
    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def size_bytes(self) -> float: ...


class OpGraphLike(Protocol):
    @property
    def operators(self) -> Sequence[OperatorLike]: ...
    @property
    def edges(self) -> Sequence[DataEdgeLike]: ...
    @property
    def model_weights(self) -> Mapping[str, float]: ...


class ChannelLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def bandwidth_GBps(self) -> float: ...
    @property
    def latency_s(self) -> float: ...
    @property
    def concurrent(self) -> bool: ...


class DeviceGraphLike(Protocol):
    def device_names(self) -> Sequence[str]: ...
    def memory_bytes(self, device: str) -> float: ...
    def op_time_s(self, op: OperatorLike, device: str) -> float: ...
    def channels(self, src: str, dst: str) -> Sequence[ChannelLike]: ...


# ---- the schedule -------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpSlot:
    device: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class TransferSlot:
    """Data of one dependency sent from `src_device` to `dst_device` over channel `channel`."""

    src_device: str
    dst_device: str
    channel: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Schedule:
    """Operator slots by name; transfer slots by (src op, dst op) for cross-device edges only."""

    ops: Mapping[str, OpSlot]
    transfers: Mapping[EdgeKey, TransferSlot] = field(default_factory=dict)

    def assignment(self) -> dict[str, str]:
        return {name: slot.device for name, slot in self.ops.items()}

    def channel_choice(self) -> dict[EdgeKey, tuple[str, str, str]]:
        return {k: (t.src_device, t.dst_device, t.channel) for k, t in self.transfers.items()}

    def makespans_s(self, graph: OpGraphLike) -> dict[str, float]:
        """Completion time of each model: its last operator's end (004 eq. 3)."""
        out: dict[str, float] = {m: 0.0 for m in graph.model_weights}
        for op in graph.operators:
            out[op.model] = max(out[op.model], self.ops[op.name].end_s)
        return out

    def objective_s(self, graph: OpGraphLike) -> float:
        """Weighted sum of model makespans (004 eq. 3)."""
        spans = self.makespans_s(graph)
        return sum(graph.model_weights[m] * t for m, t in spans.items())


@dataclass(frozen=True)
class Violation:
    kind: str  # duration | dependency | device_overlap | channel_overlap | memory | link | missing
    message: str


def transfer_time_s(size_bytes: float, channel: ChannelLike, bandwidth_GBps: float | None = None) -> float:
    """alpha-beta time of one transfer over one channel (004 sec. 3.2.1, T_comm(size, l_alpha))."""
    bandwidth = channel.bandwidth_GBps if bandwidth_GBps is None else bandwidth_GBps
    return channel.latency_s + size_bytes / (bandwidth * 1e9)


def channels_conflict(a: ChannelLike, b: ChannelLike) -> bool:
    """Two channels of one link and direction conflict when they are the same channel or when
    either of them cannot run concurrently with its siblings (004 sec. 3.1: NVLink and PCIe)."""
    return a.name == b.name or not (a.concurrent and b.concurrent)


def _channel(devices: DeviceGraphLike, src: str, dst: str, name: str) -> ChannelLike | None:
    for ch in devices.channels(src, dst):
        if ch.name == name:
            return ch
    return None


def _bandwidth(overrides: Mapping[ChannelKey, float] | None, src: str, dst: str, name: str) -> float | None:
    if not overrides:
        return None
    return overrides.get((src, dst, name), overrides.get((dst, src, name)))


def _overlap(a0: float, a1: float, b0: float, b1: float, tol: float) -> bool:
    return min(a1, b1) - max(a0, b0) > tol


# ---- structural checks shared by check() and replay() -----------------------------------------
def _structure_violations(schedule: Schedule, graph: OpGraphLike, devices: DeviceGraphLike) -> list[Violation]:
    out: list[Violation] = []
    known_devices = set(devices.device_names())
    for op in graph.operators:
        slot = schedule.ops.get(op.name)
        if slot is None:
            out.append(Violation("missing", f"operator {op.name!r} has no slot"))
        elif slot.device not in known_devices:
            out.append(Violation("missing", f"operator {op.name!r} is on unknown device {slot.device!r}"))
    if out:
        return out
    edge_keys = set()
    for edge in graph.edges:
        key = (edge.src, edge.dst)
        edge_keys.add(key)
        a, b = schedule.ops[edge.src].device, schedule.ops[edge.dst].device
        t = schedule.transfers.get(key)
        if a == b:
            if t is not None:
                out.append(Violation("link", f"edge {key} stays on {a} but has a transfer"))
            continue
        if t is None:
            out.append(Violation("missing", f"edge {key} crosses {a}->{b} but has no transfer"))
        elif (t.src_device, t.dst_device) != (a, b):
            out.append(Violation("link", f"edge {key} goes {a}->{b} but its transfer says "
                                         f"{t.src_device}->{t.dst_device}"))
        elif _channel(devices, a, b, t.channel) is None:
            out.append(Violation("link", f"edge {key}: no channel {t.channel!r} between {a} and {b}"))
    extra = sorted(set(schedule.transfers) - edge_keys)
    if extra:
        out.append(Violation("link", f"transfers for edges not in the graph: {extra}"))
    out.extend(_memory_violations(schedule, graph, devices))
    return out


def memory_use_bytes(schedule: Schedule, graph: OpGraphLike) -> dict[str, float]:
    """Bytes held on each device (004 eq. 6): resident operator memory plus its input data."""
    use: dict[str, float] = defaultdict(float)
    for op in graph.operators:
        use[schedule.ops[op.name].device] += op.mem_bytes
    for edge in graph.edges:
        use[schedule.ops[edge.dst].device] += edge.size_bytes
    return dict(use)


def _memory_violations(schedule: Schedule, graph: OpGraphLike, devices: DeviceGraphLike) -> list[Violation]:
    out = []
    for dev, used in sorted(memory_use_bytes(schedule, graph).items()):
        cap = devices.memory_bytes(dev)
        if used > cap * (1 + 1e-9):
            out.append(Violation("memory", f"device {dev} holds {used:.4g} bytes > capacity {cap:.4g}"))
    return out


# ---- check a timed schedule ---------------------------------------------------------------------
def check(schedule: Schedule, graph: OpGraphLike, devices: DeviceGraphLike,
          bandwidth_GBps: Mapping[ChannelKey, float] | None = None, tol_s: float = 1e-9) -> list[Violation]:
    """Every violated constraint of the timed schedule (empty when feasible), `tol_s` of slack."""
    out = _structure_violations(schedule, graph, devices)
    if any(v.kind in ("missing", "link") for v in out):
        return out
    ops = {op.name: op for op in graph.operators}
    for name, slot in schedule.ops.items():
        need = devices.op_time_s(ops[name], slot.device)
        if slot.start_s < -tol_s or slot.end_s - slot.start_s < need - tol_s:
            out.append(Violation("duration", f"operator {name!r} on {slot.device} lasts "
                                             f"{slot.end_s - slot.start_s:.6g} s < {need:.6g} s"))
    sizes = {(e.src, e.dst): e.size_bytes for e in graph.edges}
    for key, t in schedule.transfers.items():
        ch = _channel(devices, t.src_device, t.dst_device, t.channel)
        need = transfer_time_s(sizes[key], ch, _bandwidth(bandwidth_GBps, t.src_device, t.dst_device, t.channel))
        if t.end_s - t.start_s < need - tol_s:
            out.append(Violation("duration", f"transfer {key} on {t.channel} lasts "
                                             f"{t.end_s - t.start_s:.6g} s < {need:.6g} s"))
    for u, v in sizes:
        su, sv = schedule.ops[u], schedule.ops[v]
        t = schedule.transfers.get((u, v))
        if t is not None and t.start_s < su.end_s - tol_s:
            out.append(Violation("dependency", f"transfer {(u, v)} starts before {u!r} ends (eq. 5)"))
        ready = t.end_s if t is not None else su.end_s
        if sv.start_s < ready - tol_s:
            out.append(Violation("dependency", f"{v!r} starts at {sv.start_s:.6g} s before its input from "
                                               f"{u!r} is ready at {ready:.6g} s (eq. 4)"))
    by_device: dict[str, list[str]] = defaultdict(list)
    for name, slot in schedule.ops.items():
        by_device[slot.device].append(name)
    for dev, names in by_device.items():
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                sa, sb = schedule.ops[a], schedule.ops[b]
                if _overlap(sa.start_s, sa.end_s, sb.start_s, sb.end_s, tol_s):
                    out.append(Violation("device_overlap", f"{a!r} and {b!r} overlap on {dev}"))
    out.extend(_channel_overlaps(schedule, devices, tol_s))
    return out


def _channel_overlaps(schedule: Schedule, devices: DeviceGraphLike, tol_s: float) -> list[Violation]:
    out = []
    by_direction: dict[tuple[str, str], list[EdgeKey]] = defaultdict(list)
    for key, t in schedule.transfers.items():
        by_direction[(t.src_device, t.dst_device)].append(key)
    for (a, b), keys in by_direction.items():
        for i, k1 in enumerate(keys):
            for k2 in keys[i + 1:]:
                t1, t2 = schedule.transfers[k1], schedule.transfers[k2]
                c1, c2 = _channel(devices, a, b, t1.channel), _channel(devices, a, b, t2.channel)
                if channels_conflict(c1, c2) and _overlap(t1.start_s, t1.end_s, t2.start_s, t2.end_s, tol_s):
                    out.append(Violation("channel_overlap", f"transfers {k1} ({t1.channel}) and {k2} "
                                                            f"({t2.channel}) overlap on {a}->{b}"))
    return out


def validate(schedule: Schedule, graph: OpGraphLike, devices: DeviceGraphLike,
             bandwidth_GBps: Mapping[ChannelKey, float] | None = None, tol_s: float = 1e-9) -> None:
    """Raise PlanError listing the violations of `check`, if any."""
    found = check(schedule, graph, devices, bandwidth_GBps, tol_s)
    if found:
        head = "; ".join(v.message for v in found[:5])
        more = f" (+{len(found) - 5} more)" if len(found) > 5 else ""
        raise PlanError(f"schedule violates {len(found)} constraint(s): {head}{more}", "schedule")


# ---- replay: keep the decisions, recompute the times ------------------------------------------
def _topo_rank(graph: OpGraphLike) -> dict[str, int]:
    succ: dict[str, list[str]] = defaultdict(list)
    indeg = {op.name: 0 for op in graph.operators}
    for e in graph.edges:
        succ[e.src].append(e.dst)
        indeg[e.dst] += 1
    order = {op.name: i for i, op in enumerate(graph.operators)}
    heap = [(order[n], n) for n, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    rank: dict[str, int] = {}
    while heap:
        _, n = heapq.heappop(heap)
        rank[n] = len(rank)
        for w in succ[n]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (order[w], w))
    if len(rank) != len(indeg):
        raise PlanError("the operator graph has a cycle", "graph.edges")
    return rank


@dataclass(frozen=True)
class ReplayResult:
    schedule: Schedule
    makespans_s: dict[str, float]
    objective_s: float


def replay(schedule: Schedule, graph: OpGraphLike, devices: DeviceGraphLike,
           bandwidth_GBps: Mapping[ChannelKey, float] | None = None) -> ReplayResult:
    """Re-time `schedule` under the device graph's (or the overridden) bandwidths, keeping its
    assignment, channels and orders; raises PlanError if those decisions are infeasible."""
    problems = _structure_violations(schedule, graph, devices)
    if problems:
        raise PlanError("cannot replay: " + "; ".join(v.message for v in problems[:5]), "schedule")
    items, duration, preds = _order_graph(schedule, graph, devices, bandwidth_GBps)
    start, end = _earliest_times(items, duration, preds)
    ops = {n: OpSlot(s.device, start[("op", n)], end[("op", n)]) for n, s in schedule.ops.items()}
    transfers = {k: TransferSlot(t.src_device, t.dst_device, t.channel, start[("tr", k)], end[("tr", k)])
                 for k, t in schedule.transfers.items()}
    new = Schedule(ops, transfers)
    return ReplayResult(new, new.makespans_s(graph), new.objective_s(graph))


Item = tuple  # ("op", name) or ("tr", (src, dst))


def _order_graph(schedule: Schedule, graph: OpGraphLike, devices: DeviceGraphLike,
                 bandwidth_GBps: Mapping[ChannelKey, float] | None):
    """Items (operators and transfers), their durations under the given bandwidths, and the arcs:
    data dependencies plus the schedule's order on every device and between conflicting transfers
    (order = the schedule's start times, ties broken by topological rank)."""
    rank = _topo_rank(graph)
    ops = {op.name: op for op in graph.operators}
    duration: dict[Item, float] = {}
    preds: dict[Item, set[Item]] = defaultdict(set)
    for name, slot in schedule.ops.items():
        duration[("op", name)] = devices.op_time_s(ops[name], slot.device)
    for e in graph.edges:
        key = (e.src, e.dst)
        t = schedule.transfers.get(key)
        if t is None:
            preds[("op", e.dst)].add(("op", e.src))
            continue
        ch = _channel(devices, t.src_device, t.dst_device, t.channel)
        bw = _bandwidth(bandwidth_GBps, t.src_device, t.dst_device, t.channel)
        duration[("tr", key)] = transfer_time_s(e.size_bytes, ch, bw)
        preds[("tr", key)].add(("op", e.src))
        preds[("op", e.dst)].add(("tr", key))
    by_device: dict[str, list[str]] = defaultdict(list)
    for name, slot in schedule.ops.items():
        by_device[slot.device].append(name)
    for names in by_device.values():
        names.sort(key=lambda n: (schedule.ops[n].start_s, rank[n]))
        for a, b in zip(names, names[1:]):
            preds[("op", b)].add(("op", a))
    by_direction: dict[tuple[str, str], list[EdgeKey]] = defaultdict(list)
    for key, t in schedule.transfers.items():
        by_direction[(t.src_device, t.dst_device)].append(key)
    for (a, b), keys in by_direction.items():
        keys.sort(key=lambda k: (schedule.transfers[k].start_s, rank[k[0]], rank[k[1]]))
        for i, k1 in enumerate(keys):
            c1 = _channel(devices, a, b, schedule.transfers[k1].channel)
            for k2 in keys[i + 1:]:
                c2 = _channel(devices, a, b, schedule.transfers[k2].channel)
                if channels_conflict(c1, c2):
                    preds[("tr", k2)].add(("tr", k1))
    return list(duration), duration, preds


def _earliest_times(items: Iterable[Item], duration: Mapping[Item, float], preds: Mapping[Item, set[Item]]):
    """Event-driven earliest start: an item starts when all its predecessors have ended."""
    items = list(items)
    succ: dict[Item, list[Item]] = defaultdict(list)
    waiting = {it: len(preds.get(it, ())) for it in items}
    for it in items:
        for p in preds.get(it, ()):
            succ[p].append(it)
    start: dict[Item, float] = {}
    end: dict[Item, float] = {}
    ready_at = {it: 0.0 for it in items}
    events = [(0.0, i, it) for i, it in enumerate(items) if waiting[it] == 0]
    heapq.heapify(events)
    seq = {it: i for i, it in enumerate(items)}
    while events:
        t, _, it = heapq.heappop(events)
        start[it], end[it] = t, t + duration[it]
        for w in succ[it]:
            ready_at[w] = max(ready_at[w], end[it])
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(events, (ready_at[w], seq[w], w))
    if len(start) != len(items):
        stuck = sorted(str(it[1]) for it in items if it not in start)[:5]
        raise PlanError(f"the schedule's orders form a cycle with its data dependencies (e.g. {stuck})",
                        "schedule")
    return start, end
