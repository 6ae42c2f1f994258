// dcost explorer: the page's controls ask the JSON API (SI units) and draw its answers.
// Sliders sit on a log scale where the quantity spans decades; each control maps its position
// to the value sent and the text shown. Every answer has its own request: while one is in
// flight, a newer position waits and is sent when it returns (no pile-up of stale requests).
"use strict";

const SLIDERS = {
  context: { toValue: (v) => Math.round(2 ** v), fromValue: Math.log2, show: (x) => `${fmtInt(x)} tokens` },
  output: { toValue: (v) => Math.round(2 ** v), fromValue: Math.log2, show: (x) => `${fmtInt(x)} tokens` },
  batch: { toValue: (v) => Math.round(2 ** v), fromValue: Math.log2, show: (x) => `${fmtInt(x)} sequences` },
  chips: { toValue: (v) => Math.round(v), fromValue: (x) => x, show: (x) => `${fmtInt(x)} chips` },
  tpot_slo: { toValue: (v) => sig(10 ** v, 3), fromValue: Math.log10, show: (x) => `${sig(x * 1e3, 3)} ms` },
  rate: { toValue: (v) => sig(10 ** v, 3), fromValue: Math.log10, show: (x) => `${sig(x, 3)} requests/s` },
};
const ANSWERS = ["curve", "optimum", "elasticities", "fleet"];
const DEBOUNCE_MS = 60;
const COLORS = {
  tpot: "#111111", t_compute: "#d62728", t_weights: "#1f77b4", t_kv: "#17becf",
  t_comm: "#9467bd", t_overhead: "#8c564b", cost: "#2ca02c", memory: "#ff7f0e",
};

let choices = null;
const state = { curve: null, optimum: null };
const plots = {};
const inflight = {};
const pending = {};
let timer = null;

function sig(x, n) { return Number(x.toPrecision(n)); }
function fmtInt(x) { return Math.round(x).toLocaleString("en-US"); }
function fmt(x, n = 4) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  if (x !== 0 && Math.abs(x) < 1e-3) return x.toExponential(n - 1);
  return Number(x.toPrecision(n)).toLocaleString("en-US", { maximumSignificantDigits: n });
}
function $(id) { return document.getElementById(id); }

function query() {
  const q = {};
  for (const id of ["hardware", "model", "engine"]) q[id] = $(id).value;
  for (const [id, s] of Object.entries(SLIDERS)) q[id] = s.toValue(Number($(id).value));
  return q;
}

function showValues() {
  const q = query();
  for (const [id, s] of Object.entries(SLIDERS)) $(`${id}-value`).textContent = s.show(q[id]);
}

function setPending(delta) {
  const n = Number(document.body.dataset.pending) + delta;
  document.body.dataset.pending = String(n);
  $("status").textContent = n > 0 ? "computing…" : "ready";
}

async function ask(name) {
  if (inflight[name]) { pending[name] = true; return; }
  inflight[name] = true;
  pending[name] = false;
  setPending(1);
  const q = query();
  try {
    const r = await fetch(`/api/${name}?` + new URLSearchParams(q));
    const body = await r.json();
    if (r.status === 400) {
      $("error").textContent = `${body.field}: ${body.error}`;
    } else if (!r.ok) {
      $("error").textContent = `${name}: HTTP ${r.status}`;
    } else {
      $("error").textContent = "";
      draw(name, body, q);
    }
  } catch (err) {
    $("error").textContent = `${name}: ${err}`;
  } finally {
    inflight[name] = false;
    setPending(-1);
    if (pending[name]) ask(name);
  }
}

function update() {
  showValues();
  clearTimeout(timer);
  timer = setTimeout(() => ANSWERS.forEach(ask), DEBOUNCE_MS);
}

// ---- plots -------------------------------------------------------------------------------

function positive(a, scale = 1) { return a.map((v) => (v !== null && v > 0 ? v * scale : null)); }

// Marks on a plot: vertical lines at the optimum and at the largest batch HBM holds, a point at
// the design on show, and (time plot) the TPOT target as a horizontal line.
function marksPlugin(kind) {
  return {
    hooks: {
      draw: [(u) => {
        const c = state.curve;
        if (!c) return;
        const ctx = u.ctx, px = uPlot.pxRatio, { left, top, width, height } = u.bbox;
        ctx.save();
        ctx.font = `${12 * px}px sans-serif`;
        ctx.textAlign = "left";  // uPlot leaves the axes' alignment set
        ctx.textBaseline = "alphabetic";
        const text = (label, x, y, color) => {  // on a white ground, so that curves do not hide it
          const w = ctx.measureText(label).width;
          ctx.fillStyle = "rgba(255,255,255,0.85)";
          ctx.fillRect(x - 2 * px, y - 11 * px, w + 4 * px, 14 * px);
          ctx.fillStyle = color; ctx.fillText(label, x, y);
        };
        const vline = (x, color, dash, label, row) => {
          if (x === null || x === undefined) return;
          const X = u.valToPos(x, "x", true);
          if (X < left || X > left + width) return;
          ctx.strokeStyle = color; ctx.setLineDash(dash.map((d) => d * px)); ctx.lineWidth = 1.5 * px;
          ctx.beginPath(); ctx.moveTo(X, top); ctx.lineTo(X, top + height); ctx.stroke();
          ctx.setLineDash([]);
          const w = ctx.measureText(label).width;
          const tx = X + 4 * px + w > left + width ? X - 4 * px - w : X + 4 * px;
          text(label, tx, top + 16 * row * px, color);
        };
        vline(c.largest_batch_in_memory, "#ff7f0e", [6, 4], "HBM full", 2);
        const o = state.optimum;
        if (o && o.feasible) {
          const binds = o.binding.length ? ` (${o.binding.join(", ")})` : "";
          vline(o.batch, "#2ca02c", [], `optimum B*=${fmtInt(o.batch)}${binds}`, 1);
        }
        const hline = (y, label, below) => {
          const Y = u.valToPos(y, "y", true);
          if (Y < top || Y > top + height) return;
          ctx.strokeStyle = "#555"; ctx.setLineDash([3 * px, 3 * px]); ctx.lineWidth = 1.5 * px;
          ctx.beginPath(); ctx.moveTo(left, Y); ctx.lineTo(left + width, Y); ctx.stroke();
          ctx.setLineDash([]);
          text(label, left + 6 * px, below ? Y + 15 * px : Y - 5 * px, "#555");
        };
        if (kind === "time") hline(c.tpot_slo * 1e3, "TPOT target");
        if (kind === "memory") hline(c.memory_limit / 1e9, "HBM limit (10 % kept free)", true);
        const p = c.point;
        const yv = { time: p.tpot * 1e3, cost: p.cost_per_token * 1e6, memory: p.memory_per_chip / 1e9 }[kind];
        if (yv > 0) {
          const X = u.valToPos(p.batch, "x", true), Y = u.valToPos(yv, "y", true);
          ctx.fillStyle = "#000"; ctx.beginPath(); ctx.arc(X, Y, 5 * px, 0, 2 * Math.PI); ctx.fill();
        }
        ctx.restore();
      }],
    },
  };
}

// the memory plot's range always holds the HBM limit, so that its line shows
function yRange(kind) {
  if (kind !== "memory") return undefined;
  return (u, min, max) => {
    const lim = state.curve ? state.curve.memory_limit / 1e9 : null;
    if (lim) { min = Math.min(min ?? lim, lim / 1.5); max = Math.max(max ?? lim, lim * 1.5); }
    return uPlot.rangeLog(min, max, 10, true);
  };
}

function makePlot(id, kind, yLabel, series) {
  const el = $(id);
  const width = Math.max(320, el.clientWidth || 420);
  const opts = {
    width, height: 280,
    plugins: [marksPlugin(kind)],
    scales: { x: { time: false, distr: 3, log: 10 }, y: { distr: 3, log: 10, range: yRange(kind) } },
    axes: [
      { label: "batch B (sequences)", labelSize: 20, size: 40 },
      { label: yLabel, labelSize: 20, size: 64 },
    ],
    legend: { live: false },
    cursor: { drag: { x: false, y: false } },
    series: [{ label: "B" }, ...series],
  };
  const empty = [[1, 2], ...series.map(() => [null, null])];
  return new uPlot(opts, empty, el);
}

function initPlots() {
  const term = (k, label) => ({ label, stroke: COLORS[k], width: 1.5 });
  plots.time = makePlot("plot-time", "time", "time (ms)", [
    { label: "TPOT", stroke: COLORS.tpot, width: 2.5 },
    term("t_compute", "compute"), term("t_weights", "weights"), term("t_kv", "KV"),
    term("t_comm", "comm"), term("t_overhead", "overhead"),
  ]);
  plots.cost = makePlot("plot-cost", "cost", "$ / M output tokens", [
    { label: "cost per token", stroke: COLORS.cost, width: 2.5 },
  ]);
  plots.memory = makePlot("plot-memory", "memory", "HBM per chip (GB)", [
    { label: "weights + KV", stroke: COLORS.memory, width: 2.5 },
  ]);
}

// ---- drawing the answers -------------------------------------------------------------------

function draw(name, body, q) {
  if (name === "curve") {
    state.curve = body;
    const x = body.batch;
    plots.time.setData([x, positive(body.tpot, 1e3),
      ...["t_compute", "t_weights", "t_kv", "t_comm", "t_overhead"].map((k) => positive(body[k], 1e3))]);
    plots.cost.setData([x, positive(body.cost_per_token, 1e6)]);
    plots.memory.setData([x, positive(body.memory_per_chip, 1e-9)]);
    const p = body.point;
    $("point-batch").textContent = fmtInt(p.batch);
    $("point-chips").textContent = fmtInt(q.chips);
    $("point-tpot").textContent = fmt(p.tpot * 1e3);
    $("point-cost").textContent = fmt(p.cost_per_token * 1e6);
    $("point-bottleneck").textContent = p.bottleneck;
    const fits = p.memory_per_chip <= body.memory_limit, meets = p.tpot <= body.tpot_slo;
    const check = $("point-check");
    check.textContent = fits && meets ? "fits HBM and meets the TPOT target"
      : [fits ? "" : `needs ${fmt(p.memory_per_chip / 1e9, 3)} GB of HBM per chip, over the ${fmt(body.memory_limit / 1e9, 3)} GB limit`,
        meets ? "" : "misses the TPOT target"].filter(Boolean).join("; ");
    check.className = fits && meets ? "ok" : "bad";
  } else if (name === "optimum") {
    state.optimum = body;
    $("opt-batch").textContent = body.feasible ? fmtInt(body.batch) : "none";
    $("opt-tpot").textContent = body.feasible ? fmt(body.tpot * 1e3) : "–";
    $("opt-cost").textContent = body.feasible ? fmt(body.cost_per_token * 1e6) : "–";
    $("opt-binding").textContent = body.feasible
      ? (body.binding.length ? body.binding.join(", ") : "none") : body.message;
    Object.values(plots).forEach((p) => p.redraw(false));
  } else if (name === "elasticities") {
    drawBars(body);
  } else if (name === "fleet") {
    drawFleet(body);
  }
}

function drawBars(body) {
  const box = $("bars");
  box.replaceChildren();
  if (!body.feasible || !body.bars.length) {
    box.textContent = body.message || "no elasticities";
    return;
  }
  const top = Math.max(...body.bars.map((b) => Math.abs(b.elasticity)));
  for (const b of body.bars) {
    const row = document.createElement("div");
    row.className = "bar-row";
    const name = document.createElement("span");
    name.className = "bar-name"; name.textContent = b.name;
    const track = document.createElement("span");
    track.className = "bar-track";
    const bar = document.createElement("span");
    const w = (50 * Math.abs(b.elasticity)) / top;
    bar.className = b.elasticity < 0 ? "bar neg" : "bar pos";
    bar.style.width = `${w}%`;
    bar.style.left = b.elasticity < 0 ? `${50 - w}%` : "50%";
    track.appendChild(bar);
    const val = document.createElement("span");
    val.className = "bar-value"; val.textContent = (b.elasticity > 0 ? "+" : "") + fmt(b.elasticity, 3);
    row.append(name, track, val);
    box.appendChild(row);
  }
}

function fleetRow(p, chosen) {
  const tr = document.createElement("tr");
  if (chosen) tr.className = "chosen";
  const ms = (d, k) => (d && d[k] !== undefined && d[k] !== null ? fmt(d[k] * 1e3, 3) : "–");
  const cells = p.feasible
    ? [p.mode + (chosen ? " ✓" : ""), p.pools.map((x) => x.describe).join("; "), fmtInt(p.chips),
      fmt(p.cost_per_hour, 4), fmt(p.cost_per_million_input, 3), fmt(p.cost_per_million_output, 3),
      ms(p.ttft, "0.99"), ms(p.tpot, "0.9"), p.binding || ""]
    : [p.mode, "infeasible", "", "", "", "", "", "", p.binding || ""];
  for (const c of cells) {
    const td = document.createElement("td");
    td.textContent = c;
    tr.appendChild(td);
  }
  return tr;
}

function drawFleet(body) {
  const tbody = $("fleet").querySelector("tbody");
  tbody.replaceChildren(fleetRow(body, true));
  if (body.alternative) tbody.appendChild(fleetRow(body.alternative, false));
  $("fleet-message").textContent = body.feasible ? "" : body.message;
}

// ---- start -----------------------------------------------------------------------------------

function fillSelect(id, items, value) {
  const sel = $(id);
  sel.replaceChildren(...items.map(([v, label]) => new Option(label, v, false, v === value)));
}

function fillEngines() {
  const hw = $("hardware").value, current = $("engine").value || choices.defaults.engine;
  const ok = choices.engines.filter((e) => e.hardware === null || e.hardware.includes(hw));
  const ids = ok.map((e) => e.id);
  fillSelect("engine", ok.map((e) => [e.id, e.label]), ids.includes(current) ? current : ids[0]);
}

async function start() {
  choices = await (await fetch("/api/choices")).json();
  const d = choices.defaults;
  fillSelect("hardware", choices.hardware.map((h) => [h, h]), d.hardware);
  fillSelect("model", choices.models.map((m) => [m, m]), d.model);
  fillEngines();
  for (const [id, s] of Object.entries(SLIDERS)) {
    $(id).value = String(s.fromValue(d[id]));
    $(id).addEventListener("input", update);
  }
  $("hardware").addEventListener("change", () => { fillEngines(); update(); });
  $("model").addEventListener("change", update);
  $("engine").addEventListener("change", update);
  initPlots();
  update();
}

window.addEventListener("DOMContentLoaded", start);
