"""The `hetplan` command line. Every user-facing failure is a HetplanError printed as one line."""
from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from hetplan.errors import HetplanError
from hetplan.files import stdout_fd_to

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan LLM training on heterogeneous, dynamically available GPU clusters.",
                  epilog="Exit status: 0 success; 1 bad input or usage; 2 no plan (infeasible, out of memory, "
                         "refused by a launch target, none within the time limit); 3 a run failed while running; "
                         "70 internal error (a bug); 130 SIGINT; 143 SIGTERM.")
console = Console(width=None if sys.stdout.isatty() else 160)
GIB = 1024**3

# Modules that add commands (solvers; compile, launch; solve, pareto; replay). They import the
# heavy packages (Pyomo, torch) inside the commands, so `hetplan --help` or a usage error starts fast.
_COMMAND_MODULES = ["hetplan.orchestration.solvers_cli", "hetplan.orchestration.runtime_cli", "hetplan.orchestration.planner_cli", "hetplan.orchestration.replay_cli",
                    "hetplan.orchestration.sailor_cli", "hetplan.orchestration.measure_cli", "hetplan.orchestration.profile_cli"]


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="on an error, show the traceback too (anywhere on "
                                     "the command line; or set HETPLAN_DEBUG=1)")) -> None:
    """Plan LLM training on heterogeneous, dynamically available GPU clusters."""


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
    from hetplan.estimators import build_estimators
    from hetplan.instance import load_instance
    from hetplan.orchestration.planner.inputs import decimal_bytes, state_and_memory_bytes, state_shortfall

    inst = load_instance(instance)
    est = build_estimators(inst)  # names, options and profiles: what `solve` would refuse, refused here
    arch = inst.model_arch
    state = state_and_memory_bytes(inst, est)
    info = {"name": inst.name, "gpus": inst.total_gpus, "gpu_types": inst.gpu_types,
            "zones": sorted({n.zone for n in inst.nodes}), "model": arch.name, "layers": arch.num_layers,
            "global_batch_size": inst.workload.global_batch_size, "objective": inst.objective.kind,
            "estimators": inst.estimators.model_dump(),
            "model_state_GB": None if state is None else state.state_bytes / 1e9,
            "gpu_memory_GB": None if state is None else state.memory_bytes / 1e9}
    if why := state_shortfall(inst, state):  # a valid file, but `solve` will find no plan
        print(f"warning: {why}", file=sys.stderr)
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
    if state is not None:
        console.print(f"one copy of the model's weights, gradients and optimizer state: "
                      f"{decimal_bytes(state.state_bytes)}; memory of the {state.gpus} allowed GPUs: "
                      f"{decimal_bytes(state.memory_bytes)}")


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
        p2p = st.p2p_s if report.iteration_model == "sailor" else st.send_fwd_s
        table.add_row(str(s), f"[{st.layer_start},{st.layer_end})", reps, f"{st.fwd_s:.4f}", f"{st.bwd_s:.4f}",
                      f"{p2p:.4f}", f"{st.sync_s:.4f}", f"{peak / GIB:.1f} / {cap / GIB:.0f}{mark}")
    console.print(table)
    console.print(
        f"simulated iteration time {report.iteration_time_s:.4f} s (pipeline {report.pipeline_s:.4f} + sync {report.sync_s:.4f} "
        f"+ update {report.update_s:.4f}); {report.samples_per_s:.2f} samples/s, {report.tokens_per_s:,.0f} tokens/s, "
        f"{report.iters_per_s:.4f} it/s; cost/iteration {report.cost_per_iteration_usd:.5f} USD "
        f"(egress {report.egress_cost_usd:.5f}); {report.num_gpus} GPUs {report.gpus_by_type_zone}")
    if report.oom_ranks:
        console.print(f"[bold red]OOM on ranks {[r.rank for r in report.oom_ranks]}[/]")
    for v in report.constraint_violations:
        console.print(f"[yellow]constraint violated:[/] {v}")
    for note in report.notes:
        console.print(f"note: {note}")


@app.command()
def simulate(instance: str = typer.Argument(..., help="instance file or bundled name"),
             plan: str = typer.Argument(..., help="plan JSON file, bundled plan name, or a plan in Sailor's format"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Simulate one iteration of a plan: time, throughput, cost and per-rank memory."""
    from hetplan.orchestration.sailor_cli import load_instance_and_plan
    from hetplan.simulator import simulate as run_simulation

    inst, pl = load_instance_and_plan(instance, plan)
    report = run_simulation(inst, pl)
    if as_json:
        print_json(report.summary())
    else:
        render_simulation(report, f"plan {report.plan.name or plan} on {inst.name}")
    if report.oom_ranks:  # the figures are printed, and the status says the plan cannot run
        sys.stderr.write(f"error: the plan runs out of memory on ranks {[r.rank for r in report.oom_ranks]}\n")
        raise typer.Exit(code=2)


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "-o", "--output", help="write here instead of stdout")) -> None:
    """Export the JSON Schema of instance files."""
    from hetplan.files import write_atomic
    from hetplan.instance import instance_json_schema

    text = json.dumps(instance_json_schema(), indent=2) + "\n"
    if output:
        write_atomic(output, text, "--output")
    else:
        sys.stdout.write(text)


@app.command()
def instances() -> None:
    """List the bundled instances (usable by name wherever an instance path is expected)."""
    from hetplan.bundled import bundled_instances

    for name in bundled_instances():
        console.print(name)


def _register_commands() -> None:
    for mod in _COMMAND_MODULES:
        import_module(mod).register(app)


# Exit status (README, "Exit status"). HetplanError subclasses carry 1, 2 or 3 themselves.
EXIT_USAGE = 1
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE: a bug in hetplan, not in the input
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
_signal_exit: list[int] = []  # the exit status a caught SIGTERM asks for


def _interrupted(code: int) -> str:
    name = "SIGTERM" if code == EXIT_SIGTERM else "SIGINT"
    return f"stopped by {name}; files named with -o/--plot are written only by a command that finishes"


def _on_sigterm(signum: int, frame: object) -> None:
    # SIGTERM takes the path of Ctrl-C (KeyboardInterrupt), so the planner stops its helper and
    # no output file is written; main() then exits 143 instead of 130. (The planner's forked
    # helper is born with the signal blocked and sets its own handlers: planner.helper._helper_main.)
    _signal_exit.append(EXIT_SIGTERM)
    raise KeyboardInterrupt


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(lines) or "(no message)"


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line `warning: <message>` on stderr, like the errors: Python's default adds the
    file, line number and source line of the code that warned (--debug keeps that)."""
    kind = "" if category is UserWarning else f"{category.__name__}: "
    (file or sys.stderr).write(f"warning: {kind}{_one_line(message)}\n")


def _empty_value(args: list[str]) -> str | None:
    """The option (or argument) given an empty value, if any: no option or argument of hetplan means
    anything empty, and typer reads '' for a path as '.', so `--events ''` failed as ".: is a
    directory", naming neither the option nor the mistake."""
    for i, arg in enumerate(args):
        if arg.startswith("--") and not arg.partition("=")[2].strip() and "=" in arg:
            return arg.partition("=")[0]
        if not arg.strip():  # '' or blanks: `-o ' '` wrote a file named ' '
            if i and args[i - 1].startswith("-"):
                return args[i - 1]
            return f"the argument after {args[i - 1]!r}" if i else "the first argument"
    return None


def _fail(message: str, code: int, debug: bool) -> NoReturn:
    if debug and sys.exc_info()[0] is not None:  # (a check before any command has no traceback)
        import traceback

        traceback.print_exc()
    sys.stderr.write(f"error: {_one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(code)


@contextmanager
def _stdout_for_output_only():
    """Point file descriptor 1 at stderr while a command runs and give Python's sys.stdout the
    real stdout: C libraries (HiGHS prints a banner when a Highs object is made, SCIP logs) and
    worker processes then write to stderr, and stdout carries only what the command prints."""
    with stdout_fd_to(2) as real:
        if real is None:  # no real descriptors (embedded use): leave them
            yield
            return
        previous = sys.stdout
        sys.stdout = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        try:
            yield
        finally:
            try:
                sys.stdout.flush()
            except OSError:
                pass
            sys.stdout = previous


def _run_app(args: list[str]) -> int:
    with _stdout_for_output_only():
        code = app(args=args, prog_name="hetplan", standalone_mode=False)
    # In non-standalone mode an explicit typer.Exit comes back as its status; a command's own
    # return value (None) means success.
    return code if isinstance(code, int) else 0


def main() -> None:
    """The `hetplan` executable: every failure is one line on stderr and a documented status."""
    args = sys.argv[1:]
    debug = "--debug" in args or os.environ.get("HETPLAN_DEBUG", "") not in ("", "0")
    args = [a for a in args if a != "--debug"] or ["--help"]  # no command: show the help
    empty = _empty_value(args)
    if empty is not None:
        _fail(f"{empty}: must not be empty; leave the option out for its default", EXIT_USAGE, debug)
    signal.signal(signal.SIGTERM, _on_sigterm)
    # A job started with `&` by a non-interactive shell inherits SIGINT ignored; `kill -INT` must
    # still stop a search, so Python's own Ctrl-C handler is put back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not debug:
        warnings.showwarning = _warning_line
    try:
        _register_commands()
        code = _run_app(args)
    except HetplanError as exc:
        _fail(str(exc), exc.exit_code, debug)
    except typer.TyperException as exc:  # usage errors: missing argument, bad option value, ...
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "hetplan"
        _fail(f"{exc.format_message()} (see `{where} --help`)", EXIT_USAGE, debug)
    except (typer.Abort, KeyboardInterrupt):
        code = _signal_exit[-1] if _signal_exit else EXIT_SIGINT
        _fail(_interrupted(code), code, debug)
    except BrokenPipeError:  # `hetplan ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing more to flush into the closed pipe
        raise SystemExit(0)
    except MemoryError:
        _fail("out of memory on this machine", EXIT_INTERNAL, debug)
    except OSError as exc:  # a file system refusal that no earlier check caught
        where = f": {exc.filename}" if exc.filename else ""
        _fail(f"{exc.strerror or exc}{where}", EXIT_USAGE, debug)
    except Exception as exc:  # a bug: say so in one line; --debug shows the traceback
        _fail(f"internal error ({type(exc).__name__}: {exc}); run with --debug for the traceback "
              "and please report it", EXIT_INTERNAL, debug)
    if code == EXIT_SIGINT and _signal_exit:
        code = _signal_exit[-1]
    if code in (EXIT_SIGINT, EXIT_SIGTERM):
        sys.stderr.write(f"error: {_interrupted(code)}\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
