"""`hetplan profile`: measure the runtime's own model (runtime/model.py) layer unit by layer unit.

For every TP degree t and microbatch size b asked for, each of the t ranks builds the layer units
(0 = embedding, 1..L = blocks, L + 1 = head) as separate one-unit stages hold them (a tied head
keeps its own copy of the word embedding, as estimators/model_stats.unit_params counts it), with
its TP group active, and measures:

* fwd_s / bwd_s per unit: after `warmup` discarded runs, the median of `repeats` runs of the unit's
  forward, and of its backward alone given a gradient of its output (the head: of its loss). The
  ranks of a TP group start each timed region together (a barrier) and the slowest rank's median
  is kept, so the times include the TP all-reduces (`LayerTime`: "TP comm included").
  Timer: time.perf_counter on CPU with torch.set_num_threads(threads) (the runtime runs one torch
  thread per rank); CUDA events on a GPU.
* tp_comm (t > 1): the unit's TP collectives alone, timed on the same tensor shapes: the embedding
  all-reduces its output in the forward; a block all-reduces the hidden state twice in the forward
  and twice in the backward; the head all-gathers the logits forward and all-reduces its input
  gradient backward (runtime/model.py; Megatron-LM, Shoeybi et al. 2019, sec. 3).
* update_s: one optimizer step (Adam, or SGD; as runtime/execute.py builds it) over the parameters of
  all units on one TP rank, median of `repeats`, after the gradients of the timed backward passes.
* memory per unit (`UnitMemory`): params_per_gpu (elements this rank holds), params_bytes,
  output_bytes (the unit's output tensor; the head's is its scalar loss) and activation_bytes:

      activation_bytes = bytes of the tensors the unit's forward saves for its backward, one
      microbatch, deduplicated by storage, storages of parameters excluded.

  On CPU it is counted with torch.autograd.graph.saved_tensors_hooks. This is the saved-tensor part
  of the executor's measured CPU memory (runtime/execute.py: live bytes of parameters + gradients +
  optimizer state + tensors saved for backward, deduplicated by storage, parameters excluded from
  the saved part), so a stage's measured memory is params + grads + optimizer state + the sum of
  its units' activation_bytes x microbatches in flight. A unit's input is saved by the unit itself
  (its first LayerNorm), a unit's output by the next one, so no storage is counted twice.
  On CUDA, the allocator's view: memory_allocated after the forward minus before, less the output;
  total_bytes = max_memory_allocated during forward and backward minus the memory before.
* optimizer_state_bytes_per_param: bytes of optimizer state per parameter element after a step
  (Adam: exp_avg + exp_avg_sq in the parameter dtype, 8 for fp32, plus a scalar step per tensor).
* links (when more than one process runs, or asked for): ping-pong p2p and all-reduce times
  between two local processes at a few message sizes, fitted by least squares to alpha-beta.
"""
from __future__ import annotations

import math
import os
import re
import statistics
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from hetplan.catalog import ModelArch
from hetplan.errors import EstimatorError, HetplanError, InstanceError
from hetplan.profiles import (DeviceInfo, GpuProfile, LinkFit, MemoryMeasurement, TimeMeasurement, UnitMemory,
                              UnitTime)
from hetplan.runtime.execute import DTYPES, _make_optimizer
from hetplan.runtime.model import ModelConfig, StageModule, TPContext
from hetplan.runtime.probe import SavedTensorLedger, storage_key

# What the forkserver imports once for all measuring processes: torch, and torch._dynamo, which
# torch.optim imports when an optimizer is made (seconds).
FORKSERVER_PRELOAD = ["hetplan.runtime.profiler", "torch._dynamo"]
# Message sizes of the link measurement: 4 KiB (latency-bound) to 16 MiB (bandwidth-bound).
LINK_MESSAGE_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
_LR = 1e-4  # the step's value does not matter for its time
# The options that size what a measuring process allocates: a refusal for want of memory names them.
SHAPE_OPTIONS = "--mbs/--seq-len/--layers/--hidden/--heads/--ffn/--vocab"
# How torch says an allocation failed when it raises a plain RuntimeError: the CPU allocator on Linux and
# macOS ("can't allocate memory") or Windows ("not enough memory"), CUDA outside its caching allocator
# ("CUDA error: out of memory"); the caching allocator raises torch.OutOfMemoryError.
_ALLOCATION_FAILED = ("can't allocate memory", "not enough memory", "out of memory")
GIB = 1024**3


@dataclass(frozen=True)
class ProfileRequest:
    arch: ModelArch
    microbatches: tuple[int, ...]
    tp_degrees: tuple[int, ...]
    gpu_type: str
    device: str = "cpu"  # "cpu" | "cuda" | "cuda:i" (rank r of a TP group uses cuda:i+r)
    dtype: str = "float32"
    threads: int = 1
    warmup: int = 2
    repeats: int = 5
    optimizer: str = "adam"
    links: bool = False
    seed: int = 0


# ---- the model --------------------------------------------------------------------------------------
def model_config(arch: ModelArch) -> ModelConfig:
    """The runtime's ModelConfig for an architecture (hetplan.runtime.runnable.check_arch refuses what the
    runtime cannot run before torch is imported)."""
    from hetplan.runtime.runnable import check_arch

    check_arch(arch, (1,))
    return ModelConfig(num_layers=arch.num_layers, hidden_size=arch.hidden_size, num_heads=arch.num_heads,
                       ffn_hidden_size=arch.ffn_hidden_size, vocab_size=arch.vocab_size, seq_len=arch.seq_len,
                       tied_embeddings=arch.tied_embeddings)


def check_request(req: ProfileRequest) -> None:
    """Refuse what cannot be measured, before any process starts."""
    from hetplan.runtime.runnable import check_arch

    check_arch(req.arch, req.tp_degrees)
    if req.dtype not in DTYPES:
        raise InstanceError(f"unknown dtype {req.dtype!r}; use one of {sorted(DTYPES)}", "--dtype")
    if req.optimizer not in ("adam", "sgd"):
        raise InstanceError(f"unknown optimizer {req.optimizer!r}; use adam or sgd", "--optimizer")
    _check_device(req)
    _check_memory(req)


def _check_device(req: ProfileRequest) -> None:
    if req.device == "cpu":
        return
    kind, _, index = req.device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise InstanceError(f"expected cpu, cuda or cuda:INDEX, got {req.device!r}", "--device")
    if not torch.cuda.is_available():
        raise InstanceError("CUDA was asked for, but torch sees no CUDA device on this machine", "--device")
    need = int(index or 0) + max(req.tp_degrees)
    if torch.cuda.device_count() < need:
        raise InstanceError(f"TP degree {max(req.tp_degrees)} from {req.device} needs {need} CUDA devices, "
                            f"this machine has {torch.cuda.device_count()}", "--device")


def _check_memory(req: ProfileRequest) -> None:
    """Refuse a shape that surely cannot fit, before torch allocates any of it (torch's failure, or the
    kernel's OOM killer, would come in the middle of the run)."""
    need, device = lower_bound_bytes(req), rank_device(req, 0)
    have = device_memory_bytes(device)
    if need > have:
        raise InstanceError(f"{shape_text(req)} needs at least {need / GIB:,.1f} GiB ({req.dtype}) in one process, "
                            f"more than the {have / GIB:,.1f} GiB of {device}", SHAPE_OPTIONS)


def lower_bound_bytes(req: ProfileRequest) -> int:
    """Bytes one measuring process surely holds at once, at the smallest TP degree and largest microbatch:
    a lower bound, so that no shape that would fit is refused. Every unit is built and run backward before
    the optimizer step, so all parameters and their gradients are held together; and one unit's forward
    makes its largest tensor: a block's attention scores (microbatch x heads x seq x seq) or the head's
    logits (microbatch x seq x vocab, gathered over the TP group)."""
    a, t, b = req.arch, min(req.tp_degrees), max(req.microbatches)
    h, s = a.hidden_size, a.seq_len
    block = (4 * h * h + 2 * h * a.ffn_hidden_size) // t  # Q, K, V, output and the two MLP weights
    params = a.num_layers * block + 2 * (a.vocab_size // t) * h  # the head keeps its own word embedding
    largest = max(b * (a.num_heads // t) * s * s, b * s * a.vocab_size)
    return (2 * params + largest) * DTYPES[req.dtype].itemsize


def device_memory_bytes(device: torch.device) -> float:
    """The memory of a device: a CUDA device's total, or this machine's physical memory for the CPU."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def shape_text(req: ProfileRequest) -> str:
    a = req.arch
    return (f"microbatch {max(req.microbatches)} x seq {a.seq_len} of {a.name} ({a.num_layers} layers, hidden "
            f"{a.hidden_size}, {a.num_heads} heads, FFN {a.ffn_hidden_size}, vocab {a.vocab_size})")


def allocation_failed(exc: BaseException) -> bool:
    """Whether torch (or Python) failed to allocate memory."""
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):  # torch.OutOfMemoryError from 2.5
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _ALLOCATION_FAILED)


@contextmanager
def refuse_when_out_of_memory(req: ProfileRequest, device: torch.device) -> Iterator[None]:
    """A failed allocation as what it is, a shape too large for this machine (bad input, exit 1), not an
    internal error: _check_memory's bound is low on purpose and cannot see what else holds memory."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        if not allocation_failed(exc):
            raise
        tried = re.search(r"tried to allocate ([\d.]+ \w+)", str(exc), re.IGNORECASE)
        amount = f" (torch tried to allocate {tried.group(1)})" if tried else ""
        raise InstanceError(f"{shape_text(req)} does not fit in the memory of {device}{amount}; "
                            "profile a smaller shape", SHAPE_OPTIONS) from None


def rank_device(req: ProfileRequest, rank: int) -> torch.device:
    if req.device == "cpu":
        return torch.device("cpu")
    _, _, index = req.device.partition(":")
    return torch.device("cuda", int(index or 0) + rank)


# ---- timing --------------------------------------------------------------------------------------------
class _Clock:
    """Seconds of a callable: perf_counter on CPU, CUDA events on a GPU; the TP group starts together."""

    def __init__(self, device: torch.device, tp: TPContext):
        self.device, self.tp = device, tp

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.tp.active:
            dist.barrier(group=self.tp.group)

    def run(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0


def _median_s(clock: _Clock, fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    times = [clock.run(fn)[1] for _ in range(warmup + repeats)]
    return statistics.median(times[warmup:])


# ---- one TP rank ---------------------------------------------------------------------------------------
class _UnitBench:
    """One layer unit on one TP rank: inputs, forward, backward and memory of one microbatch."""

    def __init__(self, unit: torch.nn.Module, kind: str, cfg: ModelConfig, dtype: torch.dtype,
                 device: torch.device):
        self.unit, self.kind, self.cfg, self.dtype, self.device = unit, kind, cfg, dtype, device
        self.gen = torch.Generator(device="cpu").manual_seed(1234 + unit.unit)

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=torch.float32).to(self.device, self.dtype)

    def inputs(self, b: int) -> tuple[Callable[[], Any], Any]:
        """(forward closure on a fresh input, gradient of its output)."""
        s, h, v = self.cfg.seq_len, self.cfg.hidden_size, self.cfg.vocab_size
        if self.kind == "embedding":
            tokens = torch.randint(0, v, (b, s), generator=self.gen).to(self.device)
            return (lambda: self.unit(tokens)), self._randn(b, s, h)
        x = self._randn(b, s, h)
        if self.kind == "block":
            return (lambda: self.unit(x.detach().requires_grad_())), self._randn(b, s, h)
        labels = torch.randint(0, v, (b, s), generator=self.gen).to(self.device)
        return (lambda: self.unit(x.detach().requires_grad_(), labels, 1.0 / b)), None

    def times(self, clock: _Clock, b: int, warmup: int, repeats: int) -> UnitTime:
        forward, grad = self.inputs(b)
        fwd, bwd = [], []
        for _ in range(warmup + repeats):
            out, f = clock.run(forward)
            _, g = clock.run(lambda: torch.autograd.backward(out, grad))
            fwd.append(f)
            bwd.append(g)
        return UnitTime(statistics.median(fwd[warmup:]), statistics.median(bwd[warmup:]))

    def memory(self, b: int) -> UnitMemory:
        forward, _ = self.inputs(b)
        params = list(self.unit.parameters())
        if self.device.type == "cuda":
            out, act, peak = _cuda_forward_bytes(forward, self.device)
        else:
            out, act = _saved_bytes(forward, params)
            peak = None
        return UnitMemory(params_per_gpu=float(sum(p.numel() for p in params)),
                          params_bytes=float(sum(p.numel() * p.element_size() for p in params)),
                          activation_bytes=float(act), output_bytes=float(out.numel() * out.element_size()),
                          total_bytes=peak)


def _saved_bytes(forward: Callable[[], torch.Tensor], params: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Run forward and count the bytes of the storages it saves for backward, parameters excluded:
    the ledger `hetplan measure` counts a run's activations with (runtime/probe.py), so both sides
    keep one definition."""
    ledger = SavedTensorLedger({storage_key(p)[0] for p in params})
    with ledger.hooks():
        out = forward()
    return out, ledger.live_bytes


def _cuda_forward_bytes(forward: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, int, float]:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = forward()
    torch.cuda.synchronize(device)
    kept = torch.cuda.memory_allocated(device) - before - out.numel() * out.element_size()
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    return out.detach(), max(kept, 0), float(peak)


def _build_units(cfg: ModelConfig, tp: TPContext, req: ProfileRequest, device: torch.device) -> list[_UnitBench]:
    """Every unit as a one-unit stage holds it (the runtime's StageModule)."""
    dtype = DTYPES[req.dtype]
    benches = []
    for u in range(cfg.num_units):
        stage = StageModule(cfg, u, u + 1, tp, req.seed, dtype, device)
        kind = "embedding" if u == 0 else ("head" if u == cfg.num_units - 1 else "block")
        benches.append(_UnitBench(stage.units()[0], kind, cfg, dtype, device))
    return benches


def _tp_comm(clock: _Clock, cfg: ModelConfig, tp: TPContext, b: int, req: ProfileRequest,
             device: torch.device) -> list[UnitTime]:
    """Per unit, its TP collectives timed alone on the unit's tensor shapes (module docstring)."""
    dtype = DTYPES[req.dtype]
    hidden = torch.zeros(b, cfg.seq_len, cfg.hidden_size, dtype=dtype, device=device)
    logits = torch.zeros(b, cfg.seq_len, cfg.vocab_size // tp.size, dtype=dtype, device=device)
    parts = [torch.empty_like(logits) for _ in range(tp.size)]
    ar = _median_s(clock, lambda: dist.all_reduce(hidden, group=tp.group), req.warmup, req.repeats)
    ag = _median_s(clock, lambda: dist.all_gather(parts, logits, group=tp.group), req.warmup, req.repeats)
    blocks = [UnitTime(2 * ar, 2 * ar)] * cfg.num_layers
    return [UnitTime(ar, 0.0), *blocks, UnitTime(ag, ar)]


def _update(clock: _Clock, benches: list[_UnitBench], req: ProfileRequest) -> tuple[float, float]:
    """(median seconds of one optimizer step over all units' parameters, state bytes per element)."""
    params = [p for bench in benches for p in bench.unit.parameters()]
    for p in params:  # every unit was run backward, but be safe for a parameter a path skipped
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    optimizer = _make_optimizer(req.optimizer, params, _LR)
    seconds = _median_s(clock, optimizer.step, max(req.warmup, 1), req.repeats)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    return seconds, state / sum(p.numel() for p in params)


def measure_rank(req: ProfileRequest, tp: TPContext, device: torch.device,
                 report: Callable[[str], None]) -> dict[str, Any]:
    """Everything one TP rank measures at TP degree tp.size (plain data; combined by `combine`)."""
    with refuse_when_out_of_memory(req, device):
        return _measure_rank(req, tp, device, report)


def _measure_rank(req: ProfileRequest, tp: TPContext, device: torch.device,
                  report: Callable[[str], None]) -> dict[str, Any]:
    cfg = model_config(req.arch)
    clock = _Clock(device, tp)
    benches = _build_units(cfg, tp, req, device)
    out: dict[str, Any] = {"tp": tp.size, "by_mbs": {}}
    for b in req.microbatches:
        units = [bench.times(clock, b, req.warmup, req.repeats) for bench in benches]
        memory = [bench.memory(b) for bench in benches]
        comm = _tp_comm(clock, cfg, tp, b, req, device) if tp.active else None
        out["by_mbs"][b] = {"units": units, "memory": memory, "tp_comm": comm}
        report(f"tp {tp.size}, microbatch {b}")
    out["update_s"], out["state_bytes_per_param"] = _update(clock, benches, req)
    return out


def _slowest(result: dict[str, Any], tp: TPContext) -> dict[str, Any]:
    """Every time of the TP group's slowest rank (element-wise maximum over the ranks)."""
    if not tp.active:
        return result
    flat = [result["update_s"]]
    for entry in result["by_mbs"].values():
        flat += [v for u in entry["units"] + entry["tp_comm"] for v in (u.fwd_s, u.bwd_s)]
    values = torch.tensor(flat, dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=tp.group)
    it = iter(values.tolist())
    result["update_s"] = next(it)
    for entry in result["by_mbs"].values():
        for key in ("units", "tp_comm"):
            entry[key] = [UnitTime(next(it), next(it)) for _ in entry[key]]
    return result


# ---- links between two local processes -----------------------------------------------------------------
def measure_links(req: ProfileRequest, rank: int, size: int, device: torch.device) -> LinkFit | None:
    """Ping-pong p2p between ranks 0 and 1 and all-reduce over all, per message size; rank 0 fits."""
    clock = _Clock(device, TPContext(size, rank, None))
    p2p, allreduce = [], []
    for nbytes in LINK_MESSAGE_BYTES:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)

        def ping_pong() -> None:
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)

        p2p.append(_median_s(clock, ping_pong, req.warmup, req.repeats) / 2)  # one way
        allreduce.append(_median_s(clock, lambda: dist.all_reduce(buf), req.warmup, req.repeats))
    if rank != 0:
        return None
    ring = 2 * (size - 1) / size
    lat, bw = fit_alpha_beta(LINK_MESSAGE_BYTES, p2p)
    ar_lat, ar_bw = fit_alpha_beta([ring * n for n in LINK_MESSAGE_BYTES], allreduce)
    return LinkFit(latency_s=lat, bandwidth_GBps=bw, allreduce_latency_s=ar_lat, allreduce_bandwidth_GBps=ar_bw,
                   processes=size, message_bytes=tuple(float(n) for n in LINK_MESSAGE_BYTES),
                   p2p_s=tuple(p2p), allreduce_s=tuple(allreduce))


def fit_alpha_beta(nbytes: list[float] | tuple[int, ...], seconds: list[float]) -> tuple[float, float]:
    """Least-squares t = latency + n / bandwidth; (latency_s >= 0, bandwidth_GBps > 0)."""
    n = len(seconds)
    mx, my = sum(nbytes) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in nbytes)
    slope = sum((x - mx) * (y - my) for x, y in zip(nbytes, seconds)) / sxx
    if slope <= 0:  # flat or falling (noise on a very fast link): bandwidth from the largest message
        slope = seconds[-1] / nbytes[-1]
    latency = max(my - slope * mx, 0.0)
    return latency, 1.0 / slope / 1e9


# ---- processes ---------------------------------------------------------------------------------------
def _child(req: ProfileRequest, size: int, rank: int, init_method: str, queue: Any, job: str) -> None:
    """One process of a TP group (job "tp"), of the link measurement ("links"), or both ("tp+links")."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: a sandbox may not route to its hostname
    torch.set_num_threads(req.threads)
    try:
        device = rank_device(req, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method,
                                world_size=size, rank=rank)
        tp = TPContext(size, rank, dist.group.WORLD)
        report = (lambda text: queue.put(("progress", text))) if rank == 0 else (lambda text: None)
        result: dict[str, Any] = {}
        if "tp" in job.split("+"):
            result["tp"] = _slowest(measure_rank(req, tp, device, report), tp)
        if "links" in job.split("+"):
            result["links"] = measure_links(req, rank, size, device)
            report("links")
        dist.barrier()
        if rank == 0:
            queue.put(("result", result))
        dist.destroy_process_group()
    except HetplanError as exc:  # a refusal (a shape too large for memory...): the parent raises it as it is
        queue.put(("refused", str(exc)))
        raise SystemExit(1)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it as one line
        queue.put(("error", f"rank {rank}: {traceback.format_exc().strip().splitlines()[-1]}"))
        raise SystemExit(1)


def _spawn(req: ProfileRequest, size: int, job: str, progress: Callable[[str], None]) -> dict[str, Any]:
    import queue as queue_mod

    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect when start_forkserver ran already
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hetplan-profile-") as tmp:
        init = f"file://{Path(tmp) / 'store'}"
        procs = [ctx.Process(target=_child, args=(req, size, r, init, queue, job), daemon=True) for r in range(size)]
        for p in procs:
            p.start()
        try:
            while True:
                try:
                    kind, payload = queue.get(timeout=0.5)
                except queue_mod.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    if dead:
                        raise EstimatorError(f"profiling process {dead[0]} died (exit code {procs[dead[0]].exitcode})")
                    continue
                if kind == "refused":
                    raise InstanceError(payload)
                if kind == "error":
                    raise EstimatorError(f"profiling at TP degree {size} failed: {payload}")
                if kind == "progress":
                    progress(payload)
                    continue
                return payload
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.exitcode is None:
                    p.terminate()


# ---- the whole profile --------------------------------------------------------------------------------
def steps(req: ProfileRequest) -> int:
    """Progress steps of a request: one per (tp, microbatch), plus the link measurement."""
    multi = any(t > 1 for t in req.tp_degrees)
    return len(req.tp_degrees) * len(req.microbatches) + (1 if multi or req.links else 0)


def run_profile(req: ProfileRequest, progress: Callable[[str], None] = lambda text: None) -> GpuProfile:
    check_request(req)
    results: dict[int, dict[str, Any]] = {}
    link: LinkFit | None = None
    # The process groups first: nothing else runs on the machine while this process measures TP 1
    # (the forkserver, started early by start_forkserver, may still be importing before).
    for t in sorted(req.tp_degrees, reverse=True):
        if t == 1:
            continue
        got = _spawn(req, t, "tp" if link else "tp+links", progress)  # links once, in the first group
        results[t] = got["tp"]
        link = link or got.get("links")
    if req.links and link is None:  # asked for, and no TP group measured it
        link = _spawn(req, 2, "links", progress)["links"]
    if 1 in req.tp_degrees:
        torch.set_num_threads(req.threads)
        results[1] = measure_rank(req, TPContext(), rank_device(req, 0), progress)
    return assemble(req, results, link)


def assemble(req: ProfileRequest, results: dict[int, dict[str, Any]], link: LinkFit | None) -> GpuProfile:
    times, memory = [], []
    for t in sorted(results):
        for b, entry in sorted(results[t]["by_mbs"].items()):
            comm = tuple(entry["tp_comm"]) if entry["tp_comm"] is not None else None
            times.append(TimeMeasurement(microbatch=b, tp=t, units=tuple(entry["units"]),
                                         update_s=results[t]["update_s"], tp_comm=comm))
            memory.append(MemoryMeasurement(microbatch=b, tp=t, units=tuple(entry["memory"])))
    state = statistics.median(r["state_bytes_per_param"] for r in results.values())
    return GpuProfile(gpu_type=req.gpu_type, times=tuple(times), memory=tuple(memory), model=req.arch.name,
                      source=_source(req), device=device_info(req, times), optimizer=req.optimizer,
                      optimizer_state_bytes_per_param=state,
                      links=(("intra_node", link),) if link is not None else ())


def _source(req: ProfileRequest) -> str:
    a = req.arch
    return (f"hetplan profile: {a.name} ({a.num_layers} layers, hidden {a.hidden_size}, {a.num_heads} heads, "
            f"seq {a.seq_len}), {req.dtype} on {req.device}, {req.threads} thread(s), median of {req.repeats}")


def device_info(req: ProfileRequest, times: list[TimeMeasurement]) -> DeviceInfo:
    device = rank_device(req, 0)
    return DeviceInfo(name=req.gpu_type, kind=device.type, memory_bytes=device_memory_bytes(device),
                      threads=req.threads if device.type == "cpu" else None, dtype=req.dtype,
                      torch_version=str(torch.__version__), achieved_tflops=achieved_tflops(req.arch, times))


def achieved_tflops(arch: ModelArch, times: list[TimeMeasurement]) -> float | None:
    """Blocks' forward FLOP/s at the smallest TP degree and largest microbatch measured (Megatron's
    FLOP count, estimators/model_stats.unit_flops_fwd, split over the TP ranks)."""
    from hetplan.estimators.model_stats import unit_flops_fwd

    best = min(times, key=lambda m: (m.tp, -m.microbatch))
    rates = [unit_flops_fwd(arch, u, best.microbatch) / best.tp / best.units[u].fwd_s
             for u in range(1, arch.num_layers + 1) if best.units[u].fwd_s > 0]
    return statistics.median(rates) / 1e12 if rates and all(math.isfinite(r) for r in rates) else None


def default_device_name(device: str, threads: int) -> str:
    """The GPU type a profile is labelled with when --gpu-type is not given."""
    if device == "cpu":
        return f"CPU-{threads}thread"
    _, _, index = device.partition(":")
    return "-".join(torch.cuda.get_device_name(int(index or 0)).split()) or "GPU"
