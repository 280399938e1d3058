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


# The first line of a Python child that must raise KeyboardInterrupt at SIGINT. An ignored signal
# stays ignored across fork and exec, and Python then installs no handler for it: under a pytest
# started with SIGINT ignored (a shell without job control starts a background command, `cmd &`,
# that way) such children never ended, while the `hetplan` CLI sets its own handler and passed.
# A process started from a terminal has this handler.
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def communicate_or_stacks(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
    """`proc.communicate(timeout=timeout_s)`; when the child has not ended by then, fail with where
    each of its threads was (the child needs `dumps_stacks()` as its environment): a hang under the
    suite's load then says where it hangs."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        masks = signal_masks(proc.pid)
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        ours = (f"this process blocks {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}, "
                f"SIGINT handler {signal.getsignal(signal.SIGINT)}")
        pytest.fail(f"the child did not end within {timeout_s} s; its signal masks then:\n{masks}\n{ours}\n"
                    f"its threads then:\n{(err or '')[-8000:]}")


def signal_masks(pid: int) -> str:
    """Each thread's signal masks as Linux shows them (/proc/PID/task/TID/status; hex, bit n-1 for
    signal n, so SIGINT is 0x2): pending to the thread (SigPnd) and to the process (ShdPnd),
    blocked, ignored, caught. A signal that does not end a child is either blocked or ignored
    there (inherited from the parent), or was taken by a thread other than the one waiting."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        lines.append(f"  {task.name} {status.get('Name', '?').strip()}: " + " ".join(
            f"{k}={status.get(k, '?').strip()}" for k in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
    return "\n".join(lines) or "  (no /proc entry)"
