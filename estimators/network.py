"""Alpha-beta communication estimator (name "alpha_beta").

A transfer of n bytes over a link costs latency_s + n / bandwidth (Hockney's alpha-beta model).
The link between two endpoints is the slowest class they cross: the node's intra-node link (NVLink
or PCIe), the inter-node network inside a zone, the inter-zone network inside a region, or the
inter-region WAN; a `zone_pairs` entry of the instance overrides the class for that pair.

All-reduce of n bytes held by each of k members:
- ring (Patarasuk and Yuan, JPDC 2009): 2 (k-1)/k n / B_min + 2 (k-1) alpha_max, where the ring
  visits members sorted by (region, zone, node) so it crosses each slow boundary as few times as
  possible, and the slowest link on that ring (B_min) bounds it;
- hierarchical: reduce-scatter and all-gather inside each node, ring all-reduce of n bytes between
  node leaders; option `allreduce` = ring | hierarchical | best (default best: the faster).

Floor (`allreduce_floor_s`, what the planner's bounds read when placement is not known): the ring
time grows with its members, its bytes-per-second term with 1 / B_min and its latency term with
alpha_max. Members on one node ring over that node's link. Members on L >= 2 nodes: the flat ring
has an edge that crosses nodes (B_min <= that link's bandwidth, alpha_max >= its latency) and, with
more members than nodes, two members side by side on one node (`ring_order` keeps a node's members
together), so B_min is also at most the fastest intra-node link of a node holding two; the
hierarchical one costs its slowest ring inside a node plus its ring between the L >= 2 leaders,
over such links. So the flat ring takes at least the ring over all k members at that B_min and the
least crossing latency, and the hierarchical one at least the least over the ways to put the k
members on L nodes, L from max(2, L_min) (L_min: the fewest nodes that hold them), of the slowest
inside ring (each node's own link) plus the ring over L leaders at the fastest crossing link
(`_hierarchical_floor_s`).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from itertools import groupby

from hetplan.catalog import LinkSpec
from hetplan.errors import EstimatorError
from hetplan.estimators.base import Endpoint, fastest_link, least_nodes, spans_pair
from hetplan.instance import Instance, Network


def ring_allreduce_time_s(nbytes: float, members: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Ring all-reduce of nbytes per member: 2 (k-1)/k x bytes at the slowest bandwidth, 2 (k-1) latencies."""
    if members <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (members - 1) / members * nbytes / bandwidth_Bps + 2 * (members - 1) * latency_s


def _hierarchical_floor_s(members: int, nodes: list[tuple[Endpoint, int]], least: int, cross: tuple[float, float],
                          sizes: list[float]) -> list[float]:
    """Per n of `sizes`: a floor on the hierarchical all-reduce of `members` endpoints on L >= `least`
    of `nodes` (endpoint, slots): the slowest ring inside a node, plus the ring over the L leaders,
    each edge crossing nodes at `cross` (bandwidth B/s, latency s) at best (module docstring). A node
    whose inside ring may take tau holds at most cap(tau) members (ring time grows with them), so an
    inside time of tau needs L(tau) nodes or more, the fewest whose caps, largest first, reach
    `members`; the floor is the least over the candidate taus (0, and each ring a node's link and
    slots allow) of tau + the leaders' ring over max(least, L(tau)) nodes. Exact over the nodes'
    own links: the fastest link of any node with the slots (the floor before) read a 150 GB/s V100
    node for a 2 + 2 ring whose A10G node has 16 GB/s (helper-13, seed 29's tied ring); inf where
    no placement exists."""
    kinds: dict = {}  # (slots, intra-node link) -> nodes alike
    for e, slots in nodes:
        link = None if e.intra_node is None else (e.intra_node.bandwidth_GBps * 1e9, e.intra_node.latency_s)
        kinds[slots, link] = kinds.get((slots, link), 0) + 1
    most = min(members, len(nodes))
    out = []
    for n in sizes:
        if n <= 0:
            out.append(0.0)
            continue
        # per kind, its inside ring of 1..slots members (inf where a link is not known)
        times = {(slots, link): [0.0] + [math.inf if link is None else ring_allreduce_time_s(n, k, *link)
                                         for k in range(2, slots + 1)] for slots, link in kinds}
        best = math.inf
        for tau in sorted({t for ts in times.values() for t in ts if t < math.inf}):
            if tau >= best:
                break
            used = _fewest_nodes([(bisect_right(ts, tau), kinds[kind]) for kind, ts in times.items()], members)
            if used is not None and max(least, used) <= most:
                best = min(best, tau + ring_allreduce_time_s(n, max(least, used), *cross))
        out.append(best)
    return out


def _fewest_nodes(caps: list[tuple[int, int]], members: int) -> int | None:
    """The fewest nodes whose (members each holds, nodes alike) reach `members`; None if all cannot."""
    held = used = 0
    for cap, count in sorted(caps, reverse=True):
        take = min(count, -(-(members - held) // cap))
        held, used = held + take * cap, used + take
        if held >= members:
            return used
    return None


def _shared_node_bandwidth_Bps(nodes: list[tuple[Endpoint, int]], members: int, cross_Bps: float) -> float:
    """The most B_min of a flat ring of `members` over two or more of `nodes` can be, given it crosses
    nodes at `cross_Bps` at best: with more members than nodes some node holds two, side by side
    on the ring, so an edge runs on that node's link, at most the fastest of a node with two slots
    (helper-13's seed 194: four A10G replicas on two 16 GB/s PCIe nodes were floored at the 44.9 GB/s
    network; the planner's gap there 32.64 -> 5.60 %, /tmp/s65/ab.py)."""
    if members <= len(nodes):
        return cross_Bps
    inside = [e.intra_node for e, slots in nodes if slots >= 2]
    if not inside or any(link is None for link in inside):
        return cross_Bps
    return min(cross_Bps, max(link.bandwidth_GBps for link in inside) * 1e9)


def ring_order(members: list[Endpoint]) -> list[Endpoint]:
    return sorted(members, key=lambda e: (e.region, e.zone, e.node_id or ""))


class AlphaBetaComm:
    name = "alpha_beta"
    OPTIONS: tuple[str, ...] = ("allreduce",)  # the estimators.options keys it reads

    def __init__(self, network: Network, allreduce: str = "best"):
        if allreduce not in ("ring", "hierarchical", "best"):
            raise EstimatorError(f"estimators.options.allreduce: must be ring, hierarchical or best, not {allreduce!r}")
        self.network, self.allreduce = network, allreduce
        self._pairs = {frozenset(p.zones): LinkSpec(kind="other", bandwidth_GBps=p.bandwidth_GBps,
                                                    latency_s=p.latency_s) for p in network.zone_pairs}

    @classmethod
    def from_instance(cls, instance: Instance, options: dict) -> "AlphaBetaComm":
        return cls(instance.cluster.network, options.get("allreduce", "best"))

    def link(self, a: Endpoint, b: Endpoint) -> LinkSpec:
        if a.node_id is not None and a.node_id == b.node_id:
            if a.intra_node is None:
                raise ValueError(f"endpoint on node {a.node_id} has no intra-node link")
            return a.intra_node
        if a.zone == b.zone:
            return self.network.inter_node
        override = self._pairs.get(frozenset((a.zone, b.zone)))
        if override is not None:
            return override
        return self.network.inter_zone if a.region == b.region else self.network.inter_region

    def p2p_time_s(self, a: Endpoint, b: Endpoint, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        link = self.link(a, b)
        return link.latency_s + nbytes / (link.bandwidth_GBps * 1e9)

    def _ring_params(self, members: list[Endpoint]) -> tuple[int, float, float] | None:
        """(members, slowest bandwidth B/s, largest latency) of the ring over `members` in
        `ring_order`; None for k <= 1."""
        k = len(members)
        if k <= 1:
            return None
        ring = ring_order(members)
        links = [self.link(ring[i], ring[(i + 1) % k]) for i in range(k)]
        return k, min(link.bandwidth_GBps for link in links) * 1e9, max(link.latency_s for link in links)

    def allreduce_times_s(self, members: list[Endpoint], sizes: list[float]) -> list[float]:
        """The all-reduce of each of `sizes` bytes over the same members (rings read once): the ring,
        the hierarchical one (a ring inside every node, then one between node leaders: reduce-scatter
        + all-gather inside nodes cost one intra-node all-reduce in total) or the faster of both."""
        def ring_s(params, nbytes: float) -> float:
            return 0.0 if params is None or nbytes <= 0 else ring_allreduce_time_s(nbytes, *params)

        flat = self._ring_params(members)
        if self.allreduce == "ring":
            return [ring_s(flat, n) for n in sizes]
        by_node = [list(g) for _, g in groupby(ring_order(members), key=lambda e: (e.region, e.zone, e.node_id))]
        inside = {self._ring_params(g) for g in by_node}  # nodes alike give one ring
        leaders = self._ring_params([g[0] for g in by_node])
        out = []
        for n in sizes:
            hier = max((ring_s(p, n) for p in inside), default=0.0) + ring_s(leaders, n)
            out.append(hier if self.allreduce == "hierarchical" else min(ring_s(flat, n), hier))
        return out

    def allreduce_time_s(self, members: list[Endpoint], nbytes: float) -> float:
        if len(members) <= 1 or nbytes <= 0:
            return 0.0  # before any link is read
        return self.allreduce_times_s(members, [nbytes])[0]

    def allreduce_floor_s(self, nodes: list[tuple[Endpoint, int]], members: int, sizes: list[float],
                          spans: str = "node", min_nodes: int = 1) -> list[float]:
        """A lower bound on `allreduce_time_s(M, n)` for each n of `sizes`, over every list M of
        `members` endpoints drawn from `nodes` (a node's endpoint, the most members it holds) that
        spans as `spans` says (estimators.base.SPANS) and sits on at least `min_nodes` nodes (module
        docstring); inf where no such M exists."""
        if members <= 1:
            return [0.0] * len(sizes)
        rings = []  # (ring members, bandwidth B/s, latency s): each a lower bound of one placement kind
        hierarchical = [math.inf] * len(sizes)  # on two nodes or more (`_hierarchical_floor_s`)
        if spans == "node" and min_nodes <= 1:
            rings += [(members, e.intra_node.bandwidth_GBps * 1e9, e.intra_node.latency_s)
                      for e, slots in nodes if slots >= members and e.intra_node is not None]
        spread = least_nodes([slots for _, slots in nodes], members)
        if spread is not None and len(nodes) >= 2:
            by_zone = {}  # links between different nodes depend on the zones alone
            for e, _ in nodes:
                by_zone.setdefault(e.zone, []).append(e)
            links = [self.link(a[0], b[-1]) for a in by_zone.values() for b in by_zone.values()
                     if (a is not b or len(a) >= 2) and spans_pair(spans, a[0], b[-1])]
            if links:
                fast = fastest_link(links)
                cross = (fast.bandwidth_GBps * 1e9, fast.latency_s)
                if self.allreduce != "hierarchical":
                    rings.append((members, _shared_node_bandwidth_Bps(nodes, members, cross[0]), cross[1]))
                if self.allreduce != "ring":
                    least = max(2, spread, min(min_nodes, members))
                    hierarchical = _hierarchical_floor_s(members, nodes, least, cross, sizes)
        return [min([ring_allreduce_time_s(n, *r) for r in rings] + [h], default=math.inf)
                for n, h in zip(sizes, hierarchical)]
