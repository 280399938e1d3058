"""A dynamic-programming heuristic for one outer choice of the joint model (blocks form).

The greedy of `heuristics.greedy` fills stages with the fastest pools in turn and splits layers in
proportion to speed; it cannot trade a stage's TP degree against its memory, and on mixed A100 +
V100 clusters it often finds no plan or one far from the optimum (GPT-Neo, 32 A100 + 96 V100,
P5 b1 D16: no plan, where the optimum puts the embedding stage on V100 at TP 4). This heuristic
searches plans of *homogeneous* stages exactly, by a dynamic program over the stages:

  For a cap theta on the stage time, stage i may hold n blocks on D replicas of one time class
  r = (GPU type g, TP t) when r fits n blocks in memory there and time[r,i,n] <= theta
  (`tables._class_figures`). The state after stages 0..i is (blocks placed s, GPUs used per type
  in units of D q GPUs), the value the least sum of stage times (value="time") or the least GPU
  rate (value="cost"):
      V_i[s + n, u + e_g ceil(t / q)] = min(V_{i-1}[s, u] + val(r, i, n))
  q = 1 unless the state space would be too large; then usage is rounded up (still within quota).
  A plan ends at s = L with usage within every type's GPUs. theta is swept over the class stage
  times from the least one the DP accepts, and each plan is scored with `evaluate.evaluate` (the
  model's own T and cost, with all-reduce, update and boundary terms), so the best one kept is
  exactly what the MILP would charge for it. The sum of stage times does not see the all-reduce
  + update of the heaviest stage (sigma + mu in T): at each theta, the DP is solved again with a
  cap e on every stage's all-reduce + update just below the plan's largest (choices with
  `tables._class_extras` > e are dropped), while T keeps falling (`_less_sync`).

Zones are merged in the DP; a plan is then placed stage by stage in one zone with room for all
of its replicas, or spread over the zones of one region (Sailor H5), or dropped. Mixed stages (two
classes in one stage) are outside this heuristic's space: the MILP covers them.

Time: the DP checks the search's deadline (`inputs.deadline_scope`) at every stage (one stage is
up to ~50 ms with 4096 usage states; MAX_USAGE_STATES caps them lower); when it passes,
`dp_heuristic` returns the best plan scored so far (or None).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from hetplan.formulations.joint.inputs import DeadlineExceeded, JointInputs, JointSolution, check_deadline, slack_below
from hetplan.formulations.joint.tables import (_cached_for, _class_extras, _class_figures, block_counts,
                                               blocks_identical, class_pools)
from hetplan.formulations.joint.bounds.parts import _first_true_from, in_region, stage_time_cap_s
from hetplan.formulations.joint.bounds.stage_fit import block_bands
from hetplan.formulations.joint.evaluation import better, blocks_ranges, evaluate, objective_within_limits

# The product over (GPU type, region) of the usage axis lengths, past which usage is counted in
# coarser units (q). Measured on zorse_4type_2region, 30 choices with P 4-5 (2026-11-28): 2048
# rather than 4096 takes 2.0-2.5x less time per choice with the same plan on 28 (the other two,
# D = 1, end 2-6 % slower, far from the best plan), and `--time-limit 30` then ends at 18.535 s,
# gap 8.3 %, against 18.80 s and 11-18 % (2-3 runs each); the 17 Sailor scenarios keep their plans
# and gaps.
MAX_USAGE_STATES = 2048


class _Space:
    """The DP's usage axes: per (GPU type, region), units of D q GPUs."""

    def __init__(self, inp: JointInputs):
        gpus: dict[tuple[str, str], int] = {}
        for p in {p.quota_key: p for p in inp.pools}.values():
            gpus[p.gpu_type, p.region] = gpus.get((p.gpu_type, p.region), 0) + p.avail_gpus
        self.keys = sorted(gpus)
        self.q = 1
        while math.prod(gpus[key] // (inp.D * self.q) + 1 for key in self.keys) > MAX_USAGE_STATES:
            self.q *= 2
        self.dims = tuple(gpus[key] // (inp.D * self.q) + 1 for key in self.keys)

    def units(self, tp: int) -> int:
        return -(-tp // self.q)


Choice = tuple[tuple[str, int], str, int]  # (time class (GPU type, TP), region, blocks)


def _options(inp: JointInputs, theta_s: float, value: str,
             extra_cap_s: float = math.inf) -> list[list[tuple[Choice, float]]]:
    """Per stage: every homogeneous choice within theta_s that fits in memory, with its value; with
    `extra_cap_s`, only choices whose all-reduce + update in one zone (`_class_extras`) is
    within it. Filtered from `_all_options`, in its order (the read-back takes the first match)."""
    return [[(choice, val) for choice, val, t, extra in row if t <= theta_s and extra <= extra_cap_s]
            for row in _all_options(inp, value)]


def _all_options(inp: JointInputs, value: str) -> list[list[tuple[Choice, float, float, float]]]:
    """Per stage: every homogeneous choice that fits in memory, (choice, value, stage time, extra),
    built once per inputs and value: the sweep asks for tens of stage-time caps."""
    return _cached_for(inp, f"dp_options_{value}", lambda inp: _make_all_options(inp, value))


def _make_all_options(inp: JointInputs, value: str) -> list[list[tuple[Choice, float, float, float]]]:
    time_s, fits = _class_figures(inp)
    extras = _class_extras(inp)
    price: dict[tuple[tuple[str, int], str], float] = {}  # USD per GPU-second
    for p in inp.pools:
        key = ((p.gpu_type, p.tp), p.region)
        price[key] = min(price.get(key, math.inf), p.price_per_gpu_hour_usd / 3600)
    out = []
    for i in range(inp.P):
        row = []
        for n in block_counts(inp, i):
            for (c, region), usd in price.items():
                if fits[c, i, n]:
                    t = time_s[c, i, n]
                    # cost: the GPU rate; the stage time breaks ties (it is what T pays besides theta)
                    val = t if value == "time" else inp.D * c[1] * usd + 1e-9 * t
                    row.append(((c, region, n), val, t, extras[c, i, n]))
        out.append(row)
    return out


def stage_dp(inp: JointInputs, theta_s: float, value: str = "time",
             extra_cap_s: float = math.inf) -> list[Choice] | None:
    """The best plan of homogeneous stages within theta_s, a choice per stage, or None. The state
    also keeps the last stage's region: a pipeline boundary between regions adds its transfer
    time (value "time") and is allowed only when it fits in theta_s (links are full duplex:
    c / 2 <= theta, as in the model). `extra_cap_s`: see `_options`."""
    space = _cached_for(inp, "dp_space", _Space)  # per inputs, as `_moves` (which reads it) is
    options = _options(inp, theta_s, value, extra_cap_s)
    if any(not row for row in options):
        return None
    regions = inp.regions
    step = inp.p2p_s(inp.region) - inp.p2p_s(inp.node) if value == "time" else 0.0
    crossing = len(regions) > 1 and inp.p2p_s(inp.region) / 2 <= theta_s
    L = inp.U - 2
    shape = (len(regions), L + 1, *space.dims)
    best = np.full(shape, np.inf)
    best[(slice(None),) + (0,) * (len(shape) - 1)] = 0.0  # stage 0 may start in any region
    values = [best]  # after each stage: the plan is read back from these (`_read_back`)
    bands = block_bands([[n for (_, _, n), _ in row] for row in options], L)
    scratch = np.empty(best[0].size)
    moves = _moves(inp, space)
    for i, row in enumerate(options):
        check_deadline()
        # best over the previous stage's region, per target region: staying, or crossing at a price
        entering = [_entering(best, r, step) if crossing and i > 0 else best[r] for r in range(len(regions))]
        new = np.full(shape, np.inf)
        (lo, hi), (q0, q1) = bands[i], bands[i + 1]
        for (c, region, n), val in row:
            r, dst_u, src_u = moves[c, region]
            s0, s1 = max(lo, q0 - n), min(hi, q1 - n)  # rows that can reach, and can still complete
            if dst_u is None or s0 > s1:
                continue
            target = new[(r, slice(s0 + n, s1 + n + 1), *dst_u)]  # a view: the minimum writes through
            tmp = scratch[:target.size].reshape(target.shape)
            np.add(entering[r][(slice(s0, s1 + 1), *src_u)], val, out=tmp)
            np.minimum(target, tmp, out=target)
        best = new
        values.append(best)
    final = best[:, L]
    if inp.max_gpus is not None:  # rounded-up usage: a state within the cap is a valid plan
        usage = sum(np.indices(space.dims)[a] * inp.D * space.q for a in range(len(space.dims)))
        final = np.where(usage[None] <= inp.max_gpus, final, np.inf)
    if not np.isfinite(final).any():
        return None
    r, *usage_at = np.unravel_index(int(np.argmin(final)), final.shape)
    return _read_back(options, values, space, regions, (int(r), L, *map(int, usage_at)), step, crossing)


def _entering(best: np.ndarray, r: int, step: float) -> np.ndarray:
    """The least value of entering region r after a stage: staying in r, or coming from another
    region at `step`."""
    out = best[r].copy()
    for rp in range(best.shape[0]):
        if rp != r:
            np.minimum(out, best[rp] + step, out=out)
    return out


def _moves(inp: JointInputs, space: _Space) -> dict:
    """(time class, region) -> (its region's index, the usage axes' destination and source slices
    of a stage on that class: u units more on its (GPU type, region) axis), or (r, None, None) when
    one stage's units exceed the axis. The same for every cap, so once per inputs (the DP's inner
    loop reads it for every choice)."""
    def make(inp: JointInputs) -> dict:
        out = {}
        for c, region in {(c, region) for row in _all_options(inp, "time") for (c, region, _), *_ in row}:
            r, axis, u = inp.regions.index(region), space.keys.index((c[0], region)), space.units(c[1])
            if u >= space.dims[axis]:
                out[c, region] = (r, None, None)
                continue
            dst, src = [slice(None)] * len(space.dims), [slice(None)] * len(space.dims)
            dst[axis], src[axis] = slice(u, None), slice(0, space.dims[axis] - u)
            out[c, region] = (r, tuple(dst), tuple(src))
        return out
    return _cached_for(inp, "dp_moves", make)


def _read_back(options: list, values: list, space: _Space, regions: list[str], at: tuple, step: float,
               crossing: bool) -> list[Choice]:
    """The choices of the plan that ends in state `at` (region, blocks, usage...): at each stage
    from the last, the first choice (in option order) and then the first previous region whose
    value plus the choice's equals the state's value, the same float operations as the forward
    pass, so the comparison is exact and the plan is the one a strict-improvement pass keeps."""
    stages = []
    r, *state = at
    for i in range(len(options) - 1, -1, -1):
        want, prev = values[i + 1][(r, *state)], values[i]
        for (c, region, n), val in options[i]:
            axis, u = 1 + space.keys.index((c[0], region)), space.units(c[1])
            if regions.index(region) != r or n > state[0] or u > state[axis]:
                continue
            before = list(state)
            before[0] -= n
            before[axis] -= u
            froms = [(prev[(rp, *before)] + (0.0 if rp == r else step), rp)
                     for rp in (range(len(regions)) if crossing and i > 0 else [r])]
            low = min(v for v, _ in froms)
            if low + val == want:
                stages.append((c, region, n))
                r, state = next(rp for v, rp in froms if v == low), before
                break
        else:  # unreachable: every finite value was reached by some choice
            raise AssertionError("stage_dp: no choice reaches the state's value")
    return stages[::-1]


def place(inp: JointInputs, stages: list[Choice]) -> JointSolution | None:
    """Replicas per pool for homogeneous stages, in stage order, each in its region: all D
    replicas in one zone if one has room, preferring the previous stage's zone (a pipeline boundary
    across zones costs transfer time and egress), then the most room; else spread over the zones
    of the region, the fullest first. None when the zones are too fragmented (the DP counts GPUs
    per region)."""
    left = {p.quota_key: p.avail_gpus for p in inp.pools}
    replicas, prev_zone = [], None
    for c, region, _ in stages:
        (ks,) = class_pools(inp, [c], region)
        row = _place_stage(inp, ks, c[1], left, prev_zone)
        if row is None:
            return None
        replicas.append(tuple(row))
        prev_zone = inp.pools[max(range(inp.K), key=lambda k: row[k])].zone
    ranges = blocks_ranges([n for _, _, n in stages])
    return JointSolution(tuple(ranges), tuple(replicas), float("nan"), float("nan"))


def _place_stage(inp: JointInputs, ks: list[int], tp: int, left: dict, prev_zone: str | None) -> list[int] | None:
    row = [0] * inp.K
    room = lambda k: left[inp.pools[k].quota_key] // tp  # noqa: E731  replicas the zone still has
    ks = sorted(ks, key=lambda k: (inp.pools[k].zone != prev_zone, -room(k)))
    whole = [k for k in ks if room(k) >= inp.D]
    if whole:
        ks = whole[:1]
    elif sum(room(k) for k in ks) < inp.D:
        return None
    else:
        ks = sorted(ks, key=lambda k: -room(k))
    todo = inp.D
    for k in ks:
        take = min(todo, room(k))
        row[k], todo = take, todo - take
        left[inp.pools[k].quota_key] -= take * tp
    return row


def dp_heuristic(inp: JointInputs, objective: str = "max_throughput", max_cost_usd: float | None = None,
                 min_iters_per_s: float | None = None, theta_lo_s: float = 0.0,
                 sweep: int = 4, descent: int = 3) -> tuple[float, JointSolution] | None:
    """(objective, solution) of the best plan the stage DP finds for this outer choice within the
    limits, or None (not the blocks form, or no plan of homogeneous stages). `theta_lo_s`: a known
    lower bound on the bottleneck (the search starts there). `descent`: at each cap, how many times
    the all-reduce + update cap is lowered below the plan's (`_less_sync`). At the search's
    deadline it returns the best plan scored so far."""
    if not blocks_identical(inp):
        return None
    best = _dp_heuristic(inp, objective, max_cost_usd, min_iters_per_s, theta_lo_s, sweep, descent)
    if len(inp.regions) > 1 and (best is None or _crosses_regions(inp, best[1])):
        best = better(best, _in_one_region(inp, objective, max_cost_usd, min_iters_per_s, theta_lo_s, sweep,
                                                 descent))
    return best


def _crosses_regions(inp: JointInputs, sol: JointSolution) -> bool:
    return len({inp.pools[k].region for row in sol.replicas for k, n in enumerate(row) if n}) > 1


def _in_one_region(inp: JointInputs, objective: str, max_cost_usd: float | None,
                   min_iters_per_s: float | None, theta_lo_s: float, sweep: int, descent: int
                   ) -> tuple[float, JointSolution] | None:
    """The best plan of the DP run on each region's pools alone, scored on `inp`. The DP prices a
    boundary between regions by the least transfer (`stage_dp`), while with Sailor's composition a
    stage sending over it pays its own, slower send in every one of the m steps (measured:
    GPT-Neo on 4 x 32 A100 in us-central1 + 32 in us-west1, P4 b2 D16: 18.0 s with a stage in
    us-west1, 13.2 s in us-central1 alone)."""
    best, index = None, {(p.gpu_type, p.zone, p.tp): k for k, p in enumerate(inp.pools)}
    for region in inp.regions:
        sub = in_region(inp, region)
        try:
            found = _dp_heuristic(sub, objective, max_cost_usd, min_iters_per_s, theta_lo_s, sweep, descent)
        except DeadlineExceeded:
            break
        if found is None:
            continue
        replicas = []
        for row in found[1].replicas:
            full = [0] * inp.K
            for j, n in enumerate(row):
                p = sub.pools[j]
                full[index[p.gpu_type, p.zone, p.tp]] = n
            replicas.append(tuple(full))
        sol = replace(found[1], replicas=tuple(replicas))
        obj = objective_within_limits(inp, sol, objective, max_cost_usd, min_iters_per_s)
        if obj is not None:
            best = better(best, (obj, sol))
    return best


def _dp_heuristic(inp: JointInputs, objective: str, max_cost_usd: float | None, min_iters_per_s: float | None,
                  theta_lo_s: float, sweep: int, descent: int) -> tuple[float, JointSolution] | None:
    time_s, _ = _class_figures(inp)
    thetas = sorted(t for t in set(time_s.values()) if t >= slack_below(theta_lo_s))
    if min_iters_per_s:
        cap = stage_time_cap_s(inp, 1 / min_iters_per_s)
        thetas = [t for t in thetas if t <= cap]
    if not thetas:
        return None
    scored: list[tuple[float, JointSolution]] = []  # every plan within the limits, in order
    try:
        return _sweep(inp, thetas, objective, max_cost_usd, min_iters_per_s, sweep, descent, scored)
    except DeadlineExceeded:  # the best plan scored so far is still a plan
        best = None
        for got in scored:
            best = better(best, got)
        return best


def _sweep(inp: JointInputs, thetas: list[float], objective: str, max_cost_usd: float | None,
           min_iters_per_s: float | None, sweep: int, descent: int,
           scored: list) -> tuple[float, JointSolution] | None:
    """`dp_heuristic` over the caps `thetas`; every plan scored within the limits is also appended
    to `scored`."""
    memo: dict = {}

    def solve(theta: float, value: str, extra_cap: float = math.inf):  # the first cap's "time" DP is
        key = (theta, value, extra_cap)  # also the last feasibility probe
        if key not in memo:
            memo[key] = stage_dp(inp, theta, value, extra_cap)
        return memo[key]

    feasible = lambda j: solve(thetas[j], "time") is not None  # noqa: E731
    if not feasible(len(thetas) - 1):
        return None
    first = _first_feasible(feasible, len(thetas))
    extras = _class_extras(inp)
    turned_down = []  # plans placed that the limits turned down

    def score(stages):
        sol = place(inp, stages) if stages is not None else None
        obj = None if sol is None else objective_within_limits(inp, sol, objective, max_cost_usd, min_iters_per_s)
        if obj is None:
            if sol is not None:
                turned_down.append(sol)
            return None
        scored.append((obj, sol))
        return obj, sol

    def capped(j: int, cap: float):
        """The fastest plan with every extra within `cap` at the least stage-time cap from thetas[j]
        up that has one (a bisection: feasibility grows with the stage-time cap)."""
        has = lambda jj: solve(thetas[jj], "time", cap) is not None  # noqa: E731
        if not has(len(thetas) - 1):
            return None
        return solve(thetas[_first_feasible(has, len(thetas), j)], "time", cap)

    def run(caps: list[int], values: tuple[str, ...], enough: int | None, done: set):
        """The best plan over the caps and DP values not in `done` (then added), stopping after
        `enough` caps that gave a plan (None: all)."""
        best, kept = None, 0
        for j in caps:
            found = False
            for value in [v for v in values if (j, v) not in done]:
                done.add((j, value))
                stages = solve(thetas[j], value)
                if value == "time" and stages is not None:
                    got = _less_sync(inp, stages, lambda cap: solve(thetas[j], "time", cap), score, extras, descent,
                                     (lambda cap, j=j: capped(j, cap)) if j == caps[0] else None)  # one jump: it searches the caps above
                else:
                    got = score(stages)
                if got is not None:
                    found, best = True, better(best, got)
            kept += found
            if enough is not None and kept >= enough:
                break
        return best

    # the cheapest plan within a cap only matters when cost counts (measured on six max-throughput
    # scenarios without a budget: it never beat the fastest plan of the same cap)
    done: set = set()
    caps = _caps_to_try(first, len(thetas), objective, sweep)
    best = run(caps, ("time",) if objective == "max_throughput" else ("time", "cost"), sweep, done)
    if max_cost_usd is None or (best is not None and not _beaten_by(inp, objective, best, turned_down)):
        return best  # no limit turned down a better plan: the search without a budget finds this one
    # no plan, or a budget turned down a better one: every cap, the cheap ones too, and the cheapest
    # plan of each (measured: Sailor's OPT-350M on 2 zones of 128 A100 + 128 V100 under 1.2 USD,
    # where no plan of the first caps breaks it, the search's first plan at 2.9-4.9 s with this wide
    # sweep up front, 2.1-2.9 s without; two interleaved pairs of runs)
    if objective != "min_cost":
        caps = sorted(set(caps) | set(_caps_to_try(first, len(thetas), "min_cost", sweep)))
    return better(best, run(caps, ("time", "cost"), None, done))


def _beaten_by(inp: JointInputs, objective: str, best: tuple, plans: list[JointSolution]) -> bool:
    """Whether one of `plans` (turned down by the limits) has a better objective than `best` by the
    model's figures."""
    key = "cost" if objective == "min_cost" else "T"
    return any(evaluate(inp, sol)[key] < best[0] for sol in plans)


def _less_sync(inp: JointInputs, stages: list[Choice], solve, score, extras: dict, steps: int,
               solve_slower=None):
    """The fastest-stages plan pays the all-reduce + update of its heaviest stage (sigma + mu in T),
    which the DP's sum of stage times does not see: cap that extra just below the plan's own and
    solve again, `steps` times, keeping the best scored plan (measured: GPT-Neo, 80 A100 + 240
    V100, P7 b1 D16: 11.64 s -> 11.44 s, the MILP's optimum, by moving the TP-2 stage). Then
    one jump: every extra within the plan's second largest, at the least stage-time cap that
    allows it (`solve_slower`): the steps move one block at a time, while a lighter heaviest stage
    may need other classes and slower stages (measured: GPT-Neo, 128 A100 + 384 V100, P4 b1 D64:
    7.37 s, A100 TP1 on the last stage with a 1.00 s all-reduce; after the jump 7.07 s, the MILP's
    optimum, V100 TP2 there)."""
    best = score(stages)
    extra_values = sorted({extras[c, i, n] for i, (c, _, n) in enumerate(stages)}) if solve_slower else []
    for _ in range(steps):
        worst = max(extras[c, i, n] for i, (c, _, n) in enumerate(stages))
        stages = solve(float(np.nextafter(worst, -np.inf)))
        got = score(stages) if stages is not None else None
        if got is None or (best is not None and got[0] >= best[0]):
            break  # T rose (or no plan): lower caps only trade more stage time for less all-reduce
        best = got
    if len(extra_values) > 1:
        jump = solve_slower(extra_values[-2])
        best = better(best, score(jump) if jump is not None else None)
    return best


def _first_feasible(feasible, count: int, lo: int = 0) -> int:
    """The least index in [lo, count) where the monotone `feasible` holds (it holds at count - 1):
    the least feasible cap is usually a few caps above the bound the search starts from, and
    every feasible probe costs a full DP (`_first_true_from`)."""
    return _first_true_from(feasible, range(count), lo)


def _caps_to_try(first: int, count: int, objective: str, sweep: int) -> list[int]:
    """Indices of the stage-time caps to try from the least feasible one: for max throughput the
    next few and then doubling steps (the optimum sits near the least bottleneck, but a plan may
    not place in the zones or meet a budget there); for min cost spread evenly up to the last (a
    slower, cheaper bottleneck may win)."""
    if objective == "min_cost":
        return sorted({first + round(j * (count - 1 - first) / sweep) for j in range(sweep + 1)})
    out = list(range(first, min(first + sweep, count)))
    step = 2
    while out and out[-1] + step < count:
        out.append(out[-1] + step)
        step *= 2
    return out
