"""The search over outer choices (the package docstring tells its steps): preparation, the first
incumbent, best first refinement, the MILPs with a cutoff, the result."""
from __future__ import annotations

import contextvars
import functools
import heapq
import math
import queue as queues
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from hetplan.errors import EstimatorError, InfeasibleError, InstanceError, NoPlanInTimeError, PlanError
from hetplan.estimators import EstimatorSet, build_estimators
from hetplan.estimators.memo import memoised
from hetplan.formulations import joint
from hetplan.instance import Instance, relaxed_limits
from hetplan.plan import Plan, tp_indivisible
from hetplan.simulator import SimulationReport, simulate
from hetplan.simulator.sailor import ring_ordered
from hetplan.orchestration.planner.options import Combo, ComboRecord, PlannerOptions, PlannerResult, SearchProgress
from hetplan.orchestration.planner.inputs import (_Tables, _quotas, enumerate_combos, joint_inputs,
                                                  state_and_memory_bytes, state_shortfall, with_sync_table)
from hetplan.orchestration.planner.steps import _Step, _best_heuristic, _refine, _tight_bound
from hetplan.orchestration.planner.helper import _Helper, _Refiner


PROGRESS_EVERY_S = 0.1  # the progress callback is called at most this often (and once at the end)


PREPARE_SHARE = 0.6  # the outer choices' inputs and cheap bounds may take this share of the limit


DIVE_CLIMB_RUNS = 4  # heuristic runs of the local search (`_climb`) from a plan a dive found


RESCUE_S = 0.25  # no plan at the deadline: the greedy looks for one this long, or a quarter of the limit if less


class _Reporter:
    """Passes `SearchProgress` to the caller's callback at most every PROGRESS_EVERY_S seconds: a
    progress display needs no more, and the search calls this at every step."""

    def __init__(self, callback: Callable[[SearchProgress], None] | None, t_start: float):
        self.callback, self.t_start = callback, t_start
        self.total = 0
        self.last = -math.inf

    def __call__(self, done: int, what: str, incumbent: float | None = None, bound: float | None = None,
                 force: bool = False) -> None:
        if self.callback is None:
            return
        now = time.perf_counter()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        gap = None if incumbent is None or bound is None else (incumbent - bound) / max(abs(incumbent), 1e-12)
        self.callback(SearchProgress(done, self.total, what, incumbent, bound, gap, now - self.t_start))


class SearchTerminated(KeyboardInterrupt):
    """SIGTERM stopped `plan()`. Raised only where SIGTERM had its default action (the process
    would die without stopping the helper or running the caller's clean-up); a KeyboardInterrupt,
    so whatever handles Ctrl-C handles it too."""


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """During the search, a default SIGTERM raises SearchTerminated in this (the main) thread.
    A handler the caller installed is left alone, and so is SIGTERM off the main thread (Python
    lets only the main thread set handlers)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SearchTerminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class _Floor:
    """Lower bounds from the layer times alone, before any outer choice is built (~0.1 s on 10,000
    GPUs), over every pool a choice can use (no memory test, so over a superset of them). Per
    microbatch size b: F_b, one microbatch through every unit, each on its fastest pool; V_b, the
    least slowest-stage time per replica from the GPUs' work (`joint.fluid_gpu_seconds_s`); C_b,
    the least USD of one microbatch through every unit; R_b, the cheapest replica's USD per second.
    A plan with D replicas per stage runs every replica's stage m = B / (D b) times, its slowest
    stage theta >= max(F_b / P, D V_b) and T >= max(F_b, theta) + (m - 1) theta
    (`joint.time_lower_bound_s`), so T >= m D V_b = B V_b / b; summed over the replicas
    rate x T >= m D C_b with m D = B / b. Cost adds egress >= 0."""

    B: int
    per_b: dict[int, tuple[float, float, float, float]]  # b -> (F_b s, V_b s, C_b USD, R_b USD/s)

    @property
    def least_time_s(self) -> float:
        return min((max(f, self.B / b * v) for b, (f, v, _, _) in self.per_b.items()), default=math.inf)

    @property
    def least_cost_usd(self) -> float:
        return min((self.B / b * c for b, (_, _, c, _) in self.per_b.items()), default=math.inf)

    def choice_bound(self, combo: Combo, objective: str) -> float:
        """A bound on one choice's plans without its inputs, the cheap bound's formula
        (`joint.time_lower_bound_s`, times the least rate for cost) on the superset of pools."""
        if combo.b not in self.per_b:
            return math.inf
        f, v, _, rate = self.per_b[combo.b]
        m = self.B // (combo.D * combo.b)
        theta = max(f / combo.P, combo.D * v)
        t_lb = joint.iteration_time_s(m, max(f, theta), 0.0, theta, 0.0)
        return t_lb * combo.P * combo.D * rate if objective == "min_cost" else t_lb


def _floor(instance: Instance, tables: _Tables, quotas: dict, opts: PlannerOptions) -> _Floor:
    B = instance.workload.global_batch_size
    gpus: dict[str, int] = {}
    for (g, _), (avail, *_) in quotas.items():
        gpus[g] = gpus.get(g, 0) + avail
    per_b = {}
    for b in opts.microbatch_sizes:
        pools = [(g, price * t / 3600, t, tables.step(g, z, t, b))
                 for (g, z), (avail, per_node, price, _) in quotas.items()
                 for t in opts.tp_choices if tables.usable(g, t, b, per_node, avail)]
        if B % b or not pools:
            continue
        units = range(tables.U)
        work = joint.least_work_by_type((g, [t * step[l] for l in units]) for g, _, t, step in pools)
        per_b[b] = (sum(min(step[l] for *_, step in pools) for l in units),
                    joint.fluid_gpu_seconds_s(work, gpus, instance.constraints.max_gpus),
                    sum(min(rate * step[l] for _, rate, _, step in pools) for l in units),
                    min(rate for _, rate, *_ in pools))
    return _Floor(B, per_b)


def _limits(instance: Instance, opts: PlannerOptions) -> tuple[float | None, float | None, tuple[str, str]]:
    """The budget and the throughput floor, and the fields a refusal names them by: the option when
    given (the CLI maps it to its flag), else the instance's constraint."""
    c = instance.constraints
    cost = (opts.max_cost_usd, "planner.max_cost_usd") if opts.max_cost_usd is not None else (
        c.max_cost_per_iteration_usd, "constraints.max_cost_per_iteration_usd")
    floor = (opts.min_iters_per_s, "planner.min_iters_per_s") if opts.min_iters_per_s is not None else (
        c.min_throughput_iters_per_s, "constraints.min_throughput_iters_per_s")
    return cost[0], floor[0], (cost[1], floor[1])


def _budget_refusal(max_cost: float, least: float, field: str) -> InfeasibleError:
    return InfeasibleError(f"{max_cost:g} USD is below the least cost of any plan, {least:.4g} USD; raise the budget "
                           f"to at least that", field)


def _check_reachable(floor: _Floor, max_cost: float | None, min_its: float | None, fields: tuple[str, str]) -> None:
    """InfeasibleError at once when the budget or the throughput floor is beyond every plan
    (`_Floor`), naming the limit (`fields`: the budget's, the floor's) and the best figure any plan
    can reach."""
    if max_cost is not None and floor.least_cost_usd > max_cost:
        raise _budget_refusal(max_cost, floor.least_cost_usd, fields[0])
    if min_its is not None and floor.least_time_s * min_its > 1:
        raise InfeasibleError(f"{min_its:g} it/s is above the most any plan reaches, {1 / floor.least_time_s:.4g} "
                              f"it/s; lower the floor to at most that", fields[1])


def _check_choices_reachable(queue: list, objective: str, max_cost: float | None, field: str) -> None:
    """With every choice's cheap bound in: InfeasibleError when the budget is below all of their
    cost bounds (rate_LB x T_LB: unlike `_Floor.least_cost_usd` it counts the P x D replicas a
    choice pays for while the slowest stage runs)."""
    if max_cost is None or not queue:
        return
    least = min(item[0] if objective == "min_cost" else item[0] * joint.rate_lower_bound_usd_per_s(item[6])
                for item in queue)
    if least > max_cost:
        raise _budget_refusal(max_cost, least, field)


def _prepare(instance: Instance, tables: _Tables, quotas: dict, combos: list[Combo], objective: str,
             max_cost: float | None, min_its: float | None, tp_choices: tuple[int, ...], floor: _Floor,
             until: joint.Deadline, report: _Reporter) -> tuple[list[ComboRecord], list, list[ComboRecord]]:
    """(records, queue items, skipped): every outer choice's inputs and cheap bound, the least
    `floor.choice_bound` first, until `until`; a choice not reached by then is skipped with that
    bound (under a tight limit the most promising choices are the ones prepared). Records and
    items come back in enumeration order: a preparation that finishes gives the search the same
    queue whatever the order it took."""
    bounds = [floor.choice_bound(combo, objective) for combo in combos]
    made: dict[int, ComboRecord | tuple] = {}
    for j in sorted(range(len(combos)), key=bounds.__getitem__):
        if until.expired():
            break
        report(len(made), "preparing the outer choices")
        made[j] = _prepare_one(instance, tables, quotas, combos[j], objective, max_cost, min_its, tp_choices)
    records: list[ComboRecord] = []
    queue: list = []  # (bound, P, D, b, exact?, combo, inputs): best first, bounds refined lazily
    skipped: list[ComboRecord] = []
    for j, combo in enumerate(combos):
        got = made.get(j)
        if got is None:
            skipped.append(ComboRecord(combo.P, combo.b, combo.D, bounds[j], "skipped_time"))
        elif isinstance(got, ComboRecord):
            records.append(got)
        else:
            queue.append(got)
    return records, queue, skipped


def _prepare_one(instance: Instance, tables: _Tables, quotas: dict, combo: Combo, objective: str,
                 max_cost: float | None, min_its: float | None, tp_choices: tuple[int, ...]) -> ComboRecord | tuple:
    """One choice's queue item (cheap bound, P, D, b, level 0, choice, inputs), or its record
    when no pool holds a unit or the cheap bound misses the throughput floor."""
    inp = joint_inputs(instance, tables, quotas, combo, objective, max_cost, min_its, tp_choices)
    if inp is None:
        return ComboRecord(combo.P, combo.b, combo.D, float("inf"), "no_pools")
    if joint.blocks_identical(inp) and any(not joint.block_counts(inp, i) for i in range(combo.P)):
        # Where the first block differs (Sailor's profiles) the compact form puts it with the
        # embedding, so P = L + 2 (one unit a stage) has no layout; its bounds looked up a stage-0
        # block count that does not exist (KeyError).
        return ComboRecord(combo.P, combo.b, combo.D, float("inf"), "infeasible")
    t_lb = joint.time_lower_bound_s(inp)
    lb = t_lb * joint.rate_lower_bound_usd_per_s(inp) if objective == "min_cost" else t_lb
    if min_its is not None and t_lb > 1 / min_its:
        return ComboRecord(combo.P, combo.b, combo.D, lb, "infeasible_by_bound")
    return (lb, combo.P, combo.D, combo.b, 0, combo, inp)


class _Scorer:
    """The objective of a candidate plan as the simulator says (the model is a relaxation of it:
    formulations/joint/milp.py), or None when the simulator finds it over a limit, out of memory or
    unplaceable. Every plan the search keeps is scored here: the plan returned and its gap read the
    simulator's figure; the cutoffs read the model's (`_Outcome.lead`)."""

    def __init__(self, instance: Instance, est: EstimatorSet, objective: str, max_cost: float | None,
                 min_its: float | None):
        self.instance, self.est, self.objective = instance, memoised(est), objective
        self.max_cost, self.min_its = max_cost, min_its
        self.reports: dict = {}  # (pools, P, D, b, ranges, replicas) -> SimulationReport or None

    def __call__(self, candidate: tuple | None) -> tuple | None:
        if candidate is None:
            return None
        _, sol, inp = candidate
        rep = self.report(sol, inp)
        if rep is None:
            return None
        return (self._objective(rep), sol, inp)

    def _objective(self, rep: SimulationReport) -> float:
        return rep.cost_per_iteration_usd if self.objective == "min_cost" else rep.iteration_time_s

    def report(self, sol: joint.JointSolution, inp: joint.JointInputs, named: Plan | None = None
               ) -> SimulationReport | None:
        """The simulation of `sol` (None as in `__call__`), once per plan; with `named` (the same plan
        with a name and metadata), the report's placed plan carries them."""
        key = (inp.pools, inp.P, inp.D, inp.b, sol.ranges, sol.replicas)
        if key not in self.reports:
            self.reports[key] = self._simulate(sol, inp)
        rep = self.reports[key]
        if rep is None or named is None:
            return rep
        return replace(rep, plan=rep.plan.model_copy(
            update={"name": named.name, "instance": named.instance, "metadata": named.metadata}))

    def _simulate(self, sol: joint.JointSolution, inp: joint.JointInputs) -> SimulationReport | None:
        try:
            rep = simulate(self.instance, joint.to_plan(sol, inp), self.est)
        except PlanError:  # first fit found no node for some replica (TP degrees mixed on a node group)
            return None
        except EstimatorError:  # e.g. Sailor's bandwidth fit is negative at some message size
            return None
        reports = [rep]
        if self.est.iteration == "sailor":  # Sailor's all-reduce reads the replica order: try the best ones
            # the least sync may interleave zones and cost more egress: also whole groups, then the
            # best of the orders within the limits
            for whole in (False, True):
                try:
                    ordered = ring_ordered(self.instance, rep.plan, self.est, whole_groups=whole)
                    if all(ordered != r.plan for r in reports):
                        reports.append(simulate(self.instance, ordered, self.est))
                except EstimatorError:  # a pair the zone table lacks: that order cannot be simulated
                    continue
        return min((r for r in reports if self._within_limits(r)), key=self._objective, default=None)

    def _within_limits(self, rep: SimulationReport) -> bool:
        cap = self.instance.constraints.max_gpus  # the simulator's own rule too (constraint_violations)
        return not rep.oom_ranks and (self.max_cost is None or rep.cost_per_iteration_usd <= self.max_cost) and (
            self.min_its is None or rep.iters_per_s >= self.min_its) and (cap is None or rep.num_gpus <= cap)


@dataclass
class _Outcome:
    """What the search has found and proven so far."""

    records: list[ComboRecord]
    score: _Scorer
    best: tuple | None = None  # (simulated objective, solution, inputs): the plan returned
    # (model objective, solution, inputs) of the plan the model rates best among those the simulator
    # accepts: the search's incumbent (cutoffs, pruning), so that the model's bounds are compared
    # with a figure of the model (`bound`)
    lead: tuple | None = None
    greedy_best: tuple | None = None  # the best heuristic plan
    open_bounds: list[float] = field(default_factory=list)  # bounds of choices not solved to the end
    unfinished: list = field(default_factory=list)  # `_ChoiceResult`s whose MILP stopped at its limit
    solved: int = 0
    pruned: int = 0
    cut: bool = False  # the time limit stopped the search before every choice was settled
    # a bound on the simulated objective of every plan of the space proven past the model's figures
    # (`_beyond_the_model`): it counts where it is above the one the search proved
    proven: float | None = None
    past_open: int | None = None  # the choices `_beyond_the_model` left open (None: it did not run)

    @property
    def timed_out(self) -> bool:
        return self.cut or any(r.status == "skipped_time" for r in self.records)

    def found(self, candidate: tuple | None, heuristic: bool = False) -> None:
        """Score `candidate` (model objective, solution, inputs) with the simulator; keep it as the
        plan to return if the simulator finds it better, and as the lead if the model does. The
        model's figure is at most the simulator's (formulations/joint/milp.py), so a candidate whose
        model figure already ties or loses to every plan it could replace is not simulated."""
        if candidate is None or self._cannot_win(candidate[0], heuristic):
            return
        scored = self.score(candidate)
        if scored is None:
            return
        self.best = joint.better(self.best, scored)
        self.lead = joint.better(self.lead, candidate)
        if heuristic:
            self.greedy_best = joint.better(self.greedy_best, scored)

    def _cannot_win(self, model_objective: float, heuristic: bool) -> bool:
        kept = [self.lead, self.best] + ([self.greedy_best] if heuristic else [])
        return all(k is not None and k[0] <= model_objective for k in kept)

    @property
    def incumbent(self) -> float | None:
        """The lead's model objective: what a choice's bound must beat to be worth solving."""
        return self.lead[0] if self.lead else None

    def target(self, rel_gap: float) -> float:
        """What a choice's bound must reach to be closed: the returned plan's simulated objective less
        rel_gap, so that the gap reported (against the simulator) is within it, but no more than the
        lead's model objective (no bound of the model passes the model's own best: where the
        simulator rates the plan more than rel_gap above the model, the reported gap is that excess)."""
        return min(self.incumbent, self.best[0] * (1 - rel_gap)) if self.best else self.incumbent * (1 - rel_gap)

    def bound(self, head: float | None = None) -> float | None:
        """The least of everything still open (the head of the queue: `head`) and the lead's model
        objective: a choice was closed when nothing in it has a model objective below a lead's, so
        this bounds the model objective, and so the simulated one, of every plan of the space."""
        values = self.open_bounds + [item.bound for item in self.unfinished]
        values += [v for v in (head, self.incumbent) if v is not None]
        least = min(values) if values else None
        return least if self.proven is None else max(self.proven, -math.inf if least is None else least)

    def close_unfinished(self, rel_gap: float) -> None:
        """Sort the choices whose MILP stopped at its limit by bound, least first, and close them
        while the least reaches the target (`target`): the incumbent is within the gap of it, so it
        keeps its bound and is not solved again."""
        self.unfinished.sort(key=lambda item: item.bound)
        while self.unfinished and self.lead is not None and self.unfinished[0].bound >= self.target(rel_gap):
            self.open_bounds.append(self.unfinished.pop(0).bound)

    def skip_rest(self, entry: tuple, queue: list) -> None:
        """The deadline: the popped choice (queue `entry`) and every queued one are skipped with
        their bounds; the entry goes back to the list for `_rescue`."""
        _settle_rest(self.records, entry[0], entry[5], queue, "skipped_time")
        self.open_bounds += [entry[0]] + [item[0] for item in queue]
        queue.append(entry)
        self.cut = True


def plan(instance: Instance, opts: PlannerOptions | None = None, estimators: EstimatorSet | None = None,
         progress: Callable[[SearchProgress], None] | None = None, tables: _Tables | None = None) -> PlannerResult:
    """The best plan found within `opts.time_limit_s`, with its proven bound (module docstring).

    The limit covers the whole call: estimator tables, the choices' inputs, heuristics, bounds,
    MILPs, the helper process and the final simulation (measured within 10 % + 1 s). `progress`
    gets a `SearchProgress` at most every PROGRESS_EVERY_S seconds and once at the end. Raises
    InfeasibleError when the constraints cannot be met (at once when a bound shows a budget or a
    throughput floor out of reach), SolverError when the time ran out before any plan was found,
    KeyboardInterrupt on SIGINT and `SearchTerminated` on a SIGTERM left at its default; the
    helper process is stopped before any of them leaves. `tables` (`planner_tables` of this very
    instance and estimators) carries figures over from earlier calls; the search is the same."""
    if tables is not None and (tables.inst is not instance or estimators is None or tables.est is not estimators):
        raise PlanError("tables were made for another instance or other estimators", "tables")
    opts = _splittable_tps(instance, opts or PlannerOptions())
    t_start = time.perf_counter()
    deadline = joint.Deadline.after(opts.time_limit_s)
    with _sigterm_as_interrupt():
        return _plan(instance, opts, estimators, _Reporter(progress, t_start), deadline, tables)


def _splittable_tps(instance: Instance, opts: PlannerOptions) -> PlannerOptions:
    """Only TP degrees that split the model's heads and MLP evenly (plan.tp_indivisible): the plan
    validator refuses the others, so the search must not offer them (e.g. TP 8 for 20 heads)."""
    arch = instance.model_arch
    tps = tuple(t for t in opts.tp_choices if not tp_indivisible(arch, t))
    if not tps:
        raise InstanceError(f"no TP degree of {opts.tp_choices} splits {arch.name} evenly "
                            f"({'; '.join(tp_indivisible(arch, max(opts.tp_choices)))})", "tp_choices")
    return opts if tps == tuple(opts.tp_choices) else replace(opts, tp_choices=tps)


def _plan(instance: Instance, opts: PlannerOptions, estimators: EstimatorSet | None, report: _Reporter,
          deadline: joint.Deadline, tables: _Tables | None = None) -> PlannerResult:
    est = estimators or build_estimators(instance)
    objective = opts.objective or instance.objective.kind
    max_cost, min_its, fields = _limits(instance, opts)
    # the simulator's tolerance, so both call the same plans feasible
    max_cost, min_its = relaxed_limits(max_cost, min_its)
    quotas = _quotas(instance, opts)
    if not quotas:
        raise InfeasibleError("no GPUs are available under allowed_gpu_types / allowed_zones")
    # before a limit's check: with the model's state beyond every GPU no plan exists at all
    if why := state_shortfall(instance, state_and_memory_bytes(instance, est, quotas)):
        raise InfeasibleError(why)
    tables = tables or _Tables(instance, est)
    floor = _floor(instance, tables, quotas, opts)
    _check_reachable(floor, max_cost, min_its, fields)
    combos = enumerate_combos(instance, quotas, opts)
    report.total = len(combos)
    linear = opts.linearize or opts.backend not in (None, "scip")
    milp = _MilpSettings(opts.backend or ("highs" if linear else "scip"), linear, opts.rel_gap)
    # the heuristics need part of the limit for a first plan, whatever the preparation takes
    until = joint.Deadline(deadline.at - (1 - PREPARE_SHARE) * opts.time_limit_s)
    records, queue, skipped = _prepare(instance, tables, quotas, combos, objective, max_cost, min_its,
                                       opts.tp_choices, floor, until, report)
    out = _Outcome(records + skipped, _Scorer(instance, est, objective, max_cost, min_its))
    if skipped:  # their bounds from the layer times stand in the reported bound
        out.open_bounds.append(min(r.lower_bound for r in skipped))
        out.cut = True
    else:
        _check_choices_reachable(queue, objective, max_cost, fields[0])
    inputs_of = {entry[5]: entry[6] for entry in queue}
    heapq.heapify(queue)
    with joint.deadline_scope(deadline):
        _search(queue, tables, objective, max_cost, min_its, opts, milp, deadline, report, out)
        _beyond_the_model(out, inputs_of, tables, objective, milp, opts, deadline, report)
    if out.best is None and out.timed_out:  # outside the search's scope: the rescue has a deadline of its own
        out.found(_rescue(queue, objective, max_cost, min_its, opts.time_limit_s), heuristic=True)
    return _result(instance, objective, (max_cost, min_its), opts, milp.backend, len(combos), out, deadline,
                   report)


def _search(queue: list, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
            opts: PlannerOptions, milp: "_MilpSettings", deadline: joint.Deadline, report: _Reporter,
            out: _Outcome) -> None:
    """Best first over the queued choices (module docstring), into `out`:

        first incumbent (heuristics on the most promising choices)
        while choices are queued: take the one of least bound
            within the gap of the incumbent?  prune it and every one left; stop
            not refined three times?          its next bound, back in the queue   (`_Search.refine`)
            its strongest bound is stale?     again at today's target, back        (`_Search.retarget`)
            no stage-DP plan yet?             the heuristics; a better incumbent sends it back
            else                              its MILP with the target as cutoff (`_Search.solve`),
                                              in a thread while the search goes on (`_Flight`)
        the MILPs still running: their plans and bounds (their own limits lifted, `_Flight.lift`);
                                              a free slot solves again a MILP stopped at its limit
        the time left goes to the MILPs stopped at their own limit

    At the deadline every choice left is recorded "skipped_time" with the bound it has (a
    computation the deadline cut is dropped, so every bound kept is valid)."""
    search = _Search(queue, tables, objective, max_cost, min_its, opts, milp, deadline, report, out)
    try:
        search.run()
    finally:  # the helper stops (and the collector's frozen objects come back) whatever happened
        search.close()
    _resolve_unfinished(out, objective, milp, deadline, opts.rel_gap)


class _Search:
    """The state of one best-first search: the queue of (bound, P, D, b, level, combo, inputs), what
    was found (`out`), the refinement steps' executor (`_Refiner`, with the helper process when
    there is one), the heuristics' results per choice and how many stage-DP runs are left."""

    def __init__(self, queue: list, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
                 opts: PlannerOptions, milp: "_MilpSettings", deadline: joint.Deadline, report: _Reporter,
                 out: _Outcome):
        self.queue, self.tables, self.objective = queue, tables, objective
        self.max_cost, self.min_its = max_cost, min_its
        self.opts, self.milp, self.deadline, self.report, self.out = opts, milp, deadline, report, out
        self.greedies: dict[Combo, tuple] = {}  # heuristic results per choice, and whether the stage DP ran
        self.dp_runs_left = opts.heuristic_choices  # stage-DP runs for the first choices the strong bound keeps
        self.strongest_for: dict[Combo, float | None] = {}  # the target each choice's strongest bound had
        self.dived = False  # whether the heuristics dived before the first MILP
        self.restarted: dict[Combo, ComboRecord] = {}  # choices queued again after a stale cutoff (`_settle`)
        self.finishing = False  # `_finish`: no queue is taken any more
        self.helper = self.refiner = None
        self.flight = _Flight(opts.concurrent_milps, functools.partial(_parallel_solves, milp.backend))

    # ---- the search ------------------------------------------------------------------------------
    def run(self) -> None:
        out, opts = self.out, self.opts
        self._start_refiner()
        out.found(_first_incumbent(self.queue, self.tables, self.objective, self.max_cost, self.min_its, self.greedies,
                                   opts.heuristic_choices, opts.heuristic_degrees, opts.rel_gap, self._tick,
                                   opts.climb_runs),
                  heuristic=True)
        self._follow()
        self._loop()
        self._finish()

    def _finish(self) -> None:
        """Nothing queued: the MILPs still running give their plans and bounds, their own limits
        lifted (`_Flight.lift`), and a free slot takes a choice whose MILP stopped at its limit
        (`_resume_unfinished`). No dive: no MILP follows."""
        self.finishing = True
        self.flight.lift()
        self._resume_unfinished()
        while self.flight.threads:
            for item in self.flight.collect(block=True):
                self._settle(item, dive=False)
            self._resume_unfinished()

    def _loop(self) -> None:
        queue, out, opts = self.queue, self.out, self.opts
        while queue:
            for item in self.flight.collect(block=False):
                self._settle(item)
            entry = self._ready_first(heapq.heappop(queue))
            lb, _, _, _, level, combo, _ = entry
            incumbent = out.incumbent
            self.report(len(out.records), f"P={combo.P} b={combo.b} D={combo.D}",
                        out.best[0] if out.best else None, out.bound(lb))
            if incumbent is not None and lb >= out.target(opts.rel_gap):
                # best first: every choice left has a bound at least this one
                out.pruned += _settle_rest(out.records, lb, combo, queue, "pruned_bound")
                out.open_bounds.append(lb)
                return
            if self.deadline.remaining() < 0.05:
                out.skip_rest(entry, queue)
                return
            try:
                if level < 3:
                    self.refine(entry)
                    continue
                if self.retarget(entry):
                    continue
                if self.dive_first():
                    heapq.heappush(queue, entry)
                    self._follow()
                    continue
                found, with_dp = self.greedies.get(combo, (None, False))
                if not with_dp:
                    lead = out.incumbent
                    found = _heuristics_on(combo, entry[6], self.greedies, out, self.objective, self.max_cost,
                                           self.min_its)
                    if out.incumbent != lead:  # a better incumbent: the check above first, then maybe the MILP
                        heapq.heappush(queue, entry)
                        self._follow()
                        continue
            except joint.DeadlineExceeded:  # a bound or heuristic of this choice reached the deadline
                out.skip_rest(entry, queue)
                return
            if self.flight.full():  # back in the queue: what the running MILPs find may settle it
                heapq.heappush(queue, entry)
                for item in self.flight.collect(block=True):
                    self._settle(item)
                continue
            self.solve(entry, found, with_dp)

    def _ready_first(self, head: tuple) -> tuple:
        """The entry the loop takes: `head`, or, when the head needs a refinement step and a MILP
        slot is free beside running solves, the least-bound queued choice whose strongest bound is
        in and under the target (`head` goes back in the queue). That choice needs its MILP unless
        a new incumbent prunes it, and a refinement never needs a slot, so its MILP runs beside the
        head's refinement instead of after it (measured: Sailor's GPT-Neo on 5 zones x 32 A100, P3
        b2 D32's MILP waited 2-3.5 s for P7 b2 D16's strongest bound). Only where MILPs run in
        threads: with one slot a MILP holds the search up."""
        target = self._target_now()
        if head[4] == 3 or target is None:  # (no target, no MILP: the queue is not scanned)
            return head
        ready = min((e for e in self.queue if e[4] == 3), default=None)
        if ready is None or ready[0] >= target or self.flight.slots < 2 or self.flight.full():
            return head
        self.queue.remove(ready)
        heapq.heapify(self.queue)
        heapq.heappush(self.queue, head)
        return ready

    def dive_first(self) -> bool:
        """Before the first MILP, `_dive`: its cutoff is the incumbent, and a heuristic's plan on a
        choice the strong bound kept may beat it. True when it gave a new incumbent."""
        if self.dived:
            return False
        self.dived = True
        return _dive(self.queue, self.tables, self.objective, self.max_cost, self.min_its, self.greedies,
                     self.opts.heuristic_choices, self.out, self.opts.combo_time_limit_s, self.opts.rel_gap)

    def refine(self, entry: tuple) -> None:
        """The choice's next bound, in three steps, each choice going back in the queue: the medium
        bound (quota aware, no DP: a few milliseconds), the strong one (dynamic programs over stages,
        tens of milliseconds), the strongest (replica-level DPs on the sum of stage times, once an
        incumbent gives them a target); a choice is solved only if it is still the most promising
        one. The step is the same whichever process computes it (`_Refiner`). Each choice's inputs
        get the all-reduce times: the same object (and its caches) goes back in the queue."""
        lb, _, _, _, level, combo, inp = entry
        inp = with_sync_table(inp, self.tables)
        step = self._step_of((lb, 0, 0, 0, level, combo, inp))
        new_lb, found, dp_ran = self.refiner.run(step, inp, self._ahead)
        if level == 2:
            self.strongest_for[combo] = step.target
        if dp_ran:
            self.dp_runs_left -= 1
            self.greedies[combo] = (found, True)
            if found is not None:
                self.out.found((*found, inp), heuristic=True)
        pushed = None
        if new_lb == float("inf"):
            self.out.records.append(ComboRecord(combo.P, combo.b, combo.D, new_lb, "infeasible_by_bound"))
        else:
            pushed = (new_lb, combo.P, combo.D, combo.b, level + 1, combo, inp)
            heapq.heappush(self.queue, pushed)
        self._follow(pushed)

    def retarget(self, entry: tuple) -> bool:
        """The strongest bound stops early at its target: computed for a worse incumbent, it may
        reach this one's (measured: opt350-2zones-budget, P3 b1 D128 went to its MILP with
        1.6046 s, 12.5 s to reject; at the later target, 1.6149 s >= 1.6144 s). True when it was
        computed again and the choice went back in the queue with it."""
        lb, _, _, _, _, combo, inp = entry
        target, before = self._target_now(), self.strongest_for.get(combo)
        if target is None or lb >= target or (before is not None and before <= target):
            return False
        self.strongest_for[combo] = target
        again = _refine(inp, self.tables, _Step(combo, 2, lb, target, False), self.objective, self.max_cost,
                        self.min_its)[0]
        heapq.heappush(self.queue, (again, combo.P, combo.D, combo.b, 3, combo, inp))
        self._follow()
        return True

    def solve(self, entry: tuple, found: tuple | None, with_dp: bool) -> None:
        """The choice's MILP with the target as cutoff, warm-started from its heuristic plan."""
        lb, _, _, _, _, combo, inp = entry
        out = self.out
        rec = self.restarted.pop(combo, None)  # a choice solved again keeps its record and its count
        if rec is None:
            rec = ComboRecord(combo.P, combo.b, combo.D, lb, "")
            out.records.append(rec)
            out.solved += 1
        rec.lower_bound = lb
        if with_dp and found is not None:  # a plan of the first heuristics, not offered yet
            out.found((*found, inp), heuristic=True)
        target = self._target_now()
        job = functools.partial(_solve_choice, rec, inp, found, out.lead, self.objective, self.milp,
                                deadline=self.deadline, target=target)
        limit_s = self.opts.combo_time_limit_s
        if self.flight.slots > 1:  # its wall-clock limit is the search's deadline; its own limit is CPU time
            self.flight.launch(functools.partial(job, limit_s=math.inf), limit_s, stale=self._stale_from(target))
        else:
            self._settle(job(limit_s=limit_s))

    def _settle(self, item: "_ChoiceResult | None", dive: bool = True) -> None:
        """What one choice's MILP gave (None: nothing in the choice beats its cutoff)."""
        out = self.out
        item = self._past_refusals(item) if item is not None else None
        if item is not None:
            out.found(item.solution)
            if item.stale and not self.finishing:  # solved again at the target of now
                combo = Combo(item.record.P, item.record.b, item.record.D)
                self.restarted[combo] = item.record
                heapq.heappush(self.queue, (item.bound, combo.P, combo.D, combo.b, 3, combo, item.inputs))
            else:
                _file(item, out.unfinished, out.open_bounds)
                if dive and item.open and item.solution is None:  # a hard MILP: a better incumbent first
                    _dive(self.queue, self.tables, self.objective, self.max_cost, self.min_its, self.greedies,
                          self.opts.heuristic_choices, out, self.opts.combo_time_limit_s, self.opts.rel_gap)
        self._follow()

    def _past_refusals(self, item: "_ChoiceResult") -> "_ChoiceResult | None":
        """A MILP plan the simulator refuses (over a limit, out of memory, unplaceable: the model
        relaxes placement) leaves the rest of its choice unsearched: the choice's MILP is solved
        again without it and those refused before (`joint.build(exclude=)`), up to MAX_REFUSED
        plans and `combo_time_limit_s` in all. Where the rows left out the refused plans alone
        (`joint.excludes_only`), the last solve's answer is the choice's (None: nothing else beats
        the incumbent); else the choice keeps the first solve's bound, which holds for the plans
        left out too, and its record says that the rest of it was not searched (`refusals_open`:
        a search without a plan then says that none was proven impossible). Without it a min-cost
        search under a throughput floor on one V100 and two 1-GPU A100 nodes found no plan: every
        P2 b1 D1 plan the MILP found puts a boundary between
        the two A100 nodes, which the model times at the fastest pair of nodes anywhere, and the
        floor refuses it (a random campaign, session 59: 4 of 800 instances' min-cost runs under a
        floor; each then found the enumerated optimum, after up to 6 refusals in one choice). With
        the first bound kept that search's gap was 99.1 %, with the last solve's 0.02 % (the model
        now times that boundary by the zone's own pairs of nodes: no refusal there; the test's
        instance that still refuses is the campaign's seed 578)."""
        first, refused = item, []
        until = time.perf_counter() + self.opts.combo_time_limit_s  # the solves again share one choice's limit
        while (item.solution is not None and self.out.score(item.solution) is None and len(refused) < MAX_REFUSED
               and self.deadline.remaining() >= 0.1 and time.perf_counter() < until):
            refused.append(item.solution[1])
            again = _solve_choice(item.record, item.inputs, None, self.out.lead, self.objective, self.milp,
                                  until - time.perf_counter(), self.deadline, first.bound,
                                  target=self._target_now(), exclude=tuple(refused))
            if again is None or again.solution is None:  # nothing else below the cutoff, or no plan in time
                if all(map(joint.excludes_only, refused)):
                    first.record.refusals_open = again is not None and again.open
                    return again
                break
            item = again
        exact = all(map(joint.excludes_only, refused))
        # rows that left out more than the refused plans, or a refused plan the loop ended on, leave
        # the rest of the choice unsearched
        first.record.refusals_open = not exact or (item.solution is not None and self.out.score(item.solution) is None)
        if item is first or exact:
            return item
        return replace(item, bound=min(item.bound, first.bound), open=item.open and item.solution is not None)

    def _resume_unfinished(self) -> None:
        """Nothing queued, and a MILP slot free beside the lifted MILPs: the choices whose MILP
        stopped at its own limit solve again there, least bound first, to the search's deadline,
        rather than after the last running MILP ends (`_resolve_unfinished`). Measured: Sailor's
        GPT-Neo-2.7B on 5 zones x 32 A100 at 90 s, P6 b2 D16 stopped at its limit at 22.6 s; one
        slot stayed free from 39.0 s while P7 b2 D16 ran to 72.0 s, and P6 started again only then."""
        out = self.out
        if not out.unfinished or self.flight.slots < 2:
            return
        while not self.flight.full() and self.deadline.remaining() >= 1.0:
            out.close_unfinished(self.opts.rel_gap)
            if not out.unfinished:
                return
            item = out.unfinished.pop(0)
            target = self._target_now()
            job = functools.partial(_solve_choice, item.record, item.inputs, item.start, out.lead, self.objective,
                                    self.milp, math.inf, self.deadline, item.bound, target=target)
            self.flight.launch(job, math.inf, stale=self._stale_from(target))

    def _stale_from(self, target: float | None) -> Callable[[], bool]:
        """Asked by a MILP launched now with `target` (`_Flight.launch`): whether its cutoff is stale."""
        cutoff = _cutoff(self.out.lead, target)
        return lambda: _stale(cutoff, self._target_now())

    def close(self) -> None:
        self.flight.close()
        if self.refiner is not None:
            self.refiner.close()
        elif self.helper is not None:
            self.helper.close()

    # ---- the refinement steps ahead (the helper's queue) ----------------------------------------
    def _start_refiner(self) -> None:
        """A helper process (two cores) computes the medium bounds of the queued choices, in queue
        order, while this one runs the heuristics of the first incumbent, and then the later steps
        of the choices under the target (`_Refiner`)."""
        if self.opts.workers >= 2 and not self.deadline.expired():  # (the preparation may have used the time up)
            self.helper = _Helper.start({item[5]: item[6] for item in self.queue}, self.tables, self.objective,
                                        self.max_cost, self.min_its, self.deadline)
        self.refiner = _Refiner(self.tables, self.objective, self.max_cost, self.min_its, self.helper)
        # the medium bounds ahead, in queue order; the first choices get warm caches from the heuristics
        self.refiner.enqueue([(_Step(item[5], 0, item[0], None, False), item[6])
                              for item in sorted(self.queue)[self.opts.heuristic_choices:]])

    def _tick(self, what: str, best: tuple | None) -> None:
        """Progress during the first incumbent's heuristics: their best plan so far is scored with
        the simulator as it comes (`_Outcome.found`), so the incumbent reported is the simulator's
        figure from the start, as later in the search and in the result (the model's figure, up to
        ~1 % lower, made the reported incumbent rise when the search proper began)."""
        self.out.found(best, heuristic=True)
        self.report(len(self.out.records), what, self.out.best[0] if self.out.best else None,
                    self.out.bound(self.queue[0][0] if self.queue else None))

    def _target_now(self) -> float | None:
        return None if self.out.lead is None else self.out.target(self.opts.rel_gap)

    def _step_of(self, item: tuple) -> _Step:
        """The step the search takes when queued `item` comes out at the head, as things stand."""
        i_lb, i_level, i_combo = item[0], item[4], item[5]
        allowed = i_level == 1 and self.dp_runs_left > 0 and not self.greedies.get(i_combo, (None, False))[1]
        return _Step(i_combo, i_level, i_lb, self._target_now() if i_level > 0 else None, allowed,
                     self.opts.rel_gap if allowed else 0.0)

    def _live(self, item: tuple) -> bool:
        """Whether `item` will be refined if the target does not change."""
        target = self._target_now()
        return item[4] < 3 and (target is None or item[0] < target) and (item[4] < 2 or target is not None)

    def _steps_ahead(self, items) -> list:
        return [(self._step_of(item), item[6]) for item in items if self._live(item)]

    def _ahead(self) -> list:
        """The steps that may come next, in queue order, each with a function that gives its inputs
        (with the all-reduce times, put back in the queue: the caches the step fills stay with the
        choice; asked only for the step taken, as the queue stands still meanwhile)."""
        queue = self.queue

        def inputs(j: int) -> joint.JointInputs:
            queue[j] = queue[j][:6] + (with_sync_table(queue[j][6], self.tables),)  # same key
            return queue[j][6]
        live = sorted((j for j in range(len(queue)) if self._live(queue[j])), key=lambda j: queue[j][:5])
        return [(self._step_of(queue[j]), functools.partial(inputs, j)) for j in live]

    def _follow(self, pushed: tuple | None = None) -> None:
        """Keep the helper's steps those of the queue: all again when the target or the DP
        allowance changed (its other steps are stale), else the choice just queued."""
        state = (self._target_now(), self.dp_runs_left > 0)
        if state != self.refiner.state:  # (the medium-bound steps need no target: those queued stay)
            self.refiner.reset(state, self._target_now(), self._steps_ahead(item for item in self.queue if item[4] > 0))
        elif pushed is not None:
            self.refiner.enqueue(self._steps_ahead([pushed]))


class _Flight:
    """The choices' MILPs (`_solve_choice`), up to `slots` at once, each in a thread of its own
    while the search goes on (HiGHS solves without the GIL). A MILP launched while another runs has
    the target of its launch as cutoff: valid whatever the other finds, since a cutoff above the
    final target only keeps more plans in; once the target falls STALE_DROP below it, the MILP stops
    and its choice goes back in the queue (`_stale`, `_Search._settle`). With one slot
    `_Search.solve` does not use it: it solves each MILP itself, one after another."""

    def __init__(self, slots: int, parallel: Callable[[], bool] = lambda: True):
        self._asked, self._parallel = slots, parallel
        self.threads: list[threading.Thread] = []
        self.results: queues.SimpleQueue = queues.SimpleQueue()
        self.stop = threading.Event()  # `close`: the running solves stop at HiGHS's next callback
        self.unbounded = threading.Event()  # `lift`: the running solves' own limits no longer apply

    @functools.cached_property
    def slots(self) -> int:
        """The slots asked for where the back-end solves without the GIL, else 1. Asked at the first
        MILP, not before: the back-end's module loads Pyomo, which a search without a MILP never needs."""
        return max(1, self._asked) if self._parallel() else 1

    def full(self) -> bool:
        return len(self.threads) >= self.slots

    def launch(self, job: Callable[..., "_ChoiceResult | None"], limit_s: float,
               stale: Callable[[], bool] | None = None) -> None:
        """Run `job(interrupt=...)` in a thread, in the caller's context (its deadline scope), its
        MILP stopped by `close`, after `limit_s` seconds of its thread's CPU time (`_CpuBudget`) or
        when `stale()` says its cutoff is stale (its result then says so: `_ChoiceResult.stale`)."""
        context = contextvars.copy_context()

        def work() -> None:
            budget = _CpuBudget(limit_s, self.stop, self.unbounded, stale)
            try:
                value = context.run(job, interrupt=budget)
                got = (True, replace(value, stale=True) if budget.went_stale and value is not None else value)
            except BaseException as exc:  # noqa: BLE001  re-raised by `collect` in the search's thread
                got = (False, exc)
            self.results.put((thread, got))

        thread = threading.Thread(target=work, name="hetplan-milp", daemon=True)
        self.threads.append(thread)
        thread.start()

    def collect(self, block: bool) -> list:
        """The results of the MILPs that finished; with `block`, at least one if any runs."""
        done: list = []
        while self.threads:
            try:
                thread, (ok, value) = self.results.get(block=block and not done)
            except queues.Empty:
                break
            self.threads.remove(thread)
            if not ok:
                raise value
            done.append(value)
        return done

    def lift(self) -> None:
        """The search has nothing left but the running MILPs: each may run to the search's deadline.
        Stopped at its own limit it would be solved again from scratch with the time left
        (`_resolve_unfinished`), its branch and bound lost (measured: Sailor's OPT-350M on 2 zones x
        (128 A100 + 128 V100), P6 b2 D32's MILP ran 12.4-26.2 s to its 10 CPU-s limit, then again
        26.3-30.1 s, where HiGHS alone proves it in 23.9 s)."""
        self.unbounded.set()

    def close(self) -> None:
        """Stop the running MILPs and wait for them (a HiGHS thread still running at interpreter
        exit aborts the process); a Ctrl-C meanwhile does not cut the wait short."""
        self.stop.set()
        for thread in self.threads:
            while thread.is_alive():
                try:
                    thread.join()
                except KeyboardInterrupt:
                    pass
        self.threads.clear()


class _CpuBudget:
    """Asked at HiGHS's callbacks in the thread that solves (`SolveOptions.interrupt`): stop when the
    search stops (`stop`) or when that thread has had `limit_s` seconds of CPU since the first call,
    unless the limit was lifted (`unbounded`, `_Flight.lift`).
    A MILP's own limit counts the work it was given, not the wall time: MILPs solving side by side
    with each other and the helper get less of the two cores each (measured:
    d_opt350_het_32_96_maxthr_budget0.5, a MILP that ends in 4.8 s alone stopped at a 5 s wall-clock
    limit and was solved again)."""

    def __init__(self, limit_s: float, stop: threading.Event, unbounded: threading.Event | None = None,
                 stale: Callable[[], bool] | None = None):
        self.limit_s, self.stop, self.start = limit_s, stop, None
        self.unbounded = unbounded or threading.Event()
        self.stale, self.went_stale = stale, False

    def __call__(self) -> bool:
        now = time.thread_time()
        if self.start is None:
            self.start = now
        if self.stale is not None and not self.stop.is_set() and self.stale():
            self.went_stale = True
            return True
        return self.stop.is_set() or (now - self.start > self.limit_s and not self.unbounded.is_set())


# A MILP running in a thread is stopped and its choice solved again when the search's target has
# fallen this far (relative) below the MILP's cutoff (`_stale`).
STALE_DROP = 0.005


def _cutoff(lead: tuple | None, target: float | None) -> float | None:
    """A choice's MILP cuts at the search's target, or at the lead's objective without one (None:
    neither, no cutoff)."""
    values = [v for v in (None if lead is None else lead[0], target) if v is not None]
    return min(values, default=None)


def _stale(cutoff: float | None, target: float | None) -> bool:
    """Whether a MILP with this cutoff is better solved again with the search's `target` of now: a
    cutoff above the target keeps in plans that cannot decide the search, and they make the MILP
    slower to prove that nothing is below the target (measured: spot_trace_2type, P8 b1 D4 ran 39 s
    without a plan at the cutoff 0.29904 s of its launch, where alone at the later 0.29600 s HiGHS
    proves it infeasible in 10.8 s)."""
    return target is not None and (cutoff is None or target < cutoff * (1 - STALE_DROP))


def _parallel_solves(backend: str) -> bool:
    """Whether `backend` solves without the GIL. It is probed first, here in the search's thread:
    HiGHS then makes its first Highs object, whose banner needs a process-wide redirection of
    stdout (`highs_backend._new_highs`), before any MILP thread exists."""
    from hetplan.solvers.registry import backend_class

    cls = backend_class(backend)
    cls.probe()
    return cls.capabilities.parallel_solves


def _resolve_unfinished(out: _Outcome, objective: str, milp: "_MilpSettings", deadline: joint.Deadline,
                        rel_gap: float) -> None:
    """Time left (every choice settled early): the choices whose MILP stopped at its own limit get
    the rest, least bound first, in equal shares; those left at the deadline keep their bounds."""
    while True:
        out.close_unfinished(rel_gap)
        remaining = deadline.remaining()
        if not out.unfinished:
            break
        if remaining < 1.0:
            out.cut = True
            break
        item = out.unfinished.pop(0)
        again = _solve_choice(item.record, item.inputs, item.start, out.lead, objective, milp,
                              remaining / (len(out.unfinished) + 1), deadline, item.bound,
                              target=out.target(rel_gap) if out.lead is not None else None)
        if again is not None:
            out.found(again.solution)
            _file(again, out.unfinished, out.open_bounds)
    out.open_bounds += [item.bound for item in out.unfinished]
    out.unfinished = []


def _rescue(queue: list, objective: str, max_cost: float | None, min_its: float | None,
            limit_s: float) -> tuple | None:
    """No plan at the deadline: the best plan the greedy finds on the queued choices, least bound
    first, within RESCUE_S or a quarter of the limit (milliseconds per choice: on 10,000 GPUs the
    second choice had one), or None. Inputs without their all-reduce table keep the ring formula."""
    best = None
    with joint.deadline_scope(joint.Deadline.after(min(RESCUE_S, 0.25 * limit_s))):
        try:
            for item in sorted(queue, key=lambda item: item[:5]):
                found = _best_heuristic(item[6], objective, max_cost, min_its, dp=False)
                if found is not None:
                    best = joint.better(best, (*found, item[6]))
        except joint.DeadlineExceeded:
            pass
    return best


# a plan of `_beyond_the_model` whose family (`joint.excluded_counts`) has more plans than this leaves
# its choice open: each of them is simulated
MAX_FAMILY = 64
# the MILPs of `_beyond_the_model` stop at their first plan under the cutoff (a relative gap no plan
# misses): each plan under it is left out in turn whatever the order, so only the last solve, which
# finds none, has to prove anything (measured: helper-12's seed 647, 14.7-16.0 s with 1.96-2.27 % left
# to 7.9-8.1 s at 1.00 %; the 31 seeds of the commit before the same plans and gaps, 0.04-1.09 s each)
FIRST_PLAN_GAP = 1.0


def _beyond_the_model(out: _Outcome, inputs_of: dict, tables: _Tables, objective: str, milp: "_MilpSettings",
                      opts: PlannerOptions, deadline: joint.Deadline, report: _Reporter) -> None:
    """A complete search whose simulated gap is above rel_gap, time left: the model rated a plan (the
    lead) below what the simulator says, and every choice was closed at the lead's model figure. Each
    choice whose proven model bound is below the target t = best (1 - rel_gap) is solved again with
    t as cutoff; each plan its MILP finds is simulated with its whole family (the plans its exclusion
    row leaves out, `_family`), which is then left out (`joint.build(exclude_pools=, exclude=)`),
    until the MILP has no plan below t. Every plan of that choice
    is then at least t: those left out were simulated (each at least the best, which is at least t),
    the others have model figures, and so simulated ones, at least t. The bound proven
    (`_Outcome.proven`) is the least of t and the bounds of the choices left open: a MILP stopped at
    its limit (`combo_time_limit_s` for all the solves of one choice), a family of more than
    MAX_FAMILY plans, the deadline (the search is then "time_limit"). Measured (helper-12's campaign
    seed 406, /tmp/s66): the search ended "complete" at 0.1 s with a 27.2 % gap and a plan 21.9 %
    slower than the enumerated optimum, and now ends at that optimum within 1 % in 0.3-0.5 s."""
    if not opts.beyond_model or out.best is None or out.timed_out or out.best[0] <= 0:
        return
    target = lambda: out.best[0] * (1 - opts.rel_gap)  # noqa: E731 (the best may improve on the way)
    if out.bound() >= target():
        return
    left = []  # the bounds of the choices left open
    for combo, lb in sorted(_model_bounds(out.records).items(), key=lambda item: item[1]):
        if lb >= target():  # and so are the rest: the target only falls
            break
        if combo not in inputs_of or deadline.remaining() < 0.1:
            out.cut = out.cut or combo in inputs_of
            left.append(lb)
            continue
        report(len(out.records), f"P={combo.P} b={combo.b} D={combo.D} past the model", out.best[0],
               min([target(), lb] + left))
        try:
            left.append(_exhaust(out, combo, lb, with_sync_table(inputs_of[combo], tables), target, objective, milp,
                                 opts, deadline))
        except joint.DeadlineExceeded:
            out.cut = True
            left.append(lb)
    out.proven, out.past_open = min([target()] + left), sum(1 for b in left if b < target())


def _model_bounds(records: list[ComboRecord]) -> dict[Combo, float]:
    """Per outer choice the greatest lower bound its records prove on its plans' model figures: the
    bound it was pruned or closed with, and a MILP's dual bound or cutoff (at most the choice's
    figures; +inf for a choice with no plan), but not the bound of a MILP whose rows left out more
    than the plans the simulator refused (`refusals_open`: it does not hold for the rest)."""
    known: dict[Combo, float] = {}
    for r in records:
        b = r.lower_bound
        if r.status in ("no_pools", "infeasible_by_bound"):
            b = math.inf
        elif r.bound is not None and not r.status.startswith("error") and not r.refusals_open:
            b = max(b, r.bound)
        key = Combo(r.P, r.b, r.D)
        known[key] = max(known.get(key, -math.inf), b)
    return known


def _exhaust(out: _Outcome, combo: Combo, lb: float, inp: joint.JointInputs, target: Callable[[], float],
             objective: str, milp: "_MilpSettings", opts: PlannerOptions, deadline: joint.Deadline) -> float:
    """`_beyond_the_model` on one choice: the bound it leaves it with (at least the target when
    every plan below the target was simulated)."""
    rec = ComboRecord(combo.P, combo.b, combo.D, lb, "")  # the choice's own record keeps its fate
    left_out: list[joint.JointSolution] = []  # with their layer split
    by_pools: list[joint.JointSolution] = []  # whatever the split
    bound = lb
    until = time.perf_counter() + opts.combo_time_limit_s
    while True:
        limit_s = until - time.perf_counter()
        if limit_s < 0.05 or deadline.remaining() < 0.1:
            break
        t = target()
        got = _solve_choice(rec, inp, None, (t,), objective, milp, limit_s, deadline, lb, target=t,
                            exclude=tuple(left_out), milp_gap=FIRST_PLAN_GAP, exclude_pools=tuple(by_pools))
        sol = None if got is None or got.solution is None else got.solution[1]
        family, every = _family(sol, inp)
        whole = True  # every plan of the family simulated (a plan of thousands of replicas takes seconds)
        for member in family or ():
            if deadline.remaining() < 0.1:
                whole = False
                break
            out.best = joint.better(out.best, out.score((0.0, member, inp)))
        if got is None or got.bound >= t:  # no plan below the target but those left out (the cutoff is no row)
            bound = math.inf
            break
        bound = max(bound, got.bound)
        if family is None or not whole:
            break
        (by_pools if every else left_out).append(sol)
    if bound < math.inf and deadline.remaining() < 0.1:  # the time limit left it open: "time_limit"
        out.cut = True
    rec_of = [r for r in out.records if (r.P, r.b, r.D) == (combo.P, combo.b, combo.D)]
    if rec_of:  # its MILP time counts in the result's
        if not rec_of[-1].status.startswith("solved"):
            out.solved += 1
        rec_of[-1].build_s += rec.build_s
        rec_of[-1].solve_s += rec.solve_s
    return bound


def _family(sol: joint.JointSolution | None, inp: joint.JointInputs) -> tuple[list | None, bool]:
    """The plans an exclusion row of `sol` leaves out, to simulate, and whether the row is the one
    without layer terms: every split of units with every spread of the replicas over each stage's
    pools where that is at most MAX_FAMILY plans (one MILP then leaves out a pattern of pools per
    stage, not one split: measured, mixed seed 2019 of tests/test_cost_model_agreement.py, max
    throughput, 81 -> 50 MILPs and 7.6 -> 4.2 s; helper-12's seed 647 7.9 -> 5.9 s), else every spread
    on `sol`'s split; (None, False) where even that is more (or there is no solution)."""
    counts = None if sol is None else joint.excluded_counts(sol, MAX_FAMILY)
    if counts is None:
        return None, False
    splits = joint.every_split(inp.U, inp.P, MAX_FAMILY // len(counts))
    if splits is None:
        return [replace(sol, replicas=c) for c in counts], False
    return [replace(sol, ranges=r, replicas=c) for r in splits for c in counts], True


def _result(instance: Instance, objective: str, limits: tuple[float | None, float | None],
            opts: PlannerOptions, backend: str, total: int, out: _Outcome, deadline: joint.Deadline,
            report: _Reporter) -> PlannerResult:
    """The result of the search in `out` (`limits`: the budget and the throughput floor), with its
    plan's simulation; SolverError or InfeasibleError when it has no plan."""
    if out.best is None:
        if out.timed_out or any(r.status == "solved:time_limit_no_solution" for r in out.records):
            raise NoPlanInTimeError(f"the time limit ({opts.time_limit_s:g} s) ran out before any plan was found; "
                              f"raise --time-limit")
        raise InfeasibleError(_why_infeasible(out.records, *limits))
    obj, sol, inp = out.best
    # the plan is a point of the model, so a bound above its figure is the rounding of a sum (by an
    # ulp: a "-0.00 %" gap on one GPU)
    bound = min(out.bound(), obj)
    gap = (obj - bound) / max(abs(obj), 1e-12)
    status = "time_limit" if out.timed_out else "complete"
    plan_out = joint.to_plan(sol, inp, name=f"{instance.name}-hetplan").model_copy(
        update={"instance": instance.name,
                "metadata": {"objective": objective, "model_objective": obj, "bound": bound, "gap": gap,
                             "status": status, "P": inp.P, "D": inp.D, "b": inp.b}})
    # every kept plan was simulated when it was scored (and found in memory, not OOM, placeable)
    report_sim = out.score.report(sol, inp, plan_out)
    if out.score.est.iteration == "sailor":  # the replica order is part of a Sailor plan (`ring_ordered`)
        plan_out = report_sim.plan
    greedy, greedy_report = out.greedy_best, None
    if greedy is out.best:  # the heuristic's plan won: the same plan
        greedy_report = report_sim
    elif greedy is not None and not deadline.expired():
        greedy_report = out.score.report(greedy[1], greedy[2], joint.to_plan(greedy[1], greedy[2], name="greedy"))
    records = out.records
    result = PlannerResult(
        plan=plan_out, report=report_sim, objective_kind=objective, model_objective=obj, bound=bound, gap=gap,
        greedy_objective=greedy[0] if greedy else None, greedy_report=greedy_report, combos_total=total,
        combos_pruned=out.pruned, combos_solved=out.solved, build_s=sum(r.build_s for r in records),
        solve_s=sum(r.solve_s for r in records), wall_s=time.perf_counter() - report.t_start, backend=backend,
        records=records, status=status,
        model_estimate=joint.evaluate(inp, sol)["cost" if objective == "min_cost" else "T"],
        plan_source="heuristic" if greedy is out.best else "milp", open_past_model=out.past_open)
    report(len(records), "done", obj, bound, force=True)
    return result


# Native options of the choices' MILPs, per back-end. HiGHS restarts its root search when presolve at
# the root has fixed enough integer columns; on the planner's MILPs, which mostly prove that no plan
# beats the cutoff, the restart only did the root's cuts and heuristics again (measured, HiGHS 1.16,
# the choice alone at its search's cutoff: Sailor's GPT-Neo on 5 zones x 32 A100, P3 b2 D32, 0.93 ->
# 0.55 s, and its search 2.44 / 2.45 -> 2.04 / 1.98 s; OPT-350M on 32 A100 + 96 V100, P3 b4 D16
# without its budget, 2.24 -> 0.80 s; unchanged within noise: on 2 zones x (128 A100 + 128 V100)
# P6 b2 D32, 4.97 / 4.87 s against 5.02 / 4.95 s; the searches of autohet_3type, a100_v100_one_zone
# and of OPT-350M over 2 zones under a budget (two MILPs) to their gap, of zorse_4type_2region at 30
# and 60 s and of large_5type_2k at 60 s: the same plans and gaps).
CHOICE_MILP_OPTIONS: dict[str, dict] = {"highs": {"mip_allow_restart": False}}


@dataclass(frozen=True)
class _MilpSettings:
    backend: str
    linear: bool
    rel_gap: float


@dataclass
class _ChoiceResult:
    """One choice's MILP outcome: its proven bound, the plan found, and how to go on if it stopped
    at its time limit (`open`: worth solving again)."""
    bound: float
    record: ComboRecord
    inputs: joint.JointInputs
    start: tuple | None  # (objective, solution) to warm-start from
    solution: tuple | None  # (objective, solution, inputs) found, or None
    open: bool = True
    stale: bool = False  # stopped because the search's target fell below its cutoff (`_stale`)


# how many plans of one choice the simulator may refuse before the choice is left (`_past_refusals`)
MAX_REFUSED = 8


def _solve_choice(rec: ComboRecord, inp: joint.JointInputs, found: tuple | None, best: tuple | None,
                  objective: str, milp: _MilpSettings, limit_s: float, deadline: joint.Deadline,
                  lb: float | None = None, interrupt: Callable[[], bool] | None = None,
                  target: float | None = None, exclude: tuple[joint.JointSolution, ...] = (),
                  milp_gap: float | None = None, exclude_pools: tuple[joint.JointSolution, ...] = ()
                  ) -> _ChoiceResult | None:
    """Build and solve one choice's MILP with the search's `target` as cutoff (the incumbent `best`
    without one), warm-started from `found` (objective, solution) when it is within the cutoff;
    update `rec`. Returns the choice's proven bound, what it found (`solution`) and whether the MILP
    stopped at its limit (`open`); None when nothing in the choice beats the incumbent, and the
    choice closed at the target when nothing beats that (`_closed_at`). The solver gets `limit_s`,
    or what the build left of the search's `deadline` if that is less. The target (at most the
    incumbent) is all a choice must be proven against: a plan below the incumbent but not the target
    would leave the gap within rel_gap. Measured: Sailor's GPT-Neo on 5 zones x 32 A100, P5 b2 D16,
    HiGHS proves no plan below 12.992 s in 11.7 s, below the incumbent's 13.1213 s in 14.4 s.
    `milp_gap`: the MILP's own relative gap instead of `_milp_gap`'s; `exclude_pools` as in `joint.build`."""
    import pyomo.environ as pyo  # here, not at the top: a search that solves no MILP never loads Pyomo
    from hetplan.solvers import SolveOptions, solve

    lb = rec.lower_bound if lb is None else lb
    lead = best[0] if best else None
    cutoff = _cutoff(best, target)
    # under a budget that no plan within the cutoff reaches in the bounds' DPs, the model without the
    # budget row first (a relaxation, `joint.build(budget=False)`), solved again with the row only
    # where its plan breaks the budget (measured, HiGHS alone: Sailor's OPT-350M on 2 zones of 128
    # A100 + 128 V100 under 1.2 USD at the 1.3712 s cutoff, P6 b2 D32 undecided after 120 s with the
    # row, no plan proven in 16.9 s without it; P4 b4 D32 9.7 -> 5.4 s)
    relax = (objective == "max_throughput" and inp.max_cost_usd is not None
             and joint.binding_budget_usd(inp, cutoff) is None)
    # likewise the rows that tell a boundary between two nodes from one on a node (`build(nodes=False)`:
    # every boundary inside a zone at c_node), solved again with them only where the plan found is
    # rated above the relaxation's figure (measured, HiGHS alone: Sailor's profiles of OPT-350M on 2 zones
    # of 128 A100 + 128 V100 under its budget, hetplan's composition, P6 b1 D64 proven infeasible at the
    # cutoff in 2.27 s with the rows, 1.28 s without)
    passes = [(not relax, inp.inter is None)] if relax or inp.inter is not None else []
    passes.append((True, True))
    spent_s = 0.0  # by the relaxation
    t0 = time.perf_counter()
    ceiling = _extra_ceiling(inp, cutoff, objective)
    rec.build_s += time.perf_counter() - t0
    for budget, nodes in passes:
        t0 = time.perf_counter()
        try:
            model = joint.build(inp, linearize=milp.linear, time_cutoff_s=cutoff if objective != "min_cost" else None,
                                cost_cutoff_usd=cutoff if objective == "min_cost" else None, budget=budget,
                                extra_ceiling_s=ceiling, nodes=nodes, exclude=exclude, exclude_pools=exclude_pools)
        except joint.NoStageChoice:  # some stage position fits no pool (within the cutoff): nothing to solve
            rec.status, rec.bound = "infeasible", cutoff
            return _closed_at(cutoff, lead, rec, inp, found)
        if cutoff is not None and objective == "min_cost":
            model.cutoff = pyo.Constraint(expr=joint.COST_SCALE * model.cost <= joint.COST_SCALE * cutoff)
        start = None
        if found is not None and found[0] <= (cutoff if cutoff is not None else found[0]):
            start = joint.warm_start(model, inp, found[1])
        rec.build_s += time.perf_counter() - t0
        left = deadline.remaining()
        if left < 0.05:  # the build took the time left
            rec.status = "skipped_time"
            return _ChoiceResult(lb, rec, inp, found, None, open=False)
        res = solve(model, backend=milp.backend, warm_start=start,
                    options=SolveOptions(time_limit_s=max(min(limit_s - spent_s, left), 0.1),
                                         rel_gap=_milp_gap(milp, lead, target) if milp_gap is None else milp_gap,
                                         diagnose_infeasible=False,
                                         interrupt=interrupt,  # a cutoff makes infeasible normal
                                         solver_options=dict(CHOICE_MILP_OPTIONS.get(milp.backend, {}))))
        rec.solve_s, spent_s = rec.solve_s + res.solve_s, spent_s + res.solve_s
        if (budget and nodes) or not res.status.has_solution or _as_good_unrelaxed(inp, model, res, objective, nodes):
            break
    rec.status = f"solved:{res.status.value}"
    if res.status.has_solution:
        sol = joint.decode(model, inp)
        ev = joint.evaluate(inp, sol)
        obj = ev["cost"] if objective == "min_cost" else ev["T"]
        rec.objective = obj if rec.objective is None else min(rec.objective, obj)
        rec.bound = None if res.bound is None else joint.objective_value(inp, res.bound)
        optimal = res.status.value == "optimal"  # within the MILP's own gap: its bound still counts
        if res.bound is None:  # (a first plan under the cutoff proves nothing of the others)
            bound = obj if optimal and milp_gap is None else lb
        else:
            bound = max(joint.objective_value(inp, res.bound), lb)
        return _ChoiceResult(min(bound, obj), rec, inp, (obj, sol), (obj, sol, inp), open=not optimal)
    if res.status.value == "infeasible":
        rec.bound = cutoff  # nothing better than the cutoff in this choice (or nothing at all)
        return _closed_at(cutoff, lead, rec, inp, found)
    if res.status.value == "time_limit_no_solution":
        return _ChoiceResult(_unsolved_bound(inp, lb, res.bound, cutoff), rec, inp, found, None)
    # a back-end error on one choice: not solved again, and its lower bound stays in the bound
    rec.status = f"error:{res.message[:80]}"
    return _ChoiceResult(lb, rec, inp, found, None, open=False)


def _as_good_unrelaxed(inp: joint.JointInputs, model, res, objective: str, nodes: bool) -> bool:
    """Whether the plan a relaxed MILP found (`build(budget=False)`, `build(nodes=False)`) is what
    the whole model makes of it: within the budget, and without the boundary rows rated by
    `evaluate` at the MILP's own objective. Then the relaxation's answer (plan and bound) is the
    whole model's."""
    ev = joint.evaluate(inp, joint.decode(model, inp))
    if inp.max_cost_usd is not None and ev["cost"] > inp.max_cost_usd:
        return False
    got = ev["cost" if objective == "min_cost" else "T"]
    return nodes or got <= joint.objective_value(inp, res.objective) * (1 + 1e-6)


def _extra_ceiling(inp: joint.JointInputs, cutoff: float | None, objective: str) -> float | None:
    """The MILP's ceiling on sigma + mu at a max-throughput cutoff (`joint.extra_ceiling_s`; None: no
    row): the plans above it are ruled out by the bounds, whose DP tests the choice's own bounds have
    mostly cached. Not under a budget that binds at the cutoff, where the bounds take the budget's
    bisections by ranges (up to 127 DP tests a cell). Measured side by side (`plan(..., time_limit_s=30)`,
    one process per run, interleaved old / new / new / old, benchmarks/sailor_real.py's instances):
    Sailor's GPT-Neo on 5 zones x 32 A100 from the limit at a 2.2 % gap (30.06 / 30.06 s) to complete
    in 28.95 / 28.07 s; OPT-350M on 2 zones of 128 A100 + 128 V100 11.11 / 10.92 -> 8.87 / 9.36 s,
    and under 1.2 USD 11.57 / 11.45 -> 9.22 / 9.06 s; on 2 regions of 64 A100 4.13 / 4.00 -> 4.40 /
    4.39 s (four MILPs of 0.5-1.5 s: two ceilings of ~0.4 s where the bounds' tables were cold)."""
    if objective == "min_cost" or cutoff is None or joint.binding_budget_usd(inp, cutoff) is not None:
        return None
    try:
        return joint.extra_ceiling_s(inp, cutoff)
    except joint.DeadlineExceeded:  # the search's deadline: what is left of it goes to the MILP as it is
        return None


def _closed_at(cutoff: float | None, lead: float | None, rec: ComboRecord, inp: joint.JointInputs,
               found: tuple | None) -> "_ChoiceResult | None":
    """A choice with no plan below the cutoff: None where the cutoff is the lead's objective (no plan
    of the choice beats the incumbent), else the choice closed with the cutoff, the search's target,
    as its bound: plans between the target and the lead are within the gap, so the MILP is not
    asked for them, but the reported bound must not pass the target on their account."""
    if cutoff is None or lead is None or cutoff >= lead:
        return None
    return _ChoiceResult(cutoff, rec, inp, found, None, open=False)


def _milp_gap(milp: _MilpSettings, incumbent: float | None, target: float | None) -> float:
    """The MILP's own relative gap: stopped at a plan p with dual bound d >= p (1 - g), the choice
    is closed when d reaches the search's `target`; with the plan at the incumbent's objective,
    g = 1 - target / incumbent does exactly that. Kept within [rel_gap / 10, rel_gap]: the search's
    gap at most, and not an exact proof where the simulator rates plans above the model (target =
    incumbent)."""
    if incumbent is None or target is None or incumbent <= 0:
        return milp.rel_gap / 2
    return min(milp.rel_gap, max(milp.rel_gap / 10, 1 - target / incumbent))


def _unsolved_bound(inp: joint.JointInputs, lb: float, dual: float | None, cutoff: float | None) -> float:
    """A choice whose MILP stopped at its limit with no plan: every plan of it within the cutoff has
    an objective at least the MILP's dual bound, and every other one more than the cutoff, so the
    choice's bound is max(lb, min(dual, cutoff)) (measured: large_5type_2k, P4 b2 D128: the bound
    0.8815 s, the MILP's dual bound 1.11 s after 240 s)."""
    if dual is None:
        return lb
    within = joint.objective_value(inp, dual)
    return max(lb, within if cutoff is None else min(within, cutoff))


def _dive(queue: list, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
          greedies: dict, count: int, out: "_Outcome", limit_s: float, rel_gap: float = 0.0) -> bool:
    """Before the first MILP (`_Search.dive_first`) and after one stopped at its limit with no plan:
    the heuristics (greedy and stage DP, 0.1-0.5 s each) on the `count` queued choices of least
    bound, those whose strong bound is in first, that have not had the DP yet and whose bound is
    below the search's target (`_Outcome.target` with `rel_gap`), then, when they gave a new
    incumbent, on the neighbours the local search from it reaches (`_climb`, DIVE_CLIMB_RUNS runs),
    all within `limit_s`. The search is best first, so under a limit it may spend all its time in
    MILPs of choices whose bounds are low while a later choice holds a better plan (measured:
    OPT-350M on 5 zones x 80 A100, the P13-P16 D16 MILPs stopped at 5 s each with bounds of
    1.50-1.68 s and no plan, and the 60 s ran out before P5 b1 D64, whose heuristic plan simulates
    at 1.756 s against the 1.779 s returned). True when it gave a new incumbent."""
    lead = out.lead
    with joint.deadline_scope(joint.Deadline.after(limit_s)):
        try:
            # the choices the strong bound has kept first: a medium bound below the incumbent mostly
            # rises above it at the next step
            for item in sorted(queue, key=lambda item: (item[4] < 2, *item[:5])):
                if count <= 0:
                    break
                combo, target = item[5], None if out.lead is None else out.target(rel_gap)
                if greedies.get(combo, (None, False))[1] or (target is not None and item[0] >= target):
                    continue  # (before its all-reduce tables: the dive may pass over the whole queue)
                inp = with_sync_table(item[6], tables)
                if target is not None and _closed_by_bounds(combo, inp, item[0], item[4], target, tables, objective,
                                                            max_cost, min_its):
                    continue
                _heuristics_on(combo, inp, greedies, out, objective, max_cost, min_its)
                count -= 1
            if out.lead is not lead:  # a new incumbent: its neighbours next, in what is left of the limit
                out.found(_climb(queue, tables, objective, max_cost, min_its, greedies, out.lead, DIVE_CLIMB_RUNS,
                                 0.0, lambda what, best: None), heuristic=True)
        except joint.DeadlineExceeded:  # the dive's limit or the search's: the search's loop sees the latter
            pass
    return out.lead is not lead


def _closed_by_bounds(combo: Combo, inp: joint.JointInputs, lb: float, level: int, target: float, tables: _Tables,
                      objective: str, max_cost: float | None, min_its: float | None) -> bool:
    """Whether a queued choice (bound `lb` at refinement `level`) has no plan below `target`, by its
    refinement steps up to the strong bound (`_refine`, levels 0 and 1: the steps the search takes
    next on it anyway, milliseconds to tenths of a second each). `_dive` runs no heuristics on a
    choice so closed (measured, `plan(..., time_limit_s=30)` before this filter: the first dive on
    Sailor's OPT-350M, 32 A100 + 96 V100 under a budget, ran them on 8 choices in 0.71 s, and on
    AutoHet's three types on 8 in 1.21 s, finding no plan; with it, on none, in 0.01 and 0.20 s)."""
    for step in range(level, 2):
        if lb >= target:
            break
        lb = _refine(inp, tables, _Step(combo, step, lb, target if step else None, False), objective, max_cost,
                     min_its)[0]
    return lb >= target


def _heuristics_on(combo: Combo, inp: joint.JointInputs, greedies: dict, out: "_Outcome", objective: str,
                   max_cost: float | None, min_its: float | None) -> tuple | None:
    """`_best_heuristic` on one choice, recorded in `greedies` (with the stage DP) and its plan
    offered to the search (`out.found`); the plan (objective, solution) or None."""
    found = _best_heuristic(inp, objective, max_cost, min_its)
    greedies[combo] = (found, True)
    if found is not None:
        out.found((*found, inp), heuristic=True)
    return found


def _file(item: _ChoiceResult, unfinished: list, bounds: list) -> None:
    """A choice stopped at its limit is solved again if time is left; any other keeps its bound
    for the reported bound."""
    if item.open:
        unfinished.append(item)
    else:
        bounds.append(item.bound)


def _first_incumbent(queue: list, tables: _Tables, objective: str, max_cost: float | None,
                     min_its: float | None, greedies: dict, heuristic_choices: int, heuristic_degrees: int,
                     rel_gap: float, tick: Callable[[str, tuple | None], None] | None = None,
                     climb_runs: int = 0) -> tuple | None:
    """The best heuristic plan over the most promising queued choices, (objective, solution,
    inputs), or None. A target from the start lets every strong bound stop early (measured on
    GPT-Neo, 3 x 256 GPUs: without one, the first 40 s of search went to bounds). The
    `heuristic_choices` choices with the least `_promise` get the greedy and the stage DP
    (`joint/stage_dp.py`, 10-100 ms each); past them, only the greedy (about a millisecond) runs,
    and only until some plan is found. For maximum throughput every single-stage choice gets both
    (a single stage's DP takes milliseconds): the best plan may lie far down the order and need the
    DP (Sailor's A100 x 128 under 0.3 USD: P1 b8 D16 ranks 165th of 316 choices; the greedy misses
    it), and a search that finds it late spends its time on MILPs it would have cut off (Sailor's
    OPT-350M on 5 zones x 32 A100 with the send-aware bound: plan 2.608 s and gap 22.5 % at the 30 s
    limit when only the first choices got the DP; with every single stage, P1 b8 D32 at 2.408 s
    and the search done in 21.6 s). At the search's deadline it
    returns the best plan found so far (the search then stops). `tick(what, best)` after each
    choice: progress. The choices are ranked by `_promise`, an estimate, not by their bounds.
    Last, `climb_runs` runs of the local search from the best plan's choice (`_climb`)."""
    best = None
    tick = tick or (lambda what, best: None)
    every = objective != "min_cost"
    try:
        order = sorted(range(len(queue)), key=lambda idx: (_promise(queue[idx][6], objective), queue[idx][:4]))
        for rank, idx in enumerate(order):
            single = every and queue[idx][5].P == 1
            if rank >= heuristic_choices and best is not None and not single:
                if every:
                    continue
                break
            joint.check_deadline()  # the preparation may have used the time up
            item = queue[idx]
            combo, inp = item[5], with_sync_table(item[6], tables)
            queue[idx] = item[:6] + (inp,)  # the refinement and the solve reuse these inputs and their caches
            # under a budget a single stage (no bubble) is often the fastest plan within it, and its
            # stage DP is quick (~2 ms)
            dp = rank < heuristic_choices or single
            found = _best_heuristic(inp, objective, max_cost, min_its, dp=dp)
            greedies[combo] = (found, dp)
            if found is not None:
                best = joint.better(best, (*found, inp))
            tick(f"heuristics P={combo.P} b={combo.b} D={combo.D}", best)
        # the cheap bound ranks poorly across data-parallel degrees (it ignores memory and quotas per
        # stage), so the most promising choice of `heuristic_degrees` other D values gets the stage DP
        # too, by the least medium bound first and only while that bound is below the incumbent
        # (measured: GPT-Neo on 80 A100 + 240 V100, the 16 first choices all had D >= 32 and no plan or
        # one 10 % off, the optimum has D = 16; small D with 16 stages make the costliest DPs, 0.6 s
        # on 2 x 256 GPUs, and rarely win)
        seen, others = {queue[idx][5].D for idx in order[:heuristic_choices]}, []
        for idx in order:
            if queue[idx][5].D not in seen:
                seen.add(queue[idx][5].D)
                inp = with_sync_table(queue[idx][6], tables)
                queue[idx] = queue[idx][:6] + (inp,)
                others.append((_tight_bound(inp, objective, min_its, exact=False), idx))
        for lb, idx in sorted(others)[:heuristic_degrees]:
            if lb == float("inf") or (best is not None and lb >= best[0] * (1 - rel_gap)):
                break
            combo, inp = queue[idx][5], queue[idx][6]
            found = _best_heuristic(inp, objective, max_cost, min_its)
            greedies[combo] = (found, True)
            if found is not None:
                best = joint.better(best, (*found, inp))
            tick(f"heuristics P={combo.P} b={combo.b} D={combo.D}", best)
        best = _climb(queue, tables, objective, max_cost, min_its, greedies, best, climb_runs, rel_gap, tick)
    except joint.DeadlineExceeded:
        pass
    return best


def _climb(queue: list, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
           greedies: dict, best: tuple | None, runs: int, rel_gap: float,
           tick: Callable[[str, tuple | None], None]) -> tuple | None:
    """Local search over the outer choices from the incumbent's: the heuristics (with the stage DP)
    on its neighbours (`_neighbours`) whose cheap bound may beat it, moving to the first that does
    better, at most `runs` heuristic runs. Good plans lie next to each other (measured on
    zorse_4type_2region: P6 D8 gave 22.34 s at b8, 19.81 s at b4, 18.69 s at b2), while the bounds
    that order the search rank them far apart. When no neighbour of the incumbent's choice does
    better, the search goes on from the best other plan the heuristics found within CLIMB_SLACK of
    the incumbent: the way to a better plan may pass through a slightly worse one."""
    index = {item[5]: idx for idx, item in enumerate(queue)}
    expanded: set[Combo] = set()
    while best is not None and runs > 0:
        here = _next_to_expand(best, greedies, expanded)
        if here is None:
            break
        moved = False
        for near in _neighbours(here):
            idx = index.get(near)
            if idx is None or greedies.get(near, (None, False))[1] or queue[idx][0] >= best[0] * (1 - rel_gap):
                continue
            joint.check_deadline()
            inp = with_sync_table(queue[idx][6], tables)
            queue[idx] = queue[idx][:6] + (inp,)
            found = _best_heuristic(inp, objective, max_cost, min_its)
            greedies[near], runs = (found, True), runs - 1
            tick(f"heuristics P={near.P} b={near.b} D={near.D}", best)
            if found is not None and found[0] < best[0]:
                best, moved = (*found, inp), True
                break
            if runs <= 0:
                break
        if not moved:  # every neighbour tried (or the runs spent): not again
            expanded.add(here)
    return best


CLIMB_SLACK = 0.02  # `_climb` also goes on from plans this much worse than the incumbent


def _next_to_expand(best: tuple, greedies: dict, expanded: set) -> Combo | None:
    """The choice `_climb` tries the neighbours of next: the incumbent's, then that of the best
    heuristic plan within CLIMB_SLACK of it (measured: Sailor's OPT-350M on 32 A100 + 96 V100 under
    0.5 USD, before `polish` moved blocks: the first plan P4 b1 D16 at 5.852 s had no better
    neighbour; P3 b2 D16 at 5.898 s led to P2 b4 D16 at 5.489 s, which the search had found only
    after 14 s, in a dive. With it, P3 b4 D8 at 5.698 s has none, and P3 b4 D16 at 5.736 s leads
    there: tests/test_sailor_planning.py)."""
    own = Combo(best[2].P, best[2].b, best[2].D)
    if own not in expanded:
        return own
    near = [(found[0], (c.P, c.b, c.D), c) for c, (found, _) in greedies.items()
            if found is not None and c not in expanded and found[0] <= best[0] * (1 + CLIMB_SLACK)]
    return min(near)[2] if near else None


def _neighbours(c: Combo) -> list[Combo]:
    """The choices `_climb` tries next to `c`: P +- 1, b x 2 and / 2, D x 2 and / 2, then one more
    stage with half the microbatch and one fewer with twice it. A memory-bound model trades stages
    against microbatch size, so its next better choice may change both (measured: Sailor's
    GPT-Neo-2.7B on 32 A100 + 96 V100, the first plan at P3 b2 D16, 31.559 s; no neighbour along
    one axis beats it, P4 b1 D16 gives 30.913 s, and the search, which returned P5 b1 D16's
    31.075 s in 2.5-2.9 s, returns it in 2.0-2.5 s)."""
    return [Combo(c.P, c.b // 2, c.D), Combo(c.P, c.b * 2, c.D), Combo(c.P - 1, c.b, c.D), Combo(c.P + 1, c.b, c.D),
            Combo(c.P, c.b, c.D * 2), Combo(c.P, c.b, c.D // 2), Combo(c.P + 1, c.b // 2, c.D),
            Combo(c.P - 1, c.b * 2, c.D)]


def _promise(inp: joint.JointInputs, objective: str) -> float:
    """The order in which the first heuristics try the choices (`joint.promise_s`; for cost times
    the least rate)."""
    time_s = joint.promise_s(inp)
    return time_s * joint.rate_lower_bound_usd_per_s(inp) if objective == "min_cost" else time_s


def _settle_rest(records: list[ComboRecord], lb: float, combo: Combo, queue: list, status: str) -> int:
    """Record the popped choice and every choice still queued with `status`; how many that is."""
    for bound, choice in [(lb, combo)] + [(item[0], item[5]) for item in queue]:
        records.append(ComboRecord(choice.P, choice.b, choice.D, bound, status))
    return 1 + len(queue)


def _why_infeasible(records: list[ComboRecord], max_cost: float | None, min_its: float | None) -> str:
    kinds = {r.status for r in records}
    if kinds <= {"no_pools"}:
        return ("no plan fits in memory: no GPU type can hold even one layer unit with any TP degree "
                "and microbatch size tried (memory constraint group)")
    parts = []
    if min_its is not None:
        parts.append(f"min_throughput_iters_per_s={min_its}")
    if max_cost is not None:
        parts.append(f"max_cost_per_iteration_usd={max_cost}")
    limits = " and ".join(parts) if parts else "the memory and quota constraints"
    rejected = [r for r in records if r.objective is not None]
    open_ = [r for r in rejected if r.refusals_open]
    if open_:  # the simulator refused plans the model had, which proves nothing about the rest
        r = min(open_, key=lambda r: r.objective)
        return (f"no plan found within {limits}, but none is proven impossible: the MILP's plans of "
                f"{len(open_)} outer choices (best P{r.P} b{r.b} D{r.D}, model figure {r.objective:.6g}) break "
                f"the limits when the simulator places them on nodes, and the rest of those choices was not "
                f"searched (the model relaxes placement: formulations/joint/milp.py); loosen the limits")
    # the modelled space (the package docstring, "Reported bound"): a plan outside it, e.g. uneven
    # microbatch shares, may meet a limit none inside it does
    proof = f"no plan of the planner's space satisfies {limits} over {len(records)} outer choices (P, b, D)"
    if rejected:  # each refused plan was left out alone and nothing else was left in its choice
        proof += (f"; the MILP's plans of {len(rejected)} of them break the limits once the simulator places "
                  f"them on nodes, and without those plans their choices hold none")
    return proof
