package chstore

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"tokenmeter/query"
)

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
	for _, m := range distColumns {
		inner = append(inner, fmt.Sprintf("any(%s_ms) AS d_%s", m, m))
		sel = append(sel, fmt.Sprintf("groupArrayIf(ifNull(d_%[1]s, 0), isNotNull(d_%[1]s))", m))
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
	vals := make([][]float64, len(distColumns))
	dest := k.dest()
	for i := range vals {
		dest = append(dest, &vals[i])
	}
	return s.each(ctx, "raw latency", stmt, args, dest, func() error {
		r := query.RawLatencyRow{Start: k.start(q.StepSeconds(), q.Start), Group: groupMap(q.GroupBy, k.groups), Values: map[string][]float64{}}
		for i, m := range distColumns {
			sort.Float64s(vals[i])
			r.Values[m] = vals[i]
			vals[i] = nil // the row keeps the values; the next scan fills a new slice
		}
		return row(r)
	})
}
