"""verl's own `Tracking` (real verl from PyPI, tracklake loaded through verl's plugin entry
point) with ``trainer.logger=['console','tracklake','tensorboard']``: TensorBoard is served
by a sidecar exporter started from the trainer, not by verl's writer in the trainer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from _env import child_env
from _optional import optional
from _sidecar import PATIENCE, SIDECAR_LINE, alive, wait_for

optional("verl")
optional("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    SCALARS,
    EventAccumulator,
)

from tracklake.integrations import verl as integration  # noqa: E402

TRAINER = textwrap.dedent("""
    import sys
    from verl.utils.tracking import Tracking, ValidationGenerationsLogger
    backends = ["console", "tracklake", "tensorboard"]
    tracking = Tracking("proj", "exp", backends, config={"trainer": {"seed": 1}})
    for step in range(1, 21):
        tracking.log({"critic/score/mean": step / 10, "timing_s/step": 0.5}, step=step)
    ValidationGenerationsLogger("proj", "exp").log(backends, [("q", "a", 1.0)], 20)
    tracking.finish(exit_code=0)
    print(sorted(m for m in sys.modules
                 if m.startswith(("torch.utils.tensorboard", "tensorboardX",
                                  "tracklake.exporters"))))
""")


def test_verls_tensorboard_backend_becomes_a_sidecar_exporter(tmp_path: Path,
                                                              root: Path) -> None:
    logdir = tmp_path / "tb"
    env = child_env() | {"TRACKLAKE_ROOT": str(root), "TENSORBOARD_DIR": str(logdir)}
    done = subprocess.run([sys.executable, "-c", TRAINER], env=env, capture_output=True,
                          text=True, timeout=PATIENCE, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"  # no TensorBoard writer in the trainer
    pids = [int(m[2]) for m in SIDECAR_LINE.finditer(done.stderr)]
    assert [m[1] for m in SIDECAR_LINE.finditer(done.stderr)] == ["tensorboard"]
    wait_for(f"sidecar {pids} to exit", lambda: not any(alive(p) for p in pids))
    assert not list(logdir.glob("events.out.tfevents.*"))  # verl's own writer wrote nothing
    run = integration.run_id_for("proj", "exp")
    acc = EventAccumulator(str(logdir / "proj" / run), size_guidance={SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("critic/score/mean")] == [
        (s, float(np.float32(s / 10))) for s in range(1, 21)]
    assert len(acc.Scalars("timing_s/step")) == 20
