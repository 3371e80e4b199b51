package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// rollupSQL builds the query of a rollup read. With r.Merge, ClickHouse
// merges the rows of each (step, group), histograms with sumMap, in order,
// paged by the query's Limit and Offset; without it, the rows come one by
// one, with their step and group, for package query to merge. r.Days are
// whole days read from rollup_tenant_day instead of their hours (only at
// query.LevelTenantHour).
func rollupSQL(r query.RollupRead) (string, []any) {
	q := r.Query
	bucket, args := stepExpr("bucket", q.StepSeconds(), q.Start)
	sel := []string{bucket + " AS b"}
	sel = append(sel, q.GroupBy...)
	agg := func(f, col string) string {
		switch {
		case !r.Merge:
			return col
		case f == "fsum":
			return floatSum(col)
		}
		return f + "(" + col + ")"
	}
	counters, latency, hourDists := q.Reads()
	kept := keptHourDists(r, hourDists)
	if counters {
		sel = append(sel, agg("sum", "requests"), agg("sum", "errors"))
		for _, c := range errClasses {
			sel = append(sel, agg("sum", "err_"+c))
		}
		sel = append(sel, agg("sum", "prompt_tokens"), agg("sum", "cached_prompt_tokens"), agg("sum", "output_tokens"))
	}
	if latency {
		for _, m := range distColumns {
			// The arrays come as text: clickhouse-go scans an array
			// element by element through reflection (about 100 ns per
			// element, a third of a tenant's month of latency).
			sel = append(sel, agg("sum", m+"_count"), agg("fsum", m+"_sum")) // fsum: floatSum
			if r.Merge {
				sel = append(sel, fmt.Sprintf("toString((%s AS %s_h).1)", histogramMergeSQL(m+"_keys", m+"_counts"), m), "toString("+m+"_h.2)")
			} else {
				sel = append(sel, "toString("+m+"_keys)", "toString("+m+"_counts)")
			}
		}
	}
	if counters {
		sel = append(sel, agg("sum", "good_requests"), agg("sum", "good_output_tokens"), agg("min", "slo_version"), agg("max", "slo_version"))
	}
	if len(kept) > 0 {
		for _, d := range kept {
			if r.Merge {
				sel = append(sel, fmt.Sprintf("toString((%s AS %s_h).1)", histogramMergeSQL(d+"_keys", d+"_counts"), d), "toString("+d+"_h.2)")
			} else {
				sel = append(sel, "toString("+d+"_keys)", "toString("+d+"_counts)")
			}
		}
	}
	marked := readsDecodeKept(r, kept)
	if marked {
		sel = append(sel, agg("min", "decode_kept"))
	}
	where, whereArgs := scope("bucket", q.Start, q.End, q.TenantID)
	from, fromArgs := newestRows(levelTables[r.Level], "bucket", where, whereArgs, "")
	if len(r.Days) > 0 {
		cols := rollupColumnList
		for _, d := range kept {
			cols += ", " + d + "_keys, " + d + "_counts"
		}
		if marked {
			cols += ", decode_kept"
		}
		from, fromArgs = withDays(cols, r.Days, where, whereArgs)
	}
	args = append(args, fromArgs...)
	stmt := fmt.Sprintf("SELECT %s\nFROM %s", strings.Join(sel, ", "), from)
	if !r.Merge {
		return stmt, args
	}
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	stmt += fmt.Sprintf("\nGROUP BY %s\nORDER BY %s", groupBy, groupBy)
	if q.Limit > 0 {
		stmt += fmt.Sprintf("\nLIMIT %d, %d", q.Offset, q.Limit)
	}
	return stmt, args
}

// keptHourDists are the histograms of rollup.HourDists that a read with
// hour distributions reads: those its level's table keeps (none at the
// minute level) of the ones its columns ask for: the token sizes for
// query.SizeColumns, prefill, decode and E2E per output class for
// query.BreakdownColumns. Reading the others cost GetUsage and GetTraffic
// the breakdown's histograms and GetLatency the token sizes' (at the
// all-tenant levels, which keep all seven): a second parse of arrays
// nobody looks at.
func keptHourDists(r query.RollupRead, hourDists bool) []string {
	if !hourDists {
		return nil
	}
	table := levelTables[r.Level]
	if len(r.Days) > 0 {
		table = "rollup_tenant_day" // keeps what rollup_tenant_hour keeps
	}
	sizes := r.Query.Columns == query.SizeColumns
	var kept []string
	for _, d := range rollup.HourDistTables[table] {
		if (d == "prompt_size" || d == "output_size") == sizes {
			kept = append(kept, d)
		}
	}
	return kept
}

// readsDecodeKept reports whether a read of the histograms kept (of
// keptHourDists) reads decode from rows that say whether they keep it
// (decodeKept: the tenant rows, hour or day): it reads their decode_kept
// too, and a row (or merged group) with a 0 there comes with
// query.RollupRow.DecodeUnkept.
func readsDecodeKept(r query.RollupRead, kept []string) bool {
	return slices.Contains(kept, "decode") && decodeKept(levelTables[r.Level])
}

// RollupRows runs a rollup read (see query.RollupRead), calling row for each
// row; the row and its maps are reused from call to call.
func (s *Store) RollupRows(ctx context.Context, r query.RollupRead, row func(*query.RollupRow) error) error {
	q := r.Query
	stmt, args := rollupSQL(r)
	counters, latency, hourDists := q.Reads()
	kept := keptHourDists(r, hourDists)
	var (
		out                  query.RollupRow
		errsBy               = make([]uint64, len(errClasses))
		dists                = make([]query.Dist, len(distColumns))
		keys, counts         [4]string
		hdists               = make([]query.Dist, len(kept))
		hourKeys, hourCounts = make([]string, len(kept)), make([]string, len(kept))
		k                    = newStepKey(len(q.GroupBy))
	)
	dest := k.dest()
	if counters {
		dest = append(dest, &out.Requests, &out.Errors)
		for i := range errsBy {
			dest = append(dest, &errsBy[i])
		}
		dest = append(dest, &out.PromptTokens, &out.CachedTokens, &out.OutputTokens)
	}
	if latency {
		for i := range dists {
			dest = append(dest, &dists[i].Count, &dists[i].Sum, &keys[i], &counts[i])
		}
	}
	if counters {
		dest = append(dest, &out.GoodRequests, &out.GoodOutputTokens, &out.MinSLO, &out.MaxSLO)
	}
	for i := range hdists {
		dest = append(dest, &hourKeys[i], &hourCounts[i])
	}
	var kept8 uint8
	marked := readsDecodeKept(r, kept)
	if marked {
		dest = append(dest, &kept8)
	}
	out.Group = make(map[string]string, len(q.GroupBy))
	out.HourDists = make(map[string]query.Dist, len(kept))
	out.ErrorsBy = make(map[string]uint64, len(errClasses))
	out.Latency = make(map[string]query.Dist, len(distColumns))
	return s.each(ctx, "rollups", stmt, args, dest, func() error {
		if latency {
			for i := range dists {
				var err error
				if dists[i].Keys, err = parseArray[int16](keys[i], 16); err == nil {
					dists[i].Counts, err = parseArray[uint64](counts[i], 64)
				}
				if err != nil {
					return fmt.Errorf("scan rollups: histogram of %s: %w", distColumns[i], err)
				}
			}
		}
		{
			for i, d := range kept {
				var err error
				if hdists[i].Keys, err = parseArray[int16](hourKeys[i], 16); err == nil {
					hdists[i].Counts, err = parseArray[uint64](hourCounts[i], 64)
				}
				if err != nil {
					return fmt.Errorf("scan rollups: histogram of %s: %w", d, err)
				}
				hdists[i].Count = 0
				for _, c := range hdists[i].Counts {
					hdists[i].Count += c
				}
				out.HourDists[d] = hdists[i]
			}
		}
		out.DecodeUnkept = marked && kept8 == 0
		out.Start = k.start(q.StepSeconds(), q.Start)
		for i, f := range q.GroupBy {
			out.Group[f] = k.groups[i]
		}
		for i, c := range errClasses {
			out.ErrorsBy[c] = errsBy[i]
		}
		for i, m := range distColumns {
			out.Latency[m] = dists[i]
		}
		return row(&out)
	})
}
