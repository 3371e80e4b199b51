package chstore

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// rawLatencyValues are the value lists rawLatencySQL reads, in order:
// rollup.LatencyMetrics, then query.HourLatencyMetrics, each an array of
// the values of the deduplicated events (d_*) that have one, as the hour
// rollup counts them (rollup/hour.go add and addHourDists): a TTFT taken
// from E2E (ttft_estimated) is no TTFT, nor is an ITL derived from it;
// decode is E2E − TTFT, at least 0,
// with both; E2E per output-length class.
var rawLatencyValues = []struct{ name, value, cond string }{
	{"ttft", "d_ttft", "isNotNull(d_ttft) AND d_ttft_estimated = 0"},
	{"itl", "d_itl", "isNotNull(d_itl) AND NOT (d_ttft_estimated AND NOT d_itl_measured)"},
	{"e2e", "d_e2e", "isNotNull(d_e2e)"},
	{"queue", "d_queue", "isNotNull(d_queue)"},
	{"prefill", "d_prefill", "isNotNull(d_prefill)"},
	{"decode", "greatest(ifNull(d_e2e, 0) - ifNull(d_ttft, 0), 0)", "isNotNull(d_e2e) AND isNotNull(d_ttft) AND d_ttft_estimated = 0"},
	{"e2e_short", "d_e2e", fmt.Sprintf("isNotNull(d_e2e) AND d_output < %d", rollup.MediumOutputTokens)},
	{"e2e_medium", "d_e2e", fmt.Sprintf("isNotNull(d_e2e) AND d_output >= %d AND d_output < %d", rollup.MediumOutputTokens, rollup.LongOutputTokens)},
	{"e2e_long", "d_e2e", fmt.Sprintf("isNotNull(d_e2e) AND d_output >= %d", rollup.LongOutputTokens)},
}

// rawLatencySQL reads every deduplicated latency value of q's range per
// step and group.
func rawLatencySQL(q query.RollupQuery) (string, []any) {
	bucket, args := stepExpr("d_completed_at", q.StepSeconds(), q.Start)
	sel := []string{bucket + " AS b"}
	inner := []string{"tenant_id AS d_tenant_id", "any(completed_at) AS d_completed_at"}
	for _, f := range q.GroupBy {
		if f != "tenant_id" {
			inner = append(inner, fmt.Sprintf("any(%s) AS d_%s", f, f))
		}
		sel = append(sel, "d_"+f)
	}
	for _, m := range []string{"ttft", "itl", "e2e", "queue", "prefill"} {
		inner = append(inner, fmt.Sprintf("any(%s_ms) AS d_%s", m, m))
	}
	inner = append(inner, "any(ttft_estimated) AS d_ttft_estimated", "any(itl_measured) AS d_itl_measured", "any(output_tokens) AS d_output")
	for _, v := range rawLatencyValues {
		sel = append(sel, fmt.Sprintf("groupArrayIf(ifNull(%s, 0), %s)", v.value, v.cond))
	}
	where := "completed_at >= toDateTime(?) AND completed_at <= toDateTime(?) AND completed_at_ms >= ? AND completed_at_ms < ?"
	args = append(args, q.Start.Unix(), q.End.Unix(), q.Start.UnixMilli(), q.End.UnixMilli())
	if q.TenantID != "" {
		where += " AND tenant_id = ?"
		args = append(args, q.TenantID)
	}
	groups := []string{"b"}
	for _, f := range q.GroupBy {
		groups = append(groups, "d_"+f)
	}
	return fmt.Sprintf("SELECT %s FROM (SELECT %s FROM inference_events WHERE %s GROUP BY tenant_id, event_id) GROUP BY %s ORDER BY %s",
		strings.Join(sel, ", "), strings.Join(inner, ", "), where, strings.Join(groups, ", "), strings.Join(groups, ", ")), args
}

// RawLatencyRows reads every deduplicated latency value of q's range, per
// step and group, each list sorted, calling row for each group until it
// returns an error.
func (s *Store) RawLatencyRows(ctx context.Context, q query.RollupQuery, row func(query.RawLatencyRow) error) error {
	stmt, args := rawLatencySQL(q)
	k := newStepKey(len(q.GroupBy))
	vals := make([][]float64, len(rawLatencyValues))
	dest := k.dest()
	for i := range vals {
		dest = append(dest, &vals[i])
	}
	return s.each(ctx, "raw latency", stmt, args, dest, func() error {
		r := query.RawLatencyRow{Start: k.start(q.StepSeconds(), q.Start), Group: groupMap(q.GroupBy, k.groups), Values: map[string][]float64{}}
		for i, v := range rawLatencyValues {
			sort.Float64s(vals[i])
			r.Values[v.name] = vals[i]
			vals[i] = nil // the row keeps the values; the next scan fills a new slice
		}
		return row(r)
	})
}
