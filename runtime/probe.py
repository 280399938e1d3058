"""Per-step instrumentation of one rank, for `hetplan measure` (runtime/measure.py).

The executor (execute.py) runs every step through a probe. `NullProbe` (the default) does nothing:
its context managers are one shared `nullcontext`, so an unmeasured run pays a few method calls
per microbatch. `StepProbe` (RunOptions.measure) records per step, in the order of `STEP_FIELDS`:

* iteration_time_s: the whole step, zero_grad to the end of the optimizer step;
* forward_s: time in the stage module's forward, summed over the step's microbatches;
* backward_s: time in autograd backward, summed over microbatches; the incoming gradient is
  received before backward starts, so waiting for it is p2p, not backward. Tensor-parallel
  all-reduces run inside forward and backward and count there, as the simulator's layer times
  include them;
* p2p_wait_s: blocked in receives (with the TP broadcast of what the leader received), issuing
  the asynchronous sends, and waiting for pending sends at the end of the pipeline;
* sync_s: the gradient synchronisation (`GradSync.sync`); update_s: `optimizer.step()`;
* data_s: making the synthetic token batches (inputs and labels);
* peak_memory_bytes: on CUDA `torch.cuda.max_memory_allocated` (reset at the start of each
  step); elsewhere the accounted peak below, because peak RSS counts the Python/torch runtime;
* accounted_peak_bytes and its parts at that peak (params_bytes, grads_bytes, optimizer_bytes,
  activations_bytes): live bytes of parameters + gradients + optimizer state + tensors saved for
  backward (through `torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage, parameter
  storages excluded from the saved part), sampled after every forward, after every backward (its
  gradient accumulation done) and after the optimizer step, and the maximum taken over the step.
  A saved tensor stops counting when the graph that saved it is freed by its microbatch's
  backward. (A forward whose graph is dropped without a backward keeps counting: a tensor saved
  as its own op's output then forms a cycle through autograd's C++ nodes that gc does not free;
  the executor runs a backward for every forward.) The profiler's per-unit activation bytes use this same definition;
  keep the two the same. Tensors that the pipeline holds but autograd does not save (the stage
  output awaiting its backward, send buffers, the sync's flat buffers) are not counted.
* peak_rss_bytes: the process's peak resident set so far (informational only).

Times use `time.perf_counter`; on CUDA every boundary first calls `torch.cuda.synchronize`, so a
region's time includes its kernels (measuring serialises the host with the device; that is the
price of attributing time to parts).
"""
from __future__ import annotations

import resource
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Iterator

import torch

STEP_FIELDS = ("iteration_time_s", "forward_s", "backward_s", "p2p_wait_s", "sync_s", "update_s", "data_s",
               "peak_memory_bytes", "accounted_peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes",
               "activations_bytes", "peak_rss_bytes")
TIME_PARTS = ("forward_s", "backward_s", "p2p_wait_s", "sync_s", "update_s", "data_s")
_NULL = nullcontext()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(storage address, storage bytes); (id, tensor bytes) for tensors without a plain storage."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), tensor_bytes(t)


class _Packed:
    """What autograd keeps instead of a saved tensor while the probe counts it: when autograd
    drops it (its graph freed), the finalizer takes its storage off the live count."""

    __slots__ = ("tensor", "key", "ledger")

    def __init__(self, tensor: torch.Tensor, key: int, ledger: "SavedTensorLedger"):
        self.tensor, self.key, self.ledger = tensor, key, ledger

    def __del__(self) -> None:
        self.ledger.release(self.key)


class SavedTensorLedger:
    """Live bytes of the storages autograd saved for backward, each storage counted once."""

    def __init__(self, excluded_storages: set[int]):
        self.excluded = excluded_storages  # parameter storages: counted as parameters
        self.live: dict[int, list[int]] = {}  # storage key -> [saved references, storage bytes]
        self.live_bytes = 0

    def pack(self, t: torch.Tensor) -> Any:
        key, nbytes = storage_key(t)
        if key in self.excluded or nbytes == 0:
            return t
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, nbytes]
            self.live_bytes += nbytes
        else:
            entry[0] += 1
        return _Packed(t, key, self)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Packed) else packed

    def release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:  # never expected; a finalizer must not raise
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self.live[key]

    def hooks(self) -> AbstractContextManager:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class NullProbe:
    """Measures nothing (the default): the executor's code path stays the same, minus the cost."""

    def begin_step(self) -> None:
        pass

    def timed(self, part: str) -> AbstractContextManager:
        return _NULL

    def saving(self) -> AbstractContextManager:
        return _NULL

    def sample_memory(self) -> None:
        pass

    def end_step(self, iteration_time_s: float) -> list[float]:
        return []


NULL_PROBE = NullProbe()


class StepProbe(NullProbe):
    """Records one rank's step (see the module docstring for what each field means)."""

    def __init__(self, device: torch.device, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer):
        self.device, self.params, self.optimizer = device, params, optimizer
        self.cuda = device.type == "cuda"
        self.params_bytes = sum(tensor_bytes(p) for p in params)
        self.ledger = SavedTensorLedger({storage_key(p)[0] for p in params})
        self.begin_step()

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def begin_step(self) -> None:
        self.parts_s = dict.fromkeys(TIME_PARTS, 0.0)
        self.peak = (0, 0, 0, 0)  # (grads, optimizer, activations, total) bytes at the accounted peak
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextmanager
    def _timed(self, part: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.parts_s[part] += self.now() - start

    def timed(self, part: str) -> AbstractContextManager:
        return self._timed(part)

    def saving(self) -> AbstractContextManager:
        return self.ledger.hooks()

    def _optimizer_bytes(self) -> int:
        return sum(tensor_bytes(v) for state in self.optimizer.state.values() for v in state.values()
                   if isinstance(v, torch.Tensor))

    def sample_memory(self) -> None:
        grads = sum(tensor_bytes(p.grad) for p in self.params if p.grad is not None)
        opt, act = self._optimizer_bytes(), self.ledger.live_bytes
        total = self.params_bytes + grads + opt + act
        if total > self.peak[3]:
            self.peak = (grads, opt, act, total)

    def end_step(self, iteration_time_s: float) -> list[float]:
        grads, opt, act, accounted = self.peak
        device_peak = torch.cuda.max_memory_allocated(self.device) if self.cuda else accounted
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        record = {"iteration_time_s": iteration_time_s, **self.parts_s, "peak_memory_bytes": device_peak,
                  "accounted_peak_bytes": accounted, "params_bytes": self.params_bytes, "grads_bytes": grads,
                  "optimizer_bytes": opt, "activations_bytes": act, "peak_rss_bytes": rss}
        return [float(record[f]) for f in STEP_FIELDS]


def step_record(values: list[float], spec_rank: int) -> dict[str, float | int]:
    """A rank's gathered values as the log's record: times as floats, bytes as ints."""
    out: dict[str, float | int] = {"rank": spec_rank}
    for name, value in zip(STEP_FIELDS, values):
        out[name] = int(value) if name.endswith("_bytes") else value
    return out
