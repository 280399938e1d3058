"""The strong bound of one outer choice (`time_lower_bound_tight_s`): the bounds of the other files,
composed by what the inputs hold (Sailor's composition, several regions) and by how hard the
search asks (`exact`, a target, `strongest`); and `extra_ceiling_s`, the most sigma + mu a plan
under a time cutoff can have (the MILP's "ceiling" row)."""
from __future__ import annotations

import math

from hetplan.formulations.joint.inputs import JointInputs
from hetplan.formulations.joint.bounds.parts import (_extra_values_s, _first_true, extra_floor_scope,
    sailor_transfer_floor_s, send_aware_applies)
from hetplan.formulations.joint.bounds.sends import sailor_send_aware_rules_out_s, sailor_send_aware_time_bound_s
from hetplan.formulations.joint.bounds.sync_aware import _time_lower_bound_merged_s
from hetplan.formulations.joint.bounds.regions import (_least_over_regions, region_split_time_bound_s,
    sailor_crossing_time_bound_s)


def time_lower_bound_tight_s(inp: JointInputs, exact: bool = False, target_s: float | None = None,
                             strongest: bool = False, decide: bool = False) -> float:
    """T >= sum_i tau_i + sum_i c_i + (m - 1) theta + sigma + mu, each term bounded alone: sum tau >=
    F (every unit on its fastest pool), c_i >= c_node, theta >= the larger of
    `bottleneck_lower_bound_s` (with `exact`: its dynamic-programming refinement), F / P and D W / N
    (`time_lower_bound_s`) and the link time / 2, sigma and mu as in `_rest_lower_bound_s`.
    With `exact` (blocks form), also `sync_aware_time_bound_s`, which bounds theta and sigma + mu
    together. `target_s` (a T the caller wants to rule out) lets the exact search stop early: the
    result is then a valid bound that is >= target_s whenever the DP can prove it.
    With several regions, `exact` also splits the plans by the regions they use
    (`region_split_time_bound_s`). `strongest` (with `exact` and a target) adds the replica-level
    DPs on the sum of stage times (`capped_sum_tau_s`) where a cell falls short of the target.
    With Sailor's composition plus `sailor_transfer_floor_s`, and `sailor_send_aware_time_bound_s`,
    which goes first when there is a target: it alone rules out most choices there, and the merged
    bound's DPs are then spared (measured, Sailor's OPT-350M on 128 A100 + 384 V100, one process:
    the merged bound first, 127 strong steps in 11.0 s, 41 of them settled by the send-aware bound
    after it; a search of 11.6 s, 6.7 s with the send-aware bound first).
    `decide` (with a target, not `strongest`): the send-aware bound counts only where it reaches
    the target (`sailor_send_aware_rules_out_s`), which it tells sooner where it does not: the
    result is still a bound, weaker than without `decide` only where it stays under the target."""
    strongest = strongest and target_s is not None  # without a target it would lift every cell
    sends = exact and send_aware_applies(inp)
    first = -math.inf
    if sends and target_s is not None:
        if decide:
            ruled_out = sailor_send_aware_rules_out_s(inp, target_s)
            first = -math.inf if ruled_out is None else ruled_out
        else:
            first = sailor_send_aware_time_bound_s(inp, target_s, receivers=strongest)
        if first >= target_s:
            return first
    shift = sailor_transfer_floor_s(inp)  # the bounds below are the hetplan composition's
    out = _time_lower_bound_merged_s(inp, exact, None if target_s is None else target_s - shift, strongest)
    if exact and len(inp.regions) > 1 and out < math.inf and (target_s is None or out + shift < target_s):
        out = max(out, region_split_time_bound_s(inp, out, None if target_s is None else target_s - shift,
                                                 strongest))
    out = max(out + shift, first)
    if sends and target_s is None and out < math.inf:  # (with a target it came first)
        out = max(out, sailor_send_aware_time_bound_s(inp))
    if sends and len(inp.regions) > 1 and out < math.inf and (target_s is None or out < target_s):
        out = max(out, sailor_region_split_bound_s(inp, target_s, strongest))
    return out


def sailor_region_split_bound_s(inp: JointInputs, target_s: float | None = None, strongest: bool = False) -> float:
    """Sailor's composition with several regions: a plan lies in one region r, and then its T is at
    least the whole bound of the inputs cut down to r's pools (`in_region`, with its send-aware
    bound), or it crosses regions, and then T >= `sailor_crossing_time_bound_s`. The least of
    these bounds every plan; the bounds of the merged inputs miss both (measured: Sailor's GPT-Neo
    on 5 zones x 32 A100, P7 b2 D16: the merged send-aware bound is 10.41 s, us-central1 alone
    12.93 s, and the optimum, 13.04 s, crosses to us-west1 at a 1-block stage)."""
    return _least_over_regions(inp, sailor_crossing_time_bound_s(inp, target_s, receivers=strongest), target_s,
                               lambda sub, target: time_lower_bound_tight_s(sub, True, target, strongest))


def extra_ceiling_s(inp: JointInputs, target_s: float) -> float:
    """The least F among the choice's all-reduce + update values (`_extra_values_s`) such that every
    plan with sigma + mu >= F has T >= target_s (inf when no value does): the strong bound under
    `extra_floor_scope(F)` reaches the target. The bound only grows with F (each cell's rest is
    max(its own, F)), so a bisection (`_first_true`) finds it in ~log2 of the values' count; each F
    returned was tested, so a bound that took another path at some F leaves the result valid. A MILP with the
    target as cutoff may then add the row sigma + mu <= F (`milp.build(extra_ceiling_s=)`): the
    plans it leaves out are ruled out here. On the choice's own inputs the bounds' DP tests (which do
    not read sigma + mu) are mostly cached already. Measured, HiGHS alone after the choice's
    strongest bound at the target: Sailor's GPT-Neo on 5 zones x 32 A100 at 12.992 s, P3 b2 D32, P4
    b2 D32, P5 / P6 / P7 b2 D16: F = 3.14, 3.01, 1.32, 1.64, 1.47 s in 0.02-0.09 s each, no plan
    below the target proven in 1.56, 1.39, 2.93, 11.15, 17.38 s with the row against 1.19, 1.75,
    5.65, 11.08, 21.21 s without; OPT-350M on 2 zones of 128 A100 + 128 V100 at 1.37125 s, P6 b2
    D32 and P4 b4 D32: 6.73 and 0.67 s against 7.04 and 2.39 s. Branch and bound moves with any
    change to a model (as a bound on sigma alone, sigma <= F, the same seven took 40.5 s against
    50.8 s without in another run, P7 22.44 s, P6 7.09 s), so read the sums: 41.8 s with the row
    against 50.3 s without."""
    vals = _extra_values_s(inp).tolist()

    def reaches(floor_s: float) -> bool:
        with extra_floor_scope(floor_s):
            return time_lower_bound_tight_s(inp, True, target_s, decide=True) >= target_s

    if not vals or not reaches(vals[-1]):
        return math.inf
    return vals[_first_true(reaches, vals, 0)]
