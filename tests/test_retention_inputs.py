"""Retention's inputs: the flags and `tracklake.toml` share one validation, with bounds,
and the policy file is read as input from outside the program (never a FIFO, a device,
a link or a directory; bounded; nesting and huge numbers refused by name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._ops.retention import PolicyError, load_policy


def _store(root: Path) -> None:
    for run_id in ("a", "b"):
        with tracklake.init(project="p", run_id=run_id, root=root) as run:
            run.log({"loss": 1.0}, step=0)


def _runs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "runs" / "project=p").iterdir())


def _retain(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["retain", "--root", str(root), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exception)
    return result.exit_code, result.output


@pytest.mark.parametrize(("flag", "value", "key", "toml"), [
    ("--keep-last", "-1", "keep_last", "-1"),
    ("--keep-last", str(1 << 40), "keep_last", str(1 << 40)),
    ("--downsample-every", "0", "downsample_every", "0"),
    ("--downsample-every", "1", "downsample_every", "1"),
    ("--max-size", "9" * 400, "max_size", '"' + "9" * 400 + '"'),
    ("--max-size", "1e400", "max_size", '"1e400"'),
    ("--max-age", "9" * 400 + "d", "max_age", '"' + "9" * 400 + 'd"'),
    ("--max-age", "inf", "max_age", '"inf"'),
    ("--max-age", "-1d", "max_age", '"-1d"'),
])
def test_a_bad_value_is_refused_alike_as_flag_and_in_the_policy_file(
        root: Path, flag: str, value: str, key: str, toml: str) -> None:
    """The same value gives the same refusal whether given as a flag or in TOML, each
    naming where it came from; nothing is planned, journaled or deleted."""
    _store(root)
    other = ["--downsample-after", "0s"] if key == "downsample_every" else []
    code, out = _retain(root, flag, value, *other, "--apply")
    assert code == 1 and flag in out and "Traceback" not in out, out
    (root / "tracklake.toml").write_text(f"[retention]\n{key} = {toml}\n")
    code, file_out = _retain(root, "--apply")
    assert code == 1 and f"tracklake.toml: {key}" in file_out, file_out
    assert out.split(flag, 1)[1] == file_out.split(f"tracklake.toml: {key}", 1)[1]
    assert _runs(root) == ["run=a", "run=b"]
    assert not list((root / "trash").glob("*")) if (root / "trash").exists() else True


def test_the_largest_values_that_fit_are_accepted(root: Path) -> None:
    _store(root)
    for args in (["--keep-last", str((1 << 31) - 1)], ["--max-size", str((1 << 63) - 1)],
                 ["--max-age", "365000d"]):
        code, out = _retain(root, *args, "--apply")
        assert code == 0, out
    assert _runs(root) == ["run=a", "run=b"]


def test_a_deeply_nested_policy_file_is_refused_by_name(root: Path) -> None:
    (root / "tracklake.toml").write_text("[retention]\nx = " + "[" * 100_000 + "\n")
    with pytest.raises(PolicyError, match=r"tracklake\.toml: not valid TOML"):
        load_policy(root)


@pytest.mark.parametrize("kind", ["directory", "link to /dev/zero", "link to a file",
                                  "huge"])
def test_a_policy_file_that_is_not_a_small_regular_file_is_refused(
        root: Path, tmp_path: Path, kind: str) -> None:
    path = root / "tracklake.toml"
    if kind == "directory":
        path.mkdir()
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "link to a file":
        outside = tmp_path / "elsewhere.toml"
        outside.write_text("[retention]\nmax_age = \"0s\"\n")
        path.symlink_to(outside)
    else:
        path.write_text("[retention]\n" + "# padding\n" * 200_000)
    with pytest.raises(PolicyError, match=r"tracklake\.toml") as info:
        load_policy(root)
    what = {"directory": "directory", "huge": "more than"}.get(kind, "symbolic link")
    assert what in str(info.value)


def test_a_policy_file_that_is_a_fifo_does_not_hang_retain_or_backup(
        root: Path, tmp_path: Path) -> None:
    _store(root)
    os.mkfifo(root / "tracklake.toml")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "tracklake._cli", *args],
                              capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    retain = cli("retain", "--root", str(root), "--keep-last", "5")
    assert retain.returncode == 1 and "tracklake.toml is a FIFO" in retain.stderr, retain
    backup = cli("backup", "--root", str(root), str(tmp_path / "backup"))
    assert backup.returncode == 0, backup  # a FIFO is not data: left out, never read
    assert not (tmp_path / "backup" / "tracklake.toml").exists()
    assert _runs(root) == ["run=a", "run=b"]


def test_a_policy_file_named_on_the_command_line_may_be_a_link(
        root: Path, tmp_path: Path) -> None:
    real = tmp_path / "real.toml"
    real.write_text("[retention]\nkeep_last = 1\n")
    (tmp_path / "link.toml").symlink_to(real)
    assert load_policy(root, tmp_path / "link.toml").keep_last == 1
