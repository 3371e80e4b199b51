package billing

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

func TestGPUCostErrors(t *testing.T) {
	b := mustBook(t, `{"gpu_prices": [{"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "1"}]}`)
	at := ts("2026-02-01T00:00:00Z")
	for _, u := range []GPUUsage{
		{GPUType: "H100", At: at, GPUSeconds: -1},
		{GPUType: "H100", At: at, GPUSeconds: math.NaN()},
		{GPUType: "H100", At: at, GPUSeconds: math.Inf(1)},
		{GPUType: "H100", At: at, GPUSeconds: 1, BusySeconds: math.NaN()},
		{GPUType: "H100", At: at, GPUSeconds: 1, MIGFraction: 1.5},
		{GPUType: "H100", At: at, GPUSeconds: 1, MIGFraction: -0.5},
		{GPUType: "H100", At: at, GPUSeconds: 1, MIGFraction: math.NaN()},
	} {
		if _, err := b.GPUCost([]GPUUsage{u}); !errors.Is(err, ErrInvalidUsage) {
			t.Errorf("GPUCost(%+v): got %v, want ErrInvalidUsage", u, err)
		}
	}
}

func TestGPUCostClampsBusy(t *testing.T) {
	b := mustBook(t, `{"gpu_prices": [{"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.6"}]}`)
	at := ts("2026-02-01T00:00:00Z")
	c, err := b.GPUCost([]GPUUsage{
		{GPUType: "H100", At: at, GPUSeconds: 10, BusySeconds: 12}, // utilization above 1: busy 10
		{GPUType: "H100", At: at, GPUSeconds: 10, BusySeconds: -3}, // below 0: busy 0
	})
	if err != nil {
		t.Fatal(err)
	}
	// 20 s × 3.6/3600 = 0.02; busy 10 s = 0.01.
	if c.BusySeconds != 10 || c.IdleSeconds != 10 || c.Cost != 20_000_000 || c.BusyCost != 10_000_000 || c.IdleCost != 10_000_000 {
		t.Errorf("got %+v", c)
	}
}

func TestGPUCostBeforeFirstPriceIsUnpriced(t *testing.T) {
	b := mustBook(t, `{"gpu_prices": [{"gpu_type": "H100", "effective_from": "2026-01-01T10:30:00Z", "per_hour": "3.6"}]}`)
	c, err := b.GPUCost([]GPUUsage{
		{GPUType: "H100", At: ts("2026-01-01T10:29:59Z"), GPUSeconds: 100, BusySeconds: 50},
		{GPUType: "H100", At: ts("2026-01-01T10:30:00Z"), GPUSeconds: 100, BusySeconds: 50},
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.UnpricedSeconds != 100 || c.GPUSeconds != 200 || c.Cost != 100_000_000 || c.BusyCost != 50_000_000 {
		t.Errorf("got %+v", c)
	}
}

func TestSimpleFraction(t *testing.T) {
	tests := []struct {
		f    float64
		want *big.Rat
	}{
		{1, big.NewRat(1, 1)},
		{0.5, big.NewRat(1, 2)},
		{1.0 / 7, big.NewRat(1, 7)},
		{2.0 / 7, big.NewRat(2, 7)},
		{3.0 / 7, big.NewRat(3, 7)},
		{4.0 / 7, big.NewRat(4, 7)},
		{0.125, big.NewRat(1, 8)},
		{1.0 / 3, big.NewRat(1, 3)},
		{0.3, big.NewRat(3, 10)},
		// Not within the small denominators: taken exactly.
		{1.0 / 97, new(big.Rat).SetFloat64(1.0 / 97)},
	}
	for _, tt := range tests {
		if got := simpleFraction(tt.f); got.Cmp(tt.want) != 0 {
			t.Errorf("simpleFraction(%v) = %s, want %s", tt.f, got, tt.want)
		}
	}
	// A float64 near but not nearest to 1/7 is not snapped.
	near := math.Nextafter(1.0/7, 1)
	if got := simpleFraction(near); got.Cmp(big.NewRat(1, 7)) == 0 {
		t.Errorf("simpleFraction(%v) snapped to 1/7", near)
	}
}

func TestExactSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		var s exactSum
		want := new(big.Rat)
		for range 1 + rng.IntN(50) {
			var f float64
			switch rng.IntN(4) {
			case 0:
				f = rng.Float64() * 600
			case 1:
				f = float64(rng.IntN(100))
			case 2:
				f = rng.Float64() * 1e-300
			default:
				f = math.Ldexp(rng.Float64(), rng.IntN(200)-100)
			}
			s.add(f)
			want.Add(want, new(big.Rat).SetFloat64(f))
		}
		if got := s.rat(); got.Cmp(want) != 0 {
			t.Fatalf("exact sum %s, want %s", got.FloatString(20), want.FloatString(20))
		}
	}
	// Subnormals, huge values, and a value that float64 addition would lose.
	var s exactSum
	for _, f := range []float64{1e16, 1, -0.0, math.SmallestNonzeroFloat64, 1, math.MaxFloat64} {
		s.add(f)
	}
	want := new(big.Rat).SetFloat64(1e16)
	want.Add(want, big.NewRat(2, 1))
	want.Add(want, new(big.Rat).SetFloat64(math.SmallestNonzeroFloat64))
	want.Add(want, new(big.Rat).SetFloat64(math.MaxFloat64))
	if got := s.rat(); got.Cmp(want) != 0 {
		t.Errorf("exact sum %s, want %s", got.FloatString(30), want.FloatString(30))
	}
}

func TestExactSumCarries(t *testing.T) {
	// Values 2^70 apart force the 128-bit accumulator to carry into big.
	var s exactSum
	want := new(big.Rat)
	for i := range 5000 {
		f := math.Ldexp(1-math.Ldexp(1, -53), 70*(i%2)) // the largest mantissa
		s.add(f)
		want.Add(want, new(big.Rat).SetFloat64(f))
	}
	if got := s.rat(); got.Cmp(want) != 0 {
		t.Errorf("exact sum %s, want %s", got.FloatString(5), want.FloatString(5))
	}
}

// TestGPUCostMatchesPriceChanges checks that GPUCost splits an hour exactly
// where GPUPriceChanges says the price changes.
func TestGPUCostMatchesPriceChanges(t *testing.T) {
	b := mustBook(t, `{"gpu_prices": [
	  {"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.6"},
	  {"gpu_type": "H100", "effective_from": "2026-01-01T10:20:00Z", "per_hour": "7.2"},
	  {"gpu_type": "H100", "pool": "spot", "effective_from": "2026-01-01T10:40:00Z", "per_hour": "1.8"}
	]}`)
	from := ts("2026-01-01T10:00:00Z")
	changes := b.GPUPriceChanges("H100", "spot", "", from, from.Add(time.Hour))
	if len(changes) != 2 {
		t.Fatalf("changes %v, want 10:20 and 10:40", changes)
	}
	var usage []GPUUsage
	for s := range 3600 {
		usage = append(usage, GPUUsage{GPUType: "H100", Pool: "spot", At: from.Add(time.Duration(s) * time.Second), GPUSeconds: 1})
	}
	c, err := b.GPUCost(usage)
	if err != nil {
		t.Fatal(err)
	}
	// 1200 s at 3.6 + 1200 s at 7.2 + 1200 s at 1.8 = 1.2 + 2.4 + 0.6 = 4.2.
	if c.Cost != 4_200_000_000 || len(c.PriceIDs) != 3 {
		t.Errorf("cost %s with %v, want 4.2 with three prices", c.Cost, c.PriceIDs)
	}
}
