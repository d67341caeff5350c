"""Whether a Parquet part's values agree with its footer's row counts and min/max
statistics.

pyarrow's statistics accessors can abort the whole process on a damaged or crafted footer
(pyarrow 25: a C++ ``ParquetException`` "Definition level histogram size mismatch"
escapes `RowGroupMetaData.column` and calls ``std::terminate``); a footer checksum does not
stop a crafted file. So footers are only looked at in a child process
(`stats_mismatch_isolated`: ``python -m tracklake._ops.fsck.footer_stats``, one per fsck
process, started again after it died): a part whose footer kills it is reported as
damaged, and fsck goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import json
import math
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracklake._errors import NoAnswerError
from tracklake._format.bounded import elsewhere, read_timeout


def differs(actual: Any, recorded: Any) -> bool:
    if actual is None:
        return False
    if isinstance(actual, _dt.datetime) and isinstance(recorded, _dt.datetime):
        return actual.replace(tzinfo=None) != recorded.replace(tzinfo=None)
    if isinstance(actual, float) and isinstance(recorded, float):
        return not (actual == recorded or (math.isnan(actual) and math.isnan(recorded)))
    return bool(actual != recorded)


def stats_mismatch(f: pq.ParquetFile) -> str | None:
    """Why the row groups read do not agree with their footer's row counts and min/max
    statistics, or None."""
    for i in range(f.metadata.num_row_groups):
        rg = f.metadata.row_group(i)
        group = f.read_row_group(i)
        if group.num_rows != rg.num_rows:
            return f"row group {i} has {group.num_rows} rows, its header says {rg.num_rows}"
        for j in range(rg.num_columns):
            col = rg.column(j)
            stats = col.statistics
            name = col.path_in_schema
            if stats is None or not stats.has_min_max or name not in group.column_names:
                continue
            values = group.column(name)
            if pa.types.is_floating(values.type):
                values = pc.filter(values, pc.invert(pc.is_nan(values)))
            mm = pc.min_max(values)
            if differs(mm["min"].as_py(), stats.min) or differs(mm["max"].as_py(), stats.max):
                return f"row group {i} column {name}: statistics do not match the values"
    return None


#: How `stats_mismatch_isolated` begins its answer when the footer killed the child.
KILLS_READER = "reading its footer statistics kills the reader"


def stats_mismatch_isolated(path: Path) -> str | None:
    """`stats_mismatch` of the part at `path` (read with verified page checksums), asked
    of a child process (one per fsck, started again after it died): why the part
    disagrees with its footer, including that it does not read or that reading its
    footer kills the reader; None if it agrees. `NoAnswerError` naming the part if the
    child gives no answer for `read_timeout()` seconds (its file system hangs): the
    child is then killed, and the next part gets a new one."""
    with _LOCK:
        global _child
        if _child is not None and _child.poll() is not None:
            _end(_child)  # ended since it last answered: its pipes are closed here
            _child = None
        if _child is None:
            _child = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, encoding="utf-8")
        child = _child
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(json.dumps(str(path)) + "\n")
            child.stdin.flush()
            seconds = read_timeout()
            with elsewhere():  # bounded here: the child reads the part, not this thread
                answered = seconds is None or select.select([child.stdout], [], [], seconds)[0]
            if not answered:
                _abandon(child)
                _child = None
                raise NoAnswerError(path, seconds or 0.0)
            line = child.stdout.readline()
        except OSError:
            line = ""
        if line:
            verdict: str | None = json.loads(line)
            return verdict
        code = _end(child)
        _child = None
    return f"{KILLS_READER} (exit status {code})"


def _end(child: subprocess.Popen[str]) -> int:
    child.kill()
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # gone: what was left to send is of no use
                pipe.close()
    return child.wait()


def _abandon(child: subprocess.Popen[str]) -> None:
    """Kill `child` without waiting for it (a process blocked on a hung mount ends only
    once the kernel gets to it)."""
    child.kill()
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):  # gone: what was left to send is of no use
                pipe.close()


def _stop_child() -> None:
    global _child
    held = _LOCK.acquire(timeout=1.0)  # else a check given up on holds it: kill anyway
    try:
        if _child is not None:
            _abandon(_child)
            _child = None
    finally:
        if held:
            _LOCK.release()


_LOCK = threading.Lock()
_child: subprocess.Popen[str] | None = None
atexit.register(_stop_child)


def _verdict(path: str) -> str | None:
    try:
        return stats_mismatch(pq.ParquetFile(path, page_checksum_verification=True))
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError, EOFError) as exc:
        return f"its footer statistics do not read ({type(exc).__name__}: {exc})"


def _serve() -> None:
    """The child: a JSON path per line in, a JSON verdict (null or why) per line out."""
    for line in sys.stdin:
        print(json.dumps(_verdict(json.loads(line))), flush=True)


if __name__ == "__main__":
    _serve()
