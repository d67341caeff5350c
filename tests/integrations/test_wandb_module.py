"""`tracklake.wandb`, W&B's module API over the store: its surface, W&B's rules for
init, steps, config and summary, what each kind of value becomes, ranks in shared mode,
and that a value W&B would take never fails the training loop. (That the exported runs
agree with what wandb records is tests/integrations/test_wandb_parity.py.)"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _optional import optional

import tracklake
import tracklake.wandb as wandb
from tracklake._integrations.wandb import current
from tracklake._integrations.wandb.init import SECONDARY_RANK_BASE


@pytest.fixture(autouse=True)
def no_current_run() -> Iterator[None]:
    yield
    for run in current.active():
        run.finish()


def _q(root: Path, sql: str) -> list[dict[str, Any]]:
    return list(tracklake.query(sql, root=root).to_pylist())


def _metrics(root: Path) -> list[tuple[int, str, float]]:
    return [(r["step"], r["key"], r["value"]) for r in _q(
        root, "SELECT step, key, value FROM metrics ORDER BY step, key, seq")]


def _events(root: Path, kind: str) -> list[dict[str, Any]]:
    return _q(root, f"SELECT title, text, level FROM events WHERE kind = '{kind}' ORDER BY seq")


# -- the surface ---------------------------------------------------------------------------


def test_all_is_exactly_the_w_and_b_surface_we_mean_to_offer() -> None:
    assert set(wandb.__all__) == {
        "AlertLevel", "Artifact", "Audio", "CommError", "Config", "ConfigError", "Error",
        "Histogram", "Html", "Image", "Run", "Settings", "Summary", "Table", "UsageError",
        "Video", "alert", "define_metric", "finish", "init", "log", "log_artifact", "login",
        "mark_preempting", "save", "termerror", "termlog", "termwarn", "unwatch", "util",
        "watch"}
    for name in wandb.__all__:
        assert getattr(wandb, name) is not None
    for error in (wandb.Error, wandb.UsageError, wandb.ConfigError, wandb.CommError):
        assert issubclass(error, tracklake.TracklakeError)


def test_a_missing_w_and_b_name_raises_attribute_error_naming_what_to_use(root: Path) -> None:
    with pytest.raises(AttributeError, match=r"'Api'.*tracklake\.query"):
        _ = wandb.Api
    with pytest.raises(AttributeError, match=r"'sweep'.*no sweeps"):
        _ = wandb.sweep
    with pytest.raises(AttributeError, match=r"'plot_3d'.*docs/integrations\.md"):
        _ = wandb.plot_3d
    run = wandb.init(project="p", root=root)
    with pytest.raises(AttributeError, match=r"'use_artifact'.*tracklake\.query"):
        _ = run.use_artifact


def test_init_takes_every_argument_of_the_installed_wandb_init(root: Path) -> None:
    real = optional("wandb")
    names = [p for p in inspect.signature(real.init).parameters if p != "anonymous"]
    ours = inspect.signature(wandb.init).parameters
    assert [n for n in names if n not in ours] == []
    for name in ("entity", "project", "name", "config", "settings"):  # W&B's positions
        assert list(ours).index(name) == names.index(name)


def test_an_unknown_init_keyword_is_ignored_with_one_warning_naming_it(root: Path) -> None:
    with pytest.warns(UserWarning, match="magic_flag"):
        wandb.init(project="p", root=root, magic_flag=1)
    wandb.finish()
    wandb.init(project="p", root=root, magic_flag=2)  # said once: no warning (an error here)


def test_before_init_run_is_none_and_using_the_run_raises_as_w_and_b_does() -> None:
    assert wandb.run is None
    with pytest.raises(wandb.Error, match=r"You must call wandb.init\(\) before wandb.log\(\)"):
        wandb.log({"a": 1})
    with pytest.raises(wandb.Error, match=r"before wandb.config\.update"):
        wandb.config.update({"a": 1})
    with pytest.raises(wandb.Error, match=r"before wandb.summary\['a'\]"):
        wandb.summary["a"] = 1
    wandb.finish()  # nothing to finish: no error, as in W&B


def test_login_is_a_no_op_and_generate_id_makes_w_and_b_like_ids() -> None:
    assert wandb.login(key="x" * 40, host="https://example.invalid", relogin=True) is True
    ids = {wandb.util.generate_id() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 8 and i.isalnum() and i.islower() for i in ids)


def test_settings_take_anything_and_read_mode_primary_and_label() -> None:
    s = wandb.Settings(mode="shared", x_primary=False, x_label="rank_3", https_proxy=None,
                       x_stats_gpu_device_ids=[0], console="off")
    assert (s.mode, s.x_primary, s.x_label, s.console, s.not_given) == (
        "shared", False, "rank_3", "off", None)
    with pytest.raises(ValueError, match="mode"):
        wandb.Settings(mode="sideways")


# -- init, finish, reinit, modes -----------------------------------------------------------


def test_run_is_set_by_init_and_cleared_by_finish(root: Path) -> None:
    run = wandb.init(project="p", name="n", id="r1", root=root, tags=["a"], group="g",
                     config={"lr": 0.1})
    assert wandb.run is run and (run.id, run.name, run.project, run.tags) == (
        "r1", "n", "p", ("a",))
    assert run.url is None and run.offline and not run.disabled
    assert wandb.config is run.config and wandb.summary is run.summary
    wandb.finish()
    assert wandb.run is None
    (record,) = tracklake.list_runs(root=root)
    assert (record.project, record.run) == ("p", "r1")
    init = json.loads(_events(root, "wandb.init")[0]["text"])
    assert init["group"] == "g" and init["tags"] == ["a"]


@pytest.mark.parametrize(("exit_code", "status"), [(None, "finished"), (0, "finished"),
                                                   (1, "failed"), (137, "failed")])
def test_finish_exit_code_is_the_run_status(root: Path, exit_code: int | None,
                                            status: str) -> None:
    wandb.init(project="p", id="r", root=root)
    wandb.finish(exit_code=exit_code, quiet=True)
    assert _q(root, "SELECT status FROM runs") == [{"status": status}]


def test_an_exception_in_the_with_block_fails_the_run(root: Path) -> None:
    with pytest.raises(KeyError), wandb.init(project="p", id="r", root=root):
        raise KeyError("boom")
    assert _q(root, "SELECT status FROM runs") == [{"status": "failed"}]


def test_log_after_finish_raises_usage_error_as_w_and_b_does(root: Path) -> None:
    run = wandb.init(project="p", root=root)
    run.finish()
    with pytest.raises(wandb.UsageError, match="is finished"):
        run.log({"a": 1})
    with pytest.raises(wandb.Error, match=r"before wandb\.log"):
        wandb.log({"a": 1})
    run.finish()  # a second finish does nothing


def test_a_second_init_returns_the_current_run_unless_reinit_says_otherwise(
        root: Path) -> None:
    first = wandb.init(project="p", id="r1", root=root)
    assert wandb.init(project="p", id="r2", root=root) is first
    with pytest.raises(wandb.Error, match="Cannot resume"):
        wandb.init(project="p", id="r2", root=root, resume="must")
    second = wandb.init(project="p", id="r2", root=root, reinit=True)
    assert second is not first and wandb.run is second
    assert first.store_run is not None and first.store_run.finished
    third = wandb.init(project="p", id="r3", root=root, reinit="create_new")
    assert wandb.run is third and second.store_run is not None
    assert not second.store_run.finished
    third.finish()
    assert wandb.run is second


@pytest.mark.parametrize("how", ["argument", "settings", "WANDB_MODE", "WANDB_DISABLED"])
def test_disabled_mode_writes_nothing(root: Path, how: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs: dict[str, Any] = {}
    if how == "argument":
        kwargs["mode"] = "disabled"
    elif how == "settings":
        kwargs["settings"] = wandb.Settings(mode="disabled")
    elif how == "WANDB_MODE":
        monkeypatch.setenv("WANDB_MODE", "disabled")
    else:
        monkeypatch.setenv("WANDB_DISABLED", "true")
    run = wandb.init(project="p", root=root, config={"a": 1}, **kwargs)
    assert run.disabled and wandb.run is run
    wandb.define_metric("x/*", step_metric="x/step")
    wandb.log({"a": 1, "t": wandb.Table(columns=["a"], data=[[1]])})
    wandb.summary["s"] = 1
    wandb.alert("t", "x")
    wandb.finish()
    assert list((root / "runs").iterdir()) == []


def test_project_name_and_id_come_from_w_and_b_variables(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "envproj")
    monkeypatch.setenv("WANDB_NAME", "envname")
    monkeypatch.setenv("WANDB_RUN_ID", "envid")
    monkeypatch.setenv("WANDB_TAGS", "a, b")
    run = wandb.init(root=root)
    assert (run.project, run.name, run.id, run.tags) == ("envproj", "envname", "envid",
                                                         ("a", "b"))


# -- steps -------------------------------------------------------------------------------


def test_steps_follow_w_and_b(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sequence checked against wandb 0.31's offline files (history.py)."""
    run = wandb.init(project="p", root=root)
    wandb.log({"a": 1})                  # step 0, committed
    wandb.log({"b": 2}, commit=False)    # row 1 open
    wandb.log({"c": 3})                  # row 1 committed
    wandb.log({"d": 4}, step=5)          # row 5 open
    wandb.log({"e": 5}, step=5)          # same row
    wandb.log({"f": 6}, step=3)          # lower: ignored, said once
    wandb.log({"f": 7}, step=2)          # ignored again, not said again
    wandb.log({"g": 7})                  # merges into row 5, commits it
    wandb.log({})                        # an empty row 6
    wandb.log({"h": 8}, step=7, commit=True)
    assert run.step == 8
    wandb.log({"i": 9}, commit=False)    # committed by finish
    wandb.finish()
    assert _metrics(root) == [(0, "a", 1), (1, "b", 2), (1, "c", 3), (5, "d", 4),
                              (5, "e", 5), (5, "g", 7), (7, "h", 8), (8, "i", 9)]
    err = capsys.readouterr().err
    assert err.count("less than the current step") == 1
    assert "2 log() calls were ignored" in err


def test_step_zero_twice_and_commit_false_then_a_step_jump(root: Path) -> None:
    wandb.init(project="p", root=root)
    wandb.log({"a": 1}, step=0)
    wandb.log({"b": 2}, step=0)
    wandb.log({"c": 3}, commit=False)
    wandb.log({"d": 4}, step=9)
    wandb.finish()
    assert _metrics(root) == [(0, "a", 1), (0, "b", 2), (0, "c", 3), (9, "d", 4)]


def test_a_step_that_is_not_an_int_raises_naming_it(root: Path) -> None:
    wandb.init(project="p", root=root)
    with pytest.raises(TypeError, match="step must be an int"):
        wandb.log({"a": 1}, step=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int64"):
        wandb.log({"a": 1}, step=2**63)
    wandb.log({"a": 1}, step=np.int64(3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be strings"):
        wandb.log({1: 2})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="dictionary"):
        wandb.log([("a", 1)])  # type: ignore[arg-type]


def test_several_x_axes_store_each_key_at_its_step_metrics_value(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wandb.init(project="p", root=root)
    wandb.define_metric("train/step")
    wandb.define_metric("train/*", step_metric="train/step")
    wandb.define_metric("rollout/*", step_metric="rollout/step")
    wandb.define_metric("clock/*", step_metric="clock/sec")
    wandb.define_metric("nosync/*", step_metric="train/step", step_sync=False)
    wandb.log({"train/loss": 1.0, "train/step": 100, "plain": 5})              # W&B step 0
    wandb.log({"rollout/r": 0.5, "rollout/step": 7})
    wandb.log({"train/loss": 0.5})                   # step_sync: at the last train/step
    wandb.log({"nosync/x": 1.0})                     # no step_sync: at W&B's step (3)
    wandb.log({"rollout/r": 0.7})                    # no rollout/step seen: ... is 7
    wandb.log({"clock/gpu": 3.0, "clock/sec": 2.5})  # a non-whole axis: W&B's step (5)
    wandb.finish()
    assert _metrics(root) == [
        (0, "plain", 5), (3, "nosync/x", 1.0), (5, "clock/gpu", 3.0), (5, "clock/sec", 2.5),
        (7, "rollout/r", 0.5), (7, "rollout/r", 0.7), (7, "rollout/step", 7),
        (100, "train/loss", 1.0), (100, "train/loss", 0.5), (100, "train/step", 100)]
    assert capsys.readouterr().err.count("'clock/sec' has value 2.5") == 1
    rules = [(e["title"], json.loads(e["text"])) for e in _events(root, "wandb.define_metric")]
    assert rules[2] == ("rollout/*", {"step_metric": "rollout/step"})


def test_records_outside_rows_stay_at_w_and_b_step_after_an_axis_far_ahead(root: Path
                                                                          ) -> None:
    """System metrics, texts and events logged after a row on an axis of its own take
    W&B's step, not the axis value (before: a clock axis at 495001 put the system metrics
    there, and the W&B export's step jumped to it)."""
    run = wandb.init(project="p", root=root)
    wandb.define_metric("clock/*", step_metric="clock/sec")
    wandb.log({"loss": 1.0})                                  # W&B step 0
    wandb.log({"clock/rate": 2.0, "clock/sec": 495001})       # W&B step 1, store 495001
    store = run.store_run
    assert store is not None
    store._log_system({"system/cpu": 3.0})  # one sample, as the sampler's thread records it
    store.log_text("note", "after the clock row")
    wandb.finish()
    assert (1, "system/cpu", 3.0) in _metrics(root)
    assert _q(root, "SELECT step FROM texts WHERE key = 'note'") == [{"step": 1}]


def test_define_metric_refuses_what_w_and_b_refuses(root: Path) -> None:
    wandb.init(project="p", root=root)
    with pytest.raises(wandb.Error, match="glob"):
        wandb.define_metric("a*b", step_metric="s")
    with pytest.raises(wandb.Error, match="summary op"):
        wandb.define_metric("a", summary="median")
    with pytest.raises(wandb.Error, match="non-empty"):
        wandb.define_metric("")
    rule = wandb.define_metric("loss", summary="min,last", goal="minimize", hidden=True)
    assert rule.options() == {"summary": "min,last", "goal": "minimize", "hidden": True}


# -- values ------------------------------------------------------------------------------


def test_values_w_and_b_takes_as_numbers_become_metrics(root: Path) -> None:
    torch = optional("torch")
    wandb.init(project="p", root=root)
    wandb.log({"np32": np.float32(0.5), "np64": np.int64(3), "npbool": np.bool_(True),
               "arr0": np.array(2.0), "big": 2**70, "tensor": torch.tensor(1.5),
               "nest": {"a": {"b": 1}}, "odd key.x": 1, "/lead": 2, "nan": math.nan})
    wandb.finish()
    got = {k: v for _, k, v in _metrics(root)}
    assert got.pop("nan") != got.get("nan", 0)  # NaN kept as NaN
    assert got == {"np32": 0.5, "np64": 3, "npbool": 1, "arr0": 2, "big": float(2**70),
                   "tensor": 1.5, "nest/a/b": 1, "odd key.x": 1, "/lead": 2}


def test_values_the_store_does_not_hold_are_skipped_counted_and_said_once(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wandb.init(project="p", root=root)
    for _ in range(3):
        wandb.log({"loss": 1.0, "none": None, "list": [1, 2], "arr": np.zeros(32),
                   "obj": object(), "": 1, "n": {"": 2, 3: 4}})
    wandb.finish()
    assert {k for _, k, _ in _metrics(root)} == {"loss"}
    err = capsys.readouterr().err
    assert err.count("'none' is a builtins.NoneType") == 1
    assert "none ×3" in err and "list ×3" in err and "arr ×3" in err and "obj ×3" in err


def test_strings_and_html_become_texts(root: Path) -> None:
    wandb.init(project="p", root=root)
    wandb.log({"note": "hello", "page": wandb.Html("<b>x</b>")}, step=2)
    wandb.finish()
    assert _q(root, "SELECT step, key, text FROM texts ORDER BY key") == [
        {"step": 2, "key": "note", "text": "hello"},
        {"step": 2, "key": "page", "text": "<b>x</b>"}]


def test_a_table_with_prompt_and_response_columns_becomes_generations(root: Path) -> None:
    wandb.init(project="p", root=root)
    table = wandb.Table(columns=["Prompt", "completion", "reward", "advantage"],
                        data=[["2+2?", "4", 1.0, 0.5], [["chat"], "x", None, -0.5]])
    wandb.log({"completions": table}, step=3)
    wandb.finish()
    rows = _q(root, "SELECT step, key, sample, input, output, score, extra FROM generations "
                    "ORDER BY sample")
    assert [(r["step"], r["key"], r["input"], r["output"], r["score"]) for r in rows] == [
        (3, "completions", "2+2?", "4", 1.0), (3, "completions", '["chat"]', "x", None)]
    extra = json.loads(rows[1]["extra"])
    assert extra["advantage"] == -0.5 and extra["reward"] is None
    assert extra["_wandb_table"] == {"columns": ["Prompt", "completion", "reward", "advantage"],
                                     "input": "Prompt", "output": "completion",
                                     "score": "reward"}


def test_another_table_is_stored_whole_in_extra(root: Path) -> None:
    wandb.init(project="p", root=root)
    table = wandb.Table(columns=["step", "input_1", "n"])
    table.add_data(1, "a", np.float64(2.0))
    wandb.log({"val/generations": table}, step=1)
    wandb.finish()
    (row,) = _q(root, "SELECT input, output, score, extra FROM generations")
    assert row["input"] is None and row["output"] is None and row["score"] is None
    assert json.loads(row["extra"])["n"] == 2.0


def test_an_incremental_table_stores_the_rows_added_since_its_last_log(root: Path) -> None:
    """verl's DAPO reward table: one INCREMENTAL table, a row added and logged per step
    (verl picks it by ``wandb.__version__ >= 0.20``)."""
    assert wandb.__version__ == "0.31.0"
    wandb.init(project="p", root=root)
    table = wandb.Table(columns=["step", "reward_counts"], log_mode="INCREMENTAL")
    for step in (1, 2, 3):
        table.add_data(step, f"1:{step}")
        wandb.log({"training/filter_groups/filtered_reward_counts": table}, step=step)
    wandb.log({"training/filter_groups/filtered_reward_counts": table}, step=4)  # no new row
    wandb.finish()
    rows = _q(root, "SELECT step, extra FROM generations ORDER BY step")
    assert [(r["step"], json.loads(r["extra"])["reward_counts"]) for r in rows] == [
        (1, "1:1"), (2, "1:2"), (3, "1:3")]


def test_an_array_of_more_than_32_numbers_is_a_histogram_as_in_w_and_b(root: Path) -> None:
    torch = optional("torch")
    wandb.init(project="p", root=root)
    wandb.log({"np": np.arange(33), "t": torch.ones(40), "small": np.ones(32)}, step=1)
    wandb.finish()
    got = {k: v for _, k, v in _metrics(root)}
    assert got["np/count"] == 33 and got["np/max"] == 32 and got["t/count"] == 40
    assert not any(k.startswith("small") for k in got)
    rows = _q(root, "SELECT key, step, counts, edges FROM histograms ORDER BY key")
    assert [(r["key"], r["step"], len(r["counts"]), sum(r["counts"])) for r in rows] == [
        ("np", 1, 32, 33), ("t", 1, 32, 40)]  # W&B's 32 bins
    assert rows[0]["edges"] == pytest.approx(np.histogram(np.arange(33), bins=32)[1].tolist())


def test_a_histogram_is_a_histogram_record_with_its_statistics_as_metrics(root: Path) -> None:
    wandb.init(project="p", root=root)
    wandb.log({"h": wandb.Histogram([1, 2, 3, 4])}, step=1)
    wandb.log({"g": wandb.Histogram(np_histogram=(np.array([1, 3]), np.array([0., 1., 2.])))},
              step=2)
    wandb.log({"bad": wandb.Histogram(np_histogram=([1.5, 2], [0., 1., 2.])), "x": 1.0},
              step=3)  # counts that are not whole: skipped, never raised
    wandb.finish()
    got = {(s, k): v for s, k, v in _metrics(root)}
    assert got[(1, "h/count")] == 4 and got[(1, "h/min")] == 1 and got[(1, "h/max")] == 4
    assert got[(1, "h/mean")] == 2.5 and got[(1, "h/std")] == pytest.approx(1.118, 1e-3)
    assert got[(2, "g/count")] == 4 and got[(2, "g/mean")] == pytest.approx(1.25)
    assert got[(3, "x")] == 1.0 and not any(k.startswith("bad") for _, k in got)
    rows = _q(root, "SELECT key, step, counts, edges FROM histograms ORDER BY step")
    assert [(r["key"], r["step"]) for r in rows] == [("h", 1), ("g", 2)]
    assert sum(rows[0]["counts"]) == 4 and len(rows[0]["counts"]) == 64  # W&B's default
    assert rows[1]["counts"] == [1, 3] and rows[1]["edges"] == [0.0, 1.0, 2.0]


def test_media_that_cannot_be_stored_are_skipped_not_raised(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    optional("PIL")
    wandb.init(project="p", root=root)
    wandb.log({"gone": wandb.Image(str(tmp_path / "missing.png")),
               "odd": wandb.Image(np.zeros((2, 2, 2, 2))), "loss": 1.0})
    wandb.finish()
    assert _metrics(root) == [(0, "loss", 1.0)]
    assert "gone ×1" in capsys.readouterr().err


def test_media_become_media_records_and_video_frames_an_artifact(root: Path,
                                                                  tmp_path: Path) -> None:
    optional("PIL")
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2")
    wandb.init(project="p", root=root)
    wandb.log({"img": wandb.Image(np.zeros((4, 4, 3)), caption="black"),
               "vid": wandb.Video(str(clip), fps=4),
               "snd": wandb.Audio(np.zeros(8), sample_rate=8000),
               "imgs": [wandb.Image(np.ones((2, 2))), wandb.Image(np.ones((2, 2)))],
               "frames": wandb.Video(np.zeros((2, 3, 4, 4), dtype=np.uint8))}, step=4)
    wandb.finish()
    rows = _q(root, "SELECT step, key, type, media_type, caption, shape, sample_rate "
                    "FROM media ORDER BY key")
    assert [(r["step"], r["key"], r["type"], r["media_type"]) for r in rows] == [
        (4, "img", "image", "image/png"), (4, "imgs", "image", "image/png"),
        (4, "imgs", "image", "image/png"), (4, "snd", "audio", "audio/wav"),
        (4, "vid", "video", "video/mp4")]
    assert rows[0]["caption"] == "black" and rows[0]["shape"] == [4, 4, 3]
    assert rows[3]["sample_rate"] == 8000
    [frames] = _q(root, "SELECT step, name, media_type FROM artifacts")
    assert frames == {"step": 4, "name": "frames_4.npy", "media_type": "application/x-npy"}


# -- config and summary ------------------------------------------------------------------


def test_config_by_item_attribute_and_update_with_w_and_b_value_change_rule(
        root: Path) -> None:
    wandb.init(project="p", root=root, config={"lr": 0.1, "id2label": {0: "NEG"}})
    wandb.config["batch"] = 8
    wandb.config.epochs = 3
    wandb.config.update({"lr": 0.1})  # the same value: allowed
    with pytest.raises(wandb.ConfigError, match='"lr"'):
        wandb.config.update({"lr": 0.2})
    with pytest.raises(wandb.ConfigError):
        wandb.config["lr"] = 0.3
    wandb.config.update({"lr": 0.2}, allow_val_change=True)
    assert (wandb.config.lr, wandb.config["batch"], wandb.config.get("none", 1)) == (0.2, 8, 1)
    assert "epochs" in wandb.config and len(wandb.config) == 4
    wandb.finish()
    configs = {r["key"]: json.loads(r["value"]) for r in _q(
        root, "SELECT key, value FROM configs ORDER BY seq")}
    assert configs == {"lr": 0.2, "id2label/0": "NEG", "batch": 8, "epochs": 3}


def test_summary_holds_the_last_values_and_records_what_the_code_sets(root: Path) -> None:
    run = wandb.init(project="p", root=root)
    wandb.log({"loss": 2.0})
    wandb.log({"loss": 1.0})
    run.summary["best"] = 0.9
    run.summary.update({"final": 1}, allow_val_change=True)  # not a key
    wandb.summary.extra = "x"
    assert dict(wandb.summary) == {"loss": 1.0, "best": 0.9, "final": 1, "extra": "x"}
    wandb.finish()
    # the first at once, the rest within 10 s of it together (at finish here)
    assert [json.loads(e["text"]) for e in _events(root, "wandb.summary")] == [
        {"best": 0.9}, {"final": 1, "extra": "x"}]


def test_a_summary_value_set_at_every_step_makes_few_events(root: Path) -> None:
    wandb.init(project="p", root=root)
    for step in range(1000):
        wandb.log({"acc": step / 1000})
        wandb.summary["best_acc"] = step / 1000
    wandb.finish()
    events = [json.loads(e["text"]) for e in _events(root, "wandb.summary")]
    assert len(events) <= 3 and events[-1] == {"best_acc": 0.999}


# -- artifacts, files, alerts, the rest ----------------------------------------------------


def test_an_artifact_is_stored_as_one_directory_with_its_w_and_b_attributes(
        root: Path, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "weights.bin").write_bytes(b"w")
    (tmp_path / "card.md").write_text("card")
    wandb.init(project="p", root=root)
    wandb.log({"a": 1})
    art = wandb.Artifact("model-1", type="model", metadata={"acc": 0.9})
    art.add_dir(str(tmp_path / "ckpt"), name="ckpt")
    art.add_file(str(tmp_path / "card.md"))
    with art.new_file("notes.txt", mode="w") as f:
        f.write("hi")
    art.add_reference("s3://bucket/data")
    assert wandb.log_artifact(art, aliases=["best"]) is art
    wandb.finish()
    rows = _q(root, "SELECT step, name, metadata FROM artifacts ORDER BY name")
    assert [r["name"] for r in rows] == ["model-1/card.md", "model-1/ckpt/weights.bin",
                                         "model-1/notes.txt", "model-1/wandb_references.json"]
    meta = json.loads(rows[0]["metadata"])
    assert rows[0]["step"] == 0 and meta["wandb_type"] == "model"
    assert meta["aliases"] == ["best"] and meta["metadata"] == {"acc": 0.9}


def test_save_stores_files_and_again_at_finish_when_they_changed(root: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("1")
    wandb.init(project="p", root=root)
    assert wandb.save(str(out / "*.txt"), base_path=str(out)) == [str(out / "a.txt")]
    (out / "a.txt").write_text("22")
    (out / "b.txt").write_text("3")
    wandb.finish()
    rows = _q(root, "SELECT name, size FROM artifacts ORDER BY seq")
    assert rows == [{"name": "a.txt", "size": 1}, {"name": "a.txt", "size": 2},
                    {"name": "b.txt", "size": 1}]


def test_files_written_to_run_dir_are_stored_at_finish_and_dir_is_not_the_store(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run's dir is kept
    run = wandb.init(project="p", root=root)
    assert Path(run.dir).parent == tmp_path
    assert not Path(run.dir).resolve().is_relative_to(root.resolve())
    (Path(run.dir) / "sub").mkdir()
    (Path(run.dir) / "sub" / "model.txt").write_text("weights")
    wandb.finish()
    assert _q(root, "SELECT name, size FROM artifacts") == [{"name": "sub_model.txt",
                                                             "size": 7}]


def test_alert_watch_and_mark_preempting(root: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    wandb.init(project="p", root=root)
    wandb.alert(title="loss spike", text="up", level=wandb.AlertLevel.ERROR)
    wandb.watch(object(), log="all")
    wandb.watch(object())
    wandb.unwatch()
    wandb.mark_preempting()
    wandb.finish()
    assert _q(root, "SELECT level, title, text FROM events WHERE kind = 'alert'") == [
        {"level": "error", "title": "loss spike", "text": "up"}]
    assert len(_events(root, "wandb.mark_preempting")) == 1
    assert capsys.readouterr().err.count("watch() logs nothing") == 1


# -- ranks -------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "env", "rank"), [
    ({"mode": "shared", "x_primary": True}, {}, 0),
    ({"mode": "shared", "x_primary": False, "x_label": "rank_3"}, {}, 3),
    ({"mode": "shared", "x_primary": False, "x_label": "rank_3"}, {"RANK": "5"}, 5),
    ({"x_primary": False, "x_label": "client_7"}, {}, None),
])
def test_processes_of_one_shared_run_are_its_ranks(
        root: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any],
        env: dict[str, str], rank: int | None) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run = wandb.init(project="p", id="job", root=root, resume="allow", reinit=True,
                     settings=wandb.Settings(**settings))
    assert run.store_run is not None
    if rank is None:  # a label without a number: a stable rank above any trainer's
        assert run.store_run.rank >= SECONDARY_RANK_BASE
        again = wandb.init(project="p", id="job", root=root, reinit=True,
                           settings=wandb.Settings(**settings))
        assert again.store_run is not None and again.store_run.rank == run.store_run.rank
    else:
        assert run.store_run.rank == rank


def test_a_restarted_job_with_the_same_id_is_a_new_attempt_of_the_run(root: Path) -> None:
    for loss in (1.0, 0.5):
        run = wandb.init(project="p", id="job", root=root)
        wandb.log({"loss": loss}, step=0)
        wandb.finish()
    assert run.resumed
    # the second attempt's step 0 supersedes the first's in the default view
    assert _q(root, "SELECT attempt, value FROM metrics") == [{"attempt": 2, "value": 0.5}]
    assert len(tracklake.list_runs(root=root)) == 1


def test_logging_from_two_threads_loses_nothing(root: Path) -> None:
    """slime logs engine gauges from a scraper thread while the loop logs."""
    import threading

    wandb.init(project="p", root=root)

    def scrape() -> None:
        for i in range(500):
            wandb.log({"gauge": float(i)})

    thread = threading.Thread(target=scrape)
    thread.start()
    for i in range(500):
        wandb.log({"loss": float(i)})
    thread.join()
    wandb.finish()
    counts = _q(root, "SELECT key, count(*) AS n, count(DISTINCT step) AS steps FROM metrics "
                      "GROUP BY key ORDER BY key")
    assert counts == [{"key": "gauge", "n": 500, "steps": 500},
                      {"key": "loss", "n": 500, "steps": 500}]


def test_an_open_row_is_stored_at_exit_without_finish(root: Path) -> None:
    """W&B commits the open row when the process ends; so does tracklake.wandb, before
    tracklake finishes the run at exit (also after a disabled run came first)."""
    import subprocess
    import sys

    from _env import child_env

    code = ("import tracklake.wandb as w; w.init(project='p', mode='disabled'); w.finish(); "
            f"w.init(project='p', root={str(root)!r}); w.log({{'a': 1}}, step=3)")
    subprocess.run([sys.executable, "-c", code], env=child_env(), check=True, timeout=120)
    assert _metrics(root) == [(3, "a", 1.0)]
    assert _q(root, "SELECT status FROM runs") == [{"status": "finished"}]
