"""Analytic time and memory estimators (no measurements needed).

Time (`AnalyticTime`, name "analytic"): per layer unit a roofline (seed 004, eq. 1-2):
    compute_s = FLOPs / (peak_flops(precision) * mfu(gpu))
    memory_s  = bytes moved (weights of the unit's shard + activations in/out) / memory bandwidth
    time      = max(compute_s, memory_s) + TP all-reduce time
Backward costs 2 x the forward FLOPs (Narayanan et al. SC'21 sec. 5.1); full recomputation adds one
forward, selective recomputation adds the attention core's forward. Megatron TP does two all-reduces
of the s b h hidden state per block in the forward and two in the backward (Shoeybi et al. 2019,
sec. 3), one in the embedding forward and backward; they run on the intra-node link of the node the
TP group sits on (`layer_time`'s `intra_node`; without it the fastest of the type's node groups', a
figure at most that of any of its nodes: `_intra_links`).
The optimizer step is memory-bound: it reads and writes every optimizer-state byte of the shard once.

Memory (`AnalyticMemory`, name "analytic"): per worker, not per stage average (Sailor sec. 4.3):
    M_peak = params + grads + optimizer states (bytes per parameter by precision, optimizer and ZeRO
    stage, Rajbhandari et al. SC'20 "ZeRO", sec. 3.1 and 5: mixed-precision Adam = 2 + 2 + 12 bytes)
           + in_flight x activations of the worker's units (Korthikanti et al. MLSys'23, see model_stats)
           + framework overhead (CUDA context, allocator and communication buffers; an assumption,
             `framework_overhead_GiB` option, default 1.0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetplan.catalog import GpuSpec, LinkSpec, ModelArch
from hetplan.errors import EstimatorError
from hetplan.estimators.base import LayerTime, MemoryBreakdown, fastest_link
from hetplan.estimators.model_stats import (
    DTYPE_BYTES,
    boundary_activation_bytes,
    is_embedding,
    is_head,
    unit_activation_bytes,
    unit_attention_flops_fwd,
    unit_flops_fwd,
    unit_params,
)
from hetplan.estimators.network import ring_allreduce_time_s
from hetplan.instance import Instance

GIB = 1024**3


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of the three model states before ZeRO sharding."""

    param: int
    grad: int
    optimizer: int


def state_bytes(precision: str, optimizer: str) -> StateBytes:
    """ZeRO paper sec. 3.1: mixed precision keeps 16-bit params and grads plus an fp32 master copy;
    Adam adds fp32 momentum and variance (K = 12), SGD with momentum the master copy + momentum (8)."""
    if precision in ("fp16", "bf16"):
        return StateBytes(2, 2, 12 if optimizer == "adam" else 8)
    return StateBytes(4, 4, 8 if optimizer == "adam" else 4)  # fp32: the params are the master copy


def zero_divisors(zero_stage: int, dp: int) -> tuple[int, int, int]:
    """Divisors (params, grads, optimizer) of ZeRO stage 0-3 over the data-parallel degree dp."""
    return (dp if zero_stage >= 3 else 1, dp if zero_stage >= 2 else 1, dp if zero_stage >= 1 else 1)


def ring_allreduce_s(nbytes: float, members: int, link: LinkSpec) -> float:
    """Ring all-reduce: 2 (n - 1) / n x bytes over the link, 2 (n - 1) latency steps."""
    return ring_allreduce_time_s(nbytes, members, link.bandwidth_GBps * 1e9, link.latency_s)


def _intra_links(instance: Instance) -> dict[str, LinkSpec]:
    """GPU type -> the link its TP all-reduces are priced at when the node is not said: the fastest
    of its node groups' (`fastest_link`), so the figure is at most what any of its nodes takes. A
    placed replica's figure reads its node's own link (`layer_time`'s `intra_node`): one type on
    NVLink and PCIe nodes had every TP group priced at the slowest, 36x on one 4-GPU A100 node beside
    an unused group at 1 GB/s (helper-12's campaign, session 64)."""
    by_type: dict[str, list[LinkSpec]] = {}
    for group in instance.cluster.node_groups:
        by_type.setdefault(group.gpu_type, []).append(group.intra_node or instance.gpu(group.gpu_type).intra_node)
    return {gpu_type: fastest_link(links) for gpu_type, links in by_type.items()}


def _number_option(options: dict, name: str, default: float, lo: float, hi: float) -> float:
    """options[name] (default when absent) as a number within [lo, hi], or EstimatorError naming it."""
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise EstimatorError(f"estimators.options.{name}: must be a number in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _mfu_option(mfu: Any, gpu_types: list[str]) -> dict[str, float] | None:
    """`options.mfu`: GPU type -> the share of its peak the layers reach, in (0, 1]."""
    if mfu is None:
        return None
    if not isinstance(mfu, dict):
        raise EstimatorError(f"estimators.options.mfu: must map GPU types to shares of peak in (0, 1], "
                             f"got {mfu!r}")
    for gpu_type, share in mfu.items():
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise EstimatorError(f"estimators.options.mfu.{gpu_type}: must be a share of peak in (0, 1], "
                                 f"got {share!r}")
    unknown = sorted(set(mfu) - set(gpu_types))
    if unknown:
        raise EstimatorError(f"estimators.options.mfu: {unknown} are no GPU type of the cluster "
                             f"(has {gpu_types})")
    return mfu


class AnalyticTime:
    name = "analytic"
    OPTIONS: tuple[str, ...] = ("mfu",)  # the estimators.options keys it reads

    def __init__(self, arch: ModelArch, gpus: dict[str, GpuSpec], intra_links: dict[str, LinkSpec], *,
                 precision: str, optimizer: str, zero_stage: int, recompute: str,
                 mfu: dict[str, float] | None = None):
        self.arch, self.gpus, self.intra_links = arch, gpus, intra_links
        self.precision, self.optimizer, self.zero_stage, self.recompute = precision, optimizer, zero_stage, recompute
        self.mfu = {g: (mfu or {}).get(g, spec.default_mfu) for g, spec in gpus.items()}
        self._cache: dict[tuple, LayerTime] = {}

    @classmethod
    def from_instance(cls, instance: Instance, options: dict) -> "AnalyticTime":
        wl = instance.workload
        return cls(instance.model_arch, {g: instance.gpu(g) for g in instance.gpu_types}, _intra_links(instance),
                   precision=wl.precision, optimizer=wl.optimizer, zero_stage=wl.zero_stage,
                   recompute=wl.recompute, mfu=_mfu_option(options.get("mfu"), instance.gpu_types))

    def _gpu(self, gpu_type: str) -> GpuSpec:
        try:
            return self.gpus[gpu_type]
        except KeyError:
            raise EstimatorError(f"no GPU type {gpu_type!r} in this instance (has {sorted(self.gpus)})") from None

    def _roofline_s(self, gpu: GpuSpec, flops: float, nbytes: float) -> float:
        compute_s = flops / (gpu.peak_flops(self.precision) * self.mfu[gpu.name])
        return max(compute_s, nbytes / (gpu.memory_bandwidth_GBps * 1e9))

    def _tp_comm_s(self, gpu_type: str, unit: int, seqs: int, tp: int, link: LinkSpec | None) -> tuple[float, float]:
        if tp == 1:
            return 0.0, 0.0
        hidden = boundary_activation_bytes(self.arch, seqs, self.precision)
        one = ring_allreduce_s(hidden, tp, link or self.intra_links[gpu_type])
        if is_embedding(self.arch, unit) or is_head(self.arch, unit):
            return one, one
        return 2 * one, 2 * one

    def layer_time(self, gpu_type: str, unit: int, microbatch: int, tp: int,
                   intra_node: LinkSpec | None = None) -> LayerTime:
        link = None if tp == 1 else intra_node  # TP 1 runs no all-reduce: one entry whatever the node
        key = (gpu_type, unit, microbatch, tp, None if link is None else (link.bandwidth_GBps, link.latency_s))
        if key not in self._cache:
            self._cache[key] = self._layer_time(gpu_type, unit, microbatch, tp, link)
        return self._cache[key]

    def _layer_time(self, gpu_type: str, unit: int, microbatch: int, tp: int, link: LinkSpec | None) -> LayerTime:
        gpu = self._gpu(gpu_type)
        act = DTYPE_BYTES[self.precision]
        flops = unit_flops_fwd(self.arch, unit, microbatch) / tp
        weight_bytes = unit_params(self.arch, unit).per_gpu(tp) * act
        io_bytes = 2 * boundary_activation_bytes(self.arch, microbatch, self.precision)
        fwd = self._roofline_s(gpu, flops, weight_bytes + io_bytes)
        # backward: gradient w.r.t. inputs and weights, each as costly as the forward
        bwd = self._roofline_s(gpu, 2 * flops, 2 * weight_bytes + 2 * io_bytes)
        if self.recompute == "full":
            bwd += fwd
        elif self.recompute == "selective":
            bwd += self._roofline_s(gpu, unit_attention_flops_fwd(self.arch, unit, microbatch) / tp, 0.0)
        tp_fwd, tp_bwd = self._tp_comm_s(gpu_type, unit, microbatch, tp, link)
        return LayerTime(fwd_s=fwd + tp_fwd, bwd_s=bwd + tp_bwd)

    def update_time_s(self, gpu_type: str, units: range, tp: int, dp: int) -> float:
        gpu = self._gpu(gpu_type)
        sb = state_bytes(self.precision, self.optimizer)
        params = sum(unit_params(self.arch, u).per_gpu(tp) for u in units)
        shard = params / zero_divisors(self.zero_stage, dp)[2]
        # read grads + optimizer states, write optimizer states + params
        touched = shard * (sb.grad + 2 * sb.optimizer + sb.param)
        return touched / (gpu.memory_bandwidth_GBps * 1e9)


class AnalyticMemory:
    name = "analytic"
    OPTIONS: tuple[str, ...] = ("framework_overhead_GiB",)  # the estimators.options keys it reads

    def __init__(self, arch: ModelArch, gpus: dict[str, GpuSpec], *, precision: str, optimizer: str,
                 zero_stage: int, recompute: str, flash_attention: bool, overhead_gib: float = 1.0):
        self.arch, self.gpus = arch, gpus
        self.precision, self.optimizer, self.zero_stage = precision, optimizer, zero_stage
        self.recompute, self.flash_attention = recompute, flash_attention
        self.overhead_bytes = overhead_gib * GIB
        # per-unit figures by (unit, tp[, microbatch]): the planner asks for every unit at every
        # data-parallel degree, and these do not depend on it
        self._params: dict[tuple[int, int], float] = {}
        self._acts: dict[tuple[int, int, int], float] = {}

    @classmethod
    def from_instance(cls, instance: Instance, options: dict) -> "AnalyticMemory":
        wl = instance.workload
        return cls(instance.model_arch, {g: instance.gpu(g) for g in instance.gpu_types},
                   precision=wl.precision, optimizer=wl.optimizer, zero_stage=wl.zero_stage,
                   recompute=wl.recompute, flash_attention=wl.flash_attention,
                   overhead_gib=_number_option(options, "framework_overhead_GiB", 1.0, 0.0, 1024.0))

    def activation_bytes(self, units: range, tp: int, microbatch: int) -> float:
        return sum(self._unit_activation_bytes(u, tp, microbatch) for u in units)

    def _unit_activation_bytes(self, unit: int, tp: int, microbatch: int) -> float:
        key = (unit, tp, microbatch)
        if key not in self._acts:
            self._acts[key] = unit_activation_bytes(self.arch, unit, microbatch, tp, precision=self.precision,
                                                    recompute=self.recompute, flash_attention=self.flash_attention)
        return self._acts[key]

    def _unit_params(self, unit: int, tp: int) -> float:
        key = (unit, tp)
        if key not in self._params:
            self._params[key] = unit_params(self.arch, unit).per_gpu(tp)
        return self._params[key]

    def worker_memory(self, gpu_type: str, units: range, tp: int, microbatch: int, dp: int,
                      in_flight: int) -> MemoryBreakdown:
        if gpu_type not in self.gpus:
            raise EstimatorError(f"no GPU type {gpu_type!r} in this instance (has {sorted(self.gpus)})")
        sb = state_bytes(self.precision, self.optimizer)
        params = sum(self._unit_params(u, tp) for u in units)
        div_p, div_g, div_o = zero_divisors(self.zero_stage, dp)
        return MemoryBreakdown(
            params_bytes=params * sb.param / div_p,
            grads_bytes=params * sb.grad / div_g,
            optimizer_bytes=params * sb.optimizer / div_o,
            activations_bytes=in_flight * self.activation_bytes(units, tp, microbatch),
            overhead_bytes=self.overhead_bytes,
            capacity_bytes=self.gpus[gpu_type].memory_bytes,
        )
