"""The shared export loop: select runs, read after the cursor, send, commit, retry, follow.

Per run: load the committed state (cursor, destination state, held aggregates); read the
records after the cursor; hand them to the destination a kind at a time in tables of up
to `batch_rows`; after each send, ask the destination to `commit()` and save the cursor
together with what it returned, atomically. On a retryable `ExportError` the exporter
waits (exponential backoff with jitter) and starts the run again from the last commit,
after `open_run()` with the committed state — so a crash or an outage at any point
neither skips nor repeats what reaches the destination.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tracklake import ExportError, NoAnswerError
from tracklake.exporters._loop.options import (
    ExportOptions,
    ExportProgress,
    ExportSummary,
    RunOutcome,
)
from tracklake.exporters._loop.pacing import Pacer, Unchanged
from tracklake.exporters._loop.ranks import (
    AGGREGATES,
    Aggregator,
    check_mode,
    ranks_to_read,
    with_rank,
)
from tracklake.exporters._loop.select import Selection, select_runs
from tracklake.exporters._loop.state import (
    ExportState,
    destination_dir,
    forget_state,
    load_state,
    now_iso,
)
from tracklake.exporters._loop.watched import WatchedProcess
from tracklake.exporters._protocol import Destination, ExportContext, RunInfo
from tracklake.files import write_atomic
from tracklake.read import (
    KINDS,
    TERMINAL_STATUSES,
    AttemptCutoffs,
    Cursor,
    ReadProblems,
    StreamId,
    positions_past_end,
    read_run,
    resolve_root,
)


def _stderr(message: str) -> None:
    print(f"tracklake export: {message}", file=sys.stderr, flush=True)


#: While a run keeps failing with the same error, it is reported at least this often (s).
RETRY_REPORT_INTERVAL = 30.0


class Exporter:
    """Exports the selected runs of one store to one destination."""

    def __init__(self, destination: Destination, *, root: str | Path | None = None,
                 selection: Selection, options: ExportOptions | None = None,
                 log: Callable[[str], None] = _stderr,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Callable[[ExportProgress], None] | None = None) -> None:
        self.destination = destination
        self.progress = progress
        self._place = (0, 0)  # the run being exported: its place in the pass, and of how many
        self.root = resolve_root(root)
        self.selection = selection
        self.options = options or ExportOptions()
        check_mode(self.options.ranks)
        self.log = log
        self.sleep = sleep
        self.clock = clock
        self.description = destination.describe()
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        if self.options.state_dir is None and not getattr(destination, "keeps_state", True):
            # where it stands matters while it runs only (the console prints every run
            # from its start each time): kept outside the store, removed at the end
            self._scratch = tempfile.TemporaryDirectory(prefix="tracklake-export-")
        self.state_dir = self.options.state_dir or (
            Path(self._scratch.name) if self._scratch is not None
            else destination_dir(self.root, destination.name, self.description))
        if self.options.state_dir is None and self._scratch is None:
            for directory in (self.root / "exports", self.state_dir):
                if directory.is_symlink():  # planted: the state is kept in the store
                    raise ExportError(
                        f"{directory} is a symbolic link; an exporter's state in the "
                        "store is never read or written through one. Remove it, or give "
                        "--state-dir", retryable=False)
        self.summary = ExportSummary(self.description)
        self._cursor_checked: dict[str, set[str]] = {}  # per run, stream keys checked
        self._started_over: set[str] = set()  # runs whose state --from-start forgot
        self._held_checked: set[str] = set()  # runs the destination was seen to hold
        self._cutoffs: dict[str, AttemptCutoffs] = {}  # per run: where attempts are superseded
        interval = self.options.commit_interval
        self.commit_interval = float(destination.commit_interval if interval is None
                                     else interval)
        self._writer = (WatchedProcess(self.options.while_pid)
                        if self.options.follow and self.options.while_pid is not None else None)
        #: passes over the selected runs so far (following: at most one per poll, however
        #: many file events came in between)
        self.passes = 0
        #: runs read in those passes, and runs skipped because nothing changed since their
        #: last delivery: what a followed export costs is in `reads`
        self.reads = 0
        self.skipped = 0
        self.pacer: Pacer | None = None  # while following: when passes start, events seen
        self._stall_reported = -math.inf  # when a store that gave no answer was reported
        destination.start(ExportContext(root=self.root, ranks=self.options.ranks))
        self._write_destination_record()

    def _write_destination_record(self) -> None:
        record = {"name": self.destination.name, "description": self.description}
        path = self.state_dir / "destination.json"
        if not path.exists():
            write_atomic(path, json.dumps(record).encode())

    # -- the top level -----------------------------------------------------------------

    def run(self) -> ExportSummary:
        """Export once, or (with options.follow) keep following until the selected runs
        are finished (for ``--run``) or until interrupted."""
        if self.selection.is_empty():
            raise ValueError("select runs to export: a project, run ids, tags, since, or all")
        opts = self.options
        self.pacer = pacer = Pacer(self.root, poll_interval=opts.poll_interval, gap=opts.pass_gap,
                      log=self.log) if opts.follow else None
        unchanged = Unchanged(self.root, opts.kinds)
        done: dict[str, int] = {}  # run key -> attempts when it was finished and exported
        delivered: dict[str, float] = {}  # run key -> when it was last delivered (following)
        if pacer is not None:
            pacer.start()
        try:
            while True:
                last_pass = self._writer_gone()  # nothing more will be written: drain, stop
                try:
                    runs = select_runs(self.root, self.selection)
                except NoAnswerError as exc:
                    if pacer is None:
                        raise
                    self._report_stall(exc)  # a hung mount: look again at the next pass
                    pacer.wait()
                    continue
                self.passes += 1
                for place, info in enumerate(runs, 1):
                    self._place = (place, len(runs))
                    if done.get(info.key) == info.attempts:
                        continue  # finished and fully exported; a new attempt reopens it
                    if (opts.follow and not last_pass
                            and info.status not in TERMINAL_STATUSES
                            and self.clock() - delivered.get(info.key, -math.inf)
                            < self.commit_interval):
                        continue  # not yet: a destination whose commits are costly
                    try:
                        look = unchanged.look(info) if opts.follow else None
                    except NoAnswerError:
                        look = None  # read it: its export reports the stall
                    if unchanged.since_delivered(info, look):
                        self.skipped += 1
                        continue  # nothing written since its last delivery
                    delivered[info.key] = self.clock()
                    self.reads += 1
                    outcome = self.export_run(info)
                    if outcome.error:
                        unchanged.forget(info)
                    else:
                        unchanged.delivered(info, look)
                    if outcome.finished and not outcome.error:
                        done[info.key] = info.attempts
                if pacer is None:
                    break
                if self.selection.runs and all(done.get(f"{i.project}/{i.run}") == i.attempts
                                               for i in runs) and len(runs) >= len(
                                                   set(self.selection.runs)):
                    break  # every run asked for is finished and exported
                if last_pass:
                    self.summary.abandoned = [i.key for i in runs
                                              if done.get(i.key) != i.attempts]
                    break
                pacer.wait()
        finally:
            if pacer is not None:
                pacer.stop()
            if self._scratch is not None:  # a destination that keeps no state
                self._scratch.cleanup()
        return self.summary

    def _report_stall(self, exc: NoAnswerError) -> None:
        """Say that the store gave no answer, at most every `RETRY_REPORT_INTERVAL`."""
        now = self.clock()
        if now - self._stall_reported >= RETRY_REPORT_INTERVAL:
            self._stall_reported = now
            self.log(f"{exc}; trying again at the next pass")

    def _writer_gone(self) -> bool:
        """True once the process given as `while_pid` has exited."""
        return self._writer is not None and not self._writer.alive()

    # -- one run -------------------------------------------------------------------------

    def export_run(self, info: RunInfo) -> RunOutcome:
        """Deliver what is new of one run, retrying what can be retried."""
        outcome = self.summary.runs.setdefault(info.key, RunOutcome(info.key))
        started = self.clock()
        delay = self.options.retry_initial
        reported: dict[str, float] = {}  # error message -> when it was last reported
        attempt = 0
        if self.options.from_start and info.key not in self._started_over:
            self._started_over.add(info.key)
            forget_state(self.state_dir, info.project, info.run)
        while True:
            try:
                state = load_state(self.state_dir, info.project, info.run)
                if state.positions_mode_differs(self.options.ranks):
                    raise ExportError(
                        f"run {info.key} was exported to {self.description} with --ranks "
                        f"{state.ranks}; export it with the same rank mode (or to another "
                        "destination)", retryable=False)
                self._check_cursor(info, state)
                sent = self._deliver(info, state)
                outcome.records += sent
                outcome.finished = state.finished
                outcome.error = None
                if attempt:
                    self.log(f"{info.key}: delivered after {attempt} retries")
                return outcome
            except (ExportError, NoAnswerError) as raised:
                if isinstance(raised, NoAnswerError):  # the store's mount hangs: wait for it
                    exc = ExportError(f"{raised}; the export waits for the store",
                                      retryable=True)
                else:
                    exc = raised
                    self._record_error(info, exc)  # (a store that does not answer: not)
                outcome.error = str(exc)
                now = self.clock()
                waited = now - started
                give_up = (None if self.options.follow and not self._writer_gone()
                           else self.options.give_up_after)
                if not exc.retryable or (give_up is not None and waited >= give_up):
                    self.log(f"{info.key}: {exc}" + ("" if not exc.retryable else
                             f" (gave up after {waited:.0f} s of retries)"))
                    return outcome
                attempt += 1
                pause = delay * random.uniform(0.5, 1.5)
                if now - reported.get(str(exc), -math.inf) >= RETRY_REPORT_INTERVAL:
                    reported[str(exc)] = now
                    self.log(f"{info.key}: {exc}; " + _retry_plan(attempt, pause, waited,
                                                                   give_up))
                self.sleep(pause)
                delay = min(delay * 2, self.options.retry_max)

    def _check_cursor(self, info: RunInfo, state: ExportState) -> None:
        """Refuse a state whose cursor is past what the store holds (once per stream and
        process): it would skip records never delivered."""
        checked = self._cursor_checked.setdefault(info.key, set())
        past, looked = positions_past_end(self.root, state.cursor, frozenset(checked))
        if past:
            key, position, last = past[0]
            raise ExportError(
                f"exporter state {state.path} says stream {key} of run {info.key} was "
                f"delivered up to seq {position}, but the store holds it only up to seq "
                f"{last}: this exporter did not write that state (planted, or restored "
                "from another store), or fsck --repair quarantined records it had "
                "delivered. Nothing of the run was exported now. Pass --from-start to "
                "export the run again from its start.", retryable=False)
        checked.update(looked)

    def _check_still_held(self, info: RunInfo, state: ExportState) -> None:
        """With nothing new to send, refuse (once per run and process) a run the
        destination no longer holds though its state says it was delivered: its files
        deleted, its file system not mounted."""
        missing = getattr(self.destination, "missing", None)
        if missing is None or not state.records or info.key in self._held_checked:
            return
        why = missing(info, state.destination)
        if why is None:
            self._held_checked.add(info.key)
            return
        raise ExportError(f"{why}; if its file system is not mounted, mount it and export "
                          "again; to export the run again from its start, pass "
                          "--from-start", retryable=False)

    def _record_error(self, info: RunInfo, exc: ExportError) -> None:
        try:
            state = load_state(self.state_dir, info.project, info.run)
        except ExportError:
            return  # a corrupt state file stays as it is, for the user to look at
        state.last_error = str(exc)
        state.last_error_at = now_iso()
        state.save()

    def _deliver(self, info: RunInfo, state: ExportState) -> int:
        opts = self.options
        cursor = copy.deepcopy(state.cursor)
        # what a later attempt logged again is left out, as the default views leave it
        cutoffs = self._cutoffs.setdefault(info.key, AttemptCutoffs(info.project, info.run))
        cutoffs.update(self.root, self.summary.problems)
        aggregator = Aggregator(opts.ranks, copy.deepcopy(state.held)) \
            if opts.ranks in AGGREGATES else None
        if aggregator is not None:
            aggregator.drop_superseded(cutoffs)
        batches: Iterator[tuple[StreamId, pa.RecordBatch]] = (
            _rank_by_rank(self.root, cursor, opts.kinds, info.ranks, self.summary.problems)
            if opts.ranks == "all" else read_run(
                self.root, cursor, kinds=opts.kinds, ranks=ranks_to_read(opts.ranks),
                problems=self.summary.problems))
        first = next(batches, None)
        terminal = info.status in TERMINAL_STATUSES
        if first is None and not (aggregator and aggregator.held and terminal):
            self._check_still_held(info, state)
            if terminal and not state.finished:
                self.destination.open_run(info, state.destination)
                state.destination = dict(self.destination.commit(info))  # what it held back
                state.save()
                self.destination.finish_run(info)
                state.finished = True
                state.save()
            self._report(info, state, 0, delivered=True)
            return 0
        self.destination.open_run(info, state.destination)
        pending: dict[str, list[pa.Table]] = {}
        rows = sent = 0

        def send_and_commit() -> None:
            nonlocal rows, sent
            for kind in KINDS:
                tables = pending.pop(kind, [])
                if tables:
                    table = pa.concat_tables(tables)
                    self.destination.write(info, kind, table)
                    sent += table.num_rows
                    newest = table.column("time").cast(pa.int64())
                    state.last_time_us = max(state.last_time_us or 0,
                                             int(max(newest.to_pylist())))
            state.destination = dict(self.destination.commit(info))
            state.cursor = copy.deepcopy(cursor)
            state.ranks = opts.ranks
            if aggregator is not None:
                state.held = copy.deepcopy(aggregator.held)
            state.records += rows
            state.last_success = now_iso()
            state.last_error = None
            state.save()
            rows = 0
            self._report(info, state, sent, delivered=False)

        pending_batches = [first] if first is not None else []
        for stream, read in _chain(pending_batches, batches):
            batch = cutoffs.visible(stream, read)
            if batch.num_rows == 0:
                continue
            if aggregator is not None and stream.kind == "metrics":
                aggregator.add(stream, batch)
                ready = aggregator.ready(info.ranks, everything=False)
                if ready is not None:
                    pending.setdefault("metrics", []).append(ready)
                    rows += ready.num_rows
            else:
                table = with_rank(stream, batch, opts.ranks)
                if table is not None:
                    pending.setdefault(stream.kind, []).append(table)
                    rows += table.num_rows
            if rows >= opts.batch_rows:
                send_and_commit()
        if aggregator is not None:
            rest = aggregator.ready(info.ranks, everything=terminal)
            if rest is not None:
                pending.setdefault("metrics", []).append(rest)
                rows += rest.num_rows
        ending = getattr(self.destination, "ending", None)
        if terminal and ending is not None:
            ending(info)  # everything of the run is read: the next commit is its last
        send_and_commit()
        if terminal:
            self.destination.finish_run(info)
            state.finished = True
            state.save()
        self._report(info, state, sent, delivered=True)
        if sent and self.progress is None:  # else the progress display says it
            self.log(f"{info.key}: {sent} records to {self.description}"
                     + (" (run finished)" if terminal else ""))
        return sent

    def _report(self, info: RunInfo, state: ExportState, sent: int, *,
                delivered: bool) -> None:
        if self.progress is not None:
            self.progress(ExportProgress(
                run=info.key, index=self._place[0], runs=self._place[1],
                records=state.records, sent=sent, delivered=delivered,
                newest_us=state.last_time_us, finished=state.finished,
                following=self.options.follow))


def _retry_plan(attempt: int, pause: float, waited: float, give_up: float | None) -> str:
    """What the loop does next about a retryable error, in words."""
    plan = f"retry {attempt} in {pause:.0f} s"
    if give_up is None:
        return plan + " (retrying until it succeeds: --follow)"
    return plan + f", giving up in {max(give_up - waited, 0):.0f} s (--give-up-after)"


def _rank_by_rank(root: Path, cursor: Cursor, kinds: tuple[str, ...], ranks: tuple[int, ...],
                  problems: ReadProblems) -> Iterator[tuple[StreamId, pa.RecordBatch]]:
    """The batches of every rank, taken next from the rank whose metrics reached the lowest
    step so far, so that what a commit holds spans the same steps of every rank (``--ranks
    all``: a destination that takes only increasing steps need not hold a whole rank back
    until the others come); a rank not listed in `ranks` comes last."""
    readers = {r: read_run(root, cursor, kinds=kinds, ranks=(r,), problems=problems)
               for r in ranks}
    queue = [(-1, r) for r in ranks]
    heapq.heapify(queue)
    while queue:
        reach, rank = heapq.heappop(queue)
        item = next(readers[rank], None)
        if item is None:
            continue
        stream, batch = item
        top = pc.max(batch.column("step")).as_py() if stream.kind == "metrics" else None
        if top is not None:
            reach = max(reach, top)
        heapq.heappush(queue, (reach, rank))
        yield item
    yield from read_run(root, cursor, kinds=kinds, problems=problems)  # ranks since listed


def _chain(first: list[tuple[StreamId, pa.RecordBatch]],
           rest: Iterator[tuple[StreamId, pa.RecordBatch]]
           ) -> Iterator[tuple[StreamId, pa.RecordBatch]]:
    yield from first
    yield from rest


def export(destination: Destination, *, root: str | Path | None = None,
           selection: Selection, options: ExportOptions | None = None,
           log: Callable[[str], None] = _stderr,
           progress: Callable[[ExportProgress], None] | None = None) -> ExportSummary:
    """Export the selected runs of the store at `root` to `destination`; `progress` is
    told where the export is after every commit (see `ExportProgress`)."""
    try:
        return Exporter(destination, root=root, selection=selection, options=options,
                        log=log, progress=progress).run()
    finally:
        destination.close()
