"""Output files: checked before long work starts, written atomically.

A command that searches for a minute and then finds its `-o` directory missing has wasted the
minute; a command interrupted while writing must not leave half a file or replace a good one with
nothing. So every output path is checked up front (`check_writable`) and written through a
temporary file in the same directory that is renamed over the target (`write_atomic`): the rename
is atomic on POSIX file systems, so readers see the old file or the new one, never a mix.
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hetplan.errors import HetplanError


class OutputError(HetplanError):
    """An output path cannot be written (missing directory, a directory in the way, no permission)."""

    def __init__(self, message: str, option: str):
        self.option = option
        super().__init__(f"{option}: {message}")


def check_writable(path: str | Path, option: str) -> Path:
    """The path as a Path, or OutputError naming `option` if a file cannot be created there."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise OutputError(f"{target} is a directory; give a file name", option)
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{parent} is a file, not a directory", option)
    if not parent.is_dir():
        raise OutputError(f"directory {parent} does not exist", option)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"directory {parent} is not writable", option)
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"{target} is not writable", option)
    return target


def check_output_dir(path: str | Path, option: str) -> Path:
    """A directory that exists and is writable or can be created (its nearest existing ancestor is)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise OutputError(f"{target} exists and is not a directory", option)
    probe = target
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{target} cannot be created: {probe} is not a writable directory", option)
    return target


def write_atomic(path: str | Path, data: str | bytes, option: str = "output") -> Path:
    """Write `data` to `path` via a temporary file in the same directory and a rename."""
    target = check_writable(path, option)
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    except OSError as exc:  # e.g. a directory that refuses new files whatever its mode says (/proc)
        raise OutputError(f"cannot write {target}: {exc.strerror} in {target.parent}", option) from None
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@contextmanager
def stdout_fd_to(fd: int) -> Iterator[int | None]:
    """Point file descriptor 1 at `fd` inside the block, so that C libraries (HiGHS's banner, SCIP's
    log, Sailor's C++ planner) do not write on the caller's stdout; yields a duplicate of the real
    stdout's descriptor, valid inside the block. Without real descriptors (embedded use) nothing is
    redirected and it yields None."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(fd, 1)
    except (OSError, ValueError, AttributeError):
        yield None
        return
    try:
        yield saved
    finally:
        os.dup2(saved, 1)
        os.close(saved)
