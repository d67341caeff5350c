"""Everything about the package is in pyproject.toml; this file only ships
``tracklake-wandb.pth`` into site-packages, with a wheel and with an editable install.

At interpreter start-up, that file makes ``import wandb`` resolve to tracklake.wandb
when TRACKLAKE_WANDB=1 is set (docs/integrations.md), and does nothing otherwise.
setuptools has no option for a file at the top of site-packages: a wheel gets it from
`build_py`, an editable install from `editable_wheel`, which otherwise installs only its
own finder.
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "tracklake-wandb.pth"
SOURCE = os.path.join("store", "_integrations", "wandb", PTH)


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(SOURCE, os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class _StrategyWithPth:
    """The editable strategy setuptools picked, plus the .pth file in the wheel."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def __call__(self, wheel: Any, files: list[str], mapping: Any) -> object:
        result = self.strategy(wheel, files, mapping)
        with open(SOURCE, encoding="utf-8") as f:
            wheel.writestr(PTH, f.read())
        return result

    def __enter__(self) -> _StrategyWithPth:
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc: object) -> object:
        return self.strategy.__exit__(*exc)


class EditableWheelWithPth(editable_wheel):
    def _select_strategy(self, *args: Any, **kwargs: Any) -> Any:
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
