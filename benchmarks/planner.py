"""hetplan's joint planner against the Sailor baseline on scenarios shaped like Sailor's evaluation.

Scenarios follow Sailor (SOSP'25, seed 000) sec. 5.2-5.3: OPT-350M and GPT-Neo-2.7B, global batch
2048 sequences of 2048 tokens, Adam, fp16; A100-40 and V100-16 in 4-GPU VMs; A100 only with 32/64/128
GPUs (fig. 7); A100 + V100 with 32+96, 80+240, 128+384 (fig. 8b, 9b, Table 2); 2 zones of one region
with 128 A100 + 128 V100 each, min cost under 0.2 iterations/s (fig. 11) and max throughput under
1.2 USD per iteration (fig. 12); A100 in 5 zones of 2 regions (fig. 10); 1/2/3 GPU types of 256 each
in one zone (sec. 5.3, the third type A100-80).

With ../shared/reference/sailor present (or HETPLAN_SHARED_DIR/reference/sailor), instances come from
`hetplan.importers.sailor.sailor_instance_dict` with Sailor's measured profiles (time "profile", comm
"sailor_poly"); the 3-type scenarios and every scenario without the reference use hetplan's analytic
estimators on the same cluster (column `est`). Both planners use the same estimators (each search a
fresh set, so neither finds the other's caches warm); every plan is scored by
`hetplan.simulator.simulate`.

    python benchmarks/planner.py --quick                 # a few small scenarios, < 2 minutes
    python benchmarks/planner.py --time-limit 60         # all scenarios, 60 s per hetplan solve
    python benchmarks/planner.py --only neo27-het-32+96 --time-limit 120
    python benchmarks/planner.py --only opt350-geo-5zones-32 --no-baseline   # hetplan's search time only

Columns: search seconds of each planner, simulated iterations/s and samples/s, cost per iteration,
hetplan / baseline on the objective (throughput ratio, or cost ratio for min cost: > 1 means hetplan
is better), hetplan's proven gap over its modelled space, and OOM flags (baseline / hetplan). A
second table breaks hetplan's time down by outer choice (P, b, D), with the MILPs solved, whether
the plan came from a heuristic or a MILP, and how far below the simulated objective the model rates
the plan ("model under": the model is a relaxation of the simulator, formulations/joint/milp.py
"Relaxed"; where this is above the gap asked for, the gap reported is about that much).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.errors import HetplanError
from hetplan.estimators import build_estimators
from hetplan.instance import Instance, instance_from_dict, read_structured
from hetplan.orchestration.planner import PlannerOptions, plan as hetplan_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sailor_baseline import SailorOptions, sailor_search  # noqa: E402
from tables import cell, objective_ratio, print_rows, select  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BATCH = 2048  # sequences per iteration, Sailor sec. 5 "Models"
# Sailor's model names (profiles/, training/) and hetplan's presets
MODELS = {"opt350": ("OPT-350", "OPT-350M"), "neo27": ("GPT-Neo-2.7", "GPT-Neo-2.7B")}
# USD per GPU-hour: A100-40 and V100-16 as Sailor used (hetplan.importers.sailor); A100-80 is an
# assumption (GCP a2-ultragpu on-demand list price in us-central1, about 5.07 USD per GPU-hour).
PRICES = {"A100-40": 3.67, "V100-16": 2.80, "A100-80": 5.07}
GPUS_PER_VM = 4  # Sailor sec. 5.2: 4-GPU VMs for every type
# Sailor sec. 5.2.4 constraints (also in reference/sailor/cluster/ae_*.json)
MIN_ITERS_PER_S = 0.2
MAX_COST_USD = 1.2
Z1, Z2 = "us-central1-a", "us-central1-b"
FIVE_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b")


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str  # key of MODELS
    gpus: dict[tuple[str, str], int]  # (gpu type, zone) -> GPUs
    objective: str = "max_throughput"
    max_cost_usd: float | None = None
    min_iters_per_s: float | None = None
    profiles: bool = True  # use Sailor's measured profiles when the reference data is there
    quick: bool = False


def scenarios(ref: Path | None) -> list[Scenario]:
    min_its, budget = MIN_ITERS_PER_S, MAX_COST_USD
    if ref is not None:
        min_its = float(read_structured(ref / "cluster" / "ae_min_throughput_iters_per_s.json")[0])
        budget = float(read_structured(ref / "cluster" / "ae_max_budget_usd_per_iter.json")[0])
    out = [Scenario(f"opt350-a100-{n}", "opt350", {("A100-40", Z1): n}, quick=n == 32) for n in (32, 64, 128)]
    for model in ("opt350", "neo27"):
        for a, v in ((32, 96), (80, 240), (128, 384)):
            out.append(Scenario(f"{model}-het-{a}+{v}", model, {("A100-40", Z1): a, ("V100-16", Z1): v},
                                quick=(model, a) == ("opt350", 32)))
    two_zones = {(g, z): 128 for g in ("A100-40", "V100-16") for z in (Z1, Z2)}
    out.append(Scenario("opt350-2zones-mincost", "opt350", two_zones, "min_cost", min_iters_per_s=min_its))
    out.append(Scenario("opt350-2zones-budget", "opt350", two_zones, max_cost_usd=budget))
    small_two = {(g, z): 32 for g in ("A100-40", "V100-16") for z in (Z1, Z2)}
    out.append(Scenario("opt350-2zones-small-mincost", "opt350", small_two, "min_cost",
                        min_iters_per_s=min_its / 4, quick=True))
    for n in (32, 80):
        out.append(Scenario(f"opt350-geo-5zones-{n}", "opt350", {("A100-40", z): n for z in FIVE_ZONES},
                            quick=n == 32))
    types = ("A100-40", "V100-16", "A100-80")
    for k in (1, 2, 3):
        out.append(Scenario(f"neo27-types-{k}", "neo27", {(g, Z1): 256 for g in types[:k]}, profiles=False))
    return out


# ---- instances ----------------------------------------------------------------------------------------
def reference_dir() -> Path | None:
    shared = Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared"))
    ref = shared / "reference" / "sailor"
    return ref if (ref / "profiles").is_dir() else None


def _node_groups(gpus: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    return [{"name": f"{g}_{z}", "gpu_type": g, "gpus_per_node": GPUS_PER_VM, "count": n // GPUS_PER_VM,
             "zone": z, "price_per_gpu_hour_usd": PRICES[g]} for (g, z), n in sorted(gpus.items())]


def build_instance(sc: Scenario, ref: Path | None) -> tuple[Instance, str]:
    """The scenario's instance and which estimators it uses ("profile" or "analytic")."""
    constraints = {k: v for k, v in (("max_cost_per_iteration_usd", sc.max_cost_usd),
                                     ("min_throughput_iters_per_s", sc.min_iters_per_s)) if v is not None}
    types = sorted({g for g, _ in sc.gpus})
    zones = sorted({z for _, z in sc.gpus})
    sailor_name, preset = MODELS[sc.model]
    if ref is not None and sc.profiles:
        from hetplan.importers.sailor import sailor_instance_dict

        data = sailor_instance_dict(ref, sailor_name, gpu_types=types, zones=zones, name=sc.name,
                                    global_batch_size=BATCH, objective=sc.objective, constraints=constraints,
                                    prices=PRICES)
        data["cluster"]["node_groups"] = _node_groups(sc.gpus)
        return instance_from_dict(data), "profile"
    data = {
        "name": sc.name,
        "cluster": {"node_groups": _node_groups(sc.gpus)},
        "workload": {"model": preset, "global_batch_size": BATCH, "precision": "fp16", "optimizer": "adam"},
        "objective": {"kind": sc.objective},
        "constraints": constraints,
    }
    if ref is not None:  # same egress prices as the profiled scenarios
        from hetplan.importers.sailor import read_egress_prices

        egress = read_egress_prices(ref / "network" / "communication_cost_gcp_usd_per_GB.json")
        data["cluster"]["network"] = {"egress": egress.model_dump()}
    return instance_from_dict(data), "analytic"


# ---- one scenario ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    search_s: float | None
    iters_per_s: float | None = None
    samples_per_s: float | None = None
    cost_usd: float | None = None
    gpus: int | None = None
    oom: bool | None = None
    shape: str = ""
    gap: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def _from_report(rep, search_s: float, shape: str) -> Outcome:
    return Outcome(search_s, rep.iters_per_s, rep.samples_per_s, rep.cost_per_iteration_usd, rep.num_gpus,
                   bool(rep.oom_ranks), shape)


def run_baseline(inst: Instance, est, sc: Scenario, time_limit_s: float | None) -> Outcome:
    gc.collect()
    t0 = time.perf_counter()
    try:
        res = sailor_search(inst, est, sc.objective, sc.max_cost_usd, sc.min_iters_per_s,
                            SailorOptions(time_limit_s=time_limit_s))
    except HetplanError as exc:
        return Outcome(time.perf_counter() - t0, note=f"baseline: {type(exc).__name__}")
    md = res.plan.metadata
    out = _from_report(res.report, res.search_s, f"P{md['P']} b{md['b']} D{md['D']}")
    out.note = "baseline timed out" if res.timed_out else ""
    out.extra = {"candidates": len(res.candidates), "dp_calls": res.dp_calls, "stage_evals": res.stage_evals}
    return out


def run_hetplan(inst: Instance, est, sc: Scenario, time_limit_s: float, workers: int = 2,
                concurrent_milps: int = 2, beyond_model: bool = True) -> Outcome:
    gc.collect()  # what earlier scenarios left is not this search's garbage (as in a fresh `hetplan solve`)
    t0 = time.perf_counter()
    try:
        res = hetplan_plan(inst, PlannerOptions(objective=sc.objective, max_cost_usd=sc.max_cost_usd,
                                                min_iters_per_s=sc.min_iters_per_s, time_limit_s=time_limit_s,
                                                workers=workers, concurrent_milps=concurrent_milps,
                                                beyond_model=beyond_model), est)
    except HetplanError as exc:
        return Outcome(time.perf_counter() - t0, note=f"hetplan: {type(exc).__name__}: {str(exc)[:80]}")
    md = res.plan.metadata
    out = _from_report(res.report, res.wall_s, f"P{md['P']} b{md['b']} D{md['D']}")
    out.gap = res.gap
    solved = [r for r in res.records if r.status.startswith("solved")]
    slow = sorted(solved, key=lambda r: -(r.build_s + r.solve_s))[:3]
    out.extra = {
        "combos": res.combos_total, "solved": res.combos_solved, "pruned": res.combos_pruned,
        "skipped_time": sum(r.status == "skipped_time" for r in res.records),
        # stopped by their own limit (CPU seconds when MILPs solve side by side, so not read off solve_s)
        "at_limit": sum(r.status in ("solved:feasible", "solved:time_limit_no_solution") for r in solved),
        "no_solution": sum(r.status == "solved:time_limit_no_solution" for r in solved),
        "build_s": res.build_s, "solve_s": res.solve_s,
        "slowest": [f"P{r.P} b{r.b} D{r.D} {r.build_s + r.solve_s:.1f}s {r.status.split(':')[-1]}" for r in slow],
        "greedy": res.greedy_objective, "model_objective": res.model_objective, "plan_from": res.plan_source,
        "model_estimate": res.model_estimate,
    }
    return out


def ratio(sc: Scenario, base: Outcome, het: Outcome) -> float | None:
    """> 1: hetplan better on the objective."""
    return objective_ratio(sc.objective, base, het)


# ---- output ---------------------------------------------------------------------------------------------
def print_tables(rows: list[tuple[Scenario, str, Outcome, Outcome]]) -> None:
    head = ("scenario", "est", "obj", "base s", "het s", "base it/s", "het it/s", "base smp/s", "het smp/s",
            "base $/it", "het $/it", "het/base", "het gap", "OOM b/h", "base shape", "het shape", "GPUs b/h", "notes")
    table = []
    for sc, est_kind, base, het in rows:
        oom = f"{'-' if base.oom is None else int(base.oom)}/{'-' if het.oom is None else int(het.oom)}"
        table.append((sc.name, est_kind, "cost" if sc.objective == "min_cost" else "thr",
                      cell(base.search_s, ".2f"), cell(het.search_s, ".2f"), cell(base.iters_per_s, ".4f"),
                      cell(het.iters_per_s, ".4f"), cell(base.samples_per_s, ".1f"), cell(het.samples_per_s, ".1f"),
                      cell(base.cost_usd, ".3f"), cell(het.cost_usd, ".3f"), cell(ratio(sc, base, het), ".3f"),
                      "-" if het.gap is None else f"{100 * het.gap:.1f}%", oom, base.shape, het.shape,
                      f"{cell(base.gpus, 'd')}/{cell(het.gpus, 'd')}", "; ".join(x for x in (base.note, het.note) if x)))
    print_rows(head, table)
    print()
    head2 = ("scenario", "combos", "MILPs", "plan from", "model under", "pruned", "skipped", "at limit", "no sol",
             "build s", "solve s", "slowest outer choices (build + solve)", "base DP calls", "base sims")
    table2 = []
    for sc, _, base, het in rows:
        e, b = het.extra, base.extra
        if not e:
            continue
        under = 1 - e["model_estimate"] / e["model_objective"]  # a rounding's -0.00 % reads as 0.00 %
        table2.append((sc.name, str(e["combos"]), str(e["solved"]), e["plan_from"],
                       f"{100 * under if abs(under) > 1e-12 else 0.0:.2f}%", str(e["pruned"]),
                       str(e["skipped_time"]), str(e["at_limit"]), str(e["no_solution"]), f"{e['build_s']:.1f}",
                       f"{e['solve_s']:.1f}",
                       " | ".join(e["slowest"]), str(b.get("dp_calls", "-")), str(b.get("candidates", "-"))))
    print_rows(head2, table2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the small scenarios (< 2 minutes)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds per hetplan solve (default 15 with --quick, else 60)")
    ap.add_argument("--baseline-time-limit", type=float, default=600.0, help="seconds for one baseline search")
    ap.add_argument("--only", default=None, help="comma-separated scenario names")
    ap.add_argument("--no-baseline", action="store_true",
                    help="hetplan's search only (timing runs: the baseline's minutes are not spent)")
    ap.add_argument("--workers", type=int, default=2,
                    help="hetplan's processes (2: a forked helper refines bounds ahead of the search; 1: none)")
    ap.add_argument("--concurrent-milps", type=int, default=2,
                    help="hetplan's MILPs solving at once, each in a thread (1: one after another)")
    ap.add_argument("--no-beyond-model", action="store_true",
                    help="hetplan stops at its model's own gap (PlannerOptions.beyond_model off)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)
    ref = reference_dir()
    chosen = scenarios(ref)
    if args.list:
        for sc in chosen:
            print(f"{sc.name:28s} {'quick' if sc.quick else '':5s} {sc.objective} {dict(sc.gpus)}")
        return 0
    if args.only:
        chosen = select(chosen, args.only, "; see --list")
        if chosen is None:
            return 2
    elif args.quick:
        chosen = [sc for sc in chosen if sc.quick]
    limit = args.time_limit if args.time_limit is not None else (15.0 if args.quick else 60.0)
    print(f"reference data: {ref or 'absent (analytic estimators)'}; hetplan time limit {limit:g} s per solve; "
          f"baseline limit {args.baseline_time_limit:g} s", flush=True)
    rows = []
    for sc in chosen:
        inst, est_kind = build_instance(sc, ref)
        # each planner gets its own estimators: a set warmed by one search would speed up the other
        base = (Outcome(None, note="baseline not run") if args.no_baseline else
                run_baseline(inst, build_estimators(inst), sc, args.baseline_time_limit))
        het = run_hetplan(inst, build_estimators(inst), sc, limit, args.workers, args.concurrent_milps,
                          not args.no_beyond_model)
        print(f"  {sc.name}: baseline {cell(base.search_s, '.1f')} s {base.shape} it/s={cell(base.iters_per_s, '.4f')}"
              f" | hetplan {het.search_s:.1f} s {het.shape} it/s={cell(het.iters_per_s, '.4f')} {het.note}", flush=True)
        rows.append((sc, est_kind, base, het))
    print()
    print_tables(rows)
    if args.json:
        Path(args.json).write_text(json.dumps([{"scenario": sc.name, "est": k, "baseline": b.__dict__,
                                                "hetplan": h.__dict__} for sc, k, b, h in rows], indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
