"""Output files (hetplan.files): what `-o` does to the path it is given.

`write_atomic` renamed a temporary file over the target whatever it was: `solve -o /dev/null` as
root replaced the system's /dev/null with a file holding the plan, a FIFO became a file nobody
read, a symlink became a file beside the one it named. And `check_writable` trusted the directory's
mode, so `solve -o /proc/x.json` searched first and failed after.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from hetplan.files import OutputError, check_writable, write_atomic
from test_cli_contract import executable, run


def test_a_symlink_keeps_pointing_at_the_file_it_names(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "link.json").symlink_to(real.name)
    write_atomic(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]  # no temporary left


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_atomic(fifo, "plan\n")
    reader.join(timeout=30)
    assert got == [b"plan\n"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_file_keeps_its_permission_bits_and_a_new_one_is_rw_r_r(tmp_path):
    old = tmp_path / "old.json"
    old.write_text("x")
    old.chmod(0o600)
    write_atomic(old, "y")
    assert old.read_text() == "y" and stat.S_IMODE(old.stat().st_mode) == 0o600
    assert stat.S_IMODE(write_atomic(tmp_path / "new.json", "z").stat().st_mode) == 0o644


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc, which refuses new files")
def test_a_directory_that_refuses_new_files_is_found_before_the_work():
    """/proc looks writable to root (os.access) and refuses every new file."""
    with pytest.raises(OutputError, match=r"^--output: cannot write /proc/hetplan-x\.json: .* in /proc$"):
        check_writable("/proc/hetplan-x.json", "--output")


def test_the_cli_writes_through_a_symlink(tmp_path):
    (tmp_path / "schema.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("schema.json")
    proc = run(executable(), ["schema", "-o", "{d}/link.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "link.json").is_symlink() and '"title"' in (tmp_path / "schema.json").read_text()
