"""Event timeline of one iteration's pipeline (for `hetplan solve --plot`).

Replays the schedule with the simulator's per-stage step times: stage s runs a microbatch's forward
after its own previous work and after stage s-1's forward of it plus the transfer; backwards flow the
other way. 1F1B: stage s warms up with min(P - s, m) forwards, then alternates one backward and one
forward; GPipe: all forwards, then all backwards. Gradient sync and the optimizer step follow.
"""
from __future__ import annotations

from dataclasses import dataclass

from hetplan.simulator import SimulationReport


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


def plot_timeline(report: SimulationReport, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = pipeline_events(report)
    colors = {"F": "#4c72b0", "B": "#dd8452", "sync": "#55a868", "update": "#8172b2"}
    fig, ax = plt.subplots(figsize=(12, 1 + 0.5 * len(report.stages)))
    for e in events:
        ax.barh(e.stage, e.end_s - e.start_s, left=e.start_s, color=colors[e.kind], edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(report.stages)), [f"stage {s}" for s in range(len(report.stages))])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"{report.plan.schedule}, {report.plan.num_microbatches} microbatches, "
                 f"iteration {report.iteration_time_s:.3f} s")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, ["forward", "backward", "grad sync", "update"], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
