"""`tracklake demo`: a simulated multi-rank RL job, then compaction and a SQL summary."""

from __future__ import annotations

import math
import multiprocessing
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracklake._ops.compact import CompactionReport

#: Where `python -m tracklake._cli.demo` writes unless $TRACKLAKE_ROOT is set: like the
#: store's default, not a Python identifier, so that it can never shadow the package.
DEMO_ROOT = "tracklake-demo"

DEMO_CONFIG: dict[str, Any] = {
    "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.001}},
    "actor_rollout_ref": {
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "actor": {"optim": {"lr": 1e-6}, "ppo_mini_batch_size": 64},
        "rollout": {"name": "vllm", "n": 5, "temperature": 1.0,
                    "trace": {"backend": "tracklake", "token2text": True, "max_length": 2048}},
    },
    "data": {"train_batch_size": 256, "max_response_length": 1024},
    "trainer": {"logger": ["console", "tracklake"], "total_training_steps": 2000,
                "log_val_generations": 4, "project_name": "demo", "experiment_name": "grpo"},
}


def _rank_main(root: str, project: str, run_id: str, rank: int, steps: int) -> None:
    import tracklake

    # seeded by run and rank: two demo runs differ (a first comparison shows two
    # curves), while one run's ranks stay reproducible
    rng = random.Random(f"{run_id}/{rank}")
    ceiling = 0.5 + 0.2 * random.Random(run_id).random()  # how far this run's score gets
    with tracklake.init(project=project, name="grpo-demo", root=root, run_id=run_id,
                        rank=rank, config=DEMO_CONFIG, tags=["demo", "grpo"]) as run:
        for step in range(steps):
            progress = step / max(steps - 1, 1)
            score = 0.2 + ceiling * (1 - math.exp(-4 * progress)) + rng.gauss(0, 0.03)
            length = 300 + 400 * progress + rng.gauss(0, 20)
            metrics = {
                "actor/pg_loss": rng.gauss(-0.01, 0.02),
                "actor/entropy": 1.2 - 0.6 * progress + rng.gauss(0, 0.02),
                "actor/kl_loss": 0.001 + 0.01 * progress + abs(rng.gauss(0, 0.001)),
                "actor/grad_norm": abs(rng.gauss(0.5, 0.1)),
                "actor/lr": 1e-6,
                "critic/score/mean": score,
                "critic/score/max": min(1.0, score + 0.3),
                "critic/score/min": max(0.0, score - 0.3),
                "critic/rewards/mean": score,
                "critic/advantages/mean": rng.gauss(0, 0.01),
                "response_length/mean": length,
                "response_length/max": length * 2,
                "response_length/clip_ratio": max(0.0, rng.gauss(0.02, 0.01)),
                "prompt_length/mean": 120 + rng.gauss(0, 5),
                "timing_s/gen": 4.0 + rng.gauss(0, 0.3),
                "timing_s/update_actor": 2.0 + rng.gauss(0, 0.2),
                "timing_s/step": 7.0 + rng.gauss(0, 0.4),
                "perf/throughput": 2500 + rng.gauss(0, 100),
                "perf/max_memory_allocated_gb": 40 + rng.gauss(0, 1),
                "training/global_step": step,
                "training/epoch": step // 500,
            }
            run.log(metrics, step=step)
            if step % 100 == 0 and rank == 0:
                run.log({"val-core/gsm8k/reward/mean@5": score + 0.05,
                         "val-aux/gsm8k/reward/std@5": 0.1}, step=step)
                run.log_generations(
                    [{"input": f"Q{step}-{i}: what is {i} + {step}?",
                      "output": f"<think>adding</think> {i + step}", "score": 1.0,
                      "data_source": "gsm8k"} for i in range(4)], step=step, key="val")
            if step % 500 == 0 and rank == 0:
                _traced_rollout(run, step, rng)
        if rank == 0:
            run.log_artifact(repr(DEMO_CONFIG).encode(), name="config.txt",
                             media_type="text/plain")
            run.alert("demo finished", f"{steps} steps", level="info")


def _traced_rollout(run: Any, step: int, rng: random.Random) -> None:
    with run.span("rollout", step=step, inputs={"prompt": "Solve 12*7 with the calculator"},
                  agent="react") as rollout:
        for turn in range(2):
            with run.span("llm", turn=turn, token_ids=[rng.randrange(32000) for _ in range(16)]
                          ) as llm:
                llm.outputs = {"text": "call calculator(12*7)" if turn == 0 else "84"}
            if turn == 0:
                with run.span("tool", tool="calculator", inputs={"expr": "12*7"}) as tool:
                    tool.outputs = {"result": 84}
        rollout.outputs = {"answer": "84", "reward": 1.0}


SUMMARY_SQL = """
SELECT r.run, r.status, r.ranks, r.attempts, s.steps,
       round(s.first_score, 3) AS first_score, round(s.last_score, 3) AS last_score,
       g.val_generations, t.spans
FROM runs r
JOIN (SELECT run, count(DISTINCT step) AS steps, arg_min(value, step) AS first_score,
             arg_max(value, step) AS last_score
      FROM metrics WHERE key = 'critic/score/mean' AND rank = 0 GROUP BY run) s USING (run)
LEFT JOIN (SELECT run, count(*) AS val_generations FROM generations GROUP BY run) g USING (run)
LEFT JOIN (SELECT run, count(*) AS spans FROM traces GROUP BY run) t USING (run)
WHERE r.project = $project
"""


def new_run_id() -> str:
    """A fresh id for one demo run (the demo adds a run to the store each time)."""
    import secrets

    return f"grpo-{secrets.token_hex(3)}"


def run_demo(root: Path, *, ranks: int = 4, steps: int = 2000, project: str = "demo",
             run_id: str | None = None) -> str:
    """Run the simulated job in `ranks` processes, compact, and return a printed summary."""
    from tracklake._ops.compact import compact
    from tracklake._read.query import query

    run_id = run_id or new_run_id()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(str(root), project, run_id, r, steps))
             for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [i for i, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"demo rank processes {failed} failed")
    report = compact(root=root, project=project, run=run_id)
    table = query(SUMMARY_SQL, root=root, params={"project": project})
    rows = table.to_pylist()
    lines = [f"run {run_id}: {ranks} ranks x {steps} steps written to {root}",
             _compaction_line(root, project, run_id, report)]
    for row in rows:
        lines.append("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    lines.append(f"try: tracklake runs --root {root}")
    lines.append(f"     tracklake sql \"SELECT key, max(value) FROM metrics WHERE run = "
                 f"'{run_id}' GROUP BY key\" --root {root}")
    return "\n".join(lines)


def _compaction_line(root: Path, project: str, run_id: str, report: CompactionReport) -> str:
    """What compaction made of the run. Each rank compacts its own segments as it finishes
    (docs/concepts.md), so the demo's own pass finds some or none of them left."""
    from tracklake._format.layout import PART_SUFFIX
    from tracklake._format.schema import KINDS

    parts = [p for kind in KINDS
             for p in root.glob(f"{kind}/project={project}/run={run_id}/*/*/*{PART_SUFFIX}")]
    size = sum(p.stat().st_size for p in parts)
    return (f"compacted into Parquet: {len(report.segments_removed)} segments by this pass, "
            f"the others by each rank as it finished ({len(parts)} part files, {size:,} bytes)")


def default_root() -> Path:
    """$TRACKLAKE_ROOT, else ./tracklake-demo."""
    return Path(os.environ.get("TRACKLAKE_ROOT", DEMO_ROOT))


if __name__ == "__main__":  # pragma: no cover
    print(run_demo(default_root()))
