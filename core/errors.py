"""Errors that hetplan raises on purpose: each carries a message a user can act on.

The CLI catches `HetplanError` and prints its message (no traceback); anything else is a bug.
"""
from __future__ import annotations


class HetplanError(Exception):
    """Base class for every error hetplan reports to a user."""


class InstanceError(HetplanError):
    """An instance file is malformed or inconsistent; `field` names the offending location."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class PlanError(HetplanError):
    """A plan is inconsistent with itself or with the instance it is applied to."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class EstimatorError(HetplanError):
    """An estimator cannot produce a figure (missing profile, unknown estimator name...)."""


class SolverError(HetplanError):
    """A solver back-end is missing, refused the model, or failed."""


class InfeasibleError(HetplanError):
    """No plan satisfies the constraints; the message names the constraint group that conflicts."""
