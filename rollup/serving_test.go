package rollup_test

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/billing"
	"tokenmeter/rollup"
)

func TestServingLabel(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{""}, ""},
		{[]string{"vllm", "vllm"}, "vllm"},
		{[]string{"vllm", "", "sglang", "vllm"}, "sglang+vllm"},
	} {
		if got := rollup.ServingLabel(tc.in); got != tc.want {
			t.Errorf("ServingLabel(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLabelCostAndServingLabels: a line takes its (deployment, model)'s
// engine and TP, the idle line its deployment's; TPs sort as numbers; a
// deployment without labelled events has empty labels.
func TestLabelCostAndServingLabels(t *testing.T) {
	hour := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	serving := []rollup.ServingRow{
		{Hour: hour, Deployment: "a", Model: "m", Engine: "vllm", TensorParallelism: 16},
		{Hour: hour, Deployment: "a", Model: "m", Engine: "sglang", TensorParallelism: 2},
		{Hour: hour, Deployment: "a", Model: "m2", Engine: "vllm", TensorParallelism: 4},
		{Hour: hour, Deployment: "b", Model: "m", Engine: "", TensorParallelism: 0},
	}
	rows := []rollup.CostRow{
		{Deployment: "a", Model: "m", TenantID: "acme"},
		{Deployment: "a", Model: "m2", TenantID: "acme"},
		{Deployment: "a", TenantID: billing.IdleTenant},
		{Deployment: "b", Model: "m", TenantID: "acme"},
		{Deployment: "c", Model: "m", TenantID: "acme"},
	}
	rollup.LabelCost(rows, serving)
	var got [][2]string
	for _, r := range rows {
		got = append(got, [2]string{r.Engine, r.TensorParallelism})
	}
	want := [][2]string{{"sglang+vllm", "2+16"}, {"vllm", "4"}, {"sglang+vllm", "2+4+16"}, {"", ""}, {"", ""}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	wantHour := []rollup.ServingHourRow{
		{Hour: hour, Deployment: "a", Model: "m", Engine: "sglang+vllm", TensorParallelism: "2+16"},
		{Hour: hour, Deployment: "a", Model: "m2", Engine: "vllm", TensorParallelism: "4"},
		{Hour: hour, Deployment: "b", Model: "m"},
	}
	if diff := cmp.Diff(wantHour, rollup.ServingLabels(hour.Add(time.Minute), serving)); diff != "" {
		t.Errorf("serving_hour rows (-want +got):\n%s", diff)
	}
}

// TestComputeCostGPUTimeExact: over generated deployment-hours, every
// policy's lines of GPU time add up to the deployment-hour's GPU time
// rounded once to the millisecond, busy and idle parts alike, and each
// tenant line's busy GPU time is the floor or ceiling of its exact share
// of the busy milliseconds by its basis (brute force, big.Rat).
func TestComputeCostGPUTimeExact(t *testing.T) {
	book, err := billing.ParsePriceBook([]byte(`{"currency":"USD","gpu_prices":[
  {"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(7, 33))
	for round := range 40 {
		var samples []rollup.GPUSampleRow
		var gpuSec, busySec float64
		nGPU := 1 + rng.IntN(3)
		for g := range nGPU {
			for k := range 1 + rng.IntN(360) {
				iv := 1 + rng.Float64()*10 // odd intervals: the sum is not whole milliseconds
				util := rng.Float64()
				samples = append(samples, rollup.GPUSampleRow{Deployment: "d", GPUType: "H100", Instance: fmt.Sprint(g),
					SampledAt: hour.Add(time.Duration(k) * 10 * time.Second), IntervalS: iv, Utilization: util})
			}
		}
		for _, s := range samples { // the order ComputeCost sums in
			gpuSec += s.IntervalS
			busySec += s.IntervalS * s.Utilization
		}
		var usage []rollup.DeploymentUsageRow
		for i := range rng.IntN(6) {
			u := rollup.DeploymentUsageRow{Hour: hour, Deployment: "d", TenantID: fmt.Sprintf("t%d", i), Model: "m",
				Requests: uint64(rng.IntN(50)), E2EMs: float64(rng.IntN(100000))}
			if rng.IntN(4) > 0 {
				u.InputTokens, u.OutputTokens = uint64(rng.IntN(100000)), uint64(rng.IntN(20000))
			}
			usage = append(usage, u)
		}
		_, rows, err := rollup.ComputeCost(hour, book, samples, usage)
		if err != nil {
			t.Fatal(err)
		}
		totalMs := uint64(math.Round(gpuSec * 1000))
		busyMs := min(uint64(math.Round(busySec*1000)), totalMs)
		for b := range 3 {
			for i := range 3 {
				var sum uint64
				for _, r := range rows {
					sum += r.GPUMs[b][i]
				}
				if sum != totalMs {
					t.Fatalf("round %d policy %d/%d: lines add up to %d ms, want %d", round, b, i, sum, totalMs)
				}
			}
			var busySum uint64
			for _, r := range rows {
				busySum += r.GPUBusyMs[b]
			}
			if busySum != busyMs {
				t.Fatalf("round %d busy policy %d: busy lines add up to %d ms, want %d", round, b, busySum, busyMs)
			}
		}
		// Under tokens/separate a tenant line's GPU time is its busy
		// share: floor or ceiling of busyMs × tokens / Σ tokens.
		var basis int64
		for _, u := range usage {
			basis += int64(u.InputTokens + u.OutputTokens)
		}
		if basis == 0 {
			continue
		}
		for _, r := range rows {
			if r.TenantID == billing.IdleTenant {
				continue
			}
			q := new(big.Rat).SetFrac(new(big.Int).SetUint64(busyMs*(r.InputTokens+r.OutputTokens)), big.NewInt(basis))
			lo := new(big.Int).Quo(q.Num(), q.Denom()).Uint64()
			if got := r.GPUMs[0][0]; got != lo && got != lo+1 {
				t.Errorf("round %d %s: %d ms, want %d or %d (exact %s)", round, r.TenantID, got, lo, lo+1, q.FloatString(3))
			}
		}
	}
}
