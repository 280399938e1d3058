"""The joint formulation's inputs and solution: pools, link costs, `JointInputs` (one outer
choice's figures from the estimators), `JointSolution`, and the search deadline the bounds and
heuristics poll."""
from __future__ import annotations

import contextvars
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator


from hetplan.formulations.stage_cost import StageCosts


ULP_SLACK = 1e-12  # relative: bounds built from sums in another order are lowered by this much


def slack_below(lo: float) -> float:
    """Where candidate figures (stage times) at or above a bound `lo` start: lo lowered by ULP_SLACK.
    A bound summed in another order can exceed the very stage time it bounds by an ulp; kept exact,
    that time was dropped and a choice's bound became the next time up, or inf (random campaign,
    session 58: a single-stage choice whose best plan takes 0.0501 s got 0.0980 s)."""
    return lo * (1 - ULP_SLACK) if lo > 0 else lo


COST_SCALE = 1e6  # objective and budget rows in micro-dollars


TIME_UNITS_PER_S = 1e3  # the model's time variables are in milliseconds (`in_model_units`)


def model_coef(floor_s: float) -> float:
    """An all-reduce table entry as the MILP (and `evaluate`, its evaluation) reads it. The tables
    hold inf where no placement of that kind exists (`planner.with_sync_table`): the bounds rule
    such (stage, pool) pairs out, while the MILP needs finite coefficients and its quota and region
    rows already forbid them, so it reads 0 there (a relaxation: never above the true floor)."""
    return floor_s if floor_s < math.inf else 0.0


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


# The deadline the bounds and heuristics of this package check in their
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


class Stopped(Exception):
    """A computation under `stop_scope` was asked to stop: its result is no longer wanted. Not a
    DeadlineExceeded, so nothing returns a partial answer for it (the stage DP does at the
    deadline); caches store only finished values, as at the deadline."""


# who may stop the long computations in scope early: a function that says whether to stop
_STOP: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("hetplan_stop", default=None)


@contextmanager
def stop_scope(stop: Callable[[], bool]) -> Iterator[None]:
    """Within the block, `check_deadline()` also raises Stopped once `stop()` is true (it is asked at
    every check: it should be cheap, or throttle itself)."""
    token = _STOP.set(stop)
    try:
        yield
    finally:
        _STOP.reset(token)


def check_deadline() -> None:
    """Raise DeadlineExceeded when the current scope's deadline has passed (about 0.1 us), or
    Stopped when its `stop_scope` asks."""
    _DEADLINE.get().check()
    stop = _STOP.get()
    if stop is not None and stop():
        raise Stopped


@dataclass(frozen=True)
class Pool:
    gpu_type: str
    zone: str
    region: str
    tp: int
    avail_gpus: int  # GPUs of this type in this zone, shared by the pools of every TP degree
    price_per_gpu_hour_usd: float
    # the most GPUs one node of this type in this zone has; None: not known. Where it is known, the
    # pools of one (type, zone) come in ascending TP, so that `to_plan` lists (and first fit places)
    # a stage's replicas of one group by ascending TP (`composition.apart` reads that order)
    node_gpus: int | None = None
    # the GPUs of the node first fit gives this pool's replica when the group's nodes are all empty
    # (the first of the type and zone in `hetplan.plan.placement_order` with t GPUs): stage 0's
    # first replica of the group sits there (`composition._crowded`); None: not known
    first_node_gpus: int | None = None

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
    # (k, position(i), n) -> seconds: a floor on the same all-reduce when stage i also holds two or
    # more replicas of pool k's (zone, GPU type), spanning zones or not (`planner.with_sync_table`;
    # None where the communication estimator has no such floor: only Sailor's, whose all-reduce is
    # its slowest neighbour pair, reads it)
    repeat_sync_table: dict | None = None
    # [k]: lower bounds on the tied-embedding all-reduce of the first and last stage when pool k
    # serves one of them (the ring's size is bytes / its least TP, at most t_k) and both ends sit in
    # one zone, in zones of one region (ez = 1), in two regions (er = 1) (`planner.tied_floors_s`);
    # empty: no tied embedding
    tied_pool_s: tuple[tuple[float, float, float], ...] = ()
    # (k, k2) -> the same floors when pool k serves the first stage and pool k2 the last, for the
    # pairs whose floors pass both pools' own in some column (`planner.tied_pair_floors_s`): the
    # ring's least TP is at most min(t_k, t_k2) and it holds both replicas (None: no such pair)
    tied_pair_s: dict | None = None
    # "hetplan": the composition of simulator/pipeline.py (rows above); "sailor": Sailor's simulator
    # composition (simulator/sailor.py, module docstring "Sailor's composition")
    composition: str = "hetplan"
    # [k] an optimizer step every stage served by pool k takes whatever units it holds (Sailor's
    # whole-model step from the profile); empty: none (the update is upd_s's per-unit sums alone)
    upd_fixed_s: tuple[float, ...] = ()
    # [k] (Sailor's composition) the least time of any one send of a replica of pool k to a replica
    # of the next or previous stage, whatever its place, size or receiver: Sailor's bandwidth fits
    # depend on the sender's TP group (a TP 1 sender is ~4x slower than a TP 4 one); empty: none
    send_floor_s: tuple[float, ...] = ()
    # [k] (Sailor's composition) the same floors on a send from a replica of pool k to a node of another
    # zone / another region (`planner.inputs._Tables.send_floor_s`): a TP 1 sender over zones is far slower than
    # the least send between zones over every TP group size (c_zone); empty: none
    send_away_s: tuple[tuple[float, float], ...] = ()
    # [k] (Sailor's composition) the least time of any one send to a replica of pool k from any
    # replica, place or size: a fit depends on the receiver's TP group too (a TP 4 sender to a TP 2
    # receiver is about as slow as a TP 2 sender); empty: none
    recv_floor_s: tuple[float, ...] = ()
    # (the hetplan composition) the fastest boundary transfer between two different nodes, for the
    # boundaries some pair of which is surely on two nodes (`composition.apart`); None: `node`
    inter: LinkCost | None = None
    # (the hetplan composition) zone -> the fastest such transfer between two nodes of that zone:
    # `inter` may be a pair over zones, and c_inter is capped by c_zone (a network between zones
    # faster than the one between nodes); a boundary with both sides in that one zone and some pair
    # on two nodes takes at least it (`composition.in_zone_s`); None: no zone has two nodes
    inter_in_zone: dict | None = None
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
    def tied_worst_s(self) -> float:
        """The largest tied-embedding floor of any pool or pair of end pools (a big-M)."""
        return max([*map(max, self.tied_pool_s), *map(max, (self.tied_pair_s or {}).values())], default=0.0)

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

    def recv_floor(self, k: int) -> float:
        return self.recv_floor_s[k] if self.recv_floor_s else 0.0

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
