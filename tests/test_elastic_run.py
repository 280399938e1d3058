"""The elastic supervisor (orchestration/elastic.py) on CPU with gloo: GPUs lost and gained, a rank
killed and a rank hung mid-run; the job goes on at the same global batch and ends with the
parameters of an uninterrupted single-process run (float64, Adam: runtime/reference.py)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from hetplan.bundled import bundled_dir
from hetplan.cluster_state import event_stream
from hetplan.errors import InstanceError
from hetplan.instance import load_instance
from hetplan.plan import load_plan, validate_plan
from hetplan.orchestration.replan import ReplanOptions
from hetplan.orchestration.elastic import ElasticOptions, parse_events, read_events, run_elastic
from hetplan.runtime.execute import (NEVER, model_config, read_control, stop_requested, wait_while_held,
                                     write_control)
from hetplan.runtime.local import steps_done
from hetplan.runtime.reference import assemble_dump, reference_train
from hetplan.runtime.spec import build_spec

BATCH = 8  # instances/elastic_small.yaml: OPT-350M cut to 2 layers, global batch 8
TINY = dict(hidden_size=16, num_heads=2, ffn_hidden_size=32, vocab_size=32, seq_len=8)  # what runs on the CPU
TINY_FLAGS = ["--hidden", "16", "--heads", "2", "--ffn", "32", "--vocab", "32", "--seq-len", "8"]
STEPS = 12


def bundled():
    """The bundled instance (one of its two A100 nodes up at the start) and its events file."""
    return load_instance("elastic_small"), bundled_dir() / "events" / "elastic_small.yaml"


def start_plan(inst):
    """instances/plans/elastic_small.json: stage [0,2) on the V100 node (two TP-1 replicas),
    stage [2,4) on a-0 (TP 2)."""
    return validate_plan(inst, load_plan("elastic_small"))


def options(tmp_path: Path, inst, events, steps: int = STEPS, **kw) -> ElasticOptions:
    return ElasticOptions(steps=steps, checkpoint_dir=tmp_path / "ckpt", out_dir=tmp_path / "run",
                          events=tuple(parse_events(events, "test")), cluster_events=tuple(event_stream(inst)),
                          model=TINY, dtype="float64", optimizer="adam", lr=1e-2, dump_params=True,
                          replan=ReplanOptions(planner_time_limit_s=0.3), **kw)


def assert_matches_reference(result, steps: int) -> None:
    spec = build_spec(load_instance("elastic_small"), result.final_plan)
    ref = reference_train(model_config(spec, TINY), global_batch_size=BATCH, steps=steps, optimizer="adam", lr=1e-2)
    assert result.losses == pytest.approx(ref.losses, abs=1e-9)
    params = assemble_dump(result.last_segment_dir / "params")
    assert set(params) == set(ref.params)
    for key, full in ref.params.items():
        for holder, value in params[key].items():
            err = (value - full).abs().max().item()
            assert err < 1e-5, f"{key} on stage/replica {holder}: max |elastic - reference| = {err:.3g}"


def test_lose_kill_gain_hang_ends_with_the_reference_parameters(tmp_path):
    """The issue's run: a V100 node lost at step 4, a rank killed at step 6, an A100 node gained
    at step 8; and a rank hung (SIGSTOP) at step 10, caught by a 2 s heartbeat timeout."""
    inst, events = bundled()
    timeout_s, beat_s = 2.0, 0.2
    log: list[str] = []
    opts = options(tmp_path, inst, yaml.safe_load(events.read_text()), heartbeat_timeout_s=timeout_s, heartbeat_s=beat_s)
    result = run_elastic(inst, start_plan(inst), opts, log=log.append)
    assert result.steps_completed == STEPS and result.samples_trained == STEPS * BATCH
    kinds = [(r.kind, r.at_iteration) for r in result.reconfigurations]
    assert kinds == [("availability", 4), ("failure", 6), ("availability", 8), ("hang", 10)], log
    lose, kill, gain, hang = result.reconfigurations
    assert "lose 2 V100-16@z-a" in lose.cause and "rank 1 killed by SIGKILL" in kill.cause
    assert "gain 2 A100-40@z-a" in gain.cause and "rank 0 sent no heartbeat" in hang.cause
    # the V100 node is gone after step 4; the second A100 node is used after step 8
    assert [row["from_iteration"] for row in result.plans] == [0, 4, 8]
    assert [row["gpus_by_type"] for row in result.plans] == [{"V100-16": 2, "A100-40": 2}, {"A100-40": 2},
                                                              {"A100-40": 4}]
    assert kill.steps_redone == 0 and not kill.plan_changed  # a checkpoint every step; same GPUs
    # SIGSTOP to detection: the timeout counts from the last beat, up to one interval before the
    # SIGSTOP; the supervisor polls every 20 ms (1 s of slack for a loaded machine)
    assert timeout_s - beat_s - 0.05 <= hang.detect_s <= timeout_s + 1.0
    for r in result.reconfigurations:
        parts = (r.detect_s, r.replan_s, r.state_transfer_s, r.restart_s)
        assert all(p >= 0 for p in parts) and r.downtime_s == pytest.approx(sum(parts))
        assert r.migration.get("checkpoint_files", 0) > 0
    assert result.downtime_s == pytest.approx(sum(r.downtime_s for r in result.reconfigurations))
    assert_matches_reference(result, STEPS)


def test_a_fault_lands_at_its_step_even_when_the_supervisor_polls_slowly(tmp_path, monkeypatch):
    """CI (2 cores) once saw `kill_rank` at step 6 of 7 never fire: the ranks ran step 7 and
    finished before the supervisor's next poll. The ranks now wait at a fault's boundary until
    it is injected, so a poll slower than a step still lands it there."""
    import hetplan.orchestration.elastic as elastic

    monkeypatch.setattr(elastic, "POLL_S", 0.5)  # a step of the tiny model takes far less
    inst, _ = bundled()
    result = run_elastic(inst, start_plan(inst), options(tmp_path, inst, [{"at_step": 2, "kill_rank": 1}], steps=3))
    assert [(r.kind, r.at_iteration) for r in result.reconfigurations] == [("failure", 2)]
    assert result.steps_completed == 3
    assert_matches_reference(result, 3)


def test_the_control_file_holds_the_ranks_until_the_hold_moves(tmp_path):
    control = tmp_path / "control"
    assert read_control(control) == (NEVER, NEVER)  # absent: no request
    control.write_text("7\n")  # a stop alone (what a supervisor before holds wrote)
    assert read_control(control) == (7, NEVER) and stop_requested(str(control), 7)
    assert not stop_requested(str(control), 6)
    write_control(control, 9, 4)
    assert read_control(control) == (9, 4) and not (tmp_path / "control.tmp").exists()
    control.write_text("9 x\n")
    assert read_control(control) == (NEVER, NEVER)
    write_control(control, NEVER, 4)
    wait_while_held(str(control), 3, limit_s=60)  # held at 4, not at 3: returns at once
    released: list[bool] = []

    def supervisor() -> None:
        time.sleep(0.2)
        released.append(True)
        write_control(control, NEVER, 8)

    thread = threading.Thread(target=supervisor)
    thread.start()
    wait_while_held(str(control), 4, limit_s=60)
    seen = list(released)  # before join: it must be the release that ended the wait
    thread.join()
    assert seen == [True]


def test_an_appended_event_in_the_watched_file_reconfigures_the_running_job(tmp_path):
    inst, _ = bundled()
    watch = tmp_path / "events.yaml"
    watch.write_text("[]\n")
    steps = 30
    opts = options(tmp_path, inst, [], steps=steps, watch=watch)

    def operator() -> None:  # once 3 steps are done, an operator writes that the V100s are gone
        seg = tmp_path / "run" / "segment_000"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and steps_done(seg, 3) < 3:
            time.sleep(0.02)
        watch.write_text(yaml.safe_dump([{"lose": {"gpu_type": "V100-16", "zone": "z-a", "count": 2}}]))

    thread = threading.Thread(target=operator)
    thread.start()
    result = run_elastic(inst, start_plan(inst), opts)
    thread.join()
    [lose] = result.reconfigurations
    assert lose.kind == "availability" and "lose 2 V100-16@z-a" in lose.cause
    assert lose.at_iteration >= 3 and "V100-16" not in result.plans[-1]["gpus_by_type"]
    assert result.steps_completed == steps
    assert_matches_reference(result, steps)


def test_a_time_scaled_trace_takes_the_v100s_away(tmp_path):
    """A Sailor-format trace (columns <GPU>_<zone>): the V100s go at trace second 2, i.e. 0.5 s
    after the start at --time-scale 4; the ranks stop at the next step and the job goes on."""
    inst, _ = bundled()
    trace = tmp_path / "trace.csv"
    trace.write_text(",Timestamp,V100-16_z-a,A100-40_z-a\n0,1000.0,2,2\n1,1002.0,0,2\n")
    steps = 20
    opts = options(tmp_path, inst, [], steps=steps, time_scale=4.0)
    opts = dataclasses.replace(opts, cluster_events=tuple(event_stream(inst, trace=trace)))
    result = run_elastic(inst, start_plan(inst), opts)
    [lose] = result.reconfigurations
    assert lose.kind == "availability" and lose.cause == "V100-16@z-a -> 0 GPUs"
    assert "V100-16" not in result.plans[-1]["gpus_by_type"] and result.steps_completed == steps
    assert_matches_reference(result, steps)


def test_a_switch_found_for_a_cluster_that_is_gone_again_is_called_off(tmp_path):
    """The trace gives 4 A100s (no V100) and then the starting 2 + 2 back, both at the first poll
    (time scale 1e9). The first change finds a 4-A100 plan while the ranks train; the second
    makes it unrunnable, and the run switched to it all the same (4 A100 ranks on 2 up)."""
    inst, _ = bundled()
    trace = tmp_path / "trace.csv"
    trace.write_text(",Timestamp,A100-40_z-a,V100-16_z-a\n0,1000.0,2,2\n1,1002.0,4,0\n2,1004.0,2,2\n")
    log: list[str] = []
    opts = options(tmp_path, inst, [], steps=6, time_scale=1e9)
    opts = dataclasses.replace(opts, cluster_events=tuple(event_stream(inst, trace=trace)))
    result = run_elastic(inst, None, opts, log=log.append)
    assert any("A100-40@z-a -> 2 GPUs" in line and "is off" in line for line in log), log
    assert all(row["gpus_by_type"].get("A100-40", 0) <= 2 for row in result.plans), result.plans
    assert result.steps_completed == 6
    assert_matches_reference(result, 6)


def test_an_idle_loss_changes_nothing_and_a_finished_run_resumes_to_nothing(tmp_path):
    inst, _ = bundled()
    # node a-1 is down from the start (the instance's event at t=0): its failure takes no GPU of
    # the plan, so the ranks are not stopped; a second run finds the final checkpoint and stops
    events = [{"at_step": 2, "fail_node": "a-1"}]
    result = run_elastic(inst, start_plan(inst), options(tmp_path, inst, events, steps=4))
    assert result.reconfigurations == [] and len(result.absorbed) == 1 and "a-1" in result.absorbed[0]
    again = run_elastic(inst, start_plan(inst), options(tmp_path, inst, [], steps=4))
    assert again.steps_completed == 4 and again.reconfigurations == [] and again.losses == []


def test_a_resumed_run_in_the_same_folder_reports_its_own_losses_only(tmp_path):
    """The second run trains iterations 4-5 in run/segment_000, where the first had left its
    steps.jsonl (iterations 0-3): `losses` held six entries, four of them the first run's."""
    inst, _ = bundled()
    first = run_elastic(inst, start_plan(inst), options(tmp_path, inst, [], steps=4))
    again = run_elastic(inst, start_plan(inst), options(tmp_path, inst, [], steps=6))
    assert len(first.losses) == 4 and len(again.losses) == 2
    assert (first.resumed_from, again.resumed_from) == (0, 4)  # the CLI said "trained 6 steps" for 2
    ref = reference_train(model_config(build_spec(inst, again.final_plan), TINY), global_batch_size=BATCH, steps=6,
                          optimizer="adam", lr=1e-2)
    assert again.losses == pytest.approx(ref.losses[4:], abs=1e-9)


def test_a_resumed_run_starts_on_the_cluster_its_earlier_events_left(tmp_path):
    """The first run loses the V100s at step 4 and stops at 5; the same command again with 8
    steps resumed at 5 on the given plan, took the old loss (fired at its first poll) for one of
    idle GPUs and trained on the lost V100s. Also: a loss of more GPUs than are up, and an event
    past the last step, are said, not dropped silently."""
    inst, _ = bundled()
    events = [{"at_step": 4, "lose": {"gpu_type": "V100-16", "zone": "z-a", "count": 4}},
              {"at_step": 9, "kill_rank": 0}]
    logs: list[list[str]] = [[], []]
    first = run_elastic(inst, start_plan(inst), options(tmp_path, inst, events, steps=5), log=logs[0].append)
    again = run_elastic(inst, start_plan(inst), options(tmp_path, inst, events, steps=8), log=logs[1].append)
    assert "V100-16" not in first.plans[-1]["gpus_by_type"] and again.resumed_from == 5
    assert all("V100-16" not in row["gpus_by_type"] for row in again.plans), again.plans
    assert again.reconfigurations == [] and again.absorbed == [], again.absorbed
    assert "'lose 4 V100-16@z-a': 2 were up, all of them lost" in logs[0]
    assert "resuming at iteration 5 on the cluster the events before it left: lose 4 V100-16@z-a" in logs[1]
    assert all(any("'kill rank 0' at step 9 never fires" in line for line in log) for log in logs)
    ref = reference_train(model_config(build_spec(inst, again.final_plan), TINY), global_batch_size=BATCH, steps=8,
                          optimizer="adam", lr=1e-2)
    assert again.losses == pytest.approx(ref.losses[5:], abs=1e-9)


@pytest.mark.parametrize("event, field, needle", [
    ({"at_step": 2, "kill_rank": True}, "kill_rank", "expected an integer, got true"),  # killed rank 1
    ({"at_step": True, "hang_rank": 0}, "at_step", "expected an integer, got true"),
    ({"at_s": True, "fail_node": "a-0"}, "at_s", "expected seconds, got true"),
    ({"at_s": 1e300, "fail_node": "a-0"}, "at_s", "less than or equal to 1000000000"),
    ({"at_step": 2, "gain": {"gpu_type": "A100-40", "zone": "z-a", "count": True}}, "gain.count", "got true"),
])
def test_events_refuse_true_and_false_as_numbers(event, field, needle):
    with pytest.raises(InstanceError, match=needle) as err:
        parse_events([event], "ev")
    assert err.value.field == "ev[0]" and str(err.value).startswith(f"ev[0]: {field}:")


@pytest.mark.parametrize("event, field, needle", [
    ({"at_step": 2, "kill_rank": 6}, "kill_rank", "rank 6 does not exist: the cluster has 6 GPUs"),
    ({"at_step": 2, "hang_rank": 99}, "hang_rank", "rank 99 does not exist"),
    ({"at_step": 2, "lose": {"gpu_type": "H100", "zone": "z-a", "count": 1}}, "lose", "H100 in zone z-a is not"),
    ({"at_s": 2, "fail_node": "b-7"}, "fail_node", "unknown node 'b-7'"),
])
def test_events_the_cluster_cannot_have_are_refused_before_the_run(tmp_path, event, field, needle):
    """Each was found only when it fired: a rank beyond the world was logged as ignored, an
    unknown GPU type or node ended the run there."""
    inst, _ = bundled()
    with pytest.raises(InstanceError, match=needle) as err:
        run_elastic(inst, start_plan(inst), options(tmp_path, inst, [{"at_step": 1, "kill_rank": 5}, event]))
    assert err.value.field == f"events[1].{field}"
    assert not (tmp_path / "run").exists()


def cut_short(step: Path) -> Path:
    """Truncate one shard of a checkpoint to 100 bytes (a crash or a full disk mid-copy)."""
    shard = sorted(step.glob("unit_*/tp*.pt"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    return shard


def test_a_damaged_newest_checkpoint_resumes_from_the_step_before(tmp_path):
    """Every rank failed on loading the cut shard (3 failures in a row, exit 3) while step 2,
    which `prune` keeps, was intact; the run resumes there and writes step 3 again."""
    inst, _ = bundled()
    run_elastic(inst, start_plan(inst), options(tmp_path, inst, [], steps=3))
    ckpt = tmp_path / "ckpt"
    shard = cut_short(ckpt / "step_00000003")
    log: list[str] = []
    again = run_elastic(inst, start_plan(inst), options(tmp_path, inst, [], steps=5), log=log.append)
    assert again.resumed_from == 2 and again.steps_completed == 5 and again.reconfigurations == []
    assert any(f"{shard.relative_to(ckpt / 'step_00000003')} has 100 bytes" in line and "set aside" in line
               for line in log), log
    assert (ckpt / "damaged_step_00000003").is_dir()
    ref = reference_train(model_config(build_spec(inst, again.final_plan), TINY), global_batch_size=BATCH, steps=5,
                          optimizer="adam", lr=1e-2)
    assert again.losses == pytest.approx(ref.losses[2:], abs=1e-9)


def test_resume_says_which_checkpoint_it_passes_over(tmp_path):
    """`python -m hetplan.runtime.execute --resume` (compiled launches) reads the newest intact step."""
    from hetplan.runtime import checkpoint

    inst, _ = bundled()
    run_elastic(inst, start_plan(inst), options(tmp_path, inst, [], steps=3))
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_00000003" / "unit_0001").rename(ckpt / "gone")
    assert checkpoint.latest(ckpt).name == "step_00000002"
    assert [why for _, why in checkpoint.damaged(ckpt)] == ["unit_0001/tp0of1.pt is missing"]
    spec = build_spec(inst, start_plan(inst)).save(tmp_path / "spec.json")
    proc = subprocess.run(["python3", "-m", "hetplan.runtime.execute", "--check-only", "--spec", str(spec),
                           "--resume", str(ckpt), "--steps", "5", "--hidden", "16", "--heads", "2", "--ffn", "32",
                           "--vocab", "32", "--seq-len", "8", "--dtype", "float64"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"hetplan: warning: {ckpt / 'step_00000003'} is damaged (unit_0001/tp0of1.pt "
                                        "is missing); resuming from step_00000002"]


def test_losing_every_gpu_stops_the_run_with_a_reason(tmp_path):
    """The re-planner answers "no GPU is up" with no plan; the supervisor passed that None on and
    ended in an AttributeError (exit 70). It is a run that cannot go on: LaunchError (exit 3)."""
    from hetplan.runtime.local import LaunchError

    inst, _ = bundled()
    events = [{"at_step": 1, "lose": {"gpu_type": "V100-16", "zone": "z-a", "count": 2}},
              {"at_step": 1, "lose": {"gpu_type": "A100-40", "zone": "z-a", "count": 2}}]
    with pytest.raises(LaunchError, match=r"cannot continue at iteration 1: no GPU is up"):
        run_elastic(inst, start_plan(inst), options(tmp_path, inst, events, steps=3))
    assert LaunchError.exit_code == 3


def test_events_file_errors_name_the_entry(tmp_path):
    bad = tmp_path / "ev.yaml"
    bad.write_text("- {at_step: 4, lose: {gpu_type: V100-16, zone: z, count: 4}, kill_rank: 2}\n")
    with pytest.raises(InstanceError, match=r"ev.yaml\[0\].*exactly one of"):
        read_events(bad)
    bad.write_text("- {at_step: 0, kill_rank: 1}\n")
    with pytest.raises(InstanceError, match="at_step"):
        read_events(bad)
    bad.write_text("{at_step: 1}\n")
    with pytest.raises(InstanceError, match="list of events"):
        read_events(bad)


def test_cli_run_elastic_json(tmp_path):
    _, events = bundled()
    argv = ["hetplan", "run", "elastic_small", "elastic_small", "--local", "--elastic", "--steps", "7",
            "--checkpoint-dir", "ckpt", "--events", str(events), "--json", "--replan-time-limit", "0.3", *TINY_FLAGS]
    # relative folders: the rendezvous file's URL must still name a path (file://ckpt/... a host)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["steps_completed"] == 7 and out["samples_trained"] == 7 * BATCH and out["downtime_s"] > 0
    assert [(r["kind"], r["at_iteration"]) for r in out["reconfigurations"]] == [("availability", 4),
                                                                                ("failure", 6)]
    assert all(set(r) >= {"cause", "detect_s", "replan_s", "state_transfer_s", "restart_s", "downtime_s"}
               for r in out["reconfigurations"])
    assert "[elastic]" in proc.stderr and (tmp_path / "ckpt").is_dir()


@pytest.mark.parametrize("args, needle", [
    (["--local"], "--elastic"),
    (["--local", "--elastic"], "--checkpoint-dir"),
    (["--local", "--elastic", "--checkpoint-dir", "c", "--events", "missing.yaml"], "missing.yaml"),
])
def test_cli_run_refuses_what_it_cannot_do(tmp_path, args, needle):
    proc = subprocess.run(["hetplan", "run", "elastic_small", *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ---- cluster launches: torchrun restarts the job, the executor resumes from the checkpoint ----
def test_compiled_launches_restart_and_resume(tmp_path):
    from torch.distributed.run import get_args_parser

    from hetplan.runtime.compile import CompileOptions, compile_plan
    from hetplan.runtime.targets import Resilience

    inst, _ = bundled()
    opts = CompileOptions(resilience=Resilience("/shared/ckpt", checkpoint_every=2, max_restarts=5))
    lines = compile_plan(inst, start_plan(inst), "torchrun", opts).files["torchrun/commands.txt"].splitlines()[1:]
    for line in lines:
        check, line = line.split(" && ")
        assert check == ("python3 -m hetplan.runtime.execute --check-only --spec ../launch_spec.json "
                         "--resume /shared/ckpt")
        assert line.startswith("HETPLAN_NODE_ID=") and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun " in line
        argv = line.split(" torchrun ", 1)[1].split()
        args = get_args_parser().parse_args(argv)
        assert args.max_restarts == 5
        assert args.training_script_args[-4:] == ["--resume", "/shared/ckpt", "--checkpoint-every", "2"]
    sbatch = compile_plan(inst, start_plan(inst), "slurm", opts).files["hetplan.sbatch"]
    assert "--max-restarts=5 " in sbatch and "--resume /shared/ckpt --checkpoint-every 2" in sbatch
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in sbatch
    check = "python3 -m hetplan.runtime.execute --check-only --spec \"$HETPLAN_SPEC\" --resume /shared/ckpt || exit 1"
    assert sbatch.index(check) < sbatch.index("exec torchrun")  # each task checks the checkpoint first
    job = list(yaml.safe_load_all(compile_plan(inst, start_plan(inst), "kubernetes", opts).files["pytorchjob.yaml"]))[-1]
    for pod in job["spec"]["pytorchReplicaSpecs"].values():
        cmd = pod["template"]["spec"]["containers"][0]["command"][-1]
        assert cmd.startswith("python3 -m hetplan.runtime.execute --check-only --spec /etc/hetplan/launch_spec.json "
                              "--resume /shared/ckpt && ") and " torchrun " in cmd
    plain = compile_plan(inst, start_plan(inst), "slurm").files["hetplan.sbatch"]
    assert "--max-restarts" not in plain and "--resume" not in plain and "TORCH_DISABLE" not in plain
    assert "--check-only" not in plain
    with pytest.raises(Exception, match="torchrun, slurm and kubernetes"):
        compile_plan(inst, start_plan(inst), "megatron", opts)


def test_a_resilient_launch_checks_its_checkpoint_once_before_torchrun(tmp_path):
    """torchrun restarts workers that exit 1 like any that fail: a checkpoint of another model made
    every rank refuse it max_restarts + 1 times. The node script checks it first (the executor's
    --check-only) and stops with one line; a folder holding nothing starts torchrun (a stand-in
    on PATH that records its arguments), the folder's space kept in one word."""
    import os
    import stat
    import sys

    from hetplan.runtime.compile import CompileOptions, write_launch
    from hetplan.runtime.targets import Resilience

    inst, _ = bundled()
    ckpt = tmp_path / "check points"
    opts = CompileOptions(resilience=Resilience(str(ckpt), max_restarts=2))
    written = write_launch(inst, start_plan(inst), "torchrun", tmp_path / "out", opts)
    script = next(p for p in written if p.name.startswith("node0_"))
    bin_dir, args_file = tmp_path / "bin", tmp_path / "torchrun.args"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    fake = bin_dir / "torchrun"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{args_file}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def launch() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), *TINY_FLAGS, "--steps", "2"], env=env, capture_output=True,
                              text=True, timeout=120)

    step = ckpt / "step_00000001"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"format": 1, "iteration": 1, "model": {"hidden_size": 24},
                                                "optimizer": "adam", "tp_of_unit": {}}))
    refused = launch()
    assert refused.returncode == 1 and not args_file.exists(), refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"hetplan: error: --resume: {step} holds a checkpoint of another model: hidden_size 24 (this run: 16); "
        f"give the same model options or another folder"]
    (step / "meta.json").unlink()
    step.rmdir()
    started = launch()
    assert started.returncode == 0, started.stdout + started.stderr
    words = args_file.read_text().splitlines()
    assert words[words.index("--resume") + 1] == str(ckpt) and words[-2:] == ["--steps", "2"]


def test_torchrun_restarts_a_killed_worker_and_the_run_resumes(tmp_path):
    """A real torchrun (--max-restarts 2) running the executor with --resume: one rank is killed
    mid-run, torchrun restarts every worker, they resume from the newest checkpoint and finish
    with the reference parameters."""
    import os
    import signal
    import sys

    from hetplan.runtime.targets import RESTART_ENV

    inst, _ = bundled()
    spec = build_spec(inst, start_plan(inst))
    spec_path = spec.save(tmp_path / "launch_spec.json")
    progress, dump, ckpt = tmp_path / "progress", tmp_path / "params", tmp_path / "ckpt"
    progress.mkdir()
    steps = 8
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={spec.world_size}", "--max-restarts=2", "-m", "hetplan.runtime.execute",
            "--spec", str(spec_path), "--single-host", "--resume", str(ckpt), "--steps", str(steps),
            "--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--dump-params", str(dump),
            "--progress-dir", str(progress), *TINY_FLAGS]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **RESTART_ENV}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while steps_done(progress, spec.world_size) < 3:  # then kill rank 2 (stage 1, on a-0) once
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else ""
        time.sleep(0.02)
    os.kill(json.loads((progress / "rank2.ready").read_text())["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]
    assert "failed (exitcode: -9) local_rank: 2" in out  # torchrun saw the kill, then restarted the group
    ref = reference_train(model_config(spec, TINY), global_batch_size=BATCH, steps=steps, optimizer="adam", lr=1e-2)
    params = assemble_dump(dump)
    for key, full in ref.params.items():
        for holder, value in params[key].items():
            assert (value - full).abs().max().item() < 1e-5, (key, holder)
