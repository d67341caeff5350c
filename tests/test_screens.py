"""What `tracklake runs`, `show` and a progress bar leave on a real 80x24 and 200x50
terminal (tmux), compared with golden text, and what they print at 40 columns, for 100
runs, for 300 keys and into a pipe: every row one line, numbers whole, ids and keys
distinct, the columns left out named.

The data set is fixed: run ids, values, and the times of the attempt files (rewritten
after the runs end; the terminal's TZ is UTC). Two things differ from one run of the
tests to the next and are masked before a screen is compared, each by text of the same
width, so the layout is compared as drawn:
- the store's directory, /tmp/tracklake-XXXXXXXX (of fixed length, so that the titles
  naming it are laid out alike), its random part;
- in the progress bar, the rate (5 cells before " records/s", a fixed width) and the
  memory destination's random name (`memory:` and 12 hex digits).
`UPDATE_GOLDEN=1` rewrites the golden files from what is drawn now (then review the diff).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _terminal import run_in_terminal
from click.testing import CliRunner

import tracklake
from tracklake._cli.cells import cell
from tracklake._cli.main import main
from tracklake._format.attempt import read_attempt, write_attempt

GOLDEN = Path(__file__).parent / "screen_golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TRACKLAKE = str(Path(sys.executable).with_name("tracklake"))
UTC = {"TZ": "UTC"}

PROJECT = "rlhf-math-reasoning"
LONG_KEYS = [f"actor/grad_norm/model.layers.17.self_attn.{p}_proj" for p in "qkv"]
#: run id, ranks, attempts of rank 0, status, hours after BASE it started, seconds it took
RUNS = [
    ("grpo-qwen2.5-7b-lr1e-6-kl0.001-seed42", 2, 1, "finished", 0, 5_025),
    ("grpo-qwen2.5-7b-lr3e-6-kl0.001-seed42", 2, 2, "finished", 3, 36_000),
    ("ppo-llama3-8b-baseline-20250105-a1b2c3", 1, 1, "running", 14, 1_200),
    ("r7", 1, 1, "failed", 20, 61),
]
BASE = dt.datetime(2025, 6, 1, 8, 0, tzinfo=dt.timezone.utc)
IDENTITY = {"host": "gpu-node-07", "pid": 4242, "python": "3.11.9",
            "command": ["python", "-m", "verl.trainer.main_ppo", "trainer.total_epochs=1"],
            "git": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True}}


def _values(i: int, rank: int, step: int) -> dict[str, float]:
    s = step / 100
    values = {
        "critic/score/mean": 0.2 + 0.6 * (1 - math.exp(-s / 15)) - 0.05 * i + 0.001 * rank,
        "critic/score/max": 1.0, "critic/score/min": 0.0,
        "actor/pg_loss": -0.01 * (i + 1) * math.cos(s / 7),
        "actor/entropy": 1.2 - 0.01 * s,
        "perf/throughput": 181_818.0 + s,
        "timing_s/step": 12_345.678 - s,
        "response_length/mean": 300 + 8 * s,
    }
    if step % 1000 == 0:
        values["val-core/gsm8k/reward/mean@5"] = 0.5 + 0.005 * s - 0.02 * i
        values["val-core/math/reward/mean@5"] = 0.3 + 0.004 * s
    if i == 0:
        values.update({k: 0.1 * (n + 1) + 0.001 * s for n, k in enumerate(LONG_KEYS)})
        if rank == 1:
            values["only/rank1/debug"] = 0.5
    return values


def write_store(root: Path) -> None:
    """The runs of `RUNS` in `PROJECT`, and `sft-base` in project `baselines`; 50 steps
    per attempt, every time in the attempt files fixed."""
    for i, (run_id, ranks, attempts, _, _, _) in enumerate(RUNS):
        for rank in range(ranks):
            for _ in range(attempts if rank == 0 else 1):
                with tracklake.init(project=PROJECT, run_id=run_id, rank=rank, root=root,
                                    name=f"run {i}", capture_identity=False,
                                    config={"trainer": {"total_training_steps": 4900},
                                            "actor": {"optim": {"lr": 1e-6 * (i + 1)}}}
                                    ) as run:
                    for step in range(0, 5000, 100):
                        run.log(_values(i, rank, step), step=step)
    with tracklake.init(project="baselines", run_id="sft-base", root=root,
                        capture_identity=False) as run:
        run.log({"critic/score/mean": 0.25, "actor/pg_loss": 0.0}, step=0)
    for i, (run_id, _, _, status, hours, seconds) in enumerate([*RUNS, ("sft-base", 1, 1,
                                                                        "finished", 30, 9)]):
        project = "baselines" if run_id == "sft-base" else PROJECT
        for path in sorted((root / "runs" / f"project={project}" / f"run={run_id}")
                           .rglob("attempt=*.json")):
            record = read_attempt(path)
            assert record is not None
            attempt = int(path.stem.split("=")[1])
            start = BASE + dt.timedelta(hours=hours, minutes=i + 10 * (attempt - 1))
            end = start + dt.timedelta(seconds=seconds)
            # written on another machine: a "running" attempt is judged by its heartbeat
            record.update(started_at=start.isoformat(), heartbeat_at=end.isoformat(),
                          finished_at=None if status == "running" else end.isoformat(),
                          status=status, identity=IDENTITY)
            record.pop("format")
            write_attempt(path, record)


@pytest.fixture(scope="module")
def store() -> Iterator[Path]:
    """The data set, in a directory whose path always has the same length."""
    home = Path(tempfile.mkdtemp(prefix="tracklake-", dir="/tmp"))
    try:
        write_store(home / "store")
        yield home / "store"
    finally:
        shutil.rmtree(home)


def masked(text: str, store: Path) -> str:
    text = text.replace(str(store.parent), "/tmp/tracklake-XXXXXXXX")
    text = re.sub(r"[ \d.kMG]{5}(?= records/s)", "#####", text)
    return re.sub(r"memory:[0-9a-f]{12}", "memory:" + "X" * 12, text)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"differs from {path} (UPDATE_GOLDEN=1 rewrites it)"


def screen(store: Path, args: list[str], width: int, height: int) -> str:
    return masked(run_in_terminal([TRACKLAKE, *args, "--root", str(store)], width, height,
                                  env=UTC), store)


def table_rows(text: str) -> list[str]:
    """The body rows of the tables of a screen (lines between │ and │)."""
    return [line for line in text.splitlines() if line.startswith("│")]


def assert_tables_unbroken(text: str, width: int) -> None:
    """Every line of a table is one whole line of it: it starts and ends with the box."""
    for line in text.splitlines():
        assert len(line) <= width
        if line[:1] in ("┏", "┃", "┡", "│", "└"):
            assert line[-1] in ("┓", "┃", "┩", "│", "┘"), line


def cells(row: str) -> list[str]:
    """The cells of a table's line (a body or a header line)."""
    return [c.strip() for c in re.split("[│┃]", row.strip("│┃"))]


def table_header(text: str) -> str:
    """The last header line of the first table (the one with every column's name)."""
    lines = text.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("┡")) - 1]


# -- tracklake runs -------------------------------------------------------------------------

def _last_numbers() -> dict[str, list[str]]:
    """Per run, the numbers its row must show whole: last step and last metric values."""
    out: dict[str, list[str]] = {}
    for i, (run_id, *_rest) in enumerate(RUNS):
        last = _values(i, 0, 4900)
        out[run_id] = ["4900", cell(last["critic/score/mean"]), cell(last["actor/pg_loss"])]
    return out


@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 50)])
def test_runs_in_a_real_terminal_show_the_golden_table(store: Path, width: int,
                                                       height: int) -> None:
    """Before: at 80 columns ids folded over up to 10 lines and numbers wrapped
    (`0.81` over `46`); now each run is one line, the numbers whole, the ids distinct,
    and a line names the columns left out."""
    text = screen(store, ["runs"], width, height)
    assert_tables_unbroken(text, width)
    rows = table_rows(text)
    assert len(rows) == len(RUNS) + 1  # one line per run
    shown = {c for row in rows for c in cells(row)}
    ids = [cells(row)[cells(table_header(text)).index("run")] for row in rows]
    assert len(set(ids)) == len(ids)
    for run_id, numbers in _last_numbers().items():
        row = next(r for r, i in zip(rows, ids, strict=True) if run_id.startswith(
            i.split("…")[0]) and run_id.endswith(i.split("…")[-1]))
        for number in numbers:
            assert number in cells(row), (run_id, number, row)
    assert "crashed" in shown and "failed" in shown  # a stale heartbeat is a crash
    if width == 80:
        assert re.search(r"^\(\d+ columns hidden at 80 columns: ", text, re.MULTILINE)
    else:
        assert "hidden" not in text and "grpo-qwen2.5-7b-lr1e-6-kl0.001-seed42" in shown
    check_golden(f"runs_{width}x{height}.txt", text)


def test_no_color_changes_no_character(store: Path) -> None:
    """NO_COLOR drops colours only: the screen is the golden one."""
    text = masked(run_in_terminal([TRACKLAKE, "runs", "--root", str(store)], 80, 24,
                                  env={**UTC, "NO_COLOR": "1"}), store)
    assert text == (GOLDEN / "runs_80x24.txt").read_text()


# -- tracklake show ---------------------------------------------------------------------------

@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 50)])
def test_show_in_a_real_terminal_shows_the_golden_text(store: Path, width: int,
                                                       height: int) -> None:
    """Before: at 80 columns every key was cut to 11 characters (`critic/sco…` three
    times) and the attempt times to `2025-06-01T08…`; now keys are whole where they fit,
    else cut in their middle and distinct, and numbers and times whole."""
    text = screen(store, ["show", RUNS[0][0]], width, height)
    assert_tables_unbroken(text, width)
    metrics = [c for c in map(cells, table_rows(text)) if len(c) > 1 and ".." in c[1]]
    keys = [m[0] for m in metrics]
    assert len(keys) == len(set(keys)) == 14
    for key in ("critic/score/mean", "critic/score/max", "critic/score/min", *LONG_KEYS):
        assert sum(k == key or (key.startswith(k.split("…")[0]) and key.endswith(
            k.split("…")[-1])) for k in keys) == 1, (key, keys)
    last = _values(0, 0, 4900)
    by_key = {m[0]: m for m in metrics}
    for key in ("critic/score/mean", "perf/throughput", "timing_s/step"):
        assert cell(last[key]) in by_key[key]
    assert "0.5 (rank 1)" in by_key["only/rank1/debug"]
    assert "2025-06-01 08:00:00" in text  # the attempt's start, local (UTC) to the second
    check_golden(f"show_{width}x{height}.txt", text)


# -- a progress bar ---------------------------------------------------------------------------

@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 50)])
def test_an_exports_progress_bar_keeps_its_counts_whole(store: Path, tmp_path: Path,
                                                        width: int, height: int) -> None:
    """Before: at 80 columns the rate was cut (`20,30…`), and with larger counts or a
    longer description the counts too (`181… r…`, tests/test_progress.py); now the counts
    and the rate are whole, and the bar, the note and the description give way."""
    copy = tmp_path / "store"  # the export keeps its state in the store
    shutil.copytree(store, copy)
    text = masked(run_in_terminal([TRACKLAKE, "export", "memory", "--all", "--root",
                                   str(copy)], width, height, env=UTC), store)
    bar = text.splitlines()[0]
    counted = re.search(r" (\d+)/\? records ##### records/s ", bar)
    summary = re.search(r"^memory:X{12}: (\d+) records from 5 runs$", text, re.MULTILINE)
    assert counted and summary, text
    assert counted.group(1) == summary.group(1)
    check_golden(f"export_{width}x{height}.txt", text)


# -- a narrow terminal, many runs, many keys, a pipe -------------------------------------------

def test_a_40_column_terminal_keeps_each_run_and_key_on_one_line(store: Path) -> None:
    text = screen(store, ["runs"], 40, 24)
    assert_tables_unbroken(text, 40)
    ids = [cells(row)[0] for row in table_rows(text)]
    assert len(ids) == len(set(ids)) == len(RUNS) + 1
    assert re.search(r"^\(\d+ columns hidden", text, re.MULTILINE)
    text = screen(store, ["show", RUNS[0][0]], 40, 24)
    assert_tables_unbroken(text, 40)
    keys = [c[0] for c in map(cells, table_rows(text)) if len(c) > 1 and ".." in c[1]]
    assert len(keys) == len(set(keys)) == 14


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100 runs whose long ids share their start and end, in a project with a long
    name, and a run of 300 keys that share a long start and differ in two places."""
    root = tmp_path_factory.mktemp("crowded") / "store"
    for i in range(100):
        with tracklake.init(project="sweeps-of-a-team-with-a-long-project-name", root=root,
                            run_id=f"grpo-qwen2.5-7b-instruct-lr{i % 10}e-6-warmup{i // 10}-"
                                   f"cosine-seed{i}", capture_identity=False) as run:
            run.log({"critic/score/mean": 0.5 + i / 1000}, step=10 * i)
    with tracklake.init(project="p", run_id="many-keys", root=root,
                        capture_identity=False) as run:
        for step in range(3):
            run.log({key: n + step for n, key in enumerate(MANY_KEYS)}, step=step)
    return root


MANY_KEYS = [f"actor_rollout_ref/actor/fsdp/model.layers.{layer}.mlp.experts.{e}.grad_norm"
             for layer in range(30) for e in range(10)]


@pytest.mark.parametrize("width", [80, 40])
def test_a_hundred_runs_with_long_ids_are_a_line_each_with_distinct_ids(
        crowded: Path, width: int) -> None:
    text = screen(crowded, ["runs", "--all"], width, 24)
    assert_tables_unbroken(text, width)
    rows = [cells(row) for row in table_rows(text)]
    header = cells(table_header(text))
    ids = [row[header.index("run")] for row in rows]
    assert len(rows) == len(set(ids)) == 101
    if "last step" in header:  # each number whole: the last steps are 0, 10, ..., 990
        steps = {int(row[header.index("last step")]) for row in rows}
        assert steps == {10 * i for i in range(100)} | {2}


@pytest.mark.parametrize("width", [80, 40])
def test_300_keys_sharing_a_long_start_stay_distinct(crowded: Path, width: int) -> None:
    text = screen(crowded, ["show", "many-keys", "--max-keys", "0"], width, 24)
    assert_tables_unbroken(text, width)
    rows = [c for c in map(cells, table_rows(text)) if "grad_norm" in c[0]]
    assert len({row[0] for row in rows}) == len(rows) == 300
    for row, key in zip(rows, sorted(MANY_KEYS), strict=True):  # in the order of keys
        head, _, tail = row[0].partition("…")
        assert key.startswith(head) and key.endswith(tail)


def test_a_pipe_gets_every_column_and_every_name_whole(store: Path, crowded: Path) -> None:
    """Not a terminal (a pipe, a file): nothing is cut or left out, as before (a table
    wider than 200 columns folds its cells over lines)."""
    out = CliRunner().invoke(main, ["show", RUNS[0][0], "--root", str(store)]).output
    assert all(key in out for key in LONG_KEYS) and "trend" in out and "values" in out
    for root, args in ((store, ["runs"]), (crowded, ["runs", "--all"]),
                       (crowded, ["show", "many-keys"])):
        out = CliRunner().invoke(main, [*args, "--root", str(root)]).output
        assert "…" not in out and "hidden" not in out
        for header in (("project", "attempts", "ranks", "start", "duration")
                       if args[0] == "runs" else ("steps", "values", "min", "trend")):
            assert header in out
