"""hetplan: plan LLM training on heterogeneous, dynamically available GPU clusters.

Data flows one way: instance -> estimators -> formulations -> solvers -> plan -> simulator / runtime.
This core package holds the shared data model (instances, GPU catalogue, plans), the simulator
and the command-line interface.
"""
from hetplan.errors import HetplanError, InstanceError, PlanError

__version__ = "0.1.0"

__all__ = ["HetplanError", "InstanceError", "PlanError", "__version__"]
