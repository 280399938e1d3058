"""Trace replay: hours of changing availability, simulated with re-planning at every event.

`replay(instance, trace, options)` walks the merged event stream (`cluster_state.event_stream`:
the instance's events, a Sailor trace CSV, events files, preemption notices) and, for each
strategy, keeps a timeline of what the job does:

* warm    at every instant with events, `replan` from the running plan (repair + planner,
          reuse-aware placement; the change penalty charges `restart_s` to any change, weighed
          against `plan_horizon_s`, by default the median time between events); when the penalty
          turned down a better plan, the re-plan is asked again after the cluster has been stable
          for 1, 2, 4, ... x `plan_horizon_s`, weighed against the time it has been stable (a
          cluster stable that long is expected to stay about as long again): after a 30 s dip
          warm kept 2 of 4 GPUs to the end of the replay, 1,870 s later;
* cold    the same, re-planned from scratch (`ReplanOptions(warm=False)`: the planner alone, placed
          first fit), the "re-plan without warm start" baseline;
* static  the first plan forever: when any of its GPUs vanish it stops and waits until all of them
          are back, then restarts from the checkpoint.

A change of plan costs downtime = re-plan latency + migration time (`runtime.migrate`: layer-wise
shards from GPU / local / peer / remote, AutoHet sec. IV) + `restart_s` (process restart,
rendezvous, warm-up: an assumption, default 30 s). While the old plan still runs (GPUs were added
or a link changed) it keeps training during the re-plan latency; when GPUs are gone it stops at
once. A preemption notice (`notice_s` before every availability drop; GCP gives 30 s) starts the
re-plan early, so its latency overlaps training and no work is lost; a failure without notice
loses the work since the last checkpoint (checkpoints every `checkpoint_interval_s` of training
and at each reconfiguration). Between events a plan trains at its simulated throughput
(`simulator.simulate` on the state's instance view) and costs its simulated cost per iteration
(compute + egress) / iteration time; during a reconfiguration the new plan's GPUs are paid, while
static waits it pays the GPUs it keeps. The replay uses the measured re-plan latency unless
`fixed_latency_s` is given (for reproducible runs). A switch whose re-plan is still running when
the next change comes (or the replay ends) never begins: its record reads `superseded` (or
`unstarted`), without downtime, and the next change is judged against the plan still training.

This module sits at the end of the pipeline, like the CLI: it drives the planner, the simulator
and the migration estimate of `hetplan.runtime.migrate` (which needs no torch).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from hetplan.cluster_state import (
    ClusterState,
    Event,
    NodeFailure,
    PreemptionNotice,
    batches,
    check_events,
    describe_event,
    event_stream,
    read_events_file,
)
from hetplan.errors import HetplanError, InstanceError, check_number
from hetplan.estimators import EstimatorSet, build_estimators
from hetplan.instance import AvailabilityEvent, Instance
from hetplan.plan import Plan, workers
from hetplan.estimators.memo import memoised
from hetplan.orchestration.replan import ReplanOptions, ReplanResult, place, replan, same_plan
from hetplan.simulator import SimulationReport, simulate

STRATEGIES = ("warm", "cold", "static")
# record actions that deploy a plan (counted as reconfigurations: a switch with no restart time and
# nothing to move was left out when they were counted by downtime)
SWITCHES = ("patched", "repaired", "planner", "resume")


@dataclass(frozen=True)
class ReplayOptions:
    horizon_s: float | None = None  # end of the replay; None: last event + the median gap between events
    restart_s: float = 30.0  # per reconfiguration: restart, rendezvous, warm-up (assumption)
    notice_s: float | None = 30.0  # availability drops announced this early (GCP spot: 30 s); None: no notice
    checkpoint_interval_s: float = 600.0  # periodic layer-wise checkpoints while training
    initial_time_limit_s: float = 3.0  # the planner's budget for the first plan (shared by the strategies)
    initial_plan: Plan | None = None  # instead of planning the first one
    # warm and cold ask the planner the same question (no cutoff), answered once per state and
    # charged to both at its measured latency: the difference between them is the warm start
    replan: ReplanOptions = ReplanOptions(planner_time_limit_s=0.3, planner_combo_time_limit_s=0.25, max_stages=8,
                                          planner_cutoff=False)
    migration: Any = None  # runtime.migrate.MigrationOptions; None: its defaults
    strategies: tuple[str, ...] = STRATEGIES
    fixed_latency_s: float | None = None  # charge this re-plan latency instead of the measured one
    plan_horizon_s: float | None = None  # how long a new plan is expected to run (the re-plan's
    # change penalty is weighed against it); None: the median time between event instants

    def __post_init__(self) -> None:
        unknown = sorted(set(self.strategies) - set(STRATEGIES))
        if unknown or not self.strategies:
            what = f"unknown strategies {unknown}" if unknown else "no strategy given"
            raise InstanceError(f"{what}; choose from {', '.join(STRATEGIES)}",
                                "replay.strategies")
        # a nan horizon once replayed "from 0 s to nan s" with exit 0
        for name, zero in (("horizon_s", False), ("checkpoint_interval_s", False), ("plan_horizon_s", False),
                           ("restart_s", True), ("notice_s", True), ("initial_time_limit_s", True),
                           ("fixed_latency_s", True)):
            check_number(getattr(self, name), f"replay.{name}", zero=zero)


@dataclass(frozen=True)
class Segment:
    start_s: float
    end_s: float
    phase: str  # train | reconfigure | wait | idle
    samples_per_s: float
    usd_per_h: float
    gpus: int


@dataclass(frozen=True)
class EventRecord:
    time_s: float
    events: list[str]
    # kept | patched | repaired | planner | none | prepared | stop | resume | continue; a switch whose
    # re-plan was still running (the old plan training) when the next change came: superseded, or
    # when the replay ended: unstarted (neither has downtime); events that change nothing a plan
    # sees (a recovery of a node that was up, a bandwidth set to its value): unchanged
    action: str
    latency_s: float
    migration_s: float
    downtime_s: float
    moved_ranks: int
    samples_per_s: float  # of the plan that trains next
    gpus: int
    usd_per_h: float
    lost_samples: float = 0.0
    remote_only_s: float = 0.0


@dataclass
class StrategyResult:
    name: str
    segments: list[Segment] = field(default_factory=list)
    records: list[EventRecord] = field(default_factory=list)
    lost_samples: float = 0.0

    @property
    def total_samples(self) -> float:
        return sum((s.end_s - s.start_s) * s.samples_per_s for s in self.segments) - self.lost_samples

    @property
    def total_cost_usd(self) -> float:
        return sum((s.end_s - s.start_s) * s.usd_per_h / 3600 for s in self.segments)

    @property
    def train_s(self) -> float:
        return sum(s.end_s - s.start_s for s in self.segments if s.phase == "train")

    @property
    def downtime_s(self) -> float:
        """Time without training while a plan was wanted (reconfiguring or waiting)."""
        return sum(s.end_s - s.start_s for s in self.segments if s.phase in ("reconfigure", "wait"))

    @property
    def idle_s(self) -> float:
        """Time with no GPU to train on at all."""
        return sum(s.end_s - s.start_s for s in self.segments if s.phase == "idle")

    def latencies(self) -> list[float]:
        return [r.latency_s for r in self.records
                if r.action not in ("continue", "stop", "resume", "prepared", "unchanged")]

    def summary(self) -> dict[str, Any]:
        lat = self.latencies()
        return {"strategy": self.name, "total_samples": self.total_samples, "total_cost_usd": self.total_cost_usd,
                "usd_per_million_samples": 1e6 * self.total_cost_usd / self.total_samples if self.total_samples > 0 else None,
                "train_s": self.train_s, "downtime_s": self.downtime_s, "idle_s": self.idle_s,
                "lost_samples": self.lost_samples,
                "reconfigurations": sum(1 for r in self.records if r.action in SWITCHES),
                "replan_latency_mean_s": statistics.fmean(lat) if lat else 0.0,
                "replan_latency_max_s": max(lat) if lat else 0.0,
                "records": [r.__dict__ for r in self.records], "segments": [s.__dict__ for s in self.segments]}


@dataclass
class ReplayResult:
    instance: str
    start_s: float
    horizon_s: float
    num_events: int
    initial: dict[str, Any]
    strategies: dict[str, StrategyResult]
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"instance": self.instance, "start_s": self.start_s, "horizon_s": self.horizon_s,
                "num_events": self.num_events, "initial": self.initial, "wall_s": self.wall_s, "notes": self.notes,
                "strategies": {k: v.summary() for k, v in self.strategies.items()}}


# ---- entry point ----------------------------------------------------------------------------------
def load_events(instance: Instance, trace: str | Path | None) -> tuple[str | None, list[Event]]:
    """A TRACE argument: a Sailor CSV, or a YAML/JSON events file (which may name a CSV)."""
    if trace is None:
        return None, []
    path = Path(trace)
    if not path.exists():
        raise InstanceError(f"file not found: {trace}", "trace")
    if path.suffix.lower() == ".csv":
        return str(path), []
    events, csv = read_events_file(path)
    check_events(instance, events, str(path))
    return csv, events


@dataclass(frozen=True)
class ReplayProgress:
    """Where a replay is, for a progress display: a strategy's events handled so far."""

    strategy: str
    done: int
    total: int
    time_s: float  # the trace time of the last event handled
    samples_per_s: float  # the plan training after it (0 while no plan runs)


def replay(instance: Instance, trace: str | Path | None = None, options: ReplayOptions | None = None,
           extra_events: Iterable[Event] = (),
           progress: Callable[[ReplayProgress], None] | None = None) -> ReplayResult:
    """Replay the instance's events (plus `trace`: a Sailor CSV replacing the instance's
    `events.trace_csv`, or an events file) under every strategy of `options`."""
    opts = options or ReplayOptions()
    t_wall = time.perf_counter()
    csv, file_events = load_events(instance, trace)
    notes: list[str] = []  # counts above the instance's, clamped (the state's own notes would repeat them)
    events = event_stream(instance, csv, [*file_events, *extra_events], opts.notice_s, notes=notes)
    groups = batches(events)
    start = 0.0  # event times are relative to the start of the job (traces: to their first row)
    state = ClusterState.initial(instance)
    if groups and groups[0][0] == start:
        state = state.apply_all(ev for ev in groups[0][1] if not isinstance(ev, PreemptionNotice))
        notices0 = [ev for ev in groups[0][1] if isinstance(ev, PreemptionNotice)]
        groups = ([(start, notices0)] if notices0 else []) + groups[1:]
    horizon = opts.horizon_s if opts.horizon_s is not None else _default_horizon(start, events)
    groups = [(t, evs) for t, evs in groups if t < horizon]
    plan0, initial = _initial_plan(instance, state, opts, notes)
    if opts.plan_horizon_s is None:
        opts = replace(opts, plan_horizon_s=_median_gap(events))
    cache: dict = {"estimators": {}}
    results = {}
    for name in opts.strategies:
        runner = (_Static if name == "static" else _Adaptive)(name, instance, state, plan0, start, opts, cache)
        for k, (t, evs) in enumerate(groups):
            runner.settle(t)
            runner.on_events(t, evs)
            if progress:
                progress(ReplayProgress(name, k + 1, len(groups), t, runner.report.samples_per_s
                                        if runner.report is not None else 0.0))
        runner.settle(horizon)
        if isinstance(runner, _Adaptive):
            runner.call_off("unstarted")
        results[name] = runner.result
    within = sum(1 for ev in events if ev.time_s < horizon)  # "56 events from 0 s to 4000 s" counted 38 past it
    return ReplayResult(instance.name, start, horizon, within, initial, results, time.perf_counter() - t_wall, notes)


def _declined(objective: str, res: ReplanResult) -> bool:
    """A feasible candidate beats the chosen plan on the objective alone, without the change penalty."""
    def value(rep: SimulationReport) -> float:
        return -rep.cost_per_iteration_usd if objective == "min_cost" else rep.samples_per_s

    chosen = value(res.report)
    return any(c.feasible and value(c.report) > chosen + 1e-9 * abs(chosen) for c in res.candidates)


def _median_gap(events: list[Event], start: float = 0.0) -> float:
    times = sorted({ev.time_s for ev in events} | {start})
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    return statistics.median(gaps) if gaps else 3600.0


def _default_horizon(start: float, events: list[Event]) -> float:
    return max([start] + [ev.time_s for ev in events]) + _median_gap(events, start)


def _initial_plan(instance: Instance, state: ClusterState, opts: ReplayOptions,
                  notes: list[str]) -> tuple[Plan | None, dict[str, Any]]:
    if state.total_gpus == 0:
        return None, {"plan": None, "note": "no GPU up at the start"}
    view = state.instance_view()
    t0 = time.perf_counter()
    if opts.initial_plan is not None:
        plan = place(view, opts.initial_plan, state, reuse=False)
        if plan is None or not state.plan_is_valid(plan):
            raise InstanceError("the initial plan does not fit the GPUs up at the start", "replay.initial_plan")
    else:
        ropts = ReplanOptions(warm=False, planner_time_limit_s=opts.initial_time_limit_s,
                              planner_combo_time_limit_s=max(opts.replan.planner_combo_time_limit_s, 1.0),
                              backend=opts.replan.backend, tp_choices=opts.replan.tp_choices,
                              microbatch_sizes=opts.replan.microbatch_sizes, max_stages=opts.replan.max_stages)
        try:
            plan = replan(instance, None, state, ropts).plan
        except HetplanError as exc:
            notes.append(f"initial plan: {exc}")
            return None, {"plan": None, "note": str(exc)}
    report = simulate(view, plan)
    return plan, {"plan": plan.name, "samples_per_s": report.samples_per_s, "num_gpus": report.num_gpus,
                  "stages": len(plan.stages), "num_microbatches": plan.num_microbatches,
                  "planning_s": time.perf_counter() - t0}


# ---- the timeline of one strategy -------------------------------------------------------------------
def _usd_per_h(report: SimulationReport | None) -> float:
    if report is None:
        return 0.0
    return 3600 * report.cost_per_iteration_usd / report.iteration_time_s


def _held_gpus(instance: Instance, plan: Plan | None, state: ClusterState | None = None) -> tuple[int, float]:
    """(GPUs, compute USD per hour) of a plan's GPUs (those still up when `state` is given)."""
    if plan is None:
        return 0, 0.0
    gpus, total = 0, 0.0
    for st in plan.stages:
        for rep in st.replicas:
            node = instance.node_by_id[rep.node]
            n = rep.tp if state is None else sum(1 for g in rep.gpus if g < state.gpus_up.get(rep.node, 0))
            gpus, total = gpus + n, total + node.price_per_gpu_hour_usd * n
    return gpus, total


def _gpu_usd_per_h(instance: Instance, plan: Plan | None, state: ClusterState | None = None) -> float:
    return _held_gpus(instance, plan, state)[1]


class _Runner:
    """Shared bookkeeping: a list of upcoming phases, then the current plan trains."""

    def __init__(self, name: str, instance: Instance, state: ClusterState, plan: Plan | None, start: float,
                 opts: ReplayOptions, cache: dict):
        self.name, self.instance, self.state, self.opts, self.cache = name, instance, state, opts, cache
        self.result = StrategyResult(name)
        self.t = start
        self.plan = plan  # the plan training (or being deployed)
        self.holder = plan  # the plan whose state sits on the GPUs
        self.lost: set[tuple[str, int]] = set()  # holder GPUs whose state is gone
        self.report = simulate(state.instance_view(), plan, self.est()) if plan is not None else None
        self.phases: list[tuple[float, str, SimulationReport | None, float]] = []  # (until, phase, report, usd/h)
        self.train_since = start  # last checkpoint reference
        self.waiting = False
        self.deploying: int | None = None  # the record of the switch the phases carry out
        self.recheck_s: float | None = None  # when to ask the re-plan again (`_Adaptive.on_recheck`)

    def est(self, state: ClusterState | None = None) -> EstimatorSet:
        """Memoised estimators for a state's network, shared by all strategies."""
        state = state or self.state
        table = self.cache["estimators"]
        key = (state.net.model_dump_json(), state.intra_node_GBps)
        if key not in table:
            table[key] = memoised(build_estimators(state.instance_view()))
        return table[key]

    # -- time ---------------------------------------------------------------------------------------
    def advance(self, t_next: float) -> None:
        while self.phases and self.t < t_next:
            until, phase, report, usd = self.phases[0]
            end = min(until, t_next)
            self._segment(self.t, end, phase, report, usd)
            self.t = end
            if end >= until:
                self.phases.pop(0)
                if not self.phases:  # the new plan is in place
                    self.holder, self.lost, self.train_since = self.plan, set(), end
                    self.deploying = None
        if self.t < t_next:
            if self.plan is None:
                self._segment(self.t, t_next, "idle", None, 0.0)
            elif self.waiting:  # the plan's GPUs still up are held (and paid) while it waits
                gpus, usd = _held_gpus(self.instance, self.plan, self.state)
                self._segment(self.t, t_next, "wait", None, usd, gpus)
            else:
                self._segment(self.t, t_next, "train", self.report, _usd_per_h(self.report))
            self.t = t_next

    def settle(self, t: float) -> None:
        """`advance` to t, taking the re-checks due before it."""
        while self.recheck_s is not None and self.recheck_s < t:
            at, self.recheck_s = self.recheck_s, None
            self.advance(at)
            self.on_recheck(at)
        self.advance(t)

    def on_recheck(self, t: float) -> None:
        """A re-check is due (only the adaptive strategies set them)."""

    def _segment(self, a: float, b: float, phase: str, report: SimulationReport | None, usd_per_h: float,
                 gpus: int = 0) -> None:
        """A segment [a, b): the GPUs of `report`'s plan, else `gpus` (a wait's held GPUs)."""
        if b <= a:
            return
        sps = report.samples_per_s if (report is not None and phase == "train") else 0.0
        gpus = report.num_gpus if report is not None else gpus
        segs = self.result.segments
        if segs and segs[-1].phase == phase and segs[-1].end_s == a and segs[-1].samples_per_s == sps \
                and segs[-1].usd_per_h == usd_per_h and segs[-1].gpus == gpus:
            segs[-1] = Segment(segs[-1].start_s, b, phase, sps, usd_per_h, gpus)
        else:
            segs.append(Segment(a, b, phase, sps, usd_per_h, gpus))

    def deploy(self, t: float, phases: list) -> None:
        """Replace the pending phases with `phases` (the next record is their switch). A
        reconfiguration still under way is cut short at `t`: its record keeps the downtime it had,
        not the whole it was planned for (records summed 80 s of downtime where 50 s passed)."""
        if self.deploying is not None and self.phases and self.phases[-1][1] == "reconfigure":
            rec = self.result.records[self.deploying]
            left = max(self.phases[-1][0] - t, 0.0)
            self.result.records[self.deploying] = replace(rec, downtime_s=max(rec.downtime_s - left, 0.0))
        self.phases = phases
        self.deploying = len(self.result.records) if phases else None

    @property
    def training(self) -> bool:
        return self.plan is not None and not self.waiting and not self.phases

    # -- events -------------------------------------------------------------------------------------
    def on_events(self, t: float, evs: list[Event]) -> None:
        """Apply an instant's changes one by one: a node that fails and recovers at the same instant
        has lost its state (applied together, they read as nothing), and only a change that takes
        GPUs of the plan holding the state without notice loses work (a failure of an idle node
        beside an announced drop made the drop lose work)."""
        changes = [ev for ev in evs if not isinstance(ev, PreemptionNotice)]
        notices = [ev for ev in evs if isinstance(ev, PreemptionNotice)]
        key, wiped, announced = self.state.key(), len(self.lost), True
        for ev in changes:
            before = self.state
            self.state = before.apply(ev)
            hit = len(self.lost)
            self._mark_lost_gpus()
            announced = announced and (len(self.lost) == hit or self._announced(before, ev))
        changed = bool(changes) and (self.state.key() != key or len(self.lost) != wiped)
        if changes and not changed:
            self.record(t, changes, "unchanged")  # a pending switch stands, nothing is re-planned
        elif changed:
            self.on_change(t, changes, announced)
        if notices:
            self.state = self.state.apply_all(notices)
            self.on_notice(t, notices)
        if changed:
            self.after_change(t)

    def after_change(self, t: float) -> None:
        """Once a change is handled (the adaptive strategies re-plan for what notices announce)."""

    def _announced(self, before: ClusterState, ev: Event) -> bool:
        if isinstance(ev, NodeFailure):
            return False
        if isinstance(ev, AvailabilityEvent):
            return any(n.gpu_type == ev.gpu_type and n.zone == ev.zone and n.effective_s == ev.time_s
                       for n in before.pending) or ev.available_gpus >= before.requested_gpus((ev.gpu_type, ev.zone))
        return True

    def _mark_lost_gpus(self) -> None:
        """GPUs of the holder plan that went down have lost their state, even if they come back."""
        if self.holder is None:
            return
        for st in self.holder.stages:
            for rep in st.replicas:
                for g in rep.gpus:
                    if g >= self.state.gpus_up.get(rep.node, 0):
                        self.lost.add((rep.node, g))

    def lose_work(self, t: float) -> float:
        """Samples trained since the last checkpoint (a failure without notice loses them), from the
        timeline: at the rate of each stretch, not the current one (after a bandwidth rise the
        loss exceeded what had been trained, and total samples went negative)."""
        if not self.training or self.report is None:
            return 0.0
        since = t - (t - self.train_since) % self.opts.checkpoint_interval_s
        lost = sum((s.end_s - max(s.start_s, since)) * s.samples_per_s for s in self.result.segments
                   if s.phase == "train" and s.end_s > since)
        self.result.lost_samples += lost
        return lost

    def migration(self, new_plan: Plan) -> tuple[float, float]:
        """(recovery seconds, remote-only seconds) of loading `new_plan` after the holder plan."""
        from hetplan.runtime.migrate import MigrationOptions, migration_plan

        mopts = self.opts.migration or MigrationOptions()
        mp = migration_plan(self.instance, self.holder, new_plan, self.state, self.lost, mopts)
        return mp.recovery_s, mp.remote_only_s

    def on_change(self, t: float, changes: list[Event], announced: bool) -> None:
        raise NotImplementedError

    def on_notice(self, t: float, notices: list[PreemptionNotice]) -> None:
        pass

    def record(self, t: float, evs: list[Event] | list[str], action: str, latency: float = 0.0, mig: float = 0.0,
               down: float = 0.0, moved: int = 0, lost: float = 0.0, remote_only: float = 0.0) -> None:
        """`evs`: the events, or what stood for them (a re-check's description)."""
        rep = self.report if self.plan is not None else None
        self.result.records.append(EventRecord(
            t, [e if isinstance(e, str) else describe_event(e) for e in evs], action, latency, mig, down, moved,
            rep.samples_per_s if rep is not None else 0.0, rep.num_gpus if rep is not None else 0,
            _usd_per_h(rep), lost, remote_only))


class _Adaptive(_Runner):
    """warm / cold: re-plan at every change."""

    def __init__(self, *args):
        super().__init__(*args)
        # re-plans for the cluster the pending notices announce: state key -> (result, latency, started at)
        self.prepared: dict[tuple, tuple[ReplanResult | None, float, float]] = {}
        base = self.opts.replan
        self.ropts = ReplanOptions(**{**base.__dict__, "warm": self.name == "warm",
                                      "change_cost_s": max(base.change_cost_s, self.opts.restart_s),
                                      "horizon_s": self.opts.plan_horizon_s or base.horizon_s})
        self.changed_at = self.t  # the last change of the cluster (re-checks count from it)

    def _replan(self, state: ClusterState, horizon_s: float | None = None) -> tuple[ReplanResult | None, float]:
        """The re-plan for `state` and its latency; `horizon_s`: weigh the change penalty against
        that instead of `plan_horizon_s`."""
        t0 = time.perf_counter()
        ropts = self.ropts if horizon_s is None else replace(self.ropts, horizon_s=horizon_s)
        try:
            res = replan(self.instance, self.plan, state, ropts, lost_gpus=self.lost, planner_cache=self.cache,
                         estimators=self.est(state))
        except HetplanError:
            res = None
        measured = res.latency_s if res is not None else time.perf_counter() - t0
        return res, (self.opts.fixed_latency_s if self.opts.fixed_latency_s is not None else measured)

    def on_notice(self, t: float, notices: list[PreemptionNotice]) -> None:
        self.record(t, notices, "prepared", latency=self._prepare(t))

    def after_change(self, t: float) -> None:
        """A change between a notice and its drop makes the head start's re-plan stale (another
        network, other GPUs): the drop then re-planned from scratch, with no head start at all."""
        self._prepare(t)

    def _prepare(self, t: float) -> float:
        """Start the re-plan for the cluster the pending notices announce, unless one for that
        cluster runs already (a later notice of the same cluster kept the earlier head start);
        its latency (0 when none started)."""
        predicted = self.state.predicted()
        if not self.state.pending or predicted.key() in self.prepared:
            return 0.0
        res, latency = self._replan(predicted)
        self.prepared[predicted.key()] = (res, latency, t)
        return latency

    def call_off(self, action: str) -> None:
        """Drop a switch whose re-plan had not finished (the old plan still training): it was
        recorded with its downtime, and `plan` named the new plan, so a re-plan latency longer than
        the time to the next change reported switches that never happened."""
        if self.deploying is not None and self.phases and self.phases[0][1] == "train":
            rec = self.result.records[self.deploying]
            self.result.records[self.deploying] = replace(
                rec, action=action, migration_s=0.0, downtime_s=0.0, moved_ranks=0, remote_only_s=0.0,
                samples_per_s=self.phases[0][2].samples_per_s, gpus=self.phases[0][2].num_gpus,
                usd_per_h=_usd_per_h(self.phases[0][2]))
            self.plan, self.report, self.phases, self.deploying = self.holder, self.phases[0][2], [], None

    def on_recheck(self, t: float) -> None:
        """The cluster has been stable for `stable` s since a re-plan whose change penalty turned
        down a better plan: ask again, the penalty weighed against `stable` s (or the plan horizon,
        if longer); switch as at a change where the old plan trains on (nothing lost)."""
        stable = t - self.changed_at
        if not self.training:  # a switch under way was chosen at the change
            return
        res, latency = self._replan(self.state, max(self.ropts.horizon_s, stable))
        if res is not None and res.plan is not None and not same_plan(res.plan, self.plan):
            self._switch(t, res, latency, 0.0, 0.0, True, [f"stable for {stable:g} s: re-check"])
        self._recheck_at(res, self.changed_at + 2 * stable)

    def _recheck_at(self, res: ReplanResult | None, t: float) -> None:
        """Ask again at t if the change penalty turned a better plan down."""
        if res is not None and res.report is not None and _declined(self.instance.objective.kind, res):
            self.recheck_s = t

    def on_change(self, t: float, changes: list[Event], announced: bool) -> None:
        self.call_off("superseded")
        self.changed_at, self.recheck_s = t, None
        old_valid = self.plan is not None and self.state.plan_is_valid(self.plan) and not (
            self.lost & {(r.node, g) for st in self.plan.stages for r in st.replicas for g in r.gpus})
        if old_valid:  # it trains on while the re-plan runs, at its rate on the changed network
            self.report = simulate(self.state.instance_view(), self.plan, self.est())
        lost = 0.0 if (announced or old_valid) else self.lose_work(t)
        hidden = 0.0
        if (ready := self.prepared.pop(self.state.key(), None)) is not None:
            res, latency, t_notice = ready
            hidden = min(latency, t - t_notice)
        else:
            res, latency = self._replan(self.state)
        if not self.state.pending:
            self.prepared.clear()
        if res is None or res.plan is None:
            self.plan, self.report = None, None
            self.deploy(t, [])
            self.record(t, changes, "none", latency=latency, lost=lost)
            return
        self._recheck_at(res, t + self.ropts.horizon_s)
        if self.plan is not None and same_plan(res.plan, self.plan) and old_valid:
            self.record(t, changes, "kept", latency=latency, lost=lost)
            return
        self._switch(t, res, latency, hidden, lost, old_valid, changes)

    def _switch(self, t: float, res: ReplanResult, latency: float, hidden: float, lost: float, old_valid: bool,
                changes: list[Event] | list[str]) -> None:
        """Deploy `res.plan`: the old plan (if still valid) trains through the re-plan's latency
        not hidden by a notice, then migration and restart."""
        mig, remote_only = self.migration(res.plan)
        wait = latency - hidden
        phases = []
        if old_valid and self.training and wait > 0:
            phases.append((t + wait, "train", self.report, _usd_per_h(self.report)))
            wait_down = 0.0
        else:
            wait_down = wait
        down = wait_down + mig + self.opts.restart_s
        self.plan, self.report = res.plan, res.report
        phases.append((t + wait + mig + self.opts.restart_s, "reconfigure", res.report,
                       _gpu_usd_per_h(self.instance, res.plan)))
        self.deploy(t, phases)
        self.waiting = False
        self.record(t, changes, res.source, latency=latency, mig=mig, down=down, moved=res.moved_ranks, lost=lost,
                    remote_only=remote_only)


class _Static(_Runner):
    """The first plan forever; stop while any of its GPUs is missing."""

    def on_change(self, t: float, changes: list[Event], announced: bool) -> None:
        if self.plan is None:
            self.record(t, changes, "none")
            return
        valid = self.state.plan_is_valid(self.plan)
        view = self.state.instance_view()
        if not valid:
            lost = 0.0 if announced else self.lose_work(t)
            action = "continue" if self.waiting else "stop"
            self.waiting = True
            self.deploy(t, [])
            self.record(t, changes, action, lost=lost)
            return
        self.report = simulate(view, self.plan, self.est())
        moved = sum(1 for w in workers(self.instance, self.plan) if (w.node_id, w.local_gpu) in self.lost)
        if not self.waiting and not moved:
            self.record(t, changes, "continue")
            return
        # back after a wait, or its GPUs all up but some lost their state (a node that failed and
        # recovered at this instant): it restarts from the checkpoint
        lost = 0.0 if (self.waiting or announced) else self.lose_work(t)
        mig, remote_only = self.migration(self.plan)
        self.waiting = False
        down = mig + self.opts.restart_s
        self.deploy(t, [(t + down, "reconfigure", self.report, _gpu_usd_per_h(self.instance, self.plan))])
        self.record(t, changes, "resume", mig=mig, down=down, moved=moved, lost=lost, remote_only=remote_only)
