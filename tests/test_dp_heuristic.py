"""The stage-DP heuristic (`formulations/joint/stage_dp.py`) against enumeration on the tiny
cluster: its DP is exact over plans of homogeneous stages, and every plan it returns is valid."""
import dataclasses
import itertools
import math

import pytest

from hetplan.formulations import joint
from hetplan.formulations.joint import stage_dp as H

from test_planner import _tiny_inputs, brute_force, combos_of, tiny, tiny_regions


def _homogeneous_by_enumeration(inp: joint.JointInputs, theta_s: float, value: str,
                                extra_cap_s: float = math.inf) -> float:
    """The least DP value over every plan of homogeneous stages within theta_s (and whose stages'
    in-zone all-reduce + update are within extra_cap_s): block counts per stage x (class, region)
    per stage, GPUs counted per (type, region)."""
    time_s, fits = joint.tables._class_figures(inp)
    extras = joint.tables._class_extras(inp)
    options = {((p.gpu_type, p.tp), p.region) for p in inp.pools}
    price = {key: min(p.price_per_gpu_hour_usd / 3600 for p in inp.pools if ((p.gpu_type, p.tp), p.region) == key)
             for key in options}
    avail: dict = {}
    for p in {p.quota_key: p for p in inp.pools}.values():
        avail[p.gpu_type, p.region] = avail.get((p.gpu_type, p.region), 0) + p.avail_gpus
    cross = inp.p2p_s(inp.region) - inp.p2p_s(inp.node)
    best = math.inf
    for ns in itertools.product(*(joint.block_counts(inp, i) for i in range(inp.P))):
        if sum(ns) != inp.U - 2:
            continue
        for pick in itertools.product(sorted(options), repeat=inp.P):
            if not all(fits[c, i, n] and time_s[c, i, n] <= theta_s and extras[c, i, n] <= extra_cap_s
                       for i, ((c, _), n) in enumerate(zip(pick, ns))):
                continue
            used: dict = {}
            for (c, r) in pick:
                used[c[0], r] = used.get((c[0], r), 0) + inp.D * c[1]
            if any(used[key] > avail[key] for key in used):
                continue
            if inp.max_gpus is not None and sum(used.values()) > inp.max_gpus:
                continue
            changes = sum(pick[i][1] != pick[i + 1][1] for i in range(inp.P - 1))
            if changes and inp.p2p_s(inp.region) / 2 > theta_s:
                continue
            if value == "time":
                v = sum(time_s[c, i, n] for i, ((c, _), n) in enumerate(zip(pick, ns))) + cross * changes
            else:
                v = sum(inp.D * c[1] * price[c, r] for (c, r) in pick)
            best = min(best, v)
    return best


def _dp_value(inp: joint.JointInputs, stages, value: str) -> float:
    time_s, _ = joint.tables._class_figures(inp)
    if value == "time":
        cross = inp.p2p_s(inp.region) - inp.p2p_s(inp.node)
        changes = sum(stages[i][1] != stages[i + 1][1] for i in range(inp.P - 1))
        return sum(time_s[c, i, n] for i, (c, _, n) in enumerate(stages)) + cross * changes
    price = {((p.gpu_type, p.tp), p.region): p.price_per_gpu_hour_usd / 3600 for p in inp.pools}
    return sum(inp.D * c[1] * price[c, r] for c, r, _ in stages)


def _two_regions(inp: joint.JointInputs) -> joint.JointInputs:
    """The V100 pools moved to a second region (a slow link between the two)."""
    pools = tuple(dataclasses.replace(p, region="r2") if p.gpu_type == "V100-16" else p for p in inp.pools)
    return dataclasses.replace(inp, pools=pools)


def _cases():
    for combo, inp in _tiny_inputs():
        yield combo, inp
        yield combo, _two_regions(inp)


@pytest.mark.parametrize("value", ["time", "cost"])
def test_stage_dp_is_exact_over_homogeneous_plans(value):
    checked = found = 0
    for combo, inp in _cases():
        time_s, _ = joint.tables._class_figures(inp)
        for theta in sorted(set(time_s.values())):
            truth = _homogeneous_by_enumeration(inp, theta, value)
            stages = H.stage_dp(inp, theta, value)
            if truth == math.inf:
                assert stages is None, (combo, theta)
            else:
                assert stages is not None, (combo, theta)
                assert _dp_value(inp, stages, value) == pytest.approx(truth, rel=1e-9, abs=1e-15), (combo, theta)
                found += 1
            checked += 1
    assert checked >= 60 and found >= 20, (checked, found)


def test_stage_dp_under_an_extra_cap_is_exact():
    """The heuristic's all-reduce descent solves the DP with a cap on each stage's all-reduce +
    update; against enumeration at several (theta, cap) pairs, including caps that leave no plan."""
    checked = found = 0
    for combo, inp in _cases():
        time_s, _ = joint.tables._class_figures(inp)
        thetas = sorted(set(time_s.values()))
        caps = sorted(set(joint.tables._class_extras(inp).values()))
        for theta in thetas[len(thetas) // 2::max(1, len(thetas) // 3)]:
            for cap in caps[::max(1, len(caps) // 4)]:
                truth = _homogeneous_by_enumeration(inp, theta, "time", cap)
                stages = H.stage_dp(inp, theta, "time", cap)
                if truth == math.inf:
                    assert stages is None, (combo, theta, cap)
                else:
                    assert stages is not None, (combo, theta, cap)
                    assert _dp_value(inp, stages, "time") == pytest.approx(truth, rel=1e-9, abs=1e-15)
                    found += 1
                checked += 1
    assert checked >= 40 and found >= 10, (checked, found)


def test_dp_heuristic_plans_are_valid_and_never_beat_the_optimum():
    """Every layer once, quotas and memory respected, the reported objective is the model's own;
    it cannot beat the brute-force optimum, and on some choices here it reaches it."""
    checked = optimal = 0
    for combo, inp in _cases():
        found = H.dp_heuristic(inp, "max_throughput")
        truth = brute_force(inp, "T", "blocks")
        if found is None:
            continue
        obj, sol = found
        units = [u for start, end in sol.ranges for u in range(start, end)]
        assert units == list(range(inp.U)), combo
        used: dict = {}
        for i, row in enumerate(sol.replicas):
            assert sum(row) == inp.D, combo
            assert joint.heuristics._stage_fits(inp, list(row), i, *sol.ranges[i]), combo
            assert len({inp.pools[k].region for k in range(inp.K) if row[k]}) == 1, combo
            for k, n in enumerate(row):
                used[inp.pools[k].quota_key] = used.get(inp.pools[k].quota_key, 0) + n * inp.pools[k].tp
        for key, n in used.items():
            assert n <= next(p.avail_gpus for p in inp.pools if p.quota_key == key), combo
        if inp.max_gpus is not None:
            assert sum(used.values()) <= inp.max_gpus, combo
        assert obj == pytest.approx(joint.evaluate(inp, sol)["T"], rel=1e-12)
        assert obj >= truth * (1 - 1e-9), combo
        optimal += obj <= truth * (1 + 1e-9)
        checked += 1
    assert checked >= 8 and optimal >= 2, (checked, optimal)


def test_dp_heuristic_respects_budget_and_min_throughput():
    for combo, inp in combos_of(tiny("min_cost"), "min_cost"):
        free = H.dp_heuristic(inp, "min_cost")
        if free is None:
            continue
        ev = joint.evaluate(inp, free[1])
        # a throughput floor just above what the cheapest plan reaches: that plan must not come back
        floor = 1 / ev["T"] * 1.0001
        limited = H.dp_heuristic(inp, "min_cost", min_iters_per_s=floor)
        if limited is not None:
            assert joint.evaluate(inp, limited[1])["T"] <= 1 / floor * (1 + 1e-12), combo
        fast = H.dp_heuristic(inp, "max_throughput", max_cost_usd=ev["cost"])
        assert fast is not None and joint.evaluate(inp, fast[1])["cost"] <= ev["cost"] * (1 + 1e-12), combo


def test_the_stage_dp_under_a_budget_that_turns_down_no_better_plan_finds_the_plan_without_it():
    """Under a budget the stage DP first sweeps as without one, and widens its sweep (the cheap
    caps, the cheapest plan of each) only where the budget turned down a plan better than the best
    it kept: with a budget above every plan's cost the same plan as without a budget; with one at
    the budget-free plan's own cost, that plan again; with one just below it, a plan within it."""
    checked = 0
    for inst in (tiny(), tiny_regions()):
        for combo, inp in combos_of(inst, "max_throughput"):
            free = H.dp_heuristic(inp, "max_throughput")
            if free is None:
                continue
            cost = joint.evaluate(inp, free[1])["cost"]
            same = H.dp_heuristic(inp, "max_throughput", max_cost_usd=1e9)
            assert (same[0], same[1].ranges, same[1].replicas) == (free[0], free[1].ranges, free[1].replicas), combo
            assert H.dp_heuristic(inp, "max_throughput", max_cost_usd=cost)[0] == free[0], combo
            below = H.dp_heuristic(inp, "max_throughput", max_cost_usd=cost * 0.999)
            assert below is None or joint.evaluate(inp, below[1])["cost"] <= cost * 0.999, combo
            checked += 1
    assert checked >= 8, checked


def test_polish_keeps_plans_valid_and_only_improves():
    """`joint.polish` reorders a plan's stages: every layer once, the same GPUs per quota, every
    stage in memory, the objective the model's own, never worse than the plan it started from and
    never below the brute-force optimum; from the stage order reversed (a poor start) it improves
    some plans."""
    checked = improved = 0
    for objective, inst in (("max_throughput", tiny()), ("max_throughput", tiny_regions()), ("min_cost", tiny("min_cost"))):
        for combo, inp in combos_of(inst, objective):
            found = H.dp_heuristic(inp, objective)
            if found is None or inp.P < 2:
                continue
            key = "cost" if objective == "min_cost" else "T"
            truth = brute_force(inp, key, "blocks")
            sol = found[1]
            starts = [found]
            # the same stages in reverse order (blocks mirrored so the ends keep embedding and head)
            counts = joint.solution_blocks(inp, sol)
            rows = list(reversed(sol.replicas))
            sizes = [n + (i == 0) + (i == inp.P - 1) for i, n in enumerate(reversed(counts))]
            if sizes[0] >= 2:
                bounds = [sum(sizes[:i]) for i in range(inp.P + 1)]
                ranges = tuple((bounds[i], bounds[i + 1]) for i in range(inp.P))
                rev = joint.JointSolution(ranges, tuple(rows), float("nan"), float("nan"))
                if all(joint.heuristics._stage_fits(inp, list(rows[i]), i, *ranges[i]) for i in range(inp.P)):
                    starts.append((joint.evaluate(inp, rev)[key], rev))
            for start in starts:
                obj, out = joint.polish(inp, start, objective)
                assert [u for s, e in out.ranges for u in range(s, e)] == list(range(inp.U)), combo
                assert joint.solution_blocks(inp, out) is not None, combo  # stays in the compact form
                used = lambda s: sorted((k, sum(r[k] for r in s.replicas)) for k in range(inp.K))  # noqa: E731
                assert used(out) == used(start[1]), combo
                for i, row in enumerate(out.replicas):
                    assert joint.heuristics._stage_fits(inp, list(row), i, *out.ranges[i]), combo
                assert obj == pytest.approx(joint.evaluate(inp, out)[key], rel=1e-12)
                assert obj <= start[0] * (1 + 1e-12), combo
                assert obj >= truth * (1 - 1e-9), combo
                improved += obj < start[0] * (1 - 1e-9)
                checked += 1
    assert checked >= 10 and improved >= 1, (checked, improved)


@pytest.mark.slow
def test_dp_heuristic_lightens_the_heaviest_stage_at_a_slower_cap():
    """GPT-Neo-2.7B on 128 A100 + 384 V100 (Sailor's profiles), P4 b1 D64: the fastest stages put
    A100 TP1 on the last stage, whose all-reduce (1.00 s) dominates T (7.37 s); lowering its cap a
    step at a time at the same stage-time cap finds no plan. The jump of `_less_sync` (every extra
    within the plan's second largest, at the least stage-time cap that allows it) reaches the
    MILP's optimum (7.07 s: V100 TP2 on the last stage): under a cutoff just below the DP's plan
    the MILP has no plan, and just above it (warm-started from that plan) it has one, so the model
    is not infeasible for another reason (the two solves take 4 s, the optimum alone 9 s)."""
    from conftest import shared_dir
    from hetplan.estimators import build_estimators
    from hetplan.importers.sailor import sailor_instance_dict
    from hetplan.instance import instance_from_dict
    from hetplan.orchestration.planner import Combo, PlannerOptions, joint_inputs, with_sync_table
    from hetplan.orchestration.planner.inputs import _quotas, _Tables
    from hetplan.solvers import SolveOptions, solve

    ref = shared_dir() / "reference" / "sailor"
    if not (ref / "profiles").is_dir():
        pytest.skip(f"Sailor reference data absent ({ref})")
    counts = {("A100-40", "us-central1-a"): 128, ("V100-16", "us-central1-a"): 384}
    inst = instance_from_dict(sailor_instance_dict(ref, "GPT-Neo-2.7", gpu_counts=counts, global_batch_size=2048))
    tables = _Tables(inst, build_estimators(inst))
    opts = PlannerOptions()
    inp = with_sync_table(joint_inputs(inst, tables, _quotas(inst, opts), Combo(4, 1, 64), "max_throughput", None,
                                       None, opts.tp_choices), tables)
    found = H.dp_heuristic(inp, "max_throughput", None, None, joint.bottleneck_lower_bound_s(inp))
    assert found is not None
    below = solve(joint.build(inp, time_cutoff_s=found[0] * (1 - 1e-6)), backend="highs",
                  options=SolveOptions(time_limit_s=120, rel_gap=1e-6))
    assert below.status.value == "infeasible", (found[0], below.status)
    model = joint.build(inp, time_cutoff_s=found[0] * (1 + 1e-3))
    above = solve(model, backend="highs", warm_start=joint.warm_start(model, inp, found[1]),
                  options=SolveOptions(time_limit_s=120, rel_gap=1e-2))
    assert above.status.value in ("optimal", "feasible"), (found[0], above.status)


@pytest.mark.slow
def test_dp_heuristic_keeps_a_pipeline_in_one_region_when_crossing_costs_every_step():
    """GPT-Neo-2.7B on Sailor's 5 zones x 32 A100 (us-central1 a, b, c, f and us-west1-b), P4 b2 D16.
    Sailor's composition pays a stage's own send to another region in every one of the m = 64
    steps (a TP 2 sender: ~0.07 s, against the least cross-region transfer the DP prices), so
    the DP over both regions (a TP 4 first stage over two zones, the last stage in us-west1-b:
    18.0 s) loses to four TP 2 stages in the us-central1 zones, one zone each (hand-built below:
    13.2 s). The heuristic also runs the DP on each region alone and must reach that plan."""
    from conftest import shared_dir
    from hetplan.estimators import build_estimators
    from hetplan.importers.sailor import sailor_instance_dict
    from hetplan.instance import instance_from_dict
    from hetplan.orchestration.planner import Combo, PlannerOptions, joint_inputs, with_sync_table
    from hetplan.orchestration.planner.inputs import _quotas, _Tables

    ref = shared_dir() / "reference" / "sailor"
    if not (ref / "profiles").is_dir():
        pytest.skip(f"Sailor reference data absent ({ref})")
    zones = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b")
    counts = {("A100-40", z): 32 for z in zones}
    inst = instance_from_dict(sailor_instance_dict(ref, "GPT-Neo-2.7", gpu_counts=counts, global_batch_size=2048,
                                                   preset="sailor"))
    tables = _Tables(inst, build_estimators(inst))
    opts = PlannerOptions()
    inp = with_sync_table(joint_inputs(inst, tables, _quotas(inst, opts), Combo(4, 2, 16), "max_throughput", None,
                                       None, opts.tp_choices), tables)
    hand = []
    for z in zones[:4]:
        k = next(k for k, p in enumerate(inp.pools) if p.zone == z and p.tp == 2)
        hand.append(tuple(16 if j == k else 0 for j in range(inp.K)))
    ranges = ((0, 9), (9, 17), (17, 25), (25, inp.U))
    by_hand = joint.evaluate(inp, joint.JointSolution(ranges, tuple(hand), math.nan, math.nan))["T"]
    found = H.dp_heuristic(inp, "max_throughput", None, None, joint.bottleneck_lower_bound_s(inp))
    assert found is not None and found[0] <= by_hand * (1 + 1e-9), (found and found[0], by_hand)
    assert {inp.pools[k].region for row in found[1].replicas for k, n in enumerate(row) if n} == {"us-central1"}
    both = H._dp_heuristic(inp, "max_throughput", None, None, joint.bottleneck_lower_bound_s(inp), 4, 3)
    assert both[0] > 1.2 * found[0]  # the DP over both regions alone is far off
