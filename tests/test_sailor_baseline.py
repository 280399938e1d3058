"""The Sailor baseline (benchmarks/sailor_baseline.py): valid plans, its heuristics as the paper states
them, and never better than exhaustive enumeration of the plans in its own search space."""
import itertools
import sys
from pathlib import Path

import pytest

from hetplan.errors import InfeasibleError, InstanceError
from hetplan.estimators import build_estimators
from hetplan.instance import instance_from_dict
from hetplan.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sailor_baseline as sb  # noqa: E402


def tiny(objective="max_throughput", constraints=None, two_regions=True):
    """2 nodes x 2 A100 (zone r1-a), 2 nodes x 2 V100 (r1-b and r2-a, or both in r1-b), a 4-block model,
    batch 8: region r1 mixes types inside a stage, r2 is a second region for the pipeline."""
    groups = [("a", "A100-40", 2, "r1-a", 3.0), ("v1", "V100-16", 1, "r1-b", 1.0),
              ("v2", "V100-16", 1, "r2-a" if two_regions else "r1-b", 1.0)]
    return instance_from_dict({
        "name": "tiny-sailor",
        "cluster": {"node_groups": [
            {"name": n, "gpu_type": g, "gpus_per_node": 2, "count": c, "zone": z, "price_per_gpu_hour_usd": p}
            for n, g, c, z, p in groups]},
        "workload": {"model": {"arch": {"num_layers": 4, "hidden_size": 1024, "num_heads": 16,
                                        "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_len": 1024}},
                     "global_batch_size": 8, "precision": "fp16", "flash_attention": True},
        "objective": {"kind": objective},
        "constraints": constraints or {},
    })


def memory_tight():
    """GPT-Neo-2.7B on V100-16 nodes: one stage holding the whole model does not fit at TP 1."""
    return instance_from_dict({
        "name": "tight",
        "cluster": {"node_groups": [
            {"name": "v", "gpu_type": "V100-16", "gpus_per_node": 4, "count": 2, "zone": "r1-a",
             "price_per_gpu_hour_usd": 1.0}]},
        "workload": {"model": "GPT-Neo-2.7B", "global_batch_size": 16, "precision": "fp16"},
    })


def search_space(inst, objective, max_cost=None, min_its=None):
    """Every plan the baseline could output: all P, b, every D dividing B / b, the H2 TP table, every
    split of D replicas over the usable types on every stage and every region per stage (a superset of
    the DP's first-fit region choice), packed by the baseline's own node packing, then simulated."""
    est = build_estimators(inst)
    s = sb._Search(inst, est, objective, max_cost, min_its, sb.SailorOptions())
    out = []
    for P in s.stage_depths():
        ranges = s.uniform_ranges(P)
        for b in s.opts.microbatch_sizes:
            if s.B % b:
                continue
            tp = s.stage_tp(P, b, ranges)
            if any(not row for row in tp):
                continue
            sh = sb._Shape(s, P, b, ranges, tp)
            for D in range(1, s.B // b + 1):
                if (s.B // b) % D:
                    continue
                sh.set_D(D)
                per_stage = [[sb.StageChoice(r, tuple((g, tp[i][g], n) for g, n in split))
                              for split in sh.combos[i] for r in s.regions
                              if all((g, r) in s.nodes for g, _ in split)] for i in range(P)]
                for stages in itertools.product(*per_stage):
                    used = {}
                    for st in stages:
                        for g, t, n in st.groups:
                            used[(g, st.region)] = used.get((g, st.region), 0) + t * n
                    if any(v > sb.len_gpus(s, *k) for k, v in used.items()):
                        continue
                    plan = sb.materialize(s, sh, tuple(stages), "brute")
                    assert plan is not None  # the packing never fragments when quotas hold
                    rep = simulate(inst, plan, est)
                    out.append(((P, b, D, tuple(stages)), rep, sb._valid(s, rep)))
    return out


def key_of(res):
    md = res.plan.metadata
    cand = next(c for c in res.candidates if c.plan.model_copy(update={"metadata": md}) == res.plan)
    return (cand.P, cand.b, cand.D, cand.stages)


@pytest.mark.parametrize("objective,constraints", [
    ("max_throughput", None),
    ("min_cost", None),
    ("max_throughput", {"max_cost_per_iteration_usd": None}),  # budget filled in below
    ("min_cost", {"min_throughput_iters_per_s": None}),
])
def test_never_better_than_exhaustive_enumeration_of_its_own_space(objective, constraints):
    inst = tiny(objective)
    space = search_space(inst, objective)
    assert len(space) > 50
    max_cost = min_its = None
    if constraints is not None:
        # a constraint that binds: halfway between the cheapest and the fastest plan of the space
        ok = [rep for _, rep, valid in space if valid]
        cheap = min(rep.cost_per_iteration_usd for rep in ok)
        fast = min(rep.iteration_time_s for rep in ok)
        costly = max(rep.cost_per_iteration_usd for rep in ok)
        slow = max(rep.iteration_time_s for rep in ok)
        if "max_cost_per_iteration_usd" in constraints:
            max_cost = (cheap + costly) / 2
        else:
            min_its = 2 / (fast + slow)
        space = search_space(inst, objective, max_cost, min_its)
    res = sb.sailor_search(inst, objective=objective, max_cost=max_cost, min_iters_per_s=min_its)
    metric = "cost_per_iteration_usd" if objective == "min_cost" else "iteration_time_s"
    truth = min(getattr(rep, metric) for _, rep, valid in space if valid)
    got = getattr(res.report, metric)
    assert got >= truth * (1 - 1e-9)
    # the returned plan is one of the enumerated plans, with the same simulated figures
    scores = {k: getattr(rep, metric) for k, rep, _ in space}
    assert scores[key_of(res)] == pytest.approx(got, rel=1e-12)
    if max_cost is not None:
        assert res.report.cost_per_iteration_usd <= max_cost * (1 + 1e-9)
    if min_its is not None:
        assert res.report.iters_per_s >= min_its * (1 - 1e-9)


def test_plans_are_valid_and_never_oom():
    for inst in (tiny(), tiny(two_regions=False), memory_tight()):
        res = sb.sailor_search(inst)
        assert not res.report.oom_ranks
        units = [u for st in res.plan.stages for u in range(st.layer_start, st.layer_end)]
        assert units == list(range(inst.model_arch.num_units))
        assert res.plan.global_microbatch * res.plan.num_microbatches == inst.workload.global_batch_size
        # Sailor's shape: the same D on every stage, one region per stage (H5), TP inside a node (H1)
        assert len({len(st.replicas) for st in res.plan.stages}) == 1
        for st in res.report.plan.stages:
            regions = {inst.node_by_id[r.node].region for r in st.replicas}
            assert len(regions) == 1
        for cand in res.candidates:  # H2: nothing the search simulated ran out of memory
            assert not cand.report.oom_ranks, (cand.P, cand.b, cand.D)


def test_h2_tp_is_the_minimum_that_fits():
    inst = memory_tight()
    est = build_estimators(inst)
    s = sb._Search(inst, est, "max_throughput", None, None, sb.SailorOptions())
    checked = 0
    for P in s.stage_depths():
        ranges = s.uniform_ranges(P)
        tp = s.stage_tp(P, 1, ranges)
        for i, row in enumerate(tp):
            units = range(*ranges[i])
            for t in (1, 2, 4):
                mem = est.memory.worker_memory("V100-16", units, t, 1, 1, P - i)
                if "V100-16" in row and t < row["V100-16"]:
                    assert mem.oom  # a smaller TP would not fit
                if "V100-16" in row and t == row["V100-16"]:
                    assert not mem.oom
                    checked += 1
            if "V100-16" not in row:
                assert est.memory.worker_memory("V100-16", units, 4, 1, 1, P - i).oom
    assert checked >= 3
    # one stage with the whole 2.7B model cannot fit a 16 GiB GPU at TP 1
    assert s.stage_tp(1, 1, s.uniform_ranges(1))[0].get("V100-16", 99) > 1


def test_uniform_layer_split():
    s = sb._Search(tiny(), build_estimators(tiny()), "max_throughput", None, None, sb.SailorOptions())
    assert s.stage_depths() == [1, 2, 4]
    assert s.uniform_ranges(1) == [(0, 6)]
    assert s.uniform_ranges(2) == [(0, 3), (3, 6)]  # embedding + 2 blocks | 2 blocks + head
    assert s.uniform_ranges(4) == [(0, 2), (2, 3), (3, 4), (4, 6)]


@pytest.mark.parametrize("objective", ["max_throughput", "min_cost"])
def test_d_sweep_stops_at_first_non_improving_degree(objective):
    res = sb.sailor_search(tiny(objective), objective=objective)
    sweeps = {}
    for cand in res.candidates:
        sweeps.setdefault((cand.P, cand.b, cand.regions), []).append(cand)
    assert sweeps
    for group in sweeps.values():
        Ds = [c.D for c in group]
        assert Ds == sorted(Ds, reverse=objective == "max_throughput")  # H3 decreasing, H4 increasing
        valid = [c for c in group if c.valid]
        metric = (lambda c: c.report.cost_per_iteration_usd) if objective == "min_cost" else \
            (lambda c: c.report.iteration_time_s)
        # strictly improving until the last valid one, which may be the first that did not improve
        for a, b in zip(valid[:-2], valid[1:-1]):
            assert metric(b) < metric(a)


def test_impossible_constraints_and_bad_input_give_clear_errors():
    with pytest.raises(InfeasibleError, match="max_cost_per_iteration_usd"):
        sb.sailor_search(tiny(), max_cost=1e-12)
    with pytest.raises(InfeasibleError, match="min_throughput_iters_per_s"):
        sb.sailor_search(tiny("min_cost"), min_iters_per_s=1e9)
    with pytest.raises(InstanceError, match="objective"):
        sb.sailor_search(tiny(), objective="fastest")
    with pytest.raises(InstanceError, match="max_cost"):
        sb.sailor_search(tiny(), max_cost=-1.0)


def test_sailor_plan_returns_plan_and_search_time():
    plan, seconds = sb.sailor_plan(tiny(), None, "max_throughput")
    assert seconds > 0
    assert plan.metadata["planner"] == "sailor-baseline"
    assert not simulate(tiny(), plan).oom_ranks


def test_on_sailor_profiles_when_the_reference_data_is_there():
    """OPT-350M on 32 A100 + 96 V100 with Sailor's measured profiles and bandwidth fits (fig. 8b)."""
    import planner as bench

    ref = bench.reference_dir()
    if ref is None:
        pytest.skip("no ../shared/reference/sailor")
    sc = next(s for s in bench.scenarios(ref) if s.name == "opt350-het-32+96")
    inst, kind = bench.build_instance(sc, ref)
    assert kind == "profile"
    est = build_estimators(inst)
    res = sb.sailor_search(inst, est)
    assert not res.report.oom_ranks and not res.timed_out
    assert res.report.num_gpus <= 128
    # the simulator agrees with itself: re-simulating the returned plan gives the reported figures
    again = simulate(inst, res.plan, est)
    assert again.iteration_time_s == pytest.approx(res.report.iteration_time_s, rel=1e-12)
    # every candidate respected H1 (TP inside a 4-GPU VM) and the quotas
    for cand in res.candidates:
        used = {}
        for st in cand.plan.stages:
            for r in st.replicas:
                assert r.tp in (1, 2, 4)
                used[r.gpu_type] = used.get(r.gpu_type, 0) + r.tp
        assert used.get("A100-40", 0) <= 32 and used.get("V100-16", 0) <= 96
