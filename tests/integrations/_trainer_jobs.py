"""What the transformers and TRL tests share: a job script run on 2 CPU processes
(``torchrun``, gloo), and the Trainer's log history under the names the store gives it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from _env import child_env


def torchrun(script: Path, root: Path, output_dir: Path, *flags: str,
             expect_ok: bool = True) -> str:
    """`script ROOT OUTPUT_DIR FLAGS...` on 2 processes; its combined output."""
    env = child_env() | {"OMP_NUM_THREADS": "1", "TRACKLAKE_COMPACT": "0",
                         "TRACKLAKE_SYSTEM_METRICS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), str(root), str(output_dir), *flags],
        env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == expect_ok, out[-4000:]
    return out


def logged(history: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """The Trainer's log history as (name W&B shows, step, value), in logging order; values
    that are not numbers (GRPO's `None`) left out, as the callback leaves them out."""
    from transformers.integrations.integration_utils import rewrite_logs

    out = []
    for entry in history:
        values = {k: v for k, v in entry.items() if k != "step"}
        for key, value in rewrite_logs(values).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append((key, entry["step"], float(value)))
    return out
