"""Memory estimator from measured profiles (`hetplan profile`, or Sailor's llm_info), name "profile".

Per worker holding `units` at TP degree tp, with the GPU type's memory measurements at that tp:

    params      = sum of the units' params_bytes (params_per_gpu x 4 where only elements are known)
    grads       = params (the runtime keeps gradients in the parameters' dtype)
    optimizer   = optimizer state bytes per element x the units' parameter elements: the profile's
                  measured figure when it stepped the instance's optimizer; SGD (torch.optim.SGD
                  without momentum, as the runtime builds it) keeps none; Adam on a profile that did
                  not measure it: 2 x the parameter bytes per element (exp_avg and exp_avg_sq)
    activations = in_flight x sum of the units' activation_bytes at the microbatch
    overhead    = option framework_overhead_GiB; default 0 for a profile measured on a CPU (its
                  activation definition already is the whole of what the executor counts), else 1 GiB
                  like the analytic estimator (CUDA context, allocator, communication buffers)

ZeRO divides params / grads / optimizer state over dp as estimators/analytic.py does (stages 3/2/1).
activation_bytes(b) is exact at a measured microbatch size, linearly interpolated between the two
measured sizes around b, extrapolated from the two nearest beyond them, proportional with one size
(activations grow linearly in the microbatch), floored at 0. The capacity is the instance's memory of
the GPU type (for a type a profile defines: the device's memory, see hetplan.instance).
"""
from __future__ import annotations

from typing import Any, Mapping

from hetplan.errors import EstimatorError
from hetplan.estimators.analytic import GIB, zero_divisors
from hetplan.estimators.base import MemoryBreakdown
from hetplan.estimators.profile_time import PROFILE_FILE_OPTIONS, instance_profiles, own_options
from hetplan.profiles import GpuProfile, MemoryMeasurement, ProfileSet

_FLOAT_BYTES = 4  # Sailor's llm_info counts fp32 elements


class ProfileMemoryEstimator:
    """MemoryEstimator backed by the memory measurements of a ProfileSet (module docstring)."""

    name = "profile"
    READS_PROFILES = True  # workload.profiles (build_estimators warns when no chosen estimator does)
    OPTIONS: tuple[str, ...] = ("framework_overhead_GiB",) + PROFILE_FILE_OPTIONS  # the estimators.options keys it reads

    def __init__(self, profiles: ProfileSet, capacity_bytes: Mapping[str, float], *, optimizer: str = "adam",
                 zero_stage: int = 0, overhead_bytes: Mapping[str, float] | None = None):
        self.profiles, self.capacity_bytes = profiles, dict(capacity_bytes)
        self.optimizer, self.zero_stage = optimizer, zero_stage
        self.overhead_bytes = {p.gpu_type: (overhead_bytes or {}).get(p.gpu_type, default_overhead_bytes(p))
                               for p in profiles.profiles}

    @classmethod
    def from_instance(cls, instance: Any, options: Mapping[str, Any] | None = None) -> "ProfileMemoryEstimator":
        """Options (flat, or nested under "profile"): framework_overhead_GiB, plus the profile
        estimator's file options (llm_info, sailor_model, metis_fwd_fraction)."""
        opts = own_options(options, cls.name)
        profiles = instance_profiles(instance, opts, "profile memory estimator")
        overhead = opts.get("framework_overhead_GiB")
        overheads = None if overhead is None else {g: float(overhead) * GIB for g in profiles.gpu_types}
        capacity = {g: float(instance.gpu(g).memory_bytes) for g in instance.gpu_types if g in profiles}
        return cls(profiles, capacity, optimizer=instance.workload.optimizer, zero_stage=instance.workload.zero_stage,
                   overhead_bytes=overheads)

    # ---- lookups with clear errors ---------------------------------------------------------------
    def _measurements(self, gpu_type: str, tp: int) -> tuple[GpuProfile, list[MemoryMeasurement]]:
        if gpu_type not in self.profiles or gpu_type not in self.capacity_bytes:
            raise EstimatorError(f"profile memory estimator: no profile for GPU type {gpu_type!r}; "
                                 f"profiles exist for {self.profiles.gpu_types}")
        profile = self.profiles.get(gpu_type)
        found = sorted((m for m in profile.memory if m.tp == tp), key=lambda m: m.microbatch)
        if not found:
            measured = sorted({m.tp for m in profile.memory})
            raise EstimatorError(f"profile memory estimator: {gpu_type} has no memory measurement at TP degree {tp}; "
                                 f"measured TP degrees: {measured or 'none'} ({profile.source})")
        return profile, found

    # ---- MemoryEstimator ---------------------------------------------------------------------------
    def worker_memory(self, gpu_type: str, units: range, tp: int, microbatch: int, dp: int,
                      in_flight: int) -> MemoryBreakdown:
        profile, found = self._measurements(gpu_type, tp)
        elements, params_bytes = _params(found[0], units, gpu_type, tp)
        div_p, div_g, div_o = zero_divisors(self.zero_stage, dp)
        state = self._state_bytes_per_element(profile, params_bytes / elements if elements else 0.0)
        return MemoryBreakdown(
            params_bytes=params_bytes / div_p,
            grads_bytes=params_bytes / div_g,
            optimizer_bytes=elements * state / div_o,
            activations_bytes=in_flight * sum(activation_bytes(found, u, microbatch, gpu_type) for u in units),
            overhead_bytes=self.overhead_bytes[gpu_type],
            capacity_bytes=self.capacity_bytes[gpu_type],
        )

    def _state_bytes_per_element(self, profile: GpuProfile, param_bytes_per_element: float) -> float:
        if profile.optimizer == self.optimizer and profile.optimizer_state_bytes_per_param is not None:
            return profile.optimizer_state_bytes_per_param
        if self.optimizer == "sgd":
            return 0.0
        return 2 * param_bytes_per_element


def default_overhead_bytes(profile: GpuProfile) -> float:
    on_cpu = profile.device is not None and profile.device.kind == "cpu"
    return 0.0 if on_cpu else 1.0 * GIB


def _params(m: MemoryMeasurement, units: range, gpu_type: str, tp: int) -> tuple[float, float]:
    """(parameter elements, parameter bytes) of `units` in one measurement."""
    elements = bytes_ = 0.0
    for u in units:
        unit = m.units[u]
        if unit.params_per_gpu is None and unit.params_bytes is None:
            raise EstimatorError(f"profile memory estimator: {gpu_type} at TP degree {tp}: layer unit {u} has no "
                                 f"parameter measurement")
        count = unit.params_per_gpu if unit.params_per_gpu is not None else unit.params_bytes / _FLOAT_BYTES
        elements += count
        bytes_ += unit.params_bytes if unit.params_bytes is not None else count * _FLOAT_BYTES
    return elements, bytes_


def activation_bytes(found: list[MemoryMeasurement], unit: int, b: int, gpu_type: str) -> float:
    """Activation bytes of one unit for microbatch b from measurements ascending in microbatch."""
    points = [(m.microbatch, m.units[unit].activation_bytes) for m in found
              if m.units[unit].activation_bytes is not None]
    if not points:
        raise EstimatorError(f"profile memory estimator: {gpu_type} at TP degree {found[0].tp}: layer unit {unit} "
                             f"has no activation measurement")
    exact = dict(points)
    if b in exact:
        return exact[b]
    if len(points) == 1:
        return points[0][1] * b / points[0][0]
    if b < points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif b > points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        i = next(i for i, (x, _) in enumerate(points) if x > b)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))
