"""Re-planning speed and quality on Sailor's availability traces at full scale (prints a table).

    HETPLAN_SHARED_DIR=/work/shared python benchmarks/replan.py [--json] [--events]
        [--models OPT-350M,GPT-Neo-2.7B] [--traces gpu_trace_multizone,gpu_trace_heterogeneous_imbalanced]
        [--budget 0.85] [--cutoff] [--scale 1] [--repeat 1] [--first-time-limit 3] [--from-first-row]

Traces (benchmarks/time_limits.py builds their instances, 4-GPU nodes, global batch 2048):
`gpu_trace_multizone` (A100-40 in five zones, 32 / 80 / 128 per zone, 640 GPUs in all) and
`gpu_trace_heterogeneous_imbalanced` (A100-40 + V100-16 in one zone, 32 + 96 / 80 + 240 / 128 + 384,
512 GPUs). Every column change of the CSV is one event (15 on multizone, 6 on
heterogeneous_imbalanced), applied one at a time from the cluster before the trace (every GPU up;
`--from-first-row`: from the state after its first row, 10 and 4 events). The first plan comes from
the planner (--first-time-limit, not timed); then, at every event:

  warm   replan(instance, previous warm plan, state, options, session=...) with the replay's options
         (ReplayOptions().replan: 8 stages at most, no cutoff unless --cutoff) and budget_s = --budget
         (0: none, the replay's 0.3 s planner limit); one `ReplanSession` kept from the first plan
         on. Its wall time, end to end (tables, repair, planner, placement, simulations), is the
         re-plan time
  cold   replan(instance, None, state, the same options with warm=False and budget_s = that wall
         time): a plan from scratch given the same time, its tables, planner and scoring included
         (a cold re-plan with only the planner's limit set to the wall time ran up to 0.15 s
         longer than the warm one, and found a better plan in 4 of 126 event passes)

Objective: the simulated samples/s of the plan (the instances maximise throughput); the table and
`--json` give their mean over the events, and whether warm >= cold held at every event. `--repeat`
runs the whole trace that many times (fresh sessions) and takes each event's median wall time.
`--scale` shrinks every GPU count (to whole 4-GPU nodes): the tests run it small. Timings need a
quiet machine (two cores: the warm re-plan uses both); the JSON carries the 1-minute load average
before and after each trace.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter

from rich.console import Console
from rich.table import Table

from hetplan.cluster_state import ClusterState
from hetplan.errors import HetplanError
from hetplan.instance import AvailabilityEvent
from hetplan.orchestration.replan import ReplanOptions, ReplanSession, replan
from hetplan.orchestration.replay import ReplayOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_limits import TRACES, trace_instance, trace_path, trace_rows  # noqa: E402

GPUS_PER_NODE = 4  # as time_limits.trace_instance builds the nodes
TARGET_S = 1.0  # the target for one re-plan, precompute included
BUDGET_S = 0.85  # the warm re-plan's budget_s: the target less room for the planner's overrun and noise


@dataclass(frozen=True)
class EventRun:
    """One event of a trace: the warm re-plan (wall seconds, median over the passes) and the cold plan
    given the same time."""

    event: str
    gpus: int
    warm_s: float
    warm_objective: float
    warm_source: str
    warm_repair_s: float  # of the same (last) pass: the running plan scored and repaired
    warm_planner_s: float  # the planner's call
    cold_s: float
    cold_objective: float


def scaled(n: int, scale: float) -> int:
    return int(round(n * scale / GPUS_PER_NODE)) * GPUS_PER_NODE


def trace_events(name: str, scale: float) -> tuple[dict, list[list[AvailabilityEvent]]]:
    """(counts for `trace_instance`, the trace's column changes: one list per row), scaled."""
    counts = {key: tuple(scaled(n, scale) for n in ns) for key, ns in TRACES[name].items()}
    rows = [[ev.model_copy(update={"available_gpus": scaled(ev.available_gpus, scale)}) for ev in row]
            for row in trace_rows(name, TRACES[name])]
    return counts, rows


def one_pass(inst, start: ClusterState, events: list[AvailabilityEvent], opts: ReplanOptions,
             first_limit_s: float) -> list[tuple[str, ClusterState, float, object, object]]:
    """(event, state, warm wall s, warm result, cold result) per event that changes the state. The
    session starts with the first plan, as a replay's or a supervisor's would."""
    session = ReplanSession()
    first = replace(opts, warm=False, budget_s=None, planner_time_limit_s=first_limit_s,
                    planner_combo_time_limit_s=max(opts.planner_combo_time_limit_s, 1.0))
    prev = replan(inst, None, start, first, session=session).plan
    state, out = start, []
    for ev in events:
        after = state.apply(ev)
        if after.available() == state.available():
            continue
        state = after
        t0 = perf_counter()
        warm = replan(inst, prev, state, opts, session=session)
        wall_s = perf_counter() - t0
        cold = replan(inst, None, state, replace(opts, warm=False, budget_s=wall_s,
                                                 planner_combo_time_limit_s=min(opts.planner_combo_time_limit_s,
                                                                                wall_s)))
        out.append((f"{ev.gpu_type}@{ev.zone}={ev.available_gpus}", state, wall_s, warm, cold))
        prev = warm.plan
    return out


def run_trace(name: str, model: str, scale: float, repeat: int, from_first_row: bool, opts: ReplanOptions,
              first_limit_s: float) -> dict:
    counts, rows = trace_events(name, scale)
    inst = trace_instance(name, counts, model)
    start = ClusterState.initial(inst)
    if from_first_row:
        start, rows = start.apply_all(rows[0]), rows[1:]
    events = [ev for row in rows for ev in row]
    load_before = os.getloadavg()[0]
    passes = [one_pass(inst, start, events, opts, first_limit_s) for _ in range(repeat)]
    runs = []
    for j, (event, state, _, warm, cold) in enumerate(passes[-1]):
        runs.append(EventRun(event, state.total_gpus, statistics.median(p[j][2] for p in passes),
                             warm.report.samples_per_s, warm.source, warm.repair_s, warm.planner_s, cold.latency_s,
                             cold.report.samples_per_s))
    every_s = [e[2] for p in passes for e in p]
    worse = sum(e[3].report.samples_per_s < e[4].report.samples_per_s * (1 - 1e-9) for p in passes for e in p)
    return {**summary(name, model, scale, runs), "replan_s_max_any_pass": max(every_s, default=0.0),
            "warm_worse_any_pass": worse, "passes": repeat, "load_1min": [load_before, os.getloadavg()[0]]}


def summary(name: str, model: str, scale: float, runs: list[EventRun]) -> dict:
    walls = [r.warm_s for r in runs]
    return {"trace": name, "model": model, "scale": scale, "events": len(runs),
            "max_gpus": max((r.gpus for r in runs), default=0),
            "replan_s_mean": statistics.fmean(walls) if walls else 0.0, "replan_s_max": max(walls, default=0.0),
            "events_within_1s": sum(w <= TARGET_S for w in walls),
            "objective": "samples_per_s, mean over the events",
            "warm_objective": statistics.fmean(r.warm_objective for r in runs) if runs else 0.0,
            "cold_objective": statistics.fmean(r.cold_objective for r in runs) if runs else 0.0,
            "warm_never_worse": all(r.warm_objective >= r.cold_objective * (1 - 1e-9) for r in runs),
            "trace_file": str(trace_path(name)) if trace_path(name).exists() else None,
            "per_event": [r.__dict__ for r in runs]}


def table(results: list[dict]) -> Table:
    out = Table(title=f"re-planning on Sailor's traces: warm re-plan wall s (target <= {TARGET_S:g} s) and "
                      f"samples/s, warm vs cold given the same time")
    for col in ("trace", "model", "events", "GPUs max", "re-plan s mean", "re-plan s max", "<= 1 s",
                "warm samples/s", "cold samples/s", "warm >= cold"):
        out.add_column(col, justify="left" if col in ("trace", "model") else "right")
    for r in results:
        out.add_row(r["trace"].removeprefix("gpu_trace_"), r["model"], str(r["events"]), str(r["max_gpus"]),
                    f"{r['replan_s_mean']:.3f}", f"{r['replan_s_max']:.3f}", f"{r['events_within_1s']}/{r['events']}",
                    f"{r['warm_objective']:.1f}", f"{r['cold_objective']:.1f}", str(r["warm_never_worse"]))
    return out


def event_table(r: dict) -> Table:
    out = Table(title=f"{r['trace']} per event")
    for col in ("event", "GPUs", "warm s", "repair s", "planner s", "warm samples/s", "source", "cold s",
                "cold samples/s"):
        out.add_column(col, justify="left" if col in ("event", "source") else "right")
    for e in r["per_event"]:
        out.add_row(e["event"], str(e["gpus"]), f"{e['warm_s']:.3f}", f"{e['warm_repair_s']:.3f}",
                    f"{e['warm_planner_s']:.3f}", f"{e['warm_objective']:.1f}", e["warm_source"],
                    f"{e['cold_s']:.3f}", f"{e['cold_objective']:.1f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=",".join(TRACES), help="comma-separated trace names")
    ap.add_argument("--models", default="OPT-350M,GPT-Neo-2.7B", help="comma-separated, as time_limits.py")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every GPU count (whole 4-GPU nodes)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over each trace; wall time: the median")
    ap.add_argument("--from-first-row", action="store_true", help="start from the trace's first row")
    ap.add_argument("--events", action="store_true", help="also print a table per trace, one row per event")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="the warm re-plan's budget_s (0: none, the "
                    "replay's planner limit)")
    ap.add_argument("--first-time-limit", type=float, default=ReplayOptions().initial_time_limit_s,
                    help="the planner's limit for the first plan (not timed)")
    ap.add_argument("--cutoff", action="store_true", help="the warm planner must beat the repair (planner_cutoff)")
    ap.add_argument("--no-beside", action="store_true", help="run the repair before the planner, not in a forked "
                    "child beside it (what one core gets; measures what the child is worth)")
    ap.add_argument("--json", action="store_true", help="one JSON object per trace, one per line")
    args = ap.parse_args(argv)
    if args.no_beside:
        import hetplan.orchestration.replan

        hetplan.orchestration.replan._Beside.start = classmethod(lambda cls, work: None)
    names = args.traces.split(",")
    unknown = sorted(set(names) - set(TRACES))
    if unknown or args.scale <= 0 or args.repeat < 1 or args.budget < 0 or args.first_time_limit <= 0:
        print(f"error: unknown traces {unknown} (choose from {sorted(TRACES)}), or --scale / --repeat / "
              f"--first-time-limit not positive, or --budget negative", file=sys.stderr)
        return 1
    try:
        opts = replace(ReplayOptions().replan, budget_s=args.budget or None, planner_cutoff=args.cutoff)
        results = [run_trace(name, model, args.scale, args.repeat, args.from_first_row, opts, args.first_time_limit)
                   for name in names for model in args.models.split(",")]
    except HetplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for r in results:
            print(json.dumps(r))
        return 0
    console = Console(width=200)
    console.print(table(results))
    if args.events:
        for r in results:
            console.print(event_table(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
