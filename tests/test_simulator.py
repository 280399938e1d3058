"""The simulator against a hand-worked 2-stage heterogeneous example, and invariants on bundled plans."""
import glob
from pathlib import Path

import pytest

from hetplan.estimators import EstimatorSet, LayerTime, build_estimators
from hetplan.estimators.analytic import AnalyticMemory
from hetplan.estimators.cost import CloudCost
from hetplan.estimators.network import AlphaBetaComm
from hetplan.instance import instance_from_dict, load_instance
from hetplan.plan import load_plan, plan_from_dict
from hetplan.simulator import simulate

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3


class PerSampleTime:
    """1 ms per layer unit per sequence on the fast GPU, 2 ms on the slow one; backward twice that."""

    name = "hand"

    def layer_time(self, gpu_type, unit, microbatch, tp, intra_node=None):
        per = 1e-3 if gpu_type == "FAST" else 2e-3
        return LayerTime(fwd_s=per * microbatch, bwd_s=2 * per * microbatch)

    def update_time_s(self, gpu_type, units, tp, dp):
        return 1e-3


def tiny_instance(tied: bool = False):
    return instance_from_dict({
        "name": "hand",
        "cluster": {
            "node_groups": [
                {"name": "fast", "gpu_type": "FAST", "gpus_per_node": 2, "count": 1, "zone": "r-a",
                 "price_per_gpu_hour_usd": 3.6, "intra_node": {"bandwidth_GBps": 100, "latency_s": 1e-5}},
                {"name": "slow", "gpu_type": "SLOW", "gpus_per_node": 1, "count": 1, "zone": "r-a",
                 "price_per_gpu_hour_usd": 1.8},
            ],
            "network": {"inter_node": {"bandwidth_GBps": 1.0, "latency_s": 1e-4}},
            "gpu_overrides": {
                "FAST": {"peak_fp16_tflops": 100, "peak_fp32_tflops": 10, "memory_gib": 1 + 9 / 1024,
                         "memory_bandwidth_GBps": 1000, "default_mfu": 0.5,
                         "intra_node": {"bandwidth_GBps": 100, "latency_s": 1e-5}},
                "SLOW": {"peak_fp16_tflops": 50, "peak_fp32_tflops": 5, "memory_gib": 8,
                         "memory_bandwidth_GBps": 500, "default_mfu": 0.5,
                         "intra_node": {"bandwidth_GBps": 10, "latency_s": 1e-5}},
            },
        },
        "workload": {"model": {"arch": {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 256,
                                        "vocab_size": 1000, "seq_len": 128, "tied_embeddings": tied}},
                     "global_batch_size": 8, "precision": "fp16"},
    })


def hand_plan():
    return plan_from_dict({
        "schedule": "1F1B", "num_microbatches": 2,
        "stages": [
            {"layer_start": 0, "layer_end": 3, "replicas": [
                {"gpu_type": "FAST", "zone": "r-a", "microbatch_share": 3},
                {"gpu_type": "FAST", "zone": "r-a", "microbatch_share": 1}]},
            {"layer_start": 3, "layer_end": 6, "replicas": [
                {"gpu_type": "SLOW", "zone": "r-a", "microbatch_share": 4}]},
        ]})


def hand_estimators(inst):
    return EstimatorSet(time=PerSampleTime(), memory=AnalyticMemory.from_instance(inst, {}),
                        comm=AlphaBetaComm.from_instance(inst, {}), cost=CloudCost.from_instance(inst, {}))


def test_hand_worked_two_stage_heterogeneous():
    inst = tiny_instance()
    rep = simulate(inst, hand_plan(), hand_estimators(inst))
    # stage 0: 3 units; replicas with shares 3 and 1 -> straggler 3 units * 1 ms * 3 = 9 ms, bwd 18 ms
    # stage 1: 3 units * 2 ms * 4 = 24 ms, bwd 48 ms
    assert rep.stages[0].fwd_s == pytest.approx(9e-3) and rep.stages[0].bwd_s == pytest.approx(18e-3)
    assert rep.stages[1].fwd_s == pytest.approx(24e-3) and rep.stages[1].bwd_s == pytest.approx(48e-3)
    # boundary: 2 bytes * 128 tokens * 64 hidden = 16384 bytes/sequence; sequences [0,3) and [3,4)
    # both go to the one V100 replica over the 1 GB/s, 100 us inter-node link, one after the other
    cf = (1e-4 + 3 * 16384 / 1e9) + (1e-4 + 16384 / 1e9)
    cb = 1e-4 + 3 * 16384 / 1e9  # gradients back: the largest piece bounds the parallel sends
    assert rep.stages[0].send_fwd_s == pytest.approx(cf)
    assert rep.stages[0].send_bwd_s == pytest.approx(cb)
    pipeline = (9 + 18 + 24 + 48) * 1e-3 + cf + cb + (2 - 1) * 72e-3
    assert rep.pipeline_s == pytest.approx(pipeline)
    # sync: stage 0's units 0..2 = embedding (1000*64 + 128*64) + 2 blocks (12 h^2 + 13 h) params,
    # fp16 grads, 2 replicas on one node over the 100 GB/s, 10 us NVLink: 2*(1/2)*bytes/bw + 2*lat
    params0 = 1000 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64)
    assert params0 == 172160
    sync0 = params0 * 2 / 100e9 + 2 * 1e-5
    assert rep.stages[0].sync_s == pytest.approx(sync0)
    assert rep.stages[1].sync_s == 0.0
    assert rep.iteration_time_s == pytest.approx(pipeline + sync0 + 1e-3)
    assert rep.samples_per_s == pytest.approx(8 / rep.iteration_time_s)
    # cost: 2 FAST at 3.6 USD/h + 1 SLOW at 1.8 USD/h for one iteration, no egress in one zone
    assert rep.cost_per_iteration_usd == pytest.approx((2 * 3.6 + 1.8) * rep.iteration_time_s / 3600)
    assert rep.egress_cost_usd == 0


def test_hand_worked_memory_per_worker_and_oom():
    inst = tiny_instance()
    rep = simulate(inst, hand_plan(), hand_estimators(inst))
    r0, r1, r2 = rep.ranks
    # rank 0: 172160 params * 16 bytes (fp16 Adam) + 2 in-flight microbatches (1F1B, stage 0 of 2)
    # of activations: embedding 3 * (2 + 1) * s h, each block 3 s h (34 + 5 a s / h) + 1 GiB overhead
    s, h, a = 128, 64, 4
    act = 3 * 3 * s * h + 2 * (3 * s * h * (34 + 5 * a * s / h))
    assert r0.memory.activations_bytes == pytest.approx(2 * act)
    assert r0.memory.total_bytes == pytest.approx(16 * 172160 + 2 * act + GIB)
    assert r0.memory.capacity_bytes == GIB + 9 * 1024**2
    assert r0.oom and not r1.oom  # share 3 needs 1 GiB + 10.2 MiB > 1 GiB + 9 MiB, share 1 fits
    assert r2.memory.activations_bytes > 0 and not r2.oom  # last stage keeps 1 microbatch in flight
    assert [r.rank for r in rep.oom_ranks] == [0]


def test_tied_embeddings_add_a_first_last_allreduce():
    untied, tied = tiny_instance(False), tiny_instance(True)
    a = simulate(untied, hand_plan(), hand_estimators(untied))
    b = simulate(tied, hand_plan(), hand_estimators(tied))
    assert b.sync_s > a.sync_s


def test_gpipe_holds_all_microbatches_and_is_not_faster():
    inst = tiny_instance()
    p1 = hand_plan()
    p2 = p1.model_copy(update={"schedule": "GPipe"})
    r1 = simulate(inst, p1, hand_estimators(inst))
    r2 = simulate(inst, p2, hand_estimators(inst))
    assert [s.in_flight for s in r1.stages] == [2, 1]
    assert [s.in_flight for s in r2.stages] == [2, 2]
    # GPipe: fwd 9+24+cf + 24 ; bwd 18+48+cb + 48
    cf, cb = r2.stages[0].send_fwd_s, r2.stages[0].send_bwd_s
    assert r2.pipeline_s == pytest.approx((9 + 24 + 24 + 18 + 48 + 48) * 1e-3 + cf + cb)


@pytest.mark.parametrize("plan_file", sorted(glob.glob(str(REPO / "instances" / "plans" / "*.json"))))
def test_bundled_plans_simulate_without_oom(plan_file):
    plan = load_plan(plan_file)
    inst = load_instance(REPO / "instances" / f"{plan.instance}.yaml")
    rep = simulate(inst, plan)
    assert not rep.oom_ranks
    assert rep.iteration_time_s > 0 and rep.cost_per_iteration_usd > 0
    # invariants: one rank per GPU, ranks consecutive, every GPU distinct
    assert [r.rank for r in rep.ranks] == list(range(plan.num_gpus))
    gpus = {(st.node, g) for s in rep.plan.stages for st in s.replicas for g in st.gpus}
    assert len(gpus) == plan.num_gpus


def test_geo_plan_pays_egress_for_cross_zone_pipeline():
    inst = load_instance(REPO / "instances" / "geo_2region_egress.yaml")
    rep = simulate(inst, load_plan(REPO / "instances" / "plans" / "geo_2region_egress.json"))
    # stage 0 in us-central1-a, stage 1 in us-central1-b: every microbatch's activation and gradient cross
    per_seq = 2 * 2048 * 1024
    expected_bytes = 2 * 32 * per_seq * 16  # fwd + bwd, global microbatch 32, 16 microbatches
    # the tied embedding's gradient ring over the 8 + 8 replicas crosses the zone boundary twice,
    # each edge carrying 2 (k-1)/k of the V x h fp16 gradient
    expected_bytes += 2 * (2 * 15 / 16 * 50272 * 1024 * 2)
    assert rep.egress_bytes == pytest.approx(expected_bytes)
    assert rep.egress_cost_usd == pytest.approx(expected_bytes / 1e9 * 0.01)


def test_estimators_default_to_analytic(a100_v100):
    est = build_estimators(a100_v100)
    assert est.notes == {"time": "analytic", "memory": "analytic", "comm": "alpha_beta", "cost": "cloud",
                         "iteration": "hetplan"}


def test_timeline_replays_to_the_simulated_pipeline_time():
    from hetplan.simulator.timeline import pipeline_events

    inst = tiny_instance()
    for schedule in ("1F1B", "GPipe"):
        rep = simulate(inst, hand_plan().model_copy(update={"schedule": schedule}), hand_estimators(inst))
        events = pipeline_events(rep)
        work = [e for e in events if e.kind in ("F", "B")]
        assert len(work) == 2 * 2 * 2  # stages x microbatches x (F, B)
        # with two stages the event replay and the closed-form pipeline time agree exactly
        assert max(e.end_s for e in work) == pytest.approx(rep.pipeline_s)
        for s in (0, 1):  # a stage never runs two things at once
            mine = sorted((e for e in work if e.stage == s), key=lambda e: e.start_s)
            assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))
