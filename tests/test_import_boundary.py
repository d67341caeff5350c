"""A training process pays only for the write path: after `import tracklake`, `init()`,
`log()`, `log_generations()`, `span()` and `finish()`, nothing of the read side, the
operations, the CLI, the exporters, DuckDB, pandas, torch or a destination SDK is
imported, although they are installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Module prefixes a training rank must not load.
FORBIDDEN = ("tracklake._read", "tracklake._ops", "tracklake._cli", "tracklake._report",
             "tracklake.exporters", "uniplot", "jinja2",
             "duckdb", "click", "rich", "pandas", "torch", "wandb", "mlflow", "swanlab",
             "tensorboard", "tensorboardX", "polars")

TRAINING = """
import json, sys
import tracklake
run = tracklake.init(project="p", name="boundary", root=sys.argv[1], config={"lr": 1e-5})
run.log({"loss": 0.5, "phase": "train", "nested": {"kl": 0.1}}, step=0)
run.log({"loss": 0.4}, step=1)
run.log_generations([("question", "answer", 1.0), {"input": "q", "output": "a"}], step=1)
with run.span("rollout", token_ids=[1, 2, 3], turn=1) as span:
    span.outputs = {"reward": 1.0}
run.alert("done", "text")
assert run.flush()
report = run.finish()
assert report.complete, report
forbidden = tuple(sys.argv[2].split(","))
print(json.dumps(sorted(m for m in sys.modules
                        if any(m == f or m.startswith(f + ".") for f in forbidden))))
"""


def test_the_write_path_imports_nothing_of_the_read_side_or_optional_packages(
        tmp_path: Path) -> None:
    installed = [m for m in ("pandas", "duckdb", "click", "rich")
                 if importlib.util.find_spec(m) is not None]
    assert "pandas" in installed, "this test means something only with pandas installed"
    out = subprocess.run([sys.executable, "-c", TRAINING, str(tmp_path), ",".join(FORBIDDEN)],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


#: Runs the command line as the `tracklake` program does, then says whether pandas was
#: loaded and whether it could have been.
COMMAND = """
import importlib, json, sys
from tracklake._cli.main import run
sys.argv = ["tracklake", *sys.argv[1:]]
try:
    run()
except SystemExit as exc:
    assert not exc.code, exc.code
loaded = "pandas" in sys.modules
try:
    importlib.import_module("pandas")
    importable = True
except ImportError:
    importable = False
print(json.dumps({"loaded": loaded, "importable": importable}))
"""


def _command(*args: str) -> tuple[str, dict[str, bool]]:
    out = subprocess.run([sys.executable, "-c", COMMAND, *args], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return "\n".join(out[:-1]), json.loads(out[-1])


def test_the_read_only_commands_answer_without_loading_pandas(root: Path) -> None:
    import tracklake

    assert importlib.util.find_spec("pandas") is not None, "meaningful only with pandas"
    for name in ("a", "b"):
        with tracklake.init(project="p", run_id=name, root=root, capture_identity=False,
                            config={"lr": 0.1}) as run:
            for step in range(5):
                run.log({"loss": 1.0 / (step + 1)}, step=step)
    store = str(root)
    out, pandas = _command("sql", "SELECT run, count(*) AS n, min(value) AS low FROM "
                           "metrics GROUP BY run ORDER BY run", "--root", store,
                           "--format", "csv")
    assert out.splitlines() == ['"run","n","low"', '"a",5,0.2', '"b",5,0.2']
    assert pandas == {"loaded": False, "importable": False}
    for args in (("runs",), ("runs", "--format", "json"), ("show", "a"), ("diff", "a", "b"),
                 ("watch", "a", "--once")):
        out, pandas = _command(*args, "--root", store)
        assert "a" in out and pandas == {"loaded": False, "importable": False}, args
    # commands that may run a destination's SDK keep pandas available
    _, pandas = _command("export", "--help")
    assert pandas["importable"]


#: Asks `tracklake.query` questions about one run, and of the runs listing, in a fresh
#: process whose caller never imported pandas; prints whether pandas got loaded.
QUESTIONS = """
import json, sys
import tracklake
root = sys.argv[1]
answers = [tracklake.query(q, root=root).to_pylist() for q in sys.argv[2:]]
print(json.dumps({"answers": answers, "pandas": "pandas" in sys.modules}))
"""


def test_questions_about_one_run_and_the_runs_load_no_pandas_in_python(root: Path) -> None:
    """pyarrow imports pandas on its first `pa.array`, `pa.scalar` or `to_numpy`
    (apache/arrow#34994): about 0.2 s in a process whose caller does not use it. A
    question about one run and the runs listing build their arrays without those, cold
    (no catalog yet) and warm, from parts, from segments, and beside a running run."""
    import shutil

    import tracklake

    assert importlib.util.find_spec("pandas") is not None, "meaningful only with pandas"
    import duckdb

    if int(duckdb.__version__.split(".")[0]) < 2:
        pytest.skip("DuckDB before 2.0 imports pyarrow.dataset, and with it pandas, to read "
                    "a registered Arrow table (docs/performance.md)")
    with tracklake.init(project="p", run_id="parts", root=root, capture_identity=False,
                        config={"lr": 0.1}) as run:
        for step in range(5):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
    tracklake.compact(root=root, run="parts")
    with tracklake.init(project="p", run_id="segs", root=root, capture_identity=False,
                        compact=False) as run:
        run.log({"loss": 2.0}, step=0)
    live = tracklake.init(project="p", run_id="live", root=root, capture_identity=False,
                          compact=False, system_metrics=False)
    live.log({"loss": 3.0}, step=0)
    live.flush()
    questions = [
        "SELECT step, value FROM metrics WHERE project = 'p' AND run = 'parts' "
        "AND key = 'loss' ORDER BY step",
        "SELECT max(value) AS top FROM metrics WHERE run = 'segs'",
        "SELECT value FROM metrics WHERE run = 'live'",
        "SELECT run, status FROM runs ORDER BY run",
        "SELECT count(*) AS n FROM run_attempts WHERE run = 'parts'",
    ]
    try:
        for when in ("cold", "warm"):
            if when == "cold":
                shutil.rmtree(root / ".cache", ignore_errors=True)
            out = subprocess.run([sys.executable, "-c", QUESTIONS, str(root), *questions],
                                 capture_output=True, text=True, check=True).stdout
            found = json.loads(out.splitlines()[-1])
            assert found["answers"] == [
                [{"step": s, "value": 1.0 / (s + 1)} for s in range(5)],
                [{"top": 2.0}], [{"value": 3.0}],
                [{"run": "live", "status": "running"}, {"run": "parts", "status": "finished"},
                 {"run": "segs", "status": "finished"}],
                [{"n": 1}]], when
            assert found["pandas"] is False, when
    finally:
        live.finish()
