package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/rollup/sketch"
)

// StatusClasses are the error classes counted per rollup row, in column order
// (err_<class>).
var StatusClasses = []string{"context_length", "rate_limited", "oom", "cuda", "timeout", "cancelled", "bad_request", "internal"}

// LatencyMetrics are the distributions kept per rollup row, in column order
// (<metric>_count, _sum, _keys, _counts).
var LatencyMetrics = []string{"ttft", "itl", "e2e", "queue"}

// RollupGroupFields are the dimensions rollup queries can group by.
var RollupGroupFields = []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}

// GoodputRule is one SLO rule compiled for a rollup: empty Tenant, Model or
// Class match anything; a threshold ≤ 0 is not checked. Rules are given most
// specific first; the first match decides.
type GoodputRule struct {
	Tenant, Model, Class string
	TTFTMs, ITLMs, E2EMs float64
}

// GoodputSpec is the SLO set a rollup counts good requests with.
type GoodputSpec struct {
	Version uint32
	Rules   []GoodputRule
	// DefaultClass is the class of events without slo_class.
	DefaultClass string
}

// thresholdSQL returns a multiIf choosing, per row, the threshold of the
// first matching rule (-1 when none applies).
func (g GoodputSpec) thresholdSQL(pick func(GoodputRule) float64) (string, []any) {
	var sb strings.Builder
	var args []any
	sb.WriteString("multiIf(")
	n := 0
	for _, r := range g.Rules {
		var conds []string
		if r.Tenant != "" {
			conds = append(conds, "tenant_id = ?")
			args = append(args, r.Tenant)
		}
		if r.Model != "" {
			conds = append(conds, "d_model = ?")
			args = append(args, r.Model)
		}
		if r.Class != "" {
			conds = append(conds, "d_class = ?")
			args = append(args, r.Class)
		}
		if len(conds) == 0 {
			conds = append(conds, "1")
		}
		fmt.Fprintf(&sb, "%s, toFloat64(?), ", strings.Join(conds, " AND "))
		t := pick(r)
		if t <= 0 {
			t = -1
		}
		args = append(args, t)
		n++
	}
	sb.WriteString("toFloat64(-1))")
	if n == 0 {
		return "toFloat64(-1)", nil
	}
	return sb.String(), args
}

// rollupColumns is the column list of both rollup tables.
func rollupColumns() []string {
	cols := []string{"bucket", "tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class", "requests", "errors"}
	for _, c := range StatusClasses {
		cols = append(cols, "err_"+c)
	}
	cols = append(cols, "prompt_tokens", "cached_prompt_tokens", "output_tokens")
	for _, m := range LatencyMetrics {
		cols = append(cols, m+"_count", m+"_sum", m+"_keys", m+"_counts")
	}
	return append(cols, "slo_version", "good_requests", "good_output_tokens", "version")
}

// RollupMinutesSQL builds the statement that recomputes the minute rollups of
// [from, to) from deduplicated raw events, counting good requests with spec.
func RollupMinutesSQL(from, to time.Time, spec GoodputSpec, version uint64) (string, []any) {
	ttft, ttftArgs := spec.thresholdSQL(func(r GoodputRule) float64 { return r.TTFTMs })
	itl, itlArgs := spec.thresholdSQL(func(r GoodputRule) float64 { return r.ITLMs })
	e2e, e2eArgs := spec.thresholdSQL(func(r GoodputRule) float64 { return r.E2EMs })
	var sel []string
	sel = append(sel,
		"toDateTime(intDiv(toUInt32(d_completed_at), 60) * 60) AS bucket",
		"tenant_id", "d_model", "d_model_version", "d_deployment", "d_gpu_type", "d_slo_class",
		"count() AS requests", "countIf(d_status != 'ok') AS errors")
	for _, c := range StatusClasses {
		sel = append(sel, fmt.Sprintf("countIf(d_status = '%s')", c))
	}
	sel = append(sel, "sum(d_prompt_tokens)", "sum(d_cached_prompt_tokens)", "sum(d_output_tokens)")
	for _, m := range LatencyMetrics {
		v := "d_" + m
		sel = append(sel,
			fmt.Sprintf("countIf(isNotNull(%s))", v),
			fmt.Sprintf("sumIf(ifNull(%s, 0), isNotNull(%s))", v, v),
			fmt.Sprintf("(%s AS %s_hist).1", sketch.SQLHistogram(v), m),
			m+"_hist.2")
	}
	sel = append(sel, "toUInt32(?)", "countIf(d_good)", "sumIf(d_output_tokens, d_good)", "toUInt64(?)")
	inner := `SELECT tenant_id, event_id,
   any(completed_at) AS d_completed_at, any(model) AS d_model, any(model_version) AS d_model_version,
   any(deployment) AS d_deployment, any(gpu_type) AS d_gpu_type, any(slo_class) AS d_slo_class,
   any(status) AS d_status, any(prompt_tokens) AS d_prompt_tokens,
   any(cached_prompt_tokens) AS d_cached_prompt_tokens, any(output_tokens) AS d_output_tokens,
   any(ttft_ms) AS d_ttft, any(itl_ms) AS d_itl, any(e2e_ms) AS d_e2e, any(queue_ms) AS d_queue
  FROM inference_events
  WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)
  GROUP BY tenant_id, event_id`
	// Goodput per ARCHITECTURE "Goodput": status OK and every configured
	// threshold met (a missing measurement fails a configured threshold).
	middle := fmt.Sprintf(`SELECT *, if(d_slo_class = '', ?, d_slo_class) AS d_class,
   %[1]s AS t_ttft, %[2]s AS t_itl, %[3]s AS t_e2e,
   d_status = 'ok'
    AND (t_ttft < 0 OR (isNotNull(d_ttft) AND ifNull(d_ttft, 0) <= t_ttft))
    AND (t_itl < 0 OR isNull(d_itl) OR ifNull(d_itl, 0) <= t_itl)
    AND (t_e2e < 0 OR (isNotNull(d_e2e) AND ifNull(d_e2e, 0) <= t_e2e)) AS d_good
  FROM (%[4]s)`, ttft, itl, e2e, inner)
	query := fmt.Sprintf("INSERT INTO rollup_minute (%s)\nSELECT %s\nFROM (%s)\nGROUP BY bucket, tenant_id, d_model, d_model_version, d_deployment, d_gpu_type, d_slo_class",
		strings.Join(rollupColumns(), ", "), strings.Join(sel, ",\n  "), middle)
	var args []any
	args = append(args, spec.Version, version)  // select list
	args = append(args, spec.DefaultClass)      // d_class
	args = append(args, ttftArgs...)            // thresholds
	args = append(args, itlArgs...)             //
	args = append(args, e2eArgs...)             //
	args = append(args, from.Unix(), to.Unix()) // inner range
	return query, args
}

// RollupHourSQL builds the statement that writes the hour rollup of hour
// into table from the rows of one computation (version) of source, merging
// histograms exactly and keeping the dimensions in keep (the others are
// left empty): rollup_hour from rollup_minute keeps them all,
// rollup_tenant_hour keeps tenant_id, rollup_total_hour none.
func RollupHourSQL(table, source string, keep []string, hour time.Time, version uint64) (string, []any) {
	sel := []string{"toDateTime(?) AS b"}
	for _, f := range RollupGroupFields {
		if slices.Contains(keep, f) {
			sel = append(sel, f)
		} else {
			sel = append(sel, "''")
		}
	}
	sel = append(sel, "sum(requests)", "sum(errors)")
	for _, c := range StatusClasses {
		sel = append(sel, "sum(err_"+c+")")
	}
	sel = append(sel, "sum(prompt_tokens)", "sum(cached_prompt_tokens)", "sum(output_tokens)")
	for _, m := range LatencyMetrics {
		sel = append(sel, "sum("+m+"_count)", "sum("+m+"_sum)",
			fmt.Sprintf("(%s AS %s_hist).1", sketch.SQLMerge(m+"_keys", m+"_counts"), m), m+"_hist.2")
	}
	sel = append(sel, "max(slo_version)", "sum(good_requests)", "sum(good_output_tokens)", "toUInt64(?)")
	query := fmt.Sprintf(`INSERT INTO %s (%s)
SELECT %s
FROM %s
WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) AND version = ?`,
		table, strings.Join(rollupColumns(), ", "), strings.Join(sel, ",\n  "), source)
	if len(keep) > 0 {
		query += "\nGROUP BY " + strings.Join(keep, ", ")
	}
	return query, []any{hour.Unix(), version, hour.Unix(), hour.Add(time.Hour).Unix(), version}
}

// hourLevels are the hour rollups and what each is built from, in order.
var hourLevels = []struct {
	table, source string
	keep          []string
}{
	{"rollup_hour", "rollup_minute", RollupGroupFields},
	{"rollup_tenant_hour", "rollup_hour", []string{"tenant_id"}},
	{"rollup_total_hour", "rollup_tenant_hour", nil},
}

// RollupHour recomputes the minute and hour rollups of one UTC hour.
func (s *Store) RollupHour(ctx context.Context, hour time.Time, spec GoodputSpec, version uint64) error {
	_, err := s.RollupHourTimed(ctx, hour, spec, version)
	return err
}

// RollupHourTimed is RollupHour, returning how long each table took
// (rollup_minute, then the hour levels), for benchmarks.
func (s *Store) RollupHourTimed(ctx context.Context, hour time.Time, spec GoodputSpec, version uint64) (map[string]time.Duration, error) {
	took := map[string]time.Duration{}
	hour = hour.UTC().Truncate(time.Hour)
	start := time.Now()
	q, args := RollupMinutesSQL(hour, hour.Add(time.Hour), spec, version)
	if err := s.conn.Exec(ctx, q, args...); err != nil {
		return nil, fmt.Errorf("roll up minutes of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	took["rollup_minute"] = time.Since(start)
	for _, l := range hourLevels {
		start = time.Now()
		q, args = RollupHourSQL(l.table, l.source, l.keep, hour, version)
		if err := s.conn.Exec(ctx, q, args...); err != nil {
			return nil, fmt.Errorf("roll up hour %s into %s: %w", hour.Format(time.RFC3339), l.table, classify(err))
		}
		took[l.table] = time.Since(start)
	}
	return took, nil
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
