"""The cluster as it is now: GPUs up per node, bandwidth per link class, failed nodes; events.

A `ClusterState` is an immutable snapshot of an instance's cluster at one time. Events move it:

* `AvailabilityEvent` (instance files, Sailor trace CSVs): `available_gpus` of one (GPU type, zone)
  are usable from `time_s` on. Counts above the instance's quota are clamped to it.
* `PreemptionNotice`: at `time_s` the provider announces that at `effective_s` the (GPU type, zone)
  will drop to `available_gpus` (spot VMs get such a notice: 30 s on GCP, 2 min on AWS). The state
  only records it (`pending`); the drop itself is the AvailabilityEvent the stream emits at
  `effective_s`. `predicted()` is the state with every pending drop applied: what to plan for.
* `NodeFailure` / `NodeRecovery`: one node disappears without notice (its GPU memory and local disk
  are lost) / comes back empty.
* `BandwidthEvent` (instance files): a link class (intra_node, inter_node, inter_zone,
  inter_region) or one zone pair changes bandwidth (the dynamic-network scenarios of seed 004,
  sec. 2.2: S1 bandwidth variations, S3 node failures).

Which nodes hold the available GPUs: inside one (GPU type, zone) the non-failed nodes are filled in
instance order (node groups in file order, node index ascending), each with as many GPUs as it
has, the last one possibly partially (a partially up node keeps its lowest local GPU indices).
So a drop takes the most recently added nodes first (last in, first out), and node ids stay those
of the instance: plans before and after an event name the same physical GPUs.

`instance_view()` is the instance with the state's network (link classes, zone pairs, intra-node
links) via `model_copy`; estimators built from it see the current bandwidths. Availability is
not part of an Instance: pass `available()` to the planner and check placements with
`check_plan`.

`event_stream` merges the instance's events, its trace CSV (or another one), events files and
optional preemption notices into one time-ordered list. At equal times: failures and recoveries
first, then trace availability, then explicit availability (so an instance's own events override
the trace at the same instant), then bandwidth changes, then notices.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetplan.catalog import LinkSpec
from hetplan.errors import InstanceError, PlanError
from hetplan.instance import (
    AvailabilityEvent,
    BandwidthEvent,
    Instance,
    Network,
    ZonePairLink,
    check_sane_ranges,
    format_validation_error,
    read_structured,
    read_trace_csv,
    region_of,
)
from hetplan.plan import Plan, placed_gpus

_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # no event happens at t = inf
GCP_SPOT_NOTICE_S = 30.0  # GCP preemptible / spot VMs: 30 s ACPI G2 soft-off notice


class PreemptionNotice(BaseModel):
    """Announced at `time_s`: from `effective_s` on, only `available_gpus` of this type and zone."""

    model_config = _STRICT
    time_s: float = Field(ge=0)
    effective_s: float = Field(ge=0)
    gpu_type: str
    zone: str
    available_gpus: int = Field(ge=0)

    @model_validator(mode="after")
    def _after_notice(self) -> "PreemptionNotice":
        if self.effective_s < self.time_s:
            raise ValueError(f"effective_s {self.effective_s} is before the notice time {self.time_s}")
        return self


class NodeFailure(BaseModel):
    """A node disappears without notice; what its GPUs, memory and local disk held is lost."""

    model_config = _STRICT
    time_s: float = Field(ge=0)
    node: str


class NodeRecovery(BaseModel):
    """A failed node is back (empty)."""

    model_config = _STRICT
    time_s: float = Field(ge=0)
    node: str


Event = Union[AvailabilityEvent, BandwidthEvent, PreemptionNotice, NodeFailure, NodeRecovery]
EVENT_KINDS: dict[str, type] = {"availability": AvailabilityEvent, "bandwidth": BandwidthEvent,
                                "preemption": PreemptionNotice, "failure": NodeFailure, "recovery": NodeRecovery}
LinkClass = Literal["intra_node", "inter_node", "inter_zone", "inter_region"]


def event_kind(event: Event) -> str:
    for name, cls in EVENT_KINDS.items():
        if isinstance(event, cls):
            return name
    raise TypeError(f"not an event: {event!r}")


def describe_event(event: Event) -> str:
    """One short line, e.g. 'A100-40@us-central1-a -> 8 GPUs'."""
    if isinstance(event, AvailabilityEvent):
        return f"{event.gpu_type}@{event.zone} -> {event.available_gpus} GPUs"
    if isinstance(event, PreemptionNotice):
        return (f"notice: {event.gpu_type}@{event.zone} -> {event.available_gpus} GPUs "
                f"at {event.effective_s:g} s")
    if isinstance(event, NodeFailure):
        return f"node {event.node} failed"
    if isinstance(event, NodeRecovery):
        return f"node {event.node} recovered"
    where = f"{event.zones[0]}<->{event.zones[1]}" if event.zones else event.link
    return f"{where} bandwidth -> {event.bandwidth_GBps:g} GB/s"


# ---- the state ------------------------------------------------------------------------------------
Key = tuple[str, str]  # (gpu type, zone)


@dataclass(frozen=True, eq=False)
class ClusterState:
    """One snapshot; `apply` returns a new one. `requested` holds the announced GPU count per
    (GPU type, zone) (absent: the full quota); what is really up also excludes failed nodes."""

    instance: Instance
    time_s: float = 0.0
    requested: tuple[tuple[Key, int], ...] = ()
    failed: frozenset[str] = frozenset()
    network: Network | None = None  # None: the instance's
    intra_node_GBps: float | None = None  # overrides every node's intra-node link bandwidth
    pending: tuple[PreemptionNotice, ...] = ()
    clamped: tuple[str, ...] = field(default=(), compare=False)  # notes about counts above quota

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def initial(cls, instance: Instance) -> "ClusterState":
        """Every GPU of the instance up, its network as written."""
        return cls(instance=instance)

    @property
    def net(self) -> Network:
        return self.network or self.instance.cluster.network

    @cached_property
    def quota(self) -> dict[Key, int]:
        return self.instance.gpus_by_type_zone()

    def requested_gpus(self, key: Key) -> int:
        return dict(self.requested).get(key, self.quota.get(key, 0))

    @cached_property
    def gpus_up(self) -> dict[str, int]:
        """node id -> GPUs usable on it (local indices 0..n-1); failed nodes have 0."""
        left = {key: self.requested_gpus(key) for key in self.quota}
        out: dict[str, int] = {}
        for node in self.instance.nodes:
            key = (node.gpu_type, node.zone)
            n = 0 if node.node_id in self.failed else min(node.num_gpus, left[key])
            left[key] -= n
            out[node.node_id] = n
        return out

    def available(self) -> dict[Key, int]:
        """(GPU type, zone) -> GPUs up: what `PlannerOptions.available` takes."""
        out = {key: 0 for key in self.quota}
        for node in self.instance.nodes:
            out[(node.gpu_type, node.zone)] += self.gpus_up[node.node_id]
        return out

    def whole_node_available(self) -> dict[Key, int]:
        """Like `available`, counting only nodes with all their GPUs up (for TP groups that need
        a whole node's worth of GPUs)."""
        out = {key: 0 for key in self.quota}
        for node in self.instance.nodes:
            if self.gpus_up[node.node_id] == node.num_gpus:
                out[(node.gpu_type, node.zone)] += node.num_gpus
        return out

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_up.values())

    def alive_nodes(self) -> frozenset[str]:
        return frozenset(n for n, k in self.gpus_up.items() if k > 0)

    def key(self) -> tuple:
        """Hashable identity of what a planner sees (GPUs up per node, bandwidths)."""
        return (tuple(sorted(self.gpus_up.items())), self.net.model_dump_json(), self.intra_node_GBps)

    # -- events ------------------------------------------------------------------------------------
    def apply(self, event: Event) -> "ClusterState":
        """The state after `event` (its time becomes the state's time)."""
        t = max(self.time_s, event.time_s)
        self.check(event)
        if isinstance(event, AvailabilityEvent):
            return self._set_available(event.gpu_type, event.zone, event.available_gpus, t)
        if isinstance(event, PreemptionNotice):
            return replace(self, time_s=t, pending=self.pending + (event,))
        if isinstance(event, NodeFailure):
            return replace(self, time_s=t, failed=self.failed | {event.node})
        if isinstance(event, NodeRecovery):
            return replace(self, time_s=t, failed=self.failed - {event.node})
        if isinstance(event, BandwidthEvent):
            return self._set_bandwidth(event, t)
        raise TypeError(f"not an event: {event!r}")

    def apply_all(self, events: Iterable[Event]) -> "ClusterState":
        state = self
        for ev in events:
            state = state.apply(ev)
        return state

    def predicted(self) -> "ClusterState":
        """The state once every pending preemption notice has taken effect."""
        state = self
        for n in sorted(self.pending, key=lambda n: n.effective_s):
            state = state._set_available(n.gpu_type, n.zone, n.available_gpus, max(state.time_s, n.effective_s))
        return state

    def check(self, event: Event, where: str | None = None) -> None:
        """InstanceError when `event` names a (GPU type, zone), node or zone the instance lacks;
        `where` is the field the message names (default events.<kind>)."""
        where = where or f"events.{event_kind(event)}"
        if isinstance(event, (AvailabilityEvent, PreemptionNotice)):
            self._check_key(event.gpu_type, event.zone, where)
        elif isinstance(event, (NodeFailure, NodeRecovery)) and event.node not in self.instance.node_by_id:
            known = [n.node_id for n in self.instance.nodes]
            raise InstanceError(f"unknown node {event.node!r} (nodes: {known[:8]}{' ...' if len(known) > 8 else ''})",
                                f"{where}.node")
        elif isinstance(event, BandwidthEvent) and event.zones is not None:
            zones = {n.zone for n in self.instance.nodes}
            unknown = sorted(set(event.zones) - zones)
            if unknown:
                raise InstanceError(f"zones {unknown} not in the cluster (has {sorted(zones)})", f"{where}.zones")

    def _check_key(self, gpu_type: str, zone: str, where: str) -> None:
        if (gpu_type, zone) not in self.quota:
            raise InstanceError(f"{gpu_type} in zone {zone} is not in the cluster "
                                f"(has {sorted(f'{g}@{z}' for g, z in self.quota)})", where)

    def _set_available(self, gpu_type: str, zone: str, count: int, t: float) -> "ClusterState":
        key = (gpu_type, zone)
        notes = self.clamped
        if count > self.quota[key]:
            notes = notes + (f"t={t:g} s: {gpu_type}@{zone} {count} GPUs clamped to the quota {self.quota[key]}",)
            count = self.quota[key]
        req = dict(self.requested)
        req[key] = count
        pending = tuple(n for n in self.pending if not ((n.gpu_type, n.zone) == key and n.effective_s <= t))
        return replace(self, time_s=t, requested=tuple(sorted(req.items())), pending=pending, clamped=notes)

    def _set_bandwidth(self, ev: BandwidthEvent, t: float) -> "ClusterState":
        net = self.net
        if ev.link == "intra_node":
            return replace(self, time_s=t, intra_node_GBps=ev.bandwidth_GBps)
        if ev.link == "zone_pair":  # (zones of the cluster: `check`)
            a, b = ev.zones
            old = next((p for p in net.zone_pairs if set(p.zones) == {a, b}), None)
            default = net.inter_zone if region_of(a) == region_of(b) else net.inter_region
            latency = old.latency_s if old else default.latency_s
            pairs = [p for p in net.zone_pairs if set(p.zones) != {a, b}]
            pairs.append(ZonePairLink(zones=(a, b), bandwidth_GBps=ev.bandwidth_GBps, latency_s=latency))
            return replace(self, time_s=t, network=net.model_copy(update={"zone_pairs": pairs}))
        link: LinkSpec = getattr(net, ev.link)
        new = link.model_copy(update={"bandwidth_GBps": ev.bandwidth_GBps})
        return replace(self, time_s=t, network=net.model_copy(update={ev.link: new}))

    # -- views -------------------------------------------------------------------------------------
    def bandwidths_GBps(self) -> dict[str, float]:
        """Current bandwidth per link class (intra_node: the slowest node's link)."""
        view = self.instance_view()
        intra = min(n.intra_node.bandwidth_GBps for n in view.nodes)
        net = self.net
        return {"intra_node": intra, "inter_node": net.inter_node.bandwidth_GBps,
                "inter_zone": net.inter_zone.bandwidth_GBps, "inter_region": net.inter_region.bandwidth_GBps}

    def instance_view(self) -> Instance:
        """The instance with this state's network (node ids and quotas unchanged, events dropped;
        the instance itself while the network is unchanged)."""
        if self.network is None and self.intra_node_GBps is None:
            return self.instance
        return _view(self.instance, self.net, self.intra_node_GBps)

    def check_plan(self, plan: Plan) -> None:
        """PlanError unless every replica of a placed plan sits on GPUs that are up."""
        for i, stage in enumerate(plan.stages):
            for j, rep in enumerate(stage.replicas):
                field_name = f"stages[{i}].replicas[{j}]"
                gpus = placed_gpus(rep)
                up = self.gpus_up.get(rep.node, 0)
                if rep.node in self.failed:
                    raise PlanError(f"node {rep.node} has failed", f"{field_name}.node")
                if max(gpus) >= up:
                    raise PlanError(f"GPUs {list(gpus)} of node {rep.node} are not all up ({up} up: "
                                    f"local indices 0..{up - 1})", f"{field_name}.gpus")

    def plan_is_valid(self, plan: Plan) -> bool:
        try:
            self.check_plan(plan)
        except PlanError:
            return False
        return True

    def summary(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "available": {f"{g}@{z}": n for (g, z), n in sorted(self.available().items())},
                "failed": sorted(self.failed), "bandwidth_GBps": self.bandwidths_GBps(),
                "pending_notices": [describe_event(n) for n in self.pending]}


def _view(instance: Instance, network: Network, intra_GBps: float | None) -> Instance:
    groups = instance.cluster.node_groups
    if intra_GBps is not None:
        groups = [g.model_copy(update={"intra_node": (g.intra_node or instance.gpu(g.gpu_type).intra_node)
                                       .model_copy(update={"bandwidth_GBps": intra_GBps})}) for g in groups]
    cluster = instance.cluster.model_copy(update={"network": network, "node_groups": groups})
    view = instance.model_copy(update={"cluster": cluster, "events": type(instance.events)()})
    # model_copy copies the instance __dict__, cached properties included (nodes carry intra-node
    # links): drop them so the view recomputes them from its own cluster.
    for name in [k for k in view.__dict__ if k not in type(view).model_fields]:
        view.__dict__.pop(name, None)
    return view


# ---- the merged event stream ----------------------------------------------------------------------
_ORDER = {"failure": 0, "recovery": 0, "trace": 1, "availability": 2, "bandwidth": 3, "preemption": 4}


def read_events_file(path: str | Path) -> tuple[list[Event], str | None]:
    """A YAML/JSON events file: `{events: [{kind: availability|bandwidth|preemption|failure|recovery,
    time_s: ..., ...}], trace_csv: optional path}` (a bare list is accepted too). Returns the
    events and the trace path (relative to the file) if any."""
    path = Path(path)
    data = read_structured(path)
    trace = None
    if isinstance(data, dict):
        trace = data.get("trace_csv")
        unknown = sorted(set(data) - {"events", "trace_csv"})
        if unknown:
            raise InstanceError(f"unknown keys {unknown}; expected 'events' and optionally 'trace_csv'", str(path))
        data = data.get("events", [])
    if not isinstance(data, list):
        raise InstanceError("expected a list of events under 'events'", str(path))
    events = [parse_event(item, f"{path}: events[{i}]") for i, item in enumerate(data)]
    return events, (str(path.parent / trace) if trace else None)


def check_events(instance: Instance, events: list[Event], where: str) -> None:
    """`ClusterState.check` on every event of a file (`where`) when it is read: the states would
    refuse one only when they reach it, naming no file."""
    state = ClusterState.initial(instance)
    for i, ev in enumerate(events):
        state.check(ev, f"{where}: events[{i}]")


def parse_event(item: Any, where: str = "event") -> Event:
    if not isinstance(item, dict) or "kind" not in item:
        raise InstanceError(f"an event is a mapping with 'kind' (one of {sorted(EVENT_KINDS)})", where)
    fields = {k: v for k, v in item.items() if k != "kind"}
    cls = EVENT_KINDS.get(item["kind"])
    if cls is None:
        raise InstanceError(f"unknown event kind {item['kind']!r}; known: {sorted(EVENT_KINDS)}", f"{where}.kind")
    try:
        event = cls(**fields)
        check_sane_ranges(event)  # as the instance's own events are (a bandwidth of 1e-300 GB/s passed)
    except ValidationError as exc:
        raise InstanceError(format_validation_error(exc), where) from None
    except ValueError as exc:
        raise InstanceError(str(exc), where) from None
    return event


def trace_events(instance: Instance, path: str | Path) -> list[AvailabilityEvent]:
    """A Sailor trace CSV's changes as AvailabilityEvents; every column must name a (GPU type,
    zone) of the instance."""
    events = read_trace_csv(Path(path), changes_only=True)
    known = {(g.gpu_type, g.zone) for g in instance.cluster.node_groups}
    for ev in events:
        if (ev.gpu_type, ev.zone) not in known:
            raise InstanceError(f"column {ev.gpu_type}_{ev.zone}: {ev.gpu_type} in zone {ev.zone} is not in "
                                f"instance {instance.name} (has {sorted(f'{g}_{z}' for g, z in known)})", str(path))
    return events


def event_stream(instance: Instance, trace: str | Path | None = None, extra: Iterable[Event] = (),
                 notice_s: float | None = None, use_instance_trace: bool = True,
                 notes: list[str] | None = None) -> list[Event]:
    """Every event in time order: the instance's availability and bandwidth events, the trace CSV
    (`trace`, else the instance's `events.trace_csv` when `use_instance_trace`), `extra` events.

    `notice_s`: every availability decrease is announced `notice_s` earlier by a PreemptionNotice
    (spot semantics); explicit PreemptionNotices in `extra` also emit their AvailabilityEvent at
    `effective_s`. Availability events whose count does not change are dropped. Counts above the
    instance's are clamped to it; `notes`, when given, gets one line per trace column or (GPU type,
    zone) of `extra` that asked for more (`over_quota_notes`)."""
    tagged: list[tuple[float, int, int, Event]] = []
    asked: list[tuple[str, AvailabilityEvent | PreemptionNotice]] = []

    def add(ev: Event, tag: str) -> None:
        tagged.append((ev.time_s, _ORDER[tag], len(tagged), ev))

    trace_path = trace
    if trace_path is None and use_instance_trace and instance.events.trace_csv:
        trace_path = instance.resolve_path(instance.events.trace_csv)
    if trace_path is not None:
        for ev in trace_events(instance, trace_path):
            add(ev, "trace")
            asked.append((f"trace {Path(trace_path).name} column {ev.gpu_type}_{ev.zone}", ev))
    for ev in instance.events.availability:
        add(ev, "availability")
    for ev in instance.events.bandwidth:
        add(ev, "bandwidth")
    for ev in extra:
        kind = event_kind(ev)
        add(ev, kind)
        if isinstance(ev, (AvailabilityEvent, PreemptionNotice)):
            asked.append((f"{kind} events of {ev.gpu_type}@{ev.zone}", ev))
        if isinstance(ev, PreemptionNotice):
            add(AvailabilityEvent(time_s=ev.effective_s, zone=ev.zone, gpu_type=ev.gpu_type,
                                  available_gpus=ev.available_gpus), "availability")
    tagged.sort(key=lambda x: x[:3])
    stream = _with_notices(instance, [ev for *_, ev in tagged], notice_s)
    if notes is not None:
        notes.extend(over_quota_notes(instance, asked))
    return stream


def over_quota_notes(instance: Instance, asked: Iterable[tuple[str, AvailabilityEvent | PreemptionNotice]]
                     ) -> list[str]:
    """One line per source (e.g. a trace column) whose largest count exceeds the instance's GPUs of
    that (GPU type, zone). Not an error: Sailor's traces are often larger than a scaled-down
    instance, and clamping them is what a replay on that instance means; but it is said."""
    have = instance.gpus_by_type_zone()
    peak: dict[tuple[str, str, str], AvailabilityEvent | PreemptionNotice] = {}
    for source, ev in asked:
        key = (source, ev.gpu_type, ev.zone)
        if key not in peak or ev.available_gpus > peak[key].available_gpus:
            peak[key] = ev
    return [f"{source}: up to {ev.available_gpus} GPUs requested (first at t={ev.time_s:g} s), the instance has "
            f"{n} {g} in {z}: counts above {n} are clamped"
            for (source, g, z), ev in peak.items() for n in [have.get((g, z), 0)] if ev.available_gpus > n]


def _with_notices(instance: Instance, events: list[Event], notice_s: float | None) -> list[Event]:
    """Per instant, keep the last availability event of each (GPU type, zone) and drop those that
    change nothing; with `notice_s`, announce every net decrease after time 0 (the start)."""
    state = ClusterState.initial(instance)
    level = dict(state.quota)
    announced = {(n.gpu_type, n.zone, n.effective_s) for n in events if isinstance(n, PreemptionNotice)}
    out: list[tuple[float, int, Event]] = []
    order = 0
    for t, batch in batches(events):
        last = {}
        for ev in batch:
            if isinstance(ev, AvailabilityEvent):
                state.check(ev)
                last[(ev.gpu_type, ev.zone)] = ev
        for ev in batch:
            order += 1
            if isinstance(ev, AvailabilityEvent):
                key = (ev.gpu_type, ev.zone)
                new = min(ev.available_gpus, state.quota[key])
                if last[key] is not ev or new == level[key]:
                    continue
                if notice_s and t > 0 and new < level[key] and (*key, t) not in announced:
                    start = max(0.0, t - notice_s)
                    out.append((start, -1, PreemptionNotice(time_s=start, effective_s=t, gpu_type=ev.gpu_type,
                                                            zone=ev.zone, available_gpus=new)))
                level[key] = new
            out.append((t, order, ev))
    out.sort(key=lambda x: (x[0], x[1]))
    return [ev for *_, ev in out]


def batches(events: list[Event]) -> list[tuple[float, list[Event]]]:
    """Events grouped by time (one re-plan per instant)."""
    out: list[tuple[float, list[Event]]] = []
    for ev in events:
        if out and out[-1][0] == ev.time_s:
            out[-1][1].append(ev)
        else:
            out.append((ev.time_s, [ev]))
    return out
