"""hetplan's runtime: compile a plan into launch files and really train it.

* `spec`: LaunchSpec (rank table, process groups, gradient-sync entries, p2p transfers, schedule,
  batch, rendezvous) built from a validated plan, and its invariants (`check_spec`).
* `compile`: `compile_plan` / `write_launch` for the targets torchrun, slurm, kubernetes
  (Kubeflow PyTorchJob), megatron and deepspeed (the last two only for uniform plans).
* `execute`: the torch.distributed executor (`python -m hetplan.runtime.execute --spec ...`):
  pipeline stages with per-stage DP and TP, uneven microbatch shares, GPipe / 1F1B.
* `local`: `launch_local` runs every rank of a plan on this machine (CPU, gloo).
* `probe`: per-rank step instrumentation (compute, p2p wait, sync, update times; accounted peak
  memory), off unless RunOptions.measure.
* `measure`: `measure_plan` runs a plan locally with the probe on and compares it with the simulator.
* `reference`: the single-process full-batch run that a distributed run must reproduce.
* `checkpoint`: layer-wise checkpoints per (unit, TP shard) that reload under other TP degrees.
* `cli`: `register(app)` adds the `compile` and `launch` commands.

Modules import torch lazily where they can: `spec`, `compile` and `targets` need no torch.
"""
from hetplan.runtime.compile import TARGETS, CompiledLaunch, CompileOptions, compile_plan, write_launch
from hetplan.runtime.spec import LaunchSpec, build_spec, check_spec, load_spec

__all__ = ["TARGETS", "CompileOptions", "CompiledLaunch", "LaunchSpec", "build_spec", "check_spec",
           "compile_plan", "load_spec", "write_launch"]
