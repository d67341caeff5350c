"""The TensorBoard destination, read back with TensorBoard's own EventAccumulator: every
point once with its step, tag and wall time; texts, tables, hparams and traces; exactly
once across crashes; the rule for a lost export state; I/O errors as retryable errors."""

from __future__ import annotations

import errno
import gc
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _env import child_env
from _optional import optional
from _records import records_by_kind

import tracklake
from tracklake import ExportError

optional("tensorboard")

from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import (
    SCALARS,
    TENSORS,
    EventAccumulator,
)
from tensorboard.plugins.hparams import metadata as hparams_metadata

from tracklake.exporters import Destination, RunInfo
from tracklake.exporters.tensorboard import destination as tb
from tracklake.exporters.tensorboard.destination import TensorBoardDestination

PROJECT = "proj"
CONFIG = {"lr": 0.001, "model": {"layers": 4, "name": "gpt|2"}, "flag": True, "betas": [0.9,
                                                                                       0.99]}
SPECIAL = [math.nan, math.inf, -math.inf, 0.1, 1e300, -0.0, 123456789.123]


def _make_run(root: Path, run_id: str = "r1", steps: int = 30) -> None:
    """A finished run holding every kind of record."""
    with tracklake.init(project=PROJECT, run_id=run_id, root=root, capture_identity=False,
                        config=CONFIG) as run:
        run.log_text("notes/intro", "# Hello\n\nmarkdown *as logged*, ünïcödé")
        for step in range(steps):
            run.log({"loss": 1.0 / (step + 1), "acc": step / 1000, "special":
                     SPECIAL[step % len(SPECIAL)]}, step=step)
            if step % 10 == 0:
                run.log_generations([{"input": "2+2?", "output": f"a | b\nline {step}",
                                      "score": 0.5, "judge": "ok"},
                                     ("q2", "<b>bold</b>", None)], step=step, key="val")
                with run.span("rollout", turn=step) as span:
                    with run.span("generate"), run.span("tokenize"):
                        pass
                    with pytest.raises(ValueError), run.span("score"):
                        raise ValueError("bad reward")
                    span.outputs = {"answer": 4}
        run.alert("loss spike", "loss went *up*", level="error", step=5)
        run.alert("slow", "step took 10 s", step=5)
        run.log_artifact(b"weights", name="model.bin", media_type="application/octet-stream")
        run.log_text("notes/outro", "done")


def _tables(root: Path, run_id: str = "r1") -> dict[str, pa.Table]:
    """Everything the run holds, per kind, as the loop hands it over (rank, attempt)."""
    return records_by_kind(root, PROJECT, run_id)


def _info(run_id: str = "r1", **changes: Any) -> RunInfo:
    fields: dict[str, Any] = {"project": PROJECT, "run": run_id, "name": "a name",
                              "status": "finished", "attempts": 1, "ranks": (0,), "tags": (),
                              "started_at": "2026-01-02T03:04:05+00:00"}
    fields.update(changes)
    return RunInfo(**fields)


def _send(dest: TensorBoardDestination, info: RunInfo, tables: Mapping[str, pa.Table],
          state: Mapping[str, Any] | None = None, *, commit: bool = True
          ) -> Mapping[str, Any] | None:
    if state is not None:
        dest.open_run(info, state)
    for kind in tracklake.KINDS:
        if kind in tables:
            dest.write(info, kind, tables[kind])
    if not commit:
        return None
    kept: dict[str, Any] = json.loads(json.dumps(dest.commit(info)))  # the loop keeps JSON
    return kept


def _accumulator(path: Path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    return acc


def _f32(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _same(value: float) -> object:
    """A comparable form of a float: NaN equals NaN, -0.0 differs from 0.0."""
    return "nan" if math.isnan(value) else (value, math.copysign(1.0, value))


def _expected_points(metrics: pa.Table) -> Counter[tuple[str, int, float, object]]:
    times = metrics.column("time").cast(pa.int64()).to_pylist()
    return Counter((k, s, t / 1_000_000, _same(_f32(v))) for k, s, t, v in zip(
        metrics.column("key").to_pylist(), metrics.column("step").to_pylist(), times,
        metrics.column("value").to_pylist(), strict=True))


def _points(acc: EventAccumulator) -> Counter[tuple[str, int, float, object]]:
    return Counter((tag, e.step, e.wall_time, _same(e.value))
                   for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))


def _texts(acc: EventAccumulator, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]


def _html(markdown: str) -> str:
    """Markdown as TensorBoard's text plugin renders it (sanitized HTML)."""
    with warnings.catch_warnings():
        # TensorBoard's vendored bleach warns that html5lib's sanitizer is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        from tensorboard import plugin_util
    return str(plugin_util.markdown_to_safe_html(markdown))


def _all_texts(acc: EventAccumulator) -> Counter[tuple[str, int, float, str]]:
    return Counter((tag, e.step, e.wall_time, e.tensor_proto.string_val[0].decode())
                   for tag in acc.PluginTagToContent("text") for e in acc.Tensors(tag))


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "tb"


@pytest.fixture
def tables(root: Path) -> dict[str, pa.Table]:
    _make_run(root)
    return _tables(root)


# -- the protocol and the layout -------------------------------------------------------


def test_satisfies_the_destination_protocol_and_describes_its_absolute_logdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    dest = TensorBoardDestination(logdir="logs")
    assert isinstance(dest, Destination)
    assert TensorBoardDestination.name == "tensorboard"
    assert dest.describe() == f"tensorboard:{tmp_path / 'logs'}"
    (option,) = TensorBoardDestination.cli_options()
    assert option.name == "logdir" and option.required


def test_imports_neither_torch_nor_tensorflow() -> None:
    code = ("import sys, tracklake.exporters.tensorboard.destination; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'tensorboardX') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, env=child_env(), check=True)
    assert out.stdout.strip() == "[]"


def test_one_event_file_per_run_at_a_path_made_from_the_run_id(
        root: Path, logdir: Path, tables: dict[str, pa.Table]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    state = _send(dest, _info(name="same display name"), tables, {})
    assert state is not None
    assert state["file"] == "events.out.tfevents.tracklake.r1"
    path = logdir / PROJECT / "r1" / state["file"]
    assert path.stat().st_size == state["offset"]
    assert os.listdir(logdir / PROJECT) == ["r1"]
    dest.close()


def test_unsafe_run_names_are_refused(logdir: Path) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    with pytest.raises(ExportError) as err:
        dest.open_run(_info(run_id=".."), {})
    assert not err.value.retryable
    assert not logdir.exists()


# -- the mapping --------------------------------------------------------------------------


def test_every_scalar_reaches_tensorboard_once_with_its_tag_step_and_wall_time(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    """Values are TensorBoard's float32 `simple_value`: rounded, NaN and ±inf kept."""
    dest = TensorBoardDestination(logdir=logdir)
    _send(dest, _info(), tables, {})
    dest.close()
    points = _points(_accumulator(logdir / PROJECT / "r1"))
    assert points == _expected_points(tables["metrics"])
    assert sum(points.values()) == 30 * 3
    specials = {p[1]: p[3] for p in points if p[0] == "special"}
    assert specials[0] == "nan" and specials[1] == (math.inf, 1.0)
    assert specials[2] == (-math.inf, -1.0) and specials[5] == (0.0, -1.0)
    assert specials[4] == (math.inf, 1.0)  # 1e300 is beyond float32: documented


def test_texts_configs_generations_alerts_traces_and_artifacts_are_texts(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    info = _info()
    _send(dest, info, tables, {})
    dest.finish_run(info)
    acc = _accumulator(logdir / PROJECT / "r1")

    assert _texts(acc, "notes/intro") == [(0, "# Hello\n\nmarkdown *as logged*, ünïcödé")]
    assert _texts(acc, "notes/outro") == [(29, "done")]

    ((step, config),) = _texts(acc, "config")
    assert step == 0 and "| key | value |" in config
    assert "| model/name | \"gpt\\|2\" |" in config and "| lr | 0.001 |" in config
    content = acc.PluginTagToContent("hparams")[hparams_metadata.SESSION_START_INFO_TAG]
    start = hparams_metadata.parse_session_start_info_plugin_data(content)
    assert start.group_name == "proj/r1"
    assert start.hparams["lr"].number_value == 0.001
    assert start.hparams["model/layers"].number_value == 4
    assert start.hparams["model/name"].string_value == "gpt|2"
    assert start.hparams["flag"].bool_value is True
    assert start.hparams["betas"].string_value == "[0.9, 0.99]"
    end = hparams_metadata.parse_session_end_info_plugin_data(
        acc.PluginTagToContent("hparams")[hparams_metadata.SESSION_END_INFO_TAG])
    assert end.status == 1  # STATUS_SUCCESS

    generations = _texts(acc, "generations/val")
    assert [s for s, _ in generations] == [0, 10, 20]
    table = generations[1][1]
    assert table.splitlines()[0] == "| sample | input | output | score | extra |"
    assert "| 0 | 2+2? | a \\| b<br>line 10 | 0.5 | {\"judge\": \"ok\"} |" in table
    assert "| 1 | q2 | &lt;b&gt;bold&lt;/b&gt; |  |  |" in table
    html = _html(table)
    assert "<table>" in html and "<td>a | b<br>line 10</td>" in html and "<b>bold" not in html

    ((alert_step, alerts),) = _texts(acc, "alerts")
    assert alert_step == 5
    assert "**ERROR**: loss spike\n\nloss went *up*" in alerts
    assert "**WARNING**: slow\n\nstep took 10 s" in alerts

    traces = _texts(acc, "traces/rollout")
    assert [s for s, _ in traces] == [0, 10, 20]
    lines = traces[0][1].splitlines()
    assert lines[0].startswith("**rollout (ok, ") and lines[1] == ""
    assert lines[2].startswith("- generate (ok, ")
    assert lines[3].startswith("    - tokenize (ok, ")
    assert lines[4].startswith("- score (error, ") and lines[4].endswith(
        "ms): ValueError: bad reward")
    assert "<ul>\n<li>generate" in _html(traces[0][1])

    ((_, artifacts),) = _texts(acc, "artifacts")
    digest = tables["artifacts"].column("digest")[0].as_py()
    assert f"| model.bin | {digest} | 7 B | application/octet-stream |" in artifacts

    ((_, status),) = _texts(acc, "tracklake/status")
    assert status == "**finished** · attempts: 1 · ranks: 0"


def test_hparams_are_written_once_per_file(logdir: Path, tables: dict[str, pa.Table]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    info = _info()
    state = _send(dest, info, {"configs": tables["configs"]}, {})
    state = _send(dest, info, {"configs": tables["configs"]}, state)
    assert state is not None and state["hparams"] is True
    acc = _accumulator(logdir / PROJECT / "r1")
    assert len(acc.Tensors(hparams_metadata.SESSION_START_INFO_TAG)) == 1
    assert len(acc.Tensors("config")) == 2
    dest.close()


def test_a_trace_whose_children_were_committed_before_a_restart_is_whole(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    """Child spans end (and are stored) before their root: they are held in the commit
    state until the root comes, even across a restart."""
    traces = tables["traces"].slice(0, 4)  # the first rollout: three children, then root
    assert traces.column("parent_id").to_pylist()[3] is None
    dest = TensorBoardDestination(logdir=logdir)
    state = _send(dest, _info(), {"traces": traces.slice(0, 3)}, {})
    assert state is not None and len(state["held_spans"]) == 3
    del dest
    dest = TensorBoardDestination(logdir=logdir)
    state = _send(dest, _info(), {"traces": traces.slice(3)}, state)
    assert state is not None and state["held_spans"] == []
    ((_, text),) = _texts(_accumulator(logdir / PROJECT / "r1"), "traces/rollout")
    assert "- generate" in text and "    - tokenize" in text and "- score" in text
    dest.close()


def test_spans_whose_root_never_came_are_written_at_finish(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    info = _info(status="crashed")
    _send(dest, info, {"traces": tables["traces"].slice(0, 3)}, {})
    dest.finish_run(info)
    acc = _accumulator(logdir / PROJECT / "r1")
    ((_, generate),) = _texts(acc, "traces/generate")
    assert generate.startswith("**generate (ok, ") and "root span of this trace" in generate
    assert "- tokenize" in generate
    assert [name for name in acc.Tags()["tensors"] if name.startswith("traces/")] == [
        "traces/generate", "traces/score"]


# -- exactly once --------------------------------------------------------------------------


def _halves(tables: Mapping[str, pa.Table]) -> tuple[dict[str, pa.Table], dict[str, pa.Table]]:
    first: dict[str, pa.Table] = {}
    second: dict[str, pa.Table] = {}
    for kind, table in tables.items():
        cut = table.num_rows // 2
        first[kind], second[kind] = table.slice(0, cut), table.slice(cut)
    return first, second


@pytest.mark.parametrize("buffer_bytes", [0, 1 << 20], ids=["written-through", "buffered"])
def test_records_after_the_last_commit_are_cut_off_and_sent_again_once(
        logdir: Path, tables: dict[str, pa.Table], buffer_bytes: int) -> None:
    """Write, commit, write more, crash (the object dropped, nothing closed), reopen with
    the committed state, send the uncommitted records again: each point once."""
    first, second = _halves(tables)
    dest = TensorBoardDestination(logdir=logdir, buffer_bytes=buffer_bytes)
    state = _send(dest, _info(), first, {})
    assert state is not None
    _send(dest, _info(), second, commit=False)
    del dest
    gc.collect()
    path = logdir / PROJECT / "r1" / state["file"]
    if buffer_bytes == 0:
        assert path.stat().st_size > state["offset"]  # uncommitted records in the file
    else:
        assert path.stat().st_size == state["offset"]  # they never left memory

    dest = TensorBoardDestination(logdir=logdir, buffer_bytes=buffer_bytes)
    dest.open_run(_info(), state)
    assert path.stat().st_size == state["offset"]
    _send(dest, _info(), second)
    dest.close()

    acc = _accumulator(path.parent)
    assert _points(acc) == _expected_points(tables["metrics"])
    calm = TensorBoardDestination(logdir=logdir / "calm")  # the same sends, no crash
    _send(calm, _info(), second, _send(calm, _info(), first, {}))
    calm.close()
    assert _all_texts(acc) == _all_texts(_accumulator(logdir / "calm" / PROJECT / "r1"))
    assert sum(_all_texts(acc).values()) > 10


CRASHER = textwrap.dedent("""
    import json, os, sys
    import pyarrow as pa
    from tracklake.exporters import RunInfo
    from tracklake.exporters.tensorboard.destination import TensorBoardDestination

    logdir, metrics = sys.argv[1], pa.ipc.open_file(sys.argv[2]).read_all()
    info = RunInfo("proj", "r1", None, "running", 1, (0,), (), None)
    dest = TensorBoardDestination(logdir=logdir, buffer_bytes=0)
    dest.open_run(info, {})
    dest.write(info, "metrics", metrics.slice(0, 40))
    print(json.dumps(dest.commit(info)), flush=True)
    dest.write(info, "metrics", metrics.slice(40))
    os._exit(9)  # no close, no flush, no atexit
""")


def test_an_exporter_process_that_dies_after_writing_loses_nothing_and_repeats_nothing(
        tmp_path: Path, logdir: Path, tables: dict[str, pa.Table]) -> None:
    metrics = tables["metrics"]
    data = tmp_path / "metrics.arrow"
    with pa.ipc.new_file(data, metrics.schema) as writer:
        writer.write_table(metrics)
    script = tmp_path / "crasher.py"
    script.write_text(CRASHER)
    out = subprocess.run([sys.executable, str(script), str(logdir), str(data)],
                         capture_output=True, text=True, env=child_env())
    assert out.returncode == 9, out.stderr
    state = json.loads(out.stdout)
    path = logdir / PROJECT / "r1" / state["file"]
    assert path.stat().st_size > state["offset"]

    dest = TensorBoardDestination(logdir=logdir)
    _send(dest, _info(), {"metrics": metrics.slice(40)}, state)
    dest.close()
    assert _points(_accumulator(path.parent)) == _expected_points(metrics)


def test_an_empty_state_with_records_in_the_file_starts_a_generation_tensorboard_prefers(
        logdir: Path, tables: dict[str, pa.Table], caplog: pytest.LogCaptureFixture) -> None:
    """The state was lost after a commit: the loop sends the run from its start again,
    into a new file whose SessionLog.START makes TensorBoard drop the older file."""
    dest = TensorBoardDestination(logdir=logdir)
    old = _send(dest, _info(), tables, {})
    dest.close()
    assert old is not None
    run_dir = logdir / PROJECT / "r1"
    before = (run_dir / old["file"]).read_bytes()

    dest = TensorBoardDestination(logdir=logdir)
    with caplog.at_level(logging.WARNING, logger=tb.__name__):
        new = _send(dest, _info(), tables, {})
    dest.close()
    assert new is not None
    assert new["file"] == "events.out.tfevents.tracklake.r1.000001"
    assert old["file"] in caplog.text and new["file"] in caplog.text
    assert (run_dir / old["file"]).read_bytes() == before  # left as it was
    assert sorted(os.listdir(run_dir)) == [old["file"], new["file"]]

    assert _points(_accumulator(run_dir)) == _expected_points(tables["metrics"])
    # The TensorBoard server's Python loader drops texts of the older file too.
    server = plugin_event_accumulator.EventAccumulator(
        str(run_dir), tensor_size_guidance={"scalars": 0, "text": 0, "hparams": 0})
    server.Reload()
    assert Counter({tag: len(server.Tensors(tag)) for tag in server.Tags()["tensors"]}) == {
        "loss": 30, "acc": 30, "special": 30, "notes/intro": 1, "notes/outro": 1,
        "config": 1, hparams_metadata.SESSION_START_INFO_TAG: 1, "generations/val": 3,
        "traces/rollout": 3, "artifacts": 1, "alerts": 1}


def test_an_empty_state_with_a_file_of_no_records_rewrites_it(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    """An export that died before its first commit (or only finished an empty run) left a
    file without records: it is rewritten, not followed by another generation."""
    dest = TensorBoardDestination(logdir=logdir)
    dest.open_run(_info(), {})
    dest.finish_run(_info())  # header and status only, never committed
    dest = TensorBoardDestination(logdir=logdir)
    state = _send(dest, _info(), tables, {})
    dest.close()
    assert state is not None and state["file"] == "events.out.tfevents.tracklake.r1"
    acc = _accumulator(logdir / PROJECT / "r1")
    assert os.listdir(logdir / PROJECT / "r1") == [state["file"]]
    assert _points(acc) == _expected_points(tables["metrics"])
    assert "tracklake/status" not in acc.Tags()["tensors"]


def test_reopening_after_finish_cuts_off_the_status_and_finishes_again(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    """A new attempt reopens a finished run at its last commit: the status written by
    finish_run() goes, and the next finish_run() writes the new one."""
    first, second = _halves(tables)
    dest = TensorBoardDestination(logdir=logdir)
    state = _send(dest, _info(), first, {})
    dest.finish_run(_info())
    _send(dest, _info(attempts=2), second, state)
    dest.finish_run(_info(attempts=2, status="failed"))
    acc = _accumulator(logdir / PROJECT / "r1")
    assert _texts(acc, "tracklake/status") == [(0, "**failed** · attempts: 2 · ranks: 0")]
    assert _points(acc) == _expected_points(tables["metrics"])


# -- errors --------------------------------------------------------------------------------


def test_an_unwritable_logdir_is_a_retryable_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    dest = TensorBoardDestination(logdir=blocker / "tb")
    with pytest.raises(ExportError) as err:
        dest.open_run(_info(), {})
    assert err.value.retryable
    assert str(blocker / "tb") in str(err.value)


def test_a_failed_write_is_retryable_and_a_reopen_resumes_exactly_once(
        logdir: Path, tables: dict[str, pa.Table], monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _halves(tables)
    dest = TensorBoardDestination(logdir=logdir, buffer_bytes=0)
    state = _send(dest, _info(), first, {})
    assert state is not None
    path = logdir / PROJECT / "r1" / state["file"]
    real_write = os.write
    calls = 0

    def full_disk(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:  # part of a record reaches the file, then the disk is full
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tb.os, "write", full_disk)
    with pytest.raises(ExportError) as err:
        dest.write(_info(), "metrics", second["metrics"])
    assert err.value.retryable and str(path) in str(err.value)
    with pytest.raises(ExportError, match="open the run again") as again:
        dest.commit(_info())
    assert again.value.retryable
    monkeypatch.setattr(tb.os, "write", real_write)

    _send(dest, _info(), second, state)  # what the loop does: reopen, send again
    dest.close()
    assert _points(_accumulator(path.parent)) == _expected_points(tables["metrics"])


def test_a_failed_fsync_is_retryable(logdir: Path, tables: dict[str, pa.Table],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    dest.open_run(_info(), {})
    dest.write(_info(), "metrics", tables["metrics"])

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tb.os, "fsync", failing_fsync)
    with pytest.raises(ExportError) as err:
        dest.commit(_info())
    assert err.value.retryable and "events.out.tfevents.tracklake.r1" in str(err.value)
    monkeypatch.undo()
    dest.close()


def test_a_committed_file_that_is_missing_or_shorter_is_not_retried(
        logdir: Path, tables: dict[str, pa.Table]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    state = _send(dest, _info(), tables, {})
    dest.close()
    assert state is not None
    path = logdir / PROJECT / "r1" / state["file"]
    os.truncate(path, state["offset"] - 1)
    with pytest.raises(ExportError, match="shorter than") as short:
        dest.open_run(_info(), state)
    assert not short.value.retryable
    path.unlink()
    with pytest.raises(ExportError, match="missing") as missing:
        dest.open_run(_info(), state)
    assert not missing.value.retryable and str(path) in str(missing.value)


@pytest.mark.parametrize("state", [
    {"file": "../../etc/passwd", "offset": 0},
    {"file": "events.out.tfevents.tracklake.other", "offset": 0},
    {"file": "events.out.tfevents.tracklake.r1", "offset": -1},
    {"file": "events.out.tfevents.tracklake.r1", "offset": True},
    {"offset": 10},
])
def test_a_state_this_exporter_did_not_write_is_refused(logdir: Path,
                                                        state: dict[str, Any]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    with pytest.raises(ExportError, match="not one this exporter wrote") as err:
        dest.open_run(_info(), state)
    assert not err.value.retryable


def test_writing_to_a_run_that_is_not_open_is_a_bug(logdir: Path,
                                                    tables: dict[str, pa.Table]) -> None:
    dest = TensorBoardDestination(logdir=logdir)
    with pytest.raises(RuntimeError, match="open_run"):
        dest.write(_info(), "metrics", tables["metrics"])


@pytest.mark.parametrize("planted", [
    {"omitted_spans": {"a": "many"}}, {"omitted_spans": {"a": [1]}},
    {"attempts": {"0": "2"}}, {"attempts": ["0"]}, {"top_step": "9"}, {"top_step": True},
    {"offset": -1}, {"file": "../../etc/passwd"},
])
def test_a_planted_state_field_of_the_wrong_type_stops_the_export_naming_the_run(
        tmp_path: Path, planted: dict[str, Any]) -> None:
    """Every field of a state is checked before use (before: a wrong `omitted_spans` value
    raised ValueError/TypeError out of the exporter instead of its error)."""
    from tracklake import ExportError
    from tracklake.exporters._protocol import RunInfo
    from tracklake.exporters.tensorboard.destination import _parse_state

    run = RunInfo(project="p", run="r", name=None, status="finished", attempts=1, ranks=(0,),
                  tags=(), started_at=None, config={}, identity={})
    state = {"file": "events.out.tfevents.tracklake.r", "offset": 0, **planted}
    with pytest.raises(ExportError, match="run p/r: the TensorBoard export state"):
        _parse_state(run, state)
