"""Gurobi back-end through gurobipy (optional: reported "not available" without gurobipy or licence).

Linear and quadratic (non-convex via NonConvex=2) models; general nonlinear terms are refused by
`missing_capability` before `run`. A start goes into each variable's `Start` attribute (Gurobi
completes partial starts itself); acceptance is read from the log ("User MIP start produced
solution" / "Loaded user MIP start"). This module is not exercised where gurobipy is absent.
"""
from __future__ import annotations

import math
import re
from time import perf_counter
from typing import Any

import numpy as np

from hetplan.errors import SolverError
from hetplan.solvers.api import SolveOptions, Status
from hetplan.solvers.model_view import ModelView
from hetplan.solvers.registry import Backend, Capabilities, Outcome, Probe, RunRequest

_ACCEPTED = re.compile(r"(User MIP start produced solution with objective|Loaded user MIP start with objective)[^\n]*")
_REJECTED = re.compile(r"User MIP start did not produce a new incumbent solution[^\n]*")


class GurobiBackend(Backend):
    name = "gurobi"
    capabilities = Capabilities(integer=True, quadratic=True, nonlinear=False, warm_start=True,
                                partial_warm_start=True, dual_bound=True)

    @classmethod
    def _detect(cls) -> Probe:
        try:
            import gurobipy
        except ImportError:
            return Probe(False, None, "gurobipy is not installed")
        version = "Gurobi " + ".".join(str(p) for p in gurobipy.gurobi.version())
        try:
            env = gurobipy.Env(empty=True)
            env.setParam("OutputFlag", 0)
            env.start()  # fails here without a valid licence
            env.dispose()
        except gurobipy.GurobiError as exc:
            return Probe(False, version, f"no usable Gurobi licence: {exc}")
        return Probe(True, version, "")

    def run(self, view: ModelView, request: RunRequest) -> Outcome:
        import gurobipy as gp

        t0 = perf_counter()
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 1)
        env.setParam("LogToConsole", int(request.options.verbose and not request.quiet))
        env.setParam("LogFile", request.log_path)
        env.start()
        model = gp.Model(env=env)
        try:
            xs = _build(model, view, gp)
            _set_params(model, request.options, view, gp)
            has_start = _set_start(xs, request)
            build_s = perf_counter() - t0
            t1 = perf_counter()
            try:
                model.optimize()
            except gp.GurobiError as exc:
                return Outcome(Status.ERROR, "exception", build_s=build_s, solve_s=perf_counter() - t1,
                               message=f"Gurobi failed: {exc}")
            solve_s = perf_counter() - t1
            outcome = _outcome(model, view, xs, gp, build_s, solve_s)
        finally:
            model.dispose()
            env.dispose()
        outcome.warm_start_accepted = _start_accepted(request.log_path) if has_start else None
        return outcome


def _build(model: Any, view: ModelView, gp: Any) -> list[Any]:
    vtypes = [gp.GRB.INTEGER if i else gp.GRB.CONTINUOUS for i in view.var_integer.tolist()]
    lb = [-gp.GRB.INFINITY if not math.isfinite(v) else v for v in view.var_lb.tolist()]
    ub = [gp.GRB.INFINITY if not math.isfinite(v) else v for v in view.var_ub.tolist()]
    xs = [model.addVar(lb=lb[k], ub=ub[k], vtype=vtypes[k], name=v.name) for k, v in enumerate(view.vars)]
    for r in range(view.n_rows):
        cols, coefs = view.row_slice(r)
        lin = gp.LinExpr(coefs.tolist(), [xs[j] for j in cols.tolist()])
        lo, hi = float(view.row_lb[r]), float(view.row_ub[r])
        name = view.row_names[r]
        quad = view.row_quad.get(r)
        expr = lin if not quad else gp.QuadExpr(lin) + gp.quicksum(c * xs[i] * xs[j] for i, j, c in quad)
        add = model.addQConstr if quad else model.addLConstr
        if math.isfinite(lo) and math.isfinite(hi) and lo == hi:
            add(expr == lo, name=name)
        elif math.isfinite(lo) and math.isfinite(hi) and not quad:
            model.addRange(lin, lo, hi, name=name)
        else:
            if math.isfinite(lo):
                add(expr >= lo, name=name if not math.isfinite(hi) else name + "_lo")
            if math.isfinite(hi):
                add(expr <= hi, name=name if not math.isfinite(lo) else name + "_hi")
    obj = view.objective
    if obj is not None:
        expr = gp.LinExpr(obj.coefs.tolist(), [xs[j] for j in obj.cols.tolist()]) + obj.constant
        if obj.quad:
            expr = gp.QuadExpr(expr) + gp.quicksum(c * xs[i] * xs[j] for i, j, c in obj.quad)
        model.setObjective(expr, gp.GRB.MAXIMIZE if obj.maximize else gp.GRB.MINIMIZE)
    return xs


def _set_params(model: Any, o: SolveOptions, view: ModelView, gp: Any) -> None:
    params: dict[str, Any] = {"MIPGap": o.rel_gap, "MIPGapAbs": o.abs_gap, "Seed": o.seed}
    if o.time_limit_s is not None:
        params["TimeLimit"] = o.time_limit_s
    if o.threads is not None:
        params["Threads"] = o.threads
    if view.row_quad or (view.objective is not None and view.objective.quad):
        params["NonConvex"] = 2  # bilinear terms are rarely convex
    params.update(o.solver_options)
    for key, value in params.items():
        try:
            model.setParam(key, value)
        except gp.GurobiError as exc:
            raise SolverError(f"Gurobi rejected option {key}={value!r}: {exc}") from exc


def _set_start(xs: list[Any], request: RunRequest) -> bool:
    if request.start is None:
        return False
    for x, val in zip(xs, request.start.values.tolist()):
        if not math.isnan(val):
            x.Start = val
    return True


def _start_accepted(log_path: str) -> bool | None:
    try:
        with open(log_path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    if _ACCEPTED.search(text):
        return True
    return False if _REJECTED.search(text) else None


def _outcome(model: Any, view: ModelView, xs: list[Any], gp: Any, build_s: float, solve_s: float) -> Outcome:
    code = model.Status
    G = gp.GRB
    word = {G.OPTIMAL: "optimal", G.INFEASIBLE: "infeasible", G.INF_OR_UNBD: "inf_or_unbd", G.UNBOUNDED: "unbounded",
            G.TIME_LIMIT: "time_limit", G.NODE_LIMIT: "node_limit", G.SOLUTION_LIMIT: "solution_limit",
            G.ITERATION_LIMIT: "iteration_limit", G.INTERRUPTED: "interrupted", G.NUMERIC: "numeric",
            G.SUBOPTIMAL: "suboptimal", G.MEM_LIMIT: "mem_limit"}.get(code, f"status_{code}")
    has_sol = model.SolCount > 0
    objective = float(model.ObjVal) if has_sol else None
    try:
        bound = float(model.ObjBound)
    except (gp.GurobiError, AttributeError):
        bound = objective if code == G.OPTIMAL else None
    values = np.array([x.X for x in xs], dtype=float) if has_sol else None
    try:
        nodes = int(model.NodeCount)
    except (gp.GurobiError, AttributeError):
        nodes = None
    if code == G.INF_OR_UNBD:
        return Outcome(Status.INFEASIBLE, word, build_s=build_s, solve_s=solve_s, infeasible_or_unbounded=True)
    status = {G.OPTIMAL: Status.OPTIMAL, G.INFEASIBLE: Status.INFEASIBLE, G.UNBOUNDED: Status.UNBOUNDED}.get(code)
    message = ""
    if status is None:
        if code == G.NUMERIC:
            status, message = (Status.FEASIBLE if has_sol else Status.ERROR), "Gurobi reports numerical trouble"
        else:
            status = Status.FEASIBLE if has_sol else Status.TIME_LIMIT_NO_SOLUTION
    if status in (Status.INFEASIBLE, Status.UNBOUNDED, Status.ERROR):
        objective, bound, values = None, None, None
    if view.objective is None and objective is not None:
        objective, bound = 0.0, 0.0
    return Outcome(status, word, objective=objective, bound=bound, nodes=nodes, values=values,
                   build_s=build_s, solve_s=solve_s, message=message)
