"""A dashboard of more runs than a URL names: the page's requests for them pass the
server's 8 KiB URL bound, are posted instead, and every run's curve is drawn; the
generations panel of all of them answers too (in the system's headless Chromium)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _cdp import Browser

import tracklake
from tracklake._ui.server import Dashboard

pytestmark = pytest.mark.xdist_group("ui_browser")

RUNS = 90  # ids of 120 characters: about 11 KiB of run= parameters


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    root = tmp_path_factory.mktemp("many") / "store"
    for i in range(RUNS):
        run_id = f"sweep-{i:03d}-" + "x" * 110
        with tracklake.init(project="p", run_id=run_id, root=root, compact=False,
                            capture_identity=False) as run:
            for step in range(4):
                run.log({"loss": i + step / 10}, step=step)
    board = Dashboard(root).start()
    browser = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        browser.open(board.url)
        yield browser
    finally:
        browser.close()
        board.close()


def test_every_runs_curve_is_drawn_when_their_names_pass_a_urls_bound(page: Browser) -> None:
    curves = page.wait("window.tracklake && tracklake.charts.get('loss') && "
                       "tracklake.charts.get('loss').curves.length", "the loss curves")
    assert curves == RUNS
    asked = [u for u in page.requested() if "/api/series" in u]
    assert asked and all(len(u) < 8 << 10 for u in asked), [len(u) for u in asked]
    last = page.js("tracklake.charts.get('loss').curves.map((c) => c.run)"
                   ".filter((r) => r.startsWith('sweep-089')).length")
    assert last == 1
