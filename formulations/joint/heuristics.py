"""Greedy warm start and local polish for one outer choice (the stage DP is `stage_dp.py`), and the
estimate that ranks the outer choices for them."""
from __future__ import annotations

from typing import Iterator

from hetplan.formulations.joint.inputs import JointInputs, JointSolution, _DEADLINE, check_deadline
from hetplan.formulations.joint.tables import _prefix_rows, _shared_for, blocks_identical, offers_counts
from hetplan.formulations.joint.evaluation import blocks_ranges, objective_within_limits, solution_blocks
from hetplan.formulations.joint.bounds.parts import _fastest_work_s, _gpus_per_type
from hetplan.formulations.joint.composition import iteration_time_s, worker_bytes


def promise_s(inp: JointInputs) -> float:
    """An estimate, not a bound, of one outer choice's least iteration time, to rank the choices
    the heuristics try first: F + (m - 1) max(F / P, D W / N), F one microbatch through every unit
    on its fastest pool, W its least GPU-seconds, N the GPUs available (with max_gpus) -- the cheap
    bound as it was before `fluid_gpu_seconds_s`, which made it a better bound and a worse ranking.
    It prefers many stages and small microbatches, which memory-bound models need; the fluid bound
    is B / b x the same GPU-seconds for every D and P and put b = 8, m = 2 first (measured,
    large_5type_2k at --time-limit 10: the plan returned simulates at 1.742 s ranked by the bound,
    1.611 s by this; ranked by (m + P - 1) theta_w, 1.742 s too: it ignores memory and prefers few
    stages)."""
    fastest = _fastest_work_s(inp)
    gpu_work = _shared_for(inp, "gpu_work", lambda inp: sum(
        min(inp.step_s[k][l] * inp.pools[k].tp for k in range(inp.K)) for l in range(inp.U)))
    gpus = sum(_gpus_per_type(inp).values())
    if inp.max_gpus is not None:
        gpus = min(gpus, inp.max_gpus)
    return iteration_time_s(inp.m, fastest, 0.0, max(fastest / inp.P, inp.D * gpu_work / max(gpus, 1)), 0.0)


def greedy(inp: JointInputs, order: str = "speed") -> JointSolution | None:
    """Fastest pools first (per GPU, so TP is used only where it pays; order="cost": cheapest work
    per USD first), one region per stage; layers split in proportion to stage speed, then moved off
    stages that run out of memory. None when no memory-feasible split is found."""
    left = {p.quota_key: p.avail_gpus for p in inp.pools}
    # replica time x GPUs it takes: a TP=2 replica must be twice as fast to beat two TP=1 replicas
    weight = (lambda k: inp.pools[k].price_per_gpu_hour_usd) if order == "cost" else (lambda k: 1.0)
    speed = sorted(range(inp.K), key=lambda k: sum(inp.step_s[k]) * inp.pools[k].tp * weight(k))
    replicas = []
    for _ in range(inp.P):
        check_deadline()
        row = _fill_stage(inp, left, speed)
        if row is None:
            return None
        replicas.append(row)
    ranges = _proportional_ranges(inp, replicas)
    ranges = _repair_memory(inp, replicas, ranges)
    if ranges is None:
        return None
    return JointSolution(tuple(ranges), tuple(tuple(r) for r in replicas), float("nan"), float("nan"))


POLISH_EVALS = 600  # plans one `polish` scores at most (about 0.4-1 ms each)


def polish(inp: JointInputs, found: tuple[float, JointSolution] | None, objective: str = "max_throughput",
           max_cost_usd: float | None = None, min_iters_per_s: float | None = None,
           max_evals: int = POLISH_EVALS) -> tuple[float, JointSolution] | None:
    """A local search on a heuristic plan (objective, solution): the same replica rows in another
    stage order or with other block counts. Moves: swap two stages' replicas (their unit ranges
    kept), or, with identical blocks, move one stage (its replicas and blocks) to another position,
    or one block across a boundary between neighbouring stages; first improvement by the
    model's objective (`objective_within_limits`, so the limits hold), every stage in memory
    (`_stage_fits`). The GPUs each pool gives are unchanged, so quotas hold too. The heuristics
    decide each stage's class and block count, not where it goes: the stage DP is indifferent to the
    order (its sum of stage times is the same), and placing stages one by one leaves the ends in
    different zones (the tied embedding's all-reduce crosses zones) or a stage spread over zones at
    an end (its all-reduce spans zones and adds the tied one). Measured on opt350-2zones-budget,
    P6 b1 D64: the stage DP's plan 1.747 s -> 1.631 s (the choice's optimum: 1.629 s), and the whole
    search 59 s (time limit) -> 39 s. The stage DP balances the stages' compute, not their sends,
    which cross regions at some boundaries only (measured: Sailor's OPT-350M on 64 + 64 A100 in two
    regions, P4 b2 D16: the DP's 6, 6, 6, 6 blocks 3.4997 s, moved to 7, 5, 5, 7 3.2495 s, the
    choice's optimum 3.2450 s). Stops at `max_evals` plans or at the
    deadline (`deadline_scope`), with the best plan by then; a heuristic: no bound reads it."""
    if found is None or inp.P < 2:
        return found
    best, sol = found
    ranges, rows = list(sol.ranges), [tuple(r) for r in sol.replicas]
    blocks = solution_blocks(inp, sol) if blocks_identical(inp) else None
    evals, P = 0, inp.P

    def score(new_ranges: list, new_rows: list) -> float | None:
        if not all(_stage_fits(inp, new_rows[i], i, *new_ranges[i]) for i in range(P)):
            return None
        cand = JointSolution(tuple(new_ranges), tuple(new_rows), float("nan"), float("nan"))
        return objective_within_limits(inp, cand, objective, max_cost_usd, min_iters_per_s)

    def moves():
        for i in range(P):
            for j in range(i + 1, P):
                if rows[i] != rows[j]:
                    new_rows = list(rows)
                    new_rows[i], new_rows[j] = rows[j], rows[i]
                    yield list(ranges), new_rows
        if blocks is None:
            return
        for j in range(P):
            for i in range(P):
                if i == j:
                    continue
                new_rows, counts = list(rows), list(blocks)
                new_rows.insert(i, new_rows.pop(j))
                counts.insert(i, counts.pop(j))
                if new_rows == rows and counts == blocks:
                    continue
                yield from _in_compact_form(inp, counts, new_rows)
        for j in range(P - 1):  # one block across the boundary between stages j and j + 1
            for step in (1, -1):
                counts = list(blocks)
                counts[j], counts[j + 1] = counts[j] + step, counts[j + 1] - step
                yield from _in_compact_form(inp, counts, rows)

    improved = True
    while improved and evals < max_evals and not _DEADLINE.get().expired():
        improved = False
        for new_ranges, new_rows in moves():
            evals += 1
            obj = score(new_ranges, new_rows)
            if obj is not None and obj < best * (1 - 1e-9):
                best, ranges, rows, improved = obj, new_ranges, new_rows, True
                if blocks is not None:
                    blocks = [e - s for s, e in ranges]
                    blocks[0] -= 1
                    blocks[-1] -= 1
                break
            if evals >= max_evals or _DEADLINE.get().expired():
                break
    if best == found[0]:
        return found
    return best, JointSolution(tuple(ranges), tuple(rows), float("nan"), float("nan"))


def _in_compact_form(inp: JointInputs, counts: list[int], rows: list) -> Iterator[tuple[list, list]]:
    """(unit ranges, rows) of a plan with `counts` blocks per stage, if it lies in the compact form
    (`tables.offers_counts`)."""
    if offers_counts(inp, counts):
        yield blocks_ranges(counts), rows


def _fill_stage(inp: JointInputs, left: dict, order: list[int]) -> list[int] | None:
    def room(r: str) -> int:
        return sum(n for (g, z), n in left.items() if any(p.zone == z and p.region == r for p in inp.pools))

    for region in sorted(inp.regions, key=lambda r: -room(r)):
        row, need, trial = [0] * inp.K, inp.D, dict(left)
        for k in order:
            pool = inp.pools[k]
            if pool.region != region:
                continue
            n = min(need, trial[pool.quota_key] // pool.tp)
            row[k], need = n, need - n
            trial[pool.quota_key] -= n * pool.tp
        if need == 0:
            left.update(trial)
            return row
    return None


def _stage_unit_time(inp: JointInputs, row: list[int], l: int) -> float:
    return max(inp.step_s[k][l] for k in range(inp.K) if row[k] > 0)


def _proportional_ranges(inp: JointInputs, replicas: list[list[int]]) -> list[tuple[int, int]]:
    """Zorse-style proportional split: stage i gets units in proportion to its speed."""
    per_unit = [sum(_stage_unit_time(inp, row, l) for l in range(inp.U)) / inp.U for row in replicas]
    speed = [1 / t for t in per_unit]
    total = sum(speed)
    bounds, acc = [0], 0.0
    for i in range(inp.P - 1):
        acc += speed[i] / total * inp.U
        lo, hi = bounds[-1] + 1, inp.U - (inp.P - 1 - i)
        bounds.append(min(max(int(round(acc)), lo), hi))
    bounds.append(inp.U)
    return [(bounds[i], bounds[i + 1]) for i in range(inp.P)]


def _stage_fits(inp: JointInputs, row: list[int], i: int, start: int, end: int) -> bool:
    stat, act = _shared_for(inp, "memory_prefix", lambda inp: (_prefix_rows(inp.stat_bytes).tolist(),
                                                               _prefix_rows(inp.act_bytes).tolist()))
    nf = inp.in_flight(i)
    return all(not row[k] or worker_bytes(stat[k][end] - stat[k][start], act[k][end] - act[k][start], nf)
               <= inp.cap_bytes[k]
               for k in range(inp.K))


def _repair_memory(inp: JointInputs, replicas: list[list[int]], ranges: list[tuple[int, int]]):
    bounds = [r[0] for r in ranges] + [inp.U]
    fits = lambda i: _stage_fits(inp, replicas[i], i, bounds[i], bounds[i + 1])  # noqa: E731
    ok = [fits(i) for i in range(inp.P)]
    seen = set()
    for _ in range(inp.U * inp.P):
        if all(ok):
            return [(bounds[i], bounds[i + 1]) for i in range(inp.P)]
        # the next move depends on the boundaries alone: once they repeat, the moves cycle until
        # the loop's count runs out, with None
        key = tuple(bounds)
        if key in seen:
            return None
        seen.add(key)
        i = ok.index(False)
        # move a boundary unit to a neighbour that still has room: later stages hold fewer microbatches
        if i + 1 < inp.P and bounds[i + 1] - 1 > bounds[i]:
            bounds[i + 1] -= 1
            moved = (i, i + 1)
        elif i > 0 and bounds[i] + 1 < bounds[i + 1]:
            bounds[i] += 1
            moved = (i - 1, i)
        else:
            return None
        for j in moved:  # only the two stages that share the moved boundary change
            ok[j] = fits(j)
    return None
