package chstore_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// telemetryColumns are the columns migration 0024 adds to gpu_hour.
const telemetryColumns = `'fb_seconds','fb_used_mib_seconds','fb_total_mib_seconds','fb_used_max','fb_used_max_ratio',
  'power_seconds','power_watt_seconds','power_max','temp_seconds','temp_degree_seconds','temp_max','clock_seconds',
  'throttle_seconds','sm_active_seconds','sm_active_sum'`

// BenchmarkGPUTelemetryStorage measures what GPU telemetry (migration 0024)
// stores at the query benchmark's scale (200 H100s over 30 days, 100M
// events): the rows of gpu_hour and gpu_device_hour that the cost step
// computes from samples (6 an hour per GPU here: the rows hold sums, so
// their size does not depend on the sample count), and the two new
// gpu_samples columns over 1M samples of 10 s whose SM activity varies as
// DCGM's does. It writes once and reports bytes; the loop does nothing.
//
//	go test -run '^$' -bench GPUTelemetryStorage -benchtime 1x ./internal/adapter/chstore
func BenchmarkGPUTelemetryStorage(b *testing.B) {
	s := chstoretest.OpenMigrated(b)
	ctx := b.Context()
	book, err := billing.ParsePriceBook([]byte(`{"gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}]}`))
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	var rows []rollup.GPUHourRow
	for h := range 720 {
		hour := start.Add(time.Duration(h) * time.Hour)
		var samples []rollup.GPUSampleRow
		for g := range 200 {
			for k := range 6 {
				u := rng.Float64()
				samples = append(samples, rollup.GPUSampleRow{Deployment: fmt.Sprint("dep-", g/8), GPUType: "H100", Pool: "on-demand", Region: "eu",
					Instance: fmt.Sprintf("GPU-%08x-synthetic", g), Node: fmt.Sprint("node-", g/8), MIGFraction: 1,
					SampledAt: hour.Add(time.Duration(k+1) * 10 * time.Minute), IntervalS: 600, Utilization: u, EnergyJoules: 600 * (90 + 600*u),
					FBUsedBytes: uint64(60+15*u) << 30, FBTotalBytes: 80 << 30, PowerWatts: 90 + 600*u, TemperatureC: 35 + 40*u,
					SMClockMHz: 1980 - float64(rng.IntN(3))*150, SMClockMaxMHz: 1980, SMActive: 0.9 * u})
			}
		}
		gpu, _, err := rollup.ComputeCost(hour, book, samples, nil)
		if err != nil {
			b.Fatal(err)
		}
		rows = append(rows, gpu...)
		if len(rows) > 500 || h == 719 {
			if err := s.WriteCost(ctx, rows, nil, 1); err != nil {
				b.Fatal(err)
			}
			rows = rows[:0]
		}
	}
	var batch chstore.GPUBatch
	for i := range 1_000_000 {
		u := rng.Float64()
		batch.Append(&meterv1.GpuSample{SampleId: fmt.Sprint(i), GpuUuid: fmt.Sprintf("GPU-%08x-synthetic", i%200), GpuType: "H100",
			Deployment: fmt.Sprint("dep-", i%200/8), SampledAt: timestamppb.New(start.Add(time.Duration(i/200) * 10 * time.Second)),
			IntervalS: 10, Utilization: u, SmActive: proto.Float64(0.9 * u), SmClockMaxMhz: 1980}, start)
	}
	if err := s.InsertGPUSamples(ctx, &batch); err != nil {
		b.Fatal(err)
	}
	bytes := func(stmt string) float64 {
		v, err := s.QueryUint64(ctx, stmt)
		if err != nil {
			b.Fatal(err)
		}
		return float64(v)
	}
	const events = 100e6
	for _, tb := range []string{"gpu_hour", "gpu_device_hour", "gpu_samples"} {
		if err := s.Exec(ctx, "OPTIMIZE TABLE "+tb+" FINAL"); err != nil {
			b.Fatal(err)
		}
	}
	device := bytes("SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = currentDatabase() AND table = 'gpu_device_hour'")
	tel := bytes("SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = currentDatabase() AND table = 'gpu_hour' AND name IN (" + telemetryColumns + ")")
	smpl := bytes("SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = currentDatabase() AND table = 'gpu_samples' AND name IN ('sm_active', 'sm_clock_max_mhz')")
	for b.Loop() { // b.Loop resets the reported metrics: they come after
	}
	b.ReportMetric(device/events, "device_hour_B/event")
	b.ReportMetric(tel/events, "gpu_hour_telemetry_B/event")
	b.ReportMetric(smpl/1e6, "sample_cols_B/sample")
	// The benchmark set's 52M samples over its 100M events.
	b.ReportMetric(smpl/1e6*52e6/events, "sample_cols_B/event")
}
