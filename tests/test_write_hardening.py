"""The write path under calls a first week of real use makes: calls with no metric value,
values outside what the columns hold, batches that cannot be built or written, and
finish() racing a logging thread. What log() accepted is stored or counted, never lost."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracklake
import tracklake._format.segment as segment_module
import tracklake._write.batches as batches_module


def _metrics(root: Path, run_id: str) -> list[tuple[int, str, float]]:
    rows = tracklake.query(f"SELECT step, key, value FROM metrics WHERE run = '{run_id}' "
                           "ORDER BY step, key", root=root).to_pylist()
    return [(r["step"], r["key"], r["value"]) for r in rows]


def _count(root: Path, view: str, run_id: str) -> int:
    rows = tracklake.query(f"SELECT count(*) AS n FROM {view} WHERE run = '{run_id}'",
                           root=root).to_pylist()
    return int(rows[0]["n"])


def _status(root: Path, run_id: str) -> str:
    return str(tracklake.find_run(root, run_id).attempts[-1]["status"])


@pytest.mark.parametrize("alone", [{"phase": "eval"}, {}, {"nested": {}}],
                         ids=["only-strings", "empty", "empty-nested"])
def test_a_call_without_metric_values_alone_in_its_flush_never_wedges_the_writer(
        root: Path, alone: dict[str, Any]) -> None:
    """A log() that holds no metric value, flushed on its own, writes nothing for metrics
    and blocks nothing queued behind it: later values are stored and finish() completes."""
    run = tracklake.init(project="p", run_id="wedge", root=root, capture_identity=False)
    run.log({"a": 1.0}, step=0)
    assert run.flush()
    run.log(alone, step=1)
    assert run.flush()
    run.log({"a": 2.0}, step=2)
    report = run.finish()
    assert report.complete and report.dropped_values == 0, report
    assert _metrics(root, "wedge") == [(0, "a", 1.0), (2, "a", 2.0)]
    assert _status(root, "wedge") == "finished"
    assert _count(root, "texts", "wedge") == (1 if alone == {"phase": "eval"} else 0)


class _Huge(Sequence[tuple[str, str, float]]):
    """2**31 generation samples, without the memory: their index does not fit int32."""

    def __len__(self) -> int:
        return 2**31

    def __getitem__(self, index: Any) -> Any:
        return ("q", "a", 1.0)


@pytest.mark.parametrize(("call", "message"), [
    (lambda run: run.log({"x": 1.0}, step=2**63), "step 9223372036854775808"),
    (lambda run: run.log({"x": 1.0}, step=np.uint64(2**64 - 1)), "int64"),
    (lambda run: run.log({"x": 1.0}, step=-(2**63) - 1), "int64"),
    (lambda run: run.log_text("t", "x", step=2**63), "int64"),
    (lambda run: run.log_generations([("q", "a", 1.0)], step=2**64), "int64"),
    (lambda run: run.alert("title", step=2**63), "int64"),
    (lambda run: run.span("rollout", step=2**63), "int64"),
    (lambda run: run.span("rollout", token_ids=[1, 2**70]), r"'rollout': token_ids\[1\]"),
    (lambda run: run.span("rollout", token_ids=[-(2**63) - 1]), "token_ids"),
    (lambda run: run.span("rollout", token_ids=[1.5]), "token_ids"),
    (lambda run: run.log_generations(_Huge()), "int32 sample index"),
], ids=["step-2^63", "step-uint64-max", "step-below-int64", "text-step", "generations-step",
        "alert-step", "span-step", "token-2^70", "token-below-int64", "token-float",
        "sample-index"])
def test_values_outside_their_columns_are_refused_at_the_call(
        root: Path, call: Any, message: str) -> None:
    """A value the column cannot hold raises at the call, naming it; everything logged
    around it is stored and finish() reports a complete run."""
    run = tracklake.init(project="p", run_id="ranges", root=root, capture_identity=False)
    run.log({"x": 0.0}, step=0)
    with pytest.raises((ValueError, TypeError), match=message):
        call(run)
    run.log({"x": 1.0}, step=1)
    assert run.flush()
    report = run.finish()
    assert report.complete and report.dropped_values == report.dropped_records == 0
    assert _metrics(root, "ranges") == [(0, "x", 0.0), (1, "x", 1.0)]


def test_a_token_id_set_on_the_span_is_checked_when_set(root: Path) -> None:
    """`span.token_ids = [...]` inside the block is checked on assignment, so the error is
    raised in the block, not lost when the span ends."""
    run = tracklake.init(project="p", run_id="span-set", root=root, capture_identity=False)
    with run.span("rollout") as span:
        with pytest.raises(ValueError, match="token_ids"):
            span.token_ids = [2**64]
        span.token_ids = np.array([1, 2, 3])
    report = run.finish()
    assert report.complete
    rows = tracklake.query("SELECT token_ids FROM traces", root=root).to_pylist()
    assert rows == [{"token_ids": [1, 2, 3]}]


@pytest.mark.parametrize("rank", [2**31, 2**40])
def test_a_rank_outside_int32_is_refused_at_init(root: Path, rank: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank partition is int32: a larger rank (argument or $RANK) raises at init()."""
    with pytest.raises(ValueError, match="rank"):
        tracklake.init(project="p", run_id="r", root=root, rank=rank, capture_identity=False)
    monkeypatch.setenv("RANK", str(rank))
    with pytest.raises(ValueError, match=f"RANK='{rank}'"):
        tracklake.init(project="p", run_id="r", root=root, capture_identity=False)
    assert not list(root.glob("runs/**/attempt=*.json"))


def test_a_batch_that_cannot_be_built_drops_only_its_call_and_counts_it(
        root: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A fault while building batches (injected for one text and one metric call) loses
    exactly those calls, counted in finish()'s report and said once on stderr; no write
    failure is booked, flush() never raises, and every other record of every kind is
    stored."""
    rows_batch, metric_batch = batches_module.rows_batch, batches_module.metric_batch

    def poisoned_rows(schema: Any, rows: Any) -> Any:
        if any(r.get("text") == "poison" for r in rows):
            raise OverflowError("injected: cannot build")
        return rows_batch(schema, rows)

    def poisoned_metrics(keys: Any, calls: Any) -> Any:
        if any(c[1] == 13 for c in calls):
            raise OverflowError("injected: cannot build")
        return metric_batch(keys, calls)

    monkeypatch.setattr(batches_module, "rows_batch", poisoned_rows)
    monkeypatch.setattr(batches_module, "metric_batch", poisoned_metrics)
    run = tracklake.init(project="p", run_id="build", root=root, capture_identity=False)
    for step in range(20):
        run.log({"a": float(step), "b": 1.0, "c": 2.0}, step=step)
        run.log_text("note", "poison" if step == 7 else f"step {step}", step=step)
        run.log_generations([{"input": "q", "output": "a", "score": 1.0}], step=step)
        if step % 5 == 4:
            assert run.flush()  # never raises, and nothing is left pending
    report = run.finish()
    assert report.dropped_values == 3 and report.dropped_records == 1
    assert report.failed_writes == 0 and report.errors_by_errno == {}
    assert report.complete is False and report.unwritten_records == 0
    assert "injected: cannot build" in (report.last_error or "")
    assert _count(root, "metrics", "build") == 19 * 3
    assert _count(root, "texts", "build") == 19
    assert _count(root, "generations", "build") == 20
    assert _status(root, "build") == "finished"
    err = capfd.readouterr().err
    assert err.count("injected: cannot build") == 2  # said once, and in finish()'s report


def test_a_batch_that_cannot_be_written_for_a_reason_other_than_the_disk_is_dropped_and_counted(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-OSError from appending one batch (injected) drops that batch, counted; it is
    not retried forever, flush() does not raise, and what comes after is written."""
    append = segment_module.SegmentWriter.append
    failed: list[int] = []

    def faulty_append(self: Any, batch: Any) -> None:
        if self.schema.metadata[b"tracklake.kind"] == b"texts" and not failed:
            failed.append(batch.num_rows)
            raise ValueError("injected: cannot serialise")
        append(self, batch)

    monkeypatch.setattr(segment_module.SegmentWriter, "append", faulty_append)
    run = tracklake.init(project="p", run_id="append", root=root, capture_identity=False)
    run.log({"a": 1.0}, step=0)
    run.log_text("t", "lost", step=0)
    run.flush()
    run.log({"a": 2.0}, step=1)
    run.log_text("t", "kept", step=1)
    assert run.flush()
    report = run.finish()
    assert failed == [1]
    assert report.dropped_records == 1 and report.failed_writes == 0
    assert _metrics(root, "append") == [(0, "a", 1.0), (1, "a", 2.0)]
    texts = tracklake.query("SELECT text FROM texts", root=root).column("text").to_pylist()
    assert texts == ["kept"]


@pytest.mark.parametrize("bad", [[1.0, 2.0], None, "loss", 3.0])
def test_log_of_something_not_a_mapping_raises_type_error_naming_it(
        root: Path, bad: Any) -> None:
    run = tracklake.init(project="p", run_id="types", root=root, capture_identity=False)
    with pytest.raises(TypeError, match=f"mapping.*{type(bad).__name__}"):
        run.log(bad)
    assert run.finish().complete


@pytest.mark.slow
def test_finish_racing_a_logging_thread_never_accepts_and_loses_a_value(root: Path) -> None:
    """Over many trials, a thread logs while the main thread finishes: every log() that
    returned is stored, and the calls after it raise RunStateError."""
    accepted_by_run: dict[str, list[int]] = {}
    for trial in range(40):
        run = tracklake.init(project="p", run_id=f"race-{trial}", root=root, fsync=False,
                             capture_identity=False, flush_interval=60)
        accepted: list[int] = []
        started = threading.Event()
        refused: list[BaseException] = []

        def logger(run: tracklake.Run = run, accepted: list[int] = accepted,
                   started: threading.Event = started,
                   refused: list[BaseException] = refused, signal_at: int = trial * 10
                   ) -> None:
            step = 0
            while True:
                try:
                    run.log({"x": float(step)}, step=step)
                except tracklake.RunStateError as exc:
                    refused.append(exc)
                    return
                accepted.append(step)
                if step == signal_at:
                    started.set()
                step += 1

        thread = threading.Thread(target=logger)
        thread.start()
        started.wait()
        report = run.finish(timeout=10)
        thread.join()
        assert refused, "the logging thread was never refused"
        assert report.complete and report.dropped_values == 0, report
        accepted_by_run[f"race-{trial}"] = accepted
    stored: dict[str, list[int]] = {name: [] for name in accepted_by_run}
    for row in tracklake.query("SELECT run, step FROM metrics ORDER BY run, step",
                               root=root).to_pylist():
        stored[row["run"]].append(row["step"])
    lost = {name: len(steps) - len(stored[name]) for name, steps in accepted_by_run.items()
            if stored[name] != steps}
    assert lost == {}, f"accepted, then lost: {lost}"
