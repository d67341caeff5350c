"""Shared fixtures: an explicit store root per test and a clean environment."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import _optional
import pytest
from _env import stripped

#: the loopback S3 server's fixtures (s3_server, s3_env, s3_bucket), for every test
pytest_plugins = ["_s3"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--require-extras", action="store_true",
                     help="fail, instead of skipping, tests whose optional extra is missing")
    parser.addoption("--extras-not-required", default="", metavar="MODULES",
                     help="with --require-extras: these top-level modules (comma-separated) "
                          "still skip where missing, as extras that do not install on this "
                          "Python")


def pytest_configure(config: pytest.Config) -> None:
    _optional.REQUIRED = bool(config.getoption("--require-extras"))
    _optional.NOT_REQUIRED = frozenset(
        name for name in config.getoption("--extras-not-required").split(",") if name)
    # also for module-scoped fixtures, which run before `clean_environment`
    os.environ["TRACKLAKE_COMPACT"] = "0"
    os.environ["TRACKLAKE_SYSTEM_METRICS"] = "0"
    # A shell without job control starts a background job (`make test &`) with SIGINT
    # ignored, and every process started from it inherits that: the tests that stop a
    # command with Ctrl-C would see it ignored. Handled here, children start with it
    # reset to the default, as from a terminal (and xdist's workers run this too).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """With `--dist loadgroup`, a test of an `xdist_group` must carry its group in its id:
    pytest-xdist schedules by that suffix. pytest 9.2 ignores the way pytest-xdist 3.8
    adds it (pytest-dev/pytest-xdist#1386), which spread each group's tests over every
    worker without a word: heavy jobs ran side by side and session fixtures ran twice."""
    if (getattr(item.config.option, "loadgroup", False)
            and item.get_closest_marker("xdist_group") and "@" not in item.nodeid):
        pytest.fail("--dist loadgroup did not group this test: pytest-xdist cannot add the "
                    "group to a test's id on this pytest (pyproject.toml pins a range that "
                    "can)", pytrace=False)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's TRACKLAKE_/WANDB_/MLFLOW_ settings or launcher ids.

    Runs do not compact themselves unless a test asks: a detached compactor would change
    the files under tests that look at segments (tests/test_compact_auto.py asks). Nor do
    they sample system metrics, whose values and events no other test expects
    (tests/test_system_metrics.py asks)."""
    for name in list(os.environ):
        if stripped(name):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRACKLAKE_COMPACT", "0")
    monkeypatch.setenv("TRACKLAKE_SYSTEM_METRICS", "0")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty store root (as a store whose every run was pruned: its ``runs/`` folder
    and nothing else), passed explicitly to every call."""
    path = tmp_path / "store"
    (path / "runs").mkdir(parents=True)
    return path
