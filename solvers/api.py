"""The one interface every formulation solves through (contract; back-ends live beside it).

    result = solve(model, backend=None, options=SolveOptions(time_limit_s=10), warm_start={var: value})

`backend=None` picks HiGHS for linear models and SCIP for nonlinear ones. A time limit never
raises: the result carries the incumbent, the proven bound and the gap.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


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
    rel_gap: float = 1e-4
    abs_gap: float = 0.0
    threads: int | None = None
    seed: int = 0
    verbose: bool = False
    log_path: str | None = None  # where the solver log is written; a temp file when None
    solver_options: dict[str, Any] = field(default_factory=dict)  # native options, passed through last


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
