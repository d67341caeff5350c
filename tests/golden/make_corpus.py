"""Write the golden corpus of this format version: `python tests/golden/make_corpus.py`.

Run it once per released format version; the tests read every version kept here, so a
later tracklake that cannot read an old store fails CI. Never regenerate an old version.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

import tracklake
from tracklake._format import FORMAT_VERSION

HERE = Path(__file__).parent


def expected_value(step: int, key: int, attempt: int) -> float:
    return step * 0.5 + key + 1000 * (attempt - 1)


def histogram_values(step: int) -> list[float]:
    return [float(step + i) for i in range(8)]


#: The pixels and samples of the media of format 1.2 (rank 1's are the same bytes: stored
#: once).
IMAGE = np.array([[0, 64], [128, 255]], dtype=np.uint8)
AUDIO = np.array([0.0, 0.5, -0.5, 1.0])


def write(root: Path) -> None:
    # run "done": compacted, two ranks, every kind of record
    for rank in (0, 1):
        with tracklake.init(project="golden", run_id="done", root=root, rank=rank,
                            capture_identity=False, config={"lr": 1e-3, "model": {"n": 2}},
                            tags=["golden"]) as run:
            for step in range(20):
                run.log({f"k{key}": expected_value(step, key, 1) for key in range(3)}, step=step)
            run.log_text("note", "hello", step=3)
            run.log_generations([("in", "out", 1.0), {"input": "a", "output": "b", "score": 0.5,
                                                      "tag": "x"}], step=5)
            with run.span("rollout", step=7, inputs={"q": 1}, token_ids=[1, 2, 3]) as span:
                with run.span("tool"):
                    pass
                span.outputs = {"a": 2}
            run.log_artifact(b"artifact-bytes", name="blob.bin")
            for step in (10, 19):  # format 1.2: histograms (and their statistics as metrics)
                run.log_histogram("h", histogram_values(step), step=step, bins=4)
            run.log_image("img", IMAGE, step=12, caption="golden")  # format 1.2: media
            run.log_audio("snd", AUDIO, sample_rate=8000, step=12)
            run.alert("golden alert", "text", level="info", step=9)
    tracklake.compact(root=root)
    # run "resumed": live segments only, attempt 2 re-logs steps >= 10
    for attempt in (1, 2):
        with tracklake.init(project="golden", run_id="resumed", root=root, rank=0,
                            capture_identity=False) as run:
            for step in range(0 if attempt == 1 else 10, 15 if attempt == 1 else 20):
                run.log({f"k{key}": expected_value(step, key, attempt) for key in range(3)},
                        step=step)
    # run "torn": a writer killed mid-batch: its last batch is cut short, no end marker
    with tracklake.init(project="golden", run_id="torn", root=root, rank=0,
                        capture_identity=False) as run:
        for step in range(10):
            run.log({"k0": expected_value(step, 0, 1)}, step=step)
            run.flush()
    segment = next((root / "metrics").glob("project=golden/run=torn/rank=0/attempt=1/*seg-*"))
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - 8 - 20])


if __name__ == "__main__":
    # only the explicit compact() of run "done": the others keep their live segments
    os.environ["TRACKLAKE_COMPACT"] = "0"
    os.environ["TRACKLAKE_SYSTEM_METRICS"] = "0"
    target = HERE / FORMAT_VERSION
    if target.exists() and "--force" not in sys.argv:
        sys.exit(f"{target} exists; golden corpora are never regenerated")
    shutil.rmtree(target, ignore_errors=True)
    write(target)
    print(f"wrote {target}")
