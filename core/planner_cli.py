"""`hetplan solve` and `hetplan pareto`: the joint planner on the command line."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress
from rich.table import Table


def _options(solver, objective, max_cost, min_throughput, time_limit, gap, max_stages):
    from hetplan.planner import PlannerOptions

    return PlannerOptions(backend=solver, objective=objective, max_cost_usd=max_cost, min_iters_per_s=min_throughput,
                          time_limit_s=time_limit, rel_gap=gap, max_stages=max_stages,
                          linearize=(solver != "scip"))


def _run(instance, opts, quiet: bool):
    from hetplan.planner import plan

    if quiet:
        return plan(instance, opts)
    with Progress(transient=True) as bar:
        task = bar.add_task("searching", total=None)

        def tick(i: int, n: int, what: str) -> None:
            bar.update(task, total=n, completed=i, description=f"outer choice {what}")

        return plan(instance, opts, progress=tick)


def register(app: typer.Typer) -> None:
    from hetplan.cli import console, print_json, render_simulation

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
              as_json: bool = typer.Option(False, "--json")) -> None:
        """Choose GPUs and a parallelization plan that optimise the objective, with a proven bound."""
        from hetplan.instance import load_instance

        if objective not in (None, "max_throughput", "min_cost"):
            raise typer.BadParameter("--objective must be max_throughput or min_cost")
        inst = load_instance(instance)
        res = _run(inst, _options(solver, objective, max_cost, min_throughput, time_limit, gap, max_stages), as_json)
        if output:
            res.plan.save(output)
        if plot:
            from hetplan.timeline import plot_timeline

            plot_timeline(res.report, str(plot))
        if as_json:
            print_json(res.summary())
            return
        render_simulation(res.report, f"hetplan plan for {inst.name} ({res.objective_kind})")
        unit = "s/iteration" if res.objective_kind == "max_throughput" else "USD/iteration"
        table = Table(title="search")
        for col in ("model objective", "proven bound", "gap", "heuristic objective", "outer choices",
                    "pruned by bound", "solved", "build s", "solve s", "wall s", "solver"):
            table.add_column(col)
        table.add_row(f"{res.model_objective:.5g} {unit}", f"{res.bound:.5g}", f"{100 * res.gap:.2f} %",
                      f"{res.greedy_objective:.5g}" if res.greedy_objective is not None else "-",
                      str(res.combos_total), str(res.combos_pruned), str(res.combos_solved),
                      f"{res.build_s:.2f}", f"{res.solve_s:.2f}", f"{res.wall_s:.2f}", res.backend)
        console.print(table)
        if output:
            console.print(f"plan written to {output}")

    @app.command()
    def pareto(instance: str = typer.Argument(..., help="instance file or bundled name"),
               points: int = typer.Option(5, "--points", help="budgets between the cheapest and the fastest plan"),
               solver: Optional[str] = typer.Option(None, "--solver"),
               time_limit: float = typer.Option(30.0, "--time-limit", help="seconds per solve"),
               max_stages: int = typer.Option(8, "--max-stages"),
               as_json: bool = typer.Option(False, "--json")) -> None:
        """Sweep budgets and print the throughput-cost front."""
        from hetplan.instance import load_instance

        inst = load_instance(instance)
        fast = _run(inst, _options(solver, "max_throughput", None, None, time_limit, 0.01, max_stages), True)
        cheap = _run(inst, _options(solver, "min_cost", None, None, time_limit, 0.01, max_stages), True)
        lo, hi = cheap.report.cost_per_iteration_usd, fast.report.cost_per_iteration_usd
        rows = [(lo, cheap)]
        for k in range(1, max(points - 1, 1)):
            budget = lo + (hi - lo) * k / max(points - 1, 1)
            rows.append((budget, _run(inst, _options(solver, "max_throughput", budget, None, time_limit, 0.01,
                                                     max_stages), True)))
        rows.append((hi, fast))
        front = [{"budget_usd": b, "cost_usd": r.report.cost_per_iteration_usd, "iters_per_s": r.report.iters_per_s,
                  "samples_per_s": r.report.samples_per_s, "gpus": r.report.num_gpus, "gap": r.gap} for b, r in rows]
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
