"""An accelerate job run by the tests under ``torchrun`` (CPU, gloo):
``_accelerate_job.py ROOT {by-name|every-process}``.

Each process logs, through `Accelerator`, a value that differs by process and step, so the
store shows which process wrote what."""

from __future__ import annotations

import sys

from accelerate import Accelerator

import tracklake.integrations.accelerate  # noqa: F401  # log_with="tracklake"
from tracklake.integrations.accelerate import TracklakeTracker


def main() -> None:
    root, mode = sys.argv[1], sys.argv[2]
    if mode == "by-name":
        accelerator = Accelerator(cpu=True, log_with="tracklake")
        accelerator.init_trackers(
            "acc", config={"lr": 0.1, "model": {"layers": 2, "labels": {0: "neg"}}},
            init_kwargs={"tracklake": {"name": "tiny", "root": root}})
        rank = accelerator.process_index
        for step in range(1, 4):  # Accelerator.log runs on the main process only
            accelerator.log({"loss": 1.0 / step + rank, "skipped": None}, step=step)
        accelerator.log({"loss": 10.0 + rank})  # no step: the one after the last
        if accelerator.is_main_process:  # elsewhere get_tracker gives a blank tracker
            accelerator.get_tracker("tracklake").log_table(
                "samples", columns=["prompt", "response", "reward", "len"],
                data=[["1+1", "2", 1.0, 1], ["2+2", "5", 0.0, 1]], step=3)
        accelerator.end_training()
        return
    # every process a rank: Accelerator forwards to trackers on the main process only, so
    # each process calls its tracker itself
    tracker = TracklakeTracker(project="acc", name="ranks", root=root, all_processes=True)
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("ignored for an instance", config={"lr": 0.1})
    rank = accelerator.process_index
    for step in range(1, 4):
        tracker.log({"loss": 1.0 / step + rank}, step=step)
    tracker.log({"loss": 10.0 + rank})
    tracker.finish()
    accelerator.end_training()


if __name__ == "__main__":
    main()
