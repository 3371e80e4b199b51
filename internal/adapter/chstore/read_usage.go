package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/query"
)

// usageRawSQL reads usage from raw events; with onlyHours, only those UTC
// hours. The inner query deduplicates by (tenant_id, event_id) so that
// duplicates never count twice, whatever the state of background merges.
func usageRawSQL(q query.UsageQuery, onlyHours []time.Time) (string, []any) {
	if servingGrouped(q.GroupBy) {
		return usageRawServingSQL(q, onlyHours)
	}
	bucket, args := stepExpr("d_completed_at", q.StepSeconds(), time.Unix(q.Start.Unix(), 0))
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
  any(cached_prompt_tokens) AS d_cached_prompt_tokens, any(output_tokens) AS d_output_tokens`)
	from, fromArgs := dedupedEvents(q, onlyHours)
	sb.WriteString(from)
	args = append(args, fromArgs...)
	sb.WriteString("\n)\nGROUP BY bucket")
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

// dedupedEvents ends the inner query of a raw usage read (after its
// select list): any(model_version) when grouped by it, the FROM and WHERE
// of the events of q's range and tenant (of onlyHours only, when not nil),
// grouped by (tenant_id, event_id).
func dedupedEvents(q query.UsageQuery, onlyHours []time.Time) (string, []any) {
	var sb strings.Builder
	if slices.Contains(q.GroupBy, "model_version") {
		sb.WriteString(", any(model_version) AS d_model_version")
	}
	sb.WriteString(`
 FROM inference_events
 WHERE completed_at >= toDateTime(?) AND completed_at <= toDateTime(?) AND completed_at_ms >= ? AND completed_at_ms < ?`)
	// Second-resolution bounds on completed_at use the primary key and
	// partitions; the millisecond bounds make the range exact; End.Unix()
	// is inclusive: End may have a fractional second.
	args := []any{q.Start.Unix(), q.End.Unix(), q.Start.UnixMilli(), q.End.UnixMilli()}
	if q.TenantID != "" {
		sb.WriteString(" AND tenant_id = ?")
		args = append(args, q.TenantID)
	}
	if onlyHours != nil {
		sb.WriteString(" AND intDiv(toUInt32(completed_at), 3600) * 3600 IN " + hourList(onlyHours))
	}
	sb.WriteString("\n GROUP BY tenant_id, event_id")
	return sb.String(), args
}

// servingGrouped reports whether a grouping needs the serving labels of
// each row's hour, deployment and model (engine, tensor_parallelism).
func servingGrouped(groupBy []string) bool {
	return slices.Contains(groupBy, "engine") || slices.Contains(groupBy, "tensor_parallelism")
}

// servingCols are the columns of the serving labels in the joined reads.
var servingCols = map[string]string{"engine": "s_engine", "tensor_parallelism": "s_tp"}

// servingGroups returns the grouping columns of a read joined with the
// serving labels: groupBy's, the labels by their joined names, and the
// inner query's columns (the hour, deployment and model the labels are
// joined on, and groupBy's other fields, named by inner).
func servingGroups(groupBy []string, inner func(f string) string) (outer []string, in []string) {
	as := func(f string) string {
		if inner(f) == f {
			return f
		}
		return inner(f) + " AS " + f
	}
	in = []string{"s_hour", as("deployment"), as("model")}
	for _, f := range groupBy {
		switch {
		case servingCols[f] != "":
			outer = append(outer, servingCols[f])
		case f == "deployment" || f == "model":
			outer = append(outer, f)
		default:
			outer = append(outer, inner(f))
			in = append(in, inner(f))
		}
	}
	return outer, in
}

// servingJoin wraps the inner query of a usage read (its rows summed per
// bucket b, s_hour, deployment, model and other groups, as i_requests,
// i_errors, i_prompt, i_cached and i_output) in the join with the serving
// labels of its hours (labels: a query of s_hour, deployment, model,
// s_engine, s_tp) and its grouping by outer.
func servingJoin(inner, labels string, outer []string) string {
	groups := strings.Join(append([]string{"b"}, outer...), ", ")
	return fmt.Sprintf(`SELECT %[1]s, sum(i_requests) AS r, sum(i_errors), sum(i_prompt), sum(i_cached), sum(i_output)
FROM (
%[2]s
) ANY LEFT JOIN (
%[3]s
) USING (s_hour, deployment, model)
GROUP BY %[1]s
HAVING r > 0
ORDER BY %[1]s`, groups, inner, labels)
}

// hourOf is the Unix hour (UInt32) of a DateTime column or expression.
func hourOf(col string) string {
	return fmt.Sprintf("toUInt32(intDiv(toUInt32(%s), 3600) * 3600)", col)
}

// labelHours is the range of whole hours that hold [start, end).
func labelHours(start, end time.Time) (int64, int64) {
	from := start.UTC().Truncate(time.Hour)
	to := end.UTC().Truncate(time.Hour)
	if to.Before(end) {
		to = to.Add(time.Hour)
	}
	return from.Unix(), to.Unix()
}

// usageRawServingSQL is usageRawSQL grouped by engine or tensor
// parallelism: each event's labels are its hour's, deployment's and
// model's, computed from the hour's raw events of every tenant as the cost
// step computes serving_hour (Store.ServingOfHours, rollup.ServingLabels:
// the distinct non-empty values, sorted, TP numerically, joined by "+"),
// so that the answer is the same before and after the hour is rolled up.
func usageRawServingSQL(q query.UsageQuery, onlyHours []time.Time) (string, []any) {
	bucket, args := stepExpr("d_completed_at", q.StepSeconds(), time.Unix(q.Start.Unix(), 0))
	outer, in := servingGroups(q.GroupBy, func(f string) string { return "d_" + f })
	in[0] = hourOf("d_completed_at") + " AS s_hour"
	var sb strings.Builder
	fmt.Fprintf(&sb, `SELECT %s AS b, %s, count() AS i_requests, countIf(d_status != 'ok') AS i_errors,
 sum(d_prompt_tokens) AS i_prompt, sum(d_cached_prompt_tokens) AS i_cached, sum(d_output_tokens) AS i_output
FROM (
 SELECT tenant_id AS d_tenant_id, event_id, any(completed_at) AS d_completed_at, any(model) AS d_model,
  any(deployment) AS d_deployment, any(status) AS d_status, any(prompt_tokens) AS d_prompt_tokens,
  any(cached_prompt_tokens) AS d_cached_prompt_tokens, any(output_tokens) AS d_output_tokens`, bucket, strings.Join(in, ", "))
	from, fromArgs := dedupedEvents(q, onlyHours)
	sb.WriteString(from)
	args = append(args, fromArgs...)
	innerGroups := append([]string{"b", "s_hour", "deployment", "model"}, in[3:]...)
	fmt.Fprintf(&sb, "\n)\nGROUP BY %s", strings.Join(innerGroups, ", "))
	fromH, toH := labelHours(q.Start, q.End)
	labels := fmt.Sprintf(`SELECT %s AS s_hour, deployment, model,
 arrayStringConcat(arraySort(groupUniqArrayIf(engine, engine != '')), '+') AS s_engine,
 arrayStringConcat(arrayMap(x -> toString(x), arraySort(groupUniqArrayIf(tensor_parallelism, tensor_parallelism != 0))), '+') AS s_tp
FROM inference_events
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)`, hourOf("completed_at"))
	args = append(args, fromH, toH)
	if onlyHours != nil {
		labels += " AND intDiv(toUInt32(completed_at), 3600) * 3600 IN " + hourList(onlyHours)
	}
	labels += "\nGROUP BY s_hour, deployment, model"
	return servingJoin(sb.String(), labels, outer), args
}

// usageRollupServingSQL is usageRollupSQL grouped by engine or tensor
// parallelism: each row's labels are those serving_hour holds for its
// hour, deployment and model (the newest computation's), "" where it holds
// none.
func usageRollupServingSQL(q query.UsageQuery, level query.Level, exclude []time.Time) (string, []any) {
	bucket, args := stepExpr("bucket", q.StepSeconds(), q.Start)
	outer, in := servingGroups(q.GroupBy, func(f string) string { return f })
	in[0] = hourOf("bucket") + " AS s_hour"
	where, whereArgs := scope("bucket", q.Start, q.End, q.TenantID)
	filter := ""
	if len(exclude) > 0 {
		filter = "intDiv(toUInt32(bucket), 3600) * 3600 NOT IN " + hourList(exclude)
	}
	from, fromArgs := newestRows(levelTables[level], "bucket", where, whereArgs, filter)
	innerGroups := append([]string{"b", "s_hour", "deployment", "model"}, in[3:]...)
	inner := fmt.Sprintf(`SELECT %s AS b, %s, sum(requests) AS i_requests, sum(errors) AS i_errors,
 sum(prompt_tokens) AS i_prompt, sum(cached_prompt_tokens) AS i_cached, sum(output_tokens) AS i_output
FROM %s
GROUP BY %s`, bucket, strings.Join(in, ", "), from, strings.Join(innerGroups, ", "))
	args = append(args, fromArgs...)
	fromH, toH := labelHours(q.Start, q.End)
	labels := `SELECT toUInt32(hour) AS s_hour, deployment, model,
 argMax(engine, version) AS s_engine, argMax(tensor_parallelism, version) AS s_tp
FROM serving_hour
WHERE hour >= toDateTime(?) AND hour < toDateTime(?)
GROUP BY hour, deployment, model`
	args = append(args, fromH, toH)
	return servingJoin(inner, labels, outer), args
}

// usageRollupSQL reads usage from the rollups of level, leaving out the
// hours in exclude. The range must lie on whole minutes.
func usageRollupSQL(q query.UsageQuery, level query.Level, exclude []time.Time) (string, []any) {
	if servingGrouped(q.GroupBy) {
		return usageRollupServingSQL(q, level, exclude)
	}
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
			case "model_version":
				u.ModelVersion = k.groups[i]
			case "engine":
				u.Engine = k.groups[i]
			case "tensor_parallelism":
				u.TensorParallelism = k.groups[i]
			}
		}
		out = append(out, u)
		return nil
	})
	return out, err
}
