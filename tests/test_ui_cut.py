"""What the dashboard sends of long texts: the run list the page asks for every second
cuts config values past 300 characters, the generations view prompts and outputs past
50,000; each cut text ends with its length and md5, so two that differ past the cut
still differ, and a search still looks through the whole text."""

from __future__ import annotations

import json
from hashlib import md5
from pathlib import Path

import tracklake
from tracklake._ui.answers import GENERATION_CHARACTERS, generations, runs


def _cut(text: str, limit: int) -> str:
    return (f"{text[:limit]}… ({len(text)} characters, "
            f"md5 {md5(text.encode()).hexdigest()[:12]})")


def test_long_config_values_are_sent_cut_and_two_that_differ_still_differ(
        tmp_path: Path) -> None:
    template = "x" * 1_000_000
    for name, tail in (("a", "1"), ("b", "2")):
        with tracklake.init(project="p", run_id=name, root=tmp_path, capture_identity=False,
                            config={"template": template + tail, "lr": 0.1}):
            pass
    answer = runs(tmp_path)
    configs = {r["run"]: r["config"] for r in answer["runs"]}
    assert configs["a"]["lr"] == configs["b"]["lr"] == "0.1"
    for name, tail in (("a", "1"), ("b", "2")):
        assert configs[name]["template"] == _cut(json.dumps(template + tail), 300)
    assert configs["a"]["template"] != configs["b"]["template"]
    assert len(json.dumps(answer)) < 5_000


def test_long_generations_are_sent_cut_and_found_by_what_is_past_the_cut(
        tmp_path: Path) -> None:
    prompt, output = "q" * 200_000, "a" * 3_000_000 + " needle"
    with tracklake.init(project="p", run_id="r", root=tmp_path,
                        capture_identity=False) as run:
        run.log_generations([{"input": prompt, "output": output, "score": 1.0},
                             {"input": prompt, "output": "short", "score": 0.0}], step=3)
    answer = generations(tmp_path, (("p", "r"),), "needle")
    [row] = answer["rows"]
    assert row["input"] == _cut(prompt, GENERATION_CHARACTERS)
    assert row["output"] == _cut(output, GENERATION_CHARACTERS)
    both = generations(tmp_path, (("p", "r"),), "")["rows"]
    assert [r["output"] for r in both] == [_cut(output, GENERATION_CHARACTERS), "short"]
    assert len(json.dumps(both)) < 4 * GENERATION_CHARACTERS
