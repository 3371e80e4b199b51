package query_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// usageFromRollups reduces rollup rows to usage rows, for comparison with
// the brute-force expectation.
func usageFromRollups(rows []query.RollupRow) []query.UsageRow {
	var out []query.UsageRow
	for _, r := range rows {
		out = append(out, query.UsageRow{
			Start: r.Start, TenantID: r.Group["tenant_id"], Model: r.Group["model"], Deployment: r.Group["deployment"],
			Requests: int64(r.Requests), Errors: int64(r.Errors), PromptTokens: int64(r.PromptTokens),
			CachedPromptTokens: int64(r.CachedTokens), OutputTokens: int64(r.OutputTokens),
		})
	}
	return out
}

// rollupHour rolls up one hour of s.
func rollupHour(t *testing.T, s *chstore.Store, hour time.Time, spec rollup.GoodputSpec, version uint64) error {
	t.Helper()
	_, err := rollup.RollupHour(context.Background(), s, hour, spec, version)
	return err
}

func TestRollupHourExact(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	var events []*meterv1.InferenceEvent
	for i := range 4000 {
		events = append(events, event(i))
	}
	chstoretest.Insert(t, s, append(events, events[:500]...)) // with duplicates
	end := day.Add(4000 * 37 * time.Second).Truncate(time.Hour).Add(time.Hour)
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive"}
	for h := day; h.Before(end); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		q query.RollupQuery
		u query.UsageQuery
	}{
		{query.RollupQuery{Start: day, End: end, Step: "hour", GroupBy: []string{"tenant_id"}},
			query.UsageQuery{Start: day, End: end, Granularity: "hour", GroupBy: []string{"tenant_id"}}},
		{query.RollupQuery{Start: day, End: end, Step: "day", GroupBy: []string{"model", "deployment"}},
			query.UsageQuery{Start: day, End: end, Granularity: "day", GroupBy: []string{"model", "deployment"}}},
		{query.RollupQuery{Start: day.Add(17 * time.Minute), End: day.Add(3*time.Hour + 5*time.Minute), Step: "minute", TenantID: "acme"},
			query.UsageQuery{Start: day.Add(17 * time.Minute), End: day.Add(3*time.Hour + 5*time.Minute), Granularity: "minute", TenantID: "acme"}},
		{query.RollupQuery{Start: day, End: end},
			query.UsageQuery{Start: day, End: end}},
	} {
		got, err := reads(s).Rollups(ctx, tc.q)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(bruteUsage(events, tc.u), usageFromRollups(got)); diff != "" {
			t.Errorf("rollups %+v (-want +got):\n%s", tc.q, diff)
		}
	}
	// Every successful request has TTFT and E2E; the histograms count them all.
	total, err := reads(s).Rollups(ctx, query.RollupQuery{Start: day, End: end})
	if err != nil {
		t.Fatal(err)
	}
	ok := total[0].Requests - total[0].Errors
	for _, m := range []string{"ttft", "e2e"} {
		var n uint64
		for _, c := range total[0].Latency[m].Counts {
			n += c
		}
		if d := total[0].Latency[m]; d.Count != ok || n != ok {
			t.Errorf("%s: count %d, histogram total %d, want %d", m, d.Count, n, ok)
		}
	}
	if total[0].GoodRequests != ok {
		t.Errorf("good requests with no thresholds = %d, want every OK request (%d)", total[0].GoodRequests, ok)
	}
}

func TestTooManySeries(t *testing.T) {
	_, _, s := migratedStore(t)
	ctx := context.Background()
	var b chstore.EventBatch
	for i := range 400 { // 400 × 37 s: about four hours, well over 5 minutes
		ev := event(i)
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{})
	}
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}
	end := day.Add(5 * time.Hour)
	for h := day; h.Before(end); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, rollup.GoodputSpec{Version: 1}, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	small := query.New(s, query.Config{MaxSeriesRows: 5})
	big := query.RollupQuery{Start: day, End: end, Step: "minute"}
	if _, err := small.Rollups(ctx, big); !errors.Is(err, query.ErrTooManySeries) || !errors.Is(err, query.ErrInvalidQuery) {
		t.Errorf("minute steps over hours: err = %v, want ErrTooManySeries", err)
	}
	if _, err := small.RawLatency(ctx, big); !errors.Is(err, query.ErrTooManySeries) {
		t.Errorf("exact minute steps over hours: err = %v, want ErrTooManySeries", err)
	}
	rows, err := small.Rollups(ctx, query.RollupQuery{Start: day, End: end, Step: "hour"})
	if err != nil || len(rows) == 0 || len(rows) > 5 {
		t.Errorf("hour steps: %d rows, err %v; want 1 to 5 rows", len(rows), err)
	}
	// The capacity report's read: 4 (model, deployment) pairs an hour.
	if _, err := small.DeploymentHours(ctx, day, end); !errors.Is(err, query.ErrTooManySeries) {
		t.Errorf("deployment hours: err = %v, want ErrTooManySeries", err)
	}
	if rows, err := small.DeploymentHours(ctx, day, day.Add(time.Hour)); err != nil || len(rows) != 4 {
		t.Errorf("deployment hours of one hour: %d rows, err %v; want 4", len(rows), err)
	}
}

// TestRollupsMergedHere checks that the rows Rollups merges in this process
// (one tenant's, or the all-tenant hours) equal ClickHouse's sumMap merge of
// the same rows, at every step and grouping, and page the same way.
// rollUpSpreadEvents inserts n events (37 s apart from day on) with their
// latencies spread over many histogram keys, and rolls up every hour they
// touch, each with its start as version. It returns the end of the last
// hour and the goodput spec used.
func rollUpSpreadEvents(t *testing.T, s *chstore.Store, n int) (time.Time, rollup.GoodputSpec) {
	t.Helper()
	var b chstore.EventBatch
	for i := range n {
		ev := event(i)
		if ev.TtftMs != nil {
			ev.TtftMs = proto.Float64(20 + float64(i*7919%5000))
			ev.E2EMs = proto.Float64(400 + float64(i*104729%90000)/7)
			ev.ItlMs = proto.Float64(5 + float64(i%97)/3)
		}
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{})
	}
	if err := s.InsertEvents(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	end := day.Add(time.Duration(n) * 37 * time.Second).Truncate(time.Hour).Add(time.Hour)
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive", Rules: []rollup.GoodputRule{{TTFTMs: 2500}}}
	for h := day; h.Before(end); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	return end, spec
}

func TestRollupsMergedHere(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	end, spec := rollUpSpreadEvents(t, s, 3000)
	// A second computation of some hours: only the newest counts.
	for h := day; h.Before(day.Add(3 * time.Hour)); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())+1); err != nil {
			t.Fatal(err)
		}
	}
	opts := cmp.Options{cmpopts.EquateEmpty(), cmpopts.EquateApprox(1e-12, 0)}
	for _, q := range []query.RollupQuery{
		{TenantID: "acme", Start: day, End: end, Step: "hour"},
		{TenantID: "acme", Start: day, End: end, Step: "day"},
		{TenantID: "acme", Start: day, End: end, Step: "month"},
		{TenantID: "acme", Start: day, End: end},
		{TenantID: "acme", Start: day, End: end, Step: "hour", GroupBy: []string{"model", "deployment"}},
		{TenantID: "acme", Start: day, End: end, Step: "day", GroupBy: []string{"deployment"}},
		{TenantID: "acme", Start: day, End: end, GroupBy: []string{"tenant_id"}},
		{TenantID: "acme", Start: day, End: end, Step: "hour", GroupBy: []string{"model"}, Limit: 7, Offset: 5},
		{TenantID: "acme", Start: day, End: end, Step: "hour", GroupBy: []string{"model"}, Limit: 7, Offset: 1000},
		{Start: day, End: end, Step: "hour"},
		{Start: day, End: end, Step: "day"},
		{Start: day, End: end},
		{Start: day, End: end, Step: "hour", Limit: 3, Offset: 2},
	} {
		if !q.MergesHere() {
			t.Fatalf("%+v is merged by ClickHouse", q)
		}
		want, err := query.RollupsInClickHouse(reads(s), ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		got, err := reads(s).Rollups(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 && q.Offset < 1000 {
			t.Fatalf("%+v: no rows", q)
		}
		if diff := cmp.Diff(want, got, opts); diff != "" {
			t.Errorf("%+v: merged here differs from ClickHouse (-want +got):\n%s", q, diff)
		}
		// Reading only the counters or only the latencies gives the same
		// numbers, here and in ClickHouse.
		for _, cols := range []query.RollupColumns{query.CounterColumns, query.LatencyColumns} {
			cq := q
			cq.Columns = cols
			for name, run := range map[string]func(context.Context, query.RollupQuery) ([]query.RollupRow, error){
				"here": reads(s).Rollups, "in ClickHouse": func(ctx context.Context, q query.RollupQuery) ([]query.RollupRow, error) {
					return query.RollupsInClickHouse(reads(s), ctx, q)
				},
			} {
				part, err := run(ctx, cq)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(onlyColumns(want, cols), part, opts); diff != "" {
					t.Errorf("%+v, merged %s: differs from the same fields of every column (-want +got):\n%s", cq, name, diff)
				}
			}
		}
	}
	if (query.RollupQuery{Start: day, End: end, GroupBy: []string{"tenant_id"}}).MergesHere() {
		t.Error("every tenant's rows are merged here")
	}
}

// onlyColumns returns rows with what cols does not read zeroed.
func onlyColumns(rows []query.RollupRow, cols query.RollupColumns) []query.RollupRow {
	var out []query.RollupRow
	for _, r := range rows {
		p := query.RollupRow{Start: r.Start, Group: r.Group, ErrorsBy: map[string]uint64{}, Latency: map[string]query.Dist{}}
		for _, c := range rollup.StatusClasses {
			p.ErrorsBy[c] = 0
		}
		for _, m := range rollup.LatencyMetrics {
			p.Latency[m] = query.Dist{}
		}
		switch cols {
		case query.CounterColumns:
			p.Requests, p.Errors, p.ErrorsBy = r.Requests, r.Errors, r.ErrorsBy
			p.PromptTokens, p.CachedTokens, p.OutputTokens = r.PromptTokens, r.CachedTokens, r.OutputTokens
			p.GoodRequests, p.GoodOutputTokens, p.MinSLO, p.MaxSLO = r.GoodRequests, r.GoodOutputTokens, r.MinSLO, r.MaxSLO
		case query.LatencyColumns:
			p.Latency = r.Latency
		}
		out = append(out, p)
	}
	return out
}

// TestRollupDays checks the day rollups: a query across tenants at a step
// of a day or more reads the fresh day rows of its whole days and the hour
// rows of the rest, and answers exactly as from the hours alone; a day
// whose hours were recomputed since (late events, an SLO change) is read
// from its hours until it is rolled up again.
func TestRollupDays(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	const n = 6000 // 37 s apart: two whole days and most of a third
	end, spec := rollUpSpreadEvents(t, s, n)
	days := func(ds ...int) []time.Time {
		var out []time.Time
		for _, d := range ds {
			out = append(out, day.Add(time.Duration(d)*rollup.Day))
		}
		return out
	}
	checkStale := func(want []time.Time) {
		t.Helper()
		got, err := rollup.StaleDays(ctx, s, time.Time{}, day.Add(10*rollup.Day))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("stale days (-want +got):\n%s", diff)
		}
	}
	queries := []query.RollupQuery{
		{Start: day, End: end, GroupBy: []string{"tenant_id"}},
		{Start: day, End: end, Step: "day", GroupBy: []string{"tenant_id"}},
		{Start: day, End: end, Step: "month", GroupBy: []string{"tenant_id"}},
		{Start: day, End: end, Step: "day"},
		{Start: day.Add(5 * time.Hour), End: end, GroupBy: []string{"tenant_id"}},
		{Start: day, End: day.Add(rollup.Day + 7*time.Hour), Step: "day", GroupBy: []string{"tenant_id"}, Limit: 2, Offset: 1},
	}
	// check compares every query with the same query answered from the
	// hour rows alone, and the fresh days of the first two with want.
	check := func(what string, wantFull, wantFrom5h []time.Time) {
		t.Helper()
		for i, want := range [][]time.Time{wantFull, wantFrom5h} {
			got, err := rollup.FreshDays(ctx, s, queries[4*i].Start, queries[4*i].End)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: fresh days of %+v (-want +got):\n%s", what, queries[4*i], diff)
			}
		}
		opts := cmp.Options{cmpopts.EquateEmpty(), cmpopts.EquateApprox(1e-12, 0)}
		for _, q := range queries {
			want, err := query.RollupsFromHours(reads(s), ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			got, err := reads(s).Rollups(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if len(want) == 0 {
				t.Fatalf("%s: %+v: no rows", what, q)
			}
			if diff := cmp.Diff(want, got, opts); diff != "" {
				t.Errorf("%s: %+v: differs from the hours (-want +got):\n%s", what, q, diff)
			}
		}
	}

	checkStale(days(0, 1, 2))
	check("before any day rollup", nil, nil)
	for _, d := range days(0, 1) {
		if ok, err := rollup.RollupDay(ctx, s, d, uint64(d.Unix())); err != nil || !ok {
			t.Fatalf("roll up %s: %v, %v", d, ok, err)
		}
	}
	if ok, err := rollup.RollupDay(ctx, s, day.Add(5*rollup.Day), 1); err != nil || ok {
		t.Fatalf("roll up a day without hours: %v, %v", ok, err)
	}
	checkStale(days(2))
	check("days 0 and 1 rolled up", days(0, 1), days(1))
	before, err := reads(s).Rollups(ctx, queries[0])
	if err != nil {
		t.Fatal(err)
	}

	// A late event in day 0, and its hour recomputed: day 0 is stale.
	late := event(n + 1)
	late.CompletedAt = timestamppb.New(day.Add(5*time.Hour + 3*time.Minute))
	var b chstore.EventBatch
	b.Append(late, ingest.ITL(late), time.Now(), sink.Source{})
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}
	if err := rollupHour(t, s, day.Add(5*time.Hour), spec, uint64(end.Unix())); err != nil {
		t.Fatal(err)
	}
	checkStale(days(0, 2))
	check("an hour of day 0 recomputed", days(1), days(1))
	after, err := reads(s).Rollups(ctx, queries[0])
	if err != nil {
		t.Fatal(err)
	}
	requests := func(rows []query.RollupRow, tenant string) uint64 {
		for _, r := range rows {
			if r.Group["tenant_id"] == tenant {
				return r.Requests
			}
		}
		return 0
	}
	tenant := late.GetTenantId()
	if got, want := requests(after, tenant), requests(before, tenant)+1; got != want {
		t.Errorf("%s's requests after the late event: %d, want %d", tenant, got, want)
	}
	if ok, err := rollup.RollupDay(ctx, s, day, uint64(end.Unix())+1); err != nil || !ok {
		t.Fatalf("roll up day 0 again: %v, %v", ok, err)
	}
	checkStale(days(2))
	check("day 0 rolled up again", days(0, 1), days(1))

	// An hour of day 1 counted with another SLO version: day 1 is not
	// rolled up until all its hours agree, and is read from its hours.
	spec2 := spec
	spec2.Version = 2
	if err := rollupHour(t, s, day.Add(rollup.Day+3*time.Hour), spec2, uint64(end.Unix())+2); err != nil {
		t.Fatal(err)
	}
	if ok, err := rollup.RollupDay(ctx, s, day.Add(rollup.Day), uint64(end.Unix())+3); err != nil || ok {
		t.Fatalf("roll up a day of two SLO versions: %v, %v", ok, err)
	}
	checkStale(days(1, 2))
	check("an hour of day 1 counted with SLO version 2", days(0), nil)
}

// migratedStore opens a store on a new database of the test server and
// migrates it.
func migratedStore(t *testing.T) (addr, db string, s *chstore.Store) {
	t.Helper()
	addr, db = chtest.NewDB(t)
	s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return addr, db, s
}
