"""How the model composes one iteration, stated once. `evaluate` (evaluation.py) applies these
functions to the numbers of a fixed plan, `build` (milp.py) to Pyomo variables and expressions,
and the bounds (bounds/) to lower bounds on the parts. Every function here is nondecreasing in
each part it takes, so a composition of lower bounds on the parts is a lower bound on the whole:
that is what makes each bound of bounds/ valid once its parts are.

  worker memory  stat + in_flight(i) x act of the units a worker of stage i holds <= cap[k]
                                                                        (`worker_bytes`)
  boundary       c_i = c_node + (c_inter - c_node) dn_i + (c_zone - c_inter) dz_i + (c_region - c_zone) dr_i
                 dn_i = 1 where some pair over the boundary is surely on two nodes (`apart`)
                                                                        (`boundary_s`)
  Sailor's sends p_i from A and G (`sailor_p2p`)
  bottleneck     theta >= tau_i and c_i / 2, or with Sailor's composition tau_i + p_i
                                                                        (`bottleneck_terms`)
  transfers      sum_i c_i, or sum_i p_i                                (`pipeline_transfers_s`)
  iteration      T = sum_i tau_i + transfers + (m - 1) theta + sigma + mu      (`iteration_time_s`)
  cost           rate T + egress, rate = sum over replicas of price x TP / 3600
                                             (`iteration_cost_usd`, `replica_rate_usd_per_s`)
  egress bytes   pipeline traffic per crossing boundary, the ring of a stage spanning zones, the
                 tied-embedding all-reduce between the ends (`pipeline_egress_bytes`,
                 `ring_factor`, `tied_egress_bytes`)

The figures are simulator/pipeline.py's (or with `composition="sailor"`, simulator/sailor.py's)
composition; milp.py's docstring says where the model relaxes it."""
from __future__ import annotations

from hetplan.formulations.joint.inputs import JointInputs, Pool


def worker_bytes(stat, act, in_flight: int):
    """Bytes on one worker holding units of static `stat` and per-microbatch activation `act`
    bytes with `in_flight` microbatches kept (`JointInputs.in_flight`). Numbers, arrays or
    expressions."""
    return stat + in_flight * act


def boundary_s(inp: JointInputs, dn, dz, dr):
    """One boundary's activation + gradient transfer per microbatch: c_node, plus the step to c_inter
    where some pair is surely on two nodes (dn), to c_zone where one crosses zones (dz), to c_region
    where one crosses regions (dr). dr implies dz, and dz implies dn."""
    c_node, c_inter, c_zone, c_region = _link_times_s(inp)
    return c_node + (c_inter - c_node) * dn + (c_zone - c_inter) * dz + (c_region - c_zone) * dr


def in_zone_s(inp: JointInputs, zone: str) -> float:
    """The least transfer between two nodes of `zone` (`JointInputs.inter_in_zone`; 0 where none is
    known): a boundary with both sides in that zone alone and dn = 1 takes at least it."""
    if inp.inter is None or not inp.inter_in_zone or zone not in inp.inter_in_zone:
        return 0.0
    return inp.p2p_s(inp.inter_in_zone[zone])


def _link_times_s(inp: JointInputs) -> tuple[float, float, float, float]:
    """(c_node, c_inter, c_zone, c_region), once per inputs: `evaluate` asks for them at every
    boundary of every plan the heuristics score. c_inter is the least transfer between two nodes
    (`JointInputs.inter`), at most c_zone and c_region, which are floors on pairs that cross."""
    got = inp._cache.get("link_times_s")
    if got is None:
        c_node, c_zone, c_region = (inp.p2p_s(link) for link in (inp.node, inp.zone, inp.region))
        c_inter = c_node if inp.inter is None else max(c_node, min(inp.p2p_s(inp.inter), c_zone, c_region))
        got = inp._cache["link_times_s"] = (c_node, c_inter, c_zone, c_region)
    return got


def may_share_node(a: Pool, b: Pool) -> bool:
    """Whether a replica of pool a and one of pool b can sit on one node: the same GPU type and
    zone, and both TP groups on one node of it (`Pool.node_gpus`; not known: they can)."""
    return a.quota_key == b.quota_key and (a.node_gpus is None or a.tp + b.tp <= a.node_gpus)


def apart(inp: JointInputs, left, right, first: bool = False) -> int:
    """dn of a boundary between stages with `left` and `right` replicas per pool: 1 where some pair
    over it is surely on two nodes. Replicas pair up over a boundary (equal shares), so
      - a pool of one side that shares a node with no pool the other side uses has its pairs on two
        nodes (`may_share_node`: a physical rule);
      - (first fit, the planner's placement) in a (GPU type, zone) q whose left replicas' TPs are
        each at most every right replica's TP in q, pairs that all share nodes put all of q's
        replicas of both sides on one node: the first right replica of q (the least TP) takes the
        first node N with room for it, every left replica of q found room at N or before it (N had
        room for a TP at least as large all along), every later right one none before N; so they
        share only where their GPUs fit on one node (`_crowded`); `first` (boundary 0): stage 0 is
        placed first, on empty nodes, so that node is the first node of q first fit gives its least
        TP (`Pool.first_node_gpus`), not any node of q (helper-14: seeds 285 and 538 of helper-12's
        campaign returned plans 2.07 % and 13.32 % above the optimum, a stage 0 that fills a 1-GPU node
        read as sharing a 4-GPU one with stage 1)."""
    if inp.inter is None:
        return 0
    used_l, used_r = [k for k, n in enumerate(left) if n], [k for k, n in enumerate(right) if n]

    def alone(ks, others) -> bool:
        return any(not any(may_share_node(inp.pools[k], inp.pools[o]) for o in others) for k in ks)
    if alone(used_l, used_r) or alone(used_r, used_l):
        return 1
    return 1 if any(_crowded(inp, q, left, right, first) for q in {inp.pools[k].quota_key for k in used_l}) else 0


def _crowded(inp: JointInputs, q: tuple[str, str], left, right, first: bool = False) -> bool:
    """Whether q's replicas of both sides (each side uses q) cannot all share nodes under first fit
    (`apart`): no left TP above a right one, and more GPUs than q's largest node has (`first`: than
    the node first fit gives the least TP of q on the left, `Pool.first_node_gpus`)."""
    ks = first_fit_groups(inp).get(q)
    if ks is None:
        return False
    tps = [inp.pools[k].tp for k in ks]
    ordered = max(t for t, k in zip(tps, ks) if left[k]) <= min(t for t, k in zip(tps, ks) if right[k])
    return ordered and sum(t * (left[k] + right[k]) for t, k in zip(tps, ks)) > _room(inp, ks, left, first)


def _room(inp: JointInputs, ks: list[int], left, first: bool) -> int:
    """The GPUs of the one node q's replicas of a boundary share if they all do (`_crowded`): q's
    largest; at boundary 0 the first node of q first fit gives stage 0's first replica of q, the
    least TP of q it uses (pools come in ascending TP)."""
    node = inp.pools[ks[0]].node_gpus
    if first:
        lead = inp.pools[next(k for k in ks if left[k])]
        node = lead.first_node_gpus if lead.first_node_gpus is not None else node
    return node


def first_fit_groups(inp: JointInputs) -> dict[tuple[str, str], list[int]]:
    """(GPU type, zone) -> its pools, for the groups first fit's rule (`apart`) reads: their
    largest node is known and their pools come in ascending TP (the order first fit places a
    stage's replicas of the group in)."""
    got = inp._cache.get("first_fit_groups")
    if got is None:
        groups: dict[tuple[str, str], list[int]] = {}
        for k, p in enumerate(inp.pools):
            groups.setdefault(p.quota_key, []).append(k)
        got = inp._cache["first_fit_groups"] = {
            q: ks for q, ks in groups.items() if inp.pools[ks[0]].node_gpus is not None
            and [inp.pools[k].tp for k in ks] == sorted(inp.pools[k].tp for k in ks)}
    return got


def sailor_p2p(A: list, G: list) -> list:
    """Sailor's per-stage transfer time (`estimate_p2p_pipeline_times`, simulator/sailor.py) from
    the sends A[i] (stage i's activation to stage i + 1, i < P - 1) and G[j] (stage j + 1's gradient
    back, j < P - 1): a middle stage sends its activation on and its gradient back, the first its
    activation (counted twice when P > 3), the last its gradient twice. Numbers or expressions."""
    P = len(A) + 1
    if P == 1:
        return [0.0]
    return [A[0] * first_stage_sends(P)] + [A[i] + G[i - 1] for i in range(1, P - 1)] + [2 * G[-1]]


def first_stage_sends(P: int) -> int:
    """How many times Sailor's composition counts stage 0's activation send (`sailor_p2p`): twice
    when P > 3. Every other stage of a pipeline counts two sends."""
    return 1 if P <= 3 else 2


def bottleneck_terms(inp: JointInputs, tau: list, c: list, p2p: list) -> list:
    """What the steady-state bottleneck theta is at least: every stage time, and half of every
    boundary (links are full duplex); in Sailor's composition every stage time with its sends."""
    if inp.sailor:
        return [t + p for t, p in zip(tau, p2p)]
    return list(tau) + [ci / 2 for ci in c]


def pipeline_transfers_s(inp: JointInputs, c: list, p2p: list):
    """The transfers one microbatch's way through the pipeline pays (Sailor's: each stage's sends)."""
    return sum(p2p) if inp.sailor else sum(c)


def iteration_time_s(m: int, stages_s, transfers_s, theta_s, sync_update_s):
    """T (1F1B) with m microbatches: one microbatch through every stage and boundary, m - 1 more at
    the bottleneck's pace, then the slowest all-reduce and the slowest optimizer step (sigma + mu)."""
    return stages_s + transfers_s + (m - 1) * theta_s + sync_update_s


def theta_for_time_s(m: int, time_s: float, stages_s: float, transfers_s: float, sync_update_s: float) -> float:
    """The bottleneck at which `iteration_time_s` reaches `time_s` with the other parts given (m > 1):
    a plan with these parts beats `time_s` only with a smaller theta."""
    return (time_s - stages_s - transfers_s - sync_update_s) / (m - 1)


def replica_rate_usd_per_s(pool: Pool) -> float:
    """USD per second of one replica of `pool`: its TP degree's GPUs at the pool's price."""
    return pool.price_per_gpu_hour_usd * pool.tp / 3600


def iteration_cost_usd(rate_usd_per_s, time_s, egress_usd):
    """Cost of one iteration: the GPUs' rate over the iteration time, plus egress."""
    return rate_usd_per_s * time_s + egress_usd


def pipeline_egress_bytes(inp: JointInputs) -> float:
    """Bytes over one boundary per iteration: every replica's activations forward and gradients
    back, m microbatches each."""
    return inp.m * inp.D * 2 * inp.boundary_bytes


def ring_factor(inp: JointInputs) -> float:
    """Bytes a ring all-reduce sends per byte reduced, over D members (x 1.5 with ZeRO-3)."""
    return 2 * (inp.D - 1) / inp.D * inp.sync_factor if inp.D > 1 else 0.0


def tied_egress_bytes(inp: JointInputs) -> float:
    """Bytes the tied-embedding all-reduce between the first and last stage sends (2 D members)."""
    return 2 * 2 * (2 * inp.D - 1) / (2 * inp.D) * inp.tied_grad_bytes if inp.P > 1 else 0.0


def tied_at(floors: tuple[float, float, float], ez, er):
    """A tied-embedding floor (node, zone, region) where the ends differ in zone (ez) / region (er)."""
    t_node, t_zone, t_region = floors
    return t_node + (t_zone - t_node) * ez + (t_region - t_zone) * er
