"""The exact driver of the cluster-partition formulation (formulations/cluster_partition.py,
Zorse sec. 4.3.2): SPLIT and the exact MILP, warm-started by SPLIT, for every group count k."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from hetplan.formulations.cluster_partition import ClusterGraph, ClusterPartition, build, decode, split, warm_start
from hetplan.solvers import SolveOptions, solve


@dataclass(frozen=True)
class KCutResult:
    k: int
    split: ClusterPartition
    exact: ClusterPartition | None
    status: str
    bound_GBps: float | None
    solve_s: float

    @property
    def split_ratio(self) -> float | None:
        """SPLIT's cut / the optimum (1 = optimal; Saran-Vazirani guarantee <= 2 - 2/k)."""
        if self.exact is None:
            return None
        if self.exact.cut_GBps == 0:
            return 1.0 if self.split.cut_GBps == 0 else float("inf")
        return self.split.cut_GBps / self.exact.cut_GBps


def solve_all_k(graph: ClusterGraph, backend: str | None = None, options: Any = None,
                k_values: Sequence[int] | None = None) -> list[KCutResult]:
    """SPLIT and the exact MILP (warm-started by SPLIT) for every k (default 1..|V|)."""
    opts = options or SolveOptions(rel_gap=0.0)
    parts = split(graph)
    out = []
    for k in k_values or range(1, graph.size + 1):
        model = build(graph, k)
        res = solve(model, backend=backend, options=opts, warm_start=warm_start(model, parts[k - 1]))
        exact = decode(model) if res.status.has_solution else None
        out.append(KCutResult(k, parts[k - 1], exact, res.status.value, res.bound, res.solve_s))
    return out

