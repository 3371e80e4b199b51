package closing

import (
	"math/big"

	"tokenmeter/billing"
)

// repricedKinds breaks a repricing's charge d down by token kind
// (billing.Repriced): now are the repriced period's lines under the book in
// force, billed what was billed for it (usage and adjustment lines), all of
// one model (and deployment). Each kind's part is its exact cost now less
// its exact cost as billed, rounded half to even to a nano-unit; the rest
// of d (the lines' own rounding, a few nano-units) goes to the kind of the
// largest part, so the parts add up to d exactly. Nil when no line of now
// is priced.
func repricedKinds(d billing.Money, now, billed []billing.StatementLine) *billing.Repriced {
	var r billing.Repriced
	var exact [3]big.Int
	priced := false
	add := func(l billing.StatementLine, neg bool) {
		if !l.Priced || l.Kind == billing.LineRepricing || l.CachedInputTokens > l.InputTokens {
			return
		}
		for k, tp := range [3]struct {
			tokens uint64
			price  billing.Money
		}{{l.InputTokens - l.CachedInputTokens, l.InputPer1M}, {l.CachedInputTokens, l.CachedInputPer1M}, {l.OutputTokens, l.OutputPer1M}} {
			term := new(big.Int).Mul(new(big.Int).SetUint64(tp.tokens), big.NewInt(int64(tp.price)))
			if neg {
				term.Neg(term)
			}
			exact[k].Add(&exact[k], term)
		}
	}
	for _, l := range now {
		if l.Priced {
			priced = true
			r.InputTokens += l.InputTokens
			r.CachedInputTokens += l.CachedInputTokens
			r.OutputTokens += l.OutputTokens
		}
		add(l, false)
	}
	if !priced {
		return nil
	}
	for _, l := range billed {
		add(l, true)
	}
	var parts [3]billing.Money
	var sum billing.Money
	largest := 0
	for k := range exact {
		parts[k] = billing.Money(halfEven(&exact[k], 1_000_000)) // 10^-15 → nano-units
		sum += parts[k]
		if abs(parts[k]) > abs(parts[largest]) {
			largest = k
		}
	}
	parts[largest] += d - sum
	r.InputCharge, r.CachedInputCharge, r.OutputCharge = parts[0], parts[1], parts[2]
	return &r
}

// halfEven is x / div rounded half to even.
func halfEven(x *big.Int, div int64) int64 {
	q, m := new(big.Int).DivMod(x, big.NewInt(div), new(big.Int)) // m ≥ 0: q is the floor
	switch c := new(big.Int).Lsh(m, 1).Cmp(big.NewInt(div)); {
	case c > 0, c == 0 && q.Bit(0) == 1:
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func abs(m billing.Money) billing.Money {
	if m < 0 {
		return -m
	}
	return m
}
