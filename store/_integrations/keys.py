"""Configs from frameworks, made fit for `Run.log_config`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def string_keys(value: Any) -> Any:
    """`value` with every mapping's keys made str (a model config's ``id2label`` has int
    keys, which `log_config` refuses)."""
    if isinstance(value, Mapping):
        return {str(k): string_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [string_keys(v) for v in value]
    return value
