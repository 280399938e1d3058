"""SCIP back-end, driven directly through PySCIPOpt (MILP and MINLP).

Why not Pyomo's scip_direct: it passes only the integer part of a start, keeps no names, and its
`optimize()` holds the GIL while Pyomo's stdout reader needs it, so a solve that logs more than a
pipe buffer (64 KiB) blocks forever. Here SCIP runs under `optimizeNogil()`, always logs to a
file (`setLogfile`), prints to the console only when verbose, and takes a full start (continuous
variables and the objective auxiliary included) or a partial one that its `completesol`
heuristic completes. Acceptance is read from SCIP's own log:
  full start    -> "k/n feasible solution given by solution candidate storage" (k >= 1)
  partial start -> "feasible solution found by completesol heuristic".
A nonlinear or quadratic objective becomes `min z` with `z >= f(x)` (SCIP objectives are linear).
"""
from __future__ import annotations

import math
import os
import re
from functools import reduce
from operator import add
from time import perf_counter
from typing import Any

import numpy as np
from pyomo.common.numeric_types import native_numeric_types
from pyomo.core.expr import numeric_expr as ne

from hetplan.errors import SolverError
from hetplan.solvers.api import SolveOptions, Status
from hetplan.solvers.model_view import ModelView
from hetplan.solvers.registry import Backend, Capabilities, Outcome, Probe, RunRequest

_FULL_START = re.compile(r"(\d+)/(\d+) feasible solution given by solution candidate storage")
_PARTIAL_START = re.compile(r"feasible solution found by completesol heuristic.*objective value\s+(\S+)")
_PARTIAL_IGNORED = re.compile(r"ignore partial solution.*")

_LIMITS = {"timelimit", "memlimit", "nodelimit", "totalnodelimit", "stallnodelimit", "sollimit",
           "bestsollimit", "restartlimit", "userinterrupt", "primallimit", "duallimit", "terminate"}


class ScipBackend(Backend):
    name = "scip"
    capabilities = Capabilities(integer=True, quadratic=True, nonlinear=True, warm_start=True,
                                partial_warm_start=True, dual_bound=True)

    @classmethod
    def _detect(cls) -> Probe:
        try:
            import pyscipopt
        except ImportError as exc:
            return Probe(False, None, f"pyscipopt is not installed ({exc}); pip install pyscipopt")
        m = pyscipopt.Model()
        m.hideOutput()
        version = f"{m.getMajorVersion()}.{m.getMinorVersion()}.{m.getTechVersion()}"
        return Probe(True, f"SCIP {version} (PySCIPOpt {pyscipopt.__version__})", "")

    def run(self, view: ModelView, request: RunRequest) -> Outcome:
        import pyscipopt as scip

        t0 = perf_counter()
        m = scip.Model()
        m.hideOutput(quiet=request.quiet or not request.options.verbose)
        m.setLogfile(request.log_path)
        try:
            xs = _add_columns(m, view)
            _add_rows(m, view, xs, scip)
            aux = _set_objective(m, view, xs, scip)
            _set_params(m, request.options, request.quiet)
            start_kind = _add_start(m, view, xs, aux, request)
        except SolverError:
            m.setLogfile(None)
            raise
        build_s = perf_counter() - t0
        t1 = perf_counter()
        try:
            m.optimizeNogil()  # releases the GIL: no deadlock with a Python thread draining stdout
        except Exception as exc:  # SCIP errors surface as generic exceptions from PySCIPOpt
            m.setLogfile(None)
            return Outcome(Status.ERROR, "exception", build_s=build_s, solve_s=perf_counter() - t1,
                           message=f"SCIP failed: {exc}")
        solve_s = perf_counter() - t1
        m.setLogfile(None)  # flush and release the log file before we read it
        outcome = _outcome(m, view, xs, build_s, solve_s)
        outcome.warm_start_accepted, line = _start_accepted(request.log_path, start_kind, m)
        if line:
            outcome.stats["warm_start_log_line"] = line
        m.freeProb()
        return outcome


def _add_columns(m: Any, view: ModelView) -> list[Any]:
    xs = []
    for k, v in enumerate(view.vars):
        lb, ub = view.var_lb[k], view.var_ub[k]
        integer = bool(view.var_integer[k])
        vtype = "B" if integer and lb >= 0 and ub <= 1 else ("I" if integer else "C")
        xs.append(m.addVar(name=v.name, vtype=vtype, lb=float(lb) if math.isfinite(lb) else None,
                           ub=float(ub) if math.isfinite(ub) else None))
    return xs


def _linear(xs: list[Any], cols: np.ndarray, coefs: np.ndarray, scip: Any) -> Any:
    return scip.quicksum(c * xs[j] for j, c in zip(cols.tolist(), coefs.tolist()))


def _add_rows(m: Any, view: ModelView, xs: list[Any], scip: Any) -> None:
    by_id = {id(v): x for v, x in zip(view.vars, xs)}
    for r in range(view.n_rows):
        cols, coefs = view.row_slice(r)
        expr = _linear(xs, cols, coefs, scip)
        for i, j, c in view.row_quad.get(r, ()):
            expr = expr + c * xs[i] * xs[j]
        if r in view.row_nonlinear:
            expr = expr + to_scip(view.row_nonlinear[r], by_id, scip, f"constraint '{view.row_names[r]}'")
        lb, ub = view.row_lb[r], view.row_ub[r]
        cons = scip.ExprCons(expr, lhs=float(lb) if math.isfinite(lb) else None,
                             rhs=float(ub) if math.isfinite(ub) else None)
        m.addCons(cons, name=view.row_names[r])


def _set_objective(m: Any, view: ModelView, xs: list[Any], scip: Any) -> Any | None:
    """Set the objective; returns the auxiliary variable when the objective is not linear."""
    obj = view.objective
    if obj is None:
        return None
    sense = "maximize" if obj.maximize else "minimize"
    expr = _linear(xs, obj.cols, obj.coefs, scip)
    if obj.is_linear:
        m.setObjective(expr + obj.constant, sense)
        return None
    for i, j, c in obj.quad:
        expr = expr + c * xs[i] * xs[j]
    if obj.nonlinear is not None:
        by_id = {id(v): x for v, x in zip(view.vars, xs)}
        expr = expr + to_scip(obj.nonlinear, by_id, scip, f"objective '{obj.name}'")
    z = m.addVar(name="hetplan_objective", vtype="C", lb=None, ub=None)
    # min z, z >= f(x)   |   max z, z <= f(x)
    m.addCons(scip.ExprCons(z - expr - obj.constant, lhs=None if obj.maximize else 0.0,
                            rhs=0.0 if obj.maximize else None), name="hetplan_objective_link")
    m.setObjective(z, sense)
    return z


def _default_memory_MB() -> float:
    try:
        return 0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return 8192.0


def _set_params(m: Any, o: SolveOptions, quiet: bool) -> None:
    params: dict[str, Any] = {
        "limits/gap": o.rel_gap,
        "limits/absgap": o.abs_gap,
        "randomization/randomseedshift": o.seed,
        "limits/memory": o.memory_limit_MB or _default_memory_MB(),  # SCIP stops with memlimit instead of the OS killing us
    }
    if o.time_limit_s is not None:
        params["limits/time"] = o.time_limit_s
    if o.threads is not None:
        params["lp/threads"] = o.threads
    params.update(o.solver_options)  # native options last: they override the common ones
    for key, value in params.items():
        try:
            m.setParam(key, value)
        except (KeyError, LookupError, ValueError, TypeError) as exc:
            raise SolverError(f"SCIP rejected option {key}={value!r}: {exc}") from exc


def _add_start(m: Any, view: ModelView, xs: list[Any], aux: Any | None, request: RunRequest) -> str | None:
    start = request.start
    if start is None:
        return None
    x = start.values
    if start.complete:
        sol = m.createSol()
        for k, val in enumerate(x.tolist()):
            m.setSolVal(sol, xs[k], val)
        if aux is not None:  # otherwise SCIP sees the start with objective 0 (the aux's default)
            m.setSolVal(sol, aux, view.objective_value(x))
        m.addSol(sol, free=True)
        return "full"
    sol = m.createPartialSol()
    for k in np.flatnonzero(~np.isnan(x)).tolist():
        m.setSolVal(sol, xs[k], float(x[k]))
    m.addSol(sol, free=True)
    return "partial"


def _start_accepted(log_path: str, kind: str | None, m: Any) -> tuple[bool | None, str]:
    """Did SCIP use the start? Read its log; fall back to None when the log is silent."""
    if kind is None:
        return None, ""
    try:
        with open(log_path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None, ""
    if kind == "full":
        for match in _FULL_START.finditer(text):
            if int(match.group(1)) >= 1:
                return True, match.group(0)
    else:
        match = _PARTIAL_START.search(text)
        if match:
            return True, match.group(0)
        refused = _PARTIAL_IGNORED.search(text)  # e.g. too many unknowns for completesol
        if refused:
            return False, refused.group(0).strip()
    # Display turned off by a native option: the log cannot tell.
    return (False if "presolving" in text.lower() else None), ""


def _outcome(m: Any, view: ModelView, xs: list[Any], build_s: float, solve_s: float) -> Outcome:
    word = m.getStatus()
    nsols = m.getNSols()
    inf = m.infinity()
    objective = m.getObjVal() if nsols > 0 else None
    bound = m.getDualbound()
    bound = math.copysign(math.inf, bound) if abs(bound) >= inf else float(bound)
    values = None
    if nsols > 0:
        best = m.getBestSol()
        values = np.array([m.getSolVal(best, x) for x in xs], dtype=float)
    stats = {
        "solutions_found": m.getNSolsFound(),
        "first_primal_bound": m.getFirstPrimalBound() if nsols > 0 else None,
        "lp_iterations": m.getNLPIterations(),
        "presolve_s": m.getPresolvingTime(),
        "scip_solving_s": m.getSolvingTime(),
    }
    if word in ("optimal", "gaplimit"):
        status = Status.OPTIMAL if nsols > 0 else Status.ERROR
    elif word == "infeasible":
        status = Status.INFEASIBLE
    elif word == "unbounded":
        status = Status.UNBOUNDED
    elif word == "inforunbd":
        return Outcome(Status.INFEASIBLE, word, nodes=m.getNTotalNodes(), build_s=build_s, solve_s=solve_s,
                       stats=stats, infeasible_or_unbounded=True)
    elif word in _LIMITS:
        status = Status.FEASIBLE if nsols > 0 else Status.TIME_LIMIT_NO_SOLUTION
    else:
        status = Status.FEASIBLE if nsols > 0 else Status.ERROR
    message = ""
    if word == "memlimit":
        message = "SCIP stopped at its memory limit (SolveOptions.memory_limit_MB / limits/memory)"
    elif status is Status.ERROR:
        message = f"SCIP stopped with status '{word}' and no solution (numerical trouble?)"
    if not status.has_solution:  # an unbounded ray's point is no incumbent
        objective, values = None, None
        bound = bound if status is Status.TIME_LIMIT_NO_SOLUTION and math.isfinite(bound) else None
    if view.objective is None and objective is not None:
        objective, bound = 0.0, 0.0
    return Outcome(status, word, objective=objective, bound=bound, nodes=m.getNTotalNodes(), values=values,
                   build_s=build_s, solve_s=solve_s, stats=stats, message=message)


# -- Pyomo expression -> PySCIPOpt expression (nonlinear parts only) -------------------------------

_UNARY = {
    "exp": lambda a, s: s.exp(a),
    "log": lambda a, s: s.log(a),
    "log10": lambda a, s: s.log(a) / math.log(10.0),
    "sqrt": lambda a, s: s.sqrt(a),
    "sin": lambda a, s: s.sin(a),
    "cos": lambda a, s: s.cos(a),
    "tan": lambda a, s: s.sin(a) / s.cos(a),
    "abs": lambda a, s: abs(a),
}


def to_scip(node: Any, by_id: dict[int, Any], scip: Any, where: str) -> Any:
    """Translate a Pyomo expression tree into PySCIPOpt operators; fixed parts become numbers."""
    if type(node) in native_numeric_types:
        return float(node)
    if not node.is_potentially_variable():
        return float(node())
    if node.is_variable_type():
        return float(node.value) if node.fixed else by_id[id(node)]
    if node.is_named_expression_type():
        return to_scip(node.expr, by_id, scip, where)
    args = [to_scip(a, by_id, scip, where) for a in node.args]
    if isinstance(node, ne.SumExpression):
        return reduce(add, args, 0.0)
    if isinstance(node, ne.ProductExpression):
        return args[0] * args[1]
    if isinstance(node, ne.DivisionExpression):
        return args[0] / args[1]
    if isinstance(node, ne.NegationExpression):
        return -args[0]
    if isinstance(node, ne.PowExpression):
        base, exponent = args
        if isinstance(exponent, float):
            return base ** (int(exponent) if exponent.is_integer() else exponent)
        if isinstance(base, float) and base > 0:  # a**y = exp(y ln a)
            return scip.exp(exponent * math.log(base))
        return scip.exp(exponent * scip.log(base))  # x**y with x > 0 required by SCIP
    if isinstance(node, ne.UnaryFunctionExpression):
        fn = _UNARY.get(node.getname())
        if fn is None:
            raise SolverError(f"{where}: SCIP translation does not support the function '{node.getname()}'")
        return fn(args[0], scip)
    raise SolverError(f"{where}: SCIP translation does not support {type(node).__name__} terms ({node})")
