"""Warm starts: turn {var: value} into a column vector and check it against the model first.

A start is *complete* when every column of the view has a value, else *partial* (SCIP and HiGHS
complete a partial start by fixing the given integers and solving the rest). The check covers
variable bounds, integrality, fixed variables and every row whose variables all have a value,
with tolerance `tol * max(1, |bound|)`; violations come back worst first, so the caller can say
which constraint a start breaks and by how much instead of letting a solver drop it silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
from pyomo.common.collections import ComponentMap
from pyomo.core.base.var import Var, VarData

from hetplan.errors import SolverError
from hetplan.solvers.api import Violation
from hetplan.solvers.model_view import ModelView


@dataclass(frozen=True)
class StartVector:
    """Values per view column, NaN where the start gives none."""

    values: np.ndarray

    @property
    def complete(self) -> bool:
        return not bool(np.isnan(self.values).any())

    @property
    def n_given(self) -> int:
        return int((~np.isnan(self.values)).sum())


@dataclass(frozen=True)
class StartCheck:
    start: StartVector
    violations: tuple[Violation, ...]
    objective: float | None  # only for a complete, feasible-to-evaluate start
    ignored: int  # keys that are not columns of the view (unused or fixed variables)

    @property
    def feasible(self) -> bool:
        return not self.violations


def items_of(warm_start: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> Iterable[tuple[Any, Any]]:
    """(var, value) pairs of a ComponentMap / Mapping, or of an iterable of pairs.

    Pyomo variables are unhashable, so a plain dict cannot hold them: use
    pyomo.common.collections.ComponentMap, a list of pairs, or `values_of(model)`.
    """
    return warm_start.items() if hasattr(warm_start, "items") else warm_start


def values_of(model: Any, only_integer: bool = False) -> ComponentMap:
    """The current values of the model's variables as a start (e.g. after a greedy filled them in)."""
    start = ComponentMap()
    for v in model.component_data_objects(Var, descend_into=True):
        if v.value is not None and not v.fixed and (v.is_integer() or not only_integer):
            start[v] = v.value
    return start


def to_vector(view: ModelView, warm_start: Mapping[Any, Any] | Iterable[tuple[Any, Any]]
              ) -> tuple[StartVector, list[Violation], int]:
    """Map the assignment to view columns; violations for fixed variables given another value."""
    index = {id(v): k for k, v in enumerate(view.vars)}
    x = np.full(view.n_vars, math.nan)
    fixed_violations: list[Violation] = []
    ignored = 0
    for var, raw in items_of(warm_start):
        if not isinstance(var, VarData):
            what = getattr(var, "name", repr(var))
            hint = " (an indexed Var: pass one entry per index, e.g. {m.x[i]: value})" if getattr(var, "is_indexed", lambda: False)() else ""
            raise SolverError(f"warm_start keys must be Pyomo variables (VarData); got {type(var).__name__} {what}{hint}")
        if raw is None:
            continue  # no value: a partial start
        try:
            val = float(raw)
        except (TypeError, ValueError) as exc:
            raise SolverError(f"warm_start value for '{var.name}' is not a number: {raw!r}") from exc
        k = index.get(id(var))
        if k is None:
            ignored += 1
            if var.fixed and var.value is not None and abs(val - var.value) > 1e-9 * max(1.0, abs(var.value)):
                fixed_violations.append(Violation("fixed", var.name, var.parent_component().name, val,
                                                  var.value, var.value, abs(val - var.value)))
            continue
        x[k] = val
    return StartVector(x), fixed_violations, ignored


def check(view: ModelView, warm_start: Mapping[Any, Any] | Iterable[tuple[Any, Any]], tol: float = 1e-6) -> StartCheck:
    """Vectorise `warm_start` and list every bound, integrality and constraint it violates."""
    start, violations, ignored = to_vector(view, warm_start)
    x = start.values
    violations += _bound_violations(view, x, tol)
    violations += _integrality_violations(view, x, tol)
    x = _rounded(view, x, tol)
    violations += _row_violations(view, x, tol)
    violations.sort(key=lambda v: -v.amount if math.isfinite(v.amount) else -math.inf)
    objective = None
    if start.complete and not violations:
        obj = view.objective_value(x)
        objective = obj if math.isfinite(obj) else None
    return StartCheck(StartVector(x), tuple(violations), objective, ignored)


def _group(view: ModelView, k: int) -> str:
    return view.vars[k].parent_component().name


def _bound_violations(view: ModelView, x: np.ndarray, tol: float) -> list[Violation]:
    out = []
    with np.errstate(invalid="ignore"):
        below = view.var_lb - x > tol * np.maximum(1.0, np.abs(np.where(np.isfinite(view.var_lb), view.var_lb, 0)))
        above = x - view.var_ub > tol * np.maximum(1.0, np.abs(np.where(np.isfinite(view.var_ub), view.var_ub, 0)))
    for k in np.flatnonzero(below | above):
        v = view.vars[k]
        lb, ub = view.var_lb[k], view.var_ub[k]
        amount = lb - x[k] if below[k] else x[k] - ub
        out.append(Violation("bound", v.name, _group(view, k), float(x[k]), _opt(lb), _opt(ub), float(amount)))
    for k in np.flatnonzero(np.isinf(x)):
        out.append(Violation("bound", view.vars[k].name, _group(view, k), float(x[k]),
                             _opt(view.var_lb[k]), _opt(view.var_ub[k]), math.inf))
    return out


def _integrality_violations(view: ModelView, x: np.ndarray, tol: float) -> list[Violation]:
    out = []
    with np.errstate(invalid="ignore"):
        frac = np.abs(x - np.round(x))
        bad = view.var_integer & (frac > max(tol, 1e-9)) & np.isfinite(x)
    for k in np.flatnonzero(bad):
        out.append(Violation("integrality", view.vars[k].name, _group(view, k), float(x[k]),
                             _opt(view.var_lb[k]), _opt(view.var_ub[k]), float(frac[k])))
    return out


def _rounded(view: ModelView, x: np.ndarray, tol: float) -> np.ndarray:
    """Integers within tolerance snap to the integer, so the solver sees an exactly integral start."""
    x = x.copy()
    with np.errstate(invalid="ignore"):
        snap = view.var_integer & (np.abs(x - np.round(x)) <= max(tol, 1e-9))
    x[snap] = np.round(x[snap])
    return x


def _row_violations(view: ModelView, x: np.ndarray, tol: float) -> list[Violation]:
    if view.n_rows == 0:
        return []
    missing = np.isnan(x)
    act = view.row_activities(x)
    # rows with a missing value cannot be judged; rows that evaluate to NaN with all values given cannot be evaluated
    rows_of_nz = np.repeat(np.arange(view.n_rows), np.diff(view.indptr))
    incomplete = np.zeros(view.n_rows, dtype=bool)
    incomplete[rows_of_nz[missing[view.indices]]] = True
    for r, terms in view.row_quad.items():
        if any(missing[i] or missing[j] for i, j, _ in terms):
            incomplete[r] = True
    out = []
    for r in np.flatnonzero(~incomplete & np.isnan(act)):
        if r in view.row_nonlinear and _nonlinear_incomplete(view, r, missing):
            continue
        out.append(Violation("evaluation", view.row_names[r], view.row_groups[r], math.nan,
                             _opt(view.row_lb[r]), _opt(view.row_ub[r]), math.inf))
    lb, ub = view.row_lb, view.row_ub
    with np.errstate(invalid="ignore"):
        scale_lb = tol * np.maximum(1.0, np.abs(np.where(np.isfinite(lb), lb, 0)))
        scale_ub = tol * np.maximum(1.0, np.abs(np.where(np.isfinite(ub), ub, 0)))
        below = (lb - act > scale_lb) & ~incomplete
        above = (act - ub > scale_ub) & ~incomplete
    for r in np.flatnonzero(below | above):
        amount = lb[r] - act[r] if below[r] else act[r] - ub[r]
        out.append(Violation("constraint", view.row_names[r], view.row_groups[r], float(act[r]),
                             _opt(lb[r]), _opt(ub[r]), float(amount)))
    return out


def _nonlinear_incomplete(view: ModelView, r: int, missing: np.ndarray) -> bool:
    from pyomo.core.expr.visitor import identify_variables

    index = {id(v): k for k, v in enumerate(view.vars)}
    return any(missing[index[id(v)]] for v in identify_variables(view.row_nonlinear[r], include_fixed=False)
               if id(v) in index)


def _opt(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def describe(violations: tuple[Violation, ...], limit: int = 5) -> str:
    """'violates 3 item(s): constraint cap: activity 310 outside [-inf, 300] by 10; ...'."""
    shown = "; ".join(v.describe() for v in violations[:limit])
    more = f"; and {len(violations) - limit} more" if len(violations) > limit else ""
    return f"violates {len(violations)} item(s): {shown}{more}"
