"""Joint resource allocation + parallelization for one outer choice (P, D, b, TP per GPU type).

The planner (`hetplan.planner`) enumerates the few discrete outer choices, Sailor-style (seed 000,
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
  c_node, c_zone, c_region   activation + gradient transfer seconds per microbatch over a boundary
  m = B / (D b) microbatches per iteration
Variables
  y[i,l] in {0,1}  unit l on stage i;           x[i,k] in Z+  replicas of pool k on stage i
  u[i,k] in {0,1}  pool k used by stage i;      v[i,z], rho[i,r] in {0,1} stage i uses zone z / sits in region r
  span[i] in {0,1} stage i spans several zones; dz[i], dr[i] in {0,1} boundary i -> i+1 crosses zones / regions
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
               dz[i] >= v[i,z] + v[i+1,z'] - 1 - span[i],  dz[i] >= v[i,z] + v[i+1,z'] - 1 - span[i+1]
               dz_all[i] >= v[i,z] + v[i+1,z'] - 1 - span[i] - span[i+1],  dz_all[i] >= dr[i]  (z != z')
               dr[i] >= rho[i,r] + rho[i+1,r'] - 1 (r != r')
               c[i] = c_node + (c_zone - c_node) dz[i] + (c_region - c_zone) dr[i]
  ends:        ez >= v[0,z] + v[P-1,z'] - 1, ez >= span[0], ez >= span[P-1]; er likewise with rho:
               the tied-embedding all-reduce between first and last stage crosses zones / regions
  bottleneck:  theta >= tau[i];  theta >= c[i] / 2              (links are full duplex)
  cuts:        tau[i] >= sum_l min_k step[k,l] y[i,l];  P theta >= sum_i tau[i]   (valid, no big-M)
  sync:        sync[i] >= tied[i];  (blocks form)  sync[i] >= S[k,i,n_i] - Msync (1 - u[i,k] + span[i]) + tied[i]
               and sync[i] >= S'[k,i,n_i] - Msync (2 - u[i,k] - span[i]) + tied[i], S / S' the all-reduce
               floors of a stage holding pool k in one zone / spanning zones (`sync_table`,
               `span_sync_table`); tied[0] = tied[P-1] = tied, tied >= t(ez, er) and
               tied >= t_k(ez, er) - Mtied (1 - u[j,k]) for j in {0, P-1}, t_k(ez, er) = t_node,k +
               (t_zone,k - t_node,k) ez + (t_region,k - t_zone,k) er the floors at bytes / t_k
               (`tied_pool_s`), t their least over k;  sigma >= sync[i]
  update:      mu >= sum_l upd[k,l] y[i,l] - Mupd[k] (1 - u[i,k])
  time (1F1B): T = sum_i tau[i] + sum_i c[i] + (m - 1) theta + sigma + mu
  cost:        rate = sum_{i,k} price[k] t_k x[i,k] / 3600 (USD/s);  egress = bytes crossing zones x price (boundaries: D transfers where dz_all)
               cost = rate * T + egress   (bilinear: kept for SCIP; exact binary-expansion
               linearisation of x[i,k] * T for HiGHS when `linearize=True`)
  limits:      cost <= budget;  T <= 1 / min_throughput;  sum_{i,k} t_k x[i,k] <= max_gpus
Objective
  max_throughput: minimise T (throughput = B / T);  min_cost: minimise cost.

Compact form (layers="blocks", chosen when every block after the first has the same figures: all
presets, Sailor's profiles). Stage i is described by its block count n alone: stage 0 holds the
embedding and blocks 1..n (n >= 1), middle stages n >= 1 generic blocks, the last stage n >= 0
blocks and the head (`block_counts`, `stage_units`). The staircase rows are replaced by
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
unit (`planner._Tables`), and `evaluate_placed` scores a solution of this model by placing it as
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
    (`planner._Tables.effective_link`); c_zone, c_region the fastest pair of their class;
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
rows above with the figures of core/simulator_sailor.py, where the pipeline pays each stage's
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
p[i] is at most Sailor's slowest send of the stage; the ring floors are the least neighbour pair.
Every bound below stays valid: Sailor's theta is at least max_i tau_i and c_i / 2 (p[i] >= a[i] and
p[i+1] >= g[i]), and sum_i p[i] >= sum_i c[i] (tests/test_sailor_planning.py checks the figures
and every bound against `simulate` on random plans). They ignore the transfers in theta, so they
are weaker for deep pipelines than for the hetplan composition.
"""
from __future__ import annotations

import bisect
import contextvars
import functools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np
import pyomo.environ as pyo
from pyomo.common.collections import ComponentMap

from hetplan.formulations.stage_cost import StageCosts
from hetplan.plan import Plan, Replica, Stage, validate_plan


ULP_SLACK = 1e-12  # relative: bounds built from sums in another order are lowered by this much
COST_SCALE = 1e6  # objective and budget rows in micro-dollars
TIME_UNITS_PER_S = 1e3  # the model's time variables are in milliseconds (`in_model_units`)


def model_coef(floor_s: float) -> float:
    """An all-reduce table entry as the MILP (and `evaluate`, its evaluation) reads it. The tables
    hold inf where no placement of that kind exists (`planner.with_sync_table`): the bounds rule
    such (stage, pool) pairs out, while the MILP needs finite coefficients and its quota and region
    rows already forbid them, so it reads 0 there (a relaxation: never above the true floor)."""
    return floor_s if floor_s < math.inf else 0.0


# ---- deadlines --------------------------------------------------------------------------------------
class DeadlineExceeded(Exception):
    """A bound or heuristic stopped at the deadline of the search it serves. What it had computed
    is dropped (caches store only finished values), so every figure kept stays valid."""


@dataclass(frozen=True)
class Deadline:
    """A point in time (`time.monotonic()`, the same clock in a forked helper) after which the
    search's long computations stop."""

    at: float = math.inf

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() > self.at

    def check(self) -> None:
        if time.monotonic() > self.at:
            raise DeadlineExceeded


NO_DEADLINE = Deadline()
# The deadline the bounds and heuristics of this module (and `joint_dp_heuristic`) check in their
# long loops. A scope rather than a parameter: the bounds call each other many levels deep through
# caches keyed by their inputs alone, and a finished value does not depend on the deadline.
_DEADLINE: contextvars.ContextVar[Deadline] = contextvars.ContextVar("hetplan_deadline", default=NO_DEADLINE)


@contextmanager
def deadline_scope(deadline: Deadline) -> Iterator[Deadline]:
    """Within the block, `check_deadline()` raises DeadlineExceeded after `deadline` (or an
    enclosing scope's earlier one)."""
    effective = Deadline(min(deadline.at, _DEADLINE.get().at))
    token = _DEADLINE.set(effective)
    try:
        yield effective
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    """Raise DeadlineExceeded when the current scope's deadline has passed (about 0.1 us)."""
    _DEADLINE.get().check()


@dataclass(frozen=True)
class Pool:
    gpu_type: str
    zone: str
    region: str
    tp: int
    avail_gpus: int  # GPUs of this type in this zone, shared by the pools of every TP degree
    price_per_gpu_hour_usd: float

    @property
    def quota_key(self) -> tuple[str, str]:
        return (self.gpu_type, self.zone)


@dataclass(frozen=True)
class LinkCost:
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True)
class JointInputs:
    """Plain numbers for one outer choice; `planner.joint_inputs` fills them from the estimators."""

    P: int
    D: int
    b: int
    m: int
    pools: tuple[Pool, ...]
    step_s: tuple[tuple[float, ...], ...]  # [k][l]
    upd_s: tuple[tuple[float, ...], ...]
    stat_bytes: tuple[tuple[float, ...], ...]
    act_bytes: tuple[tuple[float, ...], ...]
    cap_bytes: tuple[float, ...]
    grad_bytes: tuple[float, ...]  # [l], full (all TP shards)
    tied_grad_bytes: float  # 0 unless tied embeddings and P > 1
    boundary_bytes: float  # activation bytes of one microbatch crossing a stage boundary
    node: LinkCost
    zone: LinkCost
    region: LinkCost
    egress_zone_usd_per_GB: float
    egress_region_usd_per_GB: float
    sync_factor: float = 1.0  # 1.5 with ZeRO-3
    objective: str = "max_throughput"
    max_cost_usd: float | None = None
    min_iters_per_s: float | None = None
    max_gpus: int | None = None
    # (k, position(i), n) -> seconds of stage i's gradient all-reduce when it holds n blocks on D replicas of
    # pool k inside one zone, from the communication estimator (blocks form only; the ring formula
    # over the inter-node link otherwise). Lets the model match the simulator's hierarchical or
    # fitted all-reduce instead of a flat ring.
    sync_table: dict | None = None
    # the same for a stage spanning zones of its region (None with one zone or without sync_table)
    span_sync_table: dict | None = None
    # [k]: lower bounds on the tied-embedding all-reduce of the first and last stage when pool k
    # serves one of them (the ring's size is bytes / its least TP, at most t_k) and both ends sit in
    # one zone, in zones of one region (ez = 1), in two regions (er = 1) (`planner.tied_floors_s`);
    # empty: no tied embedding
    tied_pool_s: tuple[tuple[float, float, float], ...] = ()
    # "hetplan": the composition of core/simulator.py (rows above); "sailor": Sailor's simulator
    # composition (core/simulator_sailor.py, module docstring "Sailor's composition")
    composition: str = "hetplan"
    # [k] an optimizer step every stage served by pool k takes whatever units it holds (Sailor's
    # whole-model step from the profile); empty: none (the update is upd_s's per-unit sums alone)
    upd_fixed_s: tuple[float, ...] = ()
    # [k] (Sailor's composition) the least time of any one send of a replica of pool k to a replica
    # of the next or previous stage, whatever its place, size or receiver: Sailor's bandwidth fits
    # depend on the sender's TP group (a TP 1 sender is ~4x slower than a TP 4 one); empty: none
    send_floor_s: tuple[float, ...] = ()
    # [k] (Sailor's composition) the same floors on a send from a replica of pool k to a node of another
    # zone / another region (`planner._Tables.send_floor_s`): a TP 1 sender over zones is far slower than
    # the least send between zones over every TP group size (c_zone); empty: none
    send_away_s: tuple[tuple[float, float], ...] = ()
    # the shared stage evaluation the rows above were read from (`stage_cost.StageCosts`): scores a
    # decoded plan placed as the simulator places it (`evaluate_placed`); None for hand-made inputs
    costs: StageCosts | None = field(default=None, repr=False, compare=False)
    # figures that depend only on the rows above (pools, step, update, memory, gradient bytes), not
    # on P, m, the links or the sync table (`_shared_for`): choices built from the same row objects
    # may pass one dict (`planner.joint_inputs` does, per (b, D)); inputs whose rows are not the
    # ones that first used the dict (a copy made with other rows) keep such figures to themselves
    shared: dict = field(default_factory=dict, repr=False, compare=False)
    # bounds and tables computed for these very inputs (`_per_inputs_cache`); a copy made with
    # dataclasses.replace starts empty
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def tied_s(self) -> tuple[float, float, float]:
        """The tied-embedding floors whichever pools serve the ends (the least over pools)."""
        if not self.tied_pool_s:
            return 0.0, 0.0, 0.0
        return tuple(min(col) for col in zip(*self.tied_pool_s))

    @property
    def U(self) -> int:
        return len(self.grad_bytes)

    @property
    def K(self) -> int:
        return len(self.pools)

    def in_flight(self, i: int) -> int:
        """Microbatches stage i keeps activations of (1F1B); Sailor's memory rule does not cap P - i by m."""
        return self.P - i if self.sailor else min(self.P - i, self.m)

    @property
    def sailor(self) -> bool:
        return self.composition == "sailor"

    def upd_fixed(self, k: int) -> float:
        return self.upd_fixed_s[k] if self.upd_fixed_s else 0.0

    def send_floor(self, k: int) -> float:
        return self.send_floor_s[k] if self.send_floor_s else 0.0

    def send_away(self, k: int) -> tuple[float, float]:
        """(another zone, another region) send floors of pool k (`send_away_s`)."""
        return self.send_away_s[k] if self.send_away_s else (0.0, 0.0)

    def p2p_s(self, link: LinkCost) -> float:
        """Forward activation + backward gradient of one microbatch over one boundary."""
        return 2 * (link.latency_s + self.boundary_bytes / link.bandwidth_Bps)

    @property
    def zones(self) -> list[str]:
        return sorted({p.zone for p in self.pools})

    @property
    def regions(self) -> list[str]:
        return sorted({p.region for p in self.pools})


@dataclass(frozen=True)
class JointSolution:
    """Decoded parts: per stage its unit range and replica counts per pool, and the model's figures."""

    ranges: tuple[tuple[int, int], ...]
    replicas: tuple[tuple[int, ...], ...]  # [i][k]
    iteration_time_s: float
    cost_usd: float
    extra: dict = field(default_factory=dict)


# ---- bounds used for big-M constants and pruning ---------------------------------------------------
def time_upper_bound_s(inp: JointInputs) -> float:
    """T for the slowest imaginable assignment: a valid upper bound for the big-M on T."""
    worst_step = sum(max(inp.step_s[k][l] for k in range(inp.K)) for l in range(inp.U))
    tables = [inp.sync_table or {}, inp.span_sync_table or {}]
    worst_tied = max(map(max, inp.tied_pool_s), default=0.0)
    worst_sync = max([model_coef(v) for tab in tables for v in tab.values()] + [0.0]) + worst_tied
    worst_c = (max(inp.p2p_s(link) for link in (inp.node, inp.zone, inp.region)) * max(inp.P - 1, 0)
               + 2 * max([*inp.send_floor_s, *(v for row in inp.send_away_s for v in row)], default=0.0)
               * inp.P)  # Sailor's sends: each <= c / 2 + its largest floor
    worst_upd = sum(max(inp.upd_s[k][l] for k in range(inp.K)) for l in range(inp.U)) + max(inp.upd_fixed_s, default=0.0)
    return (inp.m + inp.P - 1) * (worst_step + worst_c) + worst_sync + worst_upd


def time_lower_bound_s(inp: JointInputs) -> float:
    """T >= sum_i tau_i + (m-1) theta with sum_i tau_i >= F = sum_l min_k step[k,l] and
    theta >= max(F / P, D W / N): a stage with G_i GPUs has tau_i G_i >= sum_k x[i,k] t_k step_i(k)
    >= D W_i, where W_i = sum_{l in i} min_k step[k,l] t_k (GPU-seconds of the cheapest way to run a
    unit), so max_i tau_i >= D sum_i W_i / sum_i G_i >= D W / N with N the GPUs available.
    With Sailor's composition plus `sailor_transfer_floor_s`."""
    return _work_bound_s(inp) + sailor_transfer_floor_s(inp)


def _work_bound_s(inp: JointInputs) -> float:
    return _fastest_work_s(inp) + (inp.m - 1) * _theta_work_bound_s(inp)


def sailor_transfer_floor_s(inp: JointInputs) -> float:
    """What Sailor's composition adds to the hetplan composition's T on the same inputs, at least
    (0 for the hetplan composition or one stage). Every send A_i, G_i (`sailor_p2p`) is at least
    the half of its boundary h = c / 2 and at least e = max(c_min / 2, the least send floor), c_min
    the least boundary time. For every plan:
      theta_sailor >= theta + e: where theta = tau_j, p_j >= a send of j >= e; where theta = h_i,
        stage i + 1 sends G >= h_i and another send >= e (a middle stage), or G twice (the last);
      sum_i p_i >= sum_i c_i + G_{P-1} (P <= 3), + A_0 + G_{P-1} (P > 3).
    So every bound on the hetplan composition's T plus (m - 1) e + (e or 2 e) bounds Sailor's
    (the bounds' targets are taken back by as much: `time_lower_bound_tight_s`)."""
    if not inp.sailor or inp.P == 1:
        return 0.0
    half = max(min(inp.p2p_s(link) for link in (inp.node, inp.zone, inp.region)) / 2,
               min(inp.send_floor_s, default=0.0))  # every send is at least both
    return (inp.m - 1) * half + (2 if inp.P > 3 else 1) * half


def _fastest_work_s(inp: JointInputs) -> float:
    """F: one microbatch through every unit, each on its fastest pool."""
    return _shared_for(inp, "fastest_work", lambda inp: sum(min(inp.step_s[k][l] for k in range(inp.K))
                                                            for l in range(inp.U)))


def _theta_work_bound_s(inp: JointInputs) -> float:
    """theta >= max(F / P, D W / N) (see `time_lower_bound_s`)."""
    gpu_work = _shared_for(inp, "gpu_work", lambda inp: sum(
        min(inp.step_s[k][l] * inp.pools[k].tp for k in range(inp.K)) for l in range(inp.U)))
    gpus = sum(_gpus_per_type(inp).values())
    if inp.max_gpus is not None:
        gpus = min(gpus, inp.max_gpus)
    return max(_fastest_work_s(inp) / inp.P, inp.D * gpu_work / gpus)


def _position_extras(inp: JointInputs, k: int, i: int) -> tuple[float, float]:
    """(seconds, bytes) stage position i adds on pool k besides its generic blocks: the embedding
    (and unit 1's difference from a generic block, only where it is lighter) on stage 0, the head
    on the last stage."""
    t = mem = 0.0
    nf = inp.in_flight(i)
    unit = lambda l: (inp.step_s[k][l], inp.stat_bytes[k][l] + nf * inp.act_bytes[k][l])  # noqa: E731
    if i == 0:
        t0, m0 = unit(0)
        t1, m1 = unit(1)
        tg, mg = unit(2)
        t, mem = t0 + min(0.0, t1 - tg), m0 + min(0.0, m1 - mg)
    if i == inp.P - 1:
        th, mh = unit(inp.U - 1)
        t, mem = t + th, mem + mh
    return t, mem


def blocks_coverable(inp: JointInputs, theta_s: float) -> float:
    """An upper bound on the transformer blocks P stages of D replicas can hold when no stage may
    take longer than theta_s per microbatch (relaxation: zones merged, quotas per GPU type).

    At stage position i a replica of class c holds at most cap[c,i] blocks: what fits in theta_s
    and in memory with min(P - i, m) microbatches in flight, after the embedding (i = 0) or head
    (i = P - 1). A stage holds no more than its worst replica. For a level v, the positions whose
    stage can hold >= v blocks need D replicas each of classes with cap >= v there, and at most
    N(v) positions can have that at once (`_hall_counts`). Total blocks <= sum_v (v - v_next) N(v)
    (layer-cake sum over the capacity levels)."""
    check_deadline()
    tab = _coverable_tables(inp)
    by_time = np.floor((theta_s - tab.extra_s) / tab.block_s[:, None] + 1e-9)
    caps = np.maximum(-1, np.minimum(np.minimum(by_time, tab.by_mem), inp.U - 2)).astype(np.int64)  # (K, P)
    work = _work_bound(inp, caps, tab.gpus)
    levels = np.unique(caps[caps > 0])[::-1]
    if levels.size == 0:
        return 0.0
    stages = _hall_counts(inp, tab, caps, levels)
    if stages[-1] < inp.P - 1:
        return 0.0  # every stage but the last needs a block: too few replicas that hold one
    widths = levels - np.append(levels[1:], 0)
    return min(float((widths * stages).sum()), work)


def _hall_counts(inp: JointInputs, tab: "_CoverableTables", caps: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """N(v) for each level: an upper bound on how many stage positions can each get D replicas of
    classes holding >= v blocks there, at once. A set S of positions can only be served if some
    x[j, g] >= 0 (replicas of type g at position j, each taking tp[g, j] GPUs, the type's
    smallest eligible TP there) has sum_g x[j, g] = D and sum_j tp[g, j] x[j, g] <= GPUs of g.
    For any prices lam_g >= 0 that implies D sum_{j in S} w_j <= sum_g lam_g GPUs_g with
    w_j = min_g lam_g tp[g, j] (Farkas), so |S| is at most the number of the cheapest w_j that fit
    the budget; N(v) is the least such count over a set of prices (`_hall_prices`: the ratios of
    the TP degrees, where the dual's vertices lie). With one GPU type this is exact: the positions
    needing the fewest GPUs per replica. It needs no order among the positions (the ends, with
    the embedding and the head, need not be more or less generous than the middle ones)."""
    D = inp.D
    types = list(tab.pools_of_type)
    eligible = caps[None, :, :] >= levels[:, None, None]  # (V, K, P)
    tp = np.stack([np.where(eligible[:, ks, :], tab.tp[ks][None, :, None].astype(float), np.inf).min(axis=1)
                   for ks in tab.pools_of_type.values()])  # (T, V, P): smallest eligible TP, inf if none
    lams = _hall_prices(inp)  # (L, T + 1): a price per type, then one on every GPU (max_gpus)
    held = np.array([tab.gpus[g] for g in types] + [inp.max_gpus or 0], dtype=float)
    budget = lams @ held  # (L,)
    per_gpu = lams[:, :-1] + lams[:, -1:]  # (L, T)
    finite = np.isfinite(tp)
    w = np.where(finite[None], per_gpu[:, :, None, None] * np.where(finite, tp, 0.0)[None], np.inf).min(axis=1)
    cum = np.cumsum(np.sort(w, axis=2), axis=2)  # (L, V, P)
    fit = D * cum <= budget[:, None, None] * (1 + 1e-12)
    return fit.sum(axis=2).min(axis=0)


def _hall_prices(inp: JointInputs) -> np.ndarray:
    """Prices for `_hall_counts`: per type 0 or a ratio of two TP degrees (the first nonzero one
    1), and a price on every GPU alone when max_gpus caps them (any prices give a valid count)."""
    return _shared_for(inp, f"hall_prices:{inp.max_gpus}", _make_hall_prices)  # the pools and max_gpus


def _make_hall_prices(inp: JointInputs) -> np.ndarray:
    T = len({p.gpu_type for p in inp.pools})
    tps = sorted({p.tp for p in inp.pools})
    ratios = sorted({a / b for a in tps for b in tps})
    rows = []
    for head in range(T):  # lam = (0, .., 0, 1, free ...)
        tails = np.array(np.meshgrid(*[[0.0] + ratios] * (T - head - 1), indexing="ij")).reshape(T - head - 1, -1).T \
            if T - head - 1 else np.zeros((1, 0))
        for tail in tails:
            rows.append([0.0] * head + [1.0] + list(tail) + [0.0])
    if inp.max_gpus is not None:
        rows.append([0.0] * T + [1.0])
    return np.array(rows)


@dataclass(frozen=True)
class _CoverableTables:
    block_s: np.ndarray  # (K,) seconds of one generic block
    extra_s: np.ndarray  # (K, P) seconds a position adds (`_position_extras`)
    by_mem: np.ndarray  # (K, P) blocks that fit in memory at each position
    tp: np.ndarray  # (K,)
    gpus: dict  # GPU type -> GPUs (zones merged)
    pools_of_type: dict  # GPU type -> pool indices


def _coverable_tables(inp: JointInputs) -> _CoverableTables:
    """The theta-independent parts of `blocks_coverable`, computed once per inputs (a bound search
    calls it ~10 times on the same inputs)."""
    return _cached_for(inp, "coverable", _make_coverable_tables)


def _gpus_per_type(inp: JointInputs) -> dict[str, int]:
    """GPU type -> GPUs available over all its zones (pools of one quota share its GPUs)."""
    return _shared_for(inp, "gpus", _make_gpus_per_type)


def _make_gpus_per_type(inp: JointInputs) -> dict[str, int]:
    gpus: dict[str, int] = {}
    for per_type in _gpus_per_group(inp, "zone").values():
        for g, n in per_type.items():
            gpus[g] = gpus.get(g, 0) + n
    return gpus


def _make_coverable_tables(inp: JointInputs) -> _CoverableTables:
    gpus = _gpus_per_type(inp)
    extra = np.zeros((inp.K, inp.P))
    by_mem = np.zeros((inp.K, inp.P))
    for k in range(inp.K):
        for i in range(inp.P):
            et, em = _position_extras(inp, k, i)
            per_blk = inp.stat_bytes[k][2] + inp.in_flight(i) * inp.act_bytes[k][2]
            extra[k, i] = et
            by_mem[k, i] = math.floor((inp.cap_bytes[k] - em) / per_blk) if per_blk > 0 else inp.U
    block = np.array([inp.step_s[k][2] for k in range(inp.K)])
    block = np.where(block > 0, block, np.inf)  # a free block: time never limits (caps cut at U - 2)
    types = sorted({p.gpu_type for p in inp.pools})
    return _CoverableTables(block, extra, by_mem, np.array([p.tp for p in inp.pools], dtype=np.int64), gpus,
                            {g: np.array([k for k, p in enumerate(inp.pools) if p.gpu_type == g]) for g in types})


def _work_bound(inp: JointInputs, caps: np.ndarray, gpus: dict[str, int]) -> float:
    """A stage holds no more blocks than the mean capacity of its D replicas, so all stages hold at
    most (1 / D) sum over replicas of their capacity; a GPU type gives the most in total at the TP
    degree with the most capacity per GPU (at any position: an overestimate). caps: (K, P) blocks."""
    best: dict[str, float] = {}
    top = np.maximum(caps.max(axis=1), 0)
    for k, p in enumerate(inp.pools):
        best[p.gpu_type] = max(best.get(p.gpu_type, 0.0), (gpus[p.gpu_type] // p.tp) * int(top[k]))
    return sum(best.values()) / inp.D


def _replicas(gpus: dict[str, int], min_tp: dict[str, int], max_gpus: int | None) -> int:
    budget = max_gpus if max_gpus is not None else math.inf
    count = 0
    for t, g in sorted((t, g) for g, t in min_tp.items()):  # smallest TP first: most replicas under a cap
        take = int(min(gpus[g] // t, budget // t))
        count, budget = count + take, budget - take * t
    return count


def bottleneck_lower_bound_s(inp: JointInputs, exact: bool = False, theta_hint_s: float | None = None) -> float:
    key = (exact, theta_hint_s)
    cache = _per_inputs_cache(inp, "bottleneck")
    if key not in cache:
        cache[key] = _bottleneck_lower_bound_s(inp, exact, theta_hint_s)
    return cache[key]


def _per_inputs_cache(inp: JointInputs, name: str) -> dict:
    """A dict kept on these very inputs: a search asks for the same bounds and tables of one outer
    choice several times (it lives as long as the inputs do; hashing them would cost more)."""
    return inp._cache.setdefault(name, {})


def _cached_for(inp: JointInputs, name: str, make):
    """make(inp), computed once per inputs object (`_per_inputs_cache`)."""
    cache = _per_inputs_cache(inp, name)
    if name not in cache:
        cache[name] = make(inp)
    return cache[name]


# per-inputs caches that are small to send to another process and slow to recompute (the class
# tables are large and quick to rebuild; the region sub-inputs carry caches of their own)
_PORTABLE_CACHES = ("hall_theta", "bottleneck", "coverable", "extra_lb", "sum_tau", "sum_tau_prices",
                    "capped_sum_tau")


def cache_export(inp: JointInputs) -> dict:
    """The portable part of the bounds computed for these inputs (`cache_import` takes it into
    another copy of the same inputs, e.g. in another process)."""
    return {name: dict(inp._cache[name]) for name in _PORTABLE_CACHES if name in inp._cache}


def cache_import(inp: JointInputs, caches: dict) -> None:
    """Add `cache_export` of a copy of these very inputs to their caches (every entry is a function
    of the inputs alone, so both copies hold the same values for the same keys)."""
    for name, entries in caches.items():
        inp._cache.setdefault(name, {}).update(entries)


def _shared_for(inp: JointInputs, name: str, make):
    """make(inp) for a figure of the rows alone (`JointInputs.shared`), computed once for every
    outer choice that shares them (the depths P of one (b, D) in the planner)."""
    cache = _shared_cache(inp)
    if name not in cache:
        cache[name] = make(inp)
    return cache[name]


def _shared_cache(inp: JointInputs) -> dict:
    """`inp.shared` when it belongs to these very rows (the first inputs to use it record them),
    else a cache of these inputs alone: a copy made with dataclasses.replace keeps the dict, and
    with other rows it must not read what the original computed."""
    mine = inp._cache.get("shared")  # decided once per inputs (they are immutable)
    if mine is None:
        rows = (inp.pools, inp.step_s, inp.upd_s, inp.stat_bytes, inp.act_bytes, inp.cap_bytes, inp.grad_bytes)
        owner = inp.shared.setdefault("rows", rows)  # held here, so no other object can take their ids
        mine = inp._cache["shared"] = inp.shared if all(a is b for a, b in zip(owner, rows)) else {}
    return mine


def _bottleneck_lower_bound_s(inp: JointInputs, exact: bool, theta_hint_s: float | None) -> float:
    """The least theta (slowest stage time per microbatch) for which `blocks_coverable` reaches
    the L = U - 2 blocks; +inf when no theta does (too few replicas or memory). With `exact`, from
    there the least stage time that `stages_fit_dp` accepts. `theta_hint_s` (the theta a caller
    needs to rule out, e.g. from an incumbent) saves DP calls: when the DP rejects every time below
    the hint, the first time at or above it is returned (a valid bound, maybe not the least)."""
    hall = _cached_for(inp, "hall_theta", _hall_theta_s)  # the medium and the strong bound share it
    if math.isinf(hall) or not exact or not blocks_identical(inp):
        return hall
    # the DP's answer changes only at actual stage times, so search those at or above Hall's answer
    times = np.unique(_class_tables(inp).time_s)
    times = times[times >= hall].tolist()
    fits = lambda c: stages_fit_dp(inp, c)  # noqa: E731
    if not times:
        return math.inf
    hi = len(times) - 1
    if theta_hint_s is not None:
        below = [j for j, t in enumerate(times) if t < theta_hint_s]
        if not below:
            return times[0]
        if not fits(times[below[-1]]):  # nothing below the hint fits: that is all the caller needs
            return times[below[-1] + 1] if below[-1] + 1 < len(times) else math.inf
        hi = below[-1]
    elif not fits(times[hi]):
        return math.inf
    return times[_first_true_from(fits, times, 0, hi)]  # the answer is usually a few times up


def _hall_theta_s(inp: JointInputs) -> float:
    """max(the least candidate stage time at which `blocks_coverable` reaches the L blocks, the work
    bound D W / N of `_theta_work_bound_s`), inf if no time reaches them. Both bound the slowest
    stage time of every plan; taking the larger one lets the search start at the work bound: the
    Hall count is only needed above it (usually a probe or two, where bisecting over every
    candidate took about eight)."""
    L = inp.U - 2
    pairs = sorted({(k, _position_extras(inp, k, i)[0]) for k in range(inp.K) for i in {0, inp.P - 1}} | {
        (k, 0.0) for k in range(inp.K)})
    # every stage time a class can have: n blocks plus what its position adds
    block = np.array([inp.step_s[k][2] for k, _ in pairs])
    extra = np.array([e for _, e in pairs])
    # n x block + extra rounds differently from the class tables' prefix sums of the same units (1 ulp
    # above them was seen): a candidate a hair lower keeps every stage time it stands for at or above it
    cands = np.unique(np.arange(L + 1)[None, :] * block[:, None] + extra[:, None]) * (1 - ULP_SLACK)
    cands = cands[cands != 0.0].tolist()
    if not cands or blocks_coverable(inp, cands[-1]) < L:
        return math.inf
    work = _theta_work_bound_s(inp)
    fits = lambda c: blocks_coverable(inp, c) >= L  # noqa: E731  monotone in c
    below = bisect.bisect_right(cands, work) - 1  # the last candidate <= the work bound
    if below >= 0 and fits(cands[below]):
        return work  # the Hall time is at most the work bound
    return cands[_first_true_from(fits, cands, below + 1)]  # the answer is usually close above


def _first_true_from(pred, cands, lo: int, hi: int | None = None) -> int:
    """The first index in [lo, hi] where the monotone `pred` holds (hi, default the last, must
    hold): exponential steps up from lo, then bisection. For searches whose answer is usually a
    few candidates above where they start, and whose every probe is costly."""
    hi = len(cands) - 1 if hi is None else hi
    failed, probe, step = lo - 1, lo, 1
    while not pred(cands[probe]):
        check_deadline()  # every probe is costly (a DP or a Hall count)
        failed, probe, step = probe, min(probe + step, hi), step * 2
    return _first_true(pred, cands, failed + 1, probe)


def _first_true(pred, cands: list[float], lo: int, hi: int | None = None, steps: int | None = None) -> int:
    """The first index in [lo, hi] where the monotone `pred` holds (hi, default the last, must hold).
    With `steps`, stop after that many bisection steps: the index returned is then a lower end
    (pred is false below it), which is all a lower bound needs."""
    hi = len(cands) - 1 if hi is None else hi
    for _ in range(len(cands) if steps is None else steps):
        if lo >= hi:
            break
        mid = (lo + hi) // 2
        check_deadline()
        if pred(cands[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def stages_fit_dp(inp: JointInputs, theta_s: float, extra_cap_s: float = math.inf) -> bool:
    """Exact test of a relaxation: can P stages of D replicas hold every block with no stage slower
    than theta_s per microbatch, with GPUs counted per type (zones merged, regions ignored)?

    A replica of type g on stage i holding n blocks needs w_g(i, n) GPUs: the smallest TP of g whose
    class runs the stage within theta_s and fits it in memory (`_class_figures`). With two types A
    and B, a dynamic program over stages keeps, for every (blocks placed s, A-GPUs used a), the
    fewest B-GPUs: best'[s + n, a + x w_A] = min(best[s, a] + (D - x) w_B), x = 0..D replicas of A.
    More types are merged pairwise into two resources (a merged type takes the smaller w and the
    sum of the GPUs), which only relaxes further; every merge is a valid test, so all are tried.
    Unlike the Hall count of `blocks_coverable`, this sees that GPUs a stage takes are gone for the
    others (measured: it rejects outer choices that the MILP needed 0.1-0.5 s each to reject).
    With `extra_cap_s`, a class may serve a stage only if its all-reduce + update there
    (`_ClassTables.extra_in_s`, `extra_span_s`) is within the cap (used by `sync_aware_time_bound_s`)."""
    gpus = _gpus_per_type(inp)
    types = sorted(gpus)
    need = _gpus_per_replica(inp, theta_s, types, extra_cap_s)
    if need is None:
        return False
    splits = [(types[:1], types[1:])] if len(types) <= 2 else [
        ([a], [t for t in types if t != a]) for a in types]
    return all(_two_resource_dp(inp, need, gpus, left, right) for left, right in splits)


def _gpus_per_replica(inp: JointInputs, theta_s: float, types: list[str],
                      extra_cap_s: float = math.inf) -> dict[str, np.ndarray] | None:
    """g -> (M,) fewest GPUs per replica of type g at every (stage i, n blocks) pair of
    `_pair_layout` within theta_s and with its all-reduce + update within extra_cap_s (inf when
    none); None when some stage has no feasible block count at all. Under a cap, a class may serve a
    stage by its in-zone value (`_ClassTables.extra_in_s`) only if some zone has GPUs for D replicas of such
    classes; otherwise the stage spans zones and its classes must meet the cap by their spanning
    value (`_ClassTables.extra_span_s`)."""
    tab, lay = _class_tables(inp), _pair_layout(inp)
    tp = np.array([c[1] for c in tab.classes], dtype=float)[:, None]
    rows = {g: [j for j, c in enumerate(tab.classes) if c[0] == g] for g in types}

    def least(mask: np.ndarray) -> dict[str, np.ndarray]:  # (C, M) allowed -> g -> least TP per pair
        return {g: np.where(mask[ix], tp[ix], np.inf).min(axis=0) if ix else np.full(len(lay.pairs), np.inf)
                for g, ix in rows.items()}

    ok = tab.fits & (tab.time_s <= theta_s)
    if extra_cap_s < math.inf:
        in_zone = ok & (tab.extra_in_s <= extra_cap_s)
        tp_in = least(in_zone)
        most = np.zeros(len(lay.pairs))  # the most replicas one zone holds, each type at its least TP
        for per in _gpus_per_group(inp, "zone").values():
            held = [np.where(np.isfinite(tp_in[g]), per[g] // np.where(np.isfinite(tp_in[g]), tp_in[g], 1), 0)
                    for g in per if g in tp_in]
            most = np.maximum(most, sum(held) if held else 0)
        ok = (in_zone & (most >= inp.D)[None, :]) | (ok & (tab.extra_span_s <= extra_cap_s))
    need = least(ok)
    some = np.zeros(len(lay.pairs), dtype=bool)
    for w in need.values():
        some |= np.isfinite(w)
    if not np.all(np.bincount(lay.stage[some], minlength=inp.P) > 0):
        return None
    return need


def _least_tp(classes) -> dict[str, int]:
    """GPU type -> the smallest TP among these (type, TP) classes."""
    out: dict[str, int] = {}
    for g, t in classes:
        out[g] = min(out.get(g, t), t)
    return out


def _two_resource_dp(inp: JointInputs, need: dict, gpus: dict, left: list[str], right: list[str]) -> bool:
    L, D = inp.U - 2, inp.D
    cap_a = sum(gpus[g] for g in left)
    cap_b = sum(gpus[g] for g in right)
    lay = _pair_layout(inp)
    none = np.full(len(lay.pairs), np.inf)
    w_a = np.min([need[g] for g in left], axis=0) if left else none
    w_b = np.min([need[g] for g in right], axis=0) if right else none
    if not np.isfinite(w_b).any():  # the left resource alone: the fewest GPUs decide
        cap = cap_a if inp.max_gpus is None else min(cap_a, inp.max_gpus)
        return _least_units_dp(inp, w_a) <= cap // D
    starts = np.searchsorted(lay.stage, np.arange(inp.P + 1))
    stages = []
    for i in range(inp.P):
        by_need: dict[tuple[float, float], list[tuple[int, float]]] = {}  # block counts with the same GPUs per replica
        at = slice(starts[i], starts[i + 1])
        for wa, wb, n in zip(w_a[at].tolist(), w_b[at].tolist(), lay.count[at].tolist()):
            by_need.setdefault((wa, wb), []).append((n, 0.0))
        stages.append(list(by_need.items()))
    last = _replica_dp(stages, L, cap_a + 1, D)  # last[a]: fewest right-GPUs with a left-GPUs
    ok = last <= cap_b
    if inp.max_gpus is not None:
        ok &= last + np.arange(cap_a + 1) <= inp.max_gpus
    return bool(ok.any())


def _replica_dp(stages: list[list[tuple[tuple[float, float], list[tuple[int, float]]]]], L: int, width: int,
                D: int) -> np.ndarray:
    """out[a] = the least value of placing all L blocks on the stages in order, a = the left-resource
    GPUs used (< width): stage i adds, for an entry ((w_a, w_b), [(n, add)...]) of stages[i] and one (n, add),
    n blocks and best[s + n, a + x w_a] = min(best[s, a] + (D - x) w_b + add) over x = 0..D
    (`_stage_contrib`). Rows are kept to the band of block counts that the stages before can reach
    and the stages after can complete to L, and columns to those the stages before can reach:
    outside them every value is inf or cannot reach row L, so the result is the full DP's."""
    stages = [[(key, per_n) for key, per_n in ch if not (math.isinf(key[0]) and math.isinf(key[1]))]
              for ch in stages]  # an entry neither resource serves adds nothing
    spans = [(min(n for _, per_n in ch for n, _ in per_n), max(n for _, per_n in ch for n, _ in per_n))
             if ch else None for ch in stages]
    if any(s is None for s in spans):
        return np.full(width, np.inf)
    lo_after = np.cumsum([0] + [s[0] for s in spans[::-1]])[::-1]  # lo_after[i]: blocks stages i.. hold at least
    hi_after = np.cumsum([0] + [s[1] for s in spans[::-1]])[::-1]
    best = np.full((L + 1, width), np.inf)
    best[0, 0] = 0.0
    r0 = r1 = 0  # the rows of `best` in the band
    cols = 1  # columns of `best` that may be finite
    for i, choices in enumerate(stages):
        check_deadline()  # a stage's step: up to ~10 ms on 10,000 GPUs
        q0 = max(r0 + spans[i][0], L - int(hi_after[i + 1]))
        q1 = min(r1 + spans[i][1], L - int(lo_after[i + 1]))
        new = np.full_like(best, np.inf)
        if q0 > q1:
            return new[L]
        reach = cols
        for (wa, wb), per_n in choices:
            w = cols if math.isinf(wa) else min(width, cols + D * int(wa))
            contrib = _stage_contrib(best[r0:r1 + 1, :w], wa, wb, D)  # the same for every n: only the rows shift
            if contrib is None:
                continue
            reach = max(reach, w)
            for n, add in per_n:
                lo, hi = max(q0, r0 + n), min(q1, r0 + n + len(contrib) - 1)
                if lo > hi:
                    continue
                part = contrib[lo - r0 - n:hi - r0 - n + 1]
                target = new[lo:hi + 1, :w]
                np.minimum(target, part + add if add else part, out=target)
        best, r0, r1, cols = new, q0, q1, reach
    return best[L]


def _least_units_dp(inp: JointInputs, w: np.ndarray) -> float:
    """The fewest units of D GPUs P stages need to hold the L blocks when stage i with n blocks
    takes w[pair (i, n)] units (inf: not allowed): a min-plus dynamic program over stages on the
    blocks placed (one resource, so no GPU axis is needed)."""
    L, P = inp.U - 2, inp.P
    lay = _pair_layout(inp)
    N = L + 1
    per_stage = np.full((P, N), np.inf)
    per_stage[lay.stage, lay.count] = w
    prev = _minplus_padded_index(N)
    best = np.full(N + 1, np.inf)  # best[s]: fewest units with s blocks placed; best[N] stays inf
    best[0] = 0.0
    for i in range(P):
        best[:N] = (best[prev] + per_stage[i][None, :]).min(axis=1)
    return float(best[L])


def _stage_contrib(best: np.ndarray, wa: float, wb: float, D: int) -> np.ndarray | None:
    """out[s, a'] = min over x = 0..D of best[s, a' - x wa] + (D - x) wb: one stage with x replicas
    on the left resource (wa GPUs each) and D - x on the right (wb each); the caller shifts s by the
    stage's block count. With j = (a' - r) / wa on each residue class r mod wa, the inner min is
    D wb - J wb + min_{J - D <= j <= J} (best_j + j wb): a running minimum along j, one array
    operation instead of D + 1. None when neither resource can serve the stage."""
    rows, width = best.shape
    if math.isinf(wa) and math.isinf(wb):
        return None
    if math.isinf(wa):  # all D replicas on the right
        return best + D * wb
    if math.isinf(wb):  # all D on the left: shift by D wa
        out = np.full_like(best, np.inf)
        shift = int(D * wa)
        if shift < width:
            out[:, shift:] = best[:, :width - shift]
        return out
    wa = int(wa)
    J = -(-width // wa)
    padded = np.full((rows, J * wa), np.inf)
    padded[:, :width] = best
    j = np.arange(J)[None, :, None]
    shaped = padded.reshape(rows, J, wa) + j * wb
    if D >= J - 1:  # the window [J - D, J] is the whole prefix
        low = np.minimum.accumulate(shaped, axis=1)
    else:
        low = _window_min(shaped, D + 1)
    return (D * wb - j * wb + low).reshape(rows, J * wa)[:, :width]


def _window_min(a: np.ndarray, width: int) -> np.ndarray:
    """out[:, j] = min(a[:, max(0, j - width + 1) : j + 1]) along axis 1, in O(log width) array
    operations: windows of 2^k by doubling, then two overlapping ones cover any width."""
    out = a.copy()
    span = 1
    while 2 * span <= width:
        np.minimum(out[:, span:], out[:, :-span].copy(), out=out[:, span:])
        span *= 2
    rest = width - span  # out covers windows of `span`; shift by the rest to cover `width`
    if rest > 0:
        res = out.copy()
        np.minimum(res[:, rest:], out[:, :-rest], out=res[:, rest:])
        return res
    return out


def time_lower_bound_tight_s(inp: JointInputs, exact: bool = False, target_s: float | None = None,
                             strongest: bool = False) -> float:
    """T >= sum_i tau_i + sum_i c_i + (m - 1) theta + sigma + mu, each term bounded alone: sum tau >=
    F (every unit on its fastest pool), c_i >= c_node, theta >= the larger of
    `bottleneck_lower_bound_s` (with `exact`: its dynamic-programming refinement), F / P and D W / N
    (`time_lower_bound_s`) and the link time / 2, sigma and mu as in `_rest_lower_bound_s`.
    With `exact` (blocks form), also `sync_aware_time_bound_s`, which bounds theta and sigma + mu
    together. `target_s` (a T the caller wants to rule out) lets the exact search stop early: the
    result is then a valid bound that is >= target_s whenever the DP can prove it.
    With several regions, `exact` also splits the plans by the regions they use
    (`region_split_time_bound_s`). `strongest` (with `exact` and a target) adds the replica-level
    DPs on the sum of stage times (`capped_sum_tau_s`) where a cell falls short of the target.
    With Sailor's composition plus `sailor_transfer_floor_s`."""
    strongest = strongest and target_s is not None  # without a target it would lift every cell
    shift = sailor_transfer_floor_s(inp)  # the bounds below are the hetplan composition's
    if target_s is not None:
        target_s -= shift
    out = _time_lower_bound_merged_s(inp, exact, target_s, strongest)
    if exact and len(inp.regions) > 1 and out < math.inf and (target_s is None or out < target_s):
        out = max(out, region_split_time_bound_s(inp, out, target_s, strongest))
    return out + shift


def region_split_time_bound_s(inp: JointInputs, merged_s: float, target_s: float | None = None,
                              strongest: bool = False) -> float:
    """The bounds above merge every region, but a stage's replicas sit in one region (H5) and a
    boundary between regions costs c_region. A plan either
      - lies in one region r: T >= the bound of the inputs cut down to r's pools (`in_region`);
      - uses several regions with the first and last stage in one region: then it crosses a region
        boundary at least twice, T >= merged_s + 2 (c_region - c_node), and its slowest stage
        or boundary is at least c_region / 2 (theta >= c[i] / 2), T >= sum tau + (m - 1) theta +
        rest + 2 (c_region - c_node) with that theta;
      - or puts its ends in different regions: one crossing, and the tied-embedding all-reduce
        crosses regions too, T >= sum tau + (P - 1) c_node + (c_region - c_node) + (m - 1) theta
        + tied(region) + mu, each term bounded alone.
    The least of these is a bound (measured: OPT-350M on 5 zones in 2 regions, P5 b1 D64, the
    merged bound is 1.50 s, the optimum 1.654 s: the small region can hold one stage only at the
    cost of two crossings)."""
    c_node, c_region = inp.p2p_s(inp.node), inp.p2p_s(inp.region)
    hop = c_region - c_node
    theta = max(_theta_work_bound_s(inp), bottleneck_lower_bound_s(inp, True), c_region / 2)
    sum_tau = sum_tau_lower_bound_s(inp)
    ends_apart = sum_tau + (inp.P - 1) * c_node + hop + (inp.m - 1) * theta + inp.tied_s[2] + _mu_lower_bound_s(inp)
    # two crossings: their boundaries take c_region, so theta >= c_region / 2 there too (measured:
    # OPT-350M, 5 zones x 80 A100, P13 b2 D16, m = 64: 1.52 s -> 2.57 s, above the 1.98 s of the
    # plans inside one region; the MILPs of P13-P16 D16 each stopped at their 5 s limit)
    two_hops = max(merged_s, sum_tau + (inp.m - 1) * theta + _rest_lower_bound_s(inp)) + 2 * hop
    out = min(two_hops, ends_apart)
    for sub in _region_inputs(inp).values():
        if target_s is not None and out < target_s:
            target_s = out  # beyond the least so far, a region's bound changes nothing
        out = min(out, _time_lower_bound_merged_s(sub, True, target_s, strongest))
    return out


def _region_inputs(inp: JointInputs) -> dict[str, "JointInputs"]:
    """region -> these inputs with only the pools of that region (cached: their own bound caches
    live as long as these inputs)."""
    return _cached_for(inp, "regions", lambda inp: {r: in_region(inp, r) for r in inp.regions})


def in_region(inp: JointInputs, region: str) -> JointInputs:
    """The same outer choice with only `region`'s pools (the all-reduce table re-indexed)."""
    keep = [k for k, p in enumerate(inp.pools) if p.region == region]
    new_index = {k: j for j, k in enumerate(keep)}
    pick = lambda rows: tuple(rows[k] for k in keep)  # noqa: E731
    def table(tab: dict | None) -> dict | None:
        return None if tab is None else {(new_index[k], pos, n): v for (k, pos, n), v in tab.items() if k in new_index}
    return replace(inp, pools=pick(inp.pools), step_s=pick(inp.step_s), upd_s=pick(inp.upd_s),
                   upd_fixed_s=pick(inp.upd_fixed_s) if inp.upd_fixed_s else (),
                   send_floor_s=pick(inp.send_floor_s) if inp.send_floor_s else (),
                   send_away_s=pick(inp.send_away_s) if inp.send_away_s else (),
                   stat_bytes=pick(inp.stat_bytes), act_bytes=pick(inp.act_bytes), cap_bytes=pick(inp.cap_bytes),
                   sync_table=table(inp.sync_table), span_sync_table=table(inp.span_sync_table))


def _time_lower_bound_merged_s(inp: JointInputs, exact: bool, target_s: float | None,
                               strongest: bool = False) -> float:
    if not inp.pools:
        return math.inf
    if inp.U < 4:
        return _work_bound_s(inp)
    # the bottleneck first, with F for the sum of stage times: with a target it alone rules out
    # most choices (measured: 60 of the 67 that reached the strong bound on GPT-Neo, 32 A100 + 96
    # V100), and the Lagrangian sum-tau bound costs five times as much; a hint from the smaller F
    # base is larger, so the theta found is at least the one a hint from the full base gives
    base = _fastest_work_s(inp) + _rest_lower_bound_s(inp)
    hint = None if target_s is None or inp.m <= 1 else (target_s - base) / (inp.m - 1)
    theta = max(_theta_work_bound_s(inp), bottleneck_lower_bound_s(inp, exact, hint), _c_node_s(inp) / 2)
    if math.isinf(theta):
        return math.inf
    out = base + (inp.m - 1) * theta
    if not exact or (target_s is not None and out >= target_s):
        return out
    base = sum_tau_lower_bound_s(inp) + _rest_lower_bound_s(inp)
    out = base + (inp.m - 1) * theta
    if exact and blocks_identical(inp) and (target_s is None or out < target_s):
        out = max(out, sync_aware_time_bound_s(inp, theta, target_s, strongest=strongest))
    return out


def sync_aware_time_bound_s(inp: JointInputs, theta_lo_s: float, target_s: float | None = None,
                            grid: int = 8, strongest: bool = False) -> float:
    """T >= sum tau + (P - 1) c_node + (m - 1) theta + s (sum tau >= `sum_tau_lower_bound_s`), where s = the largest extra value (`_ClassTables`) of
    the plan's (stage, class) pairs (<= sigma + mu) and theta its slowest stage: the DP
    (`stages_fit_dp`) must fit the blocks with both caps. This sees what the separate terms of
    `time_lower_bound_tight_s` miss: a cheap all-reduce needs a high TP, and D replicas at a high
    TP may not exist (measured, GPT-Neo on 3 x 256 GPUs, P3 b1 D256: sigma + mu >= 0.073 s alone,
    0.30 s here; the optimum has 0.44 s).

    theta*(s), the least feasible theta with cap s, does not grow with s. The s axis is cut at a
    few grid values s_0 < ... < s_q (s_0 = `extra_lower_bound_s`); a plan whose largest
    extra lies in [s_j, s_j+1) fits with cap s'_j (the largest extra value below s_j+1), so
    T >= base + (m - 1) theta*(s'_j) + s_j, and the bound is the least over the cells (the last
    cell has no cap: theta*(inf) >= theta_lo_s, the caller's bottleneck bound). With `target_s`,
    a cell is only tested at the theta that would beat the target (one DP call), and the grid
    ends where s alone reaches it; a feasible cell's theta*(s'_j) is bisected a few steps only
    (its lower end is a valid bound). A cell's theta is also at least the fastest (stage, class)
    pair whose extra reaches s_j, and base is lifted by the least sum tau under the cell's caps
    (`_lifted_cell_s`; only for cells within 10 % below the target when there is one)."""
    tab = _class_tables(inp)
    sum_tau = sum_tau_lower_bound_s(inp)
    links = (inp.P - 1) * _c_node_s(inp)
    base = sum_tau + links
    caps = np.unique(np.concatenate([tab.extra_in_s.ravel(), tab.extra_span_s.ravel()]))
    caps = caps[np.isfinite(caps)].tolist()  # inf: a placement that does not exist
    thetas = np.unique(tab.time_s)
    thetas = thetas[thetas >= theta_lo_s].tolist()
    s_first = extra_lower_bound_s(inp)
    if not thetas or not caps or s_first > caps[-1]:
        return math.inf
    w = max(inp.m - 1, 0)

    arr = _class_arrays(inp)

    def cell(j: int, s_lo: float, cap: float) -> float:
        """T over the plans with theta >= thetas[j] and largest extra in [s_lo, cap]: such a plan
        has a (stage, class) pair with extra >= s_lo, and its slowest stage is no faster."""
        slowest = arr.time_s[arr.extra_hi_s >= s_lo]
        j = max(j, _first_true(lambda t: t >= float(slowest.min()), thetas + [math.inf], 0)) if slowest.size \
            else len(thetas)
        out = base + w * (thetas[j] if j < len(thetas) else math.inf) + s_lo
        if target_s is not None and not 0.9 * target_s <= out < target_s:
            return out  # reached, or too far below for the DPs to lift it there (a min-cost floor)
        goal = None if target_s is None else target_s - links - s_lo
        return max(out, _lifted_cell_s(inp, thetas, j, cap, sum_tau, w, goal, 8 if target_s is not None else 3,
                                       strongest) + links + s_lo)

    no_cap = cell(0, 0.0, math.inf)  # + s for s >= the last grid value
    s_end = caps[-1] if target_s is None else min(caps[-1], target_s - no_cap)
    if w == 0 or s_first >= s_end:
        return no_cap + s_first
    j0 = _first_true(lambda c: c >= s_first, caps, 0)
    # grid values: extras between s_first and s_end, evenly spread in value
    marks = [s_first + (s_end - s_first) * q / grid for q in range(grid + 1)]
    cells = sorted({caps[_first_true(lambda c: c >= v, caps, j0)] for v in marks})
    cells[0] = min(cells[0], s_first)  # the first cell starts at the bound itself
    best = cell(0, cells[-1], math.inf)
    hi = len(thetas) - 1
    for s_lo, s_next in zip(cells, cells[1:]):
        cap = caps[_first_true(lambda c: c >= s_next, caps, j0) - 1]  # largest extra < s_next
        fits = lambda t, cap=cap: stages_fit_dp(inp, t, cap)  # noqa: E731
        if target_s is not None:
            need = (target_s - base - s_lo) / w  # theta must be below this to beat the target
            below = _first_true(lambda t: t >= need, thetas + [math.inf], 0) - 1
            if below < 0 or not fits(thetas[below]):
                best = min(best, cell(below + 1, s_lo, cap))
                continue
            hi = min(hi, below)
        elif not fits(thetas[hi]):
            continue  # this cell holds no plan at all (theta*(cap) is beyond every stage time)
        lo = _first_true(fits, thetas, 0, hi, steps=3 if target_s is None else 1)
        best = min(best, cell(lo, s_lo, cap))
    return best


def _lifted_cell_s(inp: JointInputs, thetas: list[float], j: int, cap: float, sum_tau: float, w: int,
                   goal: float | None = None, depth: int = 6, strong: bool = False) -> float:
    """min over the plans with theta >= thetas[j] and every extra <= cap of sum tau + w theta.
    A plan's slowest stage takes one of `thetas`; if that is among thetas[lo:hi], its sum tau is
    >= `capped_sum_tau_s`(thetas[hi - 1], cap) and its theta >= thetas[lo]. The range is halved
    (at most `depth` times) until each part's bound reaches `goal` (the value the caller needs).
    `strong`: a part the plain DP leaves below the goal also gets the replica-level DPs."""
    def bound(lo: int, hi: int, d: int) -> float:
        out = max(sum_tau, capped_sum_tau_s(inp, thetas[hi - 1], cap)) + w * thetas[lo]
        if strong and (goal is None or out < goal):
            out = max(out, capped_sum_tau_s(inp, thetas[hi - 1], cap, True) + w * thetas[lo])
        if d == 0 or hi - lo == 1 or (goal is not None and out >= goal):
            return out
        mid = (lo + hi) // 2
        left = bound(lo, mid, d - 1)
        # short of the goal on the left: the node is too, so the right half gets no halving
        right = bound(mid, hi, 0 if goal is not None and left < goal else d - 1)
        return max(out, min(left, right))

    return bound(j, len(thetas), depth) if j < len(thetas) else math.inf


def extra_lower_bound_s(inp: JointInputs) -> float:
    """A lower bound on sigma + mu that sees the GPU quotas (blocks form), without a DP. Stage i
    with n blocks needs D replicas of classes whose extra value is at most s: s_need(i, n) is the
    least s for which the GPUs allow that (each type at its smallest such TP), either in one zone
    with the in-zone values (`_ClassTables.extra_in_s`) or over all zones with the spanning values
    (`_ClassTables.extra_span_s`). Every stage holds some count and some stage holds >= ceil(L / P)
    blocks, so sigma + mu >= max(max_i min_n s_need(i, n), min_{i, n >= ceil(L/P)} s_need(i, n))."""
    return _cached_for(inp, "extra_lb", _make_extra_lower_bound)


def _make_extra_lower_bound(inp: JointInputs) -> float:
    tab, lay = _class_tables(inp), _pair_layout(inp)
    gpus = _gpus_per_type(inp)
    zones = _gpus_per_group(inp, "zone")
    n_big = -(-(inp.U - 2) // inp.P)
    pair_at = {pair: j for j, pair in enumerate(lay.pairs)}

    def least_s(extra: np.ndarray, j: int, enough) -> float:
        """The least extra value at which the classes fitting pair j allow D replicas."""
        min_tp: dict[str, int] = {}
        col = extra[:, j]
        for ci in np.argsort(col, kind="stable").tolist():  # ties in class order, as sorted (value, class)
            if not tab.fits[ci, j]:
                continue
            g, t = tab.classes[ci]
            min_tp[g] = min(min_tp.get(g, t), t)
            if enough(min_tp):
                return float(col[ci])
        return math.inf

    def s_need(i: int, n: int) -> float:
        j = pair_at[i, n]
        return min(least_s(tab.extra_in_s, j, lambda tp: _most_replicas(zones, tp) >= inp.D),
                   least_s(tab.extra_span_s, j, lambda tp: _replicas(gpus, tp, inp.max_gpus) >= inp.D))

    # s_need grows with n (a class's extra grows, fewer classes fit): only the least count matters
    counts = [block_counts(inp, i) for i in range(inp.P)]
    every = max(s_need(i, c.start) for i, c in enumerate(counts))
    big = min((s_need(i, max(n_big, c.start)) for i, c in enumerate(counts) if max(n_big, c.start) in c),
              default=math.inf)
    return max(every, big)


def sum_tau_lower_bound_s(inp: JointInputs) -> float:
    """A lower bound on sum_i tau_i that sees the GPU quotas (blocks form; F otherwise), by
    Lagrangian relaxation: with a price lam_g >= 0 per GPU of type g (and lam_0 on every GPU under
    max_gpus), sum tau >= min over plans of sum_i [tau_i + sum of the prices of stage i's GPUs]
    - sum_g lam_g gpus_g - lam_0 max_gpus, and the min splits by stage: stage i with n blocks and
    straggler class r costs time[r,i,n] + D x (the cheapest replica among classes no slower than r
    that fit), then a min-plus DP over stages places the L blocks. Any prices give a valid bound;
    a few rounds of coordinate search over a grid of prices pick good ones. F (every unit on its
    fastest pool) misses that the fastest class cannot serve every stage: on GPT-Neo, 3 x 256
    GPUs, P3 b1 D256, F = 0.070 s where the optimum's sum tau is 0.286 s."""
    return _cached_for(inp, "sum_tau", lambda inp: max(_fastest_work_s(inp), _sum_tau_prices(inp)[0])
                       if blocks_identical(inp) else _fastest_work_s(inp))


@dataclass(frozen=True)
class _ClassArrays:
    """Per (stage, block count, class) figures as arrays, for the sum-of-stage-times DPs."""
    time_s: np.ndarray  # (P, N, C) stage seconds, inf where the class does not fit or n is not allowed
    extra_s: np.ndarray  # (P, N, C) the least of `_ClassTables.extra_in_s` and `_ClassTables.extra_span_s`
    extra_hi_s: np.ndarray  # (P, N, C) the larger of the two that a placement exists for
    tp: np.ndarray  # (C,)
    gpu_of: np.ndarray  # (C,) index into types
    types: list[str]
    held: np.ndarray  # (types + 1,) GPUs per type, then min(all GPUs, max_gpus)


def _class_arrays(inp: JointInputs) -> _ClassArrays:
    return _cached_for(inp, "class_arrays", _make_class_arrays)


def _make_class_arrays(inp: JointInputs) -> _ClassArrays:
    tab, lay = _class_tables(inp), _pair_layout(inp)
    gpus = _gpus_per_type(inp)
    types = sorted(gpus)
    shape = (inp.P, inp.U - 1, len(tab.classes))

    def spread(values: np.ndarray, missing: float) -> np.ndarray:  # (C, M) -> (P, N, C), missing where unfit
        out = np.full(shape, missing)
        out[lay.stage, lay.count, :] = np.where(tab.fits, values, missing).T
        return out

    total = sum(gpus.values()) if inp.max_gpus is None else min(sum(gpus.values()), inp.max_gpus)
    return _ClassArrays(spread(tab.time_s, np.inf), spread(np.minimum(tab.extra_in_s, tab.extra_span_s), np.inf),
                        spread(np.maximum(*(np.where(np.isfinite(e), e, -np.inf)  # inf: no such placement
                                            for e in (tab.extra_in_s, tab.extra_span_s))), -np.inf),
                        np.array([c[1] for c in tab.classes], dtype=float),
                        np.array([types.index(c[0]) for c in tab.classes]), types,
                        np.array([gpus[g] for g in types] + [total], dtype=float))


def _sum_tau_prices(inp: JointInputs) -> tuple[float, np.ndarray]:
    """(the Lagrangian bound of `sum_tau_lower_bound_s`, the prices that reach it)."""
    return _cached_for(inp, "sum_tau_prices", _make_sum_tau_prices)


class _ByStageTime:
    """Classes of every (stage, block count) sorted by stage time (inf: not allowed there)."""

    def __init__(self, t: np.ndarray):
        self.order = np.argsort(t, axis=2, kind="stable")
        self.t_sorted = np.take_along_axis(t, self.order, axis=2)
        self.finite = np.isfinite(self.t_sorted)

    def costs(self, arr: _ClassArrays, lams: np.ndarray, D: int) -> np.ndarray:
        """(B, P, N, C): the r-th class as straggler costs its stage time + D x the price of the
        cheapest replica among classes no slower than r, at prices lams (B, types + 1)."""
        per_gpu = (lams[:, arr.gpu_of] + lams[:, -1:]) * arr.tp  # (B, C) price of one replica per class
        price = np.where(self.finite, per_gpu[:, self.order], np.inf)  # in each (stage, count)'s time order
        return self.t_sorted + D * np.minimum.accumulate(price, axis=3)


def _make_sum_tau_prices(inp: JointInputs) -> tuple[float, np.ndarray]:
    arr = _class_arrays(inp)
    L, P = inp.U - 2, inp.P
    N = L + 1
    by_time = _ByStageTime(arr.time_s)
    # lam[g] per type; lam[-1] on every GPU, against min(all GPUs, max_gpus): single-type prices
    # alone cannot leave lam = 0 when another type is as fast
    prev, valid = _minplus_index(N)

    def values(lams: np.ndarray) -> np.ndarray:  # (B, types + 1) prices -> (B,) dual values
        check_deadline()
        stage = by_time.costs(arr, lams, inp.D).min(axis=3)  # (B, P, N)
        best = np.full((lams.shape[0], N), np.inf)
        best[:, 0] = 0.0
        for i in range(P):
            cand = best[:, prev] + stage[:, i, None, :]  # (B, s, n)
            best = np.where(valid, cand, np.inf).min(axis=2)
        return best[:, L] - lams @ arr.held

    lam = np.zeros(len(arr.types) + 1)
    best_value = float(values(lam[None])[0])
    if not np.isfinite(best_value):
        return math.inf, lam
    unit = max(float(np.min(by_time.t_sorted[..., 0][by_time.finite[..., 0]])), 1e-12) / inp.D
    steps = np.array([0.0] + [unit * 2.0 ** k for k in range(-4, 9)])
    coords = [lam.size - 1] + list(range(lam.size - 1))
    if lam.size == 2 and arr.held[0] == arr.held[-1]:
        coords = coords[:1]  # one type and no GPU cap: both prices are one price on the same GPUs
    for _ in range(3):  # coordinate search over a grid of prices, all trials of a coordinate at once
        improved = False
        for g in coords:
            trials = np.repeat(lam[None], steps.size, axis=0)
            trials[:, g] = steps
            vals = values(trials)
            j = int(np.argmax(vals))
            if vals[j] > best_value + 1e-15:
                best_value, lam, improved = float(vals[j]), trials[j], True
        if not improved:
            break
    return best_value, lam


@functools.lru_cache(maxsize=16)
def _minplus_padded_index(N: int) -> np.ndarray:
    """prev[s, n] = s - n where s >= n, else N: one stage's min-plus step as a gather from a table
    whose row N is inf (no mask needed). Cached: callers only read it."""
    prev, valid = _minplus_index(N)
    out = np.where(valid, prev, N)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=16)
def _minplus_index(N: int) -> tuple[np.ndarray, np.ndarray]:
    """(prev[s, n] = s - n where valid, valid[s, n] = s >= n): one stage's min-plus step as a gather.
    Cached: callers only read it."""
    s_idx, n_idx = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    valid = s_idx >= n_idx
    prev = np.where(valid, s_idx - n_idx, 0)
    for a in (prev, valid):
        a.setflags(write=False)
    return prev, valid


def capped_sum_tau_s(inp: JointInputs, theta_cap_s: float = math.inf, extra_cap_s: float = math.inf,
                     strong: bool = False) -> float:
    """A lower bound on sum_i tau_i over the plans whose stages all run within theta_cap_s and whose
    (stage, class) extras (`_ClassTables.extra_in_s`, or `_ClassTables.extra_span_s` where smaller) are within
    extra_cap_s (blocks form). A DP over (blocks placed, GPUs used in units of D) keeps the GPU
    total exact: a stage whose straggler is class r holds D replicas of classes no slower than r,
    so at least D x (the least TP among them) GPUs, a whole number of units, and the units of all
    stages fit min(all GPUs, max_gpus) / D. The per-type quotas enter by Lagrangian prices: those
    `sum_tau_lower_bound_s` found and none, the larger result counts. The caps are what make this
    strong: with theta at its bound, the fast (high-TP) classes cannot take every block, and the
    GPUs they need are gone for the other stages (measured: GPT-Neo on 256 A100, P5 b1 D32, sum tau
    >= 0.090 s uncapped, 0.145 s at the bottleneck bound, the optimum's sum tau).

    `strong` also takes `_replica_sum_tau_s` for every split of the GPU types into one type and
    the rest, which sees the quota of that type exactly (measured: A100 + V100, 32 + 96 GPUs,
    P5 b1 D16, at the optimum's theta and extras: 0.627 s here, 0.882 s with it, the optimum's)."""
    key = (theta_cap_s, extra_cap_s, strong)
    cache = _per_inputs_cache(inp, "capped_sum_tau")
    if key not in cache:
        out = capped_sum_tau_s(inp, theta_cap_s, extra_cap_s) if strong else \
            _capped_sum_tau_s(inp, theta_cap_s, extra_cap_s)
        if strong and out < math.inf:
            types = _class_arrays(inp).types
            for g in (types if len(types) > 2 else types[:1]):
                out = max(out, _replica_sum_tau_s(inp, theta_cap_s, extra_cap_s, g))
        cache[key] = out
    return cache[key]


def _capped_sum_tau_s(inp: JointInputs, theta_cap_s: float, extra_cap_s: float) -> float:
    arr = _class_arrays(inp)
    ok = (arr.time_s <= theta_cap_s) & (arr.extra_s <= extra_cap_s)
    t = np.where(ok, arr.time_s, np.inf)
    L, P, D = inp.U - 2, inp.P, inp.D
    N = L + 1
    by_time = _ByStageTime(t)
    if not by_time.finite[..., 0].any(axis=1).all():
        return math.inf  # some stage has no allowed count
    least_tp = np.minimum.accumulate(np.where(by_time.finite, arr.tp[by_time.order], np.inf), axis=2)  # (P, N, C)
    units = sorted({int(u) for u in arr.tp})
    V = min(int(arr.held[-1] // D), P * units[-1])  # more units than P stages can take never bind
    # with one GPU type the unit axis counts its GPUs exactly (V D <= its GPUs and the cap), and a
    # price on them subtracts at least what it adds (every plan pays <= price x V D): no prices
    prices = [] if len(arr.types) == 1 else [_sum_tau_prices(inp)[1]]
    lams = np.stack([np.zeros_like(arr.held), *prices])  # (1 or 2, types + 1)
    cost_r = by_time.costs(arr, lams, D)  # (1 or 2, P, N, C)
    # cost[u]: a stage taking u units: the best straggler whose least TP is <= u
    cost = [np.where(least_tp <= u, cost_r, np.inf).min(axis=3) for u in units]  # (1 or 2, P, N) each
    prev = _minplus_padded_index(N)
    # best[., s, v]: s blocks placed on v units; row N stays inf (where prev points for s < n)
    best = np.full((len(lams), N + 1, V + 1), np.inf)
    best[:, 0, 0] = 0.0
    allowed = [np.isfinite(c).any(axis=0) for c in cost]  # (P, N) per unit: the counts a stage may take
    for i in range(P):
        check_deadline()
        new = np.full_like(best, np.inf)
        for u, c, ok_u in zip(units, cost, allowed):
            if u > V:
                continue
            ns = np.flatnonzero(ok_u[i])  # only the counts allowed here
            if ns.size == 0:
                continue
            cand = best[:, prev[:, ns], : V + 1 - u] + c[:, i, ns][:, None, :, None]  # (., s, n, v)
            np.minimum(new[:, :N, u:], cand.min(axis=2), out=new[:, :N, u:])
        best = new
    values = best[:, L, :].min(axis=1) - lams @ arr.held
    return float(values.max())


def _replica_sum_tau_s(inp: JointInputs, theta_cap_s: float, extra_cap_s: float, left: str) -> float:
    """A lower bound on sum tau (caps as in `capped_sum_tau_s`) that counts the GPUs of type `left`
    exactly, replica by replica, and prices the GPUs of the other types (merged into one) at mu
    per GPU (Lagrangian: any mu >= 0 gives a bound; the dual is concave in mu, searched on a
    doubling grid). A stage with n blocks whose slowest class takes tau holds x replicas of `left`
    at the least TP w_a among its classes no slower than tau, and D - x of the others at their
    least such TP w_b, in any mix: best'[s + n, a + x w_a] = min(best[s, a] + tau + mu (D - x) w_b)
    over x = 0..D (`_stage_contrib`), a <= the GPUs of `left`; the bound is
    min_a best[L, a] - mu (the other GPUs)."""
    arr = _class_arrays(inp)
    t = np.where((arr.time_s <= theta_cap_s) & (arr.extra_s <= extra_cap_s), arr.time_s, np.inf)
    gpus = _gpus_per_type(inp)
    in_left = arr.gpu_of == arr.types.index(left)
    cap_a, cap_b = gpus[left], sum(v for g, v in gpus.items() if g != left)
    L, D = inp.U - 2, inp.D
    stages = [_replica_stage_choices(inp, t[i], i, in_left, arr.tp) for i in range(inp.P)]

    def value(mu: float) -> float:
        priced = [[((wa, mu * wb if wb < math.inf else wb), per_n) for (wa, wb), per_n in choices.items()]
                  for choices in stages]
        return float(_replica_dp(priced, L, cap_a + 1, D).min()) - mu * cap_b

    finite = t[np.isfinite(t)]
    if finite.size == 0:
        return math.inf
    unit = float(finite.min()) / D
    out, last = value(0.0), -math.inf
    for k in range(0, 16, 2):  # rises, then flat or falling (concave in mu)
        v = value(unit * 2.0 ** k)
        out = max(out, v)
        if v <= last + 1e-12 * abs(last):
            break
        last = v
    return out


def _replica_stage_choices(inp: JointInputs, t_i: np.ndarray, i: int, in_left: np.ndarray,
                           tp: np.ndarray) -> dict[tuple[float, float], list[tuple[int, float]]]:
    """(w_a, w_b) -> [(n, least tau with those GPUs per replica)] for stage i (`_replica_sum_tau_s`)."""
    out: dict[tuple[float, float], dict[int, float]] = {}
    for n in block_counts(inp, i):
        row = t_i[n]
        for tau in sorted(set(row[np.isfinite(row)].tolist())):
            allowed = row <= tau
            wa = float(tp[allowed & in_left].min()) if (allowed & in_left).any() else math.inf
            wb = float(tp[allowed & ~in_left].min()) if (allowed & ~in_left).any() else math.inf
            out.setdefault((wa, wb), {}).setdefault(n, tau)
    return {key: list(per_n.items()) for key, per_n in out.items()}


def _c_node_s(inp: JointInputs) -> float:
    """One boundary's transfer inside a zone: the least c_i (0 with one stage)."""
    return inp.p2p_s(inp.node) if inp.P > 1 else 0.0


def _rest_lower_bound_s(inp: JointInputs) -> float:
    """sum_i c_i + sigma + mu >= (P - 1) c_node + the larger of `_sigma_lower_bound_s` +
    `_mu_lower_bound_s` and (blocks form) `extra_lower_bound_s`."""
    sync_update = _sigma_lower_bound_s(inp) + _mu_lower_bound_s(inp)
    if blocks_identical(inp):
        sync_update = max(sync_update, extra_lower_bound_s(inp))
    return (inp.P - 1) * _c_node_s(inp) + sync_update


def _sigma_lower_bound_s(inp: JointInputs) -> float:
    """Some stage holds >= ceil(L / P) blocks (>= 1/P of the gradients). With `sync_table` (the
    model's all-reduce times, possibly intra-node), the least table entry with that many blocks;
    otherwise the model's ring over the inter-node link at the largest TP."""
    if inp.sync_table is not None:
        n_big = -(-(inp.U - 2) // inp.P)
        tables = [inp.sync_table] + ([inp.span_sync_table] if inp.span_sync_table else [])
        return min(_per_table(tab, ("least_from", n_big), lambda: min(
            (v for (_, _, n), v in tab.items() if n >= n_big), default=0.0)) for tab in tables)
    return 0.0  # without the table (layer units that differ) the model has no all-reduce floor


def _mu_lower_bound_s(inp: JointInputs) -> float:
    """mu >= 1/P of the cheapest update (some stage holds >= 1/P of the units' update work), plus
    the least fixed step (`upd_fixed_s`): the pools serving that stage take theirs too."""
    per_unit = _shared_for(inp, "least_update", lambda inp: sum(min(inp.upd_s[k][l] for k in range(inp.K))
                                                                for l in range(inp.U))) / inp.P
    return per_unit + min(inp.upd_fixed_s, default=0.0)  # every stage's pools take their fixed step


def stage_time_cap_s(inp: JointInputs, t_max_s: float) -> float:
    """The slowest a stage may be in a plan with T <= t_max_s: T >= m tau_i + (the other stages' tau)
    + rest >= m tau_i + `_rest_lower_bound_s`, since (m - 1) theta >= (m - 1) tau_i. Stage choices
    slower than this are dropped from the model (they cannot beat the cutoff)."""
    return (t_max_s - _rest_lower_bound_s(inp)) / inp.m


def cost_lower_bound_usd(inp: JointInputs, exact: bool = False, time_lb_s: float | None = None) -> float:
    """cost >= rate x T >= the larger of rate_LB x T_LB and the cheapest work: with 1F1B, T >= m tau_i
    ((m - 1) theta + sum tau >= m tau_i) and tau_i >= the stage's step time on each of its replicas,
    so rate x T >= sum_i sum_{r in i} price_r t_r m step_r(i) / 3600
    >= m D sum_l min_k price_k t_k step[k,l] / 3600. `time_lb_s`: a time bound the caller already has."""
    work = inp.m * inp.D * sum(min(p.price_per_gpu_hour_usd * p.tp * inp.step_s[k][l] for k, p in enumerate(inp.pools))
                               for l in range(inp.U)) / 3600
    t_lb = time_lower_bound_tight_s(inp, exact) if time_lb_s is None else time_lb_s
    out = max(t_lb * rate_lower_bound_usd_per_s(inp), work)
    return max(out, cost_lower_bound_dp_usd(inp)) if exact else out


def cost_lower_bound_dp_usd(inp: JointInputs) -> float:
    """cost >= rate x T. Let theta be the plan's slowest stage time (one of the class stage times
    of `_class_figures`); then T >= A + S with A = (m - 1) theta + `_rest_lower_bound_s` and
    S = sum tau, and every stage runs within theta. Per theta, dynamic programs over stages (blocks
    placed; GPU quotas ignored) give R0, the least rate of P stages of D replicas holding the L
    blocks with classes that run their stage within theta and fit it in memory, and S0, the least
    sum of stage times of such stages (also >= theta and `sum_tau_lower_bound_s`). Since
    (rate - R0)(S - S0) >= 0,
        rate (A + S) >= [R0 S + (A + S0) rate] - R0 S0,
    and the bracket is a sum over stages (stage i with straggler class r costs R0 tau_i +
    (A + S0) D price, price the cheapest class no slower than r), so a third DP minimises it:
        cost >= min over theta in [theta_LB, cap] of max(R0 (A + S0), that minimum).
    theta_LB from `bottleneck_lower_bound_s(exact=True)` (GPU counts), cap from a minimum
    throughput (`stage_time_cap_s`). Every replica pays for the bottleneck, not for its own stage
    time, which the per-unit bound of `cost_lower_bound_usd` misses; the coupled DP sees that a
    stage run fast costs more per second (measured: OPT-350M on 2 zones x (128 A100 + 128 V100),
    P2 b2 D64, min cost under 0.2 it/s: 0.4388 -> 0.4637 USD, above the 0.4480 optimum of P1, where
    the MILP had found no plan in 34 s). Blocks form only."""
    if not blocks_identical(inp):
        return cost_lower_bound_usd(inp)
    time_s, fits = _class_figures(inp)
    lo = bottleneck_lower_bound_s(inp, exact=True)
    cap = math.inf if not inp.min_iters_per_s else stage_time_cap_s(inp, 1 / inp.min_iters_per_s)
    thetas = np.array(sorted(t for t in set(time_s.values()) if lo <= t <= cap))
    if thetas.size == 0:
        return math.inf
    price = {}
    for p in inp.pools:
        c = (p.gpu_type, p.tp)
        price[c] = min(price.get(c, math.inf), p.price_per_gpu_hour_usd * p.tp / 3600)
    classes = sorted(price)
    L = inp.U - 2
    r = np.array([inp.D * price[c] for c in classes])  # USD/s of D replicas per class
    # per (stage, count): (theta, class r) -> time of r within theta, and the least rate of classes no slower
    stage_time, stage_rate = {}, {}
    for i in range(inp.P):
        for n in block_counts(inp, i):
            t = np.array([time_s[c, i, n] if fits[c, i, n] else math.inf for c in classes])
            ok = t[None, :] <= thetas[:, None]  # (theta, class)
            stage_time[i, n] = np.where(ok, t[None, :], math.inf)
            # cheapest replica among classes no slower than r (and within theta, as r is)
            no_slower = t[None, :] <= t[:, None]  # [r, c]
            cheapest = np.where(no_slower, r[None, :], math.inf).min(axis=1)
            stage_rate[i, n] = np.where(ok, cheapest[None, :], math.inf)

    def dp(weight) -> np.ndarray:  # least sum over stages of weight(i, n) (theta,) holding L blocks
        best = np.full((thetas.size, L + 1), np.inf)
        best[:, 0] = 0.0
        for i in range(inp.P):
            check_deadline()
            new = np.full_like(best, np.inf)
            for n in block_counts(inp, i):
                np.minimum(new[:, n:], best[:, :L + 1 - n] + weight(i, n)[:, None], out=new[:, n:])
            best = new
        return best[:, L]

    r0 = dp(lambda i, n: stage_rate[i, n].min(axis=1))
    s0 = np.maximum(dp(lambda i, n: stage_time[i, n].min(axis=1)), np.maximum(thetas, sum_tau_lower_bound_s(inp)))
    a = (inp.m - 1) * thetas + _rest_lower_bound_s(inp)
    simple = r0 * (a + s0)
    with np.errstate(invalid="ignore"):  # inf - inf where theta admits no plan: those stay inf below
        coupled = dp(lambda i, n: (r0[:, None] * stage_time[i, n] + (a + s0)[:, None] * stage_rate[i, n]).min(axis=1)) \
            - r0 * s0
    out = np.where(np.isfinite(simple), np.maximum(simple, np.nan_to_num(coupled, nan=-np.inf)), np.inf)
    return float(np.min(out))


def rate_lower_bound_usd_per_s(inp: JointInputs) -> float:
    return inp.P * inp.D * min(p.price_per_gpu_hour_usd * p.tp for p in inp.pools) / 3600


# ---- the model --------------------------------------------------------------------------------------
def build(inp: JointInputs, *, linearize: bool = True, time_cutoff_s: float | None = None,
          cost_cutoff_usd: float | None = None, layers: str = "auto") -> pyo.ConcreteModel:
    """The MILP (or MINLP when `linearize=False` and cost enters) for one outer choice.

    `time_cutoff_s` / `cost_cutoff_usd`: only plans at least this good are wanted (an incumbent's
    objective). They bound T (cost >= rate_LB x T for the cost cutoff), and in the blocks form every
    stage choice slower than `stage_time_cap_s` of that bound is left out of the model. The cost
    cutoff itself is not a row: add one if the model must reject worse plans.

    `layers`: "blocks" (the compact stage-choice form, needs `blocks_identical(inp)`), "staircase"
    (any per-unit figures) or "auto" (blocks when possible)."""
    if layers == "auto":
        layers = "blocks" if blocks_identical(inp) else "staircase"
    if layers == "blocks" and not blocks_identical(inp):
        raise ValueError("layers='blocks' needs identical transformer blocks after the first one")
    if layers == "staircase" and inp.sync_table is not None:
        raise ValueError("the staircase form has no all-reduce table: drop sync_table")
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
    if cost_cutoff_usd is not None:
        t_ub = min(t_ub, cost_cutoff_usd / rate_lower_bound_usd_per_s(inp))  # model units: ms

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
    _cost_and_objective(m, inp, linearize, Zs)
    _scale_rows(m, ("egress_def", "ring_egress_def"), COST_SCALE)  # USD rows in micro-dollars
    return m


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
        node=link(inp.node), zone=link(inp.zone),
        region=link(inp.region),
        pools=tuple(replace(p, price_per_gpu_hour_usd=p.price_per_gpu_hour_usd / ms) for p in inp.pools),
        min_iters_per_s=None if inp.min_iters_per_s is None else inp.min_iters_per_s / ms,
        sync_table=table(inp.sync_table), span_sync_table=table(inp.span_sync_table),
        tied_pool_s=tuple(tuple(v * ms for v in row) for row in inp.tied_pool_s))


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
        load = sum((inp.stat_bytes[k][l] + inp.in_flight(i) * inp.act_bytes[k][l]) * m.y[i, l] for l in m.L)
        big = max(0.0, sum(inp.stat_bytes[k]) + inp.in_flight(i) * sum(inp.act_bytes[k]) - inp.cap_bytes[k])
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


# ---- compact layer form: identical blocks ---------------------------------------------------------
def blocks_identical(inp: JointInputs, rel_tol: float = 1e-9) -> bool:
    """True when units 2..U-2 (every transformer block but the first) have the same figures on every
    pool: then a stage is described by its block count alone (`stage_units`)."""
    cache = _shared_cache(inp).setdefault("identical", {})  # a figure of the rows alone (`_shared_for`)
    if rel_tol not in cache:
        cache[rel_tol] = _blocks_identical(inp, rel_tol)
    return cache[rel_tol]


def _blocks_identical(inp: JointInputs, rel_tol: float) -> bool:
    if inp.U < 4:
        return False

    def same(rows) -> bool:
        arr = np.asarray(rows, dtype=float)
        ref = arr[:, 2:3]
        return bool(np.all(np.abs(arr[:, 3:inp.U - 1] - ref) <= rel_tol * np.maximum(np.abs(ref), 1e-30)))

    return all(same(rows) for rows in (inp.step_s, inp.upd_s, inp.stat_bytes, inp.act_bytes, (inp.grad_bytes,)))


def block_counts(inp: JointInputs, i: int) -> range:
    """Block counts n stage i may hold in the compact form: stage 0 holds the embedding and at least
    one block (so unit 1, the only block that may differ, is always there), middle stages at least
    one block, the last stage the head and possibly no block."""
    L, P = inp.U - 2, inp.P
    if P == 1:
        return range(L, L + 1)
    lo = 0 if i == P - 1 else 1
    others_min = (P - 1) - (1 if i < P - 1 else 0)  # stages before the last need one block each
    return range(lo, L - others_min + 1)


def position(inp: JointInputs, i: int) -> str:
    """Stages whose units look alike: "only" (P = 1), "first", "last" or "middle"."""
    return "only" if inp.P == 1 else ("first" if i == 0 else ("last" if i == inp.P - 1 else "middle"))


def stage_units(inp: JointInputs, i: int, n: int) -> range:
    """Units whose figures equal those of stage i holding n blocks (stage 0: the actual ones)."""
    if inp.P == 1:
        return range(0, inp.U)
    if i == 0:
        return range(0, 1 + n)
    if i == inp.P - 1:
        return range(inp.U - 1 - n, inp.U)
    return range(2, 2 + n)


def stage_sum(m: pyo.ConcreteModel, inp: JointInputs, i: int, per_unit) -> pyo.Expression:
    """sum over the units of stage i of `per_unit[l]`, as a linear expression in either layer form."""
    if m.layers == "blocks":
        return sum(sum(per_unit[l] for l in stage_units(inp, i, n)) * m.nb[i, n]
                   for n in block_counts(inp, i) if (i, n) in m.nb)
    return sum(per_unit[l] * m.y[i, l] for l in m.L)


def time_classes(inp: JointInputs) -> list[tuple[str, int]]:
    """Pools of one GPU type and TP degree run every unit alike (zones differ only in placement)."""
    return sorted({(p.gpu_type, p.tp) for p in inp.pools})


def _class_figures(inp: JointInputs) -> tuple[dict, dict]:
    """time[(r, i, n)] stage seconds per microbatch on class r, fits[(r, i, n)] memory fits a worker."""
    return _cached_for(inp, "figures", lambda inp: _class_tables(inp).as_dicts("time_s", "fits"))


@dataclass(frozen=True)
class _PairLayout:
    """Every (stage i, block count n) pair of the compact form for one (P, U), in stage order, with
    the unit range [lo, hi) of `stage_units` and the position index (0 first/only, 1 middle, 2 last)."""
    pairs: list  # [(i, n)]
    stage: np.ndarray
    count: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pos: np.ndarray
    positions: tuple  # position names by index


_LAYOUTS: dict[tuple[int, int], _PairLayout] = {}
_KEYS: dict[tuple, list] = {}


def _pair_layout(inp: JointInputs) -> _PairLayout:
    """The pairs of `block_counts` and their `stage_units`, shared by every choice with this P."""
    key = (inp.P, inp.U)
    if key not in _LAYOUTS:
        pairs = [(i, n) for i in range(inp.P) for n in block_counts(inp, i)]
        ranges = [stage_units(inp, i, n) for i, n in pairs]
        names = ("only",) if inp.P == 1 else ("first", "middle", "last")
        pos = [names.index(position(inp, i)) for i, _ in pairs]
        _LAYOUTS[key] = _PairLayout(pairs, *(np.array(v, dtype=np.int64) for v in (
            [i for i, _ in pairs], [n for _, n in pairs], [u.start for u in ranges], [u.stop for u in ranges], pos)),
            names)
    return _LAYOUTS[key]


def _table_keys(classes: list, inp: JointInputs) -> list:
    """[(r, i, n)] for every class and pair, class-major: the keys of the class dicts."""
    key = (tuple(classes), inp.P, inp.U)
    if key not in _KEYS:
        if len(_KEYS) > 64:  # one search needs a few per P; the lists are large and long-lived
            _KEYS.clear()
        _KEYS[key] = [(c, i, n) for c in classes for i, n in _pair_layout(inp).pairs]
    return _KEYS[key]


@dataclass(frozen=True)
class _ClassTables:
    """Per (class r, pair (i, n)) arrays (C, M) of the class figures, computed with numpy for every
    pair at once (the dict views of `_class_figures`, `_class_sync_update` and `_class_extras`
    are built from them)."""
    classes: list
    keys: list
    time_s: np.ndarray
    fits: np.ndarray
    sync_s: np.ndarray
    upd_s: np.ndarray
    # a lower bound on sync[i] + update of stage i holding n blocks when class r serves it and the
    # stage sits in one zone, so sigma + mu >= max over the plan's (stage, class) pairs (sigma >=
    # sync[i], mu >= the update of every class on every stage); inf where no zone holds D replicas
    extra_in_s: np.ndarray
    # the same for a stage that spans zones: its all-reduce is also at least the ring over the
    # inter-zone link (the model's sync_zone row), and an end stage that spans puts the tied
    # embedding across zones (ez >= span); equal to extra_in_s with one zone
    extra_span_s: np.ndarray

    def as_dicts(self, *names: str) -> tuple[dict, ...]:
        return tuple(dict(zip(self.keys, getattr(self, name).ravel().tolist())) for name in names)


def _class_tables(inp: JointInputs) -> _ClassTables:
    return _cached_for(inp, "class_tables", _make_class_tables)


def _prefix_rows(rows) -> np.ndarray:
    """(R, U + 1) running sums of each row, from 0 (cumsum adds in order, as a loop would)."""
    arr = np.asarray(rows, dtype=float)
    return np.concatenate([np.zeros((arr.shape[0], 1)), np.cumsum(arr, axis=1)], axis=1)


def _make_class_tables(inp: JointInputs) -> _ClassTables:
    lay = _pair_layout(inp)
    classes = time_classes(inp)
    members = [[k for k, p in enumerate(inp.pools) if (p.gpu_type, p.tp) == c] for c in classes]
    rep = [ks[0] for ks in members]

    def over_pairs(rows) -> np.ndarray:  # (C, M) stage sums of a per-unit figure
        pre = _prefix_rows([rows[k] for k in rep])
        return pre[:, lay.hi] - pre[:, lay.lo]

    time_s = over_pairs(inp.step_s)
    nf = np.array([inp.in_flight(i) for i in range(inp.P)])[lay.stage]
    cap = np.array([inp.cap_bytes[k] for k in rep])[:, None]
    fits = over_pairs(inp.stat_bytes) + nf * over_pairs(inp.act_bytes) <= cap
    upd_s = over_pairs(inp.upd_s) + np.array([inp.upd_fixed(k) for k in rep])[:, None]
    in_zone_s = span_s = np.zeros_like(time_s)  # without the tables (layer units that differ): no floor
    if inp.sync_table is not None:
        grid = _sync_by_pool(inp, lay, inp.sync_table)
        in_zone_s = span_s = np.stack([grid[ks].min(axis=0) for ks in members])
    if inp.span_sync_table is not None:
        grid = _sync_by_pool(inp, lay, inp.span_sync_table)
        span_s = np.stack([grid[ks].min(axis=0) for ks in members])
    sync_s = np.minimum(in_zone_s, span_s)  # a floor wherever the stage sits
    ends = (lay.stage == 0) | (lay.stage == inp.P - 1)
    # an end stage pays the tied embedding's all-reduce at least at the floor of every pool serving it
    # (the MILP's tied_pool rows): per class, the least over its pools
    ends_tied = [_ends_tied_s(inp, floors) for floors in inp.tied_pool_s] or [(0.0, 0.0)] * inp.K
    tied = np.array([[min(ends_tied[k][j] for k in ks) for j in (0, 1)] for ks in members])
    extra_in = in_zone_s + upd_s + np.where(ends, tied[:, :1], 0.0)
    if len(inp.zones) == 1:
        extra_span = extra_in
    else:
        extra_span = span_s + upd_s + np.where(ends, tied[:, 1:], 0.0)
    return _ClassTables(classes, _table_keys(classes, inp), time_s, fits, sync_s, upd_s, extra_in, extra_span)


def _sync_by_pool(inp: JointInputs, lay: _PairLayout, table: dict) -> np.ndarray:
    """(K, M) an all-reduce table's entry of every pool at every pair. The planner hands one table
    to every choice with its (D, pools, P), so the grid is kept beside the table it was read from
    (`_per_table`); rebuilding it per choice took 1.9 of 7 s on opt350-2zones-small-mincost."""
    return _per_table(table, ("sync_by_pool", inp.P, inp.U), lambda: _make_sync_by_pool(inp, lay, table))


_TABLE_FIGURES: dict[tuple, tuple] = {}


def _per_table(table: dict, what: tuple, make):
    """make(), a figure of an all-reduce table alone (and `what`), computed once per table object:
    the planner hands one table to many outer choices. The entry holds the table, so its id is not
    reused while the entry lives."""
    key = (id(table), *what)
    hit = _TABLE_FIGURES.get(key)
    if hit is None or hit[0] is not table:
        if len(_TABLE_FIGURES) > 4096:  # a search uses a few hundred; later searches bring new tables
            _TABLE_FIGURES.clear()
        hit = _TABLE_FIGURES[key] = (table, make())
    return hit[1]


def _make_sync_by_pool(inp: JointInputs, lay: _PairLayout, table: dict) -> np.ndarray:
    N = inp.U - 1
    grid = np.full((inp.K, len(lay.positions), N), np.inf)
    for (k, pos, n), v in table.items():
        if pos in lay.positions:
            grid[k, lay.positions.index(pos), n] = v
    return grid[:, lay.pos, lay.count]


def _class_extras(inp: JointInputs) -> dict:
    """extra[(r, i, n)] for the heuristics: sync[i] + update of stage i holding n blocks when class
    r serves it, in one zone (`_ClassTables.extra_in_s`), or spanning zones where no zone holds D
    replicas of it (`extra_span_s`). sync: the least of the class's pools in the all-reduce table
    (the ring over the inter-node link without one) plus, on the first and last stage, the least
    tied-embedding all-reduce floor of the class's pools the GPUs allow (`_ends_tied_s`); update:
    the class's optimizer step of those units."""
    return _cached_for(inp, "extras", _make_class_extras)


def _make_class_extras(inp: JointInputs) -> dict:
    # a class no zone holds D replicas of (inf in one zone) can only serve a stage spanning zones
    tab = _class_tables(inp)
    extra = np.where(np.isfinite(tab.extra_in_s), tab.extra_in_s, tab.extra_span_s)
    return dict(zip(tab.keys, extra.ravel().tolist()))


def _ends_tied_s(inp: JointInputs, floors: tuple[float, float, float]) -> tuple[float, float]:
    """(least tied-embedding all-reduce of the first and last stage when both sit in one zone each,
    the same when one of them spans zones) for a pool with these (node, zone, region) floors
    (`tied_pool_s`). Both ends in one zone need 2 D replicas there, both in one region 2 D
    replicas there; when no zone (region) has GPUs for that, the all-reduce crosses zones
    (regions) in every plan (ez = 1, er = 1 in the model: `ends_forced`)."""
    if inp.P <= 1:
        return 0.0, 0.0
    t_node, t_zone, t_region = floors
    ez, er = ends_forced(inp)
    far = t_region if er else t_zone
    return (far if ez else min(t_node, far)), far


def ends_forced(inp: JointInputs) -> tuple[bool, bool]:
    """(ez, er) forced to 1: no zone (region) has GPUs for the 2 D replicas of the first and last
    stage, each type counted at its smallest TP (P > 1)."""
    if inp.P <= 1:
        return False, False
    min_tp = _least_tp(time_classes(inp))
    return (_most_replicas(_gpus_per_group(inp, "zone"), min_tp) < 2 * inp.D,
            _most_replicas(_gpus_per_group(inp, "region"), min_tp) < 2 * inp.D)


def _gpus_per_group(inp: JointInputs, attr: str) -> dict[str, dict[str, int]]:
    """zone (attr="zone") or region -> GPU type -> GPUs there."""
    def make(inp: JointInputs) -> dict:
        out: dict[str, dict[str, int]] = {}
        for p in {p.quota_key: p for p in inp.pools}.values():
            per = out.setdefault(getattr(p, attr), {})
            per[p.gpu_type] = per.get(p.gpu_type, 0) + p.avail_gpus
        return out
    return _shared_for(inp, f"gpus_per_{attr}", make)


def _most_replicas(groups: dict[str, dict[str, int]], min_tp: dict[str, int]) -> int:
    """The most replicas any one group (zone or region) holds with type g at TP min_tp[g]."""
    return max((sum(gpus[g] // t for g, t in min_tp.items() if g in gpus) for gpus in groups.values()), default=0)


def _class_sync_update(inp: JointInputs) -> tuple[dict, dict]:
    """sync[(r, i, n)]: the least all-reduce of stage i holding n blocks over the pools of class r
    (the table, or the ring over the inter-node link), tied embedding not included;
    upd[(r, i, n)]: the class's optimizer step of those units."""
    return _cached_for(inp, "sync_update", lambda inp: _class_tables(inp).as_dicts("sync_s", "upd_s"))


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
    pools_of = {c: [k for k, p in enumerate(inp.pools) if (p.gpu_type, p.tp) == c] for c in classes}
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
    last = inp.P - 1
    m.ez = pyo.Var(domain=pyo.Binary)
    m.er = pyo.Var(domain=pyo.Binary)
    m.ends_zone = pyo.Constraint(pairs_z or [("", "")], rule=lambda m, z1, z2: (
        m.ez >= m.v[0, z1] + m.v[last, z2] - 1) if z1 else pyo.Constraint.Skip)
    m.ends_span = pyo.Constraint(expr=m.ez >= m.span[0])
    m.ends_span_last = pyo.Constraint(expr=m.ez >= m.span[last])
    m.ends_region = pyo.Constraint(pairs_r or [("", "")], rule=lambda m, r1, r2: (
        m.er >= m.rho[0, r1] + m.rho[last, r2] - 1) if r1 else pyo.Constraint.Skip)
    ez, er = ends_forced(inp)  # valid: no zone (region) holds both ends; the LP relaxation does not see it
    if ez:
        m.ez.setlb(1)
    if er:
        m.er.setlb(1)


def _time_constraints(m: pyo.ConcreteModel, inp: JointInputs) -> None:
    c_node, c_zone, c_region = inp.p2p_s(inp.node), inp.p2p_s(inp.zone), inp.p2p_s(inp.region)
    B = range(inp.P - 1)
    m.boundary = pyo.Constraint(B, rule=lambda m, i: m.c[i] == c_node + (c_zone - c_node) * m.dz[i]
                                + (c_region - c_zone) * m.dr[i])
    if inp.sailor:
        p2p = _sailor_send_rows(m, inp)
        m.bottleneck = pyo.Constraint(m.I, rule=lambda m, i: m.theta >= m.tau[i] + p2p[i])
        pipeline = sum(p2p)
    else:
        m.bottleneck = pyo.Constraint(m.I, rule=lambda m, i: m.theta >= m.tau[i])
        m.bottleneck_link = pyo.Constraint(B, rule=lambda m, i: m.theta >= m.c[i] / 2)
        pipeline = sum(m.c[i] for i in B)
    m.bottleneck_mean = pyo.Constraint(expr=inp.P * m.theta >= sum(m.tau[i] for i in m.I))  # valid cut
    _sync_constraints(m, inp)
    m.sync_max = pyo.Constraint(m.I, rule=lambda m, i: m.sigma >= m.sync[i])
    big_upd = [sum(inp.upd_s[k]) + inp.upd_fixed(k) for k in m.K]
    m.update = pyo.Constraint(m.I, m.K, rule=lambda m, i, k: m.mu >= stage_sum(
        m, inp, i, inp.upd_s[k]) + inp.upd_fixed(k) - big_upd[k] * (1 - m.u[i, k]))
    m.iteration = pyo.Constraint(expr=m.T == sum(m.tau[i] for i in m.I) + pipeline
                                 + (inp.m - 1) * m.theta + m.sigma + m.mu)


def _sailor_send_rows(m: pyo.ConcreteModel, inp: JointInputs) -> list:
    """Stage i's sends (Sailor's composition): A[i] its activation to stage i + 1, G[i] its gradient
    to stage i - 1, each at least half its boundary's time c / 2 and at least the send floor of every
    pool it uses (`JointInputs.send_floor_s`); returns Sailor's p[i] (`sailor_p2p`). A replica of pool
    k sends to a replica of the neighbour stage j; where j uses no pool of zone z_k (v[j, z_k] = 0),
    that receiver is in another zone, where j sits in another region (rho[j, r_k] = 0), in another
    region: then the send is at least pool k's floor away (`JointInputs.send_away_s`):
      A[i] >= away_zone[k] (u[i,k] - v[i+1, z_k]),  A[i] >= away_region[k] (u[i,k] - rho[i+1, r_k]),
    and G[i] likewise with stage i - 1."""
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
    if inp.send_away_s:
        def away(var, i, j, k, w):  # stage i's send to stage j from pool k, w = 0: zone, 1: region
            floor, pool = inp.send_away(k)[w], inp.pools[k]
            other = m.v[j, pool.zone] if w == 0 else m.rho[j, pool.region]
            return var >= floor * (m.u[i, k] - other) if floor > 0 else pyo.Constraint.Skip
        W = [0, 1]
        m.A_away = pyo.Constraint(m.A.index_set(), m.K, W, rule=lambda m, i, k, w: away(m.A[i], i, i + 1, k, w))
        m.G_away = pyo.Constraint(m.G.index_set(), m.K, W, rule=lambda m, i, k, w: away(m.G[i], i, i - 1, k, w))
    return sailor_p2p([m.A[i] for i in range(inp.P - 1)], [m.G[i] for i in range(1, inp.P)])


def sailor_p2p(A: list, G: list) -> list:
    """Sailor's per-stage transfer time (`estimate_p2p_pipeline_times`, core/simulator_sailor.py) from
    the sends A[i] (stage i's activation to stage i + 1, i < P - 1) and G[j] (stage j + 1's gradient
    back, j < P - 1): a middle stage sends its activation on and its gradient back, the first its
    activation (counted twice when P > 3), the last its gradient twice. Numbers or expressions."""
    P = len(A) + 1
    if P == 1:
        return [0.0]
    return [A[0] * (1 if P <= 3 else 2)] + [A[i] + G[i - 1] for i in range(1, P - 1)] + [2 * G[-1]]


def sailor_sends(inp: JointInputs, c: list[float], used: list[list[bool]], zones: list[set], regions: list[set]
                 ) -> tuple[list[float], list[float], list[float]]:
    """(send, A, G) of a fixed assignment, as `_sailor_send_rows` computes them: per stage its send
    floor, A for stages 0..P-2, G for stages 1..P-1 (`zones`, `regions`: those each stage uses)."""
    send = [max([inp.send_floor(k) for k in range(inp.K) if used[i][k]] + [0.0]) for i in range(inp.P)]

    def away(i: int, j: int) -> float:  # stage i's send floor to stage j: its pools' floors away
        return max([inp.send_away(k)[0] for k in range(inp.K) if used[i][k] and inp.pools[k].zone not in zones[j]]
                   + [inp.send_away(k)[1] for k in range(inp.K) if used[i][k] and inp.pools[k].region not in regions[j]]
                   + [0.0])
    return (send, [max(c[i] / 2, send[i], away(i, i + 1)) for i in range(inp.P - 1)],
            [max(c[i - 1] / 2, send[i], away(i, i - 1)) for i in range(1, inp.P)])


def _tied_at(floors: tuple[float, float, float], ez, er):
    """A tied-embedding floor (node, zone, region) where the ends differ in zone (ez) / region (er)."""
    t_node, t_zone, t_region = floors
    return t_node + (t_zone - t_node) * ez + (t_region - t_zone) * er


def _sync_constraints(m: pyo.ConcreteModel, inp: JointInputs) -> None:
    tied = {i: 0.0 for i in m.I}
    if inp.P > 1 and inp.tied_pool_s:
        # the tied-embedding all-reduce joins the first and last stage (ez/er: they differ in zone/region);
        # its ring carries bytes / the least TP of both ends, so it takes at least the floor of every
        # pool serving an end (at t_k) and of any pool (`tied_s`)
        last, big_t = inp.P - 1, max(map(max, inp.tied_pool_s))
        m.tied = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0, big_t))
        m.tied_any = pyo.Constraint(expr=m.tied >= _tied_at(inp.tied_s, m.ez, m.er))
        m.tied_pool = pyo.Constraint([0, last], m.K, rule=lambda m, j, k: m.tied >= _tied_at(
            inp.tied_pool_s[k], m.ez, m.er) - big_t * (1 - m.u[j, k]))
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
    rate = {(i, k): inp.pools[k].price_per_gpu_hour_usd * inp.pools[k].tp / 3600 for i in m.I for k in m.K}
    m.egress = pyo.Var(domain=pyo.NonNegativeReals)
    _egress_constraints(m, inp, Zs)
    need_cost = inp.objective == "min_cost" or inp.max_cost_usd is not None
    if need_cost:
        if linearize:
            compute = _linear_rate_times_T(m, inp, rate)
        else:
            compute = sum(rate[i, k] * m.x[i, k] for i in m.I for k in m.K) * m.T
        m.cost = pyo.Expression(expr=compute + m.egress)
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
    p2p_bytes = inp.m * inp.D * 2 * inp.boundary_bytes / 1e6
    B = range(inp.P - 1)
    ring = 2 * (inp.D - 1) / inp.D * inp.sync_factor if inp.D > 1 else 0.0
    gb = [g / 1e6 for g in inp.grad_bytes]
    gmax = sum(gb)
    m.wz = pyo.Var(m.I, Zs, domain=pyo.NonNegativeReals, bounds=(0, gmax))
    m.wz_def = pyo.Constraint(m.I, Zs, rule=lambda m, i, z: m.wz[i, z] >= stage_sum(
        m, inp, i, gb) - gmax * (1 - m.v[i, z]))
    m.ring_egress = pyo.Var(m.I, domain=pyo.NonNegativeReals)
    m.ring_egress_def = pyo.Constraint(m.I, rule=lambda m, i: m.ring_egress[i] >= ring * pz * (
        sum(m.wz[i, z] for z in Zs) - len(Zs) * gmax * (1 - m.span[i])))
    tied = 2 * 2 * (2 * inp.D - 1) / (2 * inp.D) * inp.tied_grad_bytes / 1e6 if inp.P > 1 else 0.0
    m.egress_def = pyo.Constraint(expr=m.egress >= sum(
        p2p_bytes * (pz * m.dz_all[i] + (pr - pz) * m.dr[i]) for i in B) + sum(m.ring_egress[i] for i in m.I)
        + tied * (pz * m.ez + (pr - pz) * m.er))


# ---- decode and greedy ------------------------------------------------------------------------------
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


def to_plan(sol: JointSolution, inp: JointInputs, name: str = "hetplan") -> Plan:
    stages = []
    for i, (start, end) in enumerate(sol.ranges):
        reps = []
        for k, n in enumerate(sol.replicas[i]):
            pool = inp.pools[k]
            reps += [Replica(gpu_type=pool.gpu_type, tp=pool.tp, zone=pool.zone, microbatch_share=inp.b)] * n
        stages.append(Stage(layer_start=start, layer_end=end, replicas=tuple(reps)))
    return Plan(name=name, schedule="1F1B", num_microbatches=inp.m, micro_batch_size=inp.b, stages=tuple(stages))


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
    stage order. Moves: swap two stages' replicas (their unit ranges kept), or, with identical
    blocks, move one stage (its replicas and blocks) to another position; first improvement by the
    model's objective (`objective_within_limits`, so the limits hold), every stage in memory
    (`_stage_fits`). The GPUs each pool gives are unchanged, so quotas hold too. The heuristics
    decide each stage's class and block count, not where it goes: the stage DP is indifferent to the
    order (its sum of stage times is the same), and placing stages one by one leaves the ends in
    different zones (the tied embedding's all-reduce crosses zones) or a stage spread over zones at
    an end (its all-reduce spans zones and adds the tied one). Measured on opt350-2zones-budget,
    P6 b1 D64: the stage DP's plan 1.747 s -> 1.631 s (the choice's optimum: 1.629 s), and the whole
    search 59 s (time limit) -> 39 s. Stops at `max_evals` plans or at the
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
                if new_rows == rows and counts == blocks or counts[0] < 1 or min(counts[1:-1], default=1) < 1:
                    continue
                sizes = [n + (k == 0) + (k == P - 1) for k, n in enumerate(counts)]
                starts = [sum(sizes[:k]) for k in range(P)]
                yield [(s, s + n) for s, n in zip(starts, sizes)], new_rows

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
    return all(not row[k] or (stat[k][end] - stat[k][start]) + nf * (act[k][end] - act[k][start]) <= inp.cap_bytes[k]
               for k in range(inp.K))


def _repair_memory(inp: JointInputs, replicas: list[list[int]], ranges: list[tuple[int, int]]):
    bounds = [r[0] for r in ranges] + [inp.U]
    fits = lambda i: _stage_fits(inp, replicas[i], i, bounds[i], bounds[i + 1])  # noqa: E731
    ok = [fits(i) for i in range(inp.P)]
    for _ in range(inp.U * inp.P):
        if all(ok):
            return [(bounds[i], bounds[i + 1]) for i in range(inp.P)]
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


def evaluate(inp: JointInputs, sol: JointSolution) -> dict[str, float]:
    """The MILP's figures (T, cost and their parts) for a fixed assignment: what its rows compute, a
    relaxation of `evaluate_placed` (module docstring)."""
    y = {(i, l): 1 if sol.ranges[i][0] <= l < sol.ranges[i][1] else 0 for i in range(inp.P) for l in range(inp.U)}
    used = [[sol.replicas[i][k] > 0 for k in range(inp.K)] for i in range(inp.P)]
    tau = [max(sum(inp.step_s[k][l] for l in range(*sol.ranges[i])) for k in range(inp.K) if used[i][k])
           for i in range(inp.P)]
    zones = [{inp.pools[k].zone for k in range(inp.K) if used[i][k]} for i in range(inp.P)]
    regions = [{inp.pools[k].region for k in range(inp.K) if used[i][k]} for i in range(inp.P)]
    span = [1 if len(z) > 1 else 0 for z in zones]
    dz = [1 if zones[i] != zones[i + 1] and not (span[i] and span[i + 1]) else 0 for i in range(inp.P - 1)]
    dr = [1 if regions[i] != regions[i + 1] else 0 for i in range(inp.P - 1)]
    dz_all = [1 if dr[i] or (zones[i] != zones[i + 1] and not (span[i] or span[i + 1])) else 0
              for i in range(inp.P - 1)]
    c_node, c_zone, c_region = inp.p2p_s(inp.node), inp.p2p_s(inp.zone), inp.p2p_s(inp.region)
    c = [c_node + (c_zone - c_node) * dz[i] + (c_region - c_zone) * dr[i] for i in range(inp.P - 1)]
    send, A, G = sailor_sends(inp, c, used, zones, regions) if inp.sailor else ([], [], [])
    p2p = sailor_p2p(A, G) if inp.sailor else [0.0] * inp.P
    theta = max([t + p for t, p in zip(tau, p2p)] + ([] if inp.sailor else [ci / 2 for ci in c]))
    last = inp.P - 1
    ez = 1 if (span[0] or span[last] or zones[0] != zones[last]) else 0
    er = 1 if regions[0] != regions[last] else 0
    tied = {0: 0.0, last: 0.0}
    if inp.P > 1:
        ends = [k for k in range(inp.K) if used[0][k] or used[last][k]] if inp.tied_pool_s else []
        t = max((_tied_at(inp.tied_pool_s[k], ez, er) for k in ends), default=0.0)
        tied = {0: t, last: t}
    else:
        ez = er = 0
    sync = []
    counts = solution_blocks(inp, sol) if inp.sync_table is not None else None  # set only for identical blocks
    for i in range(inp.P):
        table = inp.span_sync_table if span[i] else inp.sync_table
        own = [0.0]  # the staircase form (layer units that differ) has no all-reduce floor
        if counts is not None and table is not None:
            own += [model_coef(table[k, position(inp, i), counts[i]]) for k in range(inp.K) if used[i][k]]
        sync.append(max(own) + tied.get(i, 0.0))
    mu = max(sum(inp.upd_s[k][l] for l in range(*sol.ranges[i])) + inp.upd_fixed(k)
             for i in range(inp.P) for k in range(inp.K) if used[i][k])
    T = sum(tau) + (sum(p2p) if inp.sailor else sum(c)) + (inp.m - 1) * theta + max(sync) + mu
    rate = sum(inp.pools[k].price_per_gpu_hour_usd * inp.pools[k].tp * sol.replicas[i][k] / 3600
               for i in range(inp.P) for k in range(inp.K))
    pz, pr = inp.egress_zone_usd_per_GB / 1e9, inp.egress_region_usd_per_GB / 1e9
    egress = sum(inp.m * inp.D * 2 * inp.boundary_bytes * (pz * dz_all[i] + (pr - pz) * dr[i]) for i in range(inp.P - 1))
    ring = 2 * (inp.D - 1) / inp.D * inp.sync_factor if inp.D > 1 else 0.0
    egress += sum(ring * pz * len(zones[i]) * sum(inp.grad_bytes[l] for l in range(*sol.ranges[i]))
                  for i in range(inp.P) if span[i])
    if inp.P > 1:
        egress += 2 * 2 * (2 * inp.D - 1) / (2 * inp.D) * inp.tied_grad_bytes * (pz * ez + (pr - pz) * er)
    return {"ez": ez, "er": er, "T": T, "cost": rate * T + egress, "egress": egress, "rate": rate, "tau": tau, "c": c,
            "p2p": p2p, "send": send, "A": A, "G": G, "theta": theta,
            "sync": sync, "sigma": max(sync), "mu": mu, "y": y, "span": span, "dz": dz, "dr": dr, "dz_all": dz_all,
            "zones": zones, "regions": regions}


def evaluate_placed(inp: JointInputs, sol: JointSolution) -> dict[str, float]:
    """The figures of `sol`'s plan on the nodes first fit gives it (the simulator's placement), read
    from the shared stage evaluation (`inp.costs`), with the model's compute rate: what the MILP
    relaxes (`evaluate` is at most each of these figures, component by component). Keys as in
    `evaluate`: T, cost, rate, egress, tau (f + b per stage), c (cf + cb per boundary), sync, mu."""
    costs = inp.costs
    if costs is None:
        raise ValueError("evaluate_placed needs JointInputs.costs (planner.joint_inputs sets it)")
    if inp.sailor:
        raise ValueError("evaluate_placed composes the hetplan iteration; the sailor composition's plans are "
                         "scored by simulate")
    it = costs.iteration(validate_plan(costs.inst, to_plan(sol, inp)))
    rate = sum(inp.pools[k].price_per_gpu_hour_usd * inp.pools[k].tp * n / 3600
               for row in sol.replicas for k, n in enumerate(row))
    T = it.iteration_s
    return {"T": T, "cost": rate * T + it.egress_usd, "rate": rate, "egress": it.egress_usd,
            "tau": [x + y for x, y in zip(it.f, it.b)], "c": [x.fwd_s + x.bwd_s for x in it.links],
            "sync": [x.time_s for x in it.syncs], "sigma": it.sync_s, "mu": it.update_s}


def better(current: tuple | None, candidate: tuple | None) -> tuple | None:
    """The one of two (objective, ...) results with the smaller objective (the current one on a
    tie); None counts as none."""
    if candidate is None or (current is not None and current[0] <= candidate[0]):
        return current
    return candidate


def objective_within_limits(inp: JointInputs, sol: JointSolution, objective: str, max_cost_usd: float | None = None,
                            min_iters_per_s: float | None = None) -> float | None:
    """The plan's objective (cost for min cost, T otherwise) by the model's own figures
    (`evaluate`), or None when it breaks the budget or the minimum throughput."""
    ev = evaluate(inp, sol)
    if (max_cost_usd is not None and ev["cost"] > max_cost_usd) or (
            min_iters_per_s is not None and ev["T"] > 1 / min_iters_per_s):
        return None
    return ev["cost"] if objective == "min_cost" else ev["T"]


def solution_blocks(inp: JointInputs, sol: JointSolution) -> list[int] | None:
    """Blocks per stage of `sol` in the compact form, or None when it lies outside it (stage 0
    holding the embedding alone)."""
    if inp.P > 1 and sol.ranges[0][1] < 2:
        return None
    counts = [e - s for s, e in sol.ranges]
    counts[0] -= 1
    counts[-1] -= 1
    return counts


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
    inp = in_model_units(inp)
    ev = evaluate(inp, sol)
    start = ComponentMap()  # Pyomo variables are not hashable as plain dict keys
    if m.layers == "blocks":
        if not _block_start(m, inp, sol, start):
            return None
    else:
        for (i, l), val in ev["y"].items():
            start[m.y[i, l]] = val
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
        gbi = sum(inp.grad_bytes[l] for l in range(*sol.ranges[i]))
        for z in inp.zones:
            start[m.wz[i, z]] = gbi / 1e6 if z in ev["zones"][i] else 0.0
        ring = 2 * (inp.D - 1) / inp.D * inp.sync_factor if inp.D > 1 else 0.0
        start[m.ring_egress[i]] = ring * inp.egress_zone_usd_per_GB / 1e9 * len(ev["zones"][i]) * gbi if ev["span"][i] else 0.0
    for i in range(inp.P - 1):
        start[m.dz[i]], start[m.dr[i]], start[m.c[i]] = ev["dz"][i], ev["dr"][i], ev["c"][i]
        start[m.dz_all[i]] = ev["dz_all"][i]
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
