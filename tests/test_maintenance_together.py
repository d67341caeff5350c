"""`fsck --repair`, `compact` and `retain --apply` run at once, in loops, on a store with
damaged segments, each stopped at random moments (SIGKILL, SIGTERM, or SIGINT as Ctrl-C
sends it), while a reader asks: no command fails, no question fails, and once they have
run one after the other the store holds exactly what running them only one after the
other leaves."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _crafted import message_spans

import tracklake

pytestmark = pytest.mark.slow

COMMANDS = {
    "repair": ("fsck", "--repair", "-q"),
    "compact": ("compact",),
    "retain": ("retain", "--apply", "--keep-last", "3", "-q"),
}
SECONDS = 8.0


def _build(root: Path) -> None:
    rng = random.Random(3)
    for i in range(3):
        with tracklake.init(project="p", run_id=f"r{i}", root=root, capture_identity=False,
                            compact=False, system_metrics=False) as run:
            for step in range(600):
                run.log({f"k{j}": rng.random() for j in range(10)}, step=step)
                if step % 30 == 29:
                    run.flush()
    for i in range(4):  # `--keep-last 3` deletes the oldest
        with tracklake.init(project="q", run_id=f"s{i}", root=root, capture_identity=False,
                            compact=False, system_metrics=False) as run:
            for step in range(50):
                run.log({"loss": float(step * i)}, step=step)
        time.sleep(0.02)
    for i in range(2):  # a bit flipped in every third batch of r0's and r1's segments
        (seg,) = (root / "metrics" / "project=p" / f"run=r{i}").rglob("*.arrows")
        data = bytearray(seg.read_bytes())
        for start, _, end in message_spans(bytes(data))[1:][1::3]:
            data[(start + end) // 2] ^= 0x10
        seg.write_bytes(bytes(data))


def _cli(root: Path, args: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "tracklake._cli.main", *args, "--root", str(root)]


def _one_after_another(root: Path) -> None:
    for name in ("repair", "compact", "retain", "compact"):
        done = subprocess.run(_cli(root, COMMANDS[name]), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr


def _rows(root: Path) -> list[dict[str, Any]]:
    return tracklake.query("SELECT project, run, rank, attempt, step, key, value FROM "
                           "metrics ORDER BY ALL", root=root).to_pylist()


def _stopped_outside_the_command(code: int, err: str) -> bool:
    """Python's own end for Ctrl-C (death by SIGINT, after a KeyboardInterrupt traceback
    if it was running Python code), which comes only while the command's handler is not
    in place: the interpreter starting or importing tracklake, or exiting after the
    command returned (or after a first Ctrl-C had it say it was interrupted)."""
    return code == -signal.SIGINT and (
        "Traceback" not in err or err.rstrip().endswith("KeyboardInterrupt"))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the damage, until it is repaired
def test_repair_compaction_and_retention_at_once_killed_anywhere_end_as_in_turn(
        tmp_path: Path) -> None:
    template, alone, together = (tmp_path / n for n in ("template", "alone", "together"))
    _build(template)
    shutil.copytree(template, alone, symlinks=True)
    shutil.copytree(template, together, symlinks=True)
    _one_after_another(alone)
    expected = _rows(alone)
    assert {r["run"] for r in expected} == {"r0", "r1", "r2", "s1", "s2", "s3"}
    rng = random.Random(11)
    running: dict[str, subprocess.Popen[str]] = {}
    ran = dict.fromkeys(COMMANDS, 0)
    killed = 0
    asked = 0
    stop = time.monotonic() + SECONDS
    while time.monotonic() < stop or running:
        for name, args in COMMANDS.items():
            proc = running.get(name)
            if proc is not None and proc.poll() is not None:
                _, err = proc.communicate()
                assert _stopped_outside_the_command(proc.returncode, err) or (
                    proc.returncode in (0, 1, 130, -signal.SIGKILL, -signal.SIGTERM)
                    and "Traceback" not in err), (name, proc.returncode, err)
                ran[name] += 1
                del running[name]
            if name not in running and time.monotonic() < stop:
                running[name] = subprocess.Popen(_cli(together, args), text=True,
                                                 stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE)
        if running and rng.random() < 0.1:
            running[rng.choice(sorted(running))].send_signal(
                rng.choice((signal.SIGKILL, signal.SIGTERM, signal.SIGINT)))
            killed += 1
        tracklake.query("SELECT count(*) FROM metrics", root=together)  # never fails
        asked += 1
        time.sleep(0.05)
    assert killed and all(ran.values()) and asked
    _one_after_another(together)
    assert _rows(together) == expected
    check = subprocess.run(_cli(together, ("fsck",)), capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not [p for p in together.rglob("*") if p.name.endswith(".tmp")]
