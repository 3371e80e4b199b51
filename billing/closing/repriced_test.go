package closing

import (
	"math/big"
	"testing"
	"time"

	"tokenmeter/billing"
)

// TestRepricedKinds breaks repricings down by token kind: the tokens are
// the period's usage now, each kind's part is within a few nano-units of
// its exact difference (now less billed), and the parts add up to the
// repricing's charge exactly, over generated lines with prices of nine
// decimals, a mid-period price change and late usage.
func TestRepricedKinds(t *testing.T) {
	at := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	line := func(kind billing.LineKind, in, cached, out uint64, prices [3]billing.Money) billing.StatementLine {
		l := billing.StatementLine{Kind: kind, Model: "m", ChargeStart: at, ChargeEnd: at.Add(time.Hour), Priced: true,
			InputTokens: in, CachedInputTokens: cached, OutputTokens: out,
			InputPer1M: prices[0], CachedInputPer1M: prices[1], OutputPer1M: prices[2]}
		exact := new(big.Rat).SetFrac(big.NewInt(int64(in-cached)*int64(prices[0])+int64(cached)*int64(prices[1])+int64(out)*int64(prices[2])), big.NewInt(1e6))
		f, _ := exact.Float64()
		l.Charge = billing.Money(f + 0.5) // near enough: the parts must add up to d whatever the lines' rounding
		return l
	}
	seed := uint64(7)
	next := func(n uint64) uint64 { seed = seed*6364136223846793005 + 1442695040888963407; return (seed >> 33) % n }
	price := func() [3]billing.Money {
		return [3]billing.Money{billing.Money(next(9_000_000_000)), billing.Money(next(3_000_000_000)), billing.Money(next(20_000_000_000))}
	}
	for range 500 {
		oldA, oldB, newA, newB := price(), price(), price(), price()
		var billed, now []billing.StatementLine
		var d billing.Money
		var want [3]*big.Int
		for k := range want {
			want[k] = new(big.Int)
		}
		for range 1 + next(3) {
			in := next(5_000_000)
			cached, out := next(in+1), next(2_000_000)
			late := next(3) == 0
			oldP, newP := oldA, newA
			if next(2) == 0 {
				oldP, newP = oldB, newB
			}
			b := line(billing.LineUsage, in, cached, out, oldP)
			if late {
				b.Kind = billing.LineAdjustment
			}
			n := line(billing.LineUsage, in, cached, out, newP)
			billed, now = append(billed, b), append(now, n)
			d += n.Charge - b.Charge
			for k, tk := range [3]uint64{in - cached, cached, out} {
				want[k].Add(want[k], new(big.Int).Mul(new(big.Int).SetUint64(tk), big.NewInt(int64(newP[k]-oldP[k]))))
			}
		}
		r := repricedKinds(d, now, billed)
		if r == nil {
			t.Fatal("no breakdown of priced lines")
		}
		var in, cached, out uint64
		for _, l := range now {
			in, cached, out = in+l.InputTokens, cached+l.CachedInputTokens, out+l.OutputTokens
		}
		if r.InputTokens != in || r.CachedInputTokens != cached || r.OutputTokens != out {
			t.Fatalf("tokens %d/%d/%d, want %d/%d/%d", r.InputTokens, r.CachedInputTokens, r.OutputTokens, in, cached, out)
		}
		parts := [3]billing.Money{r.InputCharge, r.CachedInputCharge, r.OutputCharge}
		if parts[0]+parts[1]+parts[2] != d {
			t.Fatalf("parts %v add up to %d, want the charge %d", parts, parts[0]+parts[1]+parts[2], d)
		}
		for k := range parts {
			exact := new(big.Rat).SetFrac(want[k], big.NewInt(1e6))
			diff := new(big.Rat).Sub(exact, new(big.Rat).SetInt64(int64(parts[k])))
			if diff.Abs(diff).Cmp(big.NewRat(int64(len(now))*2+2, 1)) > 0 {
				t.Fatalf("kind %d: part %d, exact %s", k, parts[k], exact.FloatString(3))
			}
		}
	}
	if r := repricedKinds(5, []billing.StatementLine{{Model: "m"}}, nil); r != nil {
		t.Errorf("unpriced lines broken down: %+v", r)
	}
}
