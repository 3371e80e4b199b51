package query_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// TestMinuteWindow: with minute rows kept for a window, a usage query at a
// minute step before it is answered exactly from the raw events (up to
// MaxExactRange), longer ones and the other minute-step reads are refused
// with an error naming the window, and reads inside the window or at an
// hour step are unchanged, also after the rollup job dropped the old days.
func TestMinuteWindow(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	var events []*meterv1.InferenceEvent
	for i := range 5000 { // day 00:00 to about 51 h later
		events = append(events, event(i))
	}
	var b chstore.EventBatch
	for _, ev := range events {
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{Partition: 0, Offset: 1})
	}
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}
	now := day.Add(50 * time.Hour) // the window (24 h) starts at day+26h
	// The job counts the hours while day 0 is still inside the window: it
	// writes no minute rows of days already outside it.
	job, err := rollup.NewJob(rollup.Config{MinuteRetention: 24 * time.Hour}, s, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), func() time.Time { return day.Add(time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// Minute rows of day 0, read without a window.
	day0Minutes := func() int {
		rows, err := query.New(s, query.Config{}).Rollups(ctx, query.RollupQuery{Start: day.Add(time.Hour), End: day.Add(2 * time.Hour), Step: "minute"})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	if n := day0Minutes(); n == 0 {
		t.Fatal("no minute rows of day 0 after the rollup")
	}
	reads := query.New(s, query.Config{MinuteRetention: 24 * time.Hour, Now: func() time.Time { return now }})

	check := func(when string) {
		t.Helper()
		for _, q := range []query.UsageQuery{
			{Start: day.Add(time.Hour), End: day.Add(3 * time.Hour), Granularity: "minute"},                                   // before the window: raw
			{Start: day.Add(20 * time.Hour), End: day.Add(30 * time.Hour), Granularity: "minute", TenantID: "acme"},           // across its start: raw
			{Start: day.Add(27 * time.Hour), End: day.Add(29*time.Hour + 30*time.Minute), Granularity: "minute"},              // inside: minute rows
			{Start: day, End: day.Add(48 * time.Hour), Granularity: "hour", GroupBy: []string{"tenant_id"}},                   // hour rows
			{Start: day.Add(90 * time.Second).Truncate(time.Minute), End: day.Add(5 * time.Hour), GroupBy: []string{"model"}}, // minute level, before: raw
		} {
			got, err := reads.Usage(ctx, q)
			if err != nil {
				t.Fatalf("%s: usage %+v: %v", when, q, err)
			}
			// Token sizes: TestTokenSizesExact.
			if diff := cmp.Diff(bruteUsage(events, q), got, cmpopts.IgnoreFields(query.UsageRow{}, "Sizes")); diff != "" {
				t.Errorf("%s: usage %+v (-want +got):\n%s", when, q, diff)
			}
		}
		refused := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, query.ErrOutsideMinuteWindow) || !errors.Is(err, query.ErrInvalidQuery) {
				t.Fatalf("%s: %s: got %v, want ErrOutsideMinuteWindow", when, what, err)
			}
		}
		_, err := reads.Usage(ctx, query.UsageQuery{Start: day, End: day.Add(30 * time.Hour), Granularity: "minute"})
		refused("usage of 30 h at a minute step", err)
		_, err = reads.Rollups(ctx, query.RollupQuery{Start: day.Add(time.Hour), End: day.Add(2 * time.Hour), Step: "minute"})
		refused("latency at a minute step", err)
		_, err = reads.Traffic(ctx, query.RollupQuery{Start: day.Add(time.Hour), End: day.Add(2 * time.Hour), Step: "minute"})
		refused("traffic at a minute step", err)
		if _, err := reads.Rollups(ctx, query.RollupQuery{Start: day, End: day.Add(48 * time.Hour), Step: "hour"}); err != nil {
			t.Fatalf("%s: latency at an hour step: %v", when, err)
		}
		if _, err := reads.Rollups(ctx, query.RollupQuery{Start: day.Add(27 * time.Hour), End: day.Add(28 * time.Hour), Step: "minute"}); err != nil {
			t.Fatalf("%s: latency at a minute step inside the window: %v", when, err)
		}
	}
	check("before the drop")

	// The job's hourly sweep, at now: day 0 lies wholly before the window.
	sweeper, err := rollup.NewJob(rollup.Config{MinuteRetention: 24 * time.Hour}, s, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	if err := sweeper.DropOldMinutes(ctx); err != nil {
		t.Fatal(err)
	}
	if n := day0Minutes(); n != 0 {
		t.Fatalf("%d minute rows of day 0 left after the sweep", n)
	}
	if dropped, err := s.DropMinuteDays(ctx, now.Add(-24*time.Hour)); err != nil || len(dropped) != 0 {
		t.Fatalf("a second sweep dropped %v (%v): want nothing left before the window", dropped, err)
	}
	check("after the drop")
}
