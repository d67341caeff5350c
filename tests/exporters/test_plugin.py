"""A third party adds a destination by installing a package with a `tracklake.exporters`
entry point; `tracklake export <name>` then finds it, with its own options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tracklake

PLUGIN = Path(__file__).parent.parent / "plugin"


def test_an_installed_plugin_is_found_and_exports(root: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    source = tmp_path / "plugin"  # pip builds in the source tree: keep the repository clean
    shutil.copytree(PLUGIN, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site), str(source)],
                   check=True, capture_output=True)
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False) as run:
        for step in range(3):
            run.log({"x": float(step)}, step=step)
        run.log_artifact(b"weights!", name="model.bin", step=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get(
        "PYTHONPATH", "")])}
    listed = subprocess.run([sys.executable, "-m", "tracklake._cli.main", "export", "--help"],
                            capture_output=True, text=True, env=env, check=True)
    assert "hello" in listed.stdout
    out = tmp_path / "hello.jsonl"
    done = subprocess.run([sys.executable, "-m", "tracklake._cli.main", "export", "hello",
                           "--root", str(root), "--all", "--out", str(out)],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"run": "p/r", "step": s, "key": "x", "value": float(s)} for s in range(3)
                     ] + [{"run": "p/r", "artifact": "model.bin", "head": "weights!"},
                          {"run": "p/r", "finished": "finished"}]


class Incomplete:
    """A destination class that follows the old, partial contract (no `start`, no
    `describe`, no `cli_options`...)."""

    name = "incomplete"

    def open_run(self, run: Any, state: Any) -> None: ...
    def write(self, run: Any, kind: str, records: Any) -> None: ...
    def commit(self, run: Any) -> dict[str, Any]: return {}
    def finish_run(self, run: Any) -> None: ...
    def close(self) -> None: ...


def test_a_plugin_missing_part_of_the_contract_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from tracklake.exporters import _registry

    point = EntryPoint("incomplete", f"{__name__}:Incomplete", _registry.GROUP)
    monkeypatch.setattr(_registry, "entry_points", lambda group: [point])
    with pytest.raises(TypeError, match="lacks commit_interval, cli_options, from_cli, "
                                        "describe, start of the Destination contract"):
        _registry.load("incomplete")
