"""The joint formulation: resource allocation + parallelization for one outer choice (P, b, D).

Files, in the order data flows through them (each imports only the ones above it):
  inputs.py        `JointInputs` (one outer choice's figures from the estimators), `JointSolution`,
                   the search deadline
  composition.py   how an iteration is composed, stated once: memory of a worker, boundary time,
                   the bottleneck, T, cost, egress bytes; applied to numbers by `evaluate`, to
                   Pyomo expressions by `build`, to lower bounds on the parts by the bounds
  tables.py        the stage-cost tables of the blocks form: per (time class, stage, block count)
                   stage time, memory fit, all-reduce and update, built once with numpy and read
                   by the MILP rows, the bounds and the heuristics alike
  bounds/          lower bounds on T and cost, a file per family (its __init__ lists them); each
                   function states its bound and why it holds
  evaluation.py    the model's own figures for a solution (`evaluate`) and the same solution
                   placed as the simulator places it (`evaluate_placed`)
  milp.py          the MILP: its math in the module docstring, `build`, `decode`, `warm_start`
  heuristics.py    the greedy warm start and `polish`
  stage_dp.py      the stage-DP heuristic over plans of homogeneous stages

The planner (`hetplan.orchestration.planner`) drives them per outer choice: a bound (bounds/) prunes the
choice or ranks it, the heuristics give an incumbent, the MILP (milp.py) is solved with that
incumbent as a cutoff, and the search stops when the best bound left is within the gap.
The names below are this package's public interface.
"""
from hetplan.formulations.joint.inputs import (ULP_SLACK, COST_SCALE, TIME_UNITS_PER_S, model_coef,
    DeadlineExceeded, Deadline, NO_DEADLINE, deadline_scope, check_deadline, Stopped, stop_scope, Pool, LinkCost,
    JointInputs, JointSolution)
from hetplan.formulations.joint.tables import (cache_export, cache_import, blocks_identical, block_counts,
    position, stage_units, stage_sum, time_classes, ends_forced)
from hetplan.formulations.joint.bounds import (time_upper_bound_s, time_lower_bound_s, sailor_transfer_floor_s,
    fluid_gpu_seconds_s, least_work_by_type,
    blocks_coverable, bottleneck_lower_bound_s, stages_fit_dp, time_lower_bound_tight_s,
    region_split_time_bound_s, in_region, sync_aware_time_bound_s, extra_lower_bound_s, sum_tau_lower_bound_s,
    capped_sum_tau_s, budget_sum_tau_s, stage_time_cap_s, cost_lower_bound_usd, cost_lower_bound_dp_usd,
    rate_lower_bound_usd_per_s,
    budget_time_lower_bound_s, binding_budget_usd, sailor_crossing_time_bound_s, sailor_region_split_bound_s,
    sailor_send_aware_time_bound_s, sailor_send_aware_rules_out_s, send_aware_applies, extra_floor_scope,
    extra_ceiling_s)
from hetplan.formulations.joint.composition import (worker_bytes, boundary_s, sailor_p2p, bottleneck_terms,
    pipeline_transfers_s, iteration_time_s, theta_for_time_s, replica_rate_usd_per_s, iteration_cost_usd)
from hetplan.formulations.joint.evaluation import (sailor_sends, to_plan, evaluate, evaluate_placed,
    better, objective_within_limits, solution_blocks)
from hetplan.formulations.joint.heuristics import greedy, POLISH_EVALS, polish, promise_s
from hetplan.formulations.joint.stage_dp import dp_heuristic

__all__ = ["ULP_SLACK", "COST_SCALE", "TIME_UNITS_PER_S", "model_coef", "DeadlineExceeded", "Deadline",
           "NO_DEADLINE", "deadline_scope", "check_deadline", "Stopped", "stop_scope", "Pool", "LinkCost", "JointInputs",
           "JointSolution",
           "cache_export", "cache_import", "blocks_identical", "block_counts", "position", "stage_units",
           "stage_sum", "time_classes", "ends_forced", "time_upper_bound_s", "time_lower_bound_s",
           "sailor_transfer_floor_s", "fluid_gpu_seconds_s", "least_work_by_type", "blocks_coverable",
           "bottleneck_lower_bound_s",
           "stages_fit_dp",
           "time_lower_bound_tight_s", "region_split_time_bound_s", "in_region", "sync_aware_time_bound_s",
           "extra_lower_bound_s", "sum_tau_lower_bound_s", "capped_sum_tau_s", "budget_sum_tau_s", "stage_time_cap_s",
           "cost_lower_bound_usd", "cost_lower_bound_dp_usd", "rate_lower_bound_usd_per_s",
           "budget_time_lower_bound_s", "binding_budget_usd", "sailor_send_aware_time_bound_s",
           "sailor_send_aware_rules_out_s", "send_aware_applies", "sailor_crossing_time_bound_s",
           "sailor_region_split_bound_s", "extra_floor_scope", "extra_ceiling_s", "worker_bytes", "boundary_s",
           "sailor_p2p",
           "bottleneck_terms", "pipeline_transfers_s", "iteration_time_s", "theta_for_time_s",
           "replica_rate_usd_per_s", "iteration_cost_usd",
           "sailor_sends", "to_plan", "evaluate", "evaluate_placed", "better", "objective_within_limits",
           "solution_blocks", "build", "in_model_units", "objective_value", "NoStageChoice", "decode",
           "warm_start", "excludes_only", "excluded_counts", "every_split", "greedy", "promise_s", "POLISH_EVALS",
           "polish", "dp_heuristic"]

_MILP_NAMES = frozenset({"build", "in_model_units", "objective_value", "NoStageChoice", "decode", "warm_start",
                         "excludes_only", "excluded_counts", "every_split"})


def __getattr__(name: str):
    """milp.py's names, loaded on first use: it imports Pyomo (about 0.5 s), which a search that
    solves no MILP, or a process that only simulates, never needs."""
    if name in _MILP_NAMES:
        from hetplan.formulations.joint import milp
        return getattr(milp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
