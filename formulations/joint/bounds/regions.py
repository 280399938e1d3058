"""Bounds on the plans over several regions: a stage's replicas sit in one region, so a plan lies in
one region (that region's inputs alone bound it) or crosses between regions, where every crossing
pays the link between them (`sailor_crossing_time_bound_s` for Sailor's composition,
`region_split_time_bound_s` otherwise). The crossing bound tests the regions' GPUs with a DP over
the stages in order, each region's GPUs counted apart (`_regions_fit`)."""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from hetplan.formulations.joint.inputs import JointInputs, check_deadline
from hetplan.formulations.joint.composition import first_stage_sends, iteration_time_s
from hetplan.formulations.joint.tables import (_cached_for, _class_tables, _gpus_per_group, _pair_layout,
    _per_inputs_cache, blocks_identical, class_pools)
from hetplan.formulations.joint.bounds.parts import (_c_node_s, _gpus_per_type, _links_lower_bound_s,
    _minplus_padded_index, _mu_lower_bound_s, _region_extras_s, _region_inputs, _sailor_class_sends_s,
    _sailor_send_floor_s, _sailor_stage_times_s, _send_figures, _sync_update_lower_bound_s)
from hetplan.formulations.joint.bounds.work import _theta_work_bound_s
from hetplan.formulations.joint.bounds.stage_fit import _least_tp, _monotone_in_theta_and_cap
from hetplan.formulations.joint.bounds.bottleneck import bottleneck_lower_bound_s
from hetplan.formulations.joint.bounds.sum_tau import sum_tau_lower_bound_s
from hetplan.formulations.joint.bounds.sends import _split_cells_bound_s, _times_fit
from hetplan.formulations.joint.bounds.sync_aware import _time_lower_bound_merged_s, sync_aware_time_bound_s


def _least_over_regions(inp: JointInputs, crossing_s: float, target_s: float | None, bound_in) -> float:
    """min(crossing_s, `bound_in(sub, target)` of each region's inputs `sub`): the plans that cross
    regions and those inside each one (a region's target is lowered to the least so far: beyond
    it, that region's bound changes nothing)."""
    out = crossing_s
    for sub in _region_inputs(inp).values():
        if target_s is not None and out < target_s:
            target_s = out
        out = min(out, bound_in(sub, target_s))
    return out


def sailor_crossing_time_bound_s(inp: JointInputs, target_s: float | None = None, receivers: bool = False) -> float:
    """Sailor's composition, the plans that use two regions. A stage sits in one region (H5), so
    some boundaries j cross regions: c_j = c_region, and both sends over j (`sailor_p2p`,
    evaluation.sailor_sends), stage j's activation A_j and stage j + 1's gradient G_j, take at
    least x_c = max(c_region / 2, the send floors of class c, its least floor to another region)
    (`_sailor_crossing_sends_s`). A stage's time with its sends is then at least its compute plus
    x_c per crossing send and its class's floor per other send (`_sailor_crossing_times_s`), and
    theta is at least the least time at which the send-aware DP (`sailor_send_aware_time_bound_s`)
    fits the blocks with those times for some set of crossings. Two cases cover every plan:
      - its ends lie in different regions: one crossing j or more, and the tied-embedding
        all-reduce crosses regions too, sigma + mu >= tied(region) + mu (evaluate's `tied_at`);
      - its ends lie in one region: two crossings j < j' or more.
    The transfers: sum p >= (P - 1 - n) c_node + 2 n min_c x_c + the ends' extra sends, n = 1 or 2.
    Where the cells lift the sum of stage times with sends at their classes' own floors
    (`_lifted_send_cell_s`), the 2 n sends over the crossings or more (the first stage's activation
    and the last stage's gradient count twice in Sailor's p) add at least min_c (x_c - their own
    floor) each (measured: Sailor's OPT-350M on 64 + 64 A100 in two regions, P4 b2 D16, whose plan
    that the cells pictured, two TP 2 stages a region, pays 0.0324 and 0.0329 s over the crossing
    where its class's floor is 0.0051 s: the choice's bound from 3.172 s to 3.217 s, the target).
    With two regions, where that lift falls short, the sum is also taken with each region's GPUs
    counted apart and every send at its own region's floors (`_regions_stage_sum_s`; measured on
    the same scenario, P3 b2 D32: its strongest bound from 3.1897 s to 3.2171 s, over the target
    3.2170 s, so its MILP no longer runs)."""
    times, x = _sailor_stage_times_s(inp), float(_sailor_crossing_sends_s(inp).min())
    excess = float((_sailor_crossing_sends_s(inp) - _sailor_class_sends_s(inp)).min())
    sum_tau, sync_update = sum_tau_lower_bound_s(inp), _sync_update_lower_bound_s(inp)
    ends = first_stage_sends(inp.P) * _sailor_send_floor_s(inp)
    cases = [([(j,) for j in range(inp.P - 1)], 1, inp.tied_s[2] + _mu_lower_bound_s(inp))]
    if inp.P > 2:
        cases.append((list(itertools.combinations(range(inp.P - 1), 2)), 2, 0.0))
    out = math.inf
    for crossings, n, rest_floor in cases:
        per_set = [_sailor_crossing_times_s(inp, c) for c in crossings]
        # every stage time a fit test may take: a plan's slowest one is then a candidate
        tested = [*per_set] if len(inp.regions) != 2 else [
            *per_set, *_crossing_variants_s(inp).values(),
            *(v for family in (_regions_receiver_cases_s(inp) if receivers else ()) for case in family for v in case.values())]
        cands = np.unique(np.concatenate([times[np.isfinite(times)]] + [t[np.isfinite(t)] for t in tested]))
        cands = cands[cands >= bottleneck_lower_bound_s(inp, exact=False)].tolist()
        if not cands:
            continue
        transfers = (inp.P - 1 - n) * _c_node_s(inp) + 2 * n * x + ends
        fits = _crossing_fit(inp, _times_fit(inp, *per_set), ends_apart=n == 1, receivers=receivers)
        stage_sum = None if len(inp.regions) != 2 else functools.partial(_regions_stage_sum_s, inp, ends_apart=n == 1)
        out = min(out, _split_cells_bound_s(inp, fits, cands, sum_tau, transfers, sync_update,
                                            target_s if target_s is None else min(target_s, out), rest_floor,
                                            lift=True, send_excess_s=2 * n * excess, stage_sum=stage_sum))
    return out


def _crossing_fit(inp: JointInputs, fits, ends_apart: bool, receivers: bool = False):
    """`fits(theta, cap, rate)` and, with two regions, `_regions_fit`: both hold for every plan of
    the case (a stage's times with its crossing sends in `fits`, the regions' GPUs in the other)."""
    if len(inp.regions) != 2:
        return fits
    return lambda t, cap, rate=math.inf: fits(t, cap, rate) and _regions_fit(inp, t, cap, ends_apart, receivers)


def _regions_fit(inp: JointInputs, theta_s: float, extra_cap_s: float, ends_apart: bool,
                 receivers: bool = False) -> bool:
    """Whether the blocks fit P stages of D replicas over two regions with a boundary between them
    (ends in different regions, or in one region with two crossings or more), every stage within
    theta_s with its sends: a stage sits in one region (H5), next to a crossing its sends over it
    take at least x_c (`_sailor_crossing_sends_s`), elsewhere its class's floor, and the stages of
    a region share its GPUs. A dynamic program over stages whose state is (blocks placed, units of
    D GPUs used in region 0, the regions of this stage and the next, crossings so far odd, any),
    its value the fewest units used in region 1; a replica of stage i with n blocks in region r
    takes the fewest GPUs of any type of r that serves (i, n) within theta_s and extra_cap_s
    (`_gpus_per_replica`, types merged within a region: a relaxation). `stages_fit_dp` counts
    GPUs per type with the regions merged, so it lets a small region's stages take GPUs of the
    large one (measured: Sailor's GPT-Neo on 4 x 32 A100 in us-central1 + 32 in us-west1, P5 b2
    D16, whose stages in us-west1 share 32 GPUs: the least slowest stage of the plans with their
    ends in different regions from 0.1663 to 0.1767 s, `sailor_crossing_time_bound_s` against the
    target 12.992 s from 12.550 to 12.982 s; P6 b1 D16 and P4 b1 D32 reach the target). Monotone
    in theta_s and the cap like `stages_fit_dp`: the answers are kept the same way
    (`_monotone_in_theta_and_cap`).
    `receivers`: also, for every family of `_regions_receiver_cases_s`, some case of it fits."""
    if receivers:  # the plain test first: its answers are kept on their own
        return _regions_fit(inp, theta_s, extra_cap_s, ends_apart) and _monotone_in_theta_and_cap(
            inp, "regions_fit", (ends_apart, True), theta_s, extra_cap_s,
            lambda: _every_family_fits(inp, _regions_receiver_cases_s(inp),
                                       lambda case: _regions_fit_dp(inp, theta_s, extra_cap_s, ends_apart, case)))
    return _monotone_in_theta_and_cap(
        inp, "regions_fit", (ends_apart, False), theta_s, extra_cap_s,
        lambda: _regions_fit_dp(inp, theta_s, extra_cap_s, ends_apart, _crossing_variants_s(inp)))


def _every_family_fits(inp: JointInputs, families: list[list], fits) -> bool:
    """Whether some case of every family fits (`fits(case)`). The same answer in any order, so the
    family that failed last is tried first, and in each family the case that fitted last: the
    next theta of a bisection mostly fails or fits the same way (measured: Sailor's GPT-Neo on 5
    zones x 32 A100, P7 b2 D16's strongest bound at the search's target, 1,724 regions DPs
    instead of 6,996, 2.18 -> 0.69 s; on 2 regions x 64 A100, P3 b2 D32, 429 instead of 2,132,
    0.29 -> 0.13 s; the same bounds)."""
    order = _per_inputs_cache(inp, "family_order")
    families_first = order.setdefault(id(families), list(range(len(families))))
    for pos, f in enumerate(families_first):
        cases_first = order.setdefault((id(families), f), list(range(len(families[f]))))
        hit = next((k for k in cases_first if fits(families[f][k])), None)
        if hit is None:
            families_first.insert(0, families_first.pop(pos))
            return False
        cases_first.insert(0, cases_first.pop(cases_first.index(hit)))
    return True


def _regions_receiver_cases_s(inp: JointInputs) -> list[list[dict]]:
    """Families of cases of the regions' stage times (`_crossing_variants_s`, per region and
    crossing) where a stage's sends also wait for their receivers, as `_sailor_receiver_cases_s`
    does with the regions merged: a send is at least the receive floor of every pool the receiving
    stage uses (evaluation.sailor_sends). Per level phi of the classes' least receive floors in
    each region, one case: the family's sending stage pays its sends to the receivers at
    max(figure, phi) (a middle stage: one of its two sends, the least of both ways), and the
    receiving stages are served only by the classes whose floor in their region is <= phi. A plan
    fits the case of phi = the largest floor among its receivers' classes, so some case of each
    family fits it. Families: stage 0 (its activation sends wait for stage 1), stage P - 1 (its
    two gradient sends wait for stage P - 2), each middle stage i (stages i - 1 and i + 1). Asked at
    the strongest level only (`sailor_crossing_time_bound_s` with `receivers`). Measured: Sailor's
    GPT-Neo on 5 zones x 32 A100, P7 b2 D16, whose plan the test pictured without them has TP 2
    stages beside TP 1 ones (a send to those takes at least TP 1's receive floor, 0.0224 s, not
    its own 0.0119 s): the strongest bound 12.937 -> 12.992 s, at the search's target, in 3.3 s,
    where the choice's MILP took 18 s."""
    def make(inp: JointInputs) -> list[list[dict]]:
        tab, lay, P = _class_tables(inp), _pair_layout(inp), inp.P
        a_times, g_times = _send_counts(inp)
        figures, variants = _region_send_figures(inp), _crossing_variants_s(inp)
        owns = np.concatenate([f[0][np.isfinite(f[0])] for f in figures.values()])
        recvs = np.unique(np.concatenate([f[2][np.isfinite(f[2])] for f in figures.values()]))
        least_own = owns.min() if owns.size else -np.inf
        levels = np.concatenate([recvs[recvs <= least_own][-1:], recvs[recvs > least_own]]).tolist()

        def case(sender: int, receivers: tuple[int, ...], phi: float) -> dict:
            out = {}
            on = lay.stage == sender
            for j, before, after in itertools.product(range(len(inp.regions)), (False, True), (False, True)):
                own, cross, recv = figures[j]
                a_fig, g_fig = (cross if after else own)[:, None], (cross if before else own)[:, None]
                times = variants[j, before, after].copy()
                if sender == 0:
                    sends = a_times[on][None, :] * np.maximum(a_fig, phi)
                elif sender == P - 1:
                    sends = g_times[on][None, :] * np.maximum(g_fig, phi)
                else:  # one of its two sends waits: the least of both ways
                    sends = np.minimum(np.maximum(a_fig, phi) + g_fig, a_fig + np.maximum(g_fig, phi))
                times[:, on] = tab.time_s[:, on] + sends
                times[np.ix_(recv > phi, np.isin(lay.stage, receivers))] = np.inf
                out[j, before, after] = times
            return out

        senders = [(0, (1,)), (P - 1, (P - 2,))] + [(i, (i - 1, i + 1)) for i in range(1, P - 1)]
        return [[case(i, r, phi) for phi in levels] for i, r in senders]
    return _cached_for(inp, "regions_receiver_cases", make)


def _crossing_variants_s(inp: JointInputs) -> dict[tuple[int, bool, bool], np.ndarray]:
    """(region index, crossing before the stage, crossing after it) -> (C, M) stage times with
    sends of a stage in that region, every stage's incoming / outgoing boundary between regions or
    not (`_with_crossing_sends`), each send at least the floors of the class's pools in that region:
    a stage's pools lie in its region (H5), and its sends are at least every one of its pools'
    floors (evaluation.sailor_sends). The floors differ by region (measured: Sailor's GPT-Neo on
    5 zones x 32 A100, TP 1 to another region: 0.0766-0.1083 s from us-central1, 0.0943 s from
    us-west1; the least over both regions let `_regions_fit` fit P6 b2 D16 at a slowest stage of
    0.1707 s, where the plan it pictured runs 0.1832 s)."""
    def make(inp: JointInputs) -> dict:
        a_times, g_times = _send_counts(inp)
        return {(j, before, after): _with_crossing_sends(inp, a_times * after + g_times * before, x, other)
                for j, (other, x, _) in _region_send_figures(inp).items()
                for before, after in itertools.product((False, True), repeat=2)}
    return _cached_for(inp, "crossing_variants", make)


def _region_send_figures(inp: JointInputs) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Region index -> `_send_figures` over the class's pools in that region."""
    return {j: _send_figures(inp, region) for j, region in enumerate(inp.regions)}


def _regions_fit_dp(inp: JointInputs, theta_s: float, extra_cap_s: float, ends_apart: bool, variants: dict) -> bool:
    """`_regions_fit` at one theta with the stage times `variants` ((region index, crossing before,
    crossing after) -> (C, M)), its answer not known from another (thetas that give the same GPUs
    per replica give the same answer)."""
    units = dict(zip(variants, _region_units(inp, theta_s, extra_cap_s, variants)))
    key = (b"".join(units[k].tobytes() for k in sorted(units)), ends_apart)
    cache = _per_inputs_cache(inp, "regions_fit_dp")
    if key not in cache:
        cache[key] = _two_regions_dp(inp, units, ends_apart)
    return cache[key]


def _region_units(inp: JointInputs, theta_s: float, extra_cap_s: float, variants: dict) -> np.ndarray:
    """(V, M): per variant (region index j, ...) of `variants` and pair, the fewest units of D GPUs
    a replica takes of any type of region j within theta_s and extra_cap_s: `_gpus_per_replica`
    for every variant at once (the regions' tests ask it thousands of times a search), with region
    j's own all-reduce + update floors (`_region_extras_s`) and its zones alone in the in-zone rule."""
    cache = _per_inputs_cache(inp, "region_units")
    if id(variants) not in cache:  # the dict is kept with its arrays: its id is not reused meanwhile
        types = sorted(_gpus_per_type(inp))
        per_region = _gpus_per_group(inp, "region")
        own = np.array([[g in per_region.get(inp.regions[j], {}) for g in types] for j, *_ in variants])
        extras = _region_extras_s(inp)
        extras_s = tuple(np.stack([extras[j][e] for j, *_ in variants]) for e in (0, 1))
        zone_region = {p.zone: p.region for p in inp.pools}
        zones = np.array([[zone_region[z] == inp.regions[j] for z in _gpus_per_group(inp, "zone")]
                          for j, *_ in variants], dtype=float)
        cache[id(variants)] = (variants, np.stack(list(variants.values())), own, tuple(types), extras_s, zones)
    _, times, own, types, extras_s, zones = cache[id(variants)]
    return np.where(own[:, :, None], _least_tp(inp, theta_s, types, extra_cap_s, times, extras_s, zones),
                    np.inf).min(axis=1)


def _region_unit_caps(inp: JointInputs) -> list[int]:
    """Per region, the units of D GPUs it holds (its GPUs of every type, within the choice's cap)."""
    per_region = _gpus_per_group(inp, "region")
    caps = [sum(per_region.get(r, {}).values()) // inp.D for r in inp.regions]
    return caps if inp.max_gpus is None else [min(c, inp.max_gpus // inp.D) for c in caps]


# The states of the DPs over stages on two regions (`_two_regions_dp`, `_regions_stage_sum_dp`):
# (region of the stage before, region of this one, crossings so far odd, any crossing so far).
def _first_states(shape: tuple[int, ...]) -> dict:
    """Before stage 0: in either region, no crossing yet, nothing placed (a table of `shape`, 0 at
    its origin, inf elsewhere)."""
    start = np.full(shape, np.inf)
    start[(0,) * len(shape)] = 0.0
    return {(r, r, False, False): start for r in (0, 1)}


def _next_regions(inp: JointInputs, i: int, here: int) -> tuple[int, ...]:
    """The regions stage i + 1 may take (the last stage has none after it: its own)."""
    return (0, 1) if i < inp.P - 1 else (here,)


def _state_after(here: int, odd: bool, crossed: bool, after: int) -> tuple:
    """The state of the next stage, in region `after`, from this one's."""
    cross = after != here
    return here, after, odd ^ cross, crossed or cross


def _keep_least(states: dict, key: tuple, table: np.ndarray) -> None:
    """states[key] = the elementwise least of it and `table`."""
    if key in states:
        np.minimum(states[key], table, out=states[key])
    else:
        states[key] = table


def _in_case(state: tuple, ends_apart: bool) -> bool:
    """Whether a plan that ends in `state` is of the case: its ends in different regions (an odd
    number of crossings), or in one region with a crossing."""
    return state[2] == ends_apart and state[3]


def _two_regions_dp(inp: JointInputs, units: dict, ends_apart: bool) -> bool:
    """The dynamic program of `_regions_fit` over `units` (`_regions_fit_dp`). The states that
    share the regions of the stage before and this one read the same units, so their tables are
    stacked and each transition is one gather over all of them (half the time of a loop over
    states and unit values: c_gptneo_a100_5zones_32each's 897 DPs, 2.3 -> 1.2 s)."""
    lay, D, L = _pair_layout(inp), inp.D, inp.U - 2
    caps = _region_unit_caps(inp)
    width = caps[0] + 1
    prev = _minplus_padded_index(L + 1)  # prev[s, n] = s - n, or the inf row L + 1
    starts = np.searchsorted(lay.stage, np.arange(inp.P + 1))
    # a state -> (blocks, units of region 0) -> the fewest units of region 1
    states = _first_states((L + 1, width))
    for i in range(inp.P):
        check_deadline()
        at = slice(starts[i], starts[i + 1])
        groups: dict = {}
        for (before, here, odd, crossed), best in states.items():
            groups.setdefault((before, here), []).append(((odd, crossed), best))
        new: dict = {}
        for (before, here), members in groups.items():
            stack = np.full((len(members), L + 2, width + 1), np.inf)  # with an inf row and column
            for j, (_, best) in enumerate(members):
                stack[j, :L + 1, :width] = best
            for after in _next_regions(inp, i, here):
                u_row = units[here, before != here, after != here][at]
                ok = np.isfinite(u_row)
                if not ok.any():
                    continue
                rows, u = prev[:, lay.count[at][ok]], u_row[ok].astype(int)  # (L + 1, k), (k,)
                if here == 0:  # region 0's units move the column: from w - u, or the inf column
                    src = np.arange(width)[None, :] - u[:, None]
                    reach = stack[:, rows[:, :, None], np.where(src >= 0, src, width)[None]].min(axis=2)
                else:  # region 1's units add to the value
                    reach = (stack[:, rows, :width] + u[None, None, :, None]).min(axis=2)
                for j, ((odd, crossed), _) in enumerate(members):
                    _keep_least(new, _state_after(here, odd, crossed, after), reach[j])
        states = new
    for state, best in states.items():
        if _in_case(state, ends_apart):
            ok = best[L] <= caps[1]
            if inp.max_gpus is not None:
                ok &= best[L] + np.arange(width) <= inp.max_gpus // D
            if ok.any():
                return True
    return False


REGION_SUM_STATES = 50_000  # the most (blocks placed, units of each region) states `_regions_stage_sum_s` keeps


def _regions_stage_sum_s(inp: JointInputs, theta_cap_s: float, extra_cap_s: float, ends_apart: bool) -> float:
    """A lower bound on sum_i (tau_i + p_i), each stage's time with its sends, over the plans of one
    case of the crossing bound over two regions (`ends_apart`: ends in different regions, else in
    one region with two crossings or more) whose every tau_i + p_i is at most theta_cap_s and
    whose every stage's all-reduce + update floor, taken in its region (`_region_extras_s`), is
    at most extra_cap_s. A stage sits in one region (H5); with S the classes of its replicas and
    u the least TP among them, each of its D replicas takes u GPUs or more, and tau_i + p_i is at
    least the time with sends (`_crossing_variants_s`: crossings before and after it or not) of
    the class of S with TP u, so of the least such time over the region's classes with TP <= u
    that the caps allow. A dynamic program over the stages, as `_two_regions_dp` but valued: its
    state (the regions of the stage before and this one, crossings so far odd, any, blocks
    placed, units of D GPUs used in each region), its value the least sum; a region's units are
    its GPUs of every type, merged. The sends over the crossings count at their region's floors,
    which the sums of `capped_sum_tau_s` (types merged over the regions, each send at its class's
    own floor) do not see (measured: Sailor's OPT-350M on 64 + 64 A100 in two regions, P3 b2 D32:
    a TP 2 stage takes a region's 64 GPUs, so it is an end stage; the cell of the plans' largest
    all-reduce + update 0.5563 s, at a slowest stage of 0.1518 s: 0.3843 s there, 0.4166 s here).
    -inf (no bound) where the states would exceed REGION_SUM_STATES."""
    cache = _per_inputs_cache(inp, "regions_stage_sum")
    key = (theta_cap_s, extra_cap_s, ends_apart)
    if key not in cache:
        units, costs = _regions_stage_costs(inp, theta_cap_s, extra_cap_s)
        cache[key] = _regions_stage_sum_dp(inp, units, costs, ends_apart)
    return cache[key]


def _regions_stage_costs(inp: JointInputs, theta_cap_s: float, extra_cap_s: float) -> tuple[list[int], dict]:
    """(the TP degrees u, (region index, crossing before, crossing after) -> (len(u), M) the least
    time with sends of the region's classes with TP <= u that fit in memory and the caps allow,
    inf for none) of `_regions_stage_sum_s`."""
    tab = _class_tables(inp)
    tp = np.array([c[1] for c in tab.classes])
    units = sorted({int(t) for t in tp})
    extras = _region_extras_s(inp)
    own = [np.array([bool(ks) for ks in class_pools(inp, tab.classes, r)]) for r in inp.regions]
    costs = {}
    for (j, before, after), times in _crossing_variants_s(inp).items():
        ok = tab.fits & own[j][:, None] & (times <= theta_cap_s) & (np.minimum(*extras[j]) <= extra_cap_s)
        t = np.where(ok, times, np.inf)
        costs[j, before, after] = np.stack([np.where(tp[:, None] <= u, t, np.inf).min(axis=0) for u in units])
    return units, costs


def _regions_stage_sum_dp(inp: JointInputs, units: list[int], costs: dict, ends_apart: bool) -> float:
    """The dynamic program of `_regions_stage_sum_s`."""
    lay, L = _pair_layout(inp), inp.U - 2
    caps = _region_unit_caps(inp)
    w0, w1 = caps[0] + 1, caps[1] + 1
    if (L + 1) * w0 * w1 > REGION_SUM_STATES:
        return -math.inf
    prev = _minplus_padded_index(L + 1)  # prev[s, n] = s - n, or the inf row L + 1
    starts = np.searchsorted(lay.stage, np.arange(inp.P + 1))
    states = _first_states((L + 2, w0 + 1, w1 + 1))  # an inf row and column on each axis
    for i in range(inp.P):
        check_deadline()
        at = slice(starts[i], starts[i + 1])
        new: dict = {}
        for (before, here, odd, crossed), best in states.items():
            for after in _next_regions(inp, i, here):
                cost = costs[here, before != here, after != here][:, at]  # (units, pairs of stage i)
                reach = np.full((L + 2, w0 + 1, w1 + 1), np.inf)
                for k, u in enumerate(units):
                    ok = np.isfinite(cost[k])
                    if not ok.any():
                        continue
                    rows = prev[:, lay.count[at][ok]]  # (L + 1, pairs)
                    # this region's units shift its axis: from w - u, or the inf column
                    src0 = np.arange(w0) - (u if here == 0 else 0)
                    src1 = np.arange(w1) - (u if here == 1 else 0)
                    got = best[rows][:, :, np.where(src0 >= 0, src0, w0)][:, :, :, np.where(src1 >= 0, src1, w1)]
                    np.minimum(reach[:L + 1, :w0, :w1], (got + cost[k, ok][None, :, None, None]).min(axis=1),
                               out=reach[:L + 1, :w0, :w1])
                _keep_least(new, _state_after(here, odd, crossed, after), reach)
        states = new
    return float(min((best[L, :w0, :w1].min() for state, best in states.items() if _in_case(state, ends_apart)),
                     default=math.inf))


def _sailor_crossing_sends_s(inp: JointInputs) -> np.ndarray:
    """(C,): x_c of `sailor_crossing_time_bound_s`, the least a send of class c over a boundary
    between regions takes."""
    return _send_figures(inp)[1]


def _sailor_crossing_times_s(inp: JointInputs, crossings: tuple[int, ...]) -> np.ndarray:
    """(C, M): `_sailor_stage_times_s` where the boundaries `crossings` lie between regions: stage
    i's sends are A_i (twice for the first stage when P > 3) and G_{i-1} (twice for the last),
    each at least x_c (`_sailor_crossing_sends_s`) over a crossing and its class's floor
    otherwise."""
    cache = _per_inputs_cache(inp, "sailor_crossing_times")
    if crossings not in cache:
        i, (a_times, g_times) = _pair_layout(inp).stage, _send_counts(inp)
        crossed = list(crossings)
        cache[crossings] = _with_crossing_sends(inp, a_times * np.isin(i, crossed) + g_times * np.isin(i - 1, crossed))
    return cache[crossings]


def _send_counts(inp: JointInputs) -> tuple[np.ndarray, np.ndarray]:
    """(M,) twice: how many sends of its activation A_i and of its gradient G_{i-1} the stage of
    each (stage, blocks) pair pays in Sailor's composition (`sailor_p2p`)."""
    i, P = _pair_layout(inp).stage, inp.P
    return (np.where(i == 0, first_stage_sends(P), np.where(i == P - 1, 0, 1)),
            np.where(i == P - 1, 2, np.where(i == 0, 0, 1)))


def _with_crossing_sends(inp: JointInputs, crossing_sends: np.ndarray, x: np.ndarray | None = None,
                         other: np.ndarray | None = None) -> np.ndarray:
    """(C, M) stage times with sends where `crossing_sends` (M,) of each pair's sends go over a
    boundary between regions (x_c each, default `_sailor_crossing_sends_s`) and the others at the
    class's floor (`other`, default `_sailor_class_sends_s`)."""
    a_times, g_times = _send_counts(inp)
    x = _sailor_crossing_sends_s(inp) if x is None else x
    other = _sailor_class_sends_s(inp) if other is None else other
    return (_class_tables(inp).time_s + _sends_s(crossing_sends, x)
            + _sends_s(a_times + g_times - crossing_sends, other))


def _sends_s(counts: np.ndarray, each_s: np.ndarray) -> np.ndarray:
    """(C, M) counts[m] x each_s[c], with no send costing 0 even where a class has no link (each_s inf;
    numpy's 0 x inf is nan, and a nan stage time poisons every min and max downstream)."""
    with np.errstate(invalid="ignore"):
        out = counts[None, :] * each_s[:, None]
    return np.where(counts[None, :] == 0, 0.0, out)


def region_split_time_bound_s(inp: JointInputs, merged_s: float, target_s: float | None = None,
                              strongest: bool = False) -> float:
    """The bounds above merge every region, but a stage's replicas sit in one region (H5) and a
    boundary between regions costs c_region. A plan either
      - lies in one region r: T >= the bound of the inputs cut down to r's pools (`in_region`);
      - uses several regions with the first and last stage in one region: then it crosses a region
        boundary at least twice, T >= merged_s + 2 (c_region - c_node), and its slowest stage
        or boundary is at least c_region / 2 (theta >= c[i] / 2), T >= sum tau + (m - 1) theta +
        rest + 2 (c_region - c_node) with that theta;
      - or puts its ends in different regions: one crossing, and the tied-embedding all-reduce
        crosses regions too, T >= sum tau + (P - 1) c_node + (c_region - c_node) + (m - 1) theta
        + tied(region) + mu, each term bounded alone; and T >= merged_s + (c_region - c_node)
        (merged_s holds with the boundaries at c_node and grows with them one for one).
    The least of these is a bound (measured: OPT-350M on 5 zones in 2 regions, P5 b1 D64, the
    merged bound is 1.50 s, the optimum 1.654 s: the small region can hold one stage only at the
    cost of two crossings)."""
    return _least_over_regions(inp, min(_crossing_bounds_s(inp, merged_s, target_s, strongest)), target_s,
                               lambda sub, target: _time_lower_bound_merged_s(sub, True, target, strongest))


def _crossing_bounds_s(inp: JointInputs, merged_s: float, target_s: float | None = None,
                       strongest: bool = False) -> tuple[float, float]:
    """(T of the plans whose ends lie in different regions, T of the plans over several regions
    whose ends lie in one) at least, as `region_split_time_bound_s` states them. Where these fall
    short of the target (`strongest`, blocks form), also the sync-aware bound
    (`sync_aware_time_bound_s`) with theta >= c_region / 2 (a crossing boundary's half) plus the
    crossings' hops: the merged bound takes theta and sigma + mu together but not that floor, and
    the terms above take the floor but bound sigma + mu and sum tau alone (measured: Llama-7B on
    large_5type_2k at the target 1.5742 s, P4 b1 D128: 0.9937 -> 1.1854 s; of the 99 choices whose
    strongest bound was under the target, 32 reach it, and the least rises to 1.0171 s)."""
    c_node, c_region = inp.p2p_s(inp.node), inp.p2p_s(inp.region)
    hop = c_region - c_node
    slowest = max(_theta_work_bound_s(inp), bottleneck_lower_bound_s(inp, True))
    theta = max(slowest, c_region / 2)
    sum_tau = sum_tau_lower_bound_s(inp)
    ends_apart = max(merged_s + hop, iteration_time_s(inp.m, sum_tau, (inp.P - 1) * c_node + hop, theta,
                                                      inp.tied_s[2] + _mu_lower_bound_s(inp)))
    # two crossings: their boundaries take c_region, so theta >= c_region / 2 there too (measured:
    # OPT-350M, 5 zones x 80 A100, P13 b2 D16, m = 64: 1.52 s -> 2.57 s, above the 1.98 s of the
    # plans inside one region; the MILPs of P13-P16 D16 each stopped at their 5 s limit)
    two_hops = max(merged_s, iteration_time_s(inp.m, sum_tau, _links_lower_bound_s(inp), theta,
                                              _sync_update_lower_bound_s(inp))) + 2 * hop
    if (strongest and target_s is not None and min(ends_apart, two_hops) < target_s and inp.m > 1
            and blocks_identical(inp) and math.isfinite(slowest)):
        together = sync_aware_time_bound_s(inp, slowest, target_s - hop, strongest=strongest,
                                           theta_floor_s=c_region / 2)
        ends_apart, two_hops = max(ends_apart, together + hop), max(two_hops, together + 2 * hop)
    return ends_apart, two_hops
