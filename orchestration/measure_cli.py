"""Command-line command `measure`: run a plan locally with the probe on and compare with the simulator.

    hetplan measure INSTANCE PLAN --local [--steps 10] [--warmup 2] [--json] [--out DIR]
                    [--hidden H --heads A --ffn F --vocab V --seq-len S] [--schedule GPipe|1F1B]
                    [--dtype float32] [--optimizer adam|sgd] [--lr X] [--seed N]

The logic is runtime/measure.py (its docstring maps every measured part to a simulated field).
Progress (steps completed by every rank) goes to stderr; stdout carries the table, or with
--json exactly one object {"measured", "simulated", "relative_error", ...}.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table

from hetplan.errors import PlanError, fields_as
from hetplan.orchestration.runtime_cli import local_run_overrides

MIB = 2**20


def _format(part: str, value: float | None) -> str:
    if value is None:
        return "-"
    if part.endswith("_bytes"):
        return f"{value / MIB:.2f} MiB"
    return f"{value:.4g} s" if value >= 1e-3 or value == 0 else f"{value * 1e3:.3g} ms"


def _format_error(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f} %"


def render_measure(result, title: str) -> None:
    from hetplan.orchestration.cli import console

    table = Table(title=title)
    for col in ("part", "measured", "simulated", "(sim - meas) / meas"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for part in result.parts:
        table.add_row(part, _format(part, result.measured[part]), _format(part, result.simulated[part]),
                      _format_error(result.relative_error[part]))
    console.print(table)
    console.print(f"medians over {result.steps_used} steps after {result.warmup} warm-up steps "
                  f"(run took {result.wall_s:.1f} s); per-rank records: {result.log_path}")
    for note in result.notes:
        console.print(f"note: {note}")


@contextmanager
def _progress(steps: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal's stderr; one line per step otherwise (logs, pipes)."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield lambda done: print(f"measure: {done}/{steps} steps done", file=sys.stderr, flush=True)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("measuring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("steps", total=steps)
        yield lambda done: bar.update(task, completed=done)


def register(app: typer.Typer) -> None:
    @app.command("measure")
    def measure_cmd(
        instance: str = typer.Argument(..., help="instance file or bundled name"),
        plan: str = typer.Argument(..., help="plan file or bundled name"),
        local: bool = typer.Option(False, "--local", help="run every rank on this machine (the only mode)"),
        steps: int = typer.Option(10, "--steps", min=1, help="training steps, warm-up included"),
        warmup: int = typer.Option(2, "--warmup", min=0, help="first steps left out of the medians"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="directory for spec, log.json (default: temp)"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="hidden size (default: the instance's model)"),
        heads: Optional[int] = typer.Option(None, "--heads"),
        ffn: Optional[int] = typer.Option(None, "--ffn"),
        vocab: Optional[int] = typer.Option(None, "--vocab"),
        seq_len: Optional[int] = typer.Option(None, "--seq-len"),
        schedule: Optional[str] = typer.Option(None, "--schedule", help="GPipe | 1F1B (default: the plan's)"),
        dtype: str = typer.Option("float32", "--dtype", help="float32 | float64 | bfloat16"),
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adam | sgd"),
        lr: Optional[float] = typer.Option(None, "--lr"),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """Run a plan locally, time each part per rank and compare with the simulator."""
        if not local:
            raise PlanError("only --local measurements are supported: every rank runs on this machine", "--local")
        overrides = local_run_overrides(schedule, out, hidden, heads, ffn, vocab, seq_len, lr)
        from hetplan.orchestration.sailor_cli import load_instance_and_plan
        from hetplan.runtime.measure import measure_plan  # torch: only once the arguments are checked

        inst, pl = load_instance_and_plan(instance, plan)
        with _progress(steps) as on_progress, fields_as({"warmup": "--warmup"}):
            result = measure_plan(inst, pl, steps, warmup, overrides, schedule=schedule, dtype=dtype,
                                  optimizer=optimizer, lr=lr, seed=seed, out_dir=out, on_progress=on_progress)
        if as_json:
            from hetplan.orchestration.cli import print_json

            print_json(result.to_json())
        else:
            render_measure(result, f"measured vs simulated: plan {plan} on {instance}")
