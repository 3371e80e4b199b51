package rollup_test

import (
	"fmt"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/rollup"
)

// BenchmarkComputeCostGPUHour times the cost step's computation of one hour
// of 200 H100s sampled every 10 s (72,000 samples with every telemetry
// reading) in 25 deployments: gpu_hour rows with their telemetry and the
// per-GPU rows, each GPU priced on its own.
//
//	go test -run '^$' -bench ComputeCostGPUHour -benchtime 20x ./rollup
func BenchmarkComputeCostGPUHour(b *testing.B) {
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	book, err := billing.ParsePriceBook([]byte(`{"gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}]}`))
	if err != nil {
		b.Fatal(err)
	}
	var samples []rollup.GPUSampleRow
	for g := range 200 {
		for k := range 360 {
			var s rollup.GPUSampleRow
			s.Deployment, s.GPUType, s.Pool, s.Region = fmt.Sprint("dep-", g/8), "H100", "on-demand", "eu"
			s.Instance, s.MIGFraction = fmt.Sprintf("GPU-%08x", g), 1
			s.SampledAt, s.IntervalS, s.Utilization, s.EnergyJoules = hour.Add(time.Duration(k+1)*10*time.Second), 10, float64(k%10)/10, 5000
			s.Node, s.FBUsedBytes, s.FBTotalBytes = "n", uint64(40+k%40)<<30, 80<<30
			s.PowerWatts, s.TemperatureC, s.SMClockMHz, s.SMClockMaxMHz = 300+float64(k%50), 60+float64(k%20), 1980-float64(k%3)*200, 1980
			s.SMActive = float64(k%10) / 12
			samples = append(samples, s)
		}
	}
	b.ResetTimer()
	for range b.N {
		if _, _, err := rollup.ComputeCost(hour, book, samples, nil); err != nil {
			b.Fatal(err)
		}
	}
}
