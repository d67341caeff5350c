"""The code the Ray actor test runs inside its actors. It imports verl only, never
tracklake, as verl's own `TaskRunner` and agent-loop workers do: whatever reaches the store
comes through tracklake's ``verl.plugins`` entry point, loaded by ``import verl``."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

BACKENDS = ["console", "tracklake", "tensorboard"]


def tracklake_modules() -> list[str]:
    """The tracklake modules this process has imported."""
    return sorted(m for m in sys.modules if m.split(".")[0] == "tracklake")


class TaskRunner:
    """Builds and feeds verl's `Tracking` as verl's `RayPPOTrainer.fit` does in its actor."""

    def start(self, project: str, experiment: str, steps: int) -> dict[str, Any]:
        before = tracklake_modules()
        from verl.utils.tracking import Tracking

        self.tracking = Tracking(project_name=project, experiment_name=experiment,
                                 default_backend=BACKENDS,
                                 config={"trainer": {"logger": BACKENDS, "seed": 7}})
        for step in range(1, steps + 1):
            self.tracking.log(data={"critic/score/mean": step / 10, "timing_s/step": 0.5},
                              step=step)
        return {"pid": os.getpid(), "before": before, "after": tracklake_modules(),
                "tracking": f"{type(self.tracking).__module__}.{type(self.tracking).__name__}"}

    def finish(self) -> None:
        self.tracking.finish(exit_code=0)


class AgentLoopWorker:
    """One traced rollout, as verl's agent-loop worker records it with
    ``trace.backend=tracklake``."""

    def rollout(self, project: str, experiment: str, step: int) -> dict[str, Any]:
        before = tracklake_modules()
        from verl.utils.rollout_trace import (
            RolloutTraceConfig,
            rollout_trace_attr,
            rollout_trace_op,
        )

        RolloutTraceConfig.init(project, experiment, "tracklake")

        class LLMClient:
            @rollout_trace_op
            async def generate(self, prompt: str) -> str:
                return prompt.upper()

        async def trajectory() -> str:
            with rollout_trace_attr(step=step, sample_index=0, rollout_n=0, name="agent_loop"):
                return str(await LLMClient().generate("hello"))

        return {"pid": os.getpid(), "before": before, "output": asyncio.run(trajectory())}
