"""Field checks for what comes from outside (attempt files, pack manifests, cursors).

Each check returns the value when it is what the field must hold and raises
`FieldError` naming the field otherwise; callers turn that into their own error naming
the file. Readers index, cast and compare these values (``int32`` partitions,
``TIMESTAMPTZ`` casts, ``" ".join`` of a command), so a wrong type is refused here, where
it is one reported problem, instead of failing every query of the store later.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard, TypeVar

T = TypeVar("T")

#: Ranks and attempts are int32 partition values in every query.
MAX_INT32 = 2**31 - 1
#: Sequence numbers, steps and sizes are int64 columns.
MAX_INT64 = 2**63 - 1
_NAME = re.compile(r"[A-Za-z0-9._+@-]{1,128}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: ISO 8601 with a time zone, as `now_iso()` writes it and DuckDB's TIMESTAMPTZ reads it.
_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})")


class FieldError(ValueError):
    """A field holds something it must not; the message names the field."""


def name(value: object, field: str) -> str:
    """A project, run or other name usable as one path component."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or set(value) == {"."}:
        raise FieldError(f"{field}: {_show(value)} is not a usable name "
                         "([A-Za-z0-9._+@-], 1 to 128 characters)")
    return value


def integer(value: object, field: str, low: int = 0, high: int = MAX_INT64) -> int:
    """An int (not a bool) in low..high."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FieldError(f"{field}: {_show(value)} is not an integer in {low}..{high}")
    return value


def text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise FieldError(f"{field}: {_show(value)} is not a string")
    return value


def boolean(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"{field}: {_show(value)} is not true or false")
    return value


def is_digest(value: object) -> TypeGuard[str]:
    """Whether `value` is a sha256 hex digest as the store names blobs: 64 lowercase hex
    digits, so that it forms no path outside the store."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def digest(value: object, field: str) -> str:
    if not is_digest(value):
        raise FieldError(f"{field}: {_show(value)} is not a sha256 hex digest")
    return value


def timestamp(value: object, field: str) -> str:
    """An ISO 8601 timestamp with its time zone (``2026-11-30T07:23:18.727506+00:00``)."""
    if not isinstance(value, str) or not _TIMESTAMP.fullmatch(value):
        raise FieldError(f"{field}: {_show(value)} is not an ISO 8601 timestamp with a "
                         "time zone")
    try:
        _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise FieldError(f"{field}: {_show(value)} is not a valid timestamp ({exc})") from exc
    return value


def one_of(value: object, field: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise FieldError(f"{field}: {_show(value)} is not one of {', '.join(allowed)}")
    assert isinstance(value, str)
    return value


def mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise FieldError(f"{field}: {_show(value)} is not an object with string keys")
    return value


def list_of(value: object, field: str, check: Callable[[object, str], T]) -> list[T]:
    if not isinstance(value, list):
        raise FieldError(f"{field}: {_show(value)} is not a list")
    return [check(v, f"{field}[{i}]") for i, v in enumerate(value)]


def strings(value: object, field: str) -> Mapping[str, str]:
    """An object whose values are all strings (an environment, package versions)."""
    for k, v in mapping(value, field).items():
        text(v, f"{field}.{k}")
    return mapping(value, field)


def optional(check: Callable[[object, str], T]) -> Callable[[object, str], T | None]:
    """`check`, letting null (and an absent field, read as null) through."""
    def checked(value: object, field: str) -> T | None:
        return None if value is None else check(value, field)
    return checked


def _show(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
