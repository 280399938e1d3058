"""Command-line commands of the runtime: `compile` and `launch --local`.

    hetplan compile INSTANCE PLAN --target torchrun -o out/
    hetplan launch --local INSTANCE PLAN --steps 10 --hidden 64 --heads 4 --ffn 256 --vocab 512 --seq-len 32

Instances and plans are paths or bundled short names. Errors reach `hetplan.cli.main`, which prints
one line and exits with the error's status.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hetplan.errors import PlanError


def _hosts(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        node, sep, host = pair.partition("=")
        if not sep or not node or not host:
            raise PlanError(f"--host expects NODE=HOSTNAME, got {pair!r}", "hosts")
        out[node] = host
    return out


def local_run_overrides(schedule: str | None, out: Path | None, hidden: int | None, heads: int | None,
                        ffn: int | None, vocab: int | None, seq_len: int | None) -> dict[str, int]:
    """Check the options `launch --local` and `measure --local` share (schedule, output folder)
    and return the model overrides they name."""
    if schedule is not None and schedule not in ("GPipe", "1F1B"):
        raise PlanError(f"unknown schedule {schedule!r}; use GPipe or 1F1B", "--schedule")
    if out is not None:
        from hetplan.files import check_output_dir

        check_output_dir(out, "--out")
    return {k: v for k, v in (("hidden_size", hidden), ("num_heads", heads), ("ffn_hidden_size", ffn),
                              ("vocab_size", vocab), ("seq_len", seq_len)) if v is not None}


def register(app: typer.Typer) -> None:
    @app.command("compile")
    def compile_cmd(
        instance: str = typer.Argument(..., help="instance file or bundled name"),
        plan: str = typer.Argument(..., help="plan file or bundled name"),
        target: str = typer.Option("torchrun", "--target", "-t",
                                   help="torchrun | slurm | kubernetes | megatron | deepspeed"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory"),
        host: list[str] = typer.Option([], "--host", help="NODE=HOSTNAME, repeatable (default: node ids)"),
        master_port: int = typer.Option(29500, "--master-port"),
        rendezvous: str = typer.Option("static", "--rendezvous", help="static | c10d (torchrun target)"),
        image: str = typer.Option("hetplan-runtime:latest", "--image", help="container image (kubernetes)"),
    ) -> None:
        """Write the launch spec and the target's launch files for a plan."""
        from hetplan.instance import load_instance
        from hetplan.plan import load_plan
        from hetplan.runtime.compile import CompileOptions, write_launch

        from hetplan.files import check_output_dir

        if rendezvous not in ("static", "c10d"):
            raise PlanError(f"unknown rendezvous {rendezvous!r}; use static or c10d", "--rendezvous")
        check_output_dir(out, "--out")
        options = CompileOptions(hosts=_hosts(host), master_port=master_port, rendezvous=rendezvous, image=image)
        paths = write_launch(load_instance(instance), load_plan(plan), target, out, options)
        for p in paths:
            typer.echo(str(p))

    @app.command("launch")
    def launch_cmd(
        instance: str = typer.Argument(..., help="instance file or bundled name"),
        plan: str = typer.Argument(..., help="plan file or bundled name"),
        local: bool = typer.Option(False, "--local", help="run every rank on this machine (CPU, gloo)"),
        steps: int = typer.Option(10, "--steps", min=1),
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
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="directory for spec, log.json (default: temp)"),
        method: str = typer.Option("processes", "--method", help="processes | torchrun"),
    ) -> None:
        """Train a plan on this machine, one process per rank, and print loss and time per step."""
        from hetplan.runtime.local import launch_local

        if not local:
            raise PlanError("only --local launches are run by this command; for a cluster use "
                            "`hetplan compile ... --target torchrun|slurm|kubernetes`", "--local")
        if method not in ("processes", "torchrun"):
            raise PlanError(f"unknown method {method!r}; use processes or torchrun", "--method")
        overrides = local_run_overrides(schedule, out, hidden, heads, ffn, vocab, seq_len)
        result = launch_local(instance, plan, steps, overrides, schedule=schedule, dtype=dtype,
                              optimizer=optimizer, lr=lr, seed=seed, out_dir=out,
                              method=method)  # type: ignore[arg-type]
        typer.echo(f"log: {result.out_dir / 'log.json'}")
        typer.echo("step  loss        time_s")
        for k, (loss, t) in enumerate(zip(result.losses, result.times_s), start=1):
            typer.echo(f"{k:4d}  {loss:.6f}  {t:.3f}")
