"""A tiny TRL GRPOTrainer job, run by the tests under ``torchrun`` (CPU, gloo):
``_trl_grpo.py ROOT OUTPUT_DIR [--crash-at N] [--resume]``.

A one-layer GPT-2 of 8 dimensions and a word-level tokenizer with a chat template are built
here (no hub download). GRPO trains it for 6 steps on 2 processes, 2 chat prompts a step
with 2 completions of at most 4 tokens each, two reward functions (one without an
opinion), completions logged (TRL's parquet files); it evaluates and checkpoints every 3
steps. World rank zero writes the Trainer's own log history to
``OUTPUT_DIR/log_history.json`` and a copy of each completions file TRL wrote to
``OUTPUT_DIR/writes/``, which the tests compare with the store."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from _hf_train import CrashAt, end  # the job scripts' folder is sys.path[0]
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    TrainerCallback,
)
from trl import GRPOConfig, GRPOTrainer

WORDS = ["<pad>", "<eos>", "<unk>", "user", "assistant", ":", "how", "many", "a", "b", "c",
         "d", "?", "yes", "no", "one", "two", "three"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> "
                 "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}")


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer of 18 words, with a chat template."""
    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>",
                                  eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def prompts(texts: list[str]) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts]})


def count_a(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """The reward: how many ``a`` words the assistant answered."""
    return [float(c[0]["content"].split().count("a")) for c in completions]


def no_opinion(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """A reward function with nothing to say about any sample (TRL then logs its metrics as
    `None`)."""
    return [None] * len(completions)


class KeepWrites(TrainerCallback):
    """Copies every completions file TRL writes or rewrites during this attempt, at each
    event before TRL may write it again, to ``OUTPUT_DIR/writes/NNN.parquet`` in order
    (world rank zero, where TRL writes); a rewrite of the same bytes is not a write."""

    def __init__(self, output_dir: str) -> None:
        self.files = Path(output_dir, "completions")
        self.writes = Path(output_dir, "writes")
        self.left: dict[str, int] = {}
        self.seen: dict[str, bytes] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a crashed attempt's files, until this attempt writes them again
        self.left = {p.name: p.stat().st_mtime_ns for p in self.files.glob("*.parquet")}

    def _keep(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.writes.mkdir(exist_ok=True)
        for path in sorted(self.files.glob("*.parquet")):
            if self.left.get(path.name) == path.stat().st_mtime_ns:
                continue
            data = path.read_bytes()
            if self.seen.get(path.name) != data:
                self.seen[path.name] = data
                n = len(list(self.writes.iterdir()))
                Path(self.writes, f"{n:03d}.parquet").write_bytes(data)

    on_log = on_step_end = on_evaluate = on_train_end = _keep


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("output_dir")
    parser.add_argument("--crash-at", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    os.environ["TRACKLAKE_ROOT"] = opts.root
    import tracklake.integrations.transformers  # noqa: F401  (report_to="tracklake")

    callbacks: list[Any] = [KeepWrites(opts.output_dir)]
    if opts.crash_at:
        callbacks.append(CrashAt(opts.crash_at))
    torch.manual_seed(0)
    tok = tokenizer()
    model = GPT2LMHeadModel(GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=len(WORDS), n_positions=32,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id))
    args = GRPOConfig(
        output_dir=opts.output_dir, max_steps=6, per_device_train_batch_size=2,
        per_device_eval_batch_size=2, num_generations=2, max_completion_length=4,
        logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="steps",
        save_steps=3, log_completions=True, use_cpu=True, ddp_backend="gloo",
        report_to="tracklake", project="trl", run_name="grpo", disable_tqdm=True, seed=0,
        dataloader_num_workers=0, learning_rate=1e-2)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[count_a, no_opinion], args=args, processing_class=tok,
        train_dataset=prompts(["how many a ?", "how many b ?", "a b c ?", "c d ?"] * 4),
        eval_dataset=prompts(["how many c ?", "a a ?"]), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    end(trainer, opts.output_dir)


if __name__ == "__main__":
    main()
