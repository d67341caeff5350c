"""A node's wall clock for the test bed (`_nodes.Node`): imported first in a node's
process, it moves the wall clock that tracklake's modules read (`time.time`,
`time.time_ns`, `datetime.datetime.now`) by ``$NODE_CLOCK`` seconds: they import a
`time` and a `datetime` module of their own whose clocks are moved. Monotonic clocks,
sleeps and timed waits stay the machine's, as on a host whose wall clock is off; a file
time set by the file system (a write, ``utime`` without times) is the file server's.
Compiled modules (pyarrow, DuckDB) keep the real modules."""

from __future__ import annotations

import builtins
import datetime
import os
import time
import types
from typing import Any

OFFSET = float(os.environ.get("NODE_CLOCK", "0"))
_Real = datetime.datetime


def _time() -> float:
    return time.time() + OFFSET


def _time_ns() -> int:
    return time.time_ns() + int(OFFSET * 1e9)


class _Meta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _Real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _Real)


class _NodeDatetime(_Real, metaclass=_Meta):
    __slots__ = ()

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _Real:  # type: ignore[override]
        return _Real.fromtimestamp(_time(), tz)


def _moved(module: types.ModuleType, **names: Any) -> types.ModuleType:
    copy = types.ModuleType(module.__name__, module.__doc__)
    copy.__dict__.update({**module.__dict__, **names})
    return copy


_MOVED = {"time": _moved(time, time=_time, time_ns=_time_ns),
          "datetime": _moved(datetime, datetime=_NodeDatetime)}
_import = builtins.__import__


def _node_import(name: str, globals: dict[str, Any] | None = None, *args: Any,
                 **kwargs: Any) -> Any:
    if name in _MOVED and str((globals or {}).get("__name__", "")).startswith("tracklake"):
        return _MOVED[name]
    return _import(name, globals, *args, **kwargs)


if OFFSET:
    builtins.__import__ = _node_import
