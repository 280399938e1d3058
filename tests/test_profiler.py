"""`hetplan profile` (runtime/profiler.py, orchestration/profile_cli.py) and what reads its files: the profile time
estimator, the profile memory estimator (estimators/profile_memory.py), a GPU type defined by a
profile's device section (core/instance.py), Sailor's format, and instances/profile_schema.json.

One tiny model (2 layers, hidden 32, 4 heads, vocab 64, seq 16) is profiled once through the
installed executable at microbatches 1, 2 and TP 1, 2 on the CPU; the checks compare its figures with
the runtime model itself and with hand-computed tensor sizes. No check depends on wall-clock speed.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hetplan.errors import EstimatorError, InstanceError
from hetplan.profiles import ProfileSet, profile_json_schema

REPO = Path(__file__).resolve().parents[1]
ARCH = {"name": "tiny", "num_layers": 2, "hidden_size": 32, "num_heads": 4, "ffn_hidden_size": 128,
        "vocab_size": 64, "seq_len": 16}
DEVICE = "CPU-2core"
MBS, TPS = (1, 2), (1, 2)


def hetplan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("hetplan")
    if exe is None:
        pytest.fail("the `hetplan` executable is not on PATH: install the package as the README says")
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("profile")
    (d / "tiny.yaml").write_text(yaml.safe_dump(ARCH))
    proc = hetplan("profile", "--model", "tiny.yaml", "--mbs", "1,2", "--tp", "1,2", "--gpu-type", DEVICE,
                   "--warmup", "1", "--repeats", "3", "-o", "prof.yaml", cwd=d)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "prof.yaml"  # stdout carries the output path only
    return d


@pytest.fixture(scope="module")
def profile(folder):
    return ProfileSet.from_json(folder / "prof.yaml").get(DEVICE)


def _config():
    from hetplan.runtime.model import ModelConfig

    return ModelConfig(**{k: v for k, v in ARCH.items() if k != "name"})


# ---- the measurements ------------------------------------------------------------------------------
def test_every_time_is_positive_and_finite(profile):
    assert {(m.microbatch, m.tp) for m in profile.times} == {(b, t) for b in MBS for t in TPS}
    for m in profile.times:
        values = [m.update_s] + [v for u in m.units for v in (u.fwd_s, u.bwd_s)]
        assert all(math.isfinite(v) and v > 0 for v in values), m
        assert len(m.units) == ARCH["num_layers"] + 2
        # TP collectives were timed where there are some: the blocks' two all-reduces each way
        assert (m.tp_comm is None) == (m.tp == 1)
        if m.tp_comm is not None:
            assert all(u.fwd_s > 0 and u.bwd_s > 0 for u in m.tp_comm[1:-1])


def test_params_per_gpu_match_the_runtime_model(profile):
    from hetplan.runtime.model import StageModule, TPContext

    cfg = _config()
    for tp in TPS:
        measured = profile.memory_at(tp, 1).units
        for u in range(cfg.num_units):
            for rank in range(tp):  # every rank holds the same number (even splits)
                stage = StageModule(cfg, u, u + 1, TPContext(size=tp, rank=rank))
                count = sum(p.numel() for _, p in stage.logical_params())
                assert measured[u].params_per_gpu == count, (tp, u, rank)
                assert measured[u].params_bytes == 4 * count


def test_activations_grow_with_the_microbatch(profile):
    for tp in TPS:
        one, two = profile.memory_at(tp, 1).units, profile.memory_at(tp, 2).units
        for u, (a, b) in enumerate(zip(one, two)):
            assert a.activation_bytes > 0
            assert abs(b.activation_bytes / a.activation_bytes - 2) < 0.2, (tp, u)  # within 10 % of 2x


def test_sizes_agree_with_hand_computed_tensors(profile):
    s, h = ARCH["seq_len"], ARCH["hidden_size"]
    for m in profile.memory:
        b, units = m.microbatch, m.units
        for u in units[:-1]:  # embedding and blocks hand on the fp32 hidden state
            assert u.output_bytes == b * s * h * 4
        assert units[-1].output_bytes == 4  # the head's scalar loss
        # the embedding keeps its int64 lookup indices and the bool mask of out-of-shard tokens
        assert units[0].activation_bytes == b * s * (8 + 1)
        # a block keeps at least its input, q, k, v and the b x heads x s x s attention probabilities
        assert units[1].activation_bytes > b * (4 * s * h + ARCH["num_heads"] // m.tp * s * s) * 4


def test_device_optimizer_and_links_are_recorded(profile):
    assert profile.device.name == DEVICE and profile.device.kind == "cpu" and profile.device.threads == 1
    assert profile.device.memory_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert profile.device.achieved_tflops > 0
    assert profile.optimizer == "adam"
    assert 8 <= profile.optimizer_state_bytes_per_param < 8.1  # exp_avg + exp_avg_sq (fp32) + step scalars
    link = profile.link("intra_node")
    assert link.bandwidth_GBps > 0 and link.latency_s >= 0 and len(link.p2p_s) == len(link.message_bytes)


def test_the_file_round_trips_and_matches_its_schema(folder, profile):
    import jsonschema

    schema = json.loads((REPO / "instances" / "profile_schema.json").read_text())
    assert schema == json.loads(json.dumps(profile_json_schema())), \
        "run: hetplan profile-schema -o instances/profile_schema.json"
    data = yaml.safe_load((folder / "prof.yaml").read_text())
    jsonschema.validate(data, schema)
    again = ProfileSet.from_dict(json.loads(json.dumps(data)))
    assert again.get(DEVICE) == profile


# ---- the estimators, with the device as a new GPU type ------------------------------------------------
def _instance(folder: Path, **estimators):
    from hetplan.instance import load_instance

    inst = {"name": "cpu-box",
            "cluster": {"node_groups": [{"name": "box", "gpu_type": DEVICE, "gpus_per_node": 2, "count": 1,
                                         "zone": "local-a", "price_per_gpu_hour_usd": 0}]},
            "workload": {"model": {"arch": ARCH}, "global_batch_size": 8, "precision": "fp32",
                         "profiles": [{"gpu_type": DEVICE, "path": "prof.yaml"}]},
            "estimators": {"time": "profile", "memory": "profile", **estimators}}
    (folder / "inst.yaml").write_text(yaml.safe_dump(inst))
    return load_instance(folder / "inst.yaml")


def test_a_profile_of_another_width_is_said_to_be_another_models(folder, profile):
    """Only the layer count was checked: a profile measured at hidden 32 planned a model of hidden 64
    on its times without a word. Its TP-1 parameter count says so (by hand, biases and norms in:
    hidden 32: 2,560 + 2 x 12,704 + 2,112 = 30,080; hidden 64: 5,120 + 2 x 33,472 + 4,224 = 76,288);
    the model's own profile is quiet."""
    import warnings

    from hetplan.estimators import build_estimators
    from hetplan.instance import instance_from_dict

    inst = _instance(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_estimators(inst)
    wider = inst.model_dump(exclude={"base_dir"})
    wider["workload"]["model"] = {"arch": {**ARCH, "hidden_size": 64}}
    wider["workload"]["profiles"] = [{"gpu_type": DEVICE, "path": str(folder / "prof.yaml")}]
    with pytest.warns(UserWarning, match=r"^workload\.profiles: the profile of CPU-2core .* counts 30,080 parameters "
                                         r"at TP 1, the model tiny 76,288: its times are another model's$"):
        build_estimators(instance_from_dict(wider))


def test_a_profile_defines_a_new_gpu_type(folder, profile):
    inst = _instance(folder)
    gpu = inst.gpu(DEVICE)
    assert gpu.memory_bytes == int(profile.device.memory_bytes)
    assert gpu.peak_fp32_tflops == pytest.approx(profile.device.achieved_tflops)
    assert gpu.intra_node.bandwidth_GBps == pytest.approx(profile.link("intra_node").bandwidth_GBps)


def test_estimators_read_the_profile(folder, profile):
    from hetplan.estimators import build_estimators

    est = build_estimators(_instance(folder))
    for tp in TPS:
        for b in (1, 2, 3):  # 3: extrapolated (a tiny unit's times are noise: may be floored at 0)
            for u in range(profile.num_units):
                t = est.time.layer_time(DEVICE, u, b, tp)
                assert t.fwd_s >= 0 and t.bwd_s >= 0 and (b == 3 or t.fwd_s > 0 and t.bwd_s > 0)
        units = range(0, profile.num_units)
        for b in MBS:
            mem = est.memory.worker_memory(DEVICE, units, tp, b, dp=1, in_flight=2)
            measured = profile.memory_at(tp, b).units
            assert mem.params_bytes == mem.grads_bytes == sum(u.params_bytes for u in measured)
            assert mem.activations_bytes == 2 * sum(u.activation_bytes for u in measured)
            assert mem.optimizer_bytes == pytest.approx(
                profile.optimizer_state_bytes_per_param * sum(u.params_per_gpu for u in measured))
            assert mem.overhead_bytes == 0 and mem.capacity_bytes == int(profile.device.memory_bytes)
        # b = 3 is extrapolated linearly from b = 1, 2
        one, two, three = (est.memory.worker_memory(DEVICE, units, tp, b, 1, 1).activations_bytes for b in (1, 2, 3))
        assert three == pytest.approx(2 * two - one)
    with pytest.raises(EstimatorError, match=r"no memory measurement at TP degree 4; measured TP degrees: \[1, 2\]"):
        est.memory.worker_memory(DEVICE, range(0, 2), 4, 1, 1, 1)


def test_zero_and_sgd_change_the_model_states(folder, profile):
    from hetplan.estimators.profile_memory import ProfileMemoryEstimator

    profiles = ProfileSet((profile,))
    units = range(1, 3)
    sgd = ProfileMemoryEstimator(profiles, {DEVICE: 1e12}, optimizer="sgd")
    assert sgd.worker_memory(DEVICE, units, 1, 1, 1, 1).optimizer_bytes == 0
    zero1 = ProfileMemoryEstimator(profiles, {DEVICE: 1e12}, zero_stage=1)
    plain = ProfileMemoryEstimator(profiles, {DEVICE: 1e12})
    a, b = plain.worker_memory(DEVICE, units, 1, 1, 4, 1), zero1.worker_memory(DEVICE, units, 1, 1, 4, 1)
    assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes / 4) and b.params_bytes == a.params_bytes


def test_a_profile_without_device_cannot_define_a_type(folder):
    data = yaml.safe_load((folder / "prof.yaml").read_text())
    del data["profiles"][0]["device"]
    (folder / "prof.yaml.bak").write_text((folder / "prof.yaml").read_text())
    try:
        (folder / "prof.yaml").write_text(yaml.safe_dump(data))
        with pytest.raises(InstanceError, match="no device section"):
            _instance(folder)
    finally:
        (folder / "prof.yaml").write_text((folder / "prof.yaml.bak").read_text())


# ---- Sailor's format ----------------------------------------------------------------------------------
def _same_as_sailor_carries(a, b) -> None:
    key = lambda m: (m.microbatch, m.tp)  # noqa: E731
    assert [(key(m), m.units, m.update_s) for m in sorted(a.times, key=key)] == \
           [(key(m), m.units, m.update_s) for m in sorted(b.times, key=key)]
    for tp in TPS:  # llm_info: microbatch 1, these four columns
        for x, y in zip(a.memory_at(tp, 1).units, b.memory_at(tp, 1).units):
            assert (x.params_per_gpu, x.params_bytes, x.activation_bytes, x.output_bytes) == \
                   (y.params_per_gpu, y.params_bytes, y.activation_bytes, y.output_bytes)


def test_sailor_export_round_trips(tmp_path, profile):
    """What `hetplan profile --format sailor -o DIR/profile.json` writes reads back through the importer."""
    from hetplan.importers.sailor import read_sailor_profile
    from hetplan.orchestration.profile_cli import write_profile

    written = write_profile(profile, tmp_path / "profile.json", "sailor")
    assert [p.name for p in written] == ["profile.json", "llm_info.json"]
    data = json.loads(written[0].read_text())
    assert len(data["1"]["1"]) == ARCH["num_layers"] + 2 and all(len(v) == 3 for v in data["1"]["1"].values())
    back = read_sailor_profile(written[0], gpu_type=DEVICE, model="tiny", llm_info=written[1])
    _same_as_sailor_carries(back, profile)


# ---- bad input: one line, exit 1 ------------------------------------------------------------------------
BAD = [
    (["--model", "NOPE"], "unknown model preset 'NOPE'"),
    (["--model", "tiny.yaml", "--tp", "3"], "TP degree 3 does not divide num_heads 4"),
    (["--model", "tiny.yaml", "--mbs", "0"], "--mbs"),
    (["--model", "tiny.yaml", "--mbs", "1,x"], "--mbs"),
    (["--model", "Llama-7B"], "swiglu"),
    (["--model", "tiny.yaml", "--device", "cuda"], "--device"),  # this machine has no CUDA (or too few GPUs)
    (["--model", "tiny.yaml", "--format", "sailor"], ".json"),
]


@pytest.mark.parametrize("args, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line(folder, args, needle):
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            args = [*args, "--tp", str(torch.cuda.device_count() + 1)]
    proc = hetplan("profile", *args, "-o", "bad.yaml", cwd=folder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert not (folder / "bad.yaml").exists()
