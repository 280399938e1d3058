"""The discrete-event schedule replayer and checker (hetplan.formulations.opsched_replay), on hand-timed cases.

Devices run 1 TFLOP/s at full efficiency, so an operator of g GFLOP lasts g ms; channel 'fast' is
10 GB/s and 'slow' 5 GB/s without latency, so 0.01 GB takes 1 ms and 2 ms.
"""
from __future__ import annotations

import pytest

from hetplan.errors import PlanError
from hetplan.formulations.opsched_graph import Channel, DataEdge, Device, DeviceGraph, OpGraph, Operator
from hetplan.formulations.opsched_replay import (
    OpSlot, Schedule, TransferSlot, check, memory_use_bytes, replay, transfer_time_s, validate,
)

GB = 1e9
MS = 1e-3


def devices(slow_concurrent: bool = True, memory_GB: float = 100.0) -> DeviceGraph:
    devs = [Device(name=n, peak_tflops=1.0, efficiency=1.0, mem_bandwidth_GBps=1e4, memory_bytes=memory_GB * GB)
            for n in ("d0", "d1")]
    return DeviceGraph.mesh(devs, [Channel(name="fast", bandwidth_GBps=10.0),
                                   Channel(name="slow", bandwidth_GBps=5.0, concurrent=slow_concurrent)])


def fan_out() -> OpGraph:
    """a (1 ms) feeds b (2 ms) and c (1 ms) with 0.01 GB each."""
    ops = (Operator(name="a", flops=1e9, mem_bytes=1 * GB), Operator(name="b", flops=2e9, mem_bytes=1 * GB),
           Operator(name="c", flops=1e9, mem_bytes=1 * GB))
    return OpGraph(operators=ops, edges=(DataEdge(src="a", dst="b", size_bytes=0.01 * GB),
                                         DataEdge(src="a", dst="c", size_bytes=0.01 * GB)))


def plan(ch_b: str, ch_c: str, b_first: bool = True) -> Schedule:
    """a on d0, b and c on d1; the start times only carry the order (replay re-times them)."""
    first, second = (0.0, 1.0) if b_first else (1.0, 0.0)
    return Schedule({"a": OpSlot("d0", 0, 0), "b": OpSlot("d1", first, first), "c": OpSlot("d1", second, second)},
                    {("a", "b"): TransferSlot("d0", "d1", ch_b, first, first),
                     ("a", "c"): TransferSlot("d0", "d1", ch_c, second, second)})


def times(res, key):
    slot = res.schedule.ops[key] if isinstance(key, str) else res.schedule.transfers[key]
    return round(slot.start_s / MS, 9), round(slot.end_s / MS, 9)


def test_same_channel_serializes_transfers():
    res = replay(plan("fast", "fast"), fan_out(), devices())
    assert times(res, ("a", "b")) == (1, 2) and times(res, ("a", "c")) == (2, 3)
    assert times(res, "b") == (2, 4) and times(res, "c") == (4, 5)
    assert res.objective_s == pytest.approx(5 * MS)


def test_concurrent_sibling_channels_overlap():
    g = fan_out()
    res = replay(plan("fast", "slow", b_first=False), g, devices())
    # c first on d1: its input on 'slow' 1-3 ms, b's on 'fast' 1-2 ms in parallel; c 3-4, b 4-6
    assert times(res, ("a", "c")) == (1, 3) and times(res, ("a", "b")) == (1, 2)
    assert times(res, "c") == (3, 4) and times(res, "b") == (4, 6)
    assert check(res.schedule, g, devices()) == []


def test_non_concurrent_channel_excludes_its_sibling():
    g = fan_out()
    res = replay(plan("fast", "slow", b_first=False), g, devices(slow_concurrent=False))
    # c's transfer starts first by the plan's order (1-3 ms on 'slow'), b's waits: 3-4 ms on 'fast'
    assert times(res, ("a", "c")) == (1, 3) and times(res, ("a", "b")) == (3, 4)
    assert times(res, "c") == (3, 4) and times(res, "b") == (4, 6)
    # the concurrent timing is infeasible on the non-concurrent graph
    concurrent = replay(plan("fast", "slow", b_first=False), g, devices()).schedule
    assert [v.kind for v in check(concurrent, g, devices(slow_concurrent=False))] == ["channel_overlap"]


def test_opposite_directions_are_separate_resources():
    """Full duplex: d0 -> d1 and d1 -> d0 on the same channel overlap."""
    ops = tuple(Operator(name=n, flops=1e9) for n in ("a", "x", "b", "y"))
    g = OpGraph(operators=ops, edges=(DataEdge(src="a", dst="b", size_bytes=0.01 * GB),
                                      DataEdge(src="x", dst="y", size_bytes=0.01 * GB)))
    s = Schedule({"a": OpSlot("d0", 0, 0), "x": OpSlot("d1", 0, 0), "b": OpSlot("d1", 1, 1), "y": OpSlot("d0", 1, 1)},
                 {("a", "b"): TransferSlot("d0", "d1", "fast", 0, 0), ("x", "y"): TransferSlot("d1", "d0", "fast", 0, 0)})
    res = replay(s, g, devices())
    assert times(res, ("a", "b")) == (1, 2) == times(res, ("x", "y"))
    assert res.objective_s == pytest.approx(3 * MS)


def test_bandwidth_override_equals_a_changed_graph():
    g, s = fan_out(), plan("fast", "fast")
    slowed = devices().with_channel_bandwidth("d0", "d1", "fast", 2.5)  # 0.01 GB now takes 4 ms
    by_graph = replay(s, g, slowed)
    by_override = replay(s, g, devices(), bandwidth_GBps={("d1", "d0", "fast"): 2.5})
    assert by_graph.schedule == by_override.schedule
    assert times(by_graph, ("a", "c")) == (5, 9) and by_graph.objective_s == pytest.approx(10 * MS)  # c 9-10 ms
    assert check(by_override.schedule, g, devices(), bandwidth_GBps={("d0", "d1", "fast"): 2.5}) == []
    # the old timing is too short for the slower channel
    old = replay(s, g, devices()).schedule
    assert {v.kind for v in check(old, g, slowed)} == {"duration"}


def test_replay_is_the_earliest_timing_of_a_feasible_schedule():
    g = fan_out()
    late = Schedule({"a": OpSlot("d0", 0.5 * MS, 1.5 * MS), "b": OpSlot("d1", 3 * MS, 5 * MS),
                     "c": OpSlot("d1", 6 * MS, 7 * MS)},
                    {("a", "b"): TransferSlot("d0", "d1", "fast", 1.5 * MS, 2.5 * MS),
                     ("a", "c"): TransferSlot("d0", "d1", "slow", 1.6 * MS, 3.6 * MS)})
    assert check(late, g, devices()) == []
    res = replay(late, g, devices())
    for name, slot in res.schedule.ops.items():
        assert slot.start_s <= late.ops[name].start_s
    assert replay(res.schedule, g, devices()).schedule == res.schedule  # idempotent
    assert res.objective_s == pytest.approx(5 * MS)


def test_check_names_each_violation():
    g = fan_out()
    good = replay(plan("fast", "fast"), g, devices()).schedule
    ops, tr = dict(good.ops), dict(good.transfers)
    overlap = Schedule({**ops, "c": OpSlot("d1", 3 * MS, 4 * MS)}, tr)  # c inside b's 2-4 ms
    assert "device_overlap" in {v.kind for v in check(overlap, g, devices())}
    early = Schedule(ops, {**tr, ("a", "b"): TransferSlot("d0", "d1", "fast", 0.5 * MS, 1.5 * MS)})
    kinds = {v.kind for v in check(early, g, devices())}
    assert "dependency" in kinds  # starts before a ends (eq. 5)
    missing = Schedule(ops, {("a", "b"): tr[("a", "b")]})
    assert [v.kind for v in check(missing, g, devices())] == ["missing"]
    wrong = Schedule(ops, {**tr, ("a", "c"): TransferSlot("d0", "d1", "ib", 2 * MS, 3 * MS)})
    assert [v.kind for v in check(wrong, g, devices())] == ["link"]
    with pytest.raises(PlanError, match="no channel 'ib'"):
        replay(wrong, g, devices())
    assert memory_use_bytes(good, g) == {"d0": 1 * GB, "d1": 2 * GB + 0.02 * GB}  # eq. 6 with inputs on d1
    tight = devices(memory_GB=2.0)
    assert [v.kind for v in check(good, g, tight)] == ["memory"]
    with pytest.raises(PlanError, match="memory|holds"):
        validate(good, g, tight)


def test_order_against_the_data_is_a_cycle():
    g = OpGraph(operators=(Operator(name="a", flops=1e9), Operator(name="b", flops=1e9)),
                edges=(DataEdge(src="a", dst="b", size_bytes=1.0),))
    backwards = Schedule({"a": OpSlot("d0", 5, 6), "b": OpSlot("d0", 0, 1)})
    with pytest.raises(PlanError, match="cycle"):
        replay(backwards, g, devices())


def test_transfer_time_is_alpha_beta():
    ch = Channel(name="c", bandwidth_GBps=12.5, latency_s=2e-5)
    assert transfer_time_s(25e6, ch) == pytest.approx(2e-5 + 2e-3)
    assert transfer_time_s(25e6, ch, bandwidth_GBps=25.0) == pytest.approx(2e-5 + 1e-3)
