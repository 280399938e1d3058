"""Per-stage (DP, TP) choice: MILP and the OOM-first greedy (seed 003) against exhaustive search."""
from __future__ import annotations

import random

import pytest

from hetplan.formulations.common import FormulationInputError
from hetplan.formulations.stage_parallelism import (
    StageDevices,
    StageParallelismInputs,
    build,
    decode,
    enumerate_all,
    greedy,
    inputs_from_instance,
    tabulate,
    warm_start,
)
from hetplan.solvers import SolveOptions, Status, solve

EXACT = SolveOptions(rel_gap=0.0, time_limit_s=60, diagnose_infeasible=False)


def random_inputs(seed: int) -> StageParallelismInputs:
    rng = random.Random(seed)
    P, G = rng.randint(1, 3), rng.choice([2, 3, 4])
    stages = []
    for s in range(P):
        nodes = tuple((f"s{s}n{j}", rng.choice(["A", "V"]), rng.choice([1, 2, 4])) for j in range(rng.randint(1, 2)))
        stages.append(StageDevices(nodes, s, s + 1))
    speed = {"A": 2.0, "V": 1.0}
    layers = [rng.randint(1, 4) for _ in range(P)]
    zero = rng.random() < 0.5

    def time_fn(s, t, k, b):  # TP splits the work with a 10 % communication tax per extra rank
        return layers[s] * b / speed[t] / k * (1 + 0.1 * (k - 1))

    def memory_fn(s, t, k, b, d):  # static (ZeRO-sharded over d or not) + activations of P - s in flight
        return layers[s] * (8 / k / (d if zero else 1) + 2 * b * (P - s) / k)

    def sync_fn(s, k, d):
        return 0.05 * layers[s] * (d - 1) / d / k

    caps = {"A": float(rng.choice([16, 24, 32])), "V": float(rng.choice([12, 16, 24]))}
    return tabulate(stages, G, rng.choice([2, 4, 8]), time_fn, memory_fn, caps, sync_fn)


def _feasible_seeds(lo: int, hi: int, want: int) -> list[int]:
    out = [s for s in range(lo, hi) if enumerate_all(random_inputs(s)) is not None]
    return out[:want]


# ---- hand-computed ----------------------------------------------------------------------------
def one_node_stage(mem_per_worker):
    """One stage on one 4-GPU node of type A, G = 4; memory_fn(tp) given; time = b / tp."""
    dev = StageDevices((("n0", "A", 4),), 0, 2)
    return tabulate([dev], 4, 8, lambda s, t, k, b: b / k, lambda s, t, k, b, d: mem_per_worker[k],
                    {"A": 10.0})


def test_oom_first_doubles_tp_until_it_fits_by_hand():
    inputs = one_node_stage({1: 12.0, 2: 11.0, 4: 6.0})  # only TP 4 fits
    g = greedy(inputs)
    assert g.fits_memory
    assert g.stages[0].tp == 4 and g.stages[0].dp == 1  # 4 -> 2 -> 1 replicas
    assert g.steps == 3  # evaluated TP 1, TP 2, TP 4
    best = enumerate_all(inputs)
    assert best.stages[0].tp == 4 and best.iteration_s == pytest.approx(g.iteration_s)
    # 4 sequences on one TP-4 group: tau = 1, iteration = tau + (m - 1) tau = 8
    assert g.iteration_s == pytest.approx(8.0)


def test_one_doubling_suffices_greedy_and_model_agree():
    """TP 1 (12 > 10) does not fit, TP 2 (9) does: OOM-first stops at TP 2 / DP 2 after two
    evaluations, which is also the optimum (TP 4 would be slower per step: 4 / 4 vs 2 / 2)."""
    inputs = one_node_stage({1: 12.0, 2: 9.0, 4: 6.0})
    g, best = greedy(inputs), enumerate_all(inputs)
    assert (g.stages[0].tp, g.stages[0].dp) == (2, 2) and g.steps == 2
    assert g.iteration_s == pytest.approx(best.iteration_s)
    model = build(inputs)
    assert solve(model, backend="highs", options=EXACT).status == Status.OPTIMAL
    assert decode(model).iteration_s == pytest.approx(best.iteration_s)


def test_most_likely_to_oom_stage_is_repaired_first():
    devs = [StageDevices((("n0", "A", 2),), 0, 1), StageDevices((("n1", "A", 2),), 1, 2)]
    mem = {0: {1: 11.0, 2: 5.0}, 1: {1: 15.0, 2: 5.0}}  # stage 1 is more over-full (1.5 vs 1.1)
    inputs = tabulate(devs, 2, 4, lambda s, t, k, b: b / k, lambda s, t, k, b, d: mem[s][k], {"A": 10.0})
    g = greedy(inputs)
    assert [c.tp for c in g.stages] == [2, 2] and g.steps == 4
    assert g.fits_memory


def test_tp_stays_inside_a_node():
    dev = StageDevices((("n0", "A", 2), ("n1", "A", 2)), 0, 1)
    assert dev.tp_options == (1, 2)  # 4 GPUs in all, but no node has 4
    inputs = tabulate([dev], 2, 2, lambda s, t, k, b: b / k, lambda s, t, k, b, d: 20.0 / k, {"A": 10.0})
    # TP 2 fits (10 <= 10), TP 4 would be needed for more headroom but does not exist
    model = build(inputs)
    solve(model, backend="highs", options=EXACT)
    assert decode(model).stages[0].tp == 2
    tight = tabulate([dev], 2, 2, lambda s, t, k, b: b / k, lambda s, t, k, b, d: 30.0 / k, {"A": 10.0})
    assert enumerate_all(tight) is None and not greedy(tight).fits_memory
    model = build(tight)
    assert solve(model, backend="highs", options=EXACT).status == Status.INFEASIBLE


def test_zero_sharding_makes_more_replicas_fit():
    """Memory 16 / d: one replica does not fit (16 > 10), two do (8 <= 10): the model must run
    DP >= 2 even though a single TP-1 replica would be as fast per microbatch step."""
    dev = StageDevices((("n0", "A", 2),), 0, 1)
    inputs = tabulate([dev], 2, 2, lambda s, t, k, b: 1.0 * b / k, lambda s, t, k, b, d: 16.0 / d / k, {"A": 10.0})
    model = build(inputs)
    solve(model, backend="scip", options=EXACT)
    plan = decode(model)
    assert plan.fits_memory and plan.iteration_s == pytest.approx(enumerate_all(inputs).iteration_s)
    assert (plan.stages[0].tp, plan.stages[0].dp) in {(1, 2), (2, 1)}


# ---- against exhaustive search ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", _feasible_seeds(0, 60, 10))
def test_milp_matches_exhaustive(seed):
    inputs = random_inputs(seed)
    best = enumerate_all(inputs)
    for backend in ("highs", "scip"):
        model = build(inputs)
        res = solve(model, backend=backend, options=EXACT)
        assert res.status == Status.OPTIMAL
        plan = decode(model)
        assert plan.fits_memory
        assert plan.iteration_s == pytest.approx(best.iteration_s, rel=1e-6)
        assert res.objective == pytest.approx(best.iteration_s, rel=1e-6)


@pytest.mark.parametrize("seed", range(60, 80))
def test_infeasible_exactly_when_exhaustive_finds_nothing(seed):
    inputs = random_inputs(seed)
    best = enumerate_all(inputs)
    model = build(inputs)
    res = solve(model, backend="highs", options=EXACT)
    assert res.status == (Status.INFEASIBLE if best is None else Status.OPTIMAL)
    g = greedy(inputs)
    if best is not None and g.fits_memory:
        assert g.iteration_s >= best.iteration_s - 1e-9
        model = build(inputs)
        res = solve(model, backend="highs", warm_start=warm_start(model, g), options=EXACT)
        assert res.warm_start_violations == ()
        assert res.warm_start_objective == pytest.approx(g.iteration_s)


# ---- errors and instance wiring ---------------------------------------------------------------------
def test_bad_inputs_name_the_field():
    dev = StageDevices((("n0", "A", 2),), 0, 1)
    with pytest.raises(FormulationInputError) as err:
        StageParallelismInputs((dev,), 2, 1, {}, {}, {"A": 1.0})
    assert err.value.field == "time_s"
    with pytest.raises(FormulationInputError) as err:
        tabulate([dev], 2, 1, lambda *a: 1.0, lambda *a: 1.0, {"B": 1.0})
    assert err.value.field == "capacity_bytes"
    with pytest.raises(FormulationInputError) as err:
        tabulate([dev], 0, 1, lambda *a: 1.0, lambda *a: 1.0, {"A": 1.0})
    assert err.value.field == "global_microbatch"


def test_from_bundled_instance_gives_a_valid_plan():
    from hetplan.estimators.registry import build_estimators
    from hetplan.instance import load_instance
    from hetplan.plan import Plan, validate_plan

    inst = load_instance("a100_v100_one_zone")
    est = build_estimators(inst)
    units = inst.model_arch.num_units
    stages = [StageDevices((("v100-0", "V100-16", 4), ("v100-1", "V100-16", 4)), 0, units // 2),
              StageDevices((("a100-0", "A100-40", 4), ("a100-1", "A100-40", 4)), units // 2, units)]
    inputs = inputs_from_instance(inst, est, stages, global_microbatch=8)
    g = greedy(inputs)
    model = build(inputs)
    res = solve(model, backend="highs", options=SolveOptions(rel_gap=0.0, time_limit_s=60))
    assert res.status == Status.OPTIMAL
    plan_part = decode(model, steps=res.nodes or 0)
    assert plan_part.fits_memory
    assert plan_part.iteration_s <= g.iteration_s + 1e-9
    plan = Plan(num_microbatches=inputs.num_microbatches, stages=plan_part.to_stages(inputs))
    placed = validate_plan(inst, plan)
    assert placed.global_microbatch == 8
    assert all(r.tp <= 4 for s in placed.stages for r in s.replicas)
