"""Whether a Parquet part's values agree with its footer's row counts and min/max
statistics.

pyarrow's statistics accessors can abort the whole process on a damaged or crafted footer
(pyarrow 25: a C++ ``ParquetException`` "Definition level histogram size mismatch"
escapes `RowGroupMetaData.column` and calls ``std::terminate``), so a footer that has not
verified against its checksum is only looked at in a child process
(`stats_mismatch_isolated`): ``python -m tracklake._ops.fsck.footer_stats PATH``.
"""

from __future__ import annotations

import datetime as _dt
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Seconds a child may take over one part's footer before it counts as hung.
CHILD_TIMEOUT = 300.0


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


def stats_mismatch_isolated(path: Path) -> str | None:
    """`stats_mismatch` of the part at `path` (read with verified page checksums), run in
    a child process: why it disagrees with its footer, including that it does not read or
    that reading its footer kills the reader; None if it agrees."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(path)],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"reading its footer statistics did not end within {CHILD_TIMEOUT:.0f} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"reading its footer statistics kills the reader (signal {-done.returncode})"
    return done.stdout.strip() or f"its statistics do not read ({done.stderr.strip()[-200:]})"


def _main(path: str) -> int:
    try:
        f = pq.ParquetFile(path, page_checksum_verification=True)
        why = stats_mismatch(f)
    except (OSError, pa.ArrowException, ValueError, KeyError, TypeError, EOFError) as exc:
        why = f"its footer statistics do not read ({type(exc).__name__}: {exc})"
    if why is None:
        return 0
    print(why)
    return 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
