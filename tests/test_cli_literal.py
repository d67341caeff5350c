"""What users log is printed as it is: a value, name or key holding rich markup
(`[/INST]` of Llama/Mistral prompts, `[bold]`, `[link=...]`) never breaks or styles the
output of `sql`, `show`, `diff` or `runs`; and int64's extreme steps do not overflow
`show`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main

MARKUP = ("[/INST]", "[bold]x[/bold]", "[link=file:///etc]y")


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    for i, name in enumerate(("[/INST] run", "[bold]x[/bold] run")):
        with tracklake.init(project="p", name=name, run_id=f"r{i}", root=root,
                            config={"prompt": MARKUP[i], "tmpl": MARKUP[2]},
                            compact=False) as run:
            run.log({"[/INST]/loss": 1.0, "[bold]k[/bold]": 2.0}, step=0)
            run.log_generations([{"input": "<s>[INST] hi [/INST]", "output": MARKUP[1],
                                  "score": 1.0}], step=0)
    return root


def test_sql_table_prints_markup_in_values_literally(store: Path) -> None:
    code, out = _invoke("sql", "--root", str(store), "SELECT input, output FROM generations")
    assert code == 0
    assert "[/INST]" in out and "[bold]x[/bold]" in out


def test_show_prints_markup_in_names_keys_and_config_literally(store: Path) -> None:
    code, out = _invoke("show", "r0", "--root", str(store))
    assert code == 0
    assert "[/INST]/loss" in out and "[bold]k[/bold]" in out and "[/INST] run" in out


def test_diff_prints_markup_in_config_literally(store: Path) -> None:
    code, out = _invoke("diff", "r0", "r1", "--root", str(store), "--section", "config")
    assert code == 0
    assert "[/INST]" in out and "[bold]x[/bold]" in out


def test_runs_prints_markup_in_metric_keys_literally(store: Path) -> None:
    code, out = _invoke("runs", "--root", str(store), "--metric", "*k*")
    assert code == 0
    assert "[bold]k[/bold]" in out


def test_show_handles_the_extreme_int64_steps(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with tracklake.init(project="p", run_id="wide", root=root, compact=False) as run:
        run.log({"loss": 1.0}, step=-(2**63))
        run.log({"loss": 2.0}, step=2**63 - 1)
    code, out = _invoke("show", "wide", "--root", str(root))
    assert code == 0
    assert str(-(2**63)) in out and str(2**63 - 1) in out
