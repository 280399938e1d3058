"""A re-implementation of Sailor's planner (SOSP'25, seed 000, sec. 4.2) over hetplan's estimators.

Only the *search* is Sailor's: every candidate is scored with hetplan's estimators (in the dynamic
program) and with `hetplan.simulator.simulate` (to pick, stop and check constraints), the same code
that scores hetplan's own plans, so a comparison with `hetplan.orchestration.planner.plan` measures the search alone.
Written from the paper's text (sec. 4.2.1-4.2.3, Listing 1), not from Sailor's code.

Search, outermost first:

1. P, pipeline depth: the divisors of the number of transformer blocks up to `max_stages`; layers
   are split *uniformly* (P | L blocks per stage, the embedding joins stage 0, the head the last stage,
   as Megatron does). Sailor does not balance layers across heterogeneous stages.
2. b, microbatch size, from `microbatch_sizes` (those dividing the global batch B).
3. H1 + H2, TP per (stage, GPU type): TP only inside a node, so a TP degree must divide every node
   size of the type; the *minimum* TP at which one worker of stage i fits in memory with P - i
   microbatches in flight (1F1B warm-up, the worst case for any D) and no ZeRO sharding (dp = 1, again
   independent of D and of availability). The first GPU type (in hetplan's sorted type order) keeps
   that minimum; any other type is doubled while doubling speeds its stage step up by >= `tp_speedup`
   (1.5x): the scaling heuristic of sec. 4.2 ("based on memory constraints and scaling heuristics").
4. Region combinations: every non-empty subset of the cluster's regions (H6: the zones of a region
   are one pool of GPUs); the DP only places stages in the chosen regions.
5. D, data-parallel degree, the same on every stage, D | B / b (so m = B / (D b) is whole):
   H3 (max throughput): from the largest D the resources allow, decreasing, stopping at the first
   D whose simulated throughput does not improve on the previous valid one;
   H4 (min cost): increasing, stopping at the first D whose simulated cost does not decrease.
   D values whose plan breaks a constraint are skipped, not counted as "not improving".
6. Listing 1, `solve_dp(i, R, region, C)`: for stage i, every split of D replicas over the GPU types
   usable on the stage (each with the stage's TP), placed in the first region, starting from the
   previous stage's region, that still holds it (H5: a stage's DP traffic stays in one region);
   recursion on the rest of the pipeline with the remaining resources, memoised on
   (i, remaining GPUs per (type, region), region); an answer found under a budget is reused under a
   smaller one when it fits that one too (`_memo_lookup`). A sub-pipeline is scored as a whole
   1F1B iteration: sum of stage steps + boundary transfers + (m - 1) x straggler + max sync + max
   update (sec. 4.3), all from hetplan's estimators on representative nodes. With a budget C the
   stage cost uses Eq. 2 (C_comp x m x t_straggler + C_comm) and the straggler-guess loop of lines
   17-32; the reverse problem (min cost under a throughput floor, omitted in the paper "for brevity")
   is the same recursion minimising rate x T + egress among sub-pipelines with T <= 1 / min_its.
7. Each D's DP result is turned into a plan (replicas packed onto nodes of their region, larger TP
   first, a stage's replicas kept in the zones it already uses where possible) and simulated; a plan
   is valid when no rank is OOM and the simulated cost / throughput meet the constraints. The best
   valid plan by the objective is returned.

Known limits, kept on purpose: uniform layers, one D for all stages, TP fixed per (stage, type) before
the DP, greedy region choice, zones merged (a stage may end up spanning zones; the simulator charges
that), the DP's sub-pipeline objective is not decomposable (so the DP is a heuristic), and the
number of replica splits grows as D^(types - 1) per stage (the 3-type case is slow, as in sec. 5.3).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Iterable

from hetplan.errors import EstimatorError, InfeasibleError, InstanceError
from hetplan.estimators import Endpoint, EstimatorSet, build_estimators
from hetplan.estimators.model_stats import DTYPE_BYTES, boundary_activation_bytes, sync_volume_factor, unit_params
from hetplan.instance import Instance, Node
from hetplan.plan import Plan, Replica, Stage
from hetplan.simulator import SimulationReport, simulate

OBJECTIVES = ("max_throughput", "min_cost")


@dataclass(frozen=True)
class SailorOptions:
    max_stages: int = 16  # same default as hetplan.orchestration.planner.PlannerOptions
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    tp_choices: tuple[int, ...] = (1, 2, 4, 8)
    tp_speedup: float = 1.5  # H2 scaling rule for the non-first GPU types
    time_limit_s: float | None = None  # stop the search and return the best plan so far


@dataclass(frozen=True)
class StageChoice:
    """One stage of a DP solution: its region and (gpu type, tp, replicas) per used type."""

    region: str
    groups: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Candidate:
    """One simulated plan of the search (one outer choice P, b, regions, D)."""

    P: int
    b: int
    D: int
    regions: tuple[str, ...]
    stages: tuple[StageChoice, ...]
    plan: Plan
    report: SimulationReport
    valid: bool
    dp_time_s: float  # the DP's own estimate of the iteration time


@dataclass
class SailorResult:
    plan: Plan
    report: SimulationReport
    objective: str
    search_s: float
    candidates: list[Candidate] = field(default_factory=list)
    dp_calls: int = 0
    stage_evals: int = 0
    timed_out: bool = False


class _Timeout(Exception):
    pass


# ---- a sub-pipeline as the DP sees it ---------------------------------------------------------------
@dataclass(frozen=True)
class _Part:
    """Stages i..P-1 of a pipeline: the figures a 1F1B iteration time and Eq. 2's cost are made of."""

    stages: tuple[StageChoice, ...]
    sum_step_s: float
    straggler_s: float
    sum_link_s: float  # activation + gradient transfers over the boundaries inside the part
    max_link_s: float  # slowest one-direction transfer (links are full duplex)
    max_sync_s: float
    max_update_s: float
    rate_usd_per_s: float
    egress_usd: float

    def time_s(self, m: int) -> float:
        return (self.sum_step_s + self.sum_link_s + (m - 1) * max(self.straggler_s, self.max_link_s)
                + self.max_sync_s + self.max_update_s)

    def cost_eq2_usd(self, m: int) -> float:
        """Sailor's Eq. 2: sum_i C_comp_i x N_batches x t_straggler + C_comm."""
        return self.rate_usd_per_s * m * self.straggler_s + self.egress_usd

    def cost_usd(self, m: int) -> float:
        return self.rate_usd_per_s * self.time_s(m) + self.egress_usd


@dataclass(frozen=True)
class _StageEval:
    step_s: float
    sync_s: float
    update_s: float
    rate_usd_per_s: float


# ---- the search -------------------------------------------------------------------------------------
class _Search:
    def __init__(self, instance: Instance, est: EstimatorSet, objective: str, max_cost: float | None,
                 min_its: float | None, opts: SailorOptions):
        self.inst, self.est, self.objective, self.opts = instance, est, objective, opts
        self.max_cost, self.min_its = max_cost, min_its
        self.t_max = 1 / min_its if min_its else None
        self.arch, self.wl = instance.model_arch, instance.workload
        self.B = self.wl.global_batch_size
        self.deadline = None if opts.time_limit_s is None else time.perf_counter() + opts.time_limit_s
        self.grad_bytes_per_param = DTYPE_BYTES[self.wl.precision]
        self.sync_factor = sync_volume_factor(self.wl.zero_stage)
        self._pools()
        self.dp_calls = self.stage_evals = 0

    # -- resources (H6: a region is one pool per GPU type) -------------------------------------------
    def _pools(self) -> None:
        c = self.inst.constraints
        nodes: dict[tuple[str, str], list[Node]] = {}
        price: dict[tuple[str, str], float] = {}
        for n in self.inst.nodes:
            if not c.allows(n.gpu_type, n.zone):
                continue
            key = (n.gpu_type, n.region)
            nodes.setdefault(key, []).append(n)
            price[key] = max(price.get(key, 0.0), n.price_per_gpu_hour_usd)
        if not nodes:
            raise InfeasibleError("no GPUs are available under allowed_gpu_types / allowed_zones")
        for key in nodes:  # zones in name order, nodes in file order: the H6 merge of a region's zones
            nodes[key].sort(key=lambda n: n.zone)
        self.nodes, self.price = nodes, price
        self.keys = sorted(nodes)  # index of the resource vector R
        self.key_index = {k: j for j, k in enumerate(self.keys)}
        self.types = [g for g in self.inst.gpu_types if any(k[0] == g for k in self.keys)]
        self.regions = sorted({k[1] for k in self.keys})
        self.node_size = {g: [n.num_gpus for k in self.keys if k[0] == g for n in nodes[k]] for g in self.types}

    def _check_time(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise _Timeout

    # -- 1. uniform layer split ------------------------------------------------------------------------
    def stage_depths(self) -> list[int]:
        L = self.arch.num_layers
        return [P for P in range(1, min(L, self.opts.max_stages) + 1) if L % P == 0]

    def uniform_ranges(self, P: int) -> list[tuple[int, int]]:
        per = self.arch.num_layers // P
        ranges = []
        for i in range(P):
            start = 0 if i == 0 else 1 + i * per
            end = self.arch.num_units if i == P - 1 else 1 + (i + 1) * per
            ranges.append((start, end))
        return ranges

    # -- 3. H1 + H2 --------------------------------------------------------------------------------------
    def _step_s(self, g: str, units: range, b: int, tp: int) -> float | None:
        try:
            return sum(self.est.time.layer_time(g, u, b, tp).total_s for u in units)
        except EstimatorError:  # e.g. a TP degree the profile never measured
            return None

    def _tp_options(self, g: str) -> list[int]:
        sizes = self.node_size[g]
        return [t for t in sorted(self.opts.tp_choices) if all(n % t == 0 for n in sizes)]  # H1

    def _fits(self, g: str, units: range, tp: int, b: int, in_flight: int) -> bool:
        mem = self.est.memory.worker_memory(g, units, tp, b, 1, in_flight)
        return not mem.oom

    def stage_tp(self, P: int, b: int, ranges: list[tuple[int, int]]) -> list[dict[str, int]]:
        """tp[i][g] for the types usable on stage i (H2: minimum that fits; scaling rule above it)."""
        out = []
        for i, (s, e) in enumerate(ranges):
            units, row = range(s, e), {}
            for rank, g in enumerate(self.types):
                options = [t for t in self._tp_options(g) if self._step_s(g, units, b, t) is not None]
                fitting = [t for t in options if self._fits(g, units, t, b, P - i)]
                if not fitting:
                    continue
                tp = fitting[0]
                if rank > 0:
                    while tp * 2 in options and self._step_s(g, units, b, tp * 2) * self.opts.tp_speedup \
                            <= self._step_s(g, units, b, tp):
                        tp *= 2
                row[g] = tp
            out.append(row)
        return out

    # -- estimates for one stage and one boundary ----------------------------------------------------------
    def _endpoints(self, g: str, region: str, tp: int, count: int) -> list[Endpoint]:
        """Representative placement: replicas packed onto the type's nodes of the region, in order."""
        out = []
        nodes = self.nodes[(g, region)]
        gpu = 0
        for _ in range(count):
            node = _node_at(nodes, gpu)
            out.append(Endpoint(node.zone, node.region, node.node_id, node.intra_node))
            gpu += tp
        return out

    def _boundary(self, a: StageChoice, b: StageChoice, bsz: int, D: int, m: int) -> tuple[float, float, float]:
        """(fwd + bwd transfer s, slowest one-direction s, egress USD per iteration) of one boundary."""
        ga, ta, _ = a.groups[0]
        gb = b.groups[0][0]
        src = self._endpoints(ga, a.region, ta, 1)[0]
        last = len(self.nodes[(gb, b.region)]) - 1
        dst_node = self.nodes[(gb, b.region)][last if (ga, a.region) == (gb, b.region) and last > 0 else 0]
        dst = Endpoint(dst_node.zone, dst_node.region, dst_node.node_id, dst_node.intra_node)
        nbytes = boundary_activation_bytes(self.arch, bsz, self.wl.precision)
        fwd, bwd = self.est.comm.p2p_time_s(src, dst, nbytes), self.est.comm.p2p_time_s(dst, src, nbytes)
        egress = 2 * m * D * self.est.cost.egress_usd(src, dst, nbytes) if a.region != b.region else 0.0
        return fwd + bwd, max(fwd, bwd), egress


class _Shape:
    """Everything fixed by (P, b, D): ranges, TP per stage, and caches of stage estimates."""

    def __init__(self, s: _Search, P: int, b: int, ranges: list[tuple[int, int]], tp: list[dict[str, int]]):
        self.s, self.P, self.b, self.ranges, self.tp = s, P, b, ranges, tp
        self.step = [{g: s._step_s(g, range(*ranges[i]), b, t) for g, t in tp[i].items()} for i in range(P)]
        self.grad_bytes = [sum(unit_params(s.arch, u).total for u in range(*r)) * s.grad_bytes_per_param
                           for r in ranges]

    def set_D(self, D: int) -> None:
        self.D, self.m = D, self.s.B // (D * self.b)
        self._stage_cache: dict = {}
        self._boundary_cache: dict = {}
        self.memo: dict = {}
        # generate_combos (Listing 1, line 2): every split of D replicas over the stage's usable types
        self.combos = [list(_splits(D, list(self.tp[i]))) for i in range(self.P)]

    def stage(self, i: int, choice: StageChoice) -> _StageEval:
        key = (i, choice)
        hit = self._stage_cache.get(key)
        if hit is not None:
            return hit
        s = self.s
        s.stage_evals += 1
        units = range(*self.ranges[i])
        members: list[Endpoint] = []
        for g, t, n in choice.groups:
            members += s._endpoints(g, choice.region, t, n)
        min_tp = min(t for _, t, _ in choice.groups)
        sync = s.est.comm.allreduce_time_s(members, s.sync_factor * self.grad_bytes[i] / min_tp) if self.D > 1 else 0.0
        ev = _StageEval(
            step_s=max(self.step[i][g] for g, _, _ in choice.groups),
            sync_s=sync,
            update_s=max(s.est.time.update_time_s(g, units, t, self.D) for g, t, _ in choice.groups),
            rate_usd_per_s=sum(s.price[(g, choice.region)] * t * n for g, t, n in choice.groups) / 3600)
        self._stage_cache[key] = ev
        return ev

    def boundary(self, a: StageChoice, b: StageChoice) -> tuple[float, float, float]:
        key = (a.region, a.groups[0][:2], b.region, b.groups[0][:2])
        if key not in self._boundary_cache:
            self._boundary_cache[key] = self.s._boundary(a, b, self.b, self.D, self.m)
        return self._boundary_cache[key]


def _node_at(nodes: list[Node], gpu_offset: int) -> Node:
    for n in nodes:
        if gpu_offset < n.num_gpus:
            return n
        gpu_offset -= n.num_gpus
    return nodes[-1]  # not reached: callers ask for no more GPUs than the region has


def _splits(D: int, types: list[str]) -> Iterable[tuple[tuple[str, int], ...]]:
    """All (type, replicas > 0) tuples with replicas summing to D."""
    if not types:
        return
    for counts in _compositions(D, len(types)):
        yield tuple((g, n) for g, n in zip(types, counts) if n > 0)


def _compositions(total: int, parts: int) -> Iterable[tuple[int, ...]]:
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


# ---- Listing 1 --------------------------------------------------------------------------------------
def _better(s: _Search, a: _Part | None, b: _Part, m: int) -> _Part:
    if a is None:
        return b
    if s.objective == "min_cost":
        ka, kb = (a.cost_usd(m), a.time_s(m)), (b.cost_usd(m), b.time_s(m))
    else:
        ka, kb = (a.time_s(m), a.cost_usd(m)), (b.time_s(m), b.cost_usd(m))
    return b if kb < ka else a


def _join(sh: _Shape, choice: StageChoice, ev: _StageEval, rest: _Part | None) -> _Part:
    if rest is None:
        return _Part((choice,), ev.step_s, ev.step_s, 0.0, 0.0, ev.sync_s, ev.update_s, ev.rate_usd_per_s, 0.0)
    both, one_way, egress = sh.boundary(choice, rest.stages[0])
    return _Part((choice, *rest.stages), ev.step_s + rest.sum_step_s, max(ev.step_s, rest.straggler_s),
                 both + rest.sum_link_s, max(one_way, rest.max_link_s), max(ev.sync_s, rest.max_sync_s),
                 max(ev.update_s, rest.max_update_s), ev.rate_usd_per_s + rest.rate_usd_per_s,
                 egress + rest.egress_usd)


def _region_fits(s: _Search, sh: _Shape, i: int, split, R: tuple[int, ...], curr: str,
                 regions: tuple[str, ...]) -> str | None:
    """find_region_fits: the first region, from the previous stage's onwards, holding the split."""
    start = regions.index(curr)
    for region in regions[start:] + regions[:start]:
        if all((g, region) in s.nodes and n * sh.tp[i][g] <= R[s.key_index[(g, region)]] for g, n in split):
            return region
    return None


def solve_dp(s: _Search, sh: _Shape, i: int, R: tuple[int, ...], curr: str, regions: tuple[str, ...],
             budget: float | None) -> _Part | None:
    key = (i, R, curr)
    hit = _memo_lookup(sh.memo.get(key, ()), sh.m, budget)
    if hit is not None:
        return hit[0]
    s.dp_calls += 1
    s._check_time()
    m, best = sh.m, None
    for split in sh.combos[i]:
        region = _region_fits(s, sh, i, split, R, curr, regions)
        if region is None:
            continue
        choice = StageChoice(region, tuple((g, sh.tp[i][g], n) for g, n in split))
        ev = sh.stage(i, choice)
        if i == sh.P - 1:
            part = _join(sh, choice, ev, None)
            if _admissible(s, part, m, budget):
                best = _better(s, best, part, m)
            continue
        left = list(R)
        for g, t, n in choice.groups:
            left[s.key_index[(g, region)]] -= t * n
        left_t = tuple(left)
        if budget is None:
            rest = solve_dp(s, sh, i + 1, left_t, region, regions, None)
            if rest is not None:
                part = _join(sh, choice, ev, rest)
                if _admissible(s, part, m, None):
                    best = _better(s, best, part, m)
            continue
        # sec. 4.2.3, Listing 1 lines 17-32: guess that stage i is the straggler, give the rest what is
        # left of the budget, and re-solve with the rest's straggler until the guess holds
        assumed = ev.step_s
        remaining = budget - ev.rate_usd_per_s * m * assumed
        while remaining > 0:
            rest = solve_dp(s, sh, i + 1, left_t, region, regions, remaining)
            if rest is None:
                break
            part = _join(sh, choice, ev, rest)
            if _admissible(s, part, m, budget):
                best = _better(s, best, part, m)
            if rest.straggler_s <= assumed:
                break
            assumed = rest.straggler_s
            remaining = budget - ev.rate_usd_per_s * m * assumed
    sh.memo.setdefault(key, []).append((math.inf if budget is None else budget, best))
    return best


def _memo_lookup(entries, m: int, budget: float | None) -> tuple[_Part | None] | None:
    """Reuse a sub-pipeline solved under a budget at least as large: its answer stands when it is
    also within this budget (or when nothing fitted even the larger one). Listing 1 tabulates
    T_iter[P][i][R] with no budget dimension; this keeps the table's reuse and the answers admissible.
    For the last stage the reuse is exact; for earlier ones the straggler-guess loop makes it a heuristic."""
    limit = math.inf if budget is None else budget
    for stored, part in sorted(entries, key=lambda e: e[0]):
        if stored >= limit and (part is None or part.cost_eq2_usd(m) <= limit):
            return (part,)
    return None


def _admissible(s: _Search, part: _Part, m: int, budget: float | None) -> bool:
    if budget is not None and part.cost_eq2_usd(m) > budget:
        return False
    # a sub-pipeline's time only grows as stages are added, so this prunes soundly
    return s.t_max is None or part.time_s(m) <= s.t_max


# ---- from a DP result to a simulated plan ---------------------------------------------------------------
def materialize(s: _Search, sh: _Shape, stages: tuple[StageChoice, ...], name: str) -> Plan | None:
    """Pack replicas onto nodes: larger TP first (sizes dividing the node size then never fragment),
    a stage's replicas in the zones it already uses when they have room."""
    free = {n.node_id: n.num_gpus for nodes in s.nodes.values() for n in nodes}
    requests = [(i, g, t, stage.region) for i, stage in enumerate(stages) for g, t, n in stage.groups for _ in range(n)]
    requests.sort(key=lambda r: -r[2])  # stable: stage order kept within one TP degree
    placed: dict[int, list[Replica]] = {i: [] for i in range(len(stages))}
    zones_of: dict[int, set[str]] = {i: set() for i in range(len(stages))}
    for i, g, t, region in requests:
        nodes = [n for n in s.nodes[(g, region)] if free[n.node_id] >= t]
        if not nodes:
            return None
        own = [n for n in nodes if n.zone in zones_of[i]]
        node = (own or nodes)[0]
        free[node.node_id] -= t
        zones_of[i].add(node.zone)
        placed[i].append(Replica(gpu_type=g, tp=t, zone=node.zone, node=node.node_id))
    out = []
    for i, (start, end) in enumerate(sh.ranges):
        reps = sorted(placed[i], key=lambda r: (r.gpu_type, r.zone, r.node))
        out.append(Stage(layer_start=start, layer_end=end, replicas=tuple(reps)))
    return Plan(name=name, instance=s.inst.name, schedule="1F1B", num_microbatches=sh.m, micro_batch_size=sh.b,
                stages=tuple(out))


def _valid(s: _Search, rep: SimulationReport) -> bool:
    if rep.oom_ranks:
        return False
    if s.max_cost is not None and rep.cost_per_iteration_usd > s.max_cost * (1 + 1e-9):
        return False
    if s.min_its is not None and rep.iters_per_s < s.min_its * (1 - 1e-9):
        return False
    mg = s.inst.constraints.max_gpus
    return mg is None or rep.num_gpus <= mg


def _score(s: _Search, rep: SimulationReport) -> float:
    """Lower is better."""
    return rep.cost_per_iteration_usd if s.objective == "min_cost" else rep.iteration_time_s


def _max_D(s: _Search, P: int, tp: list[dict[str, int]], regions: tuple[str, ...]) -> int:
    """Largest D the chosen regions could hold (each type at its smallest TP over the stages)."""
    tp_min = {g: min(row[g] for row in tp if g in row) for g in s.types if any(g in row for row in tp)}
    per_region = {r: sum(len_gpus(s, g, r) // tp_min[g] for g in tp_min) for r in regions}
    total = sum(per_region.values())
    return min(total // P, max(per_region.values()))


def len_gpus(s: _Search, g: str, region: str) -> int:
    return sum(n.num_gpus for n in s.nodes.get((g, region), []))


def _search(s: _Search) -> tuple[list[Candidate], bool]:
    candidates: list[Candidate] = []  # filled as plans are simulated, so a timeout keeps them
    try:
        for P in s.stage_depths():
            ranges = s.uniform_ranges(P)
            for b in s.opts.microbatch_sizes:
                if s.B % b:
                    continue
                tp = s.stage_tp(P, b, ranges)
                if any(not row for row in tp):
                    continue  # some stage fits on no GPU type at any TP (H2)
                sh = _Shape(s, P, b, ranges, tp)
                for k in range(1, len(s.regions) + 1):
                    for regions in itertools.combinations(s.regions, k):
                        _sweep_D(s, sh, regions, candidates)
    except _Timeout:
        return candidates, True
    return candidates, False


def _sweep_D(s: _Search, sh: _Shape, regions: tuple[str, ...], out: list[Candidate]) -> None:
    """H3 / H4 over the data-parallel degree for one (P, b, region combination)."""
    d_max = _max_D(s, sh.P, sh.tp, regions)
    Ds = [D for D in range(1, d_max + 1) if (s.B // sh.b) % D == 0]
    Ds.sort(reverse=s.objective != "min_cost")
    R0 = tuple(len_gpus(s, g, r) if r in regions else 0 for g, r in s.keys)
    last = None
    for D in Ds:
        sh.set_D(D)
        part = solve_dp(s, sh, 0, R0, regions[0], regions, s.max_cost)
        if part is None:
            continue
        plan = materialize(s, sh, part.stages, f"{s.inst.name}-sailor")
        if plan is None:
            continue
        rep = simulate(s.inst, plan, s.est)
        ok = _valid(s, rep)
        out.append(Candidate(sh.P, sh.b, D, regions, part.stages, plan, rep, ok, part.time_s(sh.m)))
        if not ok:
            continue
        if last is not None and _score(s, rep) >= last:
            break  # H3 / H4: the first non-improving degree ends the sweep
        last = _score(s, rep)


# ---- entry points -------------------------------------------------------------------------------------
def sailor_search(instance: Instance, estimators: EstimatorSet | None = None, objective: str | None = None,
                  max_cost: float | None = None, min_iters_per_s: float | None = None,
                  options: SailorOptions | None = None) -> SailorResult:
    """Run the baseline and return its best plan with the simulator's report and search statistics."""
    t0 = time.perf_counter()
    objective = objective or instance.objective.kind
    if objective not in OBJECTIVES:
        raise InstanceError(f"unknown objective {objective!r}; expected one of {list(OBJECTIVES)}", "objective")
    c = instance.constraints
    max_cost = max_cost if max_cost is not None else c.max_cost_per_iteration_usd
    min_its = min_iters_per_s if min_iters_per_s is not None else c.min_throughput_iters_per_s
    for value, name in ((max_cost, "max_cost"), (min_its, "min_iters_per_s")):
        if value is not None and not value > 0:
            raise InstanceError(f"must be > 0, got {value}", name)
    s = _Search(instance, estimators or build_estimators(instance), objective, max_cost, min_its,
                options or SailorOptions())
    candidates, timed_out = _search(s)
    valid = [cand for cand in candidates if cand.valid]
    if not valid:
        why = "the time limit ran out" if timed_out else "no candidate"
        limits = [f"max_cost_per_iteration_usd={max_cost}" if max_cost is not None else "",
                  f"min_throughput_iters_per_s={min_its}" if min_its is not None else ""]
        limits = " and ".join(x for x in limits if x) or "the memory and quota constraints"
        raise InfeasibleError(f"Sailor baseline: {why} among {len(candidates)} simulated plans satisfies {limits}")
    best = min(valid, key=lambda cand: (_score(s, cand.report), cand.P, cand.D))
    plan = best.plan.model_copy(update={"metadata": {
        "planner": "sailor-baseline", "objective": objective, "P": best.P, "b": best.b, "D": best.D,
        "regions": list(best.regions), "tp": [[list(g) for g in st.groups] for st in best.stages],
        "candidates": len(candidates), "timed_out": timed_out}})
    return SailorResult(plan=plan, report=best.report, objective=objective, search_s=time.perf_counter() - t0,
                        candidates=candidates, dp_calls=s.dp_calls, stage_evals=s.stage_evals, timed_out=timed_out)


def sailor_plan(instance: Instance, estimators: EstimatorSet | None, objective: str | None,
                max_cost: float | None = None, min_iters_per_s: float | None = None,
                options: SailorOptions | None = None) -> tuple[Plan, float]:
    """Sailor's planner: (best plan, search seconds). Raises InfeasibleError when nothing is valid."""
    res = sailor_search(instance, estimators, objective, max_cost, min_iters_per_s, options)
    return res.plan, res.search_s
