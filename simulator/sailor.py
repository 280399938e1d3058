"""The sailor iteration model: Sailor's simulator composition (SOSP'25 sec. 4.3), over the "sailor"
estimators (estimators/sailor.py). Selected by `estimators: {preset: sailor}` (EstimatorSet.iteration).

Formulas of `Planner/simulations/runtime_simulator.py` at eth-easl/sailor cf2c8e3, for one pipeline
with microbatch size b, P stages, m = ceil(B / (b x D_0)) microbatches (D_0: replicas of stage 0):

  compute_i = max over stage i's replicas of sum over its units (fwd + bwd)
  update_i  = max over its replicas of the profile's whole-model step
  p2p_i     = Sailor's per-stage send time (`estimate_p2p_pipeline_times`): with A_i the slowest send
              of the stage's output (last unit's output x b) from replica j to replica j mod D_{i+1} of
              stage i + 1, and G_i the slowest send back (size: see SailorModelInfo.p2p_gradient) to
              replica j mod D_{i-1} of stage i - 1:
              middle stages A_i + G_i; the last 2 G_i; the first A_0 when P <= 3, else 2 A_0
  T_pp      = (m - 1) max_i (compute_i + p2p_i) + sum_i p2p_i + sum_i compute_i + max_i update_i
  T_sync    = max over stages of the bucketed all-reduce of the stage's full parameter bytes divided
              by min(4, its least TP degree), over its replicas (slowest neighbour pair)
  T_iter    = T_pp + T_sync
  memory    = the sailor memory estimator with P - i microbatches in flight on stage i (not capped by m)
  cost      = GPU price x GPUs x T_iter + egress: the activations forward and the gradients back
              (each the sending stage's last-unit output x b, m times, priced by zone pair) and the
              ring all-reduce, 2 (D - 1) / D x full stage bytes on every edge j -> j + 1 mod D.

Reported parts: `pipeline_s` = T_pp - max update, `update_s` = max update, `sync_s` = T_sync; per
stage `p2p_s` = p2p_i, `fwd_s` / `bwd_s` of the slowest replica, `send_fwd_s` = A_i, `send_bwd_s` = G_i.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from hetplan.errors import EstimatorError, PlanError
from hetplan.estimators import Endpoint, EstimatorSet
from hetplan.estimators.sailor import SailorComm, SailorMemory, SailorModelInfo, SailorTime
from hetplan.instance import Instance
from hetplan.plan import Plan, Replica, Stage
from hetplan.formulations.stage_cost import endpoint
from hetplan.simulator.pipeline import RankMemory, SimulationReport, StageReport, build_report


def simulate_sailor(instance: Instance, plan: Plan, est: EstimatorSet) -> SimulationReport:
    """Score a placed, validated plan with the sailor iteration model (module docstring)."""
    if not all(isinstance(getattr(e, "_inner", e), kind) for e, kind in ((est.memory, SailorMemory),
                                                                          (est.time, SailorTime))):
        raise EstimatorError("the sailor iteration model needs the sailor time and memory estimators "
                             "(estimators: {preset: sailor})")
    return _SailorIteration(instance, plan, est).run()


def sync_bytes(info: SailorModelInfo, stage: Stage) -> float:
    """What a stage's data-parallel all-reduce carries: its full parameter bytes divided by
    min(4, its least TP degree)."""
    return info.param_bytes(range(stage.layer_start, stage.layer_end)) / min([4] + [r.tp for r in stage.replicas])


class _SailorIteration:
    def __init__(self, instance: Instance, plan: Plan, est: EstimatorSet):
        self.inst, self.plan, self.est = instance, plan, est
        self.info = est.memory.info
        self.P, self.m = len(plan.stages), plan.num_microbatches
        shares = plan.distinct_shares()
        if len(shares) != 1:
            raise PlanError(f"the sailor iteration model takes one microbatch size for every replica; the plan has "
                            f"{sorted(shares)}", "stages")
        self.mbs = shares.pop()
        self.egress_usd = self.egress_bytes = 0.0
        self._eps: dict[tuple[str, int], Endpoint] = {}

    def _ep(self, rep: Replica, gpus: int) -> Endpoint:
        """The replica's endpoint with `gpus` GPUs, one object per (node, gpus): a plan's sends, rings
        and egress ask for every replica several times (measured: 29,952 in the 14 simulations of
        Sailor's OPT-350M search on 2 zones x (128 A100 + 128 V100), a third of their time)."""
        key = (rep.node, gpus)
        if key not in self._eps:
            self._eps[key] = replace(endpoint(self.inst, rep), gpus=gpus)
        return self._eps[key]

    def _reps(self, s: int) -> tuple[Replica, ...]:
        return self.plan.stages[s].replicas

    # -- per stage ---------------------------------------------------------------------------------
    def _compute(self, s: int) -> tuple[float, float]:
        """(fwd, bwd) of the replica with the largest fwd + bwd."""
        stage, best = self.plan.stages[s], (0.0, 0.0)
        units = range(stage.layer_start, stage.layer_end)
        nodes = self.inst.node_by_id
        alike = dict.fromkeys((r.gpu_type, r.tp, nodes[r.node].intra_node) for r in stage.replicas)
        for gpu_type, tp, node_link in alike:  # alike replicas: alike times
            times = [self.est.time.layer_time(gpu_type, u, self.mbs, tp, node_link) for u in units]
            f, b = sum(t.fwd_s for t in times), sum(t.bwd_s for t in times)
            if f + b > sum(best):
                best = (f, b)
        return best

    def _slowest_send(self, s: int, to: int, nbytes: float) -> float:
        src, dst = self._reps(s), self._reps(to)
        return max(self.est.comm.p2p_time_s(self._ep(r, r.tp), self._ep(dst[j % len(dst)], dst[j % len(dst)].tp),
                                            nbytes) for j, r in enumerate(src))

    def _p2p(self, s: int) -> tuple[float, float, float]:
        """(p2p_s, A_s, G_s) of stage s (module docstring)."""
        stage = self.plan.stages[s]
        act = self._slowest_send(s, s + 1, self.info.output_bytes(stage.layer_end - 1, self.mbs)) \
            if s < self.P - 1 else 0.0
        grad = self._slowest_send(s, s - 1, self.info.gradient_bytes(stage.layer_start, self.mbs)) if s > 0 else 0.0
        if 0 < s < self.P - 1:
            return act + grad, act, grad
        if s == self.P - 1:
            return 2 * grad, act, grad
        return (act if self.P <= 3 else 2 * act), act, grad

    def _sync(self, s: int) -> float:
        nbytes = sync_bytes(self.info, self.plan.stages[s])
        return self.est.comm.allreduce_time_s([self._ep(r, 1) for r in self._reps(s)], nbytes)

    def _egress(self, a: Endpoint, b: Endpoint, nbytes: float) -> None:
        self.egress_usd += self.est.cost.egress_usd(a, b, nbytes)
        self.egress_bytes += nbytes if a.zone != b.zone else 0.0

    def _pipeline_egress(self) -> None:
        for s, stage in enumerate(self.plan.stages):
            for to in (s + 1, s - 1):
                if not 0 <= to < self.P:
                    continue
                sender_stage = self.plan.stages[min(s, to)]  # both directions carry the earlier stage's output
                nbytes = self.info.output_bytes(sender_stage.layer_end - 1, self.mbs) * self.m
                dst = self._reps(to)
                for j, r in enumerate(self._reps(s)):
                    self._egress(self._ep(r, r.tp), self._ep(dst[j % len(dst)], 1), nbytes)
            reps, d = self._reps(s), len(self._reps(s))
            per_edge = self.info.param_bytes(range(stage.layer_start, stage.layer_end)) / d * 2 * (d - 1)
            for j in range(d):
                self._egress(self._ep(reps[j], 1), self._ep(reps[(j + 1) % d], 1), per_edge)

    def _ranks(self) -> list[RankMemory]:
        out = []
        for s, stage in enumerate(self.plan.stages):
            units = range(stage.layer_start, stage.layer_end)
            for r, rep in enumerate(stage.replicas):
                mem = self.est.memory.worker_memory(rep.gpu_type, units, rep.tp, self.mbs, len(stage.replicas),
                                                    self.P - s)
                out.extend(RankMemory(len(out) + t, s, r, t, rep.node, rep.gpu_type, mem) for t in range(rep.tp))
        return out

    # -- whole iteration ---------------------------------------------------------------------------
    def run(self) -> SimulationReport:
        compute = [self._compute(s) for s in range(self.P)]
        update = [max(self.est.time.update_at_s(r.gpu_type, self.mbs, r.tp) for r in self._reps(s))
                  for s in range(self.P)]
        p2p = [self._p2p(s) for s in range(self.P)]
        step = [f + b for f, b in compute]
        straggler = max(c + p[0] for c, p in zip(step, p2p))
        t_pp_no_update = (self.m - 1) * straggler + sum(p[0] for p in p2p) + sum(step)
        sync = [self._sync(s) for s in range(self.P)]
        t_iter = t_pp_no_update + max(update) + max(sync)
        self._pipeline_egress()
        stages = [StageReport(s, st.layer_start, st.layer_end, len(st.replicas), compute[s][0], compute[s][1],
                              p2p[s][1], p2p[s][2], sync[s], update[s], self.P - s, p2p[s][0])
                  for s, st in enumerate(self.plan.stages)]
        return self._report(t_iter, t_pp_no_update, max(sync), max(update), stages)

    def _report(self, t_iter: float, pipeline_s: float, sync_s: float, update_s: float,
                stages: list[StageReport]) -> SimulationReport:
        batch, trained = self.inst.workload.global_batch_size, self.plan.global_microbatch * self.m
        notes = []
        if trained != batch:
            notes.append(f"{self.m} microbatches x {self.plan.global_microbatch} sequences = {trained} sequences "
                         f"per iteration, {trained - batch} over the global batch {batch} (Sailor's ceil rounding)")
        return build_report(self.inst, self.plan, self.est, t_iter, pipeline_s, sync_s, update_s, stages,
                            self._ranks(), self.egress_usd, self.egress_bytes, iteration_model="sailor", notes=notes)


# ---- replica order -------------------------------------------------------------------------------
MAX_ORDERED_GROUPS = 7  # stages with more (zone, GPU type) groups keep their replica order
MAX_ORDER_STATES = 200_000  # `_bottleneck_sequence`'s table: counts left x last group, at most this many


def ring_ordered(instance: Instance, plan: Plan, est: EstimatorSet, whole_groups: bool = False) -> Plan:
    """A placed plan with each stage's replicas in the order whose slowest neighbour pair is fastest.
    Sailor's all-reduce time is that of the slowest pair (j, j + 1) in the stage's replica order
    (`_sync`), so the order is part of a Sailor plan. Replicas of one (zone, GPU type) group share
    their fits, so only the sequence of groups matters; two replicas of a group side by side are a
    pair too (measured: Sailor's us-central1-b to itself is slower than to c or f). The sequence is
    the exact least (`_bottleneck_sequence`) where its table is small enough, else (or with
    `whole_groups`) the best order of whole groups, which crosses zones fewer times (less egress
    where pairs of zones cost it). Stages with more than MAX_ORDERED_GROUPS groups keep their order, and so does every
    stage when the communication estimator is not Sailor's. The pipeline pairs j -> j mod D change
    with it: the caller compares the simulations. `plan` itself when no stage's order changes."""
    if not isinstance(est.comm, SailorComm):
        return plan
    stages = []
    for stage in plan.stages:
        groups: dict[tuple[str, str], list[Replica]] = {}
        for rep in stage.replicas:
            groups.setdefault((endpoint(instance, rep).zone, rep.gpu_type), []).append(rep)
        if not 1 < len(groups) <= MAX_ORDERED_GROUPS:
            stages.append(stage)
            continue
        keys = list(groups)
        nbytes = sync_bytes(est.memory.info, stage)
        ends = [replace(endpoint(instance, groups[key][0]), gpus=1) for key in keys]
        pair = np.array([[_pair_s(est.comm, a, b, nbytes, len(stage.replicas)) for b in ends] for a in ends])
        counts = [len(groups[key]) for key in keys]
        order = (None if whole_groups else _bottleneck_sequence(counts, pair)) or _best_group_order(counts, pair)
        queues = [iter(groups[key]) for key in keys]
        replicas = tuple(next(queues[g]) for g in order)
        stages.append(stage if replicas == stage.replicas else stage.model_copy(update={"replicas": replicas}))
    if all(new is old for new, old in zip(stages, plan.stages)):
        return plan
    return plan.model_copy(update={"stages": tuple(stages)})


def _pair_s(comm: SailorComm, a: Endpoint, b: Endpoint, nbytes: float, members: int) -> float:
    """Sailor's all-reduce time when a -> b is the slowest pair; inf for a pair its zone table lacks
    (an order that needs it cannot be simulated, so the orders avoid it where they can)."""
    try:
        return comm.pair_allreduce_s(a, b, nbytes, members)
    except EstimatorError:
        return math.inf


def _best_group_order(counts: list[int], pair: np.ndarray) -> list[int]:
    """Every group's replicas side by side, the groups in the order whose slowest pair (two of one
    group included) is fastest: the sequence of group indices."""
    own = max((pair[g, g] for g, c in enumerate(counts) if c > 1), default=0.0)
    best = min(itertools.permutations(range(len(counts))),
               key=lambda order: max([own] + [pair[a, b] for a, b in zip(order, order[1:])]))
    return [g for g in best for _ in range(counts[g])]


def _bottleneck_sequence(counts: list[int], pair: np.ndarray) -> list[int] | None:
    """The sequence holding counts[g] copies of each group g whose slowest neighbour pair
    pair[a, b] is least (None when its table would pass MAX_ORDER_STATES). A dynamic program over
    (copies left per group, last group placed): best[r, y] = min over z with r_z > 0 of
    max(pair[y, z], best[r - e_z, z]), best[0, y] = 0, filled by the number of copies left; the
    first copy has no pair before it."""
    k = len(counts)
    shape = [c + 1 for c in counts]
    size = int(np.prod(shape))
    if size * k > MAX_ORDER_STATES:
        return None
    strides = [int(np.prod(shape[g + 1:])) for g in range(k)]
    left = np.indices(shape).reshape(k, size)  # (groups, states): copies left
    total = left.sum(axis=0)
    best = np.full((size, k), np.inf)
    best[total == 0] = 0.0
    for t in range(1, int(total.max()) + 1):
        at = np.flatnonzero(total == t)
        step = np.full((at.size, k), np.inf)
        for z in range(k):
            ok = left[z, at] > 0
            cand = np.maximum(pair[:, z][None, :], best[at[ok] - strides[z], z][:, None])  # (states, last y)
            step[ok] = np.minimum(step[ok], cand)
        best[at] = step
    state = size - 1  # every copy left
    order: list[int] = []
    last = None
    for _ in range(int(total[state])):
        options = [z for z in range(k) if left[z, state] > 0]
        value = lambda z: max(0.0 if last is None else pair[last, z], best[state - strides[z], z])  # noqa: E731
        last = min(options, key=value)
        order.append(last)
        state -= strides[last]
    return order
