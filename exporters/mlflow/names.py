"""MLflow names and limits: tracklake keys as metric, param, tag and artifact names, and
requests cut to MLflow's limits (the rules are documented in docs/exporters.md, MLflow).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from tracklake.exporters._shared.json_value import json_value
from tracklake.exporters._shared.keys import distinct_name, hashed_name

#: Limits from mlflow.utils.validation (copied so that importing this module does not
#: import mlflow; test_mlflow.py checks they still match).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_BATCH_LOG_REQUEST_SIZE = 1_000_000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_ENTITY_KEY_LENGTH = 250
MAX_TRACE_LINKS_PER_REQUEST = 100
#: Bytes of JSON sent per log_batch request: under MLflow's 1 MB with room for the envelope.
REQUEST_BUDGET = 900_000
#: Spans per log_spans request.
SPANS_PER_REQUEST = 500

RUN_ID_TAG = "tracklake.run_id"

_BAD_KEY_CHARS = re.compile(r"[^\w/.\- :]")
_T = TypeVar("_T")


#: verl's MLflow logger writes ``@`` (pass@k metrics) as this (verl.utils.tracking).
AT = "_at_"


def mlflow_key(key: str) -> str:
    """The MLflow metric/param/tag name for a tracklake key, never shared by two keys.

    As verl names it, ``@`` written ``_at_``, where that name is legal and reads back as
    the key alone (``_at_`` replaced by ``@``): ``val-core/acc/best@5`` is
    ``val-core/acc/best_at_5``; a key MLflow takes unchanged is such a name unless it
    holds ``_at_`` itself. Any other key (``time_at_peak`` too, whose plain name belongs
    to ``time@peak``) gets its cleaned form, ``@`` as ``_at_``, with ``-`` and a hash
    of the key (`hashed_name`).
    """
    name = key.replace("@", AT)
    if name.replace(AT, "@") == key and len(name) <= MAX_ENTITY_KEY_LENGTH and (
            _clean(name) == name):
        return name
    return hashed_name(key, _clean(name), _clean, limit=MAX_ENTITY_KEY_LENGTH, sep="-")


def _clean(key: str) -> str:
    """Characters MLflow refuses become ``_``; empty path segments go, ``.``/``..``
    segments become ``_``/``__`` (MLflow refuses names that change under normalisation)."""
    name = _BAD_KEY_CHARS.sub("_", key)
    parts = [p for p in name.split("/") if p]
    name = "/".join("_" * len(p) if p in (".", "..") else p for p in parts) or "_"
    return "_" + name[1:] if name.startswith("..") else name


def artifact_part(key: str) -> str:
    """A key as a relative artifact path (no ``:``, no empty, ``.`` or ``..`` parts),
    distinct for distinct keys."""
    return distinct_name(key, lambda k: _clean(k).replace(":", "_"),
                         limit=MAX_ENTITY_KEY_LENGTH, sep="-")


def step_name(step: int | None) -> str:
    return "no_step" if step is None else f"step_{step:08d}"


def param_value(json_text: str) -> str:
    """A config value (JSON text) as a param: strings as themselves, the rest as JSON."""
    value = json_value(json_text)
    return (value if isinstance(value, str) else json_text)[:MAX_PARAM_VAL_LENGTH]


def chunks(items: Sequence[_T], limit: int, size: Callable[[_T], int]) -> Iterator[list[_T]]:
    """`items` in lists of at most `limit` items and about REQUEST_BUDGET bytes."""
    chunk: list[_T] = []
    used = 0
    for item in items:
        n = size(item)
        if chunk and (len(chunk) >= limit or used + n > REQUEST_BUDGET):
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += n
    if chunk:
        yield chunk


def json_size(*texts: str) -> int:
    """An upper bound of one entity's share of a log_batch request (MLflow sends indented
    JSON with non-ASCII characters escaped: about 130 bytes besides the strings)."""
    return 200 + sum(len(json.dumps(t)) for t in texts)
