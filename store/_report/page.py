"""The report's HTML template: styles and a few lines of script inline, nothing loaded
from elsewhere; a Content-Security-Policy lets only this page's own script run, so text
from the store can never become code even if it escaped the autoescaping."""

from __future__ import annotations

import base64
import hashlib

#: Filters the rows of a table by the text of its search box, and hides identical config
#: rows on request, searches for `#q=TEXT` of the address; marks the body so that a test
#: can see the script ran under the CSP.
SCRIPT = """
document.body.dataset.scripted = 'yes';
document.querySelectorAll('input[data-filter]').forEach(function (box) {
  box.addEventListener('input', function () {
    var needle = box.value.toLowerCase();
    document.querySelectorAll('#' + box.dataset.filter + ' tbody tr').forEach(function (tr) {
      tr.hidden = needle !== '' && tr.textContent.toLowerCase().indexOf(needle) < 0;
    });
  });
});
// report.html#q=TEXT opens with the tables searched for TEXT (a link to a search)
var asked = new URLSearchParams(location.hash.slice(1)).get('q');
if (asked) document.querySelectorAll('input[data-filter]').forEach(function (box) {
  box.value = asked;
  box.dispatchEvent(new Event('input'));
});
var only = document.getElementById('only-diff');
if (only) only.addEventListener('change', function () {
  document.querySelectorAll('#config tbody tr.same').forEach(function (tr) {
    tr.hidden = only.checked;
  });
});
"""

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: .5em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
td.text { white-space: pre-wrap; max-width: 40em; }
tr.differs td { background: #fff4d6; }
pre.sql { background: #f4f4f4; padding: .5em; font-size: 12px; white-space: pre-wrap; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; }
svg.chart { border: 1px solid #eee; background: #fff; }
svg.chart text.t { font-weight: bold; font-size: 12px; }
details.span { margin-left: 1.2em; }
summary { cursor: pointer; }
.error { color: #b00; }
.note { color: #666; font-size: 12px; }
.strip { display: flex; flex-wrap: wrap; gap: 6px; align-items: flex-end; margin: .5em 0; }
.strip figure { margin: 0; font-size: 11px; }
.strip img { max-width: 160px; max-height: 160px; image-rendering: pixelated;
  border: 1px solid #eee; }
"""

SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; \
style-src 'unsafe-inline'; img-src data:; script-src '{{ script_hash }}'">
<title>tracklake report: {{ runs | map(attribute='label') | join(', ') }}</title>
<style>{{ style }}</style></head>
<body>
<h1>tracklake report</h1>
<p class="note">{{ runs | length }} run(s) from {{ root }}, written {{ written }} by
tracklake {{ version }}. Every part shows the SQL that read it:
<code>tracklake sql</code> runs it again, given a run's SQL parameters (the last row of
the runs table) after <code>--root</code>.</p>

<h2 id="runs">Runs</h2>
<table id="run-table"><thead><tr><th></th>
{% for p in runs %}<th>{{ p.label }}</th>{% endfor %}</tr></thead><tbody>
{% for field, values in identity %}<tr><th>{{ field }}</th>
{% for v in values %}<td class="text">{{ v }}</td>{% endfor %}</tr>{% endfor %}
</tbody></table>
{{ sql_block(sql.run) }}

<h2 id="charts">Charts</h2>
<p class="note">{{ charts | length }} metric keys{{ charts_note }}.</p>
<div class="charts">{% for svg in charts %}{{ svg }}{% endfor %}</div>
{{ sql_block(sql.charts) }}

<h2 id="histograms">Histograms and images</h2>
<p class="note">Per key, the latest {{ max_histogram_steps }} histograms of the run's lowest
rank (a column per step, each bin as dark as its count) and the latest {{ max_images }}
images.</p>
{% for p, svgs, strips in media %}{% if svgs or strips %}<h3>{{ p.label }}</h3>
<div class="charts">{% for svg in svgs %}{{ svg }}{% endfor %}</div>
{% for key, shown in strips %}<div class="strip"><b>{{ key }}</b>
{% for im in shown %}<figure>{% if im.src %}<img src="{{ im.src }}" alt="{{ key }} step {{
im.step }}">{% else %}<span class="note">not shown ({{ im.media_type }}, {{ im.size }}
bytes)</span>{% endif %}<figcaption>step {{ im.step }}{% if im.caption %}: {{ im.caption }}
{% endif %}</figcaption></figure>{% endfor %}</div>{% endfor %}{% endif %}{% endfor %}
{{ sql_block(sql.histograms) }}{{ sql_block(sql.images) }}

<h2 id="config-diff">Config</h2>
<p>{{ config | selectattr('differs') | list | length }} of {{ config | length }} keys differ
{% if runs | length > 1 %}<label><input type="checkbox" id="only-diff"> only differences
</label>{% endif %}</p>
<table id="config"><thead><tr><th>key</th>
{% for p in runs %}<th>{{ p.label }}</th>{% endfor %}</tr></thead><tbody>
{% for row in config %}<tr class="{{ 'differs' if row.differs else 'same' }}">
<td>{{ row.key }}</td>{% for v in row.values %}<td class="text">{{ v }}</td>{% endfor %}
</tr>{% endfor %}</tbody></table>
{{ sql_block(sql.config) }}

<h2 id="generations">Generations</h2>
{% for p in runs %}<h3>{{ p.label }}: {{ p.generations | length }} samples
{%- if p.more_generations %} (the first {{ max_generations }}; more in the store){% endif %}
</h3>
{% if p.generations %}
<input type="search" placeholder="search" data-filter="gen-{{ loop.index }}">
<table id="gen-{{ loop.index }}" class="generations"><thead><tr><th>step</th><th>key</th>
<th>rank</th><th>sample</th><th>input</th><th>output</th><th>score</th></tr></thead><tbody>
{% for g in p.generations %}<tr><td>{{ g.step }}</td><td>{{ g.key }}</td><td>{{ g.rank }}</td>
<td>{{ g.sample }}</td><td class="text">{{ g.input }}</td><td class="text">{{ g.output }}</td>
<td>{{ g.score }}</td></tr>{% endfor %}</tbody></table>{% endif %}
{% endfor %}
{{ sql_block(sql.generations) }}

<h2 id="traces">Traces</h2>
{% for p in runs %}<h3>{{ p.label }}: {{ p.traces | length }} traces
{%- if p.more_spans %} (the first {{ max_spans }} spans; more in the store){% endif %}</h3>
<div class="traces">{% for span in p.traces %}{{ span_tree(span) }}{% endfor %}</div>
{% endfor %}
{{ sql_block(sql.traces) }}

<h2 id="alerts">Alerts and events</h2>
<table id="events"><thead><tr><th>run</th><th>time</th><th>step</th><th>rank</th>
<th>level</th><th>kind</th><th>title</th><th>text</th></tr></thead><tbody>
{% for p in runs %}{% for e in p.events %}<tr><td>{{ p.label }}</td><td>{{ e.time }}</td>
<td>{{ e.step }}</td><td>{{ e.rank }}</td><td>{{ e.level }}</td><td>{{ e.kind }}</td>
<td>{{ e.title }}</td><td class="text">{{ e.text }}</td></tr>{% endfor %}{% endfor %}
</tbody></table>
{{ sql_block(sql.events) }}
<script>{{ script }}</script>
</body></html>
"""

MACROS = """
{% macro sql_block(text) %}<details><summary>SQL</summary><pre class="sql">{{ text }}</pre>
</details>{% endmacro %}
{% macro span_tree(span) %}<details class="span"><summary>{{ span.row.name }}
<span class="note">{{ span.row.status }}{% if span.row.ms is not none %},
{{ '%.1f' | format(span.row.ms) }} ms{% endif %}, step {{ span.row.step }},
rank {{ span.row.rank }}</span>
{% if span.row.error %}<span class="error">{{ span.row.error }}</span>{% endif %}</summary>
{% for name in ('attributes', 'inputs', 'outputs') %}{% if span.row[name] %}
<div class="text"><b>{{ name }}</b>: {{ span.row[name] }}</div>{% endif %}{% endfor %}
{% for child in span.children %}{{ span_tree(child) }}{% endfor %}</details>{% endmacro %}
"""
