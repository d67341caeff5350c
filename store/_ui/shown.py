"""What a panel ran, as the page shows it beside the panel and puts into the SQL console:
the statement and its parameters as the texts ``tracklake sql --param NAME=VALUE`` takes
(a list as ``[a,b]``, infinity as ``inf``)."""

from __future__ import annotations

import math
from typing import Any


def shown(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """{"sql": ..., "params": {name: text}} for a statement run with `params`."""
    return {"sql": sql.strip(), "params": {name: _text(v) for name, v in params.items()}}


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(value)
