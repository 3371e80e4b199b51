package chstore

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/query"
)

// TestReadSQL checks the SQL and arguments of every read the query package
// plans: the table each level reads, the bucketing of each step, the
// tenant as an argument (never in the text), the hours left out or kept,
// the day rollups, merging and paging.
func TestReadSQL(t *testing.T) {
	end := t0.Add(48 * time.Hour)
	h1 := t0.Add(time.Hour)
	norm := func(q query.RollupQuery) query.RollupQuery {
		t.Helper()
		n, err := q.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	usage := func(q query.UsageQuery) query.UsageQuery {
		t.Helper()
		n, err := q.Normalize()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		name string
		read any
		want []string // fragments, in order
		not  []string
		args []any // nil: not checked beyond the placeholder count
	}{
		{"usage from raw events, every hour",
			query.UsageRead{Query: usage(query.UsageQuery{TenantID: "acme", Start: t0, End: h1, Granularity: "minute"}), Raw: true},
			[]string{"SELECT toUInt32(intDiv(toUInt32(d_completed_at), 60) * 60) AS bucket", "FROM inference_events", "AND tenant_id = ?",
				"GROUP BY tenant_id, event_id", "HAVING requests > 0"},
			[]string{"acme", " IN ("},
			[]any{t0.Unix(), h1.Unix(), t0.UnixMilli(), h1.UnixMilli(), "acme"}},
		{"usage from raw events of two hours",
			query.UsageRead{Query: usage(query.UsageQuery{Start: t0, End: end}), Raw: true, Hours: []time.Time{t0, h1}},
			[]string{"SELECT toUInt32(?) AS bucket", "AND intDiv(toUInt32(completed_at), 3600) * 3600 IN (" + itoa(t0) + ", " + itoa(h1) + ")"},
			[]string{"tenant_id = ?"},
			[]any{t0.Unix(), t0.Unix(), end.Unix(), t0.UnixMilli(), end.UnixMilli()}},
		{"usage from the all-tenant hours, leaving out an hour",
			query.UsageRead{Query: usage(query.UsageQuery{Start: t0, End: end, Granularity: "day"}), Level: query.LevelTotalHour, Hours: []time.Time{h1}},
			[]string{"SELECT toUInt32(intDiv(toUInt32(bucket), 86400) * 86400) AS b, sum(requests) AS r", "FROM rollup_total_hour\n",
				"NOT IN (" + itoa(h1) + ")", "(bucket, version) IN (SELECT bucket, max(version) FROM rollup_total_hour", "GROUP BY b\nHAVING r > 0\nORDER BY b"},
			[]string{"FINAL"},
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"usage by model from the minute rows, by month",
			query.UsageRead{Query: usage(query.UsageQuery{TenantID: "acme", Start: t0.Add(time.Minute), End: end, Granularity: "month", GroupBy: []string{"model"}}), Level: query.LevelMinute},
			[]string{"toUInt32(toDateTime(toStartOfMonth(bucket, 'UTC'), 'UTC')) AS b, model", "FROM rollup_minute_recent FINAL\n", "AND tenant_id = ?", "GROUP BY b, model"},
			[]string{"max(version)"},
			[]any{t0.Unix() + 60, end.Unix(), "acme"}},
		{"rollups merged by ClickHouse, paged",
			query.RollupRead{Query: norm(query.RollupQuery{Start: t0, End: end, Step: "hour", GroupBy: []string{"model"}, Limit: 10, Offset: 20}), Level: query.LevelHour, Merge: true},
			[]string{"SELECT toUInt32(intDiv(toUInt32(bucket), 3600) * 3600) AS b, model, sum(requests), sum(errors), sum(err_context_length)",
				"toString((sumMap(", "FROM rollup_hour\n", "GROUP BY b, model\nORDER BY b, model\nLIMIT 20, 10"},
			nil,
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"rollup rows one by one, counters only",
			query.RollupRead{Query: norm(query.RollupQuery{TenantID: "acme", Start: t0, End: end, Step: "day", Columns: query.CounterColumns}), Level: query.LevelTenantHour},
			[]string{"SELECT toUInt32(intDiv(toUInt32(bucket), 86400) * 86400) AS b, requests, errors, err_context_length", "good_requests, good_output_tokens, slo_version, slo_version",
				"FROM rollup_tenant_hour\n", "AND tenant_id = ?"},
			[]string{"\nGROUP BY", "ttft_keys", "LIMIT"},
			[]any{t0.Unix(), end.Unix(), "acme", t0.Unix(), end.Unix(), "acme"}},
		{"rollups of every tenant with fresh days, latency only",
			query.RollupRead{Query: norm(query.RollupQuery{Start: t0, End: end, Step: "day", GroupBy: []string{"tenant_id"}, Columns: query.LatencyColumns}), Level: query.LevelTenantHour, Days: []time.Time{t0}, Merge: true},
			[]string{"sum(ttft_count), " + floatSum("ttft_sum"), "FROM (\n  SELECT bucket, tenant_id", "FROM rollup_tenant_day\n", "toUInt32(bucket) IN (" + itoa(t0) + ")",
				"UNION ALL", "FROM rollup_tenant_hour\n", "intDiv(toUInt32(bucket), 86400) * 86400 NOT IN (" + itoa(t0) + ")", "GROUP BY b, tenant_id"},
			[]string{"sum(requests)"},
			nil},
		{"exact latency from raw events",
			norm(query.RollupQuery{TenantID: "acme", Start: t0, End: h1, Step: "minute", GroupBy: []string{"model"}}),
			[]string{"SELECT toUInt32(intDiv(toUInt32(d_completed_at), 60) * 60) AS b, d_model, groupArrayIf(ifNull(d_ttft, 0), isNotNull(d_ttft) AND d_ttft_estimated = 0)",
				"groupArrayIf(ifNull(greatest(ifNull(d_e2e, 0) - ifNull(d_ttft, 0), 0), 0), isNotNull(d_e2e) AND isNotNull(d_ttft) AND d_ttft_estimated = 0)",
				"any(model) AS d_model", "any(ttft_estimated) AS d_ttft_estimated", "FROM inference_events WHERE", "AND tenant_id = ?", "GROUP BY tenant_id, event_id) GROUP BY b, d_model ORDER BY b, d_model"},
			[]string{"acme"},
			[]any{t0.Unix(), h1.Unix(), t0.UnixMilli(), h1.UnixMilli(), "acme"}},
		{"cost by tenant, weighted tokens, idle shared",
			costQ(t, query.CostQuery{Start: t0, End: end, Step: "day", GroupBy: []string{"tenant_id"}, Busy: "weighted_tokens", Idle: "shared_even"}),
			[]string{"SELECT toUInt32(intDiv(toUInt32(hour), 86400) * 86400) AS b, tenant_id, sum(cost_weighted_shared_even) AS c, sum(busy_weighted)",
				"FROM cost_hour\n", "(hour, version) IN (SELECT hour, max(version) FROM cost_hour", "HAVING c != 0 OR g != 0 OR sum(requests) > 0\nORDER BY b, tenant_id"},
			nil,
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"one tenant's total cost",
			costQ(t, query.CostQuery{TenantID: "acme", Start: t0, End: end}),
			[]string{"SELECT toUInt32(?) AS b, sum(cost_tokens_separate) AS c", "AND tenant_id = ?"},
			[]string{"acme"},
			[]any{t0.Unix(), t0.Unix(), end.Unix(), "acme", t0.Unix(), end.Unix(), "acme"}},
		{"GPU usage by deployment",
			gpuQ(t, query.GPUUsageQuery{Start: t0, End: end, Step: "hour", GroupBy: []string{"deployment"}}),
			[]string{"SELECT toUInt32(intDiv(toUInt32(hour), 3600) * 3600) AS b, deployment, " + floatSum("h_gpu"), "FROM (SELECT hour, deployment, sum(gpus) AS h_gpus",
				"FROM gpu_hour\n", "GROUP BY hour, deployment)\nGROUP BY b, deployment\nORDER BY b, deployment"},
			[]string{"LIMIT"},
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"GPU usage by deployment, bounded",
			gpuQ(t, query.GPUUsageQuery{Start: t0, End: end, Step: "hour", GroupBy: []string{"deployment", "gpu_type"}, Limit: 200_001}),
			[]string{"GROUP BY b, deployment, gpu_type\nORDER BY b, deployment, gpu_type\nLIMIT 200001"},
			nil,
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"engine stats by deployment, bounded",
			query.EngineQuery{Start: t0, End: end, Step: "hour", GroupBy: []string{"deployment"}, Limit: 200_001},
			[]string{"uniqExact(replica)", "FROM engine_hour\n", "GROUP BY b, deployment\nORDER BY b, deployment\nLIMIT 200001"},
			nil,
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sql, args, err := ReadSQL(tc.read)
			if err != nil {
				t.Fatal(err)
			}
			rest := sql
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("SQL lacks %q (in order):\n%s", w, sql)
				}
				rest = rest[i+len(w):]
			}
			for _, n := range tc.not {
				if strings.Contains(sql, n) {
					t.Errorf("SQL holds %q:\n%s", n, sql)
				}
			}
			if tc.args != nil {
				if diff := cmp.Diff(tc.args, args); diff != "" {
					t.Errorf("args (-want +got):\n%s", diff)
				}
			}
			if strings.Count(sql, "?") != len(args) {
				t.Errorf("%d placeholders, %d args:\n%s", strings.Count(sql, "?"), len(args), sql)
			}
		})
	}
	if _, _, err := ReadSQL(42); err == nil {
		t.Error("ReadSQL(42) = nil error, want one")
	}
}

// TestGPUTokensSQL checks the tokens joined to GPU usage: attributed tenant
// lines only.
func TestGPUTokensSQL(t *testing.T) {
	end := t0.Add(24 * time.Hour)
	sql, args := gpuTokensSQL(gpuQ(t, query.GPUUsageQuery{Start: t0, End: end, Step: "total", GroupBy: []string{"gpu_type"}}), "__idle__")
	for _, w := range []string{"SELECT toUInt32(?) AS b, gpu_type, sum(input_tokens), sum(output_tokens) FROM cost_hour",
		"unattributed = 0 AND tenant_id != '__idle__'", "GROUP BY b, gpu_type"} {
		if !strings.Contains(sql, w) {
			t.Errorf("SQL lacks %q:\n%s", w, sql)
		}
	}
	if diff := cmp.Diff([]any{t0.Unix(), t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}, args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
}

// TestStepExpr checks the bucketing of every step width.
func TestStepExpr(t *testing.T) {
	for _, tc := range []struct {
		width int64
		want  string
		args  []any
	}{
		{60, "toUInt32(intDiv(toUInt32(c), 60) * 60)", nil},
		{86400, "toUInt32(intDiv(toUInt32(c), 86400) * 86400)", nil},
		{-1, "toUInt32(toDateTime(toStartOfMonth(c, 'UTC'), 'UTC'))", nil},
		{0, "toUInt32(?)", []any{t0.Unix()}},
	} {
		got, args := stepExpr("c", tc.width, t0)
		if got != tc.want || !cmp.Equal(args, tc.args) {
			t.Errorf("stepExpr(c, %d) = %q %v, want %q %v", tc.width, got, args, tc.want, tc.args)
		}
	}
}

// itoa is t in Unix seconds, as the SQL lists hours.
func itoa(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func costQ(t *testing.T, q query.CostQuery) query.CostQuery {
	t.Helper()
	n, err := q.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func gpuQ(t *testing.T, q query.GPUUsageQuery) query.GPUUsageQuery {
	t.Helper()
	n, err := q.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCostSQLRefusesUnknownPolicies checks that a cost query that skipped
// Normalize gets an error, not a panic or a column that does not exist.
func TestCostSQLRefusesUnknownPolicies(t *testing.T) {
	_, _, err := ReadSQL(query.CostQuery{Start: t0, End: t0.Add(time.Hour), Step: "total", Busy: "tokens", Idle: "nobody"})
	if !errors.Is(err, query.ErrInvalidQuery) {
		t.Errorf("err = %v, want ErrInvalidQuery", err)
	}
}

func TestQuoteString(t *testing.T) {
	for in, want := range map[string]string{"__idle__": "'__idle__'", `a'b\c`: `'a\'b\\c'`, "": "''"} {
		if got := quoteString(in); got != want {
			t.Errorf("quoteString(%q) = %s, want %s", in, got, want)
		}
	}
}
