"""Turning what callers log into flat keys and float values, without importing torch."""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Iterator, Mapping
from typing import Any

SEPARATOR = "/"
#: how deep a logged value may nest mappings and lists: past it a value is refused with
#: its key named, where Python's recursion limit (about 1,000) would raise RecursionError
#: from somewhere inside, and a reader or exporter decoding it could hit the same
MAX_NESTING = 100


def _numpy() -> Any:
    return sys.modules.get("numpy")  # no numpy value can exist unless numpy is imported


def _is_torch_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")  # never import torch: if it is not loaded, no tensor exists
    return torch is not None and isinstance(value, torch.Tensor)


def check_key(key: object, where: str = "metric") -> str:
    """Return `key` if it can name a record, else raise TypeError/ValueError naming it."""
    if not isinstance(key, str):
        raise TypeError(f"{where} key {key!r} has type {type(key).__name__}; keys must be str")
    if not key or "\x00" in key:
        raise ValueError(f"{where} key {key!r} is empty or contains NUL")
    return key


def flatten(mapping: Mapping[str, Any], prefix: str = "", depth: int = 0
            ) -> Iterator[tuple[str, Any]]:
    """Yield (key, leaf) pairs of a nested mapping, joining nested keys with '/'; a
    ValueError naming the key where mappings nest deeper than `MAX_NESTING`."""
    if depth >= MAX_NESTING:
        raise ValueError(f"key {_shown(prefix[:-1])!r} nests mappings more than {MAX_NESTING} "
                         "levels deep; flatten it, or log it as text")
    for key, value in mapping.items():
        full = prefix + check_key(key)
        if isinstance(value, Mapping):
            yield from flatten(value, full + SEPARATOR, depth + 1)
        else:
            yield full, value


def _shown(key: str) -> str:
    return key if len(key) <= 80 else f"{key[:40]}…{key[-40:]}"


def to_float(key: str, value: object) -> float | str:
    """A metric value as float, or the value as str when it is text.

    Raises TypeError naming `key` for anything that is not a real scalar.
    """
    np = _numpy()
    if isinstance(value, bool) or (np is not None and isinstance(value, np.bool_)):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Real):  # int, float, numpy scalars, Fraction, Decimal-likes
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf  # type: ignore[operator]  # int beyond float range
    if np is not None and isinstance(value, np.ndarray):
        if value.ndim == 0 or (value.size == 1 and value.dtype.kind in "biuf"):
            return to_float(key, value.reshape(()).item())
        raise TypeError(
            f"metric {key!r}: numpy array of shape {value.shape} is not a scalar; "
            "log a summary such as .mean() instead, or a histogram (run.log_histogram, or "
            "log(..., histograms=True))"
        )
    if _is_torch_tensor(value):
        tensor: Any = value
        if tensor.numel() == 1 and not tensor.is_complex():
            return to_float(key, tensor.item())  # .item() copies from CUDA if needed
        raise TypeError(
            f"metric {key!r}: torch tensor of shape {tuple(tensor.shape)} and dtype "
            f"{tensor.dtype} is not a real scalar; log a summary such as .mean().item() "
            "instead, or a histogram (run.log_histogram, or log(..., histograms=True))"
        )
    raise TypeError(
        f"metric {key!r} has unsupported type {type(value).__module__}.{type(value).__qualname__}"
        "; log int, float, bool, str, a numpy or torch scalar, or a nested mapping of them"
    )


def coerce_metrics(metrics: Mapping[str, Any], arrays: dict[str, Any] | None = None
                   ) -> tuple[list[str], list[float], dict[str, str]]:
    """Flatten and coerce one `log()` call: (metric keys, float values, text values).

    With `arrays` (``log(..., histograms=True)``), arrays and tensors of more than one
    element are put there by key instead of being refused."""
    keys: list[str] = []
    values: list[float] = []
    texts: dict[str, str] = {}
    for key, raw in flatten(metrics):
        if arrays is not None:
            from tracklake._write.histogram import is_array

            if is_array(raw):
                arrays[key] = raw
                continue
        value = to_float(key, raw)
        if isinstance(value, str):
            texts[key] = value
        else:
            keys.append(key)
            values.append(value)
    return keys, values, texts


def config_to_mapping(config: object) -> Mapping[str, Any]:
    """A config as a plain mapping: dicts, OmegaConf DictConfig, dataclasses, argparse."""
    if config is None:
        return {}
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(config, omegaconf.DictConfig):
        resolved = omegaconf.OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
        assert isinstance(resolved, dict)
        return resolved
    if isinstance(config, Mapping):
        return config
    import dataclasses

    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "__dict__") and type(config).__name__ == "Namespace":
        return dict(vars(config))
    raise TypeError(
        f"config of type {type(config).__qualname__} is not supported; pass a mapping, an "
        "OmegaConf DictConfig, a dataclass instance or an argparse Namespace"
    )


def flatten_config(config: object) -> dict[str, Any]:
    """Flatten a config with '/' into JSON-able leaves (lists kept as lists)."""
    out: dict[str, Any] = {}
    for key, value in flatten(config_to_mapping(config)):
        try:
            out[key] = jsonable(value)
        except ValueError as exc:
            raise ValueError(f"config key {_shown(key)!r}: {exc}") from None
    return out


def jsonable(value: object, depth: int = 0) -> Any:
    """A JSON-serialisable form of a config leaf or a record attribute; a ValueError if
    its mappings and lists nest deeper than `MAX_NESTING`."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    np = _numpy()
    if np is not None and isinstance(value, np.generic):
        return jsonable(value.item(), depth)
    if np is not None and isinstance(value, np.ndarray):
        return jsonable(value.tolist(), depth)
    if _is_torch_tensor(value):
        tensor: Any = value
        return jsonable(tensor.tolist(), depth)
    sequences = sys.modules.get("omegaconf")
    mapping = isinstance(value, Mapping)
    if mapping or isinstance(value, (list, tuple, set, frozenset)) or (
            sequences is not None and isinstance(value, sequences.ListConfig)):
        if depth >= MAX_NESTING:
            raise ValueError(f"a value nests mappings and lists more than {MAX_NESTING} "
                             "levels deep")
        inner: Any = value
        if mapping:
            return {str(k): jsonable(v, depth + 1) for k, v in inner.items()}
        return [jsonable(v, depth + 1) for v in inner]
    return str(value)
