"""`tracklake retain`, `pin`, `unpin`, `fsck`, `backup` and `restore`: the store's
lifecycle (docs/lifecycle.md). The command line imports this module when one of them runs."""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path
from typing import Any

import click

from tracklake._cli.names import given_projects, given_runs
from tracklake._cli.progress import OperationProgress, quiet_option
from tracklake._errors import TracklakeError
from tracklake._format.naming import DEFAULT_ROOT, resolve_root

_root_option = click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), default=None,
    help=f"Store directory (default: $TRACKLAKE_ROOT, else ./{DEFAULT_ROOT}).")


def _fail(exc: TracklakeError | click.ClickException) -> None:
    click.echo(f"tracklake: error: {exc}", err=True)
    sys.exit(1)


def _store(root: Path | None) -> Path:
    """The store an operation works on: an error, never an empty answer, for a directory
    that is missing or is no store."""
    from tracklake._read.location import existing_root

    try:
        return existing_root(resolve_root(root))
    except TracklakeError as exc:
        _fail(exc)
        raise  # not reached: _fail exits


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@click.command()
@_root_option
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file with a [retention] section (default: ROOT/tracklake.toml).")
@click.option("--apply", "do_apply", is_flag=True,
              help="Carry the plan out (without it, only print it).")
@click.option("--force", "force", multiple=True, metavar="RUN",
              help="Drop this run's data even if an exporter has not exported it yet or "
                   "no backup holds it (RUN or PROJECT/RUN; repeatable).")
@click.option("--keep-last", type=int, help="Keep the N newest runs of each project.")
@click.option("--max-age", help="Delete runs that ended longer ago than this (e.g. 90d).")
@click.option("--max-size", help="Delete the oldest runs while the store is bigger (500GB).")
@click.option("--best", metavar="'max|min METRIC K'",
              help="Never delete the best K runs of a project by this metric.")
@click.option("--drop-after", help="Drop traces, generations, texts and artifacts of runs "
                                   "that ended longer ago than this; metrics stay.")
@click.option("--drop-kinds", help="Comma-separated kinds --drop-after drops.")
@click.option("--downsample-after", help="Thin the metrics of runs that ended longer ago.")
@click.option("--downsample-every", type=int, help="Keep every K-th step (default 10).")
@click.option("--require-backup", is_flag=True, default=None,
              help="Remove only data a recorded `tracklake backup` holds as it is now.")
@click.option("--log", "show_log", is_flag=True, help="Print the audit log and stop.")
@quiet_option
def retain(root: Path | None, policy_file: Path | None, do_apply: bool, force: tuple[str, ...],
           keep_last: int | None, max_age: str | None, max_size: str | None,
           best: str | None, drop_after: str | None, drop_kinds: str | None,
           downsample_after: str | None, downsample_every: int | None,
           require_backup: bool | None, show_log: bool, quiet: bool) -> None:
    """Apply the retention policy: print the plan (a dry run), or carry it out with
    --apply. Live runs, pinned runs and data not yet exported are never removed."""
    from tracklake._ops import retention as rt
    from tracklake._ops.retention.apply import pending_journals

    try:
        store = _store(root)
        if show_log:
            for record in rt.audit_records(store):
                click.echo(f"{record['at']}  {record['action']:<10} {record['project']}/"
                           f"{record['run']}  {','.join(record['kinds'])}  {record['bytes']:,} "
                           f"bytes  rule={record['rule']}  by {record['user']}@{record['host']}")
            return
        given = {"keep_last": keep_last, "downsample_every": downsample_every,
                 "require_backup": require_backup or None, "max_age": max_age,
                 "max_size": max_size, "best": best, "drop_after": drop_after,
                 "downsample_after": downsample_after,
                 "drop_kinds": drop_kinds and _kinds(drop_kinds)}
        flags = rt.check_fields({k: v for k, v in given.items() if v is not None},
                                lambda key: "--" + key.replace("_", "-"))
        policy = rt.load_policy(store, policy_file).merged(flags)
        if policy.is_empty():
            raise rt.PolicyError(
                f"no retention rule: write a [retention] section in {store / rt.POLICY_FILE}, "
                "pass --policy FILE, or give rules as flags (see --help)")
        now = _dt.datetime.now(_dt.timezone.utc).timestamp()
        plan = rt.make_plan(store, policy, now, force)
        if not (quiet and do_apply):  # a dry run's plan is what was asked for
            _print_plan(plan, do_apply)
        unfinished = len(pending_journals(store))
        if unfinished and not do_apply:
            click.echo(f"note: {unfinished} action(s) of a killed earlier `retain --apply` are "
                       "unfinished; --apply finishes them first")
        if do_apply:
            with OperationProgress("retain", "actions", quiet=quiet) as progress:
                report = rt.apply_plan(store, plan, now, progress=progress)
            for key, why in report.skipped:
                click.echo(f"skipped {key}: {why}", err=quiet)
            if report.resumed and not quiet:
                click.echo(f"finished {report.resumed} action(s) a killed earlier run left")
            if not quiet:
                click.echo(f"applied {len(report.done)} action(s); the audit log "
                           "(`tracklake retain --log`) records each")
    except TracklakeError as exc:
        _fail(exc)


def _kinds(text: str) -> tuple[str, ...]:
    from tracklake._ops.retention.policy import check_drop_kinds

    return check_drop_kinds([k.strip() for k in text.split(",") if k.strip()], "--drop-kinds")


def _print_plan(plan: Any, applying: bool) -> None:
    verb = "plan" if applying else "dry run (nothing changes without --apply)"
    click.echo(f"retention {verb}: store holds {_mb(plan.store_bytes)}")
    for a in plan.actions:
        freed = "thins" if a.verb == "downsample" else "frees"
        click.echo(f"  {a.verb:<10} {a.key:<40} {','.join(a.kinds):<30} {freed} "
                   f"{_mb(a.bytes):>12}  rule={a.rule}: {a.why}"
                   + ("  [forced]" if a.forced else ""))
    for s in plan.skipped:
        rule = f" (rule {s.rule})" if s.rule else ""
        click.echo(f"  skip       {s.project}/{s.run}{rule}: {s.reason}")
    for key, why in plan.kept:
        click.echo(f"  keep       {key}: {why}")
    click.echo(f"{len(plan.actions)} action(s), {_mb(plan.freed)} to free"
               + ("" if applying else "; run again with --apply to carry it out"))


@click.command()
@click.argument("run")
@_root_option
@click.option("--project", callback=given_projects,
              help="Project of the run, if its id exists in several.")
@click.option("--reason", default="", help="Why the run is kept (shown in plans).")
def pin(run: str, root: Path | None, project: str | None, reason: str) -> None:
    """Pin a run: retention never deletes, drops or thins it."""
    from tracklake._ops.retention import pin as do_pin
    from tracklake._read.reader import find_run

    try:
        store = _store(root)
        record = find_run(store, run, project)
        path = do_pin(store, record.project, record.run, reason)
        click.echo(f"pinned {record.project}/{record.run} ({path})")
    except TracklakeError as exc:
        _fail(exc)


@click.command()
@click.argument("run")
@_root_option
@click.option("--project", callback=given_projects,
              help="Project of the run, if its id exists in several.")
def unpin(run: str, root: Path | None, project: str | None) -> None:
    """Remove a run's pin (a `keep` tag given at init still pins it)."""
    from tracklake._ops.retention import unpin as do_unpin
    from tracklake._read.reader import find_run

    try:
        store = _store(root)
        record = find_run(store, run, project)
        if do_unpin(store, record.project, record.run):
            click.echo(f"unpinned {record.project}/{record.run}")
        else:
            click.echo(f"{record.project}/{record.run} was not pinned")
    except TracklakeError as exc:
        _fail(exc)


@click.command()
@_root_option
@click.option("--repair", is_flag=True,
              help="Quarantine damaged files into ROOT/quarantine/ (never deletes) and "
                   "salvage the readable batches of damaged or torn segments.")
@quiet_option
def fsck(root: Path | None, repair: bool, quiet: bool) -> None:
    """Check every segment, part, blob, attempt file and exporter state; exit 0 only when
    the store is clean."""
    from tracklake._ops.fsck import fsck as do_fsck

    try:
        store = _store(root)
        with OperationProgress("fsck", "streams", quiet=quiet) as progress:
            report = do_fsck(store, repair=repair, progress=progress)
    except TracklakeError as exc:
        _fail(exc)
        return
    checked = ", ".join(f"{n} {what}" for what, n in sorted(report.checked.items()))
    if not quiet:
        click.echo(f"checked {checked or 'nothing'} ({_mb(report.bytes)})")
    for problem in report.problems:
        click.echo(problem.line(store))
    if report.clean:
        if not quiet:
            click.echo("clean")
        return
    click.echo(f"{len(report.problems)} problem(s)" + (
        "" if repair else "; `tracklake fsck --repair` quarantines and salvages"))
    sys.exit(1)


_select_options = [
    click.option("--project", "projects", multiple=True, callback=given_projects,
                 help="Only the runs of this project (repeatable)."),
    click.option("--run", "runs", multiple=True, metavar="RUN", callback=given_runs,
                 help="Only this run, RUN or PROJECT/RUN (repeatable)."),
]


def _selected(f: Any) -> Any:
    for option in reversed(_select_options):
        f = option(f)
    return f


def _print_listing(dest: str) -> None:
    from tracklake._ops.backup import read_manifest
    from tracklake._ops.backup.manifest import run_of

    manifest = read_manifest(dest)
    files = manifest["files"]
    click.echo(f"backup {dest}: {len(files)} files, "
               f"{_mb(sum(e['size'] for e in files.values()))}, last backup "
               f"{manifest.get('last_backup', 'never')} from {manifest.get('source')}")
    runs: dict[str, list[int]] = {}
    for rel, entry in files.items():
        key = run_of(rel)
        if key is not None and not rel.startswith(("pins/", "exports/")):
            counts = runs.setdefault(key, [0, 0])
            counts[0] += 1
            counts[1] += entry["size"]
    for key, (n, size) in sorted(runs.items()):
        click.echo(f"  {key}  {n} files  {_mb(size)}")


@click.command()
@click.argument("dest")
@_root_option
@_selected
@click.option("--list", "list_only", is_flag=True,
              help="Show what the backup at DEST holds instead of backing up.")
@click.option("--follow", is_flag=True,
              help="Keep backing up sealed data as it is written until the selected runs "
                   "end (or SIGINT/SIGTERM).")
@click.option("--interval", type=float, default=10.0, show_default=True,
              help="Seconds between passes with --follow.")
@quiet_option
def backup(dest: str, root: Path | None, projects: tuple[str, ...], runs: tuple[str, ...],
           list_only: bool, follow: bool, interval: float, quiet: bool) -> None:
    """Back the store up to DEST, a directory or a URL (s3://BUCKET/PATH, gs://...,
    file://...; S3 endpoint, region and credentials from the AWS_* variables or ~/.aws):
    only files DEST does not hold yet are copied (by sha256), each verified; a killed
    backup resumes. DEST keeps a store's layout."""
    import signal

    from tracklake._ops.backup import Selection
    from tracklake._ops.backup import backup as do_backup
    from tracklake._ops.backup import follow as do_follow

    try:
        if list_only:
            _print_listing(dest)
            return
        store = _store(root)
        selection = Selection.of(projects, runs)
        if follow:
            stop: list[int] = []

            def on_signal(signum: int, frame: object) -> None:
                stop.append(signum)  # the pass under way finishes and saves its manifest

            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            report = do_follow(store, dest, selection=selection, interval=interval,
                               should_stop=lambda: bool(stop),
                               on_pass=(lambda r: None) if quiet else _print_pass,
                               on_error=_print_retry)
        else:
            with OperationProgress("backup", "files", quiet=quiet) as progress:
                report = do_backup(store, dest, selection=selection, progress=progress)
    except TracklakeError as exc:
        _fail(exc)
        return
    if not quiet:
        click.echo(f"backed up {len(report.copied)} new or changed files "
                   f"({_mb(report.bytes_copied)}); {report.unchanged} already there; the "
                   f"selection holds {_mb(report.bytes_total)}")
    if report.unrecorded:
        click.echo(f"warning: {report.unrecorded}", err=True)


def _print_retry(exc: TracklakeError) -> None:
    click.echo(f"tracklake: {exc} (trying again)", err=True)


def _print_pass(report: Any) -> None:
    if report.copied:
        click.echo(f"copied {len(report.copied)} files ({_mb(report.bytes_copied)}); "
                   f"{report.skipped_live} live segment(s) wait until sealed")


@click.command()
@click.argument("src")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Store directory to restore into (created if missing).")
@_selected
@click.option("--policy", is_flag=True,
              help="Also restore the backup's tracklake.toml (retention policy).")
@click.option("--exports", is_flag=True, help="Also restore exporter states.")
@quiet_option
def restore(src: str, root: Path, projects: tuple[str, ...], runs: tuple[str, ...],
            policy: bool, exports: bool, quiet: bool) -> None:
    """Restore the backup at SRC (a directory or URL) into --root: every file is
    verified before any is moved into place, files that are there already are skipped,
    other content at the same path is refused."""
    from tracklake._ops.backup import Selection
    from tracklake._ops.backup import restore as do_restore

    try:
        with OperationProgress("restore", "files", quiet=quiet) as progress:
            report = do_restore(src, root, selection=Selection.of(projects, runs),
                                progress=progress, policy=policy, exports=exports)
    except TracklakeError as exc:
        _fail(exc)
        return
    if not quiet:
        click.echo(f"restored {len(report.copied)} files ({_mb(report.bytes_copied)}); "
                   f"{report.unchanged} were there already")
        if report.skipped:
            click.echo(f"skipped {len(report.skipped)} paths that are not store data "
                       f"(--policy, --exports restore those): {', '.join(report.skipped[:10])}")

