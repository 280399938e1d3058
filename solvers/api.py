"""The one interface every formulation solves through (contract; back-ends live beside it).

    result = solve(model, backend=None, options=SolveOptions(time_limit_s=10), warm_start={var: value})

`backend=None` picks HiGHS for linear models and SCIP for nonlinear ones. A time limit never
raises: the result carries the incumbent, the proven bound and the gap.

Status words, the same for every back-end:
- OPTIMAL: proven optimal within the requested `rel_gap` / `abs_gap` (HiGHS calls a solve that
  stops at `mip_rel_gap` "optimal", SCIP calls it "gaplimit"; both map here).
- FEASIBLE: an incumbent exists but a limit (time, nodes, memory, solutions) stopped the search.
- INFEASIBLE / UNBOUNDED: proven (an "infeasible or unbounded" answer is resolved by a second
  solve without the objective).
- TIME_LIMIT_NO_SOLUTION: a limit stopped the search before any incumbent was found.
- ERROR: the back-end failed (numerical trouble, memory, an exception); `message` says why.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from hetplan.errors import InfeasibleError, SolverError


class Status(str, enum.Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # stopped by gap or limit with an incumbent
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    TIME_LIMIT_NO_SOLUTION = "time_limit_no_solution"
    ERROR = "error"

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE)


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float | None = None
    rel_gap: float = 1e-4  # the same default for every back-end so their answers compare
    abs_gap: float = 0.0
    threads: int | None = None
    seed: int = 0
    verbose: bool = False
    log_path: str | None = None  # where the solver log is written; a temp file when None
    solver_options: dict[str, Any] = field(default_factory=dict)  # native options, passed through last
    # Added by the solver layer (all optional):
    warm_start_tol: float = 1e-6  # absolute tolerance (scaled by max(1, |rhs|)) of the start check
    memory_limit_MB: float | None = None  # SCIP limits/memory; None = 75 % of this machine's RAM
    diagnose_infeasible: bool = True  # run the deletion filter on an infeasible answer ...
    diagnose_max_rows: int = 500  # ... when the model has at most this many constraints
    # asked at the solver's callbacks, in the thread that solves: True stops the solve as its time
    # limit would (back-ends with Capabilities.parallel_solves; the others run to their limit)
    interrupt: Callable[[], bool] | None = field(default=None, compare=False)

    def validate(self) -> None:
        """Raise SolverError naming the first option that is out of range."""
        if self.time_limit_s is not None and not (self.time_limit_s > 0 and math.isfinite(self.time_limit_s)):
            raise SolverError(f"SolveOptions.time_limit_s must be a positive finite number, got {self.time_limit_s!r}")
        if not (self.rel_gap >= 0 and math.isfinite(self.rel_gap)):
            raise SolverError(f"SolveOptions.rel_gap must be >= 0, got {self.rel_gap!r}")
        if not (self.abs_gap >= 0 and math.isfinite(self.abs_gap)):
            raise SolverError(f"SolveOptions.abs_gap must be >= 0, got {self.abs_gap!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise SolverError(f"SolveOptions.threads must be a positive integer, got {self.threads!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise SolverError(f"SolveOptions.seed must be a non-negative integer, got {self.seed!r}")
        if not (self.warm_start_tol >= 0):
            raise SolverError(f"SolveOptions.warm_start_tol must be >= 0, got {self.warm_start_tol!r}")
        if self.memory_limit_MB is not None and not self.memory_limit_MB > 0:
            raise SolverError(f"SolveOptions.memory_limit_MB must be > 0, got {self.memory_limit_MB!r}")


@dataclass(frozen=True)
class Violation:
    """One way a warm start breaks the model: a bound, integrality, a fixed value or a constraint."""

    kind: str  # "bound" | "integrality" | "fixed" | "constraint" | "evaluation"
    name: str  # the variable or constraint name (Pyomo's)
    group: str  # the Pyomo component the item belongs to
    value: float  # the variable value or the constraint body's activity
    lower: float | None
    upper: float | None
    amount: float  # by how much it is violated (absolute)

    def describe(self) -> str:
        lo = "-inf" if self.lower is None else f"{self.lower:g}"
        hi = "+inf" if self.upper is None else f"{self.upper:g}"
        if self.kind == "integrality":
            return f"{self.name} = {self.value:g} is not integral (off by {self.amount:g})"
        if self.kind == "evaluation":
            return f"{self.name} cannot be evaluated at the start"
        what = "value" if self.kind in ("bound", "fixed") else "activity"
        return f"{self.kind} {self.name}: {what} {self.value:g} outside [{lo}, {hi}] by {self.amount:g}"


@dataclass(frozen=True)
class SolveResult:
    backend: str
    status: Status
    termination: str  # the back-end's own word for why it stopped
    objective: float | None  # incumbent objective (model sense)
    bound: float | None  # proven dual bound (model sense)
    gap: float | None  # relative gap |objective - bound| / max(|objective|, 1e-10)
    build_s: float
    solve_s: float
    nodes: int | None
    warm_start_given: bool
    warm_start_accepted: bool | None  # None when the back-end cannot tell
    warm_start_objective: float | None
    log_path: str | None
    message: str = ""
    # Added by the solver layer (all optional):
    backend_version: str | None = None
    warm_start_violations: tuple[Violation, ...] = ()  # why a start was refused, worst first
    conflict: tuple[str, ...] = ()  # constraint names that conflict (infeasibility diagnosis)
    conflict_groups: tuple[str, ...] = ()  # their Pyomo component names
    stats: dict[str, Any] = field(default_factory=dict)  # back-end statistics (solutions found, LP iterations...)

    def require_solution(self) -> SolveResult:
        """Return self when there is an incumbent; raise InfeasibleError / SolverError otherwise."""
        if self.status.has_solution:
            return self
        if self.status is Status.INFEASIBLE:
            raise InfeasibleError(self.message or "the model is infeasible")
        raise SolverError(f"{self.backend}: no solution ({self.status.value}, {self.termination}). {self.message}".strip())

    def summary(self) -> str:
        """One line for logs and tables."""
        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.6g}"
        return (f"{self.backend}: {self.status.value} obj={fmt(self.objective)} bound={fmt(self.bound)} "
                f"gap={fmt(self.gap)} build={self.build_s:.2f}s solve={self.solve_s:.2f}s nodes={self.nodes}")


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """|objective - bound| / max(|objective|, 1e-10); inf when no finite bound is proven."""
    if objective is None or bound is None:
        return None
    if not math.isfinite(bound):
        return math.inf
    diff = abs(objective - bound)
    return 0.0 if diff == 0.0 else diff / max(abs(objective), 1e-10)
