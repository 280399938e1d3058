"""hetplan against the real Sailor planner, both plans scored by Sailor's own simulator.

Sailor (eth-easl/sailor cf2c8e3, MIT) is built from ../shared/reference/sailor/src:

    apt-get install -y libjsoncpp-dev && pip install pybind11 numpy pandas
    bash ../shared/reference/sailor/src/build.sh /tmp/sailor_build
    python benchmarks/sailor_real.py --sailor-build /tmp/sailor_build [--only NAME,...] [--json] [--cli]

`--cli` also times the user's end to end on each scenario: a `hetplan solve` process on the
scenario's instance file, from its start to its exit with the plan written.

Scenarios: the 17 of the Sailor-fidelity check (issue #20), named as in
../shared/reference/sailor/golden (meta.clusters): A100-40 / V100-16 in 4-GPU VMs; OPT-350 (global
batch 1024) and GPT-Neo-2.7 (2048) as Sailor's training configs say; 1, 2 and 5 zones, 2 regions;
budgets (USD per iteration) and throughput floors (iterations/s); fp32 as in Sailor's evaluation.

Real Sailor, as its `simulations/simulator.py` `evaluate_trace_with_mem` runs it: `libplanner.SailorPlanner`
is constructed (its precompute, timed apart) with the quotas of the scenario, `get_sorted_plans(quotas,
max_cost, min_throughput)` is the search; the chosen plan is the first of the sorted list that
`Simulator.check_config_fits` accepts and whose simulated cost (throughput scenarios) or throughput
(min-cost scenarios) meets the limit. Each plan is scored by Sailor's `Simulator.simulate_iteration_time`
(cost per iteration = GPUs x price / 3600 x T_iter + egress, as `simulate_plan` computes it).

hetplan: the instance of `sailor_instance_dict(..., preset="sailor")` (Sailor's profiles, memory model,
bandwidth fits and prices), searched by `hetplan.orchestration.planner.plan`, whose result is scored by hetplan's
sailor iteration model (simulator/sailor.py, equal to Sailor's simulator on the 252 golden records)
and, when the plan has Sailor's form, by Sailor's Simulator too (column `check`: the larger relative
difference of the two scores of each plan).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetplan.errors import HetplanError
from hetplan.estimators import build_estimators
from hetplan.files import stdout_fd_to
from hetplan.importers.sailor import sailor_instance_dict
from hetplan.importers.sailor_plan import plan_from_sailor, plan_to_sailor
from hetplan.instance import Instance, instance_from_dict
from hetplan.orchestration.planner import PlannerOptions, plan as hetplan_plan
from hetplan.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import cell, objective_ratio, print_rows, select  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
Z = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b")
TRAINING = {"OPT-350": "training_config_opt_350.json", "GPT-Neo-2.7": "training_config_gpt_neo27.json"}


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str  # Sailor's model name
    gpus: dict[tuple[str, str], int]  # (GPU type, zone) -> GPUs
    objective: str = "max_throughput"
    max_cost_usd: float | None = None
    min_iters_per_s: float | None = None


def scenarios() -> list[Scenario]:
    a, v, opt, neo = "A100-40", "V100-16", "OPT-350", "GPT-Neo-2.7"
    het2z = {(g, z): 128 for g in (a, v) for z in Z[:2]}
    return [
        Scenario("a_opt350_a100_32", opt, {(a, Z[0]): 32}),
        Scenario("a_opt350_a100_64", opt, {(a, Z[0]): 64}),
        Scenario("a_opt350_a100_128", opt, {(a, Z[0]): 128}),
        Scenario("b_OPT-350_a32_v96", opt, {(a, Z[0]): 32, (v, Z[0]): 96}),
        Scenario("b_OPT-350_a128_v384", opt, {(a, Z[0]): 128, (v, Z[0]): 384}),
        Scenario("b_GPT-Neo-2.7_a32_v96", neo, {(a, Z[0]): 32, (v, Z[0]): 96}),
        Scenario("b_GPT-Neo-2.7_a128_v384", neo, {(a, Z[0]): 128, (v, Z[0]): 384}),
        Scenario("c_opt350_a100_5zones_32each", opt, {(a, z): 32 for z in Z}),
        Scenario("c_gptneo_a100_5zones_32each", neo, {(a, z): 32 for z in Z}),
        Scenario("c_opt350_a100_2zones_64each", opt, {(a, z): 64 for z in Z[:2]}),
        Scenario("c_opt350_a100_2regions_64each", opt, {(a, Z[0]): 64, (a, Z[4]): 64}),
        Scenario("c_opt350_het_2zones_128x4", opt, het2z),
        Scenario("d_opt350_a100_128_mincost_minthr0.2", opt, {(a, Z[0]): 128}, "min_cost", min_iters_per_s=0.2),
        Scenario("d_opt350_a100_128_maxthr_budget0.3", opt, {(a, Z[0]): 128}, max_cost_usd=0.3),
        Scenario("d_opt350_het_32_96_maxthr_budget0.5", opt, {(a, Z[0]): 32, (v, Z[0]): 96}, max_cost_usd=0.5),
        Scenario("d_fig11_opt350_het2z_mincost_minthr0.2", opt, het2z, "min_cost", min_iters_per_s=0.2),
        Scenario("d_fig12_opt350_het2z_maxthr_budget1.2", opt, het2z, max_cost_usd=1.2),
    ]


# ---- Sailor, built ------------------------------------------------------------------------------------
class RealSailor:
    def __init__(self, build: Path):
        self.root = build / "sailor"  # build.sh copies the tree to DEST/sailor
        self.planner_dir = self.root / "sailor" / "Planner"
        lib = self.planner_dir / "sailor_planner" / "cpp_src"
        if not any(lib.glob("libplanner*.so")):
            raise SystemExit(f"no libplanner*.so under {lib}: run build.sh {build} first")
        os.environ["SAILOR_PATH"] = str(build)
        sys.path[:0] = [str(lib), str(self.root)]
        import libplanner  # noqa: F401 - the built planner
        from sailor.Planner.simulations.runtime_simulator import Simulator

        self.lib, self.Simulator, self.build = libplanner, Simulator, build
        self.llm_info = json.loads((self.planner_dir / "llm_info.json").read_text())
        self.profiles = json.loads((self.planner_dir / "simulations" / "profiles_tmp.json").read_text())
        self.prices = {"A100-40": 3.673385, "V100-16": 2.859998}  # simulations/constants.py GPU_PRICES

    def training(self, model: str) -> dict[str, Any]:
        return json.loads((self.planner_dir / "simulations" / "configs" / TRAINING[model]).read_text())

    def simulator(self, model: str):
        return self.Simulator(str(self.build), self.training(model), self.llm_info, False, self.profiles,
                              zone=Z[0])

    def search(self, sc: Scenario) -> tuple[list[dict[str, Any]], float, float]:
        """Sailor's sorted plans, its precompute seconds and its search seconds."""
        quotas: dict[str, dict[str, int]] = {}
        for (g, z), n in sc.gpus.items():
            quotas.setdefault(g, {})[z] = n
        by_zone: dict[str, dict[str, int]] = {}
        for (g, z), n in sc.gpus.items():
            by_zone.setdefault(z, {})[g] = n
        with tempfile.TemporaryDirectory() as tmp:
            qpath = Path(tmp) / "quotas.json"
            qpath.write_text(json.dumps(quotas))
            with open(os.devnull, "w") as null, stdout_fd_to(null.fileno()):
                t0 = time.perf_counter()
                planner = self.lib.SailorPlanner(
                    f"{self.planner_dir}/sailor_planner/profiles/{sc.model}/",
                    str(self.root / "sailor" / "providers" / "multizone_bandwidths_het.json"),
                    str(self.planner_dir / "simulations" / "configs" / TRAINING[sc.model]),
                    str(self.planner_dir / "llm_info.json"),
                    str(self.root / "sailor" / "providers" / "gcp" / "communication_cost.json"),
                    True, False, str(qpath), "throughput" if sc.objective == "max_throughput" else "iteration_cost")
                t1 = time.perf_counter()
                configs = planner.get_sorted_plans(by_zone, sc.max_cost_usd or 0.0, sc.min_iters_per_s or 0.0)
                t2 = time.perf_counter()
        return [self._plan_dict(c, sorted(quotas)) for c in configs], t1 - t0, t2 - t1

    @staticmethod
    def _plan_dict(config, gpu_types: list[str]) -> dict[str, Any]:
        """The plan dict Sailor's Python wrapper (cpp_src/planner.py) makes of a C++ config: replicas
        `[[[gpu, tp, zone]], tp]`, GPU types indexed in sorted order of the quotas' keys."""
        zones = list(config.get_zones())
        per_stage = [[[[[gpu_types[g], tp, zones[zi]]], tp] for g, tp, zi in stage]
                     for stage in config.get_config_per_stage()]
        layers = [list(s) for s in config.get_stages()]
        return {"mbs": config.get_mbs(), "pipeline_list": [{
            "num_stages": len(layers), "layers_per_stage": layers, "tmp_per_stage": per_stage,
            "dp": [len(s) for s in per_stage]}]}

    def score(self, sim, plan: dict[str, Any]) -> dict[str, float] | None:
        """Sailor's simulate_plan figures, or None when the plan does not fit."""
        with open(os.devnull, "w") as null, stdout_fd_to(null.fileno()):
            if not sim.check_config_fits(plan):
                return None
            t_iter, comm_usd, _ = sim.simulate_iteration_time(plan)
        gpus: dict[str, int] = {}
        for stage in plan["pipeline_list"][0]["tmp_per_stage"]:
            for vms, tp in stage:
                gpus[vms[0][0]] = gpus.get(vms[0][0], 0) + tp
        comp_usd_per_s = sum(n * self.prices[g] / 3600 for g, n in gpus.items())
        return {"iters_per_s": 1 / t_iter, "cost_usd": comp_usd_per_s * t_iter + comm_usd, "gpus": sum(gpus.values())}


def meets(sc: Scenario, s: dict[str, float]) -> bool:
    """The limit as Sailor's evaluation checks it (simulator.py evaluate_trace_with_mem)."""
    if sc.objective == "max_throughput":
        return sc.max_cost_usd is None or bool(s["cost_usd"] <= sc.max_cost_usd)  # Sailor's figures are numpy's
    return sc.min_iters_per_s is None or bool(s["iters_per_s"] >= sc.min_iters_per_s)


# ---- one scenario ---------------------------------------------------------------------------------------
@dataclass
class Side:
    search_s: float = 0.0
    precompute_s: float | None = None
    iters_per_s: float | None = None
    cost_usd: float | None = None
    gpus: int | None = None
    shape: str = ""
    met: bool | None = None
    gap: float | None = None
    check: float | None = None  # |hetplan's sailor model - Sailor's simulator| / Sailor's, worst figure
    milps: int | None = None  # hetplan: MILPs solved
    cli_s: float | None = None  # hetplan, with --cli: the whole `hetplan solve` process (`cli_wall_s`)
    plan_from: str = ""  # hetplan: "heuristic" or "milp" (PlannerResult.plan_source)
    note: str = ""
    plan: dict[str, Any] | None = field(default=None, repr=False)


def shape_of(plan: dict[str, Any]) -> str:
    pipe = plan["pipeline_list"][0]
    tps = sorted({tp for st in pipe["tmp_per_stage"] for _, tp in st})
    return f"P{pipe['num_stages']} mbs{plan['mbs']} D{pipe['dp'][0]} tp{'/'.join(map(str, tps))}"


def instance_data(sc: Scenario, ref: Path, batch: int, iteration: str = "sailor") -> dict[str, Any]:
    """The scenario's instance as a document (its file paths absolute, so it can be written anywhere)."""
    limits = {k: v for k, v in (("max_cost_per_iteration_usd", sc.max_cost_usd),
                                ("min_throughput_iters_per_s", sc.min_iters_per_s)) if v is not None}
    data = sailor_instance_dict(ref, sc.model, gpu_types=sorted({g for g, _ in sc.gpus}),
                                zones=sorted({z for _, z in sc.gpus}), name=sc.name, global_batch_size=batch,
                                objective=sc.objective, constraints=limits, gpu_counts=sc.gpus, preset="sailor")
    data["estimators"]["iteration"] = iteration
    return data


def cli_wall_s(data: dict[str, Any], time_limit_s: float) -> float | None:
    """Seconds from starting `hetplan solve FILE --time-limit T -o PLAN` to its exit, the plan
    written (None when it fails or writes no plan): the user's end to end, interpreter start,
    imports, estimators and the simulation of the plan included."""
    with tempfile.TemporaryDirectory() as tmp:
        inst, out = Path(tmp) / "instance.json", Path(tmp) / "plan.json"
        inst.write_text(json.dumps(data))
        t0 = time.perf_counter()
        done = subprocess.run(["hetplan", "solve", str(inst), "--time-limit", str(time_limit_s), "-o", str(out)],
                              capture_output=True)
        wall = time.perf_counter() - t0
        return wall if done.returncode == 0 and out.is_file() else None


def run_sailor(real: RealSailor, sc: Scenario, inst: Instance) -> Side:
    plans, pre_s, search_s = real.search(sc)
    side = Side(search_s=search_s, precompute_s=pre_s)
    sim = real.simulator(sc.model)
    for p in plans:
        s = real.score(sim, p)
        if s is not None and meets(sc, s):
            side.iters_per_s, side.cost_usd, side.gpus = s["iters_per_s"], s["cost_usd"], s["gpus"]
            side.shape, side.met, side.plan = shape_of(p), True, p
            try:
                side.check = _check(inst, p, s)
            except HetplanError as exc:  # e.g. a plan that uses more GPUs of a zone than the cluster has
                side.note = f"hetplan refuses Sailor's plan: {str(exc)[:120]}"
            return side
    side.note = f"no plan of {len(plans)} fits and meets the limit"
    side.met = False
    return side


def _check(inst: Instance, sailor_plan: dict[str, Any], s: dict[str, float]) -> float:
    return disagreement(simulate(inst, plan_from_sailor(sailor_plan, inst)), s)


def disagreement(rep, s: dict[str, float]) -> float:
    """The larger relative difference of hetplan's report and Sailor's score (throughput, cost)."""
    return max(abs(rep.iters_per_s - s["iters_per_s"]) / s["iters_per_s"],
               abs(rep.cost_per_iteration_usd - s["cost_usd"]) / s["cost_usd"])


def run_hetplan(real: RealSailor, sc: Scenario, inst: Instance, search_inst: Instance, time_limit_s: float,
                concurrent_milps: int = PlannerOptions.concurrent_milps) -> Side:
    t0 = time.perf_counter()
    try:
        res = hetplan_plan(search_inst, PlannerOptions(time_limit_s=time_limit_s, concurrent_milps=concurrent_milps),
                           build_estimators(search_inst))
    except HetplanError as exc:
        return Side(search_s=time.perf_counter() - t0, note=f"{type(exc).__name__}: {str(exc)[:90]}")
    rep = simulate(inst, res.plan) if search_inst is not inst else res.report
    side = Side(search_s=res.wall_s, iters_per_s=rep.iters_per_s, cost_usd=rep.cost_per_iteration_usd,
                gpus=rep.num_gpus, gap=res.gap, met=rep.feasible, milps=res.combos_solved, plan_from=res.plan_source)
    try:
        side.plan = plan_to_sailor(res.plan, inst)
    except HetplanError as exc:
        side.note = f"not in Sailor's form: {exc}"
        side.shape = f"P{len(res.plan.stages)}"
        return side
    side.shape = shape_of(side.plan)
    s = real.score(real.simulator(sc.model), side.plan)
    if s is None:
        side.note, side.met = "Sailor's check_config_fits refuses it", False
        return side
    side.check = disagreement(rep, s)
    side.iters_per_s, side.cost_usd, side.met = s["iters_per_s"], s["cost_usd"], meets(sc, s)
    return side


def ratio(sc: Scenario, sailor: Side, het: Side) -> float | None:
    """> 1: hetplan better on the objective."""
    return objective_ratio(sc.objective, sailor, het)


# ---- output ---------------------------------------------------------------------------------------------

def print_table(rows: list[tuple[Scenario, Side, Side]]) -> None:
    head = ("scenario", "obj", "sailor s (pre)", "het s", "het CLI s", "sailor it/s", "het it/s", "sailor $/it", "het $/it",
            "het/sailor", "met s/h", "het gap", "MILPs", "from", "check s/h", "sailor shape", "het shape", "notes")
    table = []
    for sc, s, h in rows:
        r = ratio(sc, s, h)
        table.append((sc.name, "cost" if sc.objective == "min_cost" else "thr",
                      f"{s.search_s:.2f} ({cell(s.precompute_s, '.1f')})", f"{h.search_s:.2f}", cell(h.cli_s, ".2f"),
                      cell(s.iters_per_s, ".4f"), cell(h.iters_per_s, ".4f"), cell(s.cost_usd, ".3f"),
                      cell(h.cost_usd, ".3f"), cell(r, ".3f"),
                      f"{'-' if s.met is None else 'yn'[not s.met]}/{'-' if h.met is None else 'yn'[not h.met]}",
                      "-" if h.gap is None else f"{100 * h.gap:.1f}%", cell(h.milps, "d"), h.plan_from or "-",
                      f"{cell(s.check, '.0e')}/{cell(h.check, '.0e')}", s.shape, h.shape,
                      "; ".join(x for x in (s.note, h.note) if x)))
    print_rows(head, table)
    ok = [ratio(sc, s, h) for sc, s, h in rows]
    wins = sum(1 for (sc, s, h), r in zip(rows, ok) if r is not None and r >= 1 - 1e-9 and h.met)
    print(f"\nhetplan at least as good as Sailor, limit met: {wins} of {len(rows)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sailor-build", type=Path, default=Path(os.environ.get("SAILOR_BUILD", "/tmp/sailor_build")),
                    help="DEST of build.sh (default $SAILOR_BUILD or /tmp/sailor_build)")
    ap.add_argument("--only", default=None, help="comma-separated scenario names")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds for one hetplan search")
    ap.add_argument("--search", choices=("sailor", "hetplan"), default="sailor",
                    help="iteration model hetplan searches with (hetplan: its own composition over Sailor's "
                         "estimators, the plan re-scored by Sailor's)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    ap.add_argument("--concurrent-milps", type=int, default=PlannerOptions.concurrent_milps,
                    help="MILPs the in-process search solves at once, each in a thread (1: one after another; "
                         "`--cli` runs keep the CLI's default)")
    ap.add_argument("--cli", action="store_true",
                    help="also time the whole `hetplan solve` process on each scenario (process start to plan written)")
    args = ap.parse_args(argv)
    shared = Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared"))
    ref = shared / "reference" / "sailor"
    if not (ref / "profiles").is_dir():
        print(f"no Sailor reference data under {ref}", file=sys.stderr)
        return 2
    chosen = select(scenarios(), args.only)
    if chosen is None:
        return 2
    real = RealSailor(args.sailor_build)
    rows = []
    for sc in chosen:
        batch = real.training(sc.model)["global_batch_size"]
        data = instance_data(sc, ref, batch)
        inst = instance_from_dict(data)
        s = run_sailor(real, sc, inst)
        search_data = data if args.search == "sailor" else instance_data(sc, ref, batch, args.search)
        search_inst = inst if search_data is data else instance_from_dict(search_data)
        h = run_hetplan(real, sc, inst, search_inst, args.time_limit, args.concurrent_milps)
        if args.cli:
            h.cli_s = cli_wall_s(search_data, args.time_limit)
        print(f"  {sc.name}: sailor {cell(s.iters_per_s, '.4f')} it/s {cell(s.cost_usd, '.3f')} $ | hetplan "
              f"{cell(h.iters_per_s, '.4f')} it/s {cell(h.cost_usd, '.3f')} $ {h.note}", file=sys.stderr, flush=True)
        rows.append((sc, s, h))
    if args.json:
        print(json.dumps([{"scenario": sc.name, "objective": sc.objective, "ratio": ratio(sc, s, h),
                           "sailor": {k: v for k, v in asdict(s).items() if k != "plan"} | {"plan": s.plan},
                           "hetplan": {k: v for k, v in asdict(h).items() if k != "plan"} | {"plan": h.plan}}
                          for sc, s, h in rows], indent=2))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
