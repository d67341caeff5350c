"""SQL over the store: DuckDB views over compacted Parquet and the live tail, read-only.

Safety: the connection is in-memory and DuckDB has no file access at all
(`enable_external_access = false` with no allowed directory or path, configuration
locked): it reads the compacted parts only through pyarrow datasets registered in it, which
also verify the parts' page checksums. So no statement can write, delete or create a file,
attach a database or load an extension. As a second layer, only SELECT (and EXPLAIN /
DESCRIBE / SUMMARIZE of a SELECT) statements run, checked with DuckDB's own parser.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

import pyarrow as pa

from tracklake._errors import FormatError, NewerFormatError, QueryError
from tracklake._format.bounded import bounded, elsewhere, on_interrupt
from tracklake._format.columns import empty_batch, fixed, strings, table_of
from tracklake._format.part import read_part_table

if TYPE_CHECKING:
    import duckdb
from tracklake._format import KINDS, PARTITION_SCHEMA, SCHEMAS
from tracklake._read import kept_connections
from tracklake._read.attempt_rows import FIRST_OF_RANK, LATEST, attempts_view
from tracklake._read.from_summaries import summaries_sql
from tracklake._read.location import existing_root, is_url, read_root
from tracklake._read.reader import (
    Part,
    ReadProblems,
    add_once,
)
from tracklake._read.readonly import (
    MEMORY_ENV,
    check_read_only,
    lock_down,
    memory_limit,
    parsed_statements,
    question_connection,
    statements_of,
)
from tracklake._read.run_table import run_table
from tracklake._read.runs_rows import RUNS_SELECT
from tracklake._read.scope import EVERYTHING, Scope, scope_of_sql
from tracklake._read.snapshot import (
    STEP_KINDS,
    Snapshot,
    bundles_dataset,
    part_lost,
    parts_dataset,
)

T = TypeVar("T")

def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


#: A run's config is, per rank, its latest attempt's (docs/format.md): the attempt's last
#: value of each key by seq.
_RUN_CONFIGS_VIEW = """
CREATE TEMP VIEW run_configs AS
WITH latest AS (SELECT project, run, rank, max(attempt) AS attempt FROM configs_all
                GROUP BY ALL)
SELECT c.project, c.run, c.rank, c.attempt, c.key, arg_max(c.value, c.seq) AS value
FROM configs_all c JOIN latest l USING (project, run, rank, attempt)
GROUP BY ALL
"""


class _Cutoffs:
    """Per (project, run, rank, attempt): the first step a later attempt logged again."""

    @staticmethod
    def compute(con: duckdb.DuckDBPyConnection, resumed: list[tuple[str, str]]
                ) -> list[tuple[str, str, int, int, int]]:
        """Only the `resumed` runs (those with a metrics stream of a later attempt) can
        have cutoffs: the others cost nothing here."""
        if not resumed:
            return []
        con.register("_resumed", table_of({
            "project": strings([p for p, _ in resumed]),
            "run": strings([r for _, r in resumed])}))
        rows = con.execute("""
            WITH firsts AS (
              SELECT project, run, rank, attempt, min(first_step) AS first_step
              FROM metric_summaries_all SEMI JOIN _resumed USING (project, run)
              GROUP BY ALL)
            SELECT a.project, a.run, a.rank, a.attempt, min(b.first_step)
            FROM firsts a JOIN firsts b ON a.project = b.project AND a.run = b.run
                 AND a.rank = b.rank AND b.attempt > a.attempt
            GROUP BY ALL""").fetchall()
        con.unregister("_resumed")
        return [tuple(r) for r in rows]


def _superseded_filter(cutoffs: Iterable[tuple[str, str, int, int, int]]) -> str:
    """Hides rows at or after each cutoff step; a row without a step is at none of them
    (`step >= cut` is NULL for it, which NOT would turn into hiding it)."""
    terms = [f"(project = {_sql_str(p)} AND run = {_sql_str(r)} AND rank = {rank} AND "
             f"attempt = {att} AND step >= {cut})" for p, r, rank, att, cut in cutoffs]
    return f" WHERE NOT coalesce({' OR '.join(terms)}, false)" if terms else ""


def connect(root: str | os.PathLike[str] | None = None, *,
            threads: int | None = None,
            problems: ReadProblems | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only DuckDB connection with tracklake's views over the store at `root` (a
    directory, or a pyarrow file system URL such as ``s3://bucket/store``).

    Views: runs, run_attempts, metrics, configs, run_configs, texts, generations, traces,
    artifacts, events, metric_summaries; `<kind>_all` include the steps superseded by a later
    attempt. Run statements through `tracklake.query()` to keep them read-only. Files
    found damaged are left out and noted in `problems` (a `RuntimeWarning` without it).
    """
    found = ReadProblems() if problems is None else problems
    root_path = existing_root(root)
    con = bounded(lambda: _connect(root_path, threads, found, frozenset(), EVERYTHING,
                                    own=True), root_path)
    if problems is None:
        _warn(found)
    return con


def _warn(problems: ReadProblems) -> None:
    import warnings

    for path, why in problems.damaged:
        warnings.warn(f"{path}: {why}", RuntimeWarning, stacklevel=3)


def _connect(root_path: Path, threads: int | None, problems: ReadProblems,
             skip: frozenset[Path], scope: Scope, trust_catalog: bool = True,
             own: bool = False) -> duckdb.DuckDBPyConnection:
    """The views of `scope` (those of the kinds it does not reach are not created), on a
    database of its `own`, or on a connection to the process's (`question_connection`)."""
    import duckdb  # imported on use: `import tracklake` stays light for training processes

    snap = Snapshot(root_path, problems, skip, scope, trust_catalog)
    behind = _Behind([(str(p.path), p.first_seq, p.last_seq)
                      for k in KINDS for p in snap.parts[k]],
                     [str(b.path) for b in snap.bundles])
    wholes = _run_tables(snap, scope, problems) if not own else {}
    keep = _keep_key(root_path, snap, scope, wholes) if not threads else None
    tables = tuple(wholes[k] for k in snap.kinds) if keep is not None else ()
    if keep is not None and (con := kept_connections.take(keep, tables)) is not None:
        _BEHIND[con] = behind  # its views read these very tables
        return con
    # a connection handed to the caller (`connect`) has a database of its own
    con = duckdb.connect(":memory:") if own else question_connection()
    try:
        _make_views(con, root_path, snap, scope, threads, own, behind, wholes,
                    copied=keep is not None)
    except BaseException:
        _BEHIND.pop(con, None)
        con.close()
        raise
    if keep is not None:
        kept_connections.lend(keep, con, tables)
    return con


def _run_tables(snap: Snapshot, scope: Scope, problems: ReadProblems
                ) -> dict[str, pa.Table]:
    """For a question about one run: its parts of each kind read whole (`run_table`),
    for the kinds with no live rows whose parts are small enough."""
    if scope.run is None:
        return {}
    wholes = {}
    for kind in snap.kinds:
        if snap.parts[kind] and not snap.live[kind].num_rows:
            whole = run_table(kind, snap.parts[kind], problems)
            if whole is not None:
                wholes[kind] = whole
    return wholes


def _keep_key(root_path: Path, snap: Snapshot, scope: Scope, wholes: dict[str, pa.Table]
              ) -> tuple[object, ...] | None:
    """What a connection whose views read `wholes` alone is kept for
    (`kept_connections`); None if its views would read anything else (live rows,
    attempt files, summaries)."""
    if scope.attempts or not snap.kinds or any(k not in wholes for k in snap.kinds) or \
            _summaries_needed(snap, scope):
        return None
    return (str(root_path), scope.project, scope.run, scope.runs, snap.kinds,
            memory_limit())


def _summaries_needed(snap: Snapshot, scope: Scope) -> bool:
    """The summary views: asked for, or for the cutoffs of resumed runs (`_Cutoffs`)."""
    return "metrics" in snap.kinds and (scope.summaries or bool(snap.resumed))


def _make_views(con: duckdb.DuckDBPyConnection, root_path: Path, snap: Snapshot,
                scope: Scope, threads: int | None, own: bool, behind: _Behind,
                wholes: dict[str, pa.Table], copied: bool) -> None:
    """The views of `snap` on `con`; a kind in `wholes` reads that table (registered, or
    `copied` into a table of the connection's own, which DuckDB scans faster)."""
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if own:  # the caller's connection may ask `query(connection=...)` what is behind it
        con.register("_tracklake_parts", table_of(
            {"path": strings([p for p, _, _ in behind.parts]),
             "first_seq": fixed([f for _, f, _ in behind.parts], pa.int64()),
             "last_seq": fixed([la for _, _, la in behind.parts], pa.int64())}))
        con.register("_tracklake_bundles", table_of(
            {"path": strings(behind.bundles)}))
    else:
        _BEHIND[con] = behind
    summaries = _summaries_needed(snap, scope)
    # a question of the summaries alone, no run resumed: no view reads the values (each
    # statement costs about a millisecond)
    values = scope.metric_values or bool(snap.resumed)
    for kind in snap.kinds:
        cols = ", ".join(f'"{n}"' for n in [*SCHEMAS[kind].names, *PARTITION_SCHEMA.names])
        parts = snap.parts[kind]
        live = bool(snap.live[kind].num_rows) or not parts
        if kind == "metrics" and not values:
            if snap.live[kind].num_rows:  # for metric_summaries_all
                con.register(f"_live_{kind}", snap.live[kind])
            continue
        if live:  # (metric_summaries_all reads it only if it has rows: then `live`)
            con.register(f"_live_{kind}", snap.live[kind])
        sources = [f"SELECT {cols} FROM _live_{kind}"] if live else []
        whole = wholes.get(kind)
        if whole is not None and copied:
            con.register("_whole", whole)
            con.execute(f"CREATE TEMP TABLE {kind}_all AS SELECT * FROM _whole")
            con.unregister("_whole")
            continue
        if whole is not None:  # one small run's parts, read whole (`run_table`)
            con.register(f"{kind}_all", whole)
            continue
        if parts:
            con.register(f"_parts_{kind}", parts_dataset(root_path, kind, parts))
            sources.insert(0, f"SELECT {cols} FROM _parts_{kind}")
        if kind == "metrics" and snap.bundles:
            con.register("_bundles_metrics", bundles_dataset(snap.bundles))
            sources.insert(0, f"SELECT {cols} FROM _bundles_metrics")
        con.execute(f"CREATE TEMP VIEW {kind}_all AS {' UNION ALL '.join(sources)}")
    if "metrics" in snap.kinds:
        _summary_views(con, snap, summaries, values)
    else:
        _step_views(con, snap.kinds, "")
    if scope.attempts and snap.runs is not None:  # the runs view alone, its rows made
        con.register("_runs", snap.runs)
        con.execute("CREATE TEMP VIEW runs AS SELECT * FROM _runs")
    elif scope.attempts:
        now = _dt.datetime.now(_dt.timezone.utc).timestamp()
        con.register("_attempts", attempts_view(snap.attempts, now))
        con.execute("CREATE TEMP VIEW run_attempts AS SELECT * EXCLUDE "
                    f"({LATEST}, {FIRST_OF_RANK}) FROM _attempts")
        con.execute(f"CREATE TEMP VIEW runs AS {RUNS_SELECT}")
    if own:
        lock_down(con)


def _step_views(con: duckdb.DuckDBPyConnection, kinds: tuple[str, ...], where: str) -> None:
    for kind in kinds:
        con.execute(f"CREATE TEMP VIEW {kind} AS SELECT * FROM {kind}_all"
                    + (where if kind in STEP_KINDS else ""))


def _summary_views(con: duckdb.DuckDBPyConnection, snap: Snapshot, summaries: bool,
                   values: bool = True) -> None:
    """metric_summaries(_all) if `summaries` (each statement costs a question about
    a millisecond), and the default views of `snap`'s kinds without the steps a later
    attempt logged again (not `metrics` unless `values`)."""
    cutoffs: list[tuple[str, str, int, int, int]] = []
    if summaries:
        con.register("_summaries_parts", snap.summaries)
        live = """
            UNION ALL
            SELECT project, run, rank, attempt, key, count(*), min(value), max(value),
                   min(step), max(step), arg_max(value, (step, seq)), max(seq),
                   epoch_us(arg_max(time, (step, seq)))
            FROM _live_metrics GROUP BY ALL""" if snap.live["metrics"].num_rows else ""
        con.execute(f"CREATE TEMP VIEW metric_summaries_all AS SELECT * FROM "
                    f"_summaries_parts{live}")
        cutoffs = _Cutoffs.compute(con, snap.resumed)
    _step_views(con, snap.kinds if values else tuple(k for k in snap.kinds if k != "metrics"),
                _superseded_filter(cutoffs))
    if "configs" in snap.kinds:
        con.execute(_RUN_CONFIGS_VIEW)
    if not summaries:
        return
    summary_cols = "key, count(*) AS count, min(value) AS min, max(value) AS max, " \
                   "min(step) AS first_step, max(step) AS last_step, " \
                   "arg_max(value, (step, seq)) AS last_value"
    if cutoffs:
        # resumed runs: summarise their visible rows; the others come from the summaries
        runs_cut = " OR ".join(f"(project = {_sql_str(p)} AND run = {_sql_str(r)})"
                               for p, r, *_ in cutoffs)
        con.execute(f"""
            CREATE TEMP VIEW metric_summaries AS
            SELECT project, run, rank, key, CAST(sum(count) AS BIGINT) AS count, min(min) AS min,
                   max(max) AS max, min(first_step) AS first_step,
                   max(last_step) AS last_step,
                   arg_max(last_value, (last_step, attempt, last_seq)) AS last_value
            FROM metric_summaries_all WHERE NOT ({runs_cut}) GROUP BY ALL
            UNION ALL
            SELECT project, run, rank, {summary_cols}
            FROM metrics WHERE {runs_cut} GROUP BY ALL""")
    else:
        con.execute("""
            CREATE TEMP VIEW metric_summaries AS
            SELECT project, run, rank, key, CAST(sum(count) AS BIGINT) AS count, min(min) AS min,
                   max(max) AS max, min(first_step) AS first_step,
                   max(last_step) AS last_step,
                   arg_max(last_value, (last_step, attempt, last_seq)) AS last_value
            FROM metric_summaries_all GROUP BY ALL""")


def query(sql: str, *, root: str | os.PathLike[str] | None = None,
          params: list[Any] | dict[str, Any] | None = None,
          connection: duckdb.DuckDBPyConnection | None = None,
          problems: ReadProblems | None = None, timeout: float | None = None) -> pa.Table:
    """Run a read-only SQL query over the store and return an Arrow table.

    A query runs within a memory limit (`readonly.memory_limit`); with `timeout`, one
    still running after that many seconds is stopped and raises QueryError.

    A file found damaged is left out of the answer and noted in `problems` (a
    `RuntimeWarning` without it); with a `connection` of the caller's, a query that hits a
    damaged part raises `QueryError` naming it.

    Without a `connection`, a question over `metrics` that the summaries answer is asked
    of `metric_summaries` (`from_summaries`); a caller's connection is asked `sql` as
    written (it may hold no such view).
    """
    check_read_only(sql)
    if connection is not None:
        try:
            return _execute(connection, sql, params, timeout)
        except QueryError as exc:
            if not _may_be_damage(exc):
                raise
            if _drop_damaged_bundles(connection):
                raise QueryError(f"{exc}; a damaged bundle (a derived copy) was deleted: "
                                 "ask again") from exc
            damaged = _damaged_parts(connection)
            if not damaged:
                raise
            names = "; ".join(f"{path}: {why}" for path, why in damaged)
            raise QueryError(f"{exc}; damaged: {names}") from exc
    found = ReadProblems() if problems is None else problems
    sql, scope = _asked(sql, params)
    table = with_connection(root, found, lambda con: _execute(con, sql, params, timeout),
                            scope)
    if problems is None:
        _warn(found)
    return table


def _asked(sql: str, params: Any) -> tuple[str, Scope]:
    """What is asked for `sql` (`from_summaries`: of the summaries, if they answer it)
    and what it reaches of the store (the one run or project `sql` is narrowed to, if
    any: the summaries' answer is the same)."""
    scope = scope_of_sql(sql, params)
    summarised = summaries_sql(sql)
    if summarised is None:
        return sql, scope
    return summarised, scope_of_sql(summarised, params).for_run(scope.project, scope.run)


def with_connection(root: str | os.PathLike[str] | None, problems: ReadProblems,
                    work: Callable[[duckdb.DuckDBPyConnection], T],
                    scope: Scope = EVERYTHING) -> T:
    """`work(connection)` over what `scope` reaches of the store; if it names a view
    outside `scope`, again over everything; if it fails on a part whose pages are damaged,
    again without that part (noted in `problems`). A file system that gives no answer
    for `read_timeout()` seconds ends it with `NoAnswerError` naming what it was asked."""
    root_path = read_root(root)
    # the root's check in the question's own bounded call (a call costs 0.08 ms)
    return bounded(lambda: _with_connection(existing_root(root_path), problems, work, scope),
                   root_path)


def _with_connection(root_path: Path, problems: ReadProblems,
                     work: Callable[[duckdb.DuckDBPyConnection], T], scope: Scope) -> T:
    import duckdb

    skip: frozenset[Path] = frozenset()
    relisted = 0
    while True:
        try:
            # after a file went missing, the run catalog is not trusted (it is rewritten)
            con = _connect(root_path, None, problems, skip, scope, trust_catalog=not relisted)
        except FileNotFoundError:
            relisted += 1
            if relisted > _RELISTS:
                raise
            time.sleep(_RELIST_PAUSE * relisted)  # let a merge in progress end
            continue  # a part was merged away since the listing: the merged part holds it
        answered = False
        try:
            result = work(con)
            answered = True
            return result
        except QueryError as exc:
            if isinstance(exc.__cause__, duckdb.CatalogException) and not scope.everything:
                scope = EVERYTHING  # a view the SQL's table names did not show
                continue
            if not _may_be_damage(exc):
                raise
            if _parts_gone(con) and relisted < _RELISTS:
                relisted += 1
                time.sleep(_RELIST_PAUSE * relisted)
                continue  # merged away (or pruned) while the query ran: list again
            if bad_bundles := _drop_damaged_bundles(con):
                # a derived copy: the parts it copied answer instead (with anything to
                # skip, a connection reads no bundle, even one it could not delete)
                skip = skip | set(bad_bundles)
                continue
            damaged = _damaged_parts(con)
            if not damaged:
                if _parts_gone(con) and relisted < _RELISTS:
                    relisted += 1  # gone since `_parts_gone` was asked above
                    time.sleep(_RELIST_PAUSE * relisted)
                    continue
                raise
            for item in damaged:
                add_once(problems.damaged, item)
            skip = skip | {path for path, _ in damaged}
        finally:
            _BEHIND.pop(con, None)
            if not kept_connections.give_back(con, answered):
                con.close()


#: How often a query lists the store again because compaction merged parts under it,
#: pausing this many seconds times the number of the retry before each.
_RELISTS = 8
_RELIST_PAUSE = 0.05


class _Behind(NamedTuple):
    """The files a connection's views read: parts (path, first seq, last seq), bundles."""

    parts: list[tuple[str, int, int]]
    bundles: list[str]


#: What is behind each question's connection while it is open (a connection handed to
#: the caller has it as tables instead: registering them costs a question 0.7 ms).
_BEHIND: dict[duckdb.DuckDBPyConnection, _Behind] = {}


def _behind(con: duckdb.DuckDBPyConnection) -> _Behind:
    """The files behind `con` (none for a connection tracklake did not make)."""
    import duckdb

    if con in _BEHIND:
        return _BEHIND[con]
    try:
        parts = con.execute("SELECT path, first_seq, last_seq FROM _tracklake_parts"
                            ).fetchall()
        bundles = con.execute("SELECT path FROM _tracklake_bundles").fetchall()
    except duckdb.Error:
        return _Behind([], [])  # not a tracklake connection
    return _Behind([tuple(row) for row in parts], [path for (path,) in bundles])


def _parts_gone(con: duckdb.DuckDBPyConnection) -> bool:
    """True if a part behind `con` no longer exists (compaction merged it into another)."""
    behind = _behind(con)
    return any(not os.path.exists(path)
               for path in [*(p for p, _, _ in behind.parts), *behind.bundles])


def _may_be_damage(exc: QueryError) -> bool:
    """True if DuckDB failed while reading data (a pyarrow scan raising surfaces as invalid
    input or I/O), not on the SQL itself (parser, binder, catalog, conversion errors):
    only then are the parts read in full to look for damage."""
    import duckdb

    return isinstance(exc.__cause__, (duckdb.InvalidInputException, duckdb.IOException))


def _drop_damaged_bundles(con: duckdb.DuckDBPyConnection) -> list[Path]:
    """Delete the bundles behind `con` whose pages do not verify (read in full: only
    after a failure), as far as the store lets this reader; returns them."""
    damaged = []
    for path in _behind(con).bundles:
        try:
            read_part_table(Path(path))
        except FileNotFoundError:
            continue
        except FormatError:
            with contextlib.suppress(OSError):  # a read-only store: skipped, not deleted
                os.unlink(path)
            damaged.append(Path(path))
    return damaged


def _damaged_parts(con: duckdb.DuckDBPyConnection) -> list[tuple[Path, str]]:
    """The parts behind `con` whose pages do not verify (read in full: only after a failure)."""
    damaged = []
    for path, first, last in _behind(con).parts:
        part = Part(first, last, -1, read_root(path) if is_url(path) else Path(path))
        try:
            read_part_table(part.path)
        except FileNotFoundError:
            continue  # merged or pruned away since the question failed: not damage
        except NewerFormatError:
            raise
        except FormatError as exc:
            damaged.append((part.path, part_lost(exc, part)))
    return damaged


def first_rows_sql(sql: str, rows: int) -> str | None:
    """`sql` asking for at most `rows` rows, if it is one SELECT (so that showing the first
    rows of a huge answer does not build all of it); None otherwise."""
    import duckdb

    try:
        statements = statements_of(sql)
    except duckdb.Error:
        return None
    if len(statements) != 1 or statements[0][0] != "SELECT":
        return None
    return f"SELECT * FROM ({statements[0][1]}) LIMIT {int(rows)}"


_running: set[duckdb.DuckDBPyConnection] = set()  # connections executing a statement
_running_lock = threading.Lock()


def interrupt_queries() -> None:
    """Stop every query running in this process now (from a signal handler: Ctrl-C); each
    raises QueryError saying it was interrupted."""
    with _running_lock:
        for con in list(_running):
            con.interrupt()


on_interrupt(interrupt_queries)  # a bounded read interrupted stops its query too


def stream_query(sql: str, write: Callable[[pa.RecordBatch], None],
                 restart: Callable[[], bool], *, root: str | os.PathLike[str] | None = None,
                 params: list[Any] | dict[str, Any] | None = None,
                 problems: ReadProblems | None = None, timeout: float | None = None,
                 batch_rows: int = 65536) -> int:
    """`query`, with its answer given to `write` one record batch at a time as DuckDB
    makes it (memory holds a batch, not the answer); the rows written.

    Asking again (a part merged away under the query, a damaged part left out) calls
    `restart()` first if anything was written: it starts the output over and returns
    True, or returns False when it cannot (then QueryError says the store changed
    while the answer was written)."""
    check_read_only(sql)
    sql, scope = _asked(sql, params)
    found = ReadProblems() if problems is None else problems
    written = 0
    started = False  # something was given to `write`

    def deliver(relation: duckdb.DuckDBPyRelation) -> int:
        nonlocal written, started
        import duckdb

        if started:
            with elsewhere():
                restarted = restart()
            if not restarted:
                raise QueryError(f"the store changed while the answer was written ({written} "
                                 "rows were): ask again")
            written, started = 0, False
        reader = relation.to_arrow_reader(batch_rows) if hasattr(
            relation, "to_arrow_reader") else relation.fetch_arrow_reader(batch_rows)
        batches = 0
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                if not batches:  # no rows: the columns still reach the output
                    started = True
                    with elsewhere():  # a pipe's reader may keep it waiting
                        write(empty_batch(reader.schema))
                return written
            except (OSError, pa.ArrowException) as exc:  # DuckDB's error through Arrow
                text = str(exc)
                kind = duckdb.InterruptException if "INTERRUPT" in text else \
                    duckdb.OutOfMemoryException if "Out of Memory" in text else \
                    duckdb.InvalidInputException
                raise kind(text) from exc
            started = True
            with elsewhere():
                write(batch)
            batches += 1
            written += batch.num_rows

    rows = with_connection(root, found,
                           lambda con: _execute(con, sql, params, timeout, deliver), scope)
    if problems is None:
        _warn(found)
    return rows


@overload
def _execute(con: duckdb.DuckDBPyConnection, sql: str,
             params: list[Any] | dict[str, Any] | None,
             timeout: float | None = None, deliver: None = None) -> pa.Table: ...


@overload
def _execute(con: duckdb.DuckDBPyConnection, sql: str,
             params: list[Any] | dict[str, Any] | None,
             timeout: float | None, deliver: Callable[[duckdb.DuckDBPyRelation], int]) -> int: ...


def _execute(con: duckdb.DuckDBPyConnection, sql: str,
             params: list[Any] | dict[str, Any] | None,
             timeout: float | None = None,
             deliver: Callable[[duckdb.DuckDBPyRelation], int] | None = None
             ) -> pa.Table | int:
    """The answer of the last statement of `sql` as a table, or what `deliver(relation)`
    makes of it."""
    import duckdb

    timer = None
    if timeout is not None:
        timer = threading.Timer(timeout, con.interrupt)
        timer.daemon = True
        timer.start()
    with _running_lock:
        _running.add(con)
    try:
        # parsed once for the question (`check_read_only`), not again by the connection:
        # 0.1 to 0.3 ms of a question about one run (benchmarks/statement_cost.py)
        statements = parsed_statements(sql)
        for statement in statements[:-1]:
            con.execute(statement, params).fetchall()  # run to completion before the next
        relation = con.sql(statements[-1], params=params)
        if relation is None:
            return table_of({}) if deliver is None else 0
        return relation.to_arrow_table() if deliver is None else deliver(relation)
    except duckdb.InterruptException as exc:
        if timer is not None and not timer.is_alive():
            raise QueryError(f"query stopped after {timeout:g} s (its timeout)") from exc
        raise QueryError("query interrupted") from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryError(f"query needs more memory than the {memory_limit()} a query may "
                         f"use (set {MEMORY_ENV} to allow more): {exc}") from exc
    except duckdb.Error as exc:
        raise QueryError(f"query failed: {exc}") from exc
    finally:
        if timer is not None:
            timer.cancel()
        with _running_lock:
            _running.discard(con)
