"""Which bounds hold a search back: every outer choice's bound at a target, and which family of
bounds holds each choice that stays under it (prints a table; `--json` writes the rows).

    python benchmarks/bound_census.py large_5type_2k --objective 1.59016   # target: 1 % under it
    python benchmarks/bound_census.py INSTANCE --target 1.5742 [--only 4,1,128 ...] [--json out.json]

Max throughput only. The outer choices and their inputs are the planner's (`enumerate_combos`,
`_prepare_one`). For each choice: its cheap bound (`joint.time_lower_bound_s`, what the search
queues it with); where that is under the target, the larger of its medium and strongest bounds
at the target (`steps._tight_bound`, as the search's refinement steps compute them); and, for a
choice still under the target, every family of bounds that falls short of it there:

  merged          the bound of the choice's inputs with every region merged
  ends apart      plans with their first and last stage in different regions (hetplan's
                  composition: `region_split_time_bound_s`'s crossing bounds)
  two crossings   plans over several regions with both ends in one
  crossing        plans over two regions in Sailor's composition (`sailor_crossing_time_bound_s`)
  REGION alone    the plans inside that region (its inputs alone)

With one region the family is "merged". A choice counts in every family that falls short; the
search can only close it when all of them reach the target, or by its MILP. Times are one
process, the choices in enumeration order (the search shares them between two).
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
from hetplan.formulations.joint.bounds import parts, regions, sync_aware, tight
from hetplan.instance import Instance
from hetplan.orchestration.planner import PlannerOptions
from hetplan.orchestration.planner.inputs import _quotas, _Tables, enumerate_combos, with_sync_table
from hetplan.orchestration.planner.search import _prepare_one, _splittable_tps
from hetplan.orchestration.planner.steps import _tight_bound

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import max_throughput_instance  # noqa: E402


def families_short(inp, target_s: float) -> list[str]:
    """The families of bounds (module docstring) that fall short of `target_s` on one choice."""
    subs = parts._region_inputs(inp) if len(inp.regions) > 1 else {}
    if not subs:
        return ["merged"]
    out = []
    if inp.sailor:
        if regions.sailor_crossing_time_bound_s(inp, target_s, receivers=True) < target_s:
            out.append("crossing")
        alone = {r: tight.time_lower_bound_tight_s(sub, True, target_s, True) for r, sub in subs.items()}
    else:
        merged = sync_aware._time_lower_bound_merged_s(inp, True, target_s, True)
        ends_apart, two_crossings = regions._crossing_bounds_s(inp, merged, target_s, True)
        out += [name for name, v in (("ends apart", ends_apart), ("two crossings", two_crossings)) if v < target_s]
        alone = {r: sync_aware._time_lower_bound_merged_s(sub, True, target_s, True) for r, sub in subs.items()}
    return out + [f"{r} alone" for r, v in alone.items() if v < target_s]


def census(instance: Instance, target_s: float, only: set[tuple[int, int, int]] | None = None) -> list[dict]:
    """One row per outer choice that has inputs: P, b, D, the cheap bound, the refined bound (None
    where the cheap one reaches the target), the families short of the target, seconds."""
    opts = _splittable_tps(instance, PlannerOptions())
    tables = _Tables(instance, build_estimators(instance))
    quotas = _quotas(instance, opts)
    rows = []
    for combo in enumerate_combos(instance, quotas, opts):
        if only is not None and (combo.P, combo.b, combo.D) not in only:
            continue
        item = _prepare_one(instance, tables, quotas, combo, "max_throughput", None, None, opts.tp_choices)
        if not isinstance(item, tuple):  # no pools, or no layout
            continue
        t0 = time.perf_counter()
        cheap, inp, bound, short = float(item[0]), item[6], None, []
        if cheap < target_s:
            inp = with_sync_table(inp, tables)
            bound = max(cheap, _tight_bound(inp, "max_throughput", None, exact=False),
                        _tight_bound(inp, "max_throughput", None, target_s, exact=True, strongest=True))
            if bound < target_s:
                short = families_short(inp, target_s)
        rows.append({"P": combo.P, "b": combo.b, "D": combo.D, "cheap_s": cheap, "bound_s": bound,
                     "short": short, "seconds": time.perf_counter() - t0})
    return rows


def summary(rows: list[dict], target_s: float) -> dict:
    under = [r for r in rows if r["bound_s"] is not None and r["bound_s"] < target_s]
    counts: dict[str, int] = {}
    for r in under:
        for name in r["short"]:
            counts[name] = counts.get(name, 0) + 1
    least = min(under, key=lambda r: r["bound_s"], default=None)
    return {"choices": len(rows), "cheap_under": sum(r["bound_s"] is not None for r in rows),
            "under": len(under), "least": least, "families": counts, "seconds": sum(r["seconds"] for r in rows)}


def show(rows: list[dict], target_s: float, top: int, objective_s: float | None = None) -> None:
    s = summary(rows, target_s)
    console = Console(width=140)
    console.print(f"target {target_s:.6g} s: {s['choices']} outer choices, {s['cheap_under']} with a cheap bound "
                  f"under it, {s['under']} under it after the strongest bound ({s['seconds']:.1f} s, one process)")
    if s["least"] is not None:
        r = s["least"]
        gap = "" if objective_s is None else f": a gap of {1 - r['bound_s'] / objective_s:.2%} against the objective"
        console.print(f"least bound {r['bound_s']:.6g} s (P{r['P']} b{r['b']} D{r['D']}){gap}")
    console.print("short of the target: " + (", ".join(f"{k} {v}" for k, v in sorted(s["families"].items()))
                                             or "none"))
    table = Table("P", "b", "D", "cheap s", "bound s", "short of the target", "seconds")
    under = sorted((r for r in rows if r["short"]), key=lambda r: r["bound_s"])
    for r in under[:top]:
        table.add_row(str(r["P"]), str(r["b"]), str(r["D"]), f"{r['cheap_s']:.4f}", f"{r['bound_s']:.4f}",
                      ", ".join(r["short"]), f"{r['seconds']:.2f}")
    console.print(table)


def _choices(text: list[str] | None) -> set[tuple[int, int, int]] | None:
    if not text:
        return None
    out = set()
    for t in text:
        try:
            P, b, D = (int(x) for x in t.split(","))
        except ValueError:
            raise SystemExit(f"bound_census: --only takes P,b,D (three integers), not {t!r}")
        out.add((P, b, D))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instance", help="an instance file or a bundled instance's name")
    goal = ap.add_mutually_exclusive_group(required=True)
    goal.add_argument("--target", type=float, help="the iteration time (s) to rule out")
    goal.add_argument("--objective", type=float, help="a plan's iteration time (s): the target is rel-gap under it")
    ap.add_argument("--rel-gap", type=float, default=0.01)
    ap.add_argument("--only", nargs="*", help="outer choices P,b,D (all by default)")
    ap.add_argument("--top", type=int, default=20, help="rows of the table (least bound first)")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary here")
    args = ap.parse_args(argv)
    instance = max_throughput_instance(args.instance, "bound_census")
    if instance is None:
        return 2
    target = args.target if args.target is not None else args.objective * (1 - args.rel_gap)
    if not (math.isfinite(target) and target > 0):
        print(f"bound_census: the target must be a positive number of seconds, not {target}", file=sys.stderr)
        return 2
    rows = census(instance, target, _choices(args.only))
    show(rows, target, args.top, args.objective)
    if args.json:
        s = summary(rows, target)
        args.json.write_text(json.dumps({"target_s": target, "summary": s, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
