package query

import (
	"slices"
	"testing"
	"time"
)

// TestPlan checks the rollup level, day rollups, merging and traffic rows
// each kind of query is planned to read.
func TestPlan(t *testing.T) {
	end := t0.Add(48 * time.Hour)
	six := []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}
	for _, tc := range []struct {
		name      string
		q         RollupQuery
		level     Level
		days      bool
		mergeHere bool
		traffic   TrafficKind
	}{
		{"every tenant, no grouping", RollupQuery{Start: t0, End: end, Step: "hour"}, LevelTotalHour, false, true, TrafficLevel},
		{"every tenant by day", RollupQuery{Start: t0, End: end, Step: "day"}, LevelTotalHour, false, true, TrafficLevel},
		{"one tenant", RollupQuery{TenantID: "acme", Start: t0, End: end, Step: "hour"}, LevelTenantHour, false, true, TrafficLevel},
		{"by tenant, hour steps", RollupQuery{Start: t0, End: end, Step: "hour", GroupBy: []string{"tenant_id"}}, LevelTenantHour, false, false, TrafficLevel},
		{"by tenant, day steps", RollupQuery{Start: t0, End: end, Step: "day", GroupBy: []string{"tenant_id"}}, LevelTenantHour, true, false, TrafficLevel},
		{"by tenant, total", RollupQuery{Start: t0, End: end, GroupBy: []string{"tenant_id"}}, LevelTenantHour, true, false, TrafficLevel},
		{"by model", RollupQuery{Start: t0, End: end, Step: "day", GroupBy: []string{"model"}}, LevelHour, false, false, TrafficMerged},
		{"one tenant by model", RollupQuery{TenantID: "acme", Start: t0, End: end, GroupBy: []string{"model"}}, LevelHour, false, true, TrafficMerged},
		{"every dimension", RollupQuery{Start: t0, End: end, GroupBy: six}, LevelHour, false, false, TrafficLevel},
		{"one tenant, every other dimension", RollupQuery{TenantID: "acme", Start: t0, End: end, GroupBy: six[1:]}, LevelHour, false, true, TrafficLevel},
		{"minute steps", RollupQuery{Start: t0, End: end, Step: "minute"}, LevelMinute, false, false, TrafficMinutes},
		{"not whole hours", RollupQuery{Start: t0.Add(time.Minute), End: end, Step: "day"}, LevelMinute, false, false, TrafficMinutes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := tc.q.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			if got := q.level(); got != tc.level {
				t.Errorf("level %d, want %d", got, tc.level)
			}
			if got := q.usesDays(); got != tc.days {
				t.Errorf("usesDays %v, want %v", got, tc.days)
			}
			if got := q.mergeHere(); got != tc.mergeHere {
				t.Errorf("mergeHere %v, want %v", got, tc.mergeHere)
			}
			if got := PlanTraffic(q); got.Kind != tc.traffic || got.Level != tc.level {
				t.Errorf("traffic %d at level %d, want %d at %d", got.Kind, got.Level, tc.traffic, tc.level)
			}
		})
	}
}

// TestMergeUsage checks that rows of the same bucket and group add up and
// come out in bucket, tenant, model, deployment order.
func TestMergeUsage(t *testing.T) {
	h1 := t0.Add(time.Hour)
	got := mergeUsage([]UsageRow{
		{Start: h1, TenantID: "b", Requests: 1},
		{Start: t0, TenantID: "b", Requests: 2, OutputTokens: 5},
		{Start: t0, TenantID: "a", Requests: 3},
		{Start: t0, TenantID: "b", Requests: 4, OutputTokens: 6, Errors: 1},
	})
	want := []UsageRow{
		{Start: t0, TenantID: "a", Requests: 3},
		{Start: t0, TenantID: "b", Requests: 6, OutputTokens: 11, Errors: 1},
		{Start: h1, TenantID: "b", Requests: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestHourPieces(t *testing.T) {
	at := func(h, m int) time.Time { return t0.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute) }
	for _, tc := range []struct {
		start, end time.Time
		want       [][2]time.Time
	}{
		{at(0, 0), at(5, 0), [][2]time.Time{{at(0, 0), at(5, 0)}}},
		{at(0, 30), at(5, 30), [][2]time.Time{{at(0, 30), at(1, 0)}, {at(1, 0), at(5, 0)}, {at(5, 0), at(5, 30)}}},
		{at(0, 30), at(0, 50), [][2]time.Time{{at(0, 30), at(0, 50)}}},
		{at(0, 30), at(1, 10), [][2]time.Time{{at(0, 30), at(1, 10)}}},
		{at(0, 30), at(2, 0), [][2]time.Time{{at(0, 30), at(1, 0)}, {at(1, 0), at(2, 0)}}},
	} {
		if got := hourPieces(tc.start, tc.end); !slices.EqualFunc(got, tc.want, func(a, b [2]time.Time) bool { return a[0].Equal(b[0]) && a[1].Equal(b[1]) }) {
			t.Errorf("hourPieces(%s, %s) = %v, want %v", tc.start, tc.end, got, tc.want)
		}
	}
}
