"""Infeasibility diagnosis: which constraints conflict, by a deletion filter over the rows.

Deletion filter (Chinneck & Dravnieks 1991): start from all rows (known infeasible); for each
candidate, drop it and re-solve the feasibility problem; if the rest is still infeasible the
candidate is not needed and stays out, else it goes back in. What remains is an irreducible
infeasible subset (IIS): infeasible, and feasible once any one member is removed. Variable bounds
and integrality always stay in (they are the background of every check).

The filter runs twice: first over whole constraint groups (Pyomo components, few checks), then
over the single rows of the groups that survived (only when at most `max_rows` are left). Each
check is a solve without objective; a check that ends undecided (time limit) keeps its candidate
and marks the result as not proven irreducible.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

from hetplan.solvers.api import SolveOptions, Status
from hetplan.solvers.model_view import ModelView, extract
from hetplan.solvers.registry import Backend, RunRequest, choose_backend, get_backend, missing_capability
from hetplan.errors import SolverError


@dataclass(frozen=True)
class InfeasibilityDiagnosis:
    infeasible: bool | None  # False: the model is feasible; None: the first check was undecided
    constraints: tuple[str, ...]  # rows of the conflicting subset, in model order
    groups: tuple[str, ...]  # their Pyomo components
    irreducible: bool  # every check was decided and the row-level pass ran: the set is an IIS
    checks: int  # feasibility solves spent
    backend: str
    elapsed_s: float
    message: str


def diagnose_infeasibility(model: Any, backend: str | None = None, options: SolveOptions | None = None,
                           max_rows: int = 2000, check_time_limit_s: float = 10.0,
                           total_time_limit_s: float = 300.0) -> InfeasibilityDiagnosis:
    """Name the constraints of `model` that conflict (an IIS when small enough), using one back-end.

    Each feasibility check gets `check_time_limit_s`, the whole filter `total_time_limit_s`; once
    the budget is spent, the remaining candidates stay in and `irreducible` is False."""
    options = options or SolveOptions()
    options.validate()
    view = extract(model)
    cls = get_backend(backend or choose_backend(view))
    problem = missing_capability(cls, view)
    if problem:
        raise SolverError(problem)
    return diagnose_view(view, cls, options, max_rows, check_time_limit_s, total_time_limit_s)


def diagnose_view(view: ModelView, cls: type[Backend], options: SolveOptions, max_rows: int = 2000,
                  check_time_limit_s: float = 10.0, total_time_limit_s: float = 300.0) -> InfeasibilityDiagnosis:
    t0 = perf_counter()
    if view.trivial_conflicts:
        names = tuple(n for n, _, _ in view.trivial_conflicts)
        groups = tuple(dict.fromkeys(g for _, g, _ in view.trivial_conflicts))
        why = "; ".join(w for _, _, w in view.trivial_conflicts)
        return InfeasibilityDiagnosis(True, names, groups, True, 0, cls.name, perf_counter() - t0, f"infeasible: {why}")
    checker = _Checker(view, cls, options, check_time_limit_s, total_time_limit_s)
    try:
        rows = list(range(view.n_rows))
        first = checker.feasible(rows)
        if first is not False:
            word = "feasible" if first else "undecided (a check hit its time limit)"
            return InfeasibilityDiagnosis(None if first is None else False, (), (), False, checker.checks, cls.name,
                                          perf_counter() - t0, f"no conflict to report: the model is {word}")
        decided = True
        rows, ok = _filter_groups(view, rows, checker)
        decided &= ok
        row_pass = len(rows) <= max_rows
        if row_pass:
            rows, ok = _filter_rows(rows, checker)
            decided &= ok
    finally:
        checker.close()
    names = tuple(view.row_names[r] for r in rows)
    groups = tuple(dict.fromkeys(view.row_groups[r] for r in rows))
    irreducible = decided and row_pass
    if not rows:
        message = "infeasible: variable bounds and integrality alone admit no solution"
    else:
        kind = "an irreducible infeasible subset" if irreducible else "an infeasible subset (not proven minimal)"
        message = (f"infeasible: these {len(names)} constraint(s) conflict ({kind}): " + ", ".join(names[:20])
                   + (f" and {len(names) - 20} more" if len(names) > 20 else "") + f"; groups: {', '.join(groups)}")
    return InfeasibilityDiagnosis(True, names, groups, irreducible, checker.checks, cls.name,
                                  perf_counter() - t0, message)


def _filter_groups(view: ModelView, rows: list[int], checker: _Checker) -> tuple[list[int], bool]:
    decided = True
    for group in dict.fromkeys(view.row_groups[r] for r in rows):
        trial = [r for r in rows if view.row_groups[r] != group]
        verdict = checker.feasible(trial)
        decided &= verdict is not None
        if verdict is False:
            rows = trial
    return rows, decided


def _filter_rows(rows: list[int], checker: _Checker) -> tuple[list[int], bool]:
    decided = True
    for r in list(rows):
        trial = [q for q in rows if q != r]
        verdict = checker.feasible(trial)
        decided &= verdict is not None
        if verdict is False:
            rows = trial
    return rows, decided


class _Checker:
    """Solves the feasibility problem (no objective) on a subset of rows; True / False / None."""

    def __init__(self, view: ModelView, cls: type[Backend], options: SolveOptions, limit_s: float, budget_s: float):
        self.view, self.backend = view, cls()
        self.limit_s = min(limit_s, options.time_limit_s) if options.time_limit_s else limit_s
        self.deadline = perf_counter() + budget_s
        self.base = SolveOptions(threads=options.threads, seed=options.seed,
                                 solver_options=dict(options.solver_options), memory_limit_MB=options.memory_limit_MB)
        fd, self.log_path = tempfile.mkstemp(prefix=f"hetplan-iis-{cls.name}-", suffix=".log")
        os.close(fd)
        self.checks = 0

    def feasible(self, rows: list[int]) -> bool | None:
        remaining = self.deadline - perf_counter()
        if remaining <= 0.05:
            return None  # budget spent: undecided, the candidate stays in
        self.checks += 1
        opts = replace(self.base, time_limit_s=min(self.limit_s, remaining))
        out = self.backend.run(self.view.subset(rows), RunRequest(opts, self.log_path, quiet=True))
        if out.status.has_solution:
            return True
        if out.status is Status.INFEASIBLE:  # without an objective "infeasible or unbounded" is infeasible
            return False
        return None

    def close(self) -> None:
        try:
            os.unlink(self.log_path)
        except OSError:
            pass
