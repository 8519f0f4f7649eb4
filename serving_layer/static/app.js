// Lambda Platform dashboard: vanilla JS + hand-written SVG, no external libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = { batch: "#4c8dff", speed: "#ffa534", mixed: "#b57bff" };
// One colour per group line (group_by); at most TOP_GROUPS lines are drawn.
const PALETTE = ["#4c8dff", "#ffa534", "#2fcf8a", "#ff5d7a", "#b57bff", "#36c9d8", "#f5d90a", "#e879c6"];
const UNITS = { s: 1e3, m: 6e4, h: 3.6e6, d: 8.64e7 };
const TOP_GROUPS = PALETTE.length;
const GROUP_LIMIT = 100;  // groups asked of the API (`limit`) when grouping; the top ones are drawn
const KEY_LIMIT = 200;    // keys asked of the keys endpoint for the key picker and the filters
// Steps offered besides the default (= window): these and the configured windows, when they are
// multiples of the base window and shorter than the chosen window.
const STEP_CHOICES = ["1m", "5m", "15m", "30m", "1h", "6h", "12h", "1d"];
// Aggregations whose windows add up to the range's total (shown in the summary and legend).
const ADDITIVE = new Set(["count", "sum"]);
const state = {
  metrics: [], metric: null, series: null, timer: null,
  filters: {},  // dimension -> the one value it is fixed to (absent: any)
  seq: { series: 0, keys: 0 },  // only the latest answer of each kind is drawn
};

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

// A "nice" tick step for about `count` intervals over [lo, hi]: 1, 2 or 5 times a power of
// ten, as d3's `ticks` chooses it.
function tickStep(lo, hi, count) {
  const raw = (hi - lo) / count;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const error = raw / power;
  const factor = error >= Math.sqrt(50) ? 10 : error >= Math.sqrt(10) ? 5 : error >= Math.sqrt(2) ? 2 : 1;
  return factor * power;
}

// The y axis: [lo, hi] widened to whole multiples of a nice step (d3's `nice`), and its ticks,
// every multiple of the step from lo to hi (computed as k / (1 / step) for steps below 1, so
// 0.1 * 3 reads 0.3).
function niceTicks(lo, hi, count) {
  if (!(hi > lo)) hi = lo + 1;
  let step = tickStep(lo, hi, count);
  const at = (k) => (step < 1 ? k / Math.round(1 / step) : k * step);
  const first = () => Math.floor(lo / step + 1e-9), last = () => Math.ceil(hi / step - 1e-9);
  for (let i = 0; i < 10; i++) {  // the widened domain may call for a larger step (d3 too)
    const next = tickStep(at(first()), at(last()), count);
    if (next === step) break;
    step = next;
  }
  const k0 = first(), k1 = last();
  const ticks = [];
  for (let k = k0; k <= k1; k++) ticks.push(at(k));
  return { lo: at(k0), hi: at(k1), step, ticks };
}

// A tick's label: a whole number without decimals, another with as many as the step needs;
// in thousands (k) or millions (M) on an axis reaching 10,000 or 1,000,000 (`top`), as `fmt`
// writes values.
function tickLabel(v, step, top) {
  const [scale, suffix] = top >= 1e6 ? [1e6, "M"] : top >= 1e4 ? [1e3, "k"] : [1, ""];
  const decimals = Math.max(0, -Math.floor(Math.log10(step / scale) + 1e-9));
  const text = (v / scale).toFixed(decimals);
  return (Number.isInteger(Number(text)) ? String(Number(text)) : text) + (v ? suffix : "");
}

// Text placed inside HTML markup (a run's error, an API message) as text, never as markup.
function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function errorText(error) {
  return error.message + (error.status === 401 ? " — enter a token above" : "");
}

function showError(error) {
  const box = $("error");
  if (!error) { box.hidden = true; return; }
  box.textContent = errorText(error);
  box.hidden = false;
}

function option(select, value, label, selected) {
  const o = document.createElement("option");
  o.value = value; o.textContent = label;
  if (selected) o.selected = true;
  select.appendChild(o);
}

function metricPath(m, what) { return `/v1/metrics/${encodeURIComponent(m.name)}/${what}?`; }

// A key as the key picker's option value: its dimensions in key order.
function keyValue(m, key) { return JSON.stringify(Object.fromEntries(m.key.map((d) => [d, key[d]]))); }

function keyLabel(dims, key) { return dims.map((d) => key[d]).join(" / "); }

function appendFilters(params, filters) {
  state.metric.key.forEach((d) => { if (d in filters) params.append(d, filters[d]); });
}

function range() {
  const span = Number($("range").value);
  const win = durationMs($("window").value) || UNITS.m;
  const end = Math.ceil(Date.now() / win) * win;
  return { start: end - span, end };
}

// A metric's lookups, filter and computed fields, as configured (text only: never parsed as
// HTML).
function showDefinition(m) {
  const parts = Object.entries(m.fields || {}).map(([name, sql]) => `${name} = ${sql}`);
  if (m.where) parts.unshift(`where ${m.where}`);
  (m.lookups || []).forEach((l) => parts.unshift(`${l.as} = ${l.table} as of ts, on ${l.on}`));
  const line = $("definition");
  line.textContent = parts.join(" · ");
  line.hidden = !parts.length;
}

async function loadMetrics() {
  const body = await api("/v1/metrics");
  state.metrics = body.metrics;
  const select = $("metric");
  select.innerHTML = "";
  body.metrics.forEach((m, i) => option(select, m.name, m.name, i === 0));
  await selectMetric();
}

// On a new metric every picker starts over; on a new range (same metric) the window, step,
// time zone, grouping and filters are kept where they still apply.
async function selectMetric() {
  const m = state.metrics.find((x) => x.name === $("metric").value);
  const previous = state.metric;
  state.metric = m;
  if (!m) return;
  const changed = !previous || previous.name !== m.name || previous.key.join() !== m.key.join();
  const span = Number($("range").value);
  const win = $("window");
  const previousWindow = changed ? null : win.value;
  win.innerHTML = "";
  // Offered: the windows whose cells are kept over the whole range (retention counts back
  // from W, which is before now: a retention of the span itself keeps it), or all of them
  // when none is (the API then says what is kept); chosen first: one of <= 1,440 points.
  const kept = (w) => !(m.retention && w in m.retention) || durationMs(m.retention[w]) >= span;
  const offered = m.windows.some(kept) ? m.windows.filter(kept) : m.windows;
  const fitting = offered.filter((w) => span / durationMs(w) <= 1440);
  const chosen = fitting.includes(previousWindow) ? previousWindow
    : fitting[0] || offered[offered.length - 1];
  offered.forEach((w) => option(win, w, w, w === chosen));
  const field = $("field");
  const previousField = field.value;
  field.innerHTML = "";
  const preferred = m.session ? "sessions" : "count";
  m.aggregations.forEach((a) => option(field, a, a, a === previousField || (!previousField && a === preferred)));
  if (changed) {
    state.filters = {};
    buildDimensionPickers(m);
  }
  showDefinition(m);
  fillSteps();
  try { await loadKeys(); } catch (error) { showError(error); }
  await refreshSeries();
}

// The group-by picker (one dimension or none) and one filter picker per key dimension.
function buildDimensionPickers(m) {
  const groupBy = $("group-by");
  groupBy.innerHTML = "";
  option(groupBy, "", "(none)", true);
  m.key.forEach((d) => option(groupBy, d, d, false));
  groupBy.disabled = !m.key.length;
  const box = $("filters");
  box.innerHTML = "";
  m.key.forEach((d) => {
    const label = document.createElement("label");
    label.append(document.createTextNode(d + " "));
    const select = document.createElement("select");
    select.dataset.dim = d;
    select.className = "filter";
    option(select, "", "any", true);
    select.addEventListener("change", onFilterPicked);
    label.appendChild(select);
    box.appendChild(label);
  });
}

// Steps: the default (= window, not sent) and multiples of the base window shorter than it.
function fillSteps() {
  const m = state.metric;
  const select = $("step");
  const previous = select.value;
  const base = Math.min(...m.windows.map(durationMs));
  const win = durationMs($("window").value);
  select.innerHTML = "";
  option(select, "", "= window", true);
  const seen = new Set();
  [...m.windows, ...STEP_CHOICES]
    .map((s) => [s, durationMs(s)])
    .filter(([, ms]) => ms && ms % base === 0 && ms < win && !seen.has(ms) && seen.add(ms))
    .sort((a, b) => a[1] - b[1])
    .forEach(([s]) => option(select, s, s, s === previous));
}

// The key picker lists the keys passing every filter; each filter picker lists the values its
// dimension takes among the keys passing the *other* filters (so a chosen value can be swapped
// for another without going back to "any"). Identical requests are made once.
async function loadKeys({ keyList = true } = {}) {
  const m = state.metric;
  const select = $("key");
  if (!m.key.length) {
    select.innerHTML = "";
    option(select, "{}", "(global)", true);
    select.disabled = true;
    return;
  }
  select.disabled = false;
  const seq = ++state.seq.keys;
  const { start, end } = range();
  const requests = new Map();
  const keysFor = (filters) => {
    const params = new URLSearchParams({ start: iso(start), end: iso(end), limit: String(KEY_LIMIT) });
    appendFilters(params, filters);
    const query = params.toString();
    if (!requests.has(query)) requests.set(query, api(metricPath(m, "keys") + query));
    return requests.get(query);
  };
  const facets = await Promise.all(m.key.map((d) => {
    const others = { ...state.filters };
    delete others[d];
    return keysFor(others);
  }));
  const matching = keyList ? await keysFor(state.filters) : null;
  if (seq !== state.seq.keys || m !== state.metric) return;  // a newer call owns the pickers
  m.key.forEach((d, i) => fillFilter(d, facets[i]));
  if (matching) {
    const previous = select.value;
    select.innerHTML = "";
    // The metric's total (every key merged, no dimension given) is the default choice.
    option(select, "{}", "(all: total)", !previous || previous === "{}");
    matching.keys.forEach((k) => {
      const value = keyValue(m, k);
      option(select, value, keyLabel(m.key, k), value === previous);
    });
  }
  syncKeyPicker();
}

function filterSelect(dim) {
  return [...document.querySelectorAll("#filters select")].find((s) => s.dataset.dim === dim);
}

function fillFilter(dim, body) {
  const select = filterSelect(dim);
  const values = [...new Set(body.keys.map((k) => k[dim]))];
  const chosen = state.filters[dim];
  if (chosen !== undefined && !values.includes(chosen)) values.push(chosen);
  values.sort();
  select.innerHTML = "";
  option(select, "", "any", chosen === undefined);
  values.forEach((v) => option(select, JSON.stringify(v), v, v === chosen));
  if (body.truncated) {
    option(select, "…", `(from the first ${body.keys.length} keys)`, false);
    select.lastChild.disabled = true;
  }
}

// The key picker shows the filters' state: the total, one key (every dimension fixed), or
// "(filtered)" when only some dimensions are fixed.
function syncKeyPicker() {
  const m = state.metric;
  const select = $("key");
  if (!m || !m.key.length) return;
  const fixed = m.key.filter((d) => d in state.filters);
  let value = "{}";
  if (fixed.length === m.key.length) value = keyValue(m, state.filters);
  else if (fixed.length) value = "filtered";
  [...select.options].filter((o) => o.value === "filtered" && value !== "filtered").forEach((o) => o.remove());
  if (![...select.options].some((o) => o.value === value)) {
    option(select, value, value === "filtered" ? "(filtered)" : keyLabel(m.key, state.filters), false);
  }
  select.value = value;
}

function onKeyPicked() {
  const m = state.metric;
  const value = $("key").value;
  if (!m || value === "filtered") return;
  state.filters = value === "{}" ? {} : JSON.parse(value);
  m.key.forEach((d) => {
    const select = filterSelect(d);
    const v = state.filters[d];
    if (v === undefined) { select.value = ""; return; }
    if (![...select.options].some((o) => o.value === JSON.stringify(v))) option(select, JSON.stringify(v), v, false);
    select.value = JSON.stringify(v);
  });
  // Picking one key keeps the key list as it is; picking the total lists every key again.
  loadKeys({ keyList: value === "{}" }).catch(showError);
  refreshSeries();
}

function onFilterPicked(event) {
  const dim = event.target.dataset.dim;
  const value = event.target.value;
  if (value === "") delete state.filters[dim];
  else state.filters[dim] = JSON.parse(value);
  syncKeyPicker();
  loadKeys().catch(showError);
  refreshSeries();
}

async function refreshSeries() {
  const m = state.metric;
  if (!m) return;
  const seq = ++state.seq.series;
  const { start, end } = range();
  const params = new URLSearchParams({ window: $("window").value, start: iso(start), end: iso(end) });
  appendFilters(params, state.filters);
  const groupBy = $("group-by").value;
  if (groupBy) {
    params.set("group_by", groupBy);
    params.set("limit", String(GROUP_LIMIT));
  }
  if ($("step").value) params.set("step", $("step").value);
  if ($("tz").value) params.set("tz", $("tz").value);
  const query = params.toString();
  try {
    const body = await api(metricPath(m, "series") + query);
    if (seq !== state.seq.series) return;
    state.series = { body, start, end, query };
    showError(null);
    drawChart();
    updateHeader(body.speed_status, body.batch_watermark, body.batch_status);
  } catch (error) {
    if (seq !== state.seq.series) return;
    // The API says what it rejected (e.g. a time zone the base window cannot align to):
    // show its message where the chart was, and in the error bar.
    state.series = null;
    showError(error);
    drawEmpty(errorText(error), true);
  }
  $("chart").dataset.query = query;
  refreshSessions(start, end).catch(showError);
}

// One key's sessions (a session metric with every key dimension fixed): the batch view's
// before W, the speed view's after, newest first.
async function refreshSessions(start, end) {
  const m = state.metric;
  const card = $("sessions-card");
  const oneKey = m && m.session && m.key.every((d) => d in state.filters);
  card.hidden = !oneKey;
  if (!oneKey) return;
  const params = new URLSearchParams({ start: iso(start), end: iso(end), limit: "1000" });
  appendFilters(params, state.filters);
  const body = await api(metricPath(m, "sessions") + params.toString());
  const outputs = m.aggregations.filter((a) => body.sessions.some((s) => a in s));
  $("sessions-title").textContent =
    `Sessions of ${keyLabel(m.key, state.filters)} (${body.sessions.length}${body.truncated ? "+" : ""})`;
  $("sessions-head").innerHTML = "<tr><th>start</th><th>end</th><th>source</th><th>events</th>" +
    "<th>duration</th>" + outputs.map((a) => `<th>${esc(a)}</th>`).join("") + "</tr>";
  const tbody = $("sessions");
  tbody.innerHTML = "";
  if (!body.sessions.length) {
    tbody.innerHTML = `<tr><td colspan="${5 + outputs.length}" class="muted">no session in the range</td></tr>`;
  }
  const span = end - start;
  body.sessions.slice().reverse().forEach((s) => {
    const tr = document.createElement("tr");
    tr.innerHTML = `<td>${shortTime(Date.parse(s.start), span)}</td><td>${shortTime(Date.parse(s.end), span)}</td>` +
      `<td><i class="dot ${s.source}"></i>${s.source}</td><td>${s.events}</td>` +
      `<td>${fmt(s.duration_s / 60)} min</td>` + outputs.map((a) => `<td>${fmt(s[a])}</td>`).join("");
    tbody.appendChild(tr);
  });
}

function updateHeader(status, watermark, batchStatus) {
  const pill = $("speed-status");
  pill.textContent = "speed: " + status;
  pill.className = "pill " + status;
  // batch view unreachable: the answer holds only the windows from W on (the speed view's)
  const batchDown = batchStatus === "unavailable" ? " (batch view unreachable: only windows from W on)" : "";
  $("w-label").textContent = "W: " + (watermark || "none yet") + batchDown;
}

function drawEmpty(text, isError) {
  const box = $("chart");
  box.innerHTML = "";
  const div = document.createElement("div");
  div.className = isError ? "empty chart-error" : "empty";
  if (isError) div.id = "chart-error";
  div.textContent = text;
  box.appendChild(div);
  $("summary").textContent = "";
  $("series-legend").hidden = true;
  $("series-legend").innerHTML = "";
}

// A drawn SVG text's width, or an estimate (`perChar` px a character) while the chart is not
// laid out (a hidden page measures 0).
function textWidth(text, perChar) {
  return text.getComputedTextLength() || text.textContent.length * perChar;
}

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, v));
  if (parent) parent.appendChild(node);
  return node;
}

// The lines to draw: one (without group_by) or the top groups (with group_by). Groups are
// ranked by the sum of the shown aggregation over their windows (for count and sum: the range's
// total; for the others a rough size), largest first, ties by key ascending (the API's order),
// among the first GROUP_LIMIT groups the API returns (ascending by key; `truncated` says so).
function seriesLines(body, field) {
  const line = (points) => {
    const pts = points
      .map((p) => ({ t: Date.parse(p.start), tEnd: Date.parse(p.end), v: p[field], p }))
      .filter((p) => p.v !== null && p.v !== undefined);
    return { pts, total: pts.reduce((a, p) => a + p.v, 0) };
  };
  if (!body.groups) return [{ name: null, key: body.key, ...line(body.points) }];
  return body.groups
    .map((g) => ({ name: keyLabel(body.group_by, g.key), key: g.key, ...line(g.points) }))
    .sort((a, b) => b.total - a.total)
    .slice(0, TOP_GROUPS)
    .map((g, i) => ({ ...g, color: PALETTE[i] }));
}

function chartTitle(body, field) {
  let title = `${body.metric} · ${field} · ${body.window}`;
  if (body.step) title += ` every ${body.step}`;
  if (body.tz) title += ` · ${body.tz}`;
  const dims = state.metric ? state.metric.key : [];
  const filters = Object.entries(body.filters || {})
    .map(([d, vs]) => `${d}=${vs.join("|")}`).join(", ");
  if (body.groups) return title + ` · by ${body.group_by.join(", ")}` + (filters ? ` · ${filters}` : "");
  if (dims.length && Object.keys(body.key).length === dims.length) return title + " · " + keyLabel(dims, body.key);
  if (filters) return title + " · " + filters;
  return title + (dims.length ? " · total" : "");
}

function drawChart() {
  const { body, start, end } = state.series;
  const field = $("field").value;
  const grouped = Boolean(body.groups);
  const lines = seriesLines(body, field);
  const all = lines.flatMap((l) => l.pts);
  $("chart-title").textContent = chartTitle(body, field);
  $("source-legend").hidden = grouped;
  $("style-legend").hidden = !grouped;
  const box = $("chart");
  box.innerHTML = "";
  const width = box.clientWidth || 900, height = box.clientHeight || 340;
  const pad = { l: 56, r: 16, t: 16, b: 28 };
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, id: "chart-svg" }, box);
  const defs = el("defs", {}, svg);
  const grad = el("linearGradient", { id: "fill", x1: 0, y1: 0, x2: 0, y2: 1 }, defs);
  el("stop", { offset: "0%", "stop-color": COLORS.batch, "stop-opacity": 0.35 }, grad);
  el("stop", { offset: "100%", "stop-color": COLORS.batch, "stop-opacity": 0.02 }, grad);
  const yAxis = niceTicks(Math.min(0, ...all.map((p) => p.v)), Math.max(0, ...all.map((p) => p.v)), 5);
  const minV = yAxis.lo, maxV = yAxis.hi;
  // Windows aligned to a time zone, or hopping ones, may end after the range's end.
  const t0 = Math.min(start, ...all.map((p) => p.t));
  const t1 = Math.max(end, ...all.map((p) => p.tEnd));
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r);
  const y = (v) => pad.t + (1 - (v - minV) / (maxV - minV)) * (height - pad.t - pad.b);
  const axis = el("g", { class: "axis" }, svg);
  yAxis.ticks.forEach((v) => {
    el("line", { x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), class: "grid-line" }, axis);
    el("text", { x: pad.l - 8, y: y(v) + 4, "text-anchor": "end", class: "y-tick" }, axis)
      .textContent = tickLabel(v, yAxis.step, Math.max(-minV, maxV));
  });
  for (let i = 0; i <= 6; i++) {
    const t = t0 + ((t1 - t0) * i) / 6;
    const label = el("text", { x: x(t), y: height - 8, "text-anchor": "middle", class: "x-tick" }, axis);
    label.textContent = shortTime(t, t1 - t0);
    // Centred on its time, but never past the SVG's right edge (a long "MM-DD HH:MM" at t1).
    const half = textWidth(label, 6.5) / 2;
    if (x(t) + half > width - 1) label.setAttribute("x", width - 1 - half);
  }
  const mid = (p) => x((p.t + p.tEnd) / 2);
  const dot = (p, fill, r, parent, name) => {
    const c = el("circle", { cx: mid(p), cy: y(p.v), r, fill, "data-source": p.p.source,
      "data-start": p.p.start, class: "point" }, parent);
    c.addEventListener("mousemove", (ev) => tooltip(ev, p.p, name));
    c.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  };
  if (!all.length) {
    el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", fill: "#8793aa" }, svg)
      .textContent = "no data in this range";
  } else if (!grouped) {
    const pts = lines[0].pts;
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
    pts.forEach((p) => dot(p, COLORS[p.p.source], r, dots, null));
  } else {
    // One colour per group; a segment into a speed or mixed window is dashed.
    lines.forEach((g) => {
      const series = el("g", { class: "series", "data-key": g.name }, svg);
      for (let i = 1; i < g.pts.length; i++) {
        const seg = el("line", { x1: mid(g.pts[i - 1]), y1: y(g.pts[i - 1].v), x2: mid(g.pts[i]),
          y2: y(g.pts[i].v), stroke: g.color, "stroke-width": 2 }, series);
        if (g.pts[i].p.source !== "batch") seg.setAttribute("stroke-dasharray", "5 3");
      }
      const r = g.pts.length > 300 ? 1.4 : 2.5;
      g.pts.forEach((p) => dot(p, g.color, r, series, g.name));
    });
  }
  if (body.batch_watermark) {
    const w = Date.parse(body.batch_watermark);
    const inside = w >= t0 && w <= t1;
    const wx = Math.min(Math.max(x(w), pad.l), width - pad.r);
    const g = el("g", { id: "w-marker", "data-w": body.batch_watermark }, svg);
    el("line", { x1: wx, x2: wx, y1: pad.t, y2: height - pad.b, stroke: "#ff5d7a",
      "stroke-width": 2, "stroke-dasharray": "6 4" }, g);
    const label = el("text", { x: wx + 6, y: pad.t + 12, fill: "#ff5d7a", "font-size": 12 }, g);
    label.textContent = (inside ? "W " : w < t0 ? "◂ W " : "W ▸ ") + shortTime(w, 0);
    // Right of the line, or left of it when it would run past the plot's right edge.
    const len = textWidth(label, 7.5);
    const right = wx + 6 + len <= width - pad.r;
    label.setAttribute("x", right ? wx + 6 : Math.max(pad.l + 2, wx - 6 - len));
    label.dataset.side = right ? "right" : "left";
  }
  drawLegend(grouped ? lines : [], field, body);
  drawSummary(grouped, lines, field, body);
}

// A range's total is the sum of its windows' counts or sums only when windows do not overlap.
function showsTotal(field, body) {
  return ADDITIVE.has(field) && !(body.step && durationMs(body.step) < durationMs(body.window));
}

function drawLegend(groups, field, body) {
  const legend = $("series-legend");
  legend.innerHTML = "";
  legend.hidden = !groups.length;
  groups.forEach((g) => {
    const entry = document.createElement("span");
    entry.className = "entry";
    entry.dataset.key = g.name;
    entry.dataset.total = String(g.total);
    const swatch = document.createElement("i");
    swatch.style.background = g.color;
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = g.name;
    entry.append(swatch, name);
    if (showsTotal(field, body)) {
      const total = document.createElement("b");
      total.className = "total";
      total.textContent = fmt(g.total);
      entry.append(" ", total);
    }
    legend.appendChild(entry);
  });
  if (groups.length && (body.groups.length > groups.length || body.truncated)) {
    const more = document.createElement("span");
    more.className = "muted";
    more.textContent = `top ${groups.length} of ${body.groups.length}${body.truncated ? "+" : ""} groups by ${field}`;
    legend.appendChild(more);
  }
}

function drawSummary(grouped, lines, field, body) {
  const counts = { batch: 0, mixed: 0, speed: 0 };
  const points = grouped ? lines.flatMap((g) => g.pts.map((p) => p.p)) : body.points;
  points.forEach((p) => { counts[p.source] += 1; });
  const summary = $("summary");
  summary.innerHTML = (grouped ? `<span>groups <b id="group-count">${lines.length}</b></span>` : "") +
    `<span>points <b>${points.length}</b></span>` +
    `<span>batch <b>${counts.batch}</b></span><span>mixed <b>${counts.mixed}</b></span>` +
    `<span>speed <b>${counts.speed}</b></span>`;
  if (grouped) return;
  const pts = lines[0].pts;
  const latest = document.createElement("span");
  latest.append(`latest ${field} `);
  latest.appendChild(document.createElement("b")).textContent = pts.length ? fmt(pts[pts.length - 1].v) : "–";
  summary.appendChild(latest);
  if (showsTotal(field, body)) {
    const total = document.createElement("span");
    total.append(`total ${field} `);
    const b = total.appendChild(document.createElement("b"));
    b.id = "total";
    b.dataset.value = String(lines[0].total);
    b.textContent = fmt(lines[0].total);
    summary.appendChild(total);
  }
}

function tooltip(ev, point, name) {
  const tip = $("tooltip");
  const lines = [`${point.start} → ${point.end}`, `source: ${point.source}`];
  if (name !== null) lines.unshift(name);
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
        `<td class="status-${run.status}" title="${esc(run.error || "")}">${run.status}</td>` +
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
    tbody.innerHTML = `<tr><td colspan="7" class="muted">${esc(hint)}</td></tr>`;
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
  $("window").addEventListener("change", () => { fillSteps(); refreshSeries(); });
  $("key").addEventListener("change", onKeyPicked);
  $("group-by").addEventListener("change", () => refreshSeries());
  $("step").addEventListener("change", () => refreshSeries());
  $("tz").addEventListener("change", () => refreshSeries());
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
