"""A destination whose files were deleted after an export: the next export says so,
naming the missing file, and `--from-start` exports the run again from its start."""

from __future__ import annotations

import shutil
from pathlib import Path

from _tensorboard_log import scalar_steps
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main


def _export(root: Path, logdir: Path, *more: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["export", "tensorboard", "--root", str(root),
                                       "--run", "r", "--logdir", str(logdir), *more])
    return result.exit_code, result.output


def test_a_deleted_log_directory_is_said_and_from_start_exports_again(
        root: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    with tracklake.init(project="p", run_id="r", root=root) as run:
        for step in range(30):
            run.log({"loss": float(step)}, step=step)
    code, out = _export(root, logdir)
    assert code == 0, out
    assert scalar_steps(logdir) == list(range(30))
    shutil.rmtree(logdir)

    code, out = _export(root, logdir)  # before: "0 records", exit 0, nothing written
    assert code != 0, out
    assert str(logdir / "p" / "r") in out and "is missing" in out and "--from-start" in out
    assert not logdir.exists()

    code, out = _export(root, logdir, "--from-start")
    assert code == 0, out
    assert scalar_steps(logdir) == list(range(30))
    code, out = _export(root, logdir)  # the new state stands: nothing again, no error
    assert code == 0, out
    assert scalar_steps(logdir) == list(range(30))
