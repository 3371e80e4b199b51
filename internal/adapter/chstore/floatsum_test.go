package chstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// floatSumParts and floatSumRows are the parts (one INSERT each) and rows
// per part of the order test: many parts of rows whose float sums depend on
// their order, which ClickHouse's threads hand over in a different order
// from one run of a query to the next.
const floatSumParts, floatSumRows = 24, 200

// spread is a value whose magnitude ranges from 1e-6 to 1e9, so that
// adding the same values in another order changes the float sum.
func spread(rng *rand.Rand) float64 {
	return rng.Float64() * math.Pow(10, float64(rng.IntN(16)-6))
}

// TestFloatSumsDoNotDependOnOrder: every read that sums Float64 columns in
// ClickHouse (engine stats, GPU usage, latency sums merged by the store)
// gives the same bits each time it runs. They once summed in whatever
// order ClickHouse's threads handed the parts over: engine means read over
// gRPC and REST differed in the 16th digit.
func TestFloatSumsDoNotDependOnOrder(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(30, 9))
	var want struct{ gpuSeconds, kvWeighted, ttft float64 } // float sums in the order written
	for p := range floatSumParts {
		var engine []rollup.EngineRow
		var gpu []rollup.GPUHourRow
		var records []rollup.RollupRecord
		for i := range floatSumRows {
			id := fmt.Sprintf("r%d-%d", p, i)
			e := rollup.EngineRow{Bucket: hour, Deployment: "d", Engine: "vllm", Model: "m", Replica: id, Samples: 1,
				SampledSeconds: spread(rng), RunningWeighted: spread(rng), RunningSeconds: spread(rng),
				WaitingWeighted: spread(rng), WaitingSeconds: spread(rng), KVWeighted: spread(rng), KVSeconds: spread(rng),
				HitRateWeighted: spread(rng), HitRateSeconds: spread(rng), BatchWeighted: spread(rng), BatchSeconds: spread(rng)}
			engine = append(engine, e)
			g := rollup.GPUHourRow{Hour: hour, Deployment: id, GPUType: "H100", GPUs: 1, Samples: 1,
				GPUSeconds: spread(rng), BusySeconds: spread(rng), CoveredSeconds: spread(rng),
				EnergyJoules: spread(rng), UnpricedSeconds: spread(rng)}
			gpu = append(gpu, g)
			r := rollup.RollupRecord{Bucket: hour, Dims: [6]string{"acme", "m", "", id, "H100", ""}, Requests: 1}
			for m := range r.Sum {
				r.Count[m], r.Sum[m] = 1, spread(rng)
			}
			records = append(records, r)
			want.gpuSeconds += g.GPUSeconds
			want.kvWeighted += e.KVWeighted
			want.ttft += r.Sum[0]
		}
		if err := s.WriteEngineRows(ctx, nil, engine, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteCost(ctx, gpu, nil, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertRollupRecords(ctx, "rollup_hour", records, 1, 1); err != nil {
			t.Fatal(err)
		}
	}

	engineQ, err := query.EngineQuery{Start: hour, End: hour.Add(time.Hour)}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	gpuQ, err := query.GPUUsageQuery{Start: hour, End: hour.Add(time.Hour)}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	rollupQ, err := query.RollupQuery{Start: hour, End: hour.Add(time.Hour), Step: "hour", GroupBy: []string{"tenant_id"}}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]func() (any, error){
		"engine stats": func() (any, error) { return s.EngineRows(ctx, engineQ) },
		"GPU usage":    func() (any, error) { return s.GPUUsageRows(ctx, gpuQ, query.GPUTokens{}) },
		"latency merged by the store": func() (any, error) {
			var out []query.RollupRow
			err := s.RollupRows(ctx, query.RollupRead{Query: rollupQ, Level: query.LevelHour, Merge: true}, func(r *query.RollupRow) error {
				out = append(out, *r)
				out[len(out)-1].Latency = map[string]query.Dist{}
				for m, d := range r.Latency { // the sums only; r's maps are reused
					out[len(out)-1].Latency[m] = query.Dist{Count: d.Count, Sum: d.Sum}
				}
				return nil
			})
			return out, err
		},
	}
	const runs = 30
	for name, read := range reads {
		first, err := read()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		differ := 0
		for range runs - 1 {
			again, err := read()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			// Exact: the same read must give the same bits.
			if diff := cmp.Diff(first, again); diff != "" {
				if differ == 0 {
					t.Errorf("%s: a read differs from the first (-first +again):\n%s", name, diff)
				}
				differ++
			}
		}
		if differ > 0 {
			t.Errorf("%s: %d of %d reads differ from the first", name, differ, runs-1)
		}
	}

	// The sums are the sums, near enough: each value keeps 15 decimal
	// places.
	engine, _ := s.EngineRows(ctx, engineQ)
	gpu, _ := s.GPUUsageRows(ctx, gpuQ, query.GPUTokens{})
	latency, _ := reads["latency merged by the store"]()
	rows, _ := latency.([]query.RollupRow)
	if len(engine) != 1 || len(gpu) != 1 || len(rows) != 1 {
		t.Fatalf("got %d engine, %d GPU and %d latency rows, want 1 of each", len(engine), len(gpu), len(rows))
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"engine kv_weighted", engine[0].KVWeighted, want.kvWeighted},
		{"GPU seconds", gpu[0].GPUSeconds, want.gpuSeconds},
		{rollup.LatencyMetrics[0] + " sum", rows[0].Latency[rollup.LatencyMetrics[0]].Sum, want.ttft},
	} {
		if math.Abs(c.got-c.want) > 1e-12*math.Abs(c.want) {
			t.Errorf("%s = %v, want %v (the float sum)", c.name, c.got, c.want)
		}
	}
}
