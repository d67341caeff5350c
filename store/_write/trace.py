"""Trace spans: a context manager recording one span with parent/child nesting."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import operator
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from tracklake._write.coerce import jsonable

_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "tracklake_span", default=None)
_INT64 = (-(1 << 63), (1 << 63) - 1)
#: Nesting deeper than this (or a cycle) is stored as the object's str().
_MAX_DEPTH = 64


def check_token_ids(span: str, token_ids: Iterable[Any] | None) -> list[int] | None:
    """`token_ids` as a list of ints that the int64 column holds, else an error naming the
    span and the position."""
    if token_ids is None:
        return None
    if isinstance(token_ids, (str, bytes, Mapping)):
        raise TypeError(f"span {span!r}: token_ids must be a sequence of ints, not "
                        f"{type(token_ids).__name__}")
    out: list[int] = []
    for i, token in enumerate(token_ids):
        if isinstance(token, bool):
            raise TypeError(f"span {span!r}: token_ids[{i}] is a bool, not an int")
        try:
            value = operator.index(token)
        except TypeError:
            raise TypeError(f"span {span!r}: token_ids[{i}] must be an int, not "
                            f"{type(token).__name__} {token!r}") from None
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"span {span!r}: token_ids[{i}] = {value} is outside the int64 "
                             "range of the token_ids column")
        out.append(value)
    return out


class Span:
    """One traced operation; use as ``with run.span("rollout", turn=1) as span:``.

    Nested spans (in the same thread or asyncio task) become children. Set
    ``span.outputs``, ``span.token_ids`` or attributes before the block ends.
    """

    def __init__(self, emit: Callable[[dict[str, Any]], None], name: str, *,
                 step: int | None, default_step: int | None = None, inputs: Any = None,
                 token_ids: Sequence[int] | None = None,
                 attributes: dict[str, Any] | None = None, max_length: int | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"span name must be a non-empty str, not {name!r}")
        self._emit = emit
        self.name = name
        self.step = step
        self._default_step = default_step
        self.inputs = inputs
        self.outputs: Any = None
        self.token_ids = token_ids
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.max_length = max_length
        self.span_id = secrets.token_hex(8)
        self.trace_id = ""
        self.parent_id: str | None = None
        self._token: contextvars.Token[Span | None] | None = None
        self._start_us = 0

    @property
    def token_ids(self) -> list[int] | None:
        return self._token_ids

    @token_ids.setter
    def token_ids(self, value: Iterable[Any] | None) -> None:
        """Checked on assignment, so that a bad id raises here, not when the block ends."""
        self._token_ids = check_token_ids(self.name, value)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def __enter__(self) -> Span:
        parent = _current.get()
        self.parent_id = parent.span_id if parent else None
        self.trace_id = parent.trace_id if parent else secrets.token_hex(16)
        if self.step is None:  # a child takes its parent's step, a root the run's
            self.step = parent.step if parent is not None else self._default_step
        self._token = _current.set(self)
        self._start_us = time.time_ns() // 1000
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        end_us = time.time_ns() // 1000
        if self._token is not None:
            _current.reset(self._token)
        self._emit({
            "time": self._start_us,
            "end_time": end_us,
            "step": self.step,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "name": self.name,
            "status": "error" if exc_type else "ok",
            "error": f"{exc_type.__name__}: {exc}" if exc_type else None,
            "attributes": _json(self.attributes, self.max_length),
            "inputs": _json(self.inputs, self.max_length),
            "outputs": _json(self.outputs, self.max_length),
            "token_ids": self._token_ids,
        })


def _json(value: Any, max_length: int | None) -> str | None:
    if value is None:
        return None
    text = json.dumps(plain(value), ensure_ascii=False)
    if max_length is not None and len(text) > max_length:
        text = json.dumps({"truncated": text[:max_length], "length": len(text)})
    return text


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-ready data: pydantic models (verl's rollout outputs) and dataclass
    instances become their fields, so that SQL can reach into them instead of a str()."""
    if depth > _MAX_DEPTH:
        return _text(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        value = dump()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    try:
        return jsonable(value)
    except ValueError:  # sets within sets past MAX_NESTING
        return _text(value)


def _text(value: Any) -> str:
    """What is past the depth kept, as text; a marker if even that nests too deeply for
    Python to print (a span's end never raises over what it was given)."""
    try:
        return str(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to record>"
