// Lambda Platform dashboard: vanilla JS + hand-written SVG, no external libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = { batch: "#4c8dff", speed: "#ffa534", mixed: "#b57bff" };
const UNITS = { s: 1e3, m: 6e4, h: 3.6e6, d: 8.64e7 };
const state = { metrics: [], metric: null, series: null, timer: null };

function token() { return $("token").value.trim(); }

async function api(path, options = {}) {
  const headers = { "Accept": "application/json", ...(options.headers || {}) };
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (options.body) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const detail = body && body.detail ? body.detail : response.statusText;
    const error = new Error(`${response.status}: ${detail}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

function durationMs(text) {
  const m = /^(\d+)([smhd])$/.exec(text);
  return m ? Number(m[1]) * UNITS[m[2]] : NaN;
}

function iso(ms) { return new Date(ms).toISOString().replace(".000Z", "Z"); }

function shortTime(ms, spanMs) {
  const d = new Date(ms);
  const hm = d.toISOString().slice(11, 16);
  return spanMs > 2 * UNITS.d ? d.toISOString().slice(5, 10) + " " + hm : hm;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(2);
}

function showError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; return; }
  box.textContent = error.message + (error.status === 401 ? " — enter a token above" : "");
  box.hidden = false;
}

function option(select, value, label, selected) {
  const o = document.createElement("option");
  o.value = value; o.textContent = label;
  if (selected) o.selected = true;
  select.appendChild(o);
}

function range() {
  const span = Number($("range").value);
  const win = durationMs($("window").value) || UNITS.m;
  const end = Math.ceil(Date.now() / win) * win;
  return { start: end - span, end };
}

async function loadMetrics() {
  const body = await api("/v1/metrics");
  state.metrics = body.metrics;
  const select = $("metric");
  select.innerHTML = "";
  body.metrics.forEach((m, i) => option(select, m.name, m.name, i === 0));
  await selectMetric();
}

async function selectMetric() {
  const m = state.metrics.find((x) => x.name === $("metric").value);
  state.metric = m;
  if (!m) return;
  const span = Number($("range").value);
  const win = $("window");
  win.innerHTML = "";
  const fitting = m.windows.filter((w) => span / durationMs(w) <= 1440);
  const chosen = fitting[0] || m.windows[m.windows.length - 1];
  m.windows.forEach((w) => option(win, w, w, w === chosen));
  const field = $("field");
  const previous = field.value;
  field.innerHTML = "";
  m.aggregations.forEach((a) => option(field, a, a, a === previous || (!previous && a === "count")));
  await loadKeys();
  await refreshSeries();
}

async function loadKeys() {
  const m = state.metric;
  const select = $("key");
  const previous = select.value;
  select.innerHTML = "";
  if (!m.key.length) {
    option(select, "{}", "(global)", true);
    select.disabled = true;
    return;
  }
  select.disabled = false;
  // The metric's total (every key merged, no dimension given) is the default choice.
  option(select, "{}", "(all: total)", !previous || previous === "{}");
  const { start, end } = range();
  const body = await api(`/v1/metrics/${encodeURIComponent(m.name)}/keys?` +
    new URLSearchParams({ start: iso(start), end: iso(end), limit: "200" }));
  body.keys.forEach((k) => {
    const value = JSON.stringify(k);
    option(select, value, m.key.map((d) => k[d]).join(" / "), value === previous);
  });
}

async function refreshSeries() {
  const m = state.metric;
  if (!m || !$("key").value) { drawEmpty("No keys in this range"); return; }
  const { start, end } = range();
  const params = new URLSearchParams({ window: $("window").value, start: iso(start), end: iso(end) });
  Object.entries(JSON.parse($("key").value)).forEach(([d, v]) => params.append(d, v));
  try {
    const body = await api(`/v1/metrics/${encodeURIComponent(m.name)}/series?` + params);
    state.series = { body, start, end };
    showError(null);
    drawChart();
    updateHeader(body.speed_status, body.batch_watermark);
  } catch (error) { showError(error); }
}

function updateHeader(status, watermark) {
  const pill = $("speed-status");
  pill.textContent = "speed: " + status;
  pill.className = "pill " + status;
  $("w-label").textContent = "W: " + (watermark || "none yet");
}

function drawEmpty(text) {
  $("chart").innerHTML = `<div class="empty">${text}</div>`;
  $("summary").textContent = "";
}

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, v));
  if (parent) parent.appendChild(node);
  return node;
}

function drawChart() {
  const { body, start, end } = state.series;
  const field = $("field").value;
  const winMs = durationMs(body.window);
  const pts = body.points
    .map((p) => ({ t: Date.parse(p.start), v: p[field], p }))
    .filter((p) => p.v !== null && p.v !== undefined);
  $("chart-title").textContent = `${body.metric} · ${field} · ${body.window}` +
    (Object.keys(body.key).length ? " · " + Object.values(body.key).join(" / ")
      : state.metric && state.metric.key.length ? " · total" : "");
  const box = $("chart");
  box.innerHTML = "";
  const width = box.clientWidth || 900, height = box.clientHeight || 340;
  const pad = { l: 56, r: 16, t: 16, b: 28 };
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, id: "chart-svg" }, box);
  const defs = el("defs", {}, svg);
  const grad = el("linearGradient", { id: "fill", x1: 0, y1: 0, x2: 0, y2: 1 }, defs);
  el("stop", { offset: "0%", "stop-color": COLORS.batch, "stop-opacity": 0.35 }, grad);
  el("stop", { offset: "100%", "stop-color": COLORS.batch, "stop-opacity": 0.02 }, grad);
  const maxV = Math.max(1e-9, ...pts.map((p) => p.v));
  const minV = Math.min(0, ...pts.map((p) => p.v));
  const x = (t) => pad.l + ((t - start) / (end - start)) * (width - pad.l - pad.r);
  const y = (v) => pad.t + (1 - (v - minV) / (maxV - minV)) * (height - pad.t - pad.b);
  const axis = el("g", { class: "axis" }, svg);
  for (let i = 0; i <= 4; i++) {
    const v = minV + ((maxV - minV) * i) / 4;
    el("line", { x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), class: "grid-line" }, axis);
    el("text", { x: pad.l - 8, y: y(v) + 4, "text-anchor": "end" }, axis).textContent = fmt(v);
  }
  for (let i = 0; i <= 6; i++) {
    const t = start + ((end - start) * i) / 6;
    el("text", { x: x(t), y: height - 8, "text-anchor": "middle" }, axis).textContent =
      shortTime(t, end - start);
  }
  if (pts.length) {
    const mid = (p) => x(p.t + winMs / 2);
    const line = pts.map((p, i) => `${i ? "L" : "M"}${mid(p).toFixed(1)},${y(p.v).toFixed(1)}`).join("");
    el("path", { d: `${line}L${mid(pts[pts.length - 1]).toFixed(1)},${y(minV)}L${mid(pts[0]).toFixed(1)},${y(minV)}Z`,
      fill: "url(#fill)" }, svg);
    // The line is split by source so the batch and speed parts read in their own colours.
    for (let i = 1; i < pts.length; i++) {
      el("line", { x1: mid(pts[i - 1]), y1: y(pts[i - 1].v), x2: mid(pts[i]), y2: y(pts[i].v),
        stroke: COLORS[pts[i].p.source], "stroke-width": 2 }, svg);
    }
    const dots = el("g", { id: "points" }, svg);
    const r = pts.length > 300 ? 1.6 : 3;
    pts.forEach((p) => {
      const c = el("circle", { cx: mid(p), cy: y(p.v), r, fill: COLORS[p.p.source],
        "data-source": p.p.source, class: "point" }, dots);
      c.addEventListener("mousemove", (ev) => tooltip(ev, p.p));
      c.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
    });
  } else {
    el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", fill: "#8793aa" }, svg)
      .textContent = "no data in this range";
  }
  if (body.batch_watermark) {
    const w = Date.parse(body.batch_watermark);
    const inside = w >= start && w <= end;
    const wx = Math.min(Math.max(x(w), pad.l), width - pad.r);
    const g = el("g", { id: "w-marker", "data-w": body.batch_watermark }, svg);
    el("line", { x1: wx, x2: wx, y1: pad.t, y2: height - pad.b, stroke: "#ff5d7a",
      "stroke-width": 2, "stroke-dasharray": "6 4" }, g);
    el("text", { x: wx + 6, y: pad.t + 12, fill: "#ff5d7a", "font-size": 12 }, g).textContent =
      (inside ? "W " : w < start ? "◂ W " : "W ▸ ") + shortTime(w, 0);
  }
  const counts = { batch: 0, mixed: 0, speed: 0 };
  body.points.forEach((p) => { counts[p.source] += 1; });
  $("summary").innerHTML = `<span>points <b>${body.points.length}</b></span>` +
    `<span>batch <b>${counts.batch}</b></span><span>mixed <b>${counts.mixed}</b></span>` +
    `<span>speed <b>${counts.speed}</b></span>` +
    `<span>latest ${field} <b>${pts.length ? fmt(pts[pts.length - 1].v) : "–"}</b></span>`;
}

function tooltip(ev, point) {
  const tip = $("tooltip");
  const lines = [`${point.start} → ${point.end}`, `source: ${point.source}`];
  Object.entries(point).forEach(([k, v]) => {
    if (!["start", "end", "source"].includes(k)) lines.push(`${k}: ${fmt(v)}`);
  });
  tip.textContent = lines.join("\n");
  tip.style.left = ev.clientX + 12 + "px";
  tip.style.top = ev.clientY + 12 + "px";
  tip.hidden = false;
}

async function refreshRuns() {
  const tbody = $("runs");
  try {
    const body = await api("/v1/batch/runs?limit=8");
    tbody.innerHTML = "";
    if (!body.runs.length) tbody.innerHTML = '<tr><td colspan="7" class="muted">no runs yet</td></tr>';
    body.runs.forEach((run) => {
      const tr = document.createElement("tr");
      const pct = Math.round(run.progress * 100);
      tr.innerHTML = `<td>${run.run_id}</td><td>${run.mode}${run.start ? " " + run.start + "–" + run.end : ""}</td>` +
        `<td class="status-${run.status}" title="${run.error || ""}">${run.status}</td>` +
        `<td><div class="bar" title="${pct}%"><div style="width:${pct}%"></div></div></td>` +
        `<td>${run.requested_at.slice(5, 19).replace("T", " ")}</td>` +
        `<td>${run.duration_s === null ? "–" : run.duration_s.toFixed(1) + " s"}</td><td></td>`;
      if (run.status === "queued") {
        const b = document.createElement("button");
        b.className = "cancel"; b.textContent = "cancel";
        b.onclick = () => api(`/v1/batch/runs/${run.run_id}/cancel`, { method: "POST" })
          .then(refreshRuns).catch(runMessage);
        tr.lastChild.appendChild(b);
      }
      tbody.appendChild(tr);
    });
  } catch (error) {
    const hint = error.status === 401 || error.status === 403 ? "an operator token shows runs" : error.message;
    tbody.innerHTML = `<tr><td colspan="7" class="muted">${hint}</td></tr>`;
  }
}

function runMessage(error, text) {
  const box = $("run-message");
  box.hidden = false;
  box.className = error ? "message bad" : "message";
  box.textContent = error ? error.message : text;
}

async function queueRun() {
  $("queue").disabled = true;
  try {
    const run = await api("/v1/batch/runs", { method: "POST", body: JSON.stringify({ mode: $("run-mode").value }) });
    runMessage(null, `run ${run.run_id} ${run.coalesced ? "was already queued" : "queued"}`);
    await refreshRuns();
  } catch (error) { runMessage(error); }
  finally { $("queue").disabled = false; }
}

async function refreshStatus() {
  try {
    const s = await api("/v1/status");
    const tbody = $("lag");
    tbody.innerHTML = "";
    s.partitions.forEach((p) => {
      const tr = document.createElement("tr");
      tr.innerHTML = `<td>${p.topic}:${p.partition}</td><td>${p.applied_offset ?? "–"}</td>` +
        `<td>${p.end_offset ?? "–"}</td><td>${p.lag ?? "–"}</td><td>${p.stream_time ?? "–"}</td>`;
      tbody.appendChild(tr);
    });
    $("watermarks").innerHTML = s.metrics.map((m) =>
      `${m.metric}: W ${m.batch_watermark || "none"}${m.age_s === null ? "" : ` (${fmt(m.age_s / 60)} min old)`}`).join("<br>");
    if (!state.series) updateHeader(s.speed_status, null);
  } catch (error) { /* the series call shows the error */ }
}

function schedule() {
  clearInterval(state.timer);
  if ($("auto").checked) {
    state.timer = setInterval(() => { refreshSeries(); refreshRuns(); refreshStatus(); }, 10000);
  }
}

async function start() {
  $("token").value = localStorage.getItem("lp-token") || "";
  $("token").addEventListener("change", () => {
    localStorage.setItem("lp-token", token());
    loadMetrics().catch(showError); refreshRuns(); refreshStatus();
  });
  $("metric").addEventListener("change", () => selectMetric().catch(showError));
  $("range").addEventListener("change", () => selectMetric().catch(showError));
  $("window").addEventListener("change", () => refreshSeries());
  $("key").addEventListener("change", () => refreshSeries());
  $("field").addEventListener("change", () => state.series && drawChart());
  $("queue").addEventListener("click", queueRun);
  $("auto").addEventListener("change", schedule);
  window.addEventListener("resize", () => state.series && drawChart());
  try { await loadMetrics(); } catch (error) { showError(error); }
  refreshRuns();
  refreshStatus();
  schedule();
}

start();
