"""What a stage and a stage boundary of a placed plan cost: the one evaluation the simulator and the
joint formulation's plan scoring both read (issue "One cost model").

`simulator/pipeline.py` composes these figures into an iteration (1F1B or GPipe) and a report;
`formulations/joint/evaluation.py` `evaluate_placed` composes the same figures with the MILP's own time and cost
rows, so a change to how a stage is priced reaches both at once. The MILP's coefficients come from
the same estimator calls (`replica_times` sums `layer_time` per unit, as `planner.inputs._Tables.step`
stores per unit); where the MILP cannot see the placement (boundary links, all-reduce rings) it
takes floors over every placement (`joint` docstring, "Relaxed").

Figures, per pipeline step unless said otherwise:
  stage compute:  f_s = max_r sum_{u in s} fwd(g_r, u, share_r, t_r, link_r), b_s likewise (the
                  straggler's forward and the straggler's backward, which may be different
                  replicas; link_r: the intra-node link of r's node, which its TP all-reduces use)
  update:         max_r update(g_r, units, t_r, D_s)
  boundary s:     the microbatch moves by contiguous sample ranges (`plan.redistribution`); a
                  receiving replica takes its pieces one after another, so cf_s = max_j sum of its
                  pieces' p2p times, cb_s likewise for the gradients back; egress: every piece twice
                  (activation and gradient) at the zone pair's price
  all-reduce:     over the stage's replicas of the gradient bytes / least TP (x 1.5 with ZeRO-3),
                  every ring edge carrying 2 (k - 1) / k of the bytes of all TP shards (egress);
                  the tied embedding adds one all-reduce over the first and last stage's replicas
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hetplan.catalog import LinkSpec
from hetplan.estimators import Endpoint, EstimatorSet
from hetplan.estimators.model_stats import DTYPE_BYTES, boundary_activation_bytes, gradient_bytes, sync_volume_factor
from hetplan.estimators.network import ring_order
from hetplan.instance import Instance, Node
from hetplan.plan import Plan, Replica, redistribution


def node_endpoint(node: Node) -> Endpoint:
    """Where a node's GPUs sit, as the communication estimator needs it."""
    return Endpoint(zone=node.zone, region=node.region, node_id=node.node_id, intra_node=node.intra_node)


def endpoint(instance: Instance, rep: Replica) -> Endpoint:
    return node_endpoint(instance.node_by_id[rep.node])


@dataclass(frozen=True)
class Transfer:
    """One pipeline step over a boundary: activations forward, gradients back, and their egress."""

    fwd_s: float
    bwd_s: float
    egress_usd: float
    egress_bytes: float


@dataclass(frozen=True)
class Sync:
    """One all-reduce per iteration: its time and the egress of its ring edges across zones."""

    time_s: float
    egress_usd: float = 0.0
    egress_bytes: float = 0.0

    def __add__(self, other: "Sync") -> "Sync":
        return Sync(self.time_s + other.time_s, self.egress_usd + other.egress_usd,
                    self.egress_bytes + other.egress_bytes)


@dataclass(frozen=True)
class IterationFigures:
    """A placed plan's figures per stage and boundary, composed into one iteration: the pipeline
    (`pipeline_s`), the slowest all-reduce and the slowest update. Egress is per iteration."""

    f: tuple[float, ...]
    b: tuple[float, ...]
    upd: tuple[float, ...]
    links: tuple[Transfer, ...]
    syncs: tuple[Sync, ...]
    pipeline_s: float
    egress_usd: float
    egress_bytes: float

    @property
    def sync_s(self) -> float:
        return max(x.time_s for x in self.syncs)

    @property
    def update_s(self) -> float:
        return max(self.upd)

    @property
    def iteration_s(self) -> float:
        return self.pipeline_s + self.sync_s + self.update_s


class StageCosts:
    """The per-stage figures of placed plans on one instance with one estimator set."""

    def __init__(self, instance: Instance, est: EstimatorSet):
        self.inst, self.est = instance, est
        self.arch, self.wl = instance.model_arch, instance.workload
        self.seq_bytes = boundary_activation_bytes(self.arch, 1, self.wl.precision)  # one sequence's activations
        self.sync_factor = sync_volume_factor(self.wl.zero_stage)

    # -- compute -----------------------------------------------------------------------------------
    def replica_times(self, gpu_type: str, tp: int, units: range, share: int,
                      intra_node: LinkSpec | None = None) -> tuple[float, float]:
        """(forward, backward) seconds of one replica for its share of one microbatch; its TP
        all-reduces on `intra_node` (its node's link; None: the type's fastest, `layer_time`)."""
        fwd = bwd = 0.0
        for u in units:
            lt = self.est.time.layer_time(gpu_type, u, share, tp, intra_node)
            fwd, bwd = fwd + lt.fwd_s, bwd + lt.bwd_s
        return fwd, bwd

    def stage_times(self, plan: Plan, s: int) -> tuple[float, float]:
        """(f_s, b_s): the slowest forward and the slowest backward of stage s's replicas."""
        st = plan.stages[s]
        units = range(st.layer_start, st.layer_end)
        times = [self.replica_times(r.gpu_type, r.tp, units, plan.share(s, j), self.inst.node_by_id[r.node].intra_node)
                 for j, r in enumerate(st.replicas)]
        return max(t[0] for t in times), max(t[1] for t in times)

    def update_s(self, plan: Plan, s: int) -> float:
        st = plan.stages[s]
        units = range(st.layer_start, st.layer_end)
        return max(self.est.time.update_time_s(r.gpu_type, units, r.tp, len(st.replicas)) for r in st.replicas)

    # -- communication -----------------------------------------------------------------------------
    def boundary(self, plan: Plan, s: int) -> Transfer:
        """Boundary s -> s + 1 of a placed plan, one pipeline step."""
        src, dst = plan.stages[s], plan.stages[s + 1]
        into: dict[int, float] = {}
        back_into: dict[int, float] = {}
        egress_usd = egress_bytes = 0.0
        for i, j, n in redistribution(plan.shares(s), plan.shares(s + 1)):
            a, b = endpoint(self.inst, src.replicas[i]), endpoint(self.inst, dst.replicas[j])
            nbytes = n * self.seq_bytes
            into[j] = into.get(j, 0.0) + self.est.comm.p2p_time_s(a, b, nbytes)
            back_into[i] = back_into.get(i, 0.0) + self.est.comm.p2p_time_s(b, a, nbytes)
            # activation forward + gradient backward, both cross the same zone boundary
            egress_usd += 2 * self.est.cost.egress_usd(a, b, nbytes)
            egress_bytes += 2 * nbytes if a.zone != b.zone else 0.0
        return Transfer(max(into.values()), max(back_into.values()), egress_usd, egress_bytes)

    def allreduce(self, replicas: Sequence[Replica], nbytes_full: float) -> Sync:
        """All-reduce of nbytes_full (all TP shards) over placed replicas: each ring member moves its
        shard of bytes / least TP; every ring edge carries 2 (k - 1) / k of the full bytes."""
        if len(replicas) <= 1:
            return Sync(0.0)
        members = [endpoint(self.inst, r) for r in replicas]
        volume = self.sync_factor * nbytes_full
        t = self.est.comm.allreduce_time_s(members, volume / min(r.tp for r in replicas))
        ring = ring_order(members)
        k = len(ring)
        per_edge = 2 * (k - 1) / k * volume
        usd = nbytes = 0.0
        for i in range(k):
            a, b = ring[i], ring[(i + 1) % k]
            usd += self.est.cost.egress_usd(a, b, per_edge)
            nbytes += per_edge if a.zone != b.zone else 0.0
        return Sync(t, usd, nbytes)

    @property
    def tied_bytes(self) -> float:
        """Bytes of the tied embedding whose gradients the first and last stage sum (0 without)."""
        if not self.arch.tied_embeddings:
            return 0.0
        return self.arch.vocab_size * self.arch.hidden_size * DTYPE_BYTES[self.wl.precision]

    def iteration(self, plan: Plan) -> IterationFigures:
        """Every stage, boundary and all-reduce of a placed plan, composed (module docstring)."""
        P, m = len(plan.stages), plan.num_microbatches
        f, b = zip(*(self.stage_times(plan, s) for s in range(P)))
        links = tuple(self.boundary(plan, s) for s in range(P - 1))
        syncs = tuple(self.stage_syncs(plan))
        return IterationFigures(
            f, b, tuple(self.update_s(plan, s) for s in range(P)), links, syncs,
            pipeline_s(plan.schedule, f, b, [x.fwd_s for x in links], [x.bwd_s for x in links], m),
            m * sum(x.egress_usd for x in links) + sum(x.egress_usd for x in syncs),
            m * sum(x.egress_bytes for x in links) + sum(x.egress_bytes for x in syncs))

    def stage_syncs(self, plan: Plan) -> list[Sync]:
        """Per stage: its gradient all-reduce, plus the tied embedding's on the first and last stage."""
        out = [self.allreduce(st.replicas, gradient_bytes(self.arch, range(st.layer_start, st.layer_end),
                                                           self.wl.precision)) for st in plan.stages]
        if self.tied_bytes and len(plan.stages) > 1:
            tied = self.allreduce(list(plan.stages[0].replicas) + list(plan.stages[-1].replicas), self.tied_bytes)
            out[0] = out[0] + tied
            out[-1] = out[-1] + Sync(tied.time_s)  # its egress is counted once, on stage 0
        return out


def pipeline_s(schedule: str, f: Sequence[float], b: Sequence[float], cf: Sequence[float], cb: Sequence[float],
               m: int) -> float:
    """Pipeline time of m microbatches (simulator/pipeline.py docstring): one full pass through the
    pipeline plus m - 1 steps of the bottleneck (a stage, or a link slower than every stage)."""
    if schedule == "GPipe":
        return (sum(f) + sum(cf) + (m - 1) * max([*f, *cf])) + (sum(b) + sum(cb) + (m - 1) * max([*b, *cb]))
    step = [x + y for x, y in zip(f, b)]
    links = [max(x, y) for x, y in zip(cf, cb)]
    return sum(step) + sum(cf) + sum(cb) + (m - 1) * max(step + links)
