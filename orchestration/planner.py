"""The joint planner (`hetplan solve`): resource allocation + parallelization with a proven bound.

Decomposition. The outer loop enumerates (P pipeline stages, b microbatch size, D replicas per
stage) with B % (D b) == 0; TP per stage and GPU type, replica counts per (stage, GPU type, zone)
and layer ranges are decided inside one MILP per outer choice (`formulations/joint/`).

Search: best first with lazy bounds. Every outer choice enters a priority queue with a cheap valid
lower bound (`joint.time_lower_bound_s`; for cost, times the cheapest possible cost rate). Before
the search, the heuristics (the greedy and the stage DP of `formulations/joint/stage_dp.py`)
run on the choices with the least cheap bound, and on the most promising choice (least medium
bound) of `heuristic_degrees` other data-parallel degrees; the best plan becomes the incumbent
(`_first_incumbent`): the strong bounds then only have to rule out a target. The choice at the
head is refined twice, going back in the queue each time: first with the medium bound
(`joint.time_lower_bound_tight_s(exact=False)`: Hall counts, quota-aware all-reduce + update, a
few milliseconds), then with the strong bound; the first `heuristic_choices` choices the strong
bound keeps also get the stage-DP heuristic. The strong bound (`exact=True`: a dynamic program
over stages on GPUs per type, `joint.stages_fit_dp`, for the slowest stage alone and with a cap
on all-reduce + update, `joint.sync_aware_time_bound_s`; quota-aware bounds on the sum of stage
times, `joint.sum_tau_lower_bound_s`, and on all-reduce + update, `joint.extra_lower_bound_s`;
for cost also `joint.cost_lower_bound_dp_usd`). Each (slowest stage, all-reduce + update) cell of the
sync-aware bound is lifted by the least sum of stage times under its caps (`joint.capped_sum_tau_s`:
a DP over blocks and GPUs in units of D). Once an incumbent exists, a choice that comes out at the
head with its strong bound gets the strongest one (the same, plus replica-level DPs that count one
GPU type exactly and price the others), and only a choice still at the head after that is solved:
heuristic warm start, then the MILP with the incumbent as a cutoff (which also drops stage choices
too slow to beat it). The search stops when the head's bound
cannot beat the incumbent by more than the requested gap: every choice left is pruned at once.
Time left then goes to the choices whose MILP stopped at its own limit (`combo_time_limit_s`),
least bound first, in equal shares. With several regions the strong time bound also splits the
plans by the regions they use (`joint.region_split_time_bound_s`).
One cost model: the MILPs, bounds and heuristics read a relaxation of the simulator (its figures
are at most the simulator's on every plan of the space: formulations/joint/milp.py), whose all-reduce
and boundary figures are the communication estimator's floors over the placements first fit may
make (`with_sync_table`, `tied_floors_s`, `_Tables.effective_link`). Every plan the search keeps
is scored by `simulate` (`_Scorer`): the limits, the plan returned, its objective and gap are the
simulator's, and a bound on the relaxation is one on the simulator. The search itself compares
model figures with model figures: its incumbent and the MILP cutoffs are the model objective of the
plan the model rates best (`_Outcome.lead`). Cutting with the simulated objective instead (a few
tenths of a percent to ~2 % above the model's) closed fewer choices by their bounds and made the
MILPs slower: 2-5x longer searches on opt350-geo-5zones-32/-80, neo27-types-3 and
opt350-het-80+240 (benchmarks/planner.py).

With `estimators: {preset: sailor}` the model is Sailor's composition (formulations/joint/milp.py,
"Sailor's composition"), every plan is scored by `simulate_sailor`, and a stage spread over zones
or GPU types gets the replica order whose slowest neighbour pair is fastest
(`simulator_sailor.ring_ordered`; Sailor's all-reduce reads the pairs in replica order), kept when
the simulation says it is better; the plan returned carries that order.

Two cores: with `workers=2` (the default) a forked helper process takes refinement steps ahead
of the search: the medium bounds of the queued choices while the main process runs the first
incumbent's heuristics, then the later steps of the choices under the target, in queue order. A
step's result depends only on the step (`_Step`) and is used only when the search reaches it, so
the search makes exactly the decisions it makes in one process (`_Refiner`, `_Helper`, `_refine`).

Time limit: `time_limit_s` bounds the whole call (measured within 10 % + 1 s where the final
plan's simulation is short). One `joint.Deadline` is checked by the preparation of the choices'
inputs (at most PREPARE_SHARE of the limit, the most promising choices first by `_Floor`, a bound
from the layer times alone), by every heuristic and bound in its long loops (`joint.deadline_scope`:
a computation the deadline stops is dropped, so every bound kept is valid; the stage DP keeps the
best plan it had), by the helper's steps and the waits for them, and by the MILPs' limits. The
search then returns the best plan found with status "time_limit" and the bound proven so far; with
no plan yet, the greedy looks for one on the queued choices for RESCUE_S (or a quarter of the
limit) before SolverError says the time ran out. A budget or throughput floor beyond every plan
fails at once (`_Floor`, `_check_reachable`). `progress` receives a `SearchProgress` (choices
settled, incumbent, bound, gap) at most every PROGRESS_EVERY_S seconds.

Signals: SIGINT raises KeyboardInterrupt in the main process (a wait for the helper or a HiGHS
solve included: `solvers.highs_backend` runs HiGHS in a thread); a SIGTERM left at its default
action raises `SearchTerminated` (a KeyboardInterrupt) during the search. Either way the helper is
stopped before the exception leaves `plan()`; the helper itself ignores SIGINT (Ctrl-C reaches the
whole process group), dies at SIGTERM without a traceback and dies with the main process.

Reported bound: min over (the incumbent, the dual bounds of choices stopped by a limit or solved
within the MILP's own gap, the lower bounds of choices never solved or pruned within the gap).
This is a proven bound over the modelled space: every plan with uniform microbatch shares, the
same D on every stage, per-stage DP traffic inside one region and, where the blocks are identical
(the compact form of `formulations/joint/milp.py`), at least one block on the first stage.
"""
from __future__ import annotations

import gc
import heapq
import math
import multiprocessing
import os
import queue
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import pyomo.environ as pyo

from hetplan.errors import EstimatorError, InfeasibleError, InstanceError, NoPlanInTimeError, PlanError
from hetplan.estimators import EstimatorSet, build_estimators
from hetplan.estimators.base import spans_pair
from hetplan.estimators.memo import memoised
from hetplan.estimators.model_stats import boundary_activation_bytes, gradient_bytes, sync_volume_factor
from hetplan.formulations import joint
from hetplan.instance import Instance, relaxed_limits
from hetplan.plan import Plan, tp_indivisible
from hetplan.formulations.stage_cost import StageCosts, node_endpoint
from hetplan.simulator import SimulationReport, simulate
from hetplan.simulator.sailor import ring_ordered

TP_CHOICES = (1, 2, 4, 8)
HELPER_WAIT_S = 60.0  # the longest a refinement step may take in the helper before the main process takes over


@dataclass(frozen=True)
class PlannerOptions:
    backend: str | None = None  # None: HiGHS for the linear model, SCIP when `linearize` is False
    objective: str | None = None  # override the instance's objective kind
    max_cost_usd: float | None = None  # override / add constraints
    min_iters_per_s: float | None = None
    time_limit_s: float = 60.0  # whole search
    combo_time_limit_s: float = 5.0  # one outer choice's MILP; its bound enters the reported bound
    rel_gap: float = 0.01  # on the model's objective (see PlannerResult.status)
    max_stages: int = 16
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    tp_choices: tuple[int, ...] = TP_CHOICES
    linearize: bool = True  # False keeps rate x T bilinear (SCIP solves it as an MINLP)
    available: dict[tuple[str, str], int] | None = None  # (gpu type, zone) -> GPUs available now
    heuristic_choices: int = 8  # choices (least cheap bound first) the stage DP heuristic runs on first
    heuristic_degrees: int = 3  # then, of the other data-parallel degrees, this many (least medium bound first)
    workers: int = 2  # processes refining bounds (2: a forked helper works ahead of the search; 1: none)


@dataclass(frozen=True)
class Combo:
    P: int
    b: int
    D: int


@dataclass
class ComboRecord:
    P: int
    b: int
    D: int
    lower_bound: float
    status: str  # pruned_bound | no_pools | greedy_only | solved:<status> | infeasible | skipped_time
    objective: float | None = None
    bound: float | None = None
    build_s: float = 0.0
    solve_s: float = 0.0


@dataclass
class PlannerResult:
    plan: Plan
    report: SimulationReport  # the simulator's figures for the plan
    objective_kind: str
    # the plan's iteration time (s) or cost (USD) as the simulator scores it: what `bound` bounds
    # and `gap` measures (the name is historical: the search keeps plans by this figure)
    model_objective: float
    bound: float  # proven lower bound on the simulated objective of every plan in the modelled space
    gap: float
    greedy_objective: float | None  # the best heuristic plan (greedy or stage DP) found in the search
    greedy_report: SimulationReport | None
    combos_total: int
    combos_pruned: int
    combos_solved: int
    build_s: float
    solve_s: float
    wall_s: float
    backend: str
    records: list[ComboRecord] = field(default_factory=list)
    # "complete": every outer choice was settled (solved, pruned or ruled out): the model's gap
    # is within rel_gap unless a MILP failed, and `gap`, against the simulated objective, adds
    # how far the simulator rates the plan above the model; "time_limit": the limit stopped the
    # search first, the plan is the best found by then and `bound` / `gap` what had been proven
    status: str = "complete"
    # the planner's model's own figure for the returned plan (`joint.evaluate`): at most
    # model_objective, below it where the model relaxes the simulator
    model_estimate: float | None = None
    plan_source: str = "milp"  # "heuristic": a heuristic found the returned plan (no MILP beat it)

    def summary(self) -> dict:
        return {"objective": self.objective_kind, "status": self.status, "model_objective": self.model_objective,
                "model_estimate": self.model_estimate, "plan_source": self.plan_source,
                "bound": self.bound, "gap": self.gap, "greedy_objective": self.greedy_objective,
                "combos_total": self.combos_total, "combos_pruned": self.combos_pruned, "combos_solved": self.combos_solved,
                "build_s": self.build_s, "solve_s": self.solve_s, "wall_s": self.wall_s, "backend": self.backend,
                "simulated": {k: v for k, v in self.report.summary().items() if k not in ("ranks",)}}


# ---- inputs per outer choice ------------------------------------------------------------------------
class _Tables:
    """Estimator figures per (gpu type, tp, b) and per layer unit, computed once and reused."""

    def __init__(self, instance: Instance, est: EstimatorSet):
        self.inst, self.est = instance, est
        self.costs = StageCosts(instance, est)  # the simulator's stage evaluation: the rows below read it
        # Sailor's composition (simulator/sailor.py) reads llm_info's sizes, not the architecture's
        self.sailor = est.iteration == "sailor"
        self.info = est.memory.info if self.sailor else None
        self.arch = instance.model_arch
        self.U = self.arch.num_units
        self._step: dict = {}
        self._upd: dict = {}
        self._mem: dict = {}
        self._sync: dict = {}  # floor_s: (nodes, members, spans, min_nodes) -> bytes -> seconds
        self._node_sets: dict = {}
        self._node_sizes: dict = {}  # (zone, gpu type) -> GPUs per node, largest first
        self._least_nodes: dict = {}  # `_least_nodes` answers
        self._tied: dict = {}  # tied_floors_s: (pools, D, bytes) -> floors
        self._links: dict = {}
        self._sends: dict = {}  # send_floor_s: (gpu type, zone, tp, b) -> seconds
        self._groups: dict | None = None  # _node_groups
        self.sync_tables: dict = {}  # with_sync_table: (D, pools, P) -> table
        self._rows: dict = {}  # pool_rows: (b, D, TP choices, quotas) -> rows shared by every P
        self._grad: tuple[float, ...] | None = None
        self._stage_grad: dict = {}  # stage_grad_bytes: P -> bytes per (position, blocks)

    @property
    def grad_bytes(self) -> tuple[float, ...]:
        """Gradient bytes of every layer unit (all TP shards)."""
        if self._grad is None:
            if self.sailor:  # Sailor all-reduces and prices the full parameter bytes
                self._grad = tuple(self.info.param_bytes(range(l, l + 1)) for l in range(self.U))
            else:
                prec = self.inst.workload.precision
                self._grad = tuple(gradient_bytes(self.arch, range(l, l + 1), prec) for l in range(self.U))
        return self._grad

    @property
    def sync_factor(self) -> float:
        """All-reduce bytes per gradient byte (ZeRO-3: 1.5); Sailor's composition counts 1."""
        return 1.0 if self.sailor else sync_volume_factor(self.inst.workload.zero_stage)

    @property
    def tied_bytes(self) -> float:
        """Bytes of the tied embedding's all-reduce; Sailor's composition has none."""
        return 0.0 if self.sailor else self.costs.tied_bytes

    def boundary_bytes(self, b: int) -> float:
        """The activation bytes of one microbatch over a boundary; for Sailor's composition the least a
        stage can send (llm_info's unit outputs; a stage ends on a block or the embedding)."""
        if self.sailor:
            return min(self.info.output_bytes(u, b) for u in range(self.U - 1))
        return boundary_activation_bytes(self.arch, b, self.inst.workload.precision)

    def pool_rows(self, quotas: dict, tp_choices: tuple[int, ...], b: int, D: int) -> tuple | None:
        """(pools, step, upd, stat, act, cap, fixed update, send floor, send floors away, shared cache) of
        the outer choices with microbatch b and D replicas per stage (P changes none of them: the
        choices of every depth share these tuples); None when no pool can hold even one unit. A pool
        that cannot hold its lightest unit on the last stage (1 microbatch in flight) is useless and
        left out."""
        ordered = tuple(sorted(quotas.items()))
        key = (b, D, tuple(tp_choices), ordered)
        if key not in self._rows:
            rows: tuple[list, ...] = ([], [], [], [], [], [], [], [], [])
            for (g, z), (avail, per_node, price, region) in ordered:
                for t in tp_choices:
                    if not self.usable(g, t, b, per_node, avail):
                        continue
                    s_b, a_b, c_b = self.mem(g, t, b, D)
                    if min(s + a for s, a in zip(s_b, a_b)) > c_b:
                        continue
                    upd, fixed, send, away = self.upd(g, t, D), 0.0, 0.0, (0.0, 0.0)
                    if self.sailor:  # the profile's whole-model step, taken by every stage as is
                        upd, fixed = (0.0,) * self.U, self.est.time.update_at_s(g, b, t)
                        send = self.send_floor_s(g, z, t, b)
                        away = tuple(_finite(self.send_floor_s(g, z, t, b, kind)) for kind in ("zone", "region"))
                    for row, value in zip(rows, (joint.Pool(g, z, region, t, avail, price), self.step(g, t, b),
                                                 upd, s_b, a_b, c_b, fixed, send, away)):
                        row.append(value)
            if not self.sailor:  # JointInputs.upd_fixed_s, send_floor_s and send_away_s stay empty
                for row in rows[6:]:
                    row.clear()
            # the last entry: `JointInputs.shared`, one cache for every choice built from these rows
            self._rows[key] = (*(tuple(row) for row in rows), {}) if rows[0] else None
        return self._rows[key]

    def stage_grad_bytes(self, inp: joint.JointInputs) -> dict[tuple[str, int], float]:
        """(stage position, blocks) -> gradient bytes of such a stage, for every position and block
        count of P stages (blocks form; the same for every choice of that depth)."""
        if inp.P not in self._stage_grad:
            stages = sorted({0, min(1, inp.P - 1), inp.P - 1})  # one stage of each position
            grad = [0.0]
            for g in inp.grad_bytes:  # prefix sums: a stage's units are one contiguous range
                grad.append(grad[-1] + g)
            self._stage_grad[inp.P] = {(joint.position(inp, i), n): grad[u.stop] - grad[u.start] for i in stages
                                       for n in joint.block_counts(inp, i) for u in [joint.stage_units(inp, i, n)]}
        return self._stage_grad[inp.P]

    def usable(self, g: str, t: int, b: int, per_node: int, avail: int) -> bool:
        """Whether TP t on g's nodes of per_node GPUs (avail of them) can run microbatch b: t divides
        the node, and the time estimator prices (b, t) (Sailor's profiles have some (b, TP) only; an
        estimator without `covers` prices every one)."""
        if t > per_node or per_node % t or t > avail:
            return False
        covers = getattr(self.est.time, "covers", None)
        return covers is None or covers(g, b, t)

    def step(self, g: str, t: int, b: int) -> tuple[float, ...]:
        key = (g, t, b)
        if key not in self._step:
            self._step[key] = tuple(sum(self.costs.replica_times(g, t, range(l, l + 1), b)) for l in range(self.U))
        return self._step[key]

    def upd(self, g: str, t: int, D: int) -> tuple[float, ...]:
        key = (g, t, D)
        if key not in self._upd:
            self._upd[key] = tuple(self.est.time.update_time_s(g, range(l, l + 1), t, D) for l in range(self.U))
        return self._upd[key]

    def floor_s(self, nodes: tuple, members: int, sizes: list[float], spans: str = "node",
                min_nodes: int = 1) -> list[float]:
        """The communication estimator's lower bound on an all-reduce of each of `sizes` bytes over
        `members` endpoints drawn from `nodes` ((endpoint, slots), `_nodes`), for every placement
        (`allreduce_floor_s`; inf where no placement exists; 0 for an estimator that has none: a
        valid, weak floor)."""
        floor = getattr(self.est.comm, "allreduce_floor_s", None)
        if members <= 1:
            return [0.0] * len(sizes)
        if floor is None or not nodes:
            return [0.0 if floor is None else math.inf] * len(sizes)
        key = (nodes, members, spans, min_nodes)
        cache = self._sync.setdefault(key, {})
        missing = [n for n in dict.fromkeys(sizes) if n not in cache]
        if missing:
            cache.update(zip(missing, floor(list(nodes), members, missing, spans, min_nodes)))
        return [cache[n] for n in sizes]

    def node_sizes(self, zone: str | None, gpu_type: str | None) -> list[int]:
        """GPUs per node of `zone` and `gpu_type` (None: any), largest first."""
        key = (zone, gpu_type)
        if key not in self._node_sizes:
            self._node_sizes[key] = sorted((n.num_gpus for n in self.inst.nodes
                                            if zone in (None, n.zone) and gpu_type in (None, n.gpu_type)), reverse=True)
        return self._node_sizes[key]

    def nodes(self, pools: tuple, zone: str | None = None, region: str | None = None,
              gpu_type: str | None = None) -> tuple:
        """(node endpoint, the most replicas it holds) for the nodes of the pools' (type, zone)
        groups in `zone` / `region` / of `gpu_type` (None: any); a node holds num_gpus // (the least
        TP of its type's pools), since every replica takes at least that many GPUs."""
        key = (pools, zone, region, gpu_type)
        if key not in self._node_sets:
            least: dict = {}
            for p in pools:
                if (zone or p.zone) == p.zone and (region or p.region) == p.region and (gpu_type or p.gpu_type) == p.gpu_type:
                    least[p.gpu_type, p.zone] = min(least.get((p.gpu_type, p.zone), p.tp), p.tp)
            self._node_sets[key] = tuple((node_endpoint(n), n.num_gpus // least[n.gpu_type, n.zone])
                                         for n in self.inst.nodes if (n.gpu_type, n.zone) in least)
        return self._node_sets[key]

    def effective_link(self, kind: str, b: int) -> joint.LinkCost | None:
        """One microbatch's boundary transfer inside a zone ("node": between two nodes or two GPUs of
        one node), between two zones of a region ("zone") or two regions, timed by the communication
        estimator (the simulator's) between the fastest pair found: a lower bound on the transfer of
        every placement, exact at this message size (the time, not the link, is what the model
        reads: `JointInputs.p2p_s`); None when the cluster has no such pair."""
        key = (kind, b)
        if key not in self._links:
            times = [self._least_send_s(a, c, b) for a in self._group_firsts() for c in self._receivers(a)
                     if spans_pair(kind, a, c)]
            best = min([t for t in times if t < math.inf], default=None)
            self._links[key] = None if not best else joint.LinkCost(self.boundary_bytes(b) / best, 0.0)
        return self._links[key]

    def send_floor_s(self, g: str, z: str, t: int, b: int, away: str | None = None) -> float:
        """(Sailor's composition) The least time of one send from a TP-t replica of g in zone z to any
        node (its own included) at any TP group size, of any unit output at microbatch b: a floor
        on every send a stage holding such a replica makes (`JointInputs.send_floor_s`). With `away`
        "zone" / "region", to nodes of another zone / region only (`JointInputs.send_away_s`; inf
        where there is none)."""
        key = (g, z, t, b, away)
        if key not in self._sends:
            src = next(a for a in self._group_firsts() if (a.gpu_type, a.zone) == (g, z))
            far = {None: lambda c: True, "zone": lambda c: c.zone != src.zone,
                   "region": lambda c: c.region != src.region}[away]
            self._sends[key] = min((self._least_send_s(src, c, b, (t,)) for c in self._receivers(src) if far(c)),
                                   default=math.inf)
        return self._sends[key]

    def _node_groups(self) -> dict[tuple[str, str], list]:
        """Nodes per (GPU type, zone): a group's nodes are alike to the estimator but for their id."""
        if self._groups is None:
            self._groups = {}
            for n in self.inst.nodes:
                self._groups.setdefault((n.gpu_type, n.zone), []).append(n)
        return self._groups

    def _group_firsts(self) -> list:
        return [nodes[0] for nodes in self._node_groups().values()]

    def _receivers(self, a) -> list:
        """The nodes a boundary's transfer from node a may reach, one of each kind: another node of
        every group, and node a itself (first fit may put both stages there) when it has 2 GPUs."""
        out = [next((n for n in nodes if n.node_id != a.node_id), None) for nodes in self._node_groups().values()]
        return [c for c in out if c is not None] + ([a] if a.num_gpus >= 2 else [])

    def _least_send_s(self, a, c, b: int, src_tps: tuple[int, ...] | None = None) -> float:
        """The least transfer the estimator gives from node a to node c at microbatch b (inf where its
        table has no such pair). The hetplan composition sends the boundary bytes between endpoints
        of no stated size; Sailor's sends any unit output (the head's logits back, too) between TP
        groups whose sizes pick the bandwidth fit: the least over those sizes, over `src_tps` (every
        TP degree when None) at a and every TP degree at c."""
        if not self.sailor:
            return self._p2p_s(a, c, self.boundary_bytes(b), None, None)
        sizes = {self.info.output_bytes(u, b) for u in range(self.U)}
        return min((self._p2p_s(a, c, size, ga, gc) for size in sizes for ga in src_tps or TP_CHOICES
                    for gc in TP_CHOICES if ga <= a.num_gpus and gc <= c.num_gpus), default=math.inf)

    def _p2p_s(self, a, c, nbytes: float, gpus_a: int | None, gpus_c: int | None) -> float:
        """The estimator's transfer between nodes a and c at TP groups of these sizes (None: not said);
        inf where its table has no such pair."""
        try:
            return self.est.comm.p2p_time_s(replace(node_endpoint(a), gpus=gpus_a),
                                            replace(node_endpoint(c), gpus=gpus_c), nbytes)
        except EstimatorError:
            return math.inf

    def mem(self, g: str, t: int, b: int, D: int) -> tuple[tuple[float, ...], tuple[float, ...], float]:
        key = (g, t, b, D)
        if key not in self._mem:
            stat, act, over = [], [], 0.0
            for l in range(self.U):
                mb = self.est.memory.worker_memory(g, range(l, l + 1), t, b, D, 1)
                stat.append(mb.params_bytes + mb.grads_bytes + mb.optimizer_bytes)
                act.append(mb.activations_bytes)
                # what the simulator's out-of-memory rule counts besides these (MemoryBreakdown.oom:
                # Sailor's check_config_fits adds 2-3 GB, not its footprint's 5.06 GB)
                counted = mb.total_bytes if mb.fit_bytes is None else mb.fit_bytes
                over, cap = counted - stat[-1] - act[-1], mb.capacity_bytes
            self._mem[key] = (tuple(stat), tuple(act), cap - over)
        return self._mem[key]


def _quotas(instance: Instance, opts: PlannerOptions) -> dict[tuple[str, str], tuple[int, int, float, str]]:
    """(gpu type, zone) -> (available GPUs, GPUs per node, price, region), after allowed types/zones."""
    c = instance.constraints
    out: dict[tuple[str, str], tuple[int, int, float, str]] = {}
    for g in instance.cluster.node_groups:
        if c.allowed_gpu_types is not None and g.gpu_type not in c.allowed_gpu_types:
            continue
        if c.allowed_zones is not None and g.zone not in c.allowed_zones:
            continue
        key = (g.gpu_type, g.zone)
        n, per_node, price, region = out.get(key, (0, g.gpus_per_node, g.price_per_gpu_hour_usd, g.region_name))
        out[key] = (n + g.count * g.gpus_per_node, min(per_node, g.gpus_per_node), max(price, g.price_per_gpu_hour_usd), region)
    if opts.available is not None:
        out = {k: (min(v[0], opts.available.get(k, 0)), *v[1:]) for k, v in out.items()}
    return {k: v for k, v in out.items() if v[0] > 0}


def joint_inputs(instance: Instance, tables: _Tables, quotas: dict, combo: Combo, objective: str,
                 max_cost: float | None, min_its: float | None, tp_choices: tuple[int, ...]) -> joint.JointInputs | None:
    """Fill the MILP's numbers for one outer choice; None when no pool can hold even one unit."""
    wl, net = instance.workload, instance.cluster.network
    B = wl.global_batch_size
    m = B // (combo.D * combo.b)
    rows = tables.pool_rows(quotas, tp_choices, combo.b, combo.D)
    if rows is None:
        return None
    pools, step, upd, stat, act, cap, fixed, send, away, shared = rows
    tied = tables.tied_bytes if combo.P > 1 else 0.0

    def link(spec) -> joint.LinkCost:
        return joint.LinkCost(spec.bandwidth_GBps * 1e9, spec.latency_s)

    node_link, zone_link, region_link = (tables.effective_link(cls, combo.b) or link(spec) for cls, spec in (
        ("node", net.inter_node), ("zone", net.inter_zone), ("region", net.inter_region)))
    inp = joint.JointInputs(
        P=combo.P, D=combo.D, b=combo.b, m=m, pools=pools, step_s=step, upd_s=upd,
        stat_bytes=stat, act_bytes=act, cap_bytes=cap, grad_bytes=tables.grad_bytes,
        tied_grad_bytes=tied, boundary_bytes=tables.boundary_bytes(combo.b),
        node=node_link, zone=zone_link, region=region_link,
        egress_zone_usd_per_GB=net.egress.inter_zone_usd_per_GB,
        egress_region_usd_per_GB=net.egress.inter_region_usd_per_GB,
        sync_factor=tables.sync_factor, objective=objective, max_cost_usd=max_cost,
        min_iters_per_s=min_its, max_gpus=instance.constraints.max_gpus, shared=shared,
        tied_pool_s=tied_floors_s(tables, pools, combo.D, tied), costs=tables.costs,
        composition="sailor" if tables.sailor else "hetplan", upd_fixed_s=fixed, send_floor_s=send,
        send_away_s=away)
    return inp


def with_sync_table(inp: joint.JointInputs, tables: _Tables) -> joint.JointInputs:
    """`inp` with lower bounds on the gradient all-reduce per (pool, stage position, blocks) filled in:
    `sync_table` for a stage in one zone, `span_sync_table` for one spanning zones of its region.
    A stage holding a replica of pool k all-reduces at least factor x bytes / t_k per member (its
    least TP is at most t_k) over D members placed on one node of k's type or on two or more nodes
    of its zone (region, spanning); the estimator's floor over those placements
    (`_Tables.floor_s`) holds whatever the first-fit placement and the stage's other pools. An
    entry is inf where no such placement exists (D replicas do not fit in the zone; a region of
    one zone has no spanning stage): the bounds then rule the pair out, and the MILP reads 0
    there (`joint.model_coef`), since its quota and region rows already do."""
    if inp.sync_table is not None or not joint.blocks_identical(inp):
        return inp
    # choices with the same D, pools and P share the tables (b changes neither the bytes of a
    # position's n blocks nor the replicas that all-reduce them)
    key = (inp.D, inp.pools, inp.P)
    tabs = tables.sync_tables.get(key)
    if tabs is None:
        nbytes = tables.stage_grad_bytes(inp)
        factor = tables.sync_factor
        table, span = {}, {}
        for k, pool in enumerate(inp.pools):
            joint.check_deadline()
            sizes = [factor * n / pool.tp for n in nbytes.values()]
            one = [math.inf] * len(sizes)
            if _fits_one_node(tables, inp.pools, pool, inp.D, pool.zone):
                one = tables.floor_s(tables.nodes(inp.pools, zone=pool.zone, gpu_type=pool.gpu_type), inp.D, sizes)
            many = tables.floor_s(tables.nodes(inp.pools, zone=pool.zone), inp.D, sizes,
                                  min_nodes=max(2, _least_nodes(tables, inp.pools, pool, inp.D, pool.zone)))
            table.update(((k, pos, n), min(a, b)) for (pos, n), a, b in zip(nbytes, one, many))
            if len(inp.zones) > 1:
                far = tables.floor_s(tables.nodes(inp.pools, region=pool.region), inp.D, sizes, spans="zone")
                span.update(((k, pos, n), v) for (pos, n), v in zip(nbytes, far))
        tabs = tables.sync_tables[key] = (table, span or None)  # only once complete: a deadline may stop the loop
    return replace(inp, sync_table=tabs[0], span_sync_table=tabs[1])


def _least_nodes(tables: _Tables, pools: tuple, pool: joint.Pool, members: int, zone: str | None = None,
                 gpu_type: str | None = None) -> int:
    """The fewest nodes of `zone` and `gpu_type` (None: any) that can hold a ring of `members`
    replicas, one of them of `pool`: that replica takes t_k GPUs and each other one at least the least
    TP of the selected pools, so the ring needs t_k + (members - 1) t_least GPUs, counted on the
    largest nodes first; more than the selection has where it cannot hold them (no placement: any
    floor holds). Measured: V100 TP 2 x 4 on 4-GPU nodes was floored at one node's ring, 1.0 ms,
    where two nodes take 8.9 ms; 16 TP 2 replicas on 4-GPU nodes as a 4-node ring, 49.0 ms, where
    the stage spans 8 nodes, 58.7 ms (the bound is 5 nodes)."""
    here = lambda p: zone in (None, p.zone) and gpu_type in (None, p.gpu_type)  # noqa: E731
    least = min(p.tp for p in pools if here(p))
    key = (least, pool.tp, members, zone, gpu_type)
    if key not in tables._least_nodes:  # asked for every pool of every outer choice
        need, held, count = pool.tp + (members - 1) * least, 0, None
        for count, size in enumerate(tables.node_sizes(zone, gpu_type), start=1):
            held += size
            if held >= need:
                break
        else:
            count = max((count or 0) + 1, 2)
        tables._least_nodes[key] = count
    return tables._least_nodes[key]


def _fits_one_node(tables: _Tables, pools: tuple, pool: joint.Pool, members: int, zone: str | None = None) -> bool:
    """Whether that ring can sit on one node of the pool's type (in `zone`; None: any zone)."""
    return _least_nodes(tables, pools, pool, members, zone, pool.gpu_type) == 1


def tied_floors_s(tables: _Tables, pools: tuple, D: int, tied_bytes: float) -> tuple[tuple[float, float, float], ...]:
    """Per pool k: lower bounds on the tied-embedding all-reduce of the first and last stage (2 D
    members, factor x bytes / t_k each: the ring's least TP is at most t_k when pool k serves an
    end) when both ends sit in one zone, in zones of one region (ez = 1) or in two regions (er = 1):
    the estimator's floor over every placement of that kind. The ring fits on one node only where a
    node of k's type holds t_k + (2 D - 1) t_least GPUs (t_least: the least TP of the type); else
    it spans two nodes or more. Empty without a tied embedding."""
    if tied_bytes <= 0:
        return ()
    key = (pools, D, tied_bytes)  # the same for every P and b: computed once, not per outer choice
    if key not in tables._tied:
        kinds = [(p.tp, _fits_one_node(tables, pools, p, 2 * D)) for p in pools]
        floors = {kind: _tied_floors_s(tables, pools, D, tied_bytes / kind[0], 1 if kind[1] else 2)
                  for kind in dict.fromkeys(kinds)}
        tables._tied[key] = tuple(floors[kind] for kind in kinds)
    return tables._tied[key]


def _tied_floors_s(tables: _Tables, pools: tuple, D: int, shard_bytes: float,
                   min_nodes: int) -> tuple[float, float, float]:
    size = [sync_volume_factor(tables.inst.workload.zero_stage) * shard_bytes]
    zones = sorted({p.zone for p in pools})
    regions = sorted({p.region for p in pools})
    node = min(tables.floor_s(tables.nodes(pools, zone=z), 2 * D, size, min_nodes=min_nodes)[0] for z in zones)
    zone = min((tables.floor_s(tables.nodes(pools, region=r), 2 * D, size, spans="zone")[0] for r in regions
                if len({p.zone for p in pools if p.region == r}) > 1), default=node)
    region = tables.floor_s(tables.nodes(pools), 2 * D, size, spans="region")[0] if len(regions) > 1 else zone
    return _finite(node), _finite(zone), _finite(region)


def _finite(floor_s: float) -> float:
    """A floor where no placement exists (inf) is 0 in the model: such plans are ruled out by the
    quota rows, and an infinite coefficient would break the MILP."""
    return floor_s if floor_s < math.inf else 0.0


def enumerate_combos(instance: Instance, quotas: dict, opts: PlannerOptions) -> list[Combo]:
    B = instance.workload.global_batch_size
    U = instance.model_arch.num_units
    max_replicas = sum(n // min(opts.tp_choices) for n, *_ in quotas.values())
    combos = []
    for P in range(1, min(U, opts.max_stages) + 1):
        for b in opts.microbatch_sizes:
            if B % b:
                continue
            for D in range(1, B // b + 1):
                if (B // b) % D == 0 and P * D <= max_replicas:
                    combos.append(Combo(P, b, D))
    return combos


# ---- the search -------------------------------------------------------------------------------------
PROGRESS_EVERY_S = 0.1  # the progress callback is called at most this often (and once at the end)
PREPARE_SHARE = 0.6  # the outer choices' inputs and cheap bounds may take this share of the limit
RESCUE_S = 0.25  # no plan at the deadline: the greedy looks for one this long, or a quarter of the limit if less


@dataclass(frozen=True)
class SearchProgress:
    """Where a running search stands: the one argument of `plan(progress=...)`."""

    done: int  # outer choices settled (solved, pruned, ruled out, skipped; while preparing: prepared)
    total: int  # outer choices enumerated
    what: str  # the phase, or the choice (P, b, D) being worked on
    incumbent: float | None  # the best plan's model objective so far (s or USD per iteration)
    bound: float | None  # the proven lower bound so far over the modelled space
    gap: float | None  # (incumbent - bound) / incumbent, when both exist
    elapsed_s: float


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
    microbatch size b: F_b, one microbatch through every unit, each on its fastest pool; W_b and
    C_b, the least GPU-seconds and USD of one microbatch through every unit; R_b, the cheapest
    replica's USD per second. A plan with D replicas per stage runs every replica's stage
    m = B / (D b) times and T >= m theta >= m x (any replica's stage time), so summed over the
    replicas GPUs x T >= m D W_b and rate x T >= m D C_b, with m D = B / b and GPUs at most the
    available ones (and max_gpus); T >= F_b too. Cost adds egress >= 0."""

    B: int
    gpus: int
    per_b: dict[int, tuple[float, float, float, float]]  # b -> (F_b s, W_b GPU-s, C_b USD, R_b USD/s)

    @property
    def least_time_s(self) -> float:
        return min((max(f, self.B / b * w / self.gpus) for b, (f, w, _, _) in self.per_b.items()), default=math.inf)

    @property
    def least_cost_usd(self) -> float:
        return min((self.B / b * c for b, (_, _, c, _) in self.per_b.items()), default=math.inf)

    def choice_bound(self, combo: Combo, objective: str) -> float:
        """A bound on one choice's plans without its inputs, the cheap bound's formula
        (`joint.time_lower_bound_s`, times the least rate for cost) on the superset of pools."""
        if combo.b not in self.per_b:
            return math.inf
        f, w, _, rate = self.per_b[combo.b]
        m = self.B // (combo.D * combo.b)
        t_lb = f + (m - 1) * max(f / combo.P, combo.D * w / self.gpus)
        return t_lb * combo.P * combo.D * rate if objective == "min_cost" else t_lb


def _floor(instance: Instance, tables: _Tables, quotas: dict, opts: PlannerOptions) -> _Floor:
    B = instance.workload.global_batch_size
    gpus = sum(avail for avail, *_ in quotas.values())
    if instance.constraints.max_gpus is not None:
        gpus = min(gpus, instance.constraints.max_gpus)
    per_b = {}
    for b in opts.microbatch_sizes:
        pools = [(price * t / 3600, t, tables.step(g, t, b)) for (g, _), (avail, per_node, price, _) in quotas.items()
                 for t in opts.tp_choices if tables.usable(g, t, b, per_node, avail)]
        if B % b or not pools:
            continue
        units = range(tables.U)
        per_b[b] = (sum(min(step[l] for *_, step in pools) for l in units),
                    sum(min(t * step[l] for _, t, step in pools) for l in units),
                    sum(min(rate * step[l] for rate, _, step in pools) for l in units),
                    min(rate for rate, *_ in pools))
    return _Floor(B, gpus, per_b)


def _budget_message(max_cost: float, least: float) -> str:
    return (f"max_cost_per_iteration_usd: {max_cost:g} USD is below the least cost of any plan, {least:.4g} USD; "
            f"raise the budget to at least that")


def _check_reachable(floor: _Floor, max_cost: float | None, min_its: float | None) -> None:
    """InfeasibleError at once when the budget or the throughput floor is beyond every plan
    (`_Floor`), naming the limit and the best figure any plan can reach."""
    if max_cost is not None and floor.least_cost_usd > max_cost:
        raise InfeasibleError(_budget_message(max_cost, floor.least_cost_usd))
    if min_its is not None and floor.least_time_s * min_its > 1:
        raise InfeasibleError(f"min_throughput_iters_per_s: {min_its:g} it/s is above the most any plan reaches, "
                              f"{1 / floor.least_time_s:.4g} it/s; lower the floor to at most that")


def _check_choices_reachable(queue: list, objective: str, max_cost: float | None) -> None:
    """With every choice's cheap bound in: InfeasibleError when the budget is below all of their
    cost bounds (rate_LB x T_LB: unlike `_Floor.least_cost_usd` it counts the P x D replicas a
    choice pays for while the slowest stage runs)."""
    if max_cost is None or not queue:
        return
    least = min(item[0] if objective == "min_cost" else item[0] * joint.rate_lower_bound_usd_per_s(item[6])
                for item in queue)
    if least > max_cost:
        raise InfeasibleError(_budget_message(max_cost, least))


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
        # The compact form puts a block with the embedding, so P = L + 2 (one unit a stage) has no
        # layout there; its bounds looked up a stage-0 block count that does not exist (KeyError).
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
        if self.est.iteration == "sailor":  # Sailor's all-reduce reads the replica order: try the best one
            ordered = ring_ordered(self.instance, rep.plan, self.est)
            if ordered is not rep.plan:
                again = simulate(self.instance, ordered, self.est)
                rep = again if self._objective(again) < self._objective(rep) else rep
        if rep.oom_ranks or (self.max_cost is not None and rep.cost_per_iteration_usd > self.max_cost) or (
                self.min_its is not None and rep.iters_per_s < self.min_its):
            return None
        return rep


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

    def bound(self, head: float | None = None) -> float | None:
        """The least of everything still open (the head of the queue: `head`) and the lead's model
        objective: a choice was closed when nothing in it has a model objective below a lead's, so
        this bounds the model objective, and so the simulated one, of every plan of the space."""
        values = self.open_bounds + [item.bound for item in self.unfinished]
        values += [v for v in (head, self.incumbent) if v is not None]
        return min(values) if values else None

    def skip_rest(self, entry: tuple, queue: list) -> None:
        """The deadline: the popped choice (queue `entry`) and every queued one are skipped with
        their bounds; the entry goes back to the list for `_rescue`."""
        _settle_rest(self.records, entry[0], entry[5], queue, "skipped_time")
        self.open_bounds += [entry[0]] + [item[0] for item in queue]
        queue.append(entry)
        self.cut = True


def planner_tables(instance: Instance, estimators: EstimatorSet) -> _Tables:
    """The planner's estimator figures for `instance` scored by `estimators`, to hand to several
    `plan` calls (`tables=`). They depend on the instance (its nodes, network, model, workload) and
    the estimators only: the availability, the limits and the options key their own entries
    (`_Tables.pool_rows`, `with_sync_table`), so a re-planner whose events change only the quotas
    keeps one and skips recomputing them at every event (hetplan.orchestration.replan.ReplanSession)."""
    return _Tables(instance, estimators)


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
    max_cost, min_its = relaxed_limits(  # the simulator's tolerance, so both call the same plans feasible
        opts.max_cost_usd if opts.max_cost_usd is not None else instance.constraints.max_cost_per_iteration_usd,
        opts.min_iters_per_s if opts.min_iters_per_s is not None else instance.constraints.min_throughput_iters_per_s)
    quotas = _quotas(instance, opts)
    if not quotas:
        raise InfeasibleError("no GPUs are available under allowed_gpu_types / allowed_zones")
    tables = tables or _Tables(instance, est)
    floor = _floor(instance, tables, quotas, opts)
    _check_reachable(floor, max_cost, min_its)
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
        _check_choices_reachable(queue, objective, max_cost)
    heapq.heapify(queue)
    with joint.deadline_scope(deadline):
        _search(queue, tables, objective, max_cost, min_its, opts, milp, deadline, report, out)
    if out.best is None and out.timed_out:  # outside the search's scope: the rescue has a deadline of its own
        out.found(_rescue(queue, objective, max_cost, min_its, opts.time_limit_s), heuristic=True)
    return _result(instance, objective, (max_cost, min_its), opts, milp.backend, len(combos), out, deadline,
                   report)


def _search(queue: list, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
            opts: PlannerOptions, milp: "_MilpSettings", deadline: joint.Deadline, report: _Reporter,
            out: _Outcome) -> None:
    """Best first over the queued choices (module docstring), into `out`. At the deadline every
    choice left is recorded "skipped_time" with the bound it has (a computation the deadline cut
    is dropped, so every bound kept is valid)."""
    helper = refiner = None
    try:
        # a helper process (two cores) computes the medium bounds of the queued choices, in queue
        # order, while this one runs the heuristics of the first incumbent, and then the later steps
        # of the choices under the target (`_Refiner`)
        if opts.workers >= 2 and not deadline.expired():  # (the preparation may have used the time up)
            helper = _Helper.start({item[5]: item[6] for item in queue}, tables, objective, max_cost, min_its,
                                   deadline)
        refiner = _Refiner(tables, objective, max_cost, min_its, helper)
        # the medium bounds ahead, in queue order; the first choices get warm caches from the heuristics
        refiner.enqueue([(_Step(item[5], 0, item[0], None, False), item[6])
                         for item in sorted(queue)[opts.heuristic_choices:]])
        # the first incumbent: heuristics on the most promising choices, so the bounds have a target
        greedies: dict[Combo, tuple] = {}  # heuristic results per choice, and whether the stage DP ran

        def tick(what: str, best: tuple | None) -> None:
            report(len(out.records), what, best[0] if best else None, out.bound(queue[0][0] if queue else None))

        out.found(_first_incumbent(queue, tables, objective, max_cost, min_its, greedies, opts.heuristic_choices,
                                   opts.heuristic_degrees, opts.rel_gap, tick), heuristic=True)
        dp_runs_left = opts.heuristic_choices  # stage-DP runs for the first choices the strong bound keeps
        strongest_for: dict[Combo, float | None] = {}  # the target each choice's strongest bound had

        def target_now() -> float | None:
            return None if out.lead is None else out.incumbent * (1 - opts.rel_gap)

        def step_of(item: tuple) -> _Step:
            """The step the search takes when queued `item` comes out at the head, as things stand."""
            i_lb, i_level, i_combo = item[0], item[4], item[5]
            allowed = i_level == 1 and dp_runs_left > 0 and not greedies.get(i_combo, (None, False))[1]
            return _Step(i_combo, i_level, i_lb, target_now() if i_level > 0 else None, allowed)

        def live(item: tuple) -> bool:
            """Whether `item` will be refined if the target does not change."""
            target = target_now()
            return item[4] < 3 and (target is None or item[0] < target) and (item[4] < 2 or target is not None)

        def steps_ahead(items) -> list:
            return [(step_of(item), item[6]) for item in items if live(item)]

        def follow(pushed: tuple | None = None) -> None:
            """Keep the helper's steps those of the queue: all again when the target or the DP
            allowance changed (its other steps are stale), else the choice just queued."""
            state = (target_now(), dp_runs_left > 0)
            if state != refiner.state:  # (the medium-bound steps need no target: those queued stay)
                refiner.reset(state, target_now(), steps_ahead(item for item in queue if item[4] > 0))
            elif pushed is not None:
                refiner.enqueue(steps_ahead([pushed]))

        follow()
        while queue:
            entry = heapq.heappop(queue)
            lb, _, _, _, level, combo, inp = entry
            incumbent = out.incumbent
            report(len(out.records), f"P={combo.P} b={combo.b} D={combo.D}", out.best[0] if out.best else None,
                   out.bound(lb))
            if incumbent is not None and lb >= incumbent * (1 - opts.rel_gap):
                # best first: every choice left has a bound at least this one
                out.pruned += _settle_rest(out.records, lb, combo, queue, "pruned_bound")
                out.open_bounds.append(lb)
                break
            if deadline.remaining() < 0.05:
                out.skip_rest(entry, queue)
                break
            try:
                if level < 3:
                    # refine in three steps, each choice going back in the queue: the medium bound
                    # (quota aware, no DP: a few milliseconds), the strong one (dynamic programs over
                    # stages, tens of milliseconds), the strongest (replica-level DPs on the sum of
                    # stage times, once an incumbent gives them a target); a choice is solved only if
                    # it is still the most promising one. The step is the same whichever process
                    # computes it (`_Refiner`). Each choice's inputs get the all-reduce times: the
                    # same object (and its caches) goes back in the queue
                    inp = with_sync_table(inp, tables)

                    def ahead() -> list:
                        """The steps that may come next (the first levels of the heap), with their inputs."""
                        steps = []
                        for j in range(min(len(queue), refiner.LOOK)):
                            if live(queue[j]):
                                queue[j] = item = queue[j][:6] + (with_sync_table(queue[j][6], tables),)  # same key
                                steps.append((step_of(item), item[6]))
                        return steps

                    step = step_of((lb, 0, 0, 0, level, combo, inp))
                    new_lb, found, dp_ran = refiner.run(step, inp, ahead)
                    if level == 2:
                        strongest_for[combo] = step.target
                    if dp_ran:
                        dp_runs_left -= 1
                        greedies[combo] = (found, True)
                        if found is not None:
                            out.found((*found, inp), heuristic=True)
                    pushed = None
                    if new_lb == float("inf"):
                        out.records.append(ComboRecord(combo.P, combo.b, combo.D, new_lb, "infeasible_by_bound"))
                    else:
                        pushed = (new_lb, combo.P, combo.D, combo.b, level + 1, combo, inp)
                        heapq.heappush(queue, pushed)
                    follow(pushed)
                    continue
                target, before = target_now(), strongest_for.get(combo)
                if target is not None and lb < target and (before is None or before > target):
                    # the strongest bound stops early at its target: computed for a worse incumbent,
                    # it may reach this one's (measured: opt350-2zones-budget, P3 b1 D128 went to
                    # its MILP with 1.6046 s, 12.5 s to reject; at the later target, 1.6149 s >= 1.6144 s)
                    strongest_for[combo] = target
                    again = _refine(inp, tables, _Step(combo, 2, lb, target, False), objective, max_cost, min_its)[0]
                    heapq.heappush(queue, (again, combo.P, combo.D, combo.b, 3, combo, inp))
                    follow()
                    continue
                found, with_dp = greedies.get(combo, (None, False))
                if not with_dp:
                    lead = out.incumbent
                    found = _heuristics_on(combo, inp, greedies, out, objective, max_cost, min_its)
                    if out.incumbent != lead:  # a better incumbent: the check above first, then maybe the MILP
                        heapq.heappush(queue, entry)
                        follow()
                        continue
            except joint.DeadlineExceeded:  # a bound or heuristic of this choice reached the deadline
                out.skip_rest(entry, queue)
                break
            rec = ComboRecord(combo.P, combo.b, combo.D, lb, "")
            out.records.append(rec)
            if with_dp and found is not None:  # a plan of the first heuristics, not offered yet
                out.found((*found, inp), heuristic=True)
            item = _solve_choice(rec, inp, found, out.lead, objective, milp, opts.combo_time_limit_s, deadline)
            out.solved += 1
            if item is not None:
                out.found(item.solution)
                _file(item, out.unfinished, out.open_bounds)
                if item.open and item.solution is None:  # a hard MILP: look for a better incumbent first
                    _dive(queue, tables, objective, max_cost, min_its, greedies, opts.heuristic_choices, out,
                          opts.combo_time_limit_s)
            follow()
    finally:  # the helper stops (and the collector's frozen objects come back) whatever happened
        if refiner is not None:
            refiner.close()
        elif helper is not None:
            helper.close()
    _resolve_unfinished(out, objective, milp, deadline, opts.rel_gap)


def _resolve_unfinished(out: _Outcome, objective: str, milp: "_MilpSettings", deadline: joint.Deadline,
                        rel_gap: float) -> None:
    """Time left (every choice settled early): the choices whose MILP stopped at its own limit get
    the rest, least bound first, in equal shares; those left at the deadline keep their bounds."""
    out.unfinished.sort(key=lambda item: item.bound)
    while out.unfinished:
        item = out.unfinished[0]
        remaining = deadline.remaining()
        if out.lead is not None and item.bound >= out.incumbent * (1 - rel_gap):
            out.open_bounds.append(out.unfinished.pop(0).bound)  # the incumbent is within the gap of this bound
            continue
        if remaining < 1.0:
            out.cut = True
            break
        out.unfinished.pop(0)
        again = _solve_choice(item.record, item.inputs, item.start, out.lead, objective, milp,
                              remaining / (len(out.unfinished) + 1), deadline, item.bound)
        if again is not None:
            out.found(again.solution)
            _file(again, out.unfinished, out.open_bounds)
            out.unfinished.sort(key=lambda item: item.bound)
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
    bound = out.bound()
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
        plan_source="heuristic" if greedy is out.best else "milp")
    report(len(records), "done", obj, bound, force=True)
    return result


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


def _solve_choice(rec: ComboRecord, inp: joint.JointInputs, found: tuple | None, best: tuple | None,
                  objective: str, milp: _MilpSettings, limit_s: float, deadline: joint.Deadline,
                  lb: float | None = None) -> _ChoiceResult | None:
    """Build and solve one choice's MILP with the incumbent `best` as cutoff, warm-started from
    `found` (objective, solution) when it is within the cutoff; update `rec`. Returns the choice's
    proven bound, what it found (`solution`) and whether the MILP stopped at its limit (`open`);
    None when nothing in the choice beats the cutoff (infeasible under it). The solver gets
    `limit_s`, or what the build left of the search's `deadline` if that is less."""
    from hetplan.solvers import SolveOptions, solve

    lb = rec.lower_bound if lb is None else lb
    cutoff = best[0] if best else None
    t0 = time.perf_counter()
    try:
        model = joint.build(inp, linearize=milp.linear, time_cutoff_s=cutoff if objective != "min_cost" else None,
                            cost_cutoff_usd=cutoff if objective == "min_cost" else None)
    except joint.NoStageChoice:  # some stage position fits no pool (within the cutoff): nothing to solve
        rec.status, rec.bound = "infeasible", cutoff
        return None
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
                options=SolveOptions(time_limit_s=max(min(limit_s, left), 0.1), rel_gap=milp.rel_gap / 2,
                                     diagnose_infeasible=False))  # a cutoff makes infeasible normal
    rec.solve_s += res.solve_s
    rec.status = f"solved:{res.status.value}"
    if res.status.has_solution:
        sol = joint.decode(model, inp)
        ev = joint.evaluate(inp, sol)
        obj = ev["cost"] if objective == "min_cost" else ev["T"]
        rec.objective = obj if rec.objective is None else min(rec.objective, obj)
        rec.bound = None if res.bound is None else joint.objective_value(inp, res.bound)
        optimal = res.status.value == "optimal"  # within the MILP's own gap: its bound still counts
        bound = (obj if optimal else lb) if res.bound is None else max(joint.objective_value(inp, res.bound), lb)
        return _ChoiceResult(min(bound, obj), rec, inp, (obj, sol), (obj, sol, inp), open=not optimal)
    if res.status.value == "infeasible":
        rec.bound = cutoff  # nothing better than the cutoff in this choice (or nothing at all)
        return None
    if res.status.value == "time_limit_no_solution":
        return _ChoiceResult(lb, rec, inp, found, None)
    # a back-end error on one choice: not solved again, and its lower bound stays in the bound
    rec.status = f"error:{res.message[:80]}"
    return _ChoiceResult(lb, rec, inp, found, None, open=False)


def _dive(queue: list, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
          greedies: dict, count: int, out: "_Outcome", limit_s: float) -> None:
    """After a MILP stopped at its limit with no plan: the heuristics (greedy and stage DP, 0.1-0.5
    s each) on the `count` queued choices of least bound that have not had the DP yet and may still
    beat the incumbent, for at most `limit_s`. The search is best first, so under a limit it may
    spend all its time in MILPs of choices whose bounds are low while a later choice holds a better
    plan (measured: OPT-350M on 5 zones x 80 A100, the P13-P16 D16 MILPs stopped at 5 s each with
    bounds of 1.50-1.68 s and no plan, and the 60 s ran out before P5 b1 D64, whose heuristic plan
    simulates at 1.756 s against the 1.779 s returned)."""
    with joint.deadline_scope(joint.Deadline.after(limit_s)):
        try:
            for item in sorted(queue, key=lambda item: item[:5]):
                if count <= 0 or (out.lead is not None and item[0] >= out.incumbent):
                    break
                combo = item[5]
                if greedies.get(combo, (None, False))[1]:
                    continue
                _heuristics_on(combo, with_sync_table(item[6], tables), greedies, out, objective, max_cost, min_its)
                count -= 1
        except joint.DeadlineExceeded:  # the dive's limit or the search's: the search's loop sees the latter
            pass


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


def _refine(inp: joint.JointInputs, tables: _Tables, step: "_Step", objective: str, max_cost: float | None,
            min_its: float | None) -> tuple[float, tuple | None, bool]:
    """One refinement step of a queued choice: (its bound at the next level, the heuristics' plan
    (objective, solution) or None, whether the stage DP ran). The DP runs (when `step.dp_allowed`) on
    the first choices the strong bound keeps, after it (measured on GPT-Neo, 2 x 256 GPUs: once
    the incumbent was the optimum, the bound ruled out 15 of the 16 choices the DP had run on
    before it, 2.0 s of DPs). A function of its arguments alone, so the helper process gives the
    same answer as the main one."""
    level, lb, target = step.level, step.lb, step.target
    inp = with_sync_table(inp, tables)  # the all-reduce times enter all
    if level < 2 or target is not None:
        lb = max(lb, _tight_bound(inp, objective, min_its, target, exact=level >= 1, strongest=level == 2))
    if level == 1 and step.dp_allowed and lb < float("inf") and (target is None or lb < target):
        return lb, _best_heuristic(inp, objective, max_cost, min_its), True
    return lb, None, False


@dataclass(frozen=True)
class _Step:
    """One refinement step of a queued choice, all that `_refine` depends on besides the inputs:
    two processes computing the same step get the same result. The medium bound (level 0) does not
    read the target, so its steps carry none."""
    combo: Combo
    level: int
    lb: float
    target: float | None
    dp_allowed: bool


class _Refiner:
    """Takes the search's refinement steps (`_refine`), with a helper process working ahead when
    there is one. The helper holds the steps the search will take if nothing changes (the queued
    choices under the target, each with the step it gets when it comes out at the head) and works
    through them in queue order: first the medium bounds, while this process runs the heuristics
    of the first incumbent, then the later levels as the choices come back to the queue. When the
    target or the DP allowance changes, its steps at the later levels are replaced. The search
    uses a step's result only when it reaches that very step (`_Step`: same choice, level, bound,
    target and DP allowance), and a step's result depends on nothing else, so the search takes
    the same path as in one process, whichever process finishes first. A step the helper has not
    started is taken back and computed here; while the helper computes the head's step, this
    process computes the next ones. Each side sends the small bound caches of a choice with its
    step (`joint.cache_export`), so the other reuses them."""

    LOOK = 7  # queue entries (the heap's first three levels) this process may take ahead

    def __init__(self, tables: _Tables, objective: str, max_cost: float | None, min_its: float | None,
                 helper: "_Helper | None"):
        self.tables, self.objective, self.max_cost, self.min_its = tables, objective, max_cost, min_its
        self.helper = helper
        self.local: dict[_Step, tuple] = {}  # steps this process took ahead of the search
        self.state = None  # (target, DP allowance) of the steps the helper holds

    def enqueue(self, steps: list[tuple[_Step, joint.JointInputs]]) -> None:
        """Give the helper these steps (with this process's caches of their choices)."""
        if self.helper is not None:
            self.helper.add([(st, i) for st, i in steps if st not in self.local])

    def reset(self, state: tuple, cut: float | None, steps: list[tuple[_Step, joint.JointInputs]]) -> None:
        """The target or the DP allowance changed: the helper drops its steps past the medium
        bound and those of choices at or above `cut` (pruned before they come out), and takes
        `steps` instead."""
        self.state = state
        self.local = {st: r for st, r in self.local.items() if st.level == 0}  # the others are stale
        if self.helper is not None:
            self.helper.reset(cut)
            self.enqueue(steps)

    def run(self, step: _Step, inp: joint.JointInputs,
            ahead: Callable[[], list[tuple[_Step, joint.JointInputs]]]) -> tuple[float, tuple | None, bool]:
        """The result of `step` on `inp`; `ahead()`: the steps that may come next, with their inputs
        (asked for only while the helper computes `step`)."""
        if step in self.local:
            return self.local.pop(step)
        helper = self.helper
        if helper is not None:
            later = None
            while True:
                got = helper.take(step)
                if got is not None:
                    result, cache = got
                    joint.cache_import(inp, cache)
                    return result
                if not helper.computing(step):
                    break
                # the helper is on it: take a later step here meanwhile (one it has not started)
                later = ahead() if later is None else later
                todo = next(((st, i) for st, i in later if st != step and st not in self.local
                             and not helper.has(st) and not helper.computing(st)), None)
                if todo is None:
                    helper.wait()
                    continue
                helper.take_back(todo[0])
                self.local[todo[0]] = self._compute(*todo)
            helper.take_back(step)
        return self._compute(step, inp)

    def _compute(self, step: _Step, inp: joint.JointInputs) -> tuple[float, tuple | None, bool]:
        return _refine(inp, self.tables, step, self.objective, self.max_cost, self.min_its)

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()


def _order(step: _Step) -> tuple:
    """A step's place in the search's queue (its key there)."""
    return (step.lb, step.combo.P, step.combo.D, step.combo.b, step.level)


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class _Helper:
    """A forked process that computes the refinement steps (`_refine`) it is given, least queue
    key first, and says which one it starts. It holds its own copies of the inputs and their
    caches. Any failure (no fork on this platform, a crash, no word for HELPER_WAIT_S while a step
    is awaited) makes the main process compute the steps itself.

    Signals are the main process's business: the helper ignores SIGINT (Ctrl-C reaches the whole
    process group; the main process stops it), dies at SIGTERM without a word (what `close`
    sends), and dies with the main process (Linux: PR_SET_PDEATHSIG). Its steps stop at the
    search's deadline like the main process's."""

    def __init__(self, conn, proc, deadline: joint.Deadline):
        self.conn, self.proc, self.deadline = conn, proc, deadline
        self.done: dict[_Step, tuple] = {}  # results received and not yet used
        self.pending: set[_Step] = set()  # given and not finished (nor taken back)
        self.current: _Step | None = None  # the step the helper is computing
        self.froze = False  # whether `start` froze the collector's objects (`close` undoes it)

    @classmethod
    def start(cls, inputs: dict, tables: _Tables, objective: str, max_cost: float | None,
              min_its: float | None, deadline: joint.Deadline) -> "_Helper | None":
        try:
            ctx = multiprocessing.get_context("fork")
            if len(os.sched_getaffinity(0)) < 2:
                return None  # one core: the two would only take turns
        except (ValueError, AttributeError):  # no fork (Windows) or no affinity call (macOS)
            return None
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_helper_main, args=(os.getpid(), child, inputs, tables, objective, max_cost,
                                                      min_its, deadline), daemon=True)
        # objects that exist now go to the collector's permanent generation until `close`: neither
        # process's collections then touch them, so the pages the fork shares stay shared (not
        # when the caller froze objects already: unfreezing would release theirs too)
        froze = gc.get_freeze_count() == 0
        if froze:
            gc.freeze()
        # the child is born with SIGINT and SIGTERM blocked and unblocks them once its own handlers
        # are set: a Ctrl-C at fork time must not raise KeyboardInterrupt (and print a traceback) there
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            proc.start()
        except (AssertionError, OSError):  # a daemon process may not start children; no resources
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if froze:
                gc.unfreeze()
            conn.close()
            return None
        finally:
            child.close()
        helper = cls(conn, proc, deadline)
        helper.froze = froze
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal that came meanwhile is raised here
        except BaseException:
            helper.close()
            raise
        return helper

    def _send(self, msg) -> bool:
        if self.conn is None:
            return False
        try:
            self.conn.send(msg)
            return True
        except OSError:
            self._fail()
            return False

    def _fail(self) -> None:
        """The helper is gone or hung: every step it held is computed by the main process."""
        self.conn, self.current = None, None
        self.pending.clear()
        if self.proc.is_alive():
            self.proc.terminate()

    def add(self, steps: list[tuple[_Step, joint.JointInputs]]) -> None:
        new = [(st, i) for st, i in steps if st not in self.pending and st not in self.done]
        if new and self._send(("add", [(st, joint.cache_export(i)) for st, i in new])):
            self.pending.update(st for st, _ in new)

    def reset(self, cut: float | None) -> None:
        if self._send(("reset", cut)):
            self.pending = {st for st in self.pending if st.level == 0 and (cut is None or st.lb < cut)
                            or st == self.current}

    def take_back(self, step: _Step) -> None:
        """The main process computes `step`: the helper skips it if it has not started it."""
        if step in self.pending and step != self.current and self._send(("skip", step)):
            self.pending.discard(step)

    def has(self, step: _Step) -> bool:
        return step in self.done

    def computing(self, step: _Step) -> bool:
        return step == self.current and self.conn is not None

    def take(self, step: _Step) -> tuple | None:
        """(result, cache) of `step` if received, else None."""
        self._drain(block=False)
        return self.done.pop(step, None)

    def wait(self) -> None:
        """Wait for the helper's next message."""
        self._drain(block=True)

    def _drain(self, block: bool) -> None:
        """Receive what the helper has sent (with `block`, wait for at least one message; past the
        deadline, DeadlineExceeded: the helper's steps stop there too, so it has nothing to say)."""
        try:
            while self.conn is not None and (block or self.conn.poll()):
                wait_s = min(HELPER_WAIT_S, max(self.deadline.remaining(), 0.0) + 0.1)
                if block and not self.conn.poll(wait_s):
                    if self.deadline.expired():
                        raise joint.DeadlineExceeded
                    raise OSError("helper timed out")  # a hung helper must not hang the search
                step, ok, value = self.conn.recv()
                block = False
                if ok is None:  # the helper started this step
                    self.current = step
                    continue
                self.current = None
                self.pending.discard(step)
                if ok:
                    self.done[step] = value
        except (EOFError, OSError):
            self._fail()

    def close(self) -> None:
        """Stop the helper at once: it may be on a step nobody needs, and it holds nothing else."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        try:
            self.proc.terminate()
            self.proc.join(timeout=0.5)
            if self.proc.exitcode is None:  # stopped (SIGSTOP) or stuck in the kernel: no orphan either way
                self.proc.kill()
                self.proc.join(timeout=0.5)
        finally:
            if self.froze:
                self.froze = False
                gc.unfreeze()


def _quiet_helper(parent: int) -> None:
    """The helper's signals (`_Helper`): set while they are blocked (`_Helper.start`), then let in."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
    except (OSError, AttributeError):  # not Linux: the closed pipe ends the helper at its next message
        pass
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _helper_main(parent: int, conn, *args) -> None:
    """The helper process: its signals (`_quiet_helper`), then `_helper_loop(conn, *args)`."""
    _quiet_helper(parent)
    _helper_loop(conn, *args)


class _Sender:
    """The helper's messages, sent by a thread of their own in order, so that the helper keeps
    reading meanwhile. Sent inline, a large reply (bound caches) going out while the main process
    was itself sending a large message (`_Helper.add`) blocked both processes on full socket
    buffers, for good: GPT-Neo on 5 zones x 32 A100 with Sailor's composition hung there."""

    def __init__(self, conn):
        self.conn, self.broken = conn, False
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True).start()

    def send(self, msg) -> None:
        if self.broken:
            raise OSError("the main process closed the pipe")
        self.queue.put(msg)

    def _run(self) -> None:
        while True:
            msg = self.queue.get()
            try:
                self.conn.send(msg)
            except OSError:
                self.broken = True
                return


def _helper_loop(conn, inputs: dict, tables: _Tables, objective: str, max_cost: float | None,
                 min_its: float | None, deadline: joint.Deadline) -> None:
    sender = _Sender(conn)
    refined: dict = {}  # the inputs this process refined, with their caches
    caches: dict = {}  # choice -> bound caches the main process sent, not yet taken into its inputs
    todo: list = []  # heap of (queue key, step)
    skipped: set = set()  # steps the main process took back
    finished: set = set()  # a step given twice is computed once
    while True:
        try:
            while conn.poll() or not todo:  # read every message before the next step
                msg = conn.recv()
                if msg is None:
                    return
                kind, arg = msg
                if kind == "add":
                    for step, cache in arg:
                        if cache:
                            caches.setdefault(step.combo, []).append(cache)
                        heapq.heappush(todo, (_order(step), step))
                elif kind == "skip":
                    skipped.add(arg)
                elif kind == "reset":
                    todo = [(key, st) for key, st in todo if st.level == 0 and (arg is None or st.lb < arg)]
                    heapq.heapify(todo)
        except (EOFError, OSError):
            return
        _, step = heapq.heappop(todo)
        if step in skipped or step in finished:
            skipped.discard(step)
            continue
        finished.add(step)
        try:
            sender.send((step, None, None))  # started: the main process waits for it rather than redo it
            with joint.deadline_scope(deadline):  # past it, the failure makes the main process stop too
                inp = refined[step.combo] = with_sync_table(refined.get(step.combo, inputs[step.combo]), tables)
                for cache in caches.pop(step.combo, []):
                    joint.cache_import(inp, cache)
                result = _refine(inp, tables, step, objective, max_cost, min_its)
            reply = (step, True, (result, joint.cache_export(inp)))
        except OSError:
            return
        except Exception as exc:  # noqa: BLE001  the main process computes the step itself
            reply = (step, False, repr(exc))
        try:
            sender.send(reply)
        except OSError:
            return


def _first_incumbent(queue: list, tables: _Tables, objective: str, max_cost: float | None,
                     min_its: float | None, greedies: dict, heuristic_choices: int, heuristic_degrees: int,
                     rel_gap: float, tick: Callable[[str, tuple | None], None] | None = None) -> tuple | None:
    """The best heuristic plan over the most promising queued choices, (objective, solution,
    inputs), or None. A target from the start lets every strong bound stop early (measured on
    GPT-Neo, 3 x 256 GPUs: without one, the first 40 s of search went to bounds). The
    `heuristic_choices` choices with the least cheap bound get the greedy and the stage DP
    (`joint/stage_dp.py`, 10-100 ms each); past them, only the greedy (about a millisecond) runs,
    and only until some plan is found. Under a budget (maximum throughput) every single-stage choice
    gets both: the fastest choices are then the dearest, and a plan within the budget may lie far
    down the order (Sailor's A100 x 128 under 0.3 USD: the best plan, P1 b8 D16, ranks 165th of
    316 choices and needs the stage DP; the greedy misses it). At the search's deadline it
    returns the best plan found so far (the search then stops). `tick(what, best)` after each
    choice: progress."""
    best = None
    tick = tick or (lambda what, best: None)
    every = objective != "min_cost" and max_cost is not None
    try:
        order = sorted(range(len(queue)), key=lambda idx: queue[idx][:4])
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
    except joint.DeadlineExceeded:
        pass
    return best


def _settle_rest(records: list[ComboRecord], lb: float, combo: Combo, queue: list, status: str) -> int:
    """Record the popped choice and every choice still queued with `status`; how many that is."""
    for bound, choice in [(lb, combo)] + [(item[0], item[5]) for item in queue]:
        records.append(ComboRecord(choice.P, choice.b, choice.D, bound, status))
    return 1 + len(queue)


def _tight_bound(inp: joint.JointInputs, objective: str, min_its: float | None, target: float | None = None,
                 exact: bool = True, strongest: bool = False) -> float:
    """The medium (`exact=False`: Hall counts, no DP) or strong (`exact=True`: dynamic programs over
    stages, `joint.stages_fit_dp`) bounds of one outer choice; +inf when it is infeasible by them.
    `target` (an objective value to rule out, e.g. from the incumbent) lets the search stop early.
    For min cost the time bound only has to rule out the minimum throughput; the strong time bound
    is skipped when the cost bounds alone reach the target (it costs more than they do).
    `strongest` (max throughput, with a target): the replica-level DPs of the time bound too."""
    floor_s = None if min_its is None else 1 / min_its
    if objective != "min_cost":
        t_lb = joint.time_lower_bound_tight_s(inp, exact, target, strongest)
        return float("inf") if t_lb == float("inf") or (floor_s is not None and t_lb > floor_s) else t_lb
    t_lb = joint.time_lower_bound_tight_s(inp, False, floor_s)
    if t_lb == float("inf") or (floor_s is not None and t_lb > floor_s):
        return float("inf")
    cost = joint.cost_lower_bound_usd(inp, exact, t_lb)
    if not exact or (target is not None and cost >= target):
        return cost
    t_lb = joint.time_lower_bound_tight_s(inp, True, floor_s)
    if t_lb == float("inf") or (floor_s is not None and t_lb > floor_s):
        return float("inf")
    return max(cost, t_lb * joint.rate_lower_bound_usd_per_s(inp))


def _best_heuristic(inp: joint.JointInputs, objective: str, max_cost: float | None,
                    min_its: float | None, dp: bool = True) -> tuple[float, joint.JointSolution] | None:
    """The best of the speed-first and cost-first greedy and (with `dp`, blocks form) the stage DP
    heuristic that meets the limits, with its objective."""
    best = None
    for order in ("speed", "cost"):
        g = joint.greedy(inp, order)
        if g is None:
            continue
        obj = joint.objective_within_limits(inp, g, objective, max_cost, min_its)
        if obj is not None:
            best = joint.better(best, (obj, g))
    if dp:
        found = joint.dp_heuristic(inp, objective, max_cost, min_its, joint.bottleneck_lower_bound_s(inp))
        best = joint.better(best, found)
    return joint.polish(inp, best, objective, max_cost, min_its)


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
    return f"no plan satisfies {limits} over {len(records)} outer choices (P, b, D)"
