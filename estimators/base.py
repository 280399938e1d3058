"""Estimator protocols: the four small interfaces every plug-in implements.

The planner (formulations) and the simulator both see the cluster only through these, so a plan's
promised figures and its simulated figures come from the same numbers.

Layer units follow the plan: 0 = embedding, 1..L = transformer blocks, L + 1 = head.
`microbatch` is the number of sequences one replica processes per pipeline step (its share).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hetplan.catalog import LinkSpec


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer unit, one microbatch, on one GPU of a TP group (TP comm included)."""

    fwd_s: float
    bwd_s: float  # includes the recomputed forward when recomputation is on

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes of one worker (one GPU), by source (Sailor sec. 4.3: M_peak = M_model + M_activation)."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    overhead_bytes: float
    capacity_bytes: float
    # Bytes the feasibility rule counts, when it differs from the peak (Sailor's `check_config_fits`
    # adds a smaller framework overhead than its footprint model); None: the peak itself.
    fit_bytes: float | None = None

    @property
    def state_bytes(self) -> float:
        """Weights, gradients and optimizer state: what the worker holds whatever the microbatch."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + self.activations_bytes + self.overhead_bytes

    @property
    def counted_bytes(self) -> float:
        """What the feasibility rule compares with the capacity."""
        return self.total_bytes if self.fit_bytes is None else self.fit_bytes

    @property
    def oom(self) -> bool:
        return self.counted_bytes > self.capacity_bytes


@dataclass(frozen=True)
class Endpoint:
    """Where a GPU (or a TP group) sits, as the communication estimator needs it."""

    zone: str
    region: str
    node_id: str | None = None  # equal, non-None node ids mean the same node
    intra_node: LinkSpec | None = None
    gpus: int | None = None  # GPUs of the endpoint that take part (a TP group's size); None: not said


def fastest_link(links: list[LinkSpec]) -> LinkSpec:
    """A link at least as fast as each of `links` (the greatest bandwidth, the least latency): a
    transfer over it takes at most as long as over any of them, so it prices a lower bound where
    the node is not known."""
    if len({(x.bandwidth_GBps, x.latency_s) for x in links}) == 1:
        return links[0]
    return LinkSpec(kind="other", bandwidth_GBps=max(x.bandwidth_GBps for x in links),
                    latency_s=min(x.latency_s for x in links))


@runtime_checkable
class TimeEstimator(Protocol):
    name: str

    def layer_time(self, gpu_type: str, unit: int, microbatch: int, tp: int,
                   intra_node: LinkSpec | None = None) -> LayerTime:
        """Forward and backward time of one layer unit for one microbatch on one TP-group member.
        `intra_node`: the link of the node the TP group runs on (a placed replica's); None: the fastest
        link of the type's nodes, so the figure is at most that of any node. An estimator that
        measured its TP times (profiles) may ignore it."""
        ...

    def update_time_s(self, gpu_type: str, units: range, tp: int, dp: int) -> float:
        """Optimizer step of the parameters of `units` held by one worker (ZeRO shards over dp)."""
        ...


@runtime_checkable
class MemoryEstimator(Protocol):
    name: str

    def worker_memory(self, gpu_type: str, units: range, tp: int, microbatch: int, dp: int,
                      in_flight: int) -> MemoryBreakdown:
        """Peak memory of one worker holding `units` with TP degree tp, `in_flight` microbatches of
        activations alive at once (1F1B: min(P - stage_index, m); GPipe: m), ZeRO shards over dp."""
        ...


@runtime_checkable
class CommEstimator(Protocol):
    name: str

    def link(self, a: Endpoint, b: Endpoint) -> LinkSpec:
        """The link class between two endpoints (intra-node, inter-node, inter-zone, inter-region)."""
        ...

    def p2p_time_s(self, a: Endpoint, b: Endpoint, nbytes: float) -> float:
        """alpha-beta time to send nbytes from a to b."""
        ...

    def allreduce_time_s(self, members: list[Endpoint], nbytes: float) -> float:
        """All-reduce of nbytes held by each member (ring over the members; slowest link bounds it)."""
        ...


# Where an all-reduce's members may sit, for `allreduce_floor_s`: "node" (one zone; one node or
# several), "zone" (at least two zones of one region), "region" (at least two regions).
SPANS = ("node", "zone", "region")


def spans_pair(spans: str, a: Endpoint, b: Endpoint) -> bool:
    """Whether two places on different nodes (endpoints, node kinds, or the instance's nodes) are a
    pair of the kind `spans` names: one zone, two zones of one region, two regions."""
    if spans == "node":
        return a.zone == b.zone
    if spans == "zone":
        return a.zone != b.zone and a.region == b.region
    return a.region != b.region


@dataclass(frozen=True)
class NodeKind:
    """Nodes alike for a communication estimator (same zone, region and GPU type), one group of
    `bottleneck_floor_s`; `total` the members its nodes hold together."""

    zone: str
    region: str
    total: int


def bottleneck_floor_s(kinds: list[NodeKind], members: int, spans: str, pair_s: dict[tuple[int, int], float]) -> float:
    """A lower bound on the slowest neighbour pair of every list of `members` endpoints drawn from
    `kinds` that spans as `spans` says (SPANS), when a pair of kinds (i, j), i <= j, takes at least
    pair_s[(i, j)] ((i, i): two members of kind i; absent: no such list has that pair, e.g. for
    "node" a pair of two zones).
    Why it holds: a list's neighbour pairs join the kinds it uses into one connected group (one kind
    alone: a pair (i, i)); that group holds the `members`, and it spans as the list does (two zones
    of one region; two regions; for "node" every pair lies in one zone, so `pair_s` holds no other).
    With t the list's slowest pair, every pair it has is <= t, so such a group forms among the pairs
    <= t. Adding pairs in increasing time (Kruskal's order), the first at which a group holds
    `members` and spans is the bound; inf when none does. This counts what the least single pair of
    that kind misses: a ring over 32 A100 TP 4 replicas in zones of 8 needs four zones, so three
    pairs of zones, not only the fastest."""
    parent = list(range(len(kinds)))
    total = [k.total for k in kinds]
    members_of = [[k] for k in kinds]  # per group root: its kinds

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def spanned(group: list[NodeKind]) -> bool:  # in one zone by `pair_s` for "node"
        return spans == "node" or any(spans_pair(spans, x, y) for x in group for y in group)

    for (i, j), t in sorted(pair_s.items(), key=lambda item: item[1]):
        a, b = root(i), root(j)
        if a != b:
            parent[b] = a
            total[a] += total[b]
            members_of[a] += members_of[b]
        # a group only changes when a pair comes in, and a kind no pair reached has none (no list)
        if total[a] >= members and spanned(members_of[a]):
            return t
    return math.inf


def least_nodes(slots: list[int], members: int) -> int | None:
    """The fewest nodes whose member slots add up to `members` (None when all of them do not)."""
    total = 0
    for count, n in enumerate(sorted(slots, reverse=True), start=1):
        total += n
        if total >= members:
            return count
    return None


@runtime_checkable
class CostEstimator(Protocol):
    name: str

    def compute_usd(self, price_per_gpu_hour_usd: float, num_gpus: int, time_s: float) -> float:
        ...

    def egress_usd(self, a: Endpoint, b: Endpoint, nbytes: float) -> float:
        ...


# How the simulator composes the estimators' figures into an iteration: "hetplan" (simulator/pipeline.py,
# the model the joint planner relaxes) or "sailor" (Sailor's simulator, simulator/sailor.py).
ITERATION_MODELS = ("hetplan", "sailor")


@dataclass(frozen=True)
class EstimatorSet:
    time: TimeEstimator
    memory: MemoryEstimator
    comm: CommEstimator
    cost: CostEstimator
    notes: dict[str, str] = field(default_factory=dict)
    iteration: str = "hetplan"  # one of ITERATION_MODELS
