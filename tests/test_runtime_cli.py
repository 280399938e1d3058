"""`compile` and `launch --local` commands: files written, training runs (their error cases are in
test_cli_contract.py, through the installed executable)."""
from __future__ import annotations

import json

import pytest
import typer
import yaml
from typer.testing import CliRunner

from hetplan.orchestration.runtime_cli import register


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def _run(app, *args):
    return CliRunner().invoke(app, list(args))


def test_compile_writes_target_files(app, tmp_path):
    result = _run(app, "compile", "a100_v100_one_zone", "a100_v100_one_zone", "--target", "slurm", "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hetplan.sbatch").exists() and (tmp_path / "launch_spec.json").exists()
    assert "hetplan.sbatch" in result.output


def test_launch_local_tiny_model(app, tmp_path):
    instance = {"name": "cli_tiny", "cluster": {"node_groups": [
        {"name": "a100", "gpu_type": "A100-40", "gpus_per_node": 4, "count": 1, "zone": "z", "price_per_gpu_hour_usd": 1}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 1}}, "global_batch_size": 4,
                     "precision": "fp16"}}
    plan = {"name": "cli_tiny", "num_microbatches": 2, "stages": [
        {"layer_start": 0, "layer_end": 2, "replicas": [{"gpu_type": "A100-40", "zone": "z", "microbatch_share": 2}]},
        {"layer_start": 2, "layer_end": 3, "replicas": [{"gpu_type": "A100-40", "zone": "z", "microbatch_share": 1},
                                                         {"gpu_type": "A100-40", "zone": "z", "microbatch_share": 1}]}]}
    (tmp_path / "inst.yaml").write_text(yaml.safe_dump(instance))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    args = ["launch", "--local", str(tmp_path / "inst.yaml"), str(tmp_path / "plan.json"), "--steps", "2",
            "--hidden", "16", "--heads", "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8", "-o", str(tmp_path / "run")]
    result = _run(app, *args)
    assert result.exit_code == 0, result.output
    rows = [ln.split() for ln in result.output.splitlines() if ln[:4].strip().isdigit()]
    assert [r[0] for r in rows] == ["1", "2"]
    log = json.loads((tmp_path / "run" / "log.json").read_text())
    assert [s["loss"] for s in log["steps"]] == pytest.approx([float(r[1]) for r in rows], abs=1e-6)
    # errors reach the caller as HetplanError (hetplan.orchestration.cli.main prints them as one line)
    bad = _run(app, *args[:-2], "--heads", "3")
    assert bad.exit_code == 1 and "hidden_size 16 is not divisible by num_heads 3" in str(bad.exception)
    bad = _run(app, *args, "--schedule", "ZB")
    assert bad.exit_code == 1 and "unknown schedule 'ZB'" in str(bad.exception)
