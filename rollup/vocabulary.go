package rollup

// What a rollup row counts: its dimensions, error classes and latency
// distributions, in the column order of the rollup tables.

// StatusClasses are the error classes counted per rollup row, in column order
// (err_<class>).
var StatusClasses = []string{"context_length", "rate_limited", "oom", "cuda", "timeout", "cancelled", "bad_request", "internal"}

// LatencyMetrics are the distributions kept per rollup row, in column order
// (<metric>_count, _sum, _keys, _counts).
var LatencyMetrics = []string{"ttft", "itl", "e2e", "queue"}

// RollupGroupFields are the dimensions rollup queries can group by.
var RollupGroupFields = []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}
