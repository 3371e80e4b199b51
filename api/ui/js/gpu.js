// GPU telemetry charts, shared by the metrics tab (GET /v1/gpu-usage's
// points) and the capacity tab (the capacity report's hours): utilization
// beside memory in use, power and temperature, on one time axis, from the
// GpuTelemetry message (docs/architecture.md "GPU telemetry"). A reading
// the samples never carried (its *_hours 0) is left out, not drawn as 0.

import * as f from "./format.js";
import { figure, lineChart } from "./charts.js";

// bytes formats a number of bytes in GB (10^9), as GPU memory is sold.
export const gb = (v) => `${f.num(v / 1e9)} GB`;

const watts = (v) => `${f.num(v)} W`;
const celsius = (v) => `${f.num(v)} °C`;

// telemetryCharts draws utilization, memory, power and temperature into
// el. series: [{name, points: [{t, utilization, telemetry}]}]; base: the
// time axis of lineChart (t0, t1, step, partial); prefix names the charts
// (prefix + "-utilization", "-memory", "-power", "-temperature");
// subtitle says whose GPUs they are. With one series, each chart shows
// mean and max; with several, the mean of each.
export function telemetryCharts(el, series, base, prefix, subtitle, opts = {}) {
  const one = series.length === 1;
  const tel = (p) => p.telemetry || {};
  // With one series: its mean and max (named so), or its one line (named
  // as the series) where there is no max.
  const lines = (value, has, maxValue) => {
    if (!one) return series.map((s) => ({ name: s.name, points: s.points.filter(has).map((p) => [p.t, value(p)]) }));
    const pts = series[0].points.filter(has);
    const out = [{ name: maxValue ? "mean" : series[0].name, points: pts.map((p) => [p.t, value(p)]) }];
    if (maxValue) out.push({ name: "max", points: pts.map((p) => [p.t, maxValue(p)]), dashed: true });
    return out;
  };
  const sub = (what) => [what, subtitle].filter(Boolean).join(", ");
  if (!opts.noUtilization) {
    lineChart(figure(el, `${prefix}-utilization`, "GPU utilization", sub("busy share of GPU time")), {
      ...base, series: lines((p) => p.utilization || 0, () => true), yFormat: (v) => f.pct(v, 1), yAxis: "percent", yMax: 1,
    });
  }
  const memKnown = (p) => Number(tel(p).memory_hours || 0) > 0;
  lineChart(figure(el, `${prefix}-memory`, "GPU memory in use", sub(one ? "share of the memory: mean, and the fullest sample" : "share of the memory, mean")), {
    ...base, series: lines((p) => tel(p).memory_used_ratio || 0, memKnown, (p) => tel(p).memory_used_max_ratio || 0), yFormat: (v) => f.pct(v, 1), yAxis: "percent", yMax: 1,
  });
  const powerKnown = (p) => Number(tel(p).power_hours || 0) > 0;
  lineChart(figure(el, `${prefix}-power`, "GPU power", sub(one ? "per GPU: mean and max" : "per GPU, mean")), {
    ...base, series: lines((p) => tel(p).power_mean_watts || 0, powerKnown, (p) => tel(p).power_max_watts || 0), yFormat: watts, yLabel: "W",
  });
  const tempKnown = (p) => Number(tel(p).temperature_hours || 0) > 0;
  lineChart(figure(el, `${prefix}-temperature`, "GPU temperature", sub(one ? "mean and the hottest sample" : "mean")), {
    ...base, series: lines((p) => tel(p).temperature_mean_c || 0, tempKnown, (p) => tel(p).temperature_max_c || 0), yFormat: celsius, yLabel: "°C",
  });
}
