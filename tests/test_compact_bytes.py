"""Compaction never makes a store bigger: for each shape of benchmarks/store_bytes.py
(tiny runs, many keys, long runs) and for every record kind, the bytes of each kind's
files after compaction are at most the bytes before. Sizes are deterministic (zstd, no
timing), so these are exact checks, not measurements."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tracklake


def _bytes_by_kind(root: Path) -> dict[str, int]:
    """Bytes per top directory of the store; `.cache` (derived: the run catalog, bundles,
    deleted at any time without loss) is not the store's data."""
    sizes: dict[str, int] = {}
    for p in root.rglob("*"):
        kind = p.relative_to(root).parts[0]
        if p.is_file() and kind != ".cache":
            sizes[kind] = sizes.get(kind, 0) + p.stat().st_size
    return sizes


def _metrics(runs: int, steps: int, keys: int) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        for i in range(runs):
            with tracklake.init(project="p", run_id=f"run-{i:05d}", root=root,
                                capture_identity=False, fsync=False, compact=False) as run:
                for step in range(steps):
                    run.log({f"k{n}": step * 0.25 + n for n in range(keys)}, step=step)
    return write


def _every_kind(root: Path) -> None:
    for i in range(3):
        with tracklake.init(project="p", run_id=f"r{i}", root=root, capture_identity=False,
                            fsync=False, compact=False, config={"lr": 0.1, "seed": i}) as run:
            run.log({"loss": 1.0}, step=0)
            run.log_text("note", "hello")
            run.log_generations([("q", "a", 1.0)], step=0)
            with run.span("rollout", step=0, token_ids=[1, 2]):
                pass
            run.log_artifact(b"bytes", name="blob.bin")
            run.alert("title", "text")
            run.log_histogram("w", [0.5, 1.0, 2.0], step=0, bins=4)
            run.log_image("img", np.zeros((2, 2), np.uint8), step=0)


def _histograms(root: Path) -> None:
    rng = np.random.default_rng(0)
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        fsync=False, compact=False) as run:
        for step in range(100):
            run.log_histogram("w", rng.normal(size=1000), step=step)


def _one_value(root: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=root, capture_identity=False,
                        fsync=False, compact=False) as run:
        run.log({"x": 1.0}, step=0)


SHAPES: dict[str, Callable[[Path], None]] = {
    "tiny runs (store_bytes.py)": _metrics(runs=20, steps=10, keys=16),
    "many keys, few steps": _metrics(runs=1, steps=10, keys=1000),
    "long run": _metrics(runs=1, steps=3000, keys=16),
    "100 runs x 20 steps x 3 keys": _metrics(runs=100, steps=20, keys=3),
    "one value": _one_value,
    "every kind, one record each": _every_kind,
    "100 histograms of 64 bins": _histograms,
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_compaction_never_makes_a_shape_bigger(root: Path, shape: str) -> None:
    SHAPES[shape](root)
    before = _bytes_by_kind(root)
    report = tracklake.compact(root=root)
    assert report.parts_written and not list(root.rglob("*.arrows"))
    after = _bytes_by_kind(root)
    assert set(after) == set(before)
    grew = {k: (before[k], after[k]) for k in before if after[k] > before[k]}
    assert not grew, grew
