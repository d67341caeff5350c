"""Values that nest deeper than Python's recursion allows: what the API refuses names
the key (no RecursionError from somewhere inside), what is legal (a text that happens
to be deep JSON, in a config or the environment) is recorded with its secrets redacted,
and a span's end never raises over what it was given."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import tracklake
from tracklake._write.coerce import MAX_NESTING
from tracklake._write.identity import REDACTED

DEPTH = 5_000
DEEP_TEXT = "[" * DEPTH + "]" * DEPTH


def _nested_dicts(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(depth - 1):
        node["k"] = {}
        node = node["k"]
    node["leaf"] = 1
    return top


def _nested_lists(depth: int) -> list[Any]:
    top: list[Any] = []
    node = top
    for _ in range(depth - 1):
        node.append([])
        node = node[0]
    return top


def _init(root: Path, **options: Any) -> tracklake.Run:
    return tracklake.init(project="p", run_id="r", root=root, system_metrics=False,
                          **{"capture_identity": False, **options})


def test_a_config_nested_past_the_bound_is_refused_naming_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"key 'model/k/k/.*….*k/k' nests mappings more than "
                                         rf"{MAX_NESTING} levels deep"):
        _init(tmp_path / "a", config={"model": _nested_dicts(DEPTH)})
    with pytest.raises(ValueError, match=r"config key 'layers': a value nests mappings and "
                                         rf"lists more than {MAX_NESTING} levels deep"):
        _init(tmp_path / "b", config={"layers": _nested_lists(DEPTH)})
    looped: list[Any] = []
    looped.append(looped)  # a list that holds itself: refused the same way
    with pytest.raises(ValueError, match="config key 'cycle'"):
        _init(tmp_path / "c", config={"cycle": looped})
    with _init(tmp_path / "d", config={"model": _nested_dicts(MAX_NESTING - 1),
                                       "layers": _nested_lists(MAX_NESTING)}) as run:
        run.log({"loss": 1.0}, step=0)
    configs = tracklake.query("SELECT key, value FROM configs", root=tmp_path / "d")
    values = dict(zip(configs.column("key").to_pylist(), configs.column("value").to_pylist(),
                      strict=True))
    assert json.loads(values["layers"]) == _nested_lists(MAX_NESTING)
    assert values["model" + "/k" * (MAX_NESTING - 2) + "/leaf"] == "1"


def test_a_refused_log_call_names_its_key_and_the_run_goes_on(tmp_path: Path) -> None:
    with _init(tmp_path) as run:
        with pytest.raises(ValueError, match=r"key 'deep/k/k/.*' nests mappings"):
            run.log({"deep": _nested_dicts(DEPTH)}, step=0)
        with pytest.raises(ValueError, match=r"val sample 1: a value nests"):
            run.log_generations([{"input": "q", "output": "a"},
                                 {"input": _nested_lists(DEPTH), "output": "b"}], step=0,
                                key="val")
        with pytest.raises(ValueError, match=r"metadata of artifact 'w.bin': a value nests"):
            run.log_artifact(b"w", name="w.bin", metadata={"m": _nested_lists(DEPTH)})
        run.log({"loss": 2.0}, step=1)
        run.log_generations([{"input": "q", "output": "a", "score": 1.0, "why": [1]}], step=1,
                            key="val")
    assert tracklake.query("SELECT step, key, value FROM metrics",
                           root=tmp_path).to_pylist() == [{"step": 1, "key": "loss",
                                                           "value": 2.0}]
    [generation] = tracklake.query("SELECT step, score, extra FROM generations",
                                   root=tmp_path).to_pylist()
    assert generation == {"step": 1, "score": 1.0, "extra": '{"why": [1]}'}


def test_a_span_given_a_value_too_deep_to_print_ends_without_raising(tmp_path: Path
                                                                     ) -> None:
    with _init(tmp_path) as run, run.span("rollout", step=0,
                                          inputs={"tree": _nested_lists(DEPTH)}):
        pass
    [inputs] = tracklake.query("SELECT inputs FROM traces", root=tmp_path).column(0)
    node, levels = json.loads(inputs.as_py())["tree"], 0
    while isinstance(node, list):
        [node], levels = node, levels + 1
    # kept as lists 64 levels down, then as text: Python's repr where it can print it
    # (3.13 can), else a marker (3.10-3.12 raise RecursionError printing it)
    assert levels == 64 and isinstance(node, str)
    assert node.startswith("[[[") or node == "<a list nested too deeply to record>"


def test_deep_json_text_in_a_config_and_the_environment_is_kept_its_secrets_redacted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_json = ('{"api_key": "sk-0123456789abcdefghijklmn", "tree": ' + DEEP_TEXT
                   + ', "password": "hunter2x"}')
    monkeypatch.setenv("TRAINER_ARGS", secret_json)
    with _init(tmp_path, config={"shape": DEEP_TEXT}, capture_identity=True):
        pass
    [value] = tracklake.query("SELECT value FROM configs WHERE key = 'shape'",
                              root=tmp_path).column(0)
    assert json.loads(value.as_py()) == DEEP_TEXT
    [identity] = tracklake.query("SELECT identity FROM run_attempts",
                                 root=tmp_path).column(0)
    env = json.loads(identity.as_py())["env"]
    assert env["TRAINER_ARGS"] == secret_json.replace(
        "sk-0123456789abcdefghijklmn", REDACTED).replace("hunter2x", REDACTED)
    assert os.environ["TRAINER_ARGS"] == secret_json
