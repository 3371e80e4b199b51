package chstore

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
	"tokenmeter/rollup"
)

// MaxExactRange bounds the range of exact (raw) latency queries.
const MaxExactRange = 24 * time.Hour

// RawLatencyRow holds the exact latency values of one group in one step,
// each list sorted.
type RawLatencyRow struct {
	Start  time.Time
	Group  map[string]string
	Values map[string][]float64 // per rollup.LatencyMetrics entry
}

// RawLatency reads every deduplicated latency value of the range, for exact
// quantiles. The range may be at most MaxExactRange.
func (s *Store) RawLatency(ctx context.Context, q RollupQuery) ([]RawLatencyRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	if q.End.Sub(q.Start) > MaxExactRange {
		return nil, fmt.Errorf("%w: exact quantiles need a range of at most %s, got %s", ErrInvalidQuery, MaxExactRange, q.End.Sub(q.Start))
	}
	var args []any
	bucket, stepArgs := stepExpr("d_completed_at", q.Step, q.Start)
	args = append(args, stepArgs...)
	sel := []string{bucket + " AS b"}
	inner := []string{"tenant_id AS d_tenant_id", "any(completed_at) AS d_completed_at"}
	for _, f := range q.GroupBy {
		if f != "tenant_id" {
			inner = append(inner, fmt.Sprintf("any(%s) AS d_%s", f, f))
		}
		sel = append(sel, "d_"+f)
	}
	for _, m := range rollup.LatencyMetrics {
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
	query := fmt.Sprintf("SELECT %s FROM (SELECT %s FROM inference_events WHERE %s GROUP BY tenant_id, event_id) GROUP BY %s ORDER BY %s",
		strings.Join(sel, ", "), strings.Join(inner, ", "), where, strings.Join(groups, ", "), strings.Join(groups, ", "))
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query raw latency: %w", classify(err))
	}
	defer rows.Close()
	var out []RawLatencyRow
	for rows.Next() {
		k := newStepKey(len(q.GroupBy))
		vals := make([][]float64, len(rollup.LatencyMetrics))
		dest := k.dest()
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan raw latency: %w", err)
		}
		r := RawLatencyRow{Start: k.start(), Group: groupMap(q.GroupBy, k.groups), Values: map[string][]float64{}}
		if rollup.Granularities[q.Step] == 0 {
			r.Start = q.Start.UTC()
		}
		for i, m := range rollup.LatencyMetrics {
			sort.Float64s(vals[i])
			r.Values[m] = vals[i]
		}
		out = append(out, r)
		if len(out) > s.cfg.MaxSeriesRows {
			return nil, s.tooManySeries()
		}
	}
	return out, classify(rows.Err())
}
