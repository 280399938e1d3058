"""An independent reference: every plan of the joint planner's modelled space, scored by `simulate`.

Brute force for tiny instances (a few GPUs, a few blocks). It shares no code with the planner's
model (`formulations/joint/milp.py`): the space is rebuilt here from the instance, rule by rule, and
every plan is scored by the simulator, which is the reference. The rules, with the place in
orchestration/planner/ (and formulations/joint/milp.py) each one mirrors:

  R1 quotas (planner/inputs.py `_quotas`): GPUs per (GPU type, zone) after allowed_gpu_types /
     allowed_zones; GPUs per node = the least over the zone's node groups of that type.
  R2 pools (planner/inputs.py `_Tables.pool_rows`, planner/search.py `_splittable_tps`): (type, zone)
     in sorted order, then each TP of `tp_choices` in its order, with t <= GPUs per node, GPUs per
     node % t == 0, t <= the quota, and t dividing the model's heads, KV heads and MLP width
     (Megatron's split; without it GPT-Neo-2.7B's 20 heads at TP 8 ended the enumeration in the
     plan validator's refusal). (Pools whose memory cannot hold a single unit are dropped there; here their plans
     are simply OOM in simulation and skipped, R10.)
  R3 outer choices (planner/inputs.py `enumerate_combos`): P = 1..min(U, max_stages), b in
     `microbatch_sizes` dividing B, D dividing B / b, P x D <= sum over quotas of
     GPUs // min(tp_choices).
  R4 batch (planner/inputs.py `joint_inputs`: m = B // (D b); joint/evaluation.py `to_plan`): every replica takes b
     sequences, m = B / (D b) microbatches, 1F1B.
  R5 replicas (joint/milp.py `_replica_constraints`: sum_k x[i,k] = D): exactly D replicas per stage,
     any mix of pools (types, TP degrees and zones may differ inside a stage).
  R6 quota (joint/milp.py `_replica_constraints`, m.quota and m.max_gpus): per (type, zone) the TP
     degrees of every replica of every stage sum to at most the quota; all GPUs <= max_gpus.
  R7 region (joint/milp.py `_placement_constraints`, m.one_region / m.in_region): a stage's replicas
     sit in one region.
  R8 layers (joint/milp.py `_layer_constraints`, joint/tables.py `block_counts`): contiguous non-empty unit ranges in
     stage order, the embedding alone on stage 0 included: every preset and `arch` model has all its
     blocks alike, the first too (joint/tables.py `first_block_generic`; only profiles that time the
     first block apart, as Sailor's, keep it on stage 0: `first_needs_block=True`).
  R9 decoding (joint/evaluation.py `to_plan`): a stage lists its replicas pool by pool in pool order, no node
     given, so `validate_plan` places them first fit in (stage, replica) order (`placement_order`: the
     cheapest node first, then the widest).
  R10 memory and limits: plans with an OOM rank are skipped; a budget / throughput floor is
     checked on the simulated cost / iteration time with the simulator's 1e-9 tolerance
     (simulator.py `_with_violations`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

from hetplan.estimators import build_estimators
from hetplan.instance import Instance
from hetplan.plan import Plan, Replica, Stage
from hetplan.simulator import simulate

# the planner's defaults (planner/options.py `PlannerOptions`)
TP_CHOICES: tuple[int, ...] = (1, 2, 4, 8)
MICROBATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16)
MAX_STAGES = 16
LIMIT_TOL = 1e-9  # simulator.py `_with_violations`


@dataclass(frozen=True)
class RefPool:
    gpu_type: str
    zone: str
    region: str
    tp: int


@dataclass(frozen=True)
class Quota:
    gpus: int
    per_node: int


@dataclass(frozen=True)
class Scored:
    """One plan of the space with the simulator's figures."""

    plan: Plan
    P: int
    b: int
    D: int
    iteration_time_s: float
    cost_usd: float

    def objective(self, kind: str) -> float:
        return self.cost_usd if kind == "min_cost" else self.iteration_time_s

    def within(self, max_cost: float | None, min_its: float | None) -> bool:
        if max_cost is not None and self.cost_usd > max_cost * (1 + LIMIT_TOL):
            return False
        return min_its is None or 1 / self.iteration_time_s >= min_its * (1 - LIMIT_TOL)


def quotas(instance: Instance) -> dict[tuple[str, str], Quota]:
    """R1."""
    c = instance.constraints
    out: dict[tuple[str, str], Quota] = {}
    for g in instance.cluster.node_groups:
        if c.allowed_gpu_types is not None and g.gpu_type not in c.allowed_gpu_types:
            continue
        if c.allowed_zones is not None and g.zone not in c.allowed_zones:
            continue
        old = out.get((g.gpu_type, g.zone), Quota(0, g.gpus_per_node))
        out[g.gpu_type, g.zone] = Quota(old.gpus + g.count * g.gpus_per_node, min(old.per_node, g.gpus_per_node))
    return {k: q for k, q in out.items() if q.gpus > 0}


def pools(instance: Instance, tp_choices: tuple[int, ...] = TP_CHOICES) -> list[RefPool]:
    """R2, in the planner's pool order (R9 lists replicas in it)."""
    region = {g.zone: g.region_name for g in instance.cluster.node_groups}
    arch = instance.model_arch
    sizes = [arch.num_heads, arch.ffn_hidden_size] + ([arch.num_kv_heads] if arch.num_kv_heads is not None else [])
    out = []
    for (g, z), q in sorted(quotas(instance).items()):
        out += [RefPool(g, z, region[z], t) for t in tp_choices
                if t <= q.per_node and q.per_node % t == 0 and t <= q.gpus and all(n % t == 0 for n in sizes)]
    return out


def outer_choices(instance: Instance, tp_choices: tuple[int, ...] = TP_CHOICES,
                  microbatch_sizes: tuple[int, ...] = MICROBATCH_SIZES,
                  max_stages: int = MAX_STAGES) -> list[tuple[int, int, int]]:
    """R3: (P, b, D)."""
    B = instance.workload.global_batch_size
    U = instance.model_arch.num_units
    max_replicas = sum(q.gpus // min(tp_choices) for q in quotas(instance).values())
    return [(P, b, D) for P in range(1, min(U, max_stages) + 1) for b in microbatch_sizes if B % b == 0
            for D in range(1, B // b + 1) if (B // b) % D == 0 and P * D <= max_replicas]


def layer_splits(U: int, P: int, first_needs_block: bool) -> Iterator[tuple[tuple[int, int], ...]]:
    """R8: contiguous non-empty ranges of units 0..U-1 over P stages."""
    for cuts in itertools.combinations(range(1, U), P - 1):
        if first_needs_block and P > 1 and cuts[0] < 2:
            continue  # stage 0 would hold the embedding alone
        bounds = (0, *cuts, U)
        yield tuple((bounds[i], bounds[i + 1]) for i in range(P))


def stage_mixes(pool_list: list[RefPool], D: int) -> list[tuple[int, ...]]:
    """R5 + R7: replica counts per pool of one stage, D in all, one region."""
    out = []
    for combo in itertools.combinations_with_replacement(range(len(pool_list)), D):
        if len({pool_list[k].region for k in combo}) == 1:
            out.append(tuple(combo.count(k) for k in range(len(pool_list))))
    return out


def assignments(instance: Instance, pool_list: list[RefPool], P: int, D: int) -> Iterator[tuple[tuple[int, ...], ...]]:
    """R5-R7: replica counts per (stage, pool) within the quotas and max_gpus."""
    left = {k: q.gpus for k, q in quotas(instance).items()}
    max_gpus = instance.constraints.max_gpus
    mixes = stage_mixes(pool_list, D)

    def gpus(mix: tuple[int, ...]) -> dict[tuple[str, str], int]:
        need: dict[tuple[str, str], int] = {}
        for k, n in enumerate(mix):
            p = pool_list[k]
            need[p.gpu_type, p.zone] = need.get((p.gpu_type, p.zone), 0) + n * p.tp
        return need

    needs = [gpus(mix) for mix in mixes]

    def walk(prefix: tuple, used: int) -> Iterator[tuple[tuple[int, ...], ...]]:
        if len(prefix) == P:
            yield prefix
            return
        for mix, need in zip(mixes, needs):
            total = sum(need.values())
            if any(left[q] < n for q, n in need.items()) or (max_gpus is not None and used + total > max_gpus):
                continue
            for q, n in need.items():
                left[q] -= n
            yield from walk(prefix + (mix,), used + total)
            for q, n in need.items():
                left[q] += n

    yield from walk((), 0)


def build_plan(pool_list: list[RefPool], ranges: tuple[tuple[int, int], ...], counts: tuple[tuple[int, ...], ...],
               b: int, m: int) -> Plan:
    """R4 + R9."""
    stages = []
    for (start, end), mix in zip(ranges, counts):
        reps: list[Replica] = []
        for k, n in enumerate(mix):
            p = pool_list[k]
            reps += [Replica(gpu_type=p.gpu_type, tp=p.tp, zone=p.zone, microbatch_share=b)] * n
        stages.append(Stage(layer_start=start, layer_end=end, replicas=tuple(reps)))
    return Plan(name="enumerated", schedule="1F1B", num_microbatches=m, micro_batch_size=b, stages=tuple(stages))


def space(instance: Instance, tp_choices: tuple[int, ...] = TP_CHOICES,
          microbatch_sizes: tuple[int, ...] = MICROBATCH_SIZES, max_stages: int = MAX_STAGES,
          first_needs_block: bool = False) -> Iterator[tuple[int, int, int, Plan]]:
    """Every plan of the modelled space, with its (P, b, D). `first_needs_block`: leave out plans
    whose stage 0 holds the embedding alone (R8)."""
    pool_list = pools(instance, tp_choices)
    U, B = instance.model_arch.num_units, instance.workload.global_batch_size
    for P, b, D in outer_choices(instance, tp_choices, microbatch_sizes, max_stages):
        splits = list(layer_splits(U, P, first_needs_block))
        for counts in assignments(instance, pool_list, P, D):
            for ranges in splits:
                yield P, b, D, build_plan(pool_list, ranges, counts, b, B // (D * b))


def score_space(instance: Instance, **space_args) -> list[Scored]:
    """R10: every plan of `space` that fits in memory, simulated."""
    out, est = [], build_estimators(instance)  # once: a Sailor preset reads its profile files
    for P, b, D, plan in space(instance, **space_args):
        rep = simulate(instance, plan, est)
        if not rep.oom_ranks:
            out.append(Scored(rep.plan, P, b, D, rep.iteration_time_s, rep.cost_per_iteration_usd))
    return out


def optimum(scored: list[Scored], objective: str, max_cost: float | None = None,
            min_its: float | None = None) -> Scored | None:
    """The best plan by the simulator within the limits (R10), or None when none meets them."""
    ok = [s for s in scored if s.within(max_cost, min_its)]
    return min(ok, key=lambda s: s.objective(objective)) if ok else None
