package query_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/servingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// TestCostServingDimsExact: the cost lines' allocated GPU time and their
// grouping by engine, tensor_parallelism and model_version, against a
// brute force over generated events and samples (billing.AllocateHour of
// each deployment-hour's milliseconds and cost), every busy and idle
// policy, hour and total steps. It runs in cluster mode too (make
// test-cluster): the cost step's serving read goes through the
// Distributed events table and writes the global serving_hour.
func TestCostServingDimsExact(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := t.Context()
	// An H100 second costs 1,000,000 nanos, an A100 second 500,000: a
	// deployment-hour's cost is its milliseconds × 1,000 (× 500) exactly.
	book, err := billing.ParsePriceBook([]byte(`{"currency":"USD","gpu_prices":[
  {"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"},
  {"gpu_type":"A100","effective_from":"2026-01-01T00:00:00Z","per_hour":"1.80"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(ctx, s, book, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	h0 := day.Add(3 * time.Hour)
	rng := rand.New(rand.NewPCG(33, 26))
	gpus := map[string]struct {
		gpuType string
		n       int
		perMs   int64
	}{"dA": {"H100", 2, 1000}, "dB": {"A100", 1, 500}, "dIdle": {"L40S", 1, 0}}
	type dh = servingtest.DepHour
	gpuMs, busyMs := map[dh]int64{}, map[dh]int64{}
	served := servingtest.NewHours()

	var events chstore.EventBatch
	for i := range 1200 {
		h, m := i/400, rng.IntN(60)
		dep := []string{"dA", "dA", "dB", "dNone"}[rng.IntN(4)]
		tenant := []string{"acme", "globex", "initech"}[rng.IntN(3)]
		model, version, engine, tp := "m", "v1", "", uint32(0)
		switch {
		case dep == "dA" && h*60+m < 90: // vllm until 01:30, then sglang
			engine, tp = "vllm", 2
		case dep == "dA":
			engine, tp = "sglang", 4
		case dep == "dB":
			model, engine, tp = "m2", "trt-llm", 1
			if tenant == "acme" { // a canary
				version = "v2"
			}
		}
		e := &meterv1.InferenceEvent{EventId: fmt.Sprint(i), TenantId: tenant, Model: model, ModelVersion: version,
			Deployment: dep, Engine: engine, TensorParallelism: tp,
			CompletedAt:  timestamppb.New(h0.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)),
			PromptTokens: proto.Int64(int64(rng.IntN(3000))), OutputTokens: proto.Int64(int64(rng.IntN(600))),
			E2EMs: proto.Float64(float64(50 + rng.IntN(9000))),
		}
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
		served.Add(h, e)
	}
	var samples chstore.GPUBatch
	for dep, g := range gpus {
		for gpu := range g.n {
			for k := range 3 * 360 {
				util := float64(rng.IntN(9)) / 8
				samples.Append(&meterv1.GpuSample{SampleId: fmt.Sprintf("%s/%d/%d", dep, gpu, k), GpuUuid: fmt.Sprintf("GPU-%s-%d", dep, gpu),
					GpuType: g.gpuType, Deployment: dep, SampledAt: timestamppb.New(h0.Add(time.Duration(k) * 10 * time.Second)),
					IntervalS: 10, Utilization: util}, time.Now())
				gpuMs[dh{H: k / 360, Dep: dep}] += 10_000
				busyMs[dh{H: k / 360, Dep: dep}] += int64(util * 10_000)
			}
		}
	}
	if err := s.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertGPUSamples(ctx, &samples); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s)

	type figures struct{ Ms, BusyMs, Cost, Busy int64 }
	for _, groupBy := range [][]string{{"engine"}, {"tensor_parallelism"}, {"model_version"}, {"tenant_id", "deployment", "engine", "model_version"}} {
		for _, busy := range billing.BusyPolicies() {
			for _, idle := range billing.IdlePolicies() {
				p := billing.DefaultPolicy()
				p.Busy, p.Idle = busy, idle
				for _, step := range []string{"hour", "total"} {
					want := map[string]figures{}
					for h := range 3 {
						for _, dep := range []string{"dA", "dB", "dIdle"} {
							k := dh{H: h, Dep: dep}
							us, of := served.Usages(k)
							ms, bms, per := gpuMs[k], busyMs[k], gpus[dep].perMs
							at, err := billing.AllocateHour(billing.GPUCost{GPUSeconds: float64(ms) / 1000, Cost: billing.Money(ms),
								BusyCost: billing.Money(bms), IdleCost: billing.Money(ms - bms)}, us, p)
							if err != nil {
								t.Fatal(err)
							}
							ac, err := billing.AllocateHour(billing.GPUCost{GPUSeconds: float64(ms) / 1000, Cost: billing.Money(ms * per),
								BusyCost: billing.Money(bms * per), IdleCost: billing.Money((ms - bms) * per)}, us, p)
							if err != nil {
								t.Fatal(err)
							}
							for i, l := range at.Lines {
								vals := served.Labels(k, of[l.Tenant])
								key := ""
								if step == "hour" {
									key = h0.Add(time.Duration(h) * time.Hour).Format(time.RFC3339)
								}
								for _, f := range groupBy {
									key += " " + f + "=" + vals[f]
								}
								f := want[key]
								f.Ms, f.BusyMs = f.Ms+int64(l.Total), f.BusyMs+int64(l.Busy)
								f.Cost, f.Busy = f.Cost+int64(ac.Lines[i].Total), f.Busy+int64(ac.Lines[i].Busy)
								want[key] = f
							}
						}
					}
					rows, err := reads(s).Cost(ctx, query.CostQuery{Start: h0, End: h0.Add(3 * time.Hour), Step: step, GroupBy: groupBy,
						Busy: string(busy), Idle: string(idle)})
					if err != nil {
						t.Fatal(err)
					}
					got := map[string]figures{}
					for _, r := range rows {
						key := ""
						if step == "hour" {
							key = r.Start.UTC().Format(time.RFC3339)
						}
						for _, f := range groupBy {
							key += " " + f + "=" + r.Group[f]
						}
						got[key] = figures{int64(r.GPUMs), int64(r.GPUBusyMs), r.CostNanos, r.BusyNanos}
					}
					// Groups with neither GPU time nor cost (the idle line of
					// shared idle cost) are not answered unless they have requests.
					for k, f := range want {
						if f == (figures{}) {
							if _, ok := got[k]; !ok {
								delete(want, k)
							}
						}
					}
					for k, f := range got {
						if f == (figures{}) {
							if _, ok := want[k]; !ok {
								want[k] = f // unattributed usage only (dNone)
							}
						}
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("%s by %v under %s/%s (-brute force +got):\n%s", step, groupBy, busy, idle, diff)
					}
				}
			}
		}
	}
}
