package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/query"
)

// trafficCounters are the summed columns of a traffic row, in
// query.TrafficRow order.
func trafficCounters() []string {
	cols := []string{"requests", "errors"}
	for _, c := range errClasses {
		cols = append(cols, "err_"+c)
	}
	return append(cols, "prompt_tokens", "output_tokens")
}

// trafficSQL builds the query of a traffic read. The inner query gives each
// step, bucket (hour or minute) and series its counters and busiest minute;
// the outer one sums the counters per step and series and keeps the
// busiest minute.
func trafficSQL(r query.TrafficRead) (string, []any) {
	q := r.Query
	bucket, args := stepExpr("bucket", q.StepSeconds(), q.Start)
	inner := append([]string{bucket + " AS b"}, q.GroupBy...)
	counters := trafficCounters()
	for _, c := range counters {
		if r.Kind == query.TrafficLevel {
			inner = append(inner, c+" AS t_"+c)
		} else {
			inner = append(inner, "sum("+c+") AS t_"+c)
		}
	}
	switch r.Kind {
	case query.TrafficLevel:
		inner = append(inner, "peak_minute_requests AS t_peak_requests", "peak_minute_output_tokens AS t_peak_output")
	case query.TrafficMinutes:
		inner = append(inner, "sum(requests) AS t_peak_requests", "sum(output_tokens) AS t_peak_output")
	case query.TrafficMerged:
		inner = append(inner, "arrayReduce('max', sumForEach(minute_requests)) AS t_peak_requests",
			"arrayReduce('max', sumForEach(minute_output_tokens)) AS t_peak_output")
	}
	where, whereArgs := scope("bucket", q.Start, q.End, q.TenantID)
	filter := ""
	if r.OnlyHours != nil {
		filter = "intDiv(toUInt32(bucket), 3600) * 3600 IN " + hourList(r.OnlyHours)
	}
	from, fromArgs := newestRows(levelTables[r.Level], "bucket", where, whereArgs, filter)
	if len(r.Days) > 0 {
		cols := slices.Concat([]string{"bucket"}, dimColumns, counters, peakColumns)
		from, fromArgs = withDays(strings.Join(cols, ", "), r.Days, where, whereArgs)
	}
	args = append(args, fromArgs...)
	innerSQL := fmt.Sprintf("SELECT %s\n  FROM %s", strings.Join(inner, ", "), strings.ReplaceAll(from, "\n", "\n  "))
	if r.Kind != query.TrafficLevel {
		innerSQL += "\n  GROUP BY " + strings.Join(append([]string{"b", "bucket"}, q.GroupBy...), ", ")
	}
	outer := append([]string{"b"}, q.GroupBy...)
	for _, c := range counters {
		outer = append(outer, "sum(t_"+c+")")
	}
	outer = append(outer, "max(t_peak_requests)", "max(t_peak_output)")
	groups := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	stmt := fmt.Sprintf("SELECT %s\nFROM (\n  %s\n)\nGROUP BY %s\nORDER BY %s", strings.Join(outer, ", "), innerSQL, groups, groups)
	if r.Limit > 0 {
		stmt += fmt.Sprintf("\nLIMIT %d, %d", q.Offset, r.Limit)
	}
	return stmt, args
}

// HoursWithoutPeaks lists the hours in [from, to) whose newest rollup was
// computed before migration 0009: rows with requests but no busiest
// minute. From before 1970 and to after 2106 are clipped.
func (s *Store) HoursWithoutPeaks(ctx context.Context, from, to time.Time) ([]time.Time, error) {
	lo, hi := max(from.Unix(), 0), min(to.Unix(), 1<<32-1)
	table, args := newestRows("rollup_total_hour", "bucket", "bucket >= toDateTime(?) AND bucket < toDateTime(?)", []any{lo, hi},
		"requests > 0 AND peak_minute_requests = 0")
	return s.hours(ctx, "SELECT bucket FROM "+table+"\nORDER BY bucket", args...)
}

// TrafficRows runs a traffic read (see query.TrafficRead), returning its
// rows and the id of each row's step and series.
func (s *Store) TrafficRows(ctx context.Context, r query.TrafficRead) ([]query.TrafficRow, []string, error) {
	q := r.Query
	stmt, args := trafficSQL(r)
	var (
		out    []query.TrafficRow
		ids    []string
		t      query.TrafficRow
		errsBy = make([]uint64, len(errClasses))
		k      = newStepKey(len(q.GroupBy))
	)
	dest := k.dest(&t.Requests, &t.Errors)
	for i := range errsBy {
		dest = append(dest, &errsBy[i])
	}
	dest = append(dest, &t.PromptTokens, &t.OutputTokens, &t.PeakMinuteRequests, &t.PeakMinuteOutputTokens)
	err := s.each(ctx, "traffic", stmt, args, dest, func() error {
		t.Start = k.start(q.StepSeconds(), q.Start)
		t.Group = groupMap(q.GroupBy, k.groups)
		t.ErrorsBy = make(map[string]uint64, len(errClasses))
		for i, c := range errClasses {
			t.ErrorsBy[c] = errsBy[i]
		}
		out = append(out, t)
		ids = append(ids, k.id())
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, ids, nil
}
