package rollup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"
	"tokenmeter/query"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

const testPrices = `{
  "currency": "USD",
  "gpu_prices": [
    {"gpu_type": "H100-SXM-80GB", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "4.10"},
    {"gpu_type": "H100-SXM-80GB", "effective_from": "2026-11-20T00:30:00Z", "per_hour": "3.00"}
  ],
  "token_prices": [
    {"model": "llama-70b", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1.00", "cached_input_per_1m": "0.50", "output_per_1m": "2.00"}
  ]
}`

// gpuSamples returns 10 s samples of one GPU (or MIG instance) from h0+from
// (inclusive) to h0+to (exclusive), sampled_at = h0 + k×10 s.
func gpuSamples(dep, uuid string, mig uint32, frac float64, util float64, from, to time.Duration) []*meterv1.GpuSample {
	var out []*meterv1.GpuSample
	for at := from; at < to; at += 10 * time.Second {
		s := &meterv1.GpuSample{
			SampleId: fmt.Sprintf("%s/%d/%d", uuid, mig, at/time.Second), Node: "n1", GpuUuid: uuid, GpuType: "H100-SXM-80GB",
			Deployment: dep, SampledAt: timestamppb.New(h0.Add(at)), IntervalS: 10, Utilization: util, EnergyJoules: 3000,
			MigInstanceId: mig, MigFraction: frac, Source: "replay",
		}
		if frac > 0 && frac < 1 {
			s.MigProfile = "1g.10gb"
		}
		out = append(out, s)
	}
	return out
}

func (f *fixture) insertGPU(t *testing.T, samples []*meterv1.GpuSample) {
	t.Helper()
	var b chstore.GPUBatch
	for _, s := range samples {
		b.Append(s, time.Now())
	}
	if err := f.store.InsertGPUSamples(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
}

func (f *fixture) putPrices(t *testing.T, doc string) string {
	t.Helper()
	book, err := billing.ParsePriceBook([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := billing.EnsurePriceBook(context.Background(), f.store, book, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func money(t *testing.T, s string) int64 {
	t.Helper()
	m, err := billing.ParseMoney(s)
	if err != nil {
		t.Fatal(err)
	}
	return int64(m)
}

func TestCostRollupReconcilesAndMatchesHandComputedCost(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	version := f.putPrices(t, testPrices)

	var events []*meterv1.InferenceEvent
	for i := range 600 {
		ev := genEvent(i, h0.Add(time.Duration(i)*12*time.Second)) // hours 0 and 1
		if i%5 == 0 && ev.PromptTokens != nil {
			ev.CachedPromptTokens = proto.Int64(ev.GetPromptTokens() / 3)
		}
		events = append(events, ev)
	}
	orphans := 0
	for i := 600; i < 620; i++ {
		ev := genEvent(i, h0.Add(time.Duration(i-600)*time.Minute))
		ev.Deployment = "dorphan" // no GPU samples: unattributed
		events = append(events, ev)
		orphans++
	}
	f.insert(t, append(events, events[:50]...)) // duplicates count once

	var samples []*meterv1.GpuSample
	samples = append(samples, gpuSamples("dllama-70b", "GPU-a", 0, 0, 0.5, 0, time.Hour)...)
	samples = append(samples, gpuSamples("dllama-70b", "GPU-b", 0, 0, 0.25, 0, time.Hour)...)
	// MIG slices of one card, sampled only for the first 30 minutes (a gap).
	samples = append(samples, gpuSamples("dmixtral", "GPU-c", 1, 1.0/7, 0.8, 0, 30*time.Minute)...)
	samples = append(samples, gpuSamples("dmixtral", "GPU-c", 2, 1.0/7, 0.6, 0, 30*time.Minute)...)
	// A deployment with GPUs and no traffic: all of it is idle cost.
	samples = append(samples, gpuSamples("didle", "GPU-d", 0, 0, 0, 0, time.Hour)...)
	f.insertGPU(t, append(samples, samples[:100]...))

	if _, err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}

	// Hand-computed GPU cost of hour 0: 180 samples of 10 s before the price
	// change at 00:30 (4.10/h), 180 after (3.00/h): 2.05 + 1.50 = 3.55 per
	// whole GPU; the MIG slices ran 1800 s each at 4.10 for 1/7 of a card:
	// 2 × 1800/3600 × 4.10 / 7 = 0.585714285714… → 0.585714286.
	want := map[string]int64{
		"dllama-70b": money(t, "7.10"),
		"dmixtral":   money(t, "0.585714286"),
		"didle":      money(t, "3.55"),
	}
	hour0 := query.GPUUsageQuery{Start: h0, End: h0.Add(time.Hour), GroupBy: []string{"deployment"}}
	gpu, err := query.New(f.store, query.Config{}).GPUUsage(ctx, hour0)
	if err != nil {
		t.Fatal(err)
	}
	var gpuTotal int64
	for _, r := range gpu {
		dep := r.Group["deployment"]
		if r.CostNanos != want[dep] {
			t.Errorf("GPU cost of %s: got %s, want %s", dep, billing.Money(r.CostNanos), billing.Money(want[dep]))
		}
		if r.BusyCostNanos+r.IdleCostNanos != r.CostNanos {
			t.Errorf("%s: busy %d + idle %d != cost %d", dep, r.BusyCostNanos, r.IdleCostNanos, r.CostNanos)
		}
		if len(r.PriceVersions) != 1 || r.PriceVersions[0] != version {
			t.Errorf("%s: price versions %v, want [%s]", dep, r.PriceVersions, version)
		}
		gpuTotal += r.CostNanos
		switch dep {
		case "dmixtral":
			if r.Coverage() != 0.5 {
				t.Errorf("dmixtral coverage %v, want 0.5 (30 of 60 minutes sampled)", r.Coverage())
			}
			if r.GPUSeconds != 2*1800.0/7 {
				t.Errorf("dmixtral GPU-seconds %v, want %v", r.GPUSeconds, 2*1800.0/7)
			}
		case "dllama-70b":
			if r.GPUSeconds != 7200 || r.BusySeconds != 2700 || r.InputTokens == 0 {
				t.Errorf("dllama-70b GPU-seconds %v busy %v tokens %d, want 7200, 2700 and tokens", r.GPUSeconds, r.BusySeconds, r.InputTokens)
			}
		}
	}
	if len(gpu) != len(want) {
		t.Fatalf("GPU usage has %d deployments, want %d", len(gpu), len(want))
	}

	// Every policy pair allocates exactly the GPU cost, per deployment-hour
	// and in total; the idle deployment's cost is all on the idle line.
	for _, busy := range billing.BusyPolicies() {
		for _, idle := range billing.IdlePolicies() {
			q := query.CostQuery{Start: h0, End: h0.Add(time.Hour), GroupBy: []string{"tenant_id", "deployment"}, Busy: string(busy), Idle: string(idle)}
			rows, err := query.New(f.store, query.Config{}).Cost(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			perDep := map[string]int64{}
			var unattributed uint64
			for _, r := range rows {
				perDep[r.Group["deployment"]] += r.CostNanos
				unattributed += r.UnattributedRequests
				if r.Group["deployment"] == "didle" && (r.Group["tenant_id"] != billing.IdleTenant || r.CostNanos != want["didle"]) {
					t.Errorf("%s/%s: didle line %v %s, want all on %s", busy, idle, r.Group, billing.Money(r.CostNanos), billing.IdleTenant)
				}
				if r.CostNanos < 0 || r.BusyNanos < 0 || r.BusyNanos > r.CostNanos {
					t.Errorf("%s/%s: line %v: cost %d busy %d", busy, idle, r.Group, r.CostNanos, r.BusyNanos)
				}
				if idle != billing.IdleSeparate && r.Group["tenant_id"] == billing.IdleTenant && r.Group["deployment"] != "didle" {
					t.Errorf("%s/%s: idle line %v with %s although idle cost is shared", busy, idle, r.Group, billing.Money(r.CostNanos))
				}
			}
			for dep, w := range want {
				if perDep[dep] != w {
					t.Errorf("%s/%s: allocated %s to %s, want %s", busy, idle, billing.Money(perDep[dep]), dep, billing.Money(w))
				}
			}
			if perDep["dorphan"] != 0 {
				t.Errorf("%s/%s: unattributed usage priced at %s", busy, idle, billing.Money(perDep["dorphan"]))
			}
			if unattributed != uint64(orphans) {
				t.Errorf("%s/%s: %d unattributed requests, want %d", busy, idle, unattributed, orphans)
			}
		}
	}

	// A tenant key's answer is its own line of the finance answer.
	all, err := query.New(f.store, query.Config{}).Cost(ctx, query.CostQuery{Start: h0, End: h0.Add(2 * time.Hour), GroupBy: []string{"tenant_id"}})
	if err != nil {
		t.Fatal(err)
	}
	own, err := query.New(f.store, query.Config{}).Cost(ctx, query.CostQuery{TenantID: "acme", Start: h0, End: h0.Add(2 * time.Hour)})
	if err != nil || len(own) != 1 {
		t.Fatalf("acme cost: %v %v", own, err)
	}
	var total int64
	for _, r := range all {
		total += r.CostNanos
		if r.Group["tenant_id"] == "acme" && (r.CostNanos != own[0].CostNanos || r.OutputTokens != own[0].OutputTokens) {
			t.Errorf("acme alone %+v, in the finance answer %+v", own[0], r)
		}
	}
	if total != gpuTotal {
		t.Errorf("Σ allocated over tenants %s, GPU cost %s", billing.Money(total), billing.Money(gpuTotal))
	}

	// List charges: llama-70b tokens at 1000/500/2000 nanos per input/cached/
	// output token (exact, so the per-row rounding cannot hide an error);
	// mixtral has no list price.
	var wantList int64
	var unpricedList uint64
	seen := map[string]bool{}
	for _, ev := range events {
		if seen[ev.GetEventId()] || ev.GetCompletedAt().AsTime().After(h0.Add(time.Hour-time.Nanosecond)) {
			continue
		}
		seen[ev.GetEventId()] = true
		if ev.GetModel() != "llama-70b" {
			unpricedList++
			continue
		}
		wantList += (ev.GetPromptTokens()-ev.GetCachedPromptTokens())*1000 + ev.GetCachedPromptTokens()*500 + ev.GetOutputTokens()*2000
	}
	hourTotal, err := query.New(f.store, query.Config{}).Cost(ctx, query.CostQuery{Start: h0, End: h0.Add(time.Hour)})
	if err != nil || len(hourTotal) != 1 {
		t.Fatalf("hour 0 total: %v %v", hourTotal, err)
	}
	if hourTotal[0].ListCharge != wantList || hourTotal[0].ListUnpricedRequests != unpricedList {
		t.Errorf("list charge %s with %d unpriced requests, want %s and %d", billing.Money(hourTotal[0].ListCharge),
			hourTotal[0].ListUnpricedRequests, billing.Money(wantList), unpricedList)
	}

	// Re-running changes nothing; a new price book recosts the hours.
	if hours, err := f.job.RunOnce(ctx); err != nil || len(hours) != 0 {
		t.Fatalf("second run recomputed %v (err %v), want nothing", hours, err)
	}
	var doubled map[string]any
	if err := json.Unmarshal([]byte(testPrices), &doubled); err != nil {
		t.Fatal(err)
	}
	for _, p := range doubled["gpu_prices"].([]any) {
		e := p.(map[string]any)
		e["per_hour"] = map[string]string{"4.10": "8.20", "3.00": "6.00"}[e["per_hour"].(string)]
	}
	b, _ := json.Marshal(doubled)
	v2 := f.putPrices(t, string(b))
	if _, err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	gpu, err = query.New(f.store, query.Config{}).GPUUsage(ctx, hour0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range gpu {
		if dep := r.Group["deployment"]; dep == "dllama-70b" && (r.CostNanos != 2*want[dep] || r.PriceVersions[0] != v2) {
			t.Errorf("after repricing %s costs %s with %v, want %s with %s", dep, billing.Money(r.CostNanos), r.PriceVersions, billing.Money(2*want[dep]), v2)
		}
	}
}
