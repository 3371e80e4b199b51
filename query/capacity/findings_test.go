package capacity

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"tokenmeter/rollup"
)

// TestGPUFindingsBruteForce: memory pressure and thermal throttling from
// random hours of GPU telemetry on two GPU types (whose sums merge per
// hour), against a brute-force count of the hours over the alert rules'
// thresholds: memory in use averaging above 95%, a sample above 95%, a
// GPU above 83 °C, clocks throttled for at least 1% of the busy time.
func TestGPUFindingsBruteForce(t *testing.T) {
	kinds := map[string]int{}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 3))
		f := &fleet{}
		const hours = 48
		pressured, peaked, hot := 0, 0, 0
		var clock, throttle float64
		for i := range hours {
			at := day0.Add(time.Duration(i) * time.Hour)
			var used, total, maxRatio, maxTemp float64
			for _, typ := range []string{"H100", "A100"} {
				f.gpuHour("d", typ, at, 2, 0.5, 1_000_000_000)
				f.traffic("m", "d", at, 10, 10, 100, 100)
				var m rollup.GPUTelemetry
				totalMiB := 81920.0
				ratio := 0.80 + 0.17*rng.Float64()
				if seed%3 == 0 {
					ratio = 0.90 + 0.0555*rng.Float64()
				}
				m.FBSeconds, m.FBTotalMiBSeconds, m.FBUsedMiBSeconds = 7200, totalMiB*7200, ratio*totalMiB*7200
				m.FBUsedMaxRatio = min(1, ratio+0.05*rng.Float64())
				m.TempSeconds, m.TempMax = 7200, 60+25*rng.Float64()
				if seed%4 == 0 {
					m.TempMax = min(m.TempMax, 83) // the boundary is not hot
				}
				m.TempDegreeSeconds = m.TempMax * 7200
				m.ClockSeconds = 3600
				if rng.IntN(5) == 0 && seed%2 == 0 {
					m.ThrottleSeconds = 3600 * rng.Float64() * 0.1
				}
				f.gpu[len(f.gpu)-1].Telemetry = m
				used += m.FBUsedMiBSeconds
				total += m.FBTotalMiBSeconds
				maxRatio, maxTemp = max(maxRatio, m.FBUsedMaxRatio), max(maxTemp, m.TempMax)
				clock += m.ClockSeconds
				throttle += m.ThrottleSeconds
			}
			switch {
			case used/total > 0.95:
				pressured++
			case maxRatio > 0.95:
				peaked++
			}
			if maxTemp > 83 {
				hot++
			}
		}
		r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(hours * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{} // kind → severity, -1 none
		wantText := map[string]string{}
		switch {
		case pressured > 0:
			want[KindMemoryPressure], wantText[KindMemoryPressure] = 2, fmt.Sprintf("in %d of its %d hours", pressured, hours)
		case peaked > 0:
			want[KindMemoryPressure], wantText[KindMemoryPressure] = 1, fmt.Sprintf("in %d hours a sample", peaked)
		}
		switch {
		case hot > 0:
			want[KindThermal], wantText[KindThermal] = 2, fmt.Sprintf("in %d hours a GPU was above 83 °C", hot)
		case throttle >= 0.01*clock:
			want[KindThermal], wantText[KindThermal] = 1, "clocks throttled"
		}
		got := map[string]Finding{}
		for _, fd := range r.Findings {
			if fd.Kind == KindMemoryPressure || fd.Kind == KindThermal {
				got[fd.Kind] = fd
			}
		}
		for _, kind := range []string{KindMemoryPressure, KindThermal} {
			w, ok := want[kind]
			g, gotOK := got[kind]
			if ok != gotOK || ok && (g.Severity != w || !strings.Contains(g.Text, wantText[kind])) {
				t.Fatalf("seed %d: %s finding %+v (present %v), want severity %d with %q (present %v)", seed, kind, g, gotOK, w, wantText[kind], ok)
			}
			if ok {
				kinds[fmt.Sprint(kind, w)]++
			}
		}
	}
	// Every branch is exercised.
	for _, k := range []string{"memory_pressure2", "memory_pressure1", "thermal_throttling2", "thermal_throttling1"} {
		if kinds[k] == 0 {
			t.Errorf("no seed gave %s (%v)", k, kinds)
		}
	}
}
