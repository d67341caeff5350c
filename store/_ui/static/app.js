// tracklake ui: the page. Everything it shows comes from the dashboard's own /api/*.
"use strict";
(function () {
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                   "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  const WIDTH = 480, HEIGHT = 220, POLL_MS = 1000;
  const state = { runs: [], shown: new Set(), keys: [], smoothing: 0, x: "step",
                  ranks: "first", group: "", log: false, filter: "", sort: ["started", -1] };
  const charts = new Map();  // key -> {el, plot, meta, curves, zoom, visible}
  const $ = (id) => document.getElementById(id);
  const runId = (r) => r.project + "/" + r.run;

  async function api(path, body) {
    const init = body === undefined ? {} : {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body) };
    const res = await fetch(path, init);
    const answer = await res.json();
    if (!res.ok) throw new Error(answer.error || res.statusText);
    return answer;
  }

  const groups = [];
  function color(id) {
    if (id.startsWith("group:")) {
      if (!groups.includes(id)) groups.push(id);
      return PALETTE[groups.indexOf(id) % PALETTE.length];
    }
    const i = state.runs.findIndex((r) => runId(r) === id);
    return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
  }
  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${a})`;
  }
  function runLabel(id) {
    const r = state.runs.find((x) => runId(x) === id);
    return r ? (r.name || r.run) : id;
  }

  // EMA as TensorBoard's scalar dashboard smooths: debiased, non-finite values pass through
  function smooth(ys, w) {
    if (!w) return ys.slice();
    let last = 0, n = 0;
    return ys.map((y) => {
      if (y === null || y === undefined || !isFinite(y)) return y;
      last = last * w + (1 - w) * y; n += 1;
      return last / (1 - Math.pow(w, n));
    });
  }

  // ---- key filter and sections ----
  function keyMatcher(text) {
    text = text.trim();
    if (!text) return () => true;
    if (text.length > 2 && text.startsWith("/") && text.endsWith("/")) {
      try { const re = new RegExp(text.slice(1, -1)); return (k) => re.test(k); }
      catch (e) { return () => false; }
    }
    if (/[*?]/.test(text)) {
      const re = new RegExp("^" + text.replace(/[.+^${}()|[\]\\]/g, "\\$&")
        .replace(/\*/g, ".*").replace(/\?/g, ".") + "$");
      return (k) => re.test(k);
    }
    return (k) => k.includes(text);
  }
  function section(key) { const i = key.indexOf("/"); return i < 0 ? "(top level)" : key.slice(0, i); }

  // ---- runs list ----
  function renderRuns() {
    const ul = $("runs");
    ul.textContent = "";
    for (const r of state.runs) {
      const id = runId(r);
      const li = document.createElement("li");
      const box = document.createElement("input");
      box.type = "checkbox"; box.checked = state.shown.has(id); box.dataset.run = id;
      box.addEventListener("change", () => toggleRun(id, box.checked));
      const sw = document.createElement("span");
      sw.className = "swatch"; sw.style.background = color(id);
      const label = document.createElement("label");
      label.append(box, sw, document.createTextNode(` ${r.name || r.run} (${r.status})`));
      label.title = id;
      li.append(label);
      ul.append(li);
    }
  }
  function toggleRun(id, on) {
    if (on) state.shown.add(id); else state.shown.delete(id);
    if (state.group) redrawAll();  // a group's mean is over the runs shown
    for (const c of charts.values()) {
      if (!c.plot) continue;
      c.meta.forEach((m, i) => { if (m && m.run === id) c.plot.setSeries(i, { show: on }); });
    }
    for (const box of document.querySelectorAll(`input[data-run="${CSS.escape(id)}"]`)) box.checked = on;
    renderConfigDiff();
  }

  // ---- charts ----
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const c = charts.get(e.target.dataset.key);
      if (!c) continue;
      c.visible = e.isIntersecting;
      if (c.visible && !c.loaded) load(c);
    }
  });

  function renderCharts() {
    for (const c of charts.values()) if (c.plot) c.plot.destroy();
    charts.clear();
    observer.disconnect();
    const view = $("charts");
    view.textContent = "";
    const match = keyMatcher(state.filter);
    const bySection = new Map();
    for (const k of state.keys) {
      if (!match(k.key)) continue;
      const s = section(k.key);
      if (!bySection.has(s)) bySection.set(s, []);
      bySection.get(s).push(k);
    }
    for (const [name, keys] of bySection) {
      const det = document.createElement("details");
      det.className = "section"; det.open = true;
      const sum = document.createElement("summary");
      sum.textContent = `${name} (${keys.length})`;
      const grid = document.createElement("div");
      grid.className = "grid";
      det.append(sum, grid);
      view.append(det);
      for (const k of keys) {
        const el = document.createElement("div");
        el.className = "chart"; el.dataset.key = k.key;
        const h = document.createElement("h4"); h.textContent = k.key;
        const note = document.createElement("div"); note.className = "note";
        const hover = document.createElement("div"); hover.className = "hover"; hover.hidden = true;
        el.append(h, note, hover);
        grid.append(el);
        charts.set(k.key, { key: k.key, el, note, hover, plot: null, meta: [], curves: [],
                            zoom: null, visible: false, loaded: false });
        observer.observe(el);
      }
    }
    if (!charts.size) view.textContent = state.keys.length ? "No key matches the filter." : "No metrics yet.";
  }

  function seriesUrl(c) {
    const p = new URLSearchParams({ key: c.key, x: state.x, ranks: state.ranks, buckets: String(WIDTH) });
    for (const r of state.runs) if (!state.group || state.shown.has(runId(r))) p.append("run", runId(r));
    if (state.group) p.set("group", state.group);
    if (c.zoom) { p.set("lo", String(c.zoom[0])); p.set("hi", String(c.zoom[1])); }
    return "/api/series?" + p.toString();
  }

  let epoch = 0;  // counts changes of what a series request asks (axis, ranks, group)
  async function load(c) {
    if (c.loading) { c.again = true; return; }
    c.loading = true;
    const asked = epoch;
    try {
      const answer = await api(seriesUrl(c));
      if (charts.get(c.key) !== c) return;  // redrawn meanwhile
      if (asked !== epoch) { c.again = true; return; }  // an answer to an older question
      c.curves = answer.curves;
      c.attempts = answer.attempts;
      c.loaded = true;
      draw(c);
    } catch (e) {
      c.note.textContent = "error: " + e.message;
    } finally {
      c.loading = false;
      if (c.again) { c.again = false; load(c); }
    }
  }

  function tables(c) {
    // per curve: x, raw y, smoothed y (and the band in mean mode)
    const out = [], meta = [null];
    for (const cur of c.curves) {
      const id = state.group ? "group:" + cur.run : cur.project + "/" + cur.run;
      let ys = cur.y;
      if (state.log) ys = ys.map((v) => (v !== null && v > 0 ? v : null));
      const t = [cur.x, ys, smooth(ys, state.smoothing)];
      const label = state.group ? `${state.group}=${cur.run}`
        : runLabel(id) + (state.ranks === "all" ? ` rank ${cur.series}` : "");
      meta.push({ run: id, role: "raw", label, curve: cur }, { run: id, role: "smooth", label, curve: cur });
      if (state.ranks === "mean" || state.group) {
        t.push(cur.lo, cur.hi);
        meta.push({ run: id, role: "lo", label, curve: cur }, { run: id, role: "hi", label, curve: cur });
      }
      out.push(t);
    }
    return { out, meta };
  }

  function draw(c) {
    if (c.dragging) { c.drawLater = true; return; }  // new data would end a zoom being dragged
    const { out, meta } = tables(c);
    const data = out.length ? uPlot.join(out) : [[]];
    const shownPoints = c.curves.reduce((a, cur) => a + cur.x.length, 0);
    const allPoints = c.curves.reduce((a, cur) => a + cur.points, 0);
    c.note.textContent = c.curves.length
      ? `${allPoints} points` + (shownPoints < allPoints ? `, ${shownPoints} drawn (min/max per pixel)` : "")
      : "no values in the runs shown";
    if (c.plot && sameShape(c, meta)) {
      c.meta = meta;
      c.settingData = true;
      c.plot.setData(data, !c.zoom);
      c.settingData = false;
      return;
    }
    if (c.plot) c.plot.destroy();
    c.meta = meta;
    c.plot = new uPlot(options(c, meta), data, c.el);
  }
  function sameShape(c, meta) {
    return c.meta.length === meta.length && meta.every((m, i) => !m || (c.meta[i].run === m.run && c.meta[i].role === m.role));
  }

  function options(c, meta) {
    const series = [{ label: state.x }];
    const bands = [];
    meta.forEach((m, i) => {
      if (!m) return;
      const col = color(m.run), show = state.group ? true : state.shown.has(m.run);
      if (m.role === "raw") series.push({ label: m.label, stroke: alpha(col, state.smoothing ? 0.25 : 1), width: 1, show, points: { show: false } });
      else if (m.role === "smooth") series.push({ label: m.label + " (smoothed)", stroke: state.smoothing ? col : "transparent", width: 1.5, show, points: { show: false } });
      else { series.push({ label: m.label + " " + m.role, stroke: "transparent", show, points: { show: false } });
             if (m.role === "hi") bands.push({ series: [i, i - 1], fill: alpha(col, 0.15) }); }
    });
    const xTime = state.x === "time";
    return {
      width: WIDTH, height: HEIGHT, series, bands,
      legend: { show: false },
      axes: [{}, { size: 56, values: (u, ticks) => ticks.map(tick) }],
      scales: { x: { time: xTime }, y: { distr: state.log ? 3 : 1 } },
      cursor: { drag: { x: true, y: false }, bind: { dblclick: () => null } },
      hooks: {
        setCursor: [(u) => hover(c, u)],
        setScale: [(u, key) => { if (key === "x") zoomed(c, u); }],
        draw: [(u) => drawMarks(c, u)],
        ready: [(u) => {
          u.over.addEventListener("dblclick", () => resetZoom(c));
          u.over.addEventListener("mousedown", () => { c.dragging = true; });
        }],
      },
    };
  }

  function fmt(v) {
    if (v === null || v === undefined) return "—";
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(4) : String(+v.toPrecision(6));
  }
  function tick(v) {
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(1) : String(+v.toPrecision(4));
  }
  function fmtX(x) {
    if (state.x === "time") return new Date(x * 1000).toISOString().replace("T", " ").slice(0, 19);
    if (state.x === "relative") return x.toFixed(1) + " s";
    return "step " + x;
  }

  function hover(c, u) {
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined || u.cursor.left < 0) { c.hover.hidden = true; return; }
    const x = u.data[0][idx];
    const lines = [fmtX(x)];
    c.meta.forEach((m, i) => {
      if (!m || m.role !== "raw" || !u.series[i].show) return;
      let raw = u.data[i][idx];
      let text = fmt(raw);
      const mark = m.curve.marks.find((k) => k[0] === x);
      if (mark) text = mark[1];
      else if (raw === undefined) return;  // this run has no value at this x
      if (state.smoothing && typeof raw === "number") text += ` (smoothed ${fmt(u.data[i + 1][idx])})`;
      if (m.role === "raw" && (state.ranks === "mean" || state.group)) {
        const lo = u.data[i + 2][idx], hi = u.data[i + 3][idx];
        if (lo !== null && lo !== undefined) text += ` [${fmt(lo)} … ${fmt(hi)}]`;
      }
      lines.push(`${m.label}: ${text}`);
    });
    c.hover.textContent = "";
    for (const l of lines) { const d = document.createElement("div"); d.textContent = l; c.hover.append(d); }
    c.hover.hidden = false;
    c.hover.style.left = Math.min(u.cursor.left + 60, WIDTH - 120) + "px";
    c.hover.style.top = (u.cursor.top + 30) + "px";
  }

  function drawMarks(c, u) {
    // NaN and +inf at the top edge, -inf at the bottom: never hidden by downsampling
    const ctx = u.ctx;
    ctx.save();
    // a dashed line where a resumed attempt took over a run (its steps replace the earlier's)
    ctx.setLineDash([4, 3]);
    ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "left";
    for (const a of c.attempts || []) {
      const id = a.project + "/" + a.run;
      if (!state.shown.has(id)) continue;
      const px = u.valToPos(a.x, "x", true);
      if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = ctx.fillStyle = color(id);
      ctx.beginPath(); ctx.moveTo(px, u.bbox.top); ctx.lineTo(px, u.bbox.top + u.bbox.height); ctx.stroke();
      ctx.fillText(`attempt ${a.attempt}`, px + 3, u.bbox.top + 20);
    }
    ctx.setLineDash([]);
    c.meta.forEach((m, i) => {
      if (!m || m.role !== "raw" || !u.series[i].show) return;
      ctx.fillStyle = color(m.run);
      for (const [x, kind] of m.curve.marks) {
        const px = u.valToPos(x, "x", true);
        if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
        const py = kind === "-inf" ? u.bbox.top + u.bbox.height - 6 : u.bbox.top + 6;
        ctx.fillRect(px - 3, py - 3, 6, 6);
      }
    });
    ctx.restore();
  }

  function zoomed(c, u) {
    if (c.settingData) return;
    const { min, max } = u.scales.x;
    const xs = u.data[0];
    if (!xs.length || (min <= xs[0] && max >= xs[xs.length - 1] && !c.zoom)) return;
    c.zoom = [min, max];
    clearTimeout(c.refine);
    c.refine = setTimeout(() => load(c), 150);  // finer points for the range zoomed into
  }
  function resetZoom(c) {
    c.zoom = null;
    load(c);  // the whole range again, and the scale reset to it
  }

  function redrawAll() {
    epoch += 1;
    for (const c of charts.values()) if (c.plot) { c.plot.destroy(); c.plot = null; c.loaded = false; if (c.visible) load(c); }
  }
  function restyle() {  // smoothing: new data, same plot
    for (const c of charts.values()) if (c.plot) draw(c);
  }

  // ---- runs table and config diff ----
  let summaries = new Map();  // run id -> {last, min, max} of the key chosen for the table
  async function loadSummary() {
    const key = $("run-key").value;
    summaries = new Map();
    if (key) {
      try {
        for (const s of await api("/api/summary?" + new URLSearchParams({ key })))
          summaries.set(s.project + "/" + s.run, s);
      } catch (e) { /* the table shows no values: the status line says why on the next poll */ }
    }
    renderTable();
  }
  function renderTable() {
    const key = $("run-key").value;
    const select = $("run-key");
    const names = state.keys.map((k) => k.key);
    if (JSON.stringify([...select.options].slice(1).map((o) => o.value)) !== JSON.stringify(names)) {
      select.length = 1;
      for (const k of names) select.add(new Option(k, k));
      select.value = names.includes(key) ? key : "";
    }
    const metricCols = key ? ["last", "min", "max"] : [];
    const cols = ["", "name", "project", "run", "status", "attempts", "ranks", "started", "tags", ...metricCols];
    const head = $("run-table").tHead; head.textContent = "";
    const hr = head.insertRow();
    for (const col of cols) {
      const th = document.createElement("th");
      th.textContent = metricCols.includes(col) ? `${key} ${col}` : col;
      if (col) th.addEventListener("click", () => {
        state.sort = [col, state.sort[0] === col ? -state.sort[1] : 1]; renderTable(); });
      hr.append(th);
    }
    const body = $("run-table").tBodies[0]; body.textContent = "";
    const text = $("run-filter").value.toLowerCase();
    const value = (r, col) => {
      if (metricCols.includes(col)) { const s = summaries.get(runId(r)); return s ? s[col] : null; }
      return col === "tags" ? (r.tags || []).join(" ") : r[col];
    };
    const rows = state.runs.filter((r) => !text || JSON.stringify(r).toLowerCase().includes(text));
    const [sc, dir] = state.sort;
    rows.sort((a, b) => {
      const x = value(a, sc), y = value(b, sc);
      if (x === null || x === undefined) return 1;  // runs without a value go last
      if (y === null || y === undefined) return -1;
      return (x > y ? 1 : x < y ? -1 : 0) * dir;
    });
    for (const r of rows) {
      const tr = body.insertRow();
      const box = document.createElement("input");
      box.type = "checkbox"; box.dataset.run = runId(r); box.checked = state.shown.has(runId(r));
      box.addEventListener("change", () => toggleRun(runId(r), box.checked));
      tr.insertCell().append(box);
      for (const col of cols.slice(1)) {
        let v = value(r, col);
        if (col === "started" && v) v = new Date(v * 1000).toISOString().replace("T", " ").slice(0, 19);
        tr.insertCell().textContent = v === null || v === undefined ? "" : String(v);
      }
    }
    renderConfigDiff();
  }
  function renderConfigDiff() {
    const picked = state.runs.filter((r) => state.shown.has(runId(r)));
    const head = $("config-diff").tHead, body = $("config-diff").tBodies[0];
    head.textContent = ""; body.textContent = "";
    const hr = head.insertRow();
    for (const t of ["key", ...picked.map((r) => r.name || r.run)]) { const th = document.createElement("th"); th.textContent = t; hr.append(th); }
    const keys = [...new Set(picked.flatMap((r) => Object.keys(r.config)))].sort();
    const differs = (k) => new Set(picked.map((r) => r.config[k])).size > 1;
    keys.sort((a, b) => differs(b) - differs(a));
    for (const k of keys) {
      const tr = body.insertRow();
      if (differs(k)) tr.className = "differs";
      tr.insertCell().textContent = k;
      for (const r of picked) tr.insertCell().textContent = r.config[k] ?? "";
    }
  }

  // ---- generations: one prompt's outputs side by side, runs across, steps down ----
  let genTimer = null;
  async function loadGenerations() {
    const p = new URLSearchParams({ q: $("gen-search").value });
    for (const r of state.runs) if (state.shown.has(runId(r))) p.append("run", runId(r));
    let rows;
    try { rows = await api("/api/generations?" + p.toString()); }
    catch (e) { $("gen-note").textContent = "error: " + e.message; return; }
    const list = $("gen-list"); list.textContent = "";
    const prompts = new Map();
    for (const g of rows) {
      if (!prompts.has(g.input)) prompts.set(g.input, []);
      prompts.get(g.input).push(g);
    }
    $("gen-note").textContent = rows.length ? `${prompts.size} prompts, ${rows.length} outputs` : "No generations in the runs ticked.";
    for (const [input, outs] of prompts) {
      const box = document.createElement("section"); box.className = "prompt";
      const h = document.createElement("h4"); h.textContent = input ?? "(no prompt)";
      const runs = [...new Set(outs.map((g) => g.project + "/" + g.run))];
      const table = document.createElement("table");
      const hr = table.createTHead().insertRow();
      for (const t of ["step", ...runs.map(runLabel)]) { const th = document.createElement("th"); th.textContent = t; hr.append(th); }
      const body = table.createTBody();
      for (const step of [...new Set(outs.map((g) => g.step))]) {
        const tr = body.insertRow();
        tr.insertCell().textContent = step === null ? "" : String(step);
        for (const id of runs) {
          const td = tr.insertCell();
          for (const g of outs.filter((o) => o.step === step && o.project + "/" + o.run === id)) {
            const div = document.createElement("div"); div.textContent = g.output ?? "";
            if (g.score !== null) { const sc = document.createElement("span"); sc.className = "score"; sc.textContent = ` score ${g.score}`; div.append(sc); }
            td.append(div);
          }
        }
      }
      box.append(h, table);
      list.append(box);
    }
  }

  // ---- SQL console ----
  async function runSql() {
    const err = $("sql-error"), note = $("sql-note");
    const head = $("sql-result").tHead, body = $("sql-result").tBodies[0];
    err.hidden = true; note.textContent = "running…";
    head.textContent = ""; body.textContent = "";
    try {
      const a = await api("/api/sql", { sql: $("sql-text").value });
      const hr = head.insertRow();
      for (const c of a.columns) { const th = document.createElement("th"); th.textContent = c; hr.append(th); }
      for (const row of a.rows) {
        const tr = body.insertRow();
        for (const v of row) tr.insertCell().textContent = v === null ? "NULL" : typeof v === "object" ? JSON.stringify(v) : String(v);
      }
      note.textContent = `${a.rows.length} rows` + (a.truncated ? " (the first ones only)" : "");
    } catch (e) {
      note.textContent = "";
      err.textContent = e.message; err.hidden = false;
    }
  }

  function renderGroupKeys() {
    const select = $("group");
    const keys = [...new Set(state.runs.flatMap((r) => Object.keys(r.config)))].sort();
    const have = [...select.options].map((o) => o.value).slice(1);
    if (JSON.stringify(have) === JSON.stringify(keys)) return;
    select.length = 1;
    for (const k of keys) select.add(new Option(k, k));
    select.value = keys.includes(state.group) ? state.group : "";
  }

  // ---- live refresh ----
  let polling = false;
  async function poll() {
    if (polling) return;
    polling = true;
    try {
      const runs = await api("/api/runs");
      const before = JSON.stringify(state.runs);
      const fresh = JSON.stringify(runs) !== before;
      const known = new Set(state.runs.map(runId));
      state.runs = runs;
      for (const r of runs) if (!known.has(runId(r))) state.shown.add(runId(r));
      if (fresh) { renderRuns(); renderTable(); renderGroupKeys(); }
      const live = runs.some((r) => r.status === "running" && state.shown.has(runId(r)));
      if (fresh || live) {
        const keys = await api("/api/keys");
        const keysChanged = JSON.stringify(keys.map((k) => k.key)) !== JSON.stringify(state.keys.map((k) => k.key));
        state.keys = keys;
        if (keysChanged) { renderCharts(); renderTable(); }
        else for (const c of charts.values()) if (c.visible) load(c);
      }
      if (live && $("run-key").value && !$("table").hidden) loadSummary();
      $("status").textContent = `${runs.length} run${runs.length === 1 ? "" : "s"} · ${live ? "live" : "up to date"}`;
    } catch (e) {
      $("status").textContent = "cannot reach the dashboard: " + e.message;
    } finally {
      polling = false;
    }
  }

  // ---- controls ----
  for (const b of document.querySelectorAll("nav button")) {
    b.addEventListener("click", () => {
      for (const o of document.querySelectorAll("nav button")) o.classList.toggle("on", o === b);
      for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== b.dataset.view;
      if (b.dataset.view === "generations") loadGenerations();
    });
  }
  $("filter").addEventListener("input", (e) => { state.filter = e.target.value; renderCharts(); });
  $("smoothing").addEventListener("input", (e) => {
    state.smoothing = Number(e.target.value); $("smoothing-value").textContent = e.target.value;
    for (const c of charts.values()) if (c.plot) { c.plot.destroy(); c.plot = null; draw(c); }
  });
  $("xaxis").addEventListener("change", (e) => { state.x = e.target.value; for (const c of charts.values()) c.zoom = null; redrawAll(); });
  $("ranks").addEventListener("change", (e) => { state.ranks = e.target.value; redrawAll(); });
  $("group").addEventListener("change", (e) => { state.group = e.target.value; redrawAll(); });
  $("logscale").addEventListener("change", (e) => { state.log = e.target.checked; for (const c of charts.values()) if (c.plot) { c.plot.destroy(); c.plot = null; draw(c); } });
  $("run-filter").addEventListener("input", renderTable);
  $("run-key").addEventListener("change", loadSummary);
  $("gen-search").addEventListener("input", () => { clearTimeout(genTimer); genTimer = setTimeout(loadGenerations, 200); });
  $("sql-run").addEventListener("click", runSql);
  $("sql-text").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) runSql(); });

  document.addEventListener("mouseup", () => {
    for (const c of charts.values()) {
      if (!c.dragging) continue;
      c.dragging = false;
      // after uPlot has taken the selection (its own mouseup handler runs first or next)
      if (c.drawLater) { c.drawLater = false; setTimeout(() => draw(c), 0); }
    }
  });

  window.tracklake = { state, charts, poll, toggleRun };
  poll();
  setInterval(poll, POLL_MS);
})();
