"""Device grouping (AutoHet eq. 3): every model against brute force over all set partitions."""
from __future__ import annotations

import itertools
import random

import pytest

from hetplan.formulations.common import FormulationInputError
from hetplan.formulations.device_grouping import (
    DeviceGroupingInputs,
    UnitClass,
    all_classes_add,
    build_counts,
    build_patterns,
    build_per_gpu,
    candidate_patterns,
    decode,
    greedy,
    inputs_from_instance,
    make_grouping,
    warm_start,
)
from hetplan.orchestration.drivers.device_grouping import optimize
from hetplan.solvers import SolveOptions, Status, solve

GIB = 1024**3


# ---- independent truth ------------------------------------------------------------------------
def set_partitions(items):
    """Every partition of a list into non-empty blocks (Bell number many)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def brute_force(inputs: DeviceGroupingInputs) -> float:
    """max over all partitions of the units of (#groups) x min_j S_j K / (K + P_j - 1) (eq. 2-3)."""
    units = [(c.compute, c.memory_bytes) for c in inputs.classes for _ in range(c.count)]
    K, best = inputs.num_microbatches, 0.0
    for part in set_partitions(list(range(len(units)))):
        if any(sum(units[i][1] for i in block) < inputs.min_memory_bytes for block in part):
            continue
        z = min(sum(units[i][0] for i in block) * K / (K + len(block) - 1) for block in part)
        best = max(best, len(part) * z)
    return best


def random_inputs(rng: random.Random, max_units: int = 7) -> DeviceGroupingInputs:
    while True:
        n_classes = rng.randint(1, 3)
        classes = tuple(UnitClass(f"t{c}", rng.randint(0, 3), rng.choice([1.0, 1.5, 2.0, 3.0, 5.0]),
                                  rng.choice([16.0, 24.0, 40.0, 80.0])) for c in range(n_classes))
        n = sum(c.count for c in classes)
        if 1 <= n <= max_units:
            try:
                return DeviceGroupingInputs(classes, rng.choice([30.0, 50.0, 80.0, 120.0]), rng.choice([1, 2, 4, 16]))
            except FormulationInputError:
                continue  # not even one group has enough memory: draw again


def autohet_mix(num_gpus: int, K: int = 16, min_gib: float = 120) -> DeviceGroupingInputs:
    """A100-80 / H800 / H20 in 8-GPU nodes, node types round robin (AutoHet's cluster, sec. V)."""
    spec = [("A100-80", 156.0, 80), ("H800", 445.0, 80), ("H20", 88.8, 96)]
    counts, nodes = [0, 0, 0], [[], [], []]
    for i in range(num_gpus // 8):
        counts[i % 3] += 8
        nodes[i % 3].append((f"node{i}", 8))
    classes = tuple(UnitClass(name, counts[c], g, mem * GIB, 1, tuple(nodes[c]))
                    for c, (name, g, mem) in enumerate(spec) if counts[c])
    return DeviceGroupingInputs(classes, min_gib * GIB, K)


# ---- hand-computed ----------------------------------------------------------------------------
def test_effective_compute_matches_eq2_by_hand():
    inputs = DeviceGroupingInputs((UnitClass("a", 2, 3.0, 40), UnitClass("b", 1, 1.0, 60)), 50, 4)
    # group {a, b}: S = 4, P = 2, rho = 1 / 5 -> G = 4 * 4 / 5 = 3.2
    assert inputs.effective((1, 1)) == pytest.approx(3.2)
    assert inputs.min_group_size == 1  # one b holds 60 >= 50
    assert inputs.max_groups == 2  # memory 140 // 50 = 2 (a alone: 40 < 50)
    # one group {a, a, b}: G = 7 * 4 / 6 = 4.667; {a, b} + {a}: {a} lacks memory (40 < 50);
    # {a, a} + {b}: 2 x min(6 * 4 / 5, 1 * 4 / 4) = 2. So k = 1 wins with 28 / 6.
    assert brute_force(inputs) == pytest.approx(28 / 6)
    sol = optimize(inputs)
    assert sol.proven_optimal and sol.objective == pytest.approx(28 / 6)
    assert sol.grouping.compositions() == [(2, 1)]


def test_autohet_64_gpu_optimum_by_hand():
    """16 x (A100, H800, H20) triples + 8 x (A100, H800) pairs + 1 leftover group (2 A100 ...)."""
    inputs = autohet_mix(64)
    sol = optimize(inputs)
    assert sol.proven_optimal
    # the bottleneck group is an (A100, H800) pair: (156 + 445) * 16 / 17, and there are 25 groups
    assert sol.grouping.num_groups == 25
    assert sol.objective == pytest.approx(25 * 601 * 16 / 17)
    assert sol.total_s < 30  # generous: a regression guard, not a benchmark


# ---- models against brute force ----------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_patterns_driver_matches_brute_force(seed):
    inputs = random_inputs(random.Random(seed))
    truth = brute_force(inputs)
    sol = optimize(inputs, backend="highs")
    assert sol.proven_optimal
    assert sol.objective == pytest.approx(truth, rel=1e-6)
    assert sol.bound == pytest.approx(truth, rel=1e-6)
    g = greedy(inputs)
    assert g is None or g.objective <= truth * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_patterns_driver_on_scip_matches_brute_force(seed):
    inputs = random_inputs(random.Random(seed))
    sol = optimize(inputs, backend="scip")
    assert sol.proven_optimal and sol.objective == pytest.approx(brute_force(inputs), rel=1e-6)


@pytest.mark.parametrize("seed", range(12, 20))
def test_patterns_driver_without_greedy_or_with_probe(seed):
    inputs = random_inputs(random.Random(seed))
    truth = brute_force(inputs)
    assert optimize(inputs, use_greedy=False).objective == pytest.approx(truth, rel=1e-6)
    assert optimize(inputs, probe_step=0.05).objective == pytest.approx(truth, rel=1e-6)


@pytest.mark.parametrize("seed", range(20, 26))
@pytest.mark.parametrize("backend", ["highs", "scip"])
def test_counts_driver_matches_brute_force(seed, backend):
    inputs = random_inputs(random.Random(seed))
    sol = optimize(inputs, backend=backend, variant="counts")
    assert sol.proven_optimal
    assert sol.objective == pytest.approx(brute_force(inputs), rel=1e-5)


@pytest.mark.parametrize("seed", range(30, 34))
def test_per_gpu_minlp_matches_brute_force(seed):
    inputs = random_inputs(random.Random(seed), max_units=5)
    model = build_per_gpu(inputs)
    res = solve(model, backend="scip", options=SolveOptions(time_limit_s=60, rel_gap=0))
    assert res.status == Status.OPTIMAL
    found = decode(model)
    truth = brute_force(inputs)
    assert found.objective == pytest.approx(truth, rel=1e-6)
    assert res.objective * inputs.g_max == pytest.approx(truth, rel=1e-6)


def test_per_gpu_is_refused_by_highs_and_takes_a_warm_start():
    from hetplan.errors import SolverError

    inputs = DeviceGroupingInputs((UnitClass("A", 2, 3.0, 40), UnitClass("B", 3, 1.0, 60),
                                   UnitClass("C", 1, 2.0, 100)), 100, 4)
    model = build_per_gpu(inputs)
    with pytest.raises(SolverError):
        solve(model, backend="highs")
    start = greedy(inputs)
    res = solve(model, backend="scip", warm_start=warm_start(model, start), options=SolveOptions(rel_gap=0))
    assert res.warm_start_violations == ()
    assert res.warm_start_objective == pytest.approx(start.objective / inputs.g_max)
    assert decode(model).objective == pytest.approx(brute_force(inputs))


# HiGHS proves the pattern MILP of 24 GPUs optimal in 20 / 14 / 7 / 4 s at k = 4 / 5 / 6 / 7 (SCIP
# < 1 s each); with 22 GPUs or fewer every k takes < 0.1 s. k = 6, 7 check the same agreement
@pytest.mark.parametrize("k", [6, 7])
def test_per_k_models_agree_and_accept_greedy_start(k):
    """For a fixed k, the counts MILP and the max-min pattern MILP give the same z on HiGHS and
    SCIP, and each accepts the greedy k-grouping as a feasible start."""
    inputs = autohet_mix(24)
    start = greedy(inputs, k)
    values = []
    for build in (lambda: build_counts(inputs, k), lambda: build_patterns(inputs, k)):
        for backend in ("highs", "scip"):
            model = build()
            res = solve(model, backend=backend, warm_start=warm_start(model, start),
                        options=SolveOptions(rel_gap=0, time_limit_s=60))
            assert res.status == Status.OPTIMAL
            assert res.warm_start_violations == ()
            values.append(decode(model).objective)
    assert max(values) == pytest.approx(min(values), rel=1e-6)
    assert start.objective <= values[0] * (1 + 1e-9)


def test_time_limit_returns_a_valid_grouping_and_a_bound():
    inputs = autohet_mix(512)
    sol = optimize(inputs, time_limit_s=1e-3)
    assert sol.grouping is not None  # at least the greedy
    assert sol.bound >= sol.objective
    assert not sol.proven_optimal or sol.bound <= sol.objective * (1 + 1e-6)
    assert any(r.outcome == "not_reached" for r in sol.records) or sol.proven_optimal


def test_counts_and_patterns_agree_on_32_gpus():
    inputs = autohet_mix(32)
    a, b = optimize(inputs), optimize(inputs, variant="counts")
    assert a.proven_optimal and b.proven_optimal
    assert a.objective == pytest.approx(b.objective, rel=1e-6)


# ---- pattern generation -----------------------------------------------------------------------
def _all_patterns(inputs):
    return [p for p in itertools.product(*[range(n + 1) for n in inputs.counts]) if sum(p) > 0]


@pytest.mark.parametrize("seed", range(40, 46))
def test_candidates_contain_every_pattern_of_every_good_grouping(seed):
    """Every group of every k-grouping with min G >= z appears among the candidates for (k, z)."""
    rng = random.Random(seed)
    inputs = random_inputs(rng, max_units=6)
    units = [c for c, cls in enumerate(inputs.classes) for _ in range(cls.count)]
    for part in set_partitions(list(range(len(units)))):
        groups = [tuple(sum(1 for i in b if units[i] == c) for c in range(len(inputs.classes))) for b in part]
        if any(inputs.memory(g) < inputs.min_memory_bytes for g in groups):
            continue
        z = min(inputs.effective(g) for g in groups)
        pats, _ = candidate_patterns(inputs, len(groups), z * (1 - 1e-9))
        cand = {tuple(int(v) for v in p) for p in pats}
        assert set(groups) <= cand


def test_minimal_patterns_are_exactly_the_minimal_feasible_ones():
    inputs = autohet_mix(24)
    z = 450.0
    assert all_classes_add(inputs, z)
    pats, _ = candidate_patterns(inputs, 3, z, minimal=True)
    got = {tuple(int(v) for v in p) for p in pats}

    def ok(p):
        return sum(p) > 0 and inputs.memory(p) >= inputs.min_memory_bytes and inputs.effective(p) >= z

    expected = set()
    for p in _all_patterns(inputs):
        if ok(p) and not any(p[c] and ok(tuple(v - (i == c) for i, v in enumerate(p))) for c in range(3)):
            expected.add(p)
    allowed = {tuple(int(v) for v in p) for p in candidate_patterns(inputs, 3, z)[0]}  # size / slack filters
    assert got == expected & allowed
    assert len(got) > 0


@pytest.mark.parametrize("seed", range(50, 56))
def test_packing_and_exact_cover_threshold_forms_agree(seed):
    rng = random.Random(seed)
    inputs = random_inputs(rng)
    for k in range(1, inputs.max_groups + 1):
        for z in (0.5, 1.0, 2.0, 3.0):
            if not all_classes_add(inputs, z):
                continue
            answers = []
            for form, minimal in (("threshold", False), ("packing", True)):
                pats = candidate_patterns(inputs, k, z, minimal=minimal)
                if len(pats[0]) == 0:
                    answers.append(False)
                    continue
                model = build_patterns(inputs, k, z, patterns=pats, form=form)
                res = solve(model, options=SolveOptions(diagnose_infeasible=False))
                answers.append(res.status.has_solution)
                if res.status.has_solution:
                    assert decode(model).min_effective_compute >= z * (1 - 1e-9)
            assert answers[0] == answers[1], (k, z)


# ---- typed parts, placement, errors -----------------------------------------------------------
def test_grouping_places_every_gpu_once_on_its_nodes():
    inputs = autohet_mix(64)
    grouping = optimize(inputs).grouping
    used: dict[str, int] = {}
    for group, placed in zip(grouping.groups, grouping.placement):
        for c, name in enumerate(grouping.class_names):
            assert sum(n for cls, _, n in placed if cls == name) == group.counts[c]
        for _, node, n in placed:
            used[node] = used.get(node, 0) + n
    assert used == {f"node{i}": 8 for i in range(8)}


def test_make_grouping_rejects_wrong_counts_and_short_memory():
    inputs = DeviceGroupingInputs((UnitClass("a", 2, 3.0, 40), UnitClass("b", 1, 1.0, 60)), 50, 4)
    with pytest.raises(FormulationInputError, match="groups"):
        make_grouping(inputs, [(1, 1)])
    with pytest.raises(FormulationInputError, match=r"groups\[1\]"):
        make_grouping(inputs, [(1, 1), (1, 0)])


@pytest.mark.parametrize("bad, field", [
    (dict(classes=()), "classes"),
    (dict(classes=(UnitClass("a", 2, -1.0, 40),)), "classes[0].compute"),
    (dict(classes=(UnitClass("a", 2, 1.0, 40), UnitClass("a", 1, 1.0, 40))), "classes"),
    (dict(num_microbatches=0), "num_microbatches"),
    (dict(min_memory_bytes=1e9), "min_memory_bytes"),
    (dict(classes=(UnitClass("a", 2, 1.0, 40, 1, (("n0", 1),)),)), "classes[0].nodes"),
])
def test_bad_inputs_name_the_field(bad, field):
    args = dict(classes=(UnitClass("a", 2, 1.0, 40),), min_memory_bytes=50.0, num_microbatches=4) | bad
    with pytest.raises(FormulationInputError) as err:
        DeviceGroupingInputs(**args)
    assert err.value.field == field


def test_k_out_of_range_is_a_clear_error():
    inputs = autohet_mix(24)
    with pytest.raises(FormulationInputError, match="k_max"):
        build_counts(inputs, inputs.max_groups + 1)


def test_inputs_from_bundled_instance():
    from hetplan.estimators.registry import build_estimators
    from hetplan.instance import load_instance

    inst = load_instance("a100_v100_one_zone")
    est = build_estimators(inst)
    inputs = inputs_from_instance(inst, est, tp=1, microbatch=1)
    by_name = {c.name: c for c in inputs.classes}
    assert set(by_name) == {"A100-40", "V100-16"}
    assert by_name["A100-40"].count == 8 and by_name["V100-16"].count == 8
    assert by_name["A100-40"].compute > by_name["V100-16"].compute  # A100 is faster per the estimator
    assert inputs.num_microbatches == inst.workload.global_batch_size
    sol = optimize(inputs)
    assert sol.proven_optimal and sol.grouping is not None
    tp2 = inputs_from_instance(inst, est, tp=2)
    assert {c.count for c in tp2.classes} == {4} and all(c.gpus_per_unit == 2 for c in tp2.classes)
    with pytest.raises(FormulationInputError, match="tp"):
        inputs_from_instance(inst, est, tp=8)
