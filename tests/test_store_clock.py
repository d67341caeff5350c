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


def _ahead(code: str, *args: str, clock: float = 3600, bundles: str = "0") -> str:
    """Run `code` in a process whose wall clock is `clock` seconds ahead; its output."""
    env = {**os.environ, "NODE_CLOCK": str(clock), "TRACKLAKE_BUNDLES": bundles,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "import _node_clock, sys\n" + code, *args],
                          env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout


def test_a_compactor_ahead_takes_no_part_being_unpacked_for_a_left_over(root: Path) -> None:
    """`unpack` on another host writes a part under a temporary name, with no claim; a
    compactor that claims the stream removes temporaries of dead processes older than 10
    minutes. On a host an hour ahead, one written a moment ago looked an hour old, and
    its pid (another host's) is no process here: it was removed from under its writer.
    One truly left long ago is still removed."""
    planted = {}
    for name in ("fresh", "old"):
        with tracklake.init(project="p", run_id=name, root=root, compact=False,
                            capture_identity=False) as run:
            run.log({"loss": 1.0}, step=0)
        [directory] = root.glob(f"metrics/project=p/run={name}/rank=0/attempt=1")
        planted[name] = directory / \
            ".part-000000000000-000000000003-000000.parquet.999999999.tmp"
        planted[name].write_bytes(b"a part on its way")
    os.utime(planted["old"], (0, 0))  # left by a killed process long ago
    out = _ahead("import tracklake; tracklake.compact(root=sys.argv[1]); "
                 "print(len(tracklake.query('SELECT * FROM metrics', root=sys.argv[1])))",
                 str(root))
    assert out.split() == ["2"], out
    assert len(list(root.glob("metrics/**/part-*.parquet"))) == 2  # both claimed, compacted
    assert planted["fresh"].exists()
    assert not planted["old"].exists()


def test_a_backup_ahead_takes_no_copy_on_its_way_for_a_left_over(root: Path,
                                                                 tmp_path: Path) -> None:
    """Another host's backup copies into the same target under a temporary name; a
    backup on a host an hour ahead removed it as left by a killed backup. One truly left
    long ago is still removed."""
    _store(root)
    target = tmp_path / "backup"
    directory = target / "metrics/project=p/run=r1/rank=0/attempt=1"
    directory.mkdir(parents=True)
    on_its_way = directory / ".part-000000000000-000000000003-000000.parquet.999999999.tmp"
    on_its_way.write_bytes(b"a copy on its way")
    left = directory / ".part-000000000000-000000000003-000000.parquet.999999998.tmp"
    left.write_bytes(b"a copy of a killed backup")
    os.utime(left, (0, 0))
    out = _ahead("from tracklake._ops.backup import backup; from pathlib import Path; "
                 "print(len(backup(Path(sys.argv[1]), sys.argv[2])"
                 ".copied))", str(root), str(target))
    assert int(out.split()[-1]) >= 3, out
    assert list(directory.glob("part-*.parquet"))  # the backup placed r1's part there
    assert on_its_way.exists()
    assert not left.exists()


def test_a_reader_behind_still_starts_the_bundle_builder(root: Path) -> None:
    """A reader starts a bundle builder when the last one looked more than 30 s ago, by
    the mtime of the file it leaves. Two hours behind the store, that mtime was always
    in the future: no reader on that host ever started one."""
    _store(root)
    from tracklake._ops.bundle import build_bundles
    from tracklake._read.bundles import BUNDLE_DIR, CHECKED

    build_bundles(root)
    checked = root / BUNDLE_DIR / CHECKED
    a_minute_ago = checked.stat().st_mtime - 60
    os.utime(checked, (a_minute_ago, a_minute_ago))
    out = _ahead("from pathlib import Path; from tracklake._read import bundles\n"
                 "started = []\n"
                 "bundles.subprocess.Popen = lambda argv, **kw: started.append(argv)\n"
                 "print(bundles.start_builder(Path(sys.argv[1]), 10**6), len(started))",
                 str(root), clock=-7200, bundles="1")
    assert out.split() == ["True", "1"], out
