"""`tracklake report`: one HTML file that shows runs offline: the dashboard's page with
the answers it shows (identity, config, charts, generations, traces, events, each with
its SQL) embedded as JSON that no text from the store can break out of, and no
reference to any other file or host; and the Markdown variant with SVG files.
(What the page does with them in a browser: test_report_browser.py.)"""

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
from typing import Any

import pytest
from _pictures import HOSTILE, write_runs
from click.testing import CliRunner

import tracklake
from tracklake._cli.main import main
from tracklake._report.markdown import cell
from tracklake._report.series import Curve
from tracklake._report.svg import line_chart
from tracklake._ui.offline import DATA_ID


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


def embedded(html: str) -> dict[str, Any]:
    """The answers a report holds, each query's text put back in place of its number."""
    match = re.search(f'<script type="application/json" id="{DATA_ID}">(.*?)</script>',
                      html, re.S)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    texts = data.pop("sql")

    def back(value: Any) -> Any:
        if isinstance(value, list):
            return [back(v) for v in value]
        if not isinstance(value, dict):
            return value
        out = {}
        for name, v in value.items():
            if name in ("queries", "query"):
                out[name] = [{**q, "sql": texts[q["sql"]]} for q in v] if name == "queries" \
                    else {**v, "sql": texts[v["sql"]]}
            else:
                out[name] = back(v)
        return out
    return dict(back(data))


def queries(value: Any) -> list[dict[str, Any]]:
    """Every query (``{"sql", "params"}``) in `value`, each once."""
    found: list[dict[str, Any]] = []
    if isinstance(value, list):
        for v in value:
            found += [q for q in queries(v) if q not in found]
    elif isinstance(value, dict):
        if isinstance(value.get("sql"), str) and "params" in value:
            return [value]
        for v in value.values():
            found += [q for q in queries(v) if q not in found]
    return found


def test_report_has_every_part_with_its_sql(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert "2 runs, 3 charts" in report(store, out)
    data = embedded(out.read_text())
    assert [(r["run"], r["host"] is not None) for r in data["runs"]["runs"]] == [
        ("base", True), ("tuned", True)]  # in the order asked, with their identity
    assert [k["key"] for k in data["keys"]] == ["kl", "loss", "reward"]
    curves = {key: [(c["run"], c["points"]) for c in answer["curves"]]
              for key, answer in data["series"]["step"].items()}
    assert curves == {"kl": [("base", 200)], "loss": [("base", 200), ("tuned", 150)],
                      "reward": [("base", 200), ("tuned", 150)]}
    assert set(data["series"]["time"]) == set(curves)
    assert [g["output"] for g in data["generations"]["rows"] if g["output"] == "Paris"]
    assert [e["title"] for e in data["events"]["events"]] == ["reward plateau"]
    # the trace tree: the tool span is a child of the rollout span
    base = next(r for r in data["traces"]["runs"] if r["run"] == "base")
    assert [(s["name"], s["parent"]) for s in base["spans"]] == [("rollout", None),
                                                                 ("tool", 0)]
    sql = " ".join(q["sql"] for q in queries(data))
    for view in ("runs", "metric_summaries", "metrics", "generations", "traces", "events"):
        assert f"FROM {view}" in sql


def test_every_sql_a_report_shows_runs_again_with_its_parameters(store: Path,
                                                                   tmp_path: Path) -> None:
    """Each query the report shows, given to `tracklake sql` with the parameters the
    report shows (text, as a shell gives them), answers the rows the report holds: a
    chart's query its curves, the generations' query its rows."""
    out = tmp_path / "report.html"
    report(store, out)
    data = embedded(out.read_text())
    shown = queries(data)
    assert len(shown) >= 10

    def ask(q: dict[str, Any]) -> list[dict[str, Any]]:
        args = [a for name, value in q["params"].items()
                for a in ("--param", f"{name}={value}")]
        result = CliRunner().invoke(main, ["sql", "--root", str(store), "--format", "json",
                                           *args, q["sql"]])
        assert result.exit_code == 0, (q, result.output)
        return [json.loads(line) for line in result.output.splitlines()]

    answered = {json.dumps(q): ask(q) for q in shown}
    assert sum(bool(rows) for rows in answered.values()) >= 10  # not only empty answers
    loss = data["series"]["step"]["loss"]
    rows = answered[json.dumps(loss["queries"][0])]
    assert [(r["run"], r["xs"], r["n"]) for r in rows] == [
        (c["run"], c["x"], c["points"]) for c in loss["curves"]]
    generations = data["generations"]
    rows = answered[json.dumps(generations["queries"][0])]
    assert [r["output"] for r in rows] == [g["output"] for g in generations["rows"]]


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


def test_text_from_the_store_cannot_end_the_data_or_run(store: Path, tmp_path: Path) -> None:
    """A run name, config value, generation, span input and alert holding ``</script>``
    and markup are held as JSON text with every ``<``, ``>`` and ``&`` escaped: the page's
    only elements are its own, and its scripts run only by their hashes in its CSP, which
    lets the page connect nowhere."""
    import base64
    import hashlib

    out = tmp_path / "report.html"
    report(store, out)
    html = out.read_text()
    assert HOSTILE not in html and "document.title=" in html  # held, escaped
    parsed = elements(html)
    scripts = [attrs for tag, attrs in parsed.tags if tag == "script"]
    assert scripts == [{"type": "application/json", "id": DATA_ID}, {}, {}]
    assert html.count("</script>") == 3 and "<!--" not in html
    assert not [t for t, attrs in parsed.tags if t == "img" or "onerror" in attrs]
    [csp] = [a["content"] for t, a in parsed.tags
             if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    for code in parsed.scripts[1:]:  # uPlot and the page's own script
        digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    assert "'unsafe-inline'" not in csp
    data = embedded(html)
    assert data["runs"]["runs"][0]["name"] == f"baseline {HOSTILE}"
    # a comment opened in the data would hide the rest of the page from the parser
    with tracklake.init(project="p", run_id="c", root=store, name="<!--",
                        config={"x": "<!-- </script"}) as run:
        run.log_generations([{"input": "<!--", "output": "-->"}], step=0)
    result = CliRunner().invoke(main, ["report", "c", "--root", str(store), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "<!--" not in html and "-->" not in html and html.count("</script>") == 3
    assert embedded(html)["generations"]["rows"][0]["input"] == "<!--"


def test_a_config_shaped_like_a_query_is_held_as_it_is(root: Path, tmp_path: Path) -> None:
    """The report writes each query's text once and refers to it by number: a config
    whose keys are those of a query is data, left alone."""
    with tracklake.init(project="p", run_id="q", root=root,
                        config={"sql": "SELECT 1", "params": "none"}):
        pass
    out = tmp_path / "q.html"
    result = CliRunner().invoke(main, ["report", "q", "--root", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    config = embedded(out.read_text())["runs"]["runs"][0]["config"]
    assert config == {"sql": '"SELECT 1"', "params": '"none"'}


def test_report_references_no_other_file_or_host(store: Path, tmp_path: Path) -> None:
    """Scripts and styles are inline; the one address in the file is in uPlot's licence
    notice, a comment."""
    out = tmp_path / "report.html"
    report(store, out)
    html = out.read_text()
    refs = [(tag, name, value) for tag, attrs in elements(html).tags
            for name, value in attrs.items() if name in ("src", "href", "xlink:href",
                                                         "action", "data", "poster")]
    assert refs == [("link", "href", "data:,")]  # the empty icon: no request for one
    html = html.replace("/*! https://github.com/leeoniya/uPlot (v1.6.32) */", "", 1)
    assert not re.search(r"https?://|url\(|@import", html)


def test_a_thousand_keys_are_downsampled_and_say_so(root: Path, tmp_path: Path) -> None:
    """Each curve holds as few points as keep the file a few MB (the extremes of each of
    its pixel buckets) and the number of points it has, which the chart's note gives
    beside the number drawn."""
    with tracklake.init(project="p", run_id="wide", root=root) as run:
        for step in range(300):
            run.log({f"layer{k:04d}/grad": (k + 1) * step for k in range(1000)}, step=step)
    out = tmp_path / "wide.html"
    result = CliRunner().invoke(main, ["report", "wide", "--root", str(root), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    data = embedded(html)
    buckets = data["report"]["buckets"]
    assert buckets == 40  # 160,000 points over 1,000 curves on two axes, two a bucket
    for axis in ("step", "time"):
        curves = [c for answer in data["series"][axis].values() for c in answer["curves"]]
        assert len(curves) == 1000
        assert all(c["points"] == 300 and len(c["x"]) <= 2 * buckets for c in curves)
    assert len(html) < 6_000_000


@pytest.mark.parametrize(("args", "ranks", "series"), [
    ((), "first", {0}), (("--ranks", "mean"), "mean", {-1}), (("--ranks", "1"), "all", {1}),
    (("--ranks", "all"), "all", {0, 1})])
def test_the_options_choose_the_curves_held_and_how_the_page_starts(
        store: Path, tmp_path: Path, args: tuple[str, ...], ranks: str, series: set[int]
        ) -> None:
    """--ranks is the ranks mode held (rank N: that rank's curves only; the mean with its
    band); --smooth N starts the slider at the moving average of the same span; --x time
    on the time since the run started."""
    out = tmp_path / "report.html"
    report(store, out, "--key", "loss", "--smooth", "5", "--x", "time", *args)
    data = embedded(out.read_text())
    assert (data["report"]["ranks"], data["report"]["x"]) == (ranks, "relative")
    assert data["report"]["smoothing"] == 0.66  # 1 - 2/(5+1), to the slider's step
    base = [c for c in data["series"]["step"]["loss"]["curves"] if c["run"] == "base"]
    assert {c["series"] for c in base} == series
    assert all(("lo" in c) == (ranks == "mean") for c in base)


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
    data = embedded(out.read_text())
    assert data["keys"] == [] and data["series"] == {"step": {}, "time": {}}
    assert data["runs"]["runs"][0]["config"] == {}


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
    data = embedded(out.read_text())
    assert data["runs"]["runs"][0]["status"] == "running"
    assert len(data["series"]["step"]["loss"]["curves"]) == 1


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
