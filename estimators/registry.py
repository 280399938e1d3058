"""Estimator plug-ins by name. An instance picks them under `estimators:`; adding one is a class
with `from_instance(instance, options)` plus a line in the table below."""
from __future__ import annotations

from importlib import import_module
from typing import Any

from hetplan.errors import EstimatorError
from hetplan.estimators.base import EstimatorSet
from hetplan.instance import Instance

# kind -> name -> "module:Class" (imported lazily so optional plug-ins cost nothing until chosen)
REGISTRY: dict[str, dict[str, str]] = {
    "time": {
        "analytic": "hetplan.estimators.analytic:AnalyticTime",
        "profile": "hetplan.estimators.profile_time:ProfileTimeEstimator",
        "sailor": "hetplan.estimators.sailor:SailorTime",
    },
    "memory": {
        "analytic": "hetplan.estimators.analytic:AnalyticMemory",
        "profile": "hetplan.estimators.profile_memory:ProfileMemoryEstimator",
        "sailor": "hetplan.estimators.sailor:SailorMemory",
    },
    "comm": {
        "alpha_beta": "hetplan.estimators.network:AlphaBetaComm",
        "sailor_poly": "hetplan.estimators.sailor_network:SailorNetworkComm",
        "sailor": "hetplan.estimators.sailor:SailorComm",
    },
    "cost": {
        "cloud": "hetplan.estimators.cost:CloudCost",
    },
}


def _load(kind: str, name: str) -> Any:
    table = REGISTRY[kind]
    if name not in table:
        raise EstimatorError(f"estimators.{kind}: unknown estimator {name!r}; known: {sorted(table)}")
    module, cls = table[name].split(":")
    return getattr(import_module(module), cls)


def build_estimators(instance: Instance) -> EstimatorSet:
    """The estimator set an instance asks for (`estimators:` section; defaults analytic/alpha_beta/cloud,
    or those of its `preset`)."""
    choice = instance.estimators
    opts = choice.options
    return EstimatorSet(
        time=_load("time", choice.time).from_instance(instance, opts),
        memory=_load("memory", choice.memory).from_instance(instance, opts),
        comm=_load("comm", choice.comm).from_instance(instance, opts),
        cost=_load("cost", choice.cost).from_instance(instance, opts),
        notes={"time": choice.time, "memory": choice.memory, "comm": choice.comm, "cost": choice.cost,
               "iteration": choice.iteration},
        iteration=choice.iteration,
    )
