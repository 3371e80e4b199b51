package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"tokenmeter/rollup"
)

// Traffic reads requests, errors and tokens per step and group with the
// step's busiest minute (its requests and its output tokens, each its own
// largest), exactly, at any range: ClickHouse returns one row per step and
// group, so no query reads minute buckets into this process. Which rows
// answer (trafficSource):
//
//   - A range not on whole hours, or a minute step: rollup_minute, summed
//     per minute and group, then per step (the busiest minute is the
//     largest of those sums).
//   - Whole hours, and each series is exactly the rows of one hour level
//     (no group_by: rollup_total_hour, or rollup_tenant_hour for one
//     tenant; group_by tenant_id: rollup_tenant_hour, with the fresh days
//     of rollup_tenant_day at day steps and more; every dimension:
//     rollup_hour): each row's own busiest minute (migration 0009), the
//     step's being the largest.
//   - Whole hours, and a series merges several rows of an hour (group_by
//     model, say): rollup_hour, whose rows' per-minute counts are summed
//     per hour and series, the busiest minute being the largest sum. The
//     largest of the rows' own peaks would overstate nothing but could miss
//     a minute where two rows are both busy.
//
// Hours whose rows were computed before migration 0009 have no peaks (the
// rollup job recomputes them, newest first): until then their peaks are
// read from rollup_minute as in the first case, for those hours only.

// TrafficRow is the traffic of one group in one step.
type TrafficRow struct {
	Start        time.Time
	Group        map[string]string
	Requests     uint64
	Errors       uint64
	ErrorsBy     map[string]uint64 // per rollup.StatusClasses entry
	PromptTokens uint64
	OutputTokens uint64
	// PeakMinuteRequests and PeakMinuteOutputTokens are the requests and
	// the output tokens of the step's busiest minute for each (the two may
	// come from different minutes).
	PeakMinuteRequests     uint64
	PeakMinuteOutputTokens uint64
}

// Add merges o, another step of the same series, into r: the counters add
// up and the busiest minute is the busier of the two (the steps of a series
// do not overlap, so this is the busiest minute of both).
func (r *TrafficRow) Add(o TrafficRow) {
	r.Requests += o.Requests
	r.Errors += o.Errors
	if r.ErrorsBy == nil {
		r.ErrorsBy = map[string]uint64{}
	}
	for c, n := range o.ErrorsBy {
		r.ErrorsBy[c] += n
	}
	r.PromptTokens += o.PromptTokens
	r.OutputTokens += o.OutputTokens
	r.PeakMinuteRequests = max(r.PeakMinuteRequests, o.PeakMinuteRequests)
	r.PeakMinuteOutputTokens = max(r.PeakMinuteOutputTokens, o.PeakMinuteOutputTokens)
}

// trafficSource is the kind of rows a traffic query reads (see Traffic).
type trafficSource int

const (
	// trafficMinutes: minute rows, summed per minute and series.
	trafficMinutes trafficSource = iota
	// trafficLevel: hour (or day) rows that are each a series' own.
	trafficLevel
	// trafficMerged: rollup_hour rows merged per series, with their
	// per-minute counts.
	trafficMerged
)

// trafficSource picks the rows that answer a normalized q, and their table
// (rollupTable's choice).
func (q RollupQuery) trafficSource() (trafficSource, string) {
	table := q.table()
	switch table {
	case "rollup_minute":
		return trafficMinutes, table
	case "rollup_hour":
		// A series is one rollup_hour row per hour when it fixes every
		// dimension: grouped by it, or the query's tenant.
		fixed := len(q.GroupBy)
		if q.TenantID != "" && !slices.Contains(q.GroupBy, "tenant_id") {
			fixed++
		}
		if fixed < len(rollup.RollupGroupFields) {
			return trafficMerged, table
		}
	}
	return trafficLevel, table
}

// trafficCounters are the summed columns of a traffic row, in TrafficRow
// order.
func trafficCounters() []string {
	cols := []string{"requests", "errors"}
	for _, c := range rollup.StatusClasses {
		cols = append(cols, "err_"+c)
	}
	return append(cols, "prompt_tokens", "output_tokens")
}

// trafficSQL builds the query of a normalized q reading src rows from
// table. The inner query gives each step, bucket (hour or minute) and
// series its counters and busiest minute; the outer one sums the counters
// per step and series and keeps the busiest minute. days are whole days
// read from rollup_tenant_day (trafficLevel on rollup_tenant_hour only);
// onlyHours, when not nil, restricts the read to those hours. limit bounds
// the rows returned (0: no bound).
func (q RollupQuery) trafficSQL(src trafficSource, table string, days, onlyHours []time.Time, limit int) (string, []any) {
	bucket, args := stepExpr("bucket", q.Step, q.Start)
	inner := append([]string{bucket + " AS b"}, q.GroupBy...)
	counters := trafficCounters()
	for _, c := range counters {
		if src == trafficLevel {
			inner = append(inner, c+" AS t_"+c)
		} else {
			inner = append(inner, "sum("+c+") AS t_"+c)
		}
	}
	switch src {
	case trafficLevel:
		inner = append(inner, "peak_minute_requests AS t_peak_requests", "peak_minute_output_tokens AS t_peak_output")
	case trafficMinutes:
		inner = append(inner, "sum(requests) AS t_peak_requests", "sum(output_tokens) AS t_peak_output")
	case trafficMerged:
		inner = append(inner, "arrayReduce('max', sumForEach(minute_requests)) AS t_peak_requests",
			"arrayReduce('max', sumForEach(minute_output_tokens)) AS t_peak_output")
	}
	where := "bucket >= toDateTime(?) AND bucket < toDateTime(?)"
	whereArgs := []any{q.Start.Unix(), q.End.Unix()}
	if q.TenantID != "" {
		where += " AND tenant_id = ?"
		whereArgs = append(whereArgs, q.TenantID)
	}
	filter := ""
	if onlyHours != nil {
		filter = "intDiv(toUInt32(bucket), 3600) * 3600 IN " + hourList(onlyHours)
	}
	from, fromArgs := newestRows(table, "bucket", where, whereArgs, filter)
	if len(days) > 0 {
		cols := slices.Concat([]string{"bucket"}, rollup.RollupGroupFields, counters, peakColumns)
		from, fromArgs = withDays(strings.Join(cols, ", "), days, where, whereArgs)
	}
	args = append(args, fromArgs...)
	innerSQL := fmt.Sprintf("SELECT %s\n  FROM %s", strings.Join(inner, ", "), strings.ReplaceAll(from, "\n", "\n  "))
	if src != trafficLevel {
		innerSQL += "\n  GROUP BY " + strings.Join(append([]string{"b", "bucket"}, q.GroupBy...), ", ")
	}
	outer := append([]string{"b"}, q.GroupBy...)
	for _, c := range counters {
		outer = append(outer, "sum(t_"+c+")")
	}
	outer = append(outer, "max(t_peak_requests)", "max(t_peak_output)")
	groups := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	query := fmt.Sprintf("SELECT %s\nFROM (\n  %s\n)\nGROUP BY %s\nORDER BY %s", strings.Join(outer, ", "), innerSQL, groups, groups)
	if limit > 0 {
		query += fmt.Sprintf("\nLIMIT %d, %d", q.Offset, limit)
	}
	return query, args
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

// Traffic runs a traffic query (see the comment at the top of this file);
// q.Columns is not used. Without a Limit, a query selecting more than
// Config.MaxSeriesRows rows fails with ErrTooManySeries.
func (s *Store) Traffic(ctx context.Context, q RollupQuery) ([]TrafficRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit == 0 {
		limit = s.cfg.MaxSeriesRows + 1
	}
	src, table := q.trafficSource()
	var days, old []time.Time
	if src != trafficMinutes {
		if old, err = s.HoursWithoutPeaks(ctx, q.Start, q.End); err != nil {
			return nil, err
		}
		if src == trafficLevel && q.usesDays() {
			if days, err = s.freshDays(ctx, q.Start, q.End); err != nil {
				return nil, err
			}
		}
	}
	query, args := q.trafficSQL(src, table, days, nil, limit)
	out, ids, err := s.trafficRows(ctx, q, query, args)
	if err != nil {
		return nil, err
	}
	if q.Limit == 0 && len(out) > s.cfg.MaxSeriesRows {
		return nil, s.tooManySeries()
	}
	if len(old) == 0 {
		return out, nil
	}
	// The hours without peaks, from their minute rows: the same steps and
	// series, or fewer.
	query, args = q.trafficSQL(trafficMinutes, "rollup_minute", nil, old, 0)
	fallback, fallbackIDs, err := s.trafficRows(ctx, q, query, args)
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	for i, id := range fallbackIDs {
		if j, ok := index[id]; ok {
			r, f := &out[j], &fallback[i]
			r.PeakMinuteRequests = max(r.PeakMinuteRequests, f.PeakMinuteRequests)
			r.PeakMinuteOutputTokens = max(r.PeakMinuteOutputTokens, f.PeakMinuteOutputTokens)
		}
	}
	return out, nil
}

// trafficRows runs a query of trafficSQL, returning its rows and the id of
// each row's step and series.
func (s *Store) trafficRows(ctx context.Context, q RollupQuery, query string, args []any) ([]TrafficRow, []string, error) {
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("query traffic: %w", classify(err))
	}
	defer rows.Close()
	var (
		out []TrafficRow
		ids []string
	)
	for rows.Next() {
		var (
			r      TrafficRow
			errsBy = make([]uint64, len(rollup.StatusClasses))
			k      = newStepKey(len(q.GroupBy))
		)
		dest := k.dest(&r.Requests, &r.Errors)
		for i := range errsBy {
			dest = append(dest, &errsBy[i])
		}
		dest = append(dest, &r.PromptTokens, &r.OutputTokens, &r.PeakMinuteRequests, &r.PeakMinuteOutputTokens)
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, fmt.Errorf("scan traffic: %w", err)
		}
		r.Start = k.start()
		if rollup.Granularities[q.Step] == 0 {
			r.Start = q.Start.UTC()
		}
		r.Group = groupMap(q.GroupBy, k.groups)
		r.ErrorsBy = make(map[string]uint64, len(rollup.StatusClasses))
		for i, c := range rollup.StatusClasses {
			r.ErrorsBy[c] = errsBy[i]
		}
		out = append(out, r)
		ids = append(ids, k.id())
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read traffic: %w", classify(err))
	}
	return out, ids, nil
}
