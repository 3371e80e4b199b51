package query_test

import (
	"context"
	"testing"
	"time"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// noSizesStore writes hour rollup rows without the token-size histograms,
// as the rollups did before migration 0023.
type noSizesStore struct{ *chstore.Store }

func (s noSizesStore) InsertRollupRecords(ctx context.Context, table string, rows []rollup.RollupRecord, sloVersion uint32, version uint64) error {
	for i := range rows {
		for d, name := range rollup.HourDists {
			if name == "prompt_size" || name == "output_size" {
				rows[i].HourKeys[d], rows[i].HourCounts[d] = nil, nil
			}
		}
	}
	return s.Store.InsertRollupRecords(ctx, table, rows, sloVersion, version)
}

// TestTokenSizesPartial checks that tokens per request are not served over
// other requests than the step's: with the middle of three hours rolled up
// without token sizes (as before migration 0023), that hour and every day
// and total step spanning it have no tokens per request (no percentiles
// over the other hours' requests beside the requests of all three), while
// requests and tokens stay exact; the other hours keep theirs.
func TestTokenSizesPartial(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	events := breakdownEvents(2500)
	chstoretest.Insert(t, s, events)
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive"}
	old := day.Add(time.Hour)
	for h := day; h.Before(day.Add(3 * time.Hour)); h = h.Add(time.Hour) {
		var store rollup.HourStore = s
		if h.Equal(old) {
			store = noSizesStore{s}
		}
		if _, err := rollup.RollupHour(ctx, store, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := rollup.RollupDay(ctx, s, day, uint64(day.Unix())+1e6); err != nil || !ok {
		t.Fatalf("roll up %s: %v, %v", day, ok, err)
	}
	svc := reads(s)
	end := day.Add(24 * time.Hour)
	// kept: whether a step starting at start has token sizes for all its
	// requests (an hour step other than the old hour).
	kept := func(step string, start time.Time) bool { return step == "hour" && !start.Equal(old) }
	sums := func(b bruteValues) (requests, prompt, output uint64) {
		for _, v := range b["prompt"] {
			prompt += uint64(v)
		}
		for _, v := range b["output"] {
			output += uint64(v)
		}
		return uint64(len(b["prompt"])), prompt, output
	}
	checkStats := func(what string, b bruteValues, want bool, got ...*query.TokenStats) {
		t.Helper()
		n, _, _ := sums(b)
		for _, st := range got {
			switch {
			case !want && st != nil:
				t.Errorf("%s: tokens per request %+v over %d of the step's requests", what, *st, n)
			case want && st == nil:
				t.Errorf("%s: no tokens per request", what)
			case want && st.Requests != n:
				t.Errorf("%s: tokens per request over %d requests, want %d", what, st.Requests, n)
			}
		}
	}
	for _, q := range []query.RollupQuery{
		{Start: day, End: end, Step: "hour", GroupBy: []string{"model"}},
		{Start: day, End: end, Step: "hour", TenantID: "acme"},
		{Start: day, End: end, Step: "day", GroupBy: []string{"tenant_id"}},
		{Start: day, End: end, Step: "total", GroupBy: []string{"model", "deployment"}},
		{Start: day, End: end, Step: "total"},
	} {
		nq, _ := q.Normalize()
		_, want := trafficSteps(t, svc, events, q, func(what string, p query.TrafficPoint, b bruteValues) {
			if r, _, _ := sums(b); uint64(p.Requests) != r {
				t.Errorf("%s: %d requests, want %d", what, p.Requests, r)
			}
			checkStats(what, b, kept(nq.Step, p.Start), p.PromptTokensPerRequest, p.OutputTokensPerRequest)
		}, func(what string, sr query.TrafficSeries) {
			// Every series spans the old hour.
			checkStats(what, nil, false, sr.Summary.PromptTokensPerRequest, sr.Summary.OutputTokensPerRequest)
		})

		usageSteps(t, svc, q, nq, want, func(what string, u query.UsageRow, b bruteValues) {
			r, prompt, output := sums(b)
			if uint64(u.Requests) != r || uint64(u.PromptTokens) != prompt || uint64(u.OutputTokens) != output {
				t.Errorf("%s: requests %d, tokens %d/%d; want %d, %d/%d", what, u.Requests, u.PromptTokens, u.OutputTokens, r, prompt, output)
			}
			var ps, ops *query.TokenStats
			var err error
			if u.Sizes != nil {
				if ps, err = query.TokenStatsOf(u.Sizes.Prompt, uint64(u.PromptTokens), uint64(u.Requests)); err != nil {
					t.Fatal(err)
				}
				if ops, err = query.TokenStatsOf(u.Sizes.Output, uint64(u.OutputTokens), uint64(u.Requests)); err != nil {
					t.Fatal(err)
				}
			}
			checkStats(what, b, kept(nq.Step, u.Start), ps, ops)
			if ps != nil && !within(ps.Mean, float64(prompt)/float64(r), 1e-12) {
				t.Errorf("%s: prompt mean %v, want %v", what, ps.Mean, float64(prompt)/float64(r))
			}
		})
	}
}
