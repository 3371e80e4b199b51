package chstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"tokenmeter/rollup"

	"tokenmeter/rollup/sketch"
)

// RollupQuery selects rollup rows merged per (step, group).
type RollupQuery struct {
	// TenantID restricts to one tenant when non-empty.
	TenantID string
	// Start (inclusive) and End (exclusive) must lie on minute boundaries;
	// the hour table is used when both lie on hour boundaries and Step is
	// not "minute".
	Start, End time.Time
	// Step is "minute", "hour", "day" or "total".
	Step string
	// GroupBy lists fields of rollup.RollupGroupFields.
	GroupBy []string
	// Limit bounds the rows returned (0: no bound); Offset skips rows.
	Limit, Offset int
	// Columns chooses what is read (default: everything); what is not read
	// is zero in the rows.
	Columns RollupColumns
}

// RollupColumns chooses the columns a rollup query reads.
type RollupColumns int

const (
	// AllColumns reads everything.
	AllColumns RollupColumns = iota
	// CounterColumns reads requests, errors, tokens and goodput: no latency.
	CounterColumns
	// LatencyColumns reads the latency distributions only.
	LatencyColumns
)

// Dist is one latency distribution: count, sum and sparse histogram.
type Dist struct {
	Count  uint64
	Sum    float64
	Keys   []int16
	Counts []uint64
}

// RollupRow is the merged rollup of one group in one step.
type RollupRow struct {
	Start        time.Time
	Group        map[string]string
	Requests     uint64
	Errors       uint64
	ErrorsBy     map[string]uint64 // per rollup.StatusClasses entry
	PromptTokens uint64
	CachedTokens uint64
	OutputTokens uint64
	Latency      map[string]Dist // per rollup.LatencyMetrics entry
	// Goodput, counted with SLO versions MinSLO..MaxSLO (equal unless a
	// recomputation after an SLO change is still under way).
	GoodRequests     uint64
	GoodOutputTokens uint64
	MinSLO, MaxSLO   uint32
}

// Normalize fills defaults and checks the query; errors wrap ErrInvalidQuery.
func (q RollupQuery) Normalize() (RollupQuery, error) {
	u := UsageQuery{Start: q.Start, End: q.End, Granularity: q.Step}
	var errs []error
	if q.Step == "" {
		q.Step = "total"
	}
	if _, ok := rollup.Granularities[q.Step]; !ok {
		errs = append(errs, fmt.Errorf("%w: step %q: want minute, hour, day, month or total", ErrInvalidQuery, q.Step))
	}
	u.Granularity = q.Step
	if _, err := u.Normalize(); err != nil && len(errs) == 0 {
		errs = append(errs, err)
	}
	if !q.Start.IsZero() && (q.Start.Truncate(time.Minute) != q.Start || q.End.Truncate(time.Minute) != q.End) {
		errs = append(errs, fmt.Errorf("%w: start and end must be whole minutes", ErrInvalidQuery))
	}
	group, gerrs := parseGroupBy(q.GroupBy, rollup.RollupGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	if q.Columns < AllColumns || q.Columns > LatencyColumns {
		errs = append(errs, fmt.Errorf("%w: unknown rollup columns %d", ErrInvalidQuery, q.Columns))
	}
	if q.Limit < 0 || q.Offset < 0 {
		errs = append(errs, fmt.Errorf("%w: limit and offset must not be negative", ErrInvalidQuery))
	}
	return q, errors.Join(errs...)
}

// table picks the rollup table for the query.
func (q RollupQuery) table() string {
	return rollupTable(q.Start, q.End, q.Step, q.TenantID, q.GroupBy)
}

// rollupTable picks the coarsest rollup that answers a query: hour tables
// when the range lies on whole hours and the step is not a minute; among
// them the per-tenant or all-tenant one when the grouping allows.
func rollupTable(start, end time.Time, step, tenant string, groupBy []string) string {
	if step == "minute" || !start.Truncate(time.Hour).Equal(start) || !end.Truncate(time.Hour).Equal(end) {
		return "rollup_minute"
	}
	switch {
	case len(groupBy) == 0 && tenant == "":
		return "rollup_total_hour"
	case len(groupBy) == 0 || (len(groupBy) == 1 && groupBy[0] == "tenant_id"):
		return "rollup_tenant_hour"
	}
	return "rollup_hour"
}

// newestRows is the FROM clause (and its arguments) of a read of the rows
// of table whose time column (bucket or hour) and tenant match scope, and
// that pass filter (an expression without arguments). For the hour rollups
// and the cost tables these are the rows of the newest computation of each
// hour: a computation writes all its rows of a table in one INSERT, with
// one version, and no tenant or group ever drops out of a later one (events
// and samples stay), so this is FINAL's answer without FINAL's merge of
// every part (on 18.16, a tenant's month of latency 0.39 s with FINAL,
// 0.12 s without; every tenant's month of cost 1.8 s, 0.36 s).
// rollup_minute, written in several inserts per hour, is read with FINAL.
func newestRows(table, timeCol, scope string, scopeArgs []any, filter string) (string, []any) {
	where := scope
	if filter != "" {
		where += " AND " + filter
	}
	if table == "rollup_minute" {
		return fmt.Sprintf("%s FINAL\nWHERE %s", table, where), scopeArgs
	}
	return fmt.Sprintf("%[1]s\nWHERE %[2]s\n  AND (%[3]s, version) IN (SELECT %[3]s, max(version) FROM %[1]s WHERE %[4]s GROUP BY %[3]s)",
		table, where, timeCol, scope), slices.Concat(scopeArgs, scopeArgs)
}

// SQL builds the query for a normalized RollupQuery: ClickHouse merges
// the rows of each (step, group), histograms with sumMap.
func (q RollupQuery) SQL() (string, []any) {
	return q.sql(true, nil)
}

// reads reports whether q reads the counters and the latency columns.
func (q RollupQuery) reads() (counters, latency bool) {
	return q.Columns != LatencyColumns, q.Columns != CounterColumns
}

// sql builds the query; merged false selects the rollup rows one by one,
// with their step and group, for Store.rollups to merge (RollupRow.add).
// days are whole days of the range to read from rollup_tenant_day instead
// of their hours (only when q reads rollup_tenant_hour at a step of a day
// or more).
func (q RollupQuery) sql(merged bool, days []time.Time) (string, []any) {
	bucket, args := stepExpr("bucket", q.Step, q.Start)
	sel := []string{bucket + " AS b"}
	sel = append(sel, q.GroupBy...)
	agg := func(f, col string) string {
		if merged {
			return f + "(" + col + ")"
		}
		return col
	}
	counters, latency := q.reads()
	if counters {
		sel = append(sel, agg("sum", "requests"), agg("sum", "errors"))
		for _, c := range rollup.StatusClasses {
			sel = append(sel, agg("sum", "err_"+c))
		}
		sel = append(sel, agg("sum", "prompt_tokens"), agg("sum", "cached_prompt_tokens"), agg("sum", "output_tokens"))
	}
	if latency {
		for _, m := range rollup.LatencyMetrics {
			// The arrays come as text: clickhouse-go scans an array
			// element by element through reflection (about 100 ns per
			// element, a third of a tenant's month of latency).
			sel = append(sel, agg("sum", m+"_count"), agg("sum", m+"_sum"))
			if merged {
				sel = append(sel, fmt.Sprintf("toString((%s AS %s_h).1)", sketch.SQLMerge(m+"_keys", m+"_counts"), m), "toString("+m+"_h.2)")
			} else {
				sel = append(sel, "toString("+m+"_keys)", "toString("+m+"_counts)")
			}
		}
	}
	if counters {
		sel = append(sel, agg("sum", "good_requests"), agg("sum", "good_output_tokens"), agg("min", "slo_version"), agg("max", "slo_version"))
	}
	where := "bucket >= toDateTime(?) AND bucket < toDateTime(?)"
	whereArgs := []any{q.Start.Unix(), q.End.Unix()}
	if q.TenantID != "" {
		where += " AND tenant_id = ?"
		whereArgs = append(whereArgs, q.TenantID)
	}
	from, fromArgs := newestRows(q.table(), "bucket", where, whereArgs, "")
	if len(days) > 0 {
		from, fromArgs = withDays(rollupColumnList, days, where, whereArgs)
	}
	args = append(args, fromArgs...)
	query := fmt.Sprintf("SELECT %s\nFROM %s", strings.Join(sel, ", "), from)
	if !merged {
		return query, args
	}
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	query += fmt.Sprintf("\nGROUP BY %s\nORDER BY %s", groupBy, groupBy)
	if q.Limit > 0 {
		query += fmt.Sprintf("\nLIMIT %d, %d", q.Offset, q.Limit)
	}
	return query, args
}

// withDays is the FROM clause of a read of the columns cols (a list) of
// rollup_tenant_hour in the range and scope of where in which days are read
// from rollup_tenant_day: the newest rows of those days, and of the other
// hours.
func withDays(cols string, days []time.Time, where string, whereArgs []any) (string, []any) {
	list := hourList(days)
	dayFrom, dayArgs := newestRows("rollup_tenant_day", "bucket", where, whereArgs, "toUInt32(bucket) IN "+list)
	hourFrom, hourArgs := newestRows("rollup_tenant_hour", "bucket", where, whereArgs, "intDiv(toUInt32(bucket), 86400) * 86400 NOT IN "+list)
	return fmt.Sprintf("(\n  SELECT %[1]s\n  FROM %[2]s\n  UNION ALL\n  SELECT %[1]s\n  FROM %[3]s\n)", cols, dayFrom, hourFrom),
		slices.Concat(dayArgs, hourArgs)
}

// usesDays reports whether q may read whole days from rollup_tenant_day: a
// read of every tenant's tenant-hour rows at a step of a day or more. (One
// tenant's month is 720 rows, read fast enough; checking which day rows
// are fresh reads every tenant's hour versions.)
func (q RollupQuery) usesDays() bool {
	return q.table() == "rollup_tenant_hour" && q.TenantID == "" && rollup.Granularities[q.Step] != rollup.Granularities["hour"]
}

// mergeHere reports whether the rows of q are few enough to be merged by
// this process rather than by ClickHouse: one tenant's hour rows, or the
// all-tenant ones (a month is a few thousand rows). On 18.16, sumMap costs
// about a microsecond per histogram bucket even when a step has one row to
// merge, so a tenant's month of latency at hour step spent 0.1–0.3 s in it.
func (q RollupQuery) mergeHere() bool {
	switch q.table() {
	case "rollup_total_hour":
		return true
	case "rollup_tenant_hour", "rollup_hour":
		return q.TenantID != ""
	}
	return false
}

// ErrTooManySeries marks a query whose answer would have more (step,
// series) rows than the store serves at once; it wraps ErrInvalidQuery.
var ErrTooManySeries = fmt.Errorf("%w: too many series", ErrInvalidQuery)

func (s *Store) tooManySeries() error {
	return fmt.Errorf("%w: the query selects more than %d series × steps; narrow the range, use a coarser step or fewer group_by fields",
		ErrTooManySeries, s.cfg.MaxSeriesRows)
}

// Rollups runs a rollup query. Without a Limit, a query selecting more than
// Config.MaxSeriesRows rows fails with ErrTooManySeries.
func (s *Store) Rollups(ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	return s.rollups(ctx, q, RollupQuery.mergeHere, true)
}

// rollups runs a rollup query, merging the rows here when mergeHere says so
// and reading fresh day rollups where the query allows it and days is set.
func (s *Store) rollups(ctx context.Context, q RollupQuery, mergeHere func(RollupQuery) bool, days bool) ([]RollupRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	bounded := q.Limit == 0
	if bounded {
		q.Limit = s.cfg.MaxSeriesRows + 1
	}
	here := mergeHere(q)
	counters, latency := q.reads()
	var fresh []time.Time
	if days && q.usesDays() {
		if fresh, err = s.freshDays(ctx, q.Start, q.End); err != nil {
			return nil, err
		}
	}
	query, args := q.sql(!here, fresh)
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query rollups: %w", classify(err))
	}
	defer rows.Close()
	var (
		out   []RollupRow
		index = map[string]int{} // step and group → out, when merging here
	)
	for rows.Next() {
		var (
			errsBy = make([]uint64, len(rollup.StatusClasses))
			dists  = make([]Dist, len(rollup.LatencyMetrics))
			r      RollupRow
			k      = newStepKey(len(q.GroupBy))
		)
		dest := k.dest()
		if counters {
			dest = append(dest, &r.Requests, &r.Errors)
			for i := range errsBy {
				dest = append(dest, &errsBy[i])
			}
			dest = append(dest, &r.PromptTokens, &r.CachedTokens, &r.OutputTokens)
		}
		var keys, counts [4]string
		if latency {
			for i := range dists {
				dest = append(dest, &dists[i].Count, &dists[i].Sum, &keys[i], &counts[i])
			}
		}
		if counters {
			dest = append(dest, &r.GoodRequests, &r.GoodOutputTokens, &r.MinSLO, &r.MaxSLO)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan rollups: %w", err)
		}
		if latency {
			for i := range dists {
				if dists[i].Keys, err = parseArray[int16](keys[i], 16); err == nil {
					dists[i].Counts, err = parseArray[uint64](counts[i], 64)
				}
				if err != nil {
					return nil, fmt.Errorf("scan rollups: histogram of %s: %w", rollup.LatencyMetrics[i], err)
				}
			}
		}
		if here {
			id := k.id()
			if i, ok := index[id]; ok {
				if err := out[i].add(&r, errsBy, dists); err != nil {
					return nil, err
				}
				continue
			}
			index[id] = len(out)
		}
		r.Start = k.start()
		if rollup.Granularities[q.Step] == 0 {
			r.Start = q.Start.UTC()
		}
		r.Group = groupMap(q.GroupBy, k.groups)
		r.ErrorsBy = map[string]uint64{}
		for i, c := range rollup.StatusClasses {
			r.ErrorsBy[c] = errsBy[i]
		}
		r.Latency = map[string]Dist{}
		for i, m := range rollup.LatencyMetrics {
			r.Latency[m] = dists[i]
		}
		out = append(out, r)
		if bounded && len(out) > s.cfg.MaxSeriesRows {
			return nil, s.tooManySeries()
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read rollups: %w", classify(err))
	}
	if here {
		out = pageRollups(out, q.GroupBy, q.Offset, q.Limit)
	}
	return out, nil
}

// add merges the rollup row o, scanned with its errors by class and its
// distributions, into r, as the SQL aggregation would.
func (r *RollupRow) add(o *RollupRow, errsBy []uint64, dists []Dist) error {
	r.Requests += o.Requests
	r.Errors += o.Errors
	for i, c := range rollup.StatusClasses {
		r.ErrorsBy[c] += errsBy[i]
	}
	r.PromptTokens += o.PromptTokens
	r.CachedTokens += o.CachedTokens
	r.OutputTokens += o.OutputTokens
	for i, m := range rollup.LatencyMetrics {
		d, od := r.Latency[m], dists[i]
		h, err := sketch.FromArrays(d.Keys, d.Counts)
		if err != nil {
			return fmt.Errorf("rollup histogram of %s: %w", m, err)
		}
		oh, err := sketch.FromArrays(od.Keys, od.Counts)
		if err != nil {
			return fmt.Errorf("rollup histogram of %s: %w", m, err)
		}
		h.Merge(oh)
		r.Latency[m] = Dist{Count: d.Count + od.Count, Sum: d.Sum + od.Sum, Keys: h.Keys, Counts: h.Counts}
	}
	r.GoodRequests += o.GoodRequests
	r.GoodOutputTokens += o.GoodOutputTokens
	r.MinSLO, r.MaxSLO = min(r.MinSLO, o.MinSLO), max(r.MaxSLO, o.MaxSLO)
	return nil
}

// pageRollups orders rows as the SQL does (by step, then group-by fields)
// and returns the page of limit rows (0: all) from offset.
func pageRollups(rows []RollupRow, groupBy []string, offset, limit int) []RollupRow {
	slices.SortFunc(rows, func(a, b RollupRow) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		for _, f := range groupBy {
			if c := strings.Compare(a.Group[f], b.Group[f]); c != 0 {
				return c
			}
		}
		return 0
	})
	rows = rows[min(offset, len(rows)):]
	if limit > 0 && len(rows) > limit {
		rows = rows[:limit]
	}
	return rows
}

// parseArray parses ClickHouse's text form of an array of integers of the
// given bit size (16: Int16, 64: UInt64), such as "[-3,0,17]", in one pass.
func parseArray[T int16 | uint64](text string, bits int) ([]T, error) {
	if len(text) < 2 || text[0] != '[' || text[len(text)-1] != ']' {
		return nil, fmt.Errorf("not an array: %.40q", text)
	}
	body := text[1 : len(text)-1]
	if body == "" {
		return nil, nil
	}
	signed := bits < 64
	out := make([]T, 0, strings.Count(body, ",")+1)
	var (
		v      uint64
		neg    bool
		digits int
	)
	for i := 0; i <= len(body); i++ {
		if i == len(body) || body[i] == ',' {
			switch {
			case digits == 0:
				return nil, fmt.Errorf("bad array element in %.40q", text)
			case signed && !neg && v > math.MaxInt16, signed && neg && v > -math.MinInt16:
				return nil, fmt.Errorf("array element out of range in %.40q", text)
			case neg:
				out = append(out, T(-int64(v)))
			default:
				out = append(out, T(v))
			}
			v, neg, digits = 0, false, 0
			continue
		}
		c := body[i]
		switch {
		case c == '-' && signed && digits == 0 && !neg:
			neg = true
		case c >= '0' && c <= '9':
			d := uint64(c - '0')
			if v > (math.MaxUint64-d)/10 {
				return nil, fmt.Errorf("array element out of range in %.40q", text)
			}
			v = v*10 + d
			digits++
		default:
			return nil, fmt.Errorf("bad array element in %.40q", text)
		}
	}
	return out, nil
}
