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
    """The path as a Path, or OutputError naming `option` if it cannot be written: a new file is
    really created (and removed) beside it, as `write_atomic` will, since some directories refuse
    new files whatever their mode says (/proc, /sys as root). A symlink is checked at the file it
    names; a device or FIFO (/dev/null, a pipe) only for write permission, as it is written in place."""
    target, real = _resolved(path, option)
    if real is not None:
        fd, tmp = _temporary(real, option)
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
    return target


def _resolved(path: str | Path, option: str) -> tuple[Path, Path | None]:
    """(the path, the file a rename replaces: the path with its symlinks followed; None for a device
    or FIFO, written in place), or OutputError for what no write can reach; the directory's own
    refusal of new files is for `_temporary` to find."""
    target = Path(path)
    if target.is_dir():
        raise OutputError(f"{target} is a directory; give a file name", option)
    if _in_place(target):
        if not os.access(target, os.W_OK):
            raise OutputError(f"{target} is not writable", option)
        return target, None
    real = Path(os.path.realpath(target))
    parent = real.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{parent} is a file, not a directory", option)
    if not parent.is_dir():
        raise OutputError(f"directory {parent} does not exist", option)
    if real.exists() and not os.access(real, os.W_OK):
        raise OutputError(f"{real} is not writable", option)
    return target, real


def _in_place(target: Path) -> bool:
    """An existing target that is neither a regular file nor a directory (a device, a FIFO): written
    through, never replaced (renaming over /dev/null as root replaced the device with a file)."""
    return target.exists() and not target.is_file() and not target.is_dir()


def _temporary(real: Path, option: str) -> tuple[int, str]:
    """mkstemp beside `real`; OutputError naming `option` when the directory refuses it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    except OSError as exc:  # e.g. a directory that refuses new files whatever its mode says (/proc)
        raise OutputError(f"cannot write {real}: {exc.strerror} in {real.parent}", option) from None
    return fd, tmp


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
    """Write `data` to `path` via a temporary file in the same directory and a rename. A symlink
    keeps pointing where it did (the file it names is replaced); a device or FIFO is written in
    place; a file that exists keeps its permission bits (a new one gets rw-r--r--)."""
    target, real = _resolved(path, option)
    mode = "wb" if isinstance(data, bytes) else "w"
    if real is None:
        with open(target, mode) as fh:
            fh.write(data)
        return target
    bits = real.stat().st_mode & 0o7777 if real.exists() else 0o644
    fd, tmp = _temporary(real, option)  # the directory's refusal found here, as `check_writable` finds it
    try:
        with os.fdopen(fd, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, bits)
        os.replace(tmp, real)
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
