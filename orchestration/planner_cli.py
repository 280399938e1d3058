"""`hetplan solve` and `hetplan pareto`: the joint planner on the command line."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table


# PlannerOptions' fields as `solve` and `pareto` spell them
PLANNER_FLAGS = {"planner.objective": "--objective", "planner.max_cost_usd": "--max-cost",
                 "planner.min_iters_per_s": "--min-throughput", "planner.time_limit_s": "--time-limit",
                 "planner.rel_gap": "--gap", "planner.max_stages": "--max-stages"}


def _options(solver, objective, max_cost, min_throughput, time_limit, gap, max_stages, beyond_model=True):
    """PlannerOptions from the command line, refused (each by its flag) before anything is loaded."""
    from hetplan.errors import fields_as
    from hetplan.orchestration.planner import PlannerOptions

    if solver is not None:
        from hetplan.errors import InstanceError, SolverError
        from hetplan.solvers.registry import get_backend

        try:
            get_backend(solver)
        except SolverError as exc:
            raise InstanceError(str(exc), "--solver") from None
    with fields_as(PLANNER_FLAGS):
        return PlannerOptions(backend=solver, objective=objective, max_cost_usd=max_cost,
                              min_iters_per_s=min_throughput, time_limit_s=time_limit, rel_gap=gap,
                              max_stages=max_stages, linearize=(solver != "scip"), beyond_model=beyond_model)


def _fmt(value, unit: str) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.5g} {unit}"


def _describe(state, unit: str) -> str:
    """One status line of a running search: where it is, incumbent, bound and gap."""
    gap = state.gap
    parts = [state.what] if state.what else []
    parts.append(f"best {_fmt(state.incumbent, unit)}")
    parts.append(f"bound {_fmt(state.bound, unit)}")
    parts.append(f"gap {100 * gap:.2f} %" if gap is not None and math.isfinite(gap) else "gap -")
    return "  ".join(parts)


def _run(instance, opts, quiet: bool):
    """Run the planner; on a terminal, a progress display on stderr shows choices settled,
    incumbent, bound and gap as they move (stdout stays for the requested output)."""
    from hetplan.orchestration.planner import plan

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        return plan(instance, opts)
    unit = "s/it" if (opts.objective or instance.objective.kind) == "max_throughput" else "USD/it"
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("searching", total=None)

        def tick(state) -> None:
            bar.update(task, total=state.total, completed=state.done, description=_describe(state, unit))

        return plan(instance, opts, progress=tick)


def _check_outputs(output: Optional[Path], plot: Optional[Path]) -> None:
    from hetplan.files import check_writable

    if output is not None:
        check_writable(output, "--output")
    if plot is not None:
        check_writable(plot, "--plot")


def _write_outputs(res, output: Optional[Path], plot: Optional[Path]) -> None:
    from hetplan.files import write_atomic

    if output:
        write_atomic(output, res.plan.to_json() + "\n", "--output")
    if plot:
        from hetplan.simulator.timeline import plot_timeline

        plot_timeline(res.report, plot)


def _search_table(res) -> Table:
    unit = "s/iteration" if res.objective_kind == "max_throughput" else "USD/iteration"
    table = Table(title=f"search ({unit})")
    for col in ("simulated", "model estimate", "proven bound", "gap", "heuristic", "outer choices", "pruned by bound",
                "MILPs solved", "plan from", "build s", "solve s", "wall s", "solver"):
        table.add_column(col)
    estimate = f"{res.model_estimate:.5g}" if res.model_estimate is not None else "-"
    table.add_row(f"{res.model_objective:.5g}", estimate, f"{res.bound:.5g}", f"{100 * res.gap:.2f} %",
                  f"{res.greedy_objective:.5g}" if res.greedy_objective is not None else "-",
                  str(res.combos_total), str(res.combos_pruned), str(res.combos_solved), res.plan_source,
                  f"{res.build_s:.2f}", f"{res.solve_s:.2f}", f"{res.wall_s:.2f}", res.backend)
    return table


def _status_line(res, opts) -> str:
    """Why the search stopped where the gap is above the one asked (JSON: `status`, `gap`)."""
    if res.gap <= opts.rel_gap * (1 + 1e-9):
        return ""
    asked = f"{100 * res.gap:.2f} % (asked: {100 * opts.rel_gap:g} %)"
    if res.status == "time_limit":
        return (f"The time limit ({opts.time_limit_s:g} s) stopped the search at a gap of {asked}: the plan is the "
                f"best found by then (status time_limit). ")
    if res.status == "complete" and res.open_past_model:
        from hetplan.orchestration.planner.search import MAX_FAMILY

        return (f"Every outer choice was settled, and the gap stays at {asked}: the planner's model rates plans "
                f"below the simulator, and past the model {res.open_past_model} outer choices still hold plans it "
                f"rates under the target that were not all simulated (a MILP's limit, or more than "
                f"{MAX_FAMILY} plans left out at once) (status complete). ")
    if res.status == "complete" and res.model_estimate is not None and res.model_estimate < res.model_objective:
        return (f"Every outer choice was settled, and the gap stays at {asked} because the planner's model rates "
                f"this plan below the simulator ({res.model_estimate:.5g} against {res.model_objective:.5g}): no "
                f"bound of the model passes the model's best plan (status complete; with --beyond-model, the "
                f"default, the search goes on past the model). ")
    return f"The search ended at a gap of {asked} (status {res.status}). "


def _model_vs_simulation_note(res, opts) -> str:
    simulated = (res.report.iteration_time_s if res.objective_kind == "max_throughput"
                 else res.report.cost_per_iteration_usd)
    what = "iteration time" if res.objective_kind == "max_throughput" else "cost per iteration"
    note = _status_line(res, opts) + (
           f"The simulated {what} ({simulated:.5g}) is the plan's figure; the proven bound holds for the simulated "
            f"{what} of every plan the planner searches, and the gap is measured from it. The model estimate is the "
            "planner's MILP figure for the same plan, lower where the model relaxes the simulator.")
    if res.combos_solved == 0:
        how = ("the heuristics found the plan and the bounds closed every other choice" if res.status == "complete"
               else "the plan is the heuristics' best when the time limit stopped the search")
        note += f" No MILP was solved: {how}, so --solver did not change this result."
    return note


def register(app: typer.Typer) -> None:
    from hetplan.orchestration.cli import console, print_json, render_simulation

    @app.command()
    def solve(instance: str = typer.Argument(..., help="instance file or bundled name"),
              solver: Optional[str] = typer.Option(None, "--solver", help="scip | highs (default: HiGHS on the linear model)"),
              objective: Optional[str] = typer.Option(None, "--objective", help="max_throughput | min_cost"),
              max_cost: Optional[float] = typer.Option(None, "--max-cost", help="USD per iteration"),
              min_throughput: Optional[float] = typer.Option(None, "--min-throughput", help="iterations per second"),
              time_limit: float = typer.Option(60.0, "--time-limit", help="seconds for the whole search"),
              gap: float = typer.Option(0.01, "--gap", help="relative optimality gap to stop at"),
              max_stages: int = typer.Option(16, "--max-stages"),
              output: Optional[Path] = typer.Option(None, "-o", "--output", help="write the plan JSON here"),
              plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG of one iteration's timeline"),
              as_json: bool = typer.Option(False, "--json"),
              beyond_model: bool = typer.Option(
                  True, "--beyond-model/--no-beyond-model",
                  help="where the search ends above --gap because the model rates plans below the simulator, solve "
                       "the outer choices under the target again and simulate what they find")) -> None:
        """Choose GPUs and a parallelization plan that optimise the objective, with a proven bound."""
        from hetplan.instance import load_instance

        opts = _options(solver, objective, max_cost, min_throughput, time_limit, gap, max_stages, beyond_model)
        _check_outputs(output, plot)
        inst = load_instance(instance)
        from hetplan.errors import fields_as

        with fields_as(PLANNER_FLAGS):  # a budget or floor no plan meets, named by its flag
            res = _run(inst, opts, as_json)
        _write_outputs(res, output, plot)
        if as_json:
            print_json(res.summary())
            return
        render_simulation(res.report, f"hetplan plan for {inst.name} ({res.objective_kind})")
        console.print(_search_table(res))
        console.print(_model_vs_simulation_note(res, opts))
        for path in (output, plot):
            if path:
                console.print(f"written: {path}")

    @app.command()
    def pareto(instance: str = typer.Argument(..., help="instance file or bundled name"),
               points: int = typer.Option(5, "--points", help="budgets between the cheapest and the fastest plan"),
               solver: Optional[str] = typer.Option(None, "--solver"),
               time_limit: float = typer.Option(30.0, "--time-limit", help="seconds per solve"),
               max_stages: int = typer.Option(8, "--max-stages"),
               plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG of the front here"),
               as_json: bool = typer.Option(False, "--json")) -> None:
        """Sweep budgets and print the throughput-cost front."""
        from hetplan.errors import InstanceError
        from hetplan.instance import load_instance

        if points < 2:
            raise InstanceError(f"must be at least 2 (the cheapest and the fastest plan), got {points}", "--points")
        _options(solver, None, None, None, time_limit, 0.01, max_stages)  # its checks, before the loading
        _check_outputs(None, plot)
        inst = load_instance(instance)
        front = _front(inst, points, solver, time_limit, max_stages, as_json)
        if plot:
            from hetplan.simulator.timeline import plot_pareto

            plot_pareto(front, plot)
        if as_json:
            print_json(front)
            return
        table = Table(title=f"throughput-cost front of {inst.name}")
        for col in ("budget USD/it", "cost USD/it", "it/s", "samples/s", "GPUs", "gap"):
            table.add_column(col)
        for p in front:
            table.add_row(f"{p['budget_usd']:.5g}", f"{p['cost_usd']:.5g}", f"{p['iters_per_s']:.4g}",
                          f"{p['samples_per_s']:.4g}", str(p["gpus"]), f"{100 * p['gap']:.2f} %")
        console.print(table)
        if plot:
            console.print(f"written: {plot}")


def _front(inst, points: int, solver, time_limit: float, max_stages: int, quiet: bool) -> list[dict]:
    """The cheapest plan, the fastest plan and `points - 2` budgets evenly between their costs."""
    def solve_with(objective, budget):
        return _run(inst, _options(solver, objective, budget, None, time_limit, 0.01, max_stages), quiet)

    fast = solve_with("max_throughput", None)
    cheap = solve_with("min_cost", None)
    lo, hi = cheap.report.cost_per_iteration_usd, fast.report.cost_per_iteration_usd
    rows = [(lo, cheap)]
    for k in range(1, points - 1 if hi > lo else 1):  # hi <= lo (free GPUs): no budget lies between
        budget = lo + (hi - lo) * k / (points - 1)
        rows.append((budget, solve_with("max_throughput", budget)))
    rows.append((hi, fast))
    front = [{"budget_usd": b, "cost_usd": r.report.cost_per_iteration_usd, "iters_per_s": r.report.iters_per_s,
              "samples_per_s": r.report.samples_per_s, "gpus": r.report.num_gpus, "gap": r.gap} for b, r in rows]
    kept = [p for p in front if not any(_dominates(q, p) for q in front)]
    # a plan the sweep found twice (the cheapest is the fastest: one GPU allowed) is one point
    return [p for i, p in enumerate(kept) if not any(_same_point(q, p) for q in kept[:i])]


def _same_point(q: dict, p: dict) -> bool:
    return q["cost_usd"] == p["cost_usd"] and q["iters_per_s"] == p["iters_per_s"]


def _dominates(q: dict, p: dict) -> bool:
    """q costs no more and runs no slower than p, and is better in one (the cheapest plan ties on cost
    with faster ones where GPUs are free)."""
    return (q["cost_usd"] <= p["cost_usd"] and q["iters_per_s"] >= p["iters_per_s"]
            and (q["cost_usd"] < p["cost_usd"] or q["iters_per_s"] > p["iters_per_s"]))
