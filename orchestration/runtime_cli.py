"""Command-line commands of the runtime: `compile`, `launch --local` and `run --local --elastic`.

    hetplan compile INSTANCE PLAN --target torchrun -o out/
    hetplan launch --local INSTANCE PLAN --steps 10 --hidden 64 --heads 4 --ffn 256 --vocab 512 --seq-len 32
    hetplan run INSTANCE [PLAN] --local --elastic --steps 12 --checkpoint-dir ckpt/ --events events.yaml

Instances and plans are paths or bundled short names. Errors reach `hetplan.orchestration.cli.main`, which prints
one line and exits with the error's status.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from hetplan.errors import PlanError, fields_as


def _hosts(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        node, sep, host = pair.partition("=")
        if not sep or not node or not host:
            raise PlanError(f"expects NODE=HOSTNAME, got {pair!r}", "--host")
        if node in out and out[node] != host:  # the last one won without a word
            raise PlanError(f"node {node} is given two hosts, {out[node]} and {host}", "--host")
        out[node] = host
    return out


def _write_launch(inst, plan, target: str, out: Path, options) -> list[Path]:
    """`write_launch`, naming --out (as `solve` names --output) when the file system refuses a folder
    there that the up-front check let through: /proc passes `check_output_dir` as root, yet refuses mkdir."""
    from hetplan.files import OutputError
    from hetplan.runtime.compile import write_launch

    try:
        return write_launch(inst, plan, target, out, options)
    except OSError as exc:
        failed = Path(exc.filename) if exc.filename else None
        if failed is None or not (failed == out or out in failed.parents or failed in out.parents):
            raise  # not under --out: main's one line for file system errors says what it was
        raise OutputError(f"cannot write {failed}: {exc.strerror}", "--out") from None


# CompileOptions' fields (and compile_plan's target) as `compile` spells them
COMPILE_FLAGS = {"target": "--target", "hosts": "--host", "min_nodes": "--min-nodes", "rendezvous": "--rendezvous",
                 "checkpoint_dir": "--checkpoint-dir", "master_port": "--master-port", "image": "--image"}


def _warn_out_of_memory(inst, plan) -> None:
    """One warning line when the simulator puts ranks of the plan over their GPU's memory: `simulate`
    refuses such a plan (exit 2), and a compiled launch of it fails on the cluster."""
    from hetplan.errors import HetplanError
    from hetplan.simulator import simulate

    try:
        report = simulate(inst, plan)
    except HetplanError as exc:  # e.g. an estimator's file missing: the launch files need none
        print(f"warning: the plan's memory was not checked: {exc}", file=sys.stderr)
        return
    if report.oom_ranks:
        worst = max((r.memory for r in report.oom_ranks), key=lambda m: m.counted_bytes / m.capacity_bytes)
        print(f"warning: the simulator puts ranks {[r.rank for r in report.oom_ranks]} over their GPU memory "
              f"(up to {worst.counted_bytes / 2**30:.1f} GiB of {worst.capacity_bytes / 2**30:.1f} GiB); this launch "
              f"may fail out of memory", file=sys.stderr)


# `run --heartbeat-timeout` below this is refused: ranks touch their heartbeat file every
# min(0.25 s, timeout / 4) from a thread that a training step can keep waiting, and at 0.01 s a
# healthy rank was read as hung and re-planned away (4 -> 2 GPUs); 1 s ran 8 steps with none.
MIN_HEARTBEAT_TIMEOUT_S = 1.0


# The highest --lr taken. Adam moves every weight by about lr per step whatever the gradient's
# scale, and the weights start at a scale of 0.02: rates that train LLMs lie in 1e-5..1e-2, SGD's
# rarely above 1. 10 leaves a decade of room over any rate that can learn (SGD at 10 still gives a
# finite loss on the small CPU model); above it runs only diverge: with Adam, 100 gave a loss of 9e4
# at step 2, and 1e308 a nan loss with exit 0.
MAX_LR = 10.0


def check_dir_option(path: Path | None, option: str) -> Path | None:
    """The folder an option names, or OutputError naming `option` when no run could use it: a file,
    or a place where no folder can be made (an empty value never gets here: `cli.main` refuses it).
    A probe folder, made and removed where the folder would go, catches what permission bits hide:
    /proc looks writable to root and refuses mkdir, and the run failed after the planning with a
    bare [Errno 2] and exit 3."""
    from hetplan.files import OutputError, check_output_dir

    if path is None:
        return None
    target = check_output_dir(path, option)
    parent = target
    while not parent.exists():
        parent = parent.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hetplan-probe-", dir=parent))
    except OSError as exc:
        raise OutputError(f"{target} cannot be created: making a folder in {parent} failed "
                          f"({exc.strerror})", option) from None
    return target


def local_run_overrides(schedule: str | None, out: Path | None, hidden: int | None, heads: int | None,
                        ffn: int | None, vocab: int | None, seq_len: int | None,
                        lr: float | None = None) -> dict[str, int]:
    """Check the options `launch --local`, `measure --local` and `run` share (schedule, output
    folder, model sizes, learning rate) and return the model overrides they name."""
    from hetplan.errors import InstanceError
    from hetplan.errors import check_number
    from hetplan.runtime.runnable import check_shape_options

    if schedule is not None and schedule not in ("GPipe", "1F1B"):
        raise PlanError(f"unknown schedule {schedule!r}; use GPipe or 1F1B", "--schedule")
    check_dir_option(out, "--out")
    check_number(lr, "--lr")  # inf or 1e308 trained to a nan loss with exit 0
    if lr is not None and lr > MAX_LR:  # finite, yet a nan loss by step 2 (MAX_LR says why)
        raise InstanceError(f"must be at most {MAX_LR:g} (a learning rate that can train), got {lr:g}", "--lr")
    sizes = {"hidden_size": hidden, "num_heads": heads, "ffn_hidden_size": ffn, "vocab_size": vocab, "seq_len": seq_len}
    check_shape_options(sizes)
    return {key: value for key, value in sizes.items() if value is not None}


def register(app: typer.Typer) -> None:
    @app.command("compile")
    def compile_cmd(
        instance: str = typer.Argument(..., help="instance file or bundled name"),
        plan: str = typer.Argument(..., help="plan file or bundled name"),
        target: str = typer.Option("torchrun", "--target", "-t",
                                   help="torchrun | slurm | kubernetes | megatron | deepspeed"),
        out: Path = typer.Option(..., "--out", "-o", help="output directory"),
        host: list[str] = typer.Option([], "--host", help="NODE=HOSTNAME, repeatable (default: node ids)"),
        master_port: int = typer.Option(29500, "--master-port", help="rendezvous TCP port, 1..65535"),
        rendezvous: str = typer.Option("static", "--rendezvous", help="static | c10d (torchrun target)"),
        image: str = typer.Option("hetplan-runtime:latest", "--image", help="container image (kubernetes)"),
        checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="shared folder (same path on "
                                                     "every node): workers checkpoint there and resume from it "
                                                     "when torchrun restarts them (torchrun, slurm, kubernetes)"),
        checkpoint_every: int = typer.Option(1, "--checkpoint-every", min=1, help="steps between checkpoints"),
        max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, help="torchrun restarts of the "
                                                   "whole job (with --checkpoint-dir; default 3)"),
        min_nodes: Optional[int] = typer.Option(None, "--min-nodes", min=1, help="with --checkpoint-dir: go on "
                                                "with as few as K nodes, re-planning for those left when a node "
                                                "does not come back (torchrun, slurm; c10d rendezvous)"),
    ) -> None:
        """Write the launch spec and the target's launch files for a plan."""
        from hetplan.orchestration.sailor_cli import load_instance_and_plan
        from hetplan.runtime.compile import CompileOptions

        if rendezvous not in ("static", "c10d"):
            raise PlanError(f"unknown rendezvous {rendezvous!r}; use static or c10d", "--rendezvous")
        if not 1 <= master_port <= 65535:  # else the launch spec's own check fails after the compile
            raise PlanError(f"must be a TCP port in 1..65535, got {master_port}", "--master-port")
        out_dir = check_dir_option(out, "--out")
        from hetplan.runtime.targets import Resilience

        if min_nodes is not None and not checkpoint_dir:
            raise PlanError("--min-nodes needs --checkpoint-dir: the nodes left resume from its checkpoints",
                            "--min-nodes")
        if max_restarts is not None and not checkpoint_dir:  # it was dropped without a word
            raise PlanError("needs --checkpoint-dir: restarted workers resume from its checkpoints",
                            "--max-restarts")
        restarts = {} if max_restarts is None else {"max_restarts": max_restarts}  # else Resilience's default
        resilience = Resilience(checkpoint_dir, checkpoint_every, min_nodes=min_nodes,
                                **restarts) if checkpoint_dir else None
        options = CompileOptions(hosts=_hosts(host), master_port=master_port, rendezvous=rendezvous, image=image,
                                 resilience=resilience)
        inst, placed = load_instance_and_plan(instance, plan)
        with fields_as(COMPILE_FLAGS):
            paths = _write_launch(inst, placed, target, out_dir, options)
        # after: a plan the launch refuses is said once (the simulator's refusal of it was also a warning)
        _warn_out_of_memory(inst, placed)
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
        overrides = local_run_overrides(schedule, out, hidden, heads, ffn, vocab, seq_len, lr)
        from hetplan.orchestration.sailor_cli import load_instance_and_plan  # also Sailor's format

        inst, pl = load_instance_and_plan(instance, plan)
        result = launch_local(inst, pl, steps, overrides, schedule=schedule, dtype=dtype,
                              optimizer=optimizer, lr=lr, seed=seed, out_dir=out,
                              method=method)  # type: ignore[arg-type]
        typer.echo(f"log: {result.out_dir / 'log.json'}")
        typer.echo("step  loss        time_s")
        for k, (loss, t) in enumerate(zip(result.losses, result.times_s), start=1):
            typer.echo(f"{k:4d}  {loss:.6f}  {t:.3f}")

    @app.command("run")
    def run_cmd(
        instance: str = typer.Argument(..., help="instance file or bundled name"),
        plan: Optional[str] = typer.Argument(None, help="plan to start with (default: the planner's)"),
        local: bool = typer.Option(False, "--local", help="run every rank on this machine (CPU, gloo)"),
        elastic: bool = typer.Option(False, "--elastic", help="supervise: re-plan and resume on failures and "
                                     "availability changes"),
        steps: int = typer.Option(10, "--steps", min=1),
        checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint-dir", help="layer-wise checkpoints "
                                                      "(a run finds its newest one there and resumes from it)"),
        events: Optional[Path] = typer.Option(None, "--events", help="YAML list: {at_step|at_s: .., lose|gain: "
                                              "{gpu_type, zone, count}} | kill_rank | hang_rank | fail_node"),
        trace: Optional[Path] = typer.Option(None, "--trace", help="Sailor availability trace CSV"),
        time_scale: float = typer.Option(1.0, "--time-scale", help="trace (and instance event) seconds per "
                                         "wall second"),
        watch: Optional[Path] = typer.Option(None, "--watch", help="events file re-read while running: "
                                             "appended entries fire when seen"),
        heartbeat_timeout: float = typer.Option(10.0, "--heartbeat-timeout", help="seconds without a heartbeat "
                                                "before a rank counts as hung"),
        checkpoint_every: int = typer.Option(1, "--checkpoint-every", min=1),
        replan_time_limit: float = typer.Option(1.0, "--replan-time-limit", help="planner seconds per re-plan"),
        hidden: Optional[int] = typer.Option(None, "--hidden", help="hidden size (default: the instance's model)"),
        heads: Optional[int] = typer.Option(None, "--heads"),
        ffn: Optional[int] = typer.Option(None, "--ffn"),
        vocab: Optional[int] = typer.Option(None, "--vocab"),
        seq_len: Optional[int] = typer.Option(None, "--seq-len"),
        dtype: str = typer.Option("float32", "--dtype", help="float32 | float64 | bfloat16"),
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adam | sgd"),
        lr: Optional[float] = typer.Option(None, "--lr"),
        seed: int = typer.Option(0, "--seed"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="directory for segments' specs and logs "
                                           "(default: CHECKPOINT_DIR/../run)"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Train with a supervisor that survives rank failures and GPUs coming and going."""
        if not (local and elastic):
            raise PlanError("`hetplan run` needs --local --elastic (a supervised run on this machine); for a "
                            "plain run use `hetplan launch --local`, for a cluster `hetplan compile`", "--elastic")
        if checkpoint_dir is None:
            raise PlanError("--checkpoint-dir is required: the supervisor resumes from its checkpoints",
                            "--checkpoint-dir")
        from hetplan.errors import check_number

        ckpt = check_dir_option(checkpoint_dir, "--checkpoint-dir")
        for value, option in ((time_scale, "--time-scale"), (heartbeat_timeout, "--heartbeat-timeout"),
                              (replan_time_limit, "--replan-time-limit")):
            check_number(value, option)
        if heartbeat_timeout < MIN_HEARTBEAT_TIMEOUT_S:
            raise PlanError(f"must be at least {MIN_HEARTBEAT_TIMEOUT_S:g} s, got {heartbeat_timeout:g}",
                            "--heartbeat-timeout")
        overrides = local_run_overrides(None, out, hidden, heads, ffn, vocab, seq_len, lr)
        out_dir = out if out is not None else check_dir_option(ckpt.parent / "run", "--out")
        import sys

        from hetplan.orchestration.cli import print_json
        from hetplan.cluster_state import event_stream
        from hetplan.instance import load_instance
        from hetplan.orchestration.replan import ReplanOptions
        from hetplan.orchestration.elastic import ElasticOptions, read_events, run_elastic
        from hetplan.orchestration.sailor_cli import load_instance_and_plan

        inst, start = load_instance_and_plan(instance, plan) if plan is not None else (load_instance(instance), None)
        opts = ElasticOptions(
            steps=steps, checkpoint_dir=ckpt, out_dir=out_dir,
            events=tuple(read_events(events)) if events else (),
            cluster_events=tuple(event_stream(inst, trace=trace)), time_scale=time_scale,
            watch=watch, heartbeat_timeout_s=heartbeat_timeout, heartbeat_s=min(0.25, heartbeat_timeout / 4),
            checkpoint_every=checkpoint_every, replan=ReplanOptions(planner_time_limit_s=replan_time_limit),
            model=overrides, dtype=dtype, optimizer=optimizer, lr=lr, seed=seed)
        result = run_elastic(inst, start, opts, log=lambda msg: print(f"[elastic] {msg}", file=sys.stderr, flush=True))
        if as_json:
            print_json(result.summary())
            return
        trained = result.steps_completed - result.resumed_from  # a resumed run said "trained 12" for none
        resumed = f", resumed at iteration {result.resumed_from}" if result.resumed_from else ""
        typer.echo(f"trained {trained} steps ({trained * inst.workload.global_batch_size} samples) in "
                   f"{result.wall_s:.1f} s{resumed}; {len(result.reconfigurations)} reconfigurations, total downtime "
                   f"{result.downtime_s:.2f} s")
        for r in result.reconfigurations:
            typer.echo(f"  iteration {r.at_iteration:4d}  {r.kind:12s} {r.cause}: downtime {r.downtime_s:.2f} s "
                       f"(detect {r.detect_s:.2f}, re-plan {r.replan_s:.2f}, state {r.state_transfer_s:.2f}, "
                       f"restart {r.restart_s:.2f})")
        typer.echo("plans used:")
        for row in result.plans:
            typer.echo(f"  from iteration {row['from_iteration']:4d}: {row['name']} - {row['stages']} stages, "
                       f"{row['gpus']} GPUs {row['gpus_by_type']}")
