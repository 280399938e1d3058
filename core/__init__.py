"""hetplan: plan LLM training on heterogeneous, dynamically available GPU clusters.

Data flows one way: instance -> estimators -> formulations -> solvers -> plan -> simulator / runtime.
This package's root (the folder core/) is the data model alone, at the bottom of that flow: the
instance, the GPU catalogue, plans, profiles, the cluster's state over time, the importers of
other tools' files, and the errors. The simulator is hetplan.simulator (simulator/); the
planner, re-planning, replay and the command line are hetplan.orchestration (orchestration/).
"""
from hetplan.errors import HetplanError, InstanceError, PlanError

__version__ = "0.1.0"

__all__ = ["HetplanError", "InstanceError", "PlanError", "__version__"]
