package export

import (
	"math/big"
	"math/rand/v2"
	"testing"

	"tokenmeter/billing"
)

// TestCostText checks exact costs against math/big: products of tokens
// and prices per 1M, sums and differences, written as the shortest exact
// decimal at 15 places and as DECIMAL(38, 15) bytes.
func TestCostText(t *testing.T) {
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(costScale), nil)
	check := func(c cost, want *big.Int) {
		t.Helper()
		r := new(big.Rat).SetFrac(want, scale)
		s := r.FloatString(costScale)
		for s[len(s)-1] == '0' {
			s = s[:len(s)-1]
		}
		if s[len(s)-1] == '.' {
			s = s[:len(s)-1]
		}
		if got := c.String(); got != s {
			t.Fatalf("String() = %s, want %s", got, s)
		}
		d := c.decimal()
		got := new(big.Int).SetBytes(d[:])
		if d[0]&0x80 != 0 {
			got.Sub(got, new(big.Int).Lsh(big.NewInt(1), 128))
		}
		if got.Cmp(want) != 0 {
			t.Fatalf("decimal() = %s, want %s", got, want)
		}
	}
	check(cost{}, new(big.Int))
	rng := rand.New(rand.NewPCG(3, 2))
	for range 20_000 {
		tokens := rng.Uint64() >> rng.IntN(64)
		price := billing.Money(rng.Int64() >> rng.IntN(63))
		c, err := costOfProduct(tokens, price)
		want := new(big.Int).Mul(new(big.Int).SetUint64(tokens), big.NewInt(int64(price)))
		if err != nil {
			if want.CmpAbs(new(big.Int).Exp(big.NewInt(10), big.NewInt(38), nil)) < 0 {
				t.Fatalf("costOfProduct(%d, %d): %v", tokens, price, err)
			}
			continue
		}
		check(c, want)
		m := billing.Money(rng.Int64() >> rng.IntN(63))
		if rng.IntN(2) == 0 {
			m = -m
		}
		mc := costOfMoney(m)
		check(mc, new(big.Int).Mul(big.NewInt(int64(m)), big.NewInt(nanoToCost)))
		check(c.sub(mc), new(big.Int).Sub(want, new(big.Int).Mul(big.NewInt(int64(m)), big.NewInt(nanoToCost))))
		check(c.neg(), new(big.Int).Neg(want))
	}
}
