package billing

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var hourStart = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// randomBook makes a book with wildcard, pool, region and pool+region prices
// for a few GPU types, some of which change inside the hour.
func randomBook(rng *rand.Rand) *PriceBook {
	price := func() Money {
		switch rng.IntN(4) {
		case 0:
			return Money(rng.Int64N(20)) * 500_000_000 // round amounts
		default:
			return Money(rng.Int64N(12_000_000_000)) // any nano
		}
	}
	b := &PriceBook{Currency: "USD", Allocation: DefaultPolicy()}
	b.Allocation.Weights = TokenWeights{
		Input:       Weight(rng.Int64N(3_000_000_000)),
		CachedInput: Weight(rng.Int64N(1_000_000_000)),
		Output:      Weight(1 + rng.Int64N(5_000_000_000)),
	}
	for _, gpuType := range []string{"H100", "A100", "L4"} {
		for _, pool := range []string{"", "spot", "on-demand"} {
			for _, region := range []string{"", "eu", "us"} {
				if (pool != "" || region != "") && rng.IntN(3) != 0 {
					continue
				}
				from := hourStart.Add(-time.Duration(rng.IntN(1000)) * time.Hour)
				if rng.IntN(5) == 0 { // a specific price that starts inside the hour
					from = hourStart.Add(time.Duration(rng.IntN(3600)) * time.Second)
				}
				b.GPUPrices = append(b.GPUPrices, GPUPrice{GPUType: gpuType, Pool: pool, Region: region, EffectiveFrom: from, PerHour: price()})
				for range rng.IntN(3) { // changes in the middle of the hour
					at := hourStart.Add(time.Duration(1+rng.IntN(3599)) * time.Second)
					if at.After(from) {
						b.GPUPrices = append(b.GPUPrices, GPUPrice{GPUType: gpuType, Pool: pool, Region: region, EffectiveFrom: at, PerHour: price()})
					}
				}
			}
		}
	}
	// Drop duplicate keys that the random changes may have produced.
	seen := map[string]bool{}
	kept := b.GPUPrices[:0]
	for _, p := range b.GPUPrices {
		if !seen[p.ID()] {
			seen[p.ID()] = true
			kept = append(kept, p)
		}
	}
	b.GPUPrices = kept
	return b
}

var migFractions = []float64{0, 1, 1.0 / 7, 2.0 / 7, 3.0 / 7, 4.0 / 7, 0.5, 0.25, 1.0 / 8}

func randomUsage(rng *rand.Rand) []GPUUsage {
	n := rng.IntN(60)
	if rng.IntN(10) == 0 {
		n = 0 // no samples: traffic is unattributed
	}
	out := make([]GPUUsage, n)
	for i := range out {
		gpu := 10.0
		if rng.IntN(2) == 0 {
			gpu = rng.Float64() * 600
		}
		busy := gpu * rng.Float64()
		switch rng.IntN(20) {
		case 0:
			busy = gpu * 1.2 // the caller failed to clamp
		case 1:
			busy = -1
		case 2:
			busy = gpu
		}
		out[i] = GPUUsage{
			GPUType:     []string{"H100", "A100", "L4", "B300"}[rng.IntN(4)],
			Pool:        []string{"", "spot", "on-demand"}[rng.IntN(3)],
			Region:      []string{"", "eu", "us"}[rng.IntN(3)],
			MIGFraction: migFractions[rng.IntN(len(migFractions))],
			At:          hourStart.Add(time.Duration(rng.IntN(3600)) * time.Second),
			GPUSeconds:  gpu,
			BusySeconds: busy,
		}
	}
	return out
}

func randomTenants(rng *rand.Rand) []TenantUsage {
	n := rng.IntN(30)
	perm := rng.Perm(60)
	out := make([]TenantUsage, n)
	for i := range out {
		u := TenantUsage{Tenant: fmt.Sprintf("tenant-%02d", perm[i])}
		switch rng.IntN(6) {
		case 0: // no traffic at all
		case 1: // only failed requests
			u.Requests = 1 + rng.Int64N(5)
			if rng.IntN(2) == 0 {
				u.E2EMillis = rng.Int64N(100)
			}
		default:
			u.InputTokens = rng.Int64N(100_000)
			u.CachedInputTokens = rng.Int64N(u.InputTokens + 1)
			u.OutputTokens = rng.Int64N(50_000)
			u.Requests = 1 + rng.Int64N(100)
			u.E2EMillis = rng.Int64N(1_000_000)
		}
		out[i] = u
	}
	return out
}

// referenceCost computes cost and busy cost the slow, obvious way: one
// price lookup and one exact product per record.
func referenceCost(b *PriceBook, usage []GPUUsage) (cost, busy Money, unpriced *big.Rat) {
	var c, bc big.Rat
	unpriced = new(big.Rat)
	for _, u := range usage {
		frac := u.MIGFraction
		if frac == 0 {
			frac = 1
		}
		eff := new(big.Rat).SetFloat64(u.GPUSeconds)
		eff.Mul(eff, simpleFraction(frac))
		bs := new(big.Rat).SetFloat64(min(max(u.BusySeconds, 0), u.GPUSeconds))
		bs.Mul(bs, simpleFraction(frac))
		p, ok := b.GPUPrice(u.GPUType, u.Pool, u.Region, u.At)
		if !ok {
			unpriced.Add(unpriced, eff)
			continue
		}
		rate := big.NewRat(int64(p.PerHour), 3600)
		c.Add(&c, eff.Mul(eff, rate))
		bc.Add(&bc, bs.Mul(bs, rate))
	}
	cm, _ := moneyFromRat(&c)
	bm, _ := moneyFromRat(&bc)
	return cm, bm, unpriced
}

var amountCmp = cmp.Comparer(func(a, b Amount) bool { return a.Rat().Cmp(b.Rat()) == 0 })

// TestReconciliationProperty runs thousands of random deployment-hours
// through GPUCost and every busy × idle policy and checks that the money
// adds up exactly, is never negative, matches an independent computation,
// and does not depend on the order of samples or tenants.
func TestReconciliationProperty(t *testing.T) {
	scenarios := 2000
	if testing.Short() {
		scenarios = 200
	}
	rng := rand.New(rand.NewPCG(20260301, 1))
	var grandCost, grandLines Money
	for s := range scenarios {
		book := randomBook(rng)
		if err := book.Validate(); err != nil {
			t.Fatalf("scenario %d: random book invalid: %v", s, err)
		}
		usage := randomUsage(rng)
		tenants := randomTenants(rng)

		cost, err := book.GPUCost(usage)
		if err != nil {
			t.Fatalf("scenario %d: GPUCost: %v", s, err)
		}
		wantCost, wantBusy, wantUnpriced := referenceCost(book, usage)
		if cost.Cost != wantCost || cost.BusyCost != wantBusy {
			t.Fatalf("scenario %d: cost %s busy %s, reference %s busy %s", s, cost.Cost, cost.BusyCost, wantCost, wantBusy)
		}
		if f, _ := wantUnpriced.Float64(); cost.UnpricedSeconds != f {
			t.Fatalf("scenario %d: unpriced %v, reference %v", s, cost.UnpricedSeconds, f)
		}
		checkGroups(t, cost)

		shuffledUsage := append([]GPUUsage(nil), usage...)
		rng.Shuffle(len(shuffledUsage), func(i, j int) { shuffledUsage[i], shuffledUsage[j] = shuffledUsage[j], shuffledUsage[i] })
		again, err := book.GPUCost(shuffledUsage)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprintf("%+v", cost) != fmt.Sprintf("%+v", again) {
			t.Fatalf("scenario %d: GPUCost depends on the order of usage (-first +shuffled):\n%s", s, cmp.Diff(cost, again))
		}

		for _, busyPolicy := range BusyPolicies() {
			for _, idlePolicy := range IdlePolicies() {
				p := book.Allocation
				p.Busy, p.Idle = busyPolicy, idlePolicy
				a, err := AllocateHour(cost, tenants, p)
				if err != nil {
					t.Fatalf("scenario %d %s/%s: %v", s, busyPolicy, idlePolicy, err)
				}
				checkReconciles(t, cost, a)
				checkBusyShares(t, cost, a)
				if t.Failed() {
					t.Fatalf("scenario %d %s/%s failed", s, busyPolicy, idlePolicy)
				}
				for _, l := range a.Lines {
					grandLines += l.Total
				}
				grandCost += cost.Cost

				twice, err := AllocateHour(cost, tenants, p)
				if err != nil {
					t.Fatal(err)
				}
				shuffled := append([]TenantUsage(nil), tenants...)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				other, err := AllocateHour(cost, shuffled, p)
				if err != nil {
					t.Fatal(err)
				}
				// cmp.Diff is slow; run it only to explain a difference.
				if !sameAllocation(a, twice) {
					t.Fatalf("scenario %d %s/%s: not deterministic:\n%s", s, busyPolicy, idlePolicy, cmp.Diff(a, twice, amountCmp))
				}
				if !sameAllocation(a, other) {
					t.Fatalf("scenario %d %s/%s: depends on tenant order (-sorted +shuffled):\n%s", s, busyPolicy, idlePolicy, cmp.Diff(a, other, amountCmp))
				}
			}
		}
	}
	if grandLines != grandCost {
		t.Errorf("over all scenarios lines add up to %s, GPU cost to %s", grandLines, grandCost)
	}
}

// sameAllocation reports whether two allocations are equal in every field.
func sameAllocation(a, b Allocation) bool {
	if a.BusyPolicy != b.BusyPolicy || a.IdlePolicy != b.IdlePolicy || a.Cost != b.Cost || a.Unattributed != b.Unattributed ||
		a.ZeroBasis != b.ZeroBasis || a.UnpricedSeconds != b.UnpricedSeconds || len(a.Lines) != len(b.Lines) {
		return false
	}
	for i, x := range a.Lines {
		y := b.Lines[i]
		if x.Tenant != y.Tenant || x.Busy != y.Busy || x.Idle != y.Idle || x.Total != y.Total || x.Usage != y.Usage ||
			x.Basis.Rat().Cmp(y.Basis.Rat()) != 0 {
			return false
		}
	}
	return true
}

// checkGroups checks that the per-group breakdown adds up to the hour.
func checkGroups(t *testing.T, c GPUCost) {
	t.Helper()
	var cost, busy, idle Money
	for _, g := range c.Groups {
		if g.Cost != g.BusyCost+g.IdleCost || g.BusyCost < 0 || g.IdleCost < 0 {
			t.Fatalf("group %+v: negative or busy + idle != cost", g)
		}
		cost += g.Cost
		busy += g.BusyCost
		idle += g.IdleCost
	}
	if cost != c.Cost || busy != c.BusyCost || idle != c.IdleCost {
		t.Fatalf("groups add up to %s (busy %s, idle %s), hour is %s (busy %s, idle %s)", cost, busy, idle, c.Cost, c.BusyCost, c.IdleCost)
	}
}

// checkBusyShares checks that, when the busy cost is split by basis, every
// tenant's busy share is the floor or the ceiling of its exact quota.
func checkBusyShares(t *testing.T, c GPUCost, a Allocation) {
	t.Helper()
	if a.Unattributed || a.ZeroBasis {
		return
	}
	total := new(big.Rat)
	for _, l := range a.Lines {
		total.Add(total, l.Basis.Rat())
	}
	if total.Sign() == 0 {
		return
	}
	for _, l := range a.Lines {
		if l.Tenant == IdleTenant {
			continue
		}
		q := new(big.Rat).Mul(big.NewRat(int64(c.BusyCost), 1), l.Basis.Rat())
		q.Quo(q, total)
		floor := new(big.Int).Quo(q.Num(), q.Denom()).Int64()
		if b := int64(l.Busy); b != floor && b != floor+1 {
			t.Errorf("tenant %s busy %d, quota %s", l.Tenant, b, q.FloatString(3))
		}
	}
}
