"""`read_regular`, how tracklake reads the small files it keeps (attempt records, state,
claims, journals): bounded by a limit, and allocating what the file holds, not the
limit (an attempt file is read under a 64 MiB limit, a backup target's under 1 GiB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracklake._format import files
from tracklake._format.files import read_regular


def test_a_small_file_is_read_under_an_address_space_smaller_than_the_limit(
        tmp_path: Path) -> None:
    """A 1 GiB limit, the process's address space 256 MiB above what it maps already:
    the file's 11 bytes are read (a read of limit + 1 bytes asked the allocator for
    1 GiB, and was refused)."""
    path = tmp_path / "small.json"
    path.write_bytes(b'{"run": 1}\n')
    script = f"""
import resource
from pathlib import Path
from tracklake._format.files import read_regular
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20),) * 2)
print(read_regular(Path({str(path)!r}), 1 << 30))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(b'{"run": 1}\n')


def test_a_file_larger_than_its_size_said_is_read_on_to_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that grew after its size was taken (or one whose size says 0, as files of
    /proc do) is read on, a piece at a time, and refused past the limit as before."""
    path = tmp_path / "grown"
    data = os.urandom(3 << 20)
    path.write_bytes(data)
    real = os.fstat

    def said_small(fd: int) -> os.stat_result:
        st = real(fd)
        return os.stat_result((*st[:6], 10, *st[7:]))  # st_size

    monkeypatch.setattr(files.os, "fstat", said_small)
    assert read_regular(path, 3 << 20) == data
    assert read_regular(path, 8 << 20) == data
    with pytest.raises(OSError, match="holds more than"):
        read_regular(path, (3 << 20) - 1)
    path.write_bytes(b"")
    assert read_regular(path, 100) == b""


def test_a_file_past_the_limit_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    with pytest.raises(OSError, match=f"{path} holds more than 100 bytes"):
        read_regular(path, 100)
    assert read_regular(path, 101) == b"x" * 101
