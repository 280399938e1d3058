"""Launch targets: golden files of each rendered output, structural checks that do not depend on
the golden copy, and refusals of plans Megatron-LM / DeepSpeed cannot express.

Regenerate the golden files after an intended change with
    HETPLAN_UPDATE_GOLDEN=1 python -m pytest tests/test_runtime_targets.py
and review the diff under tests/golden/runtime/.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hetplan.errors import PlanError
from hetplan.instance import load_instance
from hetplan.plan import load_plan, plan_from_dict
from hetplan.runtime.compile import CompileOptions, compile_plan, write_launch
from hetplan.runtime.spec import LaunchSpec
from hetplan.runtime.targets import deepspeed_uniform_parts

GOLDEN = Path(__file__).parent / "golden" / "runtime"
ZONE = "us-central1-a"


def a100(tp: int = 1, share: int = 4) -> dict:
    return {"gpu_type": "A100-40", "tp": tp, "zone": ZONE, "microbatch_share": share}


def uniform_plan(bounds: list[int], tp: int, dp: int = 2, schedule: str = "1F1B", shares: list[int] | None = None,
                 name: str = "uniform"):
    shares = shares or [4] * dp
    return plan_from_dict({"name": name, "schedule": schedule, "num_microbatches": 64 // sum(shares), "stages": [
        {"layer_start": a, "layer_end": b, "replicas": [a100(tp, x) for x in shares]}
        for a, b in zip(bounds, bounds[1:])]})


@pytest.fixture(scope="module")
def instance():
    return load_instance("a100_v100_one_zone")


@pytest.fixture(scope="module")
def het_plan():
    return load_plan("a100_v100_one_zone")


def _cases(instance, het_plan):
    return {
        "het_torchrun": (het_plan, "torchrun", CompileOptions()),
        "het_torchrun_c10d": (het_plan, "torchrun", CompileOptions(rendezvous="c10d", master_port=29400,
                                                                   hosts={"a100-0": "10.0.0.1", "v100-0": "10.0.0.2"})),
        "het_slurm": (het_plan, "slurm", CompileOptions()),
        "het_kubernetes": (het_plan, "kubernetes", CompileOptions(image="registry.example/hetplan:0.1")),
        # TP=2, DP=2 on both stages, 10 + 14 blocks: Megatron's first/last-stage layer flags.
        "uniform_megatron": (uniform_plan([0, 11, 26], tp=2, name="uniform_tp2"), "megatron", CompileOptions()),
        # TP=1, DP=2, 13 + 13 units = DeepSpeed's uniform partition of 26 layers.
        "uniform_deepspeed": (uniform_plan([0, 13, 26], tp=1, name="uniform_dp2"), "deepspeed", CompileOptions()),
    }


CASE_NAMES = ["het_torchrun", "het_torchrun_c10d", "het_slurm", "het_kubernetes", "uniform_megatron",
              "uniform_deepspeed"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_rendered_files_match_golden(case, instance, het_plan):
    plan, target, options = _cases(instance, het_plan)[case]
    files = compile_plan(instance, plan, target, options).files
    folder = GOLDEN / case
    if os.environ.get("HETPLAN_UPDATE_GOLDEN"):
        shutil.rmtree(folder, ignore_errors=True)
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
    expected = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}
    assert sorted(files) == sorted(expected), "set of files differs from tests/golden/runtime/" + case
    for rel, text in files.items():
        assert text == expected[rel], f"{case}/{rel} differs from its golden copy"


def test_write_launch_writes_spec_and_scripts(instance, het_plan, tmp_path):
    paths = write_launch(instance, het_plan, "torchrun", tmp_path)
    names = sorted(str(p.relative_to(tmp_path)) for p in paths)
    assert names == ["README.md", "launch_spec.json", "torchrun/commands.txt", "torchrun/node0_a100-0.sh",
                     "torchrun/node1_v100-0.sh"]
    assert LaunchSpec.model_validate_json((tmp_path / "launch_spec.json").read_text()).world_size == 5
    assert os.access(tmp_path / "torchrun/node0_a100-0.sh", os.X_OK)


def test_a_reused_folder_keeps_no_file_of_an_earlier_compile(instance, het_plan, tmp_path):
    """The heterogeneous plan on two nodes, then a uniform one on one node, into one folder: the old
    plan's second node script goes (a `for f in node*.sh` would have started it, helper-11's F7); a
    file the compile did not write stays, and a listed path outside the folder is never removed."""
    write_launch(instance, het_plan, "torchrun", tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("mine too")
    listed = json.loads((tmp_path / ".hetplan-compiled.json").read_text())
    (tmp_path / ".hetplan-compiled.json").write_text(json.dumps(listed + [f"../{outside.name}"]))
    write_launch(instance, uniform_plan([0, 13, 26], tp=1, dp=1, name="one-node"), "torchrun", tmp_path)
    scripts = sorted(p.name for p in (tmp_path / "torchrun").glob("node*.sh"))
    assert scripts == ["node0_a100-0.sh"] and (tmp_path / "notes.txt").exists() and outside.exists()
    assert json.loads((tmp_path / ".hetplan-compiled.json").read_text()) == [
        "README.md", "launch_spec.json", "torchrun/commands.txt", "torchrun/node0_a100-0.sh"]


@pytest.mark.parametrize("target", ["torchrun", "slurm"])
def test_shell_scripts_parse(instance, het_plan, target, tmp_path):
    for path in write_launch(instance, het_plan, target, tmp_path):
        if path.suffix in (".sh", ".sbatch"):
            subprocess.run(["bash", "-n", str(path)], check=True)


def test_torchrun_commands_one_line_per_node(instance, het_plan):
    files = compile_plan(instance, het_plan, "torchrun").files
    lines = files["torchrun/commands.txt"].splitlines()[1:]
    assert len(lines) == 2
    assert lines[1].startswith("HETPLAN_NODE_ID=v100-0 CUDA_VISIBLE_DEVICES=0,1 torchrun --nnodes=2 --nproc-per-node=2 "
                               "--node-rank=1 --master-addr=a100-0 --master-port=29500 -m hetplan.runtime.execute")


def test_slurm_script_runs_one_torchrun_per_node(instance, het_plan):
    text = compile_plan(instance, het_plan, "slurm").files["hetplan.sbatch"]
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"\nexport MASTER_ADDR\n' in text
    assert text.count("exec torchrun") == 1 and "--rdzv-backend=c10d" in text
    assert "a100-0) NODE_ID=a100-0; NPROC=3; GPUS=0,1,2 ;;" in text
    assert "--nodelist" not in text  # only pinned when hostnames are given
    pinned = compile_plan(instance, het_plan, "slurm", CompileOptions(hosts={"a100-0": "n1", "v100-0": "n2"}))
    assert "#SBATCH --nodelist=n1,n2" in pinned.files["hetplan.sbatch"]


def test_kubernetes_manifest_structure(instance, het_plan):
    launch = compile_plan(instance, het_plan, "kubernetes")
    config_map, job = list(yaml.safe_load_all(launch.files["pytorchjob.yaml"]))
    assert LaunchSpec.model_validate_json(config_map["data"]["launch_spec.json"]) == launch.spec
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert sorted(specs) == ["Master", "Worker"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
    gpus = 0
    for role in specs.values():
        (container,) = role["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        gpus += role["replicas"] * container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == launch.spec.world_size


def test_kubernetes_refuses_unlike_workers(instance):
    # three nodes used: a100-0 (stage 0), v100-0 (2 GPUs) and a100-1 (1 GPU): workers differ
    plan = plan_from_dict({"num_microbatches": 8, "stages": [
        {"layer_start": 0, "layer_end": 13, "replicas": [{"gpu_type": "A100-40", "node": "a100-0", "microbatch_share": 8}]},
        {"layer_start": 13, "layer_end": 26, "replicas": [
            {"gpu_type": "V100-16", "tp": 2, "zone": ZONE, "microbatch_share": 4},
            {"gpu_type": "A100-40", "node": "a100-1", "microbatch_share": 4}]}]})
    with pytest.raises(PlanError, match="Worker pod one template"):
        compile_plan(instance, plan, "kubernetes")


# ---- Megatron-LM ------------------------------------------------------------------------------
def _megatron_layout_blocks(layout: str) -> list[str]:
    """Megatron-core's layout grammar: ',' is cosmetic, 'x*n' repeats, '|' separates stages."""
    layout = layout.replace(",", "")
    layout = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    layout = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    return layout.split("|")


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_megatron_degrees_and_batch(instance):
    launch = compile_plan(instance, uniform_plan([0, 11, 26], tp=2), "megatron")
    args = json.loads(launch.files["megatron/args.json"])
    tp, pp = int(_arg(args, "--tensor-model-parallel-size")), int(_arg(args, "--pipeline-model-parallel-size"))
    dp = launch.spec.world_size // (tp * pp)  # Megatron: DP = world / (TP x PP)
    assert (tp, pp, dp) == (2, 2, 2)
    assert int(_arg(args, "--global-batch-size")) == int(_arg(args, "--micro-batch-size")) * dp * 8 == 64
    assert (_arg(args, "--decoder-first-pipeline-num-layers"), _arg(args, "--decoder-last-pipeline-num-layers")) == ("10", "14")
    assert "--fp16" in args and "--untie-embeddings-and-output-weights" not in args


def test_megatron_even_split_needs_no_layer_flags(instance):
    args = json.loads(compile_plan(instance, uniform_plan([0, 13, 26], tp=1), "megatron").files["megatron/args.json"])
    # 12 + 12 blocks: Megatron's default even split
    assert not [a for a in args if "pipeline-num-layers" in a or "layout" in a]


def test_megatron_layout_for_uneven_middle_stages(instance):
    plan = uniform_plan([0, 5, 12, 20, 26], tp=1)  # blocks 4, 7, 8, 5
    args = json.loads(compile_plan(instance, plan, "megatron").files["megatron/args.json"])
    stages = _megatron_layout_blocks(_arg(args, "--pipeline-model-parallel-layout"))
    assert stages == ["E" + "t" * 4, "t" * 7, "t" * 8, "t" * 5 + "L"]


@pytest.mark.parametrize("plan_kwargs, message", [
    ({"bounds": [0, 13, 26], "tp": 1, "shares": [3, 5]}, "uneven microbatch shares \\[3, 5\\]"),
])
def test_megatron_refusals(instance, plan_kwargs, message):
    with pytest.raises(PlanError, match=message):
        compile_plan(instance, uniform_plan(**plan_kwargs), "megatron")


def test_megatron_and_deepspeed_refuse_the_heterogeneous_plan(instance, het_plan):
    for target in ("megatron", "deepspeed"):
        with pytest.raises(PlanError, match=f"cannot be launched with {target}: .*different TP degrees \\[1, 2\\]"):
            compile_plan(instance, het_plan, target)


def test_refusal_of_different_dp_per_stage(instance):
    plan = plan_from_dict({"num_microbatches": 8, "stages": [
        {"layer_start": 0, "layer_end": 13, "replicas": [a100(share=8)]},
        {"layer_start": 13, "layer_end": 26, "replicas": [a100(), a100()]}]})
    for target in ("megatron", "deepspeed"):
        with pytest.raises(PlanError, match="different numbers of replicas \\(DP\\) \\[1, 2\\]"):
            compile_plan(instance, plan, target)


def test_refusal_of_interleaved_placement(instance):
    # stage 0 on a100-0:0 and a100-1:0, stage 1 on a100-0:1 and a100-1:1: nodes hold
    # non-consecutive workers, so a stage-major framework would swap roles.
    plan = plan_from_dict({"num_microbatches": 8, "stages": [
        {"layer_start": 0, "layer_end": 13, "replicas": [
            {"gpu_type": "A100-40", "node": "a100-0", "gpus": [0], "microbatch_share": 4},
            {"gpu_type": "A100-40", "node": "a100-1", "gpus": [0], "microbatch_share": 4}]},
        {"layer_start": 13, "layer_end": 26, "replicas": [
            {"gpu_type": "A100-40", "node": "a100-0", "gpus": [1], "microbatch_share": 4},
            {"gpu_type": "A100-40", "node": "a100-1", "gpus": [1], "microbatch_share": 4}]}]})
    compile_plan(instance, plan, "torchrun")  # hetplan's own executor takes it
    with pytest.raises(PlanError, match="interleaves stages across nodes"):
        compile_plan(instance, plan, "megatron")


# ---- DeepSpeed --------------------------------------------------------------------------------
def test_deepspeed_batch_identity(instance):
    launch = compile_plan(instance, uniform_plan([0, 13, 26], tp=1), "deepspeed")
    config = json.loads(launch.files["deepspeed/ds_config.json"])
    dp = 2
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * dp) == 64
    assert config["fp16"] == {"enabled": True} and config["zero_optimization"] == {"stage": 0}
    assert launch.files["deepspeed/hostfile"] == "a100-0 slots=4\n"


def test_deepspeed_uniform_partition_by_hand():
    assert deepspeed_uniform_parts(26, 2) == [0, 13, 26]
    assert deepspeed_uniform_parts(26, 4) == [0, 7, 14, 20, 26]  # 26 = 4 x 6 + 2: first two get 7
    assert deepspeed_uniform_parts(3, 4) == [0, 1, 2, 3, 3]


@pytest.mark.parametrize("plan_kwargs, message", [
    ({"bounds": [0, 13, 26], "tp": 2}, "no tensor parallelism \\(plan uses TP=2\\)"),
    ({"bounds": [0, 11, 26], "tp": 1}, "cannot take an explicit layer list per stage: .*\\[0, 11, 26\\] .*\\[0, 13, 26\\]"),
])
def test_deepspeed_refusals(instance, plan_kwargs, message):
    with pytest.raises(PlanError, match=message):
        compile_plan(instance, uniform_plan(**plan_kwargs), "deepspeed")


@pytest.mark.parametrize("target, launcher", [("megatron", "megatron/node0_a100-0.sh"),
                                               ("deepspeed", "deepspeed/launch.sh")])
def test_uniform_gpipe_plan_runs_as_1f1b_with_a_note(instance, target, launcher):
    """Same microbatches, same accumulated gradients, one optimizer step: only the order of
    forwards and backwards differs, so the framework's 1F1B runs the GPipe plan's iteration."""
    gpipe = compile_plan(instance, uniform_plan([0, 13, 26], tp=1, schedule="GPipe"), target)
    one_f_one_b = compile_plan(instance, uniform_plan([0, 13, 26], tp=1), target)
    (note,) = gpipe.notes
    assert f"schedule is GPipe; {'Megatron-LM' if target == 'megatron' else 'DeepSpeed'} runs 1F1B" in note
    assert "at most 2 microbatches' activations held per stage instead of 8" in note
    assert f"# NOTE: {note}" in gpipe.files[launcher].splitlines()
    assert f"- {note}" in gpipe.files["README.md"].splitlines()
    assert one_f_one_b.notes == () and "NOTE" not in one_f_one_b.files[launcher]
    framework_files = [rel for rel in gpipe.files if rel.startswith(f"{target}/") and rel != launcher]
    for rel in framework_files:  # arguments / configs do not depend on the schedule
        if not rel.endswith(".sh"):
            assert gpipe.files[rel] == one_f_one_b.files[rel], rel


def test_unknown_target(instance, het_plan):
    with pytest.raises(PlanError, match="unknown launch target 'mpi'"):
        compile_plan(instance, het_plan, "mpi")
