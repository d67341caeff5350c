"""`@tracklake.trace` records each call of a sync or async function as a span: arguments
by name, the return value as JSON (dataclasses and pydantic models by their fields), an
exception's status before it is re-raised, and nesting across threads and asyncio tasks;
read back with SQL."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest

import tracklake
from tracklake._write import traced


def _spans(root: Path, run: tracklake.Run) -> list[dict[str, Any]]:
    run.finish()
    rows = tracklake.query("SELECT name, step, status, error, trace_id, span_id, parent_id, "
                           "inputs, outputs FROM traces ORDER BY time, name",
                           root=root).to_pylist()
    for row in rows:
        for col in ("inputs", "outputs"):
            row[col] = json.loads(row[col]) if row[col] is not None else None
    return rows


@dataclasses.dataclass
class Answer:
    text: str
    tokens: list[int]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@tracklake.trace
def solve(question: str, attempts: int = 2) -> Answer:
    return Answer(question.upper(), [1, 2], {"nan": float("nan")})


@tracklake.trace(name="reward")
async def score(answer: str, *, scale: float = 1.0) -> float:
    await asyncio.sleep(0)
    return len(answer) * scale


class Agent:
    @tracklake.trace
    def act(self, observation: str) -> dict[str, str]:
        return {"action": observation[::-1]}

    @tracklake.trace
    async def episode(self, n: int) -> list[float]:
        return list(await asyncio.gather(*(score(self.act(str(i))["action"]) for i in range(n))))


def test_sync_calls_record_arguments_by_name_and_dataclass_outputs_as_json(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)
    run.log({"loss": 1.0}, step=4)
    answer = solve("why")
    assert (answer.text, answer.tokens) == ("WHY", [1, 2])  # the caller's object, unchanged
    [span] = _spans(root, run)
    assert span["name"] == "solve" and span["status"] == "ok" and span["step"] == 4
    assert span["inputs"] == {"question": "why", "attempts": 2}
    assert span["outputs"] == {"text": "WHY", "tokens": [1, 2], "extra": {"nan": "nan"}}


def test_async_calls_nest_across_concurrent_tasks_and_self_is_left_out(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)
    assert asyncio.run(Agent().episode(3)) == [1.0, 1.0, 1.0]
    spans = _spans(root, run)
    [episode] = [s for s in spans if s["name"] == "Agent.episode"]
    assert episode["inputs"] == {"n": 3} and episode["outputs"] == [1.0, 1.0, 1.0]
    children = [s for s in spans if s is not episode]
    assert sorted(s["name"] for s in children) == ["Agent.act"] * 3 + ["reward"] * 3
    assert all(s["parent_id"] == episode["span_id"] for s in children)
    assert all(s["trace_id"] == episode["trace_id"] for s in children)
    assert sorted(s["inputs"]["answer"] for s in children if s["name"] == "reward") == [
        "0", "1", "2"]
    assert all(s["inputs"]["scale"] == 1.0 for s in children if s["name"] == "reward")


def test_an_exception_is_recorded_and_re_raised_unchanged(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)
    error = KeyError("missing")

    @tracklake.trace
    def fails() -> None:
        raise error

    with pytest.raises(KeyError) as caught:
        fails()
    assert caught.value is error
    [span] = _spans(root, run)
    assert span["status"] == "error" and span["error"] == "KeyError: 'missing'"
    assert span["outputs"] is None


def test_threads_start_their_own_traces(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)

    @tracklake.trace
    def work(i: int) -> int:
        return i

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = _spans(root, run)
    assert sorted(s["inputs"]["i"] for s in spans) == list(range(8))
    assert all(s["parent_id"] is None for s in spans)
    assert len({s["trace_id"] for s in spans}) == 8


def test_without_a_run_the_function_runs_unrecorded_and_it_is_said_once(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traced, "_warned_no_run", False)
    assert solve("a").text == "A"
    assert solve("b").text == "B"
    assert capsys.readouterr().err.count("no open run") == 1


def test_pydantic_outputs_are_stored_by_their_fields(root: Path) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Turn(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        role: str
        ids: list[int]

    run = tracklake.init(project="p", name="t", root=root)

    @tracklake.trace
    def chat(turn: Turn) -> list[Turn]:
        return [turn, Turn(role="assistant", ids=[9])]

    chat(Turn(role="user", ids=[1, 2]))
    [span] = _spans(root, run)
    assert span["inputs"] == {"turn": {"role": "user", "ids": [1, 2]}}
    assert span["outputs"] == [{"role": "user", "ids": [1, 2]}, {"role": "assistant", "ids": [9]}]


def test_several_open_runs_need_an_explicit_run(root: Path) -> None:
    first = tracklake.init(project="p", name="one", root=root, rank=0)
    second = tracklake.init(project="p", name="two", root=root, rank=1)

    @tracklake.trace(run=second)
    def chosen() -> str:
        return "ok"

    try:
        with pytest.raises(tracklake.RunStateError, match="pass run= to choose one"):
            solve("x")
        assert chosen() == "ok"
    finally:
        first.finish()
    spans = _spans(root, second)
    assert [s["name"] for s in spans] == ["test_several_open_runs_need_an_explicit_run."
                                          "<locals>.chosen"]


def test_a_finished_run_stops_recording_without_breaking_the_call(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)

    @tracklake.trace(run=run)
    def after() -> int:
        return 7

    run.finish()
    assert after() == 7
    assert tracklake.query("SELECT count(*) AS n FROM traces", root=root).to_pylist() == [
        {"n": 0}]


def test_arguments_that_do_not_fit_raise_pythons_own_error(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        solve("q", nope=1)  # type: ignore[call-arg]
    assert _spans(root, run) == []


def test_generators_and_bad_names_are_refused_at_decoration() -> None:
    def numbers() -> Any:
        yield 1

    with pytest.raises(TypeError, match="generator function"):
        tracklake.trace(numbers)
    with pytest.raises(TypeError, match="non-empty str"):
        tracklake.trace(name="")
    with pytest.raises(TypeError, match="decorates a function"):
        tracklake.trace(3)  # type: ignore[call-overload]


def test_long_values_are_cut_to_max_length_and_cycles_do_not_hang(root: Path) -> None:
    run = tracklake.init(project="p", name="t", root=root)

    @tracklake.trace(max_length=50)
    def long(text: str) -> dict[str, Any]:
        loop: dict[str, Any] = {"text": text}
        loop["self"] = loop
        return loop

    long("x" * 10_000)
    [span] = _spans(root, run)
    assert span["inputs"]["length"] > 10_000 and len(span["inputs"]["truncated"]) == 50
    assert span["outputs"]["length"] > 10_000
