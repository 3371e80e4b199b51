package chstore_test

import (
	"slices"
	"testing"
	"time"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/rollup"
)

// TestTelemetryMissingHours: an hour whose gpu_hour rows have no per-GPU
// rows (costed before migration 0024) is listed until a computation with
// them replaces it; an hour costed with them never is, nor one whose GPU
// samples are gone (recosting it would lose its cost).
func TestTelemetryMissingHours(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	h1 := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	h0, h2 := h1.Add(-time.Hour), h1.Add(time.Hour)
	insertSamples(t, s, h1, h2)
	group := func(hour time.Time, devices bool) rollup.GPUHourRow {
		g := rollup.GPUHourRow{Hour: hour, Deployment: "d", GPUType: "H100", GPUs: 1, Samples: 1, GPUSeconds: 3600, CoveredSeconds: 3600}
		if devices {
			d := g
			d.Node, d.GPU = "n1", "GPU-1"
			g.Devices = []rollup.GPUHourRow{d}
		}
		return g
	}
	if err := s.WriteCost(ctx, []rollup.GPUHourRow{group(h0, false), group(h1, false), group(h2, true)}, nil, 1); err != nil {
		t.Fatal(err)
	}
	got, err := s.TelemetryMissingHours(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Time{h1}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("hours without telemetry %v, want %v", got, want)
	}
	// The job recosts h1, now with its GPU's row.
	if err := s.WriteCost(ctx, []rollup.GPUHourRow{group(h1, true)}, nil, 2); err != nil {
		t.Fatal(err)
	}
	if got, err = s.TelemetryMissingHours(ctx); err != nil || len(got) != 0 {
		t.Errorf("after recosting: %v %v, want none", got, err)
	}
}
