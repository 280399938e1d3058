"""A solver-neutral snapshot of a Pyomo model: columns, rows in sparse form, the objective.

Every back-end translates this view, not the Pyomo model, so that the warm-start check, the
infeasibility diagnosis and the back-ends all see the same rows with the same names.

Per row r (one active ConstraintData):   row_lb[r] <= A[r, :] x + quad_r(x) + nl_r(x) <= row_ub[r]
with the body's constant moved into the bounds. Fixed variables are folded into constants.
quad_r is a list of (i, j, coef) products; nl_r is the left-over Pyomo expression (None when the
row is linear or quadratic). The objective has the same three parts plus a constant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import pyomo.environ as pyo
from pyomo.core.base.var import VarData
from pyomo.repn import generate_standard_repn

from hetplan.errors import SolverError

QuadTerms = tuple[tuple[int, int, float], ...]


class LazyNames(Sequence):
    """Names of Pyomo components, built on first access: Pyomo's `.name` walks the component tree,
    and naming every row of every model cost a planner search more than HiGHS did (2.6 of 26 s
    measured on GPT-Neo A100 + V100), while names are only read by diagnostics and SCIP."""

    def __init__(self, components: Sequence[Any], group: bool = False):
        self._components, self._group = list(components), group
        self._names: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._components)

    def __getitem__(self, r):
        if isinstance(r, slice):
            return tuple(self[k] for k in range(*r.indices(len(self))))
        name = self._names.get(r)
        if name is None:
            comp = self._components[r]
            name = self._names[r] = (comp.parent_component() if self._group else comp).name
        return name

    def take(self, rows: Sequence[int]) -> LazyNames:
        return LazyNames([self._components[r] for r in rows], self._group)


@dataclass(frozen=True)
class ObjectiveView:
    name: str
    maximize: bool
    constant: float
    cols: np.ndarray  # int64 column indices of the linear part
    coefs: np.ndarray
    quad: QuadTerms
    nonlinear: Any | None  # Pyomo expression or None

    @property
    def is_linear(self) -> bool:
        return not self.quad and self.nonlinear is None


@dataclass(frozen=True)
class ModelView:
    vars: tuple[VarData, ...]
    var_lb: np.ndarray  # -inf when unbounded
    var_ub: np.ndarray
    var_integer: np.ndarray  # bool
    row_names: Sequence[str]  # LazyNames or a tuple
    row_groups: Sequence[str]  # the Pyomo component (constraint group) each row belongs to
    row_lb: np.ndarray
    row_ub: np.ndarray
    indptr: np.ndarray  # CSR of the linear parts
    indices: np.ndarray
    data: np.ndarray
    row_quad: dict[int, QuadTerms]  # only rows that have products of two variables
    row_nonlinear: dict[int, Any]  # only rows with other nonlinear terms
    objective: ObjectiveView | None
    # (name, group, why) for rows without variables whose bounds fail and variables with empty domains
    trivial_conflicts: tuple[tuple[str, str, str], ...] = ()

    @property
    def n_vars(self) -> int:
        return len(self.vars)

    @property
    def n_rows(self) -> int:
        return len(self.row_names)

    @property
    def has_integers(self) -> bool:
        return bool(self.var_integer.any())

    @property
    def is_linear(self) -> bool:
        return not self.row_quad and not self.row_nonlinear and (self.objective is None or self.objective.is_linear)

    def nonlinear_items(self) -> list[str]:
        """Human-readable names of every component with a quadratic or nonlinear term."""
        items = [f"constraint '{self.row_names[r]}' (group '{self.row_groups[r]}')"
                 for r in sorted(set(self.row_quad) | set(self.row_nonlinear))]
        if self.objective is not None and not self.objective.is_linear:
            items.append(f"objective '{self.objective.name}'")
        return items

    def row_slice(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.indptr[r], self.indptr[r + 1]
        return self.indices[lo:hi], self.data[lo:hi]

    def subset(self, rows: Sequence[int], keep_objective: bool = False) -> ModelView:
        """The same columns with only `rows` (in the given order); used by the infeasibility filter."""
        rows = list(rows)
        counts = np.diff(self.indptr)[rows] if rows else np.zeros(0, dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        pieces = [np.arange(self.indptr[r], self.indptr[r + 1]) for r in rows]
        take = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        pos = {r: k for k, r in enumerate(rows)}
        return replace(
            self,
            row_names=_take(self.row_names, rows),
            row_groups=_take(self.row_groups, rows),
            row_lb=self.row_lb[rows] if rows else np.zeros(0),
            row_ub=self.row_ub[rows] if rows else np.zeros(0),
            indptr=indptr,
            indices=self.indices[take],
            data=self.data[take],
            row_quad={pos[r]: q for r, q in self.row_quad.items() if r in pos},
            row_nonlinear={pos[r]: e for r, e in self.row_nonlinear.items() if r in pos},
            objective=self.objective if keep_objective else None,
        )

    # -- evaluation (warm-start check) ------------------------------------------------------
    def row_activities(self, x: np.ndarray) -> np.ndarray:
        """Body value of every row at x (NaN where a needed value is missing or undefined)."""
        rows_of_nz = np.repeat(np.arange(self.n_rows), np.diff(self.indptr))
        act = np.bincount(rows_of_nz, weights=self.data * x[self.indices], minlength=self.n_rows).astype(float)
        # bincount turns NaN * 0-weight paths into NaN correctly; empty rows stay 0.
        for r, terms in self.row_quad.items():
            act[r] += sum(c * x[i] * x[j] for i, j, c in terms)
        if self.row_nonlinear:
            with _assigned(self.vars, x):
                for r, expr in self.row_nonlinear.items():
                    act[r] += _safe_value(expr)
        return act

    def objective_value(self, x: np.ndarray) -> float:
        obj = self.objective
        if obj is None:
            return 0.0
        val = obj.constant + float(np.dot(obj.coefs, x[obj.cols])) if len(obj.cols) else obj.constant
        val += sum(c * x[i] * x[j] for i, j, c in obj.quad)
        if obj.nonlinear is not None:
            with _assigned(self.vars, x):
                val += _safe_value(obj.nonlinear)
        return float(val)


class _assigned:
    """Temporarily give the Pyomo variables the values x (NaN -> None) to evaluate expressions."""

    def __init__(self, variables: Sequence[VarData], x: np.ndarray):
        self._vars, self._x = variables, x
        self._saved: list[Any] = []

    def __enter__(self) -> None:
        self._saved = [v.value for v in self._vars]
        for v, val in zip(self._vars, self._x):
            v.set_value(None if math.isnan(val) else float(val), skip_validation=True)

    def __exit__(self, *exc: object) -> None:
        for v, val in zip(self._vars, self._saved):
            v.set_value(val, skip_validation=True)


def _take(names: Sequence[str], rows: Sequence[int]) -> Sequence[str]:
    return names.take(rows) if isinstance(names, LazyNames) else tuple(names[r] for r in rows)


def _safe_value(expr: Any) -> float:
    try:
        val = pyo.value(expr, exception=False)
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return math.nan
    return math.nan if val is None else float(val)


def _finite_or_raise(x: float, what: Callable[[], str]) -> float:
    """`what()` names the number, called only when there is an error: Pyomo's `.name` walks the
    component tree and costs more than the check itself."""
    if isinstance(x, complex) or math.isnan(x) or math.isinf(x):
        raise SolverError(f"numerical trouble: {what()} is {x!r}; every coefficient must be a finite number")
    return float(x)


_UNSUPPORTED = ("SOSConstraint", "Disjunct", "Disjunction", "LogicalConstraint")


def _check_supported(model: Any) -> None:
    if not hasattr(model, "component_data_objects"):
        raise SolverError(f"solve() expects a Pyomo model (ConcreteModel or Block), got {type(model).__name__}")
    for comp in model.component_objects(descend_into=True, active=True):
        if comp.ctype.__name__ in _UNSUPPORTED:
            raise SolverError(
                f"component '{comp.name}' is a {comp.ctype.__name__}, which the hetplan solver layer does not "
                "translate; reformulate it (e.g. TransformationFactory('gdp.bigm')) before solving")
    if not model.is_constructed():
        raise SolverError("the Pyomo model is not constructed (AbstractModel?): call create_instance() first")


class _Columns:
    """Registers variables in first-use order."""

    def __init__(self) -> None:
        self.vars: list[VarData] = []
        self.index: dict[int, int] = {}

    def col(self, v: VarData) -> int:
        k = self.index.get(id(v))
        if k is None:
            k = len(self.vars)
            self.index[id(v)] = k
            self.vars.append(v)
        return k


def _split(expr: Any, cols: _Columns, where: Callable[[], str]) -> tuple[float, list[int], list[float], QuadTerms, Any]:
    """(constant, linear cols, linear coefs, quadratic terms, nonlinear rest) of one expression;
    `where()` names it in errors (only called when there is one)."""
    try:
        repn = generate_standard_repn(expr, compute_values=True, quadratic=True)
    except (ValueError, TypeError, ZeroDivisionError) as exc:
        raise SolverError(f"{where()}: cannot be read ({exc}); is a fixed variable or parameter without a value?") from exc
    const = _finite_or_raise(pyo.value(repn.constant), lambda: f"the constant of {where()}")
    lin_cols = [cols.col(v) for v in repn.linear_vars]
    lin_coefs = [_finite_or_raise(pyo.value(c), lambda v=v: f"the coefficient of '{v.name}' in {where()}")
                 for v, c in zip(repn.linear_vars, repn.linear_coefs)]
    quad = tuple(
        (cols.col(a), cols.col(b),
         _finite_or_raise(pyo.value(c), lambda a=a, b=b: f"the coefficient of '{a.name}*{b.name}' in {where()}"))
        for (a, b), c in zip(repn.quadratic_vars, repn.quadratic_coefs))
    nonlinear = None
    if repn.nonlinear_expr is not None:
        for v in repn.nonlinear_vars:
            cols.col(v)
        nonlinear = repn.nonlinear_expr
    return const, lin_cols, lin_coefs, quad, nonlinear


def extract(model: Any) -> ModelView:
    """Read the active constraints and the active objective of `model` into a ModelView."""
    _check_supported(model)
    cols = _Columns()
    rows: list[Any] = []
    lbs: list[float] = []
    ubs: list[float] = []
    indptr = [0]
    indices: list[int] = []
    data: list[float] = []
    row_quad: dict[int, QuadTerms] = {}
    row_nl: dict[int, Any] = {}
    trivial: list[tuple[str, str, str]] = []
    for con in model.component_data_objects(pyo.Constraint, active=True, descend_into=True):
        where = lambda con=con: f"constraint '{con.name}'"  # noqa: E731 (named only on an error)
        try:
            lb, body, ub = con.to_bounded_expression(evaluate_bounds=True)
        except (ValueError, TypeError) as exc:
            raise SolverError(f"{where()}: its bounds cannot be evaluated ({exc})") from exc
        lb = -math.inf if lb is None else _finite_or_nan_check(lb, lambda: f"the lower bound of {where()}")
        ub = math.inf if ub is None else _finite_or_nan_check(ub, lambda: f"the upper bound of {where()}")
        const, lc, lv, quad, nl = _split(body, cols, where)
        lb, ub = lb - const, ub - const
        if not lc and not quad and nl is None:
            tol = 1e-9 * max(1.0, abs(lb) if math.isfinite(lb) else 0.0, abs(ub) if math.isfinite(ub) else 0.0)
            if lb > tol or ub < -tol:
                trivial.append((con.name, con.parent_component().name,
                                f"constraint '{con.name}' has no free variable and requires "
                                f"{lb + const:g} <= {const:g} <= {ub + const:g}"))
            continue  # a constant row says nothing to a solver
        r = len(rows)
        rows.append(con)
        lbs.append(lb)
        ubs.append(ub)
        indices.extend(lc)
        data.extend(lv)
        indptr.append(len(indices))
        if quad:
            row_quad[r] = quad
        if nl is not None:
            row_nl[r] = nl
    objective = _objective(model, cols)
    return _assemble(cols, LazyNames(rows), LazyNames(rows, group=True), lbs, ubs, indptr, indices, data, row_quad, row_nl, objective, trivial)


def _finite_or_nan_check(x: float, what: Callable[[], str]) -> float:
    """`what()` names the number, called only on an error (see `_finite_or_raise`)."""
    if math.isnan(x):
        raise SolverError(f"numerical trouble: {what()} is NaN")
    return float(x)


def _objective(model: Any, cols: _Columns) -> ObjectiveView | None:
    objectives = list(model.component_data_objects(pyo.Objective, active=True, descend_into=True))
    if len(objectives) > 1:
        raise SolverError("the model has several active objectives (" + ", ".join(o.name for o in objectives[:5])
                          + "); deactivate all but one")
    if not objectives:
        return None
    obj = objectives[0]
    const, lc, lv, quad, nl = _split(obj.expr, cols, lambda: f"objective '{obj.name}'")
    return ObjectiveView(name=obj.name, maximize=obj.sense == pyo.maximize, constant=const,
                         cols=np.asarray(lc, dtype=np.int64), coefs=np.asarray(lv, dtype=float), quad=quad, nonlinear=nl)


def _assemble(cols: _Columns, names: Sequence[str], groups: Sequence[str], lbs: list[float], ubs: list[float],
              indptr: list[int], indices: list[int], data: list[float], row_quad: dict[int, QuadTerms],
              row_nl: dict[int, Any], objective: ObjectiveView | None,
              trivial: list[tuple[str, str, str]]) -> ModelView:
    n = len(cols.vars)
    var_lb = np.empty(n)
    var_ub = np.empty(n)
    var_int = np.zeros(n, dtype=bool)
    for k, v in enumerate(cols.vars):
        lb, ub = v.bounds
        var_lb[k] = -math.inf if lb is None else _finite_or_nan_check(lb, lambda v=v: f"the lower bound of '{v.name}'")
        var_ub[k] = math.inf if ub is None else _finite_or_nan_check(ub, lambda v=v: f"the upper bound of '{v.name}'")
        var_int[k] = v.is_integer()
        if var_lb[k] > var_ub[k]:
            trivial.append((v.name, v.parent_component().name,
                            f"variable '{v.name}' has lower bound {var_lb[k]:g} > upper bound {var_ub[k]:g}"))
        elif var_int[k] and np.ceil(var_lb[k] - 1e-9) > np.floor(var_ub[k] + 1e-9):
            trivial.append((v.name, v.parent_component().name,
                            f"integer variable '{v.name}' has no integer in [{var_lb[k]:g}, {var_ub[k]:g}]"))
    return ModelView(
        vars=tuple(cols.vars), var_lb=var_lb, var_ub=var_ub, var_integer=var_int,
        row_names=names, row_groups=groups,
        row_lb=np.asarray(lbs, dtype=float), row_ub=np.asarray(ubs, dtype=float),
        indptr=np.asarray(indptr, dtype=np.int64), indices=np.asarray(indices, dtype=np.int64),
        data=np.asarray(data, dtype=float), row_quad=row_quad, row_nonlinear=row_nl,
        objective=objective, trivial_conflicts=tuple(trivial))
