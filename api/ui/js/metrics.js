// The metrics tab: summary cards and time series of latency, traffic,
// goodput, GPU utilization and busy/idle cost, from /v1/usage,
// /v1/latency, /v1/traffic, /v1/goodput, /v1/cost and /v1/gpu-usage.

import * as api from "./api.js";
import * as f from "./format.js";
import { card, trio, panelError, fitValues } from "./cards.js";
import { figure, lineChart, timeBars } from "./charts.js";

// groupName labels a series by its group-by values.
export function groupName(s) {
  const vals = Object.values(s.group || {});
  return vals.length ? vals.join(" / ") : "all";
}

const at = (p) => api.ts(p.start);

// load fetches everything the tab shows and draws it into cardsEl and
// chartsEl. ctx: {key, finance (bool), range (api.resolveRange), group,
// tenant}. It resolves when everything is drawn; it rejects with the first
// ApiError after drawing what did not fail.
export async function load(ctx, cardsEl, chartsEl) {
  const { key, range, group, tenant, finance } = ctx;
  const sel = { start: api.iso(range.start), end: api.iso(range.end), tenant_id: tenant };
  const stepSel = { ...sel, step: range.step, group_by: group };
  const hours = { start: api.iso(range.hourStart), end: api.iso(range.hourEnd), step: range.hourStep };
  // GPU usage is the fleet's: it has no tenant. With a tenant (a tenant
  // key, or the filter) the busy/idle cost is the tenant's allocated cost.
  const fleetCost = finance && !tenant;

  const calls = {
    usage: api.get(key, "/v1/usage", { ...sel, granularity: "total" }),
    latency: api.series(key, "/v1/latency", stepSel),
    traffic: api.series(key, "/v1/traffic", stepSel),
    goodput: api.series(key, "/v1/goodput", stepSel),
    cost: api.series(key, "/v1/cost", { ...hours, tenant_id: tenant }),
  };
  if (group) {
    // The cards are the whole range, ungrouped.
    calls.latencyTotal = api.series(key, "/v1/latency", { ...sel, step: "total" });
    calls.trafficTotal = api.series(key, "/v1/traffic", { ...sel, step: "total" });
    calls.goodputTotal = api.series(key, "/v1/goodput", { ...sel, step: "total" });
  }
  if (finance) {
    calls.gpu = api.series(key, "/v1/gpu-usage", { ...hours, group_by: group === "deployment" ? "deployment" : "" });
  }
  const names = Object.keys(calls);
  const settled = await Promise.allSettled(Object.values(calls));
  const r = {};
  const errors = [];
  names.forEach((n, i) => {
    if (settled[i].status === "fulfilled") r[n] = settled[i].value;
    else errors.push(settled[i].reason);
  });

  cardsEl.replaceChildren();
  chartsEl.replaceChildren();
  if (errors.length) {
    const seen = new Set();
    for (const e of errors) {
      const text = e instanceof api.ApiError ? e.explain() : String(e.message || e);
      if (!seen.has(text)) panelError(cardsEl, text);
      seen.add(text);
    }
  }
  drawCards(cardsEl, r, group, range);
  drawCharts(chartsEl, r, range, group, fleetCost);
  fitValues(cardsEl);
  if (errors.length) throw errors[0];
}

// summaryOf is the summary of an ungrouped answer (undefined: no data).
function summaryOf(answer) {
  return answer && answer.series && answer.series.length ? answer.series[0].summary : undefined;
}

function drawCards(el, r, group, range) {
  if (r.usage) {
    let req = 0n;
    let errs = 0n;
    let inTok = 0n;
    let outTok = 0n;
    for (const b of r.usage.buckets || []) {
      req += BigInt(b.requests || 0);
      errs += BigInt(b.errors || 0);
      inTok += BigInt(b.prompt_tokens || 0);
      outTok += BigInt(b.output_tokens || 0);
    }
    card(el, { name: "requests", title: "Requests", raw: req, text: f.count(req), sub: `${f.count(errs)} failed` });
    card(el, { name: "input_tokens", title: "Input tokens", raw: inTok, text: f.count(inTok) });
    card(el, { name: "output_tokens", title: "Output tokens", raw: outTok, text: f.count(outTok) });
  }
  const traffic = summaryOf(group ? r.trafficTotal : r.traffic);
  if (traffic || r.traffic) {
    const e = traffic ? traffic.error_rate : 0;
    card(el, { name: "error_rate", title: "Error rate", raw: e, text: f.pct(e), sub: traffic ? `of all requests; busiest minute ${f.num(traffic.peak_requests_per_second)} req/s` : "no requests" });
  }
  const gp = summaryOf(group ? r.goodputTotal : r.goodput);
  if (gp || r.goodput) {
    const g = gp || {};
    card(el, {
      name: "attainment", title: "Goodput attainment", raw: g.attainment || 0, text: f.pct(g.attainment || 0),
      sub: `${f.count(g.good_requests || 0)} of ${f.count(g.requests || 0)} requests within SLO`,
    });
    card(el, {
      name: "goodput_tokens_per_second", title: "Good output tokens/s", raw: g.goodput_output_tokens_per_second || 0,
      text: f.num(g.goodput_output_tokens_per_second || 0), sub: `${f.count(g.good_output_tokens || 0)} good output tokens`,
    });
  }
  // Without the provider's cost (a tenant key, unless the operator opts in
  // with --tenant-cost) the lines carry usage only: no cost cards.
  const costSums = r.cost ? (r.cost.series || []).map((s) => s.summary || {}) : [];
  const costHidden = costSums.length > 0 && !costSums.some((s) => s.cost || s.busy_cost || s.idle_cost);
  if (r.cost && !costHidden) {
    const cur = r.cost.currency;
    const sums = costSums;
    const total = f.moneySum(sums.map((s) => s.cost), cur);
    const note = range.hourStart !== range.start || range.hourEnd !== range.end ? `whole hours ${f.rangeText(range.hourStart, range.hourEnd)}` : "GPU cost allocated";
    card(el, { name: "cost", title: "Cost", raw: total.amount, text: f.money(total.amount, cur), sub: note });
    // One series (a tenant, or the policies' shared idle cost) has the
    // API's own ratio; with the idle line apart, the cost per 1k tokens
    // is the tenants' line: busy cost over their tokens.
    const users = (r.cost.series || []).filter((s) => !(s.group && s.group.tenant_id === "__idle__"));
    let per1k = "";
    if (users.length === 1) per1k = users[0].summary.cost_per_1k_tokens || "";
    card(el, {
      name: "cost_per_1k_tokens", title: "Cost per 1k tokens", raw: per1k, text: per1k ? f.money(per1k, cur) : "–",
      sub: per1k ? "allocated cost over input + output tokens" : "no tokens with a cost in the range",
    });
  }
  // The latency cards last: each is two columns wide (three values).
  const lat = summaryOf(group ? r.latencyTotal : r.latency);
  if (lat || r.latency) {
    for (const [m, title] of [["ttft", "Time to first token"], ["itl", "Inter-token latency"], ["e2e", "End-to-end latency"]]) {
      const s = (lat && lat[m]) || {};
      trio(el, {
        title,
        items: ["p50", "p95", "p99"].map((p) => ({ name: `${m}_${p}`, label: p, raw: s[p] || 0, text: f.ms(s[p] || 0) })),
        sub: `${f.count(s.count || 0)} requests measured`,
      });
    }
  }
}

// drawCharts draws the tab's series. Every chart spans the range asked for
// (the hourly ones too, clipped to it in the last hour), and marks the
// step in progress as partial.
function drawCharts(el, r, range, group, fleetCost) {
  const base = { t0: range.start, t1: range.end, step: range.step, partial: api.partial(range.step, range.now) };
  const ofSeries = (answer, value) =>
    (answer ? answer.series : []).map((s) => ({ name: groupName(s), points: s.points.map((p) => [at(p), value(p)]) }));

  if (r.latency) {
    for (const [m, title] of [["ttft", "Time to first token"], ["itl", "Inter-token latency"], ["e2e", "End-to-end latency"]]) {
      let series;
      if (!group) {
        const pts = r.latency.series.length ? r.latency.series[0].points : [];
        series = ["p50", "p95", "p99"].map((p) => ({ name: p, points: pts.filter((x) => x[m] && x[m].count !== "0").map((x) => [at(x), x[m][p]]) }));
      } else {
        series = ofSeries(r.latency, (x) => (x[m] ? x[m].p95 : 0));
      }
      const fig = figure(el, `latency-${m}`, title, group ? "p95 by " + group : "p50, p95, p99");
      lineChart(fig, { ...base, series, yFormat: f.ms, yLabel: "ms" });
    }
  }
  if (r.traffic) {
    lineChart(figure(el, "traffic-requests", "Requests per second", group ? "by " + group : "mean per step"), {
      ...base, series: ofSeries(r.traffic, (p) => p.requests_per_second), yFormat: (v) => f.rate(v, "req/s"), yLabel: "req/s",
    });
    let tokens;
    if (!group) {
      const pts = r.traffic.series.length ? r.traffic.series[0].points : [];
      tokens = [
        { name: "input", points: pts.map((p) => [at(p), p.input_tokens_per_second]) },
        { name: "output", points: pts.map((p) => [at(p), p.output_tokens_per_second]) },
      ];
    } else {
      tokens = ofSeries(r.traffic, (p) => p.output_tokens_per_second);
    }
    lineChart(figure(el, "traffic-tokens", "Tokens per second", group ? "output tokens by " + group : "input and output"), {
      ...base, series: tokens, yFormat: (v) => f.rate(v, "tokens/s"), yLabel: "tokens/s",
    });
    lineChart(figure(el, "traffic-errors", "Error rate", group ? "by " + group : ""), {
      ...base, series: ofSeries(r.traffic, (p) => p.error_rate), yFormat: (v) => f.pct(v), yAxis: "percent", yLabel: "errors",
    });
  }
  if (r.goodput) {
    lineChart(figure(el, "goodput-attainment", "Goodput attainment", "requests within SLO" + (group ? ", by " + group : "")), {
      ...base, series: ofSeries(r.goodput, (p) => p.attainment), yFormat: (v) => f.pct(v), yAxis: "percent", yMax: 1,
    });
    lineChart(figure(el, "goodput-tokens", "Good output tokens per second", group ? "by " + group : ""), {
      ...base, series: ofSeries(r.goodput, (p) => p.goodput_output_tokens_per_second), yFormat: (v) => f.rate(v, "tokens/s"), yLabel: "tokens/s",
    });
  }
  const hoursBase = { t0: range.start, t1: range.end, step: range.hourStep, partial: api.partial(range.hourStep, range.now) };
  if (r.gpu) {
    lineChart(figure(el, "gpu-utilization", "GPU utilization", (group === "deployment" ? "by deployment" : "fleet") + ", busy share of GPU time"), {
      ...hoursBase, series: ofSeries(r.gpu, (p) => p.utilization), yFormat: (v) => f.pct(v, 1), yAxis: "percent", yMax: 1,
    });
  }
  // Busy and idle cost per step: the fleet's GPUs (GPU usage), or the
  // tenant's allocated cost.
  const src = fleetCost ? r.gpu : r.cost;
  // A tenant key sees its allocated cost only when the operator opts in
  // (meterd --tenant-cost): without it the answer's points carry usage and
  // no cost field, and there is no cost chart to draw.
  const points = src ? src.series.flatMap((s) => s.points || []) : [];
  const costHidden = !fleetCost && points.length > 0 && !points.some((p) => p.cost || p.busy_cost || p.idle_cost);
  if (src && !costHidden) {
    // Grouped by deployment, the steps are summed: the chart is the fleet's.
    const byT = new Map();
    const cur = src.currency;
    for (const s of src.series) {
      for (const p of s.points) {
        const t = at(p);
        const e = byT.get(t) || { busy: 0, idle: 0 };
        e.busy += f.moneyNum(p.busy_cost);
        e.idle += f.moneyNum(p.idle_cost);
        byT.set(t, e);
      }
    }
    const ts = [...byT.keys()].sort((a, b) => a - b);
    timeBars(figure(el, "cost-busy-idle", "Busy and idle GPU cost", fleetCost ? "all GPUs, per " + range.hourStep : "allocated to the tenant, per " + range.hourStep), {
      ...hoursBase,
      times: ts,
      stacks: [
        { name: "busy", values: ts.map((t) => byT.get(t).busy), color: "#0072b2" },
        { name: "idle", values: ts.map((t) => byT.get(t).idle), color: "#e0a000" },
      ],
      yFormat: (v) => f.money(v, cur),
      yAxis: "money",
      currency: cur,
    });
  }
}
