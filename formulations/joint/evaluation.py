"""The model's own figures for a solution (`evaluate`: composition.py applied to its numbers), the
same solution placed as the simulator places it (`evaluate_placed`), Sailor's sends, and the
comparisons the search keeps plans by."""
from __future__ import annotations


from hetplan.plan import Plan, Replica, Stage, validate_plan
from hetplan.formulations.joint.inputs import JointInputs, JointSolution, model_coef
from hetplan.formulations.joint.tables import offers_counts, position
from hetplan.formulations.joint.composition import (apart, boundary_s, bottleneck_terms, in_zone_s, iteration_cost_usd,
    iteration_time_s, pipeline_egress_bytes, pipeline_transfers_s, replica_rate_usd_per_s, ring_factor,
    sailor_p2p, tied_at, tied_egress_bytes)


def sailor_sends(inp: JointInputs, c: list[float], used: list[list[int]], zones: list[set], regions: list[set]
                 ) -> tuple[list[float], list[float], list[float]]:
    """(send, A, G) of a fixed assignment, as `_sailor_send_rows` computes them: per stage its send
    floor, A for stages 0..P-2, G for stages 1..P-1 (`used`: the pools each stage uses; `zones`,
    `regions`: the zones and regions it uses); a send is also at least the receive floor of every
    pool of the stage it goes to."""
    send = [max([inp.send_floor(k) for k in ks] + [0.0]) for ks in used]
    recv = [max([inp.recv_floor(k) for k in ks] + [0.0]) for ks in used]

    def away(i: int, j: int) -> float:  # stage i's send floor to stage j: its pools' floors away
        return max([inp.send_away(k)[0] for k in used[i] if inp.pools[k].zone not in zones[j]]
                   + [inp.send_away(k)[1] for k in used[i] if inp.pools[k].region not in regions[j]]
                   + [0.0])
    return (send, [max(c[i] / 2, send[i], recv[i + 1], away(i, i + 1)) for i in range(inp.P - 1)],
            [max(c[i - 1] / 2, send[i], recv[i - 1], away(i, i - 1)) for i in range(1, inp.P)])


def to_plan(sol: JointSolution, inp: JointInputs, name: str = "hetplan") -> Plan:
    stages = []
    for i, (start, end) in enumerate(sol.ranges):
        reps = []
        for k, n in enumerate(sol.replicas[i]):
            pool = inp.pools[k]
            reps += [Replica(gpu_type=pool.gpu_type, tp=pool.tp, zone=pool.zone, microbatch_share=inp.b)] * n
        stages.append(Stage(layer_start=start, layer_end=end, replicas=tuple(reps)))
    return Plan(name=name, schedule="1F1B", num_microbatches=inp.m, micro_batch_size=inp.b, stages=tuple(stages))


def evaluate(inp: JointInputs, sol: JointSolution) -> dict[str, float]:
    """The MILP's figures (T, cost and their parts) for a fixed assignment: what its rows compute, a
    relaxation of `evaluate_placed` (module docstring)."""
    used = [[k for k, n in enumerate(row) if n > 0] for row in sol.replicas]  # per stage the pools it uses
    tau = [max(sum(inp.step_s[k][l] for l in range(*sol.ranges[i])) for k in used[i]) for i in range(inp.P)]
    zones = [{inp.pools[k].zone for k in ks} for ks in used]
    regions = [{inp.pools[k].region for k in ks} for ks in used]
    span = [1 if len(z) > 1 else 0 for z in zones]
    dr = [1 if regions[i] != regions[i + 1] else 0 for i in range(inp.P - 1)]
    dz = [1 if dr[i] or (zones[i] != zones[i + 1] and not (span[i] and span[i + 1])) else 0
          for i in range(inp.P - 1)]
    dz_all = [1 if dr[i] or (zones[i] != zones[i + 1] and not (span[i] or span[i + 1])) else 0
              for i in range(inp.P - 1)]
    dn = [max(dz[i], apart(inp, sol.replicas[i], sol.replicas[i + 1], i == 0)) for i in range(inp.P - 1)]
    c = [boundary_s(inp, dn[i], dz[i], dr[i]) for i in range(inp.P - 1)]
    for i in range(inp.P - 1):  # both sides in one zone, some pair on two nodes of it
        if dn[i] and len(zones[i]) == 1 and zones[i] == zones[i + 1]:
            c[i] = max(c[i], in_zone_s(inp, next(iter(zones[i]))))
    send, A, G = sailor_sends(inp, c, used, zones, regions) if inp.sailor else ([], [], [])
    p2p = sailor_p2p(A, G) if inp.sailor else [0.0] * inp.P
    theta = max(bottleneck_terms(inp, tau, c, p2p))
    last = inp.P - 1
    ez = 1 if (span[0] or span[last] or zones[0] != zones[last]) else 0
    er = 1 if regions[0] != regions[last] else 0
    tied = {0: 0.0, last: 0.0}
    if inp.P > 1:
        ends = set(used[0]) | set(used[last]) if inp.tied_pool_s else ()
        pairs = inp.tied_pair_s or {}
        t = max([tied_at(inp.tied_pool_s[k], ez, er) for k in ends]
                + [tied_at(pairs[k, k2], ez, er) for k in used[0] for k2 in used[last] if (k, k2) in pairs], default=0.0)
        tied = {0: t, last: t}
    else:
        ez = er = 0
    sync = []
    counts = solution_blocks(inp, sol) if inp.sync_table is not None else None  # set only for identical blocks
    for i in range(inp.P):
        table = inp.span_sync_table if span[i] else inp.sync_table
        own = [0.0]  # the staircase form (layer units that differ) has no all-reduce floor
        if counts is not None and table is not None:
            own += [model_coef(table[k, position(inp, i), counts[i]]) for k in used[i]]
        if counts is not None and inp.repeat_sync_table is not None:
            twice = repeated_groups(inp, sol.replicas[i])
            own += [model_coef(inp.repeat_sync_table[k, position(inp, i), counts[i]]) for k in used[i]
                    if group_of(inp, k) in twice]
        sync.append(max(own) + tied.get(i, 0.0))
    mu = max(sum(inp.upd_s[k][l] for l in range(*sol.ranges[i])) + inp.upd_fixed(k)
             for i in range(inp.P) for k in used[i])
    T = iteration_time_s(inp.m, sum(tau), pipeline_transfers_s(inp, c, p2p), theta, max(sync) + mu)
    rate = sum(replica_rate_usd_per_s(inp.pools[k]) * sol.replicas[i][k] for i in range(inp.P) for k in used[i])
    pz, pr = inp.egress_zone_usd_per_GB / 1e9, inp.egress_region_usd_per_GB / 1e9
    egress = sum(pipeline_egress_bytes(inp) * (pz * dz_all[i] + (pr - pz) * dr[i]) for i in range(inp.P - 1))
    egress += sum(ring_factor(inp) * pz * len(zones[i]) * sum(inp.grad_bytes[l] for l in range(*sol.ranges[i]))
                  for i in range(inp.P) if span[i])
    egress += tied_egress_bytes(inp) * (pz * ez + (pr - pz) * er)
    return {"ez": ez, "er": er, "T": T, "cost": iteration_cost_usd(rate, T, egress), "egress": egress, "rate": rate,
            "tau": tau, "c": c,
            "p2p": p2p, "send": send, "A": A, "G": G, "theta": theta,
            "sync": sync, "sigma": max(sync), "mu": mu, "span": span, "dn": dn, "dz": dz, "dr": dr, "dz_all": dz_all,
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
    rate = sum(replica_rate_usd_per_s(inp.pools[k]) * n for row in sol.replicas for k, n in enumerate(row))
    T = it.iteration_s
    return {"T": T, "cost": iteration_cost_usd(rate, T, it.egress_usd), "rate": rate, "egress": it.egress_usd,
            "tau": [x + y for x, y in zip(it.f, it.b)], "c": [x.fwd_s + x.bwd_s for x in it.links],
            "sync": [x.time_s for x in it.syncs], "sigma": it.sync_s, "mu": it.update_s}


def group_of(inp: JointInputs, k: int) -> tuple[str, str]:
    """Pool k's (zone, GPU type): its replicas share the communication estimator's figures."""
    return (inp.pools[k].zone, inp.pools[k].gpu_type)


def repeated_groups(inp: JointInputs, row: tuple[int, ...]) -> set[tuple[str, str]]:
    """The (zone, GPU type) groups holding two or more of a stage's replicas (`row`: per pool)."""
    count: dict[tuple[str, str], int] = {}
    for k, n in enumerate(row):
        if n:
            g = group_of(inp, k)
            count[g] = count.get(g, 0) + n
    return {g for g, n in count.items() if n >= 2}


def better(current: tuple | None, candidate: tuple | None) -> tuple | None:
    """The one of two (objective, ...) results with the smaller objective (the current one on a
    tie); None counts as none."""
    if candidate is None or (current is not None and current[0] <= candidate[0]):
        return current
    return candidate


def objective_within_limits(inp: JointInputs, sol: JointSolution, objective: str, max_cost_usd: float | None = None,
                            min_iters_per_s: float | None = None) -> float | None:
    """The plan's objective (cost for min cost, T otherwise) by the model's own figures
    (`evaluate`), or None when it breaks the budget, the minimum throughput or max_gpus (the
    greedy fills stages from the quotas alone: with max_gpus 1 on a 2-GPU node it returned two
    replicas, and the search kept that plan)."""
    if inp.max_gpus is not None and gpus_used(inp, sol) > inp.max_gpus:
        return None
    ev = evaluate(inp, sol)
    if (max_cost_usd is not None and ev["cost"] > max_cost_usd) or (
            min_iters_per_s is not None and ev["T"] > 1 / min_iters_per_s):
        return None
    return ev["cost"] if objective == "min_cost" else ev["T"]


def gpus_used(inp: JointInputs, sol: JointSolution) -> int:
    """GPUs of a solution: its replicas' TP degrees, summed."""
    return sum(inp.pools[k].tp * n for row in sol.replicas for k, n in enumerate(row))


def solution_blocks(inp: JointInputs, sol: JointSolution) -> list[int] | None:
    """Blocks per stage of `sol` in the compact form, or None when it lies outside it (a count that
    `block_counts` does not offer: the embedding alone on stage 0 where the first block differs)."""
    counts = [e - s for s, e in sol.ranges]
    counts[0] -= 1
    counts[-1] -= 1
    return counts if offers_counts(inp, counts) else None


def blocks_ranges(counts: list[int]) -> list[tuple[int, int]]:
    """The unit ranges of stages holding `counts` blocks (`solution_blocks`' inverse): stage 0 also
    holds the embedding, the last stage the head."""
    ranges, start = [], 0
    for i, n in enumerate(counts):
        width = n + (i == 0) + (i == len(counts) - 1)
        ranges.append((start, start + width))
        start += width
    return ranges
