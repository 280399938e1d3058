"""Communication estimator from Sailor's fitted bandwidth polynomials, name "sailor_poly".

Sailor (seed 000, sec. 4.1 "Cluster profiling") measures bandwidth between every pair of node types
over message sizes and fits bandwidth_GBps(x) = c0 x^2 + c1 x + c2, x = log2(bytes / 1e6), capped by
the largest measured bytes/s (hetplan.profiles.BandwidthFit, with its guards outside the fitted range).

Which fit a pair of endpoints uses:
* same node (equal, non-None node ids): intra_node_bandwidths.json at (GPU type, GPUs in the
  collective: 2 for a send, the members on that node for an all-reduce, rounded down to a count in the
  file); without that file or entry, the endpoint's own intra-node LinkSpec (constant bandwidth).
* different nodes: the zone table multizone_bandwidths_het.json at (src zone, src GPU, src count,
  dst zone, dst GPU, dst count). The count is the node's GPUs per VM (GCP scales a VM's network
  bandwidth with its size), rounded down to the largest count the file has for that GPU
  (1/2/4: a 3-GPU VM uses the 2-GPU fit, an 8-GPU VM the 4-GPU fit); option `gpus_per_endpoint`
  overrides it. A pair the table lacks falls back to network_coeffs_all_homo.json "inter" for the
  source GPU when both sit in one zone and that file is given, else raises EstimatorError.
* GPU type and GPUs per node of an endpoint come from the instance's node with that id; an endpoint
  with no node id uses option `gpu_type` and count 1 (or `gpus_per_endpoint`).

Times (alpha-beta with a size-dependent beta):
  p2p(a, b, n)          = latency(a, b) + n / bw_ab(n)
  allreduce(members, n) = 2 (k - 1) / k * n / min_ring_link bw(n) + 2 (k - 1) * max_ring_link latency
over the ring members[0] -> members[1] -> ... -> members[0] (k members; 0 for k <= 1). The fits were
made with NCCL collectives on whole buffers, so every link's bandwidth is read at the full size n.
Latency per link class (intra_node, inter_node, inter_zone, inter_region) comes from the instance's
network section (the endpoint's own intra_node link for same-node pairs), 0 when built without one.
`link(a, b)` returns the class's kind and latency with the fit's peak bandwidth.

Floor (`allreduce_floor_s`): the ring's k members are the plan's replicas, so only B_min and the
latency are unknown before placement. Members on one node ring over that node's intra-node fit;
members on several nodes have a ring edge between two of them, so B_min is at most the fastest such
pair's fit at n and the latency at least the least of those pairs'.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from hetplan.catalog import LinkSpec
from hetplan.errors import EstimatorError
from hetplan.estimators.base import Endpoint, least_nodes, spans_pair
from hetplan.estimators.network import ring_allreduce_time_s
from hetplan.estimators.profile_time import own_options
from hetplan.profiles import BandwidthFit

ZoneKey = tuple[str, str, int, str, str, int]
_CLASSES = ("intra_node", "inter_node", "inter_zone", "inter_region")


class SailorNetworkComm:
    """CommEstimator over Sailor's bandwidth fits (see the module docstring)."""

    name = "sailor_poly"
    # the estimators.options keys it reads
    OPTIONS: tuple[str, ...] = ("bandwidth_file", "intra_node_file", "homo_file", "gpu_type", "gpus_per_endpoint")

    def __init__(self, zone_fits: Mapping[ZoneKey, BandwidthFit],
                 intra_fits: Mapping[tuple[str, int], BandwidthFit] | None = None,
                 homo_fits: Mapping[tuple[str, str, int], BandwidthFit] | None = None,
                 nodes: Mapping[str, tuple[str, int]] | None = None, default_gpu_type: str | None = None,
                 gpus_per_endpoint: int | None = None, latency_s: Mapping[str, float] | None = None):
        if not zone_fits:
            raise EstimatorError("sailor_poly: the zone bandwidth table is empty")
        self.zone_fits = dict(zone_fits)
        self.intra_fits = dict(intra_fits or {})
        self.homo_fits = dict(homo_fits or {})
        self.nodes = dict(nodes or {})  # node id -> (GPU type, GPUs per node)
        self.default_gpu_type = default_gpu_type
        self.gpus_per_endpoint = gpus_per_endpoint
        unknown = sorted(set(latency_s or {}) - set(_CLASSES))
        if unknown:
            raise EstimatorError(f"sailor_poly: unknown latency classes {unknown}; known: {list(_CLASSES)}")
        self.latency_s = {c: 0.0 for c in _CLASSES} | dict(latency_s or {})
        self._zone_counts: dict[str, list[int]] = {}
        for (_, gpu, count, _, dst_gpu, dst_count) in self.zone_fits:
            self._zone_counts.setdefault(gpu, []).append(count)
            self._zone_counts.setdefault(dst_gpu, []).append(dst_count)
        self._zone_counts = {g: sorted(set(c)) for g, c in self._zone_counts.items()}

    @classmethod
    def from_instance(cls, instance: Any, options: Mapping[str, Any] | None = None) -> "SailorNetworkComm":
        """options (flat, or nested under "sailor_poly"): bandwidth_file (required: a
        multizone_bandwidths*.json), intra_node_file, homo_file (network_coeffs_all_homo.json),
        gpu_type (for endpoints without a node id), gpus_per_endpoint. Paths are relative to the
        instance file."""
        from hetplan.importers.sailor import (read_homo_network_coeffs, read_intra_node_bandwidths,
                                              read_zone_bandwidths, zone_table_gap)

        opts = own_options(options, cls.name)
        if not opts.get("bandwidth_file"):
            raise EstimatorError("sailor_poly: option 'bandwidth_file' (Sailor's multizone_bandwidths_het.json) "
                                 "is required")
        path = instance.resolve_path
        net = instance.cluster.network
        zone_fits = read_zone_bandwidths(path(opts["bandwidth_file"]))
        homo_fits = read_homo_network_coeffs(path(opts["homo_file"])) if opts.get("homo_file") else {}
        homo_gpus = {gpu for kind, gpu, _ in homo_fits if kind == "inter"}  # same-zone fallback
        groups = {(n.gpu_type, n.zone) for n in instance.nodes if n.gpu_type not in homo_gpus}
        if why := zone_table_gap(zone_fits, groups, opts["bandwidth_file"]):
            raise EstimatorError(f"sailor_poly: {why}")  # else the planner silently keeps such GPUs to one node
        return cls(
            zone_fits=zone_fits,
            intra_fits=read_intra_node_bandwidths(path(opts["intra_node_file"])) if opts.get("intra_node_file") else None,
            homo_fits=homo_fits,
            nodes={n.node_id: (n.gpu_type, n.num_gpus) for n in instance.nodes},
            default_gpu_type=opts.get("gpu_type"), gpus_per_endpoint=opts.get("gpus_per_endpoint"),
            latency_s={"inter_node": net.inter_node.latency_s, "inter_zone": net.inter_zone.latency_s,
                       "inter_region": net.inter_region.latency_s},
        )

    # ---- endpoint facts -------------------------------------------------------------------------
    def _gpu_and_count(self, e: Endpoint) -> tuple[str, int]:
        if e.node_id is not None and e.node_id in self.nodes:
            gpu, count = self.nodes[e.node_id]
        elif self.default_gpu_type is not None:
            gpu, count = self.default_gpu_type, 1
        else:
            raise EstimatorError(f"sailor_poly: cannot tell the GPU type of endpoint {e} (node id not in the "
                                 f"instance; set option 'gpu_type')")
        return gpu, self.gpus_per_endpoint or count

    @staticmethod
    def _same_node(a: Endpoint, b: Endpoint) -> bool:
        return a.node_id is not None and a.node_id == b.node_id

    @staticmethod
    def _link_class(a: Endpoint, b: Endpoint) -> str:
        if SailorNetworkComm._same_node(a, b):
            return "intra_node"
        if a.zone == b.zone:
            return "inter_node"
        return "inter_zone" if a.region == b.region else "inter_region"

    def _latency(self, a: Endpoint, b: Endpoint) -> float:
        cls = self._link_class(a, b)
        if cls == "intra_node" and a.intra_node is not None:
            return a.intra_node.latency_s
        return self.latency_s[cls]

    @staticmethod
    def _round_down(count: int, available: list[int]) -> int:
        fitting = [c for c in available if c <= count]
        return fitting[-1] if fitting else available[0]

    # ---- fits -----------------------------------------------------------------------------------
    def fit(self, a: Endpoint, b: Endpoint, intra_count: int = 2) -> BandwidthFit | None:
        """The fit for a -> b; None for a same-node pair with no intra-node fit (use the LinkSpec)."""
        if self._same_node(a, b):
            gpu, _ = self._gpu_and_count(a)
            counts = sorted(c for g, c in self.intra_fits if g == gpu)
            if not counts:
                return None
            return self.intra_fits[(gpu, self._round_down(max(intra_count, 2), counts))]
        (sg, sc), (dg, dc) = self._gpu_and_count(a), self._gpu_and_count(b)
        if sg in self._zone_counts and dg in self._zone_counts:
            key = (a.zone, sg, self._round_down(sc, self._zone_counts[sg]),
                   b.zone, dg, self._round_down(dc, self._zone_counts[dg]))
            if key in self.zone_fits:
                return self.zone_fits[key]
        else:
            key = (a.zone, sg, sc, b.zone, dg, dc)
        if a.zone == b.zone:
            counts = sorted(c for k, g, c in self.homo_fits if k == "inter" and g == sg)
            if counts:
                return self.homo_fits[("inter", sg, self._round_down(sc, counts))]
        zones = sorted({k[3] for k in self.zone_fits if k[0] == a.zone and k[1] == sg})
        raise EstimatorError(f"sailor_poly: no bandwidth fit for (src zone, src GPU, count, dst zone, dst GPU, "
                             f"count) = {key}; from {a.zone}/{sg} the table reaches zones {zones}; GPU types in "
                             f"the table: {sorted(self._zone_counts)}")

    def bandwidth_Bps(self, a: Endpoint, b: Endpoint, nbytes: float, intra_count: int = 2) -> float:
        fit = self.fit(a, b, intra_count)
        if fit is None:
            return self._intra_link(a).bandwidth_GBps * 1e9
        return fit.bandwidth_Bps(nbytes)

    def _intra_link(self, a: Endpoint) -> LinkSpec:
        if a.intra_node is None:
            raise EstimatorError(f"sailor_poly: no intra-node fit or link for endpoint {a}; give the "
                                 f"'intra_node_file' option or the endpoint's intra_node link")
        return a.intra_node

    # ---- CommEstimator --------------------------------------------------------------------------
    def link(self, a: Endpoint, b: Endpoint) -> LinkSpec:
        cls = self._link_class(a, b)
        fit = self.fit(a, b)
        if fit is None:
            return self._intra_link(a)
        kind = {"intra_node": a.intra_node.kind if a.intra_node else "other", "inter_node": "ethernet",
                "inter_zone": "ethernet", "inter_region": "wan"}[cls]
        return LinkSpec(kind=kind, bandwidth_GBps=fit.peak_Bps / 1e9, latency_s=self._latency(a, b))

    def p2p_time_s(self, a: Endpoint, b: Endpoint, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self._latency(a, b) + nbytes / self.bandwidth_Bps(a, b, nbytes)

    def allreduce_times_s(self, members: list[Endpoint], sizes: list[float]) -> list[float]:
        """The all-reduce of each of `sizes` bytes over the same members (see the module docstring):
        every ring link's fit is looked up once, and per size only the distinct fits are read."""
        k = len(members)
        if k <= 1:
            return [0.0] * len(sizes)
        per_node: dict[str, int] = {}
        for m in members:
            if m.node_id is not None:
                per_node[m.node_id] = per_node.get(m.node_id, 0) + 1
        ring = [(members[i], members[(i + 1) % k]) for i in range(k)]
        fits, fixed = {}, math.inf  # distinct fits on the ring; the least constant bandwidth
        for a, b in ring:
            fit = self.fit(a, b, per_node.get(a.node_id, 2))
            if fit is None:
                fixed = min(fixed, self._intra_link(a).bandwidth_GBps * 1e9)
            else:
                fits[id(fit)] = fit
        latency = max(self._latency(a, b) for a, b in ring)
        return [0.0 if n <= 0 else ring_allreduce_time_s(
            n, k, min([fixed] + [f.bandwidth_Bps(n) for f in fits.values()]), latency) for n in sizes]

    def allreduce_time_s(self, members: list[Endpoint], nbytes: float) -> float:
        if len(members) <= 1 or nbytes <= 0:
            return 0.0  # before any fit is looked up: a pair the table lacks does not matter here
        return self.allreduce_times_s(members, [nbytes])[0]

    def allreduce_floor_s(self, nodes: list[tuple[Endpoint, int]], members: int, sizes: list[float],
                          spans: str = "node", min_nodes: int = 1) -> list[float]:
        """The contract of `network.AlphaBetaComm.allreduce_floor_s`, for the fitted links (module
        docstring)."""
        if members <= 1:
            return [0.0] * len(sizes)
        kinds: dict = {}  # nodes alike (zone, GPU type, GPUs) have the same fits: one pair per kind pair
        for e, slots in nodes:
            key = (e.region, e.zone, self._gpu_and_count(e))
            kinds.setdefault(key, []).append((e, slots))
        pairs = []  # (fit or None, latency, endpoint for the constant intra-node link)
        if spans == "node" and min_nodes <= 1:
            for same in kinds.values():
                e, slots = max(same, key=lambda item: item[1])
                if slots >= members:
                    pairs.append((self.fit(e, e, members), self._latency(e, e), e))
        if least_nodes([slots for _, slots in nodes], members) is not None and len(nodes) >= 2:
            for ka in kinds.values():
                for kb in kinds.values():
                    a, b = ka[0][0], kb[-1][0]
                    if a.node_id == b.node_id or not spans_pair(spans, a, b):
                        continue
                    try:
                        pairs.append((self.fit(a, b), self._latency(a, b), a))
                    except EstimatorError:  # a pair the table lacks: no plan can use it either
                        continue
        if not pairs:
            return [math.inf] * len(sizes)
        out = []
        for n in sizes:
            best = min(ring_allreduce_time_s(n, members, self._intra_link(e).bandwidth_GBps * 1e9 if fit is None
                                             else fit.bandwidth_Bps(n), lat) for fit, lat, e in pairs)
            out.append(0.0 if n <= 0 else best)
        return out
