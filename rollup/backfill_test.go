package rollup_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// backfillStore records the hours the cost step reads samples of (picks)
// and writes cost rows of; fresh makes the one-time GPU backfill look not
// yet done (the first start after the upgrade).
type backfillStore struct {
	*chstore.Store
	fresh           bool
	picked, written map[time.Time]bool
}

func (b *backfillStore) Watermark(ctx context.Context, job string) (time.Time, bool, error) {
	if b.fresh && job == rollup.GPUBackfillJobName {
		return time.Time{}, false, nil
	}
	return b.Store.Watermark(ctx, job)
}

func (b *backfillStore) GPUSamplesOfHours(ctx context.Context, from, to time.Time) ([]rollup.GPUSampleRow, error) {
	for h := from; h.Before(to); h = h.Add(time.Hour) {
		b.picked[h.UTC()] = true
	}
	return b.Store.GPUSamplesOfHours(ctx, from, to)
}

func (b *backfillStore) WriteCost(ctx context.Context, gpu []rollup.GPUHourRow, cost []rollup.CostRow, version uint64) error {
	for _, g := range gpu {
		b.written[g.Hour.UTC()] = true
	}
	for _, c := range cost {
		b.written[c.Hour.UTC()] = true
	}
	return b.Store.WriteCost(ctx, gpu, cost, version)
}

func keys(m map[time.Time]bool) []time.Time {
	out := make([]time.Time, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// TestJobGPUBackfillOnce checks the one-time recost of hours costed before
// migrations 0024 and 0026 at job start: an hour whose GPU samples are gone
// is never picked, so its attributed cost lines are not rewritten as
// unattributed ones; an hour that still has samples but whose GPU time
// rounds to 0 ms (so that it still looks costed before 0026 afterwards) is
// recosted once, at the first start after the upgrade, and not at the
// starts after.
func TestJobGPUBackfillOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	gone, zero := h0, h0.Add(time.Hour)
	var gpus chstore.GPUBatch
	gpus.Append(&meterv1.GpuSample{SampleId: "g1", GpuUuid: "GPU-1", GpuType: "H100", Node: "n1", Deployment: "dllama-70b",
		SampledAt: timestamppb.New(zero.Add(time.Minute)), IntervalS: 0.0004, Utilization: 0.5}, time.Now())
	if err := f.store.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	f.insert(t, []*meterv1.InferenceEvent{genEvent(2, gone.Add(time.Minute)), genEvent(4, zero.Add(time.Minute))})
	if _, err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// The hour without samples as costed before the upgrade, when its
	// samples were still kept: attributed lines without GPU time, a GPU
	// group without per-GPU rows.
	// With the price book in force: a price change recosts every hour.
	book, err := billing.BookInForce(ctx, f.store)
	if err != nil {
		t.Fatal(err)
	}
	pv := book.Version()
	version := uint64(time.Now().UnixMilli()) << rollup.VersionReplicaBits
	old := []rollup.CostRow{
		{Hour: gone, TenantID: "globex", Deployment: "dllama-70b", Model: "llama-70b", Requests: 1, Cost: [3][3]int64{{5}}, PriceVersion: pv},
		{Hour: gone, TenantID: "__idle__", Deployment: "dllama-70b", Cost: [3][3]int64{{7}}, PriceVersion: pv},
	}
	groups := []rollup.GPUHourRow{{Hour: gone, Deployment: "dllama-70b", GPUType: "H100", GPUs: 1, Samples: 1, GPUSeconds: 10,
		CoveredSeconds: 10, PriceVersion: pv}}
	if err := f.store.WriteCost(ctx, groups, old, version); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // the next jobs' versions are later

	for i, tt := range []struct {
		fresh bool
		want  []time.Time
	}{
		{true, []time.Time{zero}}, // the first start after the upgrade
		{false, nil},              // a restart
		{false, nil},
	} {
		bs := &backfillStore{Store: f.store, fresh: tt.fresh, picked: map[time.Time]bool{}, written: map[time.Time]bool{}}
		j, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, bs, prometheus.NewRegistry(),
			slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := j.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if got := keys(bs.picked); !slices.EqualFunc(got, tt.want, time.Time.Equal) {
			t.Errorf("start %d: hours recosted %v, want %v", i+1, got, tt.want)
		}
		if bs.written[gone] {
			t.Errorf("start %d: the cost of %v, whose GPU samples are gone, was rewritten", i+1, gone)
		}
	}
}
