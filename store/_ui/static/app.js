// tracklake ui: the page. Everything it shows comes from the dashboard's own /api/*, or,
// in a report file (`tracklake report`), from the answers embedded in it.
"use strict";
(function () {
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                   "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  const WIDTH = 480, HEIGHT = 220, POLL_MS = 1000;
  const state = { runs: [], shown: new Set(), keys: [], smoothing: 0, x: "step",
                  ranks: "first", group: "", log: false, filter: "", sort: ["started", -1],
                  queries: [] };
  const charts = new Map();  // key -> {el, plot, meta, curves, zoom, visible}
  const $ = (id) => document.getElementById(id);
  const runId = (r) => r.project + "/" + r.run;

  // a report file holds the server's answers for its runs: api() reads them, asks nothing
  const EMBEDDED = document.getElementById("tracklake-data");
  const REPORT = EMBEDDED ? JSON.parse(EMBEDDED.textContent) : null;

  // a read whose URL would pass the server's 8 KiB (it names many runs) is posted instead,
  // its parameters as JSON
  const MAX_URL = 8000;
  async function api(path, body) {
    if (REPORT) return offline(path, body);
    if (body === undefined && path.length > MAX_URL) {
      const [pathname, search] = path.split("?"), query = {};
      for (const [name, value] of new URLSearchParams(search)) (query[name] ||= []).push(value);
      path = pathname; body = { query };
    }
    const init = body === undefined ? {} : {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body) };
    const res = await fetch(path, init);
    const answer = await res.json();
    if (!res.ok) throw new Error(answer.error || res.statusText);
    return answer;
  }

  // ---- a report file: the embedded answers, filtered as the server would filter them ----
  const NO_SQL = "This page is a report file: it holds the answers it was written with " +
    "and cannot run new SQL. Each panel's SQL fold shows the `tracklake sql` command that " +
    "runs its query on the store; `tracklake ui` serves this page live.";
  function offline(path, body) {
    if (body !== undefined) throw new Error(NO_SQL);
    const [pathname, search] = path.split("?");
    const q = new URLSearchParams(search || ""), runs = new Set(q.getAll("run"));
    const mine = (row) => runs.has(row.project + "/" + row.run);
    switch (pathname) {
      case "/api/runs": return REPORT.runs;
      case "/api/keys": return REPORT.keys;
      case "/api/summary": return REPORT.summaries[q.get("key")] || { rows: [], queries: [] };
      case "/api/series": return offlineSeries(q, runs, q.get("key"));
      case "/api/series_batch":
        return { series: Object.fromEntries(q.getAll("key").map((k) => [k, offlineSeries(q, runs, k)])) };
      case "/api/generations": return offlineGenerations(q, mine);
      case "/api/histograms": return REPORT.histograms.filter(mine);
      case "/api/media": return REPORT.media.filter(mine);
      case "/api/traces": return offlineTraces(q, runs);
      case "/api/events": return offlineEvents(q, mine);
    }
    throw new Error("this report holds no answer to " + pathname);
  }
  function offlineSeries(q, runs, key) {
    const x = q.get("x"), byKey = REPORT.series[x === "step" ? "step" : "time"];
    const held = Object.hasOwn(byKey, key) ? byKey[key] : null;
    if (q.get("group") || q.get("ranks") !== REPORT.report.ranks || !held)
      throw new Error("this report holds other curves; `tracklake ui` draws these");
    const lo = q.has("lo") ? Number(q.get("lo")) : -Infinity;
    const hi = q.has("hi") ? Number(q.get("hi")) : Infinity;
    const start = (row) => {  // relative time: the wall time less the run's start
      if (x !== "relative") return 0;
      const r = REPORT.runs.runs.find((r) => r.project === row.project && r.run === row.run);
      return r ? r.started : 0;
    };
    const curves = held.curves.filter((c) => runs.has(c.project + "/" + c.run)).map((c) => {
      const s = start(c), kept = [];
      c.x.forEach((v, i) => { if (v - s >= lo && v - s <= hi) kept.push(i); });
      const pick = (a) => a && kept.map((i) => a[i]);
      return { ...c, x: kept.map((i) => c.x[i] - s), y: pick(c.y), lo: pick(c.lo), hi: pick(c.hi),
               marks: c.marks.map(([v, k]) => [v - s, k]).filter(([v]) => v >= lo && v <= hi) };
    });
    const attempts = held.attempts.filter((a) => runs.has(a.project + "/" + a.run))
      .map((a) => ({ ...a, x: a.x - start(a) }));
    return { ...held, x, curves, attempts };
  }
  function offlineGenerations(q, mine) {
    const text = (q.get("q") || "").toLowerCase();
    const has = (v) => (v || "").toLowerCase().includes(text);
    return { ...REPORT.generations,
             rows: REPORT.generations.rows.filter((g) => mine(g) && (!text || has(g.input) || has(g.output))) };
  }
  function offlineTraces(q, runs) {
    const text = (q.get("q") || "").toLowerCase();
    const fields = ["name", "status", "error", "attributes", "inputs", "outputs"];
    const out = [], queries = [];
    REPORT.traces.runs.forEach((r, i) => {
      if (!runs.has(r.project + "/" + r.run)) return;
      queries.push(REPORT.traces.queries[i]);
      if (!text) { out.push(r); return; }
      // the traces one of whose spans holds the text, their spans' parents found again
      const hit = new Set(r.spans.filter((sp) => fields.some((f) => String(sp[f] ?? "").toLowerCase()
        .includes(text))).map((sp) => sp.trace_id));
      const place = new Map(), spans = [];
      r.spans.forEach((sp, k) => {
        if (!hit.has(sp.trace_id)) return;
        place.set(k, spans.length);
        spans.push({ ...sp, parent: sp.parent === null ? null : place.get(sp.parent) ?? null });
      });
      out.push({ ...r, spans });
    });
    return { runs: out, queries };
  }
  function offlineEvents(q, mine) {
    const level = q.get("level") || "", kind = q.get("kind") || "";
    return { ...REPORT.events, events: REPORT.events.events.filter((e) => mine(e) &&
      (!level || e.level === level) && (!kind || e.kind === kind)) };
  }
  function sqlText(q) { return typeof q.sql === "number" ? REPORT.sql[q.sql] : q.sql; }
  // a word as a POSIX shell reads it back: bare, '…', or $'…' for control bytes (0x1F)
  function shellWord(w) {
    if (/^[A-Za-z0-9_@%+=:,.\/-]+$/.test(w)) return w;
    if (/[\x00-\x08\x0b-\x1f\x7f]/.test(w))
      return "$'" + w.replace(/[\\']/g, "\\$&").replace(/[\x00-\x1f\x7f]/g,
        (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0")) + "'";
    return "'" + w.replace(/'/g, "'\\''") + "'";
  }
  function sqlCommand(q) {
    const words = ["tracklake", "sql", "--root", REPORT.report.root];
    for (const [n, v] of Object.entries(q.params)) words.push("--param", `${n}=${v}`);
    return [...words, sqlText(q)].map(shellWord).join(" ");
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
    loadMedia();
    if (!$("traces").hidden) loadTraces();
    if (!$("events").hidden) loadEvents();
  }

  // ---- charts ----
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const c = charts.get(e.target.dataset.key);
      if (!c) continue;
      c.visible = e.isIntersecting;
      if (c.visible && !c.loaded) load(c);
    }
  }, { rootMargin: "100% 0px" });  // in view or within a screen of it: ready when scrolled to

  function renderCharts() {
    for (const c of charts.values()) if (c.plot) c.plot.destroy();
    charts.clear();
    observer.disconnect();
    const view = $("metric-charts");
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
        const sql = document.createElement("details");
        el.append(h, note, sql, hover);
        grid.append(el);
        charts.set(k.key, { key: k.key, el, note, sql, hover, plot: null, meta: [], curves: [],
                            zoom: null, visible: false, loaded: false });
        observer.observe(el);
      }
    }
    if (!charts.size) view.textContent = state.keys.length ? "No key matches the filter." : "No metrics yet.";
  }

  // the charts to ask for: whole ranges in one request per batch (the server's bound: 16
  // keys), a zoomed chart alone (its range is its own). A batch also
  // stops at about a million points to read: keys of many points are asked for in
  // several requests, answered side by side, and the first charts are drawn sooner.
  const BATCH_KEYS = 16, BATCH_POINTS = 1e6;
  function seriesUrl(keys, zoom) {
    const p = new URLSearchParams({ x: state.x, ranks: state.ranks, buckets: String(WIDTH) });
    for (const k of keys) p.append("key", k);
    for (const r of state.runs) if (!state.group || state.shown.has(runId(r))) p.append("run", runId(r));
    if (state.group) p.set("group", state.group);
    if (zoom) { p.set("lo", String(zoom[0])); p.set("hi", String(zoom[1])); }
    return (keys.length > 1 ? "/api/series_batch?" : "/api/series?") + p.toString();
  }

  let epoch = 0;  // counts changes of what a series request asks (axis, ranks, group)
  const pending = new Set();
  function load(c) {
    if (c.loading) { c.again = true; return; }
    if (!pending.size) setTimeout(askPending, 0);  // the charts asked for meanwhile join
    pending.add(c);
  }
  // A live run's poll asks a chart again only once it has waited PACE times as
  // long as its last answer took, and never while one is on its way: a chart of
  // millions of points (seconds to answer) then keeps the server busy a third of the
  // time at most, not all of it, and a chart answered in milliseconds still follows
  // every poll.
  const PACE = 2;
  function refresh(c) {
    if (c.loading || pending.has(c)) return;  // what comes back is asked again next poll
    if (c.answered !== undefined && performance.now() - c.answered < PACE * c.took) return;
    load(c);
  }
  function askPending() {
    const asked = [...pending].filter((c) => charts.get(c.key) === c);  // not redrawn since
    pending.clear();
    const points = new Map(state.keys.map((k) => [k.key, k.points * k.runs]));
    let batch = [], held = 0;
    for (const c of asked) {
      if (c.zoom) { ask([c]); continue; }
      const more = points.get(c.key) || 0;
      if (batch.length && (batch.length === BATCH_KEYS || held + more > BATCH_POINTS)) {
        ask(batch); batch = []; held = 0;
      }
      batch.push(c); held += more;
    }
    if (batch.length) ask(batch);
  }
  async function ask(batch) {
    const asked = epoch, started = performance.now();
    for (const c of batch) c.loading = true;
    let got = null, error = null;
    try {
      const url = seriesUrl(batch.map((c) => c.key), batch.length === 1 ? batch[0].zoom : null);
      got = batch.length === 1 ? new Map([[batch[0].key, await api(url)]])
        : new Map(Object.entries((await api(url)).series));
    } catch (e) {
      error = e;
    }
    const answered = performance.now();
    for (const c of batch) {
      c.loading = false;
      c.answered = answered; c.took = answered - started;
      if (charts.get(c.key) !== c) continue;  // redrawn meanwhile
      const answer = got && got.get(c.key);
      if (error || !answer) c.note.textContent = "error: " + (error ? error.message : "no answer");
      else if (asked !== epoch) c.again = true;  // an answer to an older question
      else {
        c.curves = answer.curves;
        c.attempts = answer.attempts;
        sqlPanel(answer.queries, c.sql);
        c.loaded = true;
        try { draw(c); } catch (e) { c.note.textContent = "error: " + e.message; }
      }
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
    const r = u.over.getBoundingClientRect();
    placeHover(c.hover, c.el, r.left + u.cursor.left, r.top + u.cursor.top);
  }

  // a hover box beside the cursor (x, y: the page's client coordinates) and inside its
  // chart `el`, never over the next one: right of and below the cursor, flipped to its
  // left or above it near an edge; no wider than the chart, and lines that do not fit
  // its height are counted on the last one
  function placeHover(box, el, x, y) {
    const GAP = 12, width = el.clientWidth, height = el.clientHeight;
    box.hidden = false;
    Object.assign(box.style, { left: "0px", top: "0px", width: "", maxWidth: width + "px" });
    if (box.offsetHeight > height && box.children.length > 2) {
      const rest = document.createElement("div");
      box.append(rest);
      let cut = 0;
      do { box.children[box.children.length - 2].remove(); rest.textContent = `… and ${++cut} more`; }
      while (box.offsetHeight > height && box.children.length > 2);
    }
    const w = Math.min(Math.ceil(box.getBoundingClientRect().width), width);
    const h = Math.min(box.offsetHeight, height);
    box.style.width = w + "px";  // as measured: moved right, it would wrap again
    const at = el.getBoundingClientRect();
    const px = x - at.left - el.clientLeft, py = y - at.top - el.clientTop;
    const left = px + GAP + w <= width ? px + GAP : px - GAP - w;
    const top = py + GAP + h <= height ? py + GAP : py - GAP - h;
    box.style.left = Math.max(0, Math.min(left, width - w)) + "px";
    box.style.top = Math.max(0, Math.min(top, height - h)) + "px";
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
        const a = await api("/api/summary?" + new URLSearchParams({ key }));
        for (const s of a.rows) summaries.set(s.project + "/" + s.run, s);
        summaries.queries = a.queries;
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
    sqlPanel([...state.queries, ...(key && summaries.queries ? summaries.queries : [])], $("table-sql"));
    renderConfigDiff();
  }
  function renderConfigDiff() {
    const picked = state.runs.filter((r) => state.shown.has(runId(r)));
    const head = $("config-diff").tHead, body = $("config-diff").tBodies[0];
    head.textContent = ""; body.textContent = "";
    const hr = head.insertRow();
    for (const t of ["key", ...picked.map((r) => r.name || r.run)]) { const th = document.createElement("th"); th.textContent = t; hr.append(th); }
    sqlPanel(state.queries, $("config-sql"));
    const keys = [...new Set(picked.flatMap((r) => Object.keys(r.config)))].sort();
    const differs = (k) => new Set(picked.map((r) => r.config[k])).size > 1;
    keys.sort((a, b) => differs(b) - differs(a));
    const only = $("only-diff").checked;
    for (const k of keys) {
      const tr = body.insertRow();
      tr.className = differs(k) ? "differs" : "same";
      tr.hidden = only && !differs(k);
      tr.insertCell().textContent = k;
      for (const r of picked) tr.insertCell().textContent = r.config[k] ?? "";
    }
    $("config-count").textContent = `${keys.filter(differs).length} of ${keys.length} keys differ`;
    renderIdentity(picked);
  }
  // the ticked runs side by side: where and how each ran (the lowest rank's latest attempt)
  function renderIdentity(picked) {
    const head = $("identity").tHead, body = $("identity").tBodies[0];
    head.textContent = ""; body.textContent = "";
    const hr = head.insertRow();
    for (const t of ["", ...picked.map((r) => r.name || r.run)]) { const th = document.createElement("th"); th.textContent = t; hr.append(th); }
    const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "");
    const fields = [["run", (r) => runId(r)], ["status", (r) => r.status], ["attempts", (r) => r.attempts],
                    ["ranks", (r) => r.ranks], ["started", (r) => when(r.started)], ["ended", (r) => when(r.ended)],
                    ["host", (r) => r.host], ["git commit", (r) => r.git_commit], ["git dirty", (r) => r.git_dirty],
                    ["command", (r) => r.command], ["python", (r) => r.python], ["tags", (r) => (r.tags || []).join(", ")]];
    for (const [name, pick] of fields) {
      const tr = body.insertRow();
      tr.insertCell().textContent = name;
      for (const r of picked) { const v = pick(r); tr.insertCell().textContent = v === null || v === undefined ? "" : String(v); }
    }
  }

  // ---- generations: one prompt's outputs side by side, runs across, steps down ----
  let genTimer = null;
  async function loadGenerations() {
    const p = new URLSearchParams({ q: $("gen-search").value });
    for (const r of state.runs) if (state.shown.has(runId(r))) p.append("run", runId(r));
    let rows;
    try {
      const a = await api("/api/generations?" + p.toString());
      rows = a.rows;
      sqlPanel(a.queries, $("gen-sql"));
    } catch (e) { $("gen-note").textContent = "error: " + e.message; return; }
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

  // ---- traces: each run's span trees, a span folded open on a click ----
  const MAX_RUNS = 20;  // the server's bound on runs per traces or events request
  const traces = { text: "", open: new Set(), asked: 0 };
  let traceTimer = null;
  function tickedRuns(p) {
    const ticked = state.runs.filter((r) => state.shown.has(runId(r)));
    for (const r of ticked.slice(0, MAX_RUNS)) p.append("run", runId(r));
    return ticked.length > MAX_RUNS ? ` (the first ${MAX_RUNS} of ${ticked.length} ticked runs)` : "";
  }
  async function loadTraces() {
    const p = new URLSearchParams({ q: $("trace-search").value });
    const cut = tickedRuns(p);
    const asked = ++traces.asked;
    let a;
    try { a = await api("/api/traces?" + p.toString()); }
    catch (e) { $("trace-note").textContent = "error: " + e.message; return; }
    if (asked !== traces.asked) return;  // a newer question is on its way
    const text = JSON.stringify(a);
    const count = a.runs.reduce((n, r) => n + r.spans.length, 0);
    $("trace-note").textContent = (count ? `${count} spans` : "No spans in the runs ticked" +
      ($("trace-search").value ? " that match." : ".")) + cut;
    if (text === traces.text) return;
    traces.text = text;
    const list = $("trace-list"); list.textContent = "";
    for (const [i, r] of a.runs.entries()) {
      if (!r.spans.length) continue;
      const box = document.createElement("section"); box.className = "trace-run";
      box.dataset.run = r.project + "/" + r.run;
      const h = document.createElement("h3");
      h.textContent = runLabel(r.project + "/" + r.run) + (r.more ? " (the first spans only)" : "");
      box.append(h, sqlPanel([a.queries[i]]));
      const made = [];
      for (const span of r.spans) {
        const el = spanElement(span);
        made.push(el);
        (span.parent === null ? box : made[span.parent]).append(el);
      }
      list.append(box);
    }
  }
  function spanElement(span) {
    const det = document.createElement("details");
    det.className = "span status-" + (span.status || "ok");
    const id = span.trace_id + "/" + span.span_id;
    det.dataset.span = id;
    det.open = traces.open.has(id);
    det.addEventListener("toggle", () => { if (det.open) traces.open.add(id); else traces.open.delete(id); });
    const sum = document.createElement("summary");
    const name = document.createElement("span"); name.className = "name"; name.textContent = span.name ?? "(no name)";
    const ms = document.createElement("span"); ms.className = "ms";
    ms.textContent = span.ms === null ? "" : `${span.ms} ms`;
    const where = document.createElement("span"); where.className = "where";
    where.textContent = [span.status, span.step === null ? "" : `step ${span.step}`, `rank ${span.rank}`,
                         span.children ? `${span.children} child${span.children === 1 ? "" : "ren"}` : ""]
      .filter(Boolean).join(" · ");
    sum.append(name, ms, where);
    det.append(sum);
    for (const field of ["error", "attributes", "inputs", "outputs"]) {
      const v = span[field];
      if (v === null || v === undefined || v === "" || v === "{}") continue;
      const div = document.createElement("div"); div.className = "span-field";
      const pre = document.createElement("pre"); pre.textContent = v;
      if (field === "error") pre.className = "error";
      div.append(document.createTextNode(field + (span.clipped.includes(field) ? " (clipped)" : "")), pre);
      det.append(div);
    }
    return det;
  }

  // ---- events: the runs' alerts and other events, the latest first ----
  const events = { asked: 0 };
  async function loadEvents() {
    const p = new URLSearchParams({ level: $("event-level").value, kind: $("event-kind").value });
    const cut = tickedRuns(p);
    const asked = ++events.asked;
    let a;
    try { a = await api("/api/events?" + p.toString()); }
    catch (e) { $("event-note").textContent = "error: " + e.message; return; }
    if (asked !== events.asked) return;
    for (const [id, names] of [["event-level", a.levels], ["event-kind", a.kinds]]) {
      const select = $(id), keep = select.value;
      const have = [...select.options].slice(1).map((o) => o.value);
      const want = [...new Set([...names, ...(keep ? [keep] : [])])].sort();
      if (JSON.stringify(have) === JSON.stringify(want)) continue;
      select.length = 1;
      for (const n of want) select.add(new Option(n, n));
      select.value = keep;
    }
    const alerts = a.events.filter((e) => e.level === "warning" || e.level === "error").length;
    $("event-note").textContent = (a.events.length ? `${a.events.length} events` +
      (alerts ? `, ${alerts} warnings or errors` : "") + (a.more ? " (the latest only)" : "")
      : "No events in the runs ticked.") + cut;
    sqlPanel(a.queries, $("event-sql"));
    const table = $("event-table");
    const head = table.tHead, body = table.tBodies[0];
    head.textContent = ""; body.textContent = "";
    const cols = ["time", "run", "step", "rank", "level", "kind", "title", "text"];
    const hr = head.insertRow();
    for (const c of cols) { const th = document.createElement("th"); th.textContent = c; hr.append(th); }
    for (const e of a.events) {
      const tr = body.insertRow();
      tr.className = "level-" + e.level;
      for (const c of cols) {
        const td = tr.insertCell();
        td.className = c;
        const v = c === "run" ? runLabel(e.project + "/" + e.run)
          : c === "time" && e.time ? e.time.replace("T", " ").slice(0, 19) : e[c];
        td.textContent = v === null || v === undefined ? "" : String(v);
      }
    }
  }

  // ---- what a panel ran: its SQL and parameters, and a button that opens it in the console ----
  function sqlPanel(queries, box) {
    box = box || document.createElement("details");
    box.classList.add("sql");
    const text = JSON.stringify(queries);
    if (box.shownText === text) return box;  // as it is: left open or folded
    box.shownText = text;
    const wasOpen = box.open;
    box.textContent = "";
    const sum = document.createElement("summary"); sum.textContent = "SQL";
    box.append(sum);
    queries.forEach((q, i) => {
      const pre = document.createElement("pre"); pre.className = "sql-text"; pre.textContent = sqlText(q);
      box.append(pre);
      const names = Object.keys(q.params);
      if (names.length) {
        const ps = document.createElement("pre"); ps.className = "sql-params";
        ps.textContent = names.map((n) => `$${n} = ${JSON.stringify(q.params[n])}`).join("\n");
        box.append(ps);
      }
      if (REPORT) {  // no console here: the command that runs the query on the store
        const cmd = document.createElement("pre"); cmd.className = "sql-command";
        cmd.textContent = sqlCommand(q);
        box.append(cmd);
        return;
      }
      const open = document.createElement("button");
      open.type = "button"; open.className = "sql-open";
      open.textContent = queries.length > 1 ? `Open query ${i + 1} in the SQL console` : "Open in the SQL console";
      open.addEventListener("click", () => openInConsole(q));
      box.append(open);
    });
    box.open = wasOpen;
    return box;
  }
  function openInConsole(q) {
    $("sql-text").value = sqlText(q);
    $("sql-params").value = Object.entries(q.params).map(([n, v]) => `${n}=${v}`).join("\n");
    document.querySelector('nav button[data-view="sql"]').click();
    runSql();
  }

  // ---- SQL console ----
  async function runSql() {
    const err = $("sql-error"), note = $("sql-note");
    const head = $("sql-result").tHead, body = $("sql-result").tBodies[0];
    err.hidden = true; note.textContent = "running…";
    head.textContent = ""; body.textContent = "";
    sqlChart.answer = null; chartAnswer();
    try {
      const params = $("sql-params").value.split("\n").filter((line) => line !== "");
      const a = await api("/api/sql", { sql: $("sql-text").value, params });
      const hr = head.insertRow();
      for (const c of a.columns) { const th = document.createElement("th"); th.textContent = c; hr.append(th); }
      for (const row of a.rows) {
        const tr = body.insertRow();
        for (const v of row) tr.insertCell().textContent = v === null ? "NULL" : typeof v === "object" ? JSON.stringify(v) : String(v);
      }
      note.textContent = `${a.rows.length} rows` + (a.truncated ? " (the first ones only)" : "");
      sqlChart.answer = a; chartAnswer();
    } catch (e) {
      note.textContent = "";
      err.textContent = e.message; err.hidden = false;
    }
  }

  // the console's answer as a chart: x and y columns picked among the numeric ones
  const sqlChart = { answer: null, plot: null, x: null, ys: null };
  // a cell as a number: numbers; decimals, NaN and ±inf (sent as text: NaN and inf as
  // gaps); timestamps (ISO text) as seconds since the epoch. undefined: not a number.
  const ISO = /^\d{4}-\d\d-\d\d[T ]\d\d:\d\d/;
  function cellNumber(v) {
    if (v === null || typeof v === "number") return v;
    if (typeof v !== "string") return undefined;
    if (["nan", "inf", "-inf"].includes(v.toLowerCase())) return null;
    if (/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(v)) return Number(v);
    if (ISO.test(v)) { const t = Date.parse(v); return isNaN(t) ? undefined : t / 1000; }
    return undefined;
  }
  function numericColumns(a) {
    return a.columns.map((name, i) => ({ name, i, time: a.rows.some((r) => typeof r[i] === "string" && ISO.test(r[i])) }))
      .filter(({ i }) => a.rows.some((r) => r[i] !== null) && a.rows.every((r) => cellNumber(r[i]) !== undefined));
  }
  function chartAnswer() {
    const a = sqlChart.answer, controls = $("sql-chart-controls"), box = $("sql-chart");
    if (sqlChart.plot) { sqlChart.plot.destroy(); sqlChart.plot = null; }
    box.textContent = "";
    const numeric = a ? numericColumns(a) : [];
    controls.hidden = !numeric.length;
    if (!numeric.length) { $("sql-chart-note").textContent = a && a.rows.length ? "No numeric column to draw." : ""; return; }
    const xSelect = $("sql-x"), ys = $("sql-y");
    const key = JSON.stringify(a.columns);
    if (sqlChart.columns !== key) {  // a new shape of answer: the default picks again
      sqlChart.columns = key;
      const named = numeric.find((c) => ["step", "x", "time"].includes(c.name.toLowerCase()));
      xSelect.length = 0;
      xSelect.add(new Option("(row number)", "-1"));
      for (const c of numeric) xSelect.add(new Option(c.name, String(c.i)));
      xSelect.value = named ? String(named.i) : "-1";
      ys.textContent = "";
      for (const c of numeric) {
        const label = document.createElement("label");
        const box = document.createElement("input");
        box.type = "checkbox"; box.value = String(c.i); box.checked = !named || c.i !== named.i;
        box.addEventListener("change", chartAnswer);
        label.append(box, document.createTextNode(" " + c.name));
        ys.append(label);
      }
    }
    const xi = Number(xSelect.value);
    const picked = [...ys.querySelectorAll("input")].filter((b) => b.checked && Number(b.value) !== xi).map((b) => Number(b.value));
    for (const label of ys.querySelectorAll("label")) label.style.color = "";
    if (!picked.length) { $("sql-chart-note").textContent = "Tick a column to draw."; return; }
    // uPlot draws lines along x: rows in x order, those without an x left out
    const rows = a.rows.map((r, n) => [xi < 0 ? n : cellNumber(r[xi]), r]).filter(([x]) => x !== null).sort((p, q) => p[0] - q[0]);
    const data = [rows.map(([x]) => x), ...picked.map((i) => rows.map(([, r]) => cellNumber(r[i])))];
    const series = [{ label: xi < 0 ? "row" : a.columns[xi] }];
    picked.forEach((i, k) => {
      const col = PALETTE[k % PALETTE.length];
      series.push({ label: a.columns[i], stroke: col, width: 1.5, points: { show: rows.length < 60 } });
      for (const b of ys.querySelectorAll("input")) if (Number(b.value) === i) b.parentElement.style.color = col;
    });
    $("sql-chart-note").textContent = `${rows.length} points` + (rows.length < a.rows.length ? ` (${a.rows.length - rows.length} rows without an x left out)` : "");
    sqlChart.plot = new uPlot({ width: 720, height: 300, series, legend: { show: false },
                                scales: { x: { time: xi >= 0 && numeric.find((c) => c.i === xi).time } },
                                axes: [{}, { size: 56, values: (u, ticks) => ticks.map(tick) }] }, data, box);
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


  // ---- histograms and media: one card per key, redrawn only when its data changed ----
  const HIST = { left: 56, right: 8, top: 8, bottom: 30 };
  const media = { text: "", hists: [], items: [], cards: new Map(), sections: new Map(),
                  pick: new Map(), at: new Map(), asked: 0 };

  async function loadMedia() {
    const p = new URLSearchParams();
    for (const r of state.runs) if (state.shown.has(runId(r))) p.append("run", runId(r));
    let hists, items;
    const asked = ++media.asked;
    try {
      [hists, items] = await Promise.all([api("/api/histograms?" + p), api("/api/media?" + p)]);
    } catch (e) { $("media-note").textContent = "error: " + e.message; return; }
    if (asked !== media.asked) return;  // a newer question (runs ticked meanwhile) is on its way
    $("media-note").textContent = "";
    const text = JSON.stringify([hists, items]);
    if (text === media.text) return;
    media.text = text; media.hists = hists; media.items = items;
    renderMedia();
  }

  function byKey(rows) {
    const out = new Map();
    for (const row of rows) {
      if (!out.has(row.key)) out.set(row.key, []);
      out.get(row.key).push(row);
    }
    return out;
  }

  function mediaSection(name, title, count) {
    let s = media.sections.get(name);
    if (!s) {
      const det = document.createElement("details");
      det.className = "section"; det.open = true; det.dataset.media = name;
      const sum = document.createElement("summary");
      const grid = document.createElement("div"); grid.className = "grid";
      det.append(sum, grid);
      s = { det, sum, grid };
      media.sections.set(name, s);
    }
    s.sum.textContent = `${title} (${count})`;
    return s;
  }

  function renderMedia() {
    const view = $("media-charts");
    const match = keyMatcher(state.filter);
    const hists = [...byKey(media.hists)].filter(([k]) => match(k));
    const items = [...byKey(media.items)].filter(([k]) => match(k));
    const wanted = new Set();
    const parts = [["histograms", "Histograms", hists, histCard], ["media", "Media", items, mediaCard]];
    for (const [name, title, keys, make] of parts) {
      const s = mediaSection(name, title, keys.length);
      for (const [key, rows] of keys) {
        const id = name + ":" + key, text = JSON.stringify(rows);
        wanted.add(id);
        let card = media.cards.get(id);
        if (!card) {
          const el = document.createElement("div");
          el.className = "chart " + name; el.dataset.key = key;
          card = { id, key, el, text: "" };
          media.cards.set(id, card);
        }
        if (card.text !== text) { card.text = text; card.rows = rows; make(card); }
        s.grid.append(card.el);  // in key order
      }
      if (keys.length) view.append(s.det); else s.det.remove();
    }
    for (const [id, card] of media.cards) if (!wanted.has(id)) { card.el.remove(); media.cards.delete(id); }
  }

  // a histogram key: each column a step, each bin as dark as its count within the step
  function histCard(card) {
    const el = card.el;
    el.textContent = "";
    const h = document.createElement("h4"); h.textContent = card.key;
    const runs = card.rows.map((r) => r.project + "/" + r.run);
    let run = media.pick.get(card.key);
    if (!runs.includes(run)) run = runs[0];
    el.append(h);
    if (runs.length > 1) {
      const select = document.createElement("select");
      select.className = "run-pick";
      for (const id of runs) select.add(new Option(runLabel(id), id));
      select.value = run;
      select.addEventListener("change", () => { media.pick.set(card.key, select.value); histCard(card); });
      el.append(select);
    }
    el.append(sqlPanel([card.rows[runs.indexOf(run)].query]));
    const steps = card.rows[runs.indexOf(run)].steps;
    const note = document.createElement("div"); note.className = "note";
    note.textContent = steps.length ? `${runLabel(run)}: ${steps.length} steps, ${steps[0].step} … ${steps[steps.length - 1].step}` : `${runLabel(run)}: no histogram to draw`;
    const canvas = document.createElement("canvas");
    const ratio = window.devicePixelRatio || 1;
    canvas.width = WIDTH * ratio; canvas.height = HEIGHT * ratio;
    canvas.style.width = WIDTH + "px"; canvas.style.height = HEIGHT + "px";
    const hover = document.createElement("div"); hover.className = "hover"; hover.hidden = true;
    el.append(note, canvas, hover);
    Object.assign(card, { run, steps, canvas, hover });
    if (!steps.length) return;
    const lo = Math.min(...steps.map((s) => s.edges[0]));
    const hi = Math.max(...steps.map((s) => s.edges[s.edges.length - 1]));
    const plotW = WIDTH - HIST.left - HIST.right, plotH = HEIGHT - HIST.top - HIST.bottom;
    const column = plotW / steps.length;
    // halved first: ranges near ±1.8e308 stay finite (edges are finite and increasing)
    const y = (v) => HIST.top + plotH - (v / 2 - lo / 2) / (hi / 2 - lo / 2) * plotH;
    card.pos = (i, v) => [HIST.left + (i + 0.5) * column, y(v)];  // canvas point of step i, value v
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    const col = color(run);
    steps.forEach((s, i) => {
      const top = Math.max(...s.counts) || 1;
      s.counts.forEach((n, j) => {
        if (!n) return;
        const y0 = y(s.edges[j]), y1 = y(s.edges[j + 1]);
        ctx.fillStyle = alpha(col, n / top);
        ctx.fillRect(HIST.left + i * column, y1, Math.max(column, 1), Math.max(y0 - y1, 0.5));
      });
    });
    ctx.fillStyle = "#555"; ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.fillText(tick(hi), HIST.left - 4, HIST.top + 8);
    ctx.fillText(tick(lo), HIST.left - 4, HIST.top + plotH);
    ctx.textAlign = "left";
    ctx.fillText("step " + steps[0].step, HIST.left, HEIGHT - HIST.bottom + 14);
    ctx.textAlign = "right";
    ctx.fillText("step " + steps[steps.length - 1].step, WIDTH - HIST.right, HEIGHT - HIST.bottom + 14);
    ctx.strokeStyle = "#ccc"; ctx.strokeRect(HIST.left, HIST.top, plotW, plotH);
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const mx = e.clientX - r.left, my = e.clientY - r.top;
      const i = Math.floor((mx - HIST.left) / column);
      if (i < 0 || i >= steps.length || my < HIST.top || my > HIST.top + plotH) { hover.hidden = true; return; }
      const s = steps[i];
      const v = lo + (HIST.top + plotH - my) / plotH * (hi - lo);
      const last = s.edges.length - 2;
      const j = s.edges.findIndex((edge, k) => k <= last && v >= edge && (v < s.edges[k + 1] || (k === last && v <= s.edges[k + 1])));
      hover.textContent = j < 0 ? `step ${s.step}: no bin at ${fmt(v)}`
        : `step ${s.step}: [${fmt(s.edges[j])}, ${fmt(s.edges[j + 1])}${j === last ? "]" : ")"} count ${s.counts[j]}`;
      placeHover(hover, el, e.clientX, e.clientY);
    });
    canvas.addEventListener("mouseleave", () => { hover.hidden = true; });
  }

  // a media key: images in a strip up to the step the slider picks (the newest by
  // default, following new steps), audio and video in players
  function mediaCard(card) {
    const el = card.el;
    el.textContent = "";
    const h = document.createElement("h4"); h.textContent = card.key;
    el.append(h, sqlPanel(card.rows.map((r) => r.query)));
    const steps = [...new Set(card.rows.flatMap((r) => r.items.map((i) => i.step)))].sort((a, b) => a - b);
    const newest = steps[steps.length - 1];
    let at = media.at.get(card.key);
    if (at === undefined || !steps.includes(at)) at = newest;  // "newest": follows new steps
    const strip = document.createElement("div"); strip.className = "strip";
    if (steps.length > 1) {
      const label = document.createElement("label"); label.className = "note";
      const slider = document.createElement("input");
      slider.type = "range"; slider.min = "0"; slider.max = String(steps.length - 1);
      slider.value = String(steps.indexOf(at)); slider.className = "step-slider";
      const shown = document.createElement("output"); shown.textContent = "step " + at;
      slider.addEventListener("input", () => {
        const step = steps[Number(slider.value)];
        if (step === newest) media.at.delete(card.key); else media.at.set(card.key, step);
        shown.textContent = "step " + step;
        fillStrip(card, strip, step);
      });
      label.append("up to ", slider, " ", shown);
      el.append(label);
    }
    el.append(strip);
    fillStrip(card, strip, at);
  }

  function fillStrip(card, strip, at) {
    strip.textContent = "";
    for (const r of card.rows) {
      const id = r.project + "/" + r.run;
      const row = document.createElement("div"); row.className = "media-run";
      if (card.rows.length > 1) {
        const name = document.createElement("div"); name.className = "note"; name.textContent = runLabel(id);
        row.append(name);
      }
      const items = r.items.filter((i) => i.step <= at);
      // players are heavy: the latest few of audio and video, every image of the strip
      const kept = items.filter((i, k) => i.type === "image" || k >= items.length - 3);
      for (const item of kept) row.append(mediaItem(item));
      strip.append(row);
    }
  }

  function mediaItem(item) {
    const fig = document.createElement("figure");
    fig.dataset.step = String(item.step);
    let shown;
    if (!item.served) {
      shown = document.createElement("div"); shown.className = "note";
      shown.textContent = `not shown (${item.media_type}, ${item.size} bytes)`;
    } else if (item.media_type.startsWith("image/")) {
      shown = document.createElement("img"); shown.alt = item.caption || "";
    } else {
      shown = document.createElement(item.type === "audio" ? "audio" : "video");
      shown.controls = true; shown.preload = "metadata";
    }
    if (item.served) shown.src = item.src || "/api/blob/" + item.digest;
    const cap = document.createElement("figcaption");
    cap.textContent = `step ${item.step}` + (item.rank ? ` rank ${item.rank}` : "") + (item.caption ? `: ${item.caption}` : "");
    fig.append(shown, cap);
    return fig;
  }

  // ---- live refresh ----
  let polling = false;
  async function poll() {
    if (polling) return;
    polling = true;
    try {
      const answer = await api("/api/runs");
      const runs = answer.runs;
      state.queries = answer.queries;
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
        else for (const c of charts.values()) if (c.visible) (live ? refresh : load)(c);
        loadMedia();
      }
      if (live && $("run-key").value && !$("table").hidden) loadSummary();
      if ((fresh || live) && !$("traces").hidden) loadTraces();
      if ((fresh || live) && !$("events").hidden) loadEvents();
      $("status").textContent = `${runs.length} run${runs.length === 1 ? "" : "s"} · ` + (REPORT
        ? `a report written ${REPORT.report.written} from ${REPORT.report.root} by tracklake ` +
          `${REPORT.report.version}: a snapshot, never refreshed` : live ? "live" : "up to date");
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
      if (b.dataset.view === "traces") loadTraces();
      if (b.dataset.view === "events") loadEvents();
    });
  }
  $("filter").addEventListener("input", (e) => { state.filter = e.target.value; renderCharts(); renderMedia(); });
  $("smoothing").addEventListener("input", (e) => {
    state.smoothing = Number(e.target.value); $("smoothing-value").textContent = e.target.value;
    for (const c of charts.values()) if (c.plot) { c.plot.destroy(); c.plot = null; draw(c); }
  });
  $("xaxis").addEventListener("change", (e) => { state.x = e.target.value; for (const c of charts.values()) c.zoom = null; redrawAll(); });
  $("ranks").addEventListener("change", (e) => { state.ranks = e.target.value; redrawAll(); });
  $("group").addEventListener("change", (e) => { state.group = e.target.value; redrawAll(); });
  $("logscale").addEventListener("change", (e) => { state.log = e.target.checked; for (const c of charts.values()) if (c.plot) { c.plot.destroy(); c.plot = null; draw(c); } });
  $("run-filter").addEventListener("input", renderTable);
  $("only-diff").addEventListener("change", renderConfigDiff);
  $("run-key").addEventListener("change", loadSummary);
  $("gen-search").addEventListener("input", () => { clearTimeout(genTimer); genTimer = setTimeout(loadGenerations, 200); });
  $("trace-search").addEventListener("input", () => { clearTimeout(traceTimer); traceTimer = setTimeout(loadTraces, 200); });
  $("event-level").addEventListener("change", loadEvents);
  $("event-kind").addEventListener("change", loadEvents);
  $("sql-run").addEventListener("click", runSql);
  $("sql-x").addEventListener("change", chartAnswer);
  $("sql-text").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) runSql(); });

  document.addEventListener("mouseup", () => {
    for (const c of charts.values()) {
      if (!c.dragging) continue;
      c.dragging = false;
      // after uPlot has taken the selection (its own mouseup handler runs first or next)
      if (c.drawLater) { c.drawLater = false; setTimeout(() => draw(c), 0); }
    }
  });

  if (REPORT) {  // the controls start as the report was asked for; what it cannot show says so
    const r = REPORT.report;
    state.x = $("xaxis").value = r.x;
    state.ranks = $("ranks").value = r.ranks;
    state.smoothing = r.smoothing;
    $("smoothing").value = $("smoothing-value").textContent = String(r.smoothing);
    $("ranks").disabled = $("group").disabled = true;
    const note = $("report-note");
    note.hidden = false;
    note.textContent = `A report file: each chart holds up to ${2 * r.buckets} points a curve ` +
      `(zooming shows those of the range), of ${r.ranks === "first" ? "each run's lowest rank"
      : r.ranks === "mean" ? "the mean of the ranks" : r.rank !== null ? "rank " + r.rank
      : "every rank"}; other ranks and grouping need \`tracklake ui\`.`;
    $("sql-offline").textContent = NO_SQL;
    $("sql-offline").hidden = false;
    $("sql-run").disabled = true;
  }
  // A poll every POLL_MS, but never sooner than PACE times as long as the last one took
  // after it ended: on a store whose run list takes seconds to answer (tens of thousands
  // of runs) an open page does not keep the server asking back to back. A hidden page
  // (another tab, a minimised window) asks nothing, and polls at once when shown again.
  let asleep = false;
  async function pollInTurn() {
    if (document.hidden) { asleep = true; return; }
    const started = performance.now();
    await poll();
    const took = performance.now() - started;
    setTimeout(pollInTurn, Math.max(POLL_MS - took, PACE * took));
  }
  document.addEventListener("visibilitychange", () => {
    if (asleep && !document.hidden) { asleep = false; pollInTurn(); }
  });
  window.tracklake = { state, charts, media, traces, sqlChart, poll, toggleRun, report: REPORT };
  poll().then(() => {
    if (!REPORT) setTimeout(pollInTurn, POLL_MS);
    // page.html#q=TEXT opens on the generations searched for TEXT (a link to a search)
    const asked = new URLSearchParams(location.hash.slice(1)).get("q");
    if (!asked) return;
    $("gen-search").value = asked;
    document.querySelector('nav button[data-view="generations"]').click();
  });
})();
