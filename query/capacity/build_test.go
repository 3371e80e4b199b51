package capacity

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"tokenmeter/query"
)

// fleet is a generated data set: GPU usage rows per (deployment, GPU type,
// hour) and rollup rows per (model, deployment, hour), as the query service
// returns them for the report's two reads.
type fleet struct {
	gpu []query.GPUUsageRow
	use []query.RollupRow
	// engine rows per (deployment, hour).
	engine []query.EngineRow
	// asked records the queries, to check what the report reads.
	gpuQ []query.GPUUsageQuery
	useQ [][2]time.Time
}

func (f *fleet) GPUUsage(_ context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error) {
	f.gpuQ = append(f.gpuQ, q)
	var out []query.GPUUsageRow
	for _, r := range f.gpu {
		if !r.Start.Before(q.Start) && r.Start.Before(q.End) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fleet) DeploymentHours(_ context.Context, start, end time.Time) ([]query.RollupRow, error) {
	f.useQ = append(f.useQ, [2]time.Time{start, end})
	var out []query.RollupRow
	for _, r := range f.use {
		if !r.Start.Before(start) && r.Start.Before(end) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fleet) EngineStats(_ context.Context, q query.EngineQuery) ([]query.EngineRow, error) {
	if q.Step != "hour" || !slices.Equal(q.GroupBy, []string{"deployment"}) {
		return nil, fmt.Errorf("engine query %+v: want hour steps by deployment", q)
	}
	var out []query.EngineRow
	for _, r := range f.engine {
		if !r.Start.Before(q.Start) && r.Start.Before(q.End) {
			out = append(out, r)
		}
	}
	return out, nil
}

// engineHour adds an hour of engine samples of a deployment: replicas
// replicas each sampled once with queue depth waiting and KV-cache usage kv.
func (f *fleet) engineHour(dep string, at time.Time, replicas uint64, waiting uint32, kv float64) {
	r := query.EngineRow{Start: at, Group: map[string]string{"deployment": dep}, Replicas: replicas}
	r.Samples, r.SampledSeconds = replicas, 10*float64(replicas)
	r.WaitingWeighted, r.WaitingSeconds, r.WaitingMax = 10*float64(replicas*uint64(waiting)), 10*float64(replicas), waiting
	r.WaitingValues, r.WaitingCounts = []uint32{waiting}, []uint64{replicas}
	r.KVWeighted, r.KVSeconds, r.KVMax, r.KVSamples = 10*float64(replicas)*kv, 10*float64(replicas), kv, replicas
	f.engine = append(f.engine, r)
}

// gpuHour adds an hour of gpus GPUs of a deployment at utilization util
// costing nanosPerGPUHour each.
func (f *fleet) gpuHour(dep, gpuType string, at time.Time, gpus uint32, util float64, nanosPerGPUHour int64) {
	sec := float64(gpus) * 3600
	cost := int64(gpus) * nanosPerGPUHour
	busy := int64(math.Round(float64(cost) * util))
	f.gpu = append(f.gpu, query.GPUUsageRow{Start: at, Group: map[string]string{"deployment": dep, "gpu_type": gpuType},
		GPUSeconds: sec, BusySeconds: sec * util, CoveredSeconds: sec, InstanceSeconds: sec, MaxGPUs: gpus,
		CostNanos: cost, BusyCostNanos: busy, IdleCostNanos: cost - busy})
}

// traffic adds an hour of requests of a model on a deployment.
func (f *fleet) traffic(model, dep string, at time.Time, requests, good, in, out uint64) {
	f.use = append(f.use, query.RollupRow{Start: at, Group: map[string]string{"model": model, "deployment": dep},
		Requests: requests, GoodRequests: good, PromptTokens: in, OutputTokens: out})
}

var day0 = time.Date(2026, 9, 6, 0, 0, 0, 0, time.UTC) // a Sunday

func unit(t *testing.T, r *Report, name string) *Unit {
	t.Helper()
	for i := range r.Units {
		if r.Units[i].Name == name {
			return &r.Units[i]
		}
	}
	t.Fatalf("no unit %q in %d units", name, len(r.Units))
	return nil
}

func hasFinding(r *Report, unit, kind string, severity int) bool {
	return slices.ContainsFunc(r.Findings, func(f Finding) bool {
		return f.Unit == unit && f.Kind == kind && f.Severity == severity
	})
}

// TestSaturatingDeployment: a deployment of 8 GPUs whose attainment falls
// above a known per-GPU load. The sustainable throughput must be the
// highest hourly load at or below the knee, the headroom and GPUs needed
// follow exactly, and the drop at high load is a finding.
func TestSaturatingDeployment(t *testing.T) {
	const (
		gpus  = 8
		knee  = 1200.0 // tokens/s per GPU
		hours = 30 * 24
	)
	f := &fleet{}
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint64, hours)
	for i := range hours {
		at := day0.Add(time.Duration(i) * time.Hour)
		tokens[i] = uint64(200*gpus*3600) + rng.Uint64N(1800*gpus*3600) // 200..2000 tokens/s per GPU
		good := uint64(995)
		if float64(tokens[i])/(gpus*3600) > knee {
			good = 900
		}
		f.gpuHour("sat", "H100", at, gpus, 0.7, 4_000_000_000)
		f.traffic("llama", "sat", at, 1000, good, tokens[i]/4, tokens[i]-tokens[i]/4)
		f.engineHour("sat", at, 2, uint32(i), float64(i%100)/100)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(hours * time.Hour), Growth: "1.3", Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	// What the report reads: hourly GPU usage by deployment and GPU type,
	// hourly counters by model and deployment.
	if len(f.gpuQ) != 1 || f.gpuQ[0].Step != "hour" || !f.gpuQ[0].NoTokens || !slices.Equal(f.gpuQ[0].GroupBy, []string{"deployment", "gpu_type"}) {
		t.Errorf("GPU usage queries %+v", f.gpuQ)
	}
	if len(f.useQ) != 1 || !f.useQ[0][0].Equal(day0) || !f.useQ[0][1].Equal(day0.Add(hours*time.Hour)) {
		t.Errorf("deployment hour reads %+v", f.useQ)
	}
	u := unit(t, r, "sat")

	// Brute force: the highest load at or below the knee, and the hours
	// at or below it.
	var bestTokens, peakTokens uint64
	var peakHour, bestHour int
	supporting := 0
	for i, tok := range tokens {
		load := float64(tok) / (gpus * 3600)
		if load <= knee {
			supporting++
			if tok > bestTokens {
				bestTokens, bestHour = tok, i
			}
		}
		if tok > peakTokens {
			peakTokens, peakHour = tok, i
		}
	}
	s := u.Sustainable
	if !s.Known || s.LowerBound || s.MissedHours != 0 || s.QualifyingHours != hours {
		t.Fatalf("sustainable %+v; want known, not a lower bound, no misses, %d qualifying hours", s, hours)
	}
	if want := float64(bestTokens) / (gpus * 3600); s.TokensPerSecondPerGPU != want || !s.Hour.Equal(day0.Add(time.Duration(bestHour)*time.Hour)) {
		t.Errorf("sustainable %v at %v, want %v at hour %d", s.TokensPerSecondPerGPU, s.Hour, want, bestHour)
	}
	if s.SupportingHours != supporting {
		t.Errorf("supporting hours %d, want %d", s.SupportingHours, supporting)
	}
	if u.Peak == nil || !u.Peak.Start.Equal(day0.Add(time.Duration(peakHour)*time.Hour)) {
		t.Fatalf("peak %+v, want hour %d", u.Peak, peakHour)
	}
	// The saturation at the peak is that hour's engine rows: queue depth
	// peakHour on both replicas.
	if sat := u.Peak.Saturation; sat == nil || sat.WaitingP95 != uint32(peakHour) || sat.WaitingMean != float64(peakHour) ||
		sat.Replicas != 2 || math.Abs(sat.KVMax-float64(peakHour%100)/100) > 1e-12 {
		t.Errorf("saturation at the peak %+v, want queue depth %d on 2 replicas", sat, peakHour)
	}
	wantHeadroom := 1 - (float64(peakTokens)/(gpus*3600))/(float64(bestTokens)/(gpus*3600))
	if !u.HeadroomKnown || math.Abs(u.Headroom-wantHeadroom) > 1e-12 || u.Headroom >= 0 {
		t.Errorf("headroom %v (known %v), want %v (negative: the peak is past the knee)", u.Headroom, u.HeadroomKnown, wantHeadroom)
	}
	// GPUs needed, in integers: ceil(peak/3600 ÷ (best/(8·3600))) =
	// ceil(8·peak / best); with growth 1.3: ceil(13·8·peak / (10·best)).
	ceilDiv := func(a, b uint64) int64 { return int64((a + b - 1) / b) }
	if len(u.Needed) != 3 || !strings.HasPrefix(u.Needed[2].For, "forecast peak") {
		t.Fatalf("needed %+v, want observed peak, growth and forecast", u.Needed)
	}
	if got, want := u.Needed[0].GPUs, ceilDiv(gpus*peakTokens, bestTokens); got != want || u.Needed[0].Change != want-gpus {
		t.Errorf("GPUs for the observed peak %d (change %d), want %d", got, u.Needed[0].Change, want)
	}
	if got, want := u.Needed[1].GPUs, ceilDiv(13*gpus*peakTokens, 10*bestTokens); got != want || u.Needed[1].For != "growth 1.3" {
		t.Errorf("GPUs for growth 1.3: %+v, want %d", u.Needed[1], want)
	}
	if a := u.Needed[1].Arithmetic; !strings.HasPrefix(a, "ceil(1.3 × ") || !strings.HasSuffix(a, " GPUs") {
		t.Errorf("arithmetic %q", a)
	}
	if !hasFinding(r, "sat", KindAtRisk, 2) {
		t.Errorf("findings %+v: want sat at risk", r.Findings)
	}
	if u.Utilization != 0.7 || u.P95Utilization != 0.7 || u.MeanGPUs != gpus || u.MaxGPUs != gpus {
		t.Errorf("utilization %v p95 %v, GPUs mean %v max %d", u.Utilization, u.P95Utilization, u.MeanGPUs, u.MaxGPUs)
	}
	if got, want := u.CostNanos, int64(hours*gpus*4_000_000_000); got != want || u.BusyCostNanos+u.IdleCostNanos != got {
		t.Errorf("cost %d (busy %d + idle %d), want %d", got, u.BusyCostNanos, u.IdleCostNanos, want)
	}
}

// TestExactGPUsNeededAtTheBoundary: a peak exactly 3 times the sustainable
// load needs exactly 3 GPUs' worth (no float rounding up to 4), and 3.0001
// times needs one more.
func TestExactGPUsNeededAtTheBoundary(t *testing.T) {
	for _, c := range []struct {
		growth string
		want   int64
	}{{"1", 3}, {"3", 9}, {"1.000001", 4}, {"0.5", 2}} {
		f := &fleet{}
		for i := range 48 {
			at := day0.Add(time.Duration(i) * time.Hour)
			// One GPU; the sustainable hour serves 1,000 tokens/s, the peak
			// hour 3,000 tokens/s on 3 GPUs (attainment drops above 1,000).
			gpus, tok, good := uint32(1), uint64(1000*3600), uint64(1000)
			if i%2 == 1 {
				tok = 300 * 3600
			}
			if i == 47 {
				gpus, tok, good = 3, 3000*3600*3, 500 // 3,000 tokens/s per GPU: misses
			}
			f.gpuHour("d", "A100", at, gpus, 0.5, 1)
			f.traffic("m", "d", at, 1000, good, 0, tok)
		}
		r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(48 * time.Hour), Growth: c.growth})
		if err != nil {
			t.Fatal(err)
		}
		u := unit(t, r, "d")
		if !u.Sustainable.Known || u.Sustainable.TokensPerSecondPerGPU != 1000 {
			t.Fatalf("growth %s: sustainable %+v, want 1000", c.growth, u.Sustainable)
		}
		// The peak is 9,000 tokens/s: 9 GPUs at growth 1.
		last := u.Needed[len(u.Needed)-1]
		if c.growth == "1" {
			if last.GPUs != 9 {
				t.Errorf("observed peak needs %d GPUs, want 9 (%s)", last.GPUs, last.Arithmetic)
			}
			continue
		}
		if want := map[string]int64{"3": 27, "1.000001": 10, "0.5": 5}[c.growth]; last.GPUs != want {
			t.Errorf("growth %s needs %d GPUs, want %d (%s)", c.growth, last.GPUs, want, last.Arithmetic)
		}
	}
}

// TestExactGPUsNeededForATargetLoad: a target load is the decimal the
// planner wrote, not its nearest float64: 2,400.3 tokens/s at a sustainable
// 800.1 tokens/s per GPU is exactly 3 GPUs (the float64 of 2400.3 is a
// little above it, which rounded up to 4).
func TestExactGPUsNeededForATargetLoad(t *testing.T) {
	f := &fleet{}
	for i := range 30 {
		at := day0.Add(time.Duration(i) * time.Hour)
		// 800.1 tokens/s per GPU on 8 GPUs: 23,042,880 tokens an hour.
		f.gpuHour("d", "H100", at, 8, 0.5, 1)
		f.traffic("m", "d", at, 1000, 1000, 0, 23_042_880)
	}
	for _, c := range []struct {
		tps  float64
		want int64
	}{{2400.3, 3}, {2400.30001, 4}, {800.1, 1}, {1e5, 125}} {
		r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(30 * time.Hour), TargetTokensPerSecond: c.tps})
		if err != nil {
			t.Fatal(err)
		}
		u := unit(t, r, "d")
		if u.Sustainable.TokensPerSecondPerGPU != 800.1 {
			t.Fatalf("sustainable %+v, want 800.1", u.Sustainable)
		}
		last := u.Needed[len(u.Needed)-1]
		if !strings.HasPrefix(last.For, "target") || last.GPUs != c.want {
			t.Errorf("target %v tokens/s: %s needs %d GPUs, want %d (%s)", c.tps, last.For, last.GPUs, c.want, last.Arithmetic)
		}
	}
}

// TestIdleAndUnderusedDeployments: a deployment that serves nothing and
// one at 10% utilization are reported as over-provisioned, with their idle
// cost.
func TestIdleAndUnderusedDeployments(t *testing.T) {
	f := &fleet{}
	for i := range 72 {
		at := day0.Add(time.Duration(i) * time.Hour)
		f.gpuHour("spare", "L4", at, 2, 0, 1_000_000_000)
		f.gpuHour("quiet", "L4", at, 4, 0.1, 1_000_000_000)
		f.traffic("small", "quiet", at, 500, 500, 1000, 1000)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(72 * time.Hour), Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	spare := unit(t, r, "spare")
	if spare.IdleShare != 1 || spare.IdleCostNanos != 72*2*1_000_000_000 || spare.Requests != 0 || spare.Sustainable.Known {
		t.Errorf("spare: idle share %v, idle cost %d, requests %d, sustainable %+v", spare.IdleShare, spare.IdleCostNanos, spare.Requests, spare.Sustainable)
	}
	if !hasFinding(r, "spare", KindOverProvisioned, 2) || !hasFinding(r, "quiet", KindOverProvisioned, 1) {
		t.Errorf("findings %+v: want spare (2) and quiet (1) over-provisioned", r.Findings)
	}
	if r.Findings[0].Severity != 2 {
		t.Errorf("first finding %+v, want the most urgent first", r.Findings[0])
	}
	if !strings.Contains(r.Findings[0].Text, "USD 144.00") {
		t.Errorf("finding %q: want the idle cost USD 144.00", r.Findings[0].Text)
	}
	// The fleet sums both and gets no per-GPU estimate.
	if r.Fleet.GPUHours != 72*6 || r.Fleet.MaxGPUs != 6 || r.Fleet.Sustainable.Known || r.Fleet.Sustainable.Reason == "" {
		t.Errorf("fleet: %v GPU-hours, max %d GPUs, sustainable %+v", r.Fleet.GPUHours, r.Fleet.MaxGPUs, r.Fleet.Sustainable)
	}
}

// TestBusyWithoutTraffic: GPUs busy 70% of the time with no request
// counted (the traffic under another deployment name, or work outside the
// meter) are not "all idle": the finding says what the data shows.
func TestBusyWithoutTraffic(t *testing.T) {
	f := &fleet{}
	for i := range 24 {
		f.gpuHour("ghost", "L4", day0.Add(time.Duration(i)*time.Hour), 2, 0.7, 1_000_000_000)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(24 * time.Hour), Currency: "USD"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Findings) == 0 {
		t.Fatal("no finding")
	}
	text := r.Findings[0].Text
	if strings.Contains(text, "were idle") || !strings.Contains(text, "70.0%") || !strings.Contains(text, "USD 14.40") {
		t.Errorf("finding %q: want the busy share 70.0%% and the idle cost USD 14.40, not all hours idle", text)
	}
}

// TestWeeklyGrowth: five weeks whose traffic grows by exactly 25% a week
// over a weekday × hour pattern. Growth, the forecast and the load profile
// are checked against brute-force computations.
func TestWeeklyGrowth(t *testing.T) {
	const weeks = 5
	pattern := func(at time.Time) uint64 { // per hour, a multiple of 4^5
		return uint64(1024 * (10 + 5*int(at.Weekday()) + at.Hour()))
	}
	f := &fleet{}
	var tokens []uint64
	for i := range weeks * 168 {
		at := day0.Add(time.Duration(i) * time.Hour)
		tok := pattern(at)
		for range i / 168 {
			tok = tok / 4 * 5
		}
		tokens = append(tokens, tok)
		f.gpuHour("g", "H100", at, 1, 0.5, 1)
		f.traffic("m", "g", at, 200, 200, tok/2, tok-tok/2)
	}
	end := day0.Add(weeks*168*time.Hour + 50*time.Hour) // and a partial week, not in the trend
	r, err := Build(context.Background(), f, Query{Start: day0, End: end, HorizonWeeks: 13})
	if err != nil {
		t.Fatal(err)
	}
	tr := unit(t, r, "g").Trend
	if !tr.GrowthKnown || len(tr.Weeks) != weeks {
		t.Fatalf("trend %+v", tr)
	}
	if math.Abs(tr.TokensGrowth-0.25) > 1e-12 || math.Abs(tr.PeakGrowth-0.25) > 1e-12 {
		t.Errorf("growth tokens %v peak %v, want 0.25", tr.TokensGrowth, tr.PeakGrowth)
	}
	// Brute force: weekly peaks and their least-squares line.
	peaks := make([]float64, weeks)
	for i, tok := range tokens {
		peaks[i/168] = max(peaks[i/168], float64(tok)/3600)
	}
	var sx, sy, sxy, sxx float64
	for w, p := range peaks {
		x := float64(w)
		sx, sy, sxy, sxx = sx+x, sy+p, sxy+x*p, sxx+x*x
	}
	slope := (weeks*sxy - sx*sy) / (weeks*sxx - sx*sx)
	intercept := (sy - slope*sx) / weeks
	want := intercept + slope*float64(weeks-1+13)
	fc := tr.Forecast
	if fc == nil || math.Abs(fc.TokensPerSecond-want) > 1e-9*want || fc.Weeks != weeks || !(fc.R2 > 0.9 && fc.R2 < 1) {
		t.Fatalf("forecast %+v, want %v from %d weeks with 0.9 < R² < 1", fc, want, weeks)
	}
	if !fc.At.Equal(day0.Add((weeks - 1 + 13) * week)) {
		t.Errorf("forecast at %v", fc.At)
	}
	// The profile: mean tokens/s per weekday and hour over the range.
	var sum [7][24]float64
	var n [7][24]int
	for i := range int(end.Sub(day0) / time.Hour) {
		at := day0.Add(time.Duration(i) * time.Hour)
		if i < len(tokens) {
			sum[at.Weekday()][at.Hour()] += float64(tokens[i]) / 3600
		}
		n[at.Weekday()][at.Hour()]++
	}
	u := unit(t, r, "g")
	for d := range 7 {
		for h := range 24 {
			if u.ProfileHours[d][h] != n[d][h] || math.Abs(u.Profile[d][h]-sum[d][h]/float64(n[d][h])) > 1e-9 {
				t.Fatalf("profile[%d][%d] = %v over %d hours, want %v over %d", d, h, u.Profile[d][h], u.ProfileHours[d][h], sum[d][h]/float64(n[d][h]), n[d][h])
			}
		}
	}
	if len(u.Days) != weeks*7+3 || u.Days[0].Tokens != sumDay(tokens, 0) {
		t.Errorf("%d days, first %d tokens", len(u.Days), u.Days[0].Tokens)
	}
}

func sumDay(tokens []uint64, day int) uint64 {
	var s uint64
	for _, t := range tokens[day*24 : (day+1)*24] {
		s += t
	}
	return s
}

// TestNotEnoughData: short ranges and empty data say so instead of
// inventing figures.
func TestNotEnoughData(t *testing.T) {
	f := &fleet{}
	for i := range 10 {
		at := day0.Add(time.Duration(i) * time.Hour)
		f.gpuHour("d", "H100", at, 1, 0.5, 1)
		f.traffic("m", "d", at, 1000, 1000, 10, 10)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	u := unit(t, r, "d")
	if u.Sustainable.Known || !strings.Contains(u.Sustainable.Reason, "not enough data: 10 qualifying hours") {
		t.Errorf("sustainable %+v", u.Sustainable)
	}
	if u.HeadroomKnown || len(u.Needed) != 0 || u.Trend.GrowthKnown || u.Trend.Forecast != nil ||
		!strings.Contains(u.Trend.Reason, "0 complete week(s)") {
		t.Errorf("headroom %v known %v, needed %+v, trend %+v", u.Headroom, u.HeadroomKnown, u.Needed, u.Trend)
	}
	if !hasFinding(r, "d", KindNotEnoughData, 0) {
		t.Errorf("findings %+v", r.Findings)
	}

	r, err = Build(context.Background(), f, Query{Start: day0.Add(-48 * time.Hour), End: day0})
	if err != nil {
		t.Fatal(err)
	}
	if r.NotEnoughData == "" || len(r.Units) != 0 || len(r.Findings) != 0 || r.Fleet.GPUHours != 0 {
		t.Errorf("empty range: %+v", r)
	}
	if _, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(24 * time.Hour), Deployment: "nope"}); !errors.Is(err, ErrNotFound) ||
		!strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown deployment: %v", err)
	}
}

func TestInvalidQueries(t *testing.T) {
	ok := Query{Start: day0, End: day0.Add(time.Hour)}
	for name, c := range map[string]struct {
		q    func(Query) Query
		want string
	}{
		"empty range":   {func(q Query) Query { q.End = q.Start; return q }, "the range is empty"},
		"reversed":      {func(q Query) Query { q.Start, q.End = q.End, q.Start; return q }, "the range is empty"},
		"no range":      {func(q Query) Query { return Query{} }, "start and end are required"},
		"minutes":       {func(q Query) Query { q.End = q.End.Add(time.Minute); return q }, "whole hours"},
		"too long":      {func(q Query) Query { q.End = q.Start.Add(MaxRange + time.Hour); return q }, "longer than 400 days"},
		"growth 0":      {func(q Query) Query { q.Growth = "0"; return q }, `growth "0"`},
		"growth -1":     {func(q Query) Query { q.Growth = "-1"; return q }, `growth "-1"`},
		"growth word":   {func(q Query) Query { q.Growth = "lots"; return q }, `growth "lots"`},
		"growth frac":   {func(q Query) Query { q.Growth = "1/3"; return q }, `growth "1/3"`},
		"growth NaN":    {func(q Query) Query { q.Growth = "NaN"; return q }, `growth "NaN"`},
		"target":        {func(q Query) Query { q.Target = 1.5; return q }, "target 1.5"},
		"target NaN":    {func(q Query) Query { q.Target = math.NaN(); return q }, "target NaN"},
		"tps":           {func(q Query) Query { q.TargetTokensPerSecond = -1; return q }, "target tokens per second"},
		"horizon":       {func(q Query) Query { q.HorizonWeeks = 500; return q }, "horizon of 500 weeks"},
		"group":         {func(q Query) Query { q.GroupBy = "tenant_id"; return q }, `group_by "tenant_id"`},
		"tolerance":     {func(q Query) Query { q.MissTolerance = ptr(0.7); return q }, "miss tolerance"},
		"low util":      {func(q Query) Query { q.LowUtilization = 2; return q }, "low utilization"},
		"headroom risk": {func(q Query) Query { q.HeadroomRisk = -0.1; return q }, "headroom risk"},
		"max units 0":   {func(q Query) Query { q.MaxUnits = -1; return q }, "max_units -1: want 1 to 100"},
		"max units":     {func(q Query) Query { q.MaxUnits = 101; return q }, "max_units 101: want 1 to 100"},
		"unit-hours": {func(q Query) Query { q.End = q.Start.Add(MaxRange); q.MaxUnits = 30; return q },
			"32 units (with the fleet and others) × 9600 hours is more than 250000 unit-hours; ask for at most 24 units"},
	} {
		_, err := Build(context.Background(), &fleet{}, c.q(ok))
		if !errors.Is(err, query.ErrInvalidQuery) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an invalid query naming %q", name, err, c.want)
		}
	}
}

// TestGroupByModelAndGPUType: two deployments of one model form one unit;
// per-hour figures add up before the per-GPU load is computed.
func TestGroupByModelAndGPUType(t *testing.T) {
	f := &fleet{}
	for i := range 30 {
		at := day0.Add(time.Duration(i) * time.Hour)
		f.gpuHour("a", "H100", at, 2, 0.5, 10)
		f.gpuHour("b", "H100", at, 6, 0.9, 10)
		f.gpuHour("c", "L4", at, 1, 0.2, 1)
		f.traffic("big", "a", at, 100, 100, 0, 2*3600*100)
		f.traffic("big", "b", at, 100, 100, 0, 6*3600*300)
		f.traffic("small", "c", at, 100, 100, 0, 3600*50)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(30 * time.Hour), GroupBy: ByModel})
	if err != nil {
		t.Fatal(err)
	}
	big := unit(t, r, "big")
	if !slices.Equal(big.Deployments, []string{"a", "b"}) || big.MaxGPUs != 8 || big.TokensPerSecondPerGPU != 250 {
		t.Errorf("big: deployments %v, max GPUs %d, %v tokens/s per GPU; want a, b, 8, 250", big.Deployments, big.MaxGPUs, big.TokensPerSecondPerGPU)
	}
	if math.Abs(big.Utilization-0.8) > 1e-12 {
		t.Errorf("big: utilization %v, want (2·0.5 + 6·0.9)/8 = 0.8", big.Utilization)
	}
	r, err = Build(context.Background(), f, Query{Start: day0, End: day0.Add(30 * time.Hour), GroupBy: ByGPUType})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Units) != 2 || r.Units[0].Name != "H100" || r.Units[1].Name != "L4" || !slices.Equal(r.Units[1].Models, []string{"small"}) {
		t.Errorf("units by GPU type: %+v", r.Units)
	}
}

// TestSustainableIgnoresIsolatedIncidents: one bad hour at a low load does
// not pull the estimate down (miss tolerance), and hours with too few
// requests do not count.
func TestSustainableIgnoresIsolatedIncidents(t *testing.T) {
	f := &fleet{}
	for i := range 100 {
		at := day0.Add(time.Duration(i) * time.Hour)
		tok := uint64((100 + i) * 3600) // load 100..199 tokens/s per GPU, rising
		good := uint64(1000)
		switch {
		case i == 3:
			good = 10 // an incident at a low load
		case i >= 80:
			good = 900 // saturated from load 180
		}
		requests := uint64(1000)
		if i == 79 {
			requests, good = 5, 5 // too few requests to count
		}
		f.gpuHour("d", "H100", at, 1, 0.5, 1)
		f.traffic("m", "d", at, requests, good, 0, tok)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(100 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	s := unit(t, r, "d").Sustainable
	if !s.Known || s.TokensPerSecondPerGPU != 178 || s.MissedHours != 1 || s.SupportingHours != 79 || s.QualifyingHours != 99 {
		t.Errorf("sustainable %+v; want 178 tokens/s per GPU, 1 missed of 79 supporting, 99 qualifying", s)
	}
	// With no tolerance, the incident at load 103 ends the estimate below it.
	r, err = Build(context.Background(), f, Query{Start: day0, End: day0.Add(100 * time.Hour), MissTolerance: ptr(0.0)})
	if err != nil {
		t.Fatal(err)
	}
	if s := unit(t, r, "d").Sustainable; s.TokensPerSecondPerGPU != 102 || s.SupportingHours != 3 || s.MissedHours != 0 {
		t.Errorf("no tolerance: %+v, want 102 tokens/s per GPU from 3 hours", s)
	}
}

func ptr[T any](v T) *T { return &v }

// TestMissesAtLowLoadAreNotSaturation: two incident hours at the lowest
// loads of 30 leave no load within the 5% tolerance, but the busiest hours
// met the target: no estimate, and the finding asks to look at the missed
// hours instead of calling the deployment saturated. When the busiest hour
// misses too, it is saturated.
func TestMissesAtLowLoadAreNotSaturation(t *testing.T) {
	build := func(missTop bool) *Report {
		f := &fleet{}
		for i := range 30 {
			at := day0.Add(time.Duration(i) * time.Hour)
			good := uint64(1000)
			if i < 2 || (missTop && i >= 20) {
				good = 900
			}
			f.gpuHour("d", "H100", at, 1, 0.5, 1)
			f.traffic("m", "d", at, 1000, good, 0, uint64((100+i)*3600))
		}
		r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(30 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := build(false)
	s := unit(t, r, "d").Sustainable
	if s.Known || s.Saturated || !strings.Contains(s.Reason, "2 of 30 qualifying hours") || !strings.Contains(s.Reason, "busiest hours met it") {
		t.Errorf("incidents at low load: %+v", s)
	}
	if hasFinding(r, "d", KindSaturated, 2) || !hasFinding(r, "d", KindNotEnoughData, 1) {
		t.Errorf("incidents at low load: findings %+v", r.Findings)
	}
	r = build(true)
	if s := unit(t, r, "d").Sustainable; s.Known || !s.Saturated {
		t.Errorf("misses up to the busiest hour: %+v, want saturated", s)
	}
	if !hasFinding(r, "d", KindSaturated, 2) {
		t.Errorf("misses up to the busiest hour: findings %+v", r.Findings)
	}
}

// TestMIGSlicesCompareAsGPUs: seven MIG slices of a seventh of a GPU are
// one GPU's worth; GPUs needed compares with that, not with seven.
func TestMIGSlicesCompareAsGPUs(t *testing.T) {
	f := &fleet{}
	for i := range 48 {
		at := day0.Add(time.Duration(i) * time.Hour)
		good, tok := uint64(1000), uint64(1000*3600) // 1,000 tokens/s on one GPU's worth
		if i == 47 {
			good, tok = 500, 1500*3600 // the peak misses: 1,500 tokens/s
		}
		sec := 3600.0
		f.gpu = append(f.gpu, query.GPUUsageRow{Start: at, Group: map[string]string{"deployment": "mig", "gpu_type": "A100-1g.10gb"},
			GPUSeconds: sec, BusySeconds: sec / 2, CoveredSeconds: sec, InstanceSeconds: sec, MaxGPUs: 7})
		f.traffic("m", "mig", at, 1000, good, 0, tok)
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(48 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	u := unit(t, r, "mig")
	if u.MaxGPUs != 7 || u.MaxGPUEquivalents != 1 {
		t.Fatalf("max %d instances, %v GPU equivalents; want 7 and 1", u.MaxGPUs, u.MaxGPUEquivalents)
	}
	if n := u.Needed[0]; n.GPUs != 2 || n.Change != 1 {
		t.Errorf("observed peak needs %+v; want 2 GPUs, one more than the one GPU's worth it ran", n)
	}
	if hasFinding(r, "mig", KindOverProvisioned, 1) {
		t.Errorf("findings %+v: a deployment short of capacity is not over-provisioned", r.Findings)
	}
}

// TestTargetLabelKeepsItsDigits: a small target load is named as given,
// not rounded to "0.0 tokens/s".
func TestTargetLabelKeepsItsDigits(t *testing.T) {
	f := &fleet{}
	for i := range 30 {
		at := day0.Add(time.Duration(i) * time.Hour)
		f.gpuHour("d", "H100", at, 1, 0.5, 1)
		f.traffic("m", "d", at, 1000, 1000, 0, uint64((100+i)*3600))
	}
	for tps, want := range map[float64]string{0.04: "target 0.04 tokens/s", 5000: "target 5,000 tokens/s", 1234.5: "target 1,234.5 tokens/s"} {
		r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(30 * time.Hour), TargetTokensPerSecond: tps})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(unit(t, r, "d").Needed, func(n GPUsNeeded) bool { return n.For == want }) {
			t.Errorf("target %v: needed %+v, want an entry for %q", tps, unit(t, r, "d").Needed, want)
		}
	}
}

// TestUnitsBeyondTheLimitAreOthers: a fleet of 2,500 deployments reports
// the MaxUnits largest by GPU time (then tokens) one by one and sums the
// rest into one unit, exactly: its counts, tokens, cost and GPU counts are
// the sums of the folded deployments', and the fleet is the listed units
// and the others together. Member lists stay bounded, with their counts.
func TestUnitsBeyondTheLimitAreOthers(t *testing.T) {
	const n, hours = 2500, 3
	f := &fleet{}
	type sums struct {
		requests, good, in, out uint64
		cost, busy, idle        int64
		maxGPUs                 uint32
	}
	var folded sums
	for i := range n {
		dep := fmt.Sprintf("dep-%04d", i)
		gpus := uint32(1 + i%7)
		for h := range hours {
			at := day0.Add(time.Duration(h) * time.Hour)
			if i%5 != 0 { // every fifth deployment has traffic only
				f.gpuHour(dep, []string{"H100", "A100"}[i%2], at, gpus, 0.25+float64(i%3)/10, 1_000_000_007+int64(i))
			}
			f.traffic(fmt.Sprintf("model-%03d", i%150), dep, at, uint64(100+i), uint64(90+i), uint64(1000*i+h), uint64(7*i+1))
			f.engineHour(dep, at, 1, uint32(i%4), 0.5)
		}
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(hours * time.Hour), MaxUnits: 12})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Units) != 12 || r.UnitsInOthers != n-12 || r.Others == nil || r.Others.Name != OthersName || r.MaxUnits != 12 {
		t.Fatalf("%d units, %d in others (%v), max %d; want 12, %d", len(r.Units), r.UnitsInOthers, r.Others != nil, r.MaxUnits, n-12)
	}
	// The largest by GPU time: 7 GPUs (i%7 == 6), not every fifth
	// (no GPUs), the most tokens first among equals.
	listed := map[string]bool{}
	for i, u := range r.Units {
		listed[u.Name] = true
		if i > 0 && u.Name <= r.Units[i-1].Name {
			t.Errorf("units not in name order: %q after %q", u.Name, r.Units[i-1].Name)
		}
		if u.MaxGPUs != 7 {
			t.Errorf("listed unit %s has %d GPUs, want one of the largest (7)", u.Name, u.MaxGPUs)
		}
	}
	for _, want := range []string{"dep-2498", "dep-2491", "dep-2484"} { // i%7 == 6, i%5 != 0, the most tokens
		if !listed[want] {
			t.Errorf("%s is not listed; listed %v", want, listed)
		}
	}
	for _, row := range f.gpu {
		if !listed[row.Group["deployment"]] {
			folded.cost += row.CostNanos
			folded.busy += row.BusyCostNanos
			folded.idle += row.IdleCostNanos
			if row.Start.Equal(day0) {
				folded.maxGPUs += row.MaxGPUs
			}
		}
	}
	for _, row := range f.use {
		if !listed[row.Group["deployment"]] {
			folded.requests += row.Requests
			folded.good += row.GoodRequests
			folded.in += row.PromptTokens
			folded.out += row.OutputTokens
		}
	}
	o := r.Others
	got := sums{o.Requests, o.GoodRequests, o.InputTokens, o.OutputTokens, o.CostNanos, o.BusyCostNanos, o.IdleCostNanos, o.MaxGPUs}
	if got != folded {
		t.Errorf("others sums %+v, want the folded deployments' %+v", got, folded)
	}
	var listedReq uint64
	var listedCost int64
	for _, u := range r.Units {
		listedReq += u.Requests
		listedCost += u.CostNanos
	}
	if r.Fleet.Requests != listedReq+o.Requests || r.Fleet.CostNanos != listedCost+o.CostNanos {
		t.Errorf("fleet %d requests, %d nanos; listed + others %d, %d", r.Fleet.Requests, r.Fleet.CostNanos, listedReq+o.Requests, listedCost+o.CostNanos)
	}
	if o.DeploymentCount != n-12 || len(o.Deployments) != MaxMembers || o.Deployments[0] != "dep-0000" ||
		o.ModelCount != 150 || len(o.Models) != MaxMembers || o.GPUTypeCount != 2 || !slices.Equal(o.GPUTypes, []string{"A100", "H100"}) {
		t.Errorf("others members: %d deployments (%d listed, first %q), %d models (%d listed), GPU types %d %v",
			o.DeploymentCount, len(o.Deployments), o.Deployments[0], o.ModelCount, len(o.Models), o.GPUTypeCount, o.GPUTypes)
	}
	if r.Fleet.DeploymentCount != n || len(r.Fleet.Deployments) != MaxMembers {
		t.Errorf("fleet: %d deployments, %d listed", r.Fleet.DeploymentCount, len(r.Fleet.Deployments))
	}
	if o.Sustainable.Known || len(o.Needed) > 0 || !strings.Contains(o.Sustainable.Reason, "sums 2488 deployments") {
		t.Errorf("others has a capacity estimate or no reason: %+v", o.Sustainable)
	}
	if o.Peak == nil || o.Peak.Saturation == nil || o.Peak.Saturation.Replicas != n-12 {
		t.Errorf("others' peak saturation: %+v, want the engine rows of its %d deployments", o.Peak, n-12)
	}
	for _, fd := range r.Findings {
		if !listed[fd.Unit] {
			t.Errorf("finding about %q, which is not a listed unit", fd.Unit)
		}
	}

	// By model: 150 models, 20 listed (the default), 130 in others.
	r, err = Build(context.Background(), f, Query{Start: day0, End: day0.Add(hours * time.Hour), GroupBy: ByModel})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Units) != DefaultMaxUnits || r.UnitsInOthers != 130 || r.Others.DeploymentCount+sumDeployments(r.Units) != n {
		t.Errorf("by model: %d units, %d in others", len(r.Units), r.UnitsInOthers)
	}
	// Few enough units: no others.
	r, err = Build(context.Background(), f, Query{Start: day0, End: day0.Add(hours * time.Hour), GroupBy: ByGPUType})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Units) != 3 || r.Others != nil || r.UnitsInOthers != 0 {
		t.Errorf("by GPU type: %d units, others %v", len(r.Units), r.Others)
	}
}

func sumDeployments(units []Unit) int {
	n := 0
	for _, u := range units {
		n += u.DeploymentCount
	}
	return n
}
