"""The `tracklake` command line."""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import importlib
import importlib.abc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracklake._cli.names import given_projects, stored_projects, stored_runs
from tracklake._cli.progress import quiet_option
from tracklake._errors import QueryError, TracklakeError
from tracklake._format.naming import resolve_root

if TYPE_CHECKING:
    from tracklake._read.reader import ReadProblems
    from tracklake._read.watch import Step

F = TypeVar("F", bound=Callable[..., Any])

root_option = click.option(
    "--root", type=click.Path(file_okay=False), default=None,
    help="Store directory, or a pyarrow file system URL to read (s3://bucket/store) "
         "(default: $TRACKLAKE_ROOT, else ./tracklake-store).")
#: --root of a command that writes the store: a directory, never a URL (read-only)
write_root_option = click.option(
    "--root", type=click.Path(file_okay=False), default=None,
    help="Store directory (default: $TRACKLAKE_ROOT, else ./tracklake-store).")


#: How every error of the command line starts (the exit code says which kind it was).
ERROR_PREFIX = "tracklake: error:"


class CliError(click.ClickException):
    """An error shown as `tracklake: error: ...`, exit code 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"{ERROR_PREFIX} {self.format_message()}", err=True)


class CliUsageError(click.UsageError):
    """A usage error: the command's usage line, then `tracklake: error: ...`, exit code 2."""

    def show(self, file: Any = None) -> None:
        if self.ctx is not None:
            click.echo(self.ctx.get_usage(), err=True)
            click.echo(f"Try '{self.ctx.command_path} {self.ctx.help_option_names[0]}' for "
                       "help.", err=True)
        click.echo(f"{ERROR_PREFIX} {self.format_message()}", err=True)


#: Subcommands imported only when invoked (or listed by `--help`): a question such as
#: `tracklake runs` does not pay for the modules of export, pack, lifecycle and pictures.
_LAZY_COMMANDS = {
    "export": "tracklake._cli.export:export_group",
    "pack": "tracklake._cli.pack:pack", "unpack": "tracklake._cli.pack:unpack",
    **{name: f"tracklake._cli.lifecycle:{name}"
       for name in ("retain", "pin", "unpin", "fsck", "backup", "restore")},
    "plot": "tracklake._cli.plot:plot", "report": "tracklake._cli.report:report",
    "ui": "tracklake._cli.ui:ui", "ship": "tracklake._cli.ship:ship",
}


class _Main(click.Group):
    """The `tracklake` group: every error of every subcommand in one form; the commands
    of `_LAZY_COMMANDS` are imported on first use (click's lazily loaded subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _one_form():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _ends_on_interrupt(), _one_form():
            return super().invoke(ctx)


@contextlib.contextmanager
def _ends_on_interrupt() -> Iterator[None]:
    """Ctrl-C ends any command with one line and exit status 130, as `export` does: no
    traceback, and no click "Aborted!". An error raised because of it (DuckDB's "query
    interrupted", say) counts as the interruption. What a command writes goes under a
    temporary name and is renamed into place whole, so nothing half-written is left."""
    import signal
    import threading

    seen: list[bool] = []
    previous = signal.getsignal(signal.SIGINT)
    if (previous is not signal.default_int_handler
            or threading.current_thread() is not threading.main_thread()):
        yield  # not ours to change (a host program's handler, a test's thread)
        return

    def on_sigint(signum: int, frame: Any) -> None:
        seen.append(True)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        _interrupted()
    except Exception:
        if seen:
            _interrupted()
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted() -> None:
    click.echo("tracklake: interrupted; what was complete before is kept, nothing "
               "half-written is left", err=True)
    sys.exit(130)


@contextlib.contextmanager
def _one_form() -> Iterator[None]:
    try:
        yield
    except (CliError, CliUsageError):
        raise
    except click.UsageError as exc:
        raise CliUsageError(exc.format_message(), exc.ctx) from exc
    except click.ClickException as exc:
        if exc.exit_code != CliError.exit_code:
            raise
        raise CliError(exc.format_message()) from exc
    except OSError as exc:
        from tracklake._format.files import NotRegularFileError

        if isinstance(exc, NotRegularFileError):  # a link or FIFO planted in the store
            raise CliError(exc.strerror or str(exc)) from exc
        if exc.errno not in _STORAGE_ERRNOS:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        raise CliError(f"{where}{exc.strerror or exc}; free some space (or fix the file "
                       "system) and run the command again") from exc


#: Failures of the storage itself, said in one line rather than a traceback.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def _friendly(func: F) -> F:
    """Turn tracklake errors into a message and exit code 1 instead of a traceback."""
    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TracklakeError as exc:
            raise CliError(str(exc)) from exc
    return wrapper  # type: ignore[return-value]


def _refuse_url(root: str | os.PathLike[str] | None, command: str) -> None:
    """A command that writes the store refuses a URL root (those are read-only) at once."""
    from tracklake._read.location import is_url

    given = root if root is not None else os.environ.get("TRACKLAKE_ROOT")
    if given and is_url(str(given)):
        raise CliError(f"{command} writes the store, and {given} is a URL, read-only to "
                       "tracklake: give a directory")


def _store(root: str | os.PathLike[str] | None) -> Path:
    """The store to read: a directory, or a pyarrow file system URL (read-only)."""
    from tracklake._read.location import existing_root

    try:
        return existing_root(root)
    except TracklakeError as exc:
        raise CliError(f"{exc} (`tracklake demo` creates one)") from exc


def warn_problems(problems: ReadProblems) -> None:
    """Tell on stderr which files were left out of what was shown, and what that loses."""
    for path, why in problems.damaged:
        click.echo(f"tracklake: warning: {path}: {why}", err=True)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracklake")
def main() -> None:
    """tracklake: a local-first event store for ML training runs."""


@main.command()
@root_option
@click.option("--project", callback=stored_projects, help="Only runs of this project.")
@click.option("--metric", "metrics", multiple=True,
              help="Metric key (or glob) whose last value is shown; repeatable.")
@click.option("--limit", type=click.IntRange(min=1),
              help="Show the newest N runs [default: 50 for the table, all for tsv/json].")
@click.option("--all", "all_runs", is_flag=True, help="Show every run.")
@click.option("--format", "fmt", type=click.Choice(["table", "tsv", "json"]),
              default="table", show_default=True,
              help="A table for people; tab-separated or JSON lines for scripts.")
@_friendly
def runs(root: Path | None, project: str | None, metrics: tuple[str, ...],
         limit: int | None, all_runs: bool, fmt: str) -> None:
    """List runs, newest last: status, attempts, ranks, last step, start, duration, last
    metrics. The table shows the newest 50 and says how many older runs it hides."""
    from tracklake._cli.run_list import print_runs
    from tracklake._read.reader import ReadProblems

    if all_runs and limit is not None:
        raise click.UsageError("--all and --limit exclude each other")
    problems = ReadProblems()
    print_runs(_store(root), project, metrics, problems, limit=0 if all_runs else limit,
               fmt=fmt)
    warn_problems(problems)


@main.command()
@click.argument("run")
@root_option
@click.option("--project", callback=given_projects,
              help="Project of the run, if its id exists in several.")
@click.option("--key", "keys", multiple=True, metavar="GLOB",
              help="Only the metric keys matching this glob (repeatable).")
@click.option("--max-keys", type=click.IntRange(min=0), default=200, show_default=True,
              help="Metric keys listed at most (0: every one).")
@_friendly
def show(run: str, root: Path | None, project: str | None, keys: tuple[str, ...],
         max_keys: int) -> None:
    """Show one run: identity, attempts, ranks, records and metric summaries."""
    from tracklake._cli.present import print_run
    from tracklake._read.reader import ReadProblems

    problems = ReadProblems()
    print_run(_store(root), run, project, problems, keys, max_keys)
    warn_problems(problems)


@main.command()
@click.argument("run_a")
@click.argument("run_b")
@root_option
@click.option("--section", type=click.Choice(["config", "env", "packages", "git", "all"]),
              default="all", show_default=True)
@_friendly
def diff(run_a: str, run_b: str, root: Path | None, section: str) -> None:
    """Differences between two runs: config, environment, packages, git."""
    from tracklake._cli.present import print_diff

    print_diff(_store(root), run_a, run_b, section)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of a closed pipe
    raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@main.command()
@click.argument("statement")
@root_option
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]),
              default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the result to this file (required for parquet).")
@click.option("--max-rows", type=click.IntRange(min=0), default=100, show_default=True,
              help="Rows shown as a table (0: every row).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop the query if it runs longer than this.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="The value of $NAME in the statement, as text (repeat for each).")
@_friendly
def sql(statement: str, root: Path | None, fmt: str, output: Path | None, max_rows: int,
        timeout: float | None, params: tuple[str, ...]) -> None:
    """Run a read-only SQL query over the store (views: runs, metrics, configs, texts,
    generations, traces, artifacts, events, metric_summaries). A query may use a quarter
    of the machine's memory ($TRACKLAKE_SQL_MEMORY_LIMIT); Ctrl-C stops it at once.
    `--param p=demo --param r=run1` gives `$p` and `$r` (a report's SQL); parameters the
    statement does not name are ignored."""
    import signal

    from tracklake._cli.present import check_output_outside, write_table
    from tracklake._cli.sql_output import AnswerWriter
    from tracklake._cli.sql_params import sql_params
    from tracklake._read.query import first_rows_sql, interrupt_queries, query, stream_query
    from tracklake._read.reader import ReadProblems

    problems = ReadProblems()
    interrupted = False
    store = _store(root)

    def on_sigint(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        interrupt_queries()

    if fmt == "parquet" and output is None:
        raise click.UsageError("--format parquet needs --output FILE")
    values = sql_params(statement, params) or None
    check_output_outside(output, store)
    # a table shows the first rows only: ask for no more than that (plus one, to tell);
    # other formats are written batch by batch as the query makes them
    shown = first_rows_sql(statement, max_rows + 1) if fmt == "table" and max_rows else None
    answer = None
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        if fmt != "table":
            answer = AnswerWriter(fmt, output)
        if answer is None:
            table = query(shown or statement, root=store, params=values,
                          problems=problems, timeout=timeout)
        else:
            stream_query(statement, answer.write, answer.restart, root=store,
                         params=values, problems=problems, timeout=timeout)
            answer.finish()
    except QueryError:
        if answer is not None:
            answer.abort()
        if interrupted:
            click.echo("tracklake: query interrupted", err=True)
            sys.exit(130)
        raise
    except BrokenPipeError:  # the reader of stdout went away (`| head`): not an error
        _quiet_stdout()
        return
    except OSError as exc:
        if answer is not None:
            answer.abort()
        raise CliError(f"cannot write {output or 'the answer'}: {exc.strerror or exc}"
                       ) from exc
    except BaseException:
        if answer is not None:
            answer.abort()
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        click.echo("tracklake: query interrupted", err=True)
        sys.exit(130)
    warn_problems(problems)
    if answer is not None:
        if fmt == "parquet":
            click.echo(f"wrote {answer.rows} rows to {output}")
        return
    try:
        write_table(table, output, max_rows or table.num_rows, counted=shown is None)
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc.strerror or exc}") from exc


def _until(epoch: float) -> str:
    """A local wall-clock time, to the second (at most a grace period away)."""
    import datetime as dt

    try:
        return dt.datetime.fromtimestamp(epoch).strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a holder dated past year 9999
        return "a time no clock reaches"


@main.command()
@write_root_option
@click.option("--project", callback=stored_projects)
@click.option("--run", callback=stored_runs)
@click.option("--dry-run", is_flag=True, help="Only list what would be compacted.")
@quiet_option
@_friendly
def compact(root: Path | None, project: str | None, run: str | None, dry_run: bool,
            quiet: bool) -> None:
    """Compact sealed segments into zstd Parquet (safe while runs are being written)."""
    from tracklake._cli.progress import OperationProgress
    from tracklake._ops.compact import compact as do_compact

    _refuse_url(root, "compact")
    store = _store(root)
    with OperationProgress("compact", "streams", quiet=quiet) as progress:
        report = do_compact(root=store, project=project, run=run, dry_run=dry_run,
                            progress=progress)
    verb = "would compact" if dry_run else "compacted"
    if not quiet:
        click.echo(f"{verb} {len(report.segments_removed)} segments, {report.records} "
                   f"records: {report.bytes_before:,} bytes" +
                   ("" if dry_run else f" -> {report.bytes_after:,} bytes in "
                    f"{len(report.parts_written)} parts"))
        if report.parts_removed or report.parts_kept:
            kept = f"; {len(report.parts_kept)} kept for plain engines " \
                   f"until {_until(max(u for _, u in report.parts_kept))}" \
                if report.parts_kept else ""
            click.echo(f"replaced parts: {len(report.parts_removed)} "
                       f"{'to delete' if dry_run else 'deleted'}{kept} "
                       "(TRACKLAKE_PART_GRACE, docs/format.md)")
        for path, nbytes in report.torn:
            click.echo(f"note: {path}: dropped a torn tail of {nbytes} bytes (a writer "
                       "stopped mid-batch)", err=True)
    for path, why in report.skipped:
        click.echo(f"warning: {path}: {why}; left in place (not compacted)", err=True)
    bundles = report.bundles
    if bundles is not None:
        if not quiet and (bundles.written or bundles.removed):
            click.echo(f"bundled {bundles.runs} small runs, {bundles.values} values, into "
                       f"{len(bundles.written)} bundles ({bundles.bytes:,} bytes, derived: "
                       f"ROOT/.cache/bundles); {len(bundles.removed)} outdated removed")
        if bundles.refused:
            click.echo(f"warning: small runs not bundled: {bundles.refused}", err=True)
        for rel in bundles.damaged:
            click.echo(f"warning: {store / rel}: its pages do not verify; its run is read "
                       "from its files, not bundled (tracklake fsck explains and repairs)",
                       err=True)


@main.command()
@click.argument("run")
@root_option
@click.option("--project", callback=given_projects)
@click.option("--keys", default="*", show_default=True,
              help="Glob of the metric and text keys to print.")
@click.option("--rank", default=0, show_default=True, type=int)
@click.option("--interval", default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--once", is_flag=True, help="Print what is there and stop.")
@click.option("--plot", "plot_key", metavar="KEY",
              help="Instead, redraw a chart of this metric key (or glob) as the run grows.")
@click.option("--ascii", "ascii_only", is_flag=True, help="With --plot: ASCII only.")
@_friendly
def watch(run: str, root: Path | None, project: str | None, keys: str, rank: int,
          interval: float, once: bool, plot_key: str | None, ascii_only: bool) -> None:
    """Follow a live run, printing new steps (metrics and texts) as they are written,
    and how the run ended."""
    from tracklake._read.reader import ReadProblems
    from tracklake._read.watch import follow

    if plot_key is not None:
        from tracklake._cli.plot import watch_command

        watch_command(_store(root), run, project, plot_key, rank, interval, once, ascii_only)
        return
    problems = ReadProblems()
    ended = follow(_store(root), run, project, rank=rank,
                   emit=lambda step: _echo_step(step, keys), interval=interval, once=once,
                   problems=problems)
    warn_problems(problems)
    if ended is not None:
        states = ", ".join(f"rank {r}: {s}" for r, s in sorted(ended.statuses.items()))
        click.echo(f"run {ended.project}/{ended.run} ended ({states})")
    elif once:
        click.echo(f"run {run} is still running (--once: stopped here)")



def _echo_step(step: Step, pattern: str) -> None:
    """One line for the metrics of a step (keys matching `pattern`), one per text."""
    chosen = [(k, v) for k, v in step.values.items() if fnmatch.fnmatchcase(k, pattern)]
    label = f"step:{step.step}" if step.step is not None else "step:-"
    if chosen:
        click.echo(" - ".join([label, *(f"{k}:{v:.4g}" for k, v in chosen)]))
    for key, text in step.texts:
        if fnmatch.fnmatchcase(key, pattern):
            click.echo(f"{label} - {key}: {text}")


@main.command()
@write_root_option
@click.option("--ranks", default=4, show_default=True)
@click.option("--steps", default=2000, show_default=True)
@click.option("--project", default="demo", show_default=True)
@click.option("--export", "export_to", metavar="[DEST]", is_flag=False,
              flag_value="tensorboard", default=None,
              help="Then export the run to DEST: tensorboard when no name is given; mlflow, "
                   "wandb, swanlab or any installed exporter.")
@click.option("--export-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where --export writes (default: beside the store, ROOT-DEST).")
@_friendly
def demo(root: Path | None, ranks: int, steps: int, project: str, export_to: str | None,
         export_dir: Path | None) -> None:
    """Simulate an RL job (several rank processes), compact it and query it; optionally
    export it to TensorBoard, MLflow, W&B, ... on this machine."""
    from tracklake._cli.demo import new_run_id, run_demo

    _refuse_url(root, "demo")
    store = resolve_root(root)
    plan = None
    if export_to is not None:
        from tracklake._cli.demo_export import plan_export

        plan = plan_export(export_to, store, export_dir)  # a bad name fails before the job
    elif export_dir is not None:
        raise click.UsageError("--export-dir needs --export [DEST]")
    started = time.monotonic()
    run_id = new_run_id()
    click.echo(run_demo(store, ranks=ranks, steps=steps, project=project, run_id=run_id))
    if plan is not None:
        click.echo(plan.run(store, project=project, run_id=run_id))
    click.echo(f"demo finished in {time.monotonic() - started:.1f} s; store at {store}")


def _json_default(value: Any) -> Any:
    return str(value)


def dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, indent=1)


#: Commands that only read the store and print. pyarrow imports pandas, whenever it is
#: installed, on first use of many of its functions (0.15-0.5 s, a third of what
#: `tracklake runs` takes on a large store); tracklake never uses pandas, so these
#: commands' processes do without it.
_WITHOUT_PANDAS = frozenset({"runs", "show", "diff", "sql", "watch", "plot", "report"})


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import hook under which `import pandas` fails as if it were not installed;
    pyarrow then works as it does without pandas."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r} (not loaded by "
                                      "tracklake's read-only commands)", name=name)


def run() -> None:
    """The `tracklake` program: its console script and `python -m tracklake._cli`."""
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in _WITHOUT_PANDAS and "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas())
    try:
        main()
    except KeyboardInterrupt:  # before a command ran, or once it returned
        _interrupted()


if __name__ == "__main__":
    run()
