package chstore_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// insertSamples stores a GPU sample in each of hours.
func insertSamples(t *testing.T, s *chstore.Store, hours ...time.Time) {
	t.Helper()
	var b chstore.GPUBatch
	for i, h := range hours {
		b.Append(&meterv1.GpuSample{SampleId: fmt.Sprint("s", i), GpuUuid: "GPU-1", GpuType: "H100", Node: "n1", Deployment: "d",
			SampledAt: timestamppb.New(h.Add(90 * time.Second)), IntervalS: 10, Utilization: 0.5}, time.Now())
	}
	if err := s.InsertGPUSamples(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
}

// TestGPUTimeMissingHours: an hour whose newest cost rows have attributed
// lines without GPU time (costed before migration 0026) is listed until a
// computation with GPU time replaces them; an hour of unattributed usage
// only (no GPUs) never is, nor one whose GPU samples are gone (recosting it
// would turn its lines into unattributed ones).
func TestGPUTimeMissingHours(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	h1 := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	h0, h2, h3 := h1.Add(-time.Hour), h1.Add(time.Hour), h1.Add(2*time.Hour)
	insertSamples(t, s, h1, h2, h3)
	old := []rollup.CostRow{
		{Hour: h0, TenantID: "acme", Deployment: "d", Model: "m", Requests: 1, Cost: [3][3]int64{{4}}},
		{Hour: h1, TenantID: "acme", Deployment: "d", Model: "m", Requests: 3, Cost: [3][3]int64{{5}}},
		{Hour: h1, TenantID: "__idle__", Deployment: "d", Cost: [3][3]int64{{7}}},
		{Hour: h3, TenantID: "acme", Deployment: "none", Model: "m", Requests: 2, Unattributed: true},
	}
	withTime := []rollup.CostRow{
		{Hour: h2, TenantID: "acme", Deployment: "d", Model: "m", Requests: 3, Cost: [3][3]int64{{5}}, GPUMs: [3][3]uint64{{1200}}},
		{Hour: h2, TenantID: "__idle__", Deployment: "d", Cost: [3][3]int64{{7}}, GPUMs: [3][3]uint64{{2400}}},
	}
	if err := s.WriteCost(ctx, nil, append(old, withTime...), 1); err != nil {
		t.Fatal(err)
	}
	got, err := s.GPUTimeMissingHours(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Time{h1}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("hours without GPU time %v, want %v", got, want)
	}
	// The job recosts h1: its newest rows carry GPU time.
	recosted := slices.Clone(old[1:3])
	recosted[0].GPUMs[0][0], recosted[1].GPUMs[0][0] = 1000, 2600
	if err := s.WriteCost(ctx, nil, recosted, 2); err != nil {
		t.Fatal(err)
	}
	if got, err = s.GPUTimeMissingHours(ctx); err != nil || len(got) != 0 {
		t.Errorf("after recosting: %v %v, want none", got, err)
	}
}
