"""The command line: readable output, --json, and one clear line (no traceback) on bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args, ok=True):
    proc = subprocess.run([sys.executable, "-m", "hetplan.orchestration.cli", *args], capture_output=True, text=True, cwd=REPO)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_gpus_lists_the_catalogue():
    data = json.loads(run("gpus", "--json").stdout)
    required = {"A100-40", "A100-80", "H100", "H800", "H20", "V100-16", "V100-32", "A10G", "T4", "L20",
                "RTX-4090", "RTX-3090", "Titan-RTX", "RTX-2080"}
    assert required <= set(data)
    assert data["A100-40"]["peak_bf16_tflops"] == 312 and data["V100-16"]["peak_bf16_tflops"] is None
    assert "H800" in run("gpus").stdout


def test_validate_and_simulate_bundled():
    assert "valid" in run("validate", "a100_v100_one_zone").stdout
    out = json.loads(run("simulate", "a100_v100_one_zone", "a100_v100_one_zone", "--json").stdout)
    assert out["oom_ranks"] == [] and out["num_gpus"] == 5 and out["iteration_time_s"] > 0
    text = run("simulate", "instances/autohet_3type.yaml", "instances/plans/autohet_3type.json").stdout
    assert "H20/tp4" in text and "samples/s" in text


@pytest.mark.parametrize("content, needle", [
    ("name: x\ncluster: [\n", "invalid YAML at line"),
    ("name: x\ncluster: {node_groups: [{name: a, gpu_type: Z80, gpus_per_node: 1, count: 1, zone: z-a, "
     "price_per_gpu_hour_usd: 1}]}\nworkload: {model: OPT-350M, global_batch_size: 8}\n",
     "cluster.node_groups[0].gpu_type: unknown GPU type 'Z80'"),
    ("name: x\ncluster: {node_groups: [{name: a, gpu_type: T4, gpus_per_node: 1, count: 1, zone: z-a, "
     "price_per_gpu_hour_usd: 1}], network: {inter_zone: {bandwidth_GBps: -1}}}\n"
     "workload: {model: OPT-350M, global_batch_size: 8, precision: fp16}\n",
     "cluster.network.inter_zone.bandwidth_GBps"),
])
def test_bad_instances_exit_nonzero_with_one_clear_message(tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    proc = run("validate", str(path), ok=False)
    assert proc.returncode == 1
    assert needle in proc.stderr.replace("\n", "")
    assert "Traceback" not in proc.stderr


def test_bad_plan_exits_nonzero(tmp_path):
    plan = json.loads((REPO / "instances" / "plans" / "a100_v100_one_zone.json").read_text())
    plan["stages"][1]["layer_end"] = 20
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = run("simulate", "a100_v100_one_zone", str(path), ok=False)
    assert proc.returncode == 1 and "layer units" in proc.stderr and "Traceback" not in proc.stderr


def test_a_plan_made_for_another_instance_is_said(tmp_path):
    """A plan's `instance` field was never looked at (helper-11's F7): the bundled plan on a copy of its
    instance under another name runs, with one warning naming both; on its own instance, none."""
    plan = json.loads((REPO / "instances" / "plans" / "a100_v100_one_zone.json").read_text())
    assert plan["instance"] == "a100_v100_one_zone"
    text = (REPO / "instances" / "a100_v100_one_zone.yaml").read_text()
    (tmp_path / "copy.yaml").write_text(text.replace("name: a100_v100_one_zone", "name: copy", 1))
    proc = run("simulate", str(tmp_path / "copy.yaml"), "a100_v100_one_zone")
    said = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(said) == 1 and "'a100_v100_one_zone'" in said[0] and "'copy'" in said[0], proc.stderr
    assert "warning" not in run("simulate", "a100_v100_one_zone", "a100_v100_one_zone").stderr


def test_plan_using_more_gpus_than_exist(tmp_path):
    plan = json.loads((REPO / "instances" / "plans" / "a100_v100_one_zone.json").read_text())
    plan["stages"][0]["replicas"] = [{"gpu_type": "A100-40", "tp": 4, "zone": "us-central1-a", "microbatch_share": 2}] * 4
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = run("simulate", "a100_v100_one_zone", str(path), ok=False)
    assert proc.returncode == 1 and "more GPUs than exist" in proc.stderr.replace("\n", "")


def test_schema_export(tmp_path):
    out = tmp_path / "schema.json"
    run("schema", "-o", str(out))
    assert json.loads(out.read_text())["title"] == "hetplan instance"


def _free_gpus_instance(tmp_path: Path, free: tuple[str, ...]) -> Path:
    """elastic_small with every node up and the node groups in `free` at price 0."""
    import yaml

    data = yaml.safe_load((REPO / "instances" / "elastic_small.yaml").read_text())
    data.pop("events")
    for group in data["cluster"]["node_groups"]:
        if group["name"] in free:
            group["price_per_gpu_hour_usd"] = 0.0
    path = tmp_path / "free.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_pareto_front_has_no_dominated_point(tmp_path):
    """With the V100s free the cheapest plan (cost 0, 1 GPU) ties on cost with a faster one: the front
    keeps the faster; every point costs more and runs faster than the one before."""
    path = _free_gpus_instance(tmp_path, ("v",))
    front = json.loads(run("pareto", str(path), "--points", "4", "--time-limit", "10", "--json").stdout)
    pairs = [(p["cost_usd"], p["iters_per_s"]) for p in front]
    assert len(pairs) >= 2
    assert all(c0 < c1 and t0 < t1 for (c0, t0), (c1, t1) in zip(pairs, pairs[1:])), pairs


def test_pareto_of_one_allowed_gpu_is_one_point(tmp_path):
    """One GPU type and max_gpus 1: the cheapest plan is the fastest, and the front listed it twice."""
    import yaml

    data = yaml.safe_load((REPO / "instances" / "a100_homogeneous.yaml").read_text())
    data["constraints"] = {"max_gpus": 1}
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(data))
    front = json.loads(run("pareto", str(tmp_path / "one.yaml"), "--points", "3", "--time-limit", "10",
                           "--json").stdout)
    assert len(front) == 1 and front[0]["gpus"] == 1, front


def test_pareto_of_free_gpus_is_one_point(tmp_path):
    """Every plan costs 0: no budget lies between the cheapest and the fastest, and the fastest is the front."""
    path = _free_gpus_instance(tmp_path, ("a", "v"))
    front = json.loads(run("pareto", str(path), "--points", "3", "--time-limit", "10", "--json").stdout)
    assert [p["cost_usd"] for p in front] == [0.0]
    fastest = json.loads(run("solve", str(path), "--time-limit", "10", "--json").stdout)
    assert front[0]["iters_per_s"] == pytest.approx(fastest["simulated"]["iters_per_s"])
