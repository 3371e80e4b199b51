// The metrics tab: summary cards and time series of latency, traffic,
// error classes, goodput, engine saturation (KV cache, queue, batch,
// preemptions, prefix cache), GPU utilization, memory, power and
// temperature, and busy/idle cost, from
// /v1/usage, /v1/latency, /v1/traffic, /v1/goodput, /v1/engine-stats,
// /v1/cost and /v1/gpu-usage: one call each (and, grouped, one ungrouped
// call per series answer for the cards). A superset of the per-deployment
// metrics page of inference platforms (Rafay's Token Factory): every
// panel for one deployment (the picker) or all, every time chart on the
// range's one time axis, a hover on one showing the same instant on all.

import * as api from "./api.js";
import * as f from "./format.js";
import { card, trio, stat, panelError, fitValues } from "./cards.js";
import { figure, lineChart, timeBars, palette } from "./charts.js";
import { telemetryCharts } from "./gpu.js";

// groupName labels a series by its group-by values.
export function groupName(s) {
  const vals = Object.values(s.group || {});
  return vals.length ? vals.join(" / ") : "all";
}

const at = (p) => api.ts(p.start);

// LATENCIES are the latency metrics of the cards and charts.
const LATENCIES = [["ttft", "Time to first token"], ["itl", "Inter-token latency"], ["e2e", "End-to-end latency"]];

// PHASES are the parts of a request's latency: queue, prefill and decode.
const PHASES = [["queue", "queue"], ["prefill", "prefill"], ["decode", "decode"]];

// ERROR_COLORS gives each error class (rollup.StatusClasses) one colour
// on every chart.
export const ERROR_COLORS = {
  oom: "#b2182b", cuda: "#d55e00", timeout: "#e0a000", context_length: "#5d3a9b",
  rate_limited: "#0072b2", cancelled: "#9aa3ad", bad_request: "#009e73", internal: "#000000",
};

// engineGroup is the engine stats' grouping for the page's: engines are
// not split by tenant (a replica serves every tenant).
export const engineGroup = (group) => (group === "model" || group === "deployment" ? group : "");

// groupBy is a call's group_by: the page's grouping, and deployment when
// one deployment is picked.
export function groupBy(group, deployment) {
  const g = [];
  if (deployment) g.push("deployment");
  if (group && group !== "deployment") g.push(group);
  if (group === "deployment" && !deployment) g.push("deployment");
  return g;
}

// narrow keeps the series of the picked deployment ("": all) of a series
// answer and names them by the page's grouping alone.
export function narrow(answer, deployment, group) {
  if (!deployment || !answer) return answer;
  const series = (answer.series || [])
    .filter((s) => (s.group || {}).deployment === deployment)
    .map((s) => {
      if (group === "deployment") return s;
      const g = { ...s.group };
      delete g.deployment;
      return { ...s, group: g };
    });
  return { ...answer, series };
}

// calls are the API calls of the tab for ctx, by name: {name: () =>
// promise of the (narrowed) answer}. The page makes all of them at once.
export function calls(ctx) {
  const { key, range, group, tenant, finance, deployment } = ctx;
  const dep = deployment || "";
  const sel = { start: api.iso(range.start), end: api.iso(range.end), tenant_id: tenant };
  const stepSel = { ...sel, step: range.step, group_by: groupBy(group, dep) };
  const hours = { start: api.iso(range.hourStart), end: api.iso(range.hourEnd), step: range.hourStep };
  const series = (path, params, g) => api.series(key, path, params).then((a) => narrow(a, dep, g));
  const out = {
    usage: () => api.get(key, "/v1/usage", { ...sel, granularity: "total", group_by: dep ? "deployment" : "" }).then((u) => {
      if (!dep) return u;
      return { ...u, buckets: (u.buckets || []).filter((b) => b.deployment === dep) };
    }),
    latency: () => series("/v1/latency", stepSel, group),
    traffic: () => series("/v1/traffic", stepSel, group),
    goodput: () => series("/v1/goodput", stepSel, group),
    cost: () => series("/v1/cost", { ...hours, tenant_id: tenant, group_by: dep ? ["deployment"] : [] }, ""),
  };
  if (group) {
    // The cards are the whole range, ungrouped; latency at the page's step
    // for the largest p99 of a step.
    const total = { ...sel, group_by: groupBy("", dep) };
    out.latencyTotal = () => series("/v1/latency", { ...total, step: range.step }, "");
    out.trafficTotal = () => series("/v1/traffic", { ...total, step: "total" }, "");
    out.goodputTotal = () => series("/v1/goodput", { ...total, step: "total" }, "");
  }
  if (finance) {
    // GPU usage and engine stats are the fleet's: they have no tenant.
    const gpuGroup = dep || group === "deployment" ? ["deployment"] : [];
    out.gpu = () => series("/v1/gpu-usage", { ...hours, group_by: gpuGroup }, group === "deployment" ? "deployment" : "");
    const eg = engineGroup(group);
    out.engine = () => series("/v1/engine-stats", { start: sel.start, end: sel.end, step: range.step, group_by: groupBy(eg, dep) }, eg);
    // At the page's step, as latency: the same summary as ungrouped.
    if (eg) out.engineTotal = () => series("/v1/engine-stats", { start: sel.start, end: sel.end, step: range.step, group_by: groupBy("", dep) }, "");
  }
  return out;
}

// load fetches everything the tab shows and draws it into cardsEl and
// chartsEl. ctx: {key, finance (bool), range (api.resolveRange), group,
// tenant, deployment ("": all)}. It resolves when everything is drawn; it
// rejects with the first ApiError after drawing what did not fail.
export async function load(ctx, cardsEl, chartsEl) {
  const { range, group, tenant, finance } = ctx;
  const todo = calls(ctx);
  const names = Object.keys(todo);
  const settled = await Promise.allSettled(names.map((n) => todo[n]()));
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
  // With a tenant (a tenant key, or the filter) the busy/idle cost is the
  // tenant's allocated cost; else the fleet's GPUs'.
  const fleetCost = finance && !tenant;
  drawCards(cardsEl, r, group, range);
  drawCharts(chartsEl, r, range, group, fleetCost, tenant, ctx.deployment || "");
  fitValues(cardsEl);
  if (errors.length) throw errors[0];
}

// summaryOf is the summary of an ungrouped answer (undefined: no data).
function summaryOf(answer) {
  return answer && answer.series && answer.series.length ? answer.series[0].summary : undefined;
}

// num is an API number that may be absent (0) or a 64-bit string.
const num = (v) => Number(v || 0);

function drawCards(el, r, group, range) {
  // Latency first, as on the inference platforms' pages: p50 large, p95
  // and p99 beneath; then the tail ratio p99/p50 and the largest p99 of a
  // step for each.
  const lat = summaryOf(group ? r.latencyTotal : r.latency);
  if (lat || r.latency) {
    const of = (m) => (lat && lat[m]) || {};
    for (const [m, title] of LATENCIES) {
      const s = of(m);
      stat(el, {
        title,
        main: { name: `${m}_p50`, label: "p50", raw: s.p50 || 0, text: f.ms(s.p50 || 0) },
        more: ["p95", "p99"].map((p) => ({ name: `${m}_${p}`, label: p, raw: s[p] || 0, text: f.ms(s[p] || 0) })),
        sub: `${f.count(s.count || 0)} requests measured`,
      });
    }
    // Where the time goes: queue, prefill and decode (E2E − TTFT), at
    // the median.
    trio(el, {
      title: "Where the time goes (p50)",
      items: PHASES.map(([m, label]) => ({ name: `${m}_p50`, label, raw: of(m).p50 || 0, text: Number(of(m).count || 0) ? f.ms(of(m).p50 || 0) : "–" })),
      sub: "queue, prefill, and decode (E2E − TTFT)",
    });
    trio(el, {
      title: "Tail ratio p99 / p50",
      items: LATENCIES.map(([m]) => ({ name: `${m}_tail_ratio`, label: m.toUpperCase(), raw: of(m).tail_ratio || 0, text: `${f.num(of(m).tail_ratio || 0)}×` })),
      sub: "how far the slowest 1 % lie from the median",
    });
    trio(el, {
      title: `Max p99 of a ${range.step}`,
      items: LATENCIES.map(([m]) => ({ name: `${m}_max_p99`, label: m.toUpperCase(), raw: of(m).max_p99 || 0, text: f.ms(of(m).max_p99 || 0) })),
      sub: `the worst ${range.step} of the range`,
    });
  }
  const eng = summaryOf(engineGroup(group) ? r.engineTotal : r.engine);
  if (eng || r.engine) {
    const e = eng || {};
    const kvKnown = num(e.kv_cache_samples) > 0;
    const more = [{ name: "kv_cache_max", label: "max", raw: kvKnown ? e.kv_cache_usage_max || 0 : "", text: kvKnown ? f.pct(e.kv_cache_usage_max || 0, 1) : "–" }];
    if ("kv_cache_usage_min" in e || kvKnown) {
      more.push({ name: "kv_cache_min", label: "min", raw: kvKnown ? e.kv_cache_usage_min || 0 : "", text: kvKnown ? f.pct(e.kv_cache_usage_min || 0, 1) : "–" });
    }
    stat(el, {
      title: "KV cache usage",
      main: { name: "kv_cache_mean", label: "mean", raw: kvKnown ? e.kv_cache_usage_mean || 0 : "", text: kvKnown ? f.pct(e.kv_cache_usage_mean || 0, 1) : "–" },
      more,
      sub: kvKnown ? `${f.count(e.replicas || 0)} replicas sampled` : "no engine reported it",
    });
    stat(el, {
      title: "Queue depth",
      main: { name: "waiting_p95", label: "p95", raw: e.waiting_p95 || 0, text: f.num(e.waiting_p95 || 0) },
      more: [{ name: "waiting_max", label: "max", raw: e.waiting_max || 0, text: f.num(e.waiting_max || 0) }, { name: "waiting_mean", label: "mean", raw: e.waiting_mean || 0, text: f.num(e.waiting_mean || 0) }],
      sub: "requests waiting, per replica",
    });
    stat(el, {
      title: "Running requests",
      main: { name: "running_mean", label: "mean", raw: e.running_mean || 0, text: f.num(e.running_mean || 0) },
      more: [{ name: "running_max", label: "max", raw: e.running_max || 0, text: f.num(e.running_max || 0) }],
      sub: "batch size, per replica",
    });
    const hit = e.prefix_cache_hit_rate;
    card(el, {
      name: "prefix_cache_hit_rate", title: "Prefix-cache hit rate", raw: hit === undefined ? "" : hit, text: hit === undefined ? "–" : f.pct(hit, 1),
      sub: num(e.prefix_cache_queries) > 0 ? `${f.count(e.prefix_cache_hits || 0)} of ${f.count(e.prefix_cache_queries)} tokens` : hit === undefined ? "no engine reported it" : "the engines' own rate",
    });
    card(el, { name: "preemptions", title: "Preemptions", raw: e.preemptions || "0", text: f.count(e.preemptions || 0), sub: "requests preempted" });
    if ("restarts" in e) {
      card(el, { name: "restarts", title: "Engine restarts", raw: e.restarts || "0", text: f.count(e.restarts || 0), sub: "counter resets seen by the scraper" });
    }
  }
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
    const total = f.moneySum(costSums.map((s) => s.cost), cur);
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
}

// drawCharts draws the tab's series. Every chart spans the range asked for
// (the hourly ones too, clipped to it in the last hour), and marks the
// step in progress as partial.
function drawCharts(el, r, range, group, fleetCost, tenant, deployment) {
  const base = { t0: range.start, t1: range.end, step: range.step, partial: api.partial(range.step, range.now) };
  const ofSeries = (answer, value, keep = () => true) =>
    (answer ? answer.series : []).map((s) => ({ name: groupName(s), points: s.points.filter(keep).map((p) => [at(p), value(p)]) }));
  const by = group ? " by " + group : "";

  if (r.latency) {
    for (const [m, title] of LATENCIES) {
      const has = (x) => x[m] && x[m].count !== "0" && x[m].count;
      let series;
      if (!group) {
        const pts = r.latency.series.length ? r.latency.series[0].points : [];
        series = ["p50", "p90", "p95", "p99"].map((p) => ({ name: p, points: pts.filter(has).map((x) => [at(x), x[m][p] || 0]) }));
      } else {
        series = ofSeries(r.latency, (x) => x[m].p95 || 0, has);
      }
      const fig = figure(el, `latency-${m}`, title, group ? "p95" + by : "p50, p90, p95, p99");
      lineChart(fig, { ...base, series, yFormat: f.ms, yLabel: "ms" });
    }
  }
  // The phases of the ungrouped latency: queue, prefill, decode (p50).
  const whole = group ? r.latencyTotal : r.latency;
  if (whole) {
    const pts = whole.series.length ? whole.series[0].points : [];
    const phases = PHASES.map(([m, label]) => ({ name: label, points: pts.filter((x) => x[m] && Number(x[m].count || 0) > 0).map((x) => [at(x), x[m].p50 || 0]) }));
    lineChart(figure(el, "latency-breakdown", "Where the time goes", "p50 of queue, prefill and decode (E2E − TTFT)" + (range.step === "minute" ? "; prefill and decode at hour steps only" : "")), {
      ...base, series: phases, yFormat: f.ms, yLabel: "ms",
    });
  }
  if (r.engine) drawEngine(el, r.engine, base, group, tenant);
  if (r.traffic) {
    lineChart(figure(el, "traffic-requests", "Requests per second", group ? by.trim() : "mean per step"), {
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
    lineChart(figure(el, "traffic-tokens", "Tokens per second", group ? "output tokens" + by : "input and output"), {
      ...base, series: tokens, yFormat: (v) => f.rate(v, "tokens/s"), yLabel: "tokens/s",
    });
    lineChart(figure(el, "traffic-errors", "Error rate", group ? by.trim() : ""), {
      ...base, series: ofSeries(r.traffic, (p) => p.error_rate), yFormat: (v) => f.pct(v), yAxis: "percent", yLabel: "errors",
    });
    drawErrorClasses(el, r.traffic, base, group);
  }
  if (r.goodput) {
    lineChart(figure(el, "goodput-attainment", "Goodput attainment", "requests within SLO" + (group ? "," + by : "")), {
      ...base, series: ofSeries(r.goodput, (p) => p.attainment), yFormat: (v) => f.pct(v), yAxis: "percent", yMax: 1,
    });
    lineChart(figure(el, "goodput-tokens", "Good output tokens per second", group ? by.trim() : ""), {
      ...base, series: ofSeries(r.goodput, (p) => p.goodput_output_tokens_per_second), yFormat: (v) => f.rate(v, "tokens/s"), yLabel: "tokens/s",
    });
  }
  const hoursBase = { t0: range.start, t1: range.end, step: range.hourStep, partial: api.partial(range.hourStep, range.now) };
  if (r.gpu) {
    // Utilization beside memory, power and temperature, per hour.
    const gpuSeries = r.gpu.series.map((s) => ({ name: groupName(s), points: s.points.map((p) => ({ ...p, t: at(p) })) }));
    telemetryCharts(el, gpuSeries, hoursBase, "gpu", group === "deployment" ? "by deployment" : deployment ? "deployment " + deployment : "fleet");
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

// drawErrorClasses draws the failed requests of each step stacked by
// error class (OOM, CUDA, timeout, context length, rate limited, ...),
// summed over the groups.
function drawErrorClasses(el, traffic, base, group) {
  const byT = new Map();
  const classes = new Set();
  for (const s of traffic.series) {
    for (const p of s.points) {
      const by = p.errors_by_class || {};
      if (!Object.keys(by).length) continue;
      const t = at(p);
      const e = byT.get(t) || {};
      for (const [c, n] of Object.entries(by)) {
        e[c] = (e[c] || 0) + num(n);
        classes.add(c);
      }
      byT.set(t, e);
    }
  }
  const ts = [...byT.keys()].sort((a, b) => a - b);
  const names = [...classes].sort();
  timeBars(figure(el, "errors-by-class", "Failed requests by error class", group ? "all groups" : "per " + base.step), {
    ...base,
    times: ts,
    stacks: names.map((c, i) => ({ name: c.replaceAll("_", " "), class: c, values: ts.map((t) => byT.get(t)[c] || 0), color: ERROR_COLORS[c] || palette[i % palette.length] })),
    yFormat: (v) => f.count(Math.round(v)),
    yLabel: "requests",
  });
}

// drawEngine draws the engines' saturation series: KV-cache usage (mean,
// max, min), queue depth p95, running requests (the batch), preemptions
// and the prefix-cache hit rate; restarts where the API counts them.
function drawEngine(el, engine, base, group, tenant) {
  const eg = engineGroup(group);
  const note = (tenant || group === "tenant_id" ? "all tenants (engines serve every tenant)" : "") + (eg ? (tenant || group === "tenant_id" ? ", " : "") + "by " + eg : "");
  const list = engine.series || [];
  const one = list.length ? list[0].points : [];
  const line = (value, keep = () => true) => list.map((s) => ({ name: groupName(s), points: s.points.filter(keep).map((p) => [at(p), value(p)]) }));
  const kvKnown = (p) => num(p.kv_cache_samples) > 0;
  const pctFmt = (v) => f.pct(v, 1);

  let kv;
  if (!eg) {
    kv = [
      { name: "mean", points: one.filter(kvKnown).map((p) => [at(p), p.kv_cache_usage_mean || 0]) },
      { name: "max", points: one.filter(kvKnown).map((p) => [at(p), p.kv_cache_usage_max || 0]) },
    ];
    if (one.some((p) => "kv_cache_usage_min" in p)) kv.push({ name: "min", points: one.filter(kvKnown).map((p) => [at(p), p.kv_cache_usage_min || 0]) });
  } else {
    kv = line((p) => p.kv_cache_usage_mean || 0, kvKnown);
  }
  lineChart(figure(el, "engine-kv-cache", "KV cache usage", [eg ? "mean" : "mean, max, min", note].filter(Boolean).join(", ")), {
    ...base, series: kv, yFormat: pctFmt, yAxis: "percent", yMax: 1,
  });
  const queue = eg ? line((p) => p.waiting_p95 || 0) : [
    { name: "p95", points: one.map((p) => [at(p), p.waiting_p95 || 0]) },
    { name: "max", points: one.map((p) => [at(p), p.waiting_max || 0]), dashed: true },
  ];
  lineChart(figure(el, "engine-queue", "Queue depth", ["p95 of the sampled depths" + (eg ? "" : ", and max"), note].filter(Boolean).join(", ")), {
    ...base, series: queue, yFormat: f.num, yLabel: "requests",
  });
  const running = eg ? line((p) => p.running_mean || 0) : [
    { name: "mean", points: one.map((p) => [at(p), p.running_mean || 0]) },
    { name: "max", points: one.map((p) => [at(p), p.running_max || 0]), dashed: true },
  ];
  lineChart(figure(el, "engine-running", "Running requests (batch size)", ["per replica" + (eg ? ", mean" : ", mean and max"), note].filter(Boolean).join(", ")), {
    ...base, series: running, yFormat: f.num, yLabel: "requests",
  });
  const times = [...new Set(list.flatMap((s) => s.points.map(at)))].sort((a, b) => a - b);
  const stacksOf = (value) => list.map((s, i) => {
    const byT = new Map(s.points.map((p) => [at(p), value(p)]));
    return { name: eg ? groupName(s) : "", values: times.map((t) => byT.get(t) || 0), color: palette[i % palette.length] };
  });
  timeBars(figure(el, "engine-preemptions", "Preemptions", ["requests preempted per " + base.step, note].filter(Boolean).join(", ")), {
    ...base, times, stacks: stacksOf((p) => num(p.preemptions)), yFormat: (v) => f.count(Math.round(v)), yLabel: "requests",
  });
  const hasHit = (p) => p.prefix_cache_hit_rate !== undefined;
  lineChart(figure(el, "engine-prefix-hit-rate", "Prefix-cache hit rate", ["hits over lookups (tokens)", note].filter(Boolean).join(", ")), {
    ...base, series: line((p) => p.prefix_cache_hit_rate, hasHit), yFormat: pctFmt, yAxis: "percent", yMax: 1,
  });
  if (list.some((s) => s.points.some((p) => "restarts" in p))) {
    timeBars(figure(el, "engine-restarts", "Engine restarts", ["counter resets per " + base.step, note].filter(Boolean).join(", ")), {
      ...base, times, stacks: stacksOf((p) => num(p.restarts)), yFormat: (v) => f.count(Math.round(v)), yLabel: "restarts",
    });
  }
}
