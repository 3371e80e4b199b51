package chstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"tokenmeter/query"
)

// usageRawSQL reads usage from raw events; with onlyHours, only those UTC
// hours. The inner query deduplicates by (tenant_id, event_id) so that
// duplicates never count twice, whatever the state of background merges.
func usageRawSQL(q query.UsageQuery, onlyHours []time.Time) (string, []any) {
	startMs, endMs := q.Start.UnixMilli(), q.End.UnixMilli()
	// Second-resolution bounds on completed_at use the primary key and
	// partitions; the millisecond bounds make the range exact.
	startS := q.Start.Unix()
	endS := q.End.Unix() // inclusive: End may have a fractional second
	bucket, args := stepExpr("d_completed_at", q.StepSeconds(), time.Unix(startS, 0))
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

// usageRollupSQL reads usage from the rollups of level, leaving out the
// hours in exclude. The range must lie on whole minutes.
func usageRollupSQL(q query.UsageQuery, level query.Level, exclude []time.Time) (string, []any) {
	bucket, args := stepExpr("bucket", q.StepSeconds(), q.Start)
	cols := append([]string{bucket + " AS b"}, q.GroupBy...)
	nSelect := len(args)
	where, whereArgs := scope("bucket", q.Start, q.End, q.TenantID)
	filter := ""
	if len(exclude) > 0 {
		filter = "intDiv(toUInt32(bucket), 3600) * 3600 NOT IN " + hourList(exclude)
	}
	groups := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	from, fromArgs := newestRows(levelTables[level], "bucket", where, whereArgs, filter)
	return fmt.Sprintf(`SELECT %s, sum(requests) AS r, sum(errors), sum(prompt_tokens), sum(cached_prompt_tokens), sum(output_tokens)
FROM %s
GROUP BY %s
HAVING r > 0
ORDER BY %s`, strings.Join(cols, ", "), from, groups, groups), append(args[:nSelect:nSelect], fromArgs...)
}

// usageSQL is the SQL of a usage read.
func usageSQL(r query.UsageRead) (string, []any) {
	if r.Raw {
		return usageRawSQL(r.Query, r.Hours)
	}
	return usageRollupSQL(r.Query, r.Level, r.Hours)
}

// UsageRows runs a usage read (see query.UsageRead), rows ordered by
// bucket, then group.
func (s *Store) UsageRows(ctx context.Context, r query.UsageRead) ([]query.UsageRow, error) {
	q := r.Query
	stmt, args := usageSQL(r)
	var (
		out                                      []query.UsageRow
		k                                        = newStepKey(len(q.GroupBy))
		requests, errs, prompt, cached, outputTk uint64
	)
	err := s.each(ctx, "usage", stmt, args, k.dest(&requests, &errs, &prompt, &cached, &outputTk), func() error {
		u := query.UsageRow{
			Start:    k.start(q.StepSeconds(), q.Start),
			Requests: int64(requests), Errors: int64(errs), PromptTokens: int64(prompt),
			CachedPromptTokens: int64(cached), OutputTokens: int64(outputTk),
		}
		for i, f := range q.GroupBy {
			switch f {
			case "tenant_id":
				u.TenantID = k.groups[i]
			case "model":
				u.Model = k.groups[i]
			case "deployment":
				u.Deployment = k.groups[i]
			}
		}
		out = append(out, u)
		return nil
	})
	return out, err
}
