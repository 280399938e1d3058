"""Inputs of operator scheduling (paper 004 sec. 3.2.1): operator DAGs and a multi-edge device graph.

* `OpGraph`: operators of one or more models (FLOPs, bytes moved, resident memory) and data edges
  (tensor sizes), with a priority weight per model. Built explicitly (`OpGraph.from_dict`, the
  YAML/JSON form below), merged from several models (`OpGraph.merge`), or generated from a
  transformer architecture by `transformer_layer_dag`.
* `DeviceGraph`: devices with a GPU type from `hetplan.catalog.gpu_catalog()` and, per device pair,
  a multi-edge link of several channels (`hetplan.instance.Channel`: bandwidth GB/s, latency s,
  whether it may run concurrently with its siblings). Built from devices and links, as a full
  mesh (`DeviceGraph.mesh`), or from an `Instance` (`DeviceGraph.from_instance`).

Operator time on a device is the roofline of 004 eq. (1)-(2):
    time_s = max(flops / (peak_flops * efficiency), mem_traffic_bytes / memory_bandwidth)
with the efficiency defaulting to the catalogue's `default_mfu`.

Dict / YAML form of an operator graph:

    models: {gpt: 1.0, llama: 2.0}          # model -> weight (omit: every model weight 1)
    operators:
      - {name: a, model: gpt, flops: 2.0e12, mem_traffic_bytes: 1.0e8, mem_bytes: 2.0e8}
    edges:
      - {src: a, dst: b, size_bytes: 1.6e7}
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Callable, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetplan.catalog import ModelArch, gpu_catalog
from hetplan.errors import InstanceError
from hetplan.instance import Channel, Instance, MultiEdgeLink, format_validation_error

_STRICT = ConfigDict(frozen=True, extra="forbid")

__all__ = [
    "Channel", "DataEdge", "Device", "DeviceGraph", "MultiEdgeLink", "OpGraph", "Operator",
    "transformer_layer_dag",
]


# ---- operator graph -----------------------------------------------------------------------------
class Operator(BaseModel):
    """One atomic operator (004: v in V_C^i) of one model."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    model: str = Field(default="model", min_length=1)
    flops: float = Field(ge=0, description="floating-point operations")
    mem_traffic_bytes: float = Field(ge=0, default=0.0, description="bytes read + written in device memory (roofline)")
    mem_bytes: float = Field(ge=0, default=0.0, description="resident memory while scheduled, Mem_op(v)")
    kind: str = Field(default="op", description="label, e.g. attn.fwd")

    @model_validator(mode="after")
    def _has_work(self) -> "Operator":
        if self.flops <= 0 and self.mem_traffic_bytes <= 0:
            raise ValueError(f"operator {self.name!r} needs flops > 0 or mem_traffic_bytes > 0")
        return self


class DataEdge(BaseModel):
    """A data dependency (u, v) carrying `size_bytes` (Mem_data(u, v) on v's device)."""

    model_config = _STRICT
    src: str
    dst: str
    size_bytes: float = Field(ge=0)


class OpGraph(BaseModel):
    """Operator DAGs of one or more models that share the devices."""

    model_config = _STRICT
    operators: tuple[Operator, ...] = Field(min_length=1)
    edges: tuple[DataEdge, ...] = ()
    model_weights: dict[str, float] = Field(default_factory=dict, description="model -> weight w_i > 0")

    @model_validator(mode="before")
    @classmethod
    def _default_weights(cls, data: Any) -> Any:
        """Every model weighs 1 unless `model_weights` says otherwise."""
        if isinstance(data, dict) and not data.get("model_weights"):
            models = {op.model if isinstance(op, Operator) else (op or {}).get("model", "model")
                      for op in data.get("operators") or () if isinstance(op, (Operator, dict))}
            data = {**data, "model_weights": {m: 1.0 for m in sorted(models)}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "OpGraph":
        names = [op.name for op in self.operators]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"operators: duplicated names {dupes}")
        known = set(names)
        seen = set()
        for i, e in enumerate(self.edges):
            for end in ("src", "dst"):
                if getattr(e, end) not in known:
                    raise ValueError(f"edges[{i}].{end}: unknown operator {getattr(e, end)!r}")
            if e.src == e.dst:
                raise ValueError(f"edges[{i}]: self-loop on {e.src!r}")
            if (e.src, e.dst) in seen:
                raise ValueError(f"edges[{i}]: duplicated edge {e.src!r} -> {e.dst!r}")
            seen.add((e.src, e.dst))
        models = {op.model for op in self.operators}
        missing = sorted(models - set(self.model_weights))
        if missing:
            raise ValueError(f"model_weights: no weight for models {missing}")
        extra = sorted(set(self.model_weights) - models)
        if extra:
            raise ValueError(f"model_weights: models {extra} have no operators")
        bad = sorted(m for m, w in self.model_weights.items() if not w > 0)
        if bad:
            raise ValueError(f"model_weights: weights of {bad} must be > 0")
        by_name = {op.name: op.model for op in self.operators}
        for i, e in enumerate(self.edges):
            if by_name[e.src] != by_name[e.dst]:
                raise ValueError(f"edges[{i}]: {e.src!r} and {e.dst!r} belong to different models")
        self.topo_order  # raises on a cycle
        return self

    @classmethod
    def from_dict(cls, data: Any) -> "OpGraph":
        """Parse the dict / YAML form (module docstring); errors name the offending field."""
        if not isinstance(data, dict):
            raise InstanceError("an operator graph must be a mapping with keys models, operators, edges")
        data = dict(data)
        if "models" in data:
            data["model_weights"] = data.pop("models")
        try:
            return cls(**data)
        except ValidationError as exc:
            raise InstanceError(format_validation_error(exc), "operator graph") from None
        except TypeError as exc:
            raise InstanceError(str(exc), "operator graph") from None

    def to_dict(self) -> dict[str, Any]:
        return {"models": dict(self.model_weights),
                "operators": [op.model_dump() for op in self.operators],
                "edges": [e.model_dump() for e in self.edges]}

    @classmethod
    def merge(cls, graphs: Sequence["OpGraph"]) -> "OpGraph":
        """Several models sharing one device graph (operator names must stay unique)."""
        weights: dict[str, float] = {}
        for g in graphs:
            for m, w in g.model_weights.items():
                if m in weights:
                    raise InstanceError(f"model {m!r} appears in two graphs", "model_weights")
                weights[m] = w
        try:
            return cls(operators=tuple(op for g in graphs for op in g.operators),
                       edges=tuple(e for g in graphs for e in g.edges), model_weights=weights)
        except ValidationError as exc:
            raise InstanceError(format_validation_error(exc), "operator graph") from None

    # ---- derived views ------------------------------------------------------------------------
    @cached_property
    def op_by_name(self) -> dict[str, Operator]:
        return {op.name: op for op in self.operators}

    @cached_property
    def preds(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {op.name: [] for op in self.operators}
        for e in self.edges:
            out[e.dst].append(e.src)
        return out

    @cached_property
    def succs(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {op.name: [] for op in self.operators}
        for e in self.edges:
            out[e.src].append(e.dst)
        return out

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Operators in a topological order (stable: file order among ready operators)."""
        indeg = {op.name: 0 for op in self.operators}
        for e in self.edges:
            indeg[e.dst] += 1
        ready = [op.name for op in self.operators if indeg[op.name] == 0]
        out: list[str] = []
        while ready:
            n = ready.pop(0)
            out.append(n)
            for w in self.succs[n]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        if len(out) != len(indeg):
            cyc = sorted(n for n, d in indeg.items() if d > 0)
            raise ValueError(f"edges: the operator graph has a cycle through {cyc[:5]}")
        return tuple(out)

    @cached_property
    def descendants(self) -> dict[str, frozenset[str]]:
        out: dict[str, frozenset[str]] = {}
        for n in reversed(self.topo_order):
            acc: set[str] = set()
            for w in self.succs[n]:
                acc.add(w)
                acc |= out[w]
            out[n] = frozenset(acc)
        return out

    def related(self, a: str, b: str) -> bool:
        """True when a precedes b or b precedes a (their order is fixed by the data)."""
        return b in self.descendants[a] or a in self.descendants[b]

    @property
    def models(self) -> list[str]:
        return list(self.model_weights)

    def sinks(self, model: str) -> list[str]:
        return [op.name for op in self.operators if op.model == model and not self.succs[op.name]]


# ---- devices and links --------------------------------------------------------------------------
class Device(BaseModel):
    """One accelerator: roofline figures and memory (004 sec. 3.2.1, V_D)."""

    model_config = _STRICT
    name: str = Field(min_length=1)
    gpu_type: str = "custom"
    peak_tflops: float = Field(gt=0, description="peak FLOP/s / 1e12 at the training precision")
    efficiency: float = Field(gt=0, le=1, description="fraction of peak reached (roofline's compute roof)")
    mem_bandwidth_GBps: float = Field(gt=0)
    memory_bytes: float = Field(gt=0)

    @classmethod
    def from_catalog(cls, name: str, gpu_type: str, precision: Literal["fp16", "bf16", "fp32"] = "fp16",
                     efficiency: float | None = None, memory_bytes: float | None = None) -> "Device":
        catalog = gpu_catalog()
        if gpu_type not in catalog:
            raise InstanceError(f"unknown GPU type {gpu_type!r}; known: {sorted(catalog)}", "gpu_type")
        spec = catalog[gpu_type]
        try:
            peak = spec.peak_flops(precision)
        except ValueError as exc:
            raise InstanceError(str(exc), "precision") from None
        return cls(name=name, gpu_type=gpu_type, peak_tflops=peak / 1e12,
                   efficiency=spec.default_mfu if efficiency is None else efficiency,
                   mem_bandwidth_GBps=spec.memory_bandwidth_GBps,
                   memory_bytes=spec.memory_bytes if memory_bytes is None else memory_bytes)

    def op_time_s(self, op: Operator) -> float:
        """Roofline time (004 eq. 1-2): the slower of the compute roof and the memory roof."""
        compute_s = op.flops / (self.peak_tflops * 1e12 * self.efficiency)
        memory_s = op.mem_traffic_bytes / (self.mem_bandwidth_GBps * 1e9)
        return max(compute_s, memory_s)


class DeviceGraph(BaseModel):
    """Devices and multi-edge links (004 sec. 3.1). Links are undirected with per-direction
    bandwidth; a pair without a link cannot exchange data (operators joined by an edge then never
    sit on those two devices)."""

    model_config = _STRICT
    devices: tuple[Device, ...] = Field(min_length=1)
    links: tuple[MultiEdgeLink, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> "DeviceGraph":
        names = [d.name for d in self.devices]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"devices: duplicated names {dupes}")
        seen = set()
        for i, link in enumerate(self.links):
            a, b = link.endpoints
            for end in (a, b):
                if end not in names:
                    raise ValueError(f"links[{i}].endpoints: unknown device {end!r}")
            if a == b:
                raise ValueError(f"links[{i}].endpoints: a link needs two different devices, got {a!r} twice")
            pair = frozenset((a, b))
            if pair in seen:
                raise ValueError(f"links[{i}]: a second link between {a!r} and {b!r}; put both channels in one")
            seen.add(pair)
            ch_names = [c.name for c in link.channels]
            if len(set(ch_names)) != len(ch_names):
                raise ValueError(f"links[{i}].channels: channel names must be unique, got {ch_names}")
        return self

    @classmethod
    def build(cls, devices: Iterable[Device], links: Iterable[MultiEdgeLink]) -> "DeviceGraph":
        try:
            return cls(devices=tuple(devices), links=tuple(links))
        except ValidationError as exc:
            raise InstanceError(format_validation_error(exc), "device graph") from None

    @classmethod
    def mesh(cls, devices: Sequence[Device],
             channels: Sequence[Channel] | Callable[[Device, Device], Sequence[Channel]]) -> "DeviceGraph":
        """Every pair linked; `channels` is one channel list for all pairs or a function of the pair."""
        links = []
        for i, a in enumerate(devices):
            for b in devices[i + 1:]:
                chs = channels(a, b) if callable(channels) else channels
                if chs:
                    links.append(MultiEdgeLink(endpoints=(a.name, b.name), channels=list(chs)))
        return cls.build(devices, links)

    @classmethod
    def from_instance(cls, instance: Instance) -> "DeviceGraph":
        """One device per GPU ('NODE_ID:GPU_INDEX'); GPUs of a node share its intra-node link, GPUs
        of different nodes the inter-node / inter-zone / inter-region class, each as one channel;
        `cluster.network.multi_edge` entries replace those with their channels."""
        precision = instance.workload.precision
        devices, node_of = [], {}
        for node in instance.nodes:
            spec = instance.gpu(node.gpu_type)
            peak = spec.peak_flops(precision)
            for g in range(node.num_gpus):
                name = f"{node.node_id}:{g}"
                node_of[name] = node
                devices.append(Device(name=name, gpu_type=node.gpu_type, peak_tflops=peak / 1e12,
                                      efficiency=spec.default_mfu, mem_bandwidth_GBps=spec.memory_bandwidth_GBps,
                                      memory_bytes=spec.memory_bytes))
        net = instance.cluster.network
        overrides: dict[frozenset[str], list[Channel]] = {}
        for me in net.multi_edge:
            expanded = [_expand_endpoint(ep, node_of) for ep in me.endpoints]
            for a in expanded[0]:
                for b in expanded[1]:
                    if a != b:
                        overrides[frozenset((a, b))] = list(me.channels)
        links = []
        for i, a in enumerate(devices):
            for b in devices[i + 1:]:
                chs = overrides.get(frozenset((a.name, b.name)))
                if chs is None:
                    spec = _default_link(node_of[a.name], node_of[b.name], net)
                    chs = [Channel(name=spec.kind, bandwidth_GBps=spec.bandwidth_GBps, latency_s=spec.latency_s)]
                links.append(MultiEdgeLink(endpoints=(a.name, b.name), channels=chs))
        return cls.build(devices, links)

    # ---- queries (the `hetplan.formulations.opsched_replay.DeviceGraphLike` protocol) ----------------------
    @cached_property
    def _device(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    @cached_property
    def _channels(self) -> dict[tuple[str, str], tuple[Channel, ...]]:
        out = {}
        for link in self.links:
            a, b = link.endpoints
            out[(a, b)] = out[(b, a)] = tuple(link.channels)
        return out

    def device(self, name: str) -> Device:
        return self._device[name]

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def memory_bytes(self, device: str) -> float:
        return self._device[device].memory_bytes

    def op_time_s(self, op: Operator, device: str) -> float:
        return self._device[device].op_time_s(op)

    def channels(self, src: str, dst: str) -> tuple[Channel, ...]:
        return self._channels.get((src, dst), ())

    # ---- variants -------------------------------------------------------------------------------
    def with_channel_bandwidth(self, a: str, b: str, channel: str, bandwidth_GBps: float) -> "DeviceGraph":
        """The same graph with one channel's bandwidth changed (a dynamic-bandwidth event)."""
        if not bandwidth_GBps > 0:
            raise InstanceError(f"bandwidth must be > 0, got {bandwidth_GBps}", "bandwidth_GBps")
        found = False
        links = []
        for link in self.links:
            if frozenset(link.endpoints) == frozenset((a, b)):
                chs = []
                for c in link.channels:
                    if c.name == channel:
                        found = True
                        c = c.model_copy(update={"bandwidth_GBps": bandwidth_GBps})
                    chs.append(c)
                link = MultiEdgeLink(endpoints=link.endpoints, channels=chs)
            links.append(link)
        if not found:
            raise InstanceError(f"no channel {channel!r} between {a!r} and {b!r}", "channel")
        return DeviceGraph.build(self.devices, links)

    def single_link(self) -> "DeviceGraph":
        """The single-link abstraction most planners use: each pair keeps only its fastest channel
        (fastest for a 1 GB transfer), under that channel's name, so a schedule planned on it stays
        valid on the full multi-edge graph."""
        links = []
        for link in self.links:
            best = min(link.channels, key=lambda c: c.latency_s + 1.0 / c.bandwidth_GBps)
            links.append(MultiEdgeLink(endpoints=link.endpoints, channels=[best]))
        return DeviceGraph.build(self.devices, links)


def _expand_endpoint(endpoint: str, node_of: dict[str, Any]) -> list[str]:
    """A device, or every GPU of a node (the instance checked the names: core/instance.py `_check_endpoint`)."""
    return [endpoint] if endpoint in node_of else [name for name, node in node_of.items() if node.node_id == endpoint]


def _default_link(na: Any, nb: Any, network: Any):
    if na.node_id == nb.node_id:
        return na.intra_node
    for zp in network.zone_pairs:
        if set(zp.zones) == {na.zone, nb.zone}:
            return type(network.inter_zone)(kind="other", bandwidth_GBps=zp.bandwidth_GBps, latency_s=zp.latency_s)
    if na.zone == nb.zone:
        return network.inter_node
    if na.region == nb.region:
        return network.inter_zone
    return network.inter_region


# ---- DAG generator --------------------------------------------------------------------------------
_BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4}


def transformer_layer_dag(arch: ModelArch, *, microbatch: int = 1, seq_len: int | None = None,
                          precision: Literal["fp16", "bf16", "fp32"] = "fp16", shards: int = 1,
                          split_allreduce: bool = False, backward: bool = True,
                          flash_attention: bool = False, model: str | None = None, weight: float = 1.0,
                          prefix: str = "") -> OpGraph:
    """Operator DAG of one transformer block's forward (and backward) pass.

    Operators: layer norms, attention (QKV projection, scores, softmax . V, output projection) and
    the MLP, each split over `shards` head / column shards (Megatron-style tensor split). With
    shards > 1 the partial outputs of attention and MLP are summed by an all-reduce operator, or,
    with `split_allreduce`, by `shards` reduce-scatter operators (each sums one 1/shards slice)
    followed by an all-gather (004 sec. 2.3: All-Reduce = Reduce-Scatter + All-Gather, which
    removes the single-node bottleneck). Backward operators take the output gradient and the
    activations saved by their forward operator (an edge from it), so placing a backward operator
    away from its forward one costs the transfer of those activations.

    FLOPs: 2 per multiply-add; attention scores and softmax . V each 2*b*s^2*h; the MLP has 2
    (gelu) or 3 (swiglu) h x ffn matrices; backward = 2x forward FLOPs. Memory traffic: weights,
    inputs and outputs once each, plus the b*heads*s^2 score matrix written and read when flash
    attention is off. Resident memory: weights on forward operators, gradients on backward ones,
    plus the operator's output. Norms are 8 FLOPs per element (memory bound either way).
    """
    if shards < 1 or arch.num_heads % shards or arch.ffn_hidden_size % shards:
        raise InstanceError(f"shards={shards} must divide num_heads={arch.num_heads} and "
                            f"ffn_hidden_size={arch.ffn_hidden_size}", "shards")
    if microbatch < 1:
        raise InstanceError("microbatch must be >= 1", "microbatch")
    el = _BYTES_PER_ELEMENT[precision]
    b, s, h, k = microbatch, seq_len or arch.seq_len, arch.hidden_size, shards
    head_dim = h // arch.num_heads
    qkv_cols = h + 2 * arch.kv_heads * head_dim
    tokens = b * s
    act = tokens * h * el  # one activation tensor, bytes
    n_mats = 3 if arch.mlp == "swiglu" else 2
    name = model or arch.name
    ops: list[Operator] = []
    edges: dict[tuple[str, str], float] = {}

    def op(label: str, flops: float, traffic: float, resident: float) -> str:
        full = f"{prefix}{label}"
        ops.append(Operator(name=full, model=name, flops=flops, mem_traffic_bytes=traffic,
                            mem_bytes=resident, kind=label.split("[")[0]))
        return full

    def edge(u: str, v: str, size: float) -> None:
        """Two tensors on one edge (e.g. an unsharded MLP's output and its saved activations) add up."""
        edges[(u, v)] = edges.get((u, v), 0.0) + size

    def norm(label: str, factor: float) -> str:
        return op(label, factor * 8 * tokens * h, factor * 2 * act, act)

    attn_w = (h * qkv_cols + h * h) * el / k
    attn_flops = (2 * tokens * h * qkv_cols + 4 * b * s * s * h + 2 * tokens * h * h) / k
    scores = 0 if flash_attention else 2 * b * (arch.num_heads // k) * s * s * el
    attn_saved = act + tokens * qkv_cols * el / k + scores / 2
    mlp_w = n_mats * h * arch.ffn_hidden_size * el / k
    mlp_flops = 2 * n_mats * tokens * h * arch.ffn_hidden_size / k
    mlp_mid = (n_mats - 1) * tokens * arch.ffn_hidden_size * el / k
    mlp_saved = act + mlp_mid

    def reduce(label: str, parts: list[str], factor: float) -> str:
        """Sum the shards' partial outputs: one all-reduce, or reduce-scatter + all-gather."""
        if k == 1:
            return parts[0]
        if not split_allreduce:
            red = op(f"{label}.ar", factor * (k - 1) * tokens * h, factor * (k + 1) * act, act)
            for p in parts:
                edge(p, red, act)
            return red
        gather = op(f"{label}.ag", 0.0, factor * 2 * act, act)
        for j in range(k):
            rs = op(f"{label}.rs[{j}]", factor * (k - 1) * tokens * h / k, factor * (k + 1) * act / k, act / k)
            for p in parts:
                edge(p, rs, act / k)
            edge(rs, gather, act / k)
        return gather

    ln1 = norm("ln1.fwd", 1)
    attn = [op(f"attn.fwd[{i}]", attn_flops, attn_w + 2 * act + 2 * tokens * qkv_cols * el / k + scores,
               attn_w + attn_saved) for i in range(k)]
    for a in attn:
        edge(ln1, a, act)
    attn_out = reduce("attn.fwd", attn, 1)
    ln2 = norm("ln2.fwd", 1)
    edge(attn_out, ln2, act)
    mlp = [op(f"mlp.fwd[{i}]", mlp_flops, mlp_w + 2 * act + 2 * mlp_mid, mlp_w + mlp_saved) for i in range(k)]
    for m in mlp:
        edge(ln2, m, act)
    out = reduce("mlp.fwd", mlp, 1)
    if backward:
        mlp_b = [op(f"mlp.bwd[{i}]", 2 * mlp_flops, 2 * (mlp_w + 2 * act + 2 * mlp_mid), mlp_w + act)
                 for i in range(k)]
        for i, mb in enumerate(mlp_b):
            edge(out, mb, act)  # output gradient, arriving where the layer's output was produced
            edge(mlp[i], mb, mlp_saved)
        ln2_b = norm("ln2.bwd", 2)
        edge(reduce("mlp.bwd", mlp_b, 1), ln2_b, act)
        edge(ln2, ln2_b, act)
        attn_b = [op(f"attn.bwd[{i}]", 2 * attn_flops,
                     2 * (attn_w + 2 * act + 2 * tokens * qkv_cols * el / k + scores), attn_w + act)
                  for i in range(k)]
        for i, ab in enumerate(attn_b):
            edge(ln2_b, ab, act)
            edge(attn[i], ab, attn_saved)
        ln1_b = norm("ln1.bwd", 2)
        edge(reduce("attn.bwd", attn_b, 1), ln1_b, act)
        edge(ln1, ln1_b, act)
    return OpGraph(operators=tuple(ops), edges=tuple(DataEdge(src=u, dst=v, size_bytes=z) for (u, v), z in edges.items()),
                   model_weights={name: weight})
