"""`fsck --repair` killed (SIGKILL), terminated (SIGTERM, as a batch system's time limit
sends it) or interrupted (Ctrl-C) at random points while it salvages a segment with many
damaged batches: the segment is always whole (the damaged original or the salvaged one),
the original is kept, and the next repair finishes with exactly the records an
uninterrupted repair keeps.

The signal comes at a random point after the command line is imported, within the time
an uninterrupted repair takes from there (`test_interrupt.py` does the same for other
commands)."""

from __future__ import annotations

import random
import shutil
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from _crafted import message_spans
from click.testing import CliRunner
from test_interrupt import _start, _wait_until_imported

import tracklake
from tracklake._cli.main import main
from tracklake._ops.fsck import fsck
from tracklake._read.reader import ReadProblems, list_streams, read_stream

pytestmark = pytest.mark.xdist_group("interrupt")


def _rows(root: Path) -> pa.Table:
    """The distinct (step, key, value) records that the reader gives, in one order: a
    table, as 560,000 Python tuples took most of this test's time."""
    columns = ["step", "key", "value"]
    batches = [batch.select(columns) for s in list_streams(root)
               for batch in read_stream(root, s, problems=ReadProblems())]
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.group_by(columns).aggregate([]).sort_by([(c, "ascending") for c in columns])


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A run whose one segment holds 100 batches, 30 of them damaged (one bit each)."""
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("killed") / "store"
    with tracklake.init(project="p", run_id="big", root=root, capture_identity=False,
                        compact=False, system_metrics=False) as run:
        for step in range(20_000):
            run.log({f"k{i}": rng.random() for i in range(40)}, step=step)
            if step % 200 == 199:
                run.flush()
    (seg,) = (root / "metrics").rglob("*.arrows")
    data = bytearray(seg.read_bytes())
    spans = message_spans(bytes(data))[1:]
    assert len(spans) == 100
    for start, _, end in spans[1::3][:30]:
        data[(start + end) // 2] ^= 0x10
    seg.write_bytes(bytes(data))
    return root, bytes(data)


def test_a_repair_killed_or_interrupted_anywhere_loses_nothing_and_the_next_finishes(
        damaged: tuple[Path, bytes], tmp_path: Path) -> None:
    template, original = damaged
    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    ready = tmp_path / "whole.ready"
    whole = _start(ready, "fsck", "--root", str(reference), "--repair")
    _wait_until_imported(ready, whole)
    started = time.monotonic()
    out, _ = whole.communicate(timeout=300)
    took = time.monotonic() - started
    assert "kept 70 readable batches" in out, out
    kept = _rows(reference)
    assert kept.num_rows == 70 * 200 * 40
    rng = random.Random(11)
    for attempt in range(6):
        root = tmp_path / f"s{attempt}"
        shutil.copytree(template, root)
        (seg,) = (root / "metrics").rglob("*.arrows")
        ready = tmp_path / f"s{attempt}.ready"
        proc = _start(ready, "fsck", "--root", str(root), "--repair")
        _wait_until_imported(ready, proc)
        time.sleep(rng.uniform(0.4 * took, took))  # the repair comes after the check
        how = (signal.SIGINT, signal.SIGKILL, signal.SIGTERM)[attempt % 3]
        proc.send_signal(how)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        assert seg.exists()  # never neither
        if seg.read_bytes() != original:
            assert _rows(root).equals(kept)  # replaced: by the whole salvaged segment
        again = CliRunner().invoke(main, ["fsck", "--root", str(root), "--repair"])
        assert again.exit_code in (0, 1), again.output
        assert fsck(root).clean, (attempt, how, [p.line(root) for p in fsck(root).problems])
        assert [p.name for p in seg.parent.iterdir()] == [seg.name]  # no salvage left aside
        assert _rows(root).equals(kept), (attempt, how)
        quarantined = [p.read_bytes() for p in (root / "quarantine").rglob("*.arrows*")]
        assert original in quarantined, (attempt, how)
