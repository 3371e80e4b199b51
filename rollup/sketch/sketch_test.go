package sketch

import (
	"math"
	"math/rand/v2"
	"testing"
)

// edgeTolerance absorbs float rounding at bucket bounds, where the relative
// error of Value is α exactly.
const edgeTolerance = 1e-12

func relErr(got, want float64) float64 {
	return math.Abs(got-want) / want
}

func TestKey(t *testing.T) {
	tests := []struct {
		name string
		v    float64
		want int16
	}{
		{"zero", 0, MinKey},
		{"negative zero", math.Copysign(0, -1), MinKey},
		{"negative", -5, MinKey},
		{"minus infinity", math.Inf(-1), MinKey},
		{"NaN", math.NaN(), MinKey},
		{"smallest float", math.SmallestNonzeroFloat64, MinKey},
		{"below 1 µs", 1e-6, MinKey},
		{"1 µs", MinValue, MinKey},
		{"just above 1 µs", math.Nextafter(MinValue, 1), MinKey},
		{"1 ms", 1, 0},
		{"just above 1 ms", math.Nextafter(1, 2), 1},
		{"gamma", Gamma, 1},
		{"1 s", 1e3, 346},
		{"24 h", 24 * 3600 * 1e3, 914},
		{"just below the maximum", math.Nextafter(MaxValue, 0), MaxKey},
		{"maximum", MaxValue, MaxKey},
		{"huge", 1e300, MaxKey},
		{"infinity", math.Inf(1), MaxKey},
	}
	for _, tt := range tests {
		if got := Key(tt.v); got != tt.want {
			t.Errorf("%s: Key(%v) = %d, want %d", tt.name, tt.v, got, tt.want)
		}
	}
}

// TestKeyIsCeilLog checks Key's table and series against the definition it
// replaces, ⌈math.Log(v) / ln γ⌉ (the same division ClickHouse does), value
// for value: log-uniform random values over the whole key range, the
// float64 neighbours of every bucket bound (where the definition itself
// rounds, and Key falls back to it), every token count below 2^16 (the
// rollup's token sizes) and whole and round milliseconds.
func TestKeyIsCeilLog(t *testing.T) {
	want := func(v float64) int16 {
		switch {
		case !(v > MinValue):
			return MinKey
		case v >= MaxValue:
			return MaxKey
		}
		return int16(math.Ceil(math.Log(v) / lnGamma))
	}
	var checked, wrong int
	check := func(v float64) {
		checked++
		if got, w := Key(v), want(v); got != w {
			if wrong++; wrong <= 10 {
				t.Errorf("Key(%v) = %d, want ⌈ln v / ln γ⌉ = %d", v, got, w)
			}
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	lo, hi := math.Log(MinValue), math.Log(MaxValue)
	for range 2_000_000 {
		check(math.Exp(lo + rng.Float64()*(hi-lo)))
	}
	for k := MinKey - 1; k <= MaxKey+1; k++ {
		b := math.Pow(Gamma, float64(k))
		for _, v := range []float64{b, math.Nextafter(b, 0), math.Nextafter(b, math.Inf(1))} {
			check(v)
			for range 8 {
				v = math.Nextafter(v, 0)
				check(v)
			}
		}
	}
	for n := range 1 << 16 {
		check(float64(n))
		check(float64(n) / 1000)
	}
	if wrong > 0 {
		t.Errorf("%d of %d values keyed differently", wrong, checked)
	}
}

// TestKeyRange checks the documented constants against the mapping.
func TestKeyRange(t *testing.T) {
	if got := math.Ceil(math.Log(MinValue) / lnGamma); got != float64(MinKey) {
		t.Errorf("⌈ln MinValue / ln γ⌉ = %v, want MinKey %d", got, MinKey)
	}
	if got := math.Ceil(math.Log(MaxValue) / lnGamma); got != float64(MaxKey) {
		t.Errorf("⌈ln MaxValue / ln γ⌉ = %v, want MaxKey %d", got, MaxKey)
	}
	if got := (Gamma - 1) / (Gamma + 1); relErr(got, RelativeAccuracy) > edgeTolerance {
		t.Errorf("(γ−1)/(γ+1) = %v, want α = %v", got, RelativeAccuracy)
	}
}

// TestValueRoundTrip checks that the estimate of a value's bucket is within
// α of it, and that the value lies in the bucket's bounds, from 1 µs to
// 24 h: log-uniform random values plus the float64 neighbours of every
// bucket bound.
func TestValueRoundTrip(t *testing.T) {
	const lo, hi = MinValue, 24 * 3600 * 1e3
	var values []float64
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1_000_000 {
		values = append(values, lo*math.Pow(hi/lo, rng.Float64()))
	}
	for k := Key(lo); k <= Key(hi); k++ {
		b := UpperBound(k)
		values = append(values, math.Nextafter(b, 0), b, math.Nextafter(b, math.Inf(1)))
	}
	var maxErr float64
	for _, v := range values {
		if v < lo || v > hi {
			continue
		}
		k := Key(v)
		e := relErr(Value(k), v)
		maxErr = max(maxErr, e)
		if e > RelativeAccuracy+edgeTolerance {
			t.Errorf("Value(Key(%v)) = Value(%d) = %v: relative error %v, want ≤ %v", v, k, Value(k), e, RelativeAccuracy)
		}
		if lb, ub := LowerBound(k), UpperBound(k); v <= lb*(1-edgeTolerance) || v > ub*(1+edgeTolerance) {
			t.Errorf("Key(%v) = %d, whose bounds are (%v, %v]", v, k, lb, ub)
		}
	}
	t.Logf("%d values, max relative error %.6f", len(values), maxErr)
}

func TestBounds(t *testing.T) {
	tests := []struct {
		k          int16
		lower, upp float64
	}{
		{MinKey, 0, math.Pow(Gamma, float64(MinKey))},
		{0, 1 / Gamma, 1},
		{1, 1, Gamma},
		{MaxKey, math.Pow(Gamma, float64(MaxKey)-1), math.Inf(1)},
	}
	for _, tt := range tests {
		if got := LowerBound(tt.k); got != tt.lower && relErr(got, tt.lower) > edgeTolerance {
			t.Errorf("LowerBound(%d) = %v, want %v", tt.k, got, tt.lower)
		}
		if got := UpperBound(tt.k); got != tt.upp && relErr(got, tt.upp) > edgeTolerance {
			t.Errorf("UpperBound(%d) = %v, want %v", tt.k, got, tt.upp)
		}
	}
}
