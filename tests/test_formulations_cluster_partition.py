"""Cluster partitioning (Zorse sec. 4.3.2): MILP and SPLIT against exhaustive min-k-cut."""
from __future__ import annotations

import random

import pytest

from hetplan.formulations.common import FormulationInputError
from hetplan.formulations.cluster_partition import (
    ClusterGraph,
    build,
    decode,
    inputs_from_instance,
    min_k_cut_exhaustive,
    partitions_into,
    split,
    warm_start,
)
from hetplan.orchestration.drivers.cluster_partition import solve_all_k
from hetplan.solvers import SolveOptions, Status, solve


def random_graph(seed: int, zoned: bool) -> ClusterGraph:
    rng = random.Random(seed)
    n = rng.randint(4, 7)
    zone = [rng.randint(0, 2) for _ in range(n)]
    w = {}
    for u in range(n):
        for v in range(u + 1, n):
            if zoned:
                w[(u, v)] = rng.choice([100.0, 50.0]) if zone[u] == zone[v] else rng.choice([1.0, 5.0, 10.0])
            else:
                w[(u, v)] = float(rng.choice([0, 1, 2, 5, 10]))
    return ClusterGraph(tuple(f"v{i}" for i in range(n)), tuple(1 for _ in range(n)), w)


def test_stirling_counts():
    assert sum(1 for _ in partitions_into(5, 2)) == 15
    assert sum(1 for _ in partitions_into(6, 3)) == 90
    assert sum(1 for _ in partitions_into(4, 4)) == 1


def test_two_zones_by_hand():
    # nodes 0,1 in zone a (100 GB/s between them), 2,3 in zone b (80), 5 GB/s across
    w = {(0, 1): 100.0, (2, 3): 80.0, (0, 2): 5.0, (0, 3): 5.0, (1, 2): 5.0, (1, 3): 5.0}
    g = ClusterGraph(("a0", "a1", "b0", "b1"), (8, 8, 8, 8), w)
    res = {r.k: r for r in solve_all_k(g, backend="highs")}
    assert res[2].exact.named(g) == (("a0", "a1"), ("b0", "b1"))
    assert res[2].exact.cut_GBps == pytest.approx(20.0)
    assert res[3].exact.cut_GBps == pytest.approx(100.0)  # then the 80 GB/s pair is split: 20 + 80
    assert res[1].exact.cut_GBps == 0.0 and res[4].exact.cut_GBps == pytest.approx(200.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("zoned", [True, False])
def test_milp_matches_exhaustive_for_every_k(seed, zoned):
    g = random_graph(seed, zoned)
    for r in solve_all_k(g, backend="highs"):
        truth = min_k_cut_exhaustive(g, r.k)
        assert r.status == "optimal"
        assert r.exact.cut_GBps == pytest.approx(truth.cut_GBps)
        assert r.exact.k == r.k
        # SPLIT is a valid k-partition, never better than the optimum, within Saran-Vazirani's 2 - 2/k
        assert r.split.k == r.k
        assert r.split.cut_GBps >= truth.cut_GBps - 1e-9
        assert r.split.cut_GBps <= (2 - 2 / r.k) * truth.cut_GBps + 1e-9


@pytest.mark.parametrize("seed", [2, 5])
def test_scip_and_highs_agree(seed):
    g = random_graph(seed, zoned=False)
    a = solve_all_k(g, backend="highs")
    b = solve_all_k(g, backend="scip")
    assert [r.exact.cut_GBps for r in a] == pytest.approx([r.exact.cut_GBps for r in b])


def test_split_falls_short_on_a_known_graph():
    """A random graph where SPLIT's 3-cut is 33 and the optimum 29 (ratio 1.14 <= 2 - 2/3)."""
    rng = random.Random(263)
    n = rng.randint(4, 7)
    w = {(u, v): float(rng.choice([0, 1, 2, 5, 10])) for u in range(n) for v in range(u + 1, n)}
    g = ClusterGraph(tuple(f"v{i}" for i in range(n)), tuple(1 for _ in range(n)), w)
    sp = split(g)[2]
    exact = solve_all_k(g, k_values=[3])[0]
    assert sp.cut_GBps == pytest.approx(33.0)
    assert exact.exact.cut_GBps == pytest.approx(min_k_cut_exhaustive(g, 3).cut_GBps) == pytest.approx(29.0)
    assert exact.split_ratio == pytest.approx(33 / 29)


def test_split_start_is_accepted():
    g = random_graph(3, zoned=True)
    model = build(g, 3)
    start = split(g)[2]
    res = solve(model, backend="highs", warm_start=warm_start(model, start), options=SolveOptions(rel_gap=0))
    assert res.status == Status.OPTIMAL and res.warm_start_violations == ()
    assert res.warm_start_objective == pytest.approx(start.cut_GBps)
    assert decode(model).cut_GBps == pytest.approx(min_k_cut_exhaustive(g, 3).cut_GBps)


def test_bad_inputs():
    with pytest.raises(FormulationInputError) as err:
        ClusterGraph(("a", "b"), (1, 1), {(1, 0): 3.0})
    assert err.value.field == "bandwidth_GBps"
    with pytest.raises(FormulationInputError, match="k=3"):
        build(ClusterGraph(("a", "b"), (1, 1), {(0, 1): 3.0}), 3)
    with pytest.raises(FormulationInputError) as err:
        ClusterGraph(("a", "b"), (1, 0), {})
    assert err.value.field == "gpus[1]"


def test_graph_from_instance_keeps_nodes_together():
    from hetplan.estimators.registry import build_estimators
    from hetplan.instance import load_instance

    inst = load_instance("a100_v100_one_zone")
    est = build_estimators(inst)
    nodes = inputs_from_instance(inst, est, level="node")
    assert nodes.size == 4
    # every pair of 4-GPU nodes in one zone: 16 GPU pairs x 12.5 GB/s inter-node
    assert all(w == pytest.approx(16 * 12.5) for w in nodes.bandwidth_GBps.values())
    gpus = inputs_from_instance(inst, est, level="gpu")
    assert gpus.size == 16
    assert gpus.weight(0, 1) == pytest.approx(300.0)  # A100-40 NVLink inside node a100-0
    assert gpus.weight(0, 4) == pytest.approx(12.5)  # a100-0 to a100-1: inter-node ethernet
    # min-k-cut is unbalanced by nature: cutting one V100 off (3 x 150 + 12 x 12.5 = 600 GB/s)
    # costs the same as cutting a whole node off (16 x 12.5 x 3 = 600); SPLIT's 2-cut is one of them
    assert split(gpus, 2)[1].cut_GBps == pytest.approx(600.0)
    with pytest.raises(FormulationInputError, match="level"):
        inputs_from_instance(inst, est, level="zone")
