// The finance tab (finance and admin keys): GPU cost by tenant, with the
// idle cost that no tenant was charged ("__idle__" under the separate idle
// policy), and idle cost by deployment from GPU usage.

import * as api from "./api.js";
import * as f from "./format.js";
import { card, panelError, table, fitValues } from "./cards.js";
import { figure, lineChart, barChart } from "./charts.js";

export const IDLE = "__idle__";
const MAX_LINES = 8;

// tenantLabel names a cost line: the idle line reads as what it is.
export function tenantLabel(id) {
  return id === IDLE ? "idle (no tenant)" : id || "(none)";
}

// load draws the tab; ctx as for metrics.load. It returns the tenants seen,
// for the tenant filter's suggestions.
export async function load(ctx, cardsEl, chartsEl) {
  const { key, range, tenant } = ctx;
  const hours = { start: api.iso(range.hourStart), end: api.iso(range.hourEnd), step: range.hourStep };
  const settled = await Promise.allSettled([
    api.series(key, "/v1/cost", { ...hours, group_by: "tenant_id", tenant_id: tenant }),
    api.series(key, "/v1/gpu-usage", { ...hours, group_by: "deployment" }),
  ]);
  cardsEl.replaceChildren();
  chartsEl.replaceChildren();
  const errors = settled.filter((s) => s.status === "rejected").map((s) => s.reason);
  for (const e of errors) panelError(cardsEl, e instanceof api.ApiError ? e.explain() : String(e.message || e));
  const [cost, gpu] = settled.map((s) => (s.status === "fulfilled" ? s.value : null));
  let tenants = [];
  if (cost) tenants = drawCost(cardsEl, chartsEl, cost, range);
  if (gpu) drawIdle(cardsEl, chartsEl, gpu, range);
  // The tables below the charts, each a whole row wide.
  for (const t of chartsEl.querySelectorAll(":scope > .table-wrap")) chartsEl.appendChild(t);
  fitValues(cardsEl);
  if (errors.length) throw errors[0];
  return tenants;
}

function drawCost(cardsEl, chartsEl, cost, range) {
  const cur = cost.currency;
  const lines = cost.series.map((s) => ({ id: (s.group || {}).tenant_id || "", s: s.summary || {}, points: s.points }));
  const total = f.moneySum(lines.map((l) => l.s.cost), cur);
  const idle = f.moneySum(lines.filter((l) => l.id === IDLE).map((l) => l.s.cost), cur);
  const allocated = f.moneySum(lines.filter((l) => l.id !== IDLE).map((l) => l.s.cost), cur);
  const list = f.moneySum(lines.map((l) => l.s.list_charge), cur);
  const sub = `${f.rangeText(range.hourStart, range.hourEnd)}, idle policy ${cost.idle_policy || "?"}`;
  card(cardsEl, { name: "finance_cost", title: "GPU cost", raw: total.amount, text: f.money(total.amount, cur), sub });
  card(cardsEl, { name: "finance_allocated", title: "Charged to tenants", raw: allocated.amount, text: f.money(allocated.amount, cur), sub: `busy policy ${cost.busy_policy || "?"}` });
  card(cardsEl, { name: "finance_idle", title: "Idle cost", raw: idle.amount, text: f.money(idle.amount, cur), sub: "the __idle__ line: GPU time no tenant used" });
  card(cardsEl, { name: "finance_list_charge", title: "Usage at list prices", raw: list.amount, text: f.money(list.amount, cur), sub: "tokens at the models' list prices" });

  // Biggest first; the idle line last.
  const ordered = [...lines].sort((a, b) => (a.id === IDLE) - (b.id === IDLE) || Number(b.s.cost ? b.s.cost.amount : 0) - Number(a.s.cost ? a.s.cost.amount : 0));
  barChart(figure(chartsEl, "finance-cost-by-tenant", "Cost by tenant", "busy and idle share of each line"), {
    categories: ordered.map((l) => tenantLabel(l.id)),
    stacks: [
      { name: "busy", values: ordered.map((l) => f.moneyNum(l.s.busy_cost)), color: "#0072b2" },
      { name: "idle", values: ordered.map((l) => f.moneyNum(l.s.idle_cost)), color: "#e0a000" },
    ],
    yFormat: (v) => f.money(v, cur),
    yAxis: "money",
    currency: cur,
    horizontal: true,
    categoryLabel: "Tenant",
  });
  // Cost over time: the biggest lines, the rest summed.
  const top = ordered.filter((l) => l.id !== IDLE).slice(0, MAX_LINES);
  const rest = ordered.filter((l) => l.id !== IDLE).slice(MAX_LINES);
  const series = top.map((l) => ({ name: tenantLabel(l.id), points: l.points.map((p) => [api.ts(p.start), f.moneyNum(p.cost)]) }));
  if (rest.length) {
    const sum = new Map();
    for (const l of rest) for (const p of l.points) sum.set(api.ts(p.start), (sum.get(api.ts(p.start)) || 0) + f.moneyNum(p.cost));
    series.push({ name: `${rest.length} other tenants`, points: [...sum.entries()] });
  }
  for (const l of lines.filter((x) => x.id === IDLE)) {
    series.push({ name: tenantLabel(IDLE), points: l.points.map((p) => [api.ts(p.start), f.moneyNum(p.cost)]), color: "#e0a000", dashed: true });
  }
  lineChart(figure(chartsEl, "finance-cost-over-time", "Cost over time", `by tenant, per ${range.hourStep}`), {
    t0: range.hourStart, t1: range.hourEnd, step: range.hourStep, partial: api.partial(range.hourStep, range.now),
    series, yFormat: (v) => f.money(v, cur), yAxis: "money", currency: cur,
  });
  table(chartsEl, "Cost by tenant", ["Tenant", "Requests", "Input tokens", "Output tokens", "Cost", "Busy cost", "Idle cost", "Per 1k tokens", "Per 1k output tokens"],
    ordered.map((l) => [
      { text: tenantLabel(l.id), name: "tenant", raw: l.id },
      f.count(l.s.requests), f.count(l.s.input_tokens), f.count(l.s.output_tokens),
      { text: f.money(l.s.cost && l.s.cost.amount, cur), name: "cost", raw: l.s.cost ? l.s.cost.amount : "" },
      f.money(l.s.busy_cost && l.s.busy_cost.amount, cur), f.money(l.s.idle_cost && l.s.idle_cost.amount, cur),
      l.s.cost_per_1k_tokens ? f.money(l.s.cost_per_1k_tokens, cur) : "–",
      l.s.cost_per_1k_output_tokens ? f.money(l.s.cost_per_1k_output_tokens, cur) : "–",
    ]));
  return lines.map((l) => l.id).filter((id) => id && id !== IDLE);
}

function drawIdle(cardsEl, chartsEl, gpu, range) {
  const cur = gpu.currency;
  const deps = gpu.series.map((s) => ({ name: (s.group || {}).deployment || "(none)", s: s.summary || {} }));
  deps.sort((a, b) => f.moneyNum(b.s.idle_cost) - f.moneyNum(a.s.idle_cost));
  const idle = f.moneySum(deps.map((d) => d.s.idle_cost), cur);
  let gh = 0;
  let ih = 0;
  for (const d of deps) {
    gh += d.s.gpu_hours || 0;
    ih += d.s.idle_gpu_hours || 0;
  }
  card(cardsEl, { name: "finance_gpu_idle_cost", title: "Idle GPU cost", raw: idle.amount, text: f.money(idle.amount, cur), sub: `${f.num(ih)} of ${f.num(gh)} GPU-hours idle` });
  barChart(figure(chartsEl, "finance-idle-by-deployment", "Idle cost by deployment", "GPU usage: busy and idle cost of each deployment's GPUs"), {
    categories: deps.map((d) => d.name),
    stacks: [
      { name: "busy", values: deps.map((d) => f.moneyNum(d.s.busy_cost)), color: "#0072b2" },
      { name: "idle", values: deps.map((d) => f.moneyNum(d.s.idle_cost)), color: "#e0a000" },
    ],
    yFormat: (v) => f.money(v, cur),
    yAxis: "money",
    currency: cur,
    horizontal: true,
    categoryLabel: "Deployment",
  });
  table(chartsEl, "GPU usage by deployment", ["Deployment", "GPU-hours", "Utilization", "Idle GPU-hours", "Max GPUs", "Cost", "Idle cost", "Coverage"],
    deps.map((d) => [
      { text: d.name, name: "deployment", raw: d.name },
      f.num(d.s.gpu_hours), f.pct(d.s.utilization, 1), f.num(d.s.idle_gpu_hours), f.count(d.s.max_gpus),
      f.money(d.s.cost && d.s.cost.amount, cur),
      { text: f.money(d.s.idle_cost && d.s.idle_cost.amount, cur), name: "idle_cost", raw: d.s.idle_cost ? d.s.idle_cost.amount : "" },
      f.pct(d.s.coverage, 1),
    ]));
}
