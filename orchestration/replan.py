"""Re-plan after a cluster change: repair the running plan, ask the joint planner, keep the better.

`replan(instance, previous_plan, new_state, options)` produces up to four candidates, all placed on
GPUs that are up in `new_state` and scored by the simulator on the state's instance view:

* kept      the previous plan unchanged, when all its GPUs are still up (0 ranks move);
* patched   the previous plan minus lost replicas: surviving stages and replicas stay where they
            are, a stage that lost every replica gets the fastest free GPUs that hold it (or is
            merged into a neighbour), microbatch shares are rebalanced over the survivors
            (uneven shares, Zorse sec. 4.2: a straggler gets fewer sequences; `fill` is min-max
            water filling, optimal for step times that grow with the share);
* repaired  patched, then, for the number of microbatches m in {m, m/2, 2m} (global batch
            unchanged; the simulator picks the m): free GPUs join the bottleneck stage as extra
            replicas (k = 1, 2, 4, ... of one GPU type / zone / TP at a time, to step over the
            plateaus integer shares make); stage boundaries are re-split for the slowest stage
            (`partition`: bisection on the step time with greedy packing); groups of free GPUs
            may form a new stage next to the slowest one (`add_stages`); finally single units move
            across boundaries while a lexicographic (objective, sorted stage times) key improves.
            Inside, moves are ranked by a proxy of the simulator's 1F1B formula (stage step times,
            boundary transfers, DP all-reduce, optimizer step);
* planner   the joint planner (`hetplan.orchestration.planner.plan`, through its public function) run on the
            new availability with a short time limit. With `planner_cutoff` it must beat the best
            candidate so far (passed as a throughput / cost bound, so it prunes outer choices); its
            replicas are placed on the nodes whose GPUs already hold their layers.

Warm start = the candidates built from the previous plan plus that cutoff and the reuse-aware
placement; `warm=False` is re-planning from scratch (the planner alone, placed first-fit), the
baseline the replay compares against. The repair never changes TP degrees of surviving replicas,
and grows the pipeline by at most one stage per group of free GPUs: large changes are the
planner's part, and replan gets faster and better with it.

Changing plans has a price: a rank "moves state" when the GPU it runs on does not already hold
everything it needs (`moved_ranks`: old and new rank tables compared by (node, GPU) and the layer
units / TP shard each holds; see `rank_pieces`). With `move_penalty_s` > 0 each moved rank costs
that many seconds of training over `horizon_s`, and `change_cost_s` is charged once to any candidate
that differs from the running plan (every rank restarts); with lost = change_cost_s x [changed] +
move_penalty_s x moved, a candidate scores

    max_throughput:  samples/s x max(horizon_s - lost, 0) / horizon_s        (higher wins)
    min_cost:        USD per sample x horizon_s / max(horizon_s - lost, eps)  (lower wins, scored negated)

and a candidate that violates the instance's constraints loses to one that does not. Latency
(repair, planner, total) is measured and reported.

Speed (benchmarks/replan.py: Sailor's traces, 160-640 GPUs, every re-plan within a second):

* a `ReplanSession` the caller keeps carries, per network, the memoised estimators, the repair's
  figures and the joint planner's tables (`planner.planner_tables`) from event to event: they
  depend on the instance view and the estimators, not on which GPUs are up;
* `budget_s` bounds the whole re-plan: the repair runs in a forked child beside the planner (which
  then runs without its own helper process) and the planner's limit is what the budget leaves, so
  a warm re-plan searches about as long as a cold planner given its whole wall time, on tables it
  does not rebuild, and adds the repair's candidates (with one core: the repair first, for a share);
* the repair fills shares a level per class of replicas, keys its memos by small ids, keeps each
  stage's figures until the stage changes, and the placement looks up once per replica which GPUs
  hold each rank's state; all give the results the direct computations give;
* what exists when a re-plan starts (the session's tables and memos) sits in the garbage
  collector's permanent generation until it ends (`_frozen`): a full collection over them took
  0.09-0.15 s on 640 GPUs, in about one re-plan of three.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import itertools
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hetplan.catalog import ModelArch
from hetplan.cluster_state import ClusterState
from hetplan.errors import HetplanError, InfeasibleError, PlanError, check_count, check_counts, check_number
from hetplan.estimators import EstimatorSet, build_estimators
from hetplan.estimators.memo import memoised
from hetplan.estimators.base import Endpoint
from hetplan.estimators.model_stats import boundary_activation_bytes, gradient_bytes, sync_volume_factor
from hetplan.instance import Instance
from hetplan.orchestration.planner import PlannerOptions, plan as joint_plan, planner_tables
from hetplan.plan import Plan, Replica, Stage, placement_order, tp_indivisible, validate_plan
from hetplan.formulations.stage_cost import node_endpoint
from hetplan.runtime.pieces import Piece, holdings, holds_all, moved_ranks, rank_pieces
from hetplan.simulator import SimulationReport, in_flight_microbatches, simulate

# ---- options and results --------------------------------------------------------------------------
# A re-plan with a budget (`ReplanOptions.budget_s`) runs the repair in a child process beside the
# planner (`_Beside`) until the planner's share less PLACE_SHARE (the child then scores its plans);
# with one core, first the repair, which stops trying moves at this share of the budget (on 640 GPUs
# it needs ~0.05-0.3 s in full, and it stops with the best plan it has), then the planner...
REPAIR_SHARE = 0.2
# ...the planner's limit is what is left less this share: placing its plan near the GPUs that hold
# its layers, simulating it and the planner's own overrun (measured: 20-60 ms on 640 GPUs)
PLACE_SHARE = 0.08
# ...and when neither the running plan nor its repair is a plan, the planner gets at least this
# share (a plan late beats none)
MIN_PLANNER_SHARE = 0.5
# the planner's limit under which it runs without its helper process (`PlannerOptions.workers` 1):
# on 160-640 GPUs at 0.6-0.9 s limits one process found plans as good or better than two
HELPER_MIN_S = 1.0

@dataclass(frozen=True)
class ReplanOptions:
    warm: bool = True  # False: from scratch (planner only, first-fit placement)
    planner_time_limit_s: float = 1.0  # the joint planner's runs, together; 0 skips it when a repair exists
    planner_combo_time_limit_s: float = 0.5
    planner_cutoff: bool = True  # the planner must beat the best candidate so far
    backend: str | None = None
    tp_choices: tuple[int, ...] = (1, 2, 4, 8)
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)  # for the planner
    max_stages: int = 16
    move_penalty_s: float = 0.0  # training seconds lost per rank that must load state
    change_cost_s: float = 0.0  # training seconds lost by any change of plan (restart of every rank)
    horizon_s: float = 3600.0  # how long the new plan is expected to run
    # the whole re-plan's wall-clock target (None: none): the repair stops improving at
    # REPAIR_SHARE of it, and the planner gets what is left, less PLACE_SHARE for placing and
    # scoring its plan, instead of planner_time_limit_s (the planner still runs when that is 0); where
    # nothing at all is found within it, the planner runs again on planner_time_limit_s, past it
    budget_s: float | None = None

    def __post_init__(self) -> None:
        for name, zero in (("horizon_s", False), ("budget_s", False), ("move_penalty_s", True),
                           ("change_cost_s", True), ("planner_time_limit_s", True),
                           ("planner_combo_time_limit_s", True)):
            check_number(getattr(self, name), f"replan.{name}", zero=zero, error=PlanError)
        check_counts(self.tp_choices, "replan.tp_choices", error=PlanError)
        check_counts(self.microbatch_sizes, "replan.microbatch_sizes", error=PlanError)
        check_count(self.max_stages, "replan.max_stages", error=PlanError)


@dataclass(frozen=True)
class Candidate:
    source: str  # kept | patched | repaired | planner
    plan: Plan
    report: SimulationReport
    moved_ranks: int
    score: float  # higher is better (see module docstring)
    latency_s: float

    @property
    def feasible(self) -> bool:
        return self.report.feasible


@dataclass(frozen=True)
class ReplanResult:
    plan: Plan | None  # None: no GPU is up, nothing can run
    report: SimulationReport | None
    source: str  # kept | patched | repaired | planner | none
    moved_ranks: int
    candidates: list[Candidate]
    repair_s: float
    planner_s: float
    latency_s: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "moved_ranks": self.moved_ranks, "repair_s": self.repair_s,
                "planner_s": self.planner_s, "latency_s": self.latency_s, "notes": self.notes,
                "samples_per_s": self.report.samples_per_s if self.report else 0.0,
                "num_gpus": self.report.num_gpus if self.report else 0,
                "candidates": [{"source": c.source, "samples_per_s": c.report.samples_per_s,
                                "cost_per_iteration_usd": c.report.cost_per_iteration_usd,
                                "num_gpus": c.report.num_gpus, "moved_ranks": c.moved_ranks, "score": c.score,
                                "feasible": c.feasible, "latency_s": c.latency_s} for c in self.candidates]}


# ---- work beside the planner ------------------------------------------------------------------------
class _Beside:
    """`work()` run in a forked child process on the other core while this one runs the planner,
    which then runs alone (`_run_planner`: no helper process under HELPER_MIN_S). The child sees
    everything this process had when it started (copy on write) and sends back what `work` returns
    (picklable); whatever it adds to the session's memos stays in the child."""

    def __init__(self, conn: Any, proc: Any):
        self.conn, self.proc = conn, proc
        self.finished = 0.0  # perf_counter when the child had its answer (the clock is system-wide)

    @classmethod
    def start(cls, work: Callable[[], Any]) -> "_Beside | None":
        """None where there is no second core or no fork: the caller runs `work` itself."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        if cores < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return None
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_beside_main, args=(send, work), daemon=True)
        proc.start()
        send.close()
        return cls(recv, proc)

    def result(self, timeout_s: float) -> Any:
        """What `work` returned, or None when it failed or had not answered within `timeout_s`
        (the child is then stopped)."""
        try:
            if not self.conn.poll(max(timeout_s, 0.0)):
                return None
            ok, value, self.finished = self.conn.recv()
            return value if ok else None
        except (EOFError, OSError):
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def _beside_main(conn: Any, work: Callable[[], Any]) -> None:
    """The child: Ctrl-C reaches the whole process group, and the parent stops the child itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        value = work()
        conn.send((True, value, time.perf_counter()))
    except BaseException:  # noqa: BLE001 - the parent notes that the work gave no answer
        try:
            conn.send((False, None, time.perf_counter()))
        except OSError:
            pass
    finally:
        conn.close()


# ---- what re-plans keep across events ---------------------------------------------------------------
@dataclass(frozen=True)
class _RepairMemo:
    """The repair's figures (`_Repair`): every key names all it depends on besides the instance view
    and the estimators (GPU type, TP, layer range, share, nodes), so they hold for every state of
    one network."""

    time: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)  # (GPU type, TP, share) -> seconds per layer unit
    classes: dict = field(default_factory=dict)  # replica classes (GPU type, TP) of a stage -> a small id
    class_list: list = field(default_factory=list)  # id -> those classes
    cap: dict = field(default_factory=dict)
    fill: dict = field(default_factory=dict)
    sync: dict = field(default_factory=dict)
    upd: dict = field(default_factory=dict)
    link: dict = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {f.name: len(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def added_since(self, sizes: dict[str, int]) -> dict[str, list]:
        """The entries made after `sizes` (dicts keep their order): what a repair in a child
        process sends back, so that the session keeps them."""
        out = {}
        for name, n in sizes.items():
            table = getattr(self, name)
            out[name] = table[n:] if isinstance(table, list) else list(itertools.islice(table.items(), n, None))
        return out

    def merge(self, added: dict[str, list], sizes: dict[str, int]) -> None:
        """Take a child's `added_since(sizes)`; class ids are positions, so the class tables and the
        fills keyed by them merge only while this memo has not grown since `sizes`."""
        ids_hold = len(self.class_list) == sizes["class_list"]
        for name, items in added.items():
            table = getattr(self, name)
            if name in ("classes", "class_list", "fill") and not ids_hold:
                continue
            if isinstance(table, list):
                table.extend(items)
            else:
                table.update(items)


@dataclass(frozen=True)
class _Figures:
    """What re-plans on one network share: the view they score on, the memoised estimators, the
    repair's figures and the joint planner's tables (made on first use)."""

    instance: Instance
    view: Instance
    est: EstimatorSet
    given: EstimatorSet | None  # the caller's estimators these were made from (None: built here)
    repair: _RepairMemo = field(default_factory=_RepairMemo)
    planner: list = field(default_factory=list)  # [planner_tables(view, est)] once the planner ran

    def planner_tables(self) -> Any:
        if not self.planner:
            self.planner.append(planner_tables(self.view, self.est))
        return self.planner[0]


class ReplanSession:
    """What one caller's re-plans keep from event to event (`replan(..., session=)`): per network
    (a bandwidth event changes every communication figure), the memoised estimators, the repair's
    figures and the joint planner's tables. None of them depends on which GPUs are up, only on the
    instance view and the estimators, so an event that changes quotas reuses all of them: a re-plan
    with a session finds the candidates one without finds, faster (tests/test_replan.py), and the
    time the planner saves on its tables goes into its search. The caller keeps one session per
    instance (a replay, a supervisor); cold re-planning, the baseline, takes none."""

    KEEP = 4  # networks remembered, the most recently used first (a few bandwidth states recur)

    def __init__(self) -> None:
        self._by_net: dict[tuple, _Figures] = {}

    def figures(self, instance: Instance, state: ClusterState, estimators: EstimatorSet | None) -> _Figures:
        key = (id(instance), state.net.model_dump_json(), state.intra_node_GBps)
        got = self._by_net.pop(key, None)
        if got is None or got.instance is not instance or got.given is not estimators:
            view = state.instance_view()
            got = _Figures(instance, view, memoised(estimators or build_estimators(view)), estimators)
        self._by_net[key] = got
        while len(self._by_net) > self.KEEP:
            del self._by_net[next(iter(self._by_net))]
        return got


# ---- the entry point ------------------------------------------------------------------------------
def replan(instance: Instance, previous_plan: Plan | None, new_state: ClusterState,
           options: ReplanOptions | None = None, *, lost_gpus: Iterable[tuple[str, int]] = (),
           estimators: EstimatorSet | None = None, planner_cache: dict | None = None,
           session: ReplanSession | None = None) -> ReplanResult:
    """A plan for `new_state`, warm-started from `previous_plan` (see the module docstring).

    `previous_plan` is the plan that was running (placed or not: unplaced replicas are taken to sit
    where `validate_plan` puts them first-fit); `lost_gpus` are (node, GPU) whose state is gone
    although they are up (a node that failed and came back). `planner_cache` (a dict the caller
    keeps) memoises the planner's answer per (state, planner options): a replay that meets the same
    state twice solves it once; the reported planner latency is the one measured when it ran.
    `session` (a `ReplanSession` the caller keeps across events) carries the estimator figures and
    the planner's tables from one re-plan to the next; without one, a `planner_cache` holds one
    under the key "session", so a replay gets it too."""
    opts = options or ReplanOptions()
    with _frozen():
        return _replan(instance, previous_plan, new_state, opts, lost_gpus, estimators, planner_cache, session)


@contextlib.contextmanager
def _frozen():
    """Objects that exist now go to the collector's permanent generation until the block ends, so
    no collection inside it walks them (unless the caller froze objects already: unfreezing would
    release theirs too). Those made inside are collected as usual."""
    froze = gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    try:
        yield
    finally:
        if froze:
            gc.unfreeze()


def _replan(instance: Instance, previous_plan: Plan | None, new_state: ClusterState, opts: ReplanOptions,
            lost_gpus: Iterable[tuple[str, int]], estimators: EstimatorSet | None, planner_cache: dict | None,
            session: ReplanSession | None) -> ReplanResult:
    t0 = time.perf_counter()
    if new_state.instance is not instance and new_state.instance.name != instance.name:
        raise PlanError(f"state belongs to instance {new_state.instance.name!r}, not {instance.name!r}", "new_state")
    if new_state.total_gpus == 0:
        return ReplanResult(None, None, "none", 0, [], 0.0, 0.0, time.perf_counter() - t0, ["no GPU is up"])
    if session is None and planner_cache is not None:
        session = planner_cache.setdefault("session", ReplanSession())
    figs = (session or ReplanSession()).figures(instance, new_state, estimators)  # none: figures for this call only
    view, est = figs.view, figs.est
    prev = validate_plan(instance, previous_plan) if previous_plan is not None else None
    lost = frozenset(lost_gpus)
    notes: list[str] = []
    cands: list[Candidate] = []

    def scored(source: str, plan: Plan, started: float, report: SimulationReport | None = None) -> Candidate | str:
        """The candidate, or a note when it is out of memory."""
        if report is None:
            twin = next((c.report for c in cands if same_plan(c.plan, plan)), None)
            report = simulate(view, plan, est) if twin is None else dataclasses.replace(  # the same plan scored
                twin, plan=twin.plan.model_copy(update={"name": plan.name, "metadata": plan.metadata}))
        if report.oom_ranks:
            return f"{source}: dropped, ranks {[r.rank for r in report.oom_ranks][:5]} out of memory"
        moved = moved_ranks(instance, prev if opts.warm else None, report.plan, new_state, lost)
        changed = prev is None or not same_plan(prev, report.plan)
        return Candidate(source, report.plan, report, moved, _score(view, report, moved, changed, opts),
                         time.perf_counter() - started)

    def add(got: Candidate | str) -> None:
        (notes if isinstance(got, str) else cands).append(got)

    beside, repair_s = None, 0.0
    if opts.warm and prev is not None:
        if new_state.plan_is_valid(prev) and not _lost_any(prev, lost):
            add(scored("kept", prev, t0))
        t1 = time.perf_counter()

        def repaired(until: float | None) -> list[Candidate | str]:
            return [scored(source, plan, t1, report)
                    for source, plan, report in _Repair(view, est, prev, new_state, opts, figs.repair, until).run()]

        def repaired_beside() -> tuple[list[Candidate | str], dict]:
            got = repaired(t0 + (1 - 2 * PLACE_SHARE) * opts.budget_s)  # its plans are scored after it
            return got, figs.repair.added_since(sizes)

        if opts.budget_s is not None:  # the repair beside the planner
            sizes = figs.repair.sizes()
            beside = _Beside.start(repaired_beside)
        if beside is None:  # one core, or no budget: first the repair, then the planner
            for got in repaired(None if opts.budget_s is None else t0 + REPAIR_SHARE * opts.budget_s):
                add(got)
            repair_s = time.perf_counter() - t0
    planner_s = cached_s = 0.0
    try:
        if opts.planner_time_limit_s > 0 or opts.budget_s is not None or not cands:
            t2 = time.perf_counter()
            left_s = None if opts.budget_s is None else opts.budget_s * (1 - PLACE_SHARE) - (t2 - t0)
            plan, note, planner_s = _planner_candidate(instance, figs, new_state, prev, lost, opts, _best(cands),
                                                       planner_cache, left_s)
            cached_s = time.perf_counter() - t2 - planner_s  # < 0 when the planner's answer came from the cache
            if note:
                notes.append(note)
            if plan is not None:
                add(scored("planner", plan, t2))
        if beside is not None:
            got = beside.result(t0 + opts.budget_s - time.perf_counter())
            if got is None:
                notes.append("repair: no answer from its process within the budget")
            else:
                figs.repair.merge(got[1], sizes)  # the figures it computed, for the next events
            for item in got[0] if got is not None else ():
                add(item)
            repair_s = beside.finished - t0 if got is not None else time.perf_counter() - t0
    finally:  # an interrupted planner leaves no repair process behind
        if beside is not None:
            beside.close()
    best = _best(cands)
    if best is None and opts.budget_s is not None:
        # nothing within the budget: a late plan beats none (the GPUs would stand idle), so the planner
        # runs again on planner_time_limit_s; the result's latency says how late
        t3 = time.perf_counter()
        plan, note, more_s = _planner_candidate(instance, figs, new_state, prev, lost,
                                                dataclasses.replace(opts, budget_s=None), None, planner_cache, None)
        planner_s += more_s
        notes.append(note or f"planner: nothing within the {opts.budget_s:g} s budget; planned past it")
        if plan is not None:
            add(scored("planner", plan, t3))
        best = _best(cands)
    if best is None:
        raise InfeasibleError(f"no plan fits the {new_state.total_gpus} GPUs up at t={new_state.time_s:g} s "
                              f"({'; '.join(notes) or 'repair and planner found none'})")
    # cold candidates are scored as if every rank moved (no warm start), but the ranks that really
    # move are those whose GPU lacks their state, as for warm: cold reported 4 moved of 4 where the
    # migration was 0 s
    moved = best.moved_ranks if opts.warm else moved_ranks(instance, prev, best.plan, new_state, lost)
    # latency charged: the real elapsed time, with a cached planner answer at the latency it had
    return ReplanResult(best.plan, best.report, best.source, moved, cands, repair_s, planner_s,
                        time.perf_counter() - t0 - min(cached_s, 0.0), notes)


def _lost_any(plan: Plan, lost: frozenset) -> bool:
    return any((rep.node, g) in lost for st in plan.stages for rep in st.replicas for g in rep.gpus)


def same_plan(a: Plan, b: Plan) -> bool:
    """Same stages, placements, shares and microbatch count (names and metadata aside)."""
    return (a.num_microbatches == b.num_microbatches and a.schedule == b.schedule
            and [(s.layer_start, s.layer_end) for s in a.stages] == [(s.layer_start, s.layer_end) for s in b.stages]
            and all([(r.gpu_type, r.tp, r.node, r.gpus) for r in sa.replicas] == [(r.gpu_type, r.tp, r.node, r.gpus)
                                                                              for r in sb.replicas]
                    and a.shares(i) == b.shares(i) for i, (sa, sb) in enumerate(zip(a.stages, b.stages))))


def _score(view: Instance, report: SimulationReport, moved: int, changed: bool, opts: ReplanOptions) -> float:
    run_s = opts.horizon_s - opts.move_penalty_s * moved - (opts.change_cost_s if changed else 0.0)
    if view.objective.kind == "min_cost":
        per_sample = report.cost_per_iteration_usd / view.workload.global_batch_size
        return -per_sample * opts.horizon_s / max(run_s, 1e-9)
    return report.samples_per_s * max(run_s, 0.0) / opts.horizon_s


def _best(cands: list[Candidate]) -> Candidate | None:
    if not cands:
        return None
    order = {"kept": 0, "patched": 1, "repaired": 2, "planner": 3}  # ties: the smaller change
    return max(cands, key=lambda c: (c.feasible, c.score, -order[c.source]))


# ---- the planner candidate ------------------------------------------------------------------------
def _planner_candidate(instance: Instance, figs: _Figures, state: ClusterState,
                       prev: Plan | None, lost: frozenset, opts: ReplanOptions, incumbent: Candidate | None,
                       cache: dict | None, left_s: float | None = None) -> tuple[Plan | None, str | None, float]:
    """(placed plan or None, a note, planner seconds). The planner runs on what is available and,
    if its plan does not fit the GPUs up on partially available nodes, again on whole nodes only:
    the two runs share `planner_time_limit_s`, or `left_s` of a budget (the second gets what the
    first left)."""
    view = figs.view
    min_its = max_cost = None
    if opts.warm and opts.planner_cutoff and incumbent is not None and incumbent.feasible:
        if view.objective.kind == "min_cost":
            max_cost = incumbent.report.cost_per_iteration_usd
            if view.constraints.max_cost_per_iteration_usd is not None:
                max_cost = min(max_cost, view.constraints.max_cost_per_iteration_usd)
        else:
            min_its = incumbent.report.iters_per_s
            if view.constraints.min_throughput_iters_per_s is not None:
                min_its = max(min_its, view.constraints.min_throughput_iters_per_s)
    held = holdings(instance, prev) if (opts.warm and prev is not None) else {}
    held = {g: p for g, p in held.items() if g not in lost}
    tried, spent = [], 0.0
    budget = opts.planner_time_limit_s or 0.5  # both tries together (0: only when no repair exists)
    if left_s is not None:  # what the re-plan's budget left; a plan is needed when nothing else was found
        budget = max(left_s, MIN_PLANNER_SHARE * opts.budget_s if incumbent is None else 0.0)
        if budget <= 0:
            return None, "planner: the budget was spent before it could run", 0.0
    for available in (state.available(), state.whole_node_available()):
        if available in tried:
            continue
        if tried and budget - spent < 0.05 * budget:  # the first try used the time up
            return None, "planner: its plan does not fit the GPUs up on partially available nodes, and no " \
                         "time was left to plan on whole nodes", spent
        tried.append(available)
        key = (state.key(), tuple(sorted(available.items())), opts.planner_time_limit_s, opts.budget_s,
               opts.planner_combo_time_limit_s, opts.backend, opts.tp_choices, opts.microbatch_sizes,
               opts.max_stages, min_its, max_cost)
        if cache is not None and key in cache:
            unplaced, note, secs = cache[key]
        else:
            unplaced, note, secs = _run_planner(figs, opts, available, min_its, max_cost, budget - spent)
            if cache is not None:
                cache[key] = (unplaced, note, secs)
        spent += secs
        if unplaced is None:
            return None, note, spent
        placed = place(view, unplaced, state, held, reuse=opts.warm)
        if placed is not None:
            return placed.model_copy(update={"name": f"{instance.name}-replan",
                                             "metadata": {**unplaced.metadata, "source": "planner"}}), None, spent
    return None, "planner: its plan does not fit the GPUs up on partially available nodes", spent


def _run_planner(figs: _Figures, opts: ReplanOptions, available: dict, min_its: float | None,
                 max_cost: float | None, limit_s: float) -> tuple[Plan | None, str | None, float]:
    t0 = time.perf_counter()
    # under HELPER_MIN_S the planner runs in this process alone: its helper's fork and hand-offs
    # cost more than they bring there, and the other core may run the repair (`_Beside`)
    popts = PlannerOptions(backend=opts.backend, time_limit_s=limit_s, workers=1 if limit_s < HELPER_MIN_S else 2,
                           combo_time_limit_s=opts.planner_combo_time_limit_s, max_stages=opts.max_stages,
                           microbatch_sizes=opts.microbatch_sizes, tp_choices=opts.tp_choices,
                           available=available, min_iters_per_s=min_its, max_cost_usd=max_cost)
    try:
        tables = figs.planner_tables()  # a session's carry the figures of its earlier events
        return joint_plan(figs.view, popts, figs.est, tables=tables).plan, None, time.perf_counter() - t0
    except InfeasibleError as exc:
        if min_its is not None or max_cost is not None:
            note = "planner: found nothing better than the best candidate in its time limit"
        else:
            note = f"planner: {exc}"
        return None, note, time.perf_counter() - t0
    except HetplanError as exc:
        return None, f"planner failed: {exc}", time.perf_counter() - t0


def place(view: Instance, plan: Plan, state: ClusterState, held: dict[tuple[str, int], frozenset[Piece]] | None = None,
          reuse: bool = True) -> Plan | None:
    """Put every replica that has no node on GPUs that are up. With `reuse`, prefer GPUs that
    already hold the replica's layers (fewest ranks move state); otherwise first fit in node order.
    None when the replicas do not fit."""
    arch = view.model_arch
    free: dict[str, list[int]] = {}
    for node in view.nodes:
        free[node.node_id] = list(range(state.gpus_up.get(node.node_id, 0)))
    for st in plan.stages:  # GPUs of already placed replicas are taken
        for rep in st.replicas:
            if rep.node is not None and rep.gpus is not None:
                for g in rep.gpus:
                    if g in free.get(rep.node, []):
                        free[rep.node].remove(g)
    by_key: dict[tuple[str, str], list[str]] = {}
    for node in placement_order(view.nodes):  # as validate_plan's first fit
        by_key.setdefault((node.gpu_type, node.zone), []).append(node.node_id)
    held = held or {}
    holders: dict[frozenset[Piece], tuple[set, set]] = {}  # need -> the GPUs whose state covers it, their nodes

    def covering(need: frozenset[Piece]) -> tuple[set[tuple[str, int]], set[str]]:
        """Asked once per (layer range, TP, rank), not per node and GPU tried (hundreds of each)."""
        if need not in holders:
            gpus = {gpu for gpu, have in held.items() if have and holds_all(need, have)}
            holders[need] = (gpus, {node for node, _ in gpus})
        return holders[need]

    stages = []
    for st in plan.stages:
        reps = []
        for rep in st.replicas:
            if rep.node is not None:
                reps.append(rep)
                continue
            choice = _choose_gpus(arch, st, rep, by_key.get((rep.gpu_type, rep.zone), []), free, held, reuse,
                                  covering)
            if choice is None:
                return None
            node, gpus = choice
            for g in gpus:
                free[node].remove(g)
            reps.append(rep.model_copy(update={"node": node, "gpus": gpus}))
        stages.append(st.model_copy(update={"replicas": tuple(reps)}))
    return plan.model_copy(update={"stages": tuple(stages)})


def _choose_gpus(arch: ModelArch, st: Stage, rep: Replica, nodes: list[str], free: dict[str, list[int]],
                 held: dict, reuse: bool, covering: Callable[[frozenset[Piece]], tuple[set, set]]
                 ) -> tuple[str, tuple[int, ...]] | None:
    """The node (the first in order of the best) and GPUs for `rep`: most TP ranks whose GPU already
    holds their state, then best fit (the fullest node that has room)."""
    if not reuse:
        return next(((node, tuple(free[node][: rep.tp])) for node in nodes if len(free[node]) >= rep.tp), None)
    # per TP rank, the GPUs holding its state: once per replica (hashing `arch` is slow), not per node
    holding = [covering(rank_pieces(arch, st.layer_start, st.layer_end, rep.tp, r)) for r in range(rep.tp)]
    best = None
    for node in nodes:
        left = free[node]
        if len(left) < rep.tp:
            continue
        if not any(node in on for _, on in holding):  # no hit possible: only the fit counts, GPUs when chosen
            if best is None or (0, -len(left)) > best[0]:
                best = ((0, -len(left)), node, None)
            continue
        gpus, hits = [], 0
        pool = list(left)
        for have, _ in holding:
            hit = next((g for g in pool if (node, g) in have), None)
            if hit is not None:
                hits += 1
                pool.remove(hit)
            gpus.append(hit)
        gpus = _fill_idle(node, gpus, pool, held)
        key = (hits, -len(left))  # most reuse, then best fit (fullest node)
        if best is None or key > best[0]:
            best = (key, node, tuple(gpus))
    if best is None:
        return None
    _, node, gpus = best
    return node, gpus if gpus is not None else tuple(_fill_idle(node, [None] * rep.tp, list(free[node]), held))


def _fill_idle(node: str, gpus: list, pool: list[int], held: dict) -> list[int]:
    """GPUs with no matching state: take those holding nothing first, keep holders for others."""
    idle = sorted(pool, key=lambda g: ((node, g) in held, g))
    return [g if g is not None else idle.pop(0) for g in gpus]


# ---- the repair -----------------------------------------------------------------------------------
@dataclass
class _Rep:
    gpu_type: str
    tp: int
    zone: str
    node: str
    gpus: tuple[int, ...]


@dataclass
class _Stage:
    start: int
    end: int
    reps: list[_Rep]
    shares: list[int] = field(default_factory=list)
    # the stage's step, all-reduce, update and incoming transfer seconds once asked (`_Repair.step`,
    # `sync`, `update`, `boundary`): the objective reads every stage at every move tried. `fill` sets the shares and restarts it;
    # whoever changes `reps` otherwise clears it
    memo: dict = field(default_factory=dict, repr=False, compare=False)


class _Repair:
    """Greedy repair of a placed plan on a new state (see the module docstring)."""

    def __init__(self, view: Instance, est: EstimatorSet, prev: Plan, state: ClusterState, opts: ReplanOptions,
                 memo: _RepairMemo | None = None, until: float | None = None):
        self.view, self.est, self.prev, self.state, self.opts = view, est, prev, state, opts
        self.until = until  # perf_counter time after which no more moves are tried (None: no limit)
        self.arch = view.model_arch
        self.B = view.workload.global_batch_size
        self.schedule = prev.schedule
        memo = memo or _RepairMemo()  # a session's, shared with earlier events on this network
        self._time, self._cap, self._sync, self._upd = memo.time, memo.cap, memo.sync, memo.upd
        self._link, self._fill, self._units = memo.link, memo.fill, memo.units
        self._classes, self._class_list = memo.classes, memo.class_list
        self.node_info = {n.node_id: n for n in view.nodes}
        self.seq_bytes = boundary_activation_bytes(self.arch, 1, view.workload.precision)

    def late(self) -> bool:
        """Past the deadline: every step stops trying moves and keeps the best it has (valid plans)."""
        return self.until is not None and time.perf_counter() > self.until

    # -- cached estimator figures ------------------------------------------------------------------
    def rep_time(self, g: str, tp: int, start: int, end: int, share: int) -> float:
        key = (g, tp, start, end, share)
        if key not in self._time:
            per_unit = self._units.get(key[:2] + key[4:])
            if per_unit is None:  # every unit at once: the ranges tried are many, the (type, TP, share)s few
                per_unit = self._units[key[:2] + key[4:]] = [self.est.time.layer_time(g, u, share, tp).total_s
                                                             for u in range(self.arch.num_units)]
            self._time[key] = sum(per_unit[start:end])  # the same additions in the same order as unit by unit
        return self._time[key]

    def max_share(self, g: str, tp: int, start: int, end: int, dp: int, in_flight: int, limit: int) -> int:
        """Largest share (<= limit) that fits in memory; 0 if not even one sequence does."""
        if self.view.workload.zero_stage == 0:
            dp = 1  # the DP degree only shards states under ZeRO
        key = (g, tp, start, end, dp, in_flight, limit)
        if key not in self._cap:
            def fits(s: int) -> bool:
                return not self.est.memory.worker_memory(g, range(start, end), tp, s, dp, in_flight).oom
            lo, hi = 0, limit
            while lo < hi:  # memory grows with the share: binary search the last fitting one
                mid = (lo + hi + 1) // 2
                if fits(mid):
                    lo = mid
                else:
                    hi = mid - 1
            self._cap[key] = lo
        return self._cap[key]

    def in_flight(self, i: int, P: int, m: int) -> int:
        return in_flight_microbatches(self.schedule, i, P, m)

    # -- shares (min-max water filling) ------------------------------------------------------------
    def fill(self, st: _Stage, i: int, P: int, m: int) -> float | None:
        """Give the stage's replicas shares summing to G = B / m minimising the slowest replica's
        step time (greedy one sequence at a time: optimal for non-decreasing times). Replicas left
        at 0 are dropped. Returns the step time, None when memory cannot take G sequences.
        Replicas of one (GPU type, TP) are interchangeable: the answer is memoised per class list."""
        got = self.filled(tuple((r.gpu_type, r.tp) for r in st.reps), st.start, st.end, i, P, m)
        return None if got is None else self.apply_fill(st, got)

    def filled(self, classes: tuple | int, start: int, end: int, i: int, P: int, m: int) -> tuple | None:
        """(kept replicas, their shares, step time) of `fill` for stage i of P holding [start, end)
        with replicas of these (GPU type, TP) classes, in order (or their `class_id`)."""
        G = self.B // m
        k = self.in_flight(i, P, m)
        # a stage of hundreds of replicas has a long class tuple, costly to hash at every lookup:
        # the memo is keyed by its id (`class_id`), taken once per stage by `partition`
        cid = classes if isinstance(classes, int) else self.class_id(classes)
        key = (cid, start, end, k, G)
        if key not in self._fill:
            self._fill[key] = self._water_fill(self._class_list[cid], start, end, k, G)
        return self._fill[key]

    def class_id(self, classes: tuple) -> int:
        cid = self._classes.get(classes)
        if cid is None:
            cid = self._classes[classes] = len(self._classes)
            self._class_list.append(classes)
        return cid

    @staticmethod
    def apply_fill(st: _Stage, got: tuple) -> float:
        keep, shares, step = got
        if len(keep) < len(st.reps):
            st.reps = [st.reps[j] for j in keep]
        st.shares = list(shares)
        st.memo = {"step": step}
        return step

    def _water_fill(self, classes: tuple, start: int, end: int, k: int, G: int):
        """The shares the greedy gives (one sequence at a time to the replica whose step time grows
        least, ties to the lower index), a level at a time per class of interchangeable replicas:
        the greedy merges the replicas' step-time lists (non-decreasing in the share), so it hands
        out the G smallest (time, replica) pairs. Levels are taken in time order, all replicas of
        a class at once, until the level where G is reached: its ties go to the lowest indices.
        As many steps as levels instead of G (hundreds of sequences on hundreds of replicas)."""
        dp = len(classes)
        size: dict[tuple[str, int], int] = {}
        for c in classes:
            size[c] = size.get(c, 0) + 1
        cap = {c: self.max_share(c[0], c[1], start, end, dp, k, G) for c in size}
        if sum(cap[c] * n for c, n in size.items()) < G:
            return None

        def time_at(c: tuple[str, int], share: int) -> float:
            return self.rep_time(c[0], c[1], start, end, share)

        done = dict.fromkeys(size, 0)  # levels every replica of the class has taken
        heap = [(time_at(c, 1), c) for c in size if cap[c] > 0]
        heapq.heapify(heap)
        left, ties = G, {}
        while left > 0:
            v = heap[0][0]
            level = {}  # class -> its levels at time v
            while heap and heap[0][0] == v:
                c = heapq.heappop(heap)[1]
                n = 1
                while done[c] + n < cap[c] and time_at(c, done[c] + n + 1) == v:
                    n += 1
                level[c] = n
            if sum(size[c] * n for c, n in level.items()) >= left:
                ties = level  # v is the G-th smallest time
                break
            for c, n in level.items():
                left -= size[c] * n
                done[c] += n
                if done[c] < cap[c]:
                    heapq.heappush(heap, (time_at(c, done[c] + 1), c))
        shares = []
        for c in classes:  # replica order: the ties go to the lowest indices
            take = min(ties.get(c, 0), left)
            left -= take
            shares.append(done[c] + take)
        keep = tuple(j for j in range(dp) if shares[j] > 0)
        step = max(time_at(classes[j], shares[j]) for j in keep)
        return keep, tuple(shares[j] for j in keep), step

    def step(self, st: _Stage) -> float:
        if "step" not in st.memo:
            st.memo["step"] = max(self.rep_time(r.gpu_type, r.tp, st.start, st.end, s)
                                  for r, s in zip(st.reps, st.shares))
        return st.memo["step"]

    def sync(self, st: _Stage) -> float:
        if len(st.reps) <= 1:
            return 0.0
        if "sync" not in st.memo:
            st.memo["sync"] = self._sync_s(st)
        return st.memo["sync"]

    def _sync_s(self, st: _Stage) -> float:
        key = (st.start, st.end, tuple(sorted((r.node, r.tp) for r in st.reps)))
        if key not in self._sync:
            nbytes = gradient_bytes(self.arch, range(st.start, st.end), self.view.workload.precision)
            members = [node_endpoint(self.node_info[r.node]) for r in st.reps]  # (`stage_cost.endpoint`)
            factor = sync_volume_factor(self.view.workload.zero_stage)
            self._sync[key] = self.est.comm.allreduce_time_s(members, factor * nbytes / min(r.tp for r in st.reps))
        return self._sync[key]

    def update(self, st: _Stage) -> float:
        if "update" in st.memo:
            return st.memo["update"]
        key = (st.start, st.end, len(st.reps), tuple(sorted({(r.gpu_type, r.tp) for r in st.reps})))
        if key not in self._upd:
            self._upd[key] = max(self.est.time.update_time_s(g, range(st.start, st.end), tp, len(st.reps))
                                 for g, tp in key[3])
        st.memo["update"] = self._upd[key]
        return st.memo["update"]

    def link_s_per_seq(self, a: _Rep, b: _Rep) -> tuple[float, float]:
        """(seconds per sequence of activations, latency) between two replicas' nodes."""
        key = (a.node, b.node)
        if key not in self._link:
            na, nb = self.node_info[a.node], self.node_info[b.node]
            link = self.est.comm.link(Endpoint(na.zone, na.region, na.node_id, na.intra_node),
                                      Endpoint(nb.zone, nb.region, nb.node_id, nb.intra_node))
            self._link[key] = (self.seq_bytes / (link.bandwidth_GBps * 1e9), link.latency_s)
        return self._link[key]

    def boundary(self, a: _Stage, b: _Stage) -> float:
        """Activation transfer of one pipeline step over a stage boundary: every receiving replica
        takes its share from the sending stage (modelled from its first replica's node)."""
        src = a.reps[0]
        key = ("from", src.node)
        if key not in b.memo:
            b.memo[key] = max(share * per + lat for per, lat, share in
                              ((*self.link_s_per_seq(src, r), s) for r, s in zip(b.reps, b.shares)))
        return b.memo[key]

    def proxy(self, stages: list[_Stage], m: int) -> float:
        """The simulator's 1F1B iteration time, with boundary transfers approximated (`boundary`)."""
        steps = [self.step(s) for s in stages]
        links = [self.boundary(a, b) for a, b in zip(stages, stages[1:])]
        pipe = sum(steps) + 2 * sum(links) + (m - 1) * max(steps + links)  # GPipe: the same, fwd + bwd lumped
        return pipe + max(self.sync(s) for s in stages) + max(self.update(s) for s in stages)

    def objective(self, stages: list[_Stage], m: int) -> float:
        t = self.proxy(stages, m)
        if self.view.objective.kind != "min_cost":
            return t
        rate = sum(self.node_info[r.node].price_per_gpu_hour_usd * r.tp for s in stages for r in s.reps)
        return rate * t

    # -- free GPUs -------------------------------------------------------------------------------
    def free_gpus(self, stages: list[_Stage]) -> dict[str, list[int]]:
        free = {n: list(range(k)) for n, k in self.state.gpus_up.items() if k > 0}
        for st in stages:
            for r in st.reps:
                for g in r.gpus:
                    free[r.node].remove(g)
        return free

    def rep_blocks(self, free: dict[str, list[int]]) -> dict[tuple[str, str, int], list[_Rep]]:
        """Disjoint new replicas per (GPU type, zone, TP) that the free GPUs allow, fullest nodes
        first (best fit keeps whole nodes free for wide TP groups)."""
        out: dict[tuple[str, str, int], list[_Rep]] = {}
        for tp in self.opts.tp_choices:
            if tp_indivisible(self.arch, tp):  # the plan validator would refuse it
                continue
            for node_id in sorted(free, key=lambda n: (len(free[n]), n)):
                gpus, node = free[node_id], self.node_info[node_id]
                if node.num_gpus % tp:
                    continue
                for k in range(len(gpus) // tp):
                    out.setdefault((node.gpu_type, node.zone, tp), []).append(
                        _Rep(node.gpu_type, tp, node.zone, node_id, tuple(gpus[k * tp:(k + 1) * tp])))
        return out

    def new_rep_options(self, free: dict[str, list[int]]) -> list[_Rep]:
        """One candidate replica per (GPU type, zone, TP)."""
        return [blocks[0] for _, blocks in sorted(self.rep_blocks(free).items())]

    # -- steps -----------------------------------------------------------------------------------
    def survivors(self) -> list[_Stage]:
        up = self.state.gpus_up
        out = []
        for st in self.prev.stages:
            reps = [_Rep(r.gpu_type, r.tp, self.node_info[r.node].zone, r.node, r.gpus) for r in st.replicas
                    if r.node not in self.state.failed and max(r.gpus) < up.get(r.node, 0)]
            out.append(_Stage(st.layer_start, st.layer_end, reps))
        return out

    def refill_empty(self, stages: list[_Stage], m: int) -> list[_Stage] | None:
        """Stages without replicas get the fastest free GPUs that hold them, else merge."""
        i = 0
        while i < len(stages):
            st = stages[i]
            if st.reps:
                i += 1
                continue
            free = self.free_gpus(stages)
            G = self.B // m
            while sum(self._caps(st, i, len(stages), m)) < G:
                fitting = [r for r in self.new_rep_options(free)
                           if self.max_share(r.gpu_type, r.tp, st.start, st.end, len(st.reps) + 1,
                                             self.in_flight(i, len(stages), m), G) > 0]
                if not fitting:
                    break
                rep = min(fitting, key=lambda r: self.rep_time(r.gpu_type, r.tp, st.start, st.end, 1) * r.tp)
                st.reps.append(rep)
                st.memo.clear()
                for g in rep.gpus:
                    free[rep.node].remove(g)
            if sum(self._caps(st, i, len(stages), m)) >= G:
                i += 1
                continue
            st.reps, st.memo = [], {}
            merged = self._merge(stages, i, m)
            if merged is None:
                return None
            stages = merged  # re-examine the same index: it now holds the neighbour
        return stages

    def _caps(self, st: _Stage, i: int, P: int, m: int) -> list[int]:
        k = self.in_flight(i, P, m)
        return [self.max_share(r.gpu_type, r.tp, st.start, st.end, len(st.reps), k, self.B // m) for r in st.reps]

    def _merge(self, stages: list[_Stage], i: int, m: int) -> list[_Stage] | None:
        """Drop empty stage i, giving its units to the neighbour that can hold them."""
        st = stages[i]
        for j in (i - 1, i + 1):
            if not 0 <= j < len(stages) or not stages[j].reps:
                continue
            nb = stages[j]
            trial = [_Stage(s.start, s.end, list(s.reps)) for s in stages]
            merged = _Stage(min(st.start, nb.start), max(st.end, nb.end), list(nb.reps))
            trial[j] = merged
            del trial[i]
            jj = j if j < i else j - 1
            if sum(self._caps(merged, jj, len(trial), m)) >= self.B // m:
                return trial
        return None

    def balance(self, stages: list[_Stage], m: int) -> bool:
        P = len(stages)
        return all(self.fill(st, i, P, m) is not None for i, st in enumerate(stages))

    def grow(self, stages: list[_Stage], m: int) -> None:
        """Add free GPUs as replicas of the bottleneck stage while the objective improves: k = 1, 2,
        4, ... replicas of one (GPU type, zone, TP) at a time, since with integer shares one more
        replica often cannot lower the largest share (a plateau) while a few can."""
        G = self.B // m
        P = len(stages)
        current = self.objective(stages, m)
        while not self.late():
            b = max(range(P), key=lambda i: self.step(stages[i]))
            st = stages[b]
            room = G - len(st.reps)
            best = None
            for blocks in self.rep_blocks(self.free_gpus(stages)).values():
                k = 1
                while k <= min(len(blocks), room):
                    trial = _Stage(st.start, st.end, st.reps + blocks[:k])
                    if self.fill(trial, b, P, m) is not None:
                        obj = self.objective(stages[:b] + [trial] + stages[b + 1:], m)
                        if obj < current * (1 - 1e-4) and (best is None or obj < best[0]):
                            best = (obj, trial)
                    k *= 2
            if best is None:
                return
            current, stages[b] = best

    def partition(self, stages: list[_Stage], m: int) -> list[_Stage]:
        """Stage boundaries minimising the slowest stage for the stages' replica sets: bisection on
        the step time T; for a given T, each stage in turn takes as many units as it can run within
        T (memory permitting): with stage times growing in their unit count, this greedy packing
        succeeds whenever any contiguous split does (the classic linear-partition argument)."""
        P, U = len(stages), self.arch.num_units
        classes = [self.class_id(tuple((r.gpu_type, r.tp) for r in st.reps)) for st in stages]  # fixed here

        def t(i: int, a: int, b: int) -> float | None:
            got = self.filled(classes[i], a, b, i, P, m)
            return None if got is None else got[2]

        def stage(i: int, a: int, b: int) -> _Stage:
            st = _Stage(a, b, list(stages[i].reps))
            self.apply_fill(st, self.filled(classes[i], a, b, i, P, m))
            return st

        def pack(T: float) -> list[_Stage] | None:
            a, cuts = 0, []
            for i in range(P):
                if i == P - 1:
                    tt = t(i, a, U)
                    if tt is None or tt > T:
                        return None
                    cuts.append((a, U))
                    return [stage(j, lo, hi) for j, (lo, hi) in enumerate(cuts)]
                best = None
                for b in range(a + 1, U - (P - 1 - i) + 1):
                    tt = t(i, a, b)
                    if tt is None or tt > T:
                        break
                    best = b
                if best is None:
                    return None
                cuts.append((a, best))
                a = best
            return None

        hi = max(self.step(s) for s in stages)
        best = pack(hi * (1 + 1e-9))
        if best is None:
            return stages
        lo = 0.0
        for _ in range(30):
            if self.late():
                break
            mid = (lo + hi) / 2
            trial = pack(mid)
            if trial is None:
                lo = mid
            else:
                hi, best = mid, trial
            if hi - lo <= 1e-4 * hi:
                break
        if self.objective(best, m) < self.objective(stages, m):
            return [_Stage(s.start, s.end, list(s.reps), list(s.shares)) for s in best]
        return stages

    def add_stages(self, stages: list[_Stage], m: int, max_new: int = 4) -> list[_Stage]:
        """When whole groups of GPUs are free (capacity came back), try a new stage made of up to G
        free replicas of one (GPU type, zone, TP), next to the slowest stage of two or more units,
        boundaries re-split
        (`partition`); keep it if the objective improves. Repeats up to `max_new` times."""
        G = self.B // m
        for _ in range(max_new):
            if self.late():
                return stages
            blocks = self.rep_blocks(self.free_gpus(stages))
            if not blocks or len(stages) >= min(self.opts.max_stages, self.arch.num_units):
                return stages
            current = self.objective(stages, m)
            splittable = [i for i, st in enumerate(stages) if st.end - st.start >= 2]
            if not splittable:
                return stages
            b = max(splittable, key=lambda i: self.step(stages[i]))  # the slowest stage that can give a unit
            best = None
            narrowest = min(len(st.reps) for st in stages)
            for reps in blocks.values():
                new = reps[:G]
                if len(new) < narrowest:  # a stage much narrower than the others only slows the pipeline
                    continue
                for pos in (b, b + 1):
                    trial = [_Stage(s.start, s.end, list(s.reps), list(s.shares)) for s in stages]
                    # the new stage borrows one unit from its neighbour; `partition` re-splits
                    host = trial[b]
                    cut = host.start + 1 if pos == b else host.end - 1
                    if pos == b:
                        trial[b] = _Stage(cut, host.end, list(host.reps))
                        trial.insert(b, _Stage(host.start, cut, list(new)))
                    else:
                        trial[b] = _Stage(host.start, cut, list(host.reps))
                        trial.insert(b + 1, _Stage(cut, host.end, list(new)))
                    if not self.balance(trial, m):
                        continue
                    trial = self.partition(trial, m)
                    obj = self.objective(trial, m)
                    if obj < current * (1 - 1e-3) and (best is None or obj < best[0]):
                        best = (obj, trial)
            if best is None:
                return stages
            stages = best[1]
        return stages

    def shift_boundaries(self, stages: list[_Stage], m: int) -> list[_Stage]:
        """Move one unit across a stage boundary while that helps. "Helps" is lexicographic: a lower
        objective, or the same objective with a lower sorted (descending) vector of stage times, so
        that two equally slow stages can be relieved one after the other (with the slowest stage
        unchanged a single move cannot lower the objective)."""
        P = len(stages)

        def key(sts: list[_Stage]) -> tuple[float, list[float]]:
            return self.objective(sts, m), sorted((self.step(s) for s in sts), reverse=True)

        def better(a: tuple[float, list[float]], b: tuple[float, list[float]]) -> bool:
            if a[0] < b[0] * (1 - 1e-9):
                return True
            if a[0] > b[0] * (1 + 1e-9):
                return False
            for x, y in zip(a[1], b[1]):
                if x < y * (1 - 1e-9):
                    return True
                if x > y * (1 + 1e-9):
                    return False
            return False

        current = key(stages)
        for _ in range(4 * self.arch.num_units):
            if self.late():
                break
            improved = False
            for i in range(P - 1):
                for delta in (-1, 1):  # -1: stage i gives its last unit away, +1: takes the next one
                    a, b = stages[i], stages[i + 1]
                    cut = a.end + delta
                    if not (a.start < cut < b.end):
                        continue
                    na, nb = _Stage(a.start, cut, list(a.reps)), _Stage(cut, b.end, list(b.reps))
                    if self.fill(na, i, P, m) is None or self.fill(nb, i + 1, P, m) is None:
                        continue
                    trial = stages[:i] + [na, nb] + stages[i + 2:]
                    k = key(trial)
                    if better(k, current):
                        stages, current, improved = trial, k, True
            if not improved:
                break
        return stages

    def to_plan(self, stages: list[_Stage], m: int, source: str) -> Plan:
        out = []
        for st in stages:
            reps = tuple(Replica(gpu_type=r.gpu_type, tp=r.tp, zone=r.zone, node=r.node, gpus=r.gpus,
                                 microbatch_share=s) for r, s in zip(st.reps, st.shares))
            out.append(Stage(layer_start=st.start, layer_end=st.end, replicas=reps))
        return Plan(name=f"{self.view.name}-replan", instance=self.view.name, schedule=self.schedule,
                    num_microbatches=m, stages=tuple(out), metadata={"source": source})

    def run(self) -> list[tuple[str, Plan, SimulationReport | None]]:
        """[("patched", plan, None), ("repaired", plan, its simulation)] (either may be missing). Past
        the deadline the m's not started yet are skipped."""
        out = []
        m0 = self.prev.num_microbatches
        base = self.refill_empty(self.survivors(), m0)
        if base is None:
            return out
        patched = [_Stage(s.start, s.end, list(s.reps)) for s in base]
        if self.balance(patched, m0):
            out.append(("patched", self.to_plan(patched, m0, "patched"), None))
        best = None
        for m in sorted({m0, m0 // 2, m0 * 2}, key=lambda m: (m != m0, m)):  # the running m first
            if m < 1 or self.B % m or (best is not None and self.late()):
                continue
            stages = [_Stage(s.start, s.end, list(s.reps)) for s in base]
            if not self.balance(stages, m):
                continue
            self.grow(stages, m)
            stages = self.partition(stages, m)
            stages = self.add_stages(stages, m)
            stages = self.shift_boundaries(stages, m)
            plan = self.to_plan(stages, m, "repaired")
            report = simulate(self.view, plan, self.est)  # the proxy ranks moves inside one m; the simulator the m's
            score = (self.simulated(report), m)  # ties: the fewer microbatches
            if best is None or score < best[0]:
                best = (score, plan, report)
        if best is not None:
            out.append(("repaired", best[1], best[2]))
        return out

    def simulated(self, report: SimulationReport) -> float:
        if report.oom_ranks:
            return float("inf")
        return report.cost_per_iteration_usd if self.view.objective.kind == "min_cost" else report.iteration_time_s
