"""What a person does with report.html, in the system's headless Chromium driven over its
DevTools protocol with every host name unresolvable: the dashboard's page runs from the
file alone (its script allowed by hash under its own CSP): toggle a run, smooth, read a
value under the cursor, zoom, switch the x axis; read the runs, config diff,
generations, traces and events; run a panel's SQL with the command it shows; and the page
requests nothing but the file, while text crafted to end the data or run script stays
text."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cdp import Browser
from _chart_page import (
    LOSS,
    drag_zooms_and_double_click_resets,
    plot_point,
    series_of,
    set_control,
    smoothing_changes_the_path,
    toggling_hides_and_shows,
)
from _pictures import HOSTILE, write_runs
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main

#: one worker, so one browser and one page for the whole module, in the order written
pytestmark = pytest.mark.xdist_group("report_browser")

def write_report(root: Path, out: Path, *runs: str) -> Path:
    result = CliRunner().invoke(main, ["report", *runs, "--root", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "store"
    (root / "runs").mkdir(parents=True)
    write_runs(root)
    return root


@pytest.fixture(scope="module")
def report(store: Path) -> Path:
    return write_report(store, store.parent / "report.html", "base", "tuned")


@pytest.fixture(scope="module")
def page(report: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    browser = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        opened(browser, report.as_uri())
        yield browser
    finally:
        browser.close()


def opened(page: Browser, url: str) -> None:
    """Open `url` and wait for its loss chart (not the previous page's)."""
    page.js("window.previousPage = true")
    page.open(url)
    page.wait(f"!window.previousPage && window.tracklake && {LOSS} && {LOSS}.plot && "
              f"{LOSS}.plot.data[0].length > 0", "the loss chart")


def test_the_page_draws_every_key_from_the_file_and_says_it_is_a_snapshot(
        page: Browser) -> None:
    keys = page.js("[...tracklake.charts.keys()]")
    assert keys == ["kl", "loss", "reward"]
    assert page.js(f"{LOSS}.note.textContent") == "350 points"  # 200 + 150, all held
    status = page.js("document.getElementById('status').textContent")
    assert status.startswith("2 runs · a report written ") and "never refreshed" in status
    assert page.js("document.title") == "tracklake report: p/base, p/tuned"


def test_toggling_a_run_hides_its_series_and_ticking_it_shows_them(page: Browser) -> None:
    toggling_hides_and_shows(page, "p/tuned", "p/base")


def test_the_smoothing_slider_changes_the_drawn_path(page: Browser) -> None:
    smoothing_changes_the_path(page, "p/tuned")


def test_hovering_shows_the_logged_value_at_that_step(page: Browser) -> None:
    raw = series_of(page, "p/tuned")[0]
    x, y = plot_point(page, 17, raw)
    page.mouse("mouseMoved", x, y)
    text = page.wait(f"(() => {{ const h = {LOSS}.hover;"
                     "return !h.hidden && h.textContent; })()", "the hover box")
    assert "step 17" in text
    # as tests/_pictures.py logged them, in the page's six significant digits
    for name, value in (("baseline", 2 * math.exp(-17 / 60)), ("tuned", 1.5 * math.exp(-17 / 40))):
        assert f": {float(f'{value:.6g}')!r}" in text.split(name, 1)[1]


def test_dragging_zooms_into_a_range_from_the_points_the_file_holds(page: Browser) -> None:
    drag_zooms_and_double_click_resets(page, "p/base", 50, 90)


def test_the_x_axis_and_log_scale_work_from_the_file(page: Browser) -> None:
    set_control(page, "xaxis", "time")
    page.wait(f"(() => {{ const p = {LOSS}.plot; return p && p.data[0][0] > 1.6e9; }})()",
              "wall time on x")
    set_control(page, "xaxis", "relative")
    page.wait(f"(() => {{ const p = {LOSS}.plot;"
              "return p && p.data[0][0] >= 0 && p.data[0][0] < 600; })()", "seconds on x")
    set_control(page, "logscale", "true")
    page.wait(f"(() => {{ const p = {LOSS}.plot; return p && p.scales.y.distr === 3; }})()",
              "a log y axis")
    set_control(page, "logscale", "false")
    set_control(page, "xaxis", "step")
    page.wait(f"(() => {{ const p = {LOSS}.plot;"
              "return p && p.scales.y.distr === 1 && p.data[0][0] === 0; })()", "steps again")
    # what the file does not hold says so where it is chosen
    assert page.js("document.getElementById('ranks').disabled") is True
    assert "tracklake ui" in page.js("document.getElementById('report-note').textContent")


def test_the_runs_view_shows_identity_and_the_config_diff_differences_first(
        page: Browser) -> None:
    page.click_element('nav button[data-view="table"]')
    page.wait("document.querySelectorAll('#config-diff tbody tr').length === 2", "the diff")
    diff = page.js("[...document.querySelectorAll('#config-diff tbody tr')]"
                   ".map(r => [r.className, r.cells[0].textContent])")
    assert diff == [["differs", "note"], ["differs", "optim/lr"]]
    assert page.js("document.getElementById('config-count').textContent") == (
        "2 of 2 keys differ")
    identity = page.js("Object.fromEntries([...document.querySelectorAll('#identity tbody tr')]"
                       ".map(r => [r.cells[0].textContent, r.cells[1].textContent]))")
    assert identity["run"] == "p/base" and identity["ranks"] == "2" and identity["host"]
    page.click_element('nav button[data-view="charts"]')


def test_generations_traces_and_events_come_from_the_file(page: Browser) -> None:
    page.click_element('nav button[data-view="generations"]')
    page.wait("document.querySelectorAll('#gen-list .prompt').length === 2", "two prompts")
    set_control(page, "gen-search", "PARIS", "input")
    page.wait("(() => { const h = document.querySelectorAll('#gen-list .prompt h4');"
              "return h.length === 1 && h[0].textContent === 'capital of France'; })()",
              "only the prompt whose output matches")
    set_control(page, "gen-search", "", "input")
    page.click_element('nav button[data-view="traces"]')
    root = "document.querySelector('.trace-run[data-run=\"p/base\"] > details.span')"
    page.wait(f"!!({root} && {root}.querySelector('details.span'))", "base's trace tree")
    assert page.js(f"{root}.querySelector('.name').textContent") == "rollout"
    set_control(page, "trace-search", "calculator", "input")  # the child's attribute
    page.wait("document.querySelectorAll('.trace-run details.span').length === 2",
              "the trace holding the text, whole")
    set_control(page, "trace-search", "nothing like it", "input")
    page.wait("document.querySelectorAll('.trace-run').length === 0", "no trace")
    set_control(page, "trace-search", "", "input")
    page.click_element('nav button[data-view="events"]')
    page.wait("[...document.querySelectorAll('#event-table tbody tr')]"
              ".some(r => r.cells[6].textContent === 'reward plateau')", "the alert")
    page.click_element('nav button[data-view="sql"]')
    assert page.js("document.getElementById('sql-run').disabled") is True
    assert "cannot run new SQL" in page.js("document.getElementById('sql-offline').textContent")
    page.click_element('nav button[data-view="charts"]')


def test_a_charts_sql_command_runs_in_a_shell_and_answers_its_curves(page: Browser) -> None:
    command = page.js(f"{LOSS}.sql.querySelector('pre.sql-command').textContent")
    assert command.startswith("tracklake sql --root ")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command + " --format json"], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    held = page.js(f"{LOSS}.curves.map(c => [c.run, c.x])")
    assert [[r["run"], r["xs"]] for r in rows] == held


def test_a_link_with_a_search_opens_on_the_generations_searched(
        page: Browser, report: Path) -> None:
    """`report.html#q=paris` opens on the generations searched, as typing in the box would."""
    linked = report.with_name("searched.html")
    linked.write_text(report.read_text())
    page.js("window.previousPage = true")
    page.open(linked.as_uri() + "#q=paris")
    page.wait("(() => { const h = document.querySelectorAll('#gen-list .prompt h4');"
              "const view = document.getElementById('generations');"
              "return !window.previousPage && view && !view.hidden && h.length === 1 "
              "&& h[0].textContent === 'capital of France'; })()", "the generations searched")
    opened(page, report.as_uri())


def test_text_crafted_to_end_the_data_or_run_script_stays_text(
        page: Browser, store: Path, report: Path) -> None:
    crafted = "</script><!--<script>document.title='pwned'</script>"
    with tracklake.init(project="p", run_id="crafted", root=store, name=crafted,
                        config={"note": crafted}) as run:
        run.log({"loss": 1.0}, step=0)
        run.log_generations([{"input": crafted, "output": crafted}], step=0, key="val")
    out = write_report(store, store.parent / "crafted.html", "crafted", "base")
    opened(page, out.as_uri())
    assert page.js("document.title") == "tracklake report: p/crafted, p/base"
    labels = page.js("[...document.querySelectorAll('#runs label')].map(l => l.textContent)")
    assert labels[0] == f" {crafted} (finished)"
    page.click_element('nav button[data-view="generations"]')
    page.wait(f"[...document.querySelectorAll('#gen-list .prompt h4')]"
              f".some(h => h.textContent === {json.dumps(crafted)})", "the crafted prompt")
    assert page.js("document.querySelectorAll('script').length") == 3  # the page's own
    assert page.js("document.querySelectorAll('img[src=x]').length") == 0
    assert HOSTILE in page.js("document.body.textContent")  # base's, as text
    page.click_element('nav button[data-view="charts"]')
    opened(page, report.as_uri())


def test_the_screenshot_shows_the_runs_colours(page: Browser) -> None:
    import base64
    import io

    from _optional import optional

    image = optional("PIL.Image")
    page.js(f"{LOSS}.el.scrollIntoView({{block: 'center'}})")
    shot = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
    with image.open(io.BytesIO(shot)) as picture:
        colors = {rgb for _, rgb in picture.convert("RGB").getcolors(1 << 24) or []}
    for hex_color in ("#1f77b4", "#d62728"):  # the first two runs' (app.js's PALETTE)
        rgb = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colors, f"no pixel of {hex_color}"


def test_the_page_requests_nothing_but_the_files_and_a_page_that_does_is_caught(
        page: Browser, tmp_path: Path) -> None:
    """Runs last: the network log of everything the tests above made the pages do."""
    requested = page.requested()
    assert requested and all(url.startswith(("file://", "data:")) for url in requested), (
        requested)
    leaky = tmp_path / "leaky.html"
    leaky.write_text('<html><body><img src="https://example.com/x.png"></body></html>')
    page.js("window.previousPage = true")
    page.open(leaky.as_uri())
    page.wait("!window.previousPage && document.readyState === 'complete'", "the leaky page")
    assert "https://example.com/x.png" in page.requested()
