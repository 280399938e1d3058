"""Elastic recovery with the real executor (CPU, gloo): checkpoint layer-wise, kill a worker,
re-plan on the reduced cluster, restart under the new plan from the checkpoint, continue.

The run is compared with an uninterrupted single-process reference (float64, Adam): after the
restart the losses are the reference's losses of the same iterations (training continues, no
reset) and the parameters equal the reference's (AutoHet sec. IV: layer-wise checkpoints, TP
merge when the TP degree changes)."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from hetplan.cluster_state import ClusterState, NodeFailure
from hetplan.instance import instance_from_dict
from hetplan.plan import plan_from_dict, validate_plan
from hetplan.orchestration.replan import ReplanOptions, replan
from hetplan.runtime.execute import model_config
from hetplan.runtime.local import LaunchError, launch_local
from hetplan.runtime.migrate import checkpoint_layout, migration_plan
from hetplan.runtime.reference import assemble_dump, reference_train

TINY = dict(hidden_size=16, num_heads=2, ffn_hidden_size=32, vocab_size=32, seq_len=8)
RUN = dict(model_overrides=TINY, dtype="float64", optimizer="adam", lr=1e-2, quiet=True)


def instance():
    return instance_from_dict({
        "name": "elastic",
        "cluster": {"node_groups": [
            {"name": "a", "gpu_type": "A100-40", "gpus_per_node": 2, "count": 2, "zone": "z-a",
             "price_per_gpu_hour_usd": 3.0},
            {"name": "v", "gpu_type": "V100-16", "gpus_per_node": 2, "count": 1, "zone": "z-a",
             "price_per_gpu_hour_usd": 1.0}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 2}},
                     "global_batch_size": 8, "precision": "fp16"}})


def first_plan():
    """Stage [0,2): two TP 1 replicas on a-0 (shares 3, 1); stage [2,4): one TP 2 replica on a-1."""
    rep = lambda node, gpus, share: {"gpu_type": "A100-40", "tp": len(gpus), "node": node, "gpus": gpus,  # noqa: E731
                                     "microbatch_share": share}
    return plan_from_dict({"name": "before", "num_microbatches": 2, "stages": [
        {"layer_start": 0, "layer_end": 2, "replicas": [rep("a-0", [0], 3), rep("a-0", [1], 1)]},
        {"layer_start": 2, "layer_end": 4, "replicas": [rep("a-1", [0, 1], 4)]}]})


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def worker_pids(world: int, timeout_s: float = 60.0) -> list[int]:
    """The rank processes launch_local started from this process (children of its forkserver),
    in start order, i.e. in rank order."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tree = _children()
        grandchildren = sorted(p for child in tree.get(os.getpid(), []) for p in tree.get(child, []))
        if len(grandchildren) >= world:
            return grandchildren[-world:]
        time.sleep(0.05)
    raise AssertionError("the rank processes did not start")


def test_kill_a_worker_replan_and_resume_from_the_layerwise_checkpoint(tmp_path):
    inst = instance()
    before = validate_plan(inst, first_plan())
    ckpt = tmp_path / "ckpt"
    # 1. train 2 iterations under the first plan, layer-wise checkpoint at the end
    first = launch_local(inst, before, steps=2, out_dir=tmp_path / "a", save_checkpoint=ckpt, **RUN)
    written = {str(p.relative_to(ckpt)) for p in ckpt.glob("unit_*/*.pt")}
    assert written == {f.path for f in checkpoint_layout(inst, before)}
    # 2. resume it for a long run and kill the last rank's process (node a-1) mid-training
    box: dict = {}

    def run() -> None:
        try:
            launch_local(inst, before, steps=10_000, out_dir=tmp_path / "b", load_checkpoint=ckpt,
                         timeout_s=120, **RUN)
        except LaunchError as exc:
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    pids = worker_pids(before.num_gpus)
    time.sleep(1.0)
    os.kill(pids[-1], signal.SIGKILL)  # spec rank 3: stage 1, TP rank 1, on a-1
    thread.join(timeout=120)
    assert not thread.is_alive() and "error" in box, "killing a rank must fail the run"
    # 3. re-plan on the cluster without a-1, through the public replan (TP degrees the tiny model splits)
    state = ClusterState.initial(inst).apply(NodeFailure(time_s=1, node="a-1"))
    res = replan(inst, before, state, ReplanOptions(planner_time_limit_s=0, tp_choices=(1, 2)))
    after = res.plan
    state.check_plan(after)
    assert "a-1" not in {r.node for s in after.stages for r in s.replicas}
    # 4. the migration plan: stage 1's units were only on a-1, so they come from remote storage
    # files that the first run really wrote; a-0's units stay on their GPUs
    mp = migration_plan(inst, before, after, state)
    remote_files = {f.file for r in mp.ranks for f in r.fetches if f.source == "remote"}
    assert remote_files and remote_files <= written
    assert mp.bytes_by_source["remote"] > 0 and mp.recovery_s <= mp.remote_only_s
    # 5. restart the survivors under the new plan from the checkpoint; 2 more iterations
    resumed = launch_local(inst, after, steps=2, out_dir=tmp_path / "c", load_checkpoint=ckpt, dump_params=True, **RUN)
    assert [s["iteration"] for s in resumed.log["steps"]] == [2, 3]
    cfg = model_config(resumed.spec, TINY)
    ref = reference_train(cfg, global_batch_size=8, steps=4, optimizer="adam", lr=1e-2)
    assert first.losses == pytest.approx(ref.losses[:2], abs=1e-9)
    assert resumed.losses == pytest.approx(ref.losses[2:], abs=1e-9)  # continues, no reset
    assert resumed.losses[0] < ref.losses[0]
    params = assemble_dump(resumed.dump_dir)
    assert set(params) == set(ref.params)
    for key, full in ref.params.items():
        for holder, value in params[key].items():
            err = (value - full).abs().max().item()
            assert err < 1e-5, f"{key} on stage/replica {holder}: max |resumed - reference| = {err:.3g}"


def test_death_message_of_a_rank_killed_while_writing_its_progress(tmp_path):
    """A rank killed between truncating and writing its progress file leaves it empty: the
    launcher's message then counts 0 steps (it raised ValueError, and the run's LaunchError was
    lost: seen once in CI on the test above)."""
    from hetplan.runtime.compile import compile_plan
    from hetplan.runtime.execute import RunOptions, progress_path
    from hetplan.runtime.local import _death_message

    inst = instance()
    spec = compile_plan(inst, validate_plan(inst, first_plan())).spec
    progress_path(tmp_path, 3).write_text("")
    msg = _death_message(spec, RunOptions(steps=5), 3, -signal.SIGKILL, tmp_path)
    assert "was killed by signal SIGKILL" in msg and "during step 1 of 5" in msg
