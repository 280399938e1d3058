"""Joint resource allocation + parallelization for one outer choice (P, D, b, TP per GPU type).

The planner (`hetplan.orchestration.planner`) enumerates the few discrete outer choices, Sailor-style (seed 000,
sec. 4.2: pipeline depth P, data-parallel degree D, microbatch size b, TP per GPU type, H1-H2),
and solves this MILP for each. Inside, the model chooses how many replicas of every GPU pool
(GPU type x zone, with its TP) each stage gets, which contiguous layer units each stage holds,
and which zones/regions stages sit in: the work Sailor's dynamic program (Listing 1) does with
uniform layer splits and greedy DP, here exact over the modelled space.

Sets
  I = {0..P-1} stages, L = {0..U-1} layer units (0 embedding, U-1 head), K pools k = (gpu type g_k,
  zone z_k, region r_k, TP degree t_k), Q quota groups (gpu type, zone), Z zones, R regions.
Parameters (from the estimators, for microbatch b and TP t_k)
  step[k,l]  fwd + bwd seconds of unit l for one microbatch on one replica of pool k (TP comm included)
  upd[k,l]   optimizer-step seconds of unit l on a worker of pool k (ZeRO sharded over D)
  stat[k,l]  bytes of params + grads + optimizer states of unit l on a worker of pool k
  act[k,l]   activation bytes of unit l for one microbatch on a worker of pool k
  cap[k]     GPU capacity minus framework overhead;  nf[i] = min(P - i, m) microbatches in flight (1F1B)
  avail[k]   GPUs of pool k;  price[k] USD per GPU-hour;  gb[l] gradient bytes of unit l (all TP shards)
  c_node, c_inter, c_zone, c_region   activation + gradient transfer seconds per microbatch over a boundary
  m = B / (D b) microbatches per iteration
Variables
  y[i,l] in {0,1}  unit l on stage i;           x[i,k] in Z+  replicas of pool k on stage i
  u[i,k] in {0,1}  pool k used by stage i;      v[i,z], rho[i,r] in {0,1} stage i uses zone z / sits in region r
  span[i] in {0,1} stage i spans several zones; dz[i], dr[i] in {0,1} boundary i -> i+1 crosses zones / regions
  dn[i] in {0,1} boundary i -> i+1 has a pair on two nodes
  tau[i] >= 0 stage step time; theta >= 0 steady-state bottleneck; c[i] >= 0 boundary time
  sync[i] >= 0 gradient all-reduce of stage i; sigma = max_i sync[i]; mu = max update time; T iteration time
Constraints
  staircase:   a[i,l] in {0,1} (i < P-1): unit l on stage <= i;  a[i,l] >= a[i,l+1];  a[i,l] <= a[i+1,l]
               y[i,l] = a[i,l] - a[i-1,l]  (a[-1,.] = 0, a[P-1,.] = 1);  sum_l y[i,l] >= 1
               (every unit on exactly one stage, contiguous ranges in stage order, none empty)
  replicas:    sum_k x[i,k] = D                                  D replicas per stage (Sailor's uniform D)
  quota:       sum_i sum_{k in q} t_k x[i,k] <= avail[q]   for every (GPU type, zone) q: pools of one
               type and zone differ only in TP degree, so the MILP picks TP per stage and type
  use:         x[i,k] <= D u[i,k];  u[i,k] <= x[i,k]
  straggler:   tau[i] >= sum_l step[k,l] y[i,l] - Mstep[k] (1 - u[i,k])
  memory:      sum_l (stat[k,l] + nf[i] act[k,l]) y[i,l] <= cap[k] + Mmem[k] (1 - u[i,k])     (per worker)
  region (H5): sum_r rho[i,r] = 1;  u[i,k] <= rho[i,r_k]          a stage's DP traffic stays in one region
  zones:       v[i,z_k] >= u[i,k];  v[i,z] <= sum_{k: z_k = z} u[i,k];  sum_z v[i,z] <= 1 + (|Z| - 1) span[i];
               span[i] <= sum_z v[i,z] - 1   (v and span exact: span relaxes the boundary rows)
  boundaries:  replicas pair up over a boundary (equal shares): a pair surely crosses zones where one
               side sits in one zone and the other has a replica elsewhere, every pair where both
               sides sit in one zone each (and in different regions):
               dz[i] >= v[i,z] + v[i+1,z'] - 1 - span[i],  dz[i] >= v[i,z] + v[i+1,z'] - 1 - span[i+1],
               dz[i] >= dr[i]
               dz_all[i] >= v[i,z] + v[i+1,z'] - 1 - span[i] - span[i+1],  dz_all[i] >= dr[i]  (z != z')
               dr[i] >= rho[i,r] + rho[i+1,r'] - 1 (r != r')
               dn[i] >= u[i,k] - sum_{k' may share a node with k} u[i+1,k'] (and from stage i + 1),
               dn[i] >= dz[i], and first fit's rule on the GPUs of a (type, zone) q on both sides
               (`_apart_rows`): some pair is surely on two nodes (`composition.apart`)
               c[i] = c_node + (c_inter - c_node) dn[i] + (c_zone - c_inter) dz[i] + (c_region - c_zone) dr[i]
               + cz[i], cz[i] >= (c_z - c_inter) (dn[i] + v[i,z] + v[i+1,z] - 2 - span[i] - span[i+1]) for
               the zones z whose own pairs of nodes (c_z, `inter_in_zone`) are slower than c_inter
  ends:        ez >= v[0,z] + v[P-1,z'] - 1, ez >= span[0], ez >= span[P-1]; er likewise with rho:
               the tied-embedding all-reduce between first and last stage crosses zones / regions;
               ez <= 2 - v[0,z] - v[P-1,z] + span[0] + span[P-1], er <= 2 - rho[0,r] - rho[P-1,r]
               (exact: the tied floors need not grow with ez and er)
  bottleneck:  theta >= tau[i];  theta >= c[i] / 2              (links are full duplex)
  cuts:        tau[i] >= sum_l min_k step[k,l] y[i,l];  P theta >= sum_i tau[i]   (valid, no big-M)
  sync:        sync[i] >= tied[i];  (blocks form)  sync[i] >= S[k,i,n_i] - Msync (1 - u[i,k] + span[i]) + tied[i]
               and sync[i] >= S'[k,i,n_i] - Msync (2 - u[i,k] - span[i]) + tied[i], S / S' the all-reduce
               floors of a stage holding pool k in one zone / spanning zones (`sync_table`,
               `span_sync_table`); tied[0] = tied[P-1] = tied, tied >= t(ez, er) and
               tied >= t_k(ez, er) - Mtied (1 - u[j,k]) for j in {0, P-1}, t_k(ez, er) = t_node,k +
               (t_zone,k - t_node,k) ez + (t_region,k - t_zone,k) er the floors at bytes / t_k
               (`tied_pool_s`), t their least over k, and tied >= t_kk'(ez, er) - Mtied (2 - u[0,k] -
               u[P-1,k']) for the pairs of end pools whose ring is slower than either pool's alone
               (`tied_pair_s`: the least TP of both, two nodes unless both fit one);  sigma >= sync[i];
               (D > 1, with `repeat_sync_table`) rep[i,g] in {0,1} per group g (zone, GPU type),
               (D - 1) rep[i,g] >= sum_{k in g} x[i,k] - 1 (two replicas of g or more force it) and
               sync[i] >= R[k,i,n_i] - Mrep (2 - u[i,k] - rep[i,g_k]) + tied[i], R the floor of a
               stage holding pool k and two replicas of its group (Sailor's slowest pair)
  update:      mu >= sum_l upd[k,l] y[i,l] - Mupd[k] (1 - u[i,k])
  time (1F1B): T = sum_i tau[i] + sum_i c[i] + (m - 1) theta + sigma + mu
  (the boundary, bottleneck, time, memory and cost rows are written with composition.py's functions,
  which `evaluate` and the bounds apply too: the composition is stated once)
  cost:        rate = sum_{i,k} price[k] t_k x[i,k] / 3600 (USD/s);  egress = bytes crossing zones x price (boundaries: D transfers where dz_all)
               cost = rate * T + egress   (bilinear: kept for SCIP; exact binary-expansion
               linearisation of x[i,k] * T for HiGHS when `linearize=True`)
  limits:      cost <= budget;  T <= 1 / min_throughput;  sum_{i,k} t_k x[i,k] <= max_gpus
  ceiling:     (with a time cutoff T*) sigma + mu <= F, F = `bounds.extra_ceiling_s(T*)`: every plan
               with sigma + mu >= F has T >= T* by the bounds, so only plans the cutoff rejects anyway
               are left out; the model's answers below T* are unchanged
Objective
  max_throughput: minimise T (throughput = B / T);  min_cost: minimise cost.

Compact form (layers="blocks", chosen when every block after the first has the same figures: all
presets, Sailor's profiles). Stage i is described by its block count n alone: stage 0 holds the
embedding and blocks 1..n (n >= 0 when the first block is like the others, as in every preset;
n >= 1 where it differs, as in Sailor's profiles), middle stages n >= 1 generic blocks, the last
stage n >= 0 blocks and the head (`block_counts`, `stage_units`). The staircase rows are replaced by
  nb[i,n] in {0,1}, sum_n nb[i,n] = 1, sum_{i,n} n nb[i,n] = L     (blocks placed once)
  z[i,r,n] in {0,1} for time classes r = (GPU type, TP) that fit n blocks on stage i in memory,
  sum_r z[i,r,n] = nb[i,n];  tau[i] = sum_{r,n} time[r,i,n] z[i,r,n]  (r is the straggler)
  xc[(i,r,n),c] >= 0 replicas of class c serving that choice, only for classes c that fit n blocks
  on stage i and have time[c,i,n] <= time[r,i,n]:  sum_c xc[(i,r,n),c] = D z[i,r,n],
  sum_{k of class c} x[i,k] = sum_{r,n} xc[(i,r,n),c]
which are exact (no big-M on time or memory), plus the valid cuts
  sync[i] >= sum_{j at i, c} sync[c,i,n_j] xc[j,c] / D + tied[i],  mu >= sum_{j at i, c} upd[c,i,n_j] xc[j,c] / D
(a stage's all-reduce is the slowest of its pools, so at least the mean over its replicas; the big-M
sync rows are slack in the LP relaxation);  with a cutoff T* every choice with time[r,i,n] >
stage_time_cap_s(T*) = (T* - rest_LB) / m is dropped (T >= m tau_i + rest); all-reduce times per (pool, position, n) come from
the communication estimator's floors (`sync_table`). Time variables are in
milliseconds and cost rows in micro-dollars (`in_model_units`), for the solvers' tolerances.

One cost model (`formulations/stage_cost.py`): the simulator (`hetplan.simulator`) composes the
figures of `StageCosts` for a placed plan; the rows above read the same estimator calls per layer
unit (`planner.inputs._Tables`), and `evaluate_placed` scores a solution of this model by placing it as
the simulator does (first fit) and composing the same `StageCosts` figures with this model's rates:
it equals `simulate` (tests/test_cost_model_agreement.py: 2,657 random plans). The MILP
itself is a relaxation of that evaluation: for every plan of its space, each figure it computes
(`evaluate`: T, cost, every stage time, boundary time, all-reduce, update and egress) is at most
`evaluate_placed`'s, so every bound on the model is a bound on the simulated objective; the planner
scores each plan it keeps with the simulator.
Exact: stage compute times of a stage with one time class, update times, memory, compute cost.
Relaxed, because the model does not place replicas on nodes (first fit does, in the simulator):
  - a stage's time is its slowest replica's fwd + bwd (the simulator adds the slowest fwd and the
    slowest bwd, which may come from different replicas);
  - c_node is the fastest boundary transfer inside a zone, between two nodes or two GPUs of one node
    (`planner.inputs._Tables.effective_link`), c_inter the fastest between two nodes, c_zone,
    c_region the fastest pair of their class; a boundary whose pairs may all share nodes (dn = 0)
    takes c_node, though first fit may still put them on two nodes (stages of many replicas do);
  - all-reduces are the communication estimator's floor over every placement the stage's pools
    allow (`planner.with_sync_table`, `planner.tied_floors_s`, `allreduce_floor_s` of the estimator:
    one node of the pool's type, or >= 2 nodes of its zone, or of its region when spanning zones),
    at factor x bytes / t_k per member (the stage's least TP is at most t_k; likewise the tied
    embedding's least TP over both ends is at most t_k of every pool there); the staircase form
    (units that differ) has no all-reduce floor but the tied embedding's;
  - a boundary next to a stage spanning zones crosses zones only where the rows above force it, and
    its egress is charged only where every pair crosses.
Every replica takes b sequences (uneven shares are not modelled here).

Sailor's composition (`composition="sailor"`, the instance's `estimators: {preset: sailor}`): the
rows above with the figures of simulator/sailor.py, where the pipeline pays each stage's
transfers in its step. Stage i's sends A[i] (forward) and G[i] (back) are each at least c / 2 of
their boundary, at least the send floor of every pool k the stage uses (`send_floor_s`: Sailor's
bandwidth fits depend on the sender's TP group), and at least pool k's floor to another zone /
region where the neighbour stage uses no pool of z_k (v = 0) / sits in another region (rho = 0)
(`send_away_s`, `_sailor_send_rows`). With a[i] = A[i], g[i] = G[i + 1],
  p2p:         p[0] = a[0] (P <= 3) or 2 a[0];  p[i] = a[i] + g[i-1] (middle);  p[P-1] = 2 g[P-2]
  bottleneck:  theta >= tau[i] + p[i]            (replaces theta >= tau[i] and theta >= c[i] / 2)
  time:        T = sum_i tau[i] + sum_i p[i] + (m - 1) theta + sigma + mu
  update:      mu >= upd_fixed[k] u[i,k]: the profile's whole-model step of pool k, whatever units
  memory:      P - i microbatches in flight (not capped by m); capacity less Sailor's 2 / 3 GB
and no tied-embedding all-reduce (Sailor has none), the all-reduce of llm_info's full parameter
bytes / t_k, boundary bytes the least unit output llm_info gives. Relaxed as above: c_node, c_zone,
c_region are the least transfer over every pair of nodes of the kind, every TP group size and every
unit output (Sailor sends the head's logits back from a last stage that holds the head alone), so
p[i] is at most Sailor's slowest send of the stage; the ring floors are the least neighbour pair,
and a stage with two replicas of one (zone, GPU type) g has g -> g side by side or g -> h and h' -> g
(`SailorComm.repeat_floor_s`: the rep rows, and where D exceeds the groups of a region the tables
themselves, `planner.inputs._pigeonhole`).
Every bound below stays valid: Sailor's theta is at least max_i tau_i and c_i / 2 (p[i] >= a[i] and
p[i+1] >= g[i]), and sum_i p[i] >= sum_i c[i] (tests/test_sailor_planning.py checks the figures
and every bound against `simulate` on random plans). They ignore the transfers in theta, so they
are weaker for deep pipelines than for the hetplan composition.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.formulations.joint.inputs import (COST_SCALE, JointInputs, JointSolution, LinkCost, TIME_UNITS_PER_S,
    model_coef)
from hetplan.formulations.joint.tables import (_class_figures, _class_sync_update, block_counts, blocks_identical,
    class_pools, ends_forced, position, stage_sum, time_classes)
from hetplan.formulations.joint.bounds import rate_lower_bound_usd_per_s, stage_time_cap_s, time_upper_bound_s
from hetplan.formulations.joint.evaluation import evaluate, group_of, repeated_groups, solution_blocks
from hetplan.formulations.joint.composition import (boundary_s, bottleneck_terms, first_fit_groups, in_zone_s,
    iteration_cost_usd, iteration_time_s, may_share_node, pipeline_egress_bytes, pipeline_transfers_s,
    replica_rate_usd_per_s, ring_factor, sailor_p2p, tied_at, tied_egress_bytes, worker_bytes)


def build(inp: JointInputs, *, linearize: bool = True, time_cutoff_s: float | None = None,
          cost_cutoff_usd: float | None = None, layers: str = "auto", budget: bool = True,
          extra_ceiling_s: float | None = None, nodes: bool = True,
          exclude: tuple[JointSolution, ...] = (), exclude_pools: tuple[JointSolution, ...] = ()
          ) -> pyo.ConcreteModel:
    """The MILP (or MINLP when `linearize=False` and cost enters) for one outer choice.

    `time_cutoff_s` / `cost_cutoff_usd`: only plans at least this good are wanted (an incumbent's
    objective). They bound T (cost >= rate_LB x T for the cost cutoff), and in the blocks form every
    stage choice slower than `stage_time_cap_s` of that bound is left out of the model. The cost
    cutoff itself is not a row: add one if the model must reject worse plans.

    `layers`: "blocks" (the compact stage-choice form, needs `blocks_identical(inp)`), "staircase"
    (any per-unit figures) or "auto" (blocks when possible). `budget=False` (maximum throughput)
    leaves the budget row out, and with it the rate x T rows it needs: a relaxation, whose
    infeasibility or bound holds for the model with the row, and whose plan is that model's
    optimum when its cost is within the budget.

    `extra_ceiling_s` (with `time_cutoff_s`): the row sigma + mu <= it (the module docstring's
    "ceiling"); the caller takes it from `bounds.extra_ceiling_s` at that cutoff.

    `nodes=False` leaves out dn and its rows (`_apart_rows`): every boundary that crosses no zone
    takes c_node, a relaxation (its infeasibility or bound holds for the model with the rows, and
    its plan is that model's optimum where `evaluate` rates it at the relaxation's figure).

    `exclude`: solutions whose pools per stage and layer split no plan of the model may repeat
    (`_excluded_rows`); the search's answer to a plan the simulator refused. `exclude_pools`: solutions
    whose pools per stage no plan may repeat, whatever its layer split."""
    if extra_ceiling_s is not None and time_cutoff_s is None:
        raise ValueError("extra_ceiling_s holds only below a time cutoff: pass time_cutoff_s")
    if layers == "auto":
        layers = "blocks" if blocks_identical(inp) else "staircase"
    if layers == "blocks" and not blocks_identical(inp):
        raise ValueError("layers='blocks' needs identical transformer blocks after the first one")
    if layers == "staircase" and inp.sync_table is not None:
        raise ValueError("the staircase form has no all-reduce table: drop sync_table")
    if not budget and inp.objective != "min_cost":
        inp = replace(inp, max_cost_usd=None)
    if not nodes:
        inp = replace(inp, inter=None)
    inp = in_model_units(inp)
    if time_cutoff_s is not None:
        time_cutoff_s *= TIME_UNITS_PER_S
    m = pyo.ConcreteModel(name=f"joint_P{inp.P}_D{inp.D}_b{inp.b}")
    I, L, K = range(inp.P), range(inp.U), range(inp.K)
    Zs, Rs = inp.zones, inp.regions
    m.I, m.L, m.K = pyo.Set(initialize=I), pyo.Set(initialize=L), pyo.Set(initialize=K)
    t_ub = time_upper_bound_s(inp) if time_cutoff_s is None else min(time_upper_bound_s(inp), time_cutoff_s)
    if inp.min_iters_per_s:
        t_ub = min(t_ub, 1 / inp.min_iters_per_s)
    if cost_cutoff_usd is not None and (rate := rate_lower_bound_usd_per_s(inp)) > 0:  # free GPUs: no time cap
        t_ub = min(t_ub, cost_cutoff_usd / rate)  # model units: ms

    m.layers = layers
    m.x = pyo.Var(m.I, m.K, domain=pyo.NonNegativeIntegers, bounds=lambda _, i, k: (0, min(inp.D, inp.pools[k].avail_gpus // inp.pools[k].tp)))
    m.u = pyo.Var(m.I, m.K, domain=pyo.Binary)
    m.v = pyo.Var(m.I, Zs, domain=pyo.Binary)
    m.rho = pyo.Var(m.I, Rs, domain=pyo.Binary)
    m.span = pyo.Var(m.I, domain=pyo.Binary)
    m.dz = pyo.Var(range(inp.P - 1), domain=pyo.Binary)
    m.dr = pyo.Var(range(inp.P - 1), domain=pyo.Binary)
    m.tau = pyo.Var(m.I, domain=pyo.NonNegativeReals)
    m.c = pyo.Var(range(inp.P - 1), domain=pyo.NonNegativeReals)
    m.theta = pyo.Var(domain=pyo.NonNegativeReals)
    m.sync = pyo.Var(m.I, domain=pyo.NonNegativeReals)
    m.sigma = pyo.Var(domain=pyo.NonNegativeReals)
    m.mu = pyo.Var(domain=pyo.NonNegativeReals)
    m.T = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0, t_ub))

    _replica_constraints(m, inp)
    if layers == "blocks":
        _block_constraints(m, inp, stage_time_cap_s(inp, t_ub) * (1 + 1e-9))
    else:
        _layer_constraints(m, inp)
    _placement_constraints(m, inp, Zs, Rs)
    _time_constraints(m, inp)
    if extra_ceiling_s is not None and extra_ceiling_s < math.inf:
        m.extra_ceiling = pyo.Constraint(expr=m.sigma + m.mu <= extra_ceiling_s * TIME_UNITS_PER_S)
    _cost_and_objective(m, inp, linearize, Zs)
    _scale_rows(m, ("egress_def", "ring_egress_def"), COST_SCALE)  # USD rows in micro-dollars
    _excluded_rows(m, inp, exclude, exclude_pools)
    return m


def _excluded_rows(m: pyo.ConcreteModel, inp: JointInputs, exclude: tuple[JointSolution, ...],
                   exclude_pools: tuple[JointSolution, ...] = ()) -> None:
    """For each excluded solution s: sum over (i, k) of (1 - u[i,k] where s uses pool k in stage i,
    u[i,k] where not) + sum over stages of (1 - [stage i's layers as in s]) >= 1, i.e. a plan differs
    from s in some stage's pools or layers (u[i,k] = 1 exactly when x[i,k] > 0: use_hi, use_lo). With
    D > 1 it also leaves out plans that differ from s in replica counts alone (`excludes_only`). For
    one of `exclude_pools` the row has no layer terms: a plan differs from s in some stage's pools."""
    rows = []
    for sol, with_split in [(s, True) for s in exclude] + [(s, False) for s in exclude_pools]:
        terms = [1 - m.u[i, k] if sol.replicas[i][k] else m.u[i, k] for i in range(inp.P) for k in range(inp.K)]
        if with_split:
            split = _split_terms(m, inp, sol)
            if split is None:
                continue  # outside this model's space already
            terms += split
        rows.append(sum(terms) >= 1)
    if rows:
        m.excluded = pyo.ConstraintList()
        for row in rows:
            m.excluded.add(row)


def _split_terms(m: pyo.ConcreteModel, inp: JointInputs, sol: JointSolution) -> list | None:
    """The terms of `_excluded_rows` that are 0 exactly for `sol`'s layer split; None where the
    model has no such split."""
    if m.layers != "blocks":
        return [1 - m.y[i, l] for i, (start, end) in enumerate(sol.ranges) for l in range(start, end)]
    counts = solution_blocks(inp, sol)
    if counts is None or any((i, n) not in m.nb for i, n in enumerate(counts)):
        return None
    return [1 - m.nb[i, n] for i, n in enumerate(counts)]


def excludes_only(sol: JointSolution) -> bool:
    """Whether `sol`'s row of `_excluded_rows` leaves out its plan alone: where every stage uses one
    pool, its D replicas are all of that pool, so the same pools per stage mean the same counts
    (always with D = 1)."""
    return all(sum(1 for n in row if n) == 1 for row in sol.replicas)


def excluded_counts(sol: JointSolution, most: int) -> list[tuple[tuple[int, ...], ...]] | None:
    """The replica counts of every solution `sol`'s row of `_excluded_rows` leaves out, its own
    included: the same pools per stage and layer split, each stage's replicas spread over its pools
    in every way that gives each of them one at least (prod_i C(D - 1, |pools of i| - 1) of them);
    None when that is more than `most`."""
    per_stage, total = [], 1
    for row in sol.replicas:
        used, D = [k for k, n in enumerate(row) if n], sum(row)
        total *= math.comb(D - 1, len(used) - 1)
        if total > most:
            return None
        spreads = []
        for ranges in _pieces(D, len(used)):  # D replicas split into len(used) parts
            spread = [0] * len(row)
            for k, (a, b) in zip(used, ranges):
                spread[k] = b - a
            spreads.append(tuple(spread))
        per_stage.append(spreads)
    return list(itertools.product(*per_stage))


def every_split(U: int, P: int, most: int) -> list[tuple[tuple[int, int], ...]] | None:
    """Every split of units 0..U-1 into P contiguous non-empty ranges, in stage order (a superset of
    the model's: the compact form's rules only drop some); None when there are more than `most`."""
    if math.comb(U - 1, P - 1) > most:
        return None
    return list(_pieces(U, P))


def _pieces(total: int, parts: int):
    """Every way to cut 0..total-1 into `parts` contiguous non-empty ranges (start, end)."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(zip((0, *cuts), (*cuts, total)))


def in_model_units(inp: JointInputs) -> JointInputs:
    """The same inputs with every time in milliseconds (prices per GPU-millisecond-hour scaled to
    match, so rate x T stays in USD). Stage times are 1e-4..1e-1 s: in seconds the solvers' absolute
    feasibility tolerances (1e-6 in SCIP, 1e-7 in HiGHS) let T undercut the true value by ~1e-6 s,
    and SCIP reported "best solution is not feasible in original problem" on a 2-stage model."""
    ms = TIME_UNITS_PER_S

    def link(lc: LinkCost) -> LinkCost:
        return LinkCost(lc.bandwidth_Bps / ms, lc.latency_s * ms)

    def table(tab: dict | None) -> dict | None:
        return None if tab is None else {key: v * ms for key, v in tab.items()}

    return replace(
        inp, step_s=tuple(tuple(v * ms for v in row) for row in inp.step_s),
        upd_s=tuple(tuple(v * ms for v in row) for row in inp.upd_s), upd_fixed_s=tuple(v * ms for v in inp.upd_fixed_s),
        send_floor_s=tuple(v * ms for v in inp.send_floor_s),
        send_away_s=tuple(tuple(v * ms for v in row) for row in inp.send_away_s),
        recv_floor_s=tuple(v * ms for v in inp.recv_floor_s),
        node=link(inp.node), zone=link(inp.zone),
        region=link(inp.region), inter=None if inp.inter is None else link(inp.inter),
        inter_in_zone=None if inp.inter_in_zone is None else {z: link(lc) for z, lc in inp.inter_in_zone.items()},
        pools=tuple(replace(p, price_per_gpu_hour_usd=p.price_per_gpu_hour_usd / ms) for p in inp.pools),
        min_iters_per_s=None if inp.min_iters_per_s is None else inp.min_iters_per_s / ms,
        sync_table=table(inp.sync_table), span_sync_table=table(inp.span_sync_table),
        repeat_sync_table=table(inp.repeat_sync_table),
        tied_pool_s=tuple(tuple(v * ms for v in row) for row in inp.tied_pool_s),
        tied_pair_s=None if inp.tied_pair_s is None else {
            key: tuple(v * ms for v in row) for key, row in inp.tied_pair_s.items()})


def objective_value(inp: JointInputs, solver_objective: float) -> float:
    """A solver's objective or bound in seconds (max throughput) or USD (min cost)."""
    return solver_objective / (COST_SCALE if inp.objective == "min_cost" else TIME_UNITS_PER_S)


def _scale_rows(m: pyo.ConcreteModel, names: tuple[str, ...], factor: float) -> None:
    for name in names:
        comp = getattr(m, name, None)
        if comp is None:
            continue
        for row in comp.values():
            lo, body, hi = row.lower, row.body, row.upper
            row.set_value((None if lo is None else factor * lo, factor * body, None if hi is None else factor * hi))


def _layer_constraints(m: pyo.ConcreteModel, inp: JointInputs) -> None:
    """Staircase form: a[i,l] = 1 when unit l sits on stage i or earlier; y[i,l] = a[i,l] - a[i-1,l].
    Monotone in l (a prefix of the units) and in i; its LP relaxation is much tighter than ordering
    stage indices, because every fractional point is a convex combination of contiguous splits."""
    P, U = inp.P, inp.U
    m.y = pyo.Var(m.I, m.L, domain=pyo.Binary)
    m.a = pyo.Var(range(P - 1), m.L, domain=pyo.Binary)
    a = lambda i, l: (1 if i >= P - 1 else (0 if i < 0 else m.a[i, l]))  # noqa: E731
    m.prefix = pyo.Constraint(range(P - 1), range(U - 1), rule=lambda m, i, l: m.a[i, l] >= m.a[i, l + 1])
    m.nested = pyo.Constraint(range(P - 2), m.L, rule=lambda m, i, l: m.a[i, l] <= m.a[i + 1, l])
    m.link_y = pyo.Constraint(m.I, m.L, rule=lambda m, i, l: m.y[i, l] == a(i, l) - a(i - 1, l))
    m.nonempty = pyo.Constraint(m.I, rule=lambda m, i: sum(m.y[i, l] for l in m.L) >= 1)
    big_step = [sum(inp.step_s[k]) for k in m.K]
    m.straggler = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.tau[i] >= stage_sum(
        m, inp, i, inp.step_s[k]) - big_step[k] * (1 - m.u[i, k]))

    def memory(m, i, k):
        nf = inp.in_flight(i)
        load = sum(worker_bytes(inp.stat_bytes[k][l], inp.act_bytes[k][l], nf) * m.y[i, l] for l in m.L)
        big = max(0.0, worker_bytes(sum(inp.stat_bytes[k]), sum(inp.act_bytes[k]), nf) - inp.cap_bytes[k])
        # scaled to GiB so that the coefficients stay near 1 for the solvers
        return load / 2**30 <= (inp.cap_bytes[k] + big * (1 - m.u[i, k])) / 2**30

    m.memory = pyo.Constraint(m.I, m.K, rule=memory)
    # valid cut without big-M: a stage is never faster than its units on the fastest pool
    fastest = [min(inp.step_s[k][l] for k in m.K) for l in m.L]
    m.tau_floor = pyo.Constraint(m.I, rule=lambda m, i: m.tau[i] >= stage_sum(m, inp, i, fastest))


def _replica_constraints(m: pyo.ConcreteModel, inp: JointInputs) -> None:
    D = inp.D
    m.replicas = pyo.Constraint(m.I, rule=lambda m, i: sum(m.x[i, k] for k in m.K) == D)
    keys = sorted({p.quota_key for p in inp.pools})
    m.quota = pyo.Constraint(range(len(keys)), rule=lambda m, q: sum(
        inp.pools[k].tp * m.x[i, k] for i in m.I for k in m.K if inp.pools[k].quota_key == keys[q])
        <= next(p.avail_gpus for p in inp.pools if p.quota_key == keys[q]))
    m.use_hi = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.x[i, k] <= D * m.u[i, k])
    m.use_lo = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.u[i, k] <= m.x[i, k])
    if inp.max_gpus is not None:
        m.max_gpus = pyo.Constraint(expr=sum(inp.pools[k].tp * m.x[i, k] for i in m.I for k in m.K) <= inp.max_gpus)


def _block_constraints(m: pyo.ConcreteModel, inp: JointInputs, max_stage_time: float = math.inf) -> None:
    """nb[i,n] = 1: stage i holds n blocks.  z[j] = 1 for choice j = (i, r, n): besides, class r is
    its straggler, so tau[i] = time[r,i,n] exactly, and its D replicas come from classes no slower
    than r at n that fit n blocks in memory: xc[j,c] replicas of class c, sum_c xc[j,c] = D z[j],
    and sum_{k of class c} x[i,k] = sum_j xc[j,c]. This disaggregated (convex-hull) form of the
    union of stage choices halves HiGHS's time against the aggregated row x[i,k] <= D sum z
    (measured 1.43 vs 2.94 s on GPT-Neo, A100 + V100, P5 D16). Choices slower than
    `max_stage_time` (from the cutoff, `stage_time_cap_s`) are left out."""
    classes = time_classes(inp)
    time_s, fits = _class_figures(inp)
    N = {i: list(block_counts(inp, i)) for i in range(inp.P)}
    choices = [(i, c, n) for i in range(inp.P) for n in N[i] for c in classes
               if fits[c, i, n] and time_s[c, i, n] <= max_stage_time]
    w_idx = sorted({(i, n) for i, _, n in choices})
    for i in range(inp.P):  # before any row: a stage with no choice would make an empty row "== 1"
        if not any(i2 == i for i2, _ in w_idx):
            raise NoStageChoice(i)
    m.nb = pyo.Var(w_idx, domain=pyo.Binary)
    m.z = pyo.Var(range(len(choices)), domain=pyo.Binary)
    m.choices, m.class_time_s = choices, time_s  # the warm start names the straggler class with them
    at_stage = {i: [(j, r, n) for j, (i2, r, n) in enumerate(choices) if i2 == i] for i in range(inp.P)}
    m.one_count = pyo.Constraint(m.I, rule=lambda m, i: sum(m.nb[i, n] for n in N[i] if (i, n) in m.nb) == 1)
    m.every_block = pyo.Constraint(expr=sum(n * m.nb[i, n] for (i, n) in w_idx) == inp.U - 2)
    by_w = {key: [] for key in w_idx}
    for j, (i, c, n) in enumerate(choices):
        by_w[i, n].append(j)
    m.one_class = pyo.Constraint(w_idx, rule=lambda m, i, n: sum(m.z[j] for j in by_w[i, n]) == m.nb[i, n])
    m.stage_time = pyo.Constraint(m.I, rule=lambda m, i: m.tau[i] == sum(
        time_s[c, i, n] * m.z[j] for j, c, n in at_stage[i]))
    serve = [(j, c) for j, (i, r, n) in enumerate(choices) for c in classes
             if fits[c, i, n] and time_s[c, i, n] <= time_s[r, i, n] * (1 + 1e-12)]
    m.xc = pyo.Var(serve, domain=pyo.NonNegativeReals, bounds=(0, inp.D))
    served = {j: [] for j in range(len(choices))}
    by_class = {(i, c): [] for i in range(inp.P) for c in classes}
    for j, c in serve:
        served[j].append(c)
        by_class[choices[j][0], c].append(j)
    m.replicas_of_choice = pyo.Constraint(range(len(choices)), rule=lambda m, j: sum(
        m.xc[j, c] for c in served[j]) == inp.D * m.z[j])
    pools_of = dict(zip(classes, class_pools(inp, classes)))
    m.allow = pyo.Constraint(m.I, classes, rule=lambda m, i, *c: sum(m.x[i, k] for k in pools_of[c]) == sum(
        m.xc[j, c] for j in by_class[i, c]))


class NoStageChoice(Exception):
    """No pool fits any block count on some stage: the outer choice is infeasible."""

    def __init__(self, stage: int):
        super().__init__(f"no pool fits stage {stage}")
        self.stage = stage


def _placement_constraints(m: pyo.ConcreteModel, inp: JointInputs, Zs: list[str], Rs: list[str]) -> None:
    m.one_region = pyo.Constraint(m.I, rule=lambda m, i: sum(m.rho[i, r] for r in Rs) == 1)
    m.in_region = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.u[i, k] <= m.rho[i, inp.pools[k].region])
    m.in_zone = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.v[i, inp.pools[k].zone] >= m.u[i, k])
    m.spanning = pyo.Constraint(m.I, rule=lambda m, i: sum(m.v[i, z] for z in Zs) <= 1 + (len(Zs) - 1) * m.span[i])
    # v and span exact (span relaxes the boundary rows below, so it must not be set at will)
    m.zone_used = pyo.Constraint(m.I, Zs, rule=lambda m, i, z: m.v[i, z] <= sum(
        m.u[i, k] for k in m.K if inp.pools[k].zone == z))
    m.spanning_only = pyo.Constraint(m.I, rule=lambda m, i: m.span[i] <= sum(m.v[i, z] for z in Zs) - 1)
    pairs_z = [(z1, z2) for z1 in Zs for z2 in Zs if z1 != z2]
    pairs_r = [(r1, r2) for r1 in Rs for r2 in Rs if r1 != r2]
    B = range(inp.P - 1)
    # replicas pair up over a boundary (equal shares), so a pair crosses zones for sure only where one
    # side sits in one zone and the other has a replica elsewhere (dz: the time), and every pair
    # crosses only where both sides sit in one zone each (dz_all: the egress of all D transfers)
    cross = lambda m, i, z1, z2, slack: m.v[i, z1] + m.v[i + 1, z2] - 1 - slack  # noqa: E731
    m.cross_zone = pyo.Constraint(B, pairs_z or [("", "")], rule=lambda m, i, z1, z2: (
        m.dz[i] >= cross(m, i, z1, z2, m.span[i])) if z1 else pyo.Constraint.Skip)
    m.cross_zone_next = pyo.Constraint(B, pairs_z or [("", "")], rule=lambda m, i, z1, z2: (
        m.dz[i] >= cross(m, i, z1, z2, m.span[i + 1])) if z1 else pyo.Constraint.Skip)
    m.dz_all = pyo.Var(B, domain=pyo.NonNegativeReals, bounds=(0, 1))
    m.cross_zone_all = pyo.Constraint(B, pairs_z or [("", "")], rule=lambda m, i, z1, z2: (
        m.dz_all[i] >= cross(m, i, z1, z2, m.span[i] + m.span[i + 1])) if z1 else pyo.Constraint.Skip)
    m.cross_region = pyo.Constraint(B, pairs_r or [("", "")], rule=lambda m, i, r1, r2: (
        m.dr[i] >= m.rho[i, r1] + m.rho[i + 1, r2] - 1) if r1 else pyo.Constraint.Skip)
    m.cross_region_all = pyo.Constraint(B, rule=lambda m, i: m.dz_all[i] >= m.dr[i])  # regions differ: every pair
    # ... so the boundary takes c_region even where both sides span zones (the simulator's transfers
    # all go over the region link there)
    m.cross_region_time = pyo.Constraint(B, rule=lambda m, i: m.dz[i] >= m.dr[i])
    _apart_rows(m, inp, B)
    last = inp.P - 1
    m.ez = pyo.Var(domain=pyo.Binary)
    m.er = pyo.Var(domain=pyo.Binary)
    m.ends_zone = pyo.Constraint(pairs_z or [("", "")], rule=lambda m, z1, z2: (
        m.ez >= m.v[0, z1] + m.v[last, z2] - 1) if z1 else pyo.Constraint.Skip)
    m.ends_span = pyo.Constraint(expr=m.ez >= m.span[0])
    m.ends_span_last = pyo.Constraint(expr=m.ez >= m.span[last])
    m.ends_region = pyo.Constraint(pairs_r or [("", "")], rule=lambda m, r1, r2: (
        m.er >= m.rho[0, r1] + m.rho[last, r2] - 1) if r1 else pyo.Constraint.Skip)
    # and from above: ends in one zone (region) have ez = 0 (er = 0). The tied floors need not grow
    # from node to zone to region (a network between zones may be faster than the one between
    # nodes), so a free ez or er could lower them (measured, session 60: a min-cost MILP under a
    # floor set er = 1 with both ends in one region, its tied floor 1.7 ms for 8.3 ms, and passed
    # the floor at T = 11.5 ms where its plan takes 18.0 ms)
    m.ends_same_zone = pyo.Constraint(Zs, rule=lambda m, z: m.ez <= 2 - m.v[0, z] - m.v[last, z] + m.span[0]
                                      + m.span[last])
    m.ends_same_region = pyo.Constraint(Rs, rule=lambda m, r: m.er <= 2 - m.rho[0, r] - m.rho[last, r])
    ez, er = ends_forced(inp)  # valid: no zone (region) holds both ends; the LP relaxation does not see it
    if ez:
        m.ez.setlb(1)
    if er:
        m.er.setlb(1)


def _apart_rows(m: pyo.ConcreteModel, inp: JointInputs, B: range) -> None:
    """dn[i] (`composition.apart`): 1 where some pair over boundary i is surely on two nodes:
      dn[i] >= dz[i]                                     (a pair in two zones is on two nodes)
      dn[i] >= u[i,k] - sum_{k' may share with k} u[i+1,k'], and the same from stage i + 1
      gpus[i,q] - n_q <= M_q (dn[i] + sum_{k, k' of q: t_k > t_k'} w[i,k,k']),  w[i,k,k'] <= u[i,k], u[i+1,k']
    with gpus[i,q] = sum_{k of q} t_k (x[i,k] + x[i+1,k]), n_q the GPUs of q's largest node and
    M_q = min(2 D max_k t_k, avail_q) - n_q: the first-fit rule (`composition._crowded`), off where a
    left TP of q is above a right one (w = 1). At boundary 0 the node is the first that first fit
    gives stage 0's least TP of q (`composition._room`): per pool k of q with f_k = its
    `first_node_gpus` below n_q,
      gpus[0,q] - f_k <= M_k (dn[0] + 1 - u[0,k] + sum_{k' of q: t_k' < t_k} u[0,k'] + sum w[0,.,.])
    (on where k is the least TP of q stage 0 uses), M_k = min(2 D max t, avail_q) - f_k."""
    if inp.inter is None:  # no c_inter (Sailor's composition): dn is dz, and no row or variable for it
        return
    m.dn = pyo.Var(B, domain=pyo.Binary)
    m.apart_zone = pyo.Constraint(B, rule=lambda m, i: m.dn[i] >= m.dz[i])
    mates = [[o for o in m.K if may_share_node(inp.pools[k], inp.pools[o])] for k in m.K]
    m.apart = pyo.Constraint(B, m.K, [0, 1], rule=lambda m, i, k, side: m.dn[i] >= (
        m.u[i + side, k] - sum(m.u[i + 1 - side, o] for o in mates[k])))
    rows = []  # per group first fit's rule reads: its pools, n_q, M_q and its TP inversions (k, k')
    firsts = []  # boundary 0: (the group's row, pool k, f_k, M_k) where f_k < n_q
    for ks in first_fit_groups(inp).values():
        n = inp.pools[ks[0]].node_gpus
        most = min(2 * inp.D * max(inp.pools[k].tp for k in ks), inp.pools[ks[0]].avail_gpus)
        room = [(k, inp.pools[k].first_node_gpus) for k in ks if (inp.pools[k].first_node_gpus or n) < n]
        if most - n > 0 or (inp.P > 1 and any(most > f for _, f in room)):
            rows.append((ks, n, most - n, [(kl, kr) for kl in ks for kr in ks if inp.pools[kl].tp > inp.pools[kr].tp]))
            firsts += [(len(rows) - 1, k, f, most - f) for k, f in room if most > f and inp.P > 1]
    inversions = [(i, kl, kr) for i in B for *_, pairs in rows for kl, kr in pairs]
    m.inverted = pyo.Var(inversions, domain=pyo.NonNegativeReals)
    m.inverted_left = pyo.Constraint(inversions, rule=lambda m, i, kl, kr: m.inverted[i, kl, kr] <= m.u[i, kl])
    m.inverted_right = pyo.Constraint(inversions, rule=lambda m, i, kl, kr: m.inverted[i, kl, kr] <= m.u[i + 1, kr])

    def crowded(m, i: int, j: int):
        ks, n, big, pairs = rows[j]
        if big <= 0:  # a group in `rows` for its first node alone
            return pyo.Constraint.Skip
        gpus = sum(inp.pools[k].tp * (m.x[i, k] + m.x[i + 1, k]) for k in ks)
        return gpus - n <= big * (m.dn[i] + sum(m.inverted[i, kl, kr] for kl, kr in pairs))
    m.crowded = pyo.Constraint(B, range(len(rows)), rule=crowded)

    def crowded_first(m, r: int):
        j, k, room, big = firsts[r]
        ks, _, _, pairs = rows[j]
        gpus = sum(inp.pools[o].tp * (m.x[0, o] + m.x[1, o]) for o in ks)
        lower = sum(m.u[0, o] for o in ks if inp.pools[o].tp < inp.pools[k].tp)
        return gpus - room <= big * (m.dn[0] + 1 - m.u[0, k] + lower + sum(m.inverted[0, kl, kr] for kl, kr in pairs))
    m.crowded_first = pyo.Constraint(range(len(firsts)), rule=crowded_first)


def _time_constraints(m: pyo.ConcreteModel, inp: JointInputs) -> None:
    B = range(inp.P - 1)
    dn = m.dz if inp.inter is None else m.dn  # without c_inter, c_inter = c_node and dn's step is 0
    # c_in_zone[i]: what a boundary with both sides in one zone z alone and some pair on two nodes
    # adds over c_inter, where z's own pairs of nodes are slower (`composition.in_zone_s`)
    slow = {z: in_zone_s(inp, z) - boundary_s(inp, 1, 0, 0) for z in inp.zones}
    slow = {z: t for z, t in slow.items() if t > 0}
    m.c_in_zone = pyo.Var(B, domain=pyo.NonNegativeReals, bounds=(0, max(slow.values(), default=0.0)))
    m.inside_zone = pyo.Constraint(B, list(slow), rule=lambda m, i, z: m.c_in_zone[i] >= slow[z] * (
        m.dn[i] + m.v[i, z] + m.v[i + 1, z] - 2 - m.span[i] - m.span[i + 1]))
    m.boundary = pyo.Constraint(B, rule=lambda m, i: m.c[i] == boundary_s(inp, dn[i], m.dz[i], m.dr[i]) + m.c_in_zone[i])
    tau, c = [m.tau[i] for i in m.I], [m.c[i] for i in B]
    p2p = _sailor_send_rows(m, inp) if inp.sailor else [0.0] * inp.P
    terms = bottleneck_terms(inp, tau, c, p2p)
    m.bottleneck = pyo.Constraint(range(len(terms)), rule=lambda m, j: m.theta >= terms[j])
    m.bottleneck_mean = pyo.Constraint(expr=inp.P * m.theta >= sum(m.tau[i] for i in m.I))  # valid cut
    _sync_constraints(m, inp)
    m.sync_max = pyo.Constraint(m.I, rule=lambda m, i: m.sigma >= m.sync[i])
    big_upd = [sum(inp.upd_s[k]) + inp.upd_fixed(k) for k in m.K]
    m.update = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.mu >= stage_sum(
        m, inp, i, inp.upd_s[k]) + inp.upd_fixed(k) - big_upd[k] * (1 - m.u[i, k]))
    m.iteration = pyo.Constraint(expr=m.T == iteration_time_s(inp.m, sum(tau), pipeline_transfers_s(inp, c, p2p),
                                                              m.theta, m.sigma + m.mu))


def _sailor_send_rows(m: pyo.ConcreteModel, inp: JointInputs) -> list:
    """Stage i's sends (Sailor's composition): A[i] its activation to stage i + 1, G[i] its gradient
    to stage i - 1, each at least half its boundary's time c / 2 and at least the send floor of every
    pool it uses (`JointInputs.send_floor_s`); returns Sailor's p[i] (`sailor_p2p`). A replica of pool
    k sends to a replica of the neighbour stage j; where j uses no pool of zone z_k (v[j, z_k] = 0),
    that receiver is in another zone, where j sits in another region (rho[j, r_k] = 0), in another
    region: then the send is at least pool k's floor away (`JointInputs.send_away_s`):
      A[i] >= away_zone[k] (u[i,k] - v[i+1, z_k]),  A[i] >= away_region[k] (u[i,k] - rho[i+1, r_k]),
    and G[i] likewise with stage i - 1. Every replica of the receiving stage gets one of the sends
    (replica j sends to j mod D), so A[i] >= recv[k] u[i+1,k] and G[i] >= recv[k] u[i-1,k]
    (`JointInputs.recv_floor_s`)."""
    if inp.P == 1:
        return [0.0]
    m.send = pyo.Var(m.I, domain=pyo.NonNegativeReals)
    m.send_pool = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.send[i] >= inp.send_floor(k) * m.u[i, k])
    m.A = pyo.Var(range(inp.P - 1), domain=pyo.NonNegativeReals)
    m.G = pyo.Var(range(1, inp.P), domain=pyo.NonNegativeReals)
    m.A_link = pyo.Constraint(m.A.index_set(), rule=lambda m, i: m.A[i] >= m.c[i] / 2)
    m.A_send = pyo.Constraint(m.A.index_set(), rule=lambda m, i: m.A[i] >= m.send[i])
    m.G_link = pyo.Constraint(m.G.index_set(), rule=lambda m, i: m.G[i] >= m.c[i - 1] / 2)
    m.G_send = pyo.Constraint(m.G.index_set(), rule=lambda m, i: m.G[i] >= m.send[i])
    if inp.recv_floor_s:  # every replica of the receiving stage gets a send: at least its receive floor
        m.A_recv = pyo.Constraint(m.A.index_set(), m.K, rule=lambda m, i, k: m.A[i] >= inp.recv_floor(k) * m.u[i + 1, k])
        m.G_recv = pyo.Constraint(m.G.index_set(), m.K, rule=lambda m, i, k: m.G[i] >= inp.recv_floor(k) * m.u[i - 1, k])
    if inp.send_away_s:
        def away(var, i, j, k, w):  # stage i's send to stage j from pool k, w = 0: zone, 1: region
            floor, pool = inp.send_away(k)[w], inp.pools[k]
            other = m.v[j, pool.zone] if w == 0 else m.rho[j, pool.region]
            return var >= floor * (m.u[i, k] - other) if floor > 0 else pyo.Constraint.Skip
        W = [0, 1]
        m.A_away = pyo.Constraint(m.A.index_set(), m.K, W, rule=lambda m, i, k, w: away(m.A[i], i, i + 1, k, w))
        m.G_away = pyo.Constraint(m.G.index_set(), m.K, W, rule=lambda m, i, k, w: away(m.G[i], i, i - 1, k, w))
    return sailor_p2p([m.A[i] for i in range(inp.P - 1)], [m.G[i] for i in range(1, inp.P)])


def _sync_constraints(m: pyo.ConcreteModel, inp: JointInputs) -> None:
    tied = {i: 0.0 for i in m.I}
    if inp.P > 1 and inp.tied_pool_s:
        # the tied-embedding all-reduce joins the first and last stage (ez/er: they differ in zone/region);
        # its ring carries bytes / the least TP of both ends, so it takes at least the floor of every
        # pool serving an end (at t_k), of any pool (`tied_s`) and of a pair of pools serving the
        # first and the last stage (`tied_pair_s`)
        last, big_t = inp.P - 1, inp.tied_worst_s
        m.tied = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0, big_t))
        m.tied_any = pyo.Constraint(expr=m.tied >= tied_at(inp.tied_s, m.ez, m.er))
        m.tied_pool = pyo.Constraint([0, last], m.K, rule=lambda m, j, k: m.tied >= tied_at(
            inp.tied_pool_s[k], m.ez, m.er) - big_t * (1 - m.u[j, k]))
        pairs = inp.tied_pair_s or {}
        m.tied_pair = pyo.Constraint(list(pairs), rule=lambda m, k, k2: m.tied >= tied_at(
            pairs[k, k2], m.ez, m.er) - big_t * (2 - m.u[0, k] - m.u[last, k2]))
        tied[0] = tied[last] = m.tied
    m.sync_tied = pyo.Constraint(m.I, rule=lambda m, i: m.sync[i] >= tied[i])
    if m.layers == "blocks":
        _mean_sync_update_rows(m, inp, tied)
    if inp.sync_table is None or m.layers != "blocks":
        return  # layer units that differ: no all-reduce floor but the tied embedding's
    big = max([model_coef(v) for tab in (inp.sync_table, inp.span_sync_table or {}) for v in tab.values()] + [0.0])

    def own(i, k, table):
        return sum(model_coef(table[k, position(inp, i), n]) * m.nb[i, n] for n in block_counts(inp, i)
                   if (i, n) in m.nb)

    # a stage in one zone (span 0) reads `sync_table`, one spanning zones `span_sync_table`
    m.sync_node = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.sync[i] >= own(i, k, inp.sync_table)
                                 - big * (1 - m.u[i, k] + m.span[i]) + tied[i])
    if inp.span_sync_table is not None:
        m.sync_zone = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.sync[i] >= own(i, k, inp.span_sync_table)
                                     - big * (2 - m.u[i, k] - m.span[i]) + tied[i])
    if inp.repeat_sync_table is not None and inp.D > 1:
        _repeat_sync_rows(m, inp, own, tied)


def _repeat_sync_rows(m: pyo.ConcreteModel, inp: JointInputs, own, tied: dict) -> None:
    """rep[i,g] = 1 where stage i holds two or more replicas of group g (a zone's GPU type): the row
    (D - 1) rep[i,g] >= sum_{k in g} x[i,k] - 1 forces it (the objective keeps it 0 otherwise), and
    then stage i's all-reduce is at least the `repeat_sync_table` entry of every pool k of g it uses."""
    groups = _groups(inp)
    m.groups = pyo.Set(initialize=range(len(groups)))
    index = {g: j for j, g in enumerate(groups)}
    m.rep = pyo.Var(m.I, m.groups, domain=pyo.Binary)
    m.rep_def = pyo.Constraint(m.I, m.groups, rule=lambda m, i, j: (inp.D - 1) * m.rep[i, j] >= sum(
        m.x[i, k] for k in m.K if group_of(inp, k) == groups[j]) - 1)
    big = max([model_coef(v) for v in inp.repeat_sync_table.values()] + [0.0])
    m.sync_repeat = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.sync[i] >= own(i, k, inp.repeat_sync_table)
                                   - big * (2 - m.u[i, k] - m.rep[i, index[group_of(inp, k)]]) + tied[i])


def _groups(inp: JointInputs) -> list[tuple[str, str]]:
    """The (zone, GPU type) groups of the pools, in the order of the rep variables' index."""
    return sorted({group_of(inp, k) for k in range(inp.K)})


def _mean_sync_update_rows(m: pyo.ConcreteModel, inp: JointInputs, tied: dict) -> None:
    """Valid cuts in the blocks form: a stage's all-reduce is the slowest over its pools, so it is at
    least the mean over its D replicas of their class's least all-reduce (`_class_sync_update`),
    sum_{j at i, c} sync[c,i,n_j] xc[j,c] / D; likewise the update time mu. The big-M rows on
    u[i,k] say nothing in the LP relaxation (u fractional); these do. Measured on GPT-Neo, 3 x 256
    GPUs, P4 b1 D64: HiGHS proved the optimum in 8.2 s with them, 28.1 s without."""
    sync_c, upd_c = _class_sync_update(inp)
    at = {i: [] for i in m.I}
    for j, *c in m.xc:  # Pyomo flattens the (j, (gpu type, tp)) index
        i, _, n = m.choices[j]
        at[i].append((j, tuple(c), n))
    m.sync_mean = pyo.Constraint(m.I, rule=lambda m, i: m.sync[i] >= sum(
        model_coef(sync_c[c, i, n]) / inp.D * m.xc[j, c] for j, c, n in at[i]) + tied[i])
    m.update_mean = pyo.Constraint(m.I, rule=lambda m, i: m.mu >= sum(
        upd_c[c, i, n] / inp.D * m.xc[j, c] for j, c, n in at[i]))


def _cost_and_objective(m: pyo.ConcreteModel, inp: JointInputs, linearize: bool, Zs: list[str]) -> None:
    rate = {(i, k): replica_rate_usd_per_s(inp.pools[k]) for i in m.I for k in m.K}
    m.egress = pyo.Var(domain=pyo.NonNegativeReals)
    _egress_constraints(m, inp, Zs)
    need_cost = inp.objective == "min_cost" or inp.max_cost_usd is not None
    if need_cost:
        if linearize:  # rate x T, exactly, in linear rows
            m.cost = pyo.Expression(expr=iteration_cost_usd(1.0, _linear_rate_times_T(m, inp, rate), m.egress))
        else:
            m.cost = pyo.Expression(expr=iteration_cost_usd(sum(rate[i, k] * m.x[i, k] for i in m.I for k in m.K),
                                                            m.T, m.egress))
        # rows on cost are written in micro-dollars: an iteration costs ~1e-5..1 USD, and absolute
        # feasibility tolerances (1e-6 in SCIP) would otherwise be as large as the cost differences
        if inp.max_cost_usd is not None:
            m.budget = pyo.Constraint(expr=COST_SCALE * m.cost <= COST_SCALE * inp.max_cost_usd)
    if inp.objective == "min_cost":
        m.obj = pyo.Objective(expr=COST_SCALE * m.cost, sense=pyo.minimize)
    else:
        m.obj = pyo.Objective(expr=m.T, sense=pyo.minimize)


def _linear_rate_times_T(m: pyo.ConcreteModel, inp: JointInputs, rate: dict) -> pyo.Expression:
    """x[i,k] * T exactly: x = sum_j 2^j beta[i,k,j], w[i,k,j] = beta[i,k,j] * T (McCormick on a binary)."""
    t_ub = m.T.ub
    bits = max(1, math.ceil(math.log2(inp.D + 1)))
    J = range(bits)
    m.beta = pyo.Var(m.I, m.K, J, domain=pyo.Binary)
    m.w = pyo.Var(m.I, m.K, J, domain=pyo.NonNegativeReals, bounds=(0, t_ub))
    m.expand = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.x[i, k] == sum(2**j * m.beta[i, k, j] for j in J))
    m.w_le_beta = pyo.Constraint(m.I, m.K, J, rule=lambda m, i, k, j: m.w[i, k, j] <= t_ub * m.beta[i, k, j])
    m.w_le_T = pyo.Constraint(m.I, m.K, J, rule=lambda m, i, k, j: m.w[i, k, j] <= m.T)
    m.w_ge = pyo.Constraint(m.I, m.K, J, rule=lambda m, i, k, j: m.w[i, k, j] >= m.T - t_ub * (1 - m.beta[i, k, j]))
    return sum(rate[i, k] * 2**j * m.w[i, k, j] for i in m.I for k in m.K for j in J)


def _egress_constraints(m: pyo.ConcreteModel, inp: JointInputs, Zs: list[str]) -> None:
    """Bytes leaving a zone per iteration: pipeline traffic over crossing boundaries, and the rings of
    stages spanning zones (a ring sorted by zone crosses as many zone borders as it has zones)."""
    # in MB and USD/MB: raw byte counts (1e9..1e12) next to prices (1e-11 USD/byte) gave HiGHS
    # "primal infeasibilities" on otherwise easy models, while GB let SCIP's 1e-6 feasibility
    # tolerance on wz shave ~1e-5 of the cost
    pz, pr = inp.egress_zone_usd_per_GB / 1e3, inp.egress_region_usd_per_GB / 1e3
    p2p_bytes = pipeline_egress_bytes(inp) / 1e6
    B = range(inp.P - 1)
    ring = ring_factor(inp)
    gb = [g / 1e6 for g in inp.grad_bytes]
    gmax = sum(gb)
    m.wz = pyo.Var(m.I, Zs, domain=pyo.NonNegativeReals, bounds=(0, gmax))
    m.wz_def = pyo.Constraint(m.I, Zs, rule=lambda m, i, z: m.wz[i, z] >= stage_sum(
        m, inp, i, gb) - gmax * (1 - m.v[i, z]))
    m.ring_egress = pyo.Var(m.I, domain=pyo.NonNegativeReals)
    m.ring_egress_def = pyo.Constraint(m.I, rule=lambda m, i: m.ring_egress[i] >= ring * pz * (
        sum(m.wz[i, z] for z in Zs) - len(Zs) * gmax * (1 - m.span[i])))
    tied = tied_egress_bytes(inp) / 1e6
    m.egress_def = pyo.Constraint(expr=m.egress >= sum(
        p2p_bytes * (pz * m.dz_all[i] + (pr - pz) * m.dr[i]) for i in B) + sum(m.ring_egress[i] for i in m.I)
        + tied * (pz * m.ez + (pr - pz) * m.er))


def decode(m: pyo.ConcreteModel, inp: JointInputs) -> JointSolution:
    ranges = []
    if m.layers == "blocks":
        start = 0
        for i in range(inp.P):
            n = next(n for n in block_counts(inp, i) if (i, n) in m.nb and pyo.value(m.nb[i, n]) > 0.5)
            end = inp.U if i == inp.P - 1 else (1 + n if i == 0 else start + n)
            ranges.append((start, end))
            start = end
    else:
        for i in range(inp.P):
            units = [l for l in range(inp.U) if pyo.value(m.y[i, l]) > 0.5]
            ranges.append((min(units), max(units) + 1))
    reps = tuple(tuple(int(round(pyo.value(m.x[i, k]))) for k in range(inp.K)) for i in range(inp.P))
    cost = pyo.value(m.cost) if hasattr(m, "cost") else None
    return JointSolution(tuple(ranges), reps, pyo.value(m.T) / TIME_UNITS_PER_S,
                         cost if cost is not None else float("nan"))


def _block_start(m: pyo.ConcreteModel, inp: JointInputs, sol: JointSolution, start: ComponentMap) -> bool:
    counts = solution_blocks(inp, sol)
    if counts is None:
        return False
    time_s = m.class_time_s
    for (i, n) in m.nb:
        start[m.nb[i, n]] = 1 if counts[i] == n else 0
    for j, (i, c, n) in enumerate(m.choices):
        start[m.z[j]] = 0
    for i in range(inp.P):
        used = {(inp.pools[k].gpu_type, inp.pools[k].tp) for k in range(inp.K) if sol.replicas[i][k]}
        straggler = max(used, key=lambda c: time_s[c, i, counts[i]])
        j = next((j for j, ch in enumerate(m.choices) if ch == (i, straggler, counts[i])), None)
        if j is None:
            return False
        start[m.z[j]] = 1
        for c in used:
            start[m.xc[j, c]] = sum(x for k, x in enumerate(sol.replicas[i]) if (inp.pools[k].gpu_type, inp.pools[k].tp) == c)
    for var in m.xc.values():
        if var not in start:
            start[var] = 0.0
    return True


def warm_start(m: pyo.ConcreteModel, inp: JointInputs, sol: JointSolution) -> ComponentMap | None:
    """A complete variable assignment for `sol` (the solver layer checks it against every constraint);
    None when `sol` lies outside the model's space (see `solution_blocks`)."""
    inp = in_model_units(inp if hasattr(m, "dn") else replace(inp, inter=None))  # the model's own boundaries
    ev = evaluate(inp, sol)
    start = ComponentMap()  # Pyomo variables are not hashable as plain dict keys
    if m.layers == "blocks":
        if not _block_start(m, inp, sol, start):
            return None
    else:
        for i, (first, end) in enumerate(sol.ranges):
            for l in range(inp.U):
                start[m.y[i, l]] = 1 if first <= l < end else 0
        for i in range(inp.P - 1):
            for l in range(inp.U):
                start[m.a[i, l]] = 1 if l < sol.ranges[i][1] else 0
    for i in range(inp.P):
        for k in range(inp.K):
            start[m.x[i, k]] = sol.replicas[i][k]
            start[m.u[i, k]] = 1 if sol.replicas[i][k] > 0 else 0
        for z in inp.zones:
            start[m.v[i, z]] = 1 if z in ev["zones"][i] else 0
        for r in inp.regions:
            start[m.rho[i, r]] = 1 if r in ev["regions"][i] else 0
        start[m.span[i]] = ev["span"][i]
        start[m.tau[i]] = ev["tau"][i]
        start[m.sync[i]] = ev["sync"][i]
        if hasattr(m, "rep"):
            twice = repeated_groups(inp, sol.replicas[i])
            for j, g in enumerate(_groups(inp)):
                start[m.rep[i, j]] = 1 if g in twice else 0
        gbi = sum(inp.grad_bytes[l] for l in range(*sol.ranges[i]))
        for z in inp.zones:
            start[m.wz[i, z]] = gbi / 1e6 if z in ev["zones"][i] else 0.0
        start[m.ring_egress[i]] = ring_factor(inp) * inp.egress_zone_usd_per_GB / 1e9 * len(ev["zones"][i]) * gbi if ev["span"][i] else 0.0
    for i in range(inp.P - 1):
        start[m.dz[i]], start[m.dr[i]], start[m.c[i]] = ev["dz"][i], ev["dr"][i], ev["c"][i]
        start[m.c_in_zone[i]] = ev["c"][i] - boundary_s(inp, ev["dn"][i], ev["dz"][i], ev["dr"][i])
        start[m.dz_all[i]] = ev["dz_all"][i]
        if hasattr(m, "dn"):
            start[m.dn[i]] = ev["dn"][i]
    if hasattr(m, "send"):  # Sailor's composition with P > 1
        for i in range(inp.P):
            start[m.send[i]] = ev["send"][i]
        for i in range(inp.P - 1):
            start[m.A[i]], start[m.G[i + 1]] = ev["A"][i], ev["G"][i]
    start[m.theta], start[m.sigma], start[m.mu], start[m.T] = ev["theta"], ev["sigma"], ev["mu"], ev["T"]
    start[m.egress] = ev["egress"]
    start[m.ez], start[m.er] = ev["ez"], ev["er"]
    if hasattr(m, "beta"):
        for (i, k, j) in m.beta:
            bit = (sol.replicas[i][k] >> j) & 1
            start[m.beta[i, k, j]] = bit
            start[m.w[i, k, j]] = bit * ev["T"]
    return start
