"""The simulator: scores a placed plan (iteration time, throughput, cost, memory per rank).

  pipeline.py  hetplan's composition (1F1B / GPipe over the stages' figures), `simulate`
  sailor.py    Sailor's composition, for instances with `estimators: {preset: sailor}`
  timeline.py  per-stage event timelines and figures of a simulated plan

Both compositions read the per-stage figures of `formulations/stage_cost.py`, the evaluation the
planner's model reads too, so the simulator and the planner cannot drift apart.
"""
from hetplan.simulator.pipeline import (RankMemory, SimulationReport, StageReport, build_report,
                                        in_flight_microbatches, simulate)

__all__ = ["RankMemory", "SimulationReport", "StageReport", "build_report", "in_flight_microbatches", "simulate"]
