"""`@tracklake.trace`: each call of a function recorded as a span of the run.

The span holds the call's arguments (bound to the parameter names, ``self``/``cls``
left out) and its return value as JSON (pydantic models and dataclasses by their
fields); an exception is recorded with status ``error`` and re-raised unchanged. Calls
made inside a traced call (or inside ``run.span(...)``), in the same thread or asyncio
task, become its children: asyncio tasks copy the context they were created in.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from tracklake._errors import RunStateError
from tracklake._write import lifecycle

if TYPE_CHECKING:
    from tracklake._write.run import Run

F = TypeVar("F", bound=Callable[..., Any])
_warned_no_run = False


@overload
def trace(func: F, /) -> F: ...


@overload
def trace(*, name: str | None = None, run: Run | None = None,
          max_length: int | None = None) -> Callable[[F], F]: ...


def trace(func: Callable[..., Any] | None = None, /, *, name: str | None = None,
          run: Run | None = None, max_length: int | None = None) -> Any:
    """Record every call of a sync or async function as a span (``@tracklake.trace`` or
    ``@tracklake.trace(name=..., run=..., max_length=...)``).

    The span goes to `run`, else to the one unfinished run of this process; with none, the
    function runs unrecorded (said once on stderr); with several, `RunStateError` asks for
    `run`. `name` defaults to the function's qualified name; `max_length` cuts each JSON
    field of the span (inputs, outputs) to that many characters.
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"trace name must be a non-empty str, not {name!r}")
    if func is None:
        return functools.partial(_decorate, name=name, run=run, max_length=max_length)
    return _decorate(func, name=name, run=run, max_length=max_length)


def _decorate(func: F, *, name: str | None, run: Run | None, max_length: int | None) -> F:
    if not callable(func):
        raise TypeError(f"tracklake.trace decorates a function, not {type(func).__name__}")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        # the call returns at once; the work happens later, outside any span we could open
        raise TypeError(f"tracklake.trace cannot trace the generator function "
                        f"{func.__qualname__}: trace the function that consumes it")
    span_name = name or getattr(func, "__qualname__", None) or repr(func)
    bind = _binder(func)

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            target = _target(run)
            inputs = bind(args, kwargs) if target is not None else None
            if target is None or inputs is None:
                return await func(*args, **kwargs)
            with target.span(span_name, inputs=inputs, max_length=max_length) as span:
                span.outputs = result = await func(*args, **kwargs)
            return result
        return cast(F, traced_async)

    @functools.wraps(func)
    def traced(*args: Any, **kwargs: Any) -> Any:
        target = _target(run)
        inputs = bind(args, kwargs) if target is not None else None
        if target is None or inputs is None:
            return func(*args, **kwargs)
        with target.span(span_name, inputs=inputs, max_length=max_length) as span:
            span.outputs = result = func(*args, **kwargs)
        return result
    return cast(F, traced)


def call_inputs(signature: inspect.Signature, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by parameter name, defaults applied, ``self``/``cls`` left out;
    None when they do not fit the signature (the call itself then raises Python's error)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    inputs = dict(bound.arguments)
    first = next(iter(signature.parameters), None)
    if first in ("self", "cls"):
        inputs.pop(first, None)
    return inputs


def _binder(func: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]],
                                                 dict[str, Any] | None]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: positional and keywords
        return lambda args, kwargs: {"args": list(args), "kwargs": kwargs}
    return lambda args, kwargs: call_inputs(signature, args, kwargs)


def _target(run: Run | None) -> Run | None:
    """The run a call is recorded in, or None (recorded nowhere)."""
    global _warned_no_run
    if run is not None:
        return None if run.finished else run
    live = lifecycle.live_runs()
    if len(live) > 1:
        ids = ", ".join(sorted(f"{r.id!r} rank {r.rank}" for r in live))
        raise RunStateError(f"tracklake.trace: several runs are open in this process ({ids}); "
                            "pass run= to choose one")
    if not live:
        if not _warned_no_run:
            _warned_no_run = True
            print("tracklake: a @tracklake.trace function was called with no open run in "
                  "this process; its calls are not recorded until tracklake.init()",
                  file=sys.stderr, flush=True)
        return None
    return cast("Run", live[0])
