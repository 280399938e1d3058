import os
import signal
import subprocess
from pathlib import Path

import pytest

from hetplan.instance import load_instance

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    return Path(os.environ.get("HETPLAN_SHARED_DIR", REPO.parent / "shared"))


@pytest.fixture
def a100_v100():
    return load_instance(REPO / "instances" / "a100_v100_one_zone.yaml")


def dumps_stacks() -> dict[str, str]:
    """This process's environment as it is now (what a child inherits by default) plus
    PYTHONFAULTHANDLER: a child started with it prints every thread's stack when SIGABRT ends it."""
    return {**os.environ, "PYTHONFAULTHANDLER": "1"}


def communicate_or_stacks(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
    """`proc.communicate(timeout=timeout_s)`; when the child has not ended by then, fail with where
    each of its threads was (the child needs `dumps_stacks()` as its environment): a hang under the
    suite's load then says where it hangs."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        pytest.fail(f"the child did not end within {timeout_s} s; its threads then:\n{(err or '')[-8000:]}")
