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

// The reads and writes of the day rollup (package rollup decides which
// days are fresh and which to roll up): the newest computation of each
// hour of rollup_tenant_hour, the hour_versions of the newest day rows of
// rollup_tenant_day, and the INSERT of a day's rows.

// HourVersions lists the hours in [from, to) of rollup_tenant_hour with the
// version of their newest computation and the SLO version it counted
// goodput with, in hour order.
func (s *Store) HourVersions(ctx context.Context, from, to time.Time) ([]rollup.HourVersion, error) {
	rows, err := s.conn.Query(ctx, `SELECT bucket, max(version), argMax(slo_version, version)
FROM rollup_tenant_hour
WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?)
GROUP BY bucket
ORDER BY bucket`, from.Unix(), to.Unix())
	if err != nil {
		return nil, fmt.Errorf("list rolled-up hours: %w", classify(err))
	}
	defer rows.Close()
	var out []rollup.HourVersion
	for rows.Next() {
		var h rollup.HourVersion
		if err := rows.Scan(&h.Hour, &h.Version, &h.SLOVersion); err != nil {
			return nil, fmt.Errorf("list rolled-up hours: %w", err)
		}
		h.Hour = h.Hour.UTC()
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list rolled-up hours: %w", classify(err))
	}
	return out, nil
}

// DayVersions lists the days in [from, to) of rollup_tenant_day with the
// hour_versions of their newest rows, in day order.
func (s *Store) DayVersions(ctx context.Context, from, to time.Time) ([]rollup.DayVersion, error) {
	rows, err := s.conn.Query(ctx, `SELECT bucket, argMax(hour_versions, version)
FROM rollup_tenant_day
WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?)
GROUP BY bucket
ORDER BY bucket`, from.Unix(), to.Unix())
	if err != nil {
		return nil, fmt.Errorf("list day rollups: %w", classify(err))
	}
	defer rows.Close()
	var out []rollup.DayVersion
	for rows.Next() {
		var d rollup.DayVersion
		if err := rows.Scan(&d.Day, &d.HourVersions); err != nil {
			return nil, fmt.Errorf("list day rollups: %w", err)
		}
		d.Day = d.Day.UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list day rollups: %w", classify(err))
	}
	return out, nil
}

// WriteDay writes the rows of rollup_tenant_day for d, with version: per
// tenant, the sums of its rows in rollup_tenant_hour of the computations
// d.Hours names, in d.Day's bucket, with hour_versions d.HourVersions.
// Without hours it writes nothing.
func (s *Store) WriteDay(ctx context.Context, d rollup.DayRollup, version uint64) error {
	if len(d.Hours) == 0 {
		return nil
	}
	byHour := func(a, b rollup.HourVersion) int { return a.Hour.Compare(b.Hour) }
	first, last := slices.MinFunc(d.Hours, byHour).Hour, slices.MaxFunc(d.Hours, byHour).Hour
	pairs := make([]string, len(d.Hours))
	for i, h := range d.Hours {
		pairs[i] = "(" + strconv.FormatInt(h.Hour.Unix(), 10) + ", " + strconv.FormatUint(h.Version, 10) + ")"
	}
	// Rows are matched to columns by position: no aliases, which would
	// shadow the columns in WHERE.
	sel := []string{"toDateTime(?)", "tenant_id", "''", "''", "''", "''", "''", "sum(requests)", "sum(errors)"}
	for _, c := range errClasses {
		sel = append(sel, "sum(err_"+c+")")
	}
	sel = append(sel, "sum(prompt_tokens)", "sum(cached_prompt_tokens)", "sum(output_tokens)")
	for _, m := range distColumns {
		sel = append(sel, "sum("+m+"_count)", floatSum(m+"_sum"),
			fmt.Sprintf("(sumMap(%[1]s_keys, %[1]s_counts) AS day_%[1]s).1", m), "day_"+m+".2")
	}
	sel = append(sel, "any(slo_version)", "sum(good_requests)", "sum(good_output_tokens)", "toUInt64(?)")
	// A tenant's busiest minute of the day is the busiest of its hours'.
	for _, c := range peakColumns {
		sel = append(sel, "max("+c+")")
	}
	sel = append(sel, "toUInt64(?)")
	for _, d := range hourDistColumns {
		sel = append(sel, fmt.Sprintf("(sumMap(%[1]s_keys, %[1]s_counts) AS day_%[1]s).1", d), "day_"+d+".2")
	}
	hist := hourHistColumns()
	if decodeKept("rollup_tenant_day") {
		// A tenant's day keeps decode only if every hour row of it did.
		hist = append(hist, "decode_kept")
		sel = append(sel, "min(decode_kept)")
	}
	query := fmt.Sprintf(`INSERT INTO rollup_tenant_day (%s, %s, hour_versions, %s)
SELECT %s
FROM rollup_tenant_hour
WHERE bucket >= toDateTime(?) AND bucket <= toDateTime(?)
  AND (toUInt32(bucket), version) IN (%s)
GROUP BY tenant_id`, rollupColumnList, strings.Join(peakColumns, ", "), strings.Join(hist, ", "), strings.Join(sel, ", "), strings.Join(pairs, ", "))
	if err := s.conn.Exec(ctx, query, d.Day.Unix(), version, d.HourVersions, first.Unix(), last.Unix()); err != nil {
		return fmt.Errorf("roll up day %s: %w", d.Day.Format(time.DateOnly), classify(err))
	}
	return nil
}
