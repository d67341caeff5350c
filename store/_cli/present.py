"""What the CLI prints: one run, diffs, query results (the run table: `run_list`)."""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pyarrow as pa
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracklake._cli.cells import cell
from tracklake._cli.console import literal_console, terminal_width
from tracklake._cli.drawn_table import PlainTable
from tracklake._cli.fit import Column, Whole, fitted_table, hidden_note
from tracklake._cli.present_media import histograms_table, media_rows, media_table
from tracklake._cli.sparkline import UNICODE_LEVELS, trends
from tracklake._errors import QueryError
from tracklake._format.attempt import effective_status
from tracklake._read.location import is_url
from tracklake._read.query import query, with_connection
from tracklake._read.reader import ReadProblems, RunRecord, find_run
from tracklake._read.scope import EVERYTHING

if TYPE_CHECKING:
    import duckdb

def _console() -> Console:
    return literal_console(soft_wrap=False)


def _can_draw(console: Console) -> bool:
    """Whether the terminal's encoding shows block characters (else ASCII sparklines)."""
    try:
        UNICODE_LEVELS.encode(console.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


#: Keys `show` lists unless told otherwise: a run of 100,000 keys took 50 s to print.
SHOWN_KEYS = 200


def print_run(root: Path, run_id: str, project: str | None, problems: ReadProblems,
              keys: tuple[str, ...] = (), max_keys: int = SHOWN_KEYS) -> None:
    """`tracklake show`: the run's identity, attempts, records, per key its summary (of
    the keys matching the globs `keys`, if any; the first `max_keys` of them, 0 for
    every one), histograms, media and config."""
    record = find_run(root, run_id, project)
    console = _console()
    latest = record.attempts[-1]
    ident = latest.get("identity") or {}
    git = ident.get("git") or {}
    console.print(Text.assemble((f"{record.project}/{record.run}", "bold"),
                                f"  name={latest.get('name')}  tags={latest.get('tags')}"))
    console.print(f"command: {' '.join(ident.get('command') or [])}")
    console.print(f"host: {ident.get('host')}  python: {ident.get('python')}  "
                  f"git: {git.get('commit')}{' (dirty)' if git.get('dirty') else ''}")
    width = terminal_width(console)
    _print_fitted(console, width, attempts_table(record.attempts, width, time.time()))
    rank = min(record.ranks)
    unicode = _can_draw(console)

    def read(con: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
        counts, summary = _run_rows(con, record.project, record.run)
        matching = [m for m in summary
                    if not keys or any(fnmatch.fnmatchcase(m["key"], g) for g in keys)]
        shown = matching[:max_keys] if max_keys else matching
        curves = trends(con, record.project, record.run, rank, unicode,
                        [m["key"] for m in shown])
        return (counts, shown, len(matching), len(summary), curves,
                media_rows(con, record.project, record.run, rank))

    counts, summary, matching, every, curves, (histograms, media) = with_connection(
        root, problems, read, EVERYTHING.for_run(record.project, record.run))
    console.print("records: " + ", ".join(  # the kinds of format 1.2 only when there are
        f"{c['kind']}={c['records']}" for c in counts
        if c["records"] or c["kind"] not in ("histograms", "media")))
    _print_fitted(console, width, metrics_table(summary, curves, rank, width))
    if len(summary) < matching or (keys and matching < every):
        console.print(
            f"{len(summary):,} of {every:,} keys shown"
            + (f" ({matching:,} match {', '.join(keys)})" if keys else "")
            + "; --max-keys 0 shows every one, --key GLOB picks some, and `tracklake sql` "
              "asks the metric_summaries view", highlight=False)
    if histograms:
        _print_fitted(console, width, histograms_table(histograms, rank, width, unicode))
    if media:
        _print_fitted(console, width, media_table(media, width))
    config = latest.get("config") or {}
    if config:
        columns = [Column("key", list(config), "shorten"),
                   Column("value", [json.dumps(v) for v in config.values()], "wrap", floor=20)]
        _print_fitted(console, width, fitted_table(columns, [0, 1, Whole(0), Whole(1)], width,
                                                   title="config"))


def _print_fitted(console: Console, width: int | None, fitted: tuple[PlainTable, list[str]]
                  ) -> None:
    table, hidden = fitted
    console.print(table)
    if hidden and width is not None:
        console.print(hidden_note(hidden, width, "a wider terminal shows them"),
                      highlight=False)


def attempts_table(attempts: Sequence[dict[str, Any]], width: int | None, now: float
                   ) -> tuple[PlainTable, list[str]]:
    """Each attempt of each rank: status (as every reader shows it: a "running" attempt
    whose writer is gone is "crashed"), times, write problems. On a terminal the times
    are local and to the second, as `runs` shows its start; elsewhere as recorded."""
    rows = []
    for a in attempts:
        report = a.get("write_report") or {}
        written = "" if report.get("complete", True) else (
            f"{report.get('failed_writes')} failed writes, {report.get('dropped_values')} "
            f"values dropped: {report.get('last_error')}")
        times = [a.get("started_at") or "", a.get("finished_at") or ""]
        if width is not None:
            times = [_local_time(t) for t in times]
        rows.append([str(a["attempt"]), str(a["rank"]), effective_status(a, now=now),
                     *times, written])
    headers = ("attempt", "rank", "status", "started", "finished", "write problems")
    columns = [Column(h, [r[i] for r in rows], "wrap" if i == 5 else "never", floor=20)
               for i, h in enumerate(headers)]
    return fitted_table(columns, [2, 0, 1, 3, 4, 5, Whole(5)], width, title="attempts")


def _local_time(iso: str) -> str:
    """An ISO time from an attempt file as `runs` shows times (local, to the second)."""
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def metrics_table(summary: list[dict[str, Any]], curves: dict[str, str], rank: int,
                  width: int | None) -> tuple[PlainTable, list[str]]:
    """Per key: steps, values, min, max, last value, trend. The key matters most: whole
    if the terminal has room, else cut in its middle (`critic/…/mean`), distinct."""
    rows = []
    for m in summary:
        last = cell(m["last_value"])
        if m["last_rank"] != rank:
            last += f" (rank {m['last_rank']})"  # a key the lowest rank did not log
        rows.append([m["key"], f"{m['first']}..{m['last']}", cell(m["n"]), cell(m["min"]),
                     cell(m["max"]), last, curves.get(m["key"], "")])
    headers = ("key", "steps", "values", "min", "max", "last", "trend")
    columns = [Column(h, [r[i] for r in rows], "shorten" if i == 0 else "never")
               for i, h in enumerate(headers)]
    key, steps, values, low, high, last_, trend = range(len(headers))
    return fitted_table(columns, [key, last_, steps, Whole(key), low, high, trend, values],
                        width, title=f"metrics (all ranks; last and trend: rank {rank}'s, "
                                     "as in `runs`)")


def _run_rows(con: duckdb.DuckDBPyConnection, project: str, run: str
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Records per kind of one run, and per key its range over all ranks with the last
    value of the lowest rank that logged it."""
    params = {"p": project, "r": run}
    counts = query(" UNION ALL ".join(
        f"SELECT '{k}' AS kind, count(*) AS records FROM {k}_all WHERE project = $p AND run = $r"
        for k in ("metrics", "texts", "configs", "generations", "traces", "artifacts",
                  "histograms", "media", "events")), params=params, connection=con).to_pylist()
    summary = query("SELECT key, min(first_step) AS first, max(last_step) AS last, "
                    "sum(count) AS n, min(min) AS min, max(max) AS max, "
                    "arg_min(last_value, rank) AS last_value, min(rank) AS last_rank "
                    "FROM metric_summaries WHERE project = $p AND run = $r GROUP BY key "
                    "ORDER BY key", params=params, connection=con).to_pylist()
    return counts, summary


def _identity_sections(record: RunRecord) -> dict[str, dict[str, Any]]:
    rank0 = [a for a in record.attempts if a["rank"] == min(record.ranks)][-1]
    ident = rank0.get("identity") or {}
    return {
        "config": rank0.get("config") or {},
        "env": ident.get("env") or {},
        "packages": ident.get("packages") or {},
        "git": ident.get("git") or {},
    }


def print_diff(root: Path, run_a: str, run_b: str, section: str) -> bool:
    """Print the differences of each section; True if there are none at all."""
    a = _identity_sections(find_run(root, run_a))
    b = _identity_sections(find_run(root, run_b))
    console = _console()
    same = True
    for name in ("config", "env", "packages", "git"):
        if section not in (name, "all"):
            continue
        left, right = a[name], b[name]
        keys = sorted(set(left) | set(right))
        changed = [k for k in keys if left.get(k, _MISSING) != right.get(k, _MISSING)]
        if not changed:
            console.print(f"{name}: identical ({len(keys)} entries)")
            continue
        same = False
        table = Table(title=f"{name}: {len(changed)} of {len(keys)} differ")
        table.add_column("key")
        table.add_column(run_a, overflow="fold")
        table.add_column(run_b, overflow="fold")
        for k in changed:
            table.add_row(k, _show(left.get(k, _MISSING)), _show(right.get(k, _MISSING)))
        console.print(table)
    return same


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


_MISSING = _Missing()


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, _Missing) else json.dumps(value, default=str)


def check_output_outside(output: Path | None, store: Path) -> None:
    """Refuse an output file inside the store (it would be taken for the store's own)."""
    if output is not None and not is_url(store) and \
            output.resolve().is_relative_to(store.resolve()):
        raise QueryError(f"refusing to write {output} inside the store {store}")


def write_table(table: pa.Table, output: Path | None, max_rows: int,
                counted: bool = True) -> None:
    """`table` as a table, to `output` or stdout, showing `max_rows` rows (`counted`:
    `table` is the whole answer, so the rows left out can be counted)."""
    rich_table = Table()
    for name in table.column_names:
        rich_table.add_column(name, overflow="fold")
    for row in table.slice(0, max_rows).to_pylist():
        rich_table.add_row(*(cell(v) for v in row.values()))
    if output is None:
        _console().print(rich_table)
        if table.num_rows > max_rows:
            more = f"{table.num_rows - max_rows} more rows" if counted else "more rows"
            click.echo(f"({more}; raise --max-rows or use --format csv)")
        return
    with open(output, "w") as f:
        literal_console(file=f, width=200).print(rich_table)
