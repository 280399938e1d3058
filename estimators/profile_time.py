"""Time estimator from measured per-layer profiles (Sailor / Metis / hetplan files), name "profile".

For a GPU type g, TP degree k and layer unit u, the profile gives fwd/bwd seconds at some measured
microbatch sizes m_1 < ... < m_n. For a microbatch b:

* measured (b = m_i): the measurement itself.
* decomposition="linear" (default): linear interpolation between the two measured sizes around b,
  linear extrapolation from the two nearest ones beyond [m_1, m_n]; with one measured size m,
  t(b) = t(m) * b / m. An extrapolation is kept within what a GPU's time can do beyond its
  measurements, time growing with b and time per sample not (a larger microbatch runs at least as
  efficiently): t(b) in [t(m_n), t(m_n) b / m_n] above m_n, in [t(m_1) b / m_1, t(m_1)] below m_1.
  A line through noisy times can otherwise leave that band and cross zero (measured: a CPU profile
  of a tiny model whose microbatch 2 ran faster than 1 put microbatch 4 at 0 s, and the planner
  divided by it).
* decomposition="power_of_two": AutoHet eq. (5) (seed 002, sec. III "Runtime profiling") sums the
  profiled times of the powers of two in the binary decomposition of a count; Metis' heterogeneous
  cost model (SamsungLabs/Metis) applies the same decomposition to a DP group's microbatch, which is
  what is done here: t(b) = sum over the set bits 2^i of b of t(2^i), e.g. t(6) = t(4) + t(2).
  A power of two that was not measured is itself estimated linearly.

update_time_s: a profile's update_s is the optimizer step of the *whole* model on one GPU at TP
degree k (averaged over the measured microbatch sizes, it does not depend on them). A worker holding
`units` gets the share of it that those units' parameters make up, when the profile carries memory
info with parameter counts (Sailor's llm_info, Metis' parameters_per_layer_bytes; the same TP degree
if measured, else any, since the shares barely change with TP); otherwise the share is
len(units) / number of units. With ZeRO stage >= 1 the optimizer state is sharded over the dp
replicas, so the step is divided by dp.
"""
from __future__ import annotations

import warnings
from typing import Any, Literal, Mapping

from hetplan.catalog import LinkSpec
from hetplan.errors import EstimatorError
from hetplan.estimators.base import LayerTime
from hetplan.profiles import GpuProfile, ProfileSet, UnitTime

Decomposition = Literal["linear", "power_of_two"]
_DECOMPOSITIONS = ("linear", "power_of_two")


# the options instance_profiles reads, for every estimator that loads workload.profiles
PROFILE_FILE_OPTIONS = ("llm_info", "sailor_model", "metis_fwd_fraction")


def own_options(options: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    """An estimator's options: `options[name]` when that is a mapping, else the mapping itself."""
    options = options or {}
    nested = options.get(name)
    return nested if isinstance(nested, Mapping) else options


def instance_profiles(instance: Any, opts: Mapping[str, Any], who: str) -> ProfileSet:
    """The profiles of `instance.workload.profiles` (options: llm_info, sailor_model, metis_fwd_fraction),
    checked to match the model's layer units and to cover every GPU type the cluster may use."""
    from hetplan.importers import load_profiles

    refs = instance.workload.profiles
    if not refs:
        raise EstimatorError(f"{who}: workload.profiles is empty; add a ProfileRef per GPU type")
    llm_info = opts.get("llm_info")
    loaded = ProfileSet()
    for i, ref in enumerate(refs):
        path = instance.resolve_path(ref.path)
        if not path.exists():  # the loader's own line names the file, not the field that gave it
            raise EstimatorError(f"workload.profiles[{i}].path: file not found: {path}")
        loaded = loaded.merged(load_profiles(
            path, ref.format, ref.gpu_type,
            llm_info=instance.resolve_path(llm_info) if llm_info and ref.format == "sailor" else None,
            model=opts.get("sailor_model"), metis_fwd_fraction=opts.get("metis_fwd_fraction")))
    arch = instance.model_arch
    # hetplan's own profiles count parameters as model_stats does; Sailor's llm_info counts its own
    # way (GPT-Neo-2.7: 2.65e9 against 3.18e9) and Metis' files have bytes only
    own = {ref.gpu_type for ref in refs if ref.format == "hetplan"}
    for profile in loaded.profiles:
        if profile.num_units != arch.num_units:
            raise EstimatorError(
                f"{who}: the profile of {profile.gpu_type} ({profile.source}) has "
                f"{profile.num_units} layer units, the model {arch.name} has {arch.num_units} "
                f"({arch.num_layers} blocks + embedding + head)")
        if profile.gpu_type in own:
            _warn_other_model(profile, arch)
    used = set(instance.constraints.allowed_gpu_types or instance.gpu_types)
    missing = sorted(used - set(loaded.gpu_types))
    if missing:
        raise EstimatorError(f"{who}: no profile for GPU types {missing} of the cluster; "
                             f"workload.profiles covers {loaded.gpu_types}")
    return loaded


# Parameters a hetplan profile's TP-1 memory measurement may count beyond or below the model's before
# it is said to be another model's
OTHER_MODEL_SHARE = 0.05


def _warn_other_model(profile: GpuProfile, arch: Any) -> None:
    """A warning when the profile's units hold another number of parameters than the model's: the
    layer count matched, but a profile of hidden 16 planned a model of hidden 32 on its times."""
    from hetplan.estimators.model_stats import unit_params

    counted = [m for m in profile.memory if m.tp == 1 and all(u.params_per_gpu is not None for u in m.units)]
    if not counted:
        return
    measured = sum(u.params_per_gpu for u in counted[0].units)
    model = sum(unit_params(arch, u).per_gpu(1) for u in range(arch.num_units))
    if abs(measured - model) > OTHER_MODEL_SHARE * model:
        warnings.warn(f"workload.profiles: the profile of {profile.gpu_type} ({profile.source}) counts "
                      f"{measured:,.0f} parameters at TP 1, the model {arch.name} {model:,.0f}: its times are "
                      f"another model's")


class ProfileTimeEstimator:
    """TimeEstimator backed by a ProfileSet (see the module docstring for the rules)."""

    name = "profile"
    READS_PROFILES = True  # workload.profiles (build_estimators warns when no chosen estimator does)
    OPTIONS: tuple[str, ...] = ("decomposition",) + PROFILE_FILE_OPTIONS  # the estimators.options keys it reads

    def __init__(self, profiles: ProfileSet, decomposition: Decomposition = "linear", zero_stage: int = 0):
        if decomposition not in _DECOMPOSITIONS:
            raise EstimatorError(f"profile estimator: decomposition must be one of {_DECOMPOSITIONS}, "
                                 f"got {decomposition!r}")
        if not profiles.profiles:
            raise EstimatorError("profile estimator: the profile set is empty")
        self.profiles = profiles
        self.decomposition = decomposition
        self.zero_stage = zero_stage
        self._cache: dict[tuple[str, int, int, int], LayerTime] = {}

    # ---- construction from an instance -----------------------------------------------------------
    @classmethod
    def from_instance(cls, instance: Any, options: Mapping[str, Any] | None = None) -> "ProfileTimeEstimator":
        """Read `instance.workload.profiles` (paths relative to the instance file).

        options (flat, or nested under "profile"): decomposition ("linear" | "power_of_two"),
        llm_info (Sailor's llm_info.json, for the parameter shares of sailor-format profiles),
        sailor_model (Sailor's model name in llm_info; default: the profile's grandparent folder),
        metis_fwd_fraction (forward share of Metis' combined fwd+bwd time, default 1/3).
        """
        opts = own_options(options, cls.name)
        loaded = instance_profiles(instance, opts, "profile estimator")
        return cls(loaded, decomposition=opts.get("decomposition", "linear"), zero_stage=instance.workload.zero_stage)

    # ---- lookups with clear errors ---------------------------------------------------------------
    def _profile(self, gpu_type: str, tp: int) -> GpuProfile:
        if gpu_type not in self.profiles:
            raise EstimatorError(f"profile estimator: no profile for GPU type {gpu_type!r}; "
                                 f"profiles exist for {self.profiles.gpu_types}")
        profile = self.profiles.get(gpu_type)
        if tp not in profile.tp_degrees:
            raise EstimatorError(f"profile estimator: {gpu_type} was not profiled at TP degree {tp}; "
                                 f"measured TP degrees: {profile.tp_degrees}")
        return profile

    def covers(self, gpu_type: str, microbatch: int, tp: int) -> bool:
        """Whether the profile prices (microbatch, TP): any microbatch (interpolated) at a measured TP
        degree. The planner leaves the other TP degrees out, as it would with no GPUs to run them."""
        return gpu_type in self.profiles and tp in self.profiles.get(gpu_type).tp_degrees

    # ---- TimeEstimator ---------------------------------------------------------------------------
    def layer_time(self, gpu_type: str, unit: int, microbatch: int, tp: int,
                   intra_node: LinkSpec | None = None) -> LayerTime:
        """The profile's figure; `intra_node` is not read: the profiled TP times ran on the profiled
        machine's own link."""
        key = (gpu_type, unit, microbatch, tp)
        if key not in self._cache:
            profile = self._profile(gpu_type, tp)
            if not 0 <= unit < profile.num_units:
                raise EstimatorError(f"profile estimator: layer unit {unit} out of range 0..{profile.num_units - 1}")
            if microbatch < 1:
                raise EstimatorError(f"profile estimator: microbatch must be >= 1, got {microbatch}")
            self._cache[key] = self._estimate(profile, unit, microbatch, tp)
        return self._cache[key]

    def _estimate(self, profile: GpuProfile, unit: int, b: int, tp: int) -> LayerTime:
        measured = profile.time(b, tp)
        if measured is not None:
            u = measured.units[unit]
            return LayerTime(u.fwd_s, u.bwd_s)
        if self.decomposition == "linear":
            u = _linear(profile, unit, b, tp)
            return LayerTime(u.fwd_s, u.bwd_s)
        parts = [_measured_or_linear(profile, unit, 1 << i, tp) for i in range(b.bit_length()) if b >> i & 1]
        return LayerTime(sum(p.fwd_s for p in parts), sum(p.bwd_s for p in parts))

    def update_time_s(self, gpu_type: str, units: range, tp: int, dp: int) -> float:
        profile = self._profile(gpu_type, tp)
        if dp < 1:
            raise EstimatorError(f"profile estimator: dp must be >= 1, got {dp}")
        bad = [u for u in units if not 0 <= u < profile.num_units]
        if bad:
            raise EstimatorError(f"profile estimator: layer units {bad} out of range 0..{profile.num_units - 1}")
        updates = [m.update_s for m in profile.times if m.tp == tp]
        whole_model_s = sum(updates) / len(updates)
        shard = dp if self.zero_stage >= 1 else 1
        return whole_model_s * self.update_share(gpu_type, units, tp) / shard

    def update_share(self, gpu_type: str, units: range, tp: int) -> float:
        """Fraction of the whole-model update that `units` account for (parameter share, else count share)."""
        profile = self._profile(gpu_type, tp)
        weights = _param_weights(profile, tp)
        if weights is None:
            return len(units) / profile.num_units
        return sum(weights[u] for u in units) / sum(weights)


def _linear(profile: GpuProfile, unit: int, b: int, tp: int) -> UnitTime:
    sizes = profile.microbatches(tp)
    if len(sizes) == 1:
        u = profile.time(sizes[0], tp).units[unit]
        return UnitTime(u.fwd_s * b / sizes[0], u.bwd_s * b / sizes[0])
    if b <= sizes[0]:
        lo, hi = sizes[0], sizes[1]
    elif b >= sizes[-1]:
        lo, hi = sizes[-2], sizes[-1]
    else:
        hi = next(m for m in sizes if m > b)
        lo = sizes[sizes.index(hi) - 1]
    a, c = profile.time(lo, tp).units[unit], profile.time(hi, tp).units[unit]
    w = (b - lo) / (hi - lo)
    line = UnitTime(a.fwd_s + w * (c.fwd_s - a.fwd_s), a.bwd_s + w * (c.bwd_s - a.bwd_s))
    if sizes[0] <= b <= sizes[-1]:
        return line  # between two measurements: a mean of two times
    m, t = (hi, c) if b > hi else (lo, a)  # the nearest measurement
    low, high = sorted((1.0, b / m))  # the band, as multiples of t: [1, b/m] above, [b/m, 1] below
    return UnitTime(min(max(line.fwd_s, low * t.fwd_s), high * t.fwd_s),
                    min(max(line.bwd_s, low * t.bwd_s), high * t.bwd_s))


def _measured_or_linear(profile: GpuProfile, unit: int, b: int, tp: int) -> UnitTime:
    measured = profile.time(b, tp)
    return measured.units[unit] if measured is not None else _linear(profile, unit, b, tp)


def _param_weights(profile: GpuProfile, tp: int) -> list[float] | None:
    """Per-unit parameter amounts (elements, else bytes) from the memory info at tp, else any tp."""
    candidates = [m for m in profile.memory if m.tp == tp] + [m for m in profile.memory if m.tp != tp]
    for m in candidates:
        for column in ("params_per_gpu", "params_bytes"):
            values = [getattr(u, column) for u in m.units]
            if all(v is not None for v in values) and sum(values) > 0:
                return values
    return None
