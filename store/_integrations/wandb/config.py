"""``wandb.config`` and ``wandb.summary``: dict-like objects (items, attributes,
``update``) that write each change to the store."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tracklake._errors import WandbConfigError, WandbError
from tracklake._write.coerce import config_to_mapping, jsonable


class Config:
    """``wandb.config``: a change of a value needs ``allow_val_change`` (W&B's rule)."""

    def __init__(self, on_change: Callable[[dict[str, Any]], None], *,
                 allow_val_change: bool = False) -> None:
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_on_change", on_change)
        object.__setattr__(self, "_allow_val_change", allow_val_change)

    def update(self, d: Any = None, allow_val_change: bool | None = None,
               **kwargs: Any) -> None:
        """Add or change keys (a mapping, dataclass, argparse Namespace or OmegaConf)."""
        values = dict(config_to_mapping(d)) if d is not None else {}
        values.update(kwargs)
        if not values:
            return
        allowed = self._allow_val_change if allow_val_change is None else allow_val_change
        items: dict[str, Any] = self._items
        for key, value in values.items():
            if (not allowed and key in items
                    and jsonable(items[key]) != jsonable(value)):
                raise WandbConfigError(
                    f'Attempted to change value of key "{key}" from {items[key]!r} to '
                    f"{value!r}; if you really want to do this, pass allow_val_change=True "
                    "to config.update()")
        items.update(values)
        self._on_change(values)

    def setdefaults(self, d: Mapping[str, Any]) -> None:
        """Set the keys of `d` that are not set yet."""
        self.update({k: v for k, v in d.items() if k not in self._items})

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __setattr__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(f"wandb.config has no key {key!r}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def keys(self) -> Any:
        return self._items.keys()

    def items(self) -> Any:
        return self._items.items()

    def values(self) -> Any:
        return self._items.values()

    def as_dict(self) -> dict[str, Any]:
        return dict(self._items)

    def persist(self) -> None:
        """W&B writes its config file here; the store has it already."""

    def __repr__(self) -> str:
        return f"tracklake.wandb.Config({self._items!r})"


class Summary:
    """``wandb.summary``: the last value of each logged metric, and what was set."""

    def __init__(self, on_set: Callable[[dict[str, Any]], None]) -> None:
        object.__setattr__(self, "_last", {})
        object.__setattr__(self, "_set", {})
        object.__setattr__(self, "_on_set", on_set)

    def _logged(self, metrics: Mapping[str, float]) -> None:
        self._last.update(metrics)

    def update(self, d: Mapping[str, Any] | None = None,
               allow_val_change: bool | None = None) -> None:
        """Set the values of `d` (``allow_val_change``, which config.update takes, is
        accepted and means nothing here, rather than becoming a summary key)."""
        values = dict(d or {})
        if values:
            self._set.update(values)
            self._on_set(values)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __setattr__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __getitem__(self, key: str) -> Any:
        if key in self._set:
            return self._set[key]
        return self._last[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"wandb.summary has no key {key!r}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._set or key in self._last

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self._last, *self._set]))

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

    def values(self) -> list[Any]:
        return [self[k] for k in self.keys()]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __repr__(self) -> str:
        return f"tracklake.wandb.Summary({dict(self.items())!r})"


class PreInit:
    """``wandb.config``/``wandb.summary`` before `init()`: any use raises, as in W&B."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _refuse(self, what: str) -> WandbError:
        return WandbError(f"You must call wandb.init() before {self._name}{what}")

    def __getitem__(self, key: str) -> Any:
        raise self._refuse(f"[{key!r}]")

    def __setitem__(self, key: str, value: Any) -> None:
        raise self._refuse(f"[{key!r}]")

    def __setattr__(self, key: str, value: Any) -> None:
        raise self._refuse(f".{key}")

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        raise self._refuse(f".{key}")

    def __repr__(self) -> str:
        return f"<{self._name} before wandb.init()>"
