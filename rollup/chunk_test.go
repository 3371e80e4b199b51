package rollup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"io"
	"log/slog"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// writeCounter is the store, counting the writes of each rollup table.
type writeCounter struct {
	rollup.Store
	mu     sync.Mutex
	writes map[string]int
}

func (w *writeCounter) count(table string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes[table]++
}

func (w *writeCounter) InsertRollupRecords(ctx context.Context, table string, rows []rollup.RollupRecord, sloVersion uint32, version uint64) error {
	w.count(table)
	return w.Store.InsertRollupRecords(ctx, table, rows, sloVersion, version)
}

func (w *writeCounter) WriteCost(ctx context.Context, gpu []rollup.GPUHourRow, cost []rollup.CostRow, version uint64) error {
	w.count("cost")
	return w.Store.WriteCost(ctx, gpu, cost, version)
}

// TestCatchUpWritesHoursTogether: a run that finds weeks of hours to roll
// up (a replayed history) writes each rollup table once per chunk of
// hours, not once per hour (an INSERT costs ClickHouse a part of every
// column whatever its rows: 0.3 s an hour on the development VM), and the
// usage of every hour is still exact.
func TestCatchUpWritesHoursTogether(t *testing.T) {
	f := newFixture(t)
	const hours = 100
	var events []*meterv1.InferenceEvent
	for i := range 5 * hours {
		events = append(events, genEvent(i, h0.Add(time.Duration(i)*720*time.Second)))
	}
	f.insert(t, events)
	w := &writeCounter{Store: f.store, writes: map[string]int{}}
	job, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, w, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	got, err := job.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != hours {
		t.Fatalf("the run rolled up %d hours, want %d", len(got), hours)
	}
	// 100 hours in chunks of at most 24: 5 chunks.
	for _, table := range []string{"rollup_hour", "rollup_tenant_hour", "rollup_total_hour", "rollup_deployment_hour", "cost"} {
		if n := w.writes[table]; n < 1 || n > 5 {
			t.Errorf("%s was written %d times for %d hours, want 1 to 5 (once per chunk of hours)", table, n, hours)
		}
	}

	type key struct {
		hour   int64
		tenant string
	}
	want := map[key]uint64{}
	for _, ev := range events {
		want[key{ev.GetCompletedAt().AsTime().Truncate(time.Hour).Unix(), ev.GetTenantId()}] += uint64(ev.GetOutputTokens()) + 1_000_000
	}
	// The rollups only (hour steps read raw events for hours not rolled up).
	rows, err := query.New(f.store, query.Config{}).Rollups(context.Background(), query.RollupQuery{
		Start: h0, End: h0.Add(hours * time.Hour), Step: "hour", GroupBy: []string{"tenant_id"}})
	if err != nil {
		t.Fatal(err)
	}
	have := map[key]uint64{}
	for _, r := range rows {
		have[key{r.Start.Unix(), r.Group["tenant_id"]}] += r.OutputTokens + 1_000_000*r.Requests
	}
	if diff := cmp.Diff(want, have); diff != "" {
		t.Errorf("hourly rollups of the caught-up hours (-want +got):\n%s", diff)
	}
}
