"""The planner's estimator tables and one outer choice's `JointInputs`: per pool and layer unit the step,
update, memory and send figures, and the communication estimator's all-reduce floors over the
placements first fit may make (`with_sync_table`, `tied_floors_s`), so that the model stays a
relaxation of the simulator (formulations/joint/milp.py)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple


from hetplan.catalog import LinkSpec
from hetplan.errors import EstimatorError
from hetplan.estimators import EstimatorSet
from hetplan.estimators.base import fastest_link, spans_pair
from hetplan.estimators.model_stats import boundary_activation_bytes, gradient_bytes, sync_volume_factor
from hetplan.formulations import joint
from hetplan.instance import Instance
from hetplan.plan import placement_order
from hetplan.formulations.stage_cost import StageCosts, node_endpoint
from hetplan.orchestration.planner.options import Combo, PlannerOptions, TP_CHOICES


FIRST_PLACED = ("first", "only")  # `joint.position`s of stage 0, which first fit places before the others


class _NodeSet(tuple):
    """(node endpoint, slots) pairs, hashed once: they key the floor caches, and hashing hundreds of
    endpoints at every lookup took 1.2 of the 1.7 s `floor_s` spent on Sailor's OPT-350M over 2 zones
    x 128 A100 + 128 V100 (30 s search)."""

    def __hash__(self) -> int:
        if "_hash" not in self.__dict__:
            self.__dict__["_hash"] = tuple.__hash__(self)
        return self.__dict__["_hash"]

    def __reduce__(self):  # the hash is not carried: another process may hash strings differently
        return (_NodeSet, (tuple(self),))


def _by_size(cache: dict, sizes: list[float], compute) -> list[float]:
    """Per size its figure from `cache` (bytes -> seconds), `compute` asked once for those missing."""
    missing = [n for n in dict.fromkeys(sizes) if n not in cache]
    if missing:
        cache.update(zip(missing, compute(missing)))
    return [cache[n] for n in sizes]


class _Tables:
    """Estimator figures per (gpu type, tp, b) and per layer unit, computed once and reused."""

    def __init__(self, instance: Instance, est: EstimatorSet):
        self.inst, self.est = instance, est
        self.costs = StageCosts(instance, est)  # the simulator's stage evaluation: the rows below read it
        # Sailor's composition (simulator/sailor.py) reads llm_info's sizes, not the architecture's
        self.sailor = est.iteration == "sailor"
        self.info = est.memory.info if self.sailor else None
        self.arch = instance.model_arch
        self.U = self.arch.num_units
        # the MILP's egress prices, inside one region and across two (the same for every outer choice)
        self.egress_floors = tuple(egress_floor_usd_per_GB(instance, across) for across in (False, True))
        self._step: dict = {}
        self._tp_links: dict = {}  # tp_link: (gpu type, zone, TP) -> link
        self._upd: dict = {}
        self._mem: dict = {}
        self._sync: dict = {}  # floor_s: (nodes, members, spans, min_nodes) -> bytes -> seconds
        # repeat_floor_s: (pools, region, zone, gpu type, members) -> (the region's nodes, one node of
        # the group, bytes -> seconds), None where the group has no node
        self._repeat: dict = {}
        self._node_sets: dict = {}
        self._order: dict | None = None  # placed_group: (gpu type, zone) -> nodes in placement order
        self._node_sizes: dict = {}  # (zone, gpu type) -> GPUs per node, largest first
        self._least_nodes: dict = {}  # `_least_nodes` answers
        self._tied: dict = {}  # tied_floors_s: (pools, D, bytes) -> floors
        self._links: dict = {}
        self._sends: dict = {}  # send_floor_s: (gpu type, zone, tp, b, away, receiving) -> seconds
        self._groups: dict | None = None  # _node_groups
        self.sync_tables: dict = {}  # with_sync_table: (D, pools, P) -> tables
        self.sync_entries: dict = {}  # with_sync_table: (D, pools) -> the entries of every depth so far
        self._rows: dict = {}  # pool_rows: (b, D, TP choices, quotas) -> rows shared by every P
        self._grad: tuple[float, ...] | None = None
        self._stage_grad: dict = {}  # stage_grad_bytes: P -> bytes per (position, blocks)

    @property
    def grad_bytes(self) -> tuple[float, ...]:
        """Gradient bytes of every layer unit (all TP shards)."""
        if self._grad is None:
            if self.sailor:  # Sailor all-reduces and prices the full parameter bytes
                self._grad = tuple(self.info.param_bytes(range(l, l + 1)) for l in range(self.U))
            else:
                prec = self.inst.workload.precision
                self._grad = tuple(gradient_bytes(self.arch, range(l, l + 1), prec) for l in range(self.U))
        return self._grad

    @property
    def sync_factor(self) -> float:
        """All-reduce bytes per gradient byte (ZeRO-3: 1.5); Sailor's composition counts 1."""
        return 1.0 if self.sailor else sync_volume_factor(self.inst.workload.zero_stage)

    @property
    def tied_bytes(self) -> float:
        """Bytes of the tied embedding's all-reduce; Sailor's composition has none."""
        return 0.0 if self.sailor else self.costs.tied_bytes

    def boundary_bytes(self, b: int) -> float:
        """The activation bytes of one microbatch over a boundary; for Sailor's composition the least a
        stage can send (llm_info's unit outputs; a stage ends on a block or the embedding)."""
        if self.sailor:
            return min(self.info.output_bytes(u, b) for u in range(self.U - 1))
        return boundary_activation_bytes(self.arch, b, self.inst.workload.precision)

    def pool_rows(self, quotas: dict, tp_choices: tuple[int, ...], b: int, D: int) -> tuple | None:
        """(pools, step, upd, stat, act, cap, fixed update, send floor, send floors away, receive floor,
        shared cache) of
        the outer choices with microbatch b and D replicas per stage (P changes none of them: the
        choices of every depth share these tuples); None when no pool can hold even one unit. A pool
        that cannot hold its lightest unit on the last stage (1 microbatch in flight) is useless and
        left out."""
        ordered = tuple(sorted(quotas.items()))
        key = (b, D, tuple(tp_choices), ordered)
        if key not in self._rows:
            rows: tuple[list, ...] = ([], [], [], [], [], [], [], [], [], [])
            for (g, z), (avail, per_node, price, region) in ordered:
                for t in sorted(tp_choices):  # a group's pools by ascending TP, as `joint.Pool` says
                    if not self.usable(g, t, b, per_node, avail):
                        continue
                    s_b, a_b, c_b = self.mem(g, t, b, D)
                    if min(s + a for s, a in zip(s_b, a_b)) > c_b:
                        continue
                    upd, fixed, send, away, recv = self.upd(g, t, D), 0.0, 0.0, (0.0, 0.0), 0.0
                    if self.sailor:  # the profile's whole-model step, taken by every stage as is
                        upd, fixed = (0.0,) * self.U, self.est.time.update_at_s(g, b, t)
                        send, recv = self.send_floor_s(g, z, t, b), _finite(self.send_floor_s(g, z, t, b, receiving=True))
                        away = tuple(_finite(self.send_floor_s(g, z, t, b, kind)) for kind in ("zone", "region"))
                    pool = joint.Pool(g, z, region, t, avail, price, node_gpus=max(self.node_sizes(z, g), default=None),
                                      first_node_gpus=getattr(self.first_node(g, z, t), "num_gpus", None))
                    for row, value in zip(rows, (pool, self.step(g, z, t, b),
                                                 upd, s_b, a_b, c_b, fixed, send, away, recv)):
                        row.append(value)
            if not self.sailor:  # JointInputs.upd_fixed_s, send_floor_s, send_away_s, recv_floor_s stay empty
                for row in rows[6:]:
                    row.clear()
            # the last entry: `JointInputs.shared`, one cache for every choice built from these rows
            self._rows[key] = (*(tuple(row) for row in rows), {}) if rows[0] else None
        return self._rows[key]

    def stage_grad_bytes(self, inp: joint.JointInputs) -> dict[tuple[str, int], float]:
        """(stage position, blocks) -> gradient bytes of such a stage, for every position and block
        count of P stages (blocks form; the same for every choice of that depth)."""
        if inp.P not in self._stage_grad:
            stages = sorted({0, min(1, inp.P - 1), inp.P - 1})  # one stage of each position
            grad = [0.0]
            for g in inp.grad_bytes:  # prefix sums: a stage's units are one contiguous range
                grad.append(grad[-1] + g)
            self._stage_grad[inp.P] = {(joint.position(inp, i), n): grad[u.stop] - grad[u.start] for i in stages
                                       for n in joint.block_counts(inp, i) for u in [joint.stage_units(inp, i, n)]}
        return self._stage_grad[inp.P]

    def usable(self, g: str, t: int, b: int, per_node: int, avail: int) -> bool:
        """Whether TP t on g's nodes of per_node GPUs (avail of them) can run microbatch b: t divides
        the node, and the time estimator prices (b, t) (Sailor's profiles have some (b, TP) only; an
        estimator without `covers` prices every one)."""
        if t > per_node or per_node % t or t > avail:
            return False
        covers = getattr(self.est.time, "covers", None)
        return covers is None or covers(g, b, t)

    def step(self, g: str, z: str, t: int, b: int) -> tuple[float, ...]:
        """Per layer unit, fwd + bwd seconds of a TP-t replica of type g in zone z with share b: its TP
        all-reduces at the fastest link of the zone's g nodes that hold t GPUs (`tp_link`), at most
        what the replica takes on any of them."""
        link = self.tp_link(g, z, t)
        key = (g, t, b, None if link is None else (link.bandwidth_GBps, link.latency_s))
        if key not in self._step:
            self._step[key] = tuple(sum(self.costs.replica_times(g, t, range(l, l + 1), b, link))
                                    for l in range(self.U))
        return self._step[key]

    def tp_link(self, g: str, z: str, t: int) -> LinkSpec | None:
        """The fastest intra-node link (`fastest_link`) of the nodes of type g in zone z with t GPUs or
        more (where a TP-t replica of the pool can sit); None for t = 1 (no all-reduce) or no node."""
        key = (g, z, t)
        if key not in self._tp_links:
            links = [n.intra_node for n in self.placed_group(g, z) if n.num_gpus >= t]
            self._tp_links[key] = fastest_link(links) if t > 1 and links else None
        return self._tp_links[key]

    def upd(self, g: str, t: int, D: int) -> tuple[float, ...]:
        key = (g, t, D)
        if key not in self._upd:
            self._upd[key] = tuple(self.est.time.update_time_s(g, range(l, l + 1), t, D) for l in range(self.U))
        return self._upd[key]

    def floor_s(self, nodes: tuple, members: int, sizes: list[float], spans: str = "node",
                min_nodes: int = 1) -> list[float]:
        """The communication estimator's lower bound on an all-reduce of each of `sizes` bytes over
        `members` endpoints drawn from `nodes` ((endpoint, slots), `_nodes`), for every placement
        (`allreduce_floor_s`; inf where no placement exists; 0 for an estimator that has none: a
        valid, weak floor)."""
        floor = getattr(self.est.comm, "allreduce_floor_s", None)
        if members <= 1:
            return [0.0] * len(sizes)
        if floor is None or not nodes:
            return [0.0 if floor is None else math.inf] * len(sizes)
        return _by_size(self._sync.setdefault((nodes, members, spans, min_nodes), {}), sizes,
                        lambda missing: floor(list(nodes), members, missing, spans, min_nodes))

    def repeat_floor_s(self, pools: tuple, pool: joint.Pool, members: int, sizes: list[float]) -> list[float] | None:
        """The communication estimator's lower bound on an all-reduce of each of `sizes` bytes over
        `members` endpoints of the nodes of `pools` in `pool`'s region, two or more of them on nodes
        of `pool`'s (zone, GPU type) (`repeat_floor_s`); None for an estimator without one."""
        floor = getattr(self.est.comm, "repeat_floor_s", None)
        if floor is None:
            return None
        if members <= 1:
            return [0.0] * len(sizes)
        key = (pools, pool.region, pool.zone, pool.gpu_type, members)
        if key not in self._repeat:
            like = next((e for e, _ in self.nodes(pools, zone=pool.zone, gpu_type=pool.gpu_type)), None)
            self._repeat[key] = None if like is None else (self.nodes(pools, region=pool.region), like, {})
        if self._repeat[key] is None:  # no node of the group: no such stage, any floor holds
            return [0.0] * len(sizes)
        nodes, like, cache = self._repeat[key]
        return _by_size(cache, sizes, lambda missing: floor(list(nodes), like, members, missing))

    def placed_group(self, g: str, z: str) -> list:
        """The nodes of type g in zone z in the order first fit tries them (`hetplan.plan.placement_order`)."""
        if self._order is None:
            self._order = {}
            for n in placement_order(self.inst.nodes):
                self._order.setdefault((n.gpu_type, n.zone), []).append(n)
        return self._order.get((g, z), [])

    def first_node(self, g: str, z: str, t: int):
        """The node of type g in zone z that first fit gives a TP-t replica when they are all empty:
        the first of `placed_group` with t GPUs or more (None: none has)."""
        return next((n for n in self.placed_group(g, z) if n.num_gpus >= t), None)

    def node_sizes(self, zone: str | None, gpu_type: str | None) -> list[int]:
        """GPUs per node of `zone` and `gpu_type` (None: any), largest first."""
        key = (zone, gpu_type)
        if key not in self._node_sizes:
            self._node_sizes[key] = sorted((n.num_gpus for n in self.inst.nodes
                                            if zone in (None, n.zone) and gpu_type in (None, n.gpu_type)), reverse=True)
        return self._node_sizes[key]

    def nodes(self, pools: tuple, zone: str | None = None, region: str | None = None,
              gpu_type: str | None = None, least_tp: int = 1) -> tuple:
        """(node endpoint, the most replicas it holds) for the nodes of the pools' (type, zone)
        groups in `zone` / `region` / of `gpu_type` (None: any); a node holds num_gpus // (the least
        TP of its type's pools, or `least_tp` where larger), since every replica takes at least that
        many GPUs."""
        key = (pools, zone, region, gpu_type, least_tp)
        if key not in self._node_sets:
            least: dict = {}
            for p in pools:
                if (zone or p.zone) == p.zone and (region or p.region) == p.region and (gpu_type or p.gpu_type) == p.gpu_type:
                    least[p.gpu_type, p.zone] = min(least.get((p.gpu_type, p.zone), p.tp), p.tp)
            self._node_sets[key] = _NodeSet((node_endpoint(n), n.num_gpus // max(least_tp, least[n.gpu_type, n.zone]))
                                            for n in self.inst.nodes if (n.gpu_type, n.zone) in least)
        return self._node_sets[key]

    def effective_link(self, kind: str, b: int, zone: str | None = None) -> joint.LinkCost | None:
        """One microbatch's boundary transfer inside a zone ("node": between two nodes or two GPUs of
        one node; "inter": between two nodes anywhere), between two zones of a region ("zone") or two regions,
        timed by the communication estimator (the simulator's) between the fastest pair found: a
        lower bound on the transfer of every placement, exact at this message size (the time, not
        the link, is what the model reads: `JointInputs.p2p_s`); None when the cluster has no such
        pair. With `zone`, over the pairs of nodes of that zone only."""
        key = (kind, b, zone)
        if key not in self._links:
            here = lambda n: zone in (None, n.zone)  # noqa: E731
            times = [self._least_send_s(a, c, b) for a in self._group_firsts() if here(a) for c in self._receivers(a)
                     if here(c) and (c is not a if kind == "inter" else spans_pair(kind, a, c))]
            best = min([t for t in times if t < math.inf], default=None)
            self._links[key] = None if not best else joint.LinkCost(self.boundary_bytes(b) / best, 0.0)
        return self._links[key]

    def inter_in_zone(self, b: int) -> dict | None:
        """zone -> `effective_link("inter", b)` over the pairs of two nodes of that zone (None: no zone
        has two nodes). c_inter is the fastest such pair anywhere, at most c_zone and c_region
        (`composition._link_times_s`), which the network may make faster than a zone's own pairs.
        Measured (a random campaign, session 60, seed 478: two 1-GPU A100 nodes in r2-a at 12.5
        GB/s, a zone pair r1-a / r2-a at 60 GB/s): the boundary between the A100 nodes read the zone
        pair's 0.14 ms for 0.71 ms, and a min-cost search under a floor met six MILP plans the
        simulator refused."""
        links = {z: link for z in sorted({a.zone for a in self._group_firsts()})
                 if (link := self.effective_link("inter", b, z)) is not None}
        return links or None

    def send_floor_s(self, g: str, z: str, t: int, b: int, away: str | None = None,
                     receiving: bool = False) -> float:
        """(Sailor's composition) The least time of one send from a TP-t replica of g in zone z to any
        node (its own included) at any TP group size, of any unit output at microbatch b: a floor
        on every send a stage holding such a replica makes (`JointInputs.send_floor_s`). With `away`
        "zone" / "region", to nodes of another zone / region only (`JointInputs.send_away_s`; inf
        where there is none). `receiving`: of one send to such a replica from any node instead, a
        floor on every send such a stage receives (`JointInputs.recv_floor_s`)."""
        key = (g, z, t, b, away, receiving)
        if key not in self._sends:
            self._sends[key] = min((self._send_from_s(node, t, b, away, receiving) for node in self._group_firsts()
                                    if (node.gpu_type, node.zone) == (g, z)), default=math.inf)
        return self._sends[key]

    def _send_from_s(self, node, t: int, b: int, away: str | None, receiving: bool) -> float:
        """`send_floor_s` for a replica on `node` (or on a node alike)."""
        far = {None: lambda c: True, "zone": lambda c: c.zone != node.zone,
               "region": lambda c: c.region != node.region}[away]
        least = (lambda c: self._least_send_s(c, node, b, None, (t,))) if receiving else \
            (lambda c: self._least_send_s(node, c, b, (t,)))
        return min((least(c) for c in self._receivers(node) if far(c)), default=math.inf)

    def _node_groups(self) -> dict[tuple, list]:
        """Nodes alike to the estimator but for their id: of one GPU type, zone, size and intra-node
        link. (Per (type, zone) alone, a zone's A100 nodes on NVLink and on PCIe read as the first's
        link: the boundary floor of two stages on one node came out 19x the simulator's.)"""
        if self._groups is None:
            self._groups = {}
            for n in self.inst.nodes:
                key = (n.gpu_type, n.zone, n.num_gpus, n.intra_node.bandwidth_GBps, n.intra_node.latency_s)
                self._groups.setdefault(key, []).append(n)
        return self._groups

    def _group_firsts(self) -> list:
        return [nodes[0] for nodes in self._node_groups().values()]

    def _receivers(self, a) -> list:
        """The nodes at the other end of a boundary's transfer from (or to) node a, one of each kind:
        another node of every group, and node a itself (first fit may put both stages there) when
        it has 2 GPUs."""
        out = [next((n for n in nodes if n.node_id != a.node_id), None) for nodes in self._node_groups().values()]
        return [c for c in out if c is not None] + ([a] if a.num_gpus >= 2 else [])

    def _least_send_s(self, a, c, b: int, src_tps: tuple[int, ...] | None = None,
                      dst_tps: tuple[int, ...] | None = None) -> float:
        """The least transfer the estimator gives from node a to node c at microbatch b (inf where its
        table has no such pair). The hetplan composition sends the boundary bytes between endpoints
        of no stated size; Sailor's sends any unit output (the head's logits back, too) between TP
        groups whose sizes pick the bandwidth fit: the least over those sizes, over `src_tps` at a
        and `dst_tps` at c (every TP degree when None)."""
        if not self.sailor:
            return self._p2p_s(a, c, self.boundary_bytes(b), None, None)
        sizes = {self.info.output_bytes(u, b) for u in range(self.U)}
        return min((self._p2p_s(a, c, size, ga, gc) for size in sizes for ga in src_tps or TP_CHOICES
                    for gc in dst_tps or TP_CHOICES if ga <= a.num_gpus and gc <= c.num_gpus), default=math.inf)

    def _p2p_s(self, a, c, nbytes: float, gpus_a: int | None, gpus_c: int | None) -> float:
        """The estimator's transfer between nodes a and c at TP groups of these sizes (None: not said);
        inf where its table has no such pair."""
        try:
            return self.est.comm.p2p_time_s(replace(node_endpoint(a), gpus=gpus_a),
                                            replace(node_endpoint(c), gpus=gpus_c), nbytes)
        except EstimatorError:
            return math.inf

    def mem(self, g: str, t: int, b: int, D: int) -> tuple[tuple[float, ...], tuple[float, ...], float]:
        key = (g, t, b, D)
        if key not in self._mem:
            stat, act, over = [], [], 0.0
            for l in range(self.U):
                mb = self.est.memory.worker_memory(g, range(l, l + 1), t, b, D, 1)
                stat.append(mb.state_bytes)
                act.append(mb.activations_bytes)
                # what the simulator's out-of-memory rule counts besides these (MemoryBreakdown.oom:
                # Sailor's check_config_fits adds 2-3 GB, not its footprint's 5.06 GB)
                counted = mb.total_bytes if mb.fit_bytes is None else mb.fit_bytes
                over, cap = counted - stat[-1] - act[-1], mb.capacity_bytes
            self._mem[key] = (tuple(stat), tuple(act), cap - over)
        return self._mem[key]


def _quotas(instance: Instance, opts: PlannerOptions) -> dict[tuple[str, str], tuple[int, int, float, str]]:
    """(gpu type, zone) -> (available GPUs, GPUs per node, price, region), after allowed types/zones.
    Groups of one type and zone at different prices are priced at the least of them: a replica may
    be placed on any of their nodes, so only that keeps the cost bounds below what the simulator
    charges (the most of them, as before, put a min-cost bound 6.4 % above the optimum of two
    RTX-4090 nodes at 3.47 and 1.4 USD/h, and refused budgets plans met)."""
    c = instance.constraints
    out: dict[tuple[str, str], tuple[int, int, float, str]] = {}
    for g in instance.cluster.node_groups:
        if not c.allows(g.gpu_type, g.zone):
            continue
        key = (g.gpu_type, g.zone)
        n, per_node, price, region = out.get(key, (0, g.gpus_per_node, g.price_per_gpu_hour_usd, g.region_name))
        out[key] = (n + g.count * g.gpus_per_node, min(per_node, g.gpus_per_node),
                    min(price, g.price_per_gpu_hour_usd), region)
    if opts.available is not None:
        out = {k: (min(v[0], opts.available.get(k, 0)), *v[1:]) for k, v in out.items()}
    return {k: v for k, v in out.items() if v[0] > 0}


class StateAndMemory(NamedTuple):
    state_bytes: float  # one copy of the model's weights, gradients and optimizer state
    memory_bytes: float  # the memory of all the GPUs counted
    gpus: int


def state_and_memory_bytes(instance: Instance, est: EstimatorSet, quotas: dict | None = None
                           ) -> StateAndMemory | None:
    """One copy of the model's weights, gradients and optimizer state beside the memory of all GPUs
    of `quotas` (default: every allowed GPU): the copy is the memory estimator's on one GPU of the
    type that holds it in the fewest bytes; None for an estimator that cannot say (a profile
    without these units). Every plan holds at least that copy over its GPUs: TP splits it and ZeRO
    shards it over the replicas, and neither makes the whole smaller (activations and overheads
    come on top)."""
    units = range(instance.model_arch.num_units)
    state_bytes, memory_bytes, gpus = math.inf, 0.0, 0
    quotas = _quotas(instance, PlannerOptions()) if quotas is None else quotas
    for (gpu_type, _zone), (count, *_rest) in quotas.items():
        try:
            m = est.memory.worker_memory(gpu_type, units, 1, 1, 1, 1)
        except EstimatorError:
            return None
        state_bytes = min(state_bytes, m.state_bytes)
        memory_bytes, gpus = memory_bytes + count * m.capacity_bytes, gpus + count
    return StateAndMemory(state_bytes, memory_bytes, gpus) if gpus else None


def decimal_bytes(n: float) -> str:
    """Bytes in the largest decimal unit that keeps a digit before the point ("0.0 GB" said nothing
    of a CPU profile's 27 kB model)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} bytes"


def state_shortfall(instance: Instance, got: StateAndMemory | None) -> str | None:
    """Why no plan fits in memory, where one copy of the model's state outgrows all the GPUs counted
    in `got` (`state_and_memory_bytes`); else None."""
    if got is None or got.state_bytes <= got.memory_bytes:
        return None
    w = instance.workload
    return (f"no plan fits in memory: one copy of the model's weights, gradients and optimizer state takes "
            f"{decimal_bytes(got.state_bytes)} ({w.precision}, {w.optimizer}), more than the "
            f"{decimal_bytes(got.memory_bytes)} of all {got.gpus} GPUs together; add GPUs or train a smaller model")


def _ordered_classes(size_bytes: float, node: joint.LinkCost, zone: joint.LinkCost,
                     region: joint.LinkCost) -> tuple[joint.LinkCost, joint.LinkCost, joint.LinkCost]:
    """(node, zone, region) boundary links with each at least as fast as the wider ones for a
    transfer of `size_bytes`. The bounds take every boundary at c_node or more and a crossing at
    c_zone <= c_region; a zone whose only pairs are one node's PCIe GPUs (T4: 8 GB/s) has a slower
    c_node than a 40 GB/s network between zones (a random campaign, session 59: seed 113, P3 b1 D1,
    a strong bound of 0.0612 s against 0.0603 s for the best plan). Each link only gets faster, so
    the model stays a relaxation of the simulator."""
    def time_s(link: joint.LinkCost) -> float:
        return link.latency_s + size_bytes / link.bandwidth_Bps

    zone = min(zone, region, key=time_s)
    return min(node, zone, key=time_s), zone, region


def egress_floor_usd_per_GB(instance: Instance, across_regions: bool) -> float:
    """The least egress price of a byte between two zones of one region (or of two regions): the
    class price, or a `network.egress.pairs` entry of that class below it. The MILP prices a class
    at one figure; the simulator charges a pair its own, and a pair below the class price put the
    planner's bound 21 % above the optimum under a budget (a pair at 0 USD/GB across regions)."""
    egress = instance.cluster.network.egress
    region = {g.zone: g.region_name for g in instance.cluster.node_groups}
    prices = [egress.inter_region_usd_per_GB if across_regions else egress.inter_zone_usd_per_GB]
    for pair in egress.pairs:
        a, b = (region.get(z) for z in pair.zones)
        if (a != b) == across_regions:
            prices.append(pair.usd_per_GB)
    return min(prices)


def joint_inputs(instance: Instance, tables: _Tables, quotas: dict, combo: Combo, objective: str,
                 max_cost: float | None, min_its: float | None, tp_choices: tuple[int, ...]) -> joint.JointInputs | None:
    """Fill the MILP's numbers for one outer choice; None when no pool can hold even one unit."""
    wl, net = instance.workload, instance.cluster.network
    B = wl.global_batch_size
    m = B // (combo.D * combo.b)
    rows = tables.pool_rows(quotas, tp_choices, combo.b, combo.D)
    if rows is None:
        return None
    pools, step, upd, stat, act, cap, fixed, send, away, recv, shared = rows
    tied = tables.tied_bytes if combo.P > 1 else 0.0

    def link(spec) -> joint.LinkCost:
        return joint.LinkCost(spec.bandwidth_GBps * 1e9, spec.latency_s)

    node_link, zone_link, region_link = _ordered_classes(tables.boundary_bytes(combo.b), *(
        tables.effective_link(cls, combo.b) or link(spec) for cls, spec in (
            ("node", net.inter_node), ("zone", net.inter_zone), ("region", net.inter_region))))
    inp = joint.JointInputs(
        P=combo.P, D=combo.D, b=combo.b, m=m, pools=pools, step_s=step, upd_s=upd,
        stat_bytes=stat, act_bytes=act, cap_bytes=cap, grad_bytes=tables.grad_bytes,
        tied_grad_bytes=tied, boundary_bytes=tables.boundary_bytes(combo.b),
        node=node_link, zone=zone_link, region=region_link,
        egress_zone_usd_per_GB=tables.egress_floors[0], egress_region_usd_per_GB=tables.egress_floors[1],
        sync_factor=tables.sync_factor, objective=objective, max_cost_usd=max_cost,
        min_iters_per_s=min_its, max_gpus=instance.constraints.max_gpus, shared=shared,
        tied_pool_s=tied_floors_s(tables, pools, combo.D, tied),
        tied_pair_s=tied_pair_floors_s(tables, pools, combo.D, tied), costs=tables.costs,
        composition="sailor" if tables.sailor else "hetplan", upd_fixed_s=fixed, send_floor_s=send,
        send_away_s=away, recv_floor_s=recv, inter=None if tables.sailor else tables.effective_link("inter", combo.b),
        inter_in_zone=None if tables.sailor else tables.inter_in_zone(combo.b))
    return inp


def with_sync_table(inp: joint.JointInputs, tables: _Tables) -> joint.JointInputs:
    """`inp` with lower bounds on the gradient all-reduce per (pool, stage position, blocks) filled in:
    `sync_table` for a stage in one zone, `span_sync_table` for one spanning zones of its region.
    A stage holding a replica of pool k all-reduces factor x bytes / t per member, t its least TP
    (at most t_k), over D members of at least t GPUs each, placed on one node of k's type or on two
    or more nodes of its zone (region, spanning); the least over those t of the estimator's floor
    over those placements (`_least_sync_floors_s`, `_Tables.floor_s`) holds whatever the first-fit
    placement and the stage's other pools. An
    entry is inf where no such placement exists (D replicas do not fit in the zone; a region of
    one zone has no spanning stage): the bounds then rule the pair out, and the MILP reads 0
    there (`joint.model_coef`), since its quota and region rows already do."""
    if inp.sync_table is not None or not joint.blocks_identical(inp):
        return inp
    # choices with the same D, pools and P share the tables (b changes neither the bytes of a
    # position's n blocks nor the replicas that all-reduce them)
    key = (inp.D, inp.pools, inp.P)
    tabs = tables.sync_tables.get(key)
    if tabs is None:
        nbytes = tables.stage_grad_bytes(inp)
        entries = _sync_entries(tables, inp, nbytes)
        # each depth gets tables of its own (position, blocks) only: a bound that caches a figure of a
        # whole table (`joint.tables._per_table`) reads that depth's entries
        tabs = tables.sync_tables[key] = tuple(
            None if got is None else {(k, pos, n): got[k, pos, n] for k in range(inp.K) for pos, n in nbytes}
            for got in entries)
    return replace(inp, sync_table=tabs[0], span_sync_table=tabs[1], repeat_sync_table=tabs[2])


def _sync_entries(tables: _Tables, inp: joint.JointInputs, nbytes: dict) -> tuple[dict, dict | None, dict | None]:
    """The (in one zone, spanning zones, two of a group) all-reduce floors of `with_sync_table` per
    (pool, position, blocks), for the (position, blocks) of `nbytes` and those of the depths asked
    before with the same D and pools: an entry depends on the stage's bytes, D and the pools, not
    on P (measured: Sailor's d_fig11 min-cost search asks for 149 (D, pools, P) and 16 (D, pools).
    The tables of every outer choice, best of 3, once per depth -> once per (D, pools): d_fig11 1.19 ->
    0.63 s, c_opt350_a100_5zones_32each 0.88 -> 0.44 s, large_5type_2k 3.24 -> 1.03 s)."""
    store = tables.sync_entries.setdefault((inp.D, inp.pools), ({}, {}, {}))
    # a (position, blocks) computed has an entry for every pool in the one-zone table
    missing = [pn for pn in nbytes if (0, *pn) not in store[0]]
    if missing:
        factor = tables.sync_factor
        table, span, repeat = {}, {}, {}
        # stage 0 is placed first: its one-node floor reads the nodes first fit gives it (`_first_placed_nodes`)
        parts = [(first, [pn for pn in missing if (pn[0] in FIRST_PLACED) == first]) for first in (True, False)]
        for k, pool in enumerate(inp.pools):
            joint.check_deadline()
            for first, part in parts:
                if not part:
                    continue
                sizes = [nbytes[pn] for pn in part]
                one, far = _least_sync_floors_s(tables, inp, pool, sizes, factor, first)
                table.update(((k, pos, n), v) for (pos, n), v in zip(part, one))
                if len(inp.zones) > 1:
                    span.update(((k, pos, n), v) for (pos, n), v in zip(part, far))
                twice = _repeat_floors_s(tables, inp, pool, sizes, factor)
                if twice is not None:
                    repeat.update(((k, pos, n), v) for (pos, n), v in zip(part, twice))
        if repeat:  # per (position, blocks): the same on these entries as on all of them
            _pigeonhole(inp, table, span, repeat)
        # only once complete: a deadline may stop the loop
        for whole, part in zip(store, (table, span, repeat)):
            whole.update(part)
    return store[0], store[1] or None, store[2] or None


def _pigeonhole(inp: joint.JointInputs, table: dict, span: dict, repeat: dict) -> None:
    """Raise `table` and `span` in place where D exceeds the (zone, GPU type) groups of a pool's
    region: a stage's D replicas then put two in some group, so its all-reduce is at least the least
    `repeat` entry of the region's pools (at the same position and blocks). The bounds read these
    tables, and they gain what the MILP's rep rows give it."""
    for region in inp.regions:
        ks = {k for k, p in enumerate(inp.pools) if p.region == region}
        if inp.D <= len({(inp.pools[k].zone, inp.pools[k].gpu_type) for k in ks}):
            continue
        least: dict = {}
        for (k, pos, n), v in repeat.items():
            if k in ks:
                least[pos, n] = min(least.get((pos, n), math.inf), v)
        for tab in (table, span):
            for (k, pos, n), v in tab.items():
                if k in ks and v < math.inf:
                    tab[k, pos, n] = max(v, least[pos, n])


def _repeat_floors_s(tables: _Tables, inp: joint.JointInputs, pool: joint.Pool, nbytes: list[float],
                     factor: float) -> list[float] | None:
    """Per entry of `nbytes`: a floor on the all-reduce of a stage that holds a replica of `pool` and
    two or more replicas of its (zone, GPU type), whether it spans zones or not: the least over the
    stage's possible least TP t <= t_k of the estimator's `repeat_floor_s` at factor x bytes / t
    (its members sit in the pool's region); None for an estimator without one."""
    floors = tables.repeat_floor_s(inp.pools, pool, inp.D, [factor * n / t for t in _least_tps(inp.pools, pool.tp)
                                                            for n in nbytes])
    if floors is None:
        return None
    return [min(floors[j::len(nbytes)]) for j in range(len(nbytes))]


def _least_tps(pools: tuple, tp: int) -> list[int]:
    """The least TP a stage (or a ring) holding a replica of TP `tp` can have: every TP degree of
    the pools up to `tp`."""
    return sorted({p.tp for p in pools if p.tp <= tp})


def _least_sync_floors_s(tables: _Tables, inp: joint.JointInputs, pool: joint.Pool, nbytes: list[float],
                         factor: float, first_placed: bool = False) -> tuple[list[float], list[float]]:
    """Per entry of `nbytes`: (in `pool`'s zone, spanning zones of its region) floors on the
    all-reduce of a stage that holds a replica of `pool`. The stage's least TP t is at most
    t_k; each member carries factor x bytes / t and takes at least t GPUs, so the least over those t
    of the floor at that size, with every node holding num_gpus // t members at most, bounds it.
    Measured (Sailor's OPT-350M on 5 zones x 8 A100 nodes of 4 GPUs, P1 b8 D32): counted as TP 1
    slots, 32 TP 4 replicas fit one zone; as TP 4 they need four, so the in-zone entry of a TP 4 pool
    goes from 0.4931 s to 1.9559 s (a stage in one zone has TP 1 replicas) and, with the pairs the
    four zones need (`estimators.base.bottleneck_floor_s`), the spanning one from 0.4738 to 0.4787 s.
    `first_placed` (stage 0): on one node, only on the node first fit gives it (`_first_placed_nodes`)."""
    one_zone, span = [math.inf] * len(nbytes), [math.inf] * len(nbytes)
    one_node = _fits_one_node(tables, inp.pools, pool, inp.D, pool.zone)  # both by the least TP: valid for every t
    min_nodes = max(2, _least_nodes(tables, inp.pools, pool, inp.D, pool.zone))
    for t in _least_tps(inp.pools, pool.tp):
        sizes = [factor * n / t for n in nbytes]
        if one_node:
            near = _first_placed_nodes(tables, inp.pools, pool, t, inp.D) if first_placed else \
                tables.nodes(inp.pools, zone=pool.zone, gpu_type=pool.gpu_type, least_tp=t)
            one_zone = list(map(min, one_zone, tables.floor_s(near, inp.D, sizes)))
        many = tables.floor_s(tables.nodes(inp.pools, zone=pool.zone, least_tp=t), inp.D, sizes, min_nodes=min_nodes)
        one_zone = list(map(min, one_zone, many))
        if len(inp.zones) > 1:
            far = tables.floor_s(tables.nodes(inp.pools, region=pool.region, least_tp=t), inp.D, sizes, spans="zone")
            span = list(map(min, span, far))
    return one_zone, span


def _least_nodes(tables: _Tables, pools: tuple, pool: joint.Pool, members: int, zone: str | None = None,
                 gpu_type: str | None = None, also: joint.Pool | None = None) -> int:
    """The fewest nodes of `zone` and `gpu_type` (None: any) that can hold a ring of `members`
    replicas, one of them of `pool` (and another of `also`): that replica takes t_k GPUs and each
    other one at least the least TP of the selected pools, so the ring needs t_k + (members - 1)
    t_least GPUs (t_k + t_also + (members - 2) t_least), counted on the largest nodes first; more
    than the selection has where it cannot hold them (no placement: any floor holds). Measured: V100
    TP 2 x 4 on 4-GPU nodes was floored at one node's ring, 1.0 ms, where two nodes take 8.9 ms; 16
    TP 2 replicas on 4-GPU nodes as a 4-node ring, 49.0 ms, where the stage spans 8 nodes, 58.7 ms
    (the bound is 5 nodes)."""
    here = lambda p: zone in (None, p.zone) and gpu_type in (None, p.gpu_type)  # noqa: E731
    least = min(p.tp for p in pools if here(p))
    known = (pool.tp,) if also is None else (pool.tp, also.tp)
    key = (least, known, members, zone, gpu_type)
    if key not in tables._least_nodes:  # asked for every pool of every outer choice
        need, held, count = sum(known) + (members - len(known)) * least, 0, None
        for count, size in enumerate(tables.node_sizes(zone, gpu_type), start=1):
            held += size
            if held >= need:
                break
        else:
            count = max((count or 0) + 1, 2)
        tables._least_nodes[key] = count
    return tables._least_nodes[key]


def _fits_one_node(tables: _Tables, pools: tuple, pool: joint.Pool, members: int, zone: str | None = None) -> bool:
    """Whether that ring can sit on one node of the pool's type (in `zone`; None: any zone)."""
    return _least_nodes(tables, pools, pool, members, zone, pool.gpu_type) == 1


def _first_placed_nodes(tables: _Tables, pools: tuple, pool: joint.Pool, least_tp: int, members: int) -> tuple:
    """(node endpoint, slots) of the nodes where a ring of `members` replicas of pool's (GPU type,
    zone) that holds the first stage's can sit on one node, one replica of `pool`, the least TP
    `least_tp`. First fit (`hetplan.plan.placement_order`) places stage 0 first, on empty nodes: its
    first replica, of a TP t' >= least_tp of the group's pools, takes the first node of the group
    with t' GPUs, so a ring on one node is on one of those, and that node holds t_k + (members - 1)
    least_tp GPUs. (Any node of the type was taken before: helper-13 found seeds where that first
    node has 1 or 2 GPUs, or a 32 GB/s PCIe link where the floor read another node's 281 GB/s; with
    `network._shared_node_bandwidth_Bps` the planner's gap on seed 171 went 36.63 -> 1.00 %, on 285
    53.69 -> 2.60 %, /tmp/s65/ab.py.)"""
    key = ("first placed", pools, pool.gpu_type, pool.zone, pool.tp, least_tp, members)
    if key not in tables._node_sets:
        tps = {p.tp for p in pools if p.quota_key == pool.quota_key and p.tp >= least_tp}
        firsts = {getattr(tables.first_node(pool.gpu_type, pool.zone, t), "node_id", None) for t in tps}
        need = pool.tp + (members - 1) * least_tp
        tables._node_sets[key] = _NodeSet((node_endpoint(n), n.num_gpus // least_tp)
                                          for n in tables.placed_group(pool.gpu_type, pool.zone)
                                          if n.node_id in firsts and n.num_gpus >= need)
    return tables._node_sets[key]


def tied_floors_s(tables: _Tables, pools: tuple, D: int, tied_bytes: float) -> tuple[tuple[float, float, float], ...]:
    """Per pool k: lower bounds on the tied-embedding all-reduce of the first and last stage (2 D
    members) when both ends sit in one zone, in zones of one region (ez = 1) or in two regions (er =
    1): the estimator's floor over every placement of that kind. The ring's least TP t is at most
    t_k when pool k serves an end, each member carries factor x bytes / t and takes t GPUs or more,
    so the least over those t of the floor at that size, with every node holding num_gpus // t
    members at most, bounds it (as for a stage's own all-reduce, `_least_sync_floors_s`; measured on
    spot_trace_2type's P11 b1 D4 plan, OPT-350M with both ends on TP 2 replicas over 4-GPU nodes:
    the last stage's all-reduce with the tied one 0.01089 -> 0.01292 s in the model, 0.01309 s
    placed; counted as TP 1 members, two nodes held the ring). The ring fits on one node only where
    a node of k's type holds t_k + (2 D - 1) t_least GPUs (t_least: the least TP of the type), and
    only on a node first fit gives stage 0 (`_first_placed_nodes`: the ring holds its replicas);
    else it spans two nodes or more. Empty without a tied embedding."""
    if tied_bytes <= 0:
        return ()
    key = (pools, D, tied_bytes)  # the same for every P and b: computed once, not per outer choice
    if key not in tables._tied:
        kinds = [(p.tp, k if _fits_one_node(tables, pools, p, 2 * D) else None) for k, p in enumerate(pools)]
        floors = {(tp, one): tuple(_finite(min(col)) for col in zip(*(
                      _tied_floors_s(tables, pools, D, tied_bytes / t, 1 if one is not None else 2, t,
                                     first_of=None if one is None else pools[one])
                      for t in _least_tps(pools, tp))))
                  for tp, one in dict.fromkeys(kinds)}
        tables._tied[key] = tuple(floors[kind] for kind in kinds)
    return tables._tied[key]


def tied_pair_floors_s(tables: _Tables, pools: tuple, D: int, tied_bytes: float) -> dict | None:
    """(k, k2) -> the floors of `tied_floors_s` when pool k serves the first stage and k2 the last
    (both orders), kept only where they pass both pools' own floors in some column. The ring holds
    a replica of each, so its least TP is at most min(t_k, t_k2), and it fits one node only where
    both pools are of one (zone, GPU type) and a node of it holds t_k + t_k2 + (2 D - 2) t_least
    GPUs; both ends in one zone are in the zone of both, in one region in the region of both.
    Measured (a random campaign, session 59, seed 477: two 4-GPU A10G nodes, one A100, one V100):
    P3 b1 D1's MILP plan with TP 2 and TP 4 ends was 0.0593 s in the model, as if they shared a
    node (the TP 2 pool's floor) at the TP 4 pool's bytes / 4, and 0.0756 s placed."""
    if tied_bytes <= 0:
        return None
    key = ("pairs", pools, D, tied_bytes)  # the same for every P and b, as `tied_floors_s`
    if key not in tables._tied:
        own = tied_floors_s(tables, pools, D, tied_bytes)
        kinds: dict = {}
        pairs = {}
        for k, p in enumerate(pools):
            for k2 in range(k, len(pools)):
                q = pools[k2]
                one = _pair_fits_one_node(tables, pools, p, q, 2 * D)
                kind = (min(p.tp, q.tp), (k2 if p.tp <= q.tp else k) if one else None,  # the wider one: the most GPUs
                        p.zone if p.zone == q.zone else None, p.region if p.region == q.region else None)
                if kind not in kinds:
                    tp, one, zone, region = kind
                    kinds[kind] = tuple(_finite(min(col)) for col in zip(*(
                        _tied_floors_s(tables, pools, D, tied_bytes / t, 1 if one is not None else 2, t, zone,
                                       region, first_of=None if one is None else pools[one])
                        for t in _least_tps(pools, tp))))
                floors = kinds[kind]
                if any(f > max(a, b) for f, a, b in zip(floors, own[k], own[k2])):
                    pairs[k, k2] = pairs[k2, k] = floors
        tables._tied[key] = pairs or None
    return tables._tied[key]


def _pair_fits_one_node(tables: _Tables, pools: tuple, p: joint.Pool, q: joint.Pool, members: int) -> bool:
    """Whether a ring of `members` replicas, one of pool p and one of pool q (two replicas, also
    when p is q), can sit on one node: only on a node of their common (zone, GPU type)."""
    return (p.zone, p.gpu_type) == (q.zone, q.gpu_type) and \
        _least_nodes(tables, pools, p, members, p.zone, p.gpu_type, also=q) == 1


def _tied_floors_s(tables: _Tables, pools: tuple, D: int, shard_bytes: float, min_nodes: int,
                   least_tp: int, zone: str | None = None, region: str | None = None,
                   first_of: joint.Pool | None = None) -> tuple[float, float, float]:
    """(one zone, zones of a region, two regions) floors of `tied_floors_s` for members of TP
    `least_tp` or more, each carrying `shard_bytes` (before the sync factor); inf where no placement.
    `zone` / `region`: the one zone (region) both ends sit in when they share one (None: any).
    `first_of` (with min_nodes 1): a ring on one node holds a replica of that pool, on a node
    `_first_placed_nodes` gives."""
    size = [sync_volume_factor(tables.inst.workload.zero_stage) * shard_bytes]
    zones = [zone] if zone is not None else sorted({p.zone for p in pools})
    regions = [region] if region is not None else sorted({p.region for p in pools})
    spread_from = min_nodes if first_of is None else 2  # on one node: only the first placed ones
    node = min(tables.floor_s(tables.nodes(pools, zone=z, least_tp=least_tp), 2 * D, size, min_nodes=spread_from)[0]
               for z in zones)
    if first_of is not None and min_nodes <= 1:
        node = min(node, tables.floor_s(_first_placed_nodes(tables, pools, first_of, least_tp, 2 * D), 2 * D, size)[0])
    spread = [r for r in regions if len({p.zone for p in pools if p.region == r}) > 1]
    zone_s = min((tables.floor_s(tables.nodes(pools, region=r, least_tp=least_tp), 2 * D, size, spans="zone")[0]
                  for r in spread), default=node)
    region_s = tables.floor_s(tables.nodes(pools, least_tp=least_tp), 2 * D, size, spans="region")[0] \
        if len({p.region for p in pools}) > 1 else zone_s
    return node, zone_s, region_s


def _finite(floor_s: float) -> float:
    """A floor where no placement exists (inf) is 0 in the model: such plans are ruled out by the
    quota rows, and an infinite coefficient would break the MILP."""
    return floor_s if floor_s < math.inf else 0.0


def enumerate_combos(instance: Instance, quotas: dict, opts: PlannerOptions) -> list[Combo]:
    B = instance.workload.global_batch_size
    U = instance.model_arch.num_units
    max_replicas = sum(n // min(opts.tp_choices) for n, *_ in quotas.values())
    combos = []
    for P in range(1, min(U, opts.max_stages) + 1):
        for b in opts.microbatch_sizes:
            if B % b:
                continue
            # D <= max_replicas // P: the loop stays as long as the cluster is large, not the batch
            for D in range(1, min(B // b, max_replicas // P) + 1):
                if (B // b) % D == 0:
                    combos.append(Combo(P, b, D))
    return combos


def planner_tables(instance: Instance, estimators: EstimatorSet) -> _Tables:
    """The planner's estimator figures for `instance` scored by `estimators`, to hand to several
    `plan` calls (`tables=`). They depend on the instance (its nodes, network, model, workload) and
    the estimators only: the availability, the limits and the options key their own entries
    (`_Tables.pool_rows`, `with_sync_table`), so a re-planner whose events change only the quotas
    keeps one and skips recomputing them at every event (hetplan.orchestration.replan.ReplanSession)."""
    return _Tables(instance, estimators)
