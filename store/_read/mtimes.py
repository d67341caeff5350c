"""The mtimes of many paths at once, as the catalog's validation needs them (a store of
10,000 runs watches 70,000 paths).

A loop of `os.stat` costs ≈ 1.7 µs a path on this machine's 2 cores, mostly Python;
pyarrow's `LocalFileSystem.get_file_info` stats a list in C++ without the GIL, so two
threads each take half (70,000 paths: 120 ms → 50 ms, `benchmarks/read_profile.py`).
Both follow symbolic links, as `os.stat` does; a path that does not exist, or goes
through a file, is `ABSENT` in both.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa

#: The mtime given for a path that does not exist.
ABSENT = -1
#: Fewer paths than this are stat'ed in a plain loop (a thread costs ≈ 0.1 ms, 512
#: stats ≈ 0.9 ms).
_BATCH = 512


def mtimes_of(paths: list[str]) -> np.ndarray:
    """`st_mtime_ns` of each absolute path (`ABSENT` where none exists), as int64."""
    if len(paths) < _BATCH:
        return _looped(paths)
    half = len(paths) // 2
    second: list[np.ndarray | BaseException] = []

    def stat_second() -> None:
        try:
            second.append(_batched(paths[half:]))
        except BaseException as exc:  # raised again in the caller's thread
            second.append(exc)

    worker = threading.Thread(target=stat_second, name="tracklake-stat", daemon=True)
    worker.start()
    try:
        first = _batched(paths[:half])
    finally:
        worker.join()
    if isinstance(second[0], BaseException):
        raise second[0]
    return np.concatenate([first, second[0]])


def _batched(paths: list[str]) -> np.ndarray:
    from pyarrow import fs

    try:
        infos = fs.LocalFileSystem().get_file_info(paths)
    except pa.ArrowInvalid:
        return _looped(paths)  # a path pyarrow will not take (a relative one, say)
    return np.array([ABSENT if i.mtime_ns is None else i.mtime_ns for i in infos],
                    dtype=np.int64)


def _looped(paths: list[str]) -> np.ndarray:
    stat = os.stat
    out: list[int] = []
    append = out.append
    for path in paths:
        try:
            append(stat(path).st_mtime_ns)
        except (FileNotFoundError, NotADirectoryError):
            append(ABSENT)
    return np.array(out, dtype=np.int64)
