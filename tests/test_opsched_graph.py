"""Operator graphs, multi-edge device graphs and the transformer-layer DAG generator (004 sec. 3.2.1)."""
from __future__ import annotations

import pytest
import yaml

from hetplan.catalog import ModelArch, gpu_catalog
from hetplan.errors import InstanceError
from hetplan.formulations.opsched_graph import (
    Channel, DataEdge, Device, DeviceGraph, MultiEdgeLink, OpGraph, Operator, transformer_layer_dag,
)
from hetplan.instance import instance_from_dict

TINY = ModelArch(name="tiny", num_layers=1, hidden_size=8, num_heads=2, ffn_hidden_size=32, vocab_size=16,
                 seq_len=4, mlp="gelu")


def dev(name: str, tflops: float = 1.0, eff: float = 1.0, bw: float = 100.0, mem: float = 1e9) -> Device:
    return Device(name=name, peak_tflops=tflops, efficiency=eff, mem_bandwidth_GBps=bw, memory_bytes=mem)


# ---- roofline ----------------------------------------------------------------------------------
def test_roofline_takes_the_slower_roof():
    d = dev("d", tflops=1.0, eff=0.5, bw=100.0)
    compute_bound = Operator(name="mm", flops=1e9, mem_traffic_bytes=1e8)  # 2 ms compute, 1 ms memory
    memory_bound = Operator(name="norm", flops=1e9, mem_traffic_bytes=1e9)  # 2 ms compute, 10 ms memory
    assert d.op_time_s(compute_bound) == pytest.approx(2e-3)
    assert d.op_time_s(memory_bound) == pytest.approx(1e-2)


def test_device_from_catalog_uses_published_figures():
    spec = gpu_catalog()["RTX-4090"]
    d = Device.from_catalog("g0", "RTX-4090", precision="fp16")
    assert d.peak_tflops == spec.peak_fp16_tflops and d.efficiency == spec.default_mfu
    assert d.mem_bandwidth_GBps == spec.memory_bandwidth_GBps and d.memory_bytes == spec.memory_bytes
    with pytest.raises(InstanceError, match="no bf16"):
        Device.from_catalog("v", "V100-16", precision="bf16")
    with pytest.raises(InstanceError, match="unknown GPU type 'H9000'"):
        Device.from_catalog("x", "H9000")


# ---- operator graph ----------------------------------------------------------------------------
def test_op_graph_from_yaml_and_back():
    text = """
    models: {gpt: 2.0, llama: 1.0}
    operators:
      - {name: a, model: gpt, flops: 1.0e9, mem_traffic_bytes: 1.0e6, mem_bytes: 1.0e6}
      - {name: b, model: gpt, flops: 2.0e9, mem_traffic_bytes: 1.0e6}
      - {name: x, model: llama, flops: 1.0e9, mem_traffic_bytes: 0}
    edges:
      - {src: a, dst: b, size_bytes: 1.0e7}
    """
    g = OpGraph.from_dict(yaml.safe_load(text))
    assert g.model_weights == {"gpt": 2.0, "llama": 1.0}
    assert g.topo_order == ("a", "x", "b") and g.sinks("gpt") == ["b"] and g.related("a", "b")
    assert not g.related("a", "x")
    assert OpGraph.from_dict(g.to_dict()) == g


@pytest.mark.parametrize("data, message", [
    ({"operators": [{"name": "a", "flops": 1}], "edges": [{"src": "a", "dst": "zz", "size_bytes": 1}]},
     "edges\\[0\\].dst: unknown operator 'zz'"),
    ({"operators": [{"name": "a", "flops": 1}, {"name": "b", "flops": 1}],
      "edges": [{"src": "a", "dst": "b", "size_bytes": 1}, {"src": "b", "dst": "a", "size_bytes": 1}]}, "cycle"),
    ({"operators": [{"name": "a", "flops": -1}]}, r"operators\[0\]\.flops"),
    ({"operators": [{"name": "a", "flops": 0, "mem_traffic_bytes": 0}]}, "needs flops > 0"),
    ({"operators": [{"name": "a", "model": "m", "flops": 1}], "models": {"other": 1.0}}, "no weight for models"),
    ({"operators": [{"name": "a", "flops": 1}, {"name": "a", "flops": 2}]}, "duplicated names"),
    ({"operators": [{"name": "a", "flops": 1, "flop": 2}]}, r"operators\[0\]\.flop"),
    ({"operators": [{"name": "a", "model": "m", "flops": 1}, {"name": "b", "model": "n", "flops": 1}],
      "edges": [{"src": "a", "dst": "b", "size_bytes": 1}]}, "different models"),
])
def test_op_graph_errors_name_the_field(data, message):
    with pytest.raises(InstanceError, match=message):
        OpGraph.from_dict(data)


def test_merge_keeps_models_apart():
    a = transformer_layer_dag(TINY, model="a", prefix="a.", weight=2.0)
    b = transformer_layer_dag(TINY, model="b", prefix="b.")
    both = OpGraph.merge([a, b])
    assert both.model_weights == {"a": 2.0, "b": 1.0}
    assert len(both.operators) == 16 and len(both.edges) == 20
    with pytest.raises(InstanceError, match="model 'a' appears in two graphs"):
        OpGraph.merge([a, a])


# ---- DAG generator: hand-computed FLOPs and sizes ------------------------------------------------
def test_layer_dag_shapes_and_flops_by_hand():
    g = transformer_layer_dag(TINY, precision="fp16")
    ops = g.op_by_name
    assert set(ops) == {"ln1.fwd", "attn.fwd[0]", "ln2.fwd", "mlp.fwd[0]",
                        "mlp.bwd[0]", "ln2.bwd", "attn.bwd[0]", "ln1.bwd"}
    assert len(g.edges) == 10
    # b=1, s=4, h=8, 2 heads of 4, fp16: QKV 2*4*8*24 = 1536, QK^T + AV 4*1*4*4*8 = 512, out 2*4*8*8 = 512
    assert ops["attn.fwd[0]"].flops == 2560
    assert ops["mlp.fwd[0]"].flops == 2 * 2 * 4 * 8 * 32  # two h x ffn matmuls
    assert ops["mlp.bwd[0]"].flops == 2 * ops["mlp.fwd[0]"].flops
    assert ops["attn.bwd[0]"].flops == 2 * ops["attn.fwd[0]"].flops
    sizes = {(e.src, e.dst): e.size_bytes for e in g.edges}
    act = 4 * 8 * 2
    assert sizes[("ln1.fwd", "attn.fwd[0]")] == act
    # output gradient (act) + saved MLP input (act) + saved gelu input (4 * 32 * 2 bytes)
    assert sizes[("mlp.fwd[0]", "mlp.bwd[0]")] == act + act + 4 * 32 * 2
    swiglu = transformer_layer_dag(TINY.model_copy(update={"mlp": "swiglu"}))
    assert swiglu.op_by_name["mlp.fwd[0]"].flops == 2 * 3 * 4 * 8 * 32


def test_sharding_splits_work_exactly_and_allreduce_split_adds_operators():
    whole = transformer_layer_dag(TINY)
    ar = transformer_layer_dag(TINY, shards=2)
    rsag = transformer_layer_dag(TINY, shards=2, split_allreduce=True)
    for kind in ("attn.fwd", "mlp.fwd", "attn.bwd", "mlp.bwd"):
        total = sum(o.flops for o in ar.operators if o.kind == kind)
        assert total == pytest.approx(whole.op_by_name[f"{kind}[0]"].flops)
    assert len(ar.operators) == 16  # + 2 shards and 1 all-reduce per sharded block, 4 blocks
    assert len(rsag.operators) == 24  # the all-reduce becomes 2 reduce-scatters + 1 all-gather
    act = 4 * 8 * 2
    sizes = {(e.src, e.dst): e.size_bytes for e in rsag.edges}
    assert sizes[("attn.fwd[1]", "attn.fwd.rs[0]")] == act / 2  # each slice carries 1/shards
    assert sizes[("attn.fwd.rs[1]", "attn.fwd.ag")] == act / 2
    assert sum(1 for e in ar.edges if e.dst == "attn.fwd.ar") == 2
    with pytest.raises(InstanceError, match="shards=3"):
        transformer_layer_dag(TINY, shards=3)


def test_forward_only_dag():
    g = transformer_layer_dag(TINY, backward=False, shards=2)
    assert all(".bwd" not in o.name for o in g.operators) and g.sinks(g.models[0]) == ["mlp.fwd.ar"]


# ---- device graph ------------------------------------------------------------------------------
def test_device_graph_channels_and_single_link():
    chans = [Channel(name="nvlink", bandwidth_GBps=150.0, latency_s=5e-6, concurrent=False),
             Channel(name="pcie", bandwidth_GBps=16.0, latency_s=1e-5)]
    g = DeviceGraph.mesh([dev("a"), dev("b"), dev("c")], chans)
    assert [c.name for c in g.channels("a", "b")] == ["nvlink", "pcie"] == [c.name for c in g.channels("b", "a")]
    assert g.channels("a", "a") == ()
    single = g.single_link()
    assert [c.name for c in single.channels("c", "a")] == ["nvlink"]
    slowed = g.with_channel_bandwidth("b", "a", "nvlink", 5.0)
    assert slowed.channels("a", "b")[0].bandwidth_GBps == 5.0
    assert slowed.channels("a", "c")[0].bandwidth_GBps == 150.0  # other links untouched
    assert g.channels("a", "b")[0].bandwidth_GBps == 150.0  # and the original is unchanged
    with pytest.raises(InstanceError, match="no channel 'ib'"):
        g.with_channel_bandwidth("a", "b", "ib", 1.0)
    with pytest.raises(InstanceError, match="must be > 0"):
        g.with_channel_bandwidth("a", "b", "pcie", 0.0)


@pytest.mark.parametrize("links, message", [
    ([MultiEdgeLink(endpoints=("a", "zz"), channels=[Channel(name="c", bandwidth_GBps=1)])],
     "links.0.endpoints|links\\[0\\].endpoints: unknown device 'zz'"),
    ([MultiEdgeLink(endpoints=("a", "a"), channels=[Channel(name="c", bandwidth_GBps=1)])], "two different devices"),
    ([MultiEdgeLink(endpoints=("a", "b"), channels=[Channel(name="c", bandwidth_GBps=1)]),
      MultiEdgeLink(endpoints=("b", "a"), channels=[Channel(name="d", bandwidth_GBps=1)])], "a second link"),
    ([MultiEdgeLink(endpoints=("a", "b"), channels=[Channel(name="c", bandwidth_GBps=1),
                                                    Channel(name="c", bandwidth_GBps=2)])], "unique"),
])
def test_device_graph_errors(links, message):
    with pytest.raises(InstanceError, match=message):
        DeviceGraph.build([dev("a"), dev("b")], links)


def _instance(multi_edge: list) -> object:
    return instance_from_dict({
        "name": "t",
        "cluster": {"node_groups": [{"name": "a100", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 2,
                                     "zone": "z-a", "price_per_gpu_hour_usd": 1.0}],
                    "network": {"inter_node": {"kind": "ethernet", "bandwidth_GBps": 12.5, "latency_s": 2e-5},
                                "multi_edge": multi_edge}},
        "workload": {"model": "OPT-350M", "global_batch_size": 8, "precision": "fp16"},
    })


def test_device_graph_from_instance():
    inst = _instance([{"endpoints": ["a100-0:0", "a100-0:1"],
                       "channels": [{"name": "nvlink", "bandwidth_GBps": 300, "concurrent": False},
                                    {"name": "pcie", "bandwidth_GBps": 32}]},
                      {"endpoints": ["a100-1", "a100-0:0"],
                       "channels": [{"name": "ib", "bandwidth_GBps": 25}, {"name": "eth", "bandwidth_GBps": 3}]}])
    g = DeviceGraph.from_instance(inst)
    assert g.device_names() == ["a100-0:0", "a100-0:1", "a100-1:0", "a100-1:1"]
    assert g.device("a100-1:1").peak_tflops == gpu_catalog()["A100-40"].peak_fp16_tflops
    assert [c.name for c in g.channels("a100-0:1", "a100-0:0")] == ["nvlink", "pcie"]
    assert [c.name for c in g.channels("a100-1:0", "a100-0:0")] == ["ib", "eth"]  # node id = all its GPUs
    assert [c.name for c in g.channels("a100-1:1", "a100-0:0")] == ["ib", "eth"]
    (ch,) = g.channels("a100-0:1", "a100-1:0")  # no override: the inter-node class, one channel
    assert (ch.bandwidth_GBps, ch.latency_s) == (12.5, 2e-5)
    (intra,) = g.channels("a100-1:0", "a100-1:1")  # the catalogue's intra-node NVLink
    assert intra.bandwidth_GBps == gpu_catalog()["A100-40"].intra_node.bandwidth_GBps


@pytest.mark.parametrize("end", ["b200-7", "a100-0:9", "a100-0:x", "a100-0:", ":0"])
def test_an_instance_with_a_bad_multi_edge_endpoint_is_refused_at_load(end):
    """Once found only by DeviceGraph.from_instance (opsched): `solve` and `validate` took the typo."""
    with pytest.raises(InstanceError, match=rf"multi_edge\[0\].endpoints: unknown device or node '{end}'"):
        _instance([{"endpoints": ["a100-0:0", end], "channels": [{"name": "c", "bandwidth_GBps": 1}]}])


def test_data_edge_rejects_negative_size():
    with pytest.raises(ValueError):
        DataEdge(src="a", dst="b", size_bytes=-1)
