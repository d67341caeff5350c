"""Histograms: `log_histogram` and `log(..., histograms=True)` store bin edges, counts and
statistics (also as metrics); they compact, supersede, pack and drop like the other kinds;
records that break a histogram's rules are refused by every reader, never decoded."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from _crafted import crafted_pack

import tracklake
import tracklake.read
from tracklake._format import SCHEMAS, StreamId
from tracklake._ops.fsck import fsck
from tracklake._ops.pack.pack import pack, unpack
from tracklake._ops.retention import Policy, apply_plan, make_plan


def _init(root: Path, run_id: str = "r", **options: Any) -> tracklake.Run:
    return tracklake.init(project="p", run_id=run_id, root=root, capture_identity=False,
                          system_metrics=False, **{"compact": False, **options})


def _histograms(root: Path) -> list[dict[str, Any]]:
    return tracklake.query("SELECT * EXCLUDE (time) FROM histograms ORDER BY step, key",
                           root=root).to_pylist()


def test_log_histogram_stores_numpys_bins_and_the_statistics_as_metrics(tmp_path: Path
                                                                         ) -> None:
    values = np.random.default_rng(0).normal(size=10_000)
    with _init(tmp_path) as run:
        run.log_histogram("weights", values, step=3, bins=20)
    counts, edges = np.histogram(values, bins=20)
    [row] = _histograms(tmp_path)
    assert (row["step"], row["key"], row["count"], row["nonfinite"]) == (3, "weights", 10_000, 0)
    assert row["edges"] == edges.tolist() and row["counts"] == counts.tolist()
    assert (row["min"], row["max"]) == (values.min(), values.max())
    assert math.isclose(row["mean"], values.mean()) and math.isclose(row["std"], values.std())
    metrics = {r["key"]: r["value"] for r in tracklake.query(
        "SELECT key, value FROM metrics WHERE step = 3", root=tmp_path).to_pylist()}
    assert metrics == {"weights/count": 10_000.0, "weights/min": values.min(),
                       "weights/max": values.max(), "weights/mean": row["mean"],
                       "weights/std": row["std"]}


def test_counts_already_binned_are_stored_as_given_and_bad_ones_refused_naming_the_key(
        tmp_path: Path) -> None:
    """``counts=`` with the edges as `bins` (numpy.histogram's pair, W&B's np_histogram):
    stored as given, the statistics from the midpoints; a wrong call changes nothing."""
    with _init(tmp_path) as run:
        run.log_histogram("g", counts=np.array([1, 3]), bins=[0.0, 1.0, 2.0], step=2)
        for kwargs, error in (
                ({"values": [1.0], "counts": [1], "bins": [0.0, 1.0]}, TypeError),
                ({}, TypeError),
                ({"counts": [1, 2], "bins": 2}, TypeError),
                ({"counts": [1, 2], "bins": [0.0, 1.0]}, ValueError),
                ({"counts": [1.5], "bins": [0.0, 1.0]}, ValueError),
                ({"counts": [-1], "bins": [0.0, 1.0]}, ValueError),
                ({"counts": [1], "bins": [1.0, 0.0]}, ValueError)):
            with pytest.raises(error, match="'bad'"):
                run.log_histogram("bad", step=9, **kwargs)
        run.log({"after": 1.0})  # the failed calls did not move the run's step
    [row] = _histograms(tmp_path)
    assert (row["key"], row["step"], row["counts"], row["edges"]) == (
        "g", 2, [1, 3], [0.0, 1.0, 2.0])
    assert (row["count"], row["min"], row["max"], row["mean"]) == (4, 0.0, 2.0, 1.25)
    steps = {r["key"]: r["step"] for r in tracklake.query(
        "SELECT key, step FROM metrics", root=tmp_path).to_pylist()}
    assert steps["after"] == 3


def test_given_edges_nan_and_inf_and_an_all_nan_tensor(tmp_path: Path) -> None:
    with _init(tmp_path) as run:
        run.log_histogram("a", [0.5, 1.5, math.nan, math.inf, 9.0], step=1, bins=[0, 1, 2])
        run.log_histogram("b", np.full(4, np.nan), step=1)
    a, b = _histograms(tmp_path)
    assert (a["edges"], a["counts"], a["count"], a["nonfinite"]) == ([0, 1, 2], [1, 1], 3, 2)
    assert (b["edges"], b["counts"], b["count"], b["nonfinite"]) == ([], [], 0, 4)
    assert math.isnan(b["mean"])


def test_arrays_in_log_are_refused_unless_histograms_are_asked_for(tmp_path: Path) -> None:
    class HasArray:  # any object NumPy reads (JAX, CuPy, ...), torch never imported for it
        shape = (3,)

        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
            return np.array([1.0, 2.0, 3.0])

    class HasNumpy:
        shape = (2, 2)

        def numpy(self) -> np.ndarray:
            return np.arange(4.0).reshape(2, 2)

    with _init(tmp_path) as run:
        with pytest.raises(TypeError, match=r"metric 'g'.*histograms=True"):
            run.log({"g": np.arange(4.0)}, step=0)
        run.log({"loss": 1.0, "g": np.arange(4.0), "n": {"h": HasArray(), "m": HasNumpy()},
                 "one": np.array([7.0])}, step=5, histograms=True)
        run.log({"after": 1.0})
    rows = _histograms(tmp_path)
    assert [(r["key"], r["step"], r["count"]) for r in rows] == [
        ("g", 5, 4), ("n/h", 5, 3), ("n/m", 5, 4)]
    metrics = {(r["key"], r["step"]) for r in tracklake.query(
        "SELECT key, step FROM metrics", root=tmp_path).to_pylist()}
    assert {("loss", 5), ("one", 5), ("g/mean", 5), ("n/m/std", 5), ("after", 6)} <= metrics
    assert ("g", 5) not in metrics


def test_a_torch_tensor_of_any_dtype_without_torch_imported_by_tracklake(tmp_path: Path
                                                                          ) -> None:
    torch = pytest.importorskip("torch")
    with _init(tmp_path) as run:
        run.log_histogram("bf16", torch.arange(8, dtype=torch.bfloat16), step=0, bins=4)
        run.log({"i": torch.arange(6)}, step=1, histograms=True)
    rows = _histograms(tmp_path)
    assert [(r["key"], r["count"], r["counts"]) for r in rows] == [
        ("bf16", 8, [2, 2, 2, 2]), ("i", 6, rows[1]["counts"])]
    code = ("import sys, numpy, tracklake; from tracklake._write.histogram import histogram; "
            "h = histogram('k', numpy.arange(5)); print(h.count, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["5", "False"]


@pytest.mark.parametrize(("values", "bins", "error", "match"), [
    ([], 10, ValueError, "'k': no values"),
    ([1.0, 2.0], 0, ValueError, "'k': 0 bins; give 1 to 512"),
    ([1.0, 2.0], 513, ValueError, "'k': 513 bins"),
    ([1.0, 2.0], [0.0, 2.0, 1.0], ValueError, "'k': bin edges must be finite and increasing"),
    ([1.0, 2.0], [0.0, math.nan], ValueError, "'k': bin edges"),
    ([1.0, 2.0], list(range(600)), ValueError, "'k': 600 edges"),
    ("abc", 10, TypeError, "'k': str is not an array"),
    ([1.0, 2.0], True, TypeError, "'k': bins must be"),
    (np.array(["a", "b"]), 10, TypeError, "'k': values of dtype <U1"),
    ([-1e308, 1e308], 10, ValueError, "'k': .*give the bin edges"),
])
def test_bad_input_is_refused_at_the_call_naming_the_key(
        tmp_path: Path, values: Any, bins: Any, error: type[Exception], match: str) -> None:
    with _init(tmp_path) as run, pytest.raises(error, match=match):
        run.log_histogram("k", values, step=0, bins=bins)
    assert _histograms(tmp_path) == []


def test_histograms_compact_and_a_resumed_attempt_supersedes_them(tmp_path: Path) -> None:
    with _init(tmp_path) as run:
        for step in range(4):
            run.log_histogram("w", np.arange(10.0) + step, step=step, bins=5)
    with _init(tmp_path) as run:  # attempt 2 resumes at step 2
        run.log_histogram("w", -np.arange(10.0), step=2, bins=5)
    before = _histograms(tmp_path)
    tracklake.compact(root=tmp_path)
    assert list((tmp_path / "histograms").rglob("part-*.parquet"))
    assert _histograms(tmp_path) == before
    assert [(r["step"], r["attempt"], r["min"]) for r in before] == [
        (0, 1, 0.0), (1, 1, 1.0), (2, 2, -9.0)]
    assert tracklake.query("SELECT count(*) AS n FROM histograms_all",
                           root=tmp_path).to_pylist() == [{"n": 5}]


def test_pack_unpack_and_retention_carry_and_drop_histograms(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with _init(a) as run:
        run.log_histogram("w", np.arange(100.0), step=1)
    tracklake.compact(root=a)
    pack(root=a, project="p", output=tmp_path / "x.pack")
    assert unpack(tmp_path / "x.pack", root=b).records > 0
    assert _histograms(b) == _histograms(a) and len(_histograms(b)) == 1
    assert fsck(b).clean
    plan = make_plan(b, Policy(drop_after=0.0, drop_kinds=("histograms",)), 1e12, force=["r"])
    apply_plan(b, plan, 1e12)
    assert _histograms(b) == []
    assert tracklake.query("SELECT count(*) AS n FROM metrics WHERE key = 'w/count'",
                           root=b).to_pylist() == [{"n": 1}]


# -- records that break the rules ------------------------------------------------------

def _row(seq: int, edges: list[float] | None, counts: list[int] | None, count: int = 4
         ) -> dict[str, Any]:
    return {"seq": seq, "time": 0, "step": seq, "key": f"k{seq}", "count": count,
            "nonfinite": 0, "min": 0.0, "max": 1.0, "mean": 0.5, "std": 0.1,
            "edges": edges, "counts": counts}


CRAFTED = [
    (_row(1, list(range(100_001)), [1] * 100_000), "100000 bins, more than 512"),
    (_row(2, [0.0, 1.0, 2.0], [1, 1, 1, 1, 1]), "3 edges for 5 counts"),
    (_row(3, [0.0, math.nan, 2.0], [1, 1]), "not finite and increasing"),
    (_row(4, [0.0, 2.0, 1.0], [1, 1]), "not finite and increasing"),
    (_row(5, [0.0, 1.0, 2.0], [1, -1]), "a negative or missing count"),
    (_row(6, None, [1]), "no edges or counts"),
    (_row(7, [0.0, 1.0], [1], count=-3), "negative or missing count of values"),
]


VALID = _row(0, [0.0, 1.0, 2.0], [3, 1])


def _crafted_table() -> pa.Table:
    rows = [VALID, *(r for r, _ in CRAFTED)]
    return pa.Table.from_pylist(rows, schema=SCHEMAS["histograms"])


def _write_crafted(root: Path) -> None:
    """A run whose histograms stream holds one valid record and each crafted one, written
    through the writer's own framing (as other software could)."""
    with _init(root) as run:
        for row in [VALID, *(r for r, _ in CRAFTED)]:  # one record group each, seq 0..7
            run._writer.add_rows("histograms", [{k: v for k, v in row.items() if k != "seq"}])


@pytest.mark.parametrize("compacted", [False, True])
def test_crafted_records_are_skipped_and_reported_by_readers_and_fsck(
        tmp_path: Path, compacted: bool) -> None:
    _write_crafted(tmp_path)
    if compacted:
        tracklake.compact(root=tmp_path)
        assert list((tmp_path / "histograms").rglob("part-*.parquet"))
    problems = tracklake.read.ReadProblems()
    read = [b for _, b in tracklake.read_run(tmp_path, tracklake.Cursor("p", "r"),
                                             kinds=("histograms",), problems=problems)]
    assert sum(b.num_rows for b in read) == 1 and read[0].column("key")[0].as_py() == "k0"
    [(path, why)] = problems.damaged
    assert "histograms" in str(path) and "'k1' at seq 1: 100000 bins" in why
    assert "7 such record(s) are not read" in why
    with pytest.raises(tracklake.FormatError, match="100000 bins"):
        list(tracklake.read_run(tmp_path, tracklake.Cursor("p", "r"), kinds=("histograms",)))
    [problem] = [p for p in fsck(tmp_path).problems if "invalid records" in p.what]
    assert "100000 bins" in problem.what and not problem.repairable


def test_each_crafted_record_is_refused_for_its_own_reason() -> None:
    from tracklake._format.records import invalid_records

    table = _crafted_table()
    for i, (_, reason) in enumerate(CRAFTED, 1):
        found = invalid_records("histograms", table.slice(i, 1))
        assert found is not None and reason in found[1]
    assert invalid_records("histograms", table.slice(0, 1)) is None


def test_a_pack_with_crafted_histograms_is_refused_and_nothing_unpacked(tmp_path: Path
                                                                        ) -> None:
    out = tmp_path / "bad.pack"
    crafted_pack(out, tmp_path, StreamId("p", "bad", 0, 1, "histograms"), _crafted_table())
    target = tmp_path / "target"
    with pytest.raises(tracklake.FormatError, match=r"invalid records \(histogram 'k1' at "
                                                    r"seq 1: 100000 bins"):
        unpack(out, root=target)
    assert not any(p.is_file() for p in target.rglob("*")) if target.exists() else True


def test_a_kind_of_a_newer_format_is_never_read_and_what_would_drop_it_refuses(
        tmp_path: Path) -> None:
    """What this version meets of a later format's new kind (as 1.1 met `histograms`):
    queries and exports do not see it, fsck names it, pack and backup refuse to leave it
    out silently."""
    root = tmp_path / "s"
    with _init(root) as run:
        run.log_histogram("w", [1.0, 2.0], step=0)
    tracklake.compact(root=root)
    [part] = (root / "histograms").rglob("part-*.parquet")
    future = root / "images" / part.relative_to(root / "histograms")
    future.parent.mkdir(parents=True)
    future.write_bytes(part.read_bytes())
    assert tracklake.query("SELECT count(*) AS n FROM histograms",
                           root=root).to_pylist() == [{"n": 1}]
    read = list(tracklake.read_run(root, tracklake.Cursor("p", "r")))
    assert {s.kind for s, _ in read} == {"metrics", "histograms"}
    [problem] = [p for p in fsck(root).problems if p.path == root / "images"]
    assert "kind 'images', which this tracklake (store format 1.2) does not know" in \
        problem.what and problem.todo == "upgrade tracklake"
    with pytest.raises(tracklake.StoreError, match=r"kind 'images'.*a pack would leave "
                                                   r"them out; upgrade tracklake"):
        pack(root=root, project="p", output=tmp_path / "x.pack")
    from tracklake._ops.backup import backup

    with pytest.raises(tracklake.StoreError, match=r"kind 'images'.*a backup would leave"):
        backup(root, tmp_path / "backup")
    assert not (tmp_path / "x.pack").exists() and not (tmp_path / "backup").exists()
