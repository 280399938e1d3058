"""Cluster state and events: availability per (GPU type, zone) on concrete nodes, failures,
bandwidth changes, preemption notices, the merged event stream and its errors."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetplan.cluster_state import (
    ClusterState,
    NodeFailure,
    NodeRecovery,
    PreemptionNotice,
    batches,
    event_stream,
    parse_event,
    read_events_file,
)
from hetplan.errors import InstanceError, PlanError
from hetplan.estimators import Endpoint, build_estimators
from hetplan.instance import AvailabilityEvent, BandwidthEvent, instance_from_dict, load_instance
from hetplan.plan import plan_from_dict

REPO = Path(__file__).resolve().parents[1]
SPOT = REPO / "instances" / "spot_trace_2type.yaml"


def shared_dir() -> Path:
    return Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared"))


def two_zone(count: int = 3):
    return instance_from_dict({
        "name": "two_zone",
        "cluster": {"node_groups": [
            {"name": "a100-a", "gpu_type": "A100-40", "gpus_per_node": 4, "count": count, "zone": "us-central1-a",
             "price_per_gpu_hour_usd": 1.0},
            {"name": "v100-b", "gpu_type": "V100-16", "gpus_per_node": 4, "count": 2, "zone": "us-central1-b",
             "price_per_gpu_hour_usd": 0.5}]},
        "workload": {"model": "OPT-350M", "global_batch_size": 32, "precision": "fp16"}})


def test_availability_fills_nodes_in_order_and_drops_the_last_first():
    s = ClusterState.initial(two_zone())
    assert s.available() == {("A100-40", "us-central1-a"): 12, ("V100-16", "us-central1-b"): 8}
    s = s.apply(AvailabilityEvent(time_s=5, zone="us-central1-a", gpu_type="A100-40", available_gpus=6))
    # 6 GPUs on 4-GPU nodes: a100-a-0 full, a100-a-1 with local GPUs 0-1, a100-a-2 gone
    assert [s.gpus_up[f"a100-a-{k}"] for k in range(3)] == [4, 2, 0]
    assert s.time_s == 5 and s.total_gpus == 6 + 8
    assert s.whole_node_available()[("A100-40", "us-central1-a")] == 4
    # a failed node is skipped: the same 6 GPUs now sit on nodes 1 and 2
    s = s.apply(NodeFailure(time_s=6, node="a100-a-0"))
    assert [s.gpus_up[f"a100-a-{k}"] for k in range(3)] == [0, 4, 2]
    s = s.apply(NodeRecovery(time_s=7, node="a100-a-0"))
    assert [s.gpus_up[f"a100-a-{k}"] for k in range(3)] == [4, 2, 0]


def test_counts_above_the_quota_are_clamped_with_a_note():
    s = ClusterState.initial(two_zone()).apply(
        AvailabilityEvent(time_s=0, zone="us-central1-b", gpu_type="V100-16", available_gpus=128))
    assert s.available()[("V100-16", "us-central1-b")] == 8
    assert "clamped to the quota 8" in s.clamped[0]


def test_bandwidth_events_reach_the_estimators_through_the_view():
    inst = two_zone()
    s = ClusterState.initial(inst)
    assert s.instance_view() is inst  # nothing changed yet
    s = s.apply(BandwidthEvent(time_s=1, link="inter_zone", bandwidth_GBps=2.0))
    s = s.apply(BandwidthEvent(time_s=2, link="intra_node", bandwidth_GBps=50.0))
    s = s.apply(BandwidthEvent(time_s=3, link="zone_pair", zones=("us-central1-a", "us-central1-b"),
                               bandwidth_GBps=0.5))
    view = s.instance_view()
    assert view.cluster.network.inter_zone.bandwidth_GBps == 2.0
    assert inst.cluster.network.inter_zone.bandwidth_GBps == 5.0  # the instance is untouched
    # nodes (a cached property) are recomputed: their intra-node links follow the event
    assert {n.intra_node.bandwidth_GBps for n in view.nodes} == {50.0}
    assert s.bandwidths_GBps() == {"intra_node": 50.0, "inter_node": 12.5, "inter_zone": 2.0, "inter_region": 1.0}
    comm = build_estimators(view).comm
    a, b = Endpoint("us-central1-a", "us-central1"), Endpoint("us-central1-b", "us-central1")
    # 1 GB over the zone pair at 0.5 GB/s plus the inter-zone latency kept for the pair
    assert comm.p2p_time_s(a, b, 1e9) == pytest.approx(2.0 + 5e-4)


def test_plan_checks_name_the_replica_on_a_lost_gpu():
    inst = two_zone()
    plan = plan_from_dict({"num_microbatches": 1, "stages": [{"layer_start": 0, "layer_end": 26, "replicas": [
        {"gpu_type": "A100-40", "tp": 2, "node": "a100-a-1", "gpus": [2, 3], "microbatch_share": 32}]}]})
    s = ClusterState.initial(inst)
    s.check_plan(plan)
    s = s.apply(AvailabilityEvent(time_s=1, zone="us-central1-a", gpu_type="A100-40", available_gpus=6))
    with pytest.raises(PlanError, match=r"stages\[0\]\.replicas\[0\]\.gpus: GPUs \[2, 3\] of node a100-a-1"):
        s.check_plan(plan)
    s = s.apply(NodeFailure(time_s=2, node="a100-a-1"))
    with pytest.raises(PlanError, match="node a100-a-1 has failed"):
        s.check_plan(plan)


def test_bundled_stream_is_time_ordered_and_instance_events_override_the_trace():
    inst = load_instance(SPOT)
    events = event_stream(inst)
    times = [e.time_s for e in events]
    assert times == sorted(times) and times[0] == 0.0
    # t = 1800: the trace says A100-40@us-central1-a -> 0, the instance's own event says 8 (it wins)
    state = ClusterState.initial(inst)
    for t, evs in batches(events):
        state = state.apply_all(evs)
        if t == 1800:
            break
    assert state.available()[("A100-40", "us-central1-a")] == 8
    # t = 3600: the instance's bandwidth event
    bw = [e for e in events if isinstance(e, BandwidthEvent)]
    assert [(e.time_s, e.link, e.bandwidth_GBps) for e in bw] == [(3600, "inter_zone", 2.0)]
    # only changes are kept: no two consecutive events set the same count for one (type, zone)
    last: dict = {}
    for e in events:
        if isinstance(e, AvailabilityEvent):
            assert last.get((e.gpu_type, e.zone)) != e.available_gpus
            last[(e.gpu_type, e.zone)] = e.available_gpus


def test_notices_announce_every_drop_and_predict_the_state():
    inst = load_instance(SPOT)
    events = event_stream(inst, notice_s=30)
    notices = [e for e in events if isinstance(e, PreemptionNotice)]
    assert notices and all(n.effective_s - n.time_s == 30 for n in notices)
    first = notices[0]  # trace row 1 (t = 600): A100-40@us-central1-b 8 -> 4
    assert (first.time_s, first.gpu_type, first.zone, first.available_gpus) == (570, "A100-40", "us-central1-b", 4)
    state = ClusterState.initial(inst)
    for t, evs in batches(events):
        state = state.apply_all(evs)
        if t == 570:
            break
    assert state.available()[("A100-40", "us-central1-b")] == 8  # not yet
    assert state.predicted().available()[("A100-40", "us-central1-b")] == 4
    # a notice given in an events file brings its drop with it
    extra = [PreemptionNotice(time_s=100, effective_s=160, gpu_type="V100-16", zone="us-central1-a", available_gpus=4)]
    stream = event_stream(inst, extra=extra, use_instance_trace=False)
    drops = [e for e in stream if isinstance(e, AvailabilityEvent) and e.time_s == 160]
    assert [(e.gpu_type, e.available_gpus) for e in drops] == [("V100-16", 4)]


def test_sailor_reference_trace_is_read_and_clamped():
    path = shared_dir() / "reference" / "sailor" / "cluster" / "gpu_trace_2zones_2gpus.csv"
    if not path.exists():
        pytest.skip("Sailor reference files not present")
    inst = load_instance(SPOT)
    events = event_stream(inst, trace=path, use_instance_trace=False)
    state = ClusterState.initial(inst).apply_all(e for e in events if e.time_s == 0)
    # every column asks for 128 GPUs; the instance has 16 of each (type, zone): nothing changes
    assert state.available() == state.quota
    bad = shared_dir() / "reference" / "sailor" / "cluster" / "gpu_trace_multizone.csv"
    with pytest.raises(InstanceError, match="A100-40_us-central1-c: A100-40 in zone us-central1-c is not in"):
        event_stream(inst, trace=bad, use_instance_trace=False)


def test_events_file_and_errors(tmp_path: Path):
    inst = two_zone()
    f = tmp_path / "events.yaml"
    f.write_text("events:\n"
                 "  - {kind: failure, time_s: 10, node: a100-a-1}\n"
                 "  - {kind: recovery, time_s: 50, node: a100-a-1}\n"
                 "  - {kind: bandwidth, time_s: 20, link: inter_node, bandwidth_GBps: 1.0}\n")
    events, trace = read_events_file(f)
    assert trace is None and [type(e).__name__ for e in events] == ["NodeFailure", "NodeRecovery", "BandwidthEvent"]
    ordered = event_stream(inst, extra=events)
    assert [e.time_s for e in ordered] == [10, 20, 50]
    with pytest.raises(InstanceError, match="unknown event kind 'explode'"):
        parse_event({"kind": "explode", "time_s": 1})
    with pytest.raises(InstanceError, match="events\\[0\\]: node: Field required"):
        parse_event({"kind": "failure", "time_s": 1}, "events[0]")
    with pytest.raises(InstanceError, match="events.failure.node: unknown node 'nope'"):
        ClusterState.initial(inst).apply(NodeFailure(time_s=1, node="nope"))
    with pytest.raises(InstanceError, match="T4 in zone us-central1-a is not in the cluster"):
        ClusterState.initial(inst).apply(AvailabilityEvent(time_s=1, zone="us-central1-a", gpu_type="T4",
                                                           available_gpus=1))
    with pytest.raises(InstanceError, match="before the notice time"):
        parse_event({"kind": "preemption", "time_s": 10, "effective_s": 5, "gpu_type": "A100-40",
                     "zone": "us-central1-a", "available_gpus": 0})
