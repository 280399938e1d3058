"""`hetplan replay INSTANCE [TRACE]`: simulate a job through hours of changing availability.

TRACE is a Sailor trace CSV (`,Timestamp,<GPU>_<zone>,...`, replacing the instance's own
`events.trace_csv`) or a YAML/JSON events file (`events: [{kind: failure, time_s: 900, node: ...}]`,
see `hetplan.cluster_state.read_events_file`). Prints the warm strategy's timeline per event and
the comparison with re-planning from scratch and with a static plan (`--json`: everything).
"""
from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table


# the options whose checks ReplayOptions and ReplanOptions make, by their fields
FLAGS = {"replay.horizon_s": "--horizon", "replay.restart_s": "--restart-s", "replay.notice_s": "--notice-s",
         "replay.initial_time_limit_s": "--initial-time-limit", "replay.fixed_latency_s": "--fixed-latency",
         "replay.checkpoint_interval_s": "--checkpoint-interval", "replan.move_penalty_s": "--move-penalty",
         "replan.planner_time_limit_s": "--planner-time-limit", "replay.strategies": "--strategies"}


def _options(horizon, restart, notice, no_notice, planner_time_limit, initial_time_limit, fixed_latency,
             strategies, move_penalty, checkpoint_interval):
    """ReplayOptions from the command line; an option they refuse is named by its flag."""
    from dataclasses import replace

    from hetplan.errors import fields_as
    from hetplan.orchestration.replay import ReplayOptions

    names = tuple(s.strip() for s in strategies.split(",") if s.strip())
    with fields_as(FLAGS):
        ropts = replace(ReplayOptions().replan, planner_time_limit_s=planner_time_limit, move_penalty_s=move_penalty)
        return ReplayOptions(horizon_s=horizon, restart_s=restart, notice_s=None if no_notice else notice,
                             checkpoint_interval_s=checkpoint_interval, initial_time_limit_s=initial_time_limit,
                             replan=ropts, strategies=names, fixed_latency_s=fixed_latency)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def render(result) -> None:
    from hetplan.orchestration.cli import console

    init = result.initial
    console.print(f"replay of {result.instance}: {result.num_events} events from {result.start_s:g} s to "
                  f"{result.horizon_s:g} s ({_hours(result.horizon_s - result.start_s)}); first plan: "
                  f"{init.get('num_gpus', 0)} GPUs, {init.get('stages', 0)} stages, "
                  f"{init.get('samples_per_s', 0.0):.1f} samples/s")
    for name in ("warm",) if "warm" in result.strategies else tuple(result.strategies)[:1]:
        strat = result.strategies[name]
        table = Table(title=f"timeline ({name} re-planning)")
        for col in ("t s", "events", "action", "re-plan s", "migration s", "remote-only s", "downtime s", "moved ranks",
                    "samples/s", "GPUs", "USD/h"):
            table.add_column(col, justify="left" if col in ("events", "action") else "right")
        for r in strat.records:
            table.add_row(f"{r.time_s:g}", "; ".join(r.events), r.action, f"{r.latency_s:.3f}", f"{r.migration_s:.2f}",
                          f"{r.remote_only_s:.2f}", f"{r.downtime_s:.1f}", str(r.moved_ranks), f"{r.samples_per_s:.1f}",
                          str(r.gpus), f"{r.usd_per_h:.2f}")
        console.print(table)
    table = Table(title="strategies")
    for col in ("strategy", "samples (M)", "cost USD", "USD / M samples", "training", "downtime", "no GPUs",
                "lost samples", "reconfigurations", "re-plan s mean / max"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for name, strat in result.strategies.items():
        d = strat.summary()
        per_m = d["usd_per_million_samples"]
        table.add_row(name, f"{d['total_samples'] / 1e6:.3f}", f"{d['total_cost_usd']:.2f}",
                      f"{per_m:.2f}" if per_m is not None else "-", _hours(d["train_s"]), _hours(d["downtime_s"]),
                      _hours(d["idle_s"]), f"{d['lost_samples']:.0f}", str(d["reconfigurations"]),
                      f"{d['replan_latency_mean_s']:.3f} / {d['replan_latency_max_s']:.3f}")
    console.print(table)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"replayed in {result.wall_s:.1f} s")


def _run(inst, trace, opts, quiet: bool):
    """Replay; on a terminal, a progress line on stderr per strategy: events handled, trace time,
    and the samples/s of the plan training after the last event."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hetplan.orchestration.replay import replay as run_replay

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        return run_replay(inst, trace, opts)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def tick(state) -> None:
            if state.strategy not in tasks:
                tasks[state.strategy] = bar.add_task(state.strategy, total=state.total)
            bar.update(tasks[state.strategy], completed=state.done,
                       description=f"{state.strategy}: t={state.time_s:g} s, {state.samples_per_s:.1f} samples/s")

        return run_replay(inst, trace, opts, progress=tick)


def register(app: typer.Typer) -> None:
    from hetplan.orchestration.cli import print_json

    @app.command()
    def replay(instance: str = typer.Argument(..., help="instance file or bundled name"),
               trace: Optional[str] = typer.Argument(None, help="Sailor trace CSV (in place of the instance's "
                                                     "trace_csv) or events YAML/JSON, played with the instance's own "
                                                     "events (at the same time, those apply after a trace's row)"),
               horizon: Optional[float] = typer.Option(None, "--horizon", help="end time in seconds"),
               restart: float = typer.Option(30.0, "--restart-s", help="seconds per reconfiguration for restart"),
               notice: float = typer.Option(30.0, "--notice-s", help="preemption notice before availability drops"),
               no_notice: bool = typer.Option(False, "--no-notice", help="drops come without notice"),
               planner_time_limit: float = typer.Option(0.3, "--planner-time-limit",
                                                        help="seconds for the joint planner at each event"),
               initial_time_limit: float = typer.Option(3.0, "--initial-time-limit",
                                                        help="seconds for the first plan"),
               fixed_latency: Optional[float] = typer.Option(None, "--fixed-latency",
                                                             help="charge this re-plan latency (reproducible runs)"),
               strategies: str = typer.Option("warm,cold,static", "--strategies"),
               move_penalty: float = typer.Option(0.0, "--move-penalty",
                                                  help="training seconds charged per rank that must load state"),
               checkpoint_interval: float = typer.Option(600.0, "--checkpoint-interval"),
               as_json: bool = typer.Option(False, "--json")) -> None:
        """Replay an availability trace: re-plan at each event and compare with static / cold re-planning."""
        from hetplan.instance import load_instance

        # the options first: a bad one is refused before the instance is read or anything planned
        opts = _options(horizon, restart, notice, no_notice, planner_time_limit, initial_time_limit, fixed_latency,
                        strategies, move_penalty, checkpoint_interval)
        inst = load_instance(instance)
        result = _run(inst, trace, opts, quiet=as_json)
        if as_json:
            print_json(result.summary())
            return
        render(result)
