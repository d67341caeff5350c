"""A tiny transformers Trainer job, run by the tests under ``torchrun`` (CPU, gloo):
``_hf_train.py ROOT OUTPUT_DIR [--report-to] [--no-callback] [--crash-at N] [--resume]``.

A one-layer GPT-2 of 8 dimensions is built here (no hub download) and trained for 6 steps
on 2 processes; it evaluates and checkpoints every 3 steps and evaluates once more after
`train()`. World rank zero writes the Trainer's own log history to
``OUTPUT_DIR/log_history.json``, which the tests compare with the store."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class CrashAt(TrainerCallback):
    """Every process fails at the end of optimizer step `step`, before it is logged."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


def write_log_history(trainer: Trainer, output_dir: str) -> None:
    """The Trainer's own log history, on world rank zero, where the tests read it."""
    if trainer.is_world_process_zero():
        Path(output_dir, "log_history.json").write_text(json.dumps(trainer.state.log_history))


def end(trainer: Trainer, output_dir: str) -> None:
    """Writes the log history and exits as a normal exit would, but without the interpreter's
    teardown. There gloo's worker threads, still releasing the last collective's tensors,
    wait for the GIL the tearing-down main thread holds while it joins them: the job hangs
    or aborts ("terminate called without an active exception") after all its work is done,
    a torch fault (pytorch/pytorch#179291) any job of theirs can meet."""
    write_log_history(trainer, output_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # tracklake's own exit handler among them, as at a normal exit
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("output_dir")
    parser.add_argument("--report-to", action="store_true")
    parser.add_argument("--no-callback", action="store_true")
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    os.environ["TRACKLAKE_ROOT"] = opts.root
    callbacks: list[Any] = []
    report_to: Any = "none"
    if not opts.no_callback:
        from tracklake.integrations.transformers import TracklakeCallback

        if opts.report_to:
            report_to = "tracklake"
        else:
            callbacks.append(TracklakeCallback(project="hf", name="tiny"))
    if opts.crash_at:
        callbacks.append(CrashAt(opts.crash_at))
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=64, n_positions=16,
                        id2label={0: "a", 1: "b"})
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=opts.output_dir, max_steps=6, per_device_train_batch_size=2,
        per_device_eval_batch_size=4, logging_steps=1, eval_strategy="steps", eval_steps=3,
        save_strategy="steps", save_steps=3, use_cpu=True, ddp_backend="gloo",
        report_to=report_to, run_name="tiny", disable_tqdm=True, seed=0,
        dataloader_num_workers=0, learning_rate=1e-3)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 1),
                      eval_dataset=Tokens(8, 2), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    trainer.evaluate(metric_key_prefix="eval")
    end(trainer, opts.output_dir)


if __name__ == "__main__":
    main()
