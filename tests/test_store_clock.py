"""A reader whose wall clock is hours off the clock that stamps the store's mtimes (a
file server's): what it keeps by mtime (the run catalog's entries) is judged by the
store's clock, which it measures with a file it creates and removes in ROOT/.cache.

Each reader is a process of its own whose tracklake modules see a wall clock moved by
``$NODE_CLOCK`` seconds (`_node_clock`, as on the many-node test bed), on a local store,
so that the files' mtimes are this machine's; bundles are off, so that no builder
process with the machine's clock catalogues the runs behind the reader's back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _settled import age

import tracklake

READER = """
import _node_clock
import json, sys
from pathlib import Path
import tracklake
from tracklake._read.catalog import RunCatalog
root = Path(sys.argv[1])
answers = [tracklake.query("SELECT count(*) AS n FROM metrics", root=root).to_pylist()
           for _ in range(2)]
print(json.dumps({"answers": answers,
                  "catalogued": len(RunCatalog(root).settled(None, None)),
                  "cache": sorted(p.name for p in (root / ".cache").iterdir())}))
"""


def _store(root: Path) -> None:
    for i in range(3):
        with tracklake.init(project="p", run_id=f"r{i}", root=root, compact=False,
                            capture_identity=False) as run:
            for step in range(4):
                run.log({"loss": float(step)}, step=step)
    tracklake.compact(root=root)  # parts: what the catalog holds


def _read(root: Path, clock: float) -> dict[str, object]:
    env = {**os.environ, "NODE_CLOCK": str(clock), "TRACKLAKE_BUNDLES": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", READER, str(root)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


def test_a_reader_whose_clock_is_behind_catalogues_settled_runs(root: Path) -> None:
    """Two hours behind, every file looked written in the future: nothing was ever
    catalogued, and every question paid what the first does (49 ms against 10 ms on 30
    tiny runs), for as long as the clocks stayed apart."""
    _store(root)
    age(root)  # settled by the store's clock
    result = _read(root, clock=-7200)
    assert result["answers"] == [[{"n": 12}]] * 2
    assert result["catalogued"] == 3
    cache = result["cache"]
    assert isinstance(cache, list) and not [n for n in cache if n.endswith(".tmp")], cache


def test_a_reader_whose_clock_is_ahead_keeps_nothing_written_just_now(root: Path) -> None:
    """Two hours ahead, files written a moment ago looked two hours old, and the
    catalog kept runs that could still change within one mtime tick unseen."""
    _store(root)
    age(root, -120)  # changed within the racy window by the store's clock, however slow
    result = _read(root, clock=7200)  # the reader starts
    assert result["answers"] == [[{"n": 12}]] * 2
    assert result["catalogued"] == 0


def test_where_no_probe_can_be_made_the_reader_answers_on_its_own_clock(root: Path) -> None:
    """ROOT/.cache is a file (planted, or a store this reader may not write): no clock
    is measured, nothing is written, and the answers are the same."""
    _store(root)
    age(root)
    shutil.rmtree(root / ".cache", ignore_errors=True)
    (root / ".cache").write_bytes(b"not a directory")
    env = {**os.environ, "NODE_CLOCK": "-7200", "TRACKLAKE_BUNDLES": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    code = ("import _node_clock, sys, tracklake; from pathlib import Path; "
            "from tracklake._format.store_clock import store_skew_ns; "
            "print(tracklake.query('SELECT count(*) AS n FROM metrics', "
            "root=sys.argv[1]).to_pylist(), store_skew_ns(Path(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["[{'n':", "12}]", "0"], out
    assert (root / ".cache").read_bytes() == b"not a directory"


def test_a_host_ahead_takes_no_file_being_written_for_a_left_over(root: Path) -> None:
    """A temporary of another host's process (its pid means nothing here), written a
    moment ago: fsck on a host an hour ahead took it for a copy left by a killed process
    (an hour old by its clock), which `--repair` moves away from under its writer."""
    _store(root)
    directory = next(root.glob("metrics/project=p/run=r0/rank=0/attempt=1"))
    being_written = directory / ".part-000000000000-000000000003-000000.parquet.999999999.tmp"
    being_written.write_bytes(b"a part on its way")
    env = {**os.environ, "NODE_CLOCK": "3600",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    code = ("import _node_clock, sys; from pathlib import Path; "
            "from tracklake._ops.fsck import fsck; "
            "print([str(p.path) for p in fsck(Path(sys.argv[1])).problems])")
    out = subprocess.run([sys.executable, "-c", code, str(root)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]", out
    assert being_written.exists()
