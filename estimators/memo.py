"""Estimators that answer repeated questions from memory: the planner's tables, the simulator,
the re-planner's repair and a replay ask for the same layer times and memory figures many times."""
from __future__ import annotations

import dataclasses
from typing import Any

from hetplan.estimators.base import EstimatorSet


class _Memo:
    """Wraps one estimator; remembers the answers of its pure methods (arguments are hashable:
    strings, ints, ranges). Other attributes pass through."""

    def __init__(self, inner: Any, methods: tuple[str, ...]):
        self._inner, self.name = inner, inner.name
        for meth in methods:
            setattr(self, meth, self._wrap(getattr(inner, meth)))

    @staticmethod
    def _wrap(fn):
        table: dict = {}

        def call(*args):
            if args not in table:
                table[args] = fn(*args)
            return table[args]
        return call

    def __getattr__(self, item: str) -> Any:
        return getattr(self._inner, item)


def memoised(est: EstimatorSet) -> EstimatorSet:
    """The same estimators answering repeated questions from memory: the repair, the planner's
    tables and the simulator ask for the same layer times and memory figures many times, and a
    replay asks again at every event. Use one per network state (comm figures depend on it)."""
    if isinstance(est.time, _Memo):
        return est
    # `replace` keeps every other field: the iteration model above all (sailor plans were scored
    # with the hetplan composition while it was dropped here)
    return dataclasses.replace(est, time=_Memo(est.time, ("layer_time", "update_time_s")),
                               memory=_Memo(est.memory, ("worker_memory",)))
