"""Estimator plug-ins (time, memory, communication, cost) behind the protocols of `base`."""
from hetplan.estimators.base import (
    CommEstimator,
    CostEstimator,
    Endpoint,
    EstimatorSet,
    LayerTime,
    MemoryBreakdown,
    MemoryEstimator,
    TimeEstimator,
)
from hetplan.estimators.registry import build_estimators

__all__ = ["CommEstimator", "CostEstimator", "Endpoint", "EstimatorSet", "LayerTime", "MemoryBreakdown",
           "MemoryEstimator", "TimeEstimator", "build_estimators"]
