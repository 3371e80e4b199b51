package chstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"tokenmeter/rollup"
)

// hourVersion is the newest computation of one hour of rollup_tenant_hour.
type hourVersion struct {
	hour    time.Time
	version uint64
	slo     uint32 // the SLO version that computation counted goodput with
}

// newestHours lists the hours in [from, to) of rollup_tenant_hour with the
// version of their newest computation, in hour order.
func (s *Store) newestHours(ctx context.Context, from, to time.Time) ([]hourVersion, error) {
	rows, err := s.conn.Query(ctx, `SELECT bucket, max(version), argMax(slo_version, version)
FROM rollup_tenant_hour
WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?)
GROUP BY bucket
ORDER BY bucket`, from.Unix(), to.Unix())
	if err != nil {
		return nil, fmt.Errorf("list rolled-up hours: %w", classify(err))
	}
	defer rows.Close()
	var out []hourVersion
	for rows.Next() {
		var h hourVersion
		if err := rows.Scan(&h.hour, &h.version, &h.slo); err != nil {
			return nil, fmt.Errorf("list rolled-up hours: %w", err)
		}
		h.hour = h.hour.UTC()
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list rolled-up hours: %w", classify(err))
	}
	return out, nil
}

// daySums adds up the versions of hours per day: what the hour_versions of a
// fresh day row holds.
func daySums(hours []hourVersion) map[int64]uint64 {
	sums := map[int64]uint64{}
	for _, h := range hours {
		sums[rollup.DayOf(h.hour).Unix()] += h.version
	}
	return sums
}

// dayRows returns the hour_versions of the newest day rows of the days in
// [from, to), by day.
func (s *Store) dayRows(ctx context.Context, from, to time.Time) (map[int64]uint64, error) {
	rows, err := s.conn.Query(ctx, `SELECT bucket, argMax(hour_versions, version)
FROM rollup_tenant_day
WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?)
GROUP BY bucket`, from.Unix(), to.Unix())
	if err != nil {
		return nil, fmt.Errorf("list day rollups: %w", classify(err))
	}
	defer rows.Close()
	out := map[int64]uint64{}
	for rows.Next() {
		var (
			d  time.Time
			hv uint64
		)
		if err := rows.Scan(&d, &hv); err != nil {
			return nil, fmt.Errorf("list day rollups: %w", err)
		}
		out[d.Unix()] = hv
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list day rollups: %w", classify(err))
	}
	return out, nil
}

// dayStates splits the days in [from, to) that have hour rollups into
// those with a fresh day row and those whose day row is missing or stale,
// each in order.
func (s *Store) dayStates(ctx context.Context, from, to time.Time) (fresh, stale []time.Time, err error) {
	hours, err := s.newestHours(ctx, from, to)
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.dayRows(ctx, from, to)
	if err != nil {
		return nil, nil, err
	}
	for d, sum := range daySums(hours) {
		day := time.Unix(d, 0).UTC()
		if hv, ok := rows[d]; ok && hv == sum {
			fresh = append(fresh, day)
		} else {
			stale = append(stale, day)
		}
	}
	slices.SortFunc(fresh, time.Time.Compare)
	slices.SortFunc(stale, time.Time.Compare)
	return fresh, stale, nil
}

// StaleDays lists the UTC days in [from, before) that have hour rollups but
// no fresh day rollup: never computed, or computed before one of their
// hours was recomputed, in order. From and before are rounded down to
// days; a zero from lists every stale day.
func (s *Store) StaleDays(ctx context.Context, from, before time.Time) ([]time.Time, error) {
	if from.Before(time.Unix(0, 0)) {
		from = time.Unix(0, 0)
	}
	_, stale, err := s.dayStates(ctx, rollup.DayOf(from), rollup.DayOf(before))
	return stale, err
}

// freshDays lists the whole UTC days inside [start, end) whose day rollup
// is fresh, in order.
func (s *Store) freshDays(ctx context.Context, start, end time.Time) ([]time.Time, error) {
	first := rollup.DayOf(start.Add(rollup.Day - time.Second))
	last := rollup.DayOf(end) // exclusive
	if !first.Before(last) {
		return nil, nil
	}
	fresh, _, err := s.dayStates(ctx, first, last)
	return fresh, err
}

// RollupDay recomputes the day rollup of the UTC day holding day from the
// newest rows of its hours in rollup_tenant_hour, written with version. It
// reports false, writing nothing, when the day has no hour rollups, or
// when its hours were counted with different SLO versions (an SLO change
// being recomputed): queries then read the day's hours.
func (s *Store) RollupDay(ctx context.Context, day time.Time, version uint64) (bool, error) {
	day = rollup.DayOf(day)
	hours, err := s.newestHours(ctx, day, day.Add(rollup.Day))
	if err != nil || len(hours) == 0 {
		return false, err
	}
	var (
		sum   uint64
		pairs = make([]string, len(hours))
	)
	for i, h := range hours {
		if h.slo != hours[0].slo {
			return false, nil
		}
		sum += h.version
		pairs[i] = "(" + strconv.FormatInt(h.hour.Unix(), 10) + ", " + strconv.FormatUint(h.version, 10) + ")"
	}
	// Rows are matched to columns by position: no aliases, which would
	// shadow the columns in WHERE.
	sel := []string{"toDateTime(?)", "tenant_id", "''", "''", "''", "''", "''", "sum(requests)", "sum(errors)"}
	for _, c := range rollup.StatusClasses {
		sel = append(sel, "sum(err_"+c+")")
	}
	sel = append(sel, "sum(prompt_tokens)", "sum(cached_prompt_tokens)", "sum(output_tokens)")
	for _, m := range rollup.LatencyMetrics {
		sel = append(sel, "sum("+m+"_count)", "sum("+m+"_sum)",
			fmt.Sprintf("(sumMap(%[1]s_keys, %[1]s_counts) AS day_%[1]s).1", m), "day_"+m+".2")
	}
	sel = append(sel, "any(slo_version)", "sum(good_requests)", "sum(good_output_tokens)", "toUInt64(?)")
	// A tenant's busiest minute of the day is the busiest of its hours'.
	for _, c := range peakColumns {
		sel = append(sel, "max("+c+")")
	}
	sel = append(sel, "toUInt64(?)")
	query := fmt.Sprintf(`INSERT INTO rollup_tenant_day (%s, %s, hour_versions)
SELECT %s
FROM rollup_tenant_hour
WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?)
  AND (toUInt32(bucket), version) IN (%s)
GROUP BY tenant_id`, rollupColumnList, strings.Join(peakColumns, ", "), strings.Join(sel, ", "), strings.Join(pairs, ", "))
	if err := s.conn.Exec(ctx, query, day.Unix(), version, sum, day.Unix(), day.Add(rollup.Day).Unix()); err != nil {
		return false, fmt.Errorf("roll up day %s: %w", day.Format(time.DateOnly), classify(err))
	}
	return true, nil
}
