"""verl's rollout tracing with ``trace.backend="tracklake"``, recorded as store spans.

verl 0.9.1 picks a tracing backend with a fixed ``if`` chain inside
`verl.utils.rollout_trace` (weave, mlflow, trackio) and has no hook for another one, so
`install()` replaces three public names of that module (docs/verl.md says which and why):

- ``RolloutTraceConfig.init``: verl's, then, for the ``tracklake`` backend, the run this
  process records into (the `Tracking` run when one is open here, else the same run id
  under this process's `rollout_rank`) as the config's ``client``;
- ``rollout_trace_attr``: verl's, plus a root span named as verl names it (``agent_loop``)
  with ``step``, ``sample_index``, ``rollout_n``, ``validate`` and ``experiment_name``;
  ``trace=False`` (verl's per-worker sampling) turns off every span inside;
- ``rollout_trace_op``: verl's decorator, except with the ``tracklake`` backend, where
  the call is a child span of the open one (contextvars, so concurrent asyncio rollouts
  keep their own parents) holding the bound arguments, the output as JSON (with
  ``token2text``, ``prompt_text``/``response_text`` decoded by the instance's
  tokenizer), and an exception's status before it is re-raised.

With any other backend each name behaves exactly as verl's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import operator
import sys
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from verl.utils import rollout_trace as _verl

from tracklake._integrations.verl.rollout_rank import rollout_rank
from tracklake._integrations.verl.tracking import BACKEND, RUN_TAG, active_run, run_id_for
from tracklake._write.run import Run, init
from tracklake._write.trace import Span, plain
from tracklake._write.traced import call_inputs

_verl_op = _verl.rollout_trace_op
_verl_attr = _verl.rollout_trace_attr
_verl_init: Callable[..., None] = vars(_verl.RolloutTraceConfig)["init"].__func__

#: False inside ``rollout_trace_attr(..., trace=False)``: spans are off for that rollout.
_enabled: ContextVar[bool] = ContextVar("tracklake_rollout_trace_enabled", default=True)
#: The attributes of the enclosing ``rollout_trace_attr``, copied onto every span in it.
_attributes: ContextVar[dict[str, Any] | None] = ContextVar(
    "tracklake_rollout_trace_attributes", default=None)


def install() -> None:
    """Put tracklake's three names into `verl.utils.rollout_trace`. Idempotent."""
    _verl.rollout_trace_op = rollout_trace_op
    _verl.rollout_trace_attr = rollout_trace_attr
    setattr(_verl.RolloutTraceConfig, "init", classmethod(_init))  # noqa: B010 (a method)


def installed() -> bool:
    return _verl.rollout_trace_op is rollout_trace_op


def _init(cls: Any, project_name: str, experiment_name: str, backend: str,
          token2text: bool = False, max_samples_per_step_per_worker: int | None = None) -> None:
    """verl's `RolloutTraceConfig.init`; for the ``tracklake`` backend it also opens the run."""
    _verl_init(cls, project_name, experiment_name, backend, token2text,
               max_samples_per_step_per_worker)
    config = cls.get_instance()
    if config.backend == BACKEND and not isinstance(config.client, Run):
        config.client = _open_run(project_name, experiment_name)


def _open_run(project_name: Any, experiment_name: Any) -> Run:
    if not project_name or not experiment_name:
        raise ValueError("rollout trace backend 'tracklake' needs a project and an experiment "
                         "name (actor_rollout_ref.rollout.trace.project_name/experiment_name, "
                         "by default trainer.project_name/experiment_name), got "
                         f"{project_name!r} and {experiment_name!r}")
    project, experiment = str(project_name), str(experiment_name)
    run = active_run(project, experiment)
    if run is None:
        run = init(project=project, name=experiment, run_id=run_id_for(project, experiment),
                   rank=rollout_rank(), tags=[RUN_TAG])
        print(f"tracklake: rollout traces of verl run {run.id!r} attempt {run.attempt} "
              f"(rank {run.rank}) are written to {str(run.root)!r}", file=sys.stderr,
              flush=True)
    return run


def _run() -> Run | None:
    """The run spans go to, or None when the backend is not ``tracklake``."""
    config = _verl.RolloutTraceConfig.get_instance()
    client = config.client
    if config.backend == BACKEND and isinstance(client, Run) and not client.finished:
        return client
    return None


@contextlib.contextmanager
def rollout_trace_attr(sample_index: Any = None, step: Any = None, rollout_n: Any = None,
                       name: str = "rollout_trace", validate: bool = False,
                       trace: bool = True) -> Iterator[None]:
    """verl's context manager; with the ``tracklake`` backend, also the rollout's root span."""
    with _verl_attr(sample_index=sample_index, step=step, rollout_n=rollout_n, name=name,
                    validate=validate, trace=trace):
        run = _run()
        if run is None:
            yield
            return
        if not trace:
            enabled = _enabled.set(False)
            try:
                yield
            finally:
                _enabled.reset(enabled)
            return
        values = {"sample_index": sample_index, "step": step, "rollout_n": rollout_n}
        attributes = {k: v for k, v in values.items() if v is not None}
        attributes["validate"] = validate
        attributes["experiment_name"] = _verl.RolloutTraceConfig.get_instance().experiment_name
        token = _attributes.set(attributes)
        try:
            with _span(run, name, None, step=_as_step(step)):
                yield
        finally:
            _attributes.reset(token)


def rollout_trace_op(func: Callable[..., Any]) -> Callable[..., Any]:
    """verl's decorator; with the ``tracklake`` backend each call is a span."""
    verl_wrapped: Callable[..., Any] = _verl_op(func)  # type: ignore[no-untyped-call, unused-ignore]
    signature = inspect.signature(func)
    name = func.__qualname__

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            run = _run()
            inputs = call_inputs(signature, (self, *args), kwargs) if run is not None else None
            if run is None or inputs is None or not _enabled.get():
                return await verl_wrapped(self, *args, **kwargs)
            with _span(run, name, inputs) as span:
                result = await func(self, *args, **kwargs)
                token2text = _verl.RolloutTraceConfig.enable_token2text()
                span.outputs = await _with_text(self, inputs, result) if token2text else result
            return result
        return async_wrapper

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = _run()
        inputs = call_inputs(signature, (self, *args), kwargs) if run is not None else None
        if run is None or inputs is None or not _enabled.get():
            return verl_wrapped(self, *args, **kwargs)
        with _span(run, name, inputs) as span:
            span.outputs = result = func(self, *args, **kwargs)
        return result
    return wrapper


def _span(run: Run, name: str, inputs: Any, *, step: int | None = None) -> Span:
    span = run.span(name, step=step, inputs=inputs)
    span.attributes.update(_attributes.get() or {})
    return span


def _as_step(step: Any) -> int | None:
    """verl's step as a span step; anything that is not an int stays an attribute only."""
    if step is None or isinstance(step, bool):
        return None
    try:
        return operator.index(step)
    except TypeError:
        return None


async def _with_text(instance: Any, inputs: Mapping[str, Any], output: Any) -> Any:
    """`output` with ``prompt_text``/``response_text`` decoded as verl's token2text does:
    prompt ids from the output or the call, response ids from ``response_ids`` or
    ``token_ids``, by ``instance.tokenizer.decode`` off the event loop."""
    decode = getattr(getattr(instance, "tokenizer", None), "decode", None)
    prompt_ids = _field(output, "prompt_ids")
    if prompt_ids is None:
        prompt_ids = inputs.get("prompt_ids")
    response_ids = _field(output, "response_ids")
    if response_ids is None:
        response_ids = _field(output, "token_ids")
    fields = plain(output)
    if not callable(decode) or not isinstance(fields, dict) or (
            prompt_ids is None and response_ids is None):
        return output
    loop = asyncio.get_running_loop()
    for key, ids in (("prompt_text", prompt_ids), ("response_text", response_ids)):
        if ids is None:
            continue
        try:
            fields[key] = await loop.run_in_executor(None, decode, ids)
        except Exception as exc:  # any tokenizer error: the trace says it, the rollout goes on
            fields[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
    return fields


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)
