"""``wandb.Settings``: takes every setting W&B has; `tracklake.wandb` reads ``mode``,
``x_primary`` and ``x_label`` (W&B's shared mode), the others are kept and ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: W&B's modes; ``dryrun`` and ``run`` are its old names of offline and online.
MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")


class Settings:
    """``wandb.Settings(**settings)``; a setting that was not given reads as None."""

    def __init__(self, **settings: Any) -> None:
        if "x_primary_node" in settings:  # W&B's older name
            settings.setdefault("x_primary", settings.pop("x_primary_node"))
        mode = settings.get("mode")
        if mode is not None and mode not in MODES:
            raise ValueError(f"Settings(mode={mode!r}): mode must be one of {MODES}")
        self.__dict__.update(settings)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return None

    def update(self, settings: Mapping[str, Any] | None = None, **more: Any) -> None:
        self.__dict__.update({**(settings or {}), **more})

    def given(self) -> dict[str, Any]:
        """The settings given, by name."""
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"tracklake.wandb.Settings({self.__dict__!r})"


def as_settings(settings: Settings | Mapping[str, Any] | Any | None) -> Settings:
    """`init(settings=...)` as a `Settings`: ours, a mapping, or another object's
    public attributes (the real ``wandb.Settings``)."""
    if settings is None:
        return Settings()
    if isinstance(settings, Settings):
        return settings
    if isinstance(settings, Mapping):
        return Settings(**settings)
    dump = getattr(settings, "model_dump", None)  # the real wandb.Settings is pydantic
    if callable(dump):
        return Settings(**{k: v for k, v in dump().items() if v is not None})
    return Settings(**{k: v for k, v in vars(settings).items() if not k.startswith("_")})
