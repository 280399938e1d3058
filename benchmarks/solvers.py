"""Benchmark of the solver layer on one mid-size stand-in MILP, with and without a greedy start.

Model: single-source capacitated facility location (think: GPU nodes = sites with a capacity,
training jobs = customers with a demand), `F x C` assignment binaries + `F` open binaries,
`serve[f, c] <= open[f]` linking rows (the strong formulation), capacity and assignment rows.
Cornuejols-style random instance: points in the unit square, cost = distance x demand.

    python benchmarks/solvers.py [--facilities 30] [--customers 100] [--time-limit 20] [--seed 0]

Prints per back-end, with and without warm start: build s, solve s, status, objective, bound,
gap, nodes and whether the start was accepted (from the solver's log).
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.solvers import SolveOptions, describe_backends, solve


def instance(n_fac: int, n_cust: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    fac_xy, cust_xy = rng.random((n_fac, 2)), rng.random((n_cust, 2))
    demand = rng.integers(5, 36, n_cust)
    capacity = rng.integers(10, 161, n_fac)
    capacity = np.ceil(capacity * 3.0 * demand.sum() / capacity.sum()).astype(int)  # total capacity ~ 3x demand
    fixed = rng.integers(0, 90, n_fac) + rng.integers(100, 111, n_fac) * np.sqrt(capacity)
    dist = np.linalg.norm(fac_xy[:, None, :] - cust_xy[None, :, :], axis=2)
    cost = np.round(10 * dist * demand[None, :], 2)
    return {"demand": demand, "capacity": capacity, "fixed": np.round(fixed, 2), "cost": cost}


def build(data: dict[str, np.ndarray]) -> pyo.ConcreteModel:
    F, C = range(len(data["capacity"])), range(len(data["demand"]))
    m = pyo.ConcreteModel()
    m.open = pyo.Var(F, domain=pyo.Binary)
    m.serve = pyo.Var(F, C, domain=pyo.Binary)
    m.assign = pyo.Constraint(C, rule=lambda m, c: sum(m.serve[f, c] for f in F) == 1)
    m.capacity = pyo.Constraint(F, rule=lambda m, f: sum(int(data["demand"][c]) * m.serve[f, c] for c in C)
                                <= int(data["capacity"][f]) * m.open[f])
    m.link = pyo.Constraint(F, C, rule=lambda m, f, c: m.serve[f, c] <= m.open[f])
    m.obj = pyo.Objective(expr=sum(float(data["fixed"][f]) * m.open[f] for f in F)
                          + sum(float(data["cost"][f, c]) * m.serve[f, c] for f in F for c in C))
    return m


def greedy(m: pyo.ConcreteModel, data: dict[str, np.ndarray]) -> ComponentMap:
    """Open the cheapest sites per unit capacity until 1.3x demand, then best-fit customers by cost."""
    demand, capacity, fixed, cost = data["demand"], data["capacity"], data["fixed"], data["cost"]
    order = list(np.argsort(fixed / capacity))
    opened: list[int] = []
    while sum(capacity[f] for f in opened) < 1.3 * demand.sum():
        opened.append(int(order.pop(0)))
    residual = {f: int(capacity[f]) for f in opened}
    site = {}
    for c in np.argsort(-demand):
        fits = [f for f in opened if residual[f] >= demand[c]]
        while not fits:  # open the next site that can take this customer
            f = int(order.pop(0))
            opened.append(f)
            residual[f] = int(capacity[f])
            fits = [f] if residual[f] >= demand[c] else []
        best = min(fits, key=lambda f: cost[f, c])
        residual[best] -= int(demand[c])
        site[int(c)] = best
    start = ComponentMap()
    for f in range(len(capacity)):
        start[m.open[f]] = int(f in residual)
        for c in range(len(demand)):
            start[m.serve[f, c]] = int(site[c] == f)
    return start


def _fmt(x: float | None, spec: str = ".6g") -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--facilities", type=int, default=30)
    p.add_argument("--customers", type=int, default=100)
    p.add_argument("--time-limit", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backends", default=",".join(r.name for r in describe_backends() if r.available))
    args = p.parse_args(argv)
    data = instance(args.facilities, args.customers, args.seed)
    probe = build(data)
    n_vars = sum(1 for _ in probe.component_data_objects(pyo.Var))
    n_rows = sum(1 for _ in probe.component_data_objects(pyo.Constraint))
    print(f"capacitated facility location: {args.facilities} sites x {args.customers} customers, "
          f"{n_vars} binaries, {n_rows} rows; time limit {args.time_limit:g} s, {args.threads} thread(s), "
          f"rel_gap 1e-4")
    header = ["backend", "start", "build s", "solve s", "status", "objective", "bound", "gap", "nodes", "ws accepted"]
    rows = []
    for name in args.backends.split(","):
        for with_start in (False, True):
            m = build(data)
            start = greedy(m, data) if with_start else None
            r = solve(m, name, SolveOptions(time_limit_s=args.time_limit, threads=args.threads, seed=args.seed),
                      warm_start=start)
            rows.append([name, f"greedy {_fmt(r.warm_start_objective, '.1f')}" if with_start else "none",
                         f"{r.build_s:.2f}", f"{r.solve_s:.2f}", r.status.value, _fmt(r.objective, ".2f"),
                         _fmt(r.bound, ".2f"), _fmt(r.gap, ".2e"), str(r.nodes),
                         "-" if r.warm_start_accepted is None else str(r.warm_start_accepted)])
            print("  done:", r.summary(), file=sys.stderr)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for row in rows:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
