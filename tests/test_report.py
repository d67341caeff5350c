"""`tracklake report`: one HTML file that shows runs offline (identity, config diff,
charts, generations, traces, alerts, each with its SQL), text from the store escaped,
no reference to any other file or host; and the Markdown variant with SVG files."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _pictures import HOSTILE, write_runs
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._report.markdown import cell
from tracklake._report.page import SCRIPT_HASH
from tracklake._report.series import Curve
from tracklake._report.svg import line_chart


@pytest.fixture
def store(root: Path) -> Path:
    write_runs(root)
    return root


def report(store: Path, out: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["report", "base", "tuned", "--root", str(store),
                                       "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return result.output


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text of <script> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def elements(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def test_report_has_every_part_with_its_sql(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert "2 runs, 3 charts" in report(store, out)
    html = out.read_text()
    for part in ("Runs", "Charts", "Histograms and images", "Config", "Generations",
                 "Traces", "Alerts and events"):
        assert f">{part}</h2>" in html
    assert html.count("<summary>SQL</summary>") == 8  # histograms and images: one each
    assert "FROM generations" in html and "FROM traces" in html and "FROM metrics" in html
    tags = elements(html).tags
    assert sum(tag == "svg" for tag, _ in tags) == 3  # loss, reward, kl
    assert sum(tag == "polyline" for tag, _ in tags) == 5  # base has all 3, tuned 2
    assert "Paris" in html and "reward plateau" in html
    # the trace tree: the tool span is a child of the rollout span
    assert re.search(r"<summary>rollout.*?<details class=\"span\"><summary>tool", html, re.S)


def test_every_sql_a_report_shows_runs_again_with_its_parameters(store: Path,
                                                                   tmp_path: Path) -> None:
    """Each SQL block of the report, given to `tracklake sql` with the parameters the
    report prints (text, as a shell gives them), answers what the same query answers with
    the values the report used; a parameter a statement does not name is ignored."""
    import html as html_lib
    import shlex

    out = tmp_path / "report.html"
    report(store, out)
    page = out.read_text()
    blocks = [html_lib.unescape(b) for b in re.findall(r'<pre class="sql">(.*?)</pre>',
                                                      page, re.S)]
    assert len(blocks) == 8 and not any("lowest rank" in b for b in blocks)
    row = re.search(r"<th>SQL parameters</th>(.*?)</tr>", page, re.S)
    assert row is not None
    per_run = [shlex.split(html_lib.unescape(c))
               for c in re.findall(r'<td class="text">(.*?)</td>', row.group(1), re.S)]
    charts = re.search(r"their SQL takes (.*?) besides", page, re.S)
    assert charts is not None and len(per_run) == 2
    chart_args = shlex.split(html_lib.unescape(charts.group(1)))
    answered = 0
    for args in per_run:
        given = dict(a.split("=", 1) for a in (args + chart_args)[1::2])
        typed = {"p": given["p"], "r": given["r"], "rank": int(given["rank"]),
                 "keys": given["keys"][1:-1].split(", "), "since": int(given["since"]),
                 "buckets": int(given["buckets"])}
        for sql in blocks:
            result = CliRunner().invoke(main, ["sql", "--root", str(store), "--format",
                                               "json", *args, *chart_args, sql])
            assert result.exit_code == 0, (sql, result.output)
            names = set(re.findall(r"\$(\w+)", sql))
            expected = tracklake.query(sql, root=store, params={
                k: v for k, v in typed.items() if k in names}).to_pylist()
            got = [json.loads(line) for line in result.output.splitlines()]
            assert got == json.loads(json.dumps(expected, default=str)), sql
            answered += bool(got)
    assert answered >= 8  # not a comparison of empty answers


def test_sql_params_name_what_is_missing_or_malformed(store: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["sql", "--root", str(store), "--param", "p=demo",
                                   "SELECT * FROM runs WHERE project = $p AND run = $r"])
    assert missing.exit_code == 2 and "$r" in missing.output and "--param r=" in missing.output
    for bad in ("noequals", "1x=2", "a b=1"):
        result = runner.invoke(main, ["sql", "--root", str(store), "--param", bad,
                                      "SELECT 1"])
        assert result.exit_code == 2 and bad in result.output
    twice = runner.invoke(main, ["sql", "--root", str(store), "--param", "a=1", "--param",
                                 "a=2", "SELECT $a"])
    assert twice.exit_code == 2 and "--param a is given twice" in twice.output
    # a value is text, even one like a number, and a quote in it is data, not SQL
    text = runner.invoke(main, ["sql", "--root", str(store), "--format", "json", "--param",
                                "a=007", "--param", "b=x' OR '1'='1", "SELECT $a AS a, $b AS b"])
    assert text.exit_code == 0, text.output
    assert json.loads(text.output) == {"a": "007", "b": "x' OR '1'='1"}


def test_config_diff_lists_differing_keys_first(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    report(store, out)
    html = out.read_text()
    assert "2 of 2 keys differ" in html
    rows = re.findall(r'<tr class="(differs|same)">\s*<td>([^<]*)</td>', html)
    assert rows == [("differs", "note"), ("differs", "optim/lr")]


def test_text_from_the_store_is_escaped_everywhere(store: Path, tmp_path: Path) -> None:
    """A run name, config value, generation, span input and alert holding markup show
    as text: the page's only script is its own, allowed by hash in its CSP."""
    out = tmp_path / "report.html"
    report(store, out)
    html = out.read_text()
    parsed = elements(html)
    assert [tag for tag, _ in parsed.tags].count("script") == 1
    assert not [t for t, attrs in parsed.tags if t == "img" or "onerror" in attrs]
    assert html.count("&lt;script&gt;document.title=") >= 5  # name, config, output, span, alert
    assert f"script-src '{SCRIPT_HASH}'" in html


def test_report_references_no_other_file_or_host(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    report(store, out)
    html = out.read_text()
    refs = [(tag, name, value) for tag, attrs in elements(html).tags
            for name, value in attrs.items() if name in ("src", "href", "xlink:href",
                                                         "action", "data", "poster")]
    assert refs == []
    assert not re.search(r"https?://|url\(|@import", html)


def test_a_thousand_keys_are_downsampled_and_say_so(root: Path, tmp_path: Path) -> None:
    with tracklake.init(project="p", run_id="wide", root=root) as run:
        for step in range(300):
            run.log({f"layer{k:04d}/grad": (k + 1) * step for k in range(1000)}, step=step)
    out = tmp_path / "wide.html"
    result = CliRunner().invoke(main, ["report", "wide", "--root", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert html.count("<svg ") == 1000
    assert html.count("(300 points, drawn as 120 bucket means)") == 1000
    assert len(html) < 8_000_000


def test_markdown_report_writes_svg_files_it_links(store: Path, tmp_path: Path) -> None:
    folder = tmp_path / "wiki"
    report(store, folder, "--format", "md", "--key", "lo*", "--key", "reward")
    text = (folder / "report.md").read_text()
    links = re.findall(r"!\[[^]]*\]\((charts/[^)]+)\)", text)
    assert links == ["charts/0000-loss.svg", "charts/0001-reward.svg"]
    for link in links:
        svg = ET.parse(folder / link).getroot()  # well-formed XML, standalone SVG
        assert svg.tag == "{http://www.w3.org/2000/svg}svg"
        assert svg.findall(".//{http://www.w3.org/2000/svg}polyline")
    assert HOSTILE not in text and "&lt;script&gt;" in text
    assert "| note | " not in text and "| * note | " in text


def test_report_errors_name_the_run_and_the_key(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", "base", "ghost", "--root", str(store),
                                       "-o", str(out)])
    assert result.exit_code == 1 and "no run 'ghost'" in result.output
    result = CliRunner().invoke(main, ["report", "base", "--key", "nothing*", "--root",
                                       str(store), "-o", str(out)])
    assert result.exit_code == 1
    assert "run p/base has no metric key matching 'nothing*'" in result.output
    assert not out.exists()
    result = CliRunner().invoke(main, ["report", "base", "--root", str(store), "-o",
                                       str(store / "r.html")])
    assert result.exit_code == 2 and "inside the store" in result.output


def test_report_of_a_run_with_nothing_logged(root: Path, tmp_path: Path) -> None:
    with tracklake.init(project="p", run_id="empty", root=root):
        pass
    out = tmp_path / "empty.html"
    result = CliRunner().invoke(main, ["report", "empty", "--root", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "0 metric keys" in html and "0 of 0 keys differ" in html


def test_a_live_run_gets_a_report_while_it_is_written(root: Path, tmp_path: Path) -> None:
    run = tracklake.init(project="p", run_id="live", root=root)
    for step in range(50):
        run.log({"loss": 1 / (step + 1)}, step=step)
    assert run.flush()
    out = tmp_path / "live.html"
    try:
        result = CliRunner().invoke(main, ["report", "live", "--root", str(root), "-o",
                                           str(out)])
    finally:
        run.finish()
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "<td class=\"text\">running</td>" in html and html.count("<polyline") == 1


def test_huge_values_give_finite_chart_coordinates() -> None:
    curve = Curve(run="r", key="k", ranks="rank 0", xs=[0.0, 1.0, 2.0],
                  ys=[1.7e308, -1.7e308, 0.0], points=3)
    svg = line_chart("k", [("r", curve)])
    points = re.search(r'points="([^"]*)"', svg)
    assert points is not None
    coords = [float(v) for pair in points.group(1).split() for v in pair.split(",")]
    assert len(coords) == 6 and all(math.isfinite(v) for v in coords)
    assert "1.7e+308" in svg and "-1.7e+308" in svg  # the axis says the range


def test_markdown_cells_keep_pipes_newlines_and_markup_as_text() -> None:
    assert cell("a|b\nc<script>") == "a\\|b<br>c&lt;script&gt;"
    assert cell(None) == ""


@pytest.mark.slow
def test_a_report_killed_mid_way_leaves_the_previous_file_whole(
        root: Path, tmp_path: Path) -> None:
    """kill -9 at several moments of `tracklake report`: the output is always a whole
    page, the previous one or the new one."""
    with tracklake.init(project="p", run_id="wide", root=root, fsync=False) as run:
        for step in range(200):
            run.log({f"k{k:03d}": step * k for k in range(300)}, step=step)
    out = tmp_path / "wide.html"
    out.write_text("<!DOCTYPE html><html>previous</html>\n")
    tracklake_bin = str(Path(sys.executable).with_name("tracklake"))
    for delay in (0.3, 0.8, 1.5, 2.5, 4.0):
        proc = subprocess.Popen([tracklake_bin, "report", "wide", "--root", str(root), "-o",
                                 str(out)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        html = out.read_text()
        assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_a_report_into_a_missing_directory_is_refused_not_made(store: Path, tmp_path: Path,
                                                               fmt: str) -> None:
    out = tmp_path / "typo" / "deeper" / "report.html"
    result = CliRunner().invoke(main, ["report", "base", "--root", str(store), "-o", str(out),
                                       "--format", fmt])
    assert result.exit_code == 2 and "is not an existing directory" in result.output
    assert not (tmp_path / "typo").exists()
