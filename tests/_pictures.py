"""A fixed data set for the terminal charts and the report: two runs with smooth,
deterministic curves, generations, traces and alerts, and text that would run as script
if a report failed to escape it."""

from __future__ import annotations

import math
from pathlib import Path

import tracklake

#: Text from the store that must stay text in a report.
HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='x'\">"


def write_runs(root: Path) -> None:
    """`base` (ranks 0 and 1, steps 0..199) and `tuned` (rank 0, steps 0..149)."""
    for rank in (0, 1):
        with tracklake.init(project="p", run_id="base", rank=rank, root=root,
                            name=f"baseline {HOSTILE}", config={"optim": {"lr": 1e-4},
                                                                "note": HOSTILE}) as run:
            for step in range(200):
                run.log({"loss": 2 * math.exp(-step / 60) + 0.2 * rank,
                         "reward": 1 - math.exp(-step / 80) - 0.1 * rank,
                         "kl": 0.001 * step}, step=step)
            if rank == 0:
                run.log_generations([{"input": "what is 2+2?", "output": HOSTILE,
                                      "score": 1.0},
                                     {"input": "capital of France", "output": "Paris",
                                      "score": 0.5}], step=100, key="val")
                with run.span("rollout", step=100, inputs={"prompt": HOSTILE}) as span:
                    with run.span("tool", step=100, tool="calculator"):
                        pass
                    span.outputs = {"answer": "4"}
                run.alert("reward plateau", HOSTILE, level="warning", step=150)
    with tracklake.init(project="p", run_id="tuned", rank=0, root=root, name="tuned",
                        config={"optim": {"lr": 3e-4}, "note": "plain"}) as run:
        for step in range(150):
            run.log({"loss": 1.5 * math.exp(-step / 40), "reward": 1 - math.exp(-step / 40)},
                    step=step)
