"""One outer choice's MILP with its stages' block counts fixed: how good a plan each count vector
holds and how fast HiGHS finds it, beside the stage DP heuristic's plan (prints a table; `--json`
writes the rows).

    python benchmarks/fixed_counts.py large_5type_2k --choice 4,1,128 --cutoff 1.59 \\
        --counts 4,6,12,10 4,6,11,11 5,7,10,10 3,9,4,16

Max throughput, blocks form (identical blocks) only. The choice's inputs are the planner's
(`enumerate_combos`, `_prepare_one`, `with_sync_table`). A count vector gives, per stage, the
transformer blocks it holds (stage 0 also the embedding, the last stage also the head), P numbers
that add up to the model's blocks. For each vector the choice's MILP (`joint.build`, with
`--cutoff` as its time cutoff) is solved by HiGHS with `nb[i, n]` fixed to it: status, the plan's
iteration time in the model (`joint.evaluate`) and as placed by the simulator
(`joint.evaluate_placed`), build and solve seconds. The first row is the stage DP heuristic's plan
(`joint.dp_heuristic`, stages of one GPU class each) and its counts.

Why (issue #24's notes): on large_5type_2k the best plan of P4 b1 D128 mixes two GPU classes in
every stage; HiGHS on the whole choice needs ~500 s for it, the stage DP's plan is 2.26 s in the
model, and with the optimum's counts fixed HiGHS finds it in about 1.5 s. What is missing is a
way to find good counts.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hetplan.estimators import build_estimators
from hetplan.formulations import joint
from hetplan.orchestration.planner import PlannerOptions
from hetplan.orchestration.planner.inputs import _quotas, _Tables, enumerate_combos, with_sync_table
from hetplan.orchestration.planner.search import _prepare_one, _splittable_tps
from hetplan.solvers import SolveOptions, solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import cell, max_throughput_instance  # noqa: E402


def choice_inputs(instance, P: int, b: int, D: int) -> joint.JointInputs:
    """The planner's inputs of outer choice (P, b, D), with its all-reduce tables."""
    opts = _splittable_tps(instance, PlannerOptions())
    tables = _Tables(instance, build_estimators(instance))
    quotas = _quotas(instance, opts)
    combo = next((c for c in enumerate_combos(instance, quotas, opts) if (c.P, c.b, c.D) == (P, b, D)), None)
    if combo is None:
        raise SystemExit(f"fixed_counts: P{P} b{b} D{D} is not an outer choice of {instance.name}")
    item = _prepare_one(instance, tables, quotas, combo, "max_throughput", None, None, opts.tp_choices)
    if not isinstance(item, tuple):
        raise SystemExit(f"fixed_counts: P{P} b{b} D{D} has no inputs ({item.status})")
    inp = with_sync_table(item[6], tables)
    if not joint.blocks_identical(inp):
        raise SystemExit("fixed_counts: the model's blocks differ: block counts do not describe a layout")
    return inp


def check_counts(inp: joint.JointInputs, counts: tuple[int, ...]) -> str | None:
    """Why `counts` is not a layout of the choice, or None."""
    if len(counts) != inp.P:
        return f"{len(counts)} counts for {inp.P} stages"
    if sum(counts) != inp.U - 2:
        return f"the counts add up to {sum(counts)}, the model has {inp.U - 2} blocks"
    bad = [i for i, n in enumerate(counts) if n not in joint.block_counts(inp, i)]
    return None if not bad else f"stage {bad[0]} cannot hold {counts[bad[0]]} blocks"


def row_of(inp: joint.JointInputs, what: str, counts: tuple[int, ...], status: str,
           sol: joint.JointSolution | None, build_s: float, solve_s: float) -> dict:
    model = placed = None
    if sol is not None:
        model = joint.evaluate(inp, sol)["T"]
        placed = None if inp.sailor else joint.evaluate_placed(inp, sol)["T"]
    return {"what": what, "counts": list(counts), "status": status, "model_s": model, "simulated_s": placed,
            "build_s": build_s, "solve_s": solve_s}


def fixed_count_row(inp: joint.JointInputs, counts: tuple[int, ...], cutoff_s: float | None,
                    time_limit_s: float) -> dict:
    t0 = time.perf_counter()
    model = joint.build(inp, time_cutoff_s=cutoff_s)
    for (i, n) in model.nb:
        model.nb[i, n].fix(1 if counts[i] == n else 0)
    build_s = time.perf_counter() - t0
    res = solve(model, backend="highs", options=SolveOptions(time_limit_s=time_limit_s, rel_gap=1e-3,
                                                            diagnose_infeasible=False))
    sol = joint.decode(model, inp) if res.status.has_solution else None
    return row_of(inp, "MILP, counts fixed", counts, res.status.value, sol, build_s, res.build_s + res.solve_s)


def dp_row(inp: joint.JointInputs) -> dict:
    t0 = time.perf_counter()
    found = joint.dp_heuristic(inp, "max_throughput", None, None, joint.bottleneck_lower_bound_s(inp))
    seconds = time.perf_counter() - t0
    if found is None:
        return row_of(inp, "stage DP", (), "no plan", None, 0.0, seconds)
    return row_of(inp, "stage DP", tuple(joint.solution_blocks(inp, found[1])), "plan", found[1], 0.0, seconds)


def show(rows: list[dict], title: str) -> None:
    table = Table("plan", "block counts", "status", "model s", "simulated s", "build s", "solve s", title=title)
    for r in rows:
        table.add_row(r["what"], ",".join(map(str, r["counts"])), r["status"], cell(r["model_s"], ".5f"),
                      cell(r["simulated_s"], ".5f"), f"{r['build_s']:.2f}", f"{r['solve_s']:.2f}")
    Console(width=140).print(table)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"fixed_counts: {what} takes comma-separated integers, not {text!r}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instance", help="an instance file or a bundled instance's name")
    ap.add_argument("--choice", required=True, help="the outer choice P,b,D")
    ap.add_argument("--counts", nargs="+", default=[], help="block counts per stage, e.g. 4,6,12,10")
    ap.add_argument("--cutoff", type=float, help="the MILP's time cutoff (s): only plans at least this fast")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per MILP (default 60)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    return ap


def _refused(inp: joint.JointInputs, vectors: list[tuple[int, ...]], cutoff_s: float | None) -> str | None:
    """One line on what in the arguments is wrong, or None."""
    if cutoff_s is not None and not (math.isfinite(cutoff_s) and cutoff_s > 0):
        return f"--cutoff must be a positive number of seconds, not {cutoff_s}"
    for counts in vectors:
        why = check_counts(inp, counts)
        if why is not None:
            return f"--counts {','.join(map(str, counts))}: {why}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    instance = max_throughput_instance(args.instance, "fixed_counts")
    if instance is None:
        return 2
    P, b, D = _ints(args.choice, "--choice")
    inp = choice_inputs(instance, P, b, D)
    vectors = [_ints(c, "--counts") for c in args.counts]
    why = _refused(inp, vectors, args.cutoff)
    if why is not None:
        print(f"fixed_counts: {why}", file=sys.stderr)
        return 2
    rows = [dp_row(inp)] + [fixed_count_row(inp, counts, args.cutoff, args.time_limit) for counts in vectors]
    cut = "" if args.cutoff is None else f", cutoff {args.cutoff} s"
    show(rows, f"{instance.name} P{P} b{b} D{D}{cut}")
    if args.json:
        args.json.write_text(json.dumps({"instance": instance.name, "choice": [P, b, D], "cutoff_s": args.cutoff,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
