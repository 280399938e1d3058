"""The joint planner against the enumerated optimum on random small instances, with and without going
past its model (prints a table).

    python benchmarks/planner_campaign.py [--sweeps fast,slow,mixed] [--seeds 40] [--first 0] [--json]

Instances are those of tests/test_cost_model_agreement.py (`SWEEPS`): "fast", 2-3 GPU types on at
most 6 GPUs, OPT-350M cut to 2-3 blocks; "slow", at most 8 GPUs and 4 blocks; "mixed", nodes of one
type and zone on different intra-node links. Each instance gets the four runs of that file (`runs`:
both objectives, alone and under a budget / throughput floor that binds), and each run is planned
twice, `PlannerOptions(beyond_model=False)` (the model's own gap) and the default (past the model:
orchestration/planner/search.py `_beyond_the_model`), in one process (workers=1), P < U. Every plan
of the space is enumerated and simulated (tests/_plan_enumerator.py), so each run has its optimum.

Columns per (sweep, mode): runs; "complete" ones; of those, how many end above the 1 % gap with no
choice left open past the model ("above gap") and with choices left open ("open"); plans more than
1 % above the optimum ("over 1 %", and the largest excess); bounds above the optimum ("bad bound",
which must be 0); the planner's seconds, in all and the slowest run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _plan_enumerator import optimum  # noqa: E402
from tables import print_rows  # noqa: E402
from test_cost_model_agreement import (BOUND_TOL, FAST_SEEDS, MIXED_SEEDS, SLOW_SEEDS, SWEEPS, runs,  # noqa: E402
                                       scored, solve)

from hetplan.errors import HetplanError  # noqa: E402
from hetplan.orchestration.planner import PlannerOptions  # noqa: E402

GAP = PlannerOptions.rel_gap  # the gap the runs ask for (the default)
FIRST_SEED = {"fast": FAST_SEEDS.start, "slow": SLOW_SEEDS.start, "mixed": MIXED_SEEDS.start}  # the tests' ranges


@dataclass
class Outcome:
    sweep: str
    seed: int
    run: str
    beyond_model: bool
    status: str
    gap: float | None = None
    over: float | None = None  # the plan's objective / the optimum - 1
    bound_ok: bool = True
    open_past_model: int | None = None
    wall_s: float = 0.0


def one(sweep: str, seed: int) -> list[Outcome]:
    inst, items = scored(seed, sweep)
    out = []
    for run in runs(items):
        best = optimum(items, run.objective, run.max_cost, run.min_its)
        name = run.objective + ("" if run.max_cost is None and run.min_its is None else " (limit)")
        for beyond in (False, True):
            t0 = time.perf_counter()
            try:
                res = solve(inst, run, beyond_model=beyond)
            except HetplanError as exc:
                out.append(Outcome(sweep, seed, name, beyond, f"error: {type(exc).__name__}",
                                   wall_s=time.perf_counter() - t0))
                continue
            got = res.report.cost_per_iteration_usd if run.objective == "min_cost" else res.report.iteration_time_s
            opt = best.objective(run.objective)
            out.append(Outcome(sweep, seed, name, beyond, res.status, res.gap, got / opt - 1,
                               res.bound <= opt * (1 + BOUND_TOL), res.open_past_model, res.wall_s))
    return out


def table(rows: list[Outcome]) -> None:
    head = ("sweep", "mode", "runs", "complete", "above gap", "open", "over 1 %", "max over", "bad bound",
            "errors", "planner s", "slowest s")
    lines = []
    for sweep in dict.fromkeys(r.sweep for r in rows):
        for beyond in (False, True):
            rs = [r for r in rows if r.sweep == sweep and r.beyond_model == beyond]
            done = [r for r in rs if r.status == "complete"]
            over = [r.over for r in rs if r.over is not None]
            lines.append((sweep, "past the model" if beyond else "model only", str(len(rs)), str(len(done)),
                          str(sum(1 for r in done if r.gap > GAP + BOUND_TOL and not r.open_past_model)),
                          str(sum(1 for r in done if r.open_past_model)),
                          str(sum(1 for x in over if x > GAP)), f"{100 * max(over, default=0):.2f} %",
                          str(sum(1 for r in rs if not r.bound_ok)),
                          str(sum(1 for r in rs if r.status.startswith("error"))),
                          f"{sum(r.wall_s for r in rs):.1f}", f"{max((r.wall_s for r in rs), default=0):.2f}"))
    print_rows(head, lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweeps", default="fast,mixed", help=f"comma-separated, of {', '.join(SWEEPS)}")
    ap.add_argument("--seeds", type=int, default=40, help="instances per sweep")
    ap.add_argument("--first", type=int, default=None,
                    help="first seed (default: the sweep's own range in the tests: "
                         + ", ".join(f"{k} {v}" for k, v in FIRST_SEED.items()) + ")")
    ap.add_argument("--json", action="store_true", help="print every run as JSON instead of the table")
    args = ap.parse_args(argv)
    sweeps = args.sweeps.split(",")
    if unknown := [s for s in sweeps if s not in SWEEPS]:
        print(f"--sweeps: unknown {', '.join(unknown)} (known: {', '.join(SWEEPS)})", file=sys.stderr)
        return 2
    rows = []
    for sweep in sweeps:
        first = args.first if args.first is not None else FIRST_SEED[sweep]
        for seed in range(first, first + args.seeds):
            rows += one(sweep, seed)
            print(f"  {sweep} {seed}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
