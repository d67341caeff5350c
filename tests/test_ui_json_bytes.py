"""The dashboard's answers and the report's embedded data are written by orjson, and mean
what the standard library's `json.dumps(value, default=str)` wrote, whatever they hold."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import math
import uuid
from typing import Any

import pytest

from tracklake._ui.json_bytes import json_bytes


@dataclasses.dataclass
class _Point:
    x: int


_ODD: list[Any] = [
    {"when": dt.datetime(2026, 12, 4, 21, 52, 47, 325819, tzinfo=dt.timezone.utc),
     "day": dt.date(2026, 12, 4), "at": dt.time(1, 2, 3)},
    {"point": _Point(3), "id": uuid.UUID(int=7), "price": decimal.Decimal("1.10"),
     "raw": b"\x00\xff", "set": {1}},
    {"big": 2**64, "small": -(2**63) - 1},  # past 64 bits: orjson refuses them
    {1: "a", None: "b"},  # keys that are not texts
    {"lone": "\udcff"},  # a surrogate escaped from a file name: not valid Unicode
    {"name": "réseau/损失 🚀", "ctl": "\x00\x1f\u2028", "tuple": (1, 2.5, None)},
    {"x": [0, 1, 2**53, 1e-05, 1.5e300, -0.0], "empty": {}, "list": []},
]


@pytest.mark.parametrize("value", _ODD, ids=range(len(_ODD)))
def test_what_is_written_means_what_the_standard_library_wrote(value: Any) -> None:
    expected = json.loads(json.dumps(value, default=str))
    assert json.loads(json_bytes(value)) == expected


def test_nesting_past_orjson_s_limit_is_still_written() -> None:
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    assert json.loads(json_bytes(deep)) == deep


def test_a_value_that_is_not_finite_is_null_not_an_error() -> None:
    written = json.loads(json_bytes({"y": [1.0, math.nan, math.inf, -math.inf]}))
    assert written == {"y": [1.0, None, None, None]}


def test_a_value_neither_can_write_still_raises() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises((ValueError, RecursionError)):
        json_bytes(looped)
