"""verl's rollout tracing with ``trace.backend="tracklake"``: verl's own decorator, context
manager and agent-loop worker code record spans in the store, read back with SQL.

The scenarios mirror verl's tests/utils/test_rollout_trace_on_cpu.py (there run against a
mocked weave client), here against the real store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _optional import optional

import tracklake

verl = optional("verl")

import warnings  # noqa: E402

import numpy as np  # noqa: E402
from verl.utils import rollout_trace as verl_trace  # noqa: E402
from verl.utils.rollout_trace import (  # noqa: E402
    RolloutTraceConfig,
    rollout_trace_attr,
    rollout_trace_op,
)

with warnings.catch_warnings():
    # verl's worker module imports Ray's state API from its old, deprecated place; not ours
    warnings.simplefilter("ignore", DeprecationWarning)
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop
    from verl.workers.rollout.replica import TokenOutput

from tracklake._integrations.verl import rollout_rank  # noqa: E402
from tracklake.integrations.verl import run_id_for  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_trace_config(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """verl's singleton reset around each test; the store given as a verl job gives it."""
    monkeypatch.setenv("TRACKLAKE_ROOT", str(root))
    RolloutTraceConfig.reset()
    yield
    client = RolloutTraceConfig.get_client()
    if isinstance(client, tracklake.Run) and not client.finished:
        client.finish()
    RolloutTraceConfig.reset()


def _spans(root: Path) -> list[dict[str, Any]]:
    client = RolloutTraceConfig.get_client()
    assert isinstance(client, tracklake.Run)
    client.finish()
    rows = tracklake.query(
        "SELECT name, step, status, error, trace_id, span_id, parent_id, attributes, inputs, "
        "outputs, rank FROM traces ORDER BY time, name", root=root).to_pylist()
    for row in rows:
        for col in ("attributes", "inputs", "outputs"):
            row[col] = json.loads(row[col]) if row[col] is not None else None
    return rows


class TracedClass:
    """verl's test class: decorated methods calling each other."""

    @rollout_trace_op
    async def my_method(self, a: str, b: str = "default") -> str:
        await asyncio.sleep(0)
        return f"result: {a}, {b}"

    @rollout_trace_op
    async def middle_method(self, a: str, b: str = "default") -> str:
        await self.my_method("test_a1", b="test_b1")
        return f"result: {a}, {b}"

    @rollout_trace_op
    async def my_method_with_exception(self) -> None:
        raise ValueError("Test Exception")

    async def upper_method(self) -> bool:
        await self.my_method("test_a0", b="test_b0")
        await self.middle_method("test_a2", b="test_b2")
        return True


def _init(**kwargs: Any) -> None:
    RolloutTraceConfig.init(project_name="proj", experiment_name="exp", backend="tracklake",
                            **kwargs)


def test_the_plugin_replaced_verls_names() -> None:
    assert verl_trace.rollout_trace_op is rollout_trace_op
    assert rollout_trace_op.__module__ == "tracklake._integrations.verl.rollout_trace"


def test_nested_ops_are_children_of_the_rollout_span_with_verls_attributes(root: Path) -> None:
    _init()
    run = RolloutTraceConfig.get_client()
    assert isinstance(run, tracklake.Run)
    assert run.id == run_id_for("proj", "exp")

    async def rollout() -> bool:
        with rollout_trace_attr(step=1, sample_index=2, rollout_n=3, name="agent_run"):
            return await TracedClass().upper_method()

    assert asyncio.run(rollout()) is True
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in _spans(root):
        rows.setdefault(row["name"], []).append(row)
    spans = {name: found[0] for name, found in rows.items()}
    root_span = spans["agent_run"]
    assert root_span["parent_id"] is None and root_span["step"] == 1
    assert root_span["attributes"] == {"sample_index": 2, "step": 1, "rollout_n": 3,
                                       "validate": False, "experiment_name": "exp"}
    middle = spans["TracedClass.middle_method"]
    assert middle["parent_id"] == root_span["span_id"]
    my = rows["TracedClass.my_method"]
    assert sorted(r["inputs"]["a"] for r in my) == ["test_a0", "test_a1"]
    parents = {r["inputs"]["a"]: r["parent_id"] for r in my}
    assert parents == {"test_a0": root_span["span_id"], "test_a1": middle["span_id"]}
    for row in (middle, *my):
        assert row["trace_id"] == root_span["trace_id"]
        assert row["step"] == 1 and row["status"] == "ok"
        assert row["attributes"]["sample_index"] == 2
    assert middle["inputs"] == {"a": "test_a2", "b": "test_b2"}
    assert middle["outputs"] == "result: test_a2, test_b2"


def test_an_exception_is_recorded_with_its_status_and_re_raised(root: Path) -> None:
    _init()
    with pytest.raises(ValueError, match="Test Exception"):
        asyncio.run(TracedClass().my_method_with_exception())
    [span] = _spans(root)
    assert span["status"] == "error"
    assert span["error"] == "ValueError: Test Exception"
    assert span["parent_id"] is None


def test_trace_false_turns_off_every_nested_op_and_tracing_resumes_after(root: Path) -> None:
    _init()

    async def rollouts() -> None:
        with rollout_trace_attr(step=1, sample_index=0, rollout_n=0, trace=False):
            assert await TracedClass().upper_method()
        with pytest.raises(RuntimeError), rollout_trace_attr(step=1, sample_index=0,
                                                             rollout_n=0, trace=False):
            raise RuntimeError("inside an untraced rollout")
        with rollout_trace_attr(step=2, sample_index=1, rollout_n=0):
            await TracedClass().my_method("traced")

    asyncio.run(rollouts())
    spans = _spans(root)
    assert sorted((s["name"], s["step"]) for s in spans) == [
        ("TracedClass.my_method", 2), ("rollout_trace", 2)]


def test_concurrent_asyncio_rollouts_keep_their_own_parents(root: Path) -> None:
    """64 rollouts interleaved on one event loop (as verl's worker gathers them): every
    span's parent is in its own rollout's trace, with its own sample_index."""
    _init()

    async def one(i: int) -> None:
        with rollout_trace_attr(step=5, sample_index=i, rollout_n=i % 4):
            await TracedClass().upper_method()

    async def all_of_them() -> None:
        await asyncio.gather(*(asyncio.create_task(one(i)) for i in range(64)))

    asyncio.run(all_of_them())
    spans = _spans(root)
    assert len(spans) == 64 * 4
    by_id = {s["span_id"]: s for s in spans}
    roots = [s for s in spans if s["parent_id"] is None]
    assert sorted(s["attributes"]["sample_index"] for s in roots) == list(range(64))
    for span in spans:
        if span["parent_id"] is None:
            continue
        parent = by_id[span["parent_id"]]
        assert parent["trace_id"] == span["trace_id"]
        assert parent["attributes"]["sample_index"] == span["attributes"]["sample_index"]
    assert len({s["trace_id"] for s in spans}) == 64


@dataclass
class Verdict:
    """A dataclass output, stored by its fields."""

    answer: str
    score: float


class Tokenized:
    """An LLM client as verl's agent loops use it: a tokenizer attribute and a traced
    `generate` returning verl's pydantic `TokenOutput`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @rollout_trace_op
    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any]) -> TokenOutput:
        return TokenOutput(token_ids=[3, 4], log_probs=[-0.5, -0.25])

    @rollout_trace_op
    def judge(self, text: str) -> Verdict:
        return Verdict(answer=text, score=1.0)


def _tokenizer() -> Any:
    """A real Hugging Face tokenizer built offline from a five-word vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "what": 1, "is": 2, "four": 3, "!": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_pydantic_and_dataclass_outputs_are_json_and_token2text_decodes(root: Path) -> None:
    _init(token2text=True)
    client = Tokenized(_tokenizer())

    async def rollout() -> TokenOutput:
        with rollout_trace_attr(step=3, sample_index=0, rollout_n=0):
            client.judge("four")
            return await client.generate("r1", prompt_ids=[1, 2],
                                         sampling_params={"temperature": 1.0})

    out = asyncio.run(rollout())
    assert isinstance(out, TokenOutput)  # the caller gets verl's object, not the trace's copy
    spans = {s["name"]: s for s in _spans(root)}
    generate = spans["Tokenized.generate"]
    assert generate["inputs"] == {"request_id": "r1", "prompt_ids": [1, 2],
                                  "sampling_params": {"temperature": 1.0}}
    assert generate["outputs"]["token_ids"] == [3, 4]
    assert generate["outputs"]["log_probs"] == [-0.5, -0.25]
    assert generate["outputs"]["prompt_text"] == "what is"
    assert generate["outputs"]["response_text"] == "four !"
    assert spans["Tokenized.judge"]["outputs"] == {"answer": "four", "score": 1.0}


def test_token2text_with_a_failing_tokenizer_records_the_error_and_the_rollout_goes_on(
        root: Path) -> None:
    _init(token2text=True)

    class Broken:
        def decode(self, ids: list[int]) -> str:
            raise RuntimeError("vocabulary missing")

    out = asyncio.run(Tokenized(Broken()).generate("r", prompt_ids=[1], sampling_params={}))
    assert out.token_ids == [3, 4]
    [span] = _spans(root)
    assert span["status"] == "ok"
    assert span["outputs"]["response_text_error"] == "RuntimeError: vocabulary missing"


def test_other_backends_are_verls_own(root: Path) -> None:
    RolloutTraceConfig.init(project_name="proj", experiment_name="exp", backend="dummy")
    assert RolloutTraceConfig.get_client() is None

    async def rollout() -> str:
        with rollout_trace_attr(step=1, sample_index=0):
            return await TracedClass().my_method("x")

    assert asyncio.run(rollout()) == "result: x, default"
    assert not any(p.is_file() for p in root.rglob("*"))


def test_tracklake_backend_without_names_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="needs a project and an experiment name"):
        RolloutTraceConfig.init(project_name=None, experiment_name=None,  # type: ignore[arg-type]
                                backend="tracklake")


# -- verl's own agent-loop worker: per-worker sampling and the rank of its actor -----------

@verl_agent_loop.register("tracklake_test_loop")
class EchoAgentLoop(verl_agent_loop.AgentLoopBase):
    """A registered verl agent loop that calls its server manager once."""

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        out = await self.server_manager.generate("req", prompt_ids=[1, 2],
                                                 sampling_params=sampling_params)
        return {"prompt_ids": [1, 2], "response_ids": out.token_ids, "index": int(kwargs["index"])}


def _worker(cfg: Any, tokenizer: Any) -> Any:
    """verl's `AgentLoopWorker` without its Ray/model set-up: the attributes its
    `generate_sequences` and `_run_agent_loop` read, and post-processing left out."""
    worker = object.__new__(verl_agent_loop.AgentLoopWorker)
    worker.config = cfg
    worker.rollout_config = cfg.actor_rollout_ref.rollout
    worker.llm_client = Tokenized(tokenizer)
    worker.tokenizer = tokenizer
    worker.processor = worker.hf_model_type = worker.dataset_cls = None
    worker.tools = []

    async def keep(output: Any, validate: bool, **kwargs: Any) -> Any:
        return output

    worker._agent_loop_postprocess = keep
    worker._postprocess = lambda outputs, input_non_tensor_batch, validate: outputs
    return worker


def test_verls_agent_loop_worker_traces_max_samples_per_step_per_worker(root: Path) -> None:
    """verl's `generate_sequences` picks 2 of 4 prompts; all their rollouts (n=2) are
    traced, each a root span with verl's step/sample_index/rollout_n/validate."""
    from test_verl import _trainer_config
    from verl import DataProto

    cfg = _trainer_config("actor_rollout_ref.rollout.agent.default_agent_loop=tracklake_test_loop")
    _init(token2text=True, max_samples_per_step_per_worker=2)
    worker = _worker(cfg, _tokenizer())
    batch = DataProto.from_dict(non_tensors={"index": np.array([0, 0, 1, 1, 2, 2, 3, 3])},
                                meta_info={"global_steps": 7, "validate": False})
    outputs = asyncio.run(worker.generate_sequences(batch))
    assert sorted(o["index"] for o in outputs) == [0, 0, 1, 1, 2, 2, 3, 3]
    spans = _spans(root)
    roots = [s for s in spans if s["name"] == "agent_loop"]
    assert len(roots) == 4 and len(spans) == 12
    sampled = sorted((s["attributes"]["sample_index"], s["attributes"]["rollout_n"])
                     for s in roots)
    assert len({i for i, _ in sampled}) == 2 and [n for _, n in sampled] == [0, 1, 0, 1]
    assert {s["step"] for s in spans} == {7}
    assert all(s["attributes"]["validate"] is False for s in roots)
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        if s["name"] == "Tokenized.generate":
            assert by_id[s["parent_id"]]["name"] == "EchoAgentLoop.run"
            assert s["outputs"]["response_text"] == "four !"
        if s["name"] == "EchoAgentLoop.run":
            assert by_id[s["parent_id"]]["name"] == "agent_loop"
            assert s["outputs"]["prompt_text"] == "what is"


def test_agent_loop_actor_ranks_are_stable_and_apart_from_trainer_ranks() -> None:
    base = rollout_rank.AGENT_LOOP_RANK_BASE
    assert rollout_rank.rank_for("a1", "agent_loop_worker_0_1a2b3c4d", {}) == base
    assert rollout_rank.rank_for("a2", "agent_loop_worker_7_ffffffff", {"RANK": "3"}) == base + 7
    # the same worker index in a restarted job: the same rank (a new attempt of its stream)
    assert rollout_rank.rank_for("other-id", "agent_loop_worker_7_00000000", {}) == base + 7
    assert rollout_rank.rank_for("a3", "WorkerDict", {"RANK": "5"}) == 5
    hashed = {rollout_rank.rank_for(f"actor{i}", None, {}) for i in range(1000)}
    assert len(hashed) == 1000
    assert all(rollout_rank.OTHER_ACTOR_RANK_BASE <= r < 2**31 for r in hashed)
    assert rollout_rank.rank_for(None, None, {"RANK": "2"}) == 2
    assert rollout_rank.rank_for(None, None, {}) == 0


KILLED_WORKER = """
import asyncio, sys
import verl  # the plugin installs tracklake's names, as in a Ray worker
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op

class Loop:
    @rollout_trace_op
    async def run(self, i):
        await asyncio.sleep(0)
        return {"i": i}

    @rollout_trace_op
    async def hang(self):
        print("hanging", flush=True)
        await asyncio.sleep(600)

async def main():
    for i in range(20):
        with rollout_trace_attr(step=1, sample_index=i, rollout_n=0, name="agent_loop"):
            await Loop().run(i)
    assert RolloutTraceConfig.get_client().flush()
    with rollout_trace_attr(step=2, sample_index=99, rollout_n=0, name="agent_loop"):
        await Loop().hang()

RolloutTraceConfig.init("proj", "exp", "tracklake")
asyncio.run(main())
"""


def test_a_worker_killed_mid_rollout_keeps_every_finished_span(root: Path) -> None:
    """SIGKILL while a rollout hangs inside its spans: the 20 finished rollouts read back
    whole; the open spans are not in the store (a span is written when it ends), and
    nothing is reported damaged."""
    import os
    import signal
    import subprocess
    import sys

    from _env import child_env

    env = child_env() | {"TRACKLAKE_ROOT": str(root)}
    with subprocess.Popen([sys.executable, "-c", KILLED_WORKER], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "hanging"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    problems = tracklake.ReadProblems()
    rows = tracklake.query("SELECT name, step, status FROM traces", root=root,
                           problems=problems).to_pylist()
    assert problems.damaged == [] and problems.foreign == [], problems
    assert sorted((r["name"], r["step"]) for r in rows) == sorted(
        [("agent_loop", 1)] * 20 + [("Loop.run", 1)] * 20)
    assert {r["status"] for r in rows} == {"ok"}
