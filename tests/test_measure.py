"""`hetplan measure`: per-rank step records from the executor, reduced and compared with the simulator.

Through the installed executable: a 2-stage plan and a TP=2 plan (tiny model, 3 steps, 1 warm-up)
give one JSON object with measured, simulated and relative_error; every rank's parts account for
its step time. In process: the accounted peak memory of a 1-rank SGD run equals a hand count.
No wall-clock figure is asserted, only relations between figures of the same run.
"""
from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch
import yaml

from hetplan.plan import plan_from_dict
from hetplan.instance import instance_from_dict
from hetplan.runtime.measure import measure_plan
from hetplan.runtime.model import ModelConfig, StageModule
from test_cli_contract import error_lines, executable

TINY = dict(hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=64, seq_len=16)
TINY_FLAGS = ["--hidden", "32", "--heads", "2", "--ffn", "64", "--vocab", "64", "--seq-len", "16"]
INSTANCE = {"name": "tiny_measure", "cluster": {"node_groups": [
    {"name": "a100", "gpu_type": "A100-40", "gpus_per_node": 4, "count": 1, "zone": "z-a", "price_per_gpu_hour_usd": 3.67}]},
    "workload": {"model": {"preset": "OPT-350M", "overrides": {"num_layers": 2}}, "global_batch_size": 8,
                 "precision": "fp32", "optimizer": "sgd"}}
REPLICA = {"gpu_type": "A100-40", "zone": "z-a", "microbatch_share": 4}
PLANS = {
    "two_stages": {"name": "two_stages", "num_microbatches": 2, "stages": [
        {"layer_start": 0, "layer_end": 2, "replicas": [REPLICA]},
        {"layer_start": 2, "layer_end": 4, "replicas": [REPLICA]}]},
    "tp2": {"name": "tp2", "num_microbatches": 2, "stages": [
        {"layer_start": 0, "layer_end": 4, "replicas": [{**REPLICA, "tp": 2}]}]},
}
TIME_PARTS = ("forward_s", "backward_s", "p2p_wait_s", "sync_s", "update_s")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("measure")
    (d / "inst.yaml").write_text(yaml.safe_dump(INSTANCE))
    for name, plan in PLANS.items():
        (d / f"{name}.json").write_text(json.dumps(plan))
    return d


def _measure(files, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([executable(), "measure", str(files / "inst.yaml"), *args], capture_output=True,
                          text=True, cwd=files, timeout=300)


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_measure_json_compares_every_part(files, plan):
    out = files / f"run-{plan}"
    proc = _measure(files, str(files / f"{plan}.json"), "--local", "--steps", "3", "--warmup", "1", "--json",
                    "--out", str(out), *TINY_FLAGS)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one object: anything else on stdout fails to parse
    measured, simulated, errors = doc["measured"], doc["simulated"], doc["relative_error"]
    stages = len(PLANS[plan]["stages"])
    expected = {"iteration_time_s", "pipeline_s", "sync_s", "update_s", "peak_memory_bytes",
                *(f"stage{s}_{d}_s" for s in range(stages) for d in ("fwd", "bwd"))}
    assert set(measured) == set(simulated) == set(errors) == expected
    for key, value in measured.items():
        assert math.isfinite(value) and value > 0, (key, value)
        assert errors[key] == pytest.approx((simulated[key] - value) / value, rel=1e-12)
    assert measured["pipeline_s"] < measured["iteration_time_s"]
    _check_rank_records(json.loads((out / "log.json").read_text()), warmup=1)


def _check_rank_records(log: dict, warmup: int) -> None:
    """Every rank's timed parts are disjoint pieces of its step: their sum is at most the step
    time and, after the warm-up, most of it (what is left: data, zero_grad, bookkeeping)."""
    assert len(log["steps"]) == 3
    for row in log["steps"]:
        assert [rec["rank"] for rec in row["ranks"]] == list(range(log["world_size"]))
        for rec in row["ranks"]:
            parts_s = sum(rec[k] for k in TIME_PARTS)
            assert parts_s + rec["data_s"] <= rec["iteration_time_s"] + 1e-6, rec
            if row["step"] > warmup:
                assert parts_s >= 0.5 * rec["iteration_time_s"], rec
            assert rec["peak_memory_bytes"] == rec["accounted_peak_bytes"] > 0  # CPU: the accounted peak
            assert rec["accounted_peak_bytes"] == (rec["params_bytes"] + rec["grads_bytes"] + rec["optimizer_bytes"]
                                                   + rec["activations_bytes"])


def test_measure_needs_local(files):
    proc = _measure(files, str(files / "tp2.json"), "--json")
    lines = error_lines(proc.stderr)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(lines) == 1 and "--local" in lines[0] and "Traceback" not in proc.stderr


def _param_count(h: int, f: int, v: int, s: int, layers: int) -> int:
    """GPT of runtime/model.py, tied head: embedding (word + position), per block two LayerNorms,
    q/k/v/out projections with biases, fc1/fc2 with biases; final LayerNorm."""
    block = 2 * 2 * h + 4 * (h * h + h) + (f * h + f) + (h * f + h)
    return v * h + s * h + layers * block + 2 * h


def _saved_bytes_of_one_microbatch(cfg: ModelConfig, share: int, dtype: torch.dtype) -> int:
    """Storages autograd saves for one forward of the whole model, parameters excluded, counted
    here without the probe: the executor feeds tokens[:, :-1] and labels tokens[:, 1:]."""
    module = StageModule(cfg, 0, cfg.num_units, dtype=dtype)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(cfg.vocab_size, (share, cfg.seq_len + 1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(tokens[:, :-1], tokens[:, 1:], 1.0)
    assert out.requires_grad  # the graph (and so every saved storage) is alive while we count
    return sum(saved.values())


def test_cpu_peak_memory_is_params_grads_and_one_microbatch(tmp_path):
    """1 stage, 1 rank, SGD (no optimizer state), 1F1B with 2 microbatches: F0 B0 F1 B1. The peak
    is after F1: parameters + gradients (from B0) + F1's saved tensors; F0's were freed by B0."""
    instance = instance_from_dict(INSTANCE)
    plan = plan_from_dict({"name": "one", "num_microbatches": 2, "schedule": "1F1B",
                           "stages": [{"layer_start": 0, "layer_end": 4, "replicas": [REPLICA]}]})
    result = measure_plan(instance, plan, steps=2, warmup=1, model_overrides=TINY, dtype="float64",
                          out_dir=tmp_path)
    cfg = ModelConfig(num_layers=2, **TINY)
    params_bytes = 8 * _param_count(32, 64, 64, 16, 2)
    activations_bytes = _saved_bytes_of_one_microbatch(cfg, 4, torch.float64)
    records = [rec for row in json.loads(result.log_path.read_text())["steps"] for rec in row["ranks"]]
    for rec in records:
        assert (rec["params_bytes"], rec["grads_bytes"], rec["optimizer_bytes"]) == (params_bytes, params_bytes, 0)
        assert rec["activations_bytes"] == activations_bytes
        assert rec["peak_memory_bytes"] == 2 * params_bytes + activations_bytes
    assert result.measured["peak_memory_bytes"] == 2 * params_bytes + activations_bytes
