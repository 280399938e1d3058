"""Back-end registry: name -> class, each declaring its capabilities, availability and version.

Adding a back-end = one module with a `Backend` subclass + one line in `_REGISTRY`. Modules are
imported lazily, so a missing optional package (gurobipy) never breaks `import hetplan.solvers`.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from hetplan.errors import SolverError
from hetplan.solvers.api import SolveOptions, Status
from hetplan.solvers.model_view import ModelView
from hetplan.solvers.warmstart import StartVector

# name -> "module:Class". One line per back-end.
_REGISTRY: dict[str, str] = {
    "highs": "hetplan.solvers.highs_backend:HighsBackend",
    "scip": "hetplan.solvers.scip_backend:ScipBackend",
    "gurobi": "hetplan.solvers.gurobi_backend:GurobiBackend",
}


@dataclass(frozen=True)
class Capabilities:
    integer: bool  # integer / binary variables (MILP)
    quadratic: bool  # products of two variables in rows or objective
    nonlinear: bool  # general nonlinear terms (exp, log, division, powers): MINLP
    warm_start: bool  # takes a complete start
    partial_warm_start: bool  # completes a start that gives only some variables
    dual_bound: bool  # reports a proven bound
    # solves in several threads of one process at once (the solver runs without the GIL) and asks
    # SolveOptions.interrupt at its callbacks
    parallel_solves: bool = False


@dataclass(frozen=True)
class Probe:
    available: bool
    version: str | None
    note: str = ""


@dataclass(frozen=True)
class RunRequest:
    options: SolveOptions
    log_path: str
    start: StartVector | None = None
    quiet: bool = False  # force no console output (infeasibility checks)


@dataclass
class Outcome:
    """What a back-end reports; `solve()` turns it into a SolveResult."""

    status: Status
    termination: str
    objective: float | None = None
    bound: float | None = None
    nodes: int | None = None
    values: np.ndarray | None = None
    warm_start_accepted: bool | None = None
    build_s: float = 0.0
    solve_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    infeasible_or_unbounded: bool = False  # the back-end could not tell which


class Backend(ABC):
    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    _probe: ClassVar[Probe | None] = None

    @classmethod
    @abstractmethod
    def _detect(cls) -> Probe:
        """Import the solver package and check that it runs (licence); never raises."""

    @classmethod
    def probe(cls) -> Probe:
        if cls._probe is None:
            try:
                cls._probe = cls._detect()
            except Exception as exc:  # a broken install must read as "not available", not crash
                cls._probe = Probe(False, None, f"probe failed: {exc}")
        return cls._probe

    @classmethod
    def available(cls) -> bool:
        return cls.probe().available

    @classmethod
    def version(cls) -> str | None:
        return cls.probe().version

    @abstractmethod
    def run(self, view: ModelView, request: RunRequest) -> Outcome:
        """Translate `view`, solve it under `request`, and report (never raise for a limit)."""


def backend_names() -> list[str]:
    return list(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """The class registered under `name` (not checked for availability)."""
    key = name.strip().lower()
    if key not in _REGISTRY:
        raise SolverError(f"unknown solver back-end '{name}'; known: {', '.join(_REGISTRY)}")
    module_name, cls_name = _REGISTRY[key].split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def get_backend(name: str) -> type[Backend]:
    """The class registered under `name`; SolverError when it is unknown or not installed."""
    cls = backend_class(name)
    probe = cls.probe()
    if not probe.available:
        raise SolverError(f"solver back-end '{cls.name}' is not available: {probe.note or 'not installed'}")
    return cls


def choose_backend(view: ModelView) -> str:
    """HiGHS for linear models, SCIP for anything nonlinear; the first available that can."""
    order = ["highs", "scip"] if view.is_linear else ["scip"]
    for name in order + [n for n in _REGISTRY if n not in order]:
        cls = backend_class(name)
        if cls.available() and not missing_capability(cls, view):
            return name
    kind = "linear" if view.is_linear else "nonlinear"
    raise SolverError(f"no installed solver back-end can solve this {kind} model; install pyscipopt (SCIP)")


def missing_capability(cls: type[Backend], view: ModelView) -> str | None:
    """A sentence naming the first model feature `cls` cannot handle, or None."""
    caps = cls.capabilities
    if view.has_integers and not caps.integer:
        return f"{cls.name} does not accept integer variables"
    quad_only = not view.row_nonlinear and (view.objective is None or view.objective.nonlinear is None)
    if view.is_linear or caps.nonlinear or (quad_only and caps.quadratic):
        return None
    items = view.nonlinear_items()
    shown = ", ".join(items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")
    return (f"{cls.name} accepts linear models only, but this model is nonlinear in {shown}; "
            "use backend='scip' or linearize these terms")


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    version: str | None
    capabilities: Capabilities
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "available": self.available, "version": self.version,
                "capabilities": asdict(self.capabilities), "note": self.note}


def describe_backends() -> list[BackendInfo]:
    """One row per registered back-end, for `hetplan solvers`."""
    rows = []
    for name in _REGISTRY:
        try:
            cls = backend_class(name)
        except ImportError as exc:  # the back-end module itself failed to import
            rows.append(BackendInfo(name, False, None, Capabilities(False, False, False, False, False, False),
                                    f"module failed to import: {exc}"))
            continue
        probe = cls.probe()
        rows.append(BackendInfo(name, probe.available, probe.version, cls.capabilities, probe.note))
    return rows

