"""`compile` and `launch --local` commands: files written, training runs (their error cases are in
test_cli_contract.py, through the installed executable)."""
from __future__ import annotations

import json
from pathlib import Path

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


def left_after(pids: list[int], wait_s: float) -> list[int]:
    """Those of `pids` still running `wait_s` s on, killed so as not to be left to the rest of the suite."""
    import os
    import signal
    import time

    from test_time_limits import alive

    deadline = time.monotonic() + wait_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_ctrl_c_while_the_forkserver_imports_torch_is_one_line_and_leaves_nothing(tmp_path):
    """Ctrl-C (SIGINT to the launcher's process group) while the forkserver of `launch --local`
    imports torch: it was interrupted there and printed its KeyboardInterrupt traceback under the
    launcher's one line. Now it runs in a group of its own (runtime/_forkserver.py), which the
    signal does not reach, and dies with the launcher (prctl PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import time

    from conftest import communicate_or_stacks, dumps_stacks
    from test_cli_contract import executable
    from test_time_limits import alive, children

    plan = __import__("hetplan.bundled", fromlist=["bundled_dir"]).bundled_dir() / "plans" / "elastic_small.json"
    cmd = [executable(), "launch", "elastic_small", str(plan), "--local", "--steps", "500", "--hidden", "16", "--heads",
           "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8", "-o", str(tmp_path / "out")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dumps_stacks())
    server, t0 = None, time.monotonic()
    while server is None and time.monotonic() - t0 < 60 and proc.poll() is None:
        server = next(iter(children(proc.pid)), None)
        time.sleep(0.01)
    assert server is not None, f"no forkserver appeared (exit {proc.poll()})"
    seen = time.monotonic()  # the old forkserver stayed in the launcher's group: signal it 0.5 s in
    while time.monotonic() - seen < 0.5 and alive(server) and os.getpgid(server) == proc.pid:
        time.sleep(0.01)
    importing = not (Path(tmp_path / "out") / "rank0.pid").exists()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = communicate_or_stacks(proc, 30)
    assert proc.returncode == 130 and err.splitlines() == [
        "error: stopped by SIGINT; files named with -o/--plot are written only by a command that finishes"], err
    deadline = time.monotonic() + 10
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(server) and importing


def test_ranks_of_a_killed_launcher_end_with_it(tmp_path):
    """SIGKILL to `launch --local` (no chance to stop its ranks): the ranks trained on, and the
    forkserver, which they keep open, with them. Each now dies with its parent (PR_SET_PDEATHSIG):
    the launcher, then the forkserver, then the ranks."""
    import os
    import signal
    import subprocess
    import time

    from test_cli_contract import executable
    from test_time_limits import alive, children

    plan = __import__("hetplan.bundled", fromlist=["bundled_dir"]).bundled_dir() / "plans" / "elastic_small.json"
    out = tmp_path / "out"
    cmd = [executable(), "launch", "elastic_small", str(plan), "--local", "--steps", "100000", "--hidden", "16",
           "--heads", "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and proc.poll() is None and not (out / "rank3.steps").exists():
        time.sleep(0.05)
    ranks = [int((out / f"rank{r}.pid").read_text()) for r in range(4)]
    servers = children(proc.pid)
    assert all(alive(pid) for pid in ranks) and servers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not left_after([*ranks, *servers], 10)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_torchrun_ranks_end_with_a_stopped_launcher(sig, tmp_path):
    """`launch --local --method torchrun`: on SIGTERM the launcher's subprocess.run SIGKILLed
    torchrun's agent, which then could not stop its ranks, and a SIGKILL of the launcher stopped
    nothing (helper-11: 6 ranks still training 30 s after exit 143). The agent now dies with the
    launcher and each rank with the agent (PR_SET_PDEATHSIG: runtime/_torchrun.py)."""
    import os
    import signal
    import subprocess
    import time

    from test_cli_contract import executable
    from test_time_limits import children

    plan = __import__("hetplan.bundled", fromlist=["bundled_dir"]).bundled_dir() / "plans" / "elastic_small.json"
    out = tmp_path / "out"
    cmd = [executable(), "launch", "elastic_small", str(plan), "--local", "--method", "torchrun", "--steps", "100000",
           "--hidden", "16", "--heads", "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 90 and proc.poll() is None and not (out / "rank0.steps").exists():
        time.sleep(0.05)
    agents = children(proc.pid)
    ranks = {pid for agent in agents for pid in children(agent)}
    assert agents and len(ranks) >= 4, (agents, ranks)  # the elastic_small plan has 4 ranks
    os.kill(proc.pid, getattr(signal, sig))
    proc.wait()
    assert not left_after([*agents, *ranks], 15)
