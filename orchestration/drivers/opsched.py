"""The driver of the operator-scheduling formulation (formulations/opsched.py, seed 004 sec. 3.2):
build, warm-start from the greedy (or a given) schedule, solve through hetplan.solvers, decode and
replay; and the re-search after a bandwidth change (004 sec. 2.2 / 5)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyomo.environ as pyo

from hetplan.errors import InstanceError
from hetplan.formulations.opsched import build, decode, greedy, greedy_warm_start, repair
from hetplan.formulations.opsched_graph import DeviceGraph, OpGraph
from hetplan.formulations.opsched_replay import Schedule, replay
from hetplan.solvers import SolveOptions, solve


@dataclass(frozen=True)
class OpSchedResult:
    schedule: Schedule  # the best schedule found, re-timed exactly by the replayer
    objective_s: float  # its weighted makespan
    makespans_s: dict[str, float]
    incumbent_objective_s: float  # the warm start's (greedy's by default)
    solver: Any  # hetplan.solvers.SolveResult
    build_s: float
    num_vars: int
    num_constraints: int
    from_solver: bool  # False when the solver found nothing better than the warm start


def solve_schedule(graph: OpGraph, devices: DeviceGraph, backend: str | None = None, options: Any = None,
                   incumbent: Schedule | None = None) -> OpSchedResult:
    """Build, warm-start from the incumbent (greedy by default), solve, decode and replay."""
    model = build(graph, devices, incumbent)
    ws = greedy_warm_start(model)
    result = solve(model, backend=backend, options=options or SolveOptions(), warm_start=ws.values)
    best, from_solver = replay(ws.schedule, graph, devices), False
    if result.status.has_solution:
        solved = replay(decode(model), graph, devices)
        if solved.objective_s <= best.objective_s * (1 + 1e-9):
            best, from_solver = solved, True
    n_vars = sum(1 for _ in model.component_data_objects(pyo.Var))
    n_cons = sum(1 for _ in model.component_data_objects(pyo.Constraint))
    return OpSchedResult(best.schedule, best.objective_s, best.makespans_s, ws.objective_s, result,
                         model.opsched_build_s, n_vars, n_cons, from_solver)


@dataclass(frozen=True)
class BandwidthChangeReport:
    """Figures of one bandwidth event (004 sec. 2.2 / 5: re-search after the network changes)."""

    link: tuple[str, str]
    channel: str
    old_bandwidth_GBps: float
    new_bandwidth_GBps: float
    before_s: float  # weighted makespan of the schedule on the old bandwidth
    kept_s: float  # the same schedule (same decisions) re-timed on the new bandwidth
    rescheduled_s: float  # re-solved on the new bandwidth, warm-started from the kept schedule
    greedy_after_s: float  # HEFT on the new bandwidth, for reference
    makespans_before_s: dict[str, float]
    makespans_kept_s: dict[str, float]
    makespans_rescheduled_s: dict[str, float]
    schedule: Schedule  # the re-scheduled one
    solver: Any  # hetplan.solvers.SolveResult of the re-solve
    warm_start: str  # which start the re-solve got
    warm_start_s: float  # its weighted makespan

    @property
    def saving(self) -> float:
        """Fraction of the kept schedule's weighted makespan saved by re-scheduling."""
        return 1.0 - self.rescheduled_s / self.kept_s


def reschedule_after_bandwidth_change(graph: OpGraph, devices: DeviceGraph, schedule: Schedule,
                                      link: tuple[str, str], channel: str, bandwidth_GBps: float,
                                      backend: str | None = None, options: Any = None) -> BandwidthChangeReport:
    """Change one channel's bandwidth; report the old schedule before / after (kept) and the
    re-solved schedule, warm-started from the old schedule (kept, or with its transfers re-routed
    around the changed channel), or from HEFT on the new graph when that is better."""
    old = [c for c in devices.channels(*link) if c.name == channel]
    if not old:
        raise InstanceError(f"no channel {channel!r} between {link[0]!r} and {link[1]!r}", "channel")
    new_devices = devices.with_channel_bandwidth(link[0], link[1], channel, bandwidth_GBps)
    before = replay(schedule, graph, devices)
    kept = replay(schedule, graph, new_devices)
    greedy_after = replay(greedy(graph, new_devices), graph, new_devices)
    # warm start: the old schedule, kept as is or with its transfers re-routed (same assignment and
    # order); HEFT on the new graph only when it beats both (it also tightens the big-M horizon)
    starts = {"kept old schedule": kept}
    repaired = repair(graph, new_devices, schedule)
    if repaired is not None:
        starts["old schedule, transfers re-routed"] = replay(repaired, graph, new_devices)
    starts["greedy on the new bandwidth"] = greedy_after
    label = min(starts, key=lambda k: starts[k].objective_s)
    res = solve_schedule(graph, new_devices, backend=backend, options=options, incumbent=starts[label].schedule)
    return BandwidthChangeReport(
        link=tuple(link), channel=channel, old_bandwidth_GBps=old[0].bandwidth_GBps,
        new_bandwidth_GBps=bandwidth_GBps, before_s=before.objective_s, kept_s=kept.objective_s,
        rescheduled_s=res.objective_s, greedy_after_s=greedy_after.objective_s,
        makespans_before_s=before.makespans_s, makespans_kept_s=kept.makespans_s,
        makespans_rescheduled_s=res.makespans_s, schedule=res.schedule, solver=res.solver,
        warm_start=label, warm_start_s=starts[label].objective_s)
