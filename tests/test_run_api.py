"""The Run API: lifecycle, steps, texts, generations, spans, alerts, artifacts, the
ExperimentLogger methods and the verl `Tracking` drop-in."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tracklake
from tracklake import RunStateError


def _init(root: Path, **kw: Any) -> tracklake.Run:
    kw.setdefault("capture_identity", False)
    kw.setdefault("project", "api")
    return tracklake.init(root=root, **kw)


def _rows(root: Path, sql: str) -> list[dict[str, Any]]:
    return tracklake.query(sql, root=root).to_pylist()


# -- lifecycle ----------------------------------------------------------------------------

def test_context_manager_finishes_the_run_as_finished(root: Path) -> None:
    with _init(root, run_id="ok") as run:
        run.log({"x": 1.0})
        assert not run.finished
    assert run.finished
    assert _rows(root, "select run, status from runs") == [{"run": "ok", "status": "finished"}]
    attempt = json.loads((root / "runs" / "project=api" / "run=ok" / "rank=0" /
                          "attempt=1.json").read_bytes())
    assert attempt["status"] == "finished" and attempt["finished_at"]
    assert attempt["write_report"]["complete"] is True


def test_context_manager_marks_the_run_failed_on_exception_and_reraises(root: Path) -> None:
    with pytest.raises(RuntimeError, match="diverged"), _init(root, run_id="bad") as run:
        run.log({"loss": float("nan")})
        raise RuntimeError("loss diverged")
    assert run.finished
    assert _rows(root, "select status from runs") == [{"status": "failed"}]
    assert _rows(root, "select key from metrics") == [{"key": "loss"}]  # data still written


def test_keyboard_interrupt_in_context_manager_marks_the_run_killed(root: Path) -> None:
    with pytest.raises(KeyboardInterrupt), _init(root, run_id="k"):
        raise KeyboardInterrupt
    assert _rows(root, "select status from runs") == [{"status": "killed"}]


def test_finish_is_idempotent_and_returns_the_first_report(root: Path) -> None:
    run = _init(root)
    run.log({"a": 1.0})
    first = run.finish()
    assert first.status == "finished" and first.complete
    assert run.finish("failed") is first
    assert _rows(root, "select status from runs") == [{"status": "finished"}]


def test_finish_refuses_an_unknown_status(root: Path) -> None:
    run = _init(root)
    with pytest.raises(ValueError, match="status must be"):
        run.finish("done")
    assert not run.finished
    assert run.finish().status == "finished"


def test_every_logging_call_after_finish_raises_run_state_error(root: Path,
                                                                tmp_path: Path) -> None:
    run = _init(root)
    run.log({"a": 1.0}, step=0)
    run.finish()
    artifact = tmp_path / "f.txt"
    artifact.write_text("x")
    calls = [
        lambda: run.log({"a": 2.0}),
        lambda: run.log_metrics({"a": 2.0}, step=3),
        lambda: run.log_text("t", "x"),
        lambda: run.log_generations([("i", "o", 1.0)]),
        lambda: run.log_config({"lr": 1}),
        lambda: run.span("s"),
        lambda: run.alert("title"),
        lambda: run.log_artifact(b"abc", name="a"),
        lambda: run.log_artifact(artifact),
    ]
    for call in calls:
        with pytest.raises(RunStateError, match="finish"):
            call()
    assert _rows(root, "select step, value from metrics") == [{"step": 0, "value": 1.0}]
    assert _rows(root, "select count(*) as n from texts") == [{"n": 0}]


# -- steps --------------------------------------------------------------------------------

def test_step_defaults_to_one_after_the_last_step(root: Path) -> None:
    """log() without step uses last+1 (starting at 0); an explicit step resets the count."""
    run = _init(root)
    run.log({"a": 0.0})
    run.log({"a": 1.0})
    run.log({"a": 10.0}, step=10)
    run.log({"a": 11.0})
    run.log({"a": 5.0}, step=5)
    run.log({"a": 6.0})
    run.finish()
    rows = _rows(root, "select step, value from metrics order by seq")
    assert [(r["step"], r["value"]) for r in rows] == [
        (0, 0.0), (1, 1.0), (10, 10.0), (11, 11.0), (5, 5.0), (6, 6.0)]


def test_step_accepts_index_like_ints_and_refuses_other_types(root: Path) -> None:
    np = pytest.importorskip("numpy")
    run = _init(root)
    run.log({"a": 1.0}, step=np.int64(4))
    for bad in (1.5, "3", True):
        with pytest.raises(TypeError, match="step must be an int"):
            run.log({"a": 1.0}, step=bad)  # type: ignore[arg-type]
    run.finish()
    assert _rows(root, "select step from metrics") == [{"step": 4}]


def test_a_refused_log_call_does_not_consume_a_step(root: Path) -> None:
    run = _init(root)
    run.log({"a": 0.0})
    with pytest.raises(TypeError):
        run.log({"a": None})
    with pytest.raises(TypeError):
        run.log({1: 1.0})  # type: ignore[dict-item]
    run.log({"a": 1.0})
    run.finish()
    assert [r["step"] for r in _rows(root, "select step from metrics order by seq")] == [0, 1]


def test_texts_default_to_the_current_step(root: Path) -> None:
    run = _init(root)
    run.log_text("before", "no step yet")
    run.log({"a": 1.0}, step=7)
    run.log_text("after", "at seven")
    run.log_text("explicit", "at two", step=2)
    with pytest.raises(TypeError, match="must be str"):
        run.log_text("bad", 3)  # type: ignore[arg-type]
    run.finish()
    rows = _rows(root, "select key, text, step from texts order by seq")
    assert rows == [{"key": "before", "text": "no step yet", "step": None},
                    {"key": "after", "text": "at seven", "step": 7},
                    {"key": "explicit", "text": "at two", "step": 2}]


# -- generations --------------------------------------------------------------------------

def test_log_generations_accepts_dicts_and_verl_tuples(root: Path) -> None:
    """Mappings give input/output/score with every other field in JSON `extra`; verl-style
    (input, output, score) and (input, output) tuples are accepted too."""
    run = _init(root)
    run.log_generations([
        {"input": "2+2?", "output": "4", "score": 1, "ground_truth": "4", "meta": {"len": 1}},
        {"input": "q", "output": {"tool": "calc"}, "score": 0.25},
    ], step=3)
    run.log_generations([("prompt", "answer", 0.5), ("p2", "a2")], step=4, key="val/gen")
    with pytest.raises(TypeError, match="sample 0"):
        run.log_generations(["just a string"])
    with pytest.raises(TypeError, match="score must be a number"):
        run.log_generations([{"input": "i", "output": "o", "score": "high"}])
    run.finish()
    rows = _rows(root, "select key, step, sample, input, output, score, extra "
                       "from generations order by seq, sample")
    assert rows[0] == {"key": "generations", "step": 3, "sample": 0, "input": "2+2?",
                       "output": "4", "score": 1.0, "extra": rows[0]["extra"]}
    assert json.loads(rows[0]["extra"]) == {"ground_truth": "4", "meta": {"len": 1}}
    assert json.loads(rows[1]["output"]) == {"tool": "calc"} and rows[1]["extra"] is None
    assert rows[1]["score"] == 0.25
    assert [(r["key"], r["step"], r["sample"], r["input"], r["output"], r["score"], r["extra"])
            for r in rows[2:]] == [("val/gen", 4, 0, "prompt", "answer", 0.5, None),
                                   ("val/gen", 4, 1, "p2", "a2", None, None)]


# -- spans --------------------------------------------------------------------------------

def test_nested_spans_record_parent_and_share_the_trace(root: Path) -> None:
    run = _init(root)
    with run.span("rollout", step=1, inputs={"prompt": "hi"}, turn=1) as outer:
        with run.span("tool_call", tool="search") as inner:
            inner.outputs = "found"
            inner.set_attribute("hits", 3)
        with run.span("tool_call_2") as sibling:
            pass
        outer.outputs = ["done"]
        outer.token_ids = [1, 2, 3]
    with run.span("next_trace") as other:
        pass
    run.finish()
    rows = {r["name"]: r for r in _rows(root, "select * from traces")}
    assert set(rows) == {"rollout", "tool_call", "tool_call_2", "next_trace"}
    parent, child, sib = rows["rollout"], rows["tool_call"], rows["tool_call_2"]
    assert parent["parent_id"] is None and parent["span_id"] == outer.span_id
    assert child["parent_id"] == parent["span_id"] == sib["parent_id"]
    assert child["span_id"] == inner.span_id and sib["span_id"] == sibling.span_id
    assert child["trace_id"] == parent["trace_id"] == sib["trace_id"]
    assert rows["next_trace"]["trace_id"] != parent["trace_id"]
    assert rows["next_trace"]["parent_id"] is None and other.parent_id is None
    assert all(r["status"] == "ok" and r["error"] is None for r in rows.values())
    assert json.loads(child["attributes"]) == {"tool": "search", "hits": 3}
    assert json.loads(child["outputs"]) == "found"
    assert json.loads(parent["inputs"]) == {"prompt": "hi"}
    assert json.loads(parent["attributes"]) == {"turn": 1}
    assert parent["token_ids"] == [1, 2, 3]
    assert parent["time"] <= child["time"] <= child["end_time"] <= parent["end_time"]


def test_span_records_error_status_and_the_exception_propagates(root: Path) -> None:
    run = _init(root)
    with pytest.raises(ZeroDivisionError), run.span("outer"), run.span("inner"):
        1 / 0  # noqa: B018
    with run.span("after"):
        pass
    run.finish()
    rows = {r["name"]: r for r in _rows(root, "select name, status, error, parent_id "
                                              "from traces")}
    assert rows["inner"]["status"] == rows["outer"]["status"] == "error"
    assert rows["inner"]["error"].startswith("ZeroDivisionError")
    assert rows["after"]["status"] == "ok" and rows["after"]["parent_id"] is None


def test_span_truncates_long_json_to_max_length(root: Path) -> None:
    run = _init(root)
    with run.span("s", inputs="x" * 1000, max_length=50):
        pass
    run.finish()
    (row,) = _rows(root, "select inputs from traces")
    assert json.loads(row["inputs"])["length"] == 1002
    assert len(json.loads(row["inputs"])["truncated"]) == 50


def test_child_span_without_step_inherits_the_parent_step(root: Path) -> None:
    run = _init(root)
    run.log({"a": 1.0}, step=9)
    with run.span("outer", step=1), run.span("inner"):
        pass
    run.finish()
    rows = {r["name"]: r["step"] for r in _rows(root, "select name, step from traces")}
    assert rows == {"outer": 1, "inner": 1}


# -- alerts -------------------------------------------------------------------------------

def test_alert_levels_are_recorded_and_unknown_levels_refused(root: Path) -> None:
    run = _init(root)
    run.log({"a": 1.0}, step=4)
    run.alert("loss spike", "loss went to 1e9", level="error")
    run.alert("slow step", level="info", step=2)
    run.alert("default level")
    with pytest.raises(ValueError, match="alert level"):
        run.alert("t", level="critical")
    run.finish()
    rows = _rows(root, "select level, kind, title, text, step from events order by seq")
    assert rows == [
        {"level": "error", "kind": "alert", "title": "loss spike", "text": "loss went to 1e9",
         "step": 4},
        {"level": "info", "kind": "alert", "title": "slow step", "text": "", "step": 2},
        {"level": "warning", "kind": "alert", "title": "default level", "text": "", "step": 4},
    ]


# -- artifacts ----------------------------------------------------------------------------

def _blob(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest[:2] / digest


def test_log_artifact_bytes_file_and_directory_are_content_addressed(root: Path,
                                                                     tmp_path: Path) -> None:
    run = _init(root)
    payload = b"\x00model weights\xff" * 100
    digest = run.log_artifact(payload, name="weights.bin", media_type="application/x-bin",
                              metadata={"epoch": 3})
    assert digest == hashlib.sha256(payload).hexdigest()
    assert _blob(root, digest).read_bytes() == payload

    single = tmp_path / "notes.txt"
    single.write_text("hello")
    file_digest = run.log_artifact(single, step=2)
    assert file_digest == hashlib.sha256(b"hello").hexdigest()

    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "a.json").write_text('{"a": 1}')
    (ckpt / "sub" / "b.bin").write_bytes(b"bbb")
    (ckpt / "sub" / "dup.txt").write_text("hello")  # same content as notes.txt
    run.log_artifact(ckpt, name="checkpoint")

    with pytest.raises(TypeError, match="needs a name"):
        run.log_artifact(b"x")
    with pytest.raises(FileNotFoundError):
        run.log_artifact(tmp_path / "missing")
    run.finish()

    rows = _rows(root, "select name, digest, size, media_type, metadata, step "
                       "from artifacts order by seq, name")
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"weights.bin", "notes.txt", "checkpoint/a.json",
                            "checkpoint/sub/b.bin", "checkpoint/sub/dup.txt"}
    assert by_name["weights.bin"]["media_type"] == "application/x-bin"
    assert json.loads(by_name["weights.bin"]["metadata"]) == {"epoch": 3}
    assert by_name["notes.txt"]["step"] == 2
    assert by_name["checkpoint/sub/dup.txt"]["digest"] == file_digest
    for row in rows:
        blob = _blob(root, row["digest"])
        assert blob.is_file(), row["name"]
        content = blob.read_bytes()
        assert hashlib.sha256(content).hexdigest() == row["digest"]
        assert len(content) == row["size"]
    blobs = [p for p in (root / "blobs" / "sha256").rglob("*") if p.is_file()]
    assert len(blobs) == 4  # notes.txt and sub/dup.txt share one blob
    assert not [p for p in (root / "blobs").rglob("*") if p.is_file() and p not in blobs]


# -- ExperimentLogger ---------------------------------------------------------------------

def test_experiment_logger_methods(root: Path, tmp_path: Path) -> None:
    """log_metrics(metrics, step), log_config(config) and log_artifact(path) as an
    ExperimentLogger calls them."""
    run = _init(root)
    run.log_metrics({"train/loss": 0.5, "train/acc": 0.9}, 1)
    run.log_metrics({"train/loss": 0.4}, step=2)
    run.log_metrics({"train/loss": 0.3})
    run.log_config({"optim": {"lr": 3e-4, "name": "adamw"}, "seed": 0})
    path = tmp_path / "model.pt"
    path.write_bytes(b"pt")
    assert run.log_artifact(str(path)) == hashlib.sha256(b"pt").hexdigest()
    run.finish()
    metrics = _rows(root, "select step, key, value from metrics order by seq, key")
    assert [(r["step"], r["key"], r["value"]) for r in metrics] == [
        (1, "train/acc", 0.9), (1, "train/loss", 0.5), (2, "train/loss", 0.4),
        (3, "train/loss", 0.3)]
    configs = {r["key"]: json.loads(r["value"])
               for r in _rows(root, "select key, value from configs")}
    assert configs == {"optim/lr": 3e-4, "optim/name": "adamw", "seed": 0}
    assert _rows(root, "select name from artifacts") == [{"name": "model.pt"}]


# -- Tracking -------------------------------------------------------------------------------

def test_tracking_console_and_tracklake_prints_and_writes(root: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    tracking = tracklake.Tracking("proj", "exp", ["console", "tracklake"],
                                  config={"lr": 0.1}, root=root, capture_identity=False)
    tracking.log({"loss": 0.123456, "acc": 1, "note": "hi"}, step=3)
    tracking.log({"loss": 0.5}, step=4)
    tracking.log({"only": 1.0}, step=5, backend="tracklake")
    tracking.finish()
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step:3 - loss:0.123 - acc:1 - note:hi", "step:4 - loss:0.500"]
    assert tracking.run is not None
    metrics = _rows(root, "select step, key, value from metrics order by seq, key")
    assert [(r["step"], r["key"], r["value"]) for r in metrics] == [
        (3, "acc", 1.0), (3, "loss", 0.123456), (4, "loss", 0.5), (5, "only", 1.0)]
    assert _rows(root, "select key, text from texts") == [{"key": "note", "text": "hi"}]
    assert _rows(root, "select project, name, status from runs") == [
        {"project": "proj", "name": "exp", "status": "finished"}]


def test_tracking_with_wandb_writes_only_to_the_store(root: Path) -> None:
    """'wandb' is not run in-process: the run goes to the store, stderr says how to export
    it (with sidecars=False; tests/test_sidecar*.py cover the sidecars), and no wandb module
    is imported (checked in a fresh interpreter: in this one, another test may have imported
    wandb already)."""
    assert importlib.util.find_spec("wandb") is not None, "wandb must be installed to check"
    code = ("import sys, tracklake\n"
            "tracking = tracklake.Tracking('proj', 'exp', ['wandb'], root=sys.argv[1],\n"
            "                              capture_identity=False, sidecars=False)\n"
            "tracking.log({'loss': 0.25}, step=1)\n"
            "tracking.finish()\n"
            "sys.stderr.write(repr(sorted(m for m in sys.modules if m.split('.')[0] == "
            "'wandb')))\n")
    child = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                           text=True, check=True)
    assert child.stdout == ""
    said, modules = child.stderr.rsplit("\n", 1)
    assert "tracklake export DEST --run" in said and modules == "[]"
    assert _rows(root, "select step, key, value from metrics") == [
        {"step": 1, "key": "loss", "value": 0.25}]


def test_tracking_console_only_writes_nothing(root: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    tracking = tracklake.Tracking("proj", "exp", "console", root=root)
    tracking.log({"loss": 1.0}, step=0)
    tracking.finish()
    assert tracking.run is None
    assert capsys.readouterr().out == "step:0 - loss:1.000\n"
    assert not any(p.is_file() for p in root.rglob("*"))


def test_tracking_refuses_unknown_backends(root: Path) -> None:
    with pytest.raises(ValueError, match="unknown logger backend"):
        tracklake.Tracking("proj", "exp", ["console", "neptune"], root=root)
    assert not any(p.is_file() for p in root.rglob("*"))
