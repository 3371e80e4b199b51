// Package usagemetrics owns tokenmeter's business metrics for Prometheus
// (meterd --usage-metrics), in two views read from the read side (package
// query) and cached for an interval:
//
//   - per tenant and model, the requests, tokens and latency histograms of
//     the measurement contract (llm_requests_total, llm_tokens_input_total,
//     llm_tokens_output_total, llm_latency_bucket, …), cumulative since the
//     first event (exact usage, rollup latency histograms);
//   - per deployment and model, what an SRE alerts on: the engines' batch
//     size, queue depth and KV cache (the newest rolled-up minute of engine
//     stats), the ITL and TTFT histograms and the SLO counters by slo_class
//     (cumulative), and per GPU its utilization, memory, temperature and
//     power (the hour in progress of GPU usage); with the rollup watermarks.
//
// Each view is folded beyond a cardinality cap into "__other__" series
// without losing a token. It decides the metric names, labels, buckets,
// the cap and the cache; it does not query ClickHouse itself
// (query.Service does), authenticate scrapers (package api serves the
// handler behind a finance or admin key), encode the exposition format
// (prometheus/client_golang does) or hold the alert rules (the Helm chart's
// files/alerts.rules.yaml).
package usagemetrics
