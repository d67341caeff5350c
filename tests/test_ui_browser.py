"""What a person does with `tracklake ui`, in the system's headless Chromium driven over
its DevTools protocol: toggle a run, smooth, read a value under the cursor, zoom, watch a
live run grow, ask SQL, look at histograms and images; and the page asks nothing of any
host but the dashboard."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _cdp import Browser, until
from _chart_page import (
    drag_zooms_and_double_click_resets,
    plot_point,
    series_of,
    set_control,
    smoothing_changes_the_path,
    toggling_hides_and_shows,
)

import tracklake
from tracklake._ui.server import Dashboard

LOSS = "tracklake.charts.get('loss')"

#: one worker, so one browser and one page for the whole module, in the order written
pytestmark = pytest.mark.xdist_group("ui_browser")

PROJECT = "p"
HIST_STEPS = 10


def gif() -> bytes:
    """A two-frame 5x7 GIF (a video the page shows as an image)."""
    import io

    from PIL import Image

    frames = [Image.new("RGB", (5, 7), c) for c in ("red", "blue")]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=100)
    return out.getvalue()


def loss(run: str, step: int) -> float:
    """Values with short decimals, so the page shows them exactly as logged."""
    return step * 0.5 + (1 if run == "base" else 2)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, tracklake.Run]]:
    root = tmp_path_factory.mktemp("ui") / "store"
    for name in ("base", "tuned"):
        with tracklake.init(project=PROJECT, run_id=name, root=root, name=name,
                            config={"lr": 0.1 if name == "base" else 0.3}) as run:
            for step in range(40):
                run.log({"loss": loss(name, step), "acc/train": step / 40}, step=step)
            run.log_generations([
                {"input": "capital of France?", "output": "Paris" if name == "base" else "Lyon",
                 "score": 1.0 if name == "base" else 0.0},
                {"input": "2+2?", "output": "<b>4</b>", "score": 1.0}], step=10, key="val")
            root_span = run.span("rollout" if name == "base" else "eval", step=5,
                                 inputs={"prompt": "<i>hi</i>"})
            with root_span, run.span("reward", step=5) as inner:  # a child of root_span
                time.sleep(0.03)
                inner.outputs = {"score": 1}
            run.alert("loss spiked" if name == "base" else "checkpoint saved", "loss > 10",
                      level="error" if name == "base" else "info", step=7)
            if name == "base":
                for step in range(HIST_STEPS):
                    run.log_histogram("grad/w", np.arange(10.0) + step, step=step, bins=5)
                for step in range(3):
                    run.log_image("samples", np.full((8, 12, 3), 60 * step, np.uint8),
                                  step=step, caption=f"<b>epoch {step}</b>")
                tone = np.sin(np.arange(4000) * 0.1) * 0.5
                run.log_audio("speech", tone, sample_rate=8000, step=3, caption="tone")
                run.log_video("clip", gif(), step=3)
    live = tracklake.init(project=PROJECT, run_id="live", root=root, name="live")
    for step in range(20):
        live.log({"loss": 3.0 + step}, step=step)
    live.flush()
    yield root, live
    live.finish()


@pytest.fixture(scope="module")
def dashboard(live_run: tuple[Path, tracklake.Run]) -> Iterator[Dashboard]:
    board = Dashboard(live_run[0]).start()
    yield board
    board.close()


@pytest.fixture(scope="module")
def page(dashboard: Dashboard, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    browser = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        browser.open(dashboard.url)
        browser.wait("window.tracklake && tracklake.charts.get('loss') && "
                     "tracklake.charts.get('loss').plot && "
                     "tracklake.charts.get('loss').plot.data[0].length > 0", "the loss chart")
        browser.js("window.notReloaded = true")
        yield browser
    finally:
        browser.close()


def test_toggling_a_run_hides_its_series_and_ticking_it_shows_them(page: Browser) -> None:
    toggling_hides_and_shows(page, f"{PROJECT}/tuned", f"{PROJECT}/base")


def test_the_smoothing_slider_changes_the_drawn_path(page: Browser) -> None:
    smoothing_changes_the_path(page, f"{PROJECT}/tuned")


def test_hovering_shows_the_logged_value_at_that_step(page: Browser) -> None:
    raw = series_of(page, f"{PROJECT}/base")[0]
    x, y = plot_point(page, 17, raw)
    page.mouse("mouseMoved", x, y)
    text = page.wait("(() => { const h = tracklake.charts.get('loss').hover;"
                     "return !h.hidden && h.textContent; })()", "the hover box")
    assert "step 17" in text
    assert f"base: {loss('base', 17):g}" in text and f"tuned: {loss('tuned', 17):g}" in text


def test_the_hover_box_stays_inside_its_chart_near_every_edge(page: Browser) -> None:
    """Near a chart's right edge or bottom, with long lines (the smoothed values too), the
    box of values under the cursor flips to the cursor's left or above it: it never
    covers the next chart."""
    set_control(page, "smoothing", "0.9", "input")
    page.wait(f"{LOSS}.plot && {LOSS}.plot.series[2].stroke() !== 'transparent'",
              "the smoothed curves")
    box = f"""const c = {LOSS}; if (c.hover.hidden) return false;
        const b = c.hover.getBoundingClientRect(), e = c.el.getBoundingClientRect();
        return [[b.left, b.top, b.right, b.bottom], [e.left, e.top, e.right, e.bottom],
                c.hover.textContent];"""

    def inside(found: list[Any], where: object) -> None:
        (left, top, right, bottom), chart = found[0], found[1]
        assert chart[0] <= left < right <= chart[2], (where, found)
        assert chart[1] <= top < bottom <= chart[3], (where, found)

    for fx, fy in ((0.99, 0.97), (0.99, 0.03), (0.01, 0.97), (0.5, 0.5)):
        x, y = page.js(f"""(() => {{ const u = {LOSS}.plot;
            u.root.scrollIntoView({{block: 'center'}}); {LOSS}.hover.hidden = true;
            const r = u.over.getBoundingClientRect();
            return [r.left + r.width * {fx}, r.top + r.height * {fy}]; }})()""")
        page.mouse("mouseMoved", x, y)
        found = page.wait(f"(() => {{ {box} }})()", "the hover box")
        assert "smoothed" in found[2]
        inside(found, (fx, fy))
    # run names of 2,000 characters: wrapped within the chart's width, cut to its height
    # (set and hovered in one go: a live run's refresh makes the labels again)
    found = page.js(f"""(() => {{ const u = {LOSS}.plot;
        {LOSS}.meta.forEach(m => {{ if (m) m.label = 'n'.repeat(2000); }});
        u.setCursor({{left: u.over.clientWidth / 2, top: u.over.clientHeight / 2}});
        {box} }})()""")
    assert found and "more" in found[2]
    inside(found, "long names")
    page.mouse("mouseMoved", 0, 0)
    set_control(page, "smoothing", "0", "input")


def test_dragging_zooms_into_a_range_and_a_double_click_resets_it(page: Browser) -> None:
    drag_zooms_and_double_click_resets(page, f"{PROJECT}/base", 10, 20)


def test_a_live_writers_new_steps_appear_without_a_reload(
        page: Browser, live_run: tuple[Path, tracklake.Run]) -> None:
    live = live_run[1]
    # only charts in view refresh (the histogram and media cards above may push it out)
    page.js("tracklake.charts.get('loss').el.scrollIntoView({block: 'center'})")
    assert page.js("tracklake.charts.get('loss').plot.data[0].includes(100)") is False
    for step in range(20, 101):
        live.log({"loss": 3.0 + step}, step=step)
    live.flush()
    page.wait("tracklake.charts.get('loss').plot.data[0].includes(100)", "step 100 drawn")
    assert page.js("window.notReloaded") is True


def test_a_live_chart_slow_to_answer_is_asked_again_only_after_a_pause(
        page: Browser, live_run: tuple[Path, tracklake.Run]) -> None:
    """A chart whose answer takes 1.5 s (held back in the page, as a key of millions of
    points would take) is not asked again the moment it lands while a run is live: at
    most twice in 6 s of flushes, where asking on every poll makes it four; and it still
    follows the run once answers are quick again."""
    live = live_run[1]
    page.js("tracklake.charts.get('loss').el.scrollIntoView({block: 'center'})")
    page.js("""(() => {
      window.quickFetch = window.fetch; window.lossAsked = 0;
      window.fetch = async (url, init) => {
        if (String(url).includes('/api/series') && String(url).includes('key=loss')) {
          window.lossAsked += 1; await new Promise((done) => setTimeout(done, 1500));
        }
        return window.quickFetch(url, init);
      };
    })()""")
    try:
        started, step = time.monotonic(), 101
        while time.monotonic() - started < 6:
            live.log({"loss": 3.0 + step}, step=step)
            live.flush()
            step += 1
            time.sleep(0.3)
        asked = page.js("window.lossAsked")
    finally:
        page.js("window.fetch = window.quickFetch")
    assert 1 <= asked <= 2, asked
    page.wait(f"tracklake.charts.get('loss').plot.data[0].includes({step - 1})",
              "the last step drawn once answers are quick")


def test_a_slow_run_list_spaces_the_polls_and_a_hidden_page_asks_nothing(
        page: Browser) -> None:
    """The run list held back 1.5 s in the page (as tens of thousands of runs take to
    answer): at most two polls in 6 s, where a poll every second makes three or four;
    with the page hidden (another tab) none in 3 s, and one as soon as it is shown."""
    page.js("""(() => {
      window.quickFetch = window.fetch; window.runsAsked = 0; window.runsDelay = 1500;
      window.fetch = async (url, init) => {
        if (String(url).startsWith('/api/runs') || String(url).includes('/api/runs?')) {
          window.runsAsked += 1;
          await new Promise((done) => setTimeout(done, window.runsDelay));
        }
        return window.quickFetch(url, init);
      };
    })()""")
    try:
        time.sleep(6)
        slow = page.js("window.runsAsked")
        page.js("window.runsDelay = 0; Object.defineProperty(document, 'hidden', "
                "{configurable: true, get: () => true});"
                "document.dispatchEvent(new Event('visibilitychange'))")
        time.sleep(5)  # the poll on its way, and the pause after it, end
        before = page.js("window.runsAsked")
        time.sleep(3)
        hidden = page.js("window.runsAsked") - before
        page.js("delete document.hidden; document.dispatchEvent(new Event('visibilitychange'))")
        shown = page.wait(f"window.runsAsked > {before + hidden} && window.runsAsked",
                          "a poll once the page is shown")
    finally:
        page.js("window.fetch = window.quickFetch; delete document.hidden")
    assert 1 <= slow <= 2, slow
    assert hidden == 0 and shown > before


def test_the_sql_console_answers_and_refuses_a_write(page: Browser) -> None:
    page.click_element('nav button[data-view="sql"]')
    page.js("document.getElementById('sql-text').value = "
            "\"SELECT run, max(step) AS last FROM metrics WHERE key = 'loss' "
            "GROUP BY run ORDER BY run\"")
    page.click_element("#sql-run")
    rows = page.wait("(() => { const b = document.querySelector('#sql-result tbody');"
                     "return b.rows.length === 3 && [...b.rows].map(r => r.textContent); })()",
                     "the answer's rows")
    assert rows[0] == "base39" and rows[1] == "live" + rows[1][4:] and rows[2] == "tuned39"
    page.js("document.getElementById('sql-text').value = 'DELETE FROM metrics'")
    page.click_element("#sql-run")
    error = page.wait("(() => { const e = document.getElementById('sql-error');"
                      "return !e.hidden && e.textContent; })()", "the refusal")
    assert "refused" in error and "read-only" in error
    page.click_element('nav button[data-view="charts"]')


def test_grouping_by_a_config_key_draws_one_series_per_group(page: Browser) -> None:
    page.js("(() => { const g = document.getElementById('group'); g.value = 'lr';"
            "g.dispatchEvent(new Event('change')); })()")
    labels = page.wait("(() => { const c = tracklake.charts.get('loss');"
                       "return c.plot && c.meta.filter(m => m && m.role === 'raw')"
                       ".map(m => m.label); })()", "the grouped chart")
    assert labels == ["lr=(unset)", "lr=0.1", "lr=0.3"]
    values = page.js("(() => { const c = tracklake.charts.get('loss');"
                     "return c.meta.filter(m => m && m.role === 'raw')"
                     ".map(m => m.curve.y[m.curve.x.indexOf(17)]); })()")
    assert values[1:] == [loss("base", 17), loss("tuned", 17)]
    page.js("(() => { const g = document.getElementById('group'); g.value = '';"
            "g.dispatchEvent(new Event('change')); })()")
    page.wait("(() => { const c = tracklake.charts.get('loss');"
              "return c.plot && c.meta.some(m => m && m.run === 'p/base'); })()",
              "the runs' own curves again")


def test_generations_show_one_prompts_outputs_side_by_side_and_search(page: Browser) -> None:
    page.click_element('nav button[data-view="generations"]')
    prompts = page.wait("(() => { const p = document.querySelectorAll('#gen-list .prompt');"
                        "return p.length === 2 && [...p].map(e => [e.querySelector('h4')"
                        ".textContent, [...e.querySelectorAll('tr')].map(r => [...r.cells]"
                        ".map(c => c.textContent))]); })()", "two prompts")
    france = dict(prompts)["capital of France?"]
    assert france == [["step", "base", "tuned"], ["10", "Paris score 1", "Lyon score 0"]]
    assert dict(prompts)["2+2?"][1][1] == "<b>4</b> score 1"  # text, never markup
    page.js("(() => { const s = document.getElementById('gen-search'); s.value = 'PARIS';"
            "s.dispatchEvent(new Event('input')); })()")
    page.wait("(() => { const h = document.querySelectorAll('#gen-list .prompt h4');"
              "return h.length === 1 && h[0].textContent === 'capital of France?'; })()",
              "only the prompt whose output matches")
    page.click_element('nav button[data-view="charts"]')


def test_the_runs_table_sorts_by_a_metrics_last_value_and_diffs_configs(page: Browser) -> None:
    page.click_element('nav button[data-view="table"]')
    page.wait("document.querySelectorAll('#run-key option').length > 1", "the keys")
    page.js("(() => { const s = document.getElementById('run-key'); s.value = 'acc/train';"
            "s.dispatchEvent(new Event('change')); })()")
    header = "[...document.querySelectorAll('#run-table th')]"
    rows = "[...document.querySelectorAll('#run-table tbody tr')]"
    page.wait(f"{rows}.filter(r => r.cells[9] && r.cells[9].textContent !== '').length === 2",
              "the key's last values of base and tuned")
    page.js(f"{header}.find(th => th.textContent === 'acc/train last').click()")
    names = f"{rows}.map(r => r.cells[1].textContent)"
    page.wait(f"{names}.join() === 'base,tuned,live' || {names}.join() === 'tuned,base,live'",
              "sorted by the last value, the run without one last")
    page.js(f"{header}.find(th => th.textContent === 'name').click()")
    page.wait(f"{names}.join() === 'base,live,tuned'", "sorted by name")
    diff = page.js("[...document.querySelectorAll('#config-diff tbody tr')]"
                   ".map(r => [r.className, [...r.cells].map(c => c.textContent)])")
    assert diff == [["differs", ["lr", "", "0.3", "0.1"]]]  # live, tuned, base: newest first
    assert page.js("document.getElementById('config-count').textContent") == (
        "1 of 1 keys differ")
    identity = page.js("[...document.querySelectorAll('#identity tbody tr')]"
                       ".map(r => [...r.cells].map(c => c.textContent))")
    assert identity[0] == ["run", f"{PROJECT}/live", f"{PROJECT}/tuned", f"{PROJECT}/base"]
    assert [row[0] for row in identity] == ["run", "status", "attempts", "ranks", "started",
                                            "ended", "host", "git commit", "git dirty",
                                            "command", "python", "tags"]
    page.click_element('nav button[data-view="charts"]')


def test_key_filter_sections_x_axis_and_log_scale(page: Browser) -> None:
    page.click_element('nav button[data-view="charts"]')
    sections = ("[...document.querySelectorAll('#charts details.section > summary')]"
                ".map(s => s.textContent)")
    page.wait(f"{sections}.length === 5", "the histogram and media sections")
    assert page.js(sections) == ["acc (1)", "grad (5)", "(top level) (1)", "Histograms (1)",
                                 "Media (3)"]
    set_control(page, "filter", "/^acc\\//", "input")
    assert page.js(sections) == ["acc (1)"]
    set_control(page, "filter", "lo*", "input")  # a glob matches the whole name
    assert page.js(sections) == ["(top level) (1)"]
    set_control(page, "filter", "grad/w", "input")  # histograms go by the same filter
    assert page.js(sections) == ["grad (5)", "Histograms (1)"]
    set_control(page, "filter", "sam*", "input")
    assert page.js(sections) == ["Media (1)"]
    set_control(page, "filter", "", "input")
    page.wait("tracklake.charts.get('loss').plot", "the loss chart again")
    set_control(page, "xaxis", "time")
    page.wait("(() => { const p = tracklake.charts.get('loss').plot;"
              "return p && p.data[0][0] > 1.6e9; })()", "wall time on x")
    set_control(page, "xaxis", "relative")
    page.wait("(() => { const p = tracklake.charts.get('loss').plot;"
              "return p && p.data[0][0] >= 0 && p.data[0][0] < 600; })()", "seconds on x")
    set_control(page, "logscale", "true")
    page.wait("(() => { const p = tracklake.charts.get('loss').plot;"
              "return p && p.scales.y.distr === 3; })()", "a log y axis")
    set_control(page, "logscale", "false")
    set_control(page, "xaxis", "step")
    page.wait("(() => { const p = tracklake.charts.get('loss').plot;"
              "return p && p.scales.y.distr === 1 && p.data[0][0] === 0; })()", "steps again")


HISTOGRAM = "document.querySelector('.chart.histograms[data-key=\"grad/w\"]')"
STRIP = "document.querySelector('.chart.media[data-key=\"samples\"]')"


def test_a_histogram_key_is_drawn_over_steps_and_names_the_bin_under_the_cursor(
        page: Browser) -> None:
    page.wait(f"!!({HISTOGRAM} && {HISTOGRAM}.querySelector('canvas'))", "the histogram chart")
    card = "tracklake.media.cards.get('histograms:grad/w')"
    assert page.js(f"{card}.steps.map(s => s.step)") == list(range(HIST_STEPS))
    assert page.js(f"{card}.run") == f"{PROJECT}/base"
    painted = page.js(f"""(() => {{ const c = {card}.canvas;
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }})()""")
    assert painted > 1000  # the bins are drawn, not only the axes' text
    # step 3 holds 3..12 in 5 bins of width 1.8: the value 4 is in its first bin, of 2

    def hover() -> bool:
        """Moves the mouse there and reads the box; the point is asked again each time, as
        charts above that load meanwhile move the canvas down."""
        x, y = page.js(f"""(() => {{ const c = {card};
            c.canvas.scrollIntoView({{block: 'center'}});
            const r = c.canvas.getBoundingClientRect(); const [x, y] = c.pos(3, 4);
            return [r.left + x, r.top + y]; }})()""")
        page.mouse("mouseMoved", x, y)
        return bool(page.js(f"(() => {{ const h = {card}.hover;"
                            "return !h.hidden && h.textContent; })()") == expected)
    expected = "step 3: [3, 4.8) count 2"
    until(hover, f"the hover box to say {expected!r}")


def test_an_image_key_shows_a_strip_of_decoded_images_with_step_and_caption(
        page: Browser) -> None:
    decoded = page.wait(f"""(() => {{ const s = {STRIP}; if (!s) return false;
        const imgs = [...s.querySelectorAll('img')];
        return imgs.length === 3 && imgs.every(i => i.complete && i.naturalWidth > 0)
            && imgs.map(i => [i.naturalWidth, i.naturalHeight]); }})()""", "three decoded images")
    assert decoded == [[12, 8]] * 3
    captions = page.js(f"[...{STRIP}.querySelectorAll('figcaption')].map(c => c.textContent)")
    assert captions == [f"step {s}: <b>epoch {s}</b>" for s in range(3)]  # text, not markup
    assert page.js(f"{STRIP}.querySelectorAll('b').length") == 0
    # the slider goes back to step 1: the strip shows the images up to it
    page.js(f"(() => {{ const s = {STRIP}.querySelector('.step-slider'); s.value = '1';"
            "s.dispatchEvent(new Event('input')); })()")
    assert page.js(f"[...{STRIP}.querySelectorAll('figure')].map(f => f.dataset.step)") == [
        "0", "1"]
    page.js(f"(() => {{ const s = {STRIP}.querySelector('.step-slider'); s.value = '2';"
            "s.dispatchEvent(new Event('input')); })()")


def test_audio_plays_in_a_player_and_a_gif_video_shows_as_an_image(page: Browser) -> None:
    card = "document.querySelector('.chart.media[data-key=\"{}\"]')"
    duration = page.wait(f"(() => {{ const a = {card.format('speech')}"
                         "?.querySelector('audio[controls]');"
                         "return a && a.readyState >= 1 && a.duration; })()", "the audio's length")
    assert abs(duration - 0.5) < 0.01
    assert page.js(f"{card.format('speech')}.querySelector('figcaption').textContent"
                   ) == "step 3: tone"
    size = page.wait(f"(() => {{ const i = {card.format('clip')}?.querySelector('img');"
                     "return i && i.complete && i.naturalWidth > 0 "
                     "&& [i.naturalWidth, i.naturalHeight]; })()", "the GIF decoded")
    assert size == [5, 7]


def test_a_live_writers_new_image_appears_without_a_reload(
        page: Browser, live_run: tuple[Path, tracklake.Run]) -> None:
    live = live_run[1]
    live.log_image("samples", np.full((16, 4, 3), 200, np.uint8), step=150, caption="new")
    live.flush()
    size = page.wait(f"""(() => {{ const s = {STRIP};
        const f = s && s.querySelector('figure[data-step="150"]');
        const i = f && f.querySelector('img');
        return i && i.complete && i.naturalWidth > 0 && [i.naturalWidth, i.naturalHeight]; }})()""",
                     "the live run's new image, decoded")
    assert size == [4, 16]
    assert page.js("window.notReloaded") is True


def test_a_trace_tree_expands_to_a_child_span_with_its_duration_and_searches(
        page: Browser) -> None:
    page.click_element('nav button[data-view="traces"]')
    root = f"document.querySelector('.trace-run[data-run=\"{PROJECT}/base\"] > details.span')"
    child = f"{root}.querySelector('details.span')"
    page.wait(f"!!({root} && {child})", "base's trace tree")
    assert page.js(f"{root}.querySelector('.name').textContent") == "rollout"
    assert page.js(f"{child}.checkVisibility()") is False  # folded
    page.js(f"{root}.querySelector('summary').click()")
    page.wait(f"{child}.checkVisibility()", "the child span shown")
    assert page.js(f"{child}.querySelector('.name').textContent") == "reward"
    ms = page.js(f"{child}.querySelector('.ms').textContent")
    assert ms.endswith(" ms") and int(ms[:-3]) >= 30
    inputs = page.js(f"[...{root}.querySelectorAll(':scope > .span-field pre')]"
                     ".map(p => p.textContent)")
    assert '{"prompt": "<i>hi</i>"}' in inputs  # text, never markup
    set_control(page, "trace-search", "EVAL", "input")
    page.wait("(() => { const r = [...document.querySelectorAll('.trace-run')];"
              f"return r.length === 1 && r[0].dataset.run === '{PROJECT}/tuned'; }})()",
              "only the trace that matches")
    set_control(page, "trace-search", "", "input")
    page.wait("document.querySelectorAll('.trace-run').length === 2", "both trees again")
    page.click_element('nav button[data-view="charts"]')


def test_an_alert_stands_out_and_the_level_filter_hides_it(page: Browser) -> None:
    page.click_element('nav button[data-view="events"]')
    rows = "[...document.querySelectorAll('#event-table tbody tr')]"
    alert = f"{rows}.find(r => r.cells[6].textContent === 'loss spiked')"
    page.wait(f"!!{alert}", "the alert's row")
    assert page.js(f"{alert}.className") == "level-error"
    info = f"{rows}.find(r => r.cells[6].textContent === 'checkpoint saved')"
    background = "(r) => getComputedStyle(r.cells[0]).backgroundColor"
    assert page.js(f"({background})({alert})") != page.js(f"({background})({info})")
    page.wait("[...document.getElementById('event-level').options].map(o => o.value)"
              ".join() === ',error,info'", "the levels to pick from")
    set_control(page, "event-level", "info")
    page.wait(f"!{alert} && !!{info}", "the alert hidden, the info event kept")
    set_control(page, "event-level", "")
    page.wait(f"!!{alert}", "the alert again")
    page.click_element('nav button[data-view="charts"]')


def test_a_chart_panels_sql_opened_in_the_console_answers_the_same_rows(page: Browser) -> None:
    chart = "tracklake.charts.get('loss')"
    page.wait(f"!!{chart}.sql.querySelector('.sql-open')", "the loss chart's SQL")
    page.js(f"{chart}.sql.querySelector('summary').click()")
    page.wait(f"{chart}.sql.querySelector('pre.sql-text').checkVisibility()", "the SQL shown")
    assert "FROM metrics" in page.js(f"{chart}.sql.querySelector('pre.sql-text').textContent")
    params = page.js(f"{chart}.sql.querySelector('pre.sql-params').textContent")
    assert '$key = "loss"' in params and '$buckets = "480"' in params
    curves = page.js(f"{chart}.curves.map(k => [k.project, k.run, String(k.series),"
                     "JSON.stringify(k.x)])")
    assert len(curves) == 3
    page.click_element(".chart[data-key='loss'] .sql-open")
    rows = page.wait("(() => { const b = document.querySelector('#sql-result tbody');"
                     "return !document.getElementById('sql').hidden && b.rows.length"
                     " && [...b.rows].map(r => [...r.cells].slice(0, 4)"
                     ".map(c => c.textContent)); })()", "the console's answer")
    assert rows == curves
    assert "runs=[" in page.js("document.getElementById('sql-params').value")
    page.click_element('nav button[data-view="charts"]')


def test_the_console_draws_a_chart_of_its_answer(page: Browser) -> None:
    page.click_element('nav button[data-view="sql"]')
    page.js("document.getElementById('sql-params').value = ''")
    page.js("document.getElementById('sql-text').value = \"SELECT value AS loss, step, "
            "value * 2 AS twice, run FROM metrics WHERE run = 'base' AND key = 'loss' "
            "ORDER BY step DESC\"")
    page.click_element("#sql-run")
    plot = "tracklake.sqlChart.plot"
    page.wait(f"!!{plot} && {plot}.data[0].length === 40", "the answer's chart")
    # step is x (by its name), the other numeric columns are y: uPlot has 1 + 2 series
    assert page.js(f"{plot}.series.map(s => s.label)") == ["step", "loss", "twice"]
    assert page.js(f"{plot}.data[0]") == list(range(40))  # drawn in x order
    assert page.js(f"{plot}.data[1][20]") == loss("base", 20)

    def stroke_at(series: int) -> bool:
        """Whether the canvas holds the series' colour around its point at step 20."""
        return bool(page.js(f"""(() => {{ const u = {plot};
            const x = Math.round(u.valToPos(20, 'x', true));
            const y = Math.round(u.valToPos(u.data[{series}][20], 'y', true));
            const d = u.ctx.getImageData(x - 3, y - 3, 7, 7).data;
            const want = u.series[{series}].stroke().match(/[0-9a-f]{{2}}/gi)
                .map(h => parseInt(h, 16));
            for (let i = 0; i < d.length; i += 4)
                if (d[i + 3] > 128 && want.every((v, k) => Math.abs(d[i + k] - v) < 40))
                    return true;
            return false; }})()"""))
    assert stroke_at(1) and stroke_at(2)
    page.js("document.getElementById('sql-text').value = "
            "'SELECT 1.5 AS a, 2 AS b UNION ALL SELECT 2.5, 1'")  # a decimal comes as text
    page.click_element("#sql-run")
    page.wait(f"!!{plot} && {plot}.data[0].length === 2", "the second answer's chart")
    assert page.js("document.getElementById('sql-x').value") == "-1"  # no step: row numbers
    assert page.js(f"{plot}.series.length") == 3 and page.js(f"{plot}.data[1]") == [1.5, 2.5]
    page.js("document.getElementById('sql-text').value = \"SELECT value, time FROM metrics "
            "WHERE run = 'base' AND key = 'loss'\"")
    page.click_element("#sql-run")
    page.wait(f"!!{plot} && {plot}.data[0].length === 40", "a chart over wall time")
    assert page.js(f"{plot}.series.map(s => s.label)") == ["time", "value"]
    assert page.js(f"{plot}.data[0][0] > 1.6e9 && {plot}.scales.x.time") is True
    page.click_element('nav button[data-view="charts"]')


def test_the_page_requests_nothing_beyond_the_dashboard(page: Browser,
                                                        dashboard: Dashboard) -> None:
    """Runs last: the network log of everything the tests above made the page do."""
    requested = page.requested()
    # the charts in view, in one request (a zoomed chart's own request is checked where
    # it zooms: which tests ran before this one on its worker varies)
    assert any("/api/series_batch?" in url and "key=loss" in url and "key=acc%2Ftrain" in url
               for url in requested)
    # data: URIs reach no host (Chromium's audio controls draw their icons from some)
    assert [url for url in requested
            if not url.startswith(dashboard.url) and not url.startswith("data:")] == []
