"""Device grouping: split all GPUs into data-parallel groups (AutoHet, seed 002, sec. III-B, eq. 2-3).

Each group holds a full model copy as a pipeline over its members (asymmetric PP); groups run data
parallel. AutoHet maximises (number of groups) x (minimum effective compute of a group), where the
effective compute of group j is its summed compute discounted by its pipeline bubble (eq. 2):

    G_j = S_j * (1 - rho_j),  rho_j = (P_j - 1) / (K + P_j - 1)   =>   G_j = S_j * K / (K + P_j - 1)

(S_j = summed compute of the group's units, P_j = its number of units = pipeline depth, K = micro-
batches per iteration; rho_j is the 1F1B / GPipe bubble fraction.) A *unit* is one GPU, or one TP
group of `gpus_per_unit` GPUs on one node when a TP degree is fixed (AutoHet Alg. 1 loops over TP
degrees outside the grouping problem; `inputs_from_instance(..., tp=)` builds one such instance).

Sets
  C           unit classes c (GPU type x TP degree); every unit of a class has the same g_c, m_c
  I           individual units i (per-GPU model only), class(i) in C
  J           group slots j
Parameters
  N_c         units of class c;  N = sum_c N_c
  g_c         compute of one unit (any consistent unit; `inputs_from_instance` uses microbatches/s
              through the whole model); models use g_c / g_max for numerics
  m_c         memory bytes of one unit;  MIN = minimum memory of a group (MIN_mem in eq. 3b)
  K           microbatches per iteration (eq. 1-2)
  p_min       fewest units whose memory reaches MIN;  k_max = min(N // p_min, floor(sum_c N_c m_c / MIN))

Model "per_gpu" (eq. 3 literally; MINLP, SCIP only; for reference and small instances)
  x[i,j] in {0,1}, y[j] in {0,1}, z >= 0;  S_j = sum_i g_i x[i,j], P_j = sum_i x[i,j]
  max   z * sum_j y[j]                                               (3a)
  s.t.  sum_i (m_i / MIN) x[i,j] >= y[j]                      for all j   (3b, with L = MIN)
        K S_j + L_z (1 - y[j]) >= z (K - 1 + P_j)             for all j   (3c times K + P_j - 1 > 0)
        sum_i x[i,j] / N <= y[j] <= sum_i x[i,j]              for all j   (3d)
        sum_j x[i,j] = 1                                      for all i   (3e)
  L_z = z_max (K - 1 + N) makes (3c) void for an empty group.

The number of groups k takes few values (1..k_max), and for a fixed k the objective k z is linear;
so the exact driver enumerates k outside and solves one linear model per k (`optimize`, in
orchestration/drivers/device_grouping.py: this module builds, decodes and warm-starts the models).

Model "counts" (per k; MILP; groups ordered, units counted per class, not listed per GPU)
  n[j,c] in Z+ (0..N_c), j = 0..k-1;  S_j = sum_c g_c n[j,c];  P_j = sum_c n[j,c]
  beta[j,b] in {0,1} (b = 0..B-1, 2^B > P_max = N - (k-1) p_min),  w[j,b] >= 0,  z >= z_min
  max   k z
  s.t.  sum_j n[j,c] = N_c                                    for all c        (every unit used, 3e)
        sum_c (m_c / MIN) n[j,c] >= 1                         for all j        (3b)
        P_j = sum_b 2^b beta[j,b]                             for all j        (binary size)
        w[j,b] >= z - z_max (1 - beta[j,b])                   for all j, b     (w = z beta where it binds)
        K S_j >= (K - 1) z + sum_b 2^b w[j,b]                 for all j        (3c: K S_j >= z (K - 1 + P_j))
        S_j >= S_{j+1}                                        for j < k-1      (order: no permuted copies)

Model "patterns" (per k; MILP; groups of identical composition are counted, not listed)
  A pattern p in Z+^C is a group composition; G_p = S_p K / (K + P_p - 1) is a constant, so the
  bubble costs nothing in the model. Only patterns that can occur in a solution with all G >= z_min
  are generated (`candidate_patterns`): memory(p) >= MIN, memory(N - p) >= (k - 1) MIN,
  P_p <= N - (k - 1) p_min, and 0 <= e_p <= slack, where e_p = K S_p - z_min (K - 1 + P_p) is the
  group's excess in (3c) and slack = K S - z_min (k (K - 1) + N) is the sum of all k excesses
  (each is >= 0, so none can exceed their sum).
  lambda[p] in Z+ (0..u_p, u_p = min(k, min_c floor(N_c / p_c))), y[p] in {0,1}, z_min <= z <= z_max
  max   k z
  s.t.  sum_p lambda[p] = k                                                    (k groups)
        sum_p p_c lambda[p] = N_c                             for all c        (every unit used, 3e)
        lambda[p] <= u_p y[p]                                 for all p        (y = pattern in use)
        z <= G_p + (z_max - G_p) (1 - y[p])                   for all p        (z = min over used G_p)

Threshold forms of the pattern model (what the driver solves; no y, no z):
  "threshold": "is there a k-grouping with every G >= z_min?":  lambda over candidates with
        sum_p lambda[p] = k,  sum_p p_c lambda[p] = N_c,  constant objective.
  "packing": when every class adds effective compute at z_min (K g_c >= z_min for all c, so a
        unit joining a group with e >= 0 keeps e >= 0 and memory only grows), a k-grouping with
        min G >= z_min exists iff k disjoint *minimal* patterns fit (minimal: removing any unit
        breaks G >= z_min or memory >= MIN):
        sum_p lambda[p] >= k,  sum_p p_c lambda[p] <= N_c  over minimal candidates only.
        (=>: shrink every group to a minimal sub-pattern; <=: give the unused units to any groups,
        `_absorb_leftovers`.) The candidate filters stay valid for sub-patterns, since e_p only
        falls and memory(N - p) only grows when units are removed. Minimal patterns are few, so
        512 GPUs solve in about a second.

Driver `optimize` (orchestration/drivers/device_grouping.py; exact over the modelled space): start from the greedy incumbent; for every k
(in decreasing order of its bound k K S / (k (K - 1) + N), the sum-of-excesses bound) that beats
the incumbent, ask the threshold question at z_min just above incumbent / k; "no" (infeasible, or
no candidate pattern) closes k; "yes" gives a better grouping, raises the incumbent and asks
again. When every k is closed the incumbent is optimal; otherwise the reported bound is the
largest open per-k bound. variant="counts" solves the ordered-counts MILP per k instead (same
optimum, slower; it is the reference for the pattern model). An optional probe phase
(`probe_step`) first lowers a target objective from the best bound until some k reaches it,
which helps when the packing form does not apply and the greedy is weak.

Greedy (warm start): for each k, units in decreasing compute go to the group with the smallest
effective compute, groups that still lack memory first (LPT with a memory seed); best k wins.

Not modelled (as in AutoHet eq. 3): where a group's GPUs sit. `DeviceGrouping.placement` maps
counts to nodes afterwards (fill each group from consecutive nodes of each class, so a group's
TP units and pipeline neighbours stay on few nodes; AutoHet sec. III-C does this mapping step).
The plan data model (core/plan.py) has one pipeline shape for all replicas, so a grouping with
groups of different depth is not a `Plan`; each group feeds `layer_partition` as one pipeline.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np
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

Variant = Literal["patterns", "counts", "per_gpu"]
_REL_EPS = 1e-9  # "strictly better than the incumbent" margin, relative
_MAX_GRID = 20_000_000  # pattern enumeration grid cap (product of the non-last class ranges)


# ---- inputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitClass:
    """Identical units of one kind: GPUs of one type (or TP groups of `gpus_per_unit` of them)."""

    name: str
    count: int
    compute: float  # g_c, e.g. microbatches per second through the whole model
    memory_bytes: float  # m_c of one unit (all its GPUs)
    gpus_per_unit: int = 1
    nodes: tuple[tuple[str, int], ...] = ()  # (node id, units on it); empty: one anonymous pool


@dataclass(frozen=True)
class DeviceGroupingInputs:
    classes: tuple[UnitClass, ...]
    min_memory_bytes: float  # MIN_mem of eq. (3b)
    num_microbatches: int  # K of eq. (1)-(2)

    def __post_init__(self) -> None:
        require(len(self.classes) > 0, "at least one unit class is needed", "classes")
        names = [c.name for c in self.classes]
        require(len(set(names)) == len(names), f"class names must be unique, got {names}", "classes")
        for i, c in enumerate(self.classes):
            require_int(c.count, f"classes[{i}].count", minimum=0)
            require_finite_positive(c.compute, f"classes[{i}].compute")
            require_finite_positive(c.memory_bytes, f"classes[{i}].memory_bytes")
            require_int(c.gpus_per_unit, f"classes[{i}].gpus_per_unit", minimum=1)
            if c.nodes:
                on_nodes = sum(n for _, n in c.nodes)
                require(on_nodes == c.count, f"nodes hold {on_nodes} units but count is {c.count}",
                        f"classes[{i}].nodes")
        require(self.num_units > 0, "no units: every class has count 0", "classes")
        require_finite_positive(self.min_memory_bytes, "min_memory_bytes")
        require_int(self.num_microbatches, "num_microbatches", minimum=1)
        require(self.total_memory >= self.min_memory_bytes,
                f"all units together hold {self.total_memory:.4g} bytes, less than min_memory_bytes "
                f"{self.min_memory_bytes:.4g}: not even one group fits the model", "min_memory_bytes")

    # derived numbers, all cheap
    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(c.count for c in self.classes)

    @property
    def num_units(self) -> int:
        return sum(self.counts)

    @property
    def total_compute(self) -> float:
        return sum(c.count * c.compute for c in self.classes)

    @property
    def total_memory(self) -> float:
        return sum(c.count * c.memory_bytes for c in self.classes)

    @property
    def g_max(self) -> float:
        return max(c.compute for c in self.classes if c.count > 0)

    @property
    def min_group_size(self) -> int:
        """p_min: the fewest units whose memory reaches MIN (largest memory first)."""
        need, size = self.min_memory_bytes, 0
        for c in sorted(self.classes, key=lambda c: -c.memory_bytes):
            take = min(c.count, max(0, math.ceil(need / c.memory_bytes - 1e-12)))
            size += take
            need -= take * c.memory_bytes
            if need <= 0:
                return max(size, 1)
        return self.num_units  # unreachable: total memory >= MIN is checked

    @property
    def max_groups(self) -> int:
        by_memory = math.floor(self.total_memory / self.min_memory_bytes + 1e-12)
        return max(1, min(self.num_units // self.min_group_size, by_memory))

    def effective(self, counts: Sequence[int]) -> float:
        """G = S K / (K + P - 1) of a group with these unit counts (0 for an empty group)."""
        size = sum(counts)
        if size == 0:
            return 0.0
        s = sum(n * c.compute for n, c in zip(counts, self.classes))
        return s * self.num_microbatches / (self.num_microbatches + size - 1)

    def memory(self, counts: Sequence[int]) -> float:
        return sum(n * c.memory_bytes for n, c in zip(counts, self.classes))

    def upper_bound(self, k: int) -> float:
        """Bound on k z for k groups: the k excesses K S_j - z (K - 1 + P_j) are >= 0 and sum to
        K S - z (k (K - 1) + N), so z <= K S / (k (K - 1) + N)."""
        K = self.num_microbatches
        return k * K * self.total_compute / (k * (K - 1) + self.num_units)


# ---- typed results ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceGroup:
    counts: tuple[int, ...]  # units per class, in inputs.classes order
    compute: float  # S_j
    effective_compute: float  # G_j
    memory_bytes: float

    @property
    def size(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class DeviceGrouping:
    class_names: tuple[str, ...]
    groups: tuple[DeviceGroup, ...]  # effective compute, descending
    num_microbatches: int
    placement: tuple[tuple[tuple[str, str, int], ...], ...] = ()  # per group: (class, node id, units)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def min_effective_compute(self) -> float:
        return min(g.effective_compute for g in self.groups)

    @property
    def objective(self) -> float:
        """(number of groups) x (minimum effective compute): eq. (3a)."""
        return self.num_groups * self.min_effective_compute

    def compositions(self) -> list[tuple[int, ...]]:
        return sorted((g.counts for g in self.groups), reverse=True)


def make_grouping(inputs: DeviceGroupingInputs, groups: Sequence[Sequence[int]]) -> DeviceGrouping:
    """Typed grouping from unit counts per group; checks that every unit is used exactly once
    and every group has enough memory (raises FormulationInputError otherwise)."""
    groups = [tuple(int(n) for n in g) for g in groups if sum(g) > 0]
    used = tuple(sum(g[c] for g in groups) for c in range(len(inputs.classes)))
    require(used == inputs.counts, f"groups use {used} units per class, the cluster has {inputs.counts}",
            "groups")
    for j, g in enumerate(groups):
        require(inputs.memory(g) >= inputs.min_memory_bytes * (1 - 1e-9),
                f"group {g} holds {inputs.memory(g):.4g} bytes < min_memory_bytes", f"groups[{j}]")
    items = sorted(
        (DeviceGroup(g, sum(n * c.compute for n, c in zip(g, inputs.classes)), inputs.effective(g),
                     inputs.memory(g)) for g in groups),
        key=lambda d: (-d.effective_compute, [-n for n in d.counts]))
    return DeviceGrouping(tuple(c.name for c in inputs.classes), tuple(items), inputs.num_microbatches,
                          _place(inputs, [d.counts for d in items]))


def _place(inputs: DeviceGroupingInputs, groups: Sequence[tuple[int, ...]]) -> tuple:
    """Map unit counts to nodes: each class's nodes are consumed in order, group after group."""
    out: list[list[tuple[str, str, int]]] = [[] for _ in groups]
    for c, cls in enumerate(inputs.classes):
        nodes = list(cls.nodes) or [(f"{cls.name}-pool", cls.count)]
        node_i, left = 0, nodes[0][1] if nodes else 0
        for j, g in enumerate(groups):
            need = g[c]
            while need > 0:
                while left == 0:
                    node_i += 1
                    left = nodes[node_i][1]
                take = min(need, left)
                out[j].append((cls.name, nodes[node_i][0], take))
                need -= take
                left -= take
    return tuple(tuple(p) for p in out)


# ---- greedy -----------------------------------------------------------------------------------
def greedy_for(inputs: DeviceGroupingInputs, k: int) -> DeviceGrouping | None:
    """LPT with a memory seed for exactly k groups; None when some group ends short of memory."""
    C, K = len(inputs.classes), inputs.num_microbatches
    order = sorted(range(C), key=lambda c: (-inputs.classes[c].compute, -inputs.classes[c].memory_bytes))
    counts = [[0] * C for _ in range(k)]
    comp = [0.0] * k
    mem = [0.0] * k
    size = [0] * k
    heap = [(0, 0.0, j) for j in range(k)]  # (memory reached?, effective compute, group)
    for c in order:
        cls = inputs.classes[c]
        for _ in range(cls.count):
            _, _, j = heapq.heappop(heap)
            counts[j][c] += 1
            comp[j] += cls.compute
            mem[j] += cls.memory_bytes
            size[j] += 1
            eff = comp[j] * K / (K + size[j] - 1)
            heapq.heappush(heap, (int(mem[j] >= inputs.min_memory_bytes), eff, j))
    if any(m < inputs.min_memory_bytes or s == 0 for m, s in zip(mem, size)):
        return None
    return make_grouping(inputs, counts)


def greedy(inputs: DeviceGroupingInputs, k: int | None = None) -> DeviceGrouping | None:
    """The greedy grouping for k groups, or the best over k = 1..k_max when k is None."""
    if k is not None:
        return greedy_for(inputs, k)
    best = None
    for kk in range(1, inputs.max_groups + 1):
        cand = greedy_for(inputs, kk)
        if cand is not None and (best is None or cand.objective > best.objective):
            best = cand
    return best


# ---- candidate patterns -----------------------------------------------------------------------
def candidate_patterns(inputs: DeviceGroupingInputs, k: int, z_min: float,
                       minimal: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Group compositions that can occur in a solution with k groups and every G_j >= z_min.

    minimal=True keeps only minimal ones (removing any unit breaks G >= z_min or memory >= MIN);
    valid when every class adds effective compute at this threshold (`all_classes_add`).

    Returns (patterns [n x C] int, effective compute G_p [n]). The conditions are the necessary
    ones of the module docstring; the last class (the one with most units) is not enumerated but
    solved as an interval per combination of the others, so the grid is the product of the
    other classes' ranges.
    """
    C, K, N = len(inputs.classes), inputs.num_microbatches, inputs.num_units
    cnt = np.array(inputs.counts, dtype=np.int64)
    g = np.array([c.compute for c in inputs.classes])
    m = np.array([c.memory_bytes for c in inputs.classes])
    MIN, S, pmin = inputs.min_memory_bytes, inputs.total_compute, inputs.min_group_size
    last = int(np.argmax(cnt))
    rest = [c for c in range(C) if c != last]
    grid_size = int(np.prod([cnt[c] + 1 for c in rest])) if rest else 1
    if grid_size > _MAX_GRID:
        raise FormulationInputError(
            f"pattern enumeration needs {grid_size} combinations of the other classes (cap {_MAX_GRID}); "
            f"merge unit classes or use variant='counts'", "classes")
    if rest:
        axes = np.meshgrid(*[np.arange(cnt[c] + 1) for c in rest], indexing="ij")
        q = np.stack([a.reshape(-1) for a in axes], axis=1)
    else:
        q = np.zeros((1, 0), dtype=np.int64)
    Pq = q.sum(axis=1)
    Sq = q @ g[rest] if rest else np.zeros(1)
    Mq = q @ m[rest] if rest else np.zeros(1)
    gl, ml, nl = g[last], m[last], cnt[last]
    slack = K * S - z_min * (k * (K - 1) + N)
    lo = np.zeros(len(q))
    hi = np.full(len(q), float(nl))
    lo = np.maximum(lo, 1 - Pq)  # non-empty
    lo = np.maximum(lo, (MIN * (1 - 1e-12) - Mq) / ml)  # memory(p) >= MIN
    hi = np.minimum(hi, (inputs.total_memory - (k - 1) * MIN * (1 - 1e-12) - Mq) / ml)  # memory of the rest
    hi = np.minimum(hi, N - (k - 1) * pmin - Pq)  # the other k - 1 groups need p_min units each
    a = K * gl - z_min  # e_p = a n + (K Sq - z_min (K - 1 + Pq)) must lie in [0, slack]
    r = z_min * (K - 1 + Pq) - K * Sq
    tol = 1e-9 * max(1.0, K * S)
    if a > 0:
        lo = np.maximum(lo, (r - tol) / a)
        hi = np.minimum(hi, (r + slack + tol) / a)
    elif a < 0:
        lo = np.maximum(lo, (r + slack + tol) / a)
        hi = np.minimum(hi, (r - tol) / a)
    else:
        bad = (r > tol) | (r + slack < -tol)
        hi = np.where(bad, -1, hi)
    lo_i = np.ceil(lo - 1e-9).astype(np.int64)
    hi_i = np.floor(hi + 1e-9).astype(np.int64)
    keep = hi_i >= lo_i
    q, lo_i, hi_i = q[keep], lo_i[keep], hi_i[keep]
    reps = hi_i - lo_i + 1
    if reps.sum() == 0:
        return np.zeros((0, C), dtype=np.int64), np.zeros(0)
    base = np.repeat(q, reps, axis=0)
    offs = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    nlast = np.repeat(lo_i, reps) + offs
    pats = np.zeros((len(base), C), dtype=np.int64)
    pats[:, rest] = base
    pats[:, last] = nlast
    P = pats.sum(axis=1)
    G = (pats @ g) * K / (K + P - 1)
    ok = G >= z_min * (1 - 1e-12)
    pats, G = pats[ok], G[ok]
    if minimal and len(pats):
        excess = K * (pats @ g) - z_min * (K - 1 + pats.sum(axis=1))
        mem = pats @ m
        removable = np.zeros(len(pats), dtype=bool)
        for c in range(C):  # pattern minus one unit of c still feasible -> not minimal
            still = (pats[:, c] > 0) & (pats.sum(axis=1) > 1) & (excess - (K * g[c] - z_min) >= -tol) \
                & (mem - m[c] >= MIN * (1 - 1e-12))
            removable |= still
        pats, G = pats[~removable], G[~removable]
    return pats, G


def all_classes_add(inputs: DeviceGroupingInputs, z: float) -> bool:
    """True when adding any unit to a group with G >= z keeps G >= z (K g_c >= z for all c):
    then a k-grouping with min G >= z exists iff k disjoint *minimal* patterns fit (leftover
    units join any group), the packing form of the threshold model."""
    K = inputs.num_microbatches
    return all(K * c.compute >= z for c in inputs.classes if c.count > 0)


# ---- models -----------------------------------------------------------------------------------
def _z_max(inputs: DeviceGroupingInputs, k: int) -> float:
    """Upper bound on z (normalised by g_max): the sum bound for k groups."""
    return inputs.upper_bound(k) / k / inputs.g_max * (1 + 1e-9)


def build_per_gpu(inputs: DeviceGroupingInputs, max_groups: int | None = None) -> pyo.ConcreteModel:
    """AutoHet eq. (3) literally: one binary per (unit, group). Quadratic: SCIP only."""
    J = max_groups or inputs.max_groups
    require_int(J, "max_groups", minimum=1)
    units = [c for c, cls in enumerate(inputs.classes) for _ in range(cls.count)]
    N, K, gm = len(units), inputs.num_microbatches, inputs.g_max
    zmax = inputs.total_compute / gm
    m = pyo.ConcreteModel(name="device_grouping_per_gpu")
    m.I = pyo.RangeSet(0, N - 1)
    m.J = pyo.RangeSet(0, J - 1)
    m.x = pyo.Var(m.I, m.J, domain=pyo.Binary)
    m.y = pyo.Var(m.J, domain=pyo.Binary)
    m.z = pyo.Var(bounds=(0, zmax))
    g = {i: inputs.classes[units[i]].compute / gm for i in m.I}
    mem = {i: inputs.classes[units[i]].memory_bytes / inputs.min_memory_bytes for i in m.I}
    L = zmax * (K - 1 + N)
    m.obj = pyo.Objective(expr=m.z * sum(m.y[j] for j in m.J), sense=pyo.maximize)  # (3a)
    m.memory = pyo.Constraint(m.J, rule=lambda b, j: sum(mem[i] * b.x[i, j] for i in b.I) >= b.y[j])  # (3b)
    m.min_effective = pyo.Constraint(m.J, rule=lambda b, j: K * sum(g[i] * b.x[i, j] for i in b.I)
                                     + L * (1 - b.y[j]) >= b.z * (K - 1 + sum(b.x[i, j] for i in b.I)))  # (3c)
    m.used_lo = pyo.Constraint(m.J, rule=lambda b, j: sum(b.x[i, j] for i in b.I) <= N * b.y[j])  # (3d)
    m.used_hi = pyo.Constraint(m.J, rule=lambda b, j: b.y[j] <= sum(b.x[i, j] for i in b.I))  # (3d)
    m.assign = pyo.Constraint(m.I, rule=lambda b, i: sum(b.x[i, j] for j in b.J) == 1)  # (3e)
    m._hp = {"variant": "per_gpu", "inputs": inputs, "units": units, "scale": gm}
    return m


def build_counts(inputs: DeviceGroupingInputs, k: int, z_min: float = 0.0) -> pyo.ConcreteModel:
    """Counts per (group, class) for exactly k ordered groups; linear (binary size expansion)."""
    _check_k(inputs, k)
    C, K, gm = len(inputs.classes), inputs.num_microbatches, inputs.g_max
    pmax = inputs.num_units - (k - 1) * inputs.min_group_size
    bits = max(1, pmax.bit_length())
    zmax = max(_z_max(inputs, k), z_min / gm)
    m = pyo.ConcreteModel(name=f"device_grouping_counts_k{k}")
    m.J = pyo.RangeSet(0, k - 1)
    m.C = pyo.RangeSet(0, C - 1)
    m.B = pyo.RangeSet(0, bits - 1)
    m.n = pyo.Var(m.J, m.C, domain=pyo.NonNegativeIntegers, bounds=lambda b, j, c: (0, inputs.classes[c].count))
    m.beta = pyo.Var(m.J, m.B, domain=pyo.Binary)
    m.w = pyo.Var(m.J, m.B, bounds=(0, zmax))
    m.z = pyo.Var(bounds=(z_min / gm, zmax))
    g = [c.compute / gm for c in inputs.classes]
    mem = [c.memory_bytes / inputs.min_memory_bytes for c in inputs.classes]

    def S(b, j):
        return sum(g[c] * b.n[j, c] for c in b.C)

    m.obj = pyo.Objective(expr=k * m.z, sense=pyo.maximize)
    m.cover = pyo.Constraint(m.C, rule=lambda b, c: sum(b.n[j, c] for j in b.J) == inputs.classes[c].count)
    m.memory = pyo.Constraint(m.J, rule=lambda b, j: sum(mem[c] * b.n[j, c] for c in b.C) >= 1)
    m.size = pyo.Constraint(m.J, rule=lambda b, j: sum(b.n[j, c] for c in b.C)
                            == sum(2**t * b.beta[j, t] for t in b.B))
    m.size_max = pyo.Constraint(m.J, rule=lambda b, j: sum(b.n[j, c] for c in b.C) <= pmax)
    m.w_link = pyo.Constraint(m.J, m.B, rule=lambda b, j, t: b.w[j, t] >= b.z - zmax * (1 - b.beta[j, t]))
    m.min_effective = pyo.Constraint(m.J, rule=lambda b, j: K * S(b, j)
                                     >= (K - 1) * b.z + sum(2**t * b.w[j, t] for t in b.B))
    m.order = pyo.Constraint(pyo.RangeSet(0, k - 2) if k > 1 else [],
                             rule=lambda b, j: S(b, j) >= S(b, j + 1))
    m._hp = {"variant": "counts", "inputs": inputs, "k": k, "scale": gm}
    return m


def build_patterns(inputs: DeviceGroupingInputs, k: int, z_min: float = 0.0,
                   patterns: tuple[np.ndarray, np.ndarray] | None = None,
                   form: Literal["max_min", "threshold", "packing"] = "max_min") -> pyo.ConcreteModel:
    """Counted groups of identical composition for exactly k groups; linear; bubble precomputed.

    form="max_min": maximise k z (variables lambda, y, z). form="threshold": only lambda, the two
    covering rows and a constant objective: "is there a k-grouping with every G_p >= z_min?",
    the cheap question the driver asks (candidates already satisfy G_p >= z_min).
    form="packing": the threshold question over minimal patterns (pass `patterns` from
    `candidate_patterns(..., minimal=True)`; valid when `all_classes_add(inputs, z_min)`):
    sum_p lambda[p] >= k, sum_p p_c lambda[p] <= N_c.
    """
    _check_k(inputs, k)
    gm = inputs.g_max
    pats, G = patterns if patterns is not None else candidate_patterns(inputs, k, z_min)
    cnt = np.array(inputs.counts)
    ub = (np.min(np.where(pats > 0, cnt // np.maximum(pats, 1), k), axis=1) if len(pats)
          else np.zeros(0, dtype=int))
    ub = np.minimum(ub, k).astype(int)
    Gs = G / gm
    zmax = max([_z_max(inputs, k), z_min / gm, *Gs])
    m = pyo.ConcreteModel(name=f"device_grouping_patterns_k{k}")
    m.Pt = pyo.RangeSet(0, len(pats) - 1) if len(pats) else pyo.Set(initialize=[])
    m.C = pyo.RangeSet(0, len(inputs.classes) - 1)
    m.lam = pyo.Var(m.Pt, domain=pyo.NonNegativeIntegers, bounds=lambda b, p: (0, int(ub[p])))
    packing = form == "packing"
    m.groups = pyo.Constraint(expr=(sum(m.lam[p] for p in m.Pt) >= k) if packing
                              else (sum(m.lam[p] for p in m.Pt) == k))
    m.cover = pyo.Constraint(m.C, rule=lambda b, c: _cover_row(b, pats, c, int(cnt[c]), packing))
    if form == "max_min":
        m.y = pyo.Var(m.Pt, domain=pyo.Binary)
        m.z = pyo.Var(bounds=(z_min / gm, zmax))
        m.obj = pyo.Objective(expr=k * m.z, sense=pyo.maximize)
        m.use = pyo.Constraint(m.Pt, rule=lambda b, p: b.lam[p] <= int(ub[p]) * b.y[p])
        m.min_effective = pyo.Constraint(
            m.Pt, rule=lambda b, p: b.z <= float(Gs[p]) + (zmax - float(Gs[p])) * (1 - b.y[p]))
    elif form in ("threshold", "packing"):
        m.obj = pyo.Objective(expr=0.0, sense=pyo.maximize)
    else:
        raise FormulationInputError(f"unknown form {form!r}; use 'max_min', 'threshold' or 'packing'", "form")
    m._hp = {"variant": "patterns", "form": form, "inputs": inputs, "k": k, "scale": gm,
             "patterns": pats, "index": {tuple(int(v) for v in p): i for i, p in enumerate(pats)}}
    return m


def _cover_row(b: Any, pats: np.ndarray, c: int, need: int, packing: bool) -> Any:
    terms = [int(pats[p, c]) * b.lam[p] for p in b.Pt if pats[p, c]]
    if not terms:  # no candidate holds class c: fine when packing or nothing to place
        return pyo.Constraint.Feasible if (need == 0 or packing) else pyo.Constraint.Infeasible
    return sum(terms) <= need if packing else sum(terms) == need


def build(inputs: DeviceGroupingInputs, k: int | None = None, z_min: float = 0.0,
          variant: Variant = "patterns") -> pyo.ConcreteModel:
    """The per-k model of `variant` (k required), or the literal per-GPU model (k = max groups)."""
    if variant == "per_gpu":
        return build_per_gpu(inputs, k)
    require(k is not None, f"variant {variant!r} is built for a fixed number of groups k", "k")
    if variant == "counts":
        return build_counts(inputs, k, z_min)
    if variant == "patterns":
        return build_patterns(inputs, k, z_min)
    raise FormulationInputError(f"unknown variant {variant!r}; use 'patterns', 'counts' or 'per_gpu'", "variant")


def _check_k(inputs: DeviceGroupingInputs, k: int) -> None:
    require_int(k, "k", minimum=1)
    require(k <= inputs.max_groups, f"k={k} groups exceed k_max={inputs.max_groups} "
            f"(memory and units allow at most that many)", "k")


# ---- decode and warm start ----------------------------------------------------------------------
def decode(model: pyo.ConcreteModel) -> DeviceGrouping:
    """The grouping held in a solved model's variables."""
    hp = model._hp
    inputs: DeviceGroupingInputs = hp["inputs"]
    C = len(inputs.classes)
    if hp["variant"] == "per_gpu":
        groups = []
        for j in model.J:
            counts = [0] * C
            for i in model.I:
                if var_value(model.x[i, j]) > 0.5:
                    counts[hp["units"][i]] += 1
            groups.append(counts)
    elif hp["variant"] == "counts":
        groups = [[rounded(model.n[j, c]) for c in model.C] for j in model.J]
    else:
        groups = []
        for p in model.Pt:
            groups += [list(hp["patterns"][p]) for _ in range(rounded(model.lam[p]))]
        if hp["form"] == "packing":
            groups = _absorb_leftovers(inputs, groups)
    return make_grouping(inputs, groups)


def _absorb_leftovers(inputs: DeviceGroupingInputs, groups: list[list[int]]) -> list[list[int]]:
    """Give units no packed pattern uses to the groups, fastest unit to the weakest group first
    (valid for the packing form: each addition keeps G >= z)."""
    C = len(inputs.classes)
    left = [inputs.counts[c] - sum(g[c] for g in groups) for c in range(C)]
    heap = [(inputs.effective(g), j) for j, g in enumerate(groups)]
    heapq.heapify(heap)
    for c in sorted(range(C), key=lambda c: -inputs.classes[c].compute):
        for _ in range(left[c]):
            _, j = heapq.heappop(heap)
            groups[j][c] += 1
            heapq.heappush(heap, (inputs.effective(groups[j]), j))
    return groups


def warm_start(model: pyo.ConcreteModel, grouping: DeviceGrouping) -> ComponentMap:
    """The variable assignment {var: value} of `grouping` in `model` (any variant)."""
    hp = model._hp
    inputs: DeviceGroupingInputs = hp["inputs"]
    z = grouping.min_effective_compute / hp["scale"]
    pairs: list[tuple[Any, float]] = [(model.z, z)] if hasattr(model, "z") else []
    if hp["variant"] == "per_gpu":
        pos = [0] * len(inputs.classes)
        first = [sum(inputs.counts[:c]) for c in range(len(inputs.classes))]
        for j in model.J:
            pairs.append((model.y[j], 1.0 if j < grouping.num_groups else 0.0))
        owner = {}
        for j, grp in enumerate(grouping.groups):
            for c, n in enumerate(grp.counts):
                for _ in range(n):
                    owner[first[c] + pos[c]] = j
                    pos[c] += 1
        for i in model.I:
            for j in model.J:
                pairs.append((model.x[i, j], 1.0 if owner.get(i) == j else 0.0))
    elif hp["variant"] == "counts":
        ordered = sorted(grouping.groups, key=lambda d: -d.compute)
        for j, grp in zip(model.J, ordered):
            for c in model.C:
                pairs.append((model.n[j, c], grp.counts[c]))
            for t in model.B:
                bit = (grp.size >> t) & 1
                pairs += [(model.beta[j, t], bit), (model.w[j, t], z * bit)]
    else:
        used: dict[int, int] = {}
        for grp in grouping.groups:
            p = hp["index"].get(grp.counts)
            if p is None:
                continue  # composition not among the model's candidates: the start is refused
            used[p] = used.get(p, 0) + 1
        for p in model.Pt:
            pairs.append((model.lam[p], used.get(p, 0)))
            if hasattr(model, "y"):
                pairs.append((model.y[p], 1.0 if p in used else 0.0))
    return assignment(pairs)


# ---- from an instance -------------------------------------------------------------------------
def inputs_from_instance(instance: Any, estimators: Any, *, tp: int = 1, microbatch: int = 1,
                         num_microbatches: int | None = None, min_memory_bytes: float | None = None,
                         memory_fraction: float = 1.0) -> DeviceGroupingInputs:
    """Unit classes per GPU type for one TP degree, compute and memory from the estimators.

    g_c = 1 / (sum over all layer units of the fwd + bwd seconds of one microbatch on one TP group):
    microbatches per second a unit would push through the whole model, so S_j is a balanced
    pipeline's rate. m_c = tp x (capacity - framework overhead) x memory_fraction. MIN (unless
    given) = the largest over types of one worker holding the whole model at TP 1 with one
    microbatch in flight, without the per-GPU overhead (already taken off m_c). K defaults to
    global_batch_size / microbatch.
    """
    require_int(tp, "tp", minimum=1)
    require_int(microbatch, "microbatch", minimum=1)
    require(0 < memory_fraction <= 1, f"must be in (0, 1], got {memory_fraction}", "memory_fraction")
    arch = instance.model_arch
    units = range(arch.num_units)
    batch = instance.workload.global_batch_size
    K = num_microbatches if num_microbatches is not None else max(1, batch // microbatch)
    classes, min_mem = [], 0.0
    allowed = instance.constraints.allowed_gpu_types
    for gpu_type in instance.gpu_types:
        if allowed is not None and gpu_type not in allowed:
            continue
        nodes = [(n.node_id, n.num_gpus // tp) for n in instance.nodes if n.gpu_type == gpu_type and n.num_gpus >= tp]
        count = sum(u for _, u in nodes)
        if count == 0:
            continue
        step_s = sum(estimators.time.layer_time(gpu_type, u, microbatch, tp).total_s for u in units)
        whole = estimators.memory.worker_memory(gpu_type, units, 1, microbatch, 1, 1)
        cap = (whole.capacity_bytes - whole.overhead_bytes) * tp * memory_fraction
        min_mem = max(min_mem, whole.total_bytes - whole.overhead_bytes)
        classes.append(UnitClass(f"{gpu_type}/tp{tp}" if tp > 1 else gpu_type, count, 1.0 / step_s, cap, tp,
                                 tuple((nid, u) for nid, u in nodes if u > 0)))
    require(bool(classes), f"no node has {tp} GPUs of an allowed type for TP degree {tp}", "tp")
    return DeviceGroupingInputs(tuple(classes), float(min_memory_bytes or min_mem), int(K))
