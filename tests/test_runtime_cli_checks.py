"""Options of `run`, `launch`, `measure` (and `compile`) that a fuzz run found refused late, or not at all.

Each case once trained (or started to) and ended in exit 3 with a bare "[Errno ...]", restarted its
ranks 50 times, dropped an event without a word, or trained to a nan loss with exit 0. Now each is
refused before any rank starts, with status 1 (README "Exit status") and one `error:` line naming the
option, or the events file and its entry. Through the installed `hetplan` executable, with a tiny model.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_bad_options import ELASTIC, ELASTIC_PLAN, TINY, assert_refused
from test_cli_contract import executable, run

RUN = ["run", ELASTIC, ELASTIC_PLAN, "--local", "--elastic", "--steps", "1", *TINY]
LAUNCH = ["launch", ELASTIC, ELASTIC_PLAN, "--local", "--steps", "1", *TINY]
MEASURE = ["measure", ELASTIC, ELASTIC_PLAN, "--local", "--steps", "3", *TINY]
NO_PROC = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc, which refuses new folders")


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "a_file").write_text("not a folder\n")
    return tmp_path


def made(folder: Path) -> set[str]:
    """What a refused command left in the folder besides the test's own file."""
    return {p.name for p in folder.iterdir()} - {"a_file", "events.yaml", "watch.yaml"}


# --- item 1: output folders checked before training ---
FOLDER_CASES = [
    pytest.param(RUN + ["--checkpoint-dir", "/proc/hetplan-nope"], "--checkpoint-dir", marks=NO_PROC,
                 id="run ckpt /proc"),
    pytest.param(RUN + ["--checkpoint-dir", "{d}/a_file"], "--checkpoint-dir", id="run ckpt a file"),
    pytest.param(RUN + ["--checkpoint-dir", ""], "--checkpoint-dir", id="run ckpt empty"),
    pytest.param(RUN + ["--checkpoint-dir", "{d}/ckpt", "-o", "/proc/hetplan-nope"], "--out", marks=NO_PROC,
                 id="run out /proc"),
    pytest.param(RUN + ["--checkpoint-dir", "{d}/ckpt", "-o", ""], "-o", id="run out empty"),  # as typed
    pytest.param(LAUNCH + ["-o", "/proc/hetplan-nope"], "--out", marks=NO_PROC, id="launch out /proc"),
    pytest.param(LAUNCH + ["-o", ""], "-o", id="launch out empty"),
    pytest.param(MEASURE + ["-o", "/proc/hetplan-nope"], "--out", marks=NO_PROC, id="measure out /proc"),
    pytest.param(MEASURE + ["-o", ""], "-o", id="measure out empty"),
    pytest.param(["compile", ELASTIC, ELASTIC_PLAN, "-o", "{d}/launch", "--checkpoint-dir", ""], "--checkpoint-dir",
                 id="compile ckpt empty"),
    pytest.param(["compile", ELASTIC, ELASTIC_PLAN, "-o", ""], "-o", id="compile out empty"),  # wrote into '.'
    pytest.param(["compile", ELASTIC, ELASTIC_PLAN, "-o", "/proc/hetplan-nope"], "--out", marks=NO_PROC,
                 id="compile out /proc"),
]


@pytest.mark.parametrize("args, option", FOLDER_CASES)
def test_an_unusable_folder_is_refused_before_training(folder, args, option):
    """/proc passes the permission check as root and refuses mkdir; '' was read as '.' (the run wrote
    its checkpoints into the working folder), or as "not given" by `compile`."""
    line = assert_refused(run(executable(), args, folder), f"error: {option}: ")
    assert "Errno" not in line
    assert made(folder) == set()  # no checkpoint, log or probe folder left behind


# --- item 2: a checkpoint folder of another model or optimizer ---
@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    """A checkpoint folder that one step of the tiny model (hidden 16, adam) wrote; only read after."""
    d = tmp_path_factory.mktemp("tiny_ckpt")
    first = run(executable(), RUN + ["--checkpoint-dir", "{d}/ckpt"], d)
    assert first.returncode == 0, first.stderr
    return d / "ckpt"


@pytest.mark.parametrize("extra, says", [(["--hidden", "32"], "hidden_size 16 (this run: 32)"),
                                         (["--optimizer", "sgd"], "optimizer adam, this run uses sgd")],
                         ids=["wider", "sgd"])
def test_run_refuses_a_checkpoint_of_another_model_up_front(folder, tiny_ckpt, extra, says):
    """It restarted its ranks 50 times, each failing on "checkpoint parameter 0/wpe has shape (8, 16),
    the model (8, 32)", then exited 3 (the same model resuming: tests/test_elastic_run.py)."""
    args = [*RUN, "--checkpoint-dir", str(tiny_ckpt), "--steps", "2", "-o", "{d}/run", *extra]
    line = assert_refused(run(executable(), args, folder), "error: --checkpoint-dir: ")
    assert says in line
    assert made(folder) == set()  # no segment started


def test_a_checkpoint_of_another_dtype_is_said_once(folder, tiny_ckpt):
    """tiny_ckpt is float32; resuming it under float64 converts the values (allowed), which went
    without a word: a run that meant to continue in float64 left the uninterrupted run's losses."""
    import shutil

    ckpt = shutil.copytree(tiny_ckpt, folder / "ckpt")
    args = [*RUN, "--checkpoint-dir", str(ckpt), "--steps", "2", "--dtype", "float64", "-o", "{d}/out"]
    proc = run(executable(), args, folder)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "was written in float32" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: "), proc.stderr
    assert "this run trains in float64" in warned[0] and "--dtype float32" in warned[0]


def test_a_checkpoint_without_a_recorded_model_is_still_read(tmp_path):
    """Fields meta.json does not hold (older checkpoints) are not compared; the load checks shapes."""
    from hetplan.runtime.checkpoint import check_meta, read_meta

    (tmp_path / "meta.json").write_text(json.dumps({"format": 1, "iteration": 1, "tp_of_unit": {}}))
    check_meta(read_meta(tmp_path), tmp_path, {"hidden_size": 32}, "adam", "--checkpoint-dir")


def test_a_rank_refuses_a_checkpoint_of_another_optimizer_with_the_same_sentence(tiny_ckpt):
    """A rank started without the CLI (torchrun of a compiled spec) loads through load_rank, which
    states the optimizer check once, with check_meta."""
    import torch

    from hetplan.errors import PlanError
    from hetplan.runtime.checkpoint import latest, load_rank

    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(PlanError, match="written with optimizer adam, this run uses sgd"):
        load_rank(latest(tiny_ckpt), None, [], sgd)


def test_a_refused_launch_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """Without out_dir the launch made /tmp/hetplan-local-XXXX before its checks, and a refusal left
    it there, empty."""
    import tempfile

    from hetplan.errors import PlanError
    from hetplan.runtime.local import launch_local

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bad = {"hidden_size": 16, "num_heads": 3, "ffn_hidden_size": 32, "vocab_size": 32, "seq_len": 8}
    with pytest.raises(PlanError, match="not divisible by num_heads 3"):
        launch_local(ELASTIC, ELASTIC_PLAN, 1, bad)
    assert list(tmp_path.iterdir()) == []


def test_launch_local_refuses_a_checkpoint_of_another_model(folder, tiny_ckpt):
    """The library's launch resumes from `load_checkpoint`: refused there too, before a rank starts."""
    from hetplan.errors import PlanError
    from hetplan.runtime.local import launch_local

    model = {"hidden_size": 32, "num_heads": 2, "ffn_hidden_size": 32, "vocab_size": 32, "seq_len": 8}
    with pytest.raises(PlanError, match=r"load_checkpoint: .*hidden_size 16 \(this run: 32\)"):
        launch_local(ELASTIC, ELASTIC_PLAN, 1, model, out_dir=folder / "launch",
                     load_checkpoint=tiny_ckpt / "step_00000001")
    assert not (folder / "launch").exists()  # nothing written: launch_spec.json was, before the check


def test_a_damaged_checkpoint_stops_the_supervisor_after_three_failures(folder, tiny_ckpt):
    """A failure that restarting cannot cure (here a shard overwritten after the up-front check passes
    on meta.json) restarted the ranks 50 times; now the supervisor gives up after 3 failures in a row
    with no step done, exit 3, naming the file. The garbage keeps the shard's size: a shard of
    another size is passed over before any rank starts (tests/test_elastic_run.py)."""
    import shutil

    ckpt = folder / "ckpt"
    shutil.copytree(tiny_ckpt, ckpt)
    for shard in (ckpt / "step_00000001").glob("unit_0001/*.pt"):
        shard.write_bytes(b"g" * shard.stat().st_size)
    proc = run(executable(), [*RUN, "--checkpoint-dir", str(ckpt), "--steps", "2", "-o", "{d}/run"], folder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: gave up at iteration 1: the ranks failed 3 times in a row"), lines
    assert "unit_0001/tp0of1.pt is not a readable checkpoint shard (damaged or truncated" in lines[0]
    assert sorted(p.name for p in (folder / "run").iterdir()) == ["segment_000", "segment_001", "segment_002"]


# --- item 3: events files ---
LOSE = "{gpu_type: A100-40, zone: z-a, count: 2}"
EVENT_CASES = [("- {lose: %s}" % LOSE, "neither at_step nor at_s"),
               ("- {at_s: 1, kill_rank: 0}", "needs at_step")]


@pytest.mark.parametrize("entry, says", EVENT_CASES, ids=["no at_step or at_s", "fault at_s"])
def test_run_refuses_an_event_that_would_never_fire(folder, entry, says):
    """Was dropped (no time) or ignored at run time (a fault at an at_s), and the run went on."""
    (folder / "events.yaml").write_text(f"- {{at_step: 1, lose: {LOSE}}}\n{entry}\n")
    args = RUN + ["--checkpoint-dir", "{d}/ckpt", "--events", "{d}/events.yaml"]
    line = assert_refused(run(executable(), args, folder), "events.yaml[1]: ")
    assert says in line
    assert made(folder) == set()


def test_a_watched_fault_is_ignored_with_the_right_reason(folder):
    """Logged "faults need at_step" though the entry had one: a watched file's at_step is not read."""
    (folder / "watch.yaml").write_text("- {at_step: 1, kill_rank: 0}\n")
    proc = run(executable(), RUN + ["--checkpoint-dir", "{d}/ckpt", "--watch", "{d}/watch.yaml"], folder)
    assert proc.returncode == 0, proc.stderr
    assert "faults need at_step" not in proc.stderr
    assert "ignored 'kill rank 0' in " in proc.stderr and "faults are injected only at an at_step of --events" \
        in proc.stderr


# --- item 4: learning rate ceiling ---
LR_CASES = [(LAUNCH, "1e308", "1e+308"), (RUN + ["--checkpoint-dir", "{d}/ckpt"], "11", "11"),
            (MEASURE, "1e20", "1e+20")]


@pytest.mark.parametrize("args, lr, shown", LR_CASES, ids=["launch", "run", "measure"])
def test_a_learning_rate_that_cannot_train_is_refused(folder, args, lr, shown):
    """1e308 passed the finite check and trained to a nan loss with exit 0."""
    assert_refused(run(executable(), [*args, "--lr", lr], folder), f"error: --lr: must be at most 10 "
                   f"(a learning rate that can train), got {shown}")
    assert made(folder) == set()


def test_the_highest_learning_rate_is_taken(folder):
    proc = run(executable(), [*LAUNCH, "--lr", "10", "--optimizer", "sgd", "-o", "{d}/out"], folder)
    assert proc.returncode == 0, proc.stderr
