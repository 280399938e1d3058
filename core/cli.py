"""The `hetplan` command line. Every user-facing failure is a HetplanError printed as one line."""
from __future__ import annotations

import json
import sys
from importlib import import_module
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from hetplan.errors import HetplanError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan LLM training on heterogeneous, dynamically available GPU clusters.")
console = Console(width=None if sys.stdout.isatty() else 160)
GIB = 1024**3

# Sub-packages add their own commands (solvers, compile/launch, solve/pareto, replay) when present.
_PLUGIN_MODULES = ["hetplan.solvers.cli", "hetplan.runtime.cli", "hetplan.planner_cli", "hetplan.replay_cli"]


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List the bundled GPU catalogue (published peak figures)."""
    from hetplan.catalog import gpu_catalog

    cat = gpu_catalog()
    if as_json:
        print_json({k: v.model_dump() for k, v in cat.items()})
        return
    table = Table(title="GPU catalogue")
    for col in ("GPU", "FP16 TFLOP/s", "BF16 TFLOP/s", "memory GiB", "mem BW GB/s", "intra-node link", "assumed MFU"):
        table.add_column(col, justify="right" if col != "GPU" else "left")
    for g in cat.values():
        table.add_row(g.name, f"{g.peak_fp16_tflops:g}", f"{g.peak_bf16_tflops:g}" if g.peak_bf16_tflops else "-",
                      f"{g.memory_gib:g}", f"{g.memory_bandwidth_GBps:g}",
                      f"{g.intra_node.kind} {g.intra_node.bandwidth_GBps:g} GB/s", f"{g.default_mfu:g}")
    console.print(table)


@app.command()
def validate(instance: str = typer.Argument(..., help="instance file, or the name of a bundled one"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Validate an instance file and summarise it."""
    from hetplan.instance import load_instance

    inst = load_instance(instance)
    arch = inst.model_arch
    info = {"name": inst.name, "gpus": inst.total_gpus, "gpu_types": inst.gpu_types,
            "zones": sorted({n.zone for n in inst.nodes}), "model": arch.name, "layers": arch.num_layers,
            "global_batch_size": inst.workload.global_batch_size, "objective": inst.objective.kind,
            "estimators": inst.estimators.model_dump()}
    if as_json:
        print_json(info)
        return
    table = Table(title=f"instance {inst.name}: valid")
    for col in ("node group", "GPU", "GPUs/node", "nodes", "zone", "region", "USD/GPU-h"):
        table.add_column(col)
    for g in inst.cluster.node_groups:
        table.add_row(g.name, g.gpu_type, str(g.gpus_per_node), str(g.count), g.zone, g.region_name,
                      f"{g.price_per_gpu_hour_usd:g}")
    console.print(table)
    console.print(f"model {arch.name}: {arch.num_layers} layers, hidden {arch.hidden_size}, "
                  f"global batch {inst.workload.global_batch_size} x {arch.seq_len} tokens; "
                  f"objective {inst.objective.kind}")


def describe_replicas(plan, stage: int) -> str:
    """Group identical replicas: '4 x A100-40/tp2 @ us-central1-a: 4'."""
    groups: dict[tuple, int] = {}
    for j, rep in enumerate(plan.stages[stage].replicas):
        key = (rep.gpu_type, rep.tp, rep.zone or rep.node, plan.share(stage, j))
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{n} x {g}/tp{tp} @ {z}: {sh}" for (g, tp, z, sh), n in groups.items())


def render_simulation(report, title: str) -> None:
    table = Table(title=title)
    for col in ("stage", "layers", "replicas: count x GPU/TP @ zone: share", "fwd s", "bwd s", "p2p s", "sync s",
                "peak GiB / capacity"):
        table.add_column(col)
    peaks = report.peak_memory_by_stage()
    for s, st in enumerate(report.stages):
        reps = describe_replicas(report.plan, s)
        peak, cap = peaks[s]
        mark = " [red]OOM[/]" if peak > cap else ""
        table.add_row(str(s), f"[{st.layer_start},{st.layer_end})", reps, f"{st.fwd_s:.4f}", f"{st.bwd_s:.4f}",
                      f"{st.send_fwd_s:.4f}", f"{st.sync_s:.4f}", f"{peak / GIB:.1f} / {cap / GIB:.0f}{mark}")
    console.print(table)
    console.print(
        f"iteration {report.iteration_time_s:.4f} s (pipeline {report.pipeline_s:.4f} + sync {report.sync_s:.4f} "
        f"+ update {report.update_s:.4f}); {report.samples_per_s:.2f} samples/s, {report.tokens_per_s:,.0f} tokens/s, "
        f"{report.iters_per_s:.4f} it/s; cost/iteration {report.cost_per_iteration_usd:.5f} USD "
        f"(egress {report.egress_cost_usd:.5f}); {report.num_gpus} GPUs {report.gpus_by_type_zone}")
    if report.oom_ranks:
        console.print(f"[bold red]OOM on ranks {[r.rank for r in report.oom_ranks]}[/]")
    for v in report.constraint_violations:
        console.print(f"[yellow]constraint violated:[/] {v}")


@app.command()
def simulate(instance: str = typer.Argument(..., help="instance file or bundled name"),
             plan: str = typer.Argument(..., help="plan JSON file or bundled plan name"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Simulate one iteration of a plan: time, throughput, cost and per-rank memory."""
    from hetplan.instance import load_instance
    from hetplan.plan import load_plan
    from hetplan.simulator import simulate as run_simulation

    inst = load_instance(instance)
    report = run_simulation(inst, load_plan(plan))
    if as_json:
        print_json(report.summary())
    else:
        render_simulation(report, f"plan {report.plan.name or plan} on {inst.name}")
    if report.oom_ranks:
        raise typer.Exit(code=2)


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here instead of stdout")) -> None:
    """Export the JSON Schema of instance files."""
    from hetplan.instance import instance_json_schema

    text = json.dumps(instance_json_schema(), indent=2) + "\n"
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


@app.command()
def instances() -> None:
    """List the bundled instances (usable by name wherever an instance path is expected)."""
    from hetplan.bundled import bundled_instances

    for name in bundled_instances():
        console.print(name)


def _register_plugins() -> None:
    for mod in _PLUGIN_MODULES:
        try:
            module = import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # the plug-in exists but something it needs is missing: say so
                raise
            continue
        module.register(app)


def main() -> None:
    _register_plugins()
    try:
        app(standalone_mode=False)
    except HetplanError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
