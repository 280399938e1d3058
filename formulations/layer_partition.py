"""Layer partitioning: contiguous layer ranges over an ordered pipeline of (heterogeneous) stages.

AutoHet eq. (4) (seed 002, sec. III-C) splits layers over a pipeline's GPUs to balance compute
under per-GPU memory MEM_F(l_i) + MEM_V(l_i, p_i) <= m_i, where the variable (activation) part
depends on the stage index p_i; Sailor (seed 000, sec. 4.2-4.3) scores a pipeline by
T_iter = sum_i t_i + N_batches t_straggler + max_i t_sync_i; Zorse (seed 001, sec. 4.2) lets a
stage hold GPUs of different types that take uneven shares of each microbatch. This model does
all three at once for a given stage order and replica set:

Sets
  U = {0..U-1}   layer units: 0 = embedding, 1..U-2 = blocks, U-1 = head (own costs, like any unit)
  I = {0..P-1}   stages in pipeline order;  R_i replicas of stage i (GPU type, TP degree)
  B_ir           allowed microbatch shares of replica r of stage i ({fixed} or 1..G-R_i+1)
Parameters (plain numbers, `LayerPartitionInputs`)
  t[i,r,b,u]     fwd + bwd seconds of unit u for a share of b sequences on replica r of stage i
  f[i,r,u]       static bytes of unit u on one worker of (i, r): params + grads + optimizer states
  a[i,r,b,u]     activation bytes of unit u kept per in-flight microbatch (share b)
  cap[i,r]       usable bytes of one worker;  nf_i = min(P - i, m) (1F1B) or m (GPipe) in flight
  G              global microbatch (sequences per pipeline step); m microbatches per iteration
  p2p[i]         seconds to move one microbatch's activations over boundary i -> i+1 (one way)
  s0[i], s[i,u]  gradient sync + optimizer update of stage i: s0[i] + sum_u s[i,u] (affine fit)
Variables
  c[u,i] in {0,1}, i = 1..P-1: unit u sits on stage >= i  (c[u,0] = 1, c[u,P] = 0 implied)
  x(u,i) = c[u,i] - c[u,i+1]  unit u on stage i (an expression, 0/1 by the staircase below)
  w[i,r,b] in {0,1}: replica r of stage i takes share b (only for replicas without a fixed share)
  tau[i] >= 0 stage step time; theta >= 0 steady-state bottleneck; sigma >= 0 sync tail; T >= 0
Constraints
  staircase:  c[u,i+1] <= c[u,i];  c[u,i] <= c[u+1,i]        (ranges contiguous, stages in order)
  ends:       c[0,1] = 0 (unit 0 on stage 0);  c[U-1,P-1] = 1 (last unit on the last stage)
  non-empty:  sum_u x(u,i) >= 1
  share:      sum_b w[i,r,b] = 1;   sum_r share(i,r) = G, share(i,r) = sum_b b w[i,r,b] or fixed
  straggler:  tau[i] >= sum_u t[i,r,b,u] x(u,i) - Mt[i,r,b] (1 - w[i,r,b])   (w = 1 for a fixed share)
  memory:     sum_u (f[i,r,u] + nf_i a[i,r,b,u]) x(u,i) <= cap[i,r] + Mm[i,r,b] (1 - w[i,r,b])
  bottleneck: theta >= tau[i];  theta >= p2p[i]               (a slow link is a pipeline stage too)
  tail:       sigma >= s0[i] + sum_u s[i,u] x(u,i)
  time:       T = sum_i tau[i] + 2 sum_i p2p[i] + (m - 1) theta + sigma     (Sailor's T_iter, 1F1B)
Objective
  "iteration": min T;   "bottleneck": min theta (AutoHet eq. 4a: balance the slowest stage)
Big-M's are the largest value the left side can take (sum over all units), so they are valid and
as tight as the data allows. Memory rows use GiB, time rows seconds (numerics).

Greedy (warm start, Zorse sec. 4.3.3): shares by min-max allocation (one sequence at a time to the
replica whose whole-model time grows least), layers proportional to each stage's speed, then
boundaries moved away from stages that do not fit in memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, product
from types import MappingProxyType
from typing import Any, Literal, Mapping, Sequence

import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.formulations.common import (
    FormulationInputError,
    assignment,
    require,
    require_finite_positive,
    require_int,
    rounded,
    var_value,
)

GIB = float(1024**3)
Objective = Literal["iteration", "bottleneck"]


# ---- inputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaCosts:
    """Costs of one replica (a TP group of one GPU type) for every share it may take."""

    gpu_type: str
    tp: int
    capacity_bytes: float  # usable bytes of one worker (capacity - framework overhead)
    static_bytes: tuple[float, ...]  # f[u]: params + grads + optimizer of unit u on one worker
    time_s: Mapping[int, tuple[float, ...]]  # share b -> t[b][u]
    activation_bytes: Mapping[int, tuple[float, ...]]  # share b -> a[b][u] per in-flight microbatch
    fixed_share: int | None = None  # None: the model chooses the share (Zorse's uneven microbatches)
    zone: str | None = None
    node: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_s", MappingProxyType(dict(self.time_s)))
        object.__setattr__(self, "activation_bytes", MappingProxyType(dict(self.activation_bytes)))

    @property
    def shares(self) -> tuple[int, ...]:
        return (self.fixed_share,) if self.fixed_share is not None else tuple(sorted(self.time_s))


@dataclass(frozen=True)
class LayerPartitionInputs:
    num_units: int  # U (embedding + blocks + head)
    stages: tuple[tuple[ReplicaCosts, ...], ...]  # stage i -> its replicas
    global_microbatch: int  # G
    num_microbatches: int  # m
    p2p_s: tuple[float, ...] = ()  # P - 1 boundaries (empty: no transfer cost)
    sync_fixed_s: tuple[float, ...] = ()  # s0[i] (empty: 0)
    sync_unit_s: tuple[tuple[float, ...], ...] = ()  # s[i][u] (empty: 0)
    schedule: Literal["1F1B", "GPipe"] = "1F1B"
    objective: Objective = "iteration"

    def __post_init__(self) -> None:
        U, P = self.num_units, len(self.stages)
        require_int(U, "num_units", minimum=1)
        require(P >= 1, "at least one stage is needed", "stages")
        require(P <= U, f"{P} stages cannot each hold one of {U} layer units", "stages")
        require_int(self.global_microbatch, "global_microbatch", minimum=1)
        require_int(self.num_microbatches, "num_microbatches", minimum=1)
        require(self.schedule in ("1F1B", "GPipe"), f"unknown schedule {self.schedule!r}", "schedule")
        require(self.objective in ("iteration", "bottleneck"), f"unknown objective {self.objective!r}", "objective")
        for i, reps in enumerate(self.stages):
            require(len(reps) >= 1, "a stage needs at least one replica", f"stages[{i}]")
            for r, rep in enumerate(reps):
                self._check_replica(rep, f"stages[{i}][{r}]")
            fixed = sum(rep.fixed_share for rep in reps if rep.fixed_share is not None)
            free = [rep for rep in reps if rep.fixed_share is None]
            lo = fixed + sum(min(rep.shares) for rep in free)
            hi = fixed + sum(max(rep.shares) for rep in free)
            require(lo <= self.global_microbatch <= hi,
                    f"replica shares can sum to {lo}..{hi}, not to global_microbatch {self.global_microbatch}",
                    f"stages[{i}]")
        self._check_vector(self.p2p_s, P - 1, "p2p_s")
        self._check_vector(self.sync_fixed_s, P, "sync_fixed_s")
        require(len(self.sync_unit_s) in (0, P), f"needs {P} rows, got {len(self.sync_unit_s)}", "sync_unit_s")
        for i, row in enumerate(self.sync_unit_s):
            self._check_vector(row, U, f"sync_unit_s[{i}]")

    def _check_replica(self, rep: ReplicaCosts, where: str) -> None:
        U = self.num_units
        require_int(rep.tp, f"{where}.tp", minimum=1)
        require_finite_positive(rep.capacity_bytes, f"{where}.capacity_bytes")
        self._check_vector(rep.static_bytes, U, f"{where}.static_bytes")
        if rep.fixed_share is not None:
            require_int(rep.fixed_share, f"{where}.fixed_share", minimum=1)
        require(len(rep.time_s) > 0, "no share has times", f"{where}.time_s")
        for b in rep.shares:
            require(b in rep.time_s, f"no times for share {b}", f"{where}.time_s")
            require(b in rep.activation_bytes, f"no activation bytes for share {b}", f"{where}.activation_bytes")
        for b, row in rep.time_s.items():
            require_int(b, f"{where}.time_s (share key)", minimum=1)
            self._check_vector(row, U, f"{where}.time_s[{b}]")
        for b, row in rep.activation_bytes.items():
            self._check_vector(row, U, f"{where}.activation_bytes[{b}]")

    @staticmethod
    def _check_vector(values: Sequence[float], n: int, where: str) -> None:
        if len(values) == 0:
            return
        require(len(values) == n, f"needs {n} values, got {len(values)}", where)
        for j, v in enumerate(values):
            require_finite_positive(v, f"{where}[{j}]", allow_zero=True)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def in_flight(self, stage: int) -> int:
        """Microbatches whose activations stage i keeps at once: 1F1B min(P - i, m), GPipe m."""
        m = self.num_microbatches
        return min(self.num_stages - stage, m) if self.schedule == "1F1B" else m

    def p2p(self, i: int) -> float:
        return self.p2p_s[i] if self.p2p_s else 0.0

    def sync(self, i: int, units: range) -> float:
        fixed = self.sync_fixed_s[i] if self.sync_fixed_s else 0.0
        per_unit = sum(self.sync_unit_s[i][u] for u in units) if self.sync_unit_s else 0.0
        return fixed + per_unit


# ---- typed result -----------------------------------------------------------------------------
@dataclass(frozen=True)
class StagePart:
    layer_start: int
    layer_end: int  # exclusive
    shares: tuple[int, ...]  # per replica
    replica_time_s: tuple[float, ...]
    replica_memory_bytes: tuple[float, ...]

    @property
    def time_s(self) -> float:
        return max(self.replica_time_s)


@dataclass(frozen=True)
class LayerPartition:
    stages: tuple[StagePart, ...]
    iteration_s: float
    bottleneck_s: float
    fits_memory: bool

    def objective(self, kind: Objective) -> float:
        return self.iteration_s if kind == "iteration" else self.bottleneck_s

    @property
    def boundaries(self) -> tuple[int, ...]:
        return tuple(s.layer_start for s in self.stages[1:])

    def to_stages(self, inputs: LayerPartitionInputs) -> tuple[Any, ...]:
        """hetplan.plan.Stage objects (replicas with their type, TP, place and share)."""
        from hetplan.plan import Replica, Stage

        out = []
        for part, reps in zip(self.stages, inputs.stages):
            out.append(Stage(layer_start=part.layer_start, layer_end=part.layer_end, replicas=tuple(
                Replica(gpu_type=rep.gpu_type, tp=rep.tp, zone=rep.zone, node=rep.node, microbatch_share=b)
                for rep, b in zip(reps, part.shares))))
        return tuple(out)


def evaluate(inputs: LayerPartitionInputs, boundaries: Sequence[int], shares: Sequence[Sequence[int]]) -> LayerPartition:
    """Score a partition (stage i holds [bounds[i], bounds[i+1]) ) with the model's formulas."""
    P, U = inputs.num_stages, inputs.num_units
    cuts = [0, *boundaries, U]
    require(len(cuts) == P + 1 and all(cuts[i] < cuts[i + 1] for i in range(P)),
            f"boundaries {tuple(boundaries)} do not split {U} units into {P} non-empty ranges", "boundaries")
    parts, fits, tails = [], True, []
    for i, reps in enumerate(inputs.stages):
        units = range(cuts[i], cuts[i + 1])
        require(len(shares[i]) == len(reps), f"{len(shares[i])} shares for {len(reps)} replicas", f"shares[{i}]")
        require(sum(shares[i]) == inputs.global_microbatch,
                f"shares {tuple(shares[i])} do not sum to {inputs.global_microbatch}", f"shares[{i}]")
        times, mems = [], []
        for rep, b in zip(reps, shares[i]):
            require(b in rep.shares, f"share {b} not allowed for this replica", f"shares[{i}]")
            times.append(sum(rep.time_s[b][u] for u in units))
            mem = sum(rep.static_bytes[u] + inputs.in_flight(i) * rep.activation_bytes[b][u] for u in units)
            mems.append(mem)
            fits &= mem <= rep.capacity_bytes * (1 + 1e-9)
        parts.append(StagePart(cuts[i], cuts[i + 1], tuple(int(b) for b in shares[i]), tuple(times), tuple(mems)))
        tails.append(inputs.sync(i, units))
    taus = [p.time_s for p in parts]
    links = [inputs.p2p(i) for i in range(P - 1)]
    theta = max(taus + links)
    T = sum(taus) + 2 * sum(links) + (inputs.num_microbatches - 1) * theta + max(tails)
    return LayerPartition(tuple(parts), T, theta, fits)


# ---- model ------------------------------------------------------------------------------------
def build(inputs: LayerPartitionInputs) -> pyo.ConcreteModel:
    """The MILP of the module docstring (linear: HiGHS or SCIP)."""
    U, P = inputs.num_units, inputs.num_stages
    m = pyo.ConcreteModel(name="layer_partition")
    m.U = pyo.RangeSet(0, U - 1)
    m.I = pyo.RangeSet(0, P - 1)
    m.Icut = pyo.RangeSet(1, P - 1) if P > 1 else pyo.Set(initialize=[])
    m.c = pyo.Var(m.U, m.Icut, domain=pyo.Binary)

    def c(u: int, i: int) -> Any:
        return 1 if i == 0 else (0 if i == P else m.c[u, i])

    def x(u: int, i: int) -> Any:
        return c(u, i) - c(u, i + 1)

    m.stair_stage = pyo.Constraint([(u, i) for u in range(U) for i in range(1, P - 1)],
                                   rule=lambda b, u, i: b.c[u, i + 1] <= b.c[u, i])
    m.stair_unit = pyo.Constraint([(u, i) for u in range(U - 1) for i in range(1, P)],
                                  rule=lambda b, u, i: b.c[u, i] <= b.c[u + 1, i])
    if P > 1:
        m.c[0, 1].fix(0)  # unit 0 (embedding) on stage 0
        m.c[U - 1, P - 1].fix(1)  # the last unit (head) on the last stage
    m.nonempty = pyo.Constraint(m.I, rule=lambda b, i: sum(x(u, i) for u in range(U)) >= 1)

    keys = [(i, r, s) for i, reps in enumerate(inputs.stages) for r, rep in enumerate(reps)
            for s in rep.shares]
    free = [(i, r, s) for (i, r, s) in keys if inputs.stages[i][r].fixed_share is None]
    m.w = pyo.Var(free, domain=pyo.Binary)

    def w(i: int, r: int, s: int) -> Any:
        return m.w[i, r, s] if (i, r, s) in m.w else 1

    m.one_share = pyo.Constraint(sorted({(i, r) for i, r, _ in free}),
                                 rule=lambda b, i, r: sum(b.w[i, r, s] for s in inputs.stages[i][r].shares) == 1)
    def batch(b: Any, i: int) -> Any:
        if all(rep.fixed_share is not None for rep in inputs.stages[i]):
            return pyo.Constraint.Skip  # fixed shares: their sum was checked against G on input
        return sum(s * w(i, r, s) for r, rep in enumerate(inputs.stages[i]) for s in rep.shares) \
            == inputs.global_microbatch

    m.batch = pyo.Constraint(m.I, rule=batch)

    m.tau = pyo.Var(m.I, domain=pyo.NonNegativeReals)
    m.theta = pyo.Var(domain=pyo.NonNegativeReals)
    m.sigma = pyo.Var(domain=pyo.NonNegativeReals)

    def straggler(b: Any, i: int, r: int, s: int) -> Any:
        t = inputs.stages[i][r].time_s[s]
        big = sum(t)
        return b.tau[i] >= sum(t[u] * x(u, i) for u in range(U)) - big * (1 - w(i, r, s))

    def memory(b: Any, i: int, r: int, s: int) -> Any:
        rep, nf = inputs.stages[i][r], inputs.in_flight(i)
        per = [(rep.static_bytes[u] + nf * rep.activation_bytes[s][u]) / GIB for u in range(U)]
        cap = rep.capacity_bytes / GIB
        big = max(0.0, sum(per) - cap)
        if big == 0.0:
            return pyo.Constraint.Skip  # the whole model fits: the row can never bind
        return sum(per[u] * x(u, i) for u in range(U)) <= cap + big * (1 - w(i, r, s))

    m.straggler = pyo.Constraint(keys, rule=straggler)
    m.memory = pyo.Constraint(keys, rule=memory)
    m.bottleneck = pyo.Constraint(m.I, rule=lambda b, i: b.theta >= b.tau[i])
    m.link = pyo.Constraint(pyo.RangeSet(0, P - 2) if P > 1 else [],
                            rule=lambda b, i: b.theta >= inputs.p2p(i) if inputs.p2p(i) > 0 else pyo.Constraint.Skip)
    m.tail = pyo.Constraint(m.I, rule=lambda b, i: b.sigma >= (inputs.sync_fixed_s[i] if inputs.sync_fixed_s else 0.0)
                            + sum((inputs.sync_unit_s[i][u] if inputs.sync_unit_s else 0.0) * x(u, i)
                                  for u in range(U)))
    links = 2 * sum(inputs.p2p(i) for i in range(P - 1))
    m.T = pyo.Expression(expr=sum(m.tau[i] for i in m.I) + links
                         + (inputs.num_microbatches - 1) * m.theta + m.sigma)
    m.obj = pyo.Objective(expr=m.T if inputs.objective == "iteration" else m.theta, sense=pyo.minimize)
    m._hp = {"inputs": inputs}
    return m


def decode(model: pyo.ConcreteModel) -> LayerPartition:
    inputs: LayerPartitionInputs = model._hp["inputs"]
    U, P = inputs.num_units, inputs.num_stages
    stage_of = [sum(rounded(model.c[u, i]) for i in range(1, P)) for u in range(U)]
    bounds = [stage_of.index(i) for i in range(1, P)]
    shares = []
    for i, reps in enumerate(inputs.stages):
        row = []
        for r, rep in enumerate(reps):
            if rep.fixed_share is not None:
                row.append(rep.fixed_share)
            else:
                row.append(max(rep.shares, key=lambda s: var_value(model.w[i, r, s])))
        shares.append(row)
    return evaluate(inputs, bounds, shares)


def warm_start(model: pyo.ConcreteModel, part: LayerPartition) -> ComponentMap:
    """{var: value} for `part` in `model` (c staircase, shares, times)."""
    inputs: LayerPartitionInputs = model._hp["inputs"]
    P = inputs.num_stages
    pairs: list[tuple[Any, float]] = []
    for u in range(inputs.num_units):
        stage = sum(1 for s in part.stages[1:] if u >= s.layer_start)
        for i in range(1, P):
            pairs.append((model.c[u, i], 1.0 if stage >= i else 0.0))
    for i, (sp, reps) in enumerate(zip(part.stages, inputs.stages)):
        for r, (rep, b) in enumerate(zip(reps, sp.shares)):
            if rep.fixed_share is None:
                for s in rep.shares:
                    pairs.append((model.w[i, r, s], 1.0 if s == b else 0.0))
        pairs.append((model.tau[i], sp.time_s))
    pairs.append((model.theta, part.bottleneck_s))
    tails = [inputs.sync(i, range(s.layer_start, s.layer_end)) for i, s in enumerate(part.stages)]
    pairs.append((model.sigma, max(tails)))
    return assignment(pairs)


# ---- greedy -----------------------------------------------------------------------------------
def greedy_shares(inputs: LayerPartitionInputs) -> list[list[int]]:
    """Min-max share allocation per stage: fixed shares kept, free replicas start at their
    smallest share and get one sequence at a time where the whole-model time grows least."""
    out = []
    for i, reps in enumerate(inputs.stages):
        shares = [rep.fixed_share if rep.fixed_share is not None else min(rep.shares) for rep in reps]
        left = inputs.global_microbatch - sum(shares)
        while left > 0:
            best = None
            for r, rep in enumerate(reps):
                nxt = shares[r] + 1
                if rep.fixed_share is None and nxt in rep.time_s:
                    cost = sum(rep.time_s[nxt])
                    if best is None or cost < best[0]:
                        best = (cost, r)
            if best is None:
                raise FormulationInputError("no replica can take another sequence", f"stages[{i}]")
            shares[best[1]] += 1
            left -= 1
        out.append(shares)
    return out


def greedy(inputs: LayerPartitionInputs) -> LayerPartition:
    """Zorse-style proportional split with memory repair (see the module docstring)."""
    shares = greedy_shares(inputs)
    U, P = inputs.num_units, inputs.num_stages
    unit_time = [[max(rep.time_s[b][u] for rep, b in zip(reps, shares[i])) for u in range(U)]
                 for i, reps in enumerate(inputs.stages)]
    speed = [1.0 / max(sum(row) / U, 1e-30) for row in unit_time]  # average units per second
    target = [s / sum(speed) * U for s in speed]
    bounds, acc = [], 0.0
    for i in range(P - 1):
        acc += target[i]
        lo = (bounds[-1] + 1) if bounds else 1
        hi = U - (P - 1 - i)
        bounds.append(min(max(int(round(acc)), lo), hi))
    bounds = _repair_memory(inputs, bounds, shares)
    return evaluate(inputs, bounds, shares)


def _repair_memory(inputs: LayerPartitionInputs, bounds: list[int], shares: list[list[int]]) -> list[int]:
    """Move one boundary unit away from the most over-full stage until all fit (or no move helps)."""
    P, U = inputs.num_stages, inputs.num_units
    for _ in range(U * P):
        part = evaluate(inputs, bounds, shares)
        over = [max(m / rep.capacity_bytes for m, rep in zip(s.replica_memory_bytes, reps))
                for s, reps in zip(part.stages, inputs.stages)]
        worst = max(range(P), key=lambda i: over[i])
        if over[worst] <= 1 + 1e-9:
            return bounds
        moves = []
        if worst > 0 and bounds[worst - 1] + 1 < (bounds[worst] if worst < P - 1 else U):
            moves.append((worst - 1, +1))  # first unit of `worst` goes to the previous stage
        if worst < P - 1 and bounds[worst] - 1 > (bounds[worst - 1] if worst > 0 else 0):
            moves.append((worst, -1))  # last unit of `worst` goes to the next stage
        if not moves:
            return bounds
        best = None
        for j, d in moves:
            trial = list(bounds)
            trial[j] += d
            t = evaluate(inputs, trial, shares)
            score = max(max(m / rep.capacity_bytes for m, rep in zip(s.replica_memory_bytes, reps))
                        for s, reps in zip(t.stages, inputs.stages))
            if best is None or score < best[0]:
                best = (score, trial)
        bounds = best[1]
    return bounds


# ---- exhaustive (reference for tests and small benchmarks) --------------------------------------
def enumerate_all(inputs: LayerPartitionInputs) -> tuple[LayerPartition | None, int]:
    """Best memory-feasible partition over every contiguous split and share vector; (best, count)."""
    P, U, G = inputs.num_stages, inputs.num_units, inputs.global_microbatch
    share_sets = []
    for reps in inputs.stages:
        opts = [v for v in product(*[rep.shares for rep in reps]) if sum(v) == G]
        share_sets.append(opts)
    best, count = None, 0
    for cut in combinations(range(1, U), P - 1):
        for shares in product(*share_sets):
            count += 1
            part = evaluate(inputs, cut, shares)
            if part.fits_memory and (best is None or part.objective(inputs.objective) < best.objective(inputs.objective)):
                best = part
    return best, count


# ---- from an instance -------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaChoice:
    """A replica as the caller places it: GPU type, TP degree, where it sits, optional fixed share."""

    gpu_type: str
    tp: int = 1
    zone: str | None = None
    node: str | None = None
    fixed_share: int | None = None


def inputs_from_instance(instance: Any, estimators: Any, stages: Sequence[Sequence[ReplicaChoice]], *,
                         global_microbatch: int, num_microbatches: int | None = None,
                         schedule: Literal["1F1B", "GPipe"] = "1F1B",
                         objective: Objective = "iteration") -> LayerPartitionInputs:
    """Fill the tables from the estimators for a given stage order and replica set.

    Shares: a free replica may take 1..G - R_i + 1 sequences. p2p[i]: the slowest replica pair
    across boundary i moving the activations of the largest share either side may hold (a safe
    constant, since shares are variables). Sync: ring all-reduce of the stage's gradients among
    its replicas, fitted as s0 + sum_u beta bytes_u (exact for alpha-beta), plus the slowest
    replica's optimizer step per unit (`update_time_s`).
    """
    from hetplan.estimators.base import Endpoint
    from hetplan.estimators.model_stats import boundary_activation_bytes

    require_int(global_microbatch, "global_microbatch", minimum=1)
    batch = instance.workload.global_batch_size
    m = num_microbatches if num_microbatches is not None else batch // global_microbatch
    require(m * global_microbatch == batch, f"global_microbatch {global_microbatch} x num_microbatches {m} "
            f"!= global_batch_size {batch}", "num_microbatches")
    arch = instance.model_arch
    U, G = arch.num_units, global_microbatch
    table, ends = [], []
    for i, reps in enumerate(stages):
        require(len(reps) > 0, "a stage needs at least one replica", f"stages[{i}]")
        dp = len(reps)
        row, eps = [], []
        for r, ch in enumerate(reps):
            where = f"stages[{i}][{r}]"
            require(ch.gpu_type in instance.gpu_types, f"GPU type {ch.gpu_type!r} not in the cluster", where)
            shares = (ch.fixed_share,) if ch.fixed_share is not None else tuple(range(1, G - dp + 2))
            times = {b: tuple(estimators.time.layer_time(ch.gpu_type, u, b, ch.tp).total_s for u in range(U))
                     for b in shares}
            acts, static, cap = {}, [], 0.0
            for u in range(U):
                mb = estimators.memory.worker_memory(ch.gpu_type, range(u, u + 1), ch.tp, shares[0], dp, 0)
                static.append(mb.state_bytes)
                cap = mb.capacity_bytes - mb.overhead_bytes
            for b in shares:
                acts[b] = tuple(estimators.memory.worker_memory(ch.gpu_type, range(u, u + 1), ch.tp, b, dp, 1)
                                .activations_bytes for u in range(U))
            row.append(ReplicaCosts(ch.gpu_type, ch.tp, cap, tuple(static), times, acts, ch.fixed_share,
                                    ch.zone, ch.node))
            eps.append(_endpoint(instance, ch, Endpoint))
        table.append(tuple(row))
        ends.append(eps)
    bytes_per_seq = boundary_activation_bytes(arch, 1, instance.workload.precision)
    p2p = []
    for i in range(len(stages) - 1):
        most = max(max(rep.shares) for rep in table[i] + table[i + 1])
        p2p.append(max(estimators.comm.p2p_time_s(a, b, most * bytes_per_seq) for a in ends[i] for b in ends[i + 1]))
    s0, su = [], []
    for i, reps in enumerate(table):
        unit_grad = []
        for u in range(U):
            mb = estimators.memory.worker_memory(reps[0].gpu_type, range(u, u + 1), reps[0].tp, 1, 1, 0)
            unit_grad.append(mb.grads_bytes)
        total = sum(unit_grad)
        f1 = estimators.comm.allreduce_time_s(ends[i], total)
        f2 = estimators.comm.allreduce_time_s(ends[i], total / 2)
        beta = (f1 - f2) / (total / 2) if total > 0 else 0.0
        alpha = max(0.0, f1 - beta * total)
        upd = [max(estimators.time.update_time_s(rep.gpu_type, range(u, u + 1), rep.tp, len(reps)) for rep in reps)
               for u in range(U)]
        s0.append(alpha)
        su.append(tuple(max(0.0, beta * unit_grad[u]) + upd[u] for u in range(U)))
    return LayerPartitionInputs(U, tuple(table), G, m, tuple(p2p), tuple(s0), tuple(su), schedule, objective)


def _endpoint(instance: Any, ch: ReplicaChoice, Endpoint: Any) -> Any:
    if ch.node is not None:
        node = instance.node_by_id.get(ch.node)
        require(node is not None, f"unknown node {ch.node!r}", "node")
        return Endpoint(node.zone, node.region, node.node_id, node.intra_node)
    zone = ch.zone or next(n.zone for n in instance.nodes if n.gpu_type == ch.gpu_type)
    region = next(n.region for n in instance.nodes if n.zone == zone)
    return Endpoint(zone, region, None, None)
