"""LaunchSpec: rank table, groups, transfers and invariants, checked against hand-computed values
for the bundled heterogeneous plan and by exhaustive sample enumeration on random splits."""
from __future__ import annotations

import random

import pytest

from hetplan.errors import PlanError
from hetplan.instance import instance_from_dict, load_instance
from hetplan.plan import load_plan, plan_from_dict, redistribution, sample_ranges
from hetplan.runtime.compile import compile_plan
from hetplan.runtime.execute import _parser, identify
from hetplan.runtime.spec import LaunchSpec, build_spec, check_spec, load_spec


@pytest.fixture(scope="module")
def bundled():
    return load_instance("a100_v100_one_zone"), load_plan("a100_v100_one_zone")


@pytest.fixture(scope="module")
def spec(bundled) -> LaunchSpec:
    return build_spec(*bundled)


def test_rank_table_of_bundled_plan(spec):
    # Placement by hand: stage 0 takes A100s a100-0:0,1; stage 1's V100 TP=2 replica v100-0:0,1 and
    # its A100 replica a100-0:2. Nodes ordered by first worker (a100-0 hosts worker 0), ranks node
    # by node, so worker 4 (stage 1 replica 1) becomes rank 2.
    rows = [(r.rank, r.worker, r.node, r.local_rank, r.gpu_index, r.gpu_type, r.stage, r.replica, r.tp_rank,
             r.tp_size, r.layer_start, r.layer_end, r.microbatch_share, r.sample_start) for r in spec.ranks]
    assert rows == [
        (0, 0, "a100-0", 0, 0, "A100-40", 0, 0, 0, 1, 0, 16, 4, 0),
        (1, 1, "a100-0", 1, 1, "A100-40", 0, 1, 0, 1, 0, 16, 4, 4),
        (2, 4, "a100-0", 2, 2, "A100-40", 1, 1, 0, 1, 16, 26, 5, 3),
        (3, 2, "v100-0", 0, 0, "V100-16", 1, 0, 0, 2, 16, 26, 3, 0),
        (4, 3, "v100-0", 1, 1, "V100-16", 1, 0, 1, 2, 16, 26, 3, 0),
    ]
    assert [(n.node, n.node_rank, n.gpus, n.ranks) for n in spec.nodes] == [
        ("a100-0", 0, (0, 1, 2), (0, 1, 2)), ("v100-0", 1, (0, 1), (3, 4))]
    assert {r.dp_group for r in spec.ranks} == {"stage0", "stage1"}
    assert spec.world_size == 5 and spec.rendezvous.nnodes == 2 and spec.rendezvous.master_addr == "a100-0"
    assert (spec.batch.global_batch_size, spec.batch.global_microbatch, spec.batch.accumulation_steps) == (64, 8, 8)
    assert (spec.schedule.name, spec.schedule.num_microbatches) == ("1F1B", 8)


def test_transfers_and_groups_of_bundled_plan(spec):
    # shares [4, 4] -> [3, 5]: samples 0-2 go 0->0, sample 3 goes 0->1, samples 4-7 go 1->1.
    moves = [(t.src_replica, t.dst_replica, t.src_rank, t.dst_rank, t.sequences, t.src_offset, t.dst_offset)
             for t in spec.transfers]
    assert moves == [(0, 0, 0, 3, 3, 0, 0), (0, 1, 0, 2, 1, 3, 0), (1, 1, 1, 2, 4, 0, 1)]
    groups = {g.name: (g.kind, g.ranks) for g in spec.process_groups}
    assert groups == {
        "tp.s1.r0": ("tp", (3, 4)),
        "grad.s0.tp0": ("grad", (0, 1)),          # both stage-0 replicas TP=1: sharded mode
        "grad.s1.leaders": ("grad", (3, 2)),      # TP 2 and TP 1 in stage 1: gather mode
        "grad.tied.leaders": ("grad", (0, 1, 3, 2)),  # OPT ties embedding and head across stages
        "p2p.s0.fwd": ("p2p", (0, 1, 2, 3)),
        "p2p.s0.bwd": ("p2p", (0, 1, 2, 3)),
    }
    by_unit = {e.units: (e.mode, e.groups, e.exclude) for e in spec.grad_sync}
    assert by_unit[(0,)] == ("sharded", ("grad.s0.tp0",), ("0/wte",))
    assert by_unit[(15,)] == ("sharded", ("grad.s0.tp0",), ())
    assert by_unit[(16,)] == ("gather", ("grad.s1.leaders",), ())
    assert by_unit[(0, 25)] == ("gather", ("grad.tied.leaders",), ())
    assert len(spec.grad_sync) == 26 + 1  # every unit (all stages have 2 replicas) + tied embedding


def _big_instance():
    return instance_from_dict({"name": "big", "cluster": {"node_groups": [
        {"name": "g", "gpu_type": "A100-40", "gpus_per_node": 8, "count": 16, "zone": "z", "price_per_gpu_hour_usd": 1}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 6}}, "global_batch_size": 0 + 1}})


def _random_case(rng: random.Random):
    g = rng.randint(1, 12)
    num_stages = rng.randint(1, 4)
    cuts = sorted(rng.sample(range(1, 8), num_stages - 1))
    bounds = [0, *cuts, 8]
    stages = []
    for s in range(num_stages):
        k = rng.randint(1, min(g, 4))
        split = sorted(rng.sample(range(1, g), k - 1)) if k > 1 else []
        shares = [b - a for a, b in zip([0, *split], [*split, g])]
        stages.append({"layer_start": bounds[s], "layer_end": bounds[s + 1], "replicas": [
            {"gpu_type": "A100-40", "tp": rng.choice([1, 2]), "zone": "z", "microbatch_share": x} for x in shares]})
    m = rng.randint(1, 3)
    data = _big_instance().model_dump(exclude={"base_dir"})
    data["workload"]["global_batch_size"] = g * m
    return instance_from_dict(data), plan_from_dict({"num_microbatches": m, "stages": stages})


def test_transfers_move_every_sample_once_exhaustive():
    """Enumerate samples: each sequence of a global microbatch leaves the replica whose range holds
    it and lands, at the right offset, in the next stage's replica whose range holds it."""
    rng = random.Random(7)
    for _ in range(60):
        instance, plan = _random_case(rng)
        spec = build_spec(instance, plan)
        g = spec.batch.global_microbatch
        for s in range(len(plan.stages) - 1):
            src, dst = sample_ranges(plan.shares(s)), sample_ranges(plan.shares(s + 1))
            owner_src = {k: i for i, (a, b) in enumerate(src) for k in range(a, b)}
            owner_dst = {k: j for j, (a, b) in enumerate(dst) for k in range(a, b)}
            seen = []
            for t in (t for t in spec.transfers if t.src_stage == s):
                for k in range(t.sequences):
                    sample = src[t.src_replica][0] + t.src_offset + k
                    assert owner_src[sample] == t.src_replica and owner_dst[sample] == t.dst_replica
                    assert dst[t.dst_replica][0] + t.dst_offset + k == sample
                    seen.append(sample)
            assert sorted(seen) == list(range(g))
            counts = sorted((t.src_replica, t.dst_replica, t.sequences) for t in spec.transfers if t.src_stage == s)
            assert counts == sorted(redistribution(plan.shares(s), plan.shares(s + 1)))
        # every replica's TP ranks share a node and consecutive local GPUs were claimed once
        assert len({(r.node, r.gpu_index) for r in spec.ranks}) == spec.world_size


def test_single_stage_plan_has_no_transfers_and_no_tied_entry():
    instance = instance_from_dict({"name": "one", "cluster": {"node_groups": [
        {"name": "g", "gpu_type": "A100-40", "gpus_per_node": 4, "count": 1, "zone": "z", "price_per_gpu_hour_usd": 1}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 2}}, "global_batch_size": 4}})
    plan = plan_from_dict({"num_microbatches": 1, "stages": [{"layer_start": 0, "layer_end": 4, "replicas": [
        {"gpu_type": "A100-40", "tp": 2, "zone": "z", "microbatch_share": 1},
        {"gpu_type": "A100-40", "tp": 2, "zone": "z", "microbatch_share": 3}]}]})
    spec = build_spec(instance, plan)
    assert spec.transfers == () and not [g for g in spec.process_groups if g.kind == "p2p"]
    assert [e.units for e in spec.grad_sync] == [(0,), (1,), (2,), (3,)]
    assert all(e.exclude == () and e.mode == "sharded" for e in spec.grad_sync)
    assert spec.grad_sync[0].groups == ("grad.s0.tp0", "grad.s0.tp1")
    assert spec.group("grad.s0.tp1").ranks == (1, 3)


# ---- invariant violations ---------------------------------------------------------------------
def _with_ranks(spec: LaunchSpec, rank: int, **update) -> LaunchSpec:
    rows = tuple(r.model_copy(update=update) if r.rank == rank else r for r in spec.ranks)
    return spec.model_copy(update={"ranks": rows})


def _tp_rank_moved_to_other_node(spec: LaunchSpec) -> LaunchSpec:
    """Rank 4 (V100 replica, TP rank 1) moved to a100-0:3, node listings kept consistent."""
    moved = _with_ranks(spec, 4, node="a100-0", node_rank=0, local_rank=3, gpu_index=3)
    nodes = (spec.nodes[0].model_copy(update={"gpus": (0, 1, 2, 3), "ranks": (0, 1, 2, 4)}),
             spec.nodes[1].model_copy(update={"gpus": (0,), "ranks": (3,)}))
    return moved.model_copy(update={"nodes": nodes})


def test_spec_invariants_hold_for_the_bundled_plan(spec):
    check_spec(spec)


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.model_copy(update={"world_size": 6}), "world_size 6 but the rank table has 5 rows"),
    (lambda s: s.model_copy(update={"ranks": s.ranks[:-1], "world_size": 4}), "node v100-0 lists ranks"),
    (lambda s: _with_ranks(s, 2, layer_start=15), "disagree on its layer range"),
    (lambda s: s.model_copy(update={"ranks": tuple(r.model_copy(update={"layer_start": 15}) if r.stage == 1 else r
                                                   for r in s.ranks)}), "every layer unit must be on exactly one stage"),
    (lambda s: s.model_copy(update={"model": s.model.model_copy(update={"num_layers": 30})}),
     "stages cover layer units \\[0, 26\\) but the model has 32"),
    (lambda s: s.model_copy(update={"batch": s.batch.model_copy(update={"global_batch_size": 60})}),
     "x accumulation 8 = 64 != global batch 60"),
    (lambda s: _with_ranks(_with_ranks(s, 2, microbatch_share=6), 2, microbatch_share=6),
     "microbatch shares of stage 1 sum to 9"),
    (lambda s: _tp_rank_moved_to_other_node(s), "TP group of stage 1 replica 0 spans nodes"),
    (lambda s: _with_ranks(s, 3, gpu_index=1), "used by two ranks"),
    (lambda s: s.model_copy(update={"transfers": s.transfers[:-1]}), "exactly once"),
])
def test_spec_invariant_violations_are_named(spec, mutate, message):
    with pytest.raises(PlanError, match=message):
        check_spec(mutate(spec))


def test_load_spec_checks_the_file(spec, tmp_path):
    good = spec.save(tmp_path / "spec.json")
    assert load_spec(good) == spec
    bad = tmp_path / "bad.json"
    bad.write_text(spec.to_json().replace('"world_size": 5', '"world_size": "five"'))
    with pytest.raises(PlanError, match="world_size"):
        load_spec(bad)
    broken = tmp_path / "broken.json"
    broken.write_text(spec.model_copy(update={"world_size": 4}).to_json())
    with pytest.raises(PlanError, match="world_size 4 but the rank table has 5 rows"):
        load_spec(broken)
    with pytest.raises(PlanError, match="not found"):
        load_spec(tmp_path / "missing.json")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["stages"][1].update(layer_start=15), "overlaps the previous stage"),
    (lambda d: d["stages"][1].update(layer_end=25), "stages cover layer units \\[0, 25\\)"),
    (lambda d: d["stages"][1]["replicas"][1].update(microbatch_share=4), "microbatch shares sum to 7"),
    (lambda d: d.update(num_microbatches=4), "!= global_batch_size 64"),
    (lambda d: d["stages"][1]["replicas"][0].update(tp=8),
     "tp=8 exceeds the 4 GPUs of every V100-16 node in .*: TP stays inside a node"),
    (lambda d: d["stages"][1]["replicas"][0].update(node="v100-0", tp=5), "TP stays inside a node"),
])
def test_plan_violations_are_refused_by_compile(bundled, edit, message):
    instance, plan = bundled
    data = plan.model_dump(mode="json")
    edit(data)
    with pytest.raises(PlanError, match=message):
        compile_plan(instance, plan_from_dict(data), "torchrun")


def test_hosts_and_rendezvous(bundled):
    instance, plan = bundled
    spec = build_spec(instance, plan, hosts={"a100-0": "gpu-a.example", "v100-0": "gpu-v.example"},
                      rendezvous="c10d", master_port=29600, rdzv_id="job7")
    assert [n.hostname for n in spec.nodes] == ["gpu-a.example", "gpu-v.example"]
    assert spec.rendezvous.rdzv_endpoint == "gpu-a.example:29600" and spec.rendezvous.rdzv_id == "job7"
    with pytest.raises(PlanError, match="hosts given for nodes the plan does not use: \\['a100-1'\\]"):
        build_spec(instance, plan, hosts={"a100-1": "x"})


# ---- process identity -------------------------------------------------------------------------
def test_identify_maps_node_and_local_rank(spec, monkeypatch):
    for var in ("HETPLAN_SPEC_RANK", "HETPLAN_NODE_ID", "GROUP_RANK", "LOCAL_RANK", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HETPLAN_NODE_ID", "v100-0")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert identify(spec) == 4
    monkeypatch.delenv("HETPLAN_NODE_ID")
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert identify(spec) == 2
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(PlanError, match="--nproc-per-node must be 3"):
        identify(spec)
    monkeypatch.setenv("HETPLAN_NODE_ID", "a100-1")
    with pytest.raises(PlanError, match="node 'a100-1' is not in this launch"):
        identify(spec)
    monkeypatch.setenv("HETPLAN_SPEC_RANK", "3")
    assert identify(spec) == 3


def test_executor_options_are_not_swallowed_by_torchrun():
    """torchrun's argparse matches abbreviations even after the script name: an executor flag that
    is a prefix of a torchrun flag (e.g. --log vs --log-dir) would break `torchrun -m ... --flag`."""
    from torch.distributed.run import get_args_parser

    theirs = [o for a in get_args_parser()._actions for o in a.option_strings if o not in ("-h", "--help")]
    ours = [o for a in _parser()._actions for o in a.option_strings if o not in ("-h", "--help")]
    assert ours and theirs
    assert not [(o, t) for o in ours for t in theirs if t.startswith(o)]


def test_a_plan_that_overshoots_the_batch_is_refused_by_its_rounding():
    """batch_rounding ceil (Sailor's rule): 3 microbatches of 5 for a batch of 12. `simulate` names
    batch_rounding; `compile` and `launch` named the spec's internal field ("batch.global_batch_size:
    sum of microbatch shares 5 x accumulation 3 = 15 != global batch 12", helper-11)."""
    inst = instance_from_dict({
        "name": "ceil", "cluster": {"node_groups": [{"name": "a", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 1,
                                                     "zone": "z-a", "price_per_gpu_hour_usd": 1.0}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 3}}, "global_batch_size": 12,
                     "precision": "fp16"}})
    plan = plan_from_dict({"num_microbatches": 3, "micro_batch_size": 5, "batch_rounding": "ceil", "stages": [
        {"layer_start": 0, "layer_end": 5, "replicas": [{"gpu_type": "A100-40", "zone": "z-a"}]}]})
    with pytest.raises(PlanError, match=r"overshoots the global batch: 3 x 5 = 15 sequences for 12") as err:
        build_spec(inst, plan)
    assert err.value.field == "batch_rounding"
