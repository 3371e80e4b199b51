package chstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"tokenmeter/rollup"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// ErrInvalidQuery marks a query the caller must fix: a bad range, an unknown
// granularity or group-by field. Errors wrapping it carry a readable reason.
var ErrInvalidQuery = errors.New("invalid query")

// ErrUnavailable marks a query that failed because ClickHouse could not be
// reached or did not answer; retrying later may succeed.
var ErrUnavailable = errors.New("clickhouse unavailable")

// classify wraps errors that are not answers of the server (connection
// refused, reset, timeouts) with ErrUnavailable.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// stepExpr buckets the DateTime expression col by step, as Unix seconds
// (UInt32); "total" is the range start, a bound argument.
func stepExpr(col, step string, start time.Time) (string, []any) {
	switch w := rollup.Granularities[step]; {
	case w > 0:
		return fmt.Sprintf("toUInt32(intDiv(toUInt32(%s), %d) * %d)", col, w, w), nil
	case w < 0:
		return fmt.Sprintf("toUInt32(toDateTime(toStartOfMonth(%s, 'UTC'), 'UTC'))", col), nil
	}
	return "toUInt32(?)", []any{start.Unix()}
}

// UsageGroupFields are the dimensions usage can be grouped by.
var UsageGroupFields = []string{"tenant_id", "model", "deployment"}

// MaxUsageBuckets bounds the number of time buckets one query may ask for.
const MaxUsageBuckets = 50_000

// UsageQuery selects exact usage totals.
type UsageQuery struct {
	// TenantID restricts to one tenant when non-empty.
	TenantID string
	// Start (inclusive) and End (exclusive) bound completed_at, to the millisecond.
	Start, End time.Time
	// Granularity is "minute", "hour", "day" or "total" (default).
	Granularity string
	// GroupBy lists fields of UsageGroupFields.
	GroupBy []string
}

// UsageRow is the usage of one group in one bucket.
type UsageRow struct {
	Start              time.Time
	TenantID           string
	Model              string
	Deployment         string
	Requests           int64
	Errors             int64
	PromptTokens       int64
	CachedPromptTokens int64
	OutputTokens       int64
}

// Normalize fills defaults and checks the query, joining every problem.
// Errors wrap ErrInvalidQuery.
func (q UsageQuery) Normalize() (UsageQuery, error) {
	var errs []error
	if q.Granularity == "" {
		q.Granularity = "total"
	}
	step, ok := rollup.Granularities[q.Granularity]
	if !ok {
		errs = append(errs, fmt.Errorf("%w: granularity %q: want minute, hour, day, month or total", ErrInvalidQuery, q.Granularity))
	}
	switch {
	case q.Start.IsZero() || q.End.IsZero():
		errs = append(errs, fmt.Errorf("%w: start and end are required", ErrInvalidQuery))
	case !q.End.After(q.Start):
		errs = append(errs, fmt.Errorf("%w: end (%s) must be after start (%s)", ErrInvalidQuery, q.End.Format(time.RFC3339), q.Start.Format(time.RFC3339)))
	case q.Start.Unix() < 0 || q.End.Unix() > 1<<32-1:
		errs = append(errs, fmt.Errorf("%w: range must lie between 1970 and 2106", ErrInvalidQuery))
	case ok && step > 0 && q.End.Sub(q.Start)/time.Duration(step*int64(time.Second)) > MaxUsageBuckets:
		errs = append(errs, fmt.Errorf("%w: range of %s at granularity %s is more than %d buckets; use a coarser granularity",
			ErrInvalidQuery, q.End.Sub(q.Start), q.Granularity, MaxUsageBuckets))
	}
	group, gerrs := parseGroupBy(q.GroupBy, UsageGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	return q, errors.Join(errs...)
}

// parseGroupBy reads group-by fields (repeated or comma-separated) against
// the allowed ones, returning them in the allowed order, so that the SQL and
// the output do not depend on the order the caller listed them in.
func parseGroupBy(asked, allowed []string) ([]string, []error) {
	var errs []error
	seen := map[string]bool{}
	for _, g := range asked {
		for _, f := range strings.Split(g, ",") {
			f = strings.TrimSpace(f)
			if f == "" || seen[f] {
				continue
			}
			seen[f] = true
			if !contains(allowed, f) {
				errs = append(errs, fmt.Errorf("%w: unknown group_by field %q: want any of %s", ErrInvalidQuery, f, strings.Join(allowed, ", ")))
			}
		}
	}
	var out []string
	for _, f := range allowed {
		if seen[f] {
			out = append(out, f)
		}
	}
	return out, errs
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// SQL builds the usage query for a normalized UsageQuery. The inner query
// deduplicates by (tenant_id, event_id) so that duplicates never count twice,
// whatever the state of background merges.
func (q UsageQuery) SQL() (string, []any) { return q.rawSQL(nil) }

// hourList writes hours as a ClickHouse IN list of Unix seconds.
func hourList(hours []time.Time) string {
	parts := make([]string, len(hours))
	for i, h := range hours {
		parts[i] = strconv.FormatInt(h.Unix(), 10)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// rawSQL reads raw events; with onlyHours, only those UTC hours.
func (q UsageQuery) rawSQL(onlyHours []time.Time) (string, []any) {
	startMs, endMs := q.Start.UnixMilli(), q.End.UnixMilli()
	// Second-resolution bounds on completed_at use the primary key and
	// partitions; the millisecond bounds make the range exact.
	startS := q.Start.Unix()
	endS := q.End.Unix() // inclusive: End may have a fractional second
	bucket, args := stepExpr("d_completed_at", q.Granularity, time.Unix(startS, 0))
	var sb strings.Builder
	sb.WriteString("SELECT ")
	sb.WriteString(bucket)
	sb.WriteString(" AS bucket")
	for _, f := range q.GroupBy {
		fmt.Fprintf(&sb, ", d_%s", f)
	}
	sb.WriteString(`, count() AS requests, countIf(d_status != 'ok') AS errors,
 sum(d_prompt_tokens) AS prompt_tokens, sum(d_cached_prompt_tokens) AS cached_prompt_tokens, sum(d_output_tokens) AS output_tokens
FROM (
 SELECT tenant_id AS d_tenant_id, event_id, any(completed_at) AS d_completed_at, any(model) AS d_model,
  any(deployment) AS d_deployment, any(status) AS d_status, any(prompt_tokens) AS d_prompt_tokens,
  any(cached_prompt_tokens) AS d_cached_prompt_tokens, any(output_tokens) AS d_output_tokens
 FROM inference_events
 WHERE completed_at >= toDateTime(?) AND completed_at <= toDateTime(?) AND completed_at_ms >= ? AND completed_at_ms < ?`)
	args = append(args, startS, endS, startMs, endMs)
	if q.TenantID != "" {
		sb.WriteString(" AND tenant_id = ?")
		args = append(args, q.TenantID)
	}
	if onlyHours != nil {
		sb.WriteString(" AND intDiv(toUInt32(completed_at), 3600) * 3600 IN " + hourList(onlyHours))
	}
	sb.WriteString("\n GROUP BY tenant_id, event_id\n)\nGROUP BY bucket")
	for _, f := range q.GroupBy {
		fmt.Fprintf(&sb, ", d_%s", f)
	}
	// Only buckets with data: grouping by a constant ("total") would
	// otherwise yield one row of zeros for an empty range.
	sb.WriteString("\nHAVING requests > 0\nORDER BY bucket")
	for _, f := range q.GroupBy {
		fmt.Fprintf(&sb, ", d_%s", f)
	}
	return sb.String(), args
}

// rollupSQL reads the rollups, leaving out the hours in exclude. The range
// must lie on whole minutes.
func (q UsageQuery) rollupSQL(exclude []time.Time) (string, []any) {
	table := rollupTable(q.Start, q.End, q.Granularity, q.TenantID, q.GroupBy)
	bucket, args := stepExpr("bucket", q.Granularity, q.Start)
	cols := append([]string{bucket + " AS b"}, q.GroupBy...)
	nSelect := len(args)
	where := "bucket >= toDateTime(?) AND bucket < toDateTime(?)"
	args = append(args, q.Start.Unix(), q.End.Unix())
	if q.TenantID != "" {
		where += " AND tenant_id = ?"
		args = append(args, q.TenantID)
	}
	filter := ""
	if len(exclude) > 0 {
		filter = "intDiv(toUInt32(bucket), 3600) * 3600 NOT IN " + hourList(exclude)
	}
	groups := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	from, fromArgs := newestRows(table, "bucket", where, args[nSelect:], filter)
	return fmt.Sprintf(`SELECT %s, sum(requests) AS r, sum(errors), sum(prompt_tokens), sum(cached_prompt_tokens), sum(output_tokens)
FROM %s
GROUP BY %s
HAVING r > 0
ORDER BY %s`, strings.Join(cols, ", "), from, groups, groups), append(args[:nSelect:nSelect], fromArgs...)
}

// Usage runs a usage query, exact and deduplicated. Ranges on whole minutes
// read the rollups for every hour the rollup job has finished, and raw
// events for the hours touched since (late events included), so that the
// answer is the same as from raw events alone, at rollup speed. Other ranges,
// or a store the job has not run on yet, read raw events. Invalid queries
// return an error wrapping ErrInvalidQuery.
func (s *Store) Usage(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	if q.Start.Truncate(time.Minute).Equal(q.Start) && q.End.Truncate(time.Minute).Equal(q.End) {
		wm, ok, err := s.Watermark(ctx, rollup.JobName)
		if err != nil {
			return nil, err
		}
		if ok {
			dirty, err := s.DirtyHours(ctx, wm.Add(-rollup.Overlap), time.Unix(1<<32-1, 0))
			if err != nil {
				return nil, err
			}
			var inRange []time.Time
			for _, h := range dirty {
				if h.Add(time.Hour).After(q.Start) && h.Before(q.End) {
					inRange = append(inRange, h)
				}
			}
			query, args := q.rollupSQL(inRange)
			rolled, err := s.usageRows(ctx, q, query, args)
			if err != nil || len(inRange) == 0 {
				return rolled, err
			}
			query, args = q.rawSQL(inRange)
			raw, err := s.usageRows(ctx, q, query, args)
			if err != nil {
				return nil, err
			}
			return mergeUsage(append(rolled, raw...)), nil
		}
	}
	query, args := q.rawSQL(nil)
	return s.usageRows(ctx, q, query, args)
}

// mergeUsage sums rows of the same bucket and group, ordered like the SQL.
func mergeUsage(rows []UsageRow) []UsageRow {
	type key struct {
		start                     int64
		tenant, model, deployment string
	}
	idx := map[key]int{}
	var out []UsageRow
	for _, r := range rows {
		k := key{r.Start.Unix(), r.TenantID, r.Model, r.Deployment}
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, r)
			continue
		}
		o := &out[i]
		o.Requests += r.Requests
		o.Errors += r.Errors
		o.PromptTokens += r.PromptTokens
		o.CachedPromptTokens += r.CachedPromptTokens
		o.OutputTokens += r.OutputTokens
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.Start.Equal(b.Start) {
			return a.Start.Before(b.Start)
		}
		if a.TenantID != b.TenantID {
			return a.TenantID < b.TenantID
		}
		if a.Model != b.Model {
			return a.Model < b.Model
		}
		return a.Deployment < b.Deployment
	})
	return out
}

// usageRows runs a usage query of either source; both return bucket, the
// group-by values, requests, errors and the three token sums.
func (s *Store) usageRows(ctx context.Context, q UsageQuery, query string, args []any) ([]UsageRow, error) {
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query usage: %w", classify(err))
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var (
			bucket                                   uint32
			groups                                   = make([]string, len(q.GroupBy))
			requests, errs, prompt, cached, outputTk uint64
		)
		dest := []any{&bucket}
		for i := range groups {
			dest = append(dest, &groups[i])
		}
		dest = append(dest, &requests, &errs, &prompt, &cached, &outputTk)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan usage: %w", err)
		}
		r := UsageRow{
			Start:    time.Unix(int64(bucket), 0).UTC(),
			Requests: int64(requests), Errors: int64(errs), PromptTokens: int64(prompt),
			CachedPromptTokens: int64(cached), OutputTokens: int64(outputTk),
		}
		if rollup.Granularities[q.Granularity] == 0 {
			r.Start = q.Start.UTC()
		}
		for i, f := range q.GroupBy {
			switch f {
			case "tenant_id":
				r.TenantID = groups[i]
			case "model":
				r.Model = groups[i]
			case "deployment":
				r.Deployment = groups[i]
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read usage: %w", classify(err))
	}
	return out, nil
}
