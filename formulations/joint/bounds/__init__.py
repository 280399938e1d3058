"""Lower bounds on the iteration time and cost of every plan of one outer choice. Each composes
lower bounds on the parts of an iteration with composition.py's functions (nondecreasing in every
part, so the result is a lower bound); each public function states its bound and why it is valid
in its docstring; tests/test_planner.py and tests/test_cost_model_agreement.py check them against
enumeration on small instances.

Files, each importing only the ones above it:
  parts.py       the parts' floors every bound composes: transfers, Sailor's sends per class, the
                 all-reduce and update (sigma, mu), the GPUs' rate; T's upper bound for big-M
  work.py        the cheap bound: the GPUs' work over the slowest stage (`time_lower_bound_s`)
  stage_fit.py   whether the stages fit the GPUs at a slowest stage time (`stages_fit_dp`)
  bottleneck.py  the least slowest stage time: Hall counts, then the stage DP (`bottleneck_lower_bound_s`)
  sum_tau.py     the least sum of stage times, under caps on each stage (`capped_sum_tau_s`) and on
                 the GPUs' rate (`budget_sum_tau_s`)
  sends.py       Sailor's send-aware bound, by cells of theta and of sigma + mu
  sync_aware.py  theta and sigma + mu together (`sync_aware_time_bound_s`), every region merged
  regions.py     plans in one region or crossing between regions
  tight.py       the strong bound of a choice, composed of the above (`time_lower_bound_tight_s`)
  cost.py        the cost bounds, and the time bound under a budget
"""
from hetplan.formulations.joint.bounds.parts import (time_upper_bound_s, sailor_transfer_floor_s, fluid_gpu_seconds_s,
    least_work_by_type, send_aware_applies, in_region, extra_lower_bound_s, extra_floor_scope, stage_time_cap_s,
    rate_lower_bound_usd_per_s)
from hetplan.formulations.joint.bounds.work import time_lower_bound_s
from hetplan.formulations.joint.bounds.stage_fit import stages_fit_dp, block_bands
from hetplan.formulations.joint.bounds.bottleneck import blocks_coverable, bottleneck_lower_bound_s
from hetplan.formulations.joint.bounds.sum_tau import sum_tau_lower_bound_s, capped_sum_tau_s, budget_sum_tau_s
from hetplan.formulations.joint.bounds.sends import (sailor_send_aware_time_bound_s, sailor_send_aware_rules_out_s,
    binding_budget_usd)
from hetplan.formulations.joint.bounds.sync_aware import sync_aware_time_bound_s
from hetplan.formulations.joint.bounds.regions import sailor_crossing_time_bound_s, region_split_time_bound_s
from hetplan.formulations.joint.bounds.tight import (time_lower_bound_tight_s, sailor_region_split_bound_s,
    extra_ceiling_s)
from hetplan.formulations.joint.bounds.cost import (cost_lower_bound_usd, cost_lower_bound_dp_usd,
    theta_interval_cost_bound_usd, budget_time_lower_bound_s)
from hetplan.formulations.joint.bounds import (parts, work, stage_fit, bottleneck, sum_tau, sends, sync_aware,
    regions, tight, cost)

__all__ = ["time_upper_bound_s", "sailor_transfer_floor_s", "fluid_gpu_seconds_s", "least_work_by_type",
           "send_aware_applies", "in_region", "extra_lower_bound_s", "extra_floor_scope", "stage_time_cap_s",
           "rate_lower_bound_usd_per_s", "time_lower_bound_s", "stages_fit_dp", "block_bands", "blocks_coverable",
           "bottleneck_lower_bound_s", "sum_tau_lower_bound_s", "capped_sum_tau_s", "budget_sum_tau_s",
           "sailor_send_aware_time_bound_s",
           "sailor_send_aware_rules_out_s", "binding_budget_usd", "sync_aware_time_bound_s",
           "sailor_crossing_time_bound_s", "region_split_time_bound_s", "time_lower_bound_tight_s",
           "sailor_region_split_bound_s", "extra_ceiling_s", "cost_lower_bound_usd", "cost_lower_bound_dp_usd",
           "theta_interval_cost_bound_usd", "budget_time_lower_bound_s",
           "parts", "work", "stage_fit", "bottleneck", "sum_tau", "sends", "sync_aware", "regions", "tight", "cost"]
