"""Layer partitioning (AutoHet eq. 4, Sailor T_iter, Zorse uneven shares) against exhaustive search."""
from __future__ import annotations

import random

import pytest

from hetplan.formulations.common import FormulationInputError
from hetplan.formulations.layer_partition import (
    GIB,
    LayerPartitionInputs,
    ReplicaChoice,
    ReplicaCosts,
    build,
    decode,
    enumerate_all,
    evaluate,
    greedy,
    inputs_from_instance,
    warm_start,
)
from hetplan.solvers import SolveOptions, Status, solve

EXACT = SolveOptions(rel_gap=0.0, time_limit_s=60)


def replica(times, static, acts, cap, gpu="A", fixed=None):
    """times/acts: share -> per-unit list (a list means: share 1 only)."""
    times = times if isinstance(times, dict) else {1: times}
    acts = acts if isinstance(acts, dict) else {1: acts}
    return ReplicaCosts(gpu, 1, cap, tuple(static), {b: tuple(v) for b, v in times.items()},
                        {b: tuple(v) for b, v in acts.items()}, fixed)


def random_inputs(seed: int) -> LayerPartitionInputs:
    rng = random.Random(seed)
    U, P, G = rng.randint(4, 6), rng.randint(2, 3), rng.choice([2, 3])
    stages = []
    for _ in range(P):
        reps = []
        for r in range(rng.randint(1, 2)):
            speed = rng.choice([1.0, 2.0, 3.0])
            shares = range(1, G - 1 + 2) if True else None
            times = {b: [round(b * rng.uniform(0.5, 1.5) / speed, 3) for _ in range(U)] for b in shares}
            acts = {b: [b * rng.choice([1, 2]) * GIB for _ in range(U)] for b in shares}
            static = [rng.choice([1, 2, 3]) * GIB for _ in range(U)]
            reps.append(replica(times, static, acts, rng.choice([14, 20, 40]) * GIB, f"t{speed}"))
        stages.append(tuple(reps))
    # stages with one replica must take the whole global microbatch
    stages = [reps if len(reps) > 1 else (replica(
        {G: list(reps[0].time_s[min(G, max(reps[0].time_s))])},
        list(reps[0].static_bytes), {G: list(reps[0].activation_bytes[min(G, max(reps[0].time_s))])},
        reps[0].capacity_bytes, reps[0].gpu_type, G),) for reps in stages]
    return LayerPartitionInputs(U, tuple(stages), G, rng.choice([1, 2, 4, 8]),
                                tuple(rng.uniform(0, 0.5) for _ in range(P - 1)),
                                tuple(rng.uniform(0, 0.2) for _ in range(P)),
                                tuple(tuple(rng.uniform(0, 0.1) for _ in range(U)) for _ in range(P)),
                                rng.choice(["1F1B", "GPipe"]), rng.choice(["iteration", "bottleneck"]))


# ---- hand-computed ----------------------------------------------------------------------------
def test_two_identical_stages_split_evenly_by_hand():
    t = [1.0, 2.0, 2.0, 2.0, 2.0, 1.0]  # embedding and head cheaper than blocks
    rep = replica(t, [0] * 6, [0] * 6, 1.0)
    inputs = LayerPartitionInputs(6, ((rep,), (rep,)), 1, 4, objective="bottleneck")
    model = build(inputs)
    assert solve(model, backend="highs", options=EXACT).status == Status.OPTIMAL
    part = decode(model)
    assert part.boundaries == (3,)  # 1 + 2 + 2 = 5 each side
    assert part.bottleneck_s == pytest.approx(5.0)
    # iteration = sum tau + (m - 1) theta = 10 + 3 * 5
    assert part.iteration_s == pytest.approx(25.0)


def test_stage_dependent_activation_memory_moves_layers_off_stage_0():
    """1F1B keeps min(P - i, m) = 2 microbatches on stage 0 and 1 on stage 1. With 1 GiB per unit
    per microbatch and 5 GiB capacity, stage 0 can hold 2 units (4 GiB) and stage 1 five."""
    U = 6
    rep = replica([1.0] * U, [0] * U, [GIB] * U, 5 * GIB)
    inputs = LayerPartitionInputs(U, ((rep,), (rep,)), 1, 8, objective="bottleneck")
    assert inputs.in_flight(0) == 2 and inputs.in_flight(1) == 1
    best, count = enumerate_all(inputs)
    assert count == 5
    assert best.boundaries == (2,)  # the balanced 3 | 3 would need 6 GiB on stage 0
    for backend in ("highs", "scip"):
        model = build(inputs)
        solve(model, backend=backend, options=EXACT)
        assert decode(model).boundaries == (2,)
    gpipe = LayerPartitionInputs(U, ((rep,), (rep,)), 1, 8, schedule="GPipe", objective="bottleneck")
    assert enumerate_all(gpipe)[0] is None  # 8 in flight: no unit fits anywhere
    model = build(gpipe)
    assert solve(model, backend="highs", options=SolveOptions(diagnose_infeasible=False)).status == Status.INFEASIBLE


def test_zorse_uneven_shares_chosen_by_the_model():
    """A stage with a fast (3x) and a slow replica splits G = 4 sequences 3 : 1."""
    U, G = 4, 4
    fast = replica({b: [b / 3.0] * U for b in range(1, 4)}, [0] * U, {b: [0] * U for b in range(1, 4)}, 1.0, "fast")
    slow = replica({b: [b * 1.0] * U for b in range(1, 4)}, [0] * U, {b: [0] * U for b in range(1, 4)}, 1.0, "slow")
    alone = replica({G: [1.0] * U}, [0] * U, {G: [0] * U}, 1.0, "big", fixed=G)
    inputs = LayerPartitionInputs(U, ((fast, slow), (alone,)), G, 2, objective="bottleneck")
    best, _ = enumerate_all(inputs)
    model = build(inputs)
    solve(model, backend="highs", options=EXACT)
    part = decode(model)
    assert part.stages[0].shares == (3, 1)
    assert part.bottleneck_s == pytest.approx(best.bottleneck_s)
    assert sum(part.stages[0].shares) == G


def test_embedding_and_head_costs_shift_the_boundary():
    heavy_ends = [4.0, 1.0, 1.0, 1.0, 1.0, 4.0]
    rep = replica(heavy_ends, [0] * 6, [0] * 6, 1.0)
    inputs = LayerPartitionInputs(6, ((rep,), (rep,), (rep,)), 1, 16, objective="bottleneck")
    best, _ = enumerate_all(inputs)
    model = build(inputs)
    solve(model, backend="scip", options=EXACT)
    part = decode(model)
    assert part.bottleneck_s == pytest.approx(best.bottleneck_s) == pytest.approx(4.0)
    assert part.stages[0].layer_end == 1 and part.stages[2].layer_start == 5  # ends alone


# ---- against exhaustive search ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(16))
def test_milp_matches_exhaustive(seed):
    inputs = random_inputs(seed)
    best, _ = enumerate_all(inputs)
    for backend in ("highs", "scip"):
        model = build(inputs)
        res = solve(model, backend=backend, options=SolveOptions(rel_gap=0.0, diagnose_infeasible=False))
        if best is None:
            assert res.status == Status.INFEASIBLE
            continue
        assert res.status == Status.OPTIMAL
        part = decode(model)
        assert part.fits_memory
        assert part.objective(inputs.objective) == pytest.approx(best.objective(inputs.objective), rel=1e-6)
        assert res.objective == pytest.approx(best.objective(inputs.objective), rel=1e-6)


@pytest.mark.parametrize("seed", range(16, 24))
def test_greedy_is_a_valid_start_and_never_beats_the_optimum(seed):
    inputs = random_inputs(seed)
    g = greedy(inputs)
    assert sum(s.layer_end - s.layer_start for s in g.stages) == inputs.num_units
    best, _ = enumerate_all(inputs)
    if best is not None and g.fits_memory:
        assert g.objective(inputs.objective) >= best.objective(inputs.objective) - 1e-9
        model = build(inputs)
        res = solve(model, backend="highs", warm_start=warm_start(model, g), options=EXACT)
        assert res.warm_start_violations == ()
        assert res.warm_start_objective == pytest.approx(g.objective(inputs.objective), rel=1e-6)


# ---- errors and instance wiring -------------------------------------------------------------------
def test_bad_inputs_name_the_field():
    rep = replica([1.0] * 4, [0] * 4, [0] * 4, 1.0)
    with pytest.raises(FormulationInputError) as err:
        LayerPartitionInputs(4, ((rep,),) * 5, 1, 1)
    assert err.value.field == "stages"
    with pytest.raises(FormulationInputError) as err:
        LayerPartitionInputs(4, ((rep,),), 3, 1)  # one replica with share 1 cannot make 3
    assert err.value.field == "stages[0]"
    bad = replica([1.0] * 3, [0] * 4, [0] * 4, 1.0)
    with pytest.raises(FormulationInputError) as err:
        LayerPartitionInputs(4, ((bad,),), 1, 1)
    assert err.value.field == "stages[0][0].time_s[1]"
    with pytest.raises(FormulationInputError) as err:
        LayerPartitionInputs(4, ((rep,), (rep,)), 1, 1, p2p_s=(1.0, 2.0))
    assert err.value.field == "p2p_s"
    with pytest.raises(FormulationInputError, match="boundaries"):
        evaluate(LayerPartitionInputs(4, ((rep,), (rep,)), 1, 1), (0,), [[1], [1]])


def test_from_bundled_instance_gives_a_valid_plan():
    from hetplan.estimators.registry import build_estimators
    from hetplan.instance import load_instance
    from hetplan.plan import Plan, validate_plan

    inst = load_instance("a100_v100_one_zone")
    est = build_estimators(inst)
    # stage 0: one V100 and one A100 replica sharing G = 4 (Zorse); stage 1: two A100 replicas
    stages = [[ReplicaChoice("V100-16", 1, "us-central1-a"), ReplicaChoice("A100-40", 1, "us-central1-a")],
              [ReplicaChoice("A100-40", 1, "us-central1-a"), ReplicaChoice("A100-40", 1, "us-central1-a")]]
    inputs = inputs_from_instance(inst, est, stages, global_microbatch=4)
    assert inputs.num_units == inst.model_arch.num_units
    assert inputs.num_microbatches == 16
    model = build(inputs)
    res = solve(model, backend="highs", options=EXACT)
    assert res.status == Status.OPTIMAL
    part = decode(model)
    a100_share = part.stages[0].shares[1]
    assert a100_share >= part.stages[0].shares[0]  # the faster GPU takes at least as much
    g = greedy(inputs)
    assert part.iteration_s <= g.iteration_s + 1e-9
    plan = Plan(num_microbatches=inputs.num_microbatches, stages=part.to_stages(inputs))
    placed = validate_plan(inst, plan)
    assert placed.num_gpus == 4
