"""Compile a plan into launch files for a target.

    launch = compile_plan(instance, plan, "torchrun")        # LaunchSpec + rendered files
    paths = write_launch(instance, plan, "slurm", "out/")   # writes launch_spec.json + target files

Targets: torchrun (one command line + environment per node), slurm (sbatch script, one torchrun
task per node), kubernetes (Kubeflow PyTorchJob, kubeflow.org/v1), megatron (argument list) and
deepspeed (JSON config). The first three run hetplan's executor and accept any valid plan;
megatron and deepspeed are refused with the specific reason when the plan uses what they cannot
express (different TP or DP per stage, uneven microbatch shares, explicit per-stage layers for
DeepSpeed). A uniform GPipe plan runs there as 1F1B, said in `CompiledLaunch.notes` and in the
README.md written beside the files. Every target re-checks the spec invariants before anything
is written.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal

from hetplan.errors import PlanError, RefusedError
from hetplan.instance import Instance
from hetplan.plan import Plan
from hetplan.runtime import targets
from hetplan.runtime.spec import LaunchSpec, TrainingSpec, build_spec, check_spec, replan_document

TARGETS = ("torchrun", "slurm", "kubernetes", "megatron", "deepspeed")


@dataclass(frozen=True)
class CompileOptions:
    hosts: dict[str, str] = field(default_factory=dict)  # plan node id -> hostname
    master_port: int = 29500
    rendezvous: Literal["static", "c10d"] = "static"
    rdzv_id: str | None = None
    image: str = targets.K8S_IMAGE  # container image for kubernetes (Dockerfile at the repository root)
    training: TrainingSpec | None = None
    resilience: targets.Resilience | None = None  # torchrun/slurm/kubernetes: restart and resume


@dataclass(frozen=True)
class CompiledLaunch:
    target: str
    spec: LaunchSpec
    files: dict[str, str]  # relative path -> content (launch_spec.json and README.md included)
    notes: tuple[str, ...] = ()  # where the launch departs from the plan (also in README.md)


def _refusals() -> dict[str, Callable[[LaunchSpec], str | None]]:
    return {"kubernetes": targets.kubernetes_refusal, "megatron": targets.megatron_refusal,
            "deepspeed": targets.deepspeed_refusal}


def render(spec: LaunchSpec, target: str, options: CompileOptions | None = None) -> dict[str, str]:
    """Files of a target for an existing spec; PlanError if the target cannot express it."""
    options = options or CompileOptions()
    if target not in TARGETS:
        raise PlanError(f"unknown launch target {target!r}; known: {list(TARGETS)}", "target")
    check_spec(spec)
    res = options.resilience
    if res is not None and target not in ("torchrun", "slurm", "kubernetes"):
        raise PlanError(f"restarts from checkpoints are for the torchrun, slurm and kubernetes targets; {target} "
                        f"has its own checkpointing (--save/--load)", "checkpoint_dir")
    if res is not None and res.regroups:
        _check_regroup(spec, target, res)
    refusal = _refusals().get(target)
    reason = refusal(spec) if refusal else None
    if reason:
        raise RefusedError(f"plan {spec.plan_name!r} cannot be launched with {target}: {reason}", "target")
    files = {targets.SPEC_FILE: spec.to_json() + "\n",
             targets.README_FILE: targets.render_readme(spec, target, targets.notes(spec, target), res)}
    if target == "torchrun":
        files |= targets.render_torchrun(spec, res)
    elif target == "slurm":
        files |= targets.render_slurm(spec, pin_hosts=bool(options.hosts), resilience=res)
    elif target == "kubernetes":
        files |= targets.render_kubernetes(spec, options.image, res)
    elif target == "megatron":
        files |= targets.render_megatron(spec)
    else:
        files |= targets.render_deepspeed(spec)
    return files


def _check_regroup(spec: LaunchSpec, target: str, res: targets.Resilience) -> None:
    n = len(spec.nodes)
    if target == "kubernetes":
        raise PlanError("--min-nodes is for the torchrun and slurm targets: a Kubeflow PyTorchJob names its pods, "
                        "not the plan's nodes, so the executor cannot tell which node was lost; on Kubernetes a "
                        "failed pod is rescheduled on a node with the same labels and resumes", "min_nodes")
    if not 1 <= res.min_nodes <= n:
        raise PlanError(f"{res.min_nodes}, but the plan has {n} nodes; use 1 to {n}", "min_nodes")
    if spec.rendezvous.backend != "c10d":
        raise PlanError("--min-nodes needs c10d rendezvous (--rendezvous c10d): a static one cannot change "
                        "its number of nodes", "rendezvous")
    known = dict(res.node_gpus)
    missing = [node.node for node in spec.nodes if node.node not in known]
    if missing:
        raise PlanError(f"GPU counts of nodes {missing} are not known (compile_plan fills them in)", "node_gpus")


def compile_plan(instance: Instance, plan: Plan, target: str = "torchrun",
                 options: CompileOptions | None = None) -> CompiledLaunch:
    """Validate the plan against the instance, build its LaunchSpec and render `target`. With
    `resilience.min_nodes`, the launch re-plans when nodes are lost: c10d rendezvous, one process
    per GPU of each node, and replan.json (the instance and the plan) beside the spec."""
    options = options or CompileOptions()
    if target not in TARGETS:
        raise PlanError(f"unknown launch target {target!r}; known: {list(TARGETS)}", "target")
    res = options.resilience
    regroups = res is not None and res.regroups
    rendezvous = "c10d" if target == "slurm" or regroups else options.rendezvous
    spec = build_spec(instance, plan, hosts=options.hosts, master_port=options.master_port,
                      rendezvous=rendezvous, rdzv_id=options.rdzv_id, training=options.training)
    if regroups:
        res = replace(res, node_gpus=tuple((n.node, instance.node_by_id[n.node].num_gpus) for n in spec.nodes))
        options = replace(options, resilience=res)
    files = render(spec, target, options)
    if regroups:
        files[targets.REPLAN_FILE] = replan_document(instance, plan)
    return CompiledLaunch(target, spec, files, tuple(targets.notes(spec, target)))


WRITTEN = ".hetplan-compiled.json"  # the files the last `write_launch` wrote to a folder


def write_launch(instance: Instance, plan: Plan, target: str, out_dir: str | Path,
                 options: CompileOptions | None = None) -> list[Path]:
    """Write the spec (JSON) and the target's files under `out_dir`; returns the written paths.
    Everything is rendered before the first file is written, and each file is written whole
    (temporary file + rename), so a refusal or an interruption leaves no half-written file. Files
    an earlier `write_launch` wrote there (listed in WRITTEN) that this one does not are removed: a
    folder reused for a plan on fewer nodes kept the old plan's node scripts, which a
    `for f in node*.sh` would start (helper-11's F7)."""
    from hetplan.files import write_atomic

    launch = compile_plan(instance, plan, target, options)
    out = Path(out_dir)
    before = _written_before(out)
    written = []
    for rel, text in sorted(launch.files.items()):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text, "--out")
        if path.suffix == ".sh" or path.suffix == ".sbatch":
            path.chmod(0o755)
        written.append(path)
    for rel in sorted(before - set(launch.files)):
        (out / rel).unlink(missing_ok=True)
    write_atomic(out / WRITTEN, json.dumps(sorted(launch.files), indent=1) + "\n", "--out")
    return written


def _written_before(out: Path) -> set[str]:
    """The relative paths WRITTEN lists in `out` (none where it is absent or not such a list): only
    files inside `out`, so a hand-edited list cannot remove anything else."""
    try:
        listed = json.loads((out / WRITTEN).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(listed, list):
        return set()
    inside = out.resolve()
    return {rel for rel in listed if isinstance(rel, str) and inside in (out / rel).resolve().parents}
