"""Build vs solve seconds of one joint-planner MILP per back-end, with and without its greedy start.

    python benchmarks/joint_warmstart.py [--instance a100_v100_one_zone] [--P 5 --b 1 --D 2] [--time-limit 30]
"""
from __future__ import annotations

import argparse
import time

from hetplan.estimators import build_estimators
from hetplan.formulations import joint
from hetplan.instance import load_instance
from hetplan.orchestration.planner import Combo, PlannerOptions, joint_inputs
from hetplan.orchestration.planner.inputs import _quotas, _Tables
from hetplan.solvers import SolveOptions, get_backend, solve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instance", default="a100_v100_one_zone")
    ap.add_argument("--P", type=int, default=5)
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--D", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=30.0)
    args = ap.parse_args()
    inst = load_instance(args.instance)
    tables = _Tables(inst, build_estimators(inst))
    inp = joint_inputs(inst, tables, _quotas(inst, PlannerOptions()), Combo(args.P, args.b, args.D),
                       "max_throughput", None, None, (1, 2, 4))
    g = joint.greedy(inp)
    print(f"{inst.name} P={args.P} b={args.b} D={args.D}: {inp.K} pools x {inp.U} units; "
          f"greedy T = {joint.evaluate(inp, g)['T']:.5f} s" if g else "no greedy")
    header = f"{'backend':8} {'start':6} {'vars':>6} {'rows':>6} {'build s':>8} {'solve s':>8} {'status':10} {'objective':>10} {'bound':>10} {'gap':>8} {'nodes':>7} {'accepted':>8}"
    print(header)
    for backend in ("highs", "scip"):
        if not get_backend(backend).available():
            continue
        for use_start in (False, True):
            t0 = time.perf_counter()
            model = joint.build(inp)
            start = joint.warm_start(model, inp, g) if (use_start and g) else None
            build_s = time.perf_counter() - t0
            r = solve(model, backend=backend, warm_start=start,
                      options=SolveOptions(time_limit_s=args.time_limit, rel_gap=1e-4, threads=1, diagnose_infeasible=False))
            nvars = sum(1 for _ in model.component_data_objects(ctype=None, descend_into=True) if hasattr(_, "domain"))
            nrows = sum(1 for _ in model.component_data_objects(ctype=joint.milp.pyo.Constraint, active=True))
            gap = f"{100 * r.gap:.2f}%" if r.gap is not None else "-"
            print(f"{backend:8} {'greedy' if start else 'none':6} {nvars:>6} {nrows:>6} {build_s:>8.2f} {r.solve_s:>8.2f} "
                  f"{r.status.value:10} {r.objective if r.objective is not None else float('nan'):>10.5f} "
                  f"{r.bound if r.bound is not None else float('nan'):>10.5f} {gap:>8} {r.nodes if r.nodes is not None else '-':>7} "
                  f"{str(r.warm_start_accepted):>8}", flush=True)


if __name__ == "__main__":
    main()
