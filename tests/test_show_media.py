"""`tracklake show` prints a run's histograms (the last of each key drawn as bars) and
media (per key: items, steps, bytes, distinct files, last caption)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._cli.present_media import BARS, bars


def test_show_lists_histograms_and_media_of_a_run(tmp_path: Path) -> None:
    with tracklake.init(project="p", run_id="r", root=tmp_path, capture_identity=False,
                        system_metrics=False, compact=False) as run:
        for step in range(3):
            run.log_histogram("grad/w", [0.0, 1.0, 1.0, 2.0, 2.0, 2.0], step=step, bins=3)
            run.log_image("samples", np.full((2, 2), step, np.uint8), step=step,
                          caption=f"epoch {step}")
        run.log_image("samples", np.full((2, 2), 0, np.uint8), step=3)  # stored already
    result = CliRunner(env={"COLUMNS": "140"}).invoke(
        main, ["show", "r", "--root", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0
    out = result.output
    assert "histograms=3" in out and "media=4" in out
    [row] = [line for line in out.splitlines() if "grad/w " in line and "0..2" in line]
    assert "6" in row and bars([1, 2, 3]) in row
    [row] = [line for line in out.splitlines() if "samples" in line]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:4] == ["samples", "image", "4", "0..3"] and cells[5] == "3"
    assert "epoch 2" in row  # the last caption given (the item at step 3 has none)


def test_bars_sum_bins_beyond_the_width_and_leave_empty_bins_blank() -> None:
    assert bars([0, 1, 8], unicode=False) == " _#"
    drawn = bars(list(range(4 * BARS)))
    assert len(drawn) == BARS and drawn[-1] == "█"
    assert bars([]) == ""
