"""Imported first by the forkserver of local launches (runtime/local.py preloads it).

It moves that process into a process group of its own and has it killed when the launcher exits.
A Ctrl-C at the terminal goes to the launcher's group; the forkserver, which imports torch for
2-3 s after it starts, was interrupted there and printed its KeyboardInterrupt traceback under the
launcher's one-line message. Ranks forked from it share its group, out of the terminal's reach,
so each is killed with its parent (`die_with_parent` in runtime/local.py `_child`): the launcher
gone, the forkserver goes, and every rank with it, also one whose pid the launcher never learnt
(a Ctrl-C while it started them). Only the forkserver acts on import: the launcher names itself
in HETPLAN_FORKSERVER_PARENT for the moment it starts it (`local._start_forkserver`, which also
starts it with SIGINT blocked, for the moments before this import moves it out of the group).
"""
import ctypes
import os
import signal
import sys

PARENT_ENV = "HETPLAN_FORKSERVER_PARENT"
DIE_WITH_PARENT_ENV = "HETPLAN_DIE_WITH_PARENT"  # "1": a rank started by torchrun dies with its agent
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Have Linux SIGKILL this process when its parent exits (prctl PR_SET_PDEATHSIG), and exit now
    if the parent is already gone. Elsewhere, nothing."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


if os.environ.get(PARENT_ENV) == str(os.getppid()):
    del os.environ[PARENT_ENV]
    os.setpgid(0, 0)
    die_with_parent()
