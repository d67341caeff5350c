"""`tracklake runs`: the run table, newest runs first to be read, in three renderings.

A lab's store holds thousands of runs; a terminal shows a screenful. The table shows the
newest `DEFAULT_LIMIT` runs (oldest of them first, so the newest is next to the prompt) and
says how many older ones it hides; `--limit N` / `--all` choose. Only the runs shown are
asked for their metrics, and rich, whose layout costs ≈ 0.5 ms per cell, renders only
them. `tsv` and `json` are plain renderings for scripts and pipes: every run unless
`--limit`, one line per run, built without rich at all.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracklake._cli.cells import cell, duration
from tracklake._format.bounded import bounded
from tracklake._read.location import existing_root
from tracklake._read.query import query, with_connection
from tracklake._read.reader import ReadProblems
from tracklake._read.run_index import first_listing, newest_runs
from tracklake._read.scope import scope_of_views

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from tracklake._cli.drawn_table import PlainTable

#: Keys shown by `tracklake runs` when none are chosen, if the runs have them.
DEFAULT_RUN_METRICS = ("critic/score/mean", "actor/pg_loss", "val-core/*")
#: Runs the table shows when neither `--limit` nor `--all` is given.
DEFAULT_LIMIT = 50
#: Metric columns at most (a table wider than a terminal helps nobody).
_MAX_METRICS = 6
FORMATS = ("table", "tsv", "json")
_COLUMNS = ("project", "run", "status", "attempts", "ranks", "last step", "start",
            "duration")


def print_runs(root: Path, project: str | None, metrics: tuple[str, ...],
               problems: ReadProblems, *, limit: int | None = None, fmt: str = "table"
               ) -> None:
    """Print the runs of `root` (of `project`), the newest `limit` of them (None: the
    table's default, every run for `tsv`/`json`; 0: every run)."""
    if limit is None:
        limit = DEFAULT_LIMIT if fmt == "table" else 0
    scope = scope_of_views({"runs", "metric_summaries"})
    # (listed again: every run through the catalog kept whole, `first_listing`)
    found = bounded(lambda: newest_runs(existing_root(root), project, limit), root) \
        if limit and first_listing(root) else None
    if found is not None:
        # the newest runs alone are read: a store of a million runs costs what they do
        # (and the count the run catalog's files, a few bytes a run: `run_index`)
        _, runs, chosen, last = with_connection(
            root, problems, lambda con: _runs_rows(con, project, metrics, 0),
            scope.for_runs(frozenset(found.newest)))
        total = found.total
    else:
        total, runs, chosen, last = with_connection(
            root, problems, lambda con: _runs_rows(con, project, metrics, limit), scope)
    if fmt == "json":
        _print_json(runs, chosen, last)
    elif fmt == "tsv":
        _print_tsv(runs, chosen, last)
    elif not runs:
        click.echo(f"no runs in {root}")
    else:
        _print_table(root, runs, chosen, last)
        if total > len(runs):
            click.echo(f"({total - len(runs)} older runs not shown; --limit N or --all "
                       "lists them)")


def _runs_rows(con: duckdb.DuckDBPyConnection, project: str | None,
               metrics: tuple[str, ...], limit: int
               ) -> tuple[int, list[dict[str, Any]], list[str], dict[tuple[str, str, str], Any]]:
    """How many runs there are; the newest `limit` of them (0: all), oldest first; the
    metric keys chosen; and the last value of those keys on each shown run's lowest rank."""
    where = "WHERE project = $project" if project else ""
    params: dict[str, Any] = {"project": project} if project else {}
    newest = f"ORDER BY r.started_at DESC, r.project DESC, r.run DESC LIMIT {int(limit)}" \
        if limit else ""
    # (the count in the same pass over the runs view: 7-14 ms of 10,000 runs' attempts)
    shown = query(f"""
        SELECT r.project, r.run, r.status, r.attempts, r.ranks, r.started_at,
               strftime(r.started_at, '%Y-%m-%d %H:%M:%S') AS start,
               epoch(r.ended_at) - epoch(r.started_at) AS duration, count(*) OVER () AS total
        FROM runs r {where} {newest}""", params=params, connection=con)
    total = shown.column("total")[0].as_py() if shown.num_rows else 0
    shown = shown.drop_columns(["total"])
    con.register("_shown", shown.select(["project", "run"]))
    # the shown runs' summaries, on each run's lowest rank (the rank `show` calls its own);
    # their names as parameters too, which DuckDB pushes down to the summaries' scan where
    # it does not push the join (34,000 runs: 113-130 ms and 110 MB -> 22-30 ms)
    narrow, names = _shown_names(shown)
    lowest = f"""WITH m AS (SELECT * FROM metric_summaries SEMI JOIN _shown USING (project, run)
                         {narrow}),
                low AS (SELECT project, run, min(rank) AS rank, max(last_step) AS last_step
                        FROM m GROUP BY ALL)
                SELECT m.project, m.run, m.key, m.last_value, low.last_step
                FROM m JOIN low USING (project, run, rank)"""
    summaries = query(lowest, params=names, connection=con)
    con.unregister("_shown")
    keys = sorted(set(summaries.column("key").to_pylist()))
    chosen = [k for p in (metrics or DEFAULT_RUN_METRICS) for k in keys
              if fnmatch.fnmatchcase(k, p)][:_MAX_METRICS]
    steps: dict[tuple[str, str], Any] = {}
    last: dict[tuple[str, str, str], Any] = {}
    wanted = set(chosen)
    for p, r, k, value, step in zip(*(summaries.column(c).to_pylist() for c in (
            "project", "run", "key", "last_value", "last_step")), strict=True):
        steps[(p, r)] = step
        if k in wanted:
            last[(p, r, k)] = value
    runs = shown.drop_columns(["started_at"]).to_pylist()
    for r in runs:
        r["last_step"] = steps.get((r["project"], r["run"]))
    runs.sort(key=lambda r: (r["start"] or "", r["project"], r["run"]))
    return total, runs, chosen, last


#: The most runs whose names `_shown_names` passes as parameters (a list of every run
#: would cost more to bind than the join it narrows).
_NAMED_AT_MOST = 1000


def _shown_names(shown: pa.Table) -> tuple[str, dict[str, str]]:
    """A WHERE clause naming the projects and runs of `shown` as parameters, and their
    values; none for more than `_NAMED_AT_MOST` runs."""
    if not 0 < shown.num_rows <= _NAMED_AT_MOST:
        return "", {}
    runs = sorted(set(shown.column("run").to_pylist()))
    projects = sorted(set(shown.column("project").to_pylist()))
    names = {f"shown_run_{i}": r for i, r in enumerate(runs)}
    names.update({f"shown_project_{i}": p for i, p in enumerate(projects)})
    return (f"WHERE run IN ({', '.join(f'$shown_run_{i}' for i in range(len(runs)))}) "
            f"AND project IN ({', '.join(f'$shown_project_{i}' for i in range(len(projects)))})",
            names)


def _cells(run: dict[str, Any], chosen: list[str],
           last: dict[tuple[str, str, str], Any]) -> list[str]:
    return [run["project"], run["run"], run["status"], cell(run["attempts"]),
            cell(run["ranks"]), cell(run["last_step"]), run["start"] or "",
            duration(run["duration"]),
            *(cell(last.get((run["project"], run["run"], k))) for k in chosen)]


def _print_table(root: Path, runs: list[dict[str, Any]], chosen: list[str],
                 last: dict[tuple[str, str, str], Any]) -> None:
    """The table, fitted to the terminal (every column whole when not on one); a line
    names the columns it had no room for."""
    from tracklake._cli.console import literal_console, terminal_width
    from tracklake._cli.fit import hidden_note

    console = literal_console(soft_wrap=False)
    width = terminal_width(console)
    table, hidden = runs_table(root, runs, chosen, last, width)
    console.print(table)
    if hidden and width is not None:
        console.print(hidden_note(hidden, width, "--format tsv lists them"), highlight=False)


def runs_table(root: Path, runs: list[dict[str, Any]], chosen: list[str],
               last: dict[tuple[str, str, str], Any], width: int | None
               ) -> tuple[PlainTable, list[str]]:
    """The run table in `width` cells (None: not a terminal), and the columns left out.

    Most important first: the run id (cut in its middle if it must be, distinct), its
    status, the first metric, the last step, the project when the runs are of several,
    the whole run id, the other metrics, duration, start, then the project, ranks and
    attempts; numbers are never cut."""
    from tracklake._cli.fit import Column, Whole, fitted_table

    rows = [_cells(r, chosen, last) for r in runs]
    columns = [Column(header, [row[i] for row in rows],
                      narrow="shorten" if i in (0, 1) else "never")  # project, run
               for i, header in enumerate((*_COLUMNS, *chosen))]
    project, run, status, attempts, ranks, step, start, took = range(len(_COLUMNS))
    metrics = list(range(len(_COLUMNS), len(columns)))
    several = len({r["project"] for r in runs}) > 1
    claims: list[int | Whole] = [
        run, status, *metrics[:1], step, *([project] if several else []), Whole(run),
        *metrics[1:], took, start, project, ranks, attempts, Whole(project),
        *map(Whole, metrics)]
    return fitted_table(columns, claims, width, title=f"runs in {root}")


def _print_tsv(runs: list[dict[str, Any]], chosen: list[str],
               last: dict[tuple[str, str, str], Any]) -> None:
    """One header line, then one line per run, cells separated by tabs (tabs and line
    breaks inside a cell or a metric key become spaces)."""
    clean = str.maketrans({"\t": " ", "\n": " ", "\r": " "})
    lines = ["\t".join(c.translate(clean) for c in (*_COLUMNS, *chosen))]
    lines.extend("\t".join(c.translate(clean) for c in _cells(r, chosen, last)) for r in runs)
    click.echo("\n".join(lines))


def _print_json(runs: list[dict[str, Any]], chosen: list[str],
                last: dict[tuple[str, str, str], Any]) -> None:
    """One JSON object per run and line, values unformatted (floats in full)."""
    out = []
    for r in runs:
        row = {**r, "metrics": {k: last[(r["project"], r["run"], k)] for k in chosen
                                if (r["project"], r["run"], k) in last}}
        out.append(json.dumps(row, default=str))
    if out:
        click.echo("\n".join(out))
