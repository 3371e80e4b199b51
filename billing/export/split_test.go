package export

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"tokenmeter/billing"
)

func TestSplitMoney(t *testing.T) {
	w := func(a, b, c int64) [3]*big.Int { return [3]*big.Int{big.NewInt(a), big.NewInt(b), big.NewInt(c)} }
	tests := []struct {
		total   billing.Money
		weights [3]*big.Int
		want    [3]billing.Money
	}{
		{10, w(1, 1, 1), [3]billing.Money{4, 3, 3}},
		{-10, w(1, 1, 1), [3]billing.Money{-4, -3, -3}},
		{11, w(0, 0, 0), [3]billing.Money{11, 0, 0}},
		{5, w(0, 2, 3), [3]billing.Money{0, 2, 3}},
		{2, w(1, 3, 1), [3]billing.Money{1, 1, 0}}, // 0.4, 1.2, 0.4: the tie goes to the first
		{3, w(5, 3, 2), [3]billing.Money{1, 1, 1}}, // 1.5, 0.9, 0.6
		{1 << 62, w(1<<62, 1<<62, 1<<62), [3]billing.Money{1<<62/3 + 1, 1 << 62 / 3, 1 << 62 / 3}},
	}
	for _, tt := range tests {
		if got := splitMoney(tt.total, tt.weights); got != tt.want {
			t.Errorf("splitMoney(%d, %v) = %v, want %v", tt.total, tt.weights, got, tt.want)
		}
	}
	// Any split adds up exactly and each part is within one nano-unit of
	// its exact share.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10_000 {
		total := billing.Money(rng.Int64N(1e15) - 5e14)
		weights := w(rng.Int64N(1e12), rng.Int64N(3)*rng.Int64N(1e12), rng.Int64N(1e12))
		parts := splitMoney(total, weights)
		sum := new(big.Int).Add(new(big.Int).Add(weights[0], weights[1]), weights[2])
		if sum.IsUint64() {
			if fast := splitMoney64(total, [3]uint64{weights[0].Uint64(), weights[1].Uint64(), weights[2].Uint64()}); fast != parts {
				t.Fatalf("splitMoney64(%d, %v) = %v, splitMoney %v", total, weights, fast, parts)
			}
		}
		if parts[0]+parts[1]+parts[2] != total {
			t.Fatalf("splitMoney(%d, %v) = %v: sum %d", total, weights, parts, parts[0]+parts[1]+parts[2])
		}
		if sum.Sign() == 0 {
			continue
		}
		for k := range 3 {
			exact := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(int64(total)), weights[k]), sum)
			diff := new(big.Rat).Sub(exact, new(big.Rat).SetInt64(int64(parts[k])))
			if diff.Abs(diff).Cmp(big.NewRat(1, 1)) >= 0 {
				t.Fatalf("splitMoney(%d, %v)[%d] = %d, exact %s", total, weights, k, parts[k], exact.FloatString(3))
			}
		}
	}
}

func TestScaledText(t *testing.T) {
	tests := []struct {
		n     uint64
		shift int
		want  string
	}{
		{1234567, 6, "1.234567"}, {1_000_000, 6, "1"}, {7, 6, "0.000007"}, {0, 6, "0"}, {1_500_000, 6, "1.5"}, {42, 0, "42"},
		{18446744073709551615, 6, "18446744073709.551615"},
	}
	for _, tt := range tests {
		if got := scaledText(tt.n, tt.shift); got != tt.want {
			t.Errorf("scaledText(%d, %d) = %q, want %q", tt.n, tt.shift, got, tt.want)
		}
	}
}

func TestAppendMoney(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, m := range []billing.Money{0, 1, -1, 1e9, -1e9, 1_500_000_000, 10, 123_456_789_000, math.MaxInt64, -math.MaxInt64} {
		if got := string(appendMoney(nil, m)); got != m.String() {
			t.Errorf("appendMoney(%d) = %q, want %q", m, got, m.String())
		}
	}
	for range 100_000 {
		m := billing.Money(rng.Int64() >> rng.IntN(63))
		if rng.IntN(2) == 0 {
			m = -m
		}
		if got := string(appendMoney([]byte("x"), m)); got != "x"+m.String() {
			t.Fatalf("appendMoney(%d) = %q, want %q", m, got, "x"+m.String())
		}
	}
}
