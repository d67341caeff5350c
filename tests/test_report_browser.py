"""What a person sees of report.html: headless Chromium opens it with every host name
unresolvable, runs its script (under its own CSP), draws its charts and tables, and
requests nothing from any host; a screenshot shows the charts' colours."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from _optional import optional
from _pictures import write_runs
from _programs import program
from click.testing import CliRunner

from tracklake._cli.main import main
from tracklake._report.svg import PALETTE

#: No host name resolves, and Chromium's own background traffic is off.
OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--disable-default-apps",
           "--disable-domain-reliability"]


@pytest.fixture
def page(root: Path, tmp_path: Path) -> Path:
    write_runs(root)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "base", "tuned", "--root", str(root),
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def chromium(tmp_path: Path, page: Path, *args: str) -> tuple[str, list[str]]:
    """Open `page`: Chromium's output and the URLs the page itself requested."""
    net_log = tmp_path / f"net-{page.stem}.json"
    done = subprocess.run(
        [program("chromium"), *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}",
         f"--log-net-log={net_log}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True)
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requested = [e["params"]["url"] for e in log["events"]
                 if e["type"] == start and "url" in e["params"]
                 and e["params"].get("network_isolation_key", "").startswith("file://")]
    return done.stdout, requested


def test_the_page_requests_nothing_and_a_page_that_does_is_caught(
        page: Path, tmp_path: Path) -> None:
    _, requested = chromium(tmp_path, page, "--dump-dom")
    assert requested == []
    leaky = tmp_path / "leaky.html"
    leaky.write_text('<html><body><img src="https://example.com/x.png"></body></html>')
    _, requested = chromium(tmp_path, leaky, "--dump-dom")
    assert requested == ["https://example.com/x.png"]


def test_chromium_runs_the_script_and_shows_charts_tables_and_trees(
        page: Path, tmp_path: Path) -> None:
    dom, _ = chromium(tmp_path, page, "--dump-dom")
    assert '<body data-scripted="yes">' in dom  # the CSP let the page's own script run
    assert dom.count("<polyline") == 5 and dom.count('<svg class="chart"') == 3
    assert dom.count('<input type="search"') == 1  # base's generations
    assert "<td class=\"text\">Paris</td>" in dom
    assert '<details class="span">' in dom
    # the hostile text stayed text: no element, and the title was not changed by it
    assert "<title>tracklake report: p/base, p/tuned</title>" in dom
    assert "<img" not in dom


def test_screenshot_shows_the_charts(page: Path, tmp_path: Path) -> None:
    image = optional("PIL.Image")
    shot = tmp_path / "shot.png"
    chromium(tmp_path, page, "--window-size=1200,2400", f"--screenshot={shot}")
    with image.open(shot) as picture:
        colors = {rgb for _, rgb in picture.convert("RGB").getcolors(1 << 24) or []}
    for hex_color in PALETTE[:2]:  # the first two curves of each chart
        rgb = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colors, f"no pixel of {hex_color} in {shot}"


def test_the_search_box_hides_the_generations_that_do_not_match(
        page: Path, tmp_path: Path) -> None:
    """`report.html#q=paris` searches on opening, as typing in the box would."""
    linked = page.with_name("searched.html")
    linked.write_text(page.read_text())
    done = subprocess.run(
        [program("chromium"), *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}",
         "--dump-dom", linked.as_uri() + "#q=paris"],
        capture_output=True, text=True, timeout=120, check=True)
    rows = re.findall(r'<tr( hidden="")?><td>100</td>(.*?)</tr>', done.stdout, re.S)
    shown = [cells for hidden, cells in rows if not hidden]
    assert len(rows) == 2 and len(shown) == 1 and "Paris" in shown[0]
