// SVG charts drawn by hand: line charts over time (axes, legend, hover
// values, a data table for screen readers and copying), scatter plots with
// marked points and lines, stacked bar charts and heat maps. Each chart is a
// <figure class="chart" data-chart=NAME> whose data-points attribute counts
// the data points drawn; each point is an SVG element of class "pt" (line
// and scatter charts), "bar" or "cell", with its value in data-value.
//
// Labels that come from data (tenants, models, deployments) are always set
// as text, never as markup.
//
// Value axes are "nice": their ticks are multiples of 1, 2, 2.5 or 5 times
// a power of ten, and each label is its tick's value exactly (axisTicks;
// class "tick", the value in data-v), in percent or with the currency where
// the axis is one of ratios or money. Time charts (lineChart, timeBars)
// span the domain they are given, the range the page asked for, whatever
// the data cover, so that every chart of a range shares one time axis
// (data-t0 and data-t1 on the figure); a bucket still in progress (the
// current hour) is drawn apart as partial: a dashed, lighter segment or
// a lighter bar with a dashed edge, over a shaded band, named in the legend
// and the tooltip.

import * as f from "./format.js";

const NS = "http://www.w3.org/2000/svg";
const W = 600;
const H = 240;
const M = { top: 12, right: 16, bottom: 28, left: 58 };

// palette: colour-blind-safe (Okabe & Ito), darkened where needed for
// contrast on white.
export const palette = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#8a6d00", "#56b4e9", "#5d3a9b", "#000000", "#b2182b", "#4d9221"];

function svg(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}

function html(tag, attrs, text, parent) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, String(v));
  }
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (parent) parent.appendChild(e);
  return e;
}

// figure makes (or empties) the chart's figure inside parent.
export function figure(parent, name, title, subtitle, opts = {}) {
  const fig = html("figure", { class: "chart" + (opts.full ? " full" : ""), "data-chart": name }, null, parent);
  const cap = html("figcaption", {}, title, fig);
  if (subtitle) {
    cap.appendChild(document.createTextNode(" "));
    html("span", { class: "subtitle" }, subtitle, cap);
  }
  fig.dataset.points = "0";
  return fig;
}

function empty(fig, text) {
  html("div", { class: "empty" }, text || "No data in this range.", fig);
  fig.dataset.points = "0";
  fig.dataset.empty = "true";
}

// niceTicks returns about n round tick values covering [lo, hi]: multiples
// of step, which is 1, 2, 2.5 or 5 times a power of ten.
export function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1);
  const raw = (hi - lo) / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const r = raw / mag;
  const step = Number(((r <= 1 ? 1 : r <= 2 ? 2 : r <= 2.5 ? 2.5 : r <= 5 ? 5 : 10) * mag).toPrecision(12));
  const k0 = Math.floor(lo / step);
  const k1 = Math.ceil(hi / step);
  const ticks = [];
  for (let k = k0; k <= k1; k++) ticks.push(Number((k * step).toPrecision(12)));
  return { ticks, lo: ticks[0], hi: ticks[ticks.length - 1], step };
}

// axisTicks are the ticks of a value axis over [lo, hi] with their labels:
// kind "number" (compact: 1.5k), "percent" (ratios: 0.025 reads 2.5 %) or
// "money" (in currency cur: $1.5k). Every label is its tick exactly, with
// the decimals the step needs, so no two read alike.
export function axisTicks(lo, hi, n, kind = "number", cur = "") {
  const t = niceTicks(lo, hi, n);
  return { ...t, labels: t.ticks.map((v) => f.tick(v, t.step, kind, cur)) };
}

// axisTitle is the title of a value axis: the unit given, or the
// currency's code on a money axis.
function axisTitle(kind, cur, label) {
  if (label) return kind === "money" && cur && !label.includes(cur) ? `${label} (${cur})` : label;
  return kind === "money" ? cur || "USD" : "";
}

const MIN = 60e3;
const HOUR = 3600e3;
const DAY = 24 * HOUR;
const timeSteps = [MIN, 5 * MIN, 10 * MIN, 15 * MIN, 30 * MIN, HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY, 28 * DAY];

// timeTicks returns about n round instants in [t0, t1] (UTC).
export function timeTicks(t0, t1, n = 6) {
  const span = t1 - t0;
  const step = timeSteps.find((s) => span / s <= n) || timeSteps[timeSteps.length - 1];
  const ticks = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push(t);
  return { ticks, step };
}

function timeLabel(t, tickStep, span) {
  const d = new Date(t);
  const hm = `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
  if (tickStep >= DAY) return f.time(t, "hour").split(" ").slice(0, 2).join(" ");
  if (span > DAY) return d.getUTCHours() === 0 && d.getUTCMinutes() === 0 ? f.time(t, "hour").split(" ").slice(0, 2).join(" ") : hm;
  return hm;
}

// frame draws the plot area's axes and grid. yt is the value axis
// (axisTicks); the x axis is xt, axisTicks too (numbers: class "tick",
// data-v) or {ticks, label(t)} (times: class "tick-t", data-t).
function frame(root, xs, ys, xt, yt, labels = {}) {
  const grid = svg("g", { class: "grid" }, root);
  const axis = svg("g", { class: "axis" }, root);
  yt.ticks.forEach((v, i) => {
    const y = ys(v);
    svg("line", { x1: M.left, x2: W - M.right, y1: y, y2: y }, grid);
    const t = svg("text", { class: "tick tick-y", x: M.left - 6, y: y + 4, "text-anchor": "end", "data-v": v }, axis);
    t.textContent = yt.labels[i];
  });
  xt.ticks.forEach((v, i) => {
    const x = xs(v);
    svg("line", { x1: x, x2: x, y1: H - M.bottom, y2: H - M.bottom + 4 }, axis);
    const attrs = xt.labels ? { class: "tick tick-x", "data-v": v } : { class: "tick-t", "data-t": v };
    const t = svg("text", { ...attrs, x, y: H - M.bottom + 16, "text-anchor": "middle" }, axis);
    t.textContent = xt.labels ? xt.labels[i] : xt.label(v);
  });
  svg("line", { x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }, axis);
  svg("line", { x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom }, axis);
  if (labels.x) {
    const t = svg("text", { class: "axis-title-x", x: W - M.right, y: H - 2, "text-anchor": "end" }, axis);
    t.textContent = labels.x;
  }
  if (labels.y) {
    const t = svg("text", { class: "axis-title", x: M.left + 4, y: M.top - 2, "text-anchor": "start" }, axis);
    t.textContent = labels.y;
  }
}

let clipCount = 0;

// clip adds a clip path of the plot area, margin units wider (so that
// points on its edges show whole), and returns its url() reference.
function clip(root, x, y, w, h, margin = 4) {
  const id = `plot-clip-${++clipCount}`;
  const cp = svg("clipPath", { id }, svg("defs", {}, root));
  svg("rect", { x: x - margin, y: y - margin, width: w + 2 * margin, height: h + 2 * margin }, cp);
  return `url(#${id})`;
}

// partialBand shades the part of the plot from the partial bucket's start
// to the domain's end and names it.
function partialBand(root, xs, partial, t1) {
  const x = Math.max(M.left, xs(partial.t));
  const x2 = Math.min(W - M.right, xs(t1));
  if (!(x2 > x)) return;
  const band = svg("rect", { class: "partial-band", x, y: M.top, width: x2 - x, height: H - M.top - M.bottom }, root);
  svg("title", {}, band).textContent = `${partial.label}, in progress`;
}

// timeAxis sets the figure's time domain (data-t0, data-t1) and returns
// the time scale and ticks of [t0, t1].
function timeAxis(fig, t0, t1) {
  if (!(t1 > t0)) t1 = t0 + HOUR;
  fig.dataset.t0 = String(t0);
  fig.dataset.t1 = String(t1);
  fig.dataset.x0 = String(M.left); // the plot's left and right, in the SVG's units
  fig.dataset.x1 = String(W - M.right);
  const xs = (t) => M.left + ((t - t0) / (t1 - t0)) * (W - M.left - M.right);
  const tt = timeTicks(t0, t1);
  return { t0, t1, xs, xt: { ticks: tt.ticks, label: (t) => timeLabel(t, tt.step, t1 - t0) } };
}

function legend(fig, items) {
  if (items.length < 1) return;
  const ul = html("ul", { class: "legend" }, null, fig);
  for (const it of items) {
    const li = html("li", {}, null, ul);
    const sw = html("span", { class: "swatch " + (it.shape || ""), "aria-hidden": "true" }, null, li);
    if (it.color) sw.style.background = it.color;
    if (it.shape === "partial-line" || it.shape === "partial-bar") li.className = "partial";
    html("span", {}, it.name, li);
  }
}

// tooltip shows rows [{color, text}] under a title near the pointer.
const tip = {
  show(ev, title, rows) {
    const el = document.getElementById("tooltip");
    if (!el) return;
    el.replaceChildren();
    html("div", { class: "t" }, title, el);
    for (const r of rows) {
      const row = html("div", { class: "row" }, null, el);
      if (r.color) {
        const sw = html("span", { class: "swatch" }, null, row);
        sw.style.background = r.color;
      }
      html("span", {}, r.text, row);
    }
    el.hidden = false;
    const pad = 14;
    const w = el.offsetWidth;
    const h = el.offsetHeight;
    let x = ev.clientX + pad;
    let y = ev.clientY + pad;
    if (x + w > window.innerWidth) x = ev.clientX - w - pad;
    if (y + h > window.innerHeight) y = ev.clientY - h - pad;
    el.style.left = Math.max(0, x) + "px";
    el.style.top = Math.max(0, y) + "px";
  },
  hide() {
    const el = document.getElementById("tooltip");
    if (el) el.hidden = true;
  },
};

// pointerX is the pointer's x in the SVG's coordinates.
function pointer(root, ev) {
  const r = root.getBoundingClientRect();
  return { x: ((ev.clientX - r.left) / r.width) * W, y: ((ev.clientY - r.top) / r.height) * H };
}

function root(fig, label) {
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, preserveAspectRatio: "xMidYMid meet" }, fig);
}

// dataTable adds a "Show data" disclosure that builds a table on first open.
function dataTable(fig, head, rows) {
  const d = html("details", {}, null, fig);
  html("summary", {}, "Show data", d);
  d.addEventListener("toggle", () => {
    if (!d.open || d.querySelector("table")) return;
    const t = html("table", { class: "data" }, null, d);
    const tr = html("tr", {}, null, html("thead", {}, null, t));
    head.forEach((h) => html("th", { scope: "col" }, h, tr));
    const tb = html("tbody", {}, null, t);
    rows().forEach((r) => {
      const row = html("tr", {}, null, tb);
      r.forEach((c) => html("td", {}, c, row));
    });
  });
}

// Shared hover: the time charts of one panel (the figures under one
// parent) show one instant together. A hover over any of them marks its
// instant on all of them: a dashed guide at that time, the points of that
// step enlarged, data-hover-t on each figure (empty when none), so that a
// TTFT spike reads against the KV cache and the queue of the same moment.

// hoverGuide adds the guide line of a time chart (root r, time scale xs
// over [t0, t1]) and returns {share(t)}: share shows instant t (ms; null
// hides it) on every time chart beside fig. mark(t) highlights the
// chart's own elements at t (null: none).
function hoverGuide(fig, r, xs, t0, t1, mark) {
  const guide = svg("line", { class: "guide hover-guide", y1: M.top, y2: H - M.bottom, visibility: "hidden" }, r);
  fig.dataset.hoverT = "";
  fig.showInstant = (t) => {
    const inside = t !== null && t >= t0 && t <= t1;
    guide.setAttribute("visibility", inside ? "visible" : "hidden");
    if (inside) {
      guide.setAttribute("x1", xs(t));
      guide.setAttribute("x2", xs(t));
    }
    fig.dataset.hoverT = inside ? String(t) : "";
    mark(inside ? t : null);
  };
  return {
    share(t) {
      const peers = fig.parentElement ? fig.parentElement.querySelectorAll("figure.chart") : [fig];
      for (const p of peers) if (p.showInstant) p.showInstant(t);
    },
  };
}

// MAX_SERIES bounds the series a line chart draws: with more (a grouping
// by deployment over thousands of deployments), it draws the largest by
// peak and its legend says how many more there are.
export const MAX_SERIES = 12;

// largestSeries keeps the max series with the highest peaks (the first on
// a tie), in their order, and counts the rest.
export function largestSeries(series, max = MAX_SERIES) {
  if (series.length <= max) return { shown: series, more: 0 };
  const peak = (s) => s.points.reduce((m, p) => Math.max(m, p[1]), -Infinity);
  const keep = new Set(series.map((s, i) => [peak(s), i]).sort((a, b) => b[0] - a[0] || a[1] - b[1]).slice(0, max).map(([, i]) => i));
  return { shown: series.filter((_, i) => keep.has(i)), more: series.length - max };
}

// lineChart draws series of [t, value] points over the time domain
// [t0, t1] (points outside it are clipped): opts {series: [{name, points,
// color?, dashed?, noPoints?}], t0, t1, step, yFormat, yAxis? ("number",
// "percent", "money"), currency?, yMax?, yMin?, yLabel?, marks?: [{t,
// label}] (vertical lines), partial?: {t, label} (the bucket from t on is
// in progress)}. At most MAX_SERIES series are drawn: the largest by peak,
// the legend naming how many more the answer holds.
export function lineChart(fig, opts) {
  const { shown: series, more } = largestSeries(opts.series.filter((s) => s.points.length > 0));
  const yFormat = opts.yFormat || f.num;
  const n = series.reduce((a, s) => a + (s.noPoints ? 0 : s.points.length), 0);
  if (n === 0) return empty(fig);
  let lo = 0;
  let hi = 0;
  for (const s of series) for (const [, v] of s.points) hi = Math.max(hi, v);
  if (opts.yMax !== undefined) hi = Math.max(hi, opts.yMax);
  if (opts.yMin !== undefined) {
    lo = opts.yMin;
    for (const s of series) for (const [, v] of s.points) lo = Math.min(lo, v);
  }
  const kind = opts.yAxis || "number";
  const yt = axisTicks(lo, hi, 4, kind, opts.currency);
  const { t0, t1, xs, xt } = timeAxis(fig, opts.t0, opts.t1);
  const ys = (v) => H - M.bottom - ((v - yt.lo) / (yt.hi - yt.lo)) * (H - M.top - M.bottom);
  const r = root(fig, `${fig.querySelector("figcaption").textContent}: ${series.length} series, ${n} points`);
  frame(r, xs, ys, xt, yt, { y: axisTitle(kind, opts.currency, opts.yLabel) });
  const partial = opts.partial;
  const isPartial = (t) => !!partial && t >= partial.t;
  const anyPartial = series.some((s) => !s.noPoints && s.points.some(([t]) => isPartial(t)));
  if (anyPartial) {
    partialBand(r, xs, partial, t1);
    fig.dataset.partial = String(partial.t);
  }
  for (const m of opts.marks || []) {
    svg("line", { class: "mark", x1: xs(m.t), x2: xs(m.t), y1: M.top, y2: H - M.bottom }, r);
    const t = svg("text", { class: "mark-label", x: xs(m.t) - 4, y: M.top + 10, "text-anchor": "end" }, r);
    t.textContent = m.label;
  }
  const plot = svg("g", { "clip-path": clip(r, M.left, M.top, W - M.left - M.right, H - M.top - M.bottom) }, r);
  const times = new Set();
  const path = (pts) => pts.map(([t, v], k) => `${k ? "L" : "M"}${xs(t).toFixed(1)},${ys(v).toFixed(1)}`).join("");
  series.forEach((s, i) => {
    s.color = s.color || palette[i % palette.length];
    const pts = [...s.points].sort((a, b) => a[0] - b[0]);
    s.byT = new Map(pts);
    // The complete buckets solid; from the last of them on into the
    // partial ones, a lighter dashed segment.
    const cut = s.noPoints ? pts.length : pts.findIndex(([t]) => isPartial(t));
    const done = cut < 0 ? pts : pts.slice(0, cut);
    if (done.length) svg("path", { class: "series" + (s.dashed ? " dashed" : ""), d: path(done), stroke: s.color }, plot);
    if (cut >= 0 && cut < pts.length) {
      svg("path", { class: "series-partial", d: path(pts.slice(Math.max(0, cut - 1))), stroke: s.color, "data-series": s.name }, plot);
    }
    const g = svg("g", { fill: s.color }, plot);
    for (const [t, v] of pts) {
      times.add(t);
      if (s.noPoints) continue;
      const c = svg("circle", { class: "pt", cx: xs(t).toFixed(1), cy: ys(v).toFixed(1), r: pts.length > 120 ? 1.6 : 2.6, "data-t": t, "data-v": v, "data-series": s.name }, g);
      if (isPartial(t)) {
        c.classList.add("partial");
        c.setAttribute("stroke", s.color);
      }
    }
  });
  fig.dataset.points = String(n);
  fig.dataset.series = String(series.length);
  fig.dataset.moreSeries = String(more);
  const items = series.map((s) => ({ name: s.name, color: s.color }));
  if (anyPartial) items.push({ name: `${partial.label} (in progress)`, shape: "partial-line" });
  legend(fig, items);
  if (more > 0) {
    const ul = fig.querySelector("ul.legend");
    html("li", { class: "more" }, `and ${f.count(more)} more series, smaller at their peak, not drawn`, ul);
  }

  // Hover: the values of every series at the nearest instant, and the
  // same instant marked on every time chart beside it (shareHover).
  const sorted = [...times].sort((a, b) => a - b);
  const timeText = (t) => f.time(t, opts.step) + (isPartial(t) ? ` · ${partial.label}, in progress` : "");
  const guide = hoverGuide(fig, r, xs, t0, t1, (t) => {
    for (const c of plot.querySelectorAll("circle.pt.hot")) c.classList.remove("hot");
    if (t !== null) for (const c of plot.querySelectorAll(`circle.pt[data-t="${t}"]`)) c.classList.add("hot");
  });
  const overlay = svg("rect", { class: "overlay", x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom }, r);
  overlay.addEventListener("pointermove", (ev) => {
    const { x } = pointer(r, ev);
    const t = t0 + ((x - M.left) / (W - M.left - M.right)) * (t1 - t0);
    let best = sorted[0];
    for (const c of sorted) if (Math.abs(c - t) < Math.abs(best - t)) best = c;
    guide.share(best);
    const rows = series.filter((s) => s.byT.has(best)).map((s) => ({ color: s.color, text: `${s.name}: ${yFormat(s.byT.get(best))}` }));
    tip.show(ev, timeText(best), rows);
  });
  overlay.addEventListener("pointerleave", () => {
    guide.share(null);
    tip.hide();
  });
  dataTable(fig, ["Time (UTC)", ...series.map((s) => s.name)], () =>
    sorted.map((t) => [timeText(t), ...series.map((s) => (s.byT.has(t) ? yFormat(s.byT.get(t)) : ""))]),
  );
}

// stepMs is the length of a step ("minute", "hour", "day") in ms.
export function stepMs(step) {
  return { minute: MIN, hour: HOUR, day: DAY }[step] || HOUR;
}

// timeBars draws stacked bars over the time domain [t0, t1], each bar
// spanning its bucket [t, t + step) on the same time axis as lineChart
// (bars outside the domain are clipped): opts {t0, t1, step, times: [t],
// stacks: [{name, color?, values: [number per time]}], yFormat, yAxis?,
// currency?, yLabel?, partial?: {t, label}}.
export function timeBars(fig, opts) {
  const times = opts.times;
  const stacks = opts.stacks;
  if (times.length === 0) return empty(fig);
  const yFormat = opts.yFormat || f.num;
  const kind = opts.yAxis || "number";
  const totals = times.map((_, i) => stacks.reduce((a, s) => a + (s.values[i] || 0), 0));
  const yt = axisTicks(0, Math.max(...totals, 0), 4, kind, opts.currency);
  const { t1, xs, xt } = timeAxis(fig, opts.t0, opts.t1);
  const ys = (v) => H - M.bottom - ((v - yt.lo) / (yt.hi - yt.lo)) * (H - M.top - M.bottom);
  const r = root(fig, `${fig.querySelector("figcaption").textContent}: ${times.length} bars`);
  frame(r, xs, ys, xt, yt, { y: axisTitle(kind, opts.currency, opts.yLabel) });
  const partial = opts.partial;
  const isPartial = (t) => !!partial && t >= partial.t;
  const anyPartial = times.some(isPartial);
  if (anyPartial) {
    partialBand(r, xs, partial, t1);
    fig.dataset.partial = String(partial.t);
  }
  const plot = svg("g", { "clip-path": clip(r, M.left, M.top, W - M.left - M.right, H - M.top - M.bottom, 0) }, r);
  stacks.forEach((s, i) => (s.color = s.color || palette[i % palette.length]));
  const width = stepMs(opts.step);
  // The shared instant: a guide at the bucket's middle instant's start,
  // its bars outlined.
  const guide = hoverGuide(fig, r, xs, opts.t0, t1, (t) => {
    for (const b of plot.querySelectorAll("rect.bar.hot")) b.classList.remove("hot");
    if (t === null) return;
    for (const b of plot.querySelectorAll("rect.bar")) {
      const bt = Number(b.dataset.t);
      if (t >= bt && t < bt + width) b.classList.add("hot");
    }
  });
  let n = 0;
  times.forEach((t, i) => {
    const x0 = xs(t);
    const w = xs(t + width) - x0;
    const pad = Math.min(2, w * 0.15);
    const g = svg("g", {}, plot);
    let acc = 0;
    for (const s of stacks) {
      const v = s.values[i] || 0;
      const y0 = ys(acc);
      const y1 = ys(acc + v);
      acc += v;
      const bar = svg("rect", {
        class: "bar" + (isPartial(t) ? " partial" : ""), x: (x0 + pad).toFixed(2), y: y1.toFixed(2), width: Math.max(0.5, w - 2 * pad).toFixed(2), height: Math.max(0, y0 - y1).toFixed(2),
        fill: s.color, "data-t": t, "data-v": v, "data-series": s.name,
      }, g);
      if (isPartial(t)) bar.setAttribute("stroke", s.color);
      bar.dataset.category = f.time(t, opts.step);
      n++;
    }
    const title = f.time(t, opts.step) + (isPartial(t) ? ` · ${partial.label}, in progress` : "");
    g.addEventListener("pointermove", (ev) => {
      guide.share(t);
      tip.show(ev, title, [...stacks.map((s) => ({ color: s.color, text: `${s.name}: ${yFormat(s.values[i] || 0)}` })), ...(stacks.length > 1 ? [{ text: `total: ${yFormat(totals[i])}` }] : [])]);
    });
    g.addEventListener("pointerleave", () => {
      guide.share(null);
      tip.hide();
    });
  });
  fig.dataset.points = String(n);
  const items = stacks.map((s) => ({ name: s.name, color: s.color, shape: "box" }));
  if (anyPartial) items.push({ name: `${partial.label} (in progress)`, shape: "partial-bar" });
  if (stacks.length > 1 || stacks[0].name) legend(fig, items);
  dataTable(fig, ["Time (UTC)", ...stacks.map((s) => s.name)], () =>
    times.map((t, i) => [f.time(t, opts.step) + (isPartial(t) ? ` (${partial.label})` : ""), ...stacks.map((s) => yFormat(s.values[i] || 0))]),
  );
}

// scatterChart draws points {x, y, label?, group?}: opts {groups: [{name,
// color}], xFormat, yFormat, xLabel, yLabel, yAxis? (as lineChart's), yMin?,
// yMax?, marks?: [{x, label}], ring?: {x, y, label} (a point circled),
// line?: [[x, y], ...]}.
export function scatterChart(fig, opts) {
  const pts = opts.points;
  if (pts.length === 0) return empty(fig, opts.emptyText);
  const xFormat = opts.xFormat || f.num;
  const yFormat = opts.yFormat || f.num;
  let xlo = 0;
  let xhi = 0;
  let ylo = opts.yMin !== undefined ? opts.yMin : 0;
  let yhi = opts.yMax !== undefined ? opts.yMax : 0;
  for (const p of pts) {
    xhi = Math.max(xhi, p.x);
    ylo = Math.min(ylo, p.y);
    yhi = Math.max(yhi, p.y);
  }
  for (const m of opts.marks || []) xhi = Math.max(xhi, m.x);
  const xt = axisTicks(xlo, xhi * 1.02, 5);
  const yt = axisTicks(ylo, yhi, 4, opts.yAxis || "number", opts.currency);
  const xs = (v) => M.left + ((v - xt.lo) / (xt.hi - xt.lo)) * (W - M.left - M.right);
  const ys = (v) => H - M.bottom - ((v - yt.lo) / (yt.hi - yt.lo)) * (H - M.top - M.bottom);
  const r = root(fig, `${fig.querySelector("figcaption").textContent}: ${pts.length} points`);
  frame(r, xs, ys, xt, yt, { x: opts.xLabel, y: opts.yLabel });
  for (const m of opts.marks || []) {
    svg("line", { class: "mark", x1: xs(m.x), x2: xs(m.x), y1: M.top, y2: H - M.bottom }, r);
    const t = svg("text", { class: "mark-label", x: xs(m.x) - 4, y: M.top + 10, "text-anchor": "end" }, r);
    t.textContent = m.label;
  }
  if (opts.hline !== undefined) {
    svg("line", { class: "guide", x1: M.left, x2: W - M.right, y1: ys(opts.hline.y), y2: ys(opts.hline.y) }, r);
    const t = svg("text", { x: W - M.right, y: ys(opts.hline.y) - 4, "text-anchor": "end" }, r);
    t.textContent = opts.hline.label;
  }
  const groups = opts.groups || [{ name: "", color: palette[0] }];
  const colorOf = new Map(groups.map((g, i) => [g.name, g.color || palette[i % palette.length]]));
  for (const p of pts) {
    const c = svg("circle", { class: "pt", cx: xs(p.x).toFixed(1), cy: ys(p.y).toFixed(1), r: 3, "data-x": p.x, "data-v": p.y }, r);
    c.setAttribute("fill", colorOf.get(p.group || "") || palette[0]);
    c.setAttribute("fill-opacity", "0.75");
  }
  if (opts.ring) {
    const c = svg("circle", { class: "sustainable", cx: xs(opts.ring.x), cy: ys(opts.ring.y), r: 8 }, r);
    svg("title", {}, c).textContent = opts.ring.label;
  }
  fig.dataset.points = String(pts.length);
  if (groups.length > 1 || groups[0].name) legend(fig, groups.map((g) => ({ name: g.name, color: colorOf.get(g.name), shape: "dot" })));
  const overlay = svg("rect", { class: "overlay", x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom }, r);
  overlay.addEventListener("pointermove", (ev) => {
    const { x, y } = pointer(r, ev);
    let best = null;
    let bd = 400; // within 20 units
    for (const p of pts) {
      const d = (xs(p.x) - x) ** 2 + (ys(p.y) - y) ** 2;
      if (d < bd) {
        bd = d;
        best = p;
      }
    }
    if (!best) return tip.hide();
    tip.show(ev, best.label || "", [
      { text: `${opts.xLabel || "x"}: ${xFormat(best.x)}` },
      { text: `${opts.yLabel || "y"}: ${yFormat(best.y)}` },
    ]);
  });
  overlay.addEventListener("pointerleave", () => tip.hide());
  dataTable(fig, ["Point", opts.xLabel || "x", opts.yLabel || "y"], () => pts.map((p) => [p.label || "", xFormat(p.x), yFormat(p.y)]));
}

// barChart draws stacked bars by category: opts {categories: [label],
// stacks: [{name, color?, values: [number per category]}], yFormat, yAxis?
// and currency? (the value axis, as lineChart's), valueLabel?, horizontal?}.
// Bars over time are timeBars.
export function barChart(fig, opts) {
  const cats = opts.categories;
  const stacks = opts.stacks;
  if (cats.length === 0) return empty(fig);
  const yFormat = opts.yFormat || f.num;
  const totals = cats.map((_, i) => stacks.reduce((a, s) => a + (s.values[i] || 0), 0));
  const kind = opts.yAxis || "number";
  const vt = axisTicks(0, Math.max(...totals, 0), 4, kind, opts.currency);
  const title = axisTitle(kind, opts.currency, opts.valueLabel);
  const horizontal = !!opts.horizontal;
  const left = horizontal ? 130 : M.left;
  const plotW = W - left - M.right;
  const height = horizontal ? Math.max(H, M.top + M.bottom + cats.length * 22) : H;
  const plotH = height - M.top - M.bottom;
  const r = svg("svg", { viewBox: `0 0 ${W} ${height}`, role: "img", "aria-label": `${fig.querySelector("figcaption").textContent}: ${cats.length} bars` }, fig);
  const band = (horizontal ? plotH : plotW) / cats.length;
  const vs = (v) => ((v - vt.lo) / (vt.hi - vt.lo)) * (horizontal ? plotW : plotH);
  const grid = svg("g", { class: "grid" }, r);
  const axis = svg("g", { class: "axis" }, r);
  vt.ticks.forEach((v, k) => {
    if (horizontal) {
      const x = left + vs(v);
      svg("line", { x1: x, x2: x, y1: M.top, y2: height - M.bottom }, grid);
      svg("text", { class: "tick tick-x", x, y: height - M.bottom + 16, "text-anchor": "middle", "data-v": v }, axis).textContent = vt.labels[k];
    } else {
      const y = H - M.bottom - vs(v);
      svg("line", { x1: left, x2: W - M.right, y1: y, y2: y }, grid);
      svg("text", { class: "tick tick-y", x: left - 6, y: y + 4, "text-anchor": "end", "data-v": v }, axis).textContent = vt.labels[k];
    }
  });
  if (title) {
    const attrs = horizontal
      ? { class: "axis-title", x: W - M.right, y: M.top - 2, "text-anchor": "end" }
      : { class: "axis-title", x: left + 4, y: M.top - 2, "text-anchor": "start" };
    svg("text", attrs, axis).textContent = title;
  }
  svg("line", horizontal ? { x1: left, x2: left, y1: M.top, y2: height - M.bottom } : { x1: left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }, axis);
  stacks.forEach((s, i) => (s.color = s.color || palette[i % palette.length]));
  // Label every k-th bar so that the labels do not overlap.
  const label = opts.categoryTick || ((c) => c);
  const longest = Math.max(...cats.map((c) => Math.min(18, label(c).length)));
  const every = horizontal ? 1 : Math.max(1, Math.ceil((longest * 6.5 + 8) / band));
  let n = 0;
  cats.forEach((c, i) => {
    let acc = 0;
    const g = svg("g", {}, r);
    for (const s of stacks) {
      const v = s.values[i] || 0;
      const a = vs(acc);
      const b = vs(acc + v);
      acc += v;
      const pad = Math.min(4, band * 0.15);
      const attrs = horizontal
        ? { x: left + a, y: M.top + i * band + pad, width: Math.max(0, b - a), height: Math.max(1, band - 2 * pad) }
        : { x: left + i * band + pad, y: H - M.bottom - b, width: Math.max(1, band - 2 * pad), height: Math.max(0, b - a) };
      svg("rect", { class: "bar", ...attrs, fill: s.color, "data-v": v, "data-series": s.name, "data-category": c }, g);
      n++;
    }
    if (i % every === 0) {
      const t = horizontal
        ? svg("text", { x: left - 6, y: M.top + (i + 0.5) * band + 4, "text-anchor": "end" }, axis)
        : svg("text", { x: left + (i + 0.5) * band, y: H - M.bottom + 16, "text-anchor": "middle" }, axis);
      const text = label(c);
      t.textContent = text.length > 18 ? text.slice(0, 17) + "…" : text;
    }
    g.addEventListener("pointermove", (ev) =>
      tip.show(ev, c, [...stacks.map((s) => ({ color: s.color, text: `${s.name}: ${yFormat(s.values[i] || 0)}` })), ...(stacks.length > 1 ? [{ text: `total: ${yFormat(totals[i])}` }] : [])]),
    );
    g.addEventListener("pointerleave", () => tip.hide());
  });
  fig.dataset.points = String(n);
  if (stacks.length > 1 || stacks[0].name) legend(fig, stacks.map((s) => ({ name: s.name, color: s.color, shape: "box" })));
  dataTable(fig, [opts.categoryLabel || "", ...stacks.map((s) => s.name)], () => cats.map((c, i) => [c, ...stacks.map((s) => yFormat(s.values[i] || 0))]));
}

// heatMap draws rows × columns of values: opts {rows: [label], cols:
// [label], values: [[number]], format, note?: (r, c) => string}.
export function heatMap(fig, opts) {
  const { rows, cols, values } = opts;
  const fmt = opts.format || f.num;
  let max = 0;
  for (const row of values) for (const v of row) max = Math.max(max, v || 0);
  if (rows.length === 0) return empty(fig);
  const left = 44;
  const top = 16;
  const cw = (W - left - M.right) / cols.length;
  const ch = Math.min(26, (H - top - 30) / rows.length);
  const height = top + ch * rows.length + 40;
  const r = svg("svg", { viewBox: `0 0 ${W} ${height}`, role: "img", "aria-label": `${fig.querySelector("figcaption").textContent}: ${rows.length} by ${cols.length} cells` }, fig);
  const shade = (v) => {
    // White to dark blue, by the square root so that low loads show.
    const k = max > 0 ? Math.sqrt((v || 0) / max) : 0;
    const c = (a, b) => Math.round(a + (b - a) * k);
    return `rgb(${c(247, 8)},${c(251, 48)},${c(255, 107)})`;
  };
  let n = 0;
  rows.forEach((rl, i) => {
    svg("text", { x: left - 6, y: top + i * ch + ch / 2 + 4, "text-anchor": "end" }, r).textContent = rl;
    cols.forEach((cl, j) => {
      const v = values[i][j] || 0;
      const cell = svg("rect", { class: "cell", x: left + j * cw, y: top + i * ch, width: cw, height: ch, fill: shade(v), "data-v": v }, r);
      cell.addEventListener("pointermove", (ev) => tip.show(ev, `${rl} ${cl}`, [{ text: fmt(v) }, ...(opts.note ? [{ text: opts.note(i, j) }] : [])]));
      cell.addEventListener("pointerleave", () => tip.hide());
      n++;
    });
  });
  cols.forEach((cl, j) => {
    if (j % 3 === 0) svg("text", { x: left + j * cw + cw / 2, y: top - 4, "text-anchor": "middle" }, r).textContent = cl;
  });
  // Scale: min to max.
  const ly = top + ch * rows.length + 14;
  const steps = 10;
  for (let k = 0; k < steps; k++) {
    svg("rect", { x: left + k * 16, y: ly, width: 16, height: 10, fill: shade((max * (k + 0.5) ** 2) / steps ** 2) }, r);
  }
  svg("text", { x: left + steps * 16 + 6, y: ly + 9 }, r).textContent = `0 – ${fmt(max)}`;
  fig.dataset.points = String(n);
  dataTable(fig, ["", ...cols], () => rows.map((rl, i) => [rl, ...cols.map((_, j) => fmt(values[i][j] || 0))]));
}
