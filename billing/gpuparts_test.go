package billing

import (
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSplitByWeights: shares add up to the total whatever it is, each is the
// floor or the ceiling of its exact share, ties go to the earlier index, and
// zero weights fall back (then to equal parts).
func TestSplitByWeights(t *testing.T) {
	r := func(a, b int64) *big.Rat { return big.NewRat(a, b) }
	for _, tt := range []struct {
		total             int64
		weights, fallback []*big.Rat
		want              []int64
	}{
		{10, []*big.Rat{r(1, 1), r(1, 1), r(1, 1)}, nil, []int64{4, 3, 3}},
		{11, []*big.Rat{r(1, 1), r(1, 1), r(1, 1)}, nil, []int64{4, 4, 3}},
		{7, []*big.Rat{r(0, 1), r(0, 1)}, []*big.Rat{r(3, 1), r(1, 1)}, []int64{5, 2}},
		{5, []*big.Rat{r(0, 1), r(0, 1)}, []*big.Rat{r(0, 1), r(0, 1)}, []int64{3, 2}},
		{0, []*big.Rat{r(5, 2), r(1, 2)}, nil, []int64{0, 0}},
		{3, []*big.Rat{r(5, 2), r(1, 2)}, nil, []int64{3, 0}}, // 2.5 and 0.5: equal remainders, the earlier index first
		{-4, []*big.Rat{r(1, 1), r(1, 1), r(1, 1)}, nil, []int64{-1, -1, -2}},
		{9, nil, nil, []int64{}},
	} {
		if got := splitByWeights(tt.total, tt.weights, tt.fallback); !slices.Equal(got, tt.want) {
			t.Errorf("splitByWeights(%d, %v, %v) = %v, want %v", tt.total, tt.weights, tt.fallback, got, tt.want)
		}
	}
}

// TestGPUCostParts: over random usage split into parts, the whole is
// GPUCost of all of it, and the parts' busy and idle costs add up to the
// whole's exactly, each within a nano-unit of its own exact cost.
func TestGPUCostParts(t *testing.T) {
	book, err := ParsePriceBook([]byte(`{"gpu_prices":[{"gpu_type":"A100","effective_from":"2026-01-01T00:00:00Z","per_hour":"2.345678917"},` +
		`{"gpu_type":"A100","effective_from":"2026-11-22T10:31:07Z","per_hour":"1.987654321"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(7, 33))
	for range 200 {
		parts := make([][]GPUUsage, 1+rng.IntN(8))
		var all []GPUUsage
		for i := range parts {
			for range rng.IntN(30) {
				secs := float64(1+rng.IntN(30)) / float64(1+rng.IntN(7))
				u := GPUUsage{GPUType: "A100", MIGFraction: []float64{1, 1.0 / 7, 3.0 / 7}[rng.IntN(3)],
					At: hour.Add(time.Duration(rng.IntN(3600)) * time.Second), GPUSeconds: secs, BusySeconds: secs * rng.Float64()}
				parts[i] = append(parts[i], u)
				all = append(all, u)
			}
		}
		whole, got, err := book.GPUCostParts(parts)
		if err != nil {
			t.Fatal(err)
		}
		want, err := book.GPUCost(all)
		if err != nil {
			t.Fatal(err)
		}
		if whole.Cost != want.Cost || whole.BusyCost != want.BusyCost || whole.IdleCost != want.IdleCost {
			t.Fatalf("whole %v/%v/%v, GPUCost of all %v/%v/%v", whole.Cost, whole.BusyCost, whole.IdleCost, want.Cost, want.BusyCost, want.IdleCost)
		}
		var busy, idle Money
		for i, p := range got {
			busy, idle = busy+p.BusyCost, idle+p.IdleCost
			if p.Cost != p.BusyCost+p.IdleCost {
				t.Errorf("part %d: cost %v is not busy %v + idle %v", i, p.Cost, p.BusyCost, p.IdleCost)
			}
			_, cost, busyCost, err := book.gpuCost(parts[i])
			if err != nil {
				t.Fatal(err)
			}
			exactIdle := new(big.Rat).Sub(cost, busyCost)
			for _, c := range []struct {
				got   Money
				exact *big.Rat
			}{{p.BusyCost, busyCost}, {p.IdleCost, exactIdle}} {
				d := new(big.Rat).Sub(new(big.Rat).SetInt64(int64(c.got)), c.exact)
				if d.Abs(d).Cmp(big.NewRat(2, 1)) > 0 {
					t.Errorf("part %d: %v is %s off its exact cost %s", i, c.got, d.FloatString(3), c.exact.FloatString(3))
				}
			}
		}
		if busy != whole.BusyCost || idle != whole.IdleCost {
			t.Errorf("parts add up to busy %v, idle %v; the whole's are %v, %v", busy, idle, whole.BusyCost, whole.IdleCost)
		}
	}
}
