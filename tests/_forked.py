"""A function's answer from a forked child of the test's process."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def _put(out: multiprocessing.Queue, call: Callable[..., Any], *args: Any) -> None:  # type: ignore[type-arg]
    out.put(call(*args))


def in_forked_child(call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)` in a forked child (the parent's state as it is now), which must exit
    0 within a minute."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_put, args=(out, call, *args))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    return out.get(timeout=5)
