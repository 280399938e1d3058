"""Estimator plug-ins by name. An instance picks them under `estimators:`; adding one is a class
with `from_instance(instance, options)` plus a line in the table below."""
from __future__ import annotations

import warnings
from difflib import get_close_matches
from importlib import import_module
from typing import Any, Mapping

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


def check_options(classes: list[Any], options: Mapping[str, Any]) -> None:
    """Refuse a key of `estimators.options` that none of the chosen estimators reads (a typo such as
    `framework_overhead_gib` was silently ignored). A key naming a chosen estimator may hold that
    estimator's own options (`own_options`). Classes that declare no OPTIONS are not checked."""
    if any(getattr(c, "OPTIONS", None) is None for c in classes):
        return
    read = {k for c in classes for k in c.OPTIONS}
    by_name: dict[str, set[str]] = {}
    for c in classes:
        by_name.setdefault(c.name, set()).update(c.OPTIONS)
    for key, value in options.items():
        if key in by_name and isinstance(value, Mapping):
            _refuse_unknown(value, by_name[key], f"estimators.options.{key}")
        else:
            _refuse_unknown({key: value}, read, "estimators.options")


def _refuse_unknown(options: Mapping[str, Any], read: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in options if k not in read)
    if unknown:
        close = get_close_matches(unknown[0], sorted(read), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise EstimatorError(f"{where}: {unknown[0]!r} is read by none of the chosen estimators{hint}; "
                             f"they read {sorted(read)}")


def build_estimators(instance: Instance) -> EstimatorSet:
    """The estimator set an instance asks for (`estimators:` section; defaults analytic/alpha_beta/cloud,
    or those of its `preset`)."""
    choice = instance.estimators
    opts = choice.options
    classes = {kind: _load(kind, getattr(choice, kind)) for kind in ("time", "memory", "comm", "cost")}
    check_options(list(classes.values()), opts)
    if instance.workload.profiles and not any(getattr(c, "READS_PROFILES", False) for c in classes.values()):
        warnings.warn(f"workload.profiles lists {len(instance.workload.profiles)} profile(s), but none of the chosen "
                      f"estimators reads them (time: {choice.time}, memory: {choice.memory}); choose time: profile "
                      f"(or memory: profile) to plan with the measurements")
    return EstimatorSet(
        time=classes["time"].from_instance(instance, opts),
        memory=classes["memory"].from_instance(instance, opts),
        comm=classes["comm"].from_instance(instance, opts),
        cost=classes["cost"].from_instance(instance, opts),
        notes={"time": choice.time, "memory": choice.memory, "comm": choice.comm, "cost": choice.cost,
               "iteration": choice.iteration},
        iteration=choice.iteration,
    )
