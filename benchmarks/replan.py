"""Re-plan latency and quality on a 256-GPU, 2-type cluster (prints a table).

    python benchmarks/replan.py [--initial-time-limit 20] [--planner-time-limit 2] [--cold-time-limit 2 20]

Cluster: 16 nodes x 8 A100-40 in us-central1-a and 16 nodes x 8 V100-32 in us-central1-b (one
region), GPT-Neo-2.7B, global batch 1024. The first plan comes from the joint planner; then each
event is applied to that state and re-planned in four ways:

  repair      replan(..., planner_time_limit_s=0): the warm start alone (patch + greedy repair)
  warm+plan   replan(...) with the joint planner for --planner-time-limit s, cut off at the repair
  cold T      the joint planner from scratch on the new state, T s (no warm start), placed first fit
  (for every row: latency, simulated samples/s, GPUs, ranks that must load state, and the
  migration estimate against "everyone downloads from remote storage"). A last row gives the
  64 V100 back to the plan repaired after their loss (the repair never adds stages of its own
  beyond one per free GPU group, so large returns are where the planner pays off).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from rich.console import Console
from rich.table import Table

from hetplan.cluster_state import ClusterState, NodeFailure
from hetplan.instance import AvailabilityEvent, BandwidthEvent, instance_from_dict
from hetplan.replan import ReplanOptions, replan
from hetplan.runtime.migrate import migration_plan


def cluster():
    return instance_from_dict({
        "name": "bench256",
        "cluster": {"node_groups": [
            {"name": "a100", "gpu_type": "A100-40", "gpus_per_node": 8, "count": 16, "zone": "us-central1-a",
             "price_per_gpu_hour_usd": 3.67},
            {"name": "v100", "gpu_type": "V100-32", "gpus_per_node": 8, "count": 16, "zone": "us-central1-b",
             "price_per_gpu_hour_usd": 2.48}]},
        "workload": {"model": "GPT-Neo-2.7B", "global_batch_size": 1024, "precision": "fp16",
                     "flash_attention": True}})


def events(state0: ClusterState) -> list[tuple[str, ClusterState]]:
    lose = state0.apply(AvailabilityEvent(time_s=600, zone="us-central1-a", gpu_type="A100-40", available_gpus=96))
    return [
        ("-32 A100 (4 nodes preempted)", lose),
        ("1 V100 node fails", state0.apply(NodeFailure(time_s=600, node="v100-3"))),
        ("inter-zone 5 -> 1 GB/s", state0.apply(BandwidthEvent(time_s=600, link="inter_zone", bandwidth_GBps=1.0))),
        ("-64 V100 (8 nodes preempted)", state0.apply(AvailabilityEvent(time_s=600, zone="us-central1-b",
                                                                        gpu_type="V100-32", available_gpus=64))),
    ]


def timed_replan(inst, prev, state, opts, repeat: int):
    runs = [replan(inst, prev, state, opts) for _ in range(repeat)]
    return runs[-1], statistics.median(r.latency_s for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--initial-time-limit", type=float, default=20.0)
    ap.add_argument("--planner-time-limit", type=float, default=2.0)
    ap.add_argument("--cold-time-limit", type=float, nargs="+", default=[2.0, 20.0])
    ap.add_argument("--repeat", type=int, default=3, help="repair latency: median of this many runs")
    args = ap.parse_args(argv)
    inst = cluster()
    state0 = ClusterState.initial(inst)
    t0 = time.perf_counter()
    first = replan(inst, None, state0, ReplanOptions(warm=False, planner_time_limit_s=args.initial_time_limit,
                                                     planner_combo_time_limit_s=2.0))
    prev = first.plan
    console = Console(width=200)
    console.print(f"first plan: {first.report.num_gpus} GPUs, {len(prev.stages)} stages, m={prev.num_microbatches}, "
                  f"{first.report.samples_per_s:.1f} samples/s ({time.perf_counter() - t0:.1f} s of planning)")
    table = Table(title=f"re-planning {inst.name} (256 GPUs: 128 A100-40 + 128 V100-32, GPT-Neo-2.7B)")
    for col in ("event", "method", "latency s", "samples/s", "vs cold best", "GPUs", "moved ranks", "migration s",
                "remote-only s", "source"):
        table.add_column(col, justify="left" if col in ("event", "method", "source") else "right")
    scenarios = [(name, state, prev) for name, state in events(state0)]
    # capacity comes back: the 64 V100 return to the plan repaired after their loss
    lose64 = scenarios[-1][1]
    after = replan(inst, prev, lose64, ReplanOptions(planner_time_limit_s=0)).plan
    back = lose64.apply(AvailabilityEvent(time_s=1200, zone="us-central1-b", gpu_type="V100-32", available_gpus=128))
    scenarios.append(("+64 V100 back (from the repair above)", back, after))
    for name, state, prev in scenarios:
        rows = []
        res, lat = timed_replan(inst, prev, state, ReplanOptions(planner_time_limit_s=0), args.repeat)
        rows.append(("repair", res, lat))
        res = replan(inst, prev, state, ReplanOptions(planner_time_limit_s=args.planner_time_limit,
                                                      planner_combo_time_limit_s=min(1.0, args.planner_time_limit)))
        rows.append((f"warm+plan {args.planner_time_limit:g}s", res, res.latency_s))
        for limit in args.cold_time_limit:
            try:
                res = replan(inst, prev, state, ReplanOptions(warm=False, planner_time_limit_s=limit,
                                                              planner_combo_time_limit_s=min(2.0, limit)))
            except Exception as exc:  # noqa: BLE001 - a benchmark row, not a failure
                console.print(f"[yellow]{name}: cold {limit:g}s: {exc}[/]")
                continue
            rows.append((f"cold {limit:g}s", res, res.latency_s))
        cold_best = max((r.report.samples_per_s for m, r, _ in rows if m.startswith("cold")), default=None)
        for method, res, lat in rows:
            mp = migration_plan(inst, prev, res.plan, state)
            rel = f"{res.report.samples_per_s / cold_best:.3f}" if cold_best else "-"
            table.add_row(name, method, f"{lat:.3f}", f"{res.report.samples_per_s:.1f}", rel,
                          str(res.report.num_gpus), str(res.moved_ranks), f"{mp.recovery_s:.1f}",
                          f"{mp.remote_only_s:.1f}", res.source)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
