"""Elastic local runs: a supervisor that keeps one training job going while GPUs come and go.

    hetplan run INSTANCE [PLAN] --local --elastic --steps 12 --checkpoint-dir ckpt/ --events events.yaml

The supervisor starts the executor's ranks on this host (runtime/local.py `LocalWorkers`, gloo)
in segments. Every rank takes a layer-wise checkpoint every `checkpoint_every` steps into
CKPT/step_<iteration>/ (runtime/checkpoint.py; the iteration is the data position, so a resumed
run reads exactly the samples it would have read), touches a heartbeat file every `heartbeat_s`,
and stops after the step that completes iteration N once the supervisor writes N into its
control file (all ranks stop at the same step: the request rides on the step's all_gather).
The control file also names the next fault's step: the ranks wait there until the supervisor has
injected the fault and names the one after (without the wait, a step shorter than a poll could
carry the job past a fault).

What the supervisor watches, and what it does on each (Sailor sec. 4.4: reconfigure the job
instead of killing it; AutoHet sec. IV: layer-wise checkpoints, TP split/merge, local copies
first):

* a rank that exits (killed, crashed): the others are stopped; the ranks' GPUs that held state
  are taken as lost; warm re-plan on the same cluster (orchestration/replan.py), resume from the newest
  complete checkpoint. Steps after that checkpoint are trained again (none with checkpoint_every
  1: the step in flight had not completed);
* a rank whose heartbeat is older than `heartbeat_timeout_s` (a stopped or wedged process): as
  above, after killing every rank;
* an availability change (`lose`/`gain` events at a step, Sailor trace rows time-scaled, or
  entries appended to a watched events file): the cluster state is updated. A loss that takes
  GPUs of the running plan stops the ranks at the event's step boundary (an at_step event) or
  at the next one, then re-plans; a loss of idle GPUs changes nothing; a gain (or a loss of idle
  GPUs) is re-planned while the ranks keep training, and the ranks stop only when the new plan
  differs from the running one.

Each reconfiguration is logged with its downtime split into detect (fault or boundary -> every
old rank gone; for a stop at a boundary: minus the checkpoint), re-plan (only when it ran while
nothing trained), state transfer (checkpoint written at the stop + slowest rank's load) and
restart (new processes, rendezvous, building the stages). The migration a cluster would do
(runtime/migrate.py: local copies first, then peers, then remote storage) is reported beside
it; on one host every file is local. The global batch never changes (the plan's microbatch
shares do), so the final parameters equal an uninterrupted run's.

Events file (YAML or JSON list):

    - {at_step: 4, lose: {gpu_type: V100-16, zone: us-central1-a, count: 4}}
    - {at_step: 6, kill_rank: 2}
    - {at_step: 8, gain: {gpu_type: A100-40, zone: us-central1-a, count: 4}}
    - {at_step: 9, hang_rank: 1}          # SIGSTOP: the heartbeat timeout must catch it
    - {at_s: 30, fail_node: a100-3}       # seconds since the start (wall)

`at_step: k` fires once k iterations are done; every entry has at_step or at_s, and a fault
(kill_rank, hang_rank) has at_step. A watched file (`watch`) is re-read while the job runs;
entries appended to it fire when seen (their at_step / at_s are ignored; faults there are
ignored), so an operator or a cloud hook can write
`- {lose: {gpu_type: V100-16, zone: us-central1-a, count: 4}}`.
"""
from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from hetplan.catalog import Int, PositiveInt, numbers_only
from hetplan.cluster_state import ClusterState, Event, NodeFailure, describe_event
from hetplan.errors import InfeasibleError, InstanceError, PlanError, RunFailedError
from hetplan.instance import SANE_RANGES, AvailabilityEvent, Instance, format_validation_error, read_structured
from hetplan.plan import Plan, validate_plan
from hetplan.orchestration.replan import ReplanOptions, ReplanSession, replan, same_plan
from hetplan.runtime import checkpoint
from hetplan.runtime.execute import (NEVER, RunOptions, check_checkpoint, read_control, ready_path, steps_log_path,
                                     write_control)
from hetplan.runtime.local import LaunchError, LocalWorkers, _check_options, steps_done
from hetplan.runtime.migrate import migration_plan
from hetplan.orchestration.regroup import runnable_tp
from hetplan.runtime.spec import build_spec

_STRICT = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
POLL_S = 0.02
# Rank failures in a row, none of them injected and none after a step was checkpointed, before the
# supervisor gives up: a failure that restarting does not cure (a corrupt checkpoint, a model that
# does not fit) otherwise ran to `max_reconfigurations` restarts (50, tens of seconds).
MAX_FAILURES_WITHOUT_PROGRESS = 3
MAX_TIME_S = SANE_RANGES["time_s"][1]  # an event's at_s, as an instance's event times


class GpuChange(BaseModel):
    model_config = _STRICT
    gpu_type: str
    zone: str
    count: PositiveInt


class ElasticEvent(BaseModel):
    """One line of an events file: when (at_step or at_s; neither: when seen) and one action."""

    model_config = _STRICT
    # true/false are not counts or times (pydantic reads them as 1 and 0: `kill_rank: true` killed rank 1)
    at_step: Annotated[Int, Field(ge=1)] | None = None
    at_s: Annotated[float, Field(ge=0, le=MAX_TIME_S), BeforeValidator(numbers_only("seconds"))] | None = None
    lose: GpuChange | None = None
    gain: GpuChange | None = None
    kill_rank: Annotated[Int, Field(ge=0)] | None = None
    hang_rank: Annotated[Int, Field(ge=0)] | None = None
    fail_node: str | None = None

    @model_validator(mode="after")
    def _one_action(self) -> "ElasticEvent":
        actions = [k for k in ("lose", "gain", "kill_rank", "hang_rank", "fail_node") if getattr(self, k) is not None]
        if len(actions) != 1:
            raise ValueError("an event has exactly one of lose, gain, kill_rank, hang_rank, fail_node "
                             f"(got {actions or 'none'})")
        if self.at_step is not None and self.at_s is not None:
            raise ValueError("an event has at most one of at_step and at_s")
        return self

    @property
    def is_fault(self) -> bool:
        """A fault the supervisor injects into a rank (emulation of a crash or a hang)."""
        return self.kill_rank is not None or self.hang_rank is not None

    def describe(self) -> str:
        if self.lose or self.gain:
            ch = self.lose or self.gain
            return f"{'lose' if self.lose else 'gain'} {ch.count} {ch.gpu_type}@{ch.zone}"
        if self.kill_rank is not None:
            return f"kill rank {self.kill_rank}"
        if self.hang_rank is not None:
            return f"hang rank {self.hang_rank}"
        return f"node {self.fail_node} fails"


def check_timed(ev: ElasticEvent, where: str) -> None:
    """An event of --events (not of a watched file) fires at its at_step or at_s: one with neither
    was dropped without a word, and a fault at an at_s was ignored (faults are injected only at a
    step, `_watch`)."""
    if ev.at_step is None and ev.at_s is None:
        raise InstanceError(f"'{ev.describe()}' has neither at_step nor at_s, so it would never fire (entries "
                            "that fire when seen belong in the --watch file)", where)
    if ev.is_fault and ev.at_step is None:
        raise InstanceError(f"'{ev.describe()}' needs at_step: faults are injected at a step boundary, at_s "
                            "is for availability changes and fail_node", where)


def parse_events(data: Any, where: str, watched: bool = False) -> list[ElasticEvent]:
    """`watched`: entries of a --watch file, which fire when seen (no at_step or at_s needed)."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise InstanceError("an events file is a list of events, e.g. "
                            "`- {at_step: 4, lose: {gpu_type: V100-16, zone: z, count: 4}}`", where)
    out = []
    for i, item in enumerate(data):
        try:
            out.append(ElasticEvent.model_validate(item))
        except ValidationError as exc:
            raise InstanceError(format_validation_error(exc), f"{where}[{i}]") from None
        if not watched:
            check_timed(out[-1], f"{where}[{i}]")
    return out


def read_events(path: str | Path, watched: bool = False) -> list[ElasticEvent]:
    return parse_events(read_structured(Path(path)), str(path), watched)


# ---- options and results --------------------------------------------------------------------------
@dataclass(frozen=True)
class ElasticOptions:
    steps: int
    checkpoint_dir: Path
    out_dir: Path
    events: tuple[ElasticEvent, ...] = ()
    # cluster events (cluster_state.event_stream: the instance's events, a Sailor trace) in
    # trace seconds: those at 0 give the starting cluster, the others fire at time_s / time_scale
    cluster_events: tuple[Event, ...] = ()
    time_scale: float = 1.0  # trace seconds per wall second
    watch: Path | None = None
    heartbeat_s: float = 0.25
    heartbeat_timeout_s: float = 10.0
    startup_timeout_s: float = 120.0  # before a rank's first heartbeat (process start, imports)
    checkpoint_every: int = 1
    max_reconfigurations: int = 50
    replan: ReplanOptions = field(default_factory=lambda: ReplanOptions(planner_time_limit_s=1.0))
    model: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    optimizer: str | None = None
    lr: float | None = None
    seed: int = 0
    collective_timeout_s: float = 120.0
    dump_params: bool = False  # the last segment dumps its parameters (out_dir/segment_<k>/params)
    quiet: bool = False

    def __post_init__(self) -> None:
        checks = [(self.steps >= 1, f"steps must be at least 1, got {self.steps}", "steps"),
                  (self.checkpoint_every >= 1, "checkpoint_every must be at least 1", "checkpoint_every"),
                  (self.time_scale > 0, f"time_scale must be positive, got {self.time_scale}", "time_scale"),
                  (0 < self.heartbeat_s < self.heartbeat_timeout_s,
                   "the heartbeat interval must be positive and below the heartbeat timeout", "heartbeat_timeout_s")]
        for ok, msg, where in checks:
            if not ok:
                raise PlanError(msg, where)
        for i, ev in enumerate(self.events):  # for callers that skip parse_events
            check_timed(ev, f"events[{i}]")


@dataclass(frozen=True)
class Reconfiguration:
    cause: str
    kind: str  # failure | hang | availability
    at_iteration: int  # iterations done (the checkpoint resumed from)
    plan_before: str
    plan_after: str
    plan_changed: bool
    gpus_before: int
    gpus_after: int
    moved_ranks: int
    steps_redone: int
    detect_s: float
    replan_s: float
    state_transfer_s: float
    restart_s: float
    replan_overlapped_s: float = 0.0  # re-planning done while the old plan trained (not downtime)
    migration: dict[str, Any] = field(default_factory=dict)

    @property
    def downtime_s(self) -> float:
        return self.detect_s + self.replan_s + self.state_transfer_s + self.restart_s

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "downtime_s": self.downtime_s}


@dataclass(frozen=True)
class ElasticResult:
    steps_completed: int
    samples_trained: int
    reconfigurations: list[Reconfiguration]
    absorbed: list[str]  # events that needed no restart
    plans: list[dict[str, Any]]  # the plans used, each with the iteration it started at
    losses: list[float]  # per iteration, from the run that committed it
    wall_s: float
    out_dir: Path
    last_segment_dir: Path
    final_plan: Plan
    resumed_from: int = 0  # the iteration of the checkpoint the run started from (0: none)

    @property
    def downtime_s(self) -> float:
        return sum(r.downtime_s for r in self.reconfigurations)

    def summary(self) -> dict[str, Any]:
        return {"steps_completed": self.steps_completed, "samples_trained": self.samples_trained,
                "resumed_from": self.resumed_from,
                "downtime_s": self.downtime_s, "wall_s": self.wall_s,
                "reconfigurations": [r.summary() for r in self.reconfigurations],
                "absorbed_events": self.absorbed, "plans": self.plans, "losses": self.losses,
                "out_dir": str(self.out_dir)}


# ---- the supervisor -------------------------------------------------------------------------------
@dataclass
class _Stop:
    """Why a segment ended, with what the supervisor knew when it saw it."""

    kind: str  # finished | boundary | failure | hang
    cause: str
    seen_wall: float  # time.time() when every old rank was gone
    trigger_wall: float  # the fault, or when the boundary step was seen done
    done: int  # iterations the ranks had completed
    lost_ranks: tuple[int, ...] = ()
    uninjected: str = ""  # a failure no fault event caused: the ranks' error message


@dataclass
class _Pending:
    """A reconfiguration waiting for its new ranks to be ready (restart and load are measured then)."""

    stop: _Stop
    before: Plan
    after: Plan
    moved: int
    replan_s: float
    overlapped_s: float
    resumed: int
    save_s: float
    relaunch_wall: float
    migration: dict[str, Any]


class _Supervisor:
    def __init__(self, instance: Instance, plan: Plan, state: ClusterState, opts: ElasticOptions,
                 log: Callable[[str], None]):
        self.inst, self.plan, self.state, self.opts, self.log = instance, plan, state, opts, log
        self.todo = sorted((e for e in opts.events if e.at_step is not None), key=lambda e: e.at_step)
        self.timed = sorted([(e.at_s, e) for e in opts.events if e.at_s is not None] +
                            [(ev.time_s / opts.time_scale, ev) for ev in opts.cluster_events], key=lambda x: x[0])
        self.watch_seen = 0
        self.watch_mtime = 0.0
        self.reconfs: list[Reconfiguration] = []
        self.absorbed: list[str] = []
        self.base_name = plan.name or instance.name
        self.plans = [plan_row(plan, 0)]
        self.losses: dict[int, float] = {}
        self.next_plan: Plan | None = None  # found by a re-plan while training
        self.next_cause = ""
        self.called_off = ""  # a switch called off after the ranks were asked to stop
        self.overlapped_s = 0.0
        self.planned_stop = NEVER  # the running segment's stop for at_step events
        self.session = ReplanSession()  # estimator figures and planner tables kept across events
        self.t0 = time.monotonic()

    # -- segments ----------------------------------------------------------------------------------
    def run(self) -> ElasticResult:
        opts = self.opts
        opts.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        done = first = self._committed()
        pending: _Pending | None = None
        segment, stuck = 0, 0
        seg_dir = opts.out_dir
        while done < opts.steps:
            if len(self.reconfs) >= opts.max_reconfigurations:
                raise LaunchError(f"gave up after {len(self.reconfs)} reconfigurations at iteration {done}")
            seg_dir = opts.out_dir / f"segment_{segment:03d}"
            stop = self._segment(seg_dir, done, pending)
            pending = None
            self._collect_losses(seg_dir)
            resumed = self._committed()
            if resumed >= opts.steps:
                break
            stuck = stuck + 1 if stop.uninjected and resumed == done else 0
            if stuck >= MAX_FAILURES_WITHOUT_PROGRESS:
                raise LaunchError(f"gave up at iteration {done}: the ranks failed {stuck} times in a row, with no "
                                  f"fault injected and no step done: {stop.uninjected}")
            pending = self._reconfigure(stop, resumed)
            done = resumed
            segment += 1
        done = self._committed()
        if self.next_cause:  # a stop was asked for, but the last step came first
            self.absorbed.append(f"{self.next_cause}: the run ended at iteration {done} before switching")
            self.log(self.absorbed[-1])
        return ElasticResult(steps_completed=done, samples_trained=done * self.inst.workload.global_batch_size,
                             reconfigurations=self.reconfs, absorbed=self.absorbed, plans=self.plans,
                             losses=[self.losses[i] for i in sorted(self.losses) if i < opts.steps],
                             wall_s=time.monotonic() - self.t0, out_dir=opts.out_dir, last_segment_dir=seg_dir,
                             final_plan=self.plan, resumed_from=first)

    def _committed(self) -> int:
        return committed(self.opts.checkpoint_dir)

    def _segment(self, seg_dir: Path, done: int, pending: _Pending | None) -> _Stop:
        opts = self.opts
        seg_dir.mkdir(parents=True, exist_ok=True)
        spec = build_spec(self.inst, self.plan)
        spec_path = spec.save(seg_dir / "launch_spec.json")
        control = seg_dir / "control"
        self.planned_stop = self._planned_stop(done)
        write_control(control, stop=self.planned_stop, hold=self._next_fault_step(done))
        checkpoint.set_aside(opts.checkpoint_dir, self.log)
        last = checkpoint.latest(opts.checkpoint_dir)
        run = RunOptions(steps=opts.steps - done, model=dict(opts.model), dtype=opts.dtype, optimizer=opts.optimizer,
                         lr=opts.lr, seed=opts.seed, backend="gloo", log_path=str(seg_dir / "log.json"),
                         dump_dir=str(seg_dir / "params") if opts.dump_params else None,
                         save_checkpoint=str(opts.checkpoint_dir), load_checkpoint=str(last) if last else None,
                         timeout_s=opts.collective_timeout_s, quiet=True, progress_dir=str(seg_dir),
                         checkpoint_every=opts.checkpoint_every, control_path=str(control),
                         heartbeat_s=opts.heartbeat_s)
        _check_options(spec, run, warn=False)  # the run's start said it (_check_resumable)
        workers = LocalWorkers(spec, spec_path, run, seg_dir)
        box: list[_Pending] = [pending] if pending is not None else []
        try:
            return self._watch(workers, seg_dir, control, done, box)
        finally:
            workers.close()
            if box:  # the segment ended before every rank was ready: record what is known
                self._ready(seg_dir, spec.world_size, box[0], force=True)

    def _planned_stop(self, done: int) -> int:
        """The first at_step event that changes the plan's world: a gain, or a loss that takes
        GPUs of the running plan. The ranks stop exactly at its boundary (where the GPUs appear
        or disappear); losses of idle GPUs before it are applied without a stop."""
        state = self.state
        for ev in self.todo:
            if ev.at_step > done and not ev.is_fault:
                state = state.apply(self._cluster_event(ev, state))
                if ev.gain or not state.plan_is_valid(self.plan):
                    return ev.at_step
        return NEVER

    def _next_fault_step(self, done: int) -> int:
        """Where the ranks wait for the supervisor: the next fault's step boundary (without the
        wait, a fast step could end the job before the fault is injected)."""
        return min((ev.at_step for ev in self.todo if ev.is_fault and ev.at_step > done), default=NEVER)

    def _watch(self, workers: LocalWorkers, seg_dir: Path, control: Path, base: int,
               pending: list[_Pending]) -> _Stop:
        """Poll the ranks until the segment ends; `pending` (0 or 1 reconfiguration waiting for
        its new ranks) is emptied once recorded."""
        world = workers.spec.world_size
        planned, held = read_control(control)
        faults: dict[int, float] = {}  # rank -> wall time we injected its fault
        boundary_wall = None
        while True:
            done = base + steps_done(seg_dir, world)
            if pending and self._ready(seg_dir, world, pending[0]):
                pending.clear()
            if done >= planned and boundary_wall is None:
                boundary_wall = time.time()
            for ev in self._due_step_events(done, planned):
                if ev.is_fault:
                    rank = ev.kill_rank if ev.kill_rank is not None else ev.hang_rank
                    if rank >= world:  # the job goes on: a test fault aimed at nothing is no reason to stop
                        self.log(f"iteration {done}: ignored '{ev.describe()}': the running plan has {world} ranks")
                        continue
                    faults[rank] = time.time()
                    workers.signal(rank, signal.SIGKILL if ev.kill_rank is not None else signal.SIGSTOP)
                    self.log(f"iteration {done}: {ev.describe()} (pid {workers.pids[rank]})")
                else:  # a loss of GPUs the plan does not use (_planned_stop)
                    self._apply(ev)
                    self.absorbed.append(f"iteration {done}: {ev.describe()} (idle GPUs: plan kept)")
                    self.log(self.absorbed[-1])
            if (hold := self._next_fault_step(done)) != held:  # its fault injected: release the ranks
                held = hold
                write_control(control, hold=held)
            for ev in self._due_async_events():
                self._arrive(ev, lambda: base + steps_done(seg_dir, world), control)
            if failed := workers.failed():
                killed = [r for r in failed if r in faults] or failed
                r, code = killed[0], workers.codes()[killed[0]]
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
                message = workers.failure_message()
                self.log(f"iteration {done}: {message}")
                trigger = faults.get(r, time.time())
                return _Stop("failure", f"rank {r} {how}", time.time(), trigger, done, tuple(killed),
                             "" if r in faults else message)
            # the heartbeat timeout holds once a rank is ready (imports, rendezvous and building
            # the stage may hold the GIL for long); before, the startup timeout does
            ready = [ready_path(seg_dir, r).exists() for r in range(world)]
            ages = workers.heartbeat_age_s()
            hung = [r for r, age in enumerate(ages) if ready[r] and age is not None and age > self.opts.heartbeat_timeout_s]
            if hung:
                r = ([h for h in hung if h in faults] or hung)[0]
                return self._hung(workers, f"rank {r} sent no heartbeat for {ages[r]:.1f} s (timeout "
                                  f"{self.opts.heartbeat_timeout_s:g} s)", faults.get(r, time.time() - ages[r]),
                                  done, tuple(hung))
            if time.monotonic() - workers.started_at > self.opts.startup_timeout_s and not all(ready):
                r = ready.index(False)
                return self._hung(workers, f"rank {r} was not ready within {self.opts.startup_timeout_s:g} s",
                                  time.time(), done, (r,))
            if workers.finished():
                done = base + steps_done(seg_dir, world)
                kind = "finished" if done >= self.opts.steps else "boundary"
                return _Stop(kind, self.next_cause, time.time(), boundary_wall or time.time(), done)
            time.sleep(POLL_S)

    def _hung(self, workers: LocalWorkers, cause: str, trigger_wall: float, done: int,
              ranks: tuple[int, ...]) -> _Stop:
        """Stop every rank of a segment with a hung rank (they would wait on it in collectives)."""
        workers.close()
        self.log(f"iteration {done}: {cause}; every rank stopped")
        return _Stop("hang", cause, time.time(), trigger_wall, done, ranks)

    def _ready(self, seg_dir: Path, world: int, p: _Pending, force: bool = False) -> bool:
        """Once every new rank is ready, the reconfiguration's restart and load times are known
        and it is recorded. `force`: record it now (the segment ended before that), with the
        ranks that did get ready."""
        rows = []
        for r in range(world):
            try:
                rows.append(json.loads(ready_path(seg_dir, r).read_text()))
            except (OSError, ValueError):
                if not force:
                    return False
        load_s = max((row["load_s"] for row in rows), default=0.0)
        ready_wall = max((row["ready_at"] for row in rows), default=time.time())
        stop = p.stop
        detect_s = max(stop.seen_wall - stop.trigger_wall - p.save_s, 0.0)
        rec = Reconfiguration(
            cause=stop.cause, kind=stop.kind if stop.kind != "boundary" else "availability",
            at_iteration=p.resumed, plan_before=p.before.name, plan_after=p.after.name,
            plan_changed=not same_plan(p.before, p.after), gpus_before=p.before.num_gpus, gpus_after=p.after.num_gpus,
            moved_ranks=p.moved, steps_redone=max(stop.done - p.resumed, 0), detect_s=detect_s, replan_s=p.replan_s,
            state_transfer_s=p.save_s + load_s, restart_s=max(ready_wall - p.relaunch_wall - load_s, 0.0),
            replan_overlapped_s=p.overlapped_s, migration=p.migration)
        self.reconfs.append(rec)
        self.log(f"reconfigured at iteration {rec.at_iteration} ({rec.cause}): {rec.plan_before} -> {rec.plan_after} "
                 f"({rec.gpus_before} -> {rec.gpus_after} GPUs), downtime {rec.downtime_s:.2f} s = detect "
                 f"{rec.detect_s:.2f} + re-plan {rec.replan_s:.2f} + state {rec.state_transfer_s:.2f} + restart "
                 f"{rec.restart_s:.2f}")
        return True

    # -- events ------------------------------------------------------------------------------------
    def _due_step_events(self, done: int, planned: int) -> list[ElasticEvent]:
        """at_step events now due, except those of the planned stop (applied once the ranks stopped)."""
        due = [e for e in self.todo if e.at_step <= done and (e.is_fault or e.at_step < planned)]
        self.todo = [e for e in self.todo if e not in due]
        return due

    def _due_async_events(self) -> list:
        elapsed = time.monotonic() - self.t0
        due = [ev for t, ev in self.timed if t <= elapsed]
        self.timed = [(t, ev) for t, ev in self.timed if t > elapsed]
        return due + self._poll_watch()

    def _poll_watch(self) -> list[ElasticEvent]:
        path = self.opts.watch
        if path is None or not path.exists() or path.stat().st_mtime == self.watch_mtime:
            return []
        self.watch_mtime = path.stat().st_mtime
        try:
            events = read_events(path, watched=True)
        except InstanceError as exc:  # an operator's typo must not kill the job
            self.log(f"ignored {path}: {exc}")
            return []
        new, self.watch_seen = events[self.watch_seen:], max(self.watch_seen, len(events))
        for ev in new:
            if ev.is_fault:  # "faults need at_step" was logged, also for an entry that had one
                self.log(f"ignored '{ev.describe()}' in {path}: a watched entry fires when seen (its at_step "
                         "and at_s are not read), and faults are injected only at an at_step of --events")
        return [ev for ev in new if not ev.is_fault]

    def _cluster_event(self, ev: ElasticEvent | Event, state: ClusterState) -> Event:
        return cluster_event(ev, state, time.monotonic() - self.t0)

    def _apply(self, ev: ElasticEvent | Event) -> ClusterState:
        """Apply `ev` to the cluster, saying what it could not do as written (a loss of more GPUs
        than are up, a gain past the cluster's GPUs): both used to be cut to fit without a word."""
        notes = len(self.state.clamped)
        if isinstance(ev, ElasticEvent) and ev.lose is not None:
            up = self.state.requested_gpus((ev.lose.gpu_type, ev.lose.zone))
            if ev.lose.count > up:
                self.log(f"'{ev.describe()}': {up} were up, all of them lost")
        self.state = self.state.apply(self._cluster_event(ev, self.state))
        for note in self.state.clamped[notes:]:
            self.log(f"'{self._describe(ev)}': {note}")
        return self.state

    def _describe(self, ev: ElasticEvent | Event) -> str:
        return ev.describe() if isinstance(ev, ElasticEvent) else describe_event(ev)

    def _arrive(self, ev, position: Callable[[], int], control: Path) -> None:
        """An availability change seen while training (trace, at_s, watched file): stop at the
        next boundary if it takes running GPUs; otherwise re-plan now, while the ranks train, and
        stop only for a different plan. Never a fault: `check_timed` refuses one with at_s, and
        `_poll_watch` leaves out the watched ones. `position`: the iterations done now (the ranks
        train on while this re-plans, so the stop is set from where they are once it is known)."""
        new = self._apply(ev)
        what = self._describe(ev)
        if not new.plan_is_valid(self.plan):
            self.next_plan, self.next_cause = None, what
            self._stop_next(control, position(), f"{what} takes GPUs of the running plan")
            return
        t = time.perf_counter()
        res = replan(self.inst, self.plan, new, self.opts.replan, session=self.session)
        spent = time.perf_counter() - t
        done = position()
        if res.plan is None or same_plan(res.plan, self.plan):
            # a switch asked for by an earlier change is off: its plan was found for a cluster
            # that is gone (it may not even fit this one)
            dropped = f"; the switch asked for by {self.next_cause} is off" if self.next_cause else ""
            if dropped:
                self.called_off = f"{self.next_cause} (its switch called off by {what})"
                self.next_plan, self.next_cause = None, ""
                write_control(control, stop=self.planned_stop)
            self.absorbed.append(f"iteration {done}: {what} (re-planned in {spent:.2f} s: plan kept{dropped})")
            self.log(self.absorbed[-1])
            return
        self.next_plan, self.next_cause, self.overlapped_s = res.plan, what, spent
        self._stop_next(control, done, f"{what}: a better plan found in {spent:.2f} s while training")

    def _stop_next(self, control: Path, done: int, why: str) -> None:
        """Ask the ranks to stop after the step in flight. A rank that read the control file
        before this write finishes one more step, so the iteration the run really stops at is
        the reconfiguration's (logged when the new ranks are ready)."""
        write_control(control, stop=done + 1)
        if done + 1 < self.opts.steps:
            self.log(f"iteration {done}: {why}; stopping after the step in flight")
        else:
            self.log(f"iteration {done}: {why}; the run ends at its last step before it could switch")

    # -- reconfiguration ---------------------------------------------------------------------------
    def _reconfigure(self, stop: _Stop, resumed: int) -> _Pending:
        before = self.plan
        replan_s, overlapped = 0.0, 0.0
        lost: list[tuple[str, int]] = []
        if stop.kind == "boundary" and not self.next_cause:
            # the planned stop: apply the at_step changes due there
            due = [e for e in self.todo if e.at_step <= resumed and not e.is_fault]
            self.todo = [e for e in self.todo if e not in due]
            for ev in due:
                self._apply(ev)
            stop.cause = ", ".join(e.describe() for e in due) or self.called_off or "stopped"
        if stop.kind in ("failure", "hang"):
            rows = build_spec(self.inst, before).ranks
            lost = [(rows[r].node, rows[r].gpu_index) for r in stop.lost_ranks]
        if self.next_plan is not None and stop.kind == "boundary":
            after, overlapped = self.next_plan, self.overlapped_s
            moved = 0
        else:
            t = time.perf_counter()
            try:
                res = replan(self.inst, before, self.state, self.opts.replan, lost_gpus=lost, session=self.session)
            except InfeasibleError as exc:
                raise LaunchError(f"cannot continue at iteration {resumed}: {exc}") from None
            replan_s = time.perf_counter() - t
            after, moved = res.plan, res.moved_ranks
            if after is None:  # no GPU is up (replan's answer, not an error): the run cannot go on
                raise LaunchError(f"cannot continue at iteration {resumed}: {'; '.join(res.notes) or 'no GPU is up'}")
        self.next_plan, self.next_cause, self.overlapped_s, self.called_off = None, "", 0.0, ""
        last = checkpoint.latest(self.opts.checkpoint_dir)
        meta = checkpoint.read_meta(last) if last is not None else {}
        save_s = float(meta.get("save_s", 0.0)) if stop.kind == "boundary" else 0.0
        try:
            mig = migration_plan(self.inst, before, after, self.state).summary()
        except PlanError as exc:
            mig = {"note": str(exc)}
        self.plan = validate_plan(self.inst, after)
        if not same_plan(before, self.plan):
            self.plan = self.plan.model_copy(update={"name": f"{self.base_name}@{resumed}"})
            self.plans.append(plan_row(self.plan, resumed))
        else:
            self.plan = self.plan.model_copy(update={"name": before.name})
        return _Pending(stop, before, self.plan, moved, replan_s, overlapped, resumed, save_s, time.time(), mig)

    def _collect_losses(self, seg_dir: Path) -> None:
        path = steps_log_path(seg_dir)
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                self.losses[row["iteration"]] = row["loss"]


def plan_row(plan: Plan, from_iteration: int) -> dict[str, Any]:
    """One line of the plans used: where it started, its shape and GPUs."""
    gpus: dict[str, int] = {}
    for st in plan.stages:
        for rep in st.replicas:
            gpus[rep.gpu_type] = gpus.get(rep.gpu_type, 0) + rep.tp
    return {"from_iteration": from_iteration, "name": plan.name, "stages": len(plan.stages),
            "gpus": plan.num_gpus, "gpus_by_type": gpus, "num_microbatches": plan.num_microbatches}


def initial_state(instance: Instance, events: tuple[Event, ...]) -> ClusterState:
    """The cluster at the start: the events at time 0 applied."""
    return ClusterState.initial(instance).apply_all(ev for ev in events if ev.time_s <= 0)


def cluster_event(ev: ElasticEvent | Event, state: ClusterState, t: float) -> Event:
    """`ev` as the cluster event it is at `t` seconds (a lose/gain counts from what `state` has)."""
    if not isinstance(ev, ElasticEvent):
        return ev.model_copy(update={"time_s": max(t, state.time_s)})
    if ev.fail_node is not None:
        return NodeFailure(time_s=t, node=ev.fail_node)
    ch, sign = (ev.lose, -1) if ev.lose else (ev.gain, 1)
    have = state.requested_gpus((ch.gpu_type, ch.zone)) if (ch.gpu_type, ch.zone) in state.quota else 0
    return AvailabilityEvent(time_s=t, gpu_type=ch.gpu_type, zone=ch.zone, available_gpus=max(have + sign * ch.count, 0))


def committed(checkpoint_dir: Path) -> int:
    """The iteration of the newest complete checkpoint in the folder (0: none)."""
    last = checkpoint.latest(checkpoint_dir)
    return checkpoint.read_meta(last)["iteration"] if last is not None else 0


def check_events(state: ClusterState, events: tuple[ElasticEvent, ...]) -> None:
    """Refuse, before anything runs, an event that names GPUs or a node the cluster lacks, or a
    rank no plan on it can have (one per GPU): found only when it fired, mid-run (a bad GPU type
    ended the run there; a rank beyond the world was logged as ignored)."""
    gpus = sum(node.num_gpus for node in state.instance.nodes)
    for i, ev in enumerate(events):
        where = f"events[{i}]"
        rank = ev.kill_rank if ev.kill_rank is not None else ev.hang_rank
        if rank is not None and rank >= gpus:
            raise InstanceError(f"rank {rank} does not exist: the cluster has {gpus} GPUs, so ranks 0-{gpus - 1} "
                                "at most", f"{where}.{'kill_rank' if ev.kill_rank is not None else 'hang_rank'}")
        if ev.lose or ev.gain:
            ch = ev.lose or ev.gain
            state.check(AvailabilityEvent(time_s=0, gpu_type=ch.gpu_type, zone=ch.zone, available_gpus=0),
                        f"{where}.{'lose' if ev.lose else 'gain'}")
        if ev.fail_node is not None:
            try:
                state.check(NodeFailure(time_s=0, node=ev.fail_node), where)
            except InstanceError as exc:  # its field reads `.node`; the file says fail_node
                raise InstanceError(exc.detail, f"{where}.fail_node") from None


def _events_before(first: int, state: ClusterState, opts: ElasticOptions,
                   log: Callable[[str], None]) -> tuple[ClusterState, ElasticOptions, bool]:
    """A run resumed at iteration `first` starts on the cluster its at_step events left there:
    they fired at the first poll, a loss of the plan's GPUs was taken for idle ones, and the run
    trained on GPUs the events said were gone. Faults before it are not injected again. Events at
    or after the last step never fire: said once here."""
    past = [ev for ev in opts.events if ev.at_step is not None and ev.at_step <= first]
    for ev in past:
        if ev.is_fault:
            log(f"'{ev.describe()}' at step {ev.at_step} is not injected: the run resumes at iteration {first}")
        else:
            state = state.apply(cluster_event(ev, state, 0.0))
    changes = [ev.describe() for ev in past if not ev.is_fault]
    if changes:
        log(f"resuming at iteration {first} on the cluster the events before it left: {', '.join(changes)}")
    for ev in opts.events:
        if ev.at_step is not None and ev.at_step >= opts.steps:
            log(f"'{ev.describe()}' at step {ev.at_step} never fires: the run ends at iteration {opts.steps}")
    return state, replace(opts, events=tuple(ev for ev in opts.events if ev not in past)), bool(changes)


def _check_resumable(instance: Instance, plan: Plan, opts: ElasticOptions) -> None:
    """The newest checkpoint in the folder, if any, must be of this run's model and optimizer:
    otherwise every segment's ranks failed on loading it, and the supervisor restarted them until
    `max_reconfigurations` (50 restarts, exit 3)."""
    last = checkpoint.latest(opts.checkpoint_dir)
    if last is not None:
        run = RunOptions(steps=opts.steps, model=dict(opts.model), optimizer=opts.optimizer, dtype=opts.dtype)
        check_checkpoint(build_spec(instance, plan), run, last, "--checkpoint-dir")


def run_elastic(instance: Instance, plan: Plan | None, opts: ElasticOptions,
                log: Callable[[str], None] | None = None) -> ElasticResult:
    """Train `opts.steps` iterations through every event (see the module docstring). `plan`
    None: the planner's plan for the starting cluster. Raises LaunchError when the job cannot go
    on (no plan fits what is left, too many reconfigurations)."""
    state = initial_state(instance, opts.cluster_events)
    check_events(state, opts.events)
    say = log or (lambda _msg: None)
    tp_choices = runnable_tp(instance, opts.model, opts.replan.tp_choices)
    opts = replace(opts, cluster_events=tuple(ev for ev in opts.cluster_events if ev.time_s > 0),
                   replan=replace(opts.replan, tp_choices=tp_choices),
                   checkpoint_dir=opts.checkpoint_dir.resolve(), out_dir=opts.out_dir.resolve())
    checkpoint.set_aside(opts.checkpoint_dir, say)
    first = committed(opts.checkpoint_dir)
    state, opts, changed = _events_before(first, state, opts, say)
    if plan is None:
        res = replan(instance, None, state, opts.replan)
        if res.plan is None:
            raise InfeasibleError("no GPU is up at the start")
        plan = res.plan
    plan = validate_plan(instance, plan)
    if changed and not state.plan_is_valid(plan):
        say(f"resuming at iteration {first}: the given plan uses GPUs the events before it took; re-planning")
        res = replan(instance, plan, state, opts.replan)
        if res.plan is None:
            raise InfeasibleError(f"no GPU is up at iteration {first}: {'; '.join(res.notes)}")
        plan = validate_plan(instance, res.plan)
    state.check_plan(plan)
    _check_resumable(instance, plan, opts)
    sup = _Supervisor(instance, plan, state, opts, say)
    try:
        return sup.run()
    except RunFailedError:
        raise
    except OSError as exc:
        raise LaunchError(f"elastic run failed: {exc}") from None
