"""The executor really trains heterogeneous plans: after k steps every replica's parameters equal
those of a single-process, full-batch reference run on the same data (float64, 1e-5).

Plans cover: 2 stages with uneven DP (2 replicas -> 1) and uneven shares; a TP=2 stage; a stage
mixing a TP=2 and a TP=1 replica (gather-mode gradient sync); two TP=2 replicas (sharded sync with
TP); tied embeddings across stages; three stages with 1 -> 2 -> 1 replicas. Each under GPipe (SGD,
whose update is proportional to the gradient, so a mis-weighted share shows) and 1F1B (Adam).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from hetplan.errors import PlanError
from hetplan.instance import instance_from_dict
from hetplan.plan import plan_from_dict
from hetplan.runtime.execute import model_config
from hetplan.runtime.local import LaunchError, launch_local
from hetplan.runtime.model import init_full
from hetplan.runtime.reference import assemble_dump, reference_train
from hetplan.runtime.spec import load_spec

TINY = dict(hidden_size=16, num_heads=2, ffn_hidden_size=32, vocab_size=32, seq_len=8)
STEPS = 3


def tiny_instance(num_layers: int, global_batch: int, tied: bool = True):
    return instance_from_dict({
        "name": "tiny_het",
        "cluster": {"node_groups": [
            {"name": "a100", "gpu_type": "A100-40", "gpus_per_node": 4, "count": 2, "zone": "z-a",
             "price_per_gpu_hour_usd": 3.67},
            {"name": "v100", "gpu_type": "V100-16", "gpus_per_node": 4, "count": 1, "zone": "z-a",
             "price_per_gpu_hour_usd": 2.48}]},
        "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": num_layers, "tied_embeddings": tied}},
                     "global_batch_size": global_batch, "precision": "fp16"}})


def rep(gpu: str = "A100-40", tp: int = 1, share: int = 1) -> dict:
    return {"gpu_type": gpu, "tp": tp, "zone": "z-a", "microbatch_share": share}


def tiny_plan(stages, num_microbatches: int, name: str = "tiny"):
    return plan_from_dict({"name": name, "num_microbatches": num_microbatches, "stages": [
        {"layer_start": a, "layer_end": b, "replicas": reps} for a, b, reps in stages]})


CASES = {
    # 2 stages: 2 replicas (shares 3, 1) -> 1 TP=2 replica; tied embeddings synced across stages.
    "uneven_dp_then_tp2": (tiny_instance(2, 8), tiny_plan([(0, 2, [rep(share=3), rep(share=1)]),
                                                          (2, 4, [rep(tp=2, share=4)])], 2)),
    # the bundled plan's shape: stage 1 mixes a V100 TP=2 replica and an A100 TP=1 replica.
    "mixed_tp_stage": (tiny_instance(2, 8, tied=False),
                       tiny_plan([(0, 2, [rep(share=2), rep(share=2)]),
                                  (2, 4, [rep("V100-16", tp=2, share=1), rep(share=3)])], 2)),
    # two TP=2 replicas with uneven shares: per-TP-rank (sharded) gradient sync.
    "tp2_replicas": (tiny_instance(2, 8), tiny_plan([(0, 2, [rep(tp=2, share=3), rep(tp=2, share=1)]),
                                                    (2, 4, [rep(share=4)])], 2)),
    # three stages, 1 -> 2 -> 1 replicas, 3 microbatches.
    "three_stages": (tiny_instance(3, 12), tiny_plan([(0, 2, [rep(share=4)]), (2, 4, [rep(share=1), rep(share=3)]),
                                                     (4, 5, [rep(share=4)])], 3)),
}
OPTIMIZER = {"GPipe": ("sgd", 1.0), "1F1B": ("adam", 1e-2)}


def check_against_reference(result, optimizer: str, lr: float, steps: int, start_iteration: int = 0,
                            ref_steps: int | None = None):
    cfg = model_config(result.spec, TINY)
    ref = reference_train(cfg, global_batch_size=result.spec.batch.global_batch_size, steps=ref_steps or steps,
                          optimizer=optimizer, lr=lr)
    params = assemble_dump(result.dump_dir)
    assert set(params) == set(ref.params)
    moved = 0.0
    for key, full in ref.params.items():
        moved = max(moved, (full - init_full(key, tuple(full.shape), 0)).abs().max().item())
        holders = params[key]
        assert holders, key
        for holder, value in holders.items():
            err = (value - full).abs().max().item()
            assert err < 1e-5, f"{key} on stage/replica {holder}: max |distributed - reference| = {err:.3g}"
    assert moved > 1e-3  # training moved the weights, so a wrong gradient could not hide
    return ref


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_single_process_reference(case, schedule, tmp_path):
    instance, plan = CASES[case]
    optimizer, lr = OPTIMIZER[schedule]
    result = launch_local(instance, plan, steps=STEPS, model_overrides=TINY, schedule=schedule, dtype="float64",
                          optimizer=optimizer, lr=lr, dump_params=True, out_dir=tmp_path, quiet=True)
    ref = check_against_reference(result, optimizer, lr, STEPS)
    assert result.losses == pytest.approx(ref.losses, abs=1e-9)
    assert len(result.times_s) == STEPS and all(t > 0 for t in result.times_s)
    assert len(result.peak_mem_bytes) == result.spec.world_size and min(result.peak_mem_bytes) > 0
    log = json.loads((tmp_path / "log.json").read_text())
    assert log["schedule"] == schedule and log["backend"] == "gloo"


def test_torchrun_entry_point_trains_the_same(tmp_path):
    """The real entry point: torchrun --standalone running python -m hetplan.runtime.execute."""
    instance, plan = CASES["mixed_tp_stage"]
    result = launch_local(instance, plan, steps=2, model_overrides=TINY, dtype="float64", optimizer="sgd", lr=1.0,
                          dump_params=True, out_dir=tmp_path, method="torchrun", quiet=True)
    ref = check_against_reference(result, "sgd", 1.0, 2)
    assert result.losses == pytest.approx(ref.losses, abs=1e-9)


def test_layerwise_checkpoint_resumes_under_another_plan(tmp_path):
    """Save after 2 steps with one plan; load into a plan with other stage boundaries and TP
    degrees (units 0-1: TP 1 -> 2, unit 2 moves stage at TP 2, unit 3: TP 2 -> two TP 1 replicas;
    the tied embedding copy on the last stage is restored from unit 0), train 2 more: the result
    equals 4 uninterrupted reference steps (AutoHet sec. IV, elastic recovery)."""
    instance, first = CASES["uneven_dp_then_tp2"]
    second = tiny_plan([(0, 3, [rep(tp=2, share=4)]), (3, 4, [rep(share=1), rep("V100-16", share=3)])], 2)
    ckpt = tmp_path / "ckpt"
    launch_local(instance, first, steps=2, model_overrides=TINY, dtype="float64", optimizer="adam", lr=1e-2,
                 out_dir=tmp_path / "a", save_checkpoint=ckpt, quiet=True)
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["iteration"] == 2 and meta["tp_of_unit"] == {"0": 1, "1": 1, "2": 2, "3": 2}
    result = launch_local(instance, second, steps=2, model_overrides=TINY, dtype="float64", optimizer="adam",
                          lr=1e-2, out_dir=tmp_path / "b", load_checkpoint=ckpt, dump_params=True, quiet=True)
    assert [s["iteration"] for s in result.log["steps"]] == [2, 3]
    ref = check_against_reference(result, "adam", 1e-2, 2, ref_steps=4)
    assert result.losses == pytest.approx(ref.losses[2:], abs=1e-9)


def test_bad_model_override_is_refused_before_launch(tmp_path):
    instance, plan = CASES["uneven_dp_then_tp2"]
    with pytest.raises(PlanError, match="num_heads 3 is not divisible by tensor-parallel degree 2"):
        launch_local(instance, plan, steps=1, model_overrides={**TINY, "num_heads": 3, "hidden_size": 18},
                     out_dir=tmp_path)
    with pytest.raises(PlanError, match="unknown model overrides"):
        launch_local(instance, plan, steps=1, model_overrides={"num_layers": 7}, out_dir=tmp_path)


def test_a_failing_rank_surfaces_as_launch_error(tmp_path):
    instance, plan = CASES["uneven_dp_then_tp2"]
    with pytest.raises(LaunchError, match="no checkpoint"):
        launch_local(instance, plan, steps=1, model_overrides=TINY, out_dir=tmp_path,
                     load_checkpoint=tmp_path / "missing", quiet=True, timeout_s=120)


def test_single_rank_plan_equals_reference(tmp_path):
    """World size 1: no communication at all, only gradient accumulation over microbatches."""
    instance = tiny_instance(2, 4)
    plan = tiny_plan([(0, 4, [rep(share=2)])], 2)
    result = launch_local(instance, plan, steps=2, model_overrides=TINY, dtype="float64", optimizer="sgd", lr=1.0,
                          dump_params=True, out_dir=tmp_path, quiet=True)
    cfg = model_config(result.spec, TINY)
    ref = reference_train(cfg, global_batch_size=4, steps=2, optimizer="sgd", lr=1.0)
    params = assemble_dump(result.dump_dir)
    # accumulation over 2 microbatches vs one full batch differs only by rounding
    for key, full in ref.params.items():
        assert torch.allclose(params[key][(0, 0)], full, atol=1e-12, rtol=0)


@pytest.mark.slow
def test_generated_torchrun_scripts_run_as_two_nodes(tmp_path):
    """The per-node scripts of `compile --target torchrun` (c10d rendezvous), both run on this host
    as two 'nodes' with 3 and 2 processes: torchrun numbers nodes in arrival order, the executor
    maps processes to spec ranks by HETPLAN_NODE_ID, and training matches the reference."""
    import os
    import socket
    import subprocess

    from hetplan.runtime.compile import CompileOptions, write_launch

    instance, plan = CASES["mixed_tp_stage"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_launch(instance, plan, "torchrun", tmp_path, CompileOptions(rendezvous="c10d", master_port=port,
                                                                      hosts={"a100-0": "127.0.0.1"}))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    flags = ["--steps", "2", "--dtype", "float64", "--optimizer", "sgd", "--lr", "1.0", "--hidden", "16", "--heads", "2",
             "--ffn", "32", "--vocab", "32", "--seq-len", "8", "--untied", "--dump-params", str(tmp_path / "params"),
             "--log-json", str(tmp_path / "log.json")]
    scripts = sorted((tmp_path / "torchrun").glob("node*.sh"), reverse=True)  # node 1 arrives first
    procs = [subprocess.Popen(["bash", str(s), *flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for s in scripts]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[-1][-2000:] + outputs[0][-2000:]

    run = SimpleNamespace(spec=load_spec(tmp_path / "launch_spec.json"), dump_dir=tmp_path / "params")
    ref = check_against_reference(run, "sgd", 1.0, 2)
    log = json.loads((tmp_path / "log.json").read_text())
    assert [s["loss"] for s in log["steps"]] == pytest.approx(ref.losses, abs=1e-9)
    assert sorted(log["process_rank_of_spec_rank"]) == list(range(5))


@pytest.mark.parametrize("method", ["processes", "torchrun"])
def test_a_reused_folder_keeps_no_rank_file_of_an_earlier_run(method, tmp_path):
    """An earlier run of more ranks left rank 5..7's error, start and progress files: a 3-rank run in
    the same folder removes them (helper-11's F7: they read as this run's), and keeps other files."""
    instance, plan = CASES["uneven_dp_then_tp2"]
    stale = [tmp_path / name for name in ("rank5.err", "rank6.pid", "rank7.steps", "rank5.hb", "rank6.ready")]
    for path in stale + [tmp_path / "rank5.notes"]:
        path.write_text("old")
    launch_local(instance, plan, steps=1, model_overrides=TINY, dtype="float64", out_dir=tmp_path, method=method,
                 quiet=True)
    assert not any(p.exists() for p in stale) and (tmp_path / "rank5.notes").exists()
    assert (tmp_path / "rank0.steps").read_text().strip() == "1"
