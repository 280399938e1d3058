"""Estimators against hand-computed values and published figures."""
import math

import pytest

from hetplan.catalog import LinkSpec, model_presets
from hetplan.estimators.analytic import AnalyticMemory, ring_allreduce_s, state_bytes, zero_divisors
from hetplan.estimators.base import SPANS, Endpoint, NodeKind, bottleneck_floor_s
from hetplan.estimators.cost import CloudCost
from hetplan.estimators.model_stats import (
    boundary_activation_bytes,
    megatron_block_activation_bytes,
    total_params,
    unit_activation_bytes,
    unit_flops_fwd,
    unit_params,
)
from hetplan.estimators.network import AlphaBetaComm
from hetplan.instance import Egress, EgressPrice, Network, ZonePairLink

OPT = model_presets()["OPT-350M"]
LLAMA7 = model_presets()["Llama-7B"]


def test_gpt_block_params_match_12h2_plus_13h():
    # GPT-2-style block: 12 h^2 + 13 h parameters; for OPT-350M (h = 1024) this is also the
    # params_floats Sailor measured for layer 1 (llm_info.json: 12596224).
    h = OPT.hidden_size
    assert unit_params(OPT, 1).total == 12 * h * h + 13 * h == 12_596_224


def test_llama7b_parameter_count_is_the_published_one():
    # Llama-7B has 6,738,415,616 parameters (the count of the released checkpoint).
    assert total_params(LLAMA7) == 6_738_415_616


def test_opt350m_parameter_count_by_hand():
    h, v, s, L = 1024, 50272, 2048, 24
    expected = v * h + s * h + L * (12 * h * h + 13 * h) + 2 * h  # tied head: only its final norm
    assert total_params(OPT) == expected == 355_887_104


def test_adam_mixed_precision_is_16_bytes_per_param():
    sb = state_bytes("fp16", "adam")
    assert (sb.param, sb.grad, sb.optimizer) == (2, 2, 12)
    # ZeRO paper, Figure 1: Psi = 7.5B, K = 12, N_d = 64 -> 120 GB baseline, 31.4 GB with P_os.
    psi = 7.5e9
    assert psi * (sb.param + sb.grad + sb.optimizer) / 1e9 == pytest.approx(120.0)
    dp, dg, do = zero_divisors(1, 64)
    assert psi * (sb.param / dp + sb.grad / dg + sb.optimizer / do) / 1e9 == pytest.approx(31.4, abs=0.05)
    dp, dg, do = zero_divisors(2, 64)
    assert psi * (sb.param / dp + sb.grad / dg + sb.optimizer / do) / 1e9 == pytest.approx(16.6, abs=0.05)
    dp, dg, do = zero_divisors(3, 64)
    assert psi * (sb.param / dp + sb.grad / dg + sb.optimizer / do) / 1e9 == pytest.approx(1.88, abs=0.01)


def test_worker_memory_of_whole_llama7b_is_16_bytes_per_param_plus_overhead():
    gpus = {"A100-80": __import__("hetplan.catalog", fromlist=["gpu_catalog"]).gpu_catalog()["A100-80"]}
    mem = AnalyticMemory(LLAMA7, gpus, precision="bf16", optimizer="adam", zero_stage=0, recompute="none",
                         flash_attention=True, overhead_gib=0.0)
    m = mem.worker_memory("A100-80", range(LLAMA7.num_units), tp=1, microbatch=1, dp=1, in_flight=0)
    assert m.params_bytes + m.grads_bytes + m.optimizer_bytes == 16 * 6_738_415_616
    assert m.oom  # 107.8 GB of model states cannot fit 80 GiB


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_block_activations_match_megatron_formula(tp):
    # Korthikanti et al. 2022: s b h (10 + 24/t + 5 a s / (h t)) bytes per block, no sequence parallelism.
    s, b, h, a = OPT.seq_len, 2, OPT.hidden_size, OPT.num_heads
    got = unit_activation_bytes(OPT, 1, b, tp, precision="fp16")
    assert got == pytest.approx(megatron_block_activation_bytes(s, b, h, a, tp))
    assert megatron_block_activation_bytes(2048, 1, 1024, 16, 1) == 2048 * 1024 * (34 + 160)


def test_recomputation_variants():
    s, h = OPT.seq_len, OPT.hidden_size
    assert unit_activation_bytes(OPT, 1, 1, 1, recompute="selective") == pytest.approx(34 * s * h)
    assert unit_activation_bytes(OPT, 1, 1, 1, flash_attention=True) == pytest.approx(34 * s * h)
    assert unit_activation_bytes(OPT, 1, 1, 4, recompute="full") == pytest.approx(2 * s * h)


def test_block_flops_match_24sh2_plus_4s2h():
    s, h = OPT.seq_len, OPT.hidden_size
    assert unit_flops_fwd(OPT, 1, 3) == pytest.approx(3 * (24 * s * h * h + 4 * s * s * h))
    assert unit_flops_fwd(OPT, 0, 3) == 0
    assert unit_flops_fwd(OPT, OPT.num_units - 1, 1) == 2 * s * h * OPT.vocab_size


def test_ring_allreduce_by_hand():
    link = LinkSpec(kind="nvlink", bandwidth_GBps=300, latency_s=5e-6)
    # 4 members, 1 GB each: 2 * 3/4 * 1e9 / 300e9 + 6 * 5e-6
    assert ring_allreduce_s(1e9, 4, link) == pytest.approx(0.005 + 3e-5)
    assert ring_allreduce_s(1e9, 1, link) == 0.0


def _net():
    return Network(
        inter_node=LinkSpec(bandwidth_GBps=10, latency_s=1e-5),
        inter_zone=LinkSpec(bandwidth_GBps=4, latency_s=1e-3),
        inter_region=LinkSpec(bandwidth_GBps=1, latency_s=3e-2),
        zone_pairs=[ZonePairLink(zones=("r1-a", "r1-c"), bandwidth_GBps=2, latency_s=2e-3)],
    )


NVL = LinkSpec(kind="nvlink", bandwidth_GBps=100, latency_s=1e-6)


def test_link_classes_and_p2p():
    comm = AlphaBetaComm(_net(), "ring")
    a = Endpoint("r1-a", "r1", "n0", NVL)
    assert comm.link(a, Endpoint("r1-a", "r1", "n0", NVL)) == NVL
    assert comm.link(a, Endpoint("r1-a", "r1", "n1", NVL)).bandwidth_GBps == 10
    assert comm.link(a, Endpoint("r1-b", "r1", "n2", NVL)).bandwidth_GBps == 4
    assert comm.link(a, Endpoint("r1-c", "r1", "n3", NVL)).bandwidth_GBps == 2  # zone-pair override
    assert comm.link(a, Endpoint("r2-a", "r2", "n4", NVL)).bandwidth_GBps == 1
    assert comm.p2p_time_s(a, Endpoint("r2-a", "r2", "n4", NVL), 2e9) == pytest.approx(3e-2 + 2.0)


def test_ring_is_bounded_by_slowest_link_and_hierarchical_helps():
    members = [Endpoint("r1-a", "r1", "n0", NVL)] * 4 + [Endpoint("r1-a", "r1", "n1", NVL)] * 4
    ring = AlphaBetaComm(_net(), "ring").allreduce_time_s(members, 1e9)
    assert ring == pytest.approx(2 * 7 / 8 * 1e9 / 10e9 + 14 * 1e-5)
    hier = AlphaBetaComm(_net(), "hierarchical").allreduce_time_s(members, 1e9)
    intra = 2 * 3 / 4 * 1e9 / 100e9 + 6 * 1e-6
    inter = 2 * 1 / 2 * 1e9 / 10e9 + 2 * 1e-5
    assert hier == pytest.approx(intra + inter)
    assert AlphaBetaComm(_net(), "best").allreduce_time_s(members, 1e9) == pytest.approx(min(ring, hier))


@pytest.mark.parametrize("mode", ["ring", "hierarchical", "best"])
def test_batched_allreduce_equals_one_call_per_size(mode):
    members = ([Endpoint("r1-a", "r1", "n0", NVL)] * 3 + [Endpoint("r1-a", "r1", "n1", NVL)] * 4
               + [Endpoint("r1-b", "r1", "n2", NVL)] * 2)
    comm = AlphaBetaComm(_net(), mode)
    sizes = [0.0, 1e3, 1e6, 2.5e8, 1e9]
    for group in (members, members[:1], members[:4]):
        assert comm.allreduce_times_s(group, sizes) == [comm.allreduce_time_s(group, n) for n in sizes]


def test_egress_prices():
    cost = CloudCost(Egress(inter_zone_usd_per_GB=0.01, inter_region_usd_per_GB=0.02,
                            pairs=[EgressPrice(zones=("r1-a", "r1-c"), usd_per_GB=0.05)]))
    a = Endpoint("r1-a", "r1")
    assert cost.egress_usd(a, Endpoint("r1-a", "r1"), 1e9) == 0
    assert cost.egress_usd(a, Endpoint("r1-b", "r1"), 2e9) == pytest.approx(0.02)
    assert cost.egress_usd(a, Endpoint("r1-c", "r1"), 1e9) == pytest.approx(0.05)
    assert cost.egress_usd(a, Endpoint("r2-a", "r2"), 1e9) == pytest.approx(0.02)
    assert cost.compute_usd(3.6, 2, 10.0) == pytest.approx(0.02)


def test_analytic_time_roofline_and_tp(a100_v100):
    from hetplan.estimators import build_estimators

    est = build_estimators(a100_v100)
    gpu = a100_v100.gpu("A100-40")
    lt = est.time.layer_time("A100-40", 1, 4, 1)
    flops = unit_flops_fwd(a100_v100.model_arch, 1, 4)
    assert lt.fwd_s == pytest.approx(flops / (gpu.peak_fp16_tflops * 1e12 * gpu.default_mfu))
    assert lt.bwd_s == pytest.approx(2 * lt.fwd_s)
    lt2 = est.time.layer_time("A100-40", 1, 4, 2)
    assert lt2.fwd_s > lt.fwd_s / 2  # halved compute plus the TP all-reduces
    assert math.isclose(est.time.layer_time("A100-40", 1, 4, 1).fwd_s, lt.fwd_s)  # cached, stable


def _alpha_beta_on_nodes(per_node: int, count: int, mode: str) -> tuple:
    """(instance, `AlphaBetaComm` in `mode`, node endpoints, (endpoint, slots) per node) of `count`
    A100 nodes of `per_node` GPUs in one zone."""
    from hetplan.estimators.network import AlphaBetaComm
    from hetplan.formulations.stage_cost import node_endpoint
    from hetplan.instance import instance_from_dict

    inst = instance_from_dict({
        "name": "nodes",
        "cluster": {"node_groups": [{"name": "a", "gpu_type": "A100-40", "gpus_per_node": per_node, "count": count,
                                     "zone": "us-central1-a", "price_per_gpu_hour_usd": 3.0}]},
        "workload": {"model": {"preset": "OPT-350M"}, "global_batch_size": 8}})
    eps = [node_endpoint(n) for n in inst.nodes]
    return inst, AlphaBetaComm(inst.cluster.network, allreduce=mode), eps, [(e, per_node) for e in eps]


@pytest.mark.parametrize("mode", ["ring", "hierarchical", "best"])
def test_alpha_beta_allreduce_floor_bounds_every_placement_on_at_least_min_nodes(mode):
    """`AlphaBetaComm.allreduce_floor_s` with `min_nodes` is at most `allreduce_time_s` of every list
    of members that sits on at least min_nodes nodes (each node holding at most its slots), by
    enumeration: four 2-GPU nodes in one zone. It grows with min_nodes in the hierarchical mode (its
    ring joins one leader per node used)."""
    import itertools

    _, comm, eps, nodes = _alpha_beta_on_nodes(2, 4, mode)
    sizes = [1e3, 3e6, 7e8]
    checked, rises = 0, 0
    for members in (2, 3, 4, 5, 6):
        for min_nodes in (1, 2, 3, 4):
            floors = comm.allreduce_floor_s(nodes, members, sizes, "node", min_nodes)
            for seq in itertools.combinations_with_replacement(range(len(eps)), members):
                if any(seq.count(i) > 2 for i in seq) or len(set(seq)) < min_nodes:
                    continue
                for n, floor in zip(sizes, floors):
                    assert floor <= comm.allreduce_time_s([eps[i] for i in seq], n) * (1 + 1e-12), \
                        (mode, members, min_nodes, seq, n)
                    checked += 1
            if min_nodes > 2:  # (from 1 to 2 the one-node ring drops out in every mode)
                rises += floors[-1] > comm.allreduce_floor_s(nodes, members, sizes, "node", min_nodes - 1)[-1]
    assert checked > 300
    assert rises > 0 or mode == "ring"


@pytest.mark.parametrize("mode", ["hierarchical", "best"])
def test_alpha_beta_allreduce_floor_counts_the_fullest_nodes_inside_ring(mode):
    """On three 4-GPU nodes in one zone, `AlphaBetaComm.allreduce_floor_s` is at most
    `allreduce_time_s` of every list of members on them (by enumeration), and equals the least of
    them for some (members, min_nodes): the hierarchical all-reduce's fullest node holds
    ceil(members / nodes used) of them and rings inside first. The floor of the leaders' ring
    alone (what the floor was before) is below it somewhere, or the inside ring is not exercised."""
    import itertools

    from hetplan.estimators.network import ring_allreduce_time_s

    inst, comm, eps, nodes = _alpha_beta_on_nodes(4, 3, mode)
    inter = inst.cluster.network.inter_node
    sizes = [1e3, 3e6, 7e8]
    checked = exact = above_leaders = 0
    for members in range(2, 13):
        for min_nodes in (1, 2, 3):
            floors = comm.allreduce_floor_s(nodes, members, sizes, "node", min_nodes)
            least = [math.inf] * len(sizes)
            for seq in itertools.combinations_with_replacement(range(len(eps)), members):
                if any(seq.count(i) > 4 for i in seq) or len(set(seq)) < min_nodes:
                    continue
                for j, (n, floor) in enumerate(zip(sizes, floors)):
                    t = comm.allreduce_time_s([eps[i] for i in seq], n)
                    assert floor <= t * (1 + 1e-12), (mode, members, min_nodes, seq, n)
                    least[j] = min(least[j], t)
                    checked += 1
            exact += any(f == pytest.approx(t, rel=1e-12) for f, t in zip(floors, least) if t < math.inf)
            spread = -(-members // 4)
            leaders = max(2, spread, min(min_nodes, members))
            if members > 4 or min_nodes >= 2:  # on two nodes or more: the old floor was the leaders' ring
                above_leaders += floors[-1] > ring_allreduce_time_s(sizes[-1], leaders, inter.bandwidth_GBps * 1e9,
                                                                    inter.latency_s) * (1 + 1e-9)
    assert checked > 800 and exact > 0 and above_leaders > 0, (checked, exact, above_leaders)


@pytest.mark.parametrize("mode", ["ring", "best"])
def test_alpha_beta_flat_ring_floor_counts_two_members_on_a_slow_node(mode):
    """Four 2-GPU nodes on 8 GB/s PCIe (one at 16 GB/s) over a 25 GB/s network: a ring of more members
    than nodes puts two on one node, side by side, so its slowest edge is at most the fastest PCIe
    link, not the network (helper-13's seed 194: four A10G replicas on two 16 GB/s nodes were floored
    at the network). The floor stays at most every placement (enumerated) and rises above the
    network-only ring there."""
    import itertools

    from hetplan.estimators.network import AlphaBetaComm, ring_allreduce_time_s
    from hetplan.formulations.stage_cost import node_endpoint
    from hetplan.instance import instance_from_dict

    net = {"kind": "ethernet", "bandwidth_GBps": 25.0, "latency_s": 1e-5}
    groups = [{"name": name, "gpu_type": "A10G", "gpus_per_node": 2, "count": count, "zone": "us-central1-a",
               "price_per_gpu_hour_usd": 1.0, "intra_node": {"kind": "pcie", "bandwidth_GBps": bw, "latency_s": 2e-6}}
              for name, count, bw in (("slow", 3, 8.0), ("less", 1, 16.0))]
    inst = instance_from_dict({"name": "pcie", "cluster": {"node_groups": groups, "network": {"inter_node": net}},
                               "workload": {"model": {"preset": "OPT-350M"}, "global_batch_size": 8}})
    comm = AlphaBetaComm(inst.cluster.network, allreduce=mode)
    eps = [node_endpoint(n) for n in inst.nodes]
    nodes = [(e, 2) for e in eps]
    sizes = [1e3, 3e6, 7e8]
    checked = above = 0
    for members in range(2, 9):
        floors = comm.allreduce_floor_s(nodes, members, sizes, "node", 2)
        for seq in itertools.combinations_with_replacement(range(len(eps)), members):
            if any(seq.count(i) > 2 for i in seq) or len(set(seq)) < 2:
                continue
            for n, floor in zip(sizes, floors):
                assert floor <= comm.allreduce_time_s([eps[i] for i in seq], n) * (1 + 1e-12), (members, seq, n)
                checked += 1
        network_only = ring_allreduce_time_s(sizes[-1], members, 25e9, 1e-5)
        above += mode == "ring" and members > 4 and floors[-1] > network_only * (1 + 1e-9)
    assert checked > 200 and (above == 4 or mode == "best"), (checked, above)


def test_alpha_beta_hierarchical_floor_is_exact_over_nodes_of_different_links():
    """One 2-GPU node on NVLink and two on 16 GB/s PCIe in one zone: the hierarchical all-reduce costs
    its slowest inside ring (each node's own link) plus the leaders' ring, so its floor over every
    placement on at least min_nodes nodes is the least of them, by enumeration (it read the fastest
    link of any node with the slots: 2 + 2 members on the NVLink and a PCIe node were floored at two
    NVLink rings, helper-13's seed 29)."""
    import itertools

    from hetplan.estimators.network import AlphaBetaComm
    from hetplan.formulations.stage_cost import node_endpoint
    from hetplan.instance import instance_from_dict

    groups = [{"name": "nv", "gpu_type": "V100-16", "gpus_per_node": 2, "count": 1, "zone": "us-central1-a",
               "price_per_gpu_hour_usd": 1.0},
              {"name": "pcie", "gpu_type": "A10G", "gpus_per_node": 2, "count": 2, "zone": "us-central1-a",
               "price_per_gpu_hour_usd": 1.0, "intra_node": {"kind": "pcie", "bandwidth_GBps": 16.0, "latency_s": 2e-6}}]
    inst = instance_from_dict({"name": "links", "cluster": {"node_groups": groups},
                               "workload": {"model": {"preset": "OPT-350M"}, "global_batch_size": 8,
                                            "precision": "fp16"}})
    comm = AlphaBetaComm(inst.cluster.network, allreduce="hierarchical")
    eps = [node_endpoint(n) for n in inst.nodes]
    sizes = [1e3, 3e6, 7e8]
    exact = 0
    for members in range(2, 7):
        for min_nodes in range(1, min(members, 3) + 1):
            floors = comm.allreduce_floor_s([(e, 2) for e in eps], members, sizes, "node", min_nodes)
            least = [min((comm.allreduce_time_s([eps[i] for i in seq], n)
                          for seq in itertools.combinations_with_replacement(range(3), members)
                          if max(seq.count(i) for i in seq) <= 2 and len(set(seq)) >= min_nodes), default=math.inf)
                     for n in sizes]
            assert floors == pytest.approx(least, rel=1e-12), (members, min_nodes)
            exact += least[-1] < math.inf
    assert exact >= 10


def _spans_as(spans: str, places: set) -> bool:
    """Whether a list over these (region, zone) places spans as `spans` says (estimators.base.SPANS)."""
    regions = [r for r, _ in places]
    if spans == "node":
        return len(places) == 1
    if spans == "zone":
        return len(regions) > len(set(regions))
    return len(set(regions)) > 1


def test_bottleneck_floor_is_below_every_list_of_kinds_by_enumeration():
    """`bottleneck_floor_s` against every list of members over random kinds (zones, regions, how many
    members each holds) and random pair times: at most the least slowest pair of the lists that span
    as asked (inf when there is none), equal to it on most cases, and above the least single pair of
    that kind (the floor before the kinds' capacities were counted) on some."""
    import itertools
    import random

    rng = random.Random(11)
    checked = met = rose = 0
    for _ in range(150):
        kinds = [NodeKind(zone=f"z{rng.randint(0, 2)}", region=f"r{rng.randint(0, 1)}", total=rng.randint(1, 3))
                 for _ in range(rng.randint(2, 4))]
        place = [(k.region, k.zone) for k in kinds]
        pairs = {(i, j): rng.choice([0.5, 1.0, 1.5, 2.0, 2.5]) for i in range(len(kinds)) for j in range(i, len(kinds))
                 if rng.random() < 0.85}
        members = rng.randint(2, 5)
        for spans in SPANS:
            pair_s = {ij: t for ij, t in pairs.items() if spans != "node" or place[ij[0]] == place[ij[1]]}
            best = math.inf
            for seq in itertools.product(range(len(kinds)), repeat=members):
                if any(seq.count(i) > k.total for i, k in enumerate(kinds)) or not _spans_as(spans, {place[i] for i in seq}):
                    continue
                steps = [pair_s.get((min(a, b), max(a, b))) for a, b in zip(seq, seq[1:])]
                if None not in steps:
                    best = min(best, max(steps))
            floor = bottleneck_floor_s(kinds, members, spans, pair_s)
            assert floor <= best, (kinds, pair_s, members, spans)
            single = min((t for (i, j), t in pair_s.items() if spans == "node" or _spans_as(spans, {place[i], place[j]})),
                         default=math.inf)
            checked += best < math.inf
            met += floor == best < math.inf
            rose += single < floor < math.inf
    assert checked >= 200 and met >= 0.8 * checked and rose >= 20, (checked, met, rose)


@pytest.mark.parametrize("options, pattern", [
    ({"mfu": -5}, r"estimators\.options\.mfu: must map GPU types to shares of peak in \(0, 1\], got -5"),
    ({"mfu": {"A100-40": 0}}, r"estimators\.options\.mfu\.A100-40: must be a share of peak in \(0, 1\], got 0"),
    ({"mfu": {"A100-40": "x"}}, r"estimators\.options\.mfu\.A100-40: .* got 'x'"),
    ({"mfu": {"A100-40": 1.5}}, r"estimators\.options\.mfu\.A100-40: .* got 1\.5"),
    ({"mfu": {"A100": 0.5}}, r"estimators\.options\.mfu: \['A100'\] are no GPU type of the cluster"),
    ({"framework_overhead_GiB": "x"}, r"estimators\.options\.framework_overhead_GiB: must be a number in \[0, 1024\]"),
    ({"framework_overhead_GiB": -1}, r"estimators\.options\.framework_overhead_GiB: .* got -1"),
    ({"allreduce": "tree"}, r"estimators\.options\.allreduce: must be ring, hierarchical or best, not 'tree'"),
], ids=["mfu not a mapping", "mfu 0", "mfu a string", "mfu above 1", "mfu of no GPU type", "overhead a string",
        "overhead negative", "unknown all-reduce"])
def test_bad_estimator_options_are_named(options, pattern):
    """Options reach the estimators unchecked by the instance's schema (each plug-in owns its own):
    each is refused by name when the estimators are built, not as a crash later."""
    from hetplan.errors import EstimatorError
    from hetplan.estimators import build_estimators
    from hetplan.instance import instance_from_dict
    from test_instance_and_plan import mutated

    inst = instance_from_dict(mutated(["estimators"], {"options": options}))
    with pytest.raises(EstimatorError, match=pattern):
        build_estimators(inst)


def test_good_estimator_options_change_the_figures():
    """The checks let the documented options through, and they act: a lower MFU, a slower layer."""
    from hetplan.estimators import build_estimators
    from hetplan.instance import instance_from_dict
    from test_instance_and_plan import mutated

    base = build_estimators(instance_from_dict(mutated(["estimators"], {"options": {}})))
    slow = build_estimators(instance_from_dict(mutated(["estimators"], {"options": {
        "mfu": {"A100-40": 0.1}, "framework_overhead_GiB": 2, "allreduce": "ring"}})))
    assert slow.time.layer_time("A100-40", 1, 1, 1).fwd_s > base.time.layer_time("A100-40", 1, 1, 1).fwd_s


def _one_type_on_two_links(*links):
    """One 4-GPU A100-40 node per entry of `links` (None: the catalogue's NVLink), OPT-350M."""
    from hetplan.instance import instance_from_dict
    groups = [{"name": f"g{i}", "gpu_type": "A100-40", "gpus_per_node": 4, "count": 1, "zone": "r1-a",
               "price_per_gpu_hour_usd": 1.0, **({"intra_node": link} if link else {})}
              for i, link in enumerate(links)]
    return instance_from_dict({"name": "links", "cluster": {"node_groups": groups},
                               "workload": {"model": "OPT-350M", "global_batch_size": 8, "precision": "fp16"}})


PCIE_1 = {"kind": "pcie", "bandwidth_GBps": 1.0, "latency_s": 2e-5}


def test_a_tp_group_is_priced_at_its_own_nodes_link():
    """TP all-reduces run on the node's intra-node link: a block's forward on a TP-4 group holds two
    ring all-reduces of the s b h hidden state (2 x 3/4 x bytes / bandwidth + 2 x 3 latencies each),
    so its figure on a 1 GB/s node exceeds the NVLink node's by exactly twice the ring difference;
    without a node the figure is the fastest link's (a lower bound over the type's nodes)."""
    from hetplan.estimators import build_estimators
    inst = _one_type_on_two_links(None, PCIE_1)
    nvlink, pcie = (n.intra_node for n in inst.nodes)
    est = build_estimators(inst)
    fast, slow = (est.time.layer_time("A100-40", 1, 1, 4, link) for link in (nvlink, pcie))
    hidden = boundary_activation_bytes(inst.model_arch, 1, "fp16")

    def ring(link):
        return 2 * 3 / 4 * hidden / (link.bandwidth_GBps * 1e9) + 2 * 3 * link.latency_s
    assert slow.fwd_s - fast.fwd_s == pytest.approx(2 * (ring(pcie) - ring(nvlink)), rel=1e-9)
    assert est.time.layer_time("A100-40", 1, 1, 4) == fast
    assert est.time.layer_time("A100-40", 1, 1, 1, pcie) == est.time.layer_time("A100-40", 1, 1, 1, nvlink)


def test_an_unused_slower_node_of_the_type_changes_no_plans_time():
    """helper-12's metamorphic relation: a TP-4 replica on an NVLink A100 node took 0.016989 s, and
    0.618236 s once an unused A100 node at 1 GB/s was added (every TP group of the type was priced at
    its slowest link). Now the unused node changes nothing, and the plan put on it is the slower."""
    from hetplan.plan import plan_from_dict
    from hetplan.simulator import simulate

    def on(node):
        return plan_from_dict({"name": "p", "num_microbatches": 2, "micro_batch_size": 4, "stages": [
            {"layer_start": 0, "layer_end": 26, "replicas": [{"gpu_type": "A100-40", "tp": 4, "node": node}]}]})
    alone = simulate(_one_type_on_two_links(None), on("g0-0")).iteration_time_s
    beside = _one_type_on_two_links(None, PCIE_1)
    assert simulate(beside, on("g0-0")).iteration_time_s == alone
    assert simulate(beside, on("g1-0")).iteration_time_s > 10 * alone
