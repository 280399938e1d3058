"""Measure a plan on this machine and compare each part with the simulator (`hetplan measure`).

`measure_plan(instance, plan, steps, warmup, ...)` trains the plan exactly as `hetplan launch
--local` does (runtime/local.py `launch_local`, one process per rank) with the executor's probe on
(RunOptions.measure, runtime/probe.py), drops the first `warmup` steps and reduces the remaining
steps' per-rank records to the parts the simulator reports (simulator/pipeline.py). Per kept step:

  measured part          per step                                       simulated field
  iteration_time_s       max over ranks of the rank's step time         SimulationReport.iteration_time_s
  pipeline_s             on the step's slowest rank: its step time      SimulationReport.pipeline_s
                         minus its sync_s minus its update_s
  sync_s                 the slowest rank's GradSync.sync time          SimulationReport.sync_s
  update_s               the slowest rank's optimizer.step time         SimulationReport.update_s
  stage<s>_fwd_s         max over stage s's ranks of forward time,      m x StageReport.fwd_s
                         summed over the step's m microbatches          (fwd_s is one microbatch of the
  stage<s>_bwd_s         same for backward (no wait for the gradient)   straggler replica; m = num_microbatches)
  peak_memory_bytes      max over ranks of the rank's peak memory       max over ranks of RankMemory.memory.total_bytes

and each figure is the median over the kept steps, except peak memory: the maximum over them.
pipeline_s, sync_s and update_s come from the same rank, so they add up to its step time, as
T_iter = T_pipe + T_sync + T_update does in the simulator. A rank's sync time includes waiting for
the last holder to reach the collective (skew), which the simulator does not model.
relative_error[part] = (simulated - measured) / measured (None where the measured part is 0).

The simulator scores the instance with the run's model overrides applied to its model (hidden
size, heads, ...), so both sides describe the same model; it keeps the instance's precision and
GPU types, and the estimator's memory total includes its per-GPU overhead. The measured peak is
the accounted peak on CPU (parameters + gradients + optimizer state + tensors saved for backward,
runtime/probe.py) and torch.cuda.max_memory_allocated on CUDA.

Validation setting (CPU): a 2-core machine, one torch thread per rank (runtime/local.py sets
OMP_NUM_THREADS=1 and torch.set_num_threads(1)), and plans with at most 2 ranks busy at once
(for example 1 stage x TP 2, or 2 stages x TP 1): more busy ranks than cores time-share the
cores and inflate every measured part.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from hetplan.errors import PlanError
from hetplan.instance import Instance, ModelRef, load_instance
from hetplan.plan import Plan, load_plan
from hetplan.runtime.local import LocalRunResult, launch_local
from hetplan.simulator import SimulationReport, simulate

PRECISION_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


@dataclass(frozen=True)
class MeasureResult:
    measured: dict[str, float]
    simulated: dict[str, float]
    relative_error: dict[str, float | None]
    steps_used: int  # steps after the warm-up that the medians are taken over
    warmup: int
    wall_s: float  # the launch, start to end
    log_path: Path
    device: str
    notes: tuple[str, ...]

    @property
    def parts(self) -> list[str]:
        return list(self.measured)

    def to_json(self) -> dict[str, Any]:
        return {"measured": self.measured, "simulated": self.simulated, "relative_error": self.relative_error,
                "steps_used": self.steps_used, "warmup": self.warmup, "wall_s": self.wall_s,
                "log": str(self.log_path), "device": self.device, "notes": list(self.notes)}


def relative_error(simulated: float, measured: float) -> float | None:
    return (simulated - measured) / measured if measured != 0 else None


def with_model_overrides(instance: Instance, overrides: dict[str, Any]) -> Instance:
    """The instance whose model carries the run's overrides, so the simulator scores the model that runs."""
    if not overrides:
        return instance
    ref = instance.workload.model
    try:
        if ref.arch is not None:
            new = ModelRef(arch=ref.arch.model_copy(update=overrides))
        else:
            new = ModelRef(preset=ref.preset, overrides={**ref.overrides, **overrides})
        new.resolve()
    except ValidationError as exc:
        raise PlanError(f"model overrides {overrides} do not make a valid model: {exc.errors()[0]['msg']}",
                        "model") from None
    workload = instance.workload.model_copy(update={"model": new})
    return instance.model_copy(update={"workload": workload})


# ---- reducing the per-rank records ------------------------------------------------------------
def _slowest(records: list[dict[str, Any]]) -> dict[str, Any]:
    return max(records, key=lambda rec: rec["iteration_time_s"])


def _stage_max(records: list[dict[str, Any]], ranks: list[int], key: str) -> float:
    return max(records[r][key] for r in ranks)


def measured_parts(rank_steps: list[list[dict[str, Any]]], stage_ranks: list[list[int]]) -> dict[str, float]:
    """The module docstring's table, left column, from per-step lists of per-rank records."""
    slowest = [_slowest(step) for step in rank_steps]
    out = {
        "iteration_time_s": statistics.median(s["iteration_time_s"] for s in slowest),
        "pipeline_s": statistics.median(s["iteration_time_s"] - s["sync_s"] - s["update_s"] for s in slowest),
        "sync_s": statistics.median(s["sync_s"] for s in slowest),
        "update_s": statistics.median(s["update_s"] for s in slowest),
    }
    for s, ranks in enumerate(stage_ranks):
        out[f"stage{s}_fwd_s"] = statistics.median(_stage_max(step, ranks, "forward_s") for step in rank_steps)
        out[f"stage{s}_bwd_s"] = statistics.median(_stage_max(step, ranks, "backward_s") for step in rank_steps)
    out["peak_memory_bytes"] = max(rec["peak_memory_bytes"] for step in rank_steps for rec in step)
    return out


def simulated_parts(report: SimulationReport, num_microbatches: int) -> dict[str, float]:
    """The module docstring's table, right column."""
    out = {"iteration_time_s": report.iteration_time_s, "pipeline_s": report.pipeline_s,
           "sync_s": report.sync_s, "update_s": report.update_s}
    for st in report.stages:
        out[f"stage{st.index}_fwd_s"] = num_microbatches * st.fwd_s
        out[f"stage{st.index}_bwd_s"] = num_microbatches * st.bwd_s
    out["peak_memory_bytes"] = max(r.memory.total_bytes for r in report.ranks)
    return out


def _notes(instance: Instance, dtype: str, run: LocalRunResult) -> tuple[str, ...]:
    notes = [f"measured on {run.log['device']} with {dtype}; simulated for GPU types "
             f"{sorted({r.gpu_type for r in run.spec.ranks})} at precision {instance.workload.precision}"]
    if PRECISION_OF_DTYPE.get(dtype) != instance.workload.precision:
        notes.append(f"the run's dtype {dtype} is not the instance's precision {instance.workload.precision}: "
                     f"memory and time are not like for like")
    return tuple(notes)


# ---- the whole measurement --------------------------------------------------------------------
def measure_plan(instance: Instance | str | Path, plan: Plan | str | Path, steps: int = 10, warmup: int = 2,
                 model_overrides: dict[str, Any] | None = None, *, schedule: str | None = None,
                 dtype: str = "float32", optimizer: str | None = None, lr: float | None = None, seed: int = 0,
                 out_dir: str | Path | None = None, timeout_s: float = 600.0,
                 on_progress: Callable[[int], None] | None = None) -> MeasureResult:
    """Train `plan` for `steps` steps with the probe on and compare the steps after `warmup` with
    the simulator (see the module docstring). Raises PlanError for bad input, LaunchError when a
    rank fails."""
    if warmup < 0 or steps <= warmup:
        raise PlanError(f"warmup {warmup} must be at least 0 and below the {steps} steps (the medians need a step "
                        f"after it)", "warmup")
    inst = instance if isinstance(instance, Instance) else load_instance(instance)
    pl = plan if isinstance(plan, Plan) else load_plan(plan)
    if schedule is not None:
        pl = pl.model_copy(update={"schedule": schedule})
    overrides = dict(model_overrides or {})
    simulated_instance = with_model_overrides(inst, overrides)
    report = simulate(simulated_instance, pl)  # first: a plan the simulator refuses is not launched
    start = time.perf_counter()
    run = launch_local(inst, pl, steps, overrides, dtype=dtype, optimizer=optimizer, lr=lr, seed=seed,
                       out_dir=out_dir, timeout_s=timeout_s, quiet=True, measure=True, on_progress=on_progress)
    wall_s = time.perf_counter() - start
    stage_ranks = [[r.rank for r in run.spec.ranks if r.stage == s] for s in range(run.spec.num_stages)]
    measured = measured_parts(run.rank_steps[warmup:], stage_ranks)
    simulated = simulated_parts(report, pl.num_microbatches)
    errors = {k: relative_error(simulated[k], v) for k, v in measured.items()}
    return MeasureResult(measured, simulated, errors, steps - warmup, warmup, wall_s, run.out_dir / "log.json",
                         str(run.log["device"]), _notes(inst, dtype, run))
