"""The exact driver of the device-grouping formulation (formulations/device_grouping.py, AutoHet
eq. 3): enumerate the group count k and, per k, prove that nothing beats the incumbent or beat it,
with threshold models over patterns (or the ordered-counts MILP) solved through hetplan.solvers."""
from __future__ import annotations

from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any, Literal

import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.formulations.common import FormulationInputError, SolveRecord
from hetplan.formulations.device_grouping import (_REL_EPS, DeviceGrouping, DeviceGroupingInputs, all_classes_add,
                                                  build_counts, build_patterns, candidate_patterns, decode, greedy,
                                                  greedy_for, warm_start)
from hetplan.solvers import SolveOptions, Status, solve


@dataclass(frozen=True)
class DeviceGroupingSolution:
    grouping: DeviceGrouping | None
    objective: float  # k z of the best grouping (0 when none)
    bound: float  # proven upper bound on k z over all k
    proven_optimal: bool
    greedy: DeviceGrouping | None
    records: tuple[SolveRecord, ...]
    build_s: float
    solve_s: float
    total_s: float
    variant: str

    @property
    def gap(self) -> float:
        return 0.0 if self.bound <= self.objective else (self.bound - self.objective) / max(abs(self.objective), 1e-12)

    @property
    def models_solved(self) -> int:
        return sum(1 for r in self.records if not r.outcome.startswith("pruned"))


def optimize(inputs: DeviceGroupingInputs, backend: str | None = None, options: Any = None,
             variant: Literal["patterns", "counts"] = "patterns", time_limit_s: float | None = None,
             rel_gap: float = 1e-9, probe_step: float = 0.0, use_greedy: bool = True) -> DeviceGroupingSolution:
    """Exact device grouping: enumerate k; per k, prove that nothing beats the incumbent or beat it.

    variant="patterns": per k, threshold models (is there a k-grouping with min G >= z?) climbed
    from z = incumbent / k upward (packing form over minimal patterns where it is valid). With
    probe_step > 0, a probe phase first lowers a target objective from the best bound in steps of
    `probe_step` (relative) until some k reaches it, so the exact pass starts near the optimum.
    variant="counts": per k, the ordered-counts MILP maximising z >= incumbent / k.
    `options` (hetplan.solvers.SolveOptions) applies to every solve; `time_limit_s` caps the loop.
    """
    ctx = _Ctx(inputs, backend, _with(options or SolveOptions(), diagnose_infeasible=False), time_limit_s)
    start = greedy(inputs) if use_greedy else None
    if start is not None:
        ctx.offer(start)
    ks = sorted(range(1, inputs.max_groups + 1), key=lambda kk: -inputs.upper_bound(kk))
    if variant == "patterns":
        _probe(ctx, ks, probe_step)
    elif variant != "counts":
        raise FormulationInputError(f"unknown variant {variant!r}; use 'patterns' or 'counts'", "variant")
    open_bounds: list[float] = []
    for k in ks:
        ub = inputs.upper_bound(k)
        if ub <= ctx.best_obj * (1 + rel_gap):
            ctx.records.append(SolveRecord(f"k={k}", "pruned_bound", None, ub, 0.0, 0.0))
        elif ctx.out_of_time():
            ctx.records.append(SolveRecord(f"k={k}", "not_reached", None, ub, 0.0, 0.0))
            open_bounds.append(ub)
        else:
            bound = _climb(ctx, k) if variant == "patterns" else _solve_counts(ctx, k)
            if bound is not None:
                open_bounds.append(min(bound, ub))
    records = tuple(ctx.records)
    final = [r for r in records if not r.key.startswith("probe")]
    bound = max([ctx.best_obj, *open_bounds])
    closed = all(r.outcome in ("pruned_bound", "pruned_empty", "optimal", "infeasible") for r in final)
    proven = closed and ctx.best is not None and bound <= ctx.best_obj * (1 + 1e-6)
    return DeviceGroupingSolution(ctx.best, ctx.best_obj, bound, proven, start,
                                  records, ctx.build_s, ctx.solve_s, perf_counter() - ctx.t0, variant)


class _Ctx:
    """Mutable state of one `optimize` run: incumbent, records, clocks."""

    def __init__(self, inputs: DeviceGroupingInputs, backend: str | None, options: Any, limit: float | None):
        self.inputs, self.backend, self.options, self.limit = inputs, backend, options, limit
        self.t0 = perf_counter()
        self.best: DeviceGrouping | None = None
        self.best_obj = 0.0
        self.records: list[SolveRecord] = []
        self.build_s = self.solve_s = 0.0

    def offer(self, grouping: DeviceGrouping) -> None:
        if grouping.objective > self.best_obj:
            self.best, self.best_obj = grouping, grouping.objective

    def out_of_time(self) -> bool:
        return self.limit is not None and perf_counter() - self.t0 >= self.limit

    def run(self, model: pyo.ConcreteModel, warm: ComponentMap | None = None) -> Any:
        opts = self.options
        if self.limit is not None:
            left = max(0.01, self.limit - (perf_counter() - self.t0))
            opts = _with(opts, time_limit_s=min(left, opts.time_limit_s or left))
        res = solve(model, backend=self.backend, options=opts, warm_start=warm)
        self.solve_s += res.solve_s
        return res


def _threshold(ctx: _Ctx, k: int, z_min: float, key: str) -> tuple[Any, DeviceGrouping | None]:
    """One threshold question; returns (status or 'pruned_empty', grouping found or None)."""
    tb = perf_counter()
    packing = all_classes_add(ctx.inputs, z_min)
    pats = candidate_patterns(ctx.inputs, k, z_min, minimal=packing)
    uncovered = not packing and any(n > 0 and not pats[0][:, c].any() for c, n in enumerate(ctx.inputs.counts))
    if len(pats[0]) == 0 or uncovered:
        ctx.records.append(SolveRecord(key, "pruned_empty", None, None, perf_counter() - tb, 0.0, columns=0))
        return "pruned_empty", None
    model = build_patterns(ctx.inputs, k, z_min, patterns=pats, form="packing" if packing else "threshold")
    bs = perf_counter() - tb
    ctx.build_s += bs
    res = ctx.run(model)
    found = decode(model) if res.status.has_solution else None
    if found is not None:
        ctx.offer(found)
    status = Status.OPTIMAL if res.status.has_solution else res.status  # feasibility: found = answered
    ctx.records.append(SolveRecord(key, status.value, found.objective if found else None, None, bs, res.solve_s,
                                   res.nodes, len(pats[0])))
    return status, found


def _probe(ctx: _Ctx, ks: list[int], step: float) -> None:
    """Lower a target objective from the best bound until some k reaches it (or the incumbent).

    Within a level, k is tried in decreasing greedy objective: a level below the optimum then
    usually stops after a few models."""
    if step <= 0:
        return
    score = {}
    for k in ks:
        g = greedy_for(ctx.inputs, k)
        score[k] = g.objective if g is not None else 0.0
    order = sorted(ks, key=lambda k: (-score[k], -k))
    target = max(ctx.inputs.upper_bound(k) for k in ks) * (1 - step)
    while target > ctx.best_obj * (1 + step) and not ctx.out_of_time():
        for k in order:
            if ctx.inputs.upper_bound(k) <= target or ctx.out_of_time():
                continue
            _, found = _threshold(ctx, k, target / k, f"probe {target:.6g} k={k}")
            if found is not None:
                return
        target *= 1 - step


def _climb(ctx: _Ctx, k: int) -> float | None:
    """Raise z for this k until the threshold model is infeasible; None when closed, else a bound."""
    while True:
        if ctx.out_of_time():
            ctx.records.append(SolveRecord(f"k={k}", "not_reached", None, None, 0.0, 0.0))
            return ctx.inputs.upper_bound(k)
        z_min = ctx.best_obj / k * (1 + _REL_EPS)
        status, found = _threshold(ctx, k, z_min, f"k={k}")
        if status in ("pruned_empty", Status.INFEASIBLE):
            return None
        if found is None:  # time limit or error without an answer: k stays open
            return ctx.inputs.upper_bound(k)


def _solve_counts(ctx: _Ctx, k: int) -> float | None:
    tb = perf_counter()
    z_min = ctx.best_obj / k * (1 + _REL_EPS)
    model = build_counts(ctx.inputs, k, z_min)
    bs = perf_counter() - tb
    ctx.build_s += bs
    warm = None
    if ctx.best is not None and ctx.best.num_groups == k and ctx.best.objective >= z_min * k:
        warm = warm_start(model, ctx.best)
    res = ctx.run(model, warm)
    obj = None
    if res.status.has_solution:
        found = decode(model)
        obj = found.objective
        ctx.offer(found)
    bound = None
    if res.status not in (Status.OPTIMAL, Status.INFEASIBLE):
        bound = res.bound * ctx.inputs.g_max if res.bound is not None else ctx.inputs.upper_bound(k)
    elif res.status == Status.OPTIMAL and res.bound is not None:
        bound = res.bound * ctx.inputs.g_max  # what the solver's gap tolerance leaves open
    ctx.records.append(SolveRecord(f"k={k}", res.status.value, obj, bound, bs, res.solve_s, res.nodes))
    return bound


def _with(options: Any, **changes: Any) -> Any:
    return replace(options, **changes)
