// The capacity tab (finance and admin keys): the capacity report of
// GET /v1/reports/capacity for the range, one unit at a time (the fleet or
// a deployment): its cards, the findings, attainment against load with the
// sustainable point marked, utilization against tokens/s per GPU, the
// weekday × hour load profile, busy/idle cost per day and the forecast of
// the peak. The same report downloads as HTML or CSV.

import * as api from "./api.js";
import * as f from "./format.js";
import { card, panelError, table, fitValues } from "./cards.js";
import { figure, lineChart, scatterChart, timeBars, heatMap, palette } from "./charts.js";
import { telemetryCharts, gb } from "./gpu.js";

const WEEK = 7 * 24 * 3600e3;

// OTHERS is the picker's value of the report's others (the units beyond
// its max_units, summed): no unit name holds a NUL, so it names no unit.
export const OTHERS = "\u0000others";

// othersNote says how many units the report summed into its others ("":
// it lists every unit).
export function othersNote(report) {
  const n = Number(report.units_in_others || 0);
  if (!n || !report.others) return "";
  const noun = { model: "models", gpu_type: "GPU types" }[report.group_by] || "deployments";
  return `${f.count(n)} ${noun} beyond the ${f.count(report.max_units)} largest (by GPU time) are summed into ${report.others.name}; pick it below the units, or download the report for its list.`;
}

// pickerOptions are the unit picker's [label, value] pairs: the fleet, the
// units of the report (at most its max_units) and the others.
export function pickerOptions(report) {
  const out = [["fleet (all)", ""]];
  for (const u of report.units || []) out.push([u.name, u.name]);
  if (report.others) out.push([`${report.others.name}: ${f.count(report.units_in_others)} summed`, OTHERS]);
  return out;
}

// params are the report's query parameters for the range.
export function params(range) {
  return { start: api.iso(range.hourStart), end: api.iso(range.hourEnd) };
}

// fetchReport returns the report of the range.
export async function fetchReport(ctx) {
  const answer = await api.get(ctx.key, "/v1/reports/capacity", params(ctx.range));
  return answer.report;
}

// draw shows unit `name` (or the fleet) of report into the tab's elements.
export function draw(report, name, els) {
  const { cards, findings, charts, units, note } = els;
  cards.replaceChildren();
  findings.replaceChildren();
  charts.replaceChildren();
  units.replaceChildren();
  const text = report.not_enough_data ? `Not enough data: ${report.not_enough_data}` : othersNote(report);
  note.hidden = !text;
  note.textContent = text;
  const unit = (name === OTHERS ? report.others : (report.units || []).find((u) => u.name === name)) || report.fleet;
  if (!unit) return;
  const cur = report.currency;
  drawCards(cards, unit, report, cur);
  for (const fd of report.findings || []) {
    const li = document.createElement("li");
    li.className = `sev-${fd.severity}`;
    li.dataset.kind = fd.kind;
    const u = document.createElement("span");
    u.className = "unit";
    u.textContent = fd.unit;
    const k = document.createElement("span");
    k.className = "kind";
    k.textContent = fd.kind.replaceAll("_", " ");
    li.append(u, k, document.createTextNode(fd.text));
    findings.appendChild(li);
  }
  drawCharts(charts, unit, report, cur);
  drawUnits(units, report, cur);
  fitValues(cards);
}

function drawCards(el, u, report, cur) {
  card(el, { name: "cap_gpus", title: "GPUs", raw: u.mean_gpus, text: `${f.num(u.mean_gpus)} mean`, sub: `${f.count(u.max_gpus)} at most, ${f.num(u.gpu_hours)} GPU-hours` });
  card(el, { name: "cap_utilization", title: "Utilization", raw: u.utilization, text: f.pct(u.utilization, 1), sub: `p95 of hours ${f.pct(u.p95_utilization, 1)}` });
  card(el, { name: "cap_idle_share", title: "Idle", raw: u.idle_share, text: f.pct(u.idle_share, 1), sub: `${f.num(u.idle_gpu_hours)} of ${f.num(u.gpu_hours)} GPU-hours` });
  card(el, { name: "cap_cost", title: "GPU cost", raw: u.cost ? u.cost.amount : "", text: f.money(u.cost && u.cost.amount, cur), sub: `idle ${f.money(u.idle_cost && u.idle_cost.amount, cur)}, busy ${f.money(u.busy_cost && u.busy_cost.amount, cur)}` });
  card(el, { name: "cap_tokens_per_gpu", title: "Tokens/s per GPU", raw: u.tokens_per_second_per_gpu, text: f.num(u.tokens_per_second_per_gpu), sub: `${f.count(u.requests)} requests, attainment ${f.pct(u.attainment)}` });
  if (u.peak) {
    card(el, { name: "cap_peak", title: "Peak hour", raw: u.peak.tokens_per_second, text: `${f.num(u.peak.tokens_per_second)} tokens/s`, sub: `${f.time(api.ts(u.peak.start))} UTC, ${f.num(u.peak.tokens_per_second_per_gpu)} per GPU` });
  } else {
    card(el, { name: "cap_peak", title: "Peak hour", raw: "", text: "–", sub: "no traffic" });
  }
  const s = u.sustainable || {};
  card(el, {
    name: "cap_sustainable", title: "Sustainable tokens/s per GPU", raw: s.known ? s.tokens_per_second_per_gpu : "",
    text: s.known ? (s.lower_bound ? "≥ " : "") + f.num(s.tokens_per_second_per_gpu) : "not enough data",
    sub: s.known ? `attainment ≥ ${f.pct(report.target, 1)} in ${s.supporting_hours - s.missed_hours} of ${s.supporting_hours} hours at or below it` : s.reason,
  });
  card(el, {
    name: "cap_headroom", title: "Headroom", raw: u.headroom_known ? u.headroom : "",
    text: u.headroom_known ? f.pct(u.headroom, 1) : "unknown", sub: u.headroom_known ? "1 − peak per GPU / sustainable" : "needs a sustainable load and a peak",
  });
  const t = u.trend || {};
  card(el, {
    name: "cap_growth", title: "Weekly growth", raw: t.growth_known ? t.tokens_growth : "",
    text: t.growth_known ? f.pct(t.tokens_growth, 1) : "not enough data", sub: t.growth_known ? `peak ${f.pct(t.peak_growth, 1)} a week` : t.reason,
  });
  // GPU telemetry: memory in use, power, temperature and clock throttling
  // of the unit's GPUs over the range.
  const g = u.gpu_telemetry || {};
  const known = (h) => Number(g[h] || 0) > 0;
  card(el, {
    name: "cap_memory", title: "GPU memory in use", raw: known("memory_hours") ? g.memory_used_ratio || 0 : "",
    text: known("memory_hours") ? f.pct(g.memory_used_ratio || 0, 1) : "–",
    sub: known("memory_hours") ? `mean; fullest sample ${f.pct(g.memory_used_max_ratio || 0, 1)}, ${gb(Number(g.memory_used_max_bytes || 0))}` : "no GPU reported its memory",
  });
  card(el, {
    name: "cap_power", title: "GPU power", raw: known("power_hours") ? g.power_mean_watts || 0 : "",
    text: known("power_hours") ? `${f.num(g.power_mean_watts || 0)} W` : "–", sub: known("power_hours") ? `mean per GPU; max ${f.num(g.power_max_watts || 0)} W` : "no GPU reported its power",
  });
  card(el, {
    name: "cap_temperature", title: "GPU temperature", raw: known("temperature_hours") ? g.temperature_max_c || 0 : "",
    text: known("temperature_hours") ? `${f.num(g.temperature_max_c || 0)} °C` : "–", sub: known("temperature_hours") ? `hottest sample; mean ${f.num(g.temperature_mean_c || 0)} °C` : "no GPU reported its temperature",
  });
  card(el, {
    name: "cap_throttle", title: "Clock throttled", raw: known("clock_hours") ? g.clock_throttle_share || 0 : "",
    text: known("clock_hours") ? f.pct(g.clock_throttle_share || 0, 1) : "–",
    sub: known("clock_hours") ? `of busy time: ${f.num((g.clock_throttle_seconds || 0) / 3600)} GPU-hours below 90 % of the normal clock` : "no SM clocks sampled",
  });
  for (const n of u.gpus_needed || []) {
    const box = card(el, { name: "cap_gpus_needed", title: `GPUs for ${n.for}`, raw: n.gpus, text: f.count(n.gpus), sub: `${Number(n.change) >= 0 ? "+" : ""}${f.count(n.change)} against ${f.count(u.max_gpus)} now` });
    const a = document.createElement("div");
    a.className = "arith";
    a.textContent = n.arithmetic;
    box.appendChild(a);
  }
}

function drawCharts(el, u, report, cur) {
  const hours = u.hours_detail || [];
  const s = u.sustainable || {};
  const withGPUs = hours.filter((h) => h.gpus > 0);
  // Attainment against load: qualifying hours and the others apart.
  const pts = withGPUs.filter((h) => Number(h.requests) > 0).map((h) => ({
    x: h.tokens_per_second_per_gpu, y: h.attainment, group: h.qualifies ? "qualifying hours" : `under ${f.count(report.min_hour_requests)} requests`,
    label: `${f.time(api.ts(h.start))} UTC, ${f.count(h.requests)} requests`,
  }));
  const fig = figure(el, "capacity-attainment", "Attainment against load", "each hour; the circle and the red line are the sustainable load");
  const sh = s.known ? hours.find((h) => h.start === s.hour) : null;
  scatterChart(fig, {
    points: pts,
    groups: [{ name: "qualifying hours", color: palette[0] }, { name: `under ${f.count(report.min_hour_requests)} requests`, color: "#9aa3ad" }],
    xLabel: "tokens/s per GPU", yLabel: "attainment", xFormat: f.num, yFormat: (v) => f.pct(v), yAxis: "percent", yMax: 1,
    marks: s.known ? [{ x: s.tokens_per_second_per_gpu, label: `sustainable ${f.num(s.tokens_per_second_per_gpu)}` }] : [],
    ring: sh ? { x: sh.tokens_per_second_per_gpu, y: sh.attainment, label: "sustainable point" } : undefined,
    hline: { y: report.target, label: `target ${f.pct(report.target, 1)}` },
    emptyText: "No hours with GPUs and requests in this range.",
  });
  scatterChart(figure(el, "capacity-utilization", "Utilization against tokens/s per GPU", "each hour with GPU samples"), {
    points: withGPUs.map((h) => ({ x: h.tokens_per_second_per_gpu, y: h.utilization, label: `${f.time(api.ts(h.start))} UTC` })),
    xLabel: "tokens/s per GPU", yLabel: "utilization", xFormat: f.num, yFormat: (v) => f.pct(v, 1), yAxis: "percent", yMax: 1,
    emptyText: "No hours with GPU samples in this range.",
  });
  const profile = u.load_profile || [];
  heatMap(figure(el, "capacity-heatmap", "Load by weekday and hour", "mean tokens/s, UTC"), {
    rows: profile.map((d) => f.weekdays[d.weekday]),
    cols: Array.from({ length: 24 }, (_, h) => String(h).padStart(2, "0")),
    values: profile.map((d) => d.tokens_per_second),
    format: (v) => `${f.num(v)} tokens/s`,
    note: (i, j) => (profile[i].hours ? `${profile[i].hours[j]} hours` : ""),
  });
  const days = u.days || [];
  // Over the report's range, on a time axis; today is partial.
  timeBars(figure(el, "capacity-cost-days", "Busy and idle cost per day", "UTC days"), {
    t0: api.ts(report.start), t1: api.ts(report.end), step: "day", partial: api.partial("day"),
    times: days.map((d) => api.ts(d.start)),
    stacks: [
      { name: "busy", values: days.map((d) => f.moneyNum(d.busy_cost)), color: "#0072b2" },
      { name: "idle", values: days.map((d) => f.moneyNum(d.idle_cost)), color: "#e0a000" },
    ],
    yFormat: (v) => f.money(v, cur), yAxis: "money", currency: cur,
  });
  drawForecast(el, u);
  // Utilization beside memory, power and temperature, hour by hour, on the
  // report's time axis; a hover on one marks the same hour on all.
  telemetryCharts(el, [{ name: u.name, points: withGPUs.map((h) => ({ t: api.ts(h.start), utilization: h.utilization, telemetry: h.gpu_telemetry })) }],
    { t0: api.ts(report.start), t1: api.ts(report.end), step: "hour", partial: api.partial("hour") }, "capacity-gpu", "each hour with GPU samples");
}

function drawForecast(el, u) {
  const t = u.trend || {};
  const weeks = t.weeks || [];
  const fig = figure(el, "capacity-forecast", "Weekly peak and forecast", t.forecast ? `least squares over ${t.forecast.weeks} weeks, R² ${f.num(t.forecast.r2)}` : t.reason || "");
  if (!weeks.length) {
    const d = document.createElement("div");
    d.className = "empty";
    d.textContent = `No forecast: ${t.reason || "no complete week in the range"}.`;
    fig.appendChild(d);
    return;
  }
  const series = [{ name: "weekly peak", points: weeks.map((w) => [api.ts(w.start), w.peak_tokens_per_second]) }];
  const marks = [];
  if (t.forecast) {
    const w0 = api.ts(weeks[0].start);
    const at = api.ts(t.forecast.at);
    const line = [];
    for (let k = 0, x = w0; x <= at; k++, x += WEEK) line.push([x, t.forecast.intercept + t.forecast.slope * k]);
    series.push({ name: "fit", points: line, dashed: true, color: "#5a6472", noPoints: true });
    series.push({ name: "forecast", points: [[at, t.forecast.tokens_per_second]], color: "#a3261b" });
    marks.push({ t: at, label: `forecast ${f.num(t.forecast.tokens_per_second)} tokens/s` });
  }
  const ts = series.flatMap((s) => s.points.map((p) => p[0]));
  lineChart(fig, { series, t0: Math.min(...ts), t1: Math.max(...ts), step: "day", yFormat: (v) => `${f.num(v)} tokens/s`, yLabel: "tokens/s", marks });
  if (!t.forecast && t.reason) {
    const d = document.createElement("div");
    d.className = "sub";
    d.textContent = `No forecast: ${t.reason}.`;
    fig.appendChild(d);
  }
}

function drawUnits(el, report, cur) {
  const all = [report.fleet, ...(report.units || []), report.others].filter(Boolean);
  table(el, `Units (${report.group_by || "deployment"})`, ["Unit", "GPUs (mean / max)", "Utilization", "Idle cost", "Tokens/s per GPU", "Peak per GPU", "Sustainable per GPU", "Headroom", "Attainment"],
    all.map((u) => [
      { text: u.name, name: "unit", raw: u.name },
      `${f.num(u.mean_gpus)} / ${f.count(u.max_gpus)}`,
      f.pct(u.utilization, 1),
      f.money(u.idle_cost && u.idle_cost.amount, cur),
      f.num(u.tokens_per_second_per_gpu),
      u.peak ? f.num(u.peak.tokens_per_second_per_gpu) : "–",
      u.sustainable && u.sustainable.known ? (u.sustainable.lower_bound ? "≥ " : "") + f.num(u.sustainable.tokens_per_second_per_gpu) : "–",
      u.headroom_known ? f.pct(u.headroom, 1) : "–",
      f.pct(u.attainment),
    ]));
}

// download fetches the report in format ("html" or "csv") with the key and
// saves it through a blob URL.
export async function download(ctx, format) {
  const res = await api.request(ctx.key, "/v1/reports/capacity", { ...params(ctx.range), format });
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  // The server's file name (Content-Disposition), else one of the range.
  const named = /filename="?([^";]+)"?/.exec(res.headers.get("Content-Disposition") || "");
  a.download = named ? named[1] : `capacity-${api.iso(ctx.range.hourStart).slice(0, 13)}-${api.iso(ctx.range.hourEnd).slice(0, 13)}.${format}`;
  document.body.dataset.downloaded = a.download;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

export { panelError };
