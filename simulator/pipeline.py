"""Score any plan: iteration time, throughput, cost per iteration and per-rank peak memory.

Iteration model (Sailor sec. 4.3: T_iter = max_i T_pp_i + T_sync + T_update), with the plan's batch
semantics (core/plan.py): every pipeline step moves one global microbatch through all stages; stage s
splits it over its replicas, which run in parallel, so the stage's step time is its slowest replica
(straggler). With f_s, b_s the stage's forward/backward step times, cf_s, cb_s the activation and
gradient transfer times over boundary s -> s+1, and m = num_microbatches:

  1F1B:  T_pipe = sum_s (f_s + b_s) + sum_s (cf_s + cb_s) + (m - 1) * max(max_s (f_s + b_s), max_s max(cf_s, cb_s))
         (warm-up and cool-down = one full pass through the pipeline; the steady state is bounded by the
         straggler stage, or by a link slower than every stage; links are full duplex).
  GPipe: T_pipe = [sum_s f_s + sum_s cf_s + (m - 1) * max(max_s f_s, max_s cf_s)]
                + [sum_s b_s + sum_s cb_s + (m - 1) * max(max_s b_s, max_s cb_s)]

Transfers between stages follow `redistribution` (contiguous sample ranges); a receiving replica takes
its pieces one after another, pieces to different receivers move in parallel.
T_sync = max over stages of the all-reduce of the stage's gradients across its replicas (each replica
contributes its TP-sharded gradient bytes; replicas with different TP are bounded by the smallest TP),
plus the tied-embedding all-reduce between the first and last stage. ZeRO-3 adds the parameter
all-gathers (1.5x the all-reduce volume, Rajbhandari et al. SC'20 sec. 7).
T_update = max over workers of their optimizer step.

Memory per worker on stage i: 1F1B keeps min(P - i, m) microbatches of activations alive, GPipe m.
Cost per iteration = GPU price x T_iter for every used GPU + egress bytes x price per GB.

The per-stage and per-boundary figures come from `formulations/stage_cost.py` (`StageCosts`), the
evaluation the joint planner's model reads too (`joint.evaluate_placed`), so the two cannot drift.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hetplan.estimators import EstimatorSet, MemoryBreakdown, build_estimators
from hetplan.formulations.stage_cost import StageCosts
from hetplan.instance import Instance, relaxed_limits
from hetplan.errors import PlanError
from hetplan.plan import Plan, validate_plan


@dataclass(frozen=True)
class StageReport:
    index: int
    layer_start: int
    layer_end: int
    num_replicas: int
    fwd_s: float  # straggler replica, one pipeline step
    bwd_s: float
    send_fwd_s: float  # activations to the next stage, one step (0 on the last stage)
    send_bwd_s: float  # gradients from the next stage, one step
    sync_s: float
    update_s: float
    in_flight: int
    p2p_s: float = 0.0  # the stage's transfer time per step as the sailor iteration model counts it


@dataclass(frozen=True)
class RankMemory:
    rank: int
    stage: int
    replica: int
    tp_rank: int
    node_id: str
    gpu_type: str
    memory: MemoryBreakdown

    @property
    def oom(self) -> bool:
        return self.memory.oom


@dataclass(frozen=True)
class SimulationReport:
    plan: Plan  # placed
    iteration_time_s: float
    pipeline_s: float
    sync_s: float
    update_s: float
    samples_per_s: float
    tokens_per_s: float
    iters_per_s: float
    compute_cost_usd: float
    egress_cost_usd: float
    egress_bytes: float
    stages: list[StageReport]
    ranks: list[RankMemory]
    num_gpus: int
    gpus_by_type_zone: dict[str, int]
    constraint_violations: list[str] = field(default_factory=list)
    iteration_model: str = "hetplan"  # EstimatorSet.iteration that composed the figures
    notes: list[str] = field(default_factory=list)  # what the user should know about the figures

    @property
    def cost_per_iteration_usd(self) -> float:
        return self.compute_cost_usd + self.egress_cost_usd

    @property
    def oom_ranks(self) -> list[RankMemory]:
        return [r for r in self.ranks if r.oom]

    @property
    def feasible(self) -> bool:
        return not self.oom_ranks and not self.constraint_violations

    def peak_memory_by_stage(self) -> list[tuple[float, float]]:
        """(highest peak bytes, its capacity) per stage: the worst ratio of the stage's workers."""
        out = []
        for s in range(len(self.stages)):
            worst = max((r for r in self.ranks if r.stage == s),
                        key=lambda r: r.memory.total_bytes / r.memory.capacity_bytes)
            out.append((worst.memory.total_bytes, worst.memory.capacity_bytes))
        return out

    def summary(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s,
            "pipeline_s": self.pipeline_s,
            "sync_s": self.sync_s,
            "update_s": self.update_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "iters_per_s": self.iters_per_s,
            "cost_per_iteration_usd": self.cost_per_iteration_usd,
            "compute_cost_usd": self.compute_cost_usd,
            "egress_cost_usd": self.egress_cost_usd,
            "egress_bytes": self.egress_bytes,
            "num_gpus": self.num_gpus,
            "gpus_by_type_zone": self.gpus_by_type_zone,
            "oom_ranks": [r.rank for r in self.oom_ranks],
            "constraint_violations": self.constraint_violations,
            "iteration_model": self.iteration_model,
            "notes": self.notes,
            "stages": [s.__dict__ for s in self.stages],
            "ranks": [{"rank": r.rank, "stage": r.stage, "replica": r.replica, "tp_rank": r.tp_rank,
                       "node": r.node_id, "gpu_type": r.gpu_type, "peak_bytes": r.memory.total_bytes,
                       "capacity_bytes": r.memory.capacity_bytes, "oom": r.oom,
                       "params_bytes": r.memory.params_bytes, "grads_bytes": r.memory.grads_bytes,
                       "optimizer_bytes": r.memory.optimizer_bytes,
                       "activations_bytes": r.memory.activations_bytes,
                       "overhead_bytes": r.memory.overhead_bytes} for r in self.ranks],
        }


def in_flight_microbatches(schedule: str, stage_index: int, num_stages: int, num_microbatches: int) -> int:
    """Activations alive at the peak: 1F1B warms up with P - i microbatches on stage i, GPipe keeps all."""
    if schedule == "GPipe":
        return num_microbatches
    return min(num_stages - stage_index, num_microbatches)


def simulate(instance: Instance, plan: Plan, estimators: EstimatorSet | None = None) -> SimulationReport:
    """Simulate one training iteration of `plan` on `instance` (see the module docstring)."""
    est = estimators or build_estimators(instance)
    plan = validate_plan(instance, plan)
    if est.iteration == "sailor":
        from hetplan.simulator.sailor import simulate_sailor

        return simulate_sailor(instance, plan, est)
    if plan.batch_rounding != "exact":
        raise PlanError("batch_rounding 'ceil' (Sailor's rule) needs the sailor iteration model "
                        "(estimators: {preset: sailor})", "batch_rounding")
    sim = _Sim(instance, plan, est)
    return sim.run()


class _Sim:
    def __init__(self, instance: Instance, plan: Plan, est: EstimatorSet):
        self.inst, self.plan, self.est = instance, plan, est
        self.costs = StageCosts(instance, est)
        self.m = plan.num_microbatches
        self.P = len(plan.stages)

    def _ranks(self) -> list[RankMemory]:
        out = []
        for s, stage in enumerate(self.plan.stages):
            units = range(stage.layer_start, stage.layer_end)
            k = in_flight_microbatches(self.plan.schedule, s, self.P, self.m)
            dp = len(stage.replicas)
            for r, rep in enumerate(stage.replicas):
                mem = self.est.memory.worker_memory(rep.gpu_type, units, rep.tp, self.plan.share(s, r), dp, k)
                for t in range(rep.tp):
                    out.append(RankMemory(len(out), s, r, t, rep.node, rep.gpu_type, mem))
        return out

    def run(self) -> SimulationReport:
        """The stage figures of `StageCosts` composed into one iteration (module docstring)."""
        it, plan, P = self.costs.iteration(self.plan), self.plan, self.P
        stages = [StageReport(s, st.layer_start, st.layer_end, len(st.replicas), it.f[s], it.b[s],
                              it.links[s].fwd_s if s < P - 1 else 0.0, it.links[s].bwd_s if s < P - 1 else 0.0,
                              it.syncs[s].time_s, it.upd[s], in_flight_microbatches(plan.schedule, s, P, self.m))
                  for s, st in enumerate(plan.stages)]
        return build_report(self.inst, plan, self.est, it.iteration_s, it.pipeline_s, it.sync_s, it.update_s, stages,
                            self._ranks(), it.egress_usd, it.egress_bytes)


def build_report(instance: Instance, plan: Plan, est: EstimatorSet, t_iter: float, pipeline_s: float, sync_s: float,
                 update_s: float, stages: list[StageReport], ranks: list[RankMemory], egress_usd: float,
                 egress_bytes: float, **extra) -> SimulationReport:
    """The report of an iteration model's figures: GPU counts and compute cost (every used GPU at its
    price for t_iter), throughput, and the instance's constraints checked."""
    gpus: dict[str, int] = {}
    compute_usd = 0.0
    for stage in plan.stages:
        for rep in stage.replicas:
            node = instance.node_by_id[rep.node]
            key = f"{rep.gpu_type}@{node.zone}"
            gpus[key] = gpus.get(key, 0) + rep.tp
            compute_usd += est.cost.compute_usd(node.price_per_gpu_hour_usd, rep.tp, t_iter)
    batch = instance.workload.global_batch_size
    report = SimulationReport(
        plan=plan, iteration_time_s=t_iter, pipeline_s=pipeline_s, sync_s=sync_s, update_s=update_s,
        samples_per_s=batch / t_iter, tokens_per_s=batch * instance.model_arch.seq_len / t_iter, iters_per_s=1 / t_iter,
        compute_cost_usd=compute_usd, egress_cost_usd=egress_usd, egress_bytes=egress_bytes,
        stages=stages, ranks=ranks, num_gpus=plan.num_gpus, gpus_by_type_zone=gpus, **extra)
    return _with_violations(instance, report)


def _with_violations(instance: Instance, report: SimulationReport) -> SimulationReport:
    c, out = instance.constraints, []
    max_cost, min_its = relaxed_limits(c.max_cost_per_iteration_usd, c.min_throughput_iters_per_s)
    if max_cost is not None and report.cost_per_iteration_usd > max_cost:
        out.append(f"cost per iteration {report.cost_per_iteration_usd:.4g} USD > max {c.max_cost_per_iteration_usd:.4g}")
    if min_its is not None and report.iters_per_s < min_its:
        out.append(f"throughput {report.iters_per_s:.4g} it/s < min {c.min_throughput_iters_per_s:.4g}")
    if c.max_gpus is not None and report.num_gpus > c.max_gpus:
        out.append(f"{report.num_gpus} GPUs > max_gpus {c.max_gpus}")
    used_types = {r.gpu_type for r in report.ranks}
    if c.allowed_gpu_types is not None and used_types - set(c.allowed_gpu_types):
        out.append(f"GPU types {sorted(used_types - set(c.allowed_gpu_types))} not in allowed_gpu_types")
    used_zones = {instance.node_by_id[r.node_id].zone for r in report.ranks}
    if c.allowed_zones is not None and used_zones - set(c.allowed_zones):
        out.append(f"zones {sorted(used_zones - set(c.allowed_zones))} not in allowed_zones")
    return SimulationReport(**{**report.__dict__, "constraint_violations": out})
