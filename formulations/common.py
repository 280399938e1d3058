"""Helpers shared by the formulation modules: input errors, checks, warm-start maps, solve records.

Every formulation takes a frozen dataclass of plain numbers (its *inputs*) and validates it on
construction; a bad number raises `FormulationInputError` naming the field, so a user never sees
a traceback from inside Pyomo.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from pyomo.common.collections import ComponentMap

from hetplan.errors import InstanceError


class FormulationInputError(InstanceError):
    """A formulation's inputs are inconsistent; `field` names the offending input (dotted path)."""


def require(condition: bool, message: str, field: str) -> None:
    """Raise FormulationInputError(message, field) unless `condition` holds."""
    if not condition:
        raise FormulationInputError(message, field)


def require_finite_positive(value: float, field: str, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    require(ok, f"must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}", field)


def require_int(value: int, field: str, *, minimum: int = 0) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    require(ok, f"must be an integer >= {minimum}, got {value!r}", field)


def assignment(pairs: Iterable[tuple[Any, float]]) -> ComponentMap:
    """A Pyomo variable -> value map (Pyomo variables are unhashable, so not a dict)."""
    out = ComponentMap()
    for var, value in pairs:
        out[var] = float(value)
    return out


def var_value(var: Any, default: float = 0.0) -> float:
    """The value of a solved variable; `default` where the solver left it unset."""
    value = var.value
    return default if value is None else float(value)


def rounded(var: Any) -> int:
    """An integer variable's value, rounded (solvers return 2.9999999 for 3)."""
    return int(round(var_value(var)))


@dataclass(frozen=True)
class SolveRecord:
    """One sub-problem solved (or pruned) by a driver that loops over outer choices."""

    key: str  # e.g. "k=12"
    outcome: str  # "pruned_bound" | "pruned_empty" | solver status value
    objective: float | None
    bound: float | None
    build_s: float
    solve_s: float
    nodes: int | None = None
    columns: int | None = None  # variables in the sub-model (patterns, ...)
