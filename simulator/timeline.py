"""Event timeline of one iteration's pipeline (for `hetplan solve --plot`), and the throughput-cost
front (for `hetplan pareto --plot`); both drawn with matplotlib's Agg backend.

Replays the schedule with the simulator's per-stage step times: stage s runs a microbatch's forward
after its own previous work and after stage s-1's forward of it plus the transfer; backwards flow the
other way. 1F1B: stage s warms up with min(P - s, m) forwards, then alternates one backward and one
forward; GPipe: all forwards, then all backwards. Gradient sync and the optimizer step follow.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetplan.errors import PlanError
from hetplan.simulator.pipeline import SimulationReport

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Event:
    stage: int
    kind: str  # "F" | "B" | "sync" | "update"
    microbatch: int
    start_s: float
    end_s: float


def _order(schedule: str, s: int, P: int, m: int) -> list[tuple[str, int]]:
    if schedule == "GPipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(P - s, m)
    ops = [("F", j) for j in range(warm)]
    nf, nb = warm, 0
    while nb < m:
        ops.append(("B", nb))
        nb += 1
        if nf < m:
            ops.append(("F", nf))
            nf += 1
    return ops


def pipeline_events(report: SimulationReport) -> list[Event]:
    plan, st = report.plan, report.stages
    P, m = len(st), plan.num_microbatches
    orders = [_order(plan.schedule, s, P, m) for s in range(P)]
    pos = [0] * P
    free = [0.0] * P
    done: dict[tuple[str, int, int], float] = {}
    events: list[Event] = []
    while any(pos[s] < len(orders[s]) for s in range(P)):
        progressed = False
        for s in range(P):
            if pos[s] >= len(orders[s]):
                continue
            kind, j = orders[s][pos[s]]
            if kind == "F":
                dep = 0.0 if s == 0 else done.get(("F", s - 1, j))
                ready = None if dep is None else dep + (st[s - 1].send_fwd_s if s > 0 else 0.0)
                dur = st[s].fwd_s
            else:
                dep = done.get(("F", s, j)) if s == P - 1 else done.get(("B", s + 1, j))
                ready = None if dep is None else dep + (st[s].send_bwd_s if s < P - 1 else 0.0)
                dur = st[s].bwd_s
            if ready is None:
                continue
            start = max(ready, free[s])
            free[s] = start + dur
            done[(kind, s, j)] = free[s]
            events.append(Event(s, kind, j, start, free[s]))
            pos[s] += 1
            progressed = True
        if not progressed:  # cannot happen for valid schedules; guards against an endless loop
            raise RuntimeError("pipeline schedule deadlocked")
    end = max(e.end_s for e in events)
    for s in range(P):
        events.append(Event(s, "sync", -1, end, end + report.sync_s))
        events.append(Event(s, "update", -1, end + report.sync_s, end + report.sync_s + report.update_s))
    return events


_COLORS = {"F": "#4c72b0", "B": "#dd8452", "sync": "#55a868", "update": "#8172b2"}
_LABELS = {"F": "forward", "B": "backward", "sync": "grad sync", "update": "update"}
_DPI = 120


def _figure(width_in: float, height_in: float) -> Figure:
    """A figure drawn by Agg, detached from pyplot (no global state, no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in))
    FigureCanvasAgg(fig)
    return fig


def _legend_right(ax: Axes, handles: list, labels: list[str]) -> None:
    # Outside the axes: inside, it covered the last stage's final backward, sync and update.
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)


def _save_png(fig: Figure, path: str | Path) -> None:
    """PNG via a temporary file renamed over `path`: never a half-written image."""
    from hetplan.files import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")  # "tight" keeps the outside legend
    write_atomic(path, buf.getvalue(), "--plot")


def timeline_figure(report: SimulationReport) -> Figure:
    """One iteration's pipeline as horizontal bars per stage, legend to the right of the axes."""
    from matplotlib.patches import Rectangle

    P = len(report.stages)
    fig = _figure(12, 1 + 0.5 * P)
    ax = fig.add_subplot()
    # One collection per (stage, kind): a bar per event took seconds for a few hundred microbatches.
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in pipeline_events(report):
        spans.setdefault((e.stage, e.kind), []).append((e.start_s, e.end_s - e.start_s))
    # White gaps separate neighbouring steps; with many microbatches they would hide the bars.
    edge = 0.3 if report.plan.num_microbatches <= 32 else 0.0
    for (stage, kind), xranges in spans.items():
        ax.broken_barh(xranges, (stage - 0.4, 0.8), facecolors=_COLORS[kind], edgecolor="white", linewidth=edge)
    ax.set_xlim(left=0.0)
    ax.set_yticks(range(P), [f"stage {s}" for s in range(P)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"{report.plan.schedule}, {report.plan.num_microbatches} microbatches, "
                 f"iteration {report.iteration_time_s:.3f} s")
    _legend_right(ax, [Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()], list(_LABELS.values()))
    return fig


def plot_timeline(report: SimulationReport, path: str | Path) -> None:
    _save_png(timeline_figure(report), path)


_FRONT_KEYS = ("budget_usd", "cost_usd", "iters_per_s", "samples_per_s", "gpus", "gap")


def pareto_figure(front: list[dict[str, Any]]) -> Figure:
    """Throughput (iterations/s) over cost (USD/iteration), one point per plan of the front,
    annotated with its GPU count; legend to the right of the axes."""
    _check_front(front)
    points = sorted({(p["cost_usd"], p["iters_per_s"], p["gpus"]) for p in front})  # budgets may repeat a plan
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    (line,) = ax.plot([c for c, _, _ in points], [t for _, t, _ in points], marker="o", color=_COLORS["F"])
    for cost, its, gpus in points:
        label = f"{gpus} GPU" if gpus == 1 else f"{gpus} GPUs"
        ax.annotate(label, (cost, its), xytext=(6, -12), textcoords="offset points", fontsize=8)
    ax.margins(x=0.12, y=0.15)  # room for the annotations inside the axes
    ax.set_xlabel("cost (USD / iteration)")
    ax.set_ylabel("throughput (iterations / s)")
    ax.set_title("throughput-cost front")
    ax.grid(alpha=0.3)
    _legend_right(ax, [line], [f"front ({len(points)} plans)"])
    return fig


def plot_pareto(front: list[dict[str, Any]], path: str | Path) -> None:
    """Write the throughput-cost front as a PNG (for `hetplan pareto --plot FILE`)."""
    _save_png(pareto_figure(front), path)


def _check_front(front: list[dict[str, Any]]) -> None:
    if not front:
        raise PlanError("no plans to plot", "front")
    for i, row in enumerate(front):
        missing = [k for k in _FRONT_KEYS if k not in row]
        if missing:
            raise PlanError(f"missing keys {missing}", f"front[{i}]")
        for key in ("cost_usd", "iters_per_s"):
            value = row[key]
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PlanError(f"expected a finite number, got {value!r}", f"front[{i}].{key}")
