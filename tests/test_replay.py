"""Trace replay: timelines recomputed by hand from the simulator and the migration estimate, the
bundled trace under all strategies (invariants), and the `replay` command."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hetplan.cluster_state import ClusterState, NodeFailure, NodeRecovery
from hetplan.errors import InstanceError
from hetplan.instance import AvailabilityEvent, BandwidthEvent, instance_from_dict, load_instance
from hetplan.plan import load_plan, plan_from_dict, validate_plan
from hetplan.orchestration.replan import ReplanOptions, replan
from hetplan.orchestration.replay import ReplayOptions, replay
from hetplan.runtime.migrate import migration_plan
from hetplan.simulator import simulate

REPO = Path(__file__).resolve().parents[1]
PRICE = 3.0  # USD per A100 GPU-hour in the tiny instance


def tiny():
    return instance_from_dict({
        "name": "tiny_replay",
        "cluster": {"node_groups": [{"name": "a", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 2,
                                     "zone": "z1-a", "price_per_gpu_hour_usd": PRICE}]},
        "workload": {"model": {"arch": {"num_layers": 4, "hidden_size": 512, "num_heads": 8, "ffn_hidden_size": 2048,
                                        "vocab_size": 8192, "seq_len": 512}},
                     "global_batch_size": 64, "precision": "fp16", "flash_attention": True}})


def four_replicas():
    reps = [{"gpu_type": "A100-40", "tp": 1, "node": n, "gpus": [g], "microbatch_share": 16}
            for n in ("a-0", "a-1") for g in (0, 1)]
    return plan_from_dict({"name": "dp4", "num_microbatches": 1, "stages": [{"layer_start": 0, "layer_end": 6,
                                                                           "replicas": reps}]})


def usd_per_h(report) -> float:
    return 3600 * report.cost_per_iteration_usd / report.iteration_time_s


def check_tiling(strategy, start: float, horizon: float) -> None:
    segs = strategy.segments
    assert segs[0].start_s == start and segs[-1].end_s == pytest.approx(horizon)
    for a, b in zip(segs, segs[1:]):
        assert a.end_s == pytest.approx(b.start_s)
    assert strategy.total_samples == pytest.approx(
        sum((s.end_s - s.start_s) * s.samples_per_s for s in segs) - strategy.lost_samples)


def test_static_plan_stops_waits_and_resumes_by_hand():
    """Static DP=4 plan; a-1 fails at t=100 (no notice) and is back at t=300; horizon 500,
    checkpoints every 60 s, restart 10 s.
      train [0,100) at the plan's rate; the failure loses the 100 mod 60 = 40 s since the checkpoint;
      wait [100,300) paying a-0's 2 GPUs; resume: migration (a-1 reloads from a-0 over the
      network) + 10 s restart paying all 4 GPUs; train until 500."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    rep = simulate(inst, plan)
    events = [NodeFailure(time_s=100, node="a-1"), NodeRecovery(time_s=300, node="a-1")]
    opts = ReplayOptions(horizon_s=500, restart_s=10, checkpoint_interval_s=60, initial_plan=plan,
                         strategies=("static",))
    res = replay(inst, None, opts, extra_events=events).strategies["static"]
    back = ClusterState.initial(inst).apply_all(events)
    mig = migration_plan(inst, plan, plan, back, lost_gpus=[("a-1", 0), ("a-1", 1)]).recovery_s
    assert mig > 0
    down = mig + 10
    train = 100 + (500 - 300 - down)
    assert res.lost_samples == pytest.approx(40 * rep.samples_per_s)
    assert res.total_samples == pytest.approx(train * rep.samples_per_s - 40 * rep.samples_per_s)
    cost = train * usd_per_h(rep) / 3600 + 200 * 2 * PRICE / 3600 + down * 4 * PRICE / 3600
    assert res.total_cost_usd == pytest.approx(cost)
    assert res.downtime_s == pytest.approx(200 + down)
    assert [r.action for r in res.records] == ["stop", "resume"]
    check_tiling(res, 0.0, 500)
    wait = [s for s in res.segments if s.phase == "wait"]
    assert [(s.start_s, s.end_s, s.gpus) for s in wait] == [(100, 300, 2)]  # a-0's GPUs, held (0 before)


@pytest.mark.parametrize("notice", [30.0, None])
def test_warm_replan_on_a_drop_with_and_without_notice(notice):
    """At t=100 the A100s drop from 4 to 2 (node a-1 goes). With a 30 s notice the re-plan (fixed
    latency 5 s) runs at t=70 while training goes on: at t=100 the downtime is migration + restart
    and no work is lost. Without notice the re-plan latency adds to the downtime and the 100 mod 60
    = 40 s since the last checkpoint are lost."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    rep0 = simulate(inst, plan)
    drop = AvailabilityEvent(time_s=100, zone="z1-a", gpu_type="A100-40", available_gpus=2)
    opts = ReplayOptions(horizon_s=1000, restart_s=10, checkpoint_interval_s=60, initial_plan=plan, notice_s=notice,
                         fixed_latency_s=5.0, strategies=("warm",), replan=ReplanOptions(planner_time_limit_s=0))
    res = replay(inst, None, opts, extra_events=[drop]).strategies["warm"]
    change = res.records[-1]
    assert change.time_s == 100 and change.action in ("patched", "repaired")
    assert change.gpus == 2
    state = ClusterState.initial(inst).apply(drop)
    # recompute the replay's decision: the same re-plan, its simulation and its migration estimate
    mine = replan(inst, plan, state, ReplanOptions(planner_time_limit_s=0, change_cost_s=10))
    assert mine.source == change.action and mine.report.samples_per_s == pytest.approx(change.samples_per_s)
    assert change.migration_s == pytest.approx(migration_plan(inst, plan, mine.plan, state).recovery_s)
    new_plan_sps = simulate(state.instance_view(), mine.plan).samples_per_s
    lost = 0.0 if notice else 40 * rep0.samples_per_s
    wait = 0.0 if notice else 5.0
    assert change.downtime_s == pytest.approx(wait + change.migration_s + 10)
    assert res.lost_samples == pytest.approx(lost)
    expected = 100 * rep0.samples_per_s + (1000 - 100 - change.downtime_s) * new_plan_sps - lost
    assert res.total_samples == pytest.approx(expected)
    if notice:
        assert [r.action for r in res.records][0] == "prepared" and res.records[0].time_s == 70
    assert state.plan_is_valid(validate_plan(inst, four_replicas())) is False
    check_tiling(res, 0.0, 1000)


@pytest.mark.parametrize("fails_again", [True, False])
def test_a_switch_whose_replan_outlasts_the_next_change_never_happens(fails_again):
    """Node a-1 is down at the start and back at t=100; the re-plan takes 50 s (fixed), so the
    2-GPU plan trains on until t=150. a-1 fails again at t=120 (or the replay ends at t=130):
    the switch never begins. It was recorded with its downtime (30 s restart and a migration),
    counted as a reconfiguration, and the next change was judged against the plan never
    deployed. By hand: the starting plan trains the whole time, nothing is lost."""
    inst = tiny()
    events = [NodeFailure(time_s=0, node="a-1"), NodeRecovery(time_s=100, node="a-1")]
    if fails_again:
        events.append(NodeFailure(time_s=120, node="a-1"))
    horizon = 500 if fails_again else 130
    opts = ReplayOptions(horizon_s=horizon, restart_s=30, notice_s=None, fixed_latency_s=50.0, strategies=("warm",),
                         plan_horizon_s=3600)
    res = replay(inst, None, opts, extra_events=events)
    warm = res.strategies["warm"]
    first = res.initial["samples_per_s"]
    assert [r.action for r in warm.records] == (["superseded", "kept"] if fails_again else ["unstarted"])
    assert all(r.downtime_s == 0 for r in warm.records) and warm.summary()["reconfigurations"] == 0
    assert warm.total_samples == pytest.approx(horizon * first) and warm.lost_samples == 0
    check_tiling(warm, 0.0, horizon)


def _rate(inst, plan, *events) -> float:
    return simulate(ClusterState.initial(inst).apply_all(events).instance_view(), plan).samples_per_s


def test_the_old_plan_trains_at_its_new_rate_while_the_replan_runs():
    """A bandwidth drop at t=100 leads to a switch after a 200 s re-plan; until then the DP=4 plan
    trains at its rate on the slow network (the simulator's), not at the rate it had before."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    drop = BandwidthEvent(time_s=100, link="inter_node", bandwidth_GBps=0.1)
    opts = ReplayOptions(horizon_s=1000, restart_s=10, initial_plan=plan, fixed_latency_s=200.0, plan_horizon_s=3600,
                         strategies=("warm",), replan=ReplanOptions(planner_time_limit_s=0.3))
    warm = replay(inst, None, opts, extra_events=[drop]).strategies["warm"]
    assert warm.records[0].action in ("patched", "repaired", "planner")  # the switch the test needs
    during = [seg for seg in warm.segments if seg.start_s == 100]
    assert during[0].phase == "train" and during[0].end_s == 300
    assert during[0].samples_per_s == pytest.approx(_rate(inst, plan, drop))


def test_lost_work_is_what_was_trained_since_the_checkpoint():
    """Slow network for 100 s, fast for 1 s, then a node fails (no checkpoint yet): the loss was
    101 s x the fast rate, more than was ever trained, and total samples went negative."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    slow, fast = (BandwidthEvent(time_s=t, link="inter_node", bandwidth_GBps=bw) for t, bw in ((0, 0.1), (100, 12.5)))
    opts = ReplayOptions(horizon_s=200, restart_s=10, initial_plan=plan, checkpoint_interval_s=1e6, notice_s=None,
                         strategies=("static",))
    events = [slow, fast, NodeFailure(time_s=101, node="a-1")]
    static = replay(inst, None, opts, extra_events=events).strategies["static"]
    trained = 100 * _rate(inst, plan, slow) + 1 * _rate(inst, plan, slow, fast)
    assert static.lost_samples == pytest.approx(trained) and static.total_samples == pytest.approx(0, abs=1e-6)


def test_a_node_that_fails_and_recovers_at_one_instant_has_lost_its_state():
    """Applied together the two read as nothing ("kept", "continue", no loss). By hand for the
    static plan: the 100 mod 60 = 40 s since the checkpoint are lost and a-1's GPUs reload."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    events = [NodeFailure(time_s=100, node="a-1"), NodeRecovery(time_s=100, node="a-1")]
    opts = ReplayOptions(horizon_s=500, restart_s=10, checkpoint_interval_s=60, initial_plan=plan, fixed_latency_s=5.0,
                         plan_horizon_s=3600, replan=ReplanOptions(planner_time_limit_s=0))
    res = replay(inst, None, opts, extra_events=events).strategies
    rate = _rate(inst, plan)
    for name in ("warm", "static"):
        [rec] = res[name].records
        assert rec.action in ("resume", "patched", "repaired", "planner") and rec.migration_s > 0, rec
        assert res[name].lost_samples == pytest.approx(40 * rate)
    assert res["static"].records[0].moved_ranks == 2


def test_an_announced_drop_loses_nothing_beside_the_failure_of_an_idle_node():
    """A node the plan does not use fails (no notice) at the instant of an announced drop of
    the plan's GPUs: the whole instant was taken as unannounced and the drop lost 40 s of work."""
    data = tiny().model_dump(mode="json", exclude={"base_dir"})
    data["cluster"]["node_groups"][0]["count"] = 3
    inst = instance_from_dict(data)
    reps = [{"gpu_type": "A100-40", "tp": 1, "node": n, "gpus": [g], "microbatch_share": 16}
            for n in ("a-1", "a-2") for g in (0, 1)]
    plan = validate_plan(inst, plan_from_dict({"name": "p", "num_microbatches": 1, "stages": [
        {"layer_start": 0, "layer_end": 6, "replicas": reps}]}))
    drop = AvailabilityEvent(time_s=100, zone="z1-a", gpu_type="A100-40", available_gpus=2)
    opts = ReplayOptions(horizon_s=300, restart_s=10, checkpoint_interval_s=60, initial_plan=plan, fixed_latency_s=5.0,
                         strategies=("warm",), replan=ReplanOptions(planner_time_limit_s=0))
    alone = replay(inst, None, opts, extra_events=[drop]).strategies["warm"]
    both = replay(inst, None, opts, extra_events=[drop, NodeFailure(time_s=100, node="a-0")]).strategies["warm"]
    assert alone.lost_samples == both.lost_samples == 0


def test_an_event_that_changes_nothing_leaves_a_pending_switch_alone():
    """a-1 is back at t=100 and the switch waits on a 50 s re-plan; a recovery of a-0, which never
    failed, at t=120 superseded it (and re-planned): now it is `unchanged` and the run is the same."""
    inst = tiny()
    events = [NodeFailure(time_s=0, node="a-1"), NodeRecovery(time_s=100, node="a-1")]
    opts = ReplayOptions(horizon_s=500, restart_s=30, notice_s=None, fixed_latency_s=50.0, strategies=("warm",),
                         plan_horizon_s=3600)
    base = replay(inst, None, opts, extra_events=events).strategies["warm"]
    more = replay(inst, None, opts, extra_events=[*events, NodeRecovery(time_s=120, node="a-0")]).strategies["warm"]
    assert [r.action for r in more.records] == [base.records[0].action, "unchanged"]
    assert more.total_samples == pytest.approx(base.total_samples)
    assert more.summary()["reconfigurations"] == base.summary()["reconfigurations"] == 1


def test_a_later_notice_keeps_the_head_start_of_an_earlier_one():
    """Drops to 2 GPUs at t=100 and t=120 (notices at 70 and 90), a rise to 4 at 110; re-plans take
    20 s. The notice at 90 announced the same cluster as the one at 70 and restarted its re-plan,
    so the drop at 100 waited 10 s of it: its downtime is the restart alone (no migration: a-0
    keeps its state), as with one notice."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    drops = [AvailabilityEvent(time_s=t, zone="z1-a", gpu_type="A100-40", available_gpus=n)
             for t, n in ((100, 2), (110, 4), (120, 2))]
    opts = ReplayOptions(horizon_s=300, restart_s=10, initial_plan=plan, fixed_latency_s=20.0, plan_horizon_s=3600,
                         strategies=("warm",), replan=ReplanOptions(planner_time_limit_s=0))
    warm = replay(inst, None, opts, extra_events=drops).strategies["warm"]
    first = next(r for r in warm.records if r.time_s == 100)
    assert first.downtime_s == pytest.approx(first.migration_s + 10)
    one = replay(inst, None, opts, extra_events=drops[:1]).strategies["warm"]
    assert one.records[-1].downtime_s == pytest.approx(first.downtime_s)


def test_a_reconfiguration_cut_short_keeps_the_downtime_it_had():
    """Drops and rises at t=100, 110 and 120, re-plans of 20 s, restarts of 10 s, no notice: each
    change cuts the reconfiguration under way short. The records kept their planned downtimes
    (90 s in all) while 50 s passed without training; each now keeps what it had."""
    inst = tiny()
    plan = validate_plan(inst, four_replicas())
    changes = [AvailabilityEvent(time_s=t, zone="z1-a", gpu_type="A100-40", available_gpus=n)
               for t, n in ((100, 2), (110, 4), (120, 2))]
    opts = ReplayOptions(horizon_s=300, restart_s=10, initial_plan=plan, fixed_latency_s=20.0, plan_horizon_s=3600,
                         notice_s=None, strategies=("warm",), replan=ReplanOptions(planner_time_limit_s=0))
    warm = replay(inst, None, opts, extra_events=changes).strategies["warm"]
    assert sum(r.downtime_s for r in warm.records) == pytest.approx(warm.downtime_s)
    assert [r.downtime_s for r in warm.records][:2] == pytest.approx([10.0, 10.0])  # cut at 110 and at 120
    check_tiling(warm, 0.0, 300)


def test_bundled_trace_all_strategies():
    """The bundled spot trace from the bundled plan, for its first hour and a bit (a bandwidth drop
    at 3600 s): every strategy's segments tile the time; warm re-planning trains more than the
    static plan, which stops at the first drop of its GPUs and never sees them all again."""
    inst = load_instance(REPO / "instances" / "spot_trace_2type.yaml")
    first = load_plan(REPO / "instances" / "plans" / "spot_trace_2type.json")
    opts = ReplayOptions(horizon_s=4000, initial_plan=first, fixed_latency_s=0.5)
    res = replay(inst, None, opts)
    assert set(res.strategies) == {"warm", "cold", "static"}
    for s in res.strategies.values():
        check_tiling(s, res.start_s, 4000)
        assert s.total_cost_usd > 0
    warm, static = res.strategies["warm"], res.strategies["static"]
    assert warm.total_samples > static.total_samples
    assert all(r.latency_s == 0.5 for r in warm.records if r.action in ("patched", "repaired", "planner", "kept"))
    # every reconfiguration pays at least the restart constant
    assert all(r.downtime_s >= opts.restart_s for r in warm.records if r.action in ("patched", "repaired", "planner"))
    assert res.summary()["strategies"]["warm"]["total_samples"] == pytest.approx(warm.total_samples)


def test_replay_command_json_and_errors(tmp_path):
    from hetplan.orchestration import replay_cli

    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, so "replay" is a sub-command as in `hetplan replay`
        pass

    replay_cli.register(app)
    events = tmp_path / "events.yaml"
    events.write_text("events:\n  - {kind: failure, time_s: 100, node: a-1}\n  - {kind: recovery, time_s: 200, node: a-1}\n")
    inst_file = tmp_path / "tiny.yaml"
    inst_file.write_text(json.dumps(tiny().model_dump(mode="json", exclude={"base_dir"})))
    out = CliRunner().invoke(app, ["replay", str(inst_file), str(events), "--json", "--horizon", "400",
                                   "--planner-time-limit", "0.3", "--initial-time-limit", "1", "--fixed-latency", "1",
                                   "--strategies", "warm,static"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert set(data["strategies"]) == {"warm", "static"} and data["horizon_s"] == 400
    assert [r["action"] for r in data["strategies"]["static"]["records"]][:1] in (["stop"], ["continue"])
    text = CliRunner().invoke(app, ["replay", str(inst_file), str(events), "--horizon", "400",
                                    "--initial-time-limit", "1", "--fixed-latency", "1", "--strategies", "static"])
    assert text.exit_code == 0 and "strategies" in text.output
    with pytest.raises(InstanceError, match="unknown strategies"):
        ReplayOptions(strategies=("sometimes",))
    with pytest.raises(InstanceError, match="file not found"):
        replay(tiny(), tmp_path / "missing.csv")


def test_warm_asks_again_once_the_cluster_has_been_stable():
    """4 A100s drop to 2 at t=100 (30 s notice) and are back at t=130; horizon 2000 s. The change
    penalty (restart 30 s) is weighed against the median gap between event instants, 30 s here
    (notice 70, drop 100, back 130), so at 130 warm keeps its 2-GPU plan; it used to keep it for
    the remaining 1,870 s. Now it asks again when the cluster has been stable for 30, 60, 120 ... s,
    the penalty weighed against that time, and switches back at the first check where the rule
    (rate x (stable - restart - migration) / stable > the kept rate) holds, by hand here."""
    inst = tiny()
    drop = AvailabilityEvent(time_s=100, zone="z1-a", gpu_type="A100-40", available_gpus=2)
    back = AvailabilityEvent(time_s=130, zone="z1-a", gpu_type="A100-40", available_gpus=4)
    opts = ReplayOptions(horizon_s=2000, checkpoint_interval_s=60, initial_plan=validate_plan(inst, four_replicas()),
                         fixed_latency_s=0.0, strategies=("warm",))
    res = replay(inst, None, opts, extra_events=[drop, back]).strategies["warm"]
    at_130 = next(r for r in res.records if r.time_s == 130)
    assert at_130.action == "kept" and at_130.gpus == 2
    switch = res.records[-1]
    stable = switch.time_s - 130
    assert switch.events == [f"stable for {stable:g} s: re-check"] and switch.gpus == 4
    assert stable in (30, 60, 120, 240, 480, 960)

    def gain(over_s: float) -> float:  # the switch's rate over `over_s`, restart and migration paid
        return switch.samples_per_s * (over_s - 30 - switch.migration_s) / over_s

    assert gain(stable) > at_130.samples_per_s and (stable == 30 or gain(stable / 2) <= at_130.samples_per_s)
    assert res.segments[-1].gpus == 4 and res.segments[-1].end_s == 2000
    check_tiling(res, 0.0, 2000)
