// Package query is the read side of tokenmeter: it normalizes a question
// (range, step, grouping, tenant), plans which stored rows answer it
// (rollups at the coarsest level that fits, fresh day rollups, raw events
// for hours the rollup job has not finished), merges and pages the rows,
// and turns latency histograms into percentiles and goodput counts into
// ratios. It declares the reads it needs of its store as small interfaces
// (Source and the ones it embeds); internal/adapter/chstore implements them with
// SQL. Package api maps the protocol onto a Service and its errors onto
// status codes.
package query
