"""Errors that hetplan raises on purpose: each carries a message a user can act on.

The CLI catches `HetplanError` and prints its message (no traceback); anything else is a bug.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Mapping


class HetplanError(Exception):
    """Base class for every error hetplan reports to a user.

    `exit_code` is the command line's exit status for it (README, "Exit status"): 1 for bad input
    or usage, 2 when the input is fine but no plan can be had (infeasible, out of memory, refused
    by a launch target, no plan within the time limit), 3 when a run failed while running.
    """

    exit_code = 1


class InstanceError(HetplanError):
    """An instance file is malformed or inconsistent; `field` names the offending location."""

    def __init__(self, message: str, field: str | None = None):
        self.field, self.detail = field, message
        super().__init__(f"{field}: {message}" if field else message)


class PlanError(HetplanError):
    """A plan is inconsistent with itself or with the instance it is applied to."""

    def __init__(self, message: str, field: str | None = None):
        self.field, self.detail = field, message
        super().__init__(f"{field}: {message}" if field else message)


@contextmanager
def fields_as(names: Mapping[str, str]) -> Iterator[None]:
    """Inside the block, an InstanceError or PlanError whose field is a key of `names` is raised
    again, same class and message, under the name it maps to: a command line names the library's
    fields by its own flags (min_nodes -> --min-nodes)."""
    try:
        yield
    except (InstanceError, PlanError, InfeasibleError) as exc:
        if exc.field not in names:
            raise
        raise type(exc)(exc.detail, names[exc.field]) from None


def check_number(value: float | None, field: str, *, zero: bool = False, error: type = InstanceError) -> None:
    """Refuse nan, inf and a value below 0 (`zero`) or not above 0, naming `field` (an option or
    a field): nan passes every comparison with `<`, and typer parses "nan" and "inf" as floats, so
    either would run on to a nan or inf result. None is accepted (an option not given)."""
    if value is None or (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        return
    raise error(f"must be a {'finite number >= 0' if zero else 'positive finite number'}, got {value:g}", field)


def _is_count(value: object, least: int) -> bool:
    """An integer of at least `least`; a bool, a float or a string is none."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_count(value: object, field: str, *, least: int = 1, error: type = InstanceError) -> None:
    """Refuse anything but an integer of at least `least`, naming `field`."""
    if not _is_count(value, least):
        raise error(f"must be an integer of at least {least}, got {value!r}", field)


def check_counts(values: object, field: str, *, error: type = InstanceError) -> None:
    """Refuse anything but a non-empty tuple or list of positive integers (microbatch sizes, TP
    degrees), naming `field`: 0 divided by later, an empty one failed inside max()."""
    if not (isinstance(values, (tuple, list)) and values and all(_is_count(v, 1) for v in values)):
        raise error(f"must be a non-empty list of positive integers, got {values!r}", field)


class EstimatorError(HetplanError):
    """An estimator cannot produce a figure (missing profile, unknown estimator name...)."""


class SolverError(HetplanError):
    """A solver back-end is missing, refused the model, or failed."""


class InfeasibleError(HetplanError):
    """No plan satisfies the constraints; the message names the constraint group that conflicts,
    and `field` the limit when one alone rules every plan out (an option or an instance field)."""

    exit_code = 2

    def __init__(self, message: str, field: str | None = None):
        self.field, self.detail = field, message
        super().__init__(f"{field}: {message}" if field else message)


class NoPlanInTimeError(SolverError):
    """The time limit ran out before any plan was found (the input may well be feasible)."""

    exit_code = 2


class RefusedError(PlanError):
    """A launch target (Megatron, DeepSpeed, ...) cannot express a valid plan; the message says why."""

    exit_code = 2


class RunFailedError(HetplanError):
    """A training run failed while running (a worker died or hung); the message names the rank."""

    exit_code = 3
