"""Does the time limit hold? Wall time of whole searches and re-plans against their limits (prints tables).

    python benchmarks/time_limits.py                      # both parts
    python benchmarks/time_limits.py --part solve --repeat 3
    python benchmarks/time_limits.py --part replan

solve   `hetplan.orchestration.planner.plan` on bundled instances (by default large_5type_10k at 1 s and 10 s,
        zorse_4type_2region at 2 s and 10 s): the call's own wall time, and (`--cli`) the whole
        `hetplan solve ... --json` process, imports and instance loading included. The planner
        promises wall <= 1.1 x limit + 1 s for the call.
replan  `hetplan.orchestration.replan.replan` as the replay calls it (ReplayOptions().replan: planner limit 0.3 s,
        MILP limit 0.25 s, 8 stages at most, no cutoff) at every state of Sailor's availability
        traces (`gpu_trace_heterogeneous_imbalanced.csv`: 32 + 96 / 80 + 240 / 128 + 384 A100-40 +
        V100-16; `gpu_trace_multizone.csv`: 32 / 80 / 128 A100-40 in each of five zones, 160 / 400 /
        640 GPUs), warm from the previous state's plan and cold. Reports the planner's seconds
        (`ReplanResult.planner_s`) against its limit, and the whole re-plan's latency. Without
        ../shared/reference/sailor the same counts are used.

Columns: limit, wall s (median of --repeat runs, and the max), wall / limit, whether
wall <= 1.1 limit + 1 s held in every run, the search status ("time_limit" when the limit cut it),
model objective, bound and gap.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hetplan.cluster_state import ClusterState, batches
from hetplan.errors import HetplanError
from hetplan.importers.sailor import read_availability_trace
from hetplan.instance import AvailabilityEvent, instance_from_dict, load_instance
from hetplan.orchestration.planner import PlannerOptions, plan
from hetplan.orchestration.replan import ReplanOptions, replan
from hetplan.orchestration.replay import ReplayOptions

REPO = Path(__file__).resolve().parents[1]
SOLVES = (("large_5type_10k", 1.0), ("large_5type_10k", 10.0), ("zorse_4type_2region", 2.0),
          ("zorse_4type_2region", 10.0))
PRICES = {"A100-40": 3.67, "V100-16": 2.80}  # as benchmarks/planner.py
# (name, {(GPU type, zone): GPUs per trace row}) when Sailor's traces are absent
TRACES = {
    "gpu_trace_heterogeneous_imbalanced": {("A100-40", "us-central1-a"): (32, 80, 128),
                                           ("V100-16", "us-central1-a"): (96, 240, 384)},
    "gpu_trace_multizone": {("A100-40", z): (32, 80, 128) for z in ("us-central1-a", "us-central1-b",
                                                                      "us-central1-c", "us-central1-f", "us-west1-b")},
}


def holds(wall_s: float, limit_s: float) -> bool:
    return wall_s <= 1.1 * limit_s + 1.0


# ---- whole searches ---------------------------------------------------------------------------------
def solve_rows(repeat: int, cli: bool) -> list[tuple]:
    rows = []
    for name, limit in SOLVES:
        inst = load_instance(name)
        walls, res, note = [], None, ""
        for _ in range(repeat):
            t0 = time.perf_counter()
            try:
                res = plan(inst, PlannerOptions(time_limit_s=limit))
            except HetplanError as exc:
                note = f"{type(exc).__name__}: {exc}"
            walls.append(time.perf_counter() - t0)
        process = [cli_wall(name, limit) for _ in range(repeat)] if cli else []
        rows.append((name, limit, walls, process, res, note))
    return rows


def cli_wall(name: str, limit: float) -> float:
    t0 = time.perf_counter()
    subprocess.run(["hetplan", "solve", name, "--time-limit", str(limit), "--json"], capture_output=True,
                   cwd=REPO, check=False)
    return time.perf_counter() - t0


def solve_table(rows: list[tuple]) -> Table:
    table = Table(title="plan(): wall time against the time limit (holds: wall <= 1.1 limit + 1 s)")
    for col in ("instance", "limit s", "wall s median / max", "wall / limit", "holds", "process s median / max",
                "status", "objective", "bound", "gap"):
        table.add_column(col, justify="left" if col in ("instance", "status") else "right")
    for name, limit, walls, process, res, note in rows:
        proc = f"{statistics.median(process):.2f} / {max(process):.2f}" if process else "-"
        figures = (note[:60], "-", "-", "-") if res is None else (
            getattr(res, "status", "-"), f"{res.model_objective:.5g}", f"{res.bound:.5g}", f"{100 * res.gap:.1f} %")
        table.add_row(name, f"{limit:g}", f"{statistics.median(walls):.2f} / {max(walls):.2f}",
                      f"{max(walls) / limit:.2f}", str(all(holds(w, limit) for w in walls)), proc, *figures)
    return table


# ---- re-plans ---------------------------------------------------------------------------------------
def trace_instance(name: str, counts: dict, model: str):
    groups = [{"name": f"{g}_{z}", "gpu_type": g, "gpus_per_node": 4, "count": max(n) // 4, "zone": z,
               "price_per_gpu_hour_usd": PRICES[g]} for (g, z), n in sorted(counts.items())]
    return instance_from_dict({"name": f"{name}-{model}", "cluster": {"node_groups": groups},
                               "workload": {"model": model, "global_batch_size": 2048, "precision": "fp16",
                                            "optimizer": "adam"}})


def trace_path(name: str) -> Path:
    """Sailor's trace CSV `name` under $HETPLAN_SHARED_DIR (default ../shared); it may be absent."""
    shared = Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared"))
    return shared / "reference" / "sailor" / "cluster" / f"{name}.csv"


def trace_rows(name: str, counts: dict) -> list[list[AvailabilityEvent]]:
    """The trace's availability changes, one list per row (Sailor's file when present, else `counts`)."""
    path = trace_path(name)
    if path.exists():
        return [events for _, events in batches(read_availability_trace(path, changes_only=True))]
    rows = len(next(iter(counts.values())))
    return [[AvailabilityEvent(time_s=600.0 * j, zone=z, gpu_type=g, available_gpus=n[j]) for (g, z), n in counts.items()]
            for j in range(rows)]


def trace_states(inst, name: str, counts: dict) -> list[ClusterState]:
    """The availability after each row of the trace (Sailor's file when present)."""
    state = ClusterState.initial(inst)
    out = []
    for events in trace_rows(name, counts):
        state = state.apply_all(events)
        out.append(state)
    return out


def replan_rows(models: list[str]) -> list[tuple]:
    ropts = ReplayOptions().replan
    rows = []
    for name, counts in TRACES.items():
        for model in models:
            inst = trace_instance(name, counts, model)
            prev = None
            for state in trace_states(inst, name, counts):
                for warm in (True, False):
                    opts = ropts if warm else ReplanOptions(**{**ropts.__dict__, "warm": False})
                    t0 = time.perf_counter()
                    try:
                        res = replan(inst, prev if warm else None, state, opts)
                    except HetplanError as exc:
                        rows.append((name, model, state.total_gpus, warm, None, time.perf_counter() - t0, str(exc)))
                        continue
                    rows.append((name, model, state.total_gpus, warm, res, time.perf_counter() - t0, ""))
                    if warm:
                        prev = res.plan
    return rows


def replan_table(rows: list[tuple], limit: float) -> Table:
    table = Table(title=f"replan(): planner seconds against its {limit:g} s limit (holds: <= 1.1 limit + 1 s)")
    for col in ("trace", "model", "GPUs", "start", "planner s", "planner / limit", "holds", "re-plan s", "source",
                "note"):
        table.add_column(col, justify="left" if col in ("trace", "model", "start", "source", "note") else "right")
    for name, model, gpus, warm, res, wall, note in rows:
        planner_s = res.planner_s if res is not None else float("nan")
        source, notes = (res.source, "; ".join(res.notes)) if res is not None else ("-", note)
        table.add_row(name.removeprefix("gpu_trace_"), model, str(gpus), "warm" if warm else "cold",
                      f"{planner_s:.3f}", f"{planner_s / limit:.2f}", str(holds(planner_s, limit)), f"{wall:.3f}",
                      source, notes[:50])
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("solve", "replan", "both"), default="both")
    ap.add_argument("--repeat", type=int, default=1, help="runs per search (the table shows median and max)")
    ap.add_argument("--cli", action="store_true", help="also time whole `hetplan solve` processes")
    ap.add_argument("--models", default="OPT-350M,GPT-Neo-2.7B", help="models of the re-plan part")
    args = ap.parse_args(argv)
    console = Console(width=200)
    if args.part in ("solve", "both"):
        console.print(solve_table(solve_rows(args.repeat, args.cli)))
    if args.part in ("replan", "both"):
        limit = ReplayOptions().replan.planner_time_limit_s
        console.print(replan_table(replan_rows(args.models.split(",")), limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
