package api_test

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// telemetrySample is a generated GPU sample with the fields the brute
// force reads.
type telemetrySample struct {
	dep, gpuType, node, gpu string
	hour                    time.Time
	interval, frac, util    float64
	used, total             uint64
	power, temp             float64
	clock, clockMax         float64
	smActive                float64 // < 0: not carried
}

// telemetryFleet generates three hours of samples: two whole H100s of d-a
// on two nodes (some hours hot and throttled), two MIG instances of one
// A100 of d-b, and a GPU of d-c without any telemetry. Intervals, idle
// samples, missing readings and the max clock vary with the index.
func telemetryFleet(start time.Time) ([]*meterv1.GpuSample, []telemetrySample) {
	type gpu struct {
		dep, gpuType, node, uuid, profile string
		mig                               uint32
		frac                              float64
		bare                              bool
	}
	gpus := []gpu{
		{dep: "d-a", gpuType: "H100", node: "n1", uuid: "GPU-a1"},
		{dep: "d-a", gpuType: "H100", node: "n2", uuid: "GPU-a2"},
		{dep: "d-b", gpuType: "A100", node: "n3", uuid: "GPU-b1", profile: "1g.10gb", mig: 1, frac: 1.0 / 7},
		{dep: "d-b", gpuType: "A100", node: "n3", uuid: "GPU-b1", profile: "1g.10gb", mig: 2, frac: 1.0 / 7},
		{dep: "d-c", gpuType: "L4", node: "n4", uuid: "GPU-c1", bare: true},
	}
	var (
		msgs []*meterv1.GpuSample
		want []telemetrySample
	)
	for gi, g := range gpus {
		for k, at := 0, time.Duration(0); at < 3*time.Hour; k++ {
			iv := []float64{10, 15, 20}[(k+gi)%3]
			at += time.Duration(iv * float64(time.Second))
			if at >= 3*time.Hour {
				break
			}
			m := &meterv1.GpuSample{SampleId: fmt.Sprintf("%s/%d/%d", g.uuid, g.mig, k), Node: g.node, GpuUuid: g.uuid, GpuType: g.gpuType,
				MigProfile: g.profile, MigInstanceId: g.mig, MigFraction: g.frac, Deployment: g.dep, Source: "test",
				SampledAt: timestamppb.New(start.Add(at)), IntervalS: iv}
			if k%9 != 4 { // idle samples now and then
				m.Utilization = 0.2 + float64((k*7+gi)%8)/10
			}
			if !g.bare {
				total := uint64(80 << 30)
				if g.frac > 0 {
					total = 10 << 30
				}
				m.FbTotalBytes = total
				m.FbUsedBytes = total / 100 * uint64(50+(k*13+gi)%50) // up to 99%
				if k%11 != 3 {                                        // a few samples without power
					m.PowerWatts = 150 + float64((k*17+gi)%60)*9.5
				}
				m.TemperatureC = 50 + float64((k*5+gi)%36) // up to 85 °C
				m.SmClockMhz = []float64{1980, 1950, 1700, 1410, 1200}[(k+2*gi)%5]
				if k%4 == 1 {
					m.SmClockMaxMhz = 1980
				}
				if gi != 1 && k%3 != 2 { // GPU-a2 has no SM activity (NVML-like)
					m.SmActive = proto.Float64(float64((k*3+gi)%11) / 10)
				}
			}
			msgs = append(msgs, m)
			s := telemetrySample{dep: g.dep, gpuType: g.gpuType, node: g.node, gpu: g.uuid,
				hour: start.Add(at).Truncate(time.Hour), interval: iv, frac: g.frac, util: m.GetUtilization(),
				used: m.GetFbUsedBytes(), total: m.GetFbTotalBytes(), power: m.GetPowerWatts(), temp: m.GetTemperatureC(),
				clock: m.GetSmClockMhz(), clockMax: m.GetSmClockMaxMhz(), smActive: -1}
			if g.profile != "" {
				s.gpu = fmt.Sprintf("%s/%d", g.uuid, g.mig)
			}
			if m.SmActive != nil {
				s.smActive = m.GetSmActive()
			}
			want = append(want, s)
		}
	}
	return msgs, want
}

// bruteTelemetry computes the served telemetry of the samples straight
// from the definitions (docs/architecture.md "GPU telemetry"), as the
// rollup does not: sample by sample.
func bruteTelemetry(all, samples []telemetrySample) *meterv1.GpuTelemetry {
	// The normal clock of a sample without a max clock: the highest SM
	// clock of its deployment and GPU type in its hour, over all samples.
	normal := func(s telemetrySample) float64 {
		if s.clockMax > 0 {
			return s.clockMax
		}
		var hi float64
		for _, o := range all {
			if o.dep == s.dep && o.gpuType == s.gpuType && o.hour.Equal(s.hour) {
				hi = math.Max(hi, o.clock)
			}
		}
		return hi
	}
	var (
		out                                                meterv1.GpuTelemetry
		memSec, usedSec, totalSec, powSec, powSum, tempSec float64
		tempSum, clockSec, throttle, smSec, smSum          float64
	)
	for _, s := range samples {
		dt := s.interval
		if s.total > 0 {
			memSec += dt
			usedSec += float64(s.used) * dt
			totalSec += float64(s.total) * dt
			out.MemoryUsedMaxRatio = math.Max(out.MemoryUsedMaxRatio, float64(s.used)/float64(s.total))
		}
		out.MemoryUsedMaxBytes = max(out.MemoryUsedMaxBytes, s.used)
		if s.power > 0 {
			powSec += dt
			powSum += s.power * dt
			out.PowerMaxWatts = math.Max(out.PowerMaxWatts, s.power)
		}
		if s.temp > 0 {
			tempSec += dt
			tempSum += s.temp * dt
			out.TemperatureMaxC = math.Max(out.TemperatureMaxC, s.temp)
		}
		if n := normal(s); s.util > 0 && s.clock > 0 && n > 0 {
			eff := dt
			if s.frac > 0 {
				eff = dt * s.frac
			}
			clockSec += eff
			if s.clock < 0.9*n {
				throttle += eff
			}
		}
		if s.smActive >= 0 {
			smSec += dt
			smSum += s.smActive * dt
		}
	}
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	out.MemoryUsedMeanBytes, out.MemoryUsedRatio, out.MemoryHours = div(usedSec, memSec), div(usedSec, totalSec), memSec/3600
	out.PowerMeanWatts, out.PowerHours = div(powSum, powSec), powSec/3600
	out.TemperatureMeanC, out.TemperatureHours = div(tempSum, tempSec), tempSec/3600
	out.ClockThrottleSeconds, out.ClockHours, out.ClockThrottleShare = throttle, clockSec/3600, div(throttle, clockSec)
	out.SmActive, out.SmActiveHours = div(smSum, smSec), smSec/3600
	return &out
}

// approxEqual compares within a relative 1e-9: the figures are sums of
// floats, added in another order (and read through ClickHouse's
// fixed-point sums) than the brute force's.
func approxEqual(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

// TestGpuTelemetryAnswers checks GetGpuUsage's telemetry, grouped per
// deployment, GPU type, node and GPU and stepped per hour and in total,
// and the capacity report's units (others included) and hours, against a brute force over
// the generated samples, over gRPC and REST alike.
func TestGpuTelemetryAnswers(t *testing.T) {
	s := newStack(t, false)
	ctx := context.Background()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	start := now.Truncate(time.Hour).Add(-4 * time.Hour)
	end := start.Add(3 * time.Hour)
	msgs, samples := telemetryFleet(start)
	var batch chstore.GPUBatch
	for _, m := range msgs {
		batch.Append(m, time.Now())
	}
	if err := s.store.InsertGPUSamples(ctx, &batch); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s.store)

	cost := meterv1.NewCostServiceClient(s.gconn)
	fin := withKey(testKeys["finance"])
	opts := []cmp.Option{protocmp.Transform(), cmp.Comparer(approxEqual)}
	for _, q := range []struct {
		step    string
		groupBy []string
	}{
		{"total", nil},
		{"total", []string{"deployment"}},
		{"hour", []string{"deployment", "gpu_type"}},
		{"hour", []string{"gpu_type", "mig_profile"}},
		{"total", []string{"gpu"}},
		{"hour", []string{"deployment", "node", "gpu"}},
	} {
		name := q.step + "/" + strings.Join(q.groupBy, ",")
		req := &meterv1.GetGpuUsageRequest{Start: timestamppb.New(start), End: timestamppb.New(end), Step: q.step, GroupBy: q.groupBy}
		viaGRPC, err := cost.GetGpuUsage(fin, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "step": {q.step}}
		for _, g := range q.groupBy {
			v.Add("group_by", g)
		}
		code, body := s.rest(t, "GET", "/v1/gpu-usage?"+v.Encode(), testKeys["finance"], nil)
		var viaREST meterv1.GetGpuUsageResponse
		if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
			t.Fatalf("%s: REST %d %s", name, code, body)
		}
		if diff := cmp.Diff(viaGRPC, &viaREST, protocmp.Transform()); diff != "" {
			t.Errorf("%s: gRPC and REST differ (-grpc +rest):\n%s", name, diff)
		}

		// The brute force of every series' points and summary.
		key := func(s telemetrySample) string {
			var parts []string
			for _, g := range q.groupBy {
				parts = append(parts, map[string]string{"deployment": s.dep, "gpu_type": s.gpuType, "node": s.node, "gpu": s.gpu,
					"mig_profile": map[bool]string{true: "1g.10gb", false: ""}[s.frac > 0]}[g])
			}
			return strings.Join(parts, "|")
		}
		groups := map[string]bool{}
		for _, smp := range samples {
			groups[key(smp)] = true
		}
		if len(viaGRPC.GetSeries()) != len(groups) {
			t.Errorf("%s: %d series, want %d", name, len(viaGRPC.GetSeries()), len(groups))
		}
		for _, series := range viaGRPC.GetSeries() {
			var parts []string
			for _, g := range q.groupBy {
				parts = append(parts, series.GetGroup()[g])
			}
			k := strings.Join(parts, "|")
			var of []telemetrySample
			for _, smp := range samples {
				if key(smp) == k {
					of = append(of, smp)
				}
			}
			if diff := cmp.Diff(bruteTelemetry(samples, of), series.GetSummary().GetTelemetry(), opts...); diff != "" {
				t.Errorf("%s %v: summary telemetry differs from the brute force (-want +got):\n%s", name, series.GetGroup(), diff)
			}
			for _, p := range series.GetPoints() {
				if q.step != "hour" {
					continue
				}
				var inHour []telemetrySample
				for _, smp := range of {
					if smp.hour.Equal(p.GetStart().AsTime()) {
						inHour = append(inHour, smp)
					}
				}
				if diff := cmp.Diff(bruteTelemetry(samples, inHour), p.GetTelemetry(), opts...); diff != "" {
					t.Errorf("%s %v at %s: telemetry differs from the brute force (-want +got):\n%s", name, series.GetGroup(), p.GetStart().AsTime(), diff)
				}
			}
		}
	}

	// The capacity report per deployment: each unit's telemetry and its
	// hours'.
	reports := meterv1.NewReportServiceClient(s.gconn)
	req := &meterv1.GetCapacityReportRequest{Start: timestamppb.New(start), End: timestamppb.New(end)}
	viaGRPC, err := reports.GetCapacityReport(fin, req)
	if err != nil {
		t.Fatal(err)
	}
	code, body := s.rest(t, "GET", "/v1/reports/capacity?"+url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}}.Encode(), testKeys["finance"], nil)
	var viaREST meterv1.GetCapacityReportResponse
	if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
		t.Fatalf("REST capacity report: %d %s", code, body)
	}
	if diff := cmp.Diff(viaGRPC, &viaREST, protocmp.Transform()); diff != "" {
		t.Errorf("capacity report: gRPC and REST differ (-grpc +rest):\n%s", diff)
	}
	units := viaGRPC.GetReport().GetUnits()
	if len(units) != 3 {
		t.Fatalf("%d units, want d-a, d-b and d-c", len(units))
	}
	for _, u := range append(units, viaGRPC.GetReport().GetFleet()) {
		var of []telemetrySample
		for _, smp := range samples {
			if smp.dep == u.GetName() || u.GetName() == "fleet" {
				of = append(of, smp)
			}
		}
		if diff := cmp.Diff(bruteTelemetry(samples, of), u.GetGpuTelemetry(), opts...); diff != "" {
			t.Errorf("unit %s: telemetry differs from the brute force (-want +got):\n%s", u.GetName(), diff)
		}
		if len(u.GetHoursDetail()) != 3 {
			t.Errorf("unit %s: %d hours, want 3", u.GetName(), len(u.GetHoursDetail()))
		}
		for _, h := range u.GetHoursDetail() {
			var inHour []telemetrySample
			for _, smp := range of {
				if smp.hour.Equal(h.GetStart().AsTime()) {
					inHour = append(inHour, smp)
				}
			}
			if diff := cmp.Diff(bruteTelemetry(samples, inHour), h.GetGpuTelemetry(), opts...); diff != "" {
				t.Errorf("unit %s at %s: telemetry differs from the brute force (-want +got):\n%s", u.GetName(), h.GetStart().AsTime(), diff)
			}
		}
	}
	// With one unit named, the other deployments are summed into others:
	// its telemetry is theirs.
	folded, err := reports.GetCapacityReport(fin, &meterv1.GetCapacityReportRequest{Start: req.GetStart(), End: req.GetEnd(), MaxUnits: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(folded.GetReport().GetUnits()) != 1 || folded.GetReport().GetOthers() == nil {
		t.Fatalf("max_units 1: %d units, others %v", len(folded.GetReport().GetUnits()), folded.GetReport().GetOthers())
	}
	var others []telemetrySample
	for _, smp := range samples {
		if smp.dep != folded.GetReport().GetUnits()[0].GetName() {
			others = append(others, smp)
		}
	}
	if diff := cmp.Diff(bruteTelemetry(samples, others), folded.GetReport().GetOthers().GetGpuTelemetry(), opts...); diff != "" {
		t.Errorf("others: telemetry differs from the brute force (-want +got):\n%s", diff)
	}
	for _, h := range folded.GetReport().GetOthers().GetHoursDetail() {
		var inHour []telemetrySample
		for _, smp := range others {
			if smp.hour.Equal(h.GetStart().AsTime()) {
				inHour = append(inHour, smp)
			}
		}
		if diff := cmp.Diff(bruteTelemetry(samples, inHour), h.GetGpuTelemetry(), opts...); diff != "" {
			t.Errorf("others at %s: telemetry differs from the brute force (-want +got):\n%s", h.GetStart().AsTime(), diff)
		}
	}

	// Something was throttled, hot, near full, and SM activity was read:
	// the figures above are not zeros compared with zeros.
	fleet := viaGRPC.GetReport().GetFleet().GetGpuTelemetry()
	if fleet.GetClockThrottleSeconds() == 0 || fleet.GetTemperatureMaxC() < 83 || fleet.GetMemoryUsedMaxRatio() < 0.95 || fleet.GetSmActiveHours() == 0 {
		t.Errorf("fleet telemetry %v: want throttling, a hot GPU, memory above 95%% and SM activity", fleet)
	}
}
