// Package usagemetrics owns tokenmeter's business metrics for Prometheus
// (meterd --usage-metrics): per tenant and model, the requests, tokens and
// latency histograms of the measurement contract (llm_requests_total,
// llm_tokens_input_total, llm_tokens_output_total, llm_latency_bucket, …),
// cumulative since the first event, read from the read side (package query:
// exact usage, rollup latency histograms), cached for an interval, and
// folded beyond a cardinality cap into one "__other__" series without
// losing a token.
//
// It decides the metric names, labels, buckets, the cap and the cache; it
// does not query ClickHouse itself (query.Service does), authenticate
// scrapers (package api serves the handler behind a finance or admin key)
// or encode the exposition format (prometheus/client_golang does).
package usagemetrics
