"""Per-stage parallelism: (DP, TP) for every pipeline stage and GPU type under memory (Metis + seed 003).

Each stage owns a device group (GPUs on given nodes, possibly of several types) and a contiguous
layer range (from `layer_partition` or the caller). The model picks one TP degree per stage --
TP only inside a node (tp <= GPUs of a node) and the same for all the stage's replicas (AutoHet
obs. 1, seed 002 sec. II-B: asymmetric TP needs a gradient transpose) -- how many replicas of each
GPU type the stage runs (its DP degree), and each replica's share of the global microbatch (Metis'
data load balancing, seed 003 sec. 3.3), minimising the 1F1B iteration time under per-worker
memory. Memory may fall as DP grows (ZeRO shards over DP), so it is tabulated per DP degree.

Sets
  S stages;  T_s GPU types of stage s;  D_s candidate TP degrees (powers of two <= GPUs per node);
  B = {1..G} shares;  Q_s = {1..min(G, max replicas)} DP degrees
Parameters (`StageParallelismInputs`)
  cap[s,t,k]       replicas of TP degree k that fit on stage s's nodes of type t: sum_nodes floor(gpus / k)
  time[s,t,k,b]    fwd + bwd seconds of the stage's layers for a share of b on one TP-k group of type t
  fits[s,t,k,b,d]  1 when a worker of that replica fits in memory while the stage runs d replicas
  sync[s,k,d]      gradient all-reduce + optimizer step of stage s with d replicas of TP k
  G                global microbatch (sequences per pipeline step);  m microbatches per iteration
Variables
  delta[s,k,d] in {0,1}   stage s runs TP k with DP degree d (one pair per stage)
  n[s,t,k,b] in Z+        replicas of type t, TP k, share b;  y[s,t,k,b] in {0,1} "n > 0"
  tau[s] >= 0, theta >= 0, sigma >= 0
Constraints
  choose:    sum_{k,d} delta[s,k,d] = 1
  capacity:  sum_b n[s,t,k,b] <= cap[s,t,k] sum_d delta[s,k,d]        (only the chosen TP; on the nodes)
  dp:        sum_{t,b} n[s,t,k,b] = sum_d d delta[s,k,d]
  batch:     sum_{t,k,b} b n[s,t,k,b] = G                              (shares split the global microbatch)
  used:      n[s,t,k,b] <= cap[s,t,k] y[s,t,k,b]
  memory:    y[s,t,k,b] <= sum_{d : fits[s,t,k,b,d]} delta[s,k,d]
  straggler: tau[s] >= time[s,t,k,b] y[s,t,k,b];  theta >= tau[s]
  sync:      sigma >= sum_{k,d} sync[s,k,d] delta[s,k,d]
Objective
  min  sum_s tau[s] + (m - 1) theta + sigma                  (1F1B: Sailor sec. 4.3, AutoHet eq. 1)

Greedy = the OOM-first search of seed 003 (sec. 3.4): every stage starts at TP 1 with the largest
DP its GPUs allow (capped at G replicas, fastest first) and min-max shares; while some stage does
not fit, the one with the highest memory / capacity ratio is repaired by doubling its TP, which
halves its DP. `steps` counts stage configurations evaluated, the figure seed 003's Table 1
compares; the exact model reports its branch-and-bound nodes and `enumerate_all` its count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.formulations.common import (
    assignment,
    require,
    require_finite_positive,
    require_int,
    rounded,
    var_value,
)


# ---- inputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageDevices:
    """The GPUs a stage owns: (node id, GPU type, GPUs of that node given to the stage)."""

    nodes: tuple[tuple[str, str, int], ...]
    layer_start: int = 0
    layer_end: int = 1

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for _, t, _ in self.nodes}))

    def capacity(self, gpu_type: str, tp: int) -> int:
        return sum(g // tp for _, t, g in self.nodes if t == gpu_type)

    @property
    def tp_options(self) -> tuple[int, ...]:
        """Powers of two up to the largest node: TP stays inside a node."""
        most = max(g for _, _, g in self.nodes)
        return tuple(2**e for e in range(int(math.log2(most)) + 1))


@dataclass(frozen=True)
class StageParallelismInputs:
    stages: tuple[StageDevices, ...]
    global_microbatch: int  # G
    num_microbatches: int  # m
    time_s: Mapping[tuple[int, str, int, int], float]  # (stage, type, tp, share) -> seconds
    memory_bytes: Mapping[tuple[int, str, int, int, int], float]  # (stage, type, tp, share, dp) -> bytes
    capacity_bytes: Mapping[str, float]  # per GPU type: usable bytes of one worker
    sync_s: Mapping[tuple[int, int, int], float] = field(default_factory=dict)  # (stage, tp, dp) -> seconds

    def __post_init__(self) -> None:
        for name in ("time_s", "memory_bytes", "capacity_bytes", "sync_s"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        require(len(self.stages) >= 1, "at least one stage is needed", "stages")
        require_int(self.global_microbatch, "global_microbatch", minimum=1)
        require_int(self.num_microbatches, "num_microbatches", minimum=1)
        for s, st in enumerate(self.stages):
            require(len(st.nodes) > 0, "a stage needs GPUs", f"stages[{s}].nodes")
            for j, (_, t, g) in enumerate(st.nodes):
                require_int(g, f"stages[{s}].nodes[{j}] GPUs", minimum=1)
                require(t in self.capacity_bytes, f"no capacity for GPU type {t!r}", "capacity_bytes")
            for t, k, b in self.keys(s):
                key = (s, t, k, b)
                require(key in self.time_s, f"missing time for {key}", "time_s")
                require_finite_positive(self.time_s[key], f"time_s[{key}]", allow_zero=True)
                for d in self.dp_options(s, k):
                    mk = (s, t, k, b, d)
                    require(mk in self.memory_bytes, f"missing memory for {mk}", "memory_bytes")
            for k in st.tp_options:
                for d in self.dp_options(s, k):
                    require_finite_positive(self.sync(s, k, d), f"sync_s[{(s, k, d)}]", allow_zero=True)
        for t, v in self.capacity_bytes.items():
            require_finite_positive(v, f"capacity_bytes[{t!r}]")

    def keys(self, s: int) -> list[tuple[str, int, int]]:
        """(type, tp, share) combinations of stage s that can hold at least one replica."""
        return _keys(self.stages[s], self.global_microbatch)

    def dp_options(self, s: int, tp: int) -> range:
        return _dp_options(self.stages[s], self.global_microbatch, tp)

    def sync(self, s: int, tp: int, dp: int) -> float:
        return self.sync_s.get((s, tp, dp), 0.0)

    def fits(self, s: int, t: str, tp: int, share: int, dp: int) -> bool:
        return self.memory_bytes[(s, t, tp, share, dp)] <= self.capacity_bytes[t] * (1 + 1e-9)


def _keys(st: StageDevices, G: int) -> list[tuple[str, int, int]]:
    return [(t, k, b) for t in st.gpu_types for k in st.tp_options if st.capacity(t, k) > 0
            for b in range(1, G + 1)]


def _dp_options(st: StageDevices, G: int, tp: int) -> range:
    return range(1, min(G, sum(st.capacity(t, tp) for t in st.gpu_types)) + 1)


def tabulate(stages: Sequence[StageDevices], global_microbatch: int, num_microbatches: int,
             time_fn: Callable[[int, str, int, int], float],
             memory_fn: Callable[[int, str, int, int, int], float], capacity_bytes: Mapping[str, float],
             sync_fn: Callable[[int, int, int], float] | None = None) -> StageParallelismInputs:
    """Inputs from functions: time_fn(stage, type, tp, share), memory_fn(stage, type, tp, share, dp),
    sync_fn(stage, tp, dp); evaluated at every combination the model can use."""
    G = global_microbatch
    time_s, mem, sync = {}, {}, {}
    for s, st in enumerate(stages):
        for t, k, b in _keys(st, G):
            time_s[(s, t, k, b)] = time_fn(s, t, k, b)
            for d in _dp_options(st, G, k):
                mem[(s, t, k, b, d)] = memory_fn(s, t, k, b, d)
        for k in st.tp_options:
            for d in _dp_options(st, G, k):
                if sync_fn is not None:
                    sync[(s, k, d)] = sync_fn(s, k, d)
    return StageParallelismInputs(tuple(stages), global_microbatch, num_microbatches, time_s, mem,
                                  dict(capacity_bytes), sync)


# ---- typed result -----------------------------------------------------------------------------
@dataclass(frozen=True)
class StageChoice:
    tp: int
    replicas: tuple[tuple[str, int], ...]  # (GPU type, share) per replica, slowest type first
    time_s: float  # tau: the slowest replica
    sync_s: float
    memory_ratio: float  # max over replicas of memory / capacity

    @property
    def dp(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True)
class ParallelismPlan:
    stages: tuple[StageChoice, ...]
    iteration_s: float
    fits_memory: bool
    steps: int = 0  # configurations evaluated to find it (greedy / exhaustive)

    def to_stages(self, inputs: StageParallelismInputs) -> tuple[Any, ...]:
        """hetplan.plan.Stage objects: each replica placed on a node of its type with room for its TP."""
        from hetplan.plan import Replica, Stage

        out = []
        for s, (choice, dev) in enumerate(zip(self.stages, inputs.stages)):
            free = {nid: g for nid, _, g in dev.nodes}
            reps = []
            for t, share in choice.replicas:
                node = next(nid for nid, tt, _ in dev.nodes if tt == t and free[nid] >= choice.tp)
                free[node] -= choice.tp
                reps.append(Replica(gpu_type=t, tp=choice.tp, node=node, microbatch_share=share))
            out.append(Stage(layer_start=dev.layer_start, layer_end=dev.layer_end, replicas=tuple(reps)))
        return tuple(out)


def evaluate_stage(inputs: StageParallelismInputs, s: int, tp: int, replicas: Sequence[tuple[str, int]]) -> StageChoice:
    dp = len(replicas)
    time_s = max(inputs.time_s[(s, t, tp, b)] for t, b in replicas)
    ratio = max(inputs.memory_bytes[(s, t, tp, b, dp)] / inputs.capacity_bytes[t] for t, b in replicas)
    order = sorted(replicas, key=lambda r: (r[0], -r[1]))
    return StageChoice(tp, tuple(order), time_s, inputs.sync(s, tp, dp), ratio)


def score(inputs: StageParallelismInputs, stages: Sequence[StageChoice], steps: int = 0) -> ParallelismPlan:
    taus = [c.time_s for c in stages]
    T = sum(taus) + (inputs.num_microbatches - 1) * max(taus) + max(c.sync_s for c in stages)
    return ParallelismPlan(tuple(stages), T, all(c.memory_ratio <= 1 + 1e-9 for c in stages), steps)


# ---- model ------------------------------------------------------------------------------------
def build(inputs: StageParallelismInputs) -> pyo.ConcreteModel:
    """The MILP of the module docstring (linear: HiGHS or SCIP)."""
    S, G = len(inputs.stages), inputs.global_microbatch
    pairs = [(s, k, d) for s in range(S) for k in inputs.stages[s].tp_options for d in inputs.dp_options(s, k)]
    keys = [(s, t, k, b) for s in range(S) for t, k, b in inputs.keys(s)]
    cap = {(s, t, k, b): inputs.stages[s].capacity(t, k) for s, t, k, b in keys}
    m = pyo.ConcreteModel(name="stage_parallelism")
    m.S = pyo.RangeSet(0, S - 1)
    m.delta = pyo.Var(pairs, domain=pyo.Binary)
    m.n = pyo.Var(keys, domain=pyo.NonNegativeIntegers, bounds=lambda b_, s, t, k, b: (0, min(cap[s, t, k, b], G // b)))
    m.y = pyo.Var(keys, domain=pyo.Binary)
    m.tau = pyo.Var(m.S, domain=pyo.NonNegativeReals)
    m.theta = pyo.Var(domain=pyo.NonNegativeReals)
    m.sigma = pyo.Var(domain=pyo.NonNegativeReals)

    def dsum(s: int, k: int, weight: Callable[[int], float] = lambda d: 1) -> Any:
        return sum(weight(d) * m.delta[s, k, d] for d in inputs.dp_options(s, k))

    m.choose = pyo.Constraint(m.S, rule=lambda b_, s: sum(m.delta[p] for p in pairs if p[0] == s) == 1)
    stk = sorted({(s, t, k) for s, t, k, _ in keys})
    m.capacity = pyo.Constraint(stk, rule=lambda b_, s, t, k: sum(m.n[s, t, k, b] for b in range(1, G + 1))
                                <= inputs.stages[s].capacity(t, k) * dsum(s, k))
    sk = sorted({(s, k) for s, _, k, _ in keys})
    m.dp = pyo.Constraint(sk, rule=lambda b_, s, k: sum(m.n[key] for key in keys if key[0] == s and key[2] == k)
                          == dsum(s, k, lambda d: d))
    m.batch = pyo.Constraint(m.S, rule=lambda b_, s: sum(key[3] * m.n[key] for key in keys if key[0] == s) == G)
    m.used = pyo.Constraint(keys, rule=lambda b_, s, t, k, b: m.n[s, t, k, b] <= m.n[s, t, k, b].ub * m.y[s, t, k, b])

    def memory(b_: Any, s: int, t: str, k: int, b: int) -> Any:
        ok = [d for d in inputs.dp_options(s, k) if inputs.fits(s, t, k, b, d)]
        if len(ok) == len(inputs.dp_options(s, k)):
            return pyo.Constraint.Skip
        return m.y[s, t, k, b] <= sum(m.delta[s, k, d] for d in ok)

    m.memory = pyo.Constraint(keys, rule=memory)
    m.straggler = pyo.Constraint(keys, rule=lambda b_, s, t, k, b: m.tau[s] >= inputs.time_s[(s, t, k, b)] * m.y[s, t, k, b])
    m.bottleneck = pyo.Constraint(m.S, rule=lambda b_, s: m.theta >= m.tau[s])
    m.sync = pyo.Constraint(m.S, rule=lambda b_, s: m.sigma >= sum(
        inputs.sync(s, k, d) * m.delta[s, k, d] for k in inputs.stages[s].tp_options for d in inputs.dp_options(s, k)))
    m.obj = pyo.Objective(expr=sum(m.tau[s] for s in m.S) + (inputs.num_microbatches - 1) * m.theta + m.sigma,
                          sense=pyo.minimize)
    m._hp = {"inputs": inputs, "keys": keys, "pairs": pairs}
    return m


def decode(model: pyo.ConcreteModel, steps: int = 0) -> ParallelismPlan:
    inputs: StageParallelismInputs = model._hp["inputs"]
    choices = []
    for s in range(len(inputs.stages)):
        tp = next(k for (ss, k, d) in model._hp["pairs"] if ss == s and var_value(model.delta[ss, k, d]) > 0.5)
        reps = []
        for key in model._hp["keys"]:
            ss, t, k, b = key
            if ss == s and k == tp:
                reps += [(t, b)] * rounded(model.n[key])
        choices.append(evaluate_stage(inputs, s, tp, reps))
    return score(inputs, choices, steps)


def warm_start(model: pyo.ConcreteModel, plan: ParallelismPlan) -> ComponentMap:
    pairs: list[tuple[Any, float]] = []
    for (s, k, d) in model._hp["pairs"]:
        c = plan.stages[s]
        pairs.append((model.delta[s, k, d], 1.0 if (k == c.tp and d == c.dp) else 0.0))
    for key in model._hp["keys"]:
        s, t, k, b = key
        c = plan.stages[s]
        n = sum(1 for r in c.replicas if r == (t, b)) if k == c.tp else 0
        pairs += [(model.n[key], n), (model.y[key], 1.0 if n else 0.0)]
    for s, c in enumerate(plan.stages):
        pairs.append((model.tau[s], c.time_s))
    pairs.append((model.theta, max(c.time_s for c in plan.stages)))
    pairs.append((model.sigma, max(c.sync_s for c in plan.stages)))
    return assignment(pairs)


# ---- OOM-first greedy (seed 003) ----------------------------------------------------------------
def _stage_at(inputs: StageParallelismInputs, s: int, tp: int) -> StageChoice | None:
    """Max DP at this TP (fastest replicas first, at most G), shares by min-max allocation."""
    st, G = inputs.stages[s], inputs.global_microbatch
    slots = []
    for t in st.gpu_types:
        slots += [t] * st.capacity(t, tp)
    if not slots:
        return None
    slots.sort(key=lambda t: inputs.time_s[(s, t, tp, 1)])
    slots = slots[:G]
    shares = [1] * len(slots)
    for _ in range(G - len(slots)):
        r = min(range(len(slots)), key=lambda r: inputs.time_s[(s, slots[r], tp, shares[r] + 1)])
        shares[r] += 1
    return evaluate_stage(inputs, s, tp, list(zip(slots, shares)))


def greedy(inputs: StageParallelismInputs) -> ParallelismPlan:
    """Seed 003's OOM-first search; `steps` = stage configurations evaluated. If a stage cannot be
    repaired (TP already at the node size), the plan is returned with fits_memory False."""
    choices = [_stage_at(inputs, s, 1) for s in range(len(inputs.stages))]
    steps = len(choices)
    blocked: set[int] = set()
    while True:
        over = [s for s, c in enumerate(choices) if c.memory_ratio > 1 + 1e-9 and s not in blocked]
        if not over:
            break
        s = max(over, key=lambda s: choices[s].memory_ratio)  # most likely to OOM first
        nxt = choices[s].tp * 2
        cand = _stage_at(inputs, s, nxt) if nxt in inputs.stages[s].tp_options else None
        if cand is None:
            blocked.add(s)
            continue
        choices[s] = cand
        steps += 1
    return score(inputs, choices, steps)


# ---- exhaustive (reference) -----------------------------------------------------------------------
def stage_options(inputs: StageParallelismInputs, s: int) -> list[StageChoice]:
    """Every memory-feasible configuration of stage s (TP, replica multiset with shares)."""
    st, G = inputs.stages[s], inputs.global_microbatch
    out = []
    for k in st.tp_options:
        kinds = [(t, b) for t in st.gpu_types if st.capacity(t, k) > 0 for b in range(1, G + 1)]
        ranges = [range(0, min(st.capacity(t, k), G // b) + 1) for t, b in kinds]
        for counts in product(*ranges):
            if sum(b * n for (t, b), n in zip(kinds, counts)) != G:
                continue
            if any(sum(n for (tt, _), n in zip(kinds, counts) if tt == t) > st.capacity(t, k) for t in st.gpu_types):
                continue
            reps = [kind for kind, n in zip(kinds, counts) for _ in range(n)]
            c = evaluate_stage(inputs, s, k, reps)
            if c.memory_ratio <= 1 + 1e-9:
                out.append(c)
    return out


def enumerate_all(inputs: StageParallelismInputs) -> ParallelismPlan | None:
    """Best plan over the product of every stage's feasible configurations; steps = that product."""
    opts = [stage_options(inputs, s) for s in range(len(inputs.stages))]
    best, count = None, 0
    for combo in product(*opts):
        count += 1
        plan = score(inputs, combo)
        if best is None or plan.iteration_s < best.iteration_s:
            best = plan
    return None if best is None else ParallelismPlan(best.stages, best.iteration_s, best.fits_memory, count)


# ---- from an instance -------------------------------------------------------------------------
def inputs_from_instance(instance: Any, estimators: Any, stages: Sequence[StageDevices], *,
                         global_microbatch: int, num_microbatches: int | None = None,
                         schedule: str = "1F1B") -> StageParallelismInputs:
    """Tables from the estimators. Memory: the stage's layers on one worker with 1F1B's
    min(P - s, m) microbatches in flight (GPipe: m), ZeRO sharding over the stage's DP degree.
    Sync: ring all-reduce of the stage's gradients (one TP shard) over d replicas placed on the
    stage's nodes in order, plus the slowest type's optimizer step."""
    from hetplan.estimators.base import Endpoint

    batch = instance.workload.global_batch_size
    m = num_microbatches if num_microbatches is not None else batch // global_microbatch
    require(m * global_microbatch == batch, f"global_microbatch {global_microbatch} x num_microbatches {m} "
            f"!= global_batch_size {batch}", "num_microbatches")
    P = len(stages)
    for s, st in enumerate(stages):
        require(0 <= st.layer_start < st.layer_end <= instance.model_arch.num_units,
                f"layer range [{st.layer_start}, {st.layer_end}) outside the model's units", f"stages[{s}]")
        for nid, t, g in st.nodes:
            node = instance.node_by_id.get(nid)
            require(node is not None, f"unknown node {nid!r}", f"stages[{s}].nodes")
            require(node.gpu_type == t and g <= node.num_gpus, f"node {nid} has {node.num_gpus} x {node.gpu_type}",
                    f"stages[{s}].nodes")

    def units(s: int) -> range:
        return range(stages[s].layer_start, stages[s].layer_end)

    def time_fn(s: int, t: str, k: int, b: int) -> float:
        return sum(estimators.time.layer_time(t, u, b, k).total_s for u in units(s))

    def memory_fn(s: int, t: str, k: int, b: int, d: int) -> float:
        in_flight = min(P - s, m) if schedule == "1F1B" else m
        return estimators.memory.worker_memory(t, units(s), k, b, d, in_flight).total_bytes

    def sync_fn(s: int, k: int, d: int) -> float:
        ends = []
        for nid, t, g in stages[s].nodes:
            node = instance.node_by_id[nid]
            ends += [Endpoint(node.zone, node.region, nid, node.intra_node)] * (g // k)
        t0 = stages[s].nodes[0][1]
        grads = estimators.memory.worker_memory(t0, units(s), k, 1, 1, 0).grads_bytes
        upd = max(estimators.time.update_time_s(t, units(s), k, d) for t in stages[s].gpu_types)
        return estimators.comm.allreduce_time_s(ends[:d], grads) + upd

    caps = {}
    for st in stages:
        for t in st.gpu_types:
            probe = estimators.memory.worker_memory(t, range(0, 1), 1, 1, 1, 0)
            caps[t] = probe.capacity_bytes
    return tabulate(stages, global_microbatch, m, time_fn, memory_fn, caps, sync_fn)
