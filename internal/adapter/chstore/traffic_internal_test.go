package chstore

import (
	"strings"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
)

func TestTrafficSQL(t *testing.T) {
	end := t0.Add(48 * time.Hour)
	six := dimColumns
	for _, tc := range []struct {
		name       string
		q          query.RollupQuery
		days, only []time.Time
		src        query.TrafficKind
		table      string
		want       []string
		args       []any
	}{
		{"all tenants, no group_by: total level", query.RollupQuery{Start: t0, End: end, Step: "day"}, nil, nil, query.TrafficLevel, "rollup_total_hour",
			[]string{"SELECT toUInt32(intDiv(toUInt32(bucket), 86400) * 86400) AS b, requests AS t_requests,",
				"peak_minute_requests AS t_peak_requests, peak_minute_output_tokens AS t_peak_output\n  FROM rollup_total_hour\n",
				"max(t_peak_requests), max(t_peak_output)", "GROUP BY b\nORDER BY b\nLIMIT 0, 101"},
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"one tenant: tenant level", query.RollupQuery{TenantID: "acme", Start: t0, End: end}, nil, nil, query.TrafficLevel, "rollup_tenant_hour",
			[]string{"SELECT toUInt32(?) AS b,", "FROM rollup_tenant_hour\n", "AND tenant_id = ?"},
			[]any{t0.Unix(), t0.Unix(), end.Unix(), "acme", t0.Unix(), end.Unix(), "acme"}},
		{"by tenant with fresh days", query.RollupQuery{Start: t0, End: end, Step: "month", GroupBy: []string{"tenant_id"}}, []time.Time{t0}, nil,
			query.TrafficLevel, "rollup_tenant_hour",
			[]string{"FROM rollup_tenant_day\n", "UNION ALL", "toUInt32(bucket) IN " + hourList([]time.Time{t0}),
				"SELECT bucket, tenant_id, model, model_version, deployment, gpu_type, slo_class, requests,", "GROUP BY b, tenant_id\nORDER BY b, tenant_id"},
			nil},
		{"every dimension: finest level", query.RollupQuery{Start: t0, End: end, Step: "hour", GroupBy: six}, nil, nil, query.TrafficLevel, "rollup_hour",
			[]string{"FROM rollup_hour\n", "peak_minute_requests AS t_peak_requests", "GROUP BY b, tenant_id, model, model_version, deployment, gpu_type, slo_class\n"},
			nil},
		{"one tenant's every other dimension: finest level", query.RollupQuery{TenantID: "acme", Start: t0, End: end, GroupBy: six[1:]}, nil, nil,
			query.TrafficLevel, "rollup_hour", []string{"FROM rollup_hour\n", "peak_minute_requests AS t_peak_requests"}, nil},
		{"by model: rows merged minute by minute", query.RollupQuery{Start: t0, End: end, Step: "day", GroupBy: []string{"model"}}, nil, nil,
			query.TrafficMerged, "rollup_hour",
			[]string{"sum(requests) AS t_requests", "arrayReduce('max', sumForEach(minute_requests)) AS t_peak_requests",
				"arrayReduce('max', sumForEach(minute_output_tokens)) AS t_peak_output", "FROM rollup_hour\n",
				"GROUP BY b, bucket, model\n)\nGROUP BY b, model\nORDER BY b, model"},
			[]any{t0.Unix(), end.Unix(), t0.Unix(), end.Unix()}},
		{"not whole hours: minute rows", query.RollupQuery{Start: t0.Add(17 * time.Minute), End: end, Step: "day", GroupBy: []string{"tenant_id"}}, nil, nil,
			query.TrafficMinutes, "rollup_minute_recent",
			[]string{"sum(requests) AS t_peak_requests, sum(output_tokens) AS t_peak_output", "FROM rollup_minute_recent FINAL\n",
				"GROUP BY b, bucket, tenant_id\n)"},
			[]any{t0.Unix() + 17*60, end.Unix()}},
		{"the minute rows of some hours", query.RollupQuery{Start: t0, End: end, Step: "day"}, nil, []time.Time{t0, t0.Add(time.Hour)},
			query.TrafficMinutes, "rollup_minute_recent",
			[]string{"FROM rollup_minute_recent FINAL\n", "AND intDiv(toUInt32(bucket), 3600) * 3600 IN " + hourList([]time.Time{t0, t0.Add(time.Hour)})},
			[]any{t0.Unix(), end.Unix()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := tc.q.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			r := query.PlanTraffic(q)
			if tc.only != nil {
				r.Kind, r.Level, r.OnlyHours = query.TrafficMinutes, query.LevelMinute, tc.only
			}
			if table := levelTables[r.Level]; r.Kind != tc.src || table != tc.table {
				t.Fatalf("source %d of %s, want %d of %s", r.Kind, table, tc.src, tc.table)
			}
			r.Days, r.Limit = tc.days, 101
			sql, args := trafficSQL(r)
			for _, w := range tc.want {
				if !strings.Contains(sql, w) {
					t.Errorf("SQL lacks %q:\n%s", w, sql)
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
}
