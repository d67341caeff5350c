"""The opt-in that makes ``import wandb`` resolve to `tracklake.wandb` in this process,
for frameworks that import wandb themselves (transformers' WandbCallback, TRL, verl).

`install()` puts a finder first on `sys.meta_path`: ``wandb`` becomes a module whose
attributes are `tracklake.wandb`'s (``wandb.run`` follows the current run), and the few
submodules frameworks import by name (`SUBMODULES`) hold the matching names. Any other
``wandb.*`` import fails with `ModuleNotFoundError` saying so, instead of loading a piece
of the real wandb against this one. The environment variable `ENV` does the same at
interpreter start-up (through ``tracklake-wandb.pth`` in site-packages), so it reaches
subprocesses and Ray workers that inherit the environment. Without either, nothing
changes: the real wandb (if installed) is imported as always.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

#: Set to 1 (or true/yes/on), ``import wandb`` resolves to tracklake.wandb in every
#: process started with it.
ENV = "TRACKLAKE_WANDB"

#: Submodules of wandb that frameworks import by name, and what each holds here.
SUBMODULES: dict[str, dict[str, str]] = {
    "wandb.sdk": {},
    "wandb.sdk.lib": {"RunDisabled": "Run"},
    "wandb.sdk.lib.config_util": {"ConfigError": "ConfigError"},
    "wandb.sdk.lib.runid": {"generate_id": "util.generate_id"},
    "wandb.sdk.wandb_run": {"Run": "Run"},
    "wandb.sdk.wandb_settings": {"Settings": "Settings"},
    "wandb.sdk.data_types": {},
    "wandb.wandb_run": {"Run": "Run"},
    "wandb.errors": {"Error": "Error", "UsageError": "UsageError", "CommError": "CommError"},
    "wandb.util": {"generate_id": "util.generate_id"},
    "wandb.data_types": {"Table": "Table", "Histogram": "Histogram", "Image": "Image",
                         "Video": "Video", "Audio": "Audio", "Html": "Html"},
}
_PACKAGES = {"wandb", "wandb.sdk", "wandb.sdk.lib", "wandb.sdk.data_types"}


class _Alias(types.ModuleType):
    """``wandb``: every attribute is looked up on tracklake.wandb when asked, so that
    ``wandb.run``, ``wandb.config`` and ``wandb.summary`` follow the current run."""

    def __getattr__(self, name: str) -> Any:
        import tracklake.wandb as target

        return getattr(target, name)

    def __dir__(self) -> list[str]:
        import tracklake.wandb as target

        return sorted({*super().__dir__(), *target.__all__, "run", "config", "summary"})


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "wandb":
            module: types.ModuleType = _Alias("wandb")
            module.__doc__ = ("tracklake.wandb, serving `import wandb` "
                              f"({ENV}=1 or tracklake.integrations.wandb.install())")
            return module
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "wandb":
            return
        import tracklake.wandb as target

        for name, path in SUBMODULES[module.__name__].items():
            value: Any = target
            for part in path.split("."):
                value = getattr(value, part)
            setattr(module, name, value)


class Finder(importlib.abc.MetaPathFinder):
    """Finds ``wandb`` and its `SUBMODULES` as tracklake.wandb; refuses other submodules."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "wandb" and not fullname.startswith("wandb."):
            return None
        if fullname != "wandb" and fullname not in SUBMODULES:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: `import wandb` is served by tracklake.wandb "
                f"in this process ({ENV}=1 or tracklake.integrations.wandb.install()), which "
                "has only wandb's module API (docs/integrations.md)", name=fullname)
        return importlib.util.spec_from_loader(fullname, _Loader(),
                                               is_package=fullname in _PACKAGES)


def installed() -> bool:
    """True if ``import wandb`` resolves to tracklake.wandb in this process."""
    return any(isinstance(f, Finder) for f in sys.meta_path)


def install() -> None:
    """Make ``import wandb`` resolve to tracklake.wandb in this process from now on.

    If the real wandb was imported already, the modules that hold it keep it (said in a
    warning); later imports get tracklake.wandb.
    """
    if installed():
        return
    loaded = sorted(m for m in sys.modules if m == "wandb" or m.startswith("wandb."))
    if loaded:
        warnings.warn(f"tracklake.wandb now serves `import wandb`, but the real wandb was "
                      f"imported before: what imported it keeps it ({ENV}=1 in the "
                      "environment serves every import from the start)", RuntimeWarning,
                      stacklevel=2)
        for name in loaded:
            del sys.modules[name]
    sys.meta_path.insert(0, Finder())


def uninstall() -> None:
    """Undo `install()`: the next ``import wandb`` finds the real one (if installed)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Finder)]
    for name in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
        if type(sys.modules[name]) is _Alias or name in SUBMODULES:
            del sys.modules[name]


def install_from_env() -> None:
    """What ``tracklake-wandb.pth`` runs at start-up: `install()` if `ENV` says so."""
    if os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        install()
