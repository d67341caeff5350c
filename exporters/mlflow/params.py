"""A stored config leaf as MLflow params: tracklake's rule, or verl's for runs verl logged.

tracklake stores a config flattened with ``/`` down to its leaves, lists kept whole, each
leaf as JSON text. Its own rule gives one param per leaf (strings as themselves, the rest
as JSON). verl's MLflow logger gives the same config other names and values, and verl
users compare runs by them: every list is expanded into ``key/list_len``, ``key/0``,
``key/1``, ... (recursively, dicts inside lists flattened with ``/``), empty dicts leave
nothing, and each value is Python's ``str()`` of it (``True``, ``None``, ``1e-06``)
(`verl.utils.tracking._compute_mlflow_params_from_objects` then ``mlflow.log_params``).
Runs opened by tracklake's verl integration carry the tag `VERL_RUN_TAG`, and only
their params follow verl's rule, so nothing changes for any other run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from tracklake.exporters._shared.json_value import json_value
from tracklake.exporters.mlflow.names import MAX_PARAM_VAL_LENGTH, mlflow_key, param_value

#: The run tag tracklake's verl integration sets (`tracklake.integrations.verl`).
VERL_RUN_TAG = "tracklake.integration=verl"


def is_verl_run(tags: Sequence[str]) -> bool:
    """True if the run was opened by verl's `Tracking` through tracklake's plugin."""
    return VERL_RUN_TAG in tags


def config_params(key: str, json_text: str, *, verl: bool) -> dict[str, str]:
    """The MLflow params (name -> value) of the stored config leaf `key`."""
    if not verl:
        return {mlflow_key(key): param_value(json_text)}
    return {mlflow_key(name): value[:MAX_PARAM_VAL_LENGTH]
            for name, value in _verl_leaves(key, json_value(json_text))}


def _verl_leaves(key: str, value: Any) -> Iterator[tuple[str, str]]:
    """verl's expansion of one value: lists as ``list_len`` and indices, dicts by key."""
    if isinstance(value, list):
        yield f"{key}/list_len", str(len(value))
        for i, item in enumerate(value):
            yield from _verl_leaves(f"{key}/{i}", item)
    elif isinstance(value, dict):
        for sub, item in value.items():
            yield from _verl_leaves(f"{key}/{sub}", item)
    else:
        yield key, str(value)
