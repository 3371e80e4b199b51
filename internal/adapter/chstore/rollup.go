package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// rollupColumns is the column list of every rollup table.
func rollupColumns() []string {
	cols := slices.Concat([]string{"bucket"}, dimColumns, []string{"requests", "errors"})
	for _, c := range errClasses {
		cols = append(cols, "err_"+c)
	}
	cols = append(cols, "prompt_tokens", "cached_prompt_tokens", "output_tokens")
	for _, m := range distColumns {
		cols = append(cols, m+"_count", m+"_sum", m+"_keys", m+"_counts")
	}
	return append(cols, "slo_version", "good_requests", "good_output_tokens", "version")
}

var rollupColumnList = strings.Join(rollupColumns(), ", ")

// peakColumns are the busiest minute of an hour or day row (migration
// 0009); rollup_minute_recent has no such columns: a minute row is its own minute.
var peakColumns = []string{"peak_minute_requests", "peak_minute_output_tokens"}

// minuteColumns are the per-minute requests and output tokens of an hour
// row (migration 0009).
var minuteColumns = []string{"minute_requests", "minute_output_tokens"}

// hourHistColumns are the histogram columns of hourDistColumns, keys then
// counts of each.
func hourHistColumns() []string {
	var cols []string
	for _, d := range hourDistColumns {
		cols = append(cols, d+"_keys", d+"_counts")
	}
	return cols
}

// decodeKept reports whether table's rows are written with decode_kept = 1
// (migration 0029): the tenant rows, which keep decode since
// rollup.HourDistTables gives it to them; older rows hold 0, and their
// empty decode arrays do not mean "no decode" (a read that meets one
// answers from rollup_hour instead: query.RollupRow.DecodeUnkept).
func decodeKept(table string) bool {
	return (table == "rollup_tenant_hour" || table == "rollup_tenant_day") && slices.Contains(rollup.HourDistTables[table], "decode")
}

// columnsOf is the column list of table's rows as written: the hour tables
// add the peak, per-minute and hour histogram columns to every rollup
// table's columns, and the tenant rows decode_kept (decodeKept).
func columnsOf(table string) []string {
	if table == "rollup_minute_recent" {
		return rollupColumns()
	}
	cols := slices.Concat(rollupColumns(), peakColumns, minuteColumns, hourHistColumns())
	if decodeKept(table) {
		cols = append(cols, "decode_kept")
	}
	return cols
}

// ServerNow is ClickHouse's clock, which stamps dirty_hours.
func (s *Store) ServerNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.conn.QueryRow(ctx, "SELECT now()").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read server time: %w", classify(err))
	}
	return t.UTC(), nil
}

// DirtyHours lists the hours touched by inserts stamped in [since, until).
// A zero since lists every hour holding events.
func (s *Store) DirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error) {
	query := "SELECT DISTINCT hour FROM dirty_hours WHERE ingested_at >= toDateTime(?) AND ingested_at < toDateTime(?) ORDER BY hour"
	args := []any{since.Unix(), until.Unix()}
	if since.IsZero() {
		query = "SELECT DISTINCT toDateTime(intDiv(toUInt32(completed_at), 3600) * 3600) AS h FROM inference_events ORDER BY h"
		args = nil
	}
	return s.hours(ctx, query, args...)
}

// StaleSLOHours lists the hours whose rollups counted goodput with an SLO
// version other than current.
func (s *Store) StaleSLOHours(ctx context.Context, current uint32) ([]time.Time, error) {
	return s.hours(ctx, "SELECT DISTINCT bucket FROM rollup_hour FINAL WHERE slo_version != ? ORDER BY bucket", current)
}

func (s *Store) hours(ctx context.Context, query string, args ...any) ([]time.Time, error) {
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list hours: %w", classify(err))
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var h time.Time
		if err := rows.Scan(&h); err != nil {
			return nil, fmt.Errorf("list hours: %w", err)
		}
		out = append(out, h.UTC())
	}
	return out, rows.Err()
}

// Watermark reads a job's watermark; ok is false before the first run.
func (s *Store) Watermark(ctx context.Context, job string) (t time.Time, ok bool, err error) {
	// Watermarks only move forward, so the newest is the largest.
	rows, err := s.conn.Query(ctx, "SELECT max(watermark) FROM rollup_state WHERE job = ? GROUP BY job", job)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read watermark: %w", classify(err))
	}
	defer rows.Close()
	if !rows.Next() {
		return time.Time{}, false, rows.Err()
	}
	if err := rows.Scan(&t); err != nil {
		return time.Time{}, false, fmt.Errorf("read watermark: %w", err)
	}
	return t.UTC(), true, nil
}

// SetWatermark records a job's progress.
func (s *Store) SetWatermark(ctx context.Context, job string, t time.Time) error {
	if err := s.insertRow(ctx, "INSERT INTO rollup_state (job, watermark, updated_at)", job, t.UTC().Truncate(time.Second), time.Now().UTC().Truncate(time.Second)); err != nil {
		return fmt.Errorf("write watermark: %w", err)
	}
	return nil
}

// CurrentSLO returns the newest SLO set version and its JSON; ok is false
// when none was ever stored.
func (s *Store) CurrentSLO(ctx context.Context) (version uint32, rules string, ok bool, err error) {
	rows, err := s.conn.Query(ctx, "SELECT version, rules FROM slo_sets ORDER BY version DESC LIMIT 1")
	if err != nil {
		return 0, "", false, fmt.Errorf("read SLO set: %w", classify(err))
	}
	defer rows.Close()
	if !rows.Next() {
		return 0, "", false, rows.Err()
	}
	if err := rows.Scan(&version, &rules); err != nil {
		return 0, "", false, fmt.Errorf("read SLO set: %w", err)
	}
	return version, rules, true, nil
}

// PutSLO stores rules as a new version (the current one plus 1) and returns it.
func (s *Store) PutSLO(ctx context.Context, rules, source string) (uint32, error) {
	current, _, _, err := s.CurrentSLO(ctx)
	if err != nil {
		return 0, err
	}
	v := current + 1
	if err := s.insertRow(ctx, "INSERT INTO slo_sets (version, rules, source, created_at)", v, rules, source, time.Now().UTC().Truncate(time.Second)); err != nil {
		return 0, fmt.Errorf("store SLO set: %w", err)
	}
	return v, nil
}

// insertRow inserts one row through a native batch (INSERT ... VALUES with
// bound arguments is not supported by ClickHouse 18.16 over the native protocol).
func (s *Store) insertRow(ctx context.Context, insert string, values ...any) error {
	batch, err := s.conn.PrepareBatch(ctx, insert)
	if err != nil {
		return classify(err)
	}
	if err := batch.Append(values...); err != nil {
		_ = batch.Abort()
		return err
	}
	return classify(batch.Send())
}

// LevelVersions reads the newest version of each hour of [from, to) at a
// rollup level (hour levels only).
func (s *Store) LevelVersions(ctx context.Context, level query.Level, from, to time.Time) (map[time.Time]uint64, error) {
	table, ok := levelTables[level]
	if !ok || level == query.LevelMinute {
		return nil, fmt.Errorf("hour versions: no hour level %d", level)
	}
	rows, err := s.conn.Query(ctx, "SELECT bucket, max(version) FROM "+table+
		" WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) GROUP BY bucket", from.Unix(), to.Unix())
	if err != nil {
		return nil, fmt.Errorf("read hour versions of %s: %w", table, classify(err))
	}
	defer rows.Close()
	out := map[time.Time]uint64{}
	for rows.Next() {
		var (
			h time.Time
			v uint64
		)
		if err := rows.Scan(&h, &v); err != nil {
			return nil, fmt.Errorf("read hour versions of %s: %w", table, err)
		}
		out[h.UTC()] = v
	}
	return out, rows.Err()
}
