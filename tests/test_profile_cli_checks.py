"""`hetplan profile`'s own option checks, through the installed `hetplan` executable.

Each case once ended in an internal error (exit 70: torch failing to allocate a mistyped size, or
OpenMP asked for 2^40 threads), named no option (`--threads 0`, `--model ''`), or ran on with an
empty option taken as not given (`--gpu-type ''`). Now each is refused with status 1 and one
`error: OPTION: ...` line; all but the last two cases are refused before any profiling.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_cli_contract import error_lines, executable

# The smallest model the runtime runs: a refusal that comes too late costs little.
TINY = {"name": "tiny", "num_layers": 1, "hidden_size": 8, "num_heads": 1, "ffn_hidden_size": 8, "vocab_size": 8,
        "seq_len": 4}
CHEAP = ["--mbs", "1", "--warmup", "0", "--repeats", "1"]
HUGE = "1099511627776"  # 2^40, as the fuzz run gave it
SHAPE_OPTIONS = "--mbs/--seq-len/--layers/--hidden/--heads/--ffn/--vocab"
BAD_INPUT = 1


@pytest.fixture
def folder(tmp_path) -> Path:
    """A folder of its own per test: a case that wrongly profiles leaves its output to itself."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (tmp_path / "huge_vocab.yaml").write_text(yaml.safe_dump({**TINY, "vocab_size": int(HUGE)}))
    return tmp_path


def profile(folder: Path, *args: str, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    """`hetplan profile --model tiny.yaml` with the cheap settings, then `args` (the last of an option wins);
    with `limit_bytes`, under that limit of address space, so that a large tensor cannot be allocated."""
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    argv = [executable(), "profile", "--model", "tiny.yaml", "-o", "out.yaml", *CHEAP, *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=folder, timeout=300,
                          preexec_fn=limit if limit_bytes else None)


def refused(folder: Path, proc: subprocess.CompletedProcess, needle: str) -> str:
    """Status 1, one `error:` line starting with `needle`, no traceback, no output file."""
    lines = error_lines(proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == BAD_INPUT, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(needle), proc.stderr[-2000:]
    assert not (folder / "out.yaml").exists(), "a refused run wrote its output"
    return lines[0]


# ---- 1a: each model-size option has a ceiling, checked before torch is imported ----
SIZE_OPTIONS = ["--mbs", "--tp", "--seq-len", "--layers", "--hidden", "--heads", "--ffn", "--vocab"]


@pytest.mark.parametrize("option", SIZE_OPTIONS)
def test_a_huge_size_is_refused_naming_its_option(folder, option):
    # --mbs, --seq-len, --hidden, --ffn, --vocab: exit 70 (torch's allocation failure); --layers, --heads:
    # refused as --model; --tp: refused as not dividing the heads, a wrong reason
    proc = profile(folder, option, HUGE)
    refused(folder, proc, f"error: {option}: {HUGE} is above the ceiling of ")


def test_a_huge_size_in_a_model_file_is_refused_naming_the_field(folder):
    proc = subprocess.run([executable(), "profile", "--model", "huge_vocab.yaml", "-o", "out.yaml", *CHEAP],
                          capture_output=True, text=True, cwd=folder, timeout=300)
    refused(folder, proc, f"error: --model: vocab_size {HUGE} of tiny is above the ceiling of ")


@pytest.mark.parametrize("option, value", [("--seq-len", "0"), ("--layers", "-3")])
def test_a_size_below_one_names_its_option(folder, option, value):
    # once "error: --model: seq_len: Input should be greater than 0"
    refused(folder, profile(folder, option, value), f"error: {option}: must be at least 1, got {value}")


# ---- 1b: a shape beyond the machine's memory ----
def test_a_shape_beyond_memory_is_refused_before_profiling(folder):
    # attention scores of 2^48 elements: under the seq-len ceiling, over any machine's memory
    proc = profile(folder, "--seq-len", str(1 << 24))
    line = refused(folder, proc, f"error: {SHAPE_OPTIONS}: microbatch 1 x seq 16777216 of tiny")
    assert "needs at least" in line and "GiB" in line, line
    assert "profiling" not in proc.stderr  # refused before the progress bar


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS bounds allocations on Linux")
@pytest.mark.parametrize("tp", ["1", "2"], ids=["this process", "a TP group's processes"])
def test_a_failed_allocation_is_refused_naming_the_shape_options(folder, tp):
    # 1 GiB of address space, and a block's attention scores of 1 GiB (seq 16,384, 1 head per rank): the
    # allocation fails, while the lower bound of the memory check (about 1 GiB) is below the machine's
    gib = 1 << 30
    proc = profile(folder, "--seq-len", "16384", "--tp", tp, "--heads", tp, "--hidden", "8", limit_bytes=gib)
    if proc.returncode != BAD_INPUT and profile(folder, "-o", "probe.yaml", limit_bytes=gib).returncode != 0:
        pytest.skip("this build of torch cannot run even the tiny profile within 1 GiB of address space")
    line = refused(folder, proc, f"error: {SHAPE_OPTIONS}: microbatch 1 x seq 16384 of tiny")
    assert "does not fit in the memory of cpu" in line, line


# ---- 2: counts name their option ----
COUNTS = [("--threads", "0", "must be a positive finite number, got 0"),
          ("--threads", HUGE, f"{HUGE} threads is more than the "),  # once exit 70; 100,000 a segfault
          ("--warmup", "-1", "must be a finite number >= 0, got -1"),
          ("--repeats", "0", "must be a positive finite number, got 0")]


@pytest.mark.parametrize("option, value, says", COUNTS, ids=[f"{o} {v}" for o, v, _ in COUNTS])
def test_a_bad_count_names_its_option(folder, option, value, says):
    refused(folder, profile(folder, option, value), f"error: {option}: {says}")


# ---- 2, 3: no string option takes empty text as "not given" (or as the directory ".") ----
BLANK = [("--model", ""), ("--gpu-type", ""), ("--gpu-type", "  "), ("--device", ""), ("--dtype", ""),
         ("--optimizer", ""), ("--format", ""), ("--mbs", ""), ("--tp", "")]


@pytest.mark.parametrize("option, value", BLANK, ids=[f"{o} {v!r}" for o, v in BLANK])
def test_an_empty_string_option_is_refused(folder, option, value):
    # --model '': "error: .: is a directory, not a file"; --gpu-type '': profiled, exit 0
    refused(folder, profile(folder, option, value), f"error: {option}: must not be empty")
