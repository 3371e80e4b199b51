package rollup_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"tokenmeter/billing"
	"tokenmeter/rollup"
)

// TestComputeCostTelemetryExact checks the telemetry of every gpu_hour row
// and of every GPU's gpu_device_hour row of an hour of random samples
// against a brute force over the samples, that a group's GPU rows add up
// to the group's time and energy, and their costs (busy and idle) to the
// group's exactly, each GPU's within two nano-units of its cost priced
// alone (prices that do not divide the second, a price change inside the
// hour, MIG fractions). The samples mix whole GPUs and MIG
// instances, idle ones, missing readings, reported and unreported maximum
// clocks, in several deployments sharing GPU types.
func TestComputeCostTelemetryExact(t *testing.T) {
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	book, err := billing.ParsePriceBook([]byte(`{"gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"},` +
		`{"gpu_type":"A100","effective_from":"2026-01-01T00:00:00Z","per_hour":"2.345678917"},` +
		`{"gpu_type":"A100","effective_from":"2026-11-22T10:31:07Z","per_hour":"1.987654321"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(33, 1))
	var samples []rollup.GPUSampleRow
	for range 2000 {
		dep := []string{"d1", "d2", "d3"}[rng.IntN(3)]
		gpuType := []string{"H100", "A100"}[rng.IntN(2)]
		s := rollup.GPUSampleRow{Deployment: dep, GPUType: gpuType, Pool: "p", Region: "r",
			Node: fmt.Sprint("n", rng.IntN(3)), Instance: fmt.Sprint("GPU-", rng.IntN(6)), MIGFraction: 1,
			SampledAt: hour.Add(time.Duration(rng.IntN(3600)) * time.Second), IntervalS: float64(5 + rng.IntN(20)),
			SMActive: -1}
		if rng.IntN(4) == 0 {
			s.MIGProfile, s.MIGFraction = "1g.10gb", 1.0/7
			s.Instance += fmt.Sprint("/", 1+rng.IntN(3))
		}
		if rng.IntN(6) != 0 {
			s.Utilization = rng.Float64()
		}
		if rng.IntN(8) != 0 {
			s.FBTotalBytes = 80 << 30
			s.FBUsedBytes = uint64(rng.Int64N(80 << 30))
		} else {
			s.FBUsedBytes = uint64(rng.IntN(1 << 20)) // used without a total
		}
		if rng.IntN(7) != 0 {
			s.PowerWatts = 100 + rng.Float64()*600
		}
		if rng.IntN(9) != 0 {
			s.TemperatureC = 30 + rng.Float64()*60
		}
		if rng.IntN(10) != 0 {
			s.SMClockMHz = float64(800 + rng.IntN(1200))
		}
		if rng.IntN(3) == 0 {
			s.SMClockMaxMHz = 1980
		}
		if rng.IntN(2) == 0 {
			s.SMActive = rng.Float64()
		}
		samples = append(samples, s)
	}
	gpuRows, _, err := rollup.ComputeCost(hour, book, samples, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The brute force, from the definitions.
	normal := func(s rollup.GPUSampleRow) float64 {
		if s.SMClockMaxMHz > 0 {
			return s.SMClockMaxMHz
		}
		var hi float64
		for _, o := range samples {
			if o.Deployment == s.Deployment && o.GPUType == s.GPUType {
				hi = math.Max(hi, o.SMClockMHz)
			}
		}
		return hi
	}
	brute := func(of func(rollup.GPUSampleRow) bool) rollup.GPUTelemetrySummary {
		var (
			out                                            rollup.GPUTelemetrySummary
			mem, used, total, pw, pws, tmp, tmps, clk, thr float64
			sm, sms                                        float64
		)
		for _, s := range samples {
			if !of(s) {
				continue
			}
			dt := s.IntervalS
			if s.FBTotalBytes > 0 {
				mem += dt
				used += float64(s.FBUsedBytes) * dt
				total += float64(s.FBTotalBytes) * dt
				out.MemoryUsedMaxRatio = math.Max(out.MemoryUsedMaxRatio, float64(s.FBUsedBytes)/float64(s.FBTotalBytes))
			}
			out.MemoryUsedMaxBytes = max(out.MemoryUsedMaxBytes, s.FBUsedBytes)
			if s.PowerWatts > 0 {
				pw += dt
				pws += s.PowerWatts * dt
				out.PowerMaxWatts = math.Max(out.PowerMaxWatts, s.PowerWatts)
			}
			if s.TemperatureC > 0 {
				tmp += dt
				tmps += s.TemperatureC * dt
				out.TemperatureMaxC = math.Max(out.TemperatureMaxC, s.TemperatureC)
			}
			if n := normal(s); s.Utilization > 0 && s.SMClockMHz > 0 && n > 0 {
				clk += dt * s.MIGFraction
				if s.SMClockMHz < 0.9*n {
					thr += dt * s.MIGFraction
				}
			}
			if s.SMActive >= 0 {
				sm += dt
				sms += s.SMActive * dt
			}
		}
		div := func(a, b float64) float64 { // no reading: 0
			if b == 0 {
				return 0
			}
			return a / b
		}
		out.MemoryUsedMeanBytes, out.MemoryUsedRatio, out.MemoryHours = div(used, mem), div(used, total), mem/3600
		out.PowerMeanWatts, out.PowerHours = div(pws, pw), pw/3600
		out.TemperatureMeanC, out.TemperatureHours = div(tmps, tmp), tmp/3600
		out.ClockThrottleSeconds, out.ClockHours, out.ClockThrottleShare = thr, clk/3600, div(thr, clk)
		out.SMActive, out.SMActiveHours = div(sms, sm), sm/3600
		return out
	}
	approx := cmpopts.EquateApprox(1e-12, 0)
	var devices int
	for _, g := range gpuRows {
		inGroup := func(s rollup.GPUSampleRow) bool {
			return s.Deployment == g.Deployment && s.GPUType == g.GPUType && s.MIGProfile == g.MIGProfile
		}
		if diff := cmp.Diff(brute(inGroup), g.Telemetry.Summary(), approx); diff != "" {
			t.Errorf("%s %s %q: telemetry (-brute +rollup):\n%s", g.Deployment, g.GPUType, g.MIGProfile, diff)
		}
		var sec, busy, energy float64
		var cost, busyCost, idleCost int64
		for _, d := range g.Devices {
			devices++
			cost, busyCost, idleCost = cost+d.CostNanos, busyCost+d.BusyCostNanos, idleCost+d.IdleCostNanos
			if d.CostNanos != d.BusyCostNanos+d.IdleCostNanos {
				t.Errorf("%s %s %q GPU %s: cost %d is not busy %d + idle %d", g.Deployment, g.GPUType, g.MIGProfile, d.GPU, d.CostNanos, d.BusyCostNanos, d.IdleCostNanos)
			}
			// Each GPU's share stays within a nano-unit or two of its own
			// cost priced alone.
			var own []billing.GPUUsage
			for _, s := range samples {
				if inGroup(s) && s.Instance == d.GPU {
					own = append(own, billing.GPUUsage{GPUType: s.GPUType, Pool: s.Pool, Region: s.Region, MIGFraction: s.MIGFraction,
						At: s.SampledAt, GPUSeconds: s.IntervalS, BusySeconds: s.IntervalS * min(max(s.Utilization, 0), 1)})
				}
			}
			alone, err := book.GPUCost(own)
			if err != nil {
				t.Fatal(err)
			}
			if off := int64(alone.BusyCost) - d.BusyCostNanos; off < -2 || off > 2 {
				t.Errorf("%s %s %q GPU %s: busy cost %d nano-units off its own", g.Deployment, g.GPUType, g.MIGProfile, d.GPU, off)
			}
			if off := int64(alone.IdleCost) - d.IdleCostNanos; off < -2 || off > 2 {
				t.Errorf("%s %s %q GPU %s: idle cost %d nano-units off its own", g.Deployment, g.GPUType, g.MIGProfile, d.GPU, off)
			}
			if diff := cmp.Diff(brute(func(s rollup.GPUSampleRow) bool { return inGroup(s) && s.Instance == d.GPU }), d.Telemetry.Summary(), approx); diff != "" {
				t.Errorf("%s %s %q GPU %s: telemetry (-brute +rollup):\n%s", g.Deployment, g.GPUType, g.MIGProfile, d.GPU, diff)
			}
			sec, busy, energy = sec+d.GPUSeconds, busy+d.BusySeconds, energy+d.EnergyJoules
		}
		// Money is exact: the GPUs' costs add up to the group's.
		if cost != g.CostNanos || busyCost != g.BusyCostNanos || idleCost != g.IdleCostNanos {
			t.Errorf("%s %s %q: GPUs' costs add up to %d (busy %d, idle %d) nano-units; the group's are %d (%d, %d)", g.Deployment, g.GPUType, g.MIGProfile,
				cost, busyCost, idleCost, g.CostNanos, g.BusyCostNanos, g.IdleCostNanos)
		}
		if math.Abs(sec-g.GPUSeconds) > 1e-9*g.GPUSeconds || math.Abs(busy-g.BusySeconds) > 1e-9*g.GPUSeconds || uint32(len(g.Devices)) != g.GPUs {
			t.Errorf("%s %s %q: GPUs add up to %v s (%v busy) over %d GPUs; the group has %v (%v) over %d", g.Deployment, g.GPUType, g.MIGProfile,
				sec, busy, len(g.Devices), g.GPUSeconds, g.BusySeconds, g.GPUs)
		}
	}
	if len(gpuRows) != 12 || devices < 50 {
		t.Errorf("%d groups, %d GPU rows: want 12 groups (3 deployments × 2 types × 2 profiles) of many GPUs", len(gpuRows), devices)
	}
}
