"""The joint planner (`hetplan solve`): resource allocation + parallelization with a proven bound.

Decomposition. The outer loop enumerates (P pipeline stages, b microbatch size, D replicas per
stage) with B % (D b) == 0; TP per stage and GPU type, replica counts per (stage, GPU type, zone)
and layer ranges are decided inside one MILP per outer choice (`formulations/joint/`).

Search: best first with lazy bounds. Every outer choice enters a priority queue with a cheap valid
lower bound (`joint.time_lower_bound_s`; for cost, times the cheapest possible cost rate). Before
the search, the heuristics (the greedy and the stage DP of `formulations/joint/stage_dp.py`)
run on the most promising choices (`_promise`, an estimate of the least iteration time), and on
the choice of least medium bound of `heuristic_degrees` other data-parallel degrees; from the best
plan's choice a local search (`_climb`) tries the neighbouring choices (P +- 1, b and D doubled or
halved, one more stage with half the microbatch and one fewer with twice it) and moves to
the first that does better, and when none does, goes on from the next best plan within
`CLIMB_SLACK` of it; the best plan becomes the incumbent (`_first_incumbent`): the strong
bounds then only have to rule out a target. The choice at the
head is refined twice, going back in the queue each time: first with the medium bound
(`joint.time_lower_bound_tight_s(exact=False)`: Hall counts, quota-aware all-reduce + update, a
few milliseconds), then with the strong bound; the first `heuristic_choices` choices the strong
bound keeps also get the stage-DP heuristic (in Sailor's composition the bound first only decides
that it keeps the choice, `joint.sailor_send_aware_rules_out_s`, and is finished at the target the
DP's plan sets: steps.py, `_refine`). The strong bound (`exact=True`: a dynamic program
over stages on GPUs per type, `joint.stages_fit_dp`, for the slowest stage alone and with a cap
on all-reduce + update, `joint.sync_aware_time_bound_s`; quota-aware bounds on the sum of stage
times, `joint.sum_tau_lower_bound_s`, and on all-reduce + update, `joint.extra_lower_bound_s`;
for cost also `joint.cost_lower_bound_dp_usd`; under a budget also the least time of the stage times
it affords, `joint.budget_time_lower_bound_s`, both per cell of the plans' largest all-reduce + update; in Sailor's composition also the stage DP on stage
times that include each stage's own sends, `joint.sailor_send_aware_time_bound_s`, whose cells of the
plans' largest all-reduce + update are split in halves where they cannot rule the target out, and
lifted by the least sum of those stage times with their sends under a cap on the slowest,
`joint.capped_sum_tau_s(sends=True)`; in the strongest bound its DP also fits cases in which each stage's
sends wait for their receivers, `_sailor_receiver_cases_s`). The cheap bound
is the GPUs' work with each type at its speed (`joint.fluid_gpu_seconds_s`), per region or with a
crossing between regions. Each (slowest stage, all-reduce + update) cell of the
sync-aware bound is lifted by the least sum of stage times under its caps (`joint.capped_sum_tau_s`:
a DP over blocks and GPUs in units of D). Once an incumbent exists, a choice that comes out at the
head with its strong bound gets the strongest one (the same, plus replica-level DPs that count one
GPU type exactly and price the others), and only a choice still at the head after that is solved:
heuristic warm start, then the MILP cut off at the target below (which also drops stage choices
too slow to beat it; a choice with no plan below the target is closed with the target as its
bound). Just before the first MILP, and after a MILP that stopped at its limit with
no plan, the heuristics dive (`_dive`): they run on the queued choices of least bound that have
not had the stage DP and whose bounds, refined up to the strong one, stay under the target
(`_closed_by_bounds`), those the strong bound kept first, for a better cutoff. The search stops when the head's bound
reaches the target (`_Outcome.target`): the returned plan's simulated objective less the requested
gap, but no more than the incumbent's model objective; every choice left is pruned at once.
MILPs still running then keep running to the deadline, their own limit lifted (`_Flight.lift`:
stopped, a MILP would be solved again from scratch); a slot they leave free solves again a choice
whose MILP stopped at its own limit (`combo_time_limit_s`), least bound first, to the deadline. Time
left after them goes to the choices still unsolved, least bound first, in equal shares. With several regions the strong time bound also splits the
plans by the regions they use (`joint.region_split_time_bound_s`; in Sailor's composition
`joint.sailor_region_split_bound_s`: each region's whole bound, or the send-aware DP with the sends
over one or two region crossings, `joint.sailor_crossing_time_bound_s`).
One cost model: the MILPs, bounds and heuristics read a relaxation of the simulator (its figures
are at most the simulator's on every plan of the space: formulations/joint/milp.py), whose all-reduce
and boundary figures are the communication estimator's floors over the placements first fit may
make (`with_sync_table`, `tied_floors_s`, `_Tables.effective_link`). Every plan the search keeps
is scored by `simulate` (`_Scorer`): the limits, the plan returned, its objective and gap are the
simulator's, and a bound on the relaxation is one on the simulator. A MILP plan the simulator
refuses (over a limit once placed) is left out and its choice solved again (`_Search._past_refusals`,
`joint.build(exclude=)`); the choice keeps its first bound unless the rows left out the refused
plans alone (`joint.excludes_only`), where the last solve's answer is the choice's. The search
itself compares model figures with model figures: its incumbent and the MILP cutoffs are the model objective of the
plan the model rates best (`_Outcome.lead`). Cutting with the simulated objective instead (a few
tenths of a percent to ~2 % above the model's) closed fewer choices by their bounds and made the
MILPs slower: 2-5x longer searches on opt350-geo-5zones-32/-80, neo27-types-3 and
opt350-het-80+240 (benchmarks/planner.py). Only the target the bounds close choices at reads the
simulated objective, capped at the incumbent's model objective: the reported gap, the
simulator's, then meets the requested one wherever the model can prove it (benchmarks/planner.py,
one run each: the gap within 1 % on 14 of 17 scenarios instead of 6, searches 43.2 -> 67.8 s in
all, opt350-2zones-budget 4.6 -> 28.8 s with two MILPs the bounds had closed before).

Past the model (`beyond_model`, on by default; `search._beyond_the_model`): a search that settled
every choice with the simulated gap still above rel_gap (the simulator rated the model's best plan
more than rel_gap above the model) goes on with the time left. Each choice whose proven model bound
is under the target t = best (1 - rel_gap) is solved again with t as cutoff; every plan its MILP
finds is simulated together with the plans its exclusion row leaves out (the same pools per stage
with every split of the units, `joint.every_split`, and every spread of the replicas over the pools,
`joint.excluded_counts`, where that is at most MAX_FAMILY plans; else on its own split), which are
then left out (`joint.build(exclude_pools=)`, `exclude=`), until the MILP has no plan under t. Every
plan of the choice is then at least t by the simulator, so the reported bound may pass the model's
best plan; choices left open (a MILP's limit, more plans than MAX_FAMILY, the deadline) keep their
bounds (`PlannerResult.open_past_model`). It runs only where the search ended above the gap: on the
17 scenarios of benchmarks/planner.py it never does. On helper-12's random campaign (max_stages 3,
the enumerated optimum beside it; /tmp/s66, session 66): of 31 seeds, 27 ended "complete" above 1 %,
6 of them with plans 0.10-21.87 % slower than the optimum; all end at the optimum within 1 %
(0.04-0.89 s each). benchmarks/planner_campaign.py measures it on the tests' random instances, with
and without.

With `estimators: {preset: sailor}` the model is Sailor's composition (formulations/joint/milp.py,
"Sailor's composition"), every plan is scored by `simulate_sailor`, and a stage spread over zones
or GPU types gets the replica order whose slowest neighbour pair is fastest
(`simulator_sailor.ring_ordered`; Sailor's all-reduce reads the pairs in replica order, two
replicas of one zone side by side included), kept when the simulation says it is better and within
the limits (an interleaved order can cost more egress); the plan returned carries that order.

Two cores: with `workers=2` (the default) a forked helper process takes refinement steps ahead
of the search: the medium bounds of the queued choices while the main process runs the first
incumbent's heuristics, then the later steps of the choices under the target, in queue order. A
step's result depends only on the step (`_Step`) and is used only when the search reaches it, so
the search makes exactly the decisions it makes in one process (`_Refiner`, `_Helper`, `_refine`).
While the helper computes the step the search waits for, the main process takes the next queued
steps the helper has not started, and stops the one it is on as soon as the awaited answer comes
in (`joint.stop_scope`), unless that answer leaves the search nothing to do before it
(`helper._unblocks`): a stopped step goes back to the helper.

MILPs side by side: with `concurrent_milps=2` (the default) and a back-end that solves without the
GIL (HiGHS: `Capabilities.parallel_solves`), a choice's MILP runs in a thread of its own while the
search goes on with the next choices: their bounds, their heuristics, and the next MILP when the
head of the queue needs one (`_Flight`; at most two at once, the search waits for one to end
before a third). A MILP's own limit (`combo_time_limit_s`) is then CPU seconds of its thread
(`_CpuBudget`) and its wall-clock limit the search's deadline, so MILPs that share the cores with
each other and the helper are not stopped earlier than one alone. A MILP started while another runs
has the older incumbent as its cutoff: its answer is valid (a cutoff above the final incumbent only
keeps more plans in), but the search may take other steps than with `concurrent_milps=1` and
return another plan within the gap. Measured side by side on the 8 scenarios of
benchmarks/sailor_real.py that solve MILPs (`--time-limit 30 --only ... --concurrent-milps 1`, then
2, twice, 2-core machine): search time 143.3 / 144.8 -> 134.7 / 137.6 s in all;
c_opt350_a100_2regions_64each 16.70 / 16.70 -> 11.78 / 14.80 s, d_opt350_het_32_96_maxthr_budget0.5
12.48 / 13.33 -> 10.67 / 10.19 s, b_OPT-350_a128_v384 9.44 / 10.10 -> 8.66 / 8.91 s, the one with a
single MILP within noise (4.48 / 4.50 -> 4.49 / 4.78 s), the same plans; the three stopped at 30 s
solve 8-11 MILPs instead of 5-8 and keep their gaps. With two slots, the MILP limit went from 5 to
10 s (one run each, all 17 scenarios, `--time-limit 30`): c_gptneo_a100_5zones_32each 4.48 -> 2.60 %,
c_opt350_het_2zones_128x4 7.61 -> 1.14 %, the others the same plans, gaps and MILP counts within
noise of their times (145.2 -> 147.2 s in all, most of it the three at 30 s); benchmarks/planner.py
--no-baseline 58.2 -> 45.4 s, opt350-2zones-budget 23.10 -> 11.13 s (its two MILPs no longer stop at
5 s to be solved again from the start).
A MILP whose cutoff the search's target has since passed by STALE_DROP (0.5 %) stops at HiGHS's
next callback, and its choice goes back in the queue at the bound it has, to be solved again from
there at the target of then (`_stale`, `_Search._settle`; one record and one count per choice): a
cutoff above the target keeps in plans that cannot decide the search, and the MILP takes longer to
prove that no plan is below it. Measured, one process per run, old / new / new / old
(`plan(..., time_limit_s=T)`): spot_trace_2type at 60 s, gap 4.19 / 4.19 -> 3.56 / 3.56 % (P8 b1 D4,
launched at the cutoff 0.29904 s, stops 10 s later when the target is 0.29600 s, and is then proven
infeasible in 14 s; without the stop it ran 39 s at its first cutoff, no answer); zorse_4type_2region at
30 s, autohet_3type, a100_v100_one_zone and elastic_small: no MILP stopped, the same plans and
gaps; benchmarks/planner.py --no-baseline 21.97 / 21.75 -> 21.45 / 21.71 s, the same plans.

Time limit: `time_limit_s` bounds the whole call (measured within 10 % + 1 s where the final
plan's simulation is short). One `joint.Deadline` is checked by the preparation of the choices'
inputs (at most PREPARE_SHARE of the limit, the most promising choices first by `_Floor`, a bound
from the layer times alone), by every heuristic and bound in its long loops (`joint.deadline_scope`:
a computation the deadline stops is dropped, so every bound kept is valid; the stage DP keeps the
best plan it had), by the helper's steps and the waits for them, and by the MILPs' limits. The
search then returns the best plan found with status "time_limit" and the bound proven so far; with
no plan yet, the greedy looks for one on the queued choices for RESCUE_S (or a quarter of the
limit) before SolverError says the time ran out. A budget or throughput floor beyond every plan
fails at once (`_Floor`, `_check_reachable`). `progress` receives a `SearchProgress` (choices
settled, incumbent, bound, gap) at most every PROGRESS_EVERY_S seconds.

Signals: SIGINT raises KeyboardInterrupt in the main process (a wait for the helper or a HiGHS
solve included: `solvers.highs_backend` runs HiGHS in a thread); a SIGTERM left at its default
action raises `SearchTerminated` (a KeyboardInterrupt) during the search. Either way the helper is
stopped before the exception leaves `plan()`; the helper itself ignores SIGINT (Ctrl-C reaches the
whole process group), dies at SIGTERM without a traceback and dies with the main process.

Reported bound: the greater of what the search proved past the model and the min over (the
incumbent, the dual bounds of choices stopped by a limit or solved within the MILP's own gap
(`_milp_gap`: 1 - target / cutoff, so that a MILP stopped at a plan at the cutoff closes its choice
at the search's target; measured, benchmarks/planner.py one run each: opt350-2zones-budget 1.07 ->
1.00 %, neo27-types-2 1.14 -> 1.00 %, neo27-types-3 1.43 -> 1.27 %, the same times; before, rel_gap
/ 2 whatever the target) (one stopped with no plan: its dual bound up to the cutoff, if above its
lower bound), the lower bounds of choices never solved or pruned within the gap).
This is a proven bound over the modelled space: every plan with uniform microbatch shares, the
same D on every stage, per-stage DP traffic inside one region and, where the blocks after the first
are identical but the first differs (the compact form of `formulations/joint/milp.py` on Sailor's
profiles), at least one block on the first stage.

Files, each importing only the ones listed before it:
  options.py  PlannerOptions, Combo, ComboRecord, PlannerResult, SearchProgress
  inputs.py   the estimator tables and one outer choice's JointInputs (all-reduce and tied floors)
  steps.py    one refinement step: the next bound of a choice, and the stage-DP heuristic
  helper.py   the forked helper process that takes steps ahead, and the _Refiner
  search.py   `plan`: preparation, first incumbent, best-first refinement, MILPs, the result
"""
from hetplan.orchestration.planner.options import (Combo, ComboRecord, PlannerOptions, PlannerResult, SearchProgress,
                                                   TP_CHOICES)
from hetplan.orchestration.planner.inputs import (enumerate_combos, joint_inputs, planner_tables, tied_floors_s,
                                                  with_sync_table)
from hetplan.orchestration.planner.search import SearchTerminated, plan

__all__ = ["Combo", "ComboRecord", "PlannerOptions", "PlannerResult", "SearchProgress", "TP_CHOICES",
           "enumerate_combos", "joint_inputs", "planner_tables", "tied_floors_s", "with_sync_table",
           "SearchTerminated", "plan"]
