"""Solver back-end layer: one `solve()` over SCIP, HiGHS and (optional) Gurobi.

    from hetplan.solvers import solve, SolveOptions, SolveResult, Status
    result = solve(model, backend=None, options=SolveOptions(time_limit_s=10), warm_start={var: value})

See api.py for the result contract, registry.py for back-ends and capabilities, warmstart.py for
the start check, diagnose.py for naming the constraints of an infeasible model.
"""
from hetplan.solvers.api import SolveOptions, SolveResult, Status, Violation, relative_gap
from hetplan.solvers.diagnose import InfeasibilityDiagnosis, diagnose_infeasibility
from hetplan.solvers.registry import (
    Backend,
    BackendInfo,
    Capabilities,
    backend_names,
    describe_backends,
    get_backend,
)
from hetplan.solvers.solve import solve
from hetplan.solvers.warmstart import values_of

__all__ = [
    "Backend",
    "BackendInfo",
    "Capabilities",
    "InfeasibilityDiagnosis",
    "SolveOptions",
    "SolveResult",
    "Status",
    "Violation",
    "backend_names",
    "describe_backends",
    "diagnose_infeasibility",
    "get_backend",
    "relative_gap",
    "solve",
    "values_of",
]
