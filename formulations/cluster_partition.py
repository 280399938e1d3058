"""Cluster partitioning: split the cluster into k GPU groups with the least bandwidth between groups.

Zorse (seed 001, sec. 4.3.2) runs data parallelism inside a group and pipeline parallelism across
groups, so the high-bandwidth links should stay inside groups: on the graph whose vertices are
GPUs (here: nodes, or GPUs) and whose edge weights are bandwidths, find the minimum k-cut,
for every k. Zorse uses SPLIT (Saran and Vazirani 1995): repeatedly split the component with the
lightest minimum 2-cut (Stoer-Wagner), which yields a partition for every k in one run and is
within 2 - 2/k of the optimum. This module has SPLIT as the warm start and an exact MILP.

Sets
  V vertices v (nodes or GPUs), E edges {u, v} with w_uv > 0, groups g = 0..k-1
Parameters
  w_uv   bandwidth between u and v in GB/s (node level: sum over GPU pairs, n_u n_v x link)
Variables
  x[v,g] in {0,1}  vertex v in group g;   e[u,v] >= 0  edge {u, v} is cut
Constraints
  assign:   sum_g x[v,g] = 1                                     for all v
  open:     x[v,g] <= sum_{u < v} x[u,g-1]       for g >= 1       (group g opens after group g-1:
            groups are numbered by their smallest vertex, so each partition has one labelling)
  first:    x[0,0] = 1
  nonempty: sum_v x[v,g] >= 1                                    for all g
  cut:      e[u,v] >= x[u,g] - x[v,g],  e[u,v] >= x[v,g] - x[u,g]   for all {u,v} in E, g
Objective
  min sum_{uv in E} w_uv e[u,v]       (the total bandwidth crossing between groups)
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import networkx as nx
import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.formulations.common import (
    FormulationInputError,
    assignment,
    require,
    require_finite_positive,
    require_int,
    var_value,
)


@dataclass(frozen=True)
class ClusterGraph:
    vertices: tuple[str, ...]  # node ids (or "node:gpu")
    gpus: tuple[int, ...]  # GPUs per vertex
    bandwidth_GBps: Mapping[tuple[int, int], float]  # (u, v) with u < v -> w_uv

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth_GBps", MappingProxyType(dict(self.bandwidth_GBps)))
        n = len(self.vertices)
        require(n >= 1, "the graph needs a vertex", "vertices")
        require(len(set(self.vertices)) == n, "vertex names must be unique", "vertices")
        require(len(self.gpus) == n, f"needs {n} GPU counts, got {len(self.gpus)}", "gpus")
        for i, g in enumerate(self.gpus):
            require_int(g, f"gpus[{i}]", minimum=1)
        for (u, v), w in self.bandwidth_GBps.items():
            require(0 <= u < v < n, f"edge ({u}, {v}) must have 0 <= u < v < {n}", "bandwidth_GBps")
            require_finite_positive(w, f"bandwidth_GBps[{(u, v)}]", allow_zero=True)

    @property
    def size(self) -> int:
        return len(self.vertices)

    def weight(self, u: int, v: int) -> float:
        return self.bandwidth_GBps.get((min(u, v), max(u, v)), 0.0)

    def cut(self, groups: Sequence[Sequence[int]]) -> float:
        label = {v: g for g, block in enumerate(groups) for v in block}
        return sum(w for (u, v), w in self.bandwidth_GBps.items() if label[u] != label[v])


@dataclass(frozen=True)
class ClusterPartition:
    groups: tuple[tuple[int, ...], ...]  # vertex indices, groups ordered by their smallest vertex
    cut_GBps: float

    @property
    def k(self) -> int:
        return len(self.groups)

    def named(self, graph: ClusterGraph) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(graph.vertices[v] for v in g) for g in self.groups)


def make_partition(graph: ClusterGraph, groups: Sequence[Sequence[int]]) -> ClusterPartition:
    blocks = sorted((tuple(sorted(b)) for b in groups if b), key=lambda b: b[0])
    flat = sorted(v for b in blocks for v in b)
    require(flat == list(range(graph.size)), "groups must cover every vertex exactly once", "groups")
    return ClusterPartition(tuple(blocks), graph.cut(blocks))


# ---- SPLIT greedy -----------------------------------------------------------------------------
def _min_cut(graph: ClusterGraph, block: Sequence[int]) -> tuple[float, list[int], list[int]]:
    """Lightest 2-cut of the subgraph on `block` (Stoer-Wagner; 0 across disconnected parts)."""
    g = nx.Graph()
    g.add_nodes_from(block)
    for u, v in combinations(block, 2):
        w = graph.weight(u, v)
        if w > 0:
            g.add_edge(u, v, weight=w)
    parts = list(nx.connected_components(g))
    if len(parts) > 1:
        first = sorted(parts[0])
        return 0.0, first, sorted(set(block) - set(first))
    value, (a, b) = nx.stoer_wagner(g, weight="weight")
    return float(value), sorted(a), sorted(b)


def split(graph: ClusterGraph, k_max: int | None = None) -> list[ClusterPartition]:
    """SPLIT: partitions for k = 1..k_max (default |V|), each from the previous by the lightest
    minimum cut of one of its groups."""
    k_max = k_max or graph.size
    require(1 <= k_max <= graph.size, f"k_max must be in 1..{graph.size}", "k_max")
    blocks = [list(range(graph.size))]
    out = [make_partition(graph, blocks)]
    cache: dict[tuple[int, ...], tuple[float, list[int], list[int]]] = {}
    while len(blocks) < k_max:
        best = None
        for i, b in enumerate(blocks):
            if len(b) < 2:
                continue
            key = tuple(b)
            if key not in cache:
                cache[key] = _min_cut(graph, b)
            if best is None or cache[key][0] < best[0]:
                best = (cache[key][0], i)
        _, i = best
        _, a, b = cache[tuple(blocks[i])]
        blocks = blocks[:i] + [a, b] + blocks[i + 1:]
        out.append(make_partition(graph, blocks))
    return out


def greedy(graph: ClusterGraph, k: int) -> ClusterPartition:
    return split(graph, k)[k - 1]


# ---- exact MILP -------------------------------------------------------------------------------
def build(graph: ClusterGraph, k: int) -> pyo.ConcreteModel:
    require_int(k, "k", minimum=1)
    require(k <= graph.size, f"k={k} groups need at least {k} vertices, the graph has {graph.size}", "k")
    n = graph.size
    edges = sorted((u, v) for (u, v), w in graph.bandwidth_GBps.items() if w > 0)
    m = pyo.ConcreteModel(name=f"cluster_partition_k{k}")
    m.V = pyo.RangeSet(0, n - 1)
    m.G = pyo.RangeSet(0, k - 1)
    m.x = pyo.Var(m.V, m.G, domain=pyo.Binary)
    m.e = pyo.Var(edges, bounds=(0, 1))
    for v in range(n):
        for g in range(k):
            if g > v:
                m.x[v, g].fix(0)  # implied by `open`; fixing shrinks the model
    m.x[0, 0].fix(1)
    m.assign = pyo.Constraint(m.V, rule=lambda b, v: sum(b.x[v, g] for g in b.G) == 1)
    m.open = pyo.Constraint([(v, g) for v in range(1, n) for g in range(1, min(k, v + 1))],
                            rule=lambda b, v, g: b.x[v, g] <= sum(b.x[u, g - 1] for u in range(v)))
    m.nonempty = pyo.Constraint(m.G, rule=lambda b, g: sum(b.x[v, g] for v in b.V) >= 1)
    m.cut_a = pyo.Constraint([(u, v, g) for u, v in edges for g in range(k)],
                             rule=lambda b, u, v, g: b.e[u, v] >= b.x[u, g] - b.x[v, g])
    m.cut_b = pyo.Constraint([(u, v, g) for u, v in edges for g in range(k)],
                             rule=lambda b, u, v, g: b.e[u, v] >= b.x[v, g] - b.x[u, g])
    m.obj = pyo.Objective(expr=sum(graph.weight(u, v) * m.e[u, v] for u, v in edges), sense=pyo.minimize)
    m._hp = {"graph": graph, "k": k, "edges": edges}
    return m


def decode(model: pyo.ConcreteModel) -> ClusterPartition:
    graph: ClusterGraph = model._hp["graph"]
    groups: dict[int, list[int]] = {}
    for v in model.V:
        g = max(model.G, key=lambda g: var_value(model.x[v, g]))
        groups.setdefault(g, []).append(v)
    return make_partition(graph, list(groups.values()))


def warm_start(model: pyo.ConcreteModel, part: ClusterPartition) -> ComponentMap:
    """Assignment of `part` (relabelled canonically: groups by smallest vertex)."""
    label = {v: g for g, block in enumerate(part.groups) for v in block}
    pairs: list[tuple[Any, float]] = [(model.x[v, g], 1.0 if label[v] == g else 0.0) for v in model.V for g in model.G]
    pairs += [(model.e[u, v], 0.0 if label[u] == label[v] else 1.0) for u, v in model._hp["edges"]]
    return assignment(pairs)


# ---- exhaustive (reference) ----------------------------------------------------------------------
def partitions_into(n: int, k: int) -> Iterator[list[list[int]]]:
    """Every partition of 0..n-1 into exactly k non-empty blocks (Stirling number S(n, k) many)."""
    def rec(v: int, blocks: list[list[int]]) -> Iterator[list[list[int]]]:
        if v == n:
            if len(blocks) == k:
                yield [list(b) for b in blocks]
            return
        if n - v < k - len(blocks):
            return
        for b in blocks:
            b.append(v)
            yield from rec(v + 1, blocks)
            b.pop()
        if len(blocks) < k:
            blocks.append([v])
            yield from rec(v + 1, blocks)
            blocks.pop()

    yield from rec(0, [])


def min_k_cut_exhaustive(graph: ClusterGraph, k: int) -> ClusterPartition:
    best = min(partitions_into(graph.size, k), key=graph.cut)
    return make_partition(graph, best)


# ---- from an instance -------------------------------------------------------------------------
def inputs_from_instance(instance: Any, estimators: Any, level: str = "node") -> ClusterGraph:
    """The bandwidth graph: level="node" (vertex = node, w = n_u n_v x link bandwidth, Zorse's GPU
    graph with each node's GPUs kept together) or level="gpu" (vertex = GPU, intra-node edges too)."""
    from hetplan.estimators.base import Endpoint

    nodes = instance.nodes
    ends = [Endpoint(n.zone, n.region, n.node_id, n.intra_node) for n in nodes]
    if level == "node":
        w = {}
        for a, b in combinations(range(len(nodes)), 2):
            bw = estimators.comm.link(ends[a], ends[b]).bandwidth_GBps
            w[(a, b)] = nodes[a].num_gpus * nodes[b].num_gpus * bw
        return ClusterGraph(tuple(n.node_id for n in nodes), tuple(n.num_gpus for n in nodes), w)
    if level == "gpu":
        verts, owner = [], []
        for i, n in enumerate(nodes):
            for g in range(n.num_gpus):
                verts.append(f"{n.node_id}:{g}")
                owner.append(i)
        w = {}
        for a, b in combinations(range(len(verts)), 2):
            w[(a, b)] = estimators.comm.link(ends[owner[a]], ends[owner[b]]).bandwidth_GBps
        return ClusterGraph(tuple(verts), tuple(1 for _ in verts), w)
    raise FormulationInputError(f"unknown level {level!r}; use 'node' or 'gpu'", "level")
