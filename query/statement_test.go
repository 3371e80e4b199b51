package query_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// TestStatementUsageAddsUp checks that a statement's usage, read in slices
// cut at half hours (a +05:30 month's ends) and at a price change, adds up
// exactly to the events of the range, per model, once the rollup job has
// run (whole hours from the hour rollups, the rest from minute rollups)
// and before it has (raw events).
func TestStatementUsageAddsUp(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	var events []*meterv1.InferenceEvent
	for i := range 3000 {
		events = append(events, event(i))
	}
	chstoretest.Insert(t, s, events)
	start, end := day.Add(30*time.Minute), day.Add(20*time.Hour+30*time.Minute)
	cut := day.Add(10*time.Hour + 15*time.Minute)
	want := map[string]query.UsageRow{}
	for _, r := range bruteUsage(events, query.UsageQuery{TenantID: "acme", Start: start, End: end, Granularity: "total", GroupBy: []string{"model"}}) {
		want[r.Model] = r
	}
	check := func(what string) {
		t.Helper()
		slices, err := reads(s).StatementUsage(t.Context(), "acme", start, end, []time.Time{cut, end.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]query.UsageRow{}
		for _, u := range slices {
			if u.Start.Before(cut) && u.End.After(cut) {
				t.Errorf("%s: slice %s–%s spans the cut at %s", what, u.Start, u.End, cut)
			}
			r := got[u.Model]
			r.Model = u.Model
			r.Requests += int64(u.Requests)
			r.PromptTokens += int64(u.InputTokens)
			r.CachedPromptTokens += int64(u.CachedInputTokens)
			r.OutputTokens += int64(u.OutputTokens)
			got[u.Model] = r
		}
		if len(got) != len(want) {
			t.Fatalf("%s: models %v, want %v", what, got, want)
		}
		for m, w := range want {
			g := got[m]
			if g.Requests != w.Requests || g.PromptTokens != w.PromptTokens || g.CachedPromptTokens != w.CachedPromptTokens || g.OutputTokens != w.OutputTokens {
				t.Errorf("%s: %s = %+v, want %+v", what, m, g, w)
			}
		}
	}
	check("raw events")
	job, err := rollup.NewJob(rollup.Config{}, s, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("rollups")
}
