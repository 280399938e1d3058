"""`solve()`: one call that reads a Pyomo model, checks the warm start, runs a back-end, and
writes the incumbent back into the model's variables.

Steps: extract a ModelView (refuses unsupported components and non-finite numbers), pick the
back-end (HiGHS for linear, SCIP for nonlinear), refuse a model the back-end cannot take (naming
the nonlinear components), check the start (bounds, integrality, every row; refused with the
violations listed), run, resolve "infeasible or unbounded" by a solve without objective, load
the values, and on INFEASIBLE name the conflicting constraints (deletion filter, small models).
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Iterable, Mapping

import numpy as np

from hetplan.errors import SolverError
from hetplan.solvers import warmstart
from hetplan.solvers.api import SolveOptions, SolveResult, Status, Violation, relative_gap
from hetplan.solvers.diagnose import diagnose_view
from hetplan.solvers.model_view import ModelView, extract
from hetplan.solvers.registry import Backend, Outcome, RunRequest, choose_backend, get_backend, missing_capability


@dataclass(frozen=True)
class _StartPlan:
    vector: warmstart.StartVector | None  # what goes to the solver (None: nothing)
    given: bool
    violations: tuple[Violation, ...] = ()
    objective: float | None = None
    note: str = ""


def solve(model: Any, backend: str | None = None, options: SolveOptions | None = None,
          warm_start: Mapping[Any, float] | Iterable[tuple[Any, float]] | None = None,
          check_warm_start: bool = True) -> SolveResult:
    """Solve `model` with one back-end; see hetplan.solvers.api for the result's meaning.

    `warm_start`: a ComponentMap {var: value} (Pyomo variables are unhashable, so not a dict), or
    (var, value) pairs; `hetplan.solvers.values_of(model)` takes the variables' current values.

    Raises SolverError for a missing/unknown back-end, a model it cannot take (nonlinear to
    HiGHS), bad options or non-finite coefficients. Limits and infeasibility are statuses.
    """
    options = options if options is not None else SolveOptions()
    if not isinstance(options, SolveOptions):
        raise SolverError(f"options must be a SolveOptions, got {type(options).__name__}")
    options.validate()
    t0 = perf_counter()
    view = extract(model)
    cls = get_backend(backend) if backend else get_backend(choose_backend(view))
    problem = missing_capability(cls, view)
    if problem:
        raise SolverError(problem)
    log_path = _log_path(options, cls.name)
    plan = _plan_start(view, warm_start, check_warm_start, options, cls)
    extract_s = perf_counter() - t0
    if view.trivial_conflicts:
        return _trivially_infeasible(view, cls, plan, extract_s, log_path)
    outcome = cls().run(view, RunRequest(options, log_path, plan.vector))
    if outcome.infeasible_or_unbounded:
        outcome = _disambiguate(view, cls, options, outcome)
    if outcome.status.has_solution and outcome.values is not None:
        _load(view, outcome.values)
    return _result(view, cls, options, plan, outcome, extract_s, log_path)


def _log_path(options: SolveOptions, name: str) -> str:
    if options.log_path:
        folder = os.path.dirname(os.path.abspath(options.log_path))
        os.makedirs(folder, exist_ok=True)
        open(options.log_path, "w").close()  # SCIP and Gurobi append: old runs must not read as evidence
        return options.log_path
    folder = os.path.join(tempfile.gettempdir(), "hetplan-solver-logs")
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=folder)
    os.close(fd)
    return path


def _plan_start(view: ModelView, warm_start: Mapping[Any, float] | Iterable[tuple[Any, float]] | None, check: bool,
                options: SolveOptions, cls: type[Backend]) -> _StartPlan:
    if warm_start is None:
        return _StartPlan(None, False)
    warm_start = list(warmstart.items_of(warm_start))
    if not warm_start:
        return _StartPlan(None, False)
    if not cls.capabilities.warm_start:
        return _StartPlan(None, True, note=f"{cls.name} takes no warm start; it was not passed")
    if check:
        result = warmstart.check(view, warm_start, options.warm_start_tol)
        if result.violations:
            return _StartPlan(None, True, result.violations,
                              note="warm start refused before the solve: " + warmstart.describe(result.violations))
        vector, objective, ignored = result.start, result.objective, result.ignored
    else:
        vector, _, ignored = warmstart.to_vector(view, warm_start)
        objective = view.objective_value(vector.values) if vector.complete else None
        objective = objective if objective is not None and math.isfinite(objective) else None
    notes = []
    if ignored:
        notes.append(f"{ignored} warm-start variable(s) do not appear in the active model (unused or fixed)")
    if vector.n_given == 0:
        return _StartPlan(None, True, note="; ".join(notes + ["the warm start gives no model variable"]))
    if not vector.complete:
        if not cls.capabilities.partial_warm_start:
            return _StartPlan(None, True, note=f"{cls.name} takes complete starts only; this one gives "
                                                f"{vector.n_given}/{view.n_vars} variables and was not passed")
        notes.append(f"partial warm start ({vector.n_given}/{view.n_vars} variables); the solver completes it")
    return _StartPlan(vector, True, objective=objective, note="; ".join(notes))


def _disambiguate(view: ModelView, cls: type[Backend], options: SolveOptions, outcome: Outcome) -> Outcome:
    """An 'infeasible or unbounded' answer: solve without objective; feasible there means unbounded."""
    fd, path = tempfile.mkstemp(prefix=f"hetplan-{cls.name}-feas-", suffix=".log")
    os.close(fd)
    try:
        check = cls().run(view.subset(range(view.n_rows)), RunRequest(options, path, quiet=True))
    finally:
        os.unlink(path)
    outcome.infeasible_or_unbounded = False
    outcome.solve_s += check.solve_s
    if check.status.has_solution:
        outcome.status, outcome.message = Status.UNBOUNDED, "unbounded (the model is feasible without its objective)"
    elif check.status is Status.INFEASIBLE:
        outcome.status = Status.INFEASIBLE
    else:
        outcome.status, outcome.message = Status.ERROR, "the solver reports 'infeasible or unbounded' and cannot tell which"
    return outcome


def _load(view: ModelView, values: np.ndarray) -> None:
    """Write the incumbent into the Pyomo variables; integers become exact ints for decode(), and
    continuous values come back inside their bounds (solvers may overshoot by their tolerance)."""
    values = np.clip(values, view.var_lb, view.var_ub)
    for v, val, integer in zip(view.vars, values.tolist(), view.var_integer.tolist()):
        v.set_value(int(round(val)) if integer else val, skip_validation=True)


def _coefficient_note(view: ModelView) -> str:
    """A warning when the matrix spans more than 1e9: a typical source of wrong answers (big-M)."""
    nz = np.abs(view.data[view.data != 0])
    if len(nz) == 0:
        return ""
    lo, hi = float(nz.min()), float(nz.max())
    if hi / lo <= 1e9:
        return ""
    r = int(np.argmax(np.abs(view.data) == hi))
    row = int(np.searchsorted(view.indptr, r, side="right") - 1)
    return (f"coefficients span {lo:.1e} .. {hi:.1e} (largest in constraint '{view.row_names[row]}'); "
            "expect numerical trouble, tighten big-M constants or rescale units")


def _trivially_infeasible(view: ModelView, cls: type[Backend], plan: _StartPlan, extract_s: float,
                          log_path: str) -> SolveResult:
    why = "; ".join(w for _, _, w in view.trivial_conflicts)
    return SolveResult(
        backend=cls.name, status=Status.INFEASIBLE, termination="hetplan presolve", objective=None, bound=None,
        gap=None, build_s=extract_s, solve_s=0.0, nodes=0, warm_start_given=plan.given,
        warm_start_accepted=False if plan.given else None, warm_start_objective=plan.objective, log_path=log_path,
        message=f"infeasible before solving: {why}", backend_version=cls.version(),
        warm_start_violations=plan.violations,
        conflict=tuple(n for n, _, _ in view.trivial_conflicts),
        conflict_groups=tuple(dict.fromkeys(g for _, g, _ in view.trivial_conflicts)))


def _result(view: ModelView, cls: type[Backend], options: SolveOptions, plan: _StartPlan, outcome: Outcome,
            extract_s: float, log_path: str) -> SolveResult:
    messages = [m for m in (outcome.message, plan.note, _coefficient_note(view)) if m]
    accepted = outcome.warm_start_accepted
    if plan.given and plan.vector is None:
        accepted = False if plan.violations else None
    elif plan.given and accepted is False:
        why = outcome.stats.get("warm_start_log_line")
        messages.append(f"{cls.name} did not use the warm start" + (f": {why}" if why else "")
                        + f" (see its log: {log_path})")
    if outcome.status is Status.FEASIBLE:
        gap = relative_gap(outcome.objective, outcome.bound)
        messages.insert(0, f"stopped by {outcome.termination} with an incumbent"
                        + (f" (relative gap {gap:.3g})" if gap is not None else ""))
    conflict: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    if outcome.status is Status.INFEASIBLE:
        if options.diagnose_infeasible and view.n_rows <= options.diagnose_max_rows:
            # the diagnosis may cost up to as much again as the solve's own limit (60 s without one)
            budget = max(10.0, options.time_limit_s or 60.0)
            diagnosis = diagnose_view(view, cls, options, max_rows=options.diagnose_max_rows,
                                      check_time_limit_s=min(10.0, budget), total_time_limit_s=budget)
            conflict, groups = diagnosis.constraints, diagnosis.groups
            messages.insert(0, diagnosis.message)
            outcome.stats.update(diagnosis_checks=diagnosis.checks, diagnosis_s=diagnosis.elapsed_s,
                                 diagnosis_irreducible=diagnosis.irreducible)
        else:
            messages.insert(0, f"infeasible ({view.n_rows} constraints); call "
                               "hetplan.solvers.diagnose_infeasibility(model) to name the conflicting constraints")
    stats = dict(outcome.stats)
    stats["extract_s"] = extract_s
    stats["backend_build_s"] = outcome.build_s
    return SolveResult(
        backend=cls.name, status=outcome.status, termination=outcome.termination, objective=outcome.objective,
        bound=outcome.bound, gap=relative_gap(outcome.objective, outcome.bound),
        build_s=extract_s + outcome.build_s, solve_s=outcome.solve_s, nodes=outcome.nodes,
        warm_start_given=plan.given, warm_start_accepted=accepted if plan.given else None,
        warm_start_objective=plan.objective, log_path=log_path, message="; ".join(messages),
        backend_version=cls.version(), warm_start_violations=plan.violations, conflict=conflict,
        conflict_groups=groups, stats=stats)
