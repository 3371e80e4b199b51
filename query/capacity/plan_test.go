package capacity

import (
	"context"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"tokenmeter/billing"
)

// bruteMix enumerates every vector of GPUs with 0 ≤ n_t ≤ ceil(load/s_t)
// and returns the cheapest that carries the load: least cost, then fewest
// GPUs, then the most GPUs of the earliest type.
func bruteMix(load *big.Rat, perGPU, price []*big.Rat) []int64 {
	k := len(perGPU)
	limit := make([]int64, k)
	for i := range perGPU {
		limit[i] = ceilRat(new(big.Rat).Quo(load, perGPU[i]))
	}
	var best []int64
	var bestCost *big.Rat
	var bestGPUs int64
	cur := make([]int64, k)
	var walk func(i int)
	walk = func(i int) {
		if i == k {
			carried, cost := new(big.Rat), new(big.Rat)
			var gpus int64
			for j, n := range cur {
				carried.Add(carried, new(big.Rat).Mul(big.NewRat(n, 1), perGPU[j]))
				cost.Add(cost, new(big.Rat).Mul(big.NewRat(n, 1), price[j]))
				gpus += n
			}
			if carried.Cmp(load) < 0 {
				return
			}
			better := best == nil
			if !better {
				if c := cost.Cmp(bestCost); c != 0 {
					better = c < 0
				} else if gpus != bestGPUs {
					better = gpus < bestGPUs
				} else {
					for j := range cur {
						if cur[j] != best[j] {
							better = cur[j] > best[j]
							break
						}
					}
				}
			}
			if better {
				best, bestCost, bestGPUs = slices.Clone(cur), cost, gpus
			}
			return
		}
		for n := int64(0); n <= limit[i]; n++ {
			cur[i] = n
			walk(i + 1)
		}
		cur[i] = 0
	}
	walk(0)
	return best
}

// TestCheapestMixBruteForce: the branch-and-bound search returns the mix
// the enumeration of every mix returns, over random GPU types (loads from
// an hour's tokens over its GPU-seconds, prices in nanos, ties included).
func TestCheapestMixBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 7))
	mixed := 0
	for trial := range 1500 {
		k := 1 + rng.IntN(4)
		var opts []*option
		var perGPU, price []*big.Rat
		for range k {
			gpus := float64(1 + rng.IntN(16))
			if rng.IntN(4) == 0 {
				gpus = float64(1+rng.IntN(7)) / 7 // MIG fractions
			}
			tokens := uint64(1 + rng.IntN(5000*int(gpus*3600+1)))
			s := new(big.Rat).Quo(new(big.Rat).SetUint64(tokens), new(big.Rat).SetFloat64(gpus*3600))
			nanos := int64(1+rng.IntN(40)) * 100_000_000 // 0.1 to 4.0 per hour: ties happen
			if rng.IntN(20) == 0 {
				nanos = 0
			}
			opts = append(opts, &option{GPUOption: &GPUOption{PricePerHourNanos: nanos}, perGPU: s, price: big.NewRat(nanos, 1)})
			perGPU, price = append(perGPU, s), append(price, big.NewRat(nanos, 1))
		}
		// A load of up to ~12 GPUs of the fastest type keeps the box small.
		maxS := perGPU[0]
		for _, s := range perGPU {
			if s.Cmp(maxS) > 0 {
				maxS = s
			}
		}
		load := new(big.Rat).Mul(maxS, big.NewRat(int64(rng.IntN(1200)), 100))
		if trial%50 == 0 {
			load = new(big.Rat).Mul(perGPU[0], big.NewRat(int64(1+rng.IntN(6)), 1)) // exact multiples
		}
		box := int64(1)
		for _, s := range perGPU {
			box *= 1 + ceilRat(new(big.Rat).Quo(load, s))
		}
		if box > 3_000 {
			continue
		}
		got, exhaustive := cheapestMix(load, opts)
		want := bruteMix(load, perGPU, price)
		if !exhaustive || !slices.Equal(got, want) {
			t.Fatalf("trial %d: load %s, per GPU %v, prices %v: mix %v (exhaustive %v), brute force %v", trial, load.FloatString(3), perGPU, price, got, exhaustive, want)
		}
		used := 0
		for _, n := range got {
			if n > 0 {
				used++
			}
		}
		if used > 1 {
			mixed++
		}
	}
	if mixed < 50 {
		t.Errorf("only %d trials chose a mix of types: the test does not exercise mixing", mixed)
	}
}

// planFleet is a month of one deployment, "chat", on two GPU types: H100
// on even days (8 GPUs, knee 2,000 tokens/s per GPU), A100 on odd days (16
// GPUs, knee 900), and every day's first hour on both (mixed), with
// traffic growing week over week; "tiny" has a few hours only.
func planFleet(t *testing.T) (*fleet, map[int]uint64, Query) {
	t.Helper()
	f := &fleet{}
	rng := rand.New(rand.NewPCG(5, 6))
	const days = 28
	tokens := map[int]uint64{}
	for i := range days * 24 {
		at := day0.Add(time.Duration(i) * time.Hour)
		day := i / 24
		grow := 1 + float64(day)/28
		gpus, typ, knee, price := uint32(8), "H100", 2000.0, int64(2_990_000_000)
		if day%2 == 1 {
			gpus, typ, knee, price = 16, "A100", 900.0, 1_290_000_000
		}
		load := knee * grow * (0.3 + 0.7*rng.Float64()) // per GPU
		tok := uint64(load * float64(gpus) * 3600)
		tokens[i] = tok
		good := uint64(1000)
		if load > knee {
			good = 900
		}
		util := 0.5 + 0.45*rng.Float64()
		f.gpuHour("chat", typ, at, gpus, util, price)
		if i%24 == 0 {
			f.gpuHour("chat", "L4", at, 4, util, 800_000_000) // mixed hour
		}
		f.traffic("llama", "chat", at, 1000, good, tok/3, tok-tok/3)
		if i < 20 {
			f.gpuHour("tiny", "L4", at, 1, 0.5, 800_000_000)
			f.traffic("small", "tiny", at, 500, 500, 100_000, 100_000)
		}
	}
	return f, tokens, Query{Start: day0, End: day0.Add(days * 24 * time.Hour), Currency: "USD", Prices: &billing.PriceBook{Currency: "USD", GPUPrices: []billing.GPUPrice{
		{GPUType: "H100", EffectiveFrom: day0, PerHour: 2_990_000_000},
		{GPUType: "H100", Pool: "reserved", EffectiveFrom: day0, PerHour: 1_990_000_000},
		{GPUType: "A100", EffectiveFrom: day0, PerHour: 1_290_000_000},
		{GPUType: "L4", EffectiveFrom: day0, PerHour: 800_000_000},
		{GPUType: "B200", EffectiveFrom: day0, PerHour: 6_000_000_000},
		{GPUType: "MI300", EffectiveFrom: day0.Add(90 * 24 * time.Hour), PerHour: 1}, // not yet in force
	}}}
}

// TestFleetPlanExact: each GPU type's sustainable load is the one a
// deployment that ran on that type alone gets; its cost per 1M tokens is
// the list price over that load, exact to the nano; the mix is the brute
// force's over the priced, estimated types for the forecast peak; types
// without an estimate say "not enough data".
func TestFleetPlanExact(t *testing.T) {
	f, tokens, q := planFleet(t)
	r, err := Build(context.Background(), f, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Plans) != 2 || r.Plans[0].Deployment != "chat" || r.Plans[1].Deployment != "tiny" {
		t.Fatalf("plans %+v, want chat and tiny", r.Plans)
	}
	p := r.Plans[0]
	var names []string
	for _, o := range p.Options {
		names = append(names, o.GPUType)
	}
	// Measured types in name order, then the book's other list-priced types
	// in force (not the pool price, not MI300 from the future).
	if want := []string{"A100", "H100", "L4", "B200"}; !slices.Equal(names, want) {
		t.Fatalf("options %v, want %v", names, want)
	}
	chat := unit(t, r, "chat")
	if !p.LoadKnown || chat.Trend.Forecast == nil || p.LoadTokensPerSecond != chat.Trend.Forecast.TokensPerSecond || !strings.HasPrefix(p.LoadFor, "forecast peak ") {
		t.Fatalf("plan load %v %q (known %v), want the unit's forecast %+v", p.LoadTokensPerSecond, p.LoadFor, p.LoadKnown, chat.Trend.Forecast)
	}
	load := new(big.Rat).SetFloat64(p.LoadTokensPerSecond)

	var perGPU, price []*big.Rat
	for _, o := range p.Options[:2] {
		// The reference: the same hours on this type alone, as a report.
		alone := &fleet{}
		for _, g := range f.gpu {
			if g.Group["deployment"] == "chat" && g.Group["gpu_type"] == o.GPUType && int(g.Start.Sub(day0)/time.Hour)%24 != 0 {
				alone.gpu = append(alone.gpu, g)
			}
		}
		for _, u := range f.use {
			i := int(u.Start.Sub(day0) / time.Hour)
			if u.Group["deployment"] == "chat" && i%24 != 0 && (i/24%2 == 1) == (o.GPUType == "A100") {
				alone.use = append(alone.use, u)
			}
		}
		ref, err := Build(context.Background(), alone, Query{Start: q.Start, End: q.End})
		if err != nil {
			t.Fatal(err)
		}
		want := unit(t, ref, "chat").Sustainable
		if !o.Measured || o.Sustainable != want || !want.Known || want.LowerBound {
			t.Fatalf("%s: sustainable %+v, want %+v (known, not a lower bound)", o.GPUType, o.Sustainable, want)
		}
		if o.MixedHours != 14 { // each day's first hour, shared with L4
			t.Errorf("%s: %d mixed hours, want 14", o.GPUType, o.MixedHours)
		}
		// Cost per 1M tokens from the estimate's hour, exact.
		i := int(want.Hour.Sub(day0) / time.Hour)
		gpus := int64(8)
		if o.GPUType == "A100" {
			gpus = 16
		}
		s := big.NewRat(int64(tokens[i]), gpus*3600)
		pr := big.NewRat(2_990_000_000, 1)
		if o.GPUType == "A100" {
			pr = big.NewRat(1_290_000_000, 1)
		}
		cost := new(big.Rat).Quo(new(big.Rat).Mul(pr, big.NewRat(1_000_000, 3600)), s)
		if !o.CostKnown || o.CostPer1MNanos != roundHalfEven(cost) || !o.Priced || o.PricePerHourNanos != pr.Num().Int64() {
			t.Errorf("%s: cost per 1M %d (known %v), want %s nanos at %s per hour", o.GPUType, o.CostPer1MNanos, o.CostKnown, cost.FloatString(3), pr)
		}
		if o.PriceID != "gpu:"+o.GPUType+"|*|*@"+day0.Format(time.RFC3339) {
			t.Errorf("%s: price id %q", o.GPUType, o.PriceID)
		}
		if !strings.Contains(o.CostArithmetic, "per GPU-hour ÷ (") || !strings.Contains(o.CostArithmetic, "USD "+billing.Money(o.CostPer1MNanos).String()+" per 1M tokens") {
			t.Errorf("%s: cost arithmetic %q", o.GPUType, o.CostArithmetic)
		}
		if wantGPUs := ceilRat(new(big.Rat).Quo(load, s)); o.GPUs != wantGPUs || o.CostPerHourNanos != wantGPUs*pr.Num().Int64() ||
			!strings.HasSuffix(o.Arithmetic, billing.Money(o.CostPerHourNanos).StringFixed(2)+" per hour") {
			t.Errorf("%s: %d GPUs, %d per hour (%q), want %d GPUs", o.GPUType, o.GPUs, o.CostPerHourNanos, o.Arithmetic, wantGPUs)
		}
		perGPU, price = append(perGPU, s), append(price, pr)
	}
	// L4 ran only in mixed hours: not enough data; B200 never ran.
	if l4 := p.Options[2]; !l4.Measured || l4.Sustainable.Known || l4.MixedHours != 28 || l4.CostKnown ||
		!strings.HasPrefix(l4.NotEnoughData, "not enough data") || !strings.Contains(l4.NotEnoughData, "28 hours on L4 shared with another GPU type") {
		t.Errorf("L4 option %+v", l4)
	}
	if b := p.Options[3]; b.Measured || b.CostKnown || !b.Priced || !strings.Contains(b.NotEnoughData, "ran no hour on B200") {
		t.Errorf("B200 option %+v", b)
	}
	want := bruteMix(load, perGPU, price)
	var got []int64
	for _, typ := range []string{"A100", "H100"} {
		i := slices.IndexFunc(p.Mix, func(m MixPart) bool { return m.GPUType == typ })
		if i < 0 {
			got = append(got, 0)
		} else {
			got = append(got, p.Mix[i].GPUs)
		}
	}
	if !p.MixKnown || !slices.Equal(got, want) || p.MixAtMost {
		t.Fatalf("mix %+v (%v), want %v", p.Mix, got, want)
	}
	wantCost := want[0]*1_290_000_000 + want[1]*2_990_000_000
	if p.MixCostPerHourNanos != wantCost || p.MixGPUs != want[0]+want[1] {
		t.Errorf("mix cost %d, GPUs %d; want %d, %d", p.MixCostPerHourNanos, p.MixGPUs, wantCost, want[0]+want[1])
	}
	if !strings.Contains(p.MixArithmetic, "≥ "+number(p.LoadTokensPerSecond, 1)+" tokens/s") || !strings.Contains(p.MixArithmetic, "USD "+billing.Money(wantCost).StringFixed(2)+" per hour") {
		t.Errorf("mix arithmetic %q", p.MixArithmetic)
	}
	// tiny: a day of data, no forecast and no estimate.
	if tp := r.Plans[1]; tp.LoadKnown || tp.MixKnown || !strings.HasPrefix(tp.MixReason, "not enough data") || tp.Options[0].CostKnown {
		t.Errorf("tiny plan %+v", tp)
	}
	if fp := r.FleetPlan; fp.Deployments != 1 || fp.GPUs != p.MixGPUs || fp.CostPerHourNanos != wantCost || !slices.Equal(fp.Missing, []string{"tiny"}) {
		t.Errorf("fleet plan %+v", fp)
	}
}

// TestPlanLowerBound: a deployment that never missed its target has only a
// lower bound of its load: the cost per 1M tokens and the mix are upper
// bounds, written with ≥ and "at most".
func TestPlanLowerBound(t *testing.T) {
	f := &fleet{}
	for i := range 28 * 24 {
		at := day0.Add(time.Duration(i) * time.Hour)
		f.gpuHour("calm", "H100", at, 2, 0.5, 2_000_000_000)
		tok := uint64(1000+i) * 3600
		f.traffic("m", "calm", at, 200, 200, tok/2, tok-tok/2)
	}
	q := Query{Start: day0, End: day0.Add(28 * 24 * time.Hour), Currency: "EUR",
		Prices: &billing.PriceBook{Currency: "EUR", GPUPrices: []billing.GPUPrice{{GPUType: "H100", EffectiveFrom: day0, PerHour: 2_000_000_000}}}}
	r, err := Build(context.Background(), f, q)
	if err != nil {
		t.Fatal(err)
	}
	o := r.Plans[0].Options[0]
	if !o.Sustainable.LowerBound || !o.CostKnown || !strings.Contains(o.CostArithmetic, "(≥ ") || !strings.Contains(o.CostArithmetic, "= at most EUR ") {
		t.Errorf("option %+v", o)
	}
	if p := r.Plans[0]; !p.MixKnown || !p.MixAtMost || !strings.Contains(p.MixArithmetic, "at most this many GPUs") || !r.FleetPlan.AtMost {
		t.Errorf("plan %+v", p)
	}
}

// TestPlanWithoutPrices: without a price book every measured type says why
// it has no cost, and there is no mix.
func TestPlanWithoutPrices(t *testing.T) {
	f, _, q := planFleet(t)
	q.Prices = nil
	r, err := Build(context.Background(), f, q)
	if err != nil {
		t.Fatal(err)
	}
	p := r.Plans[0]
	if len(p.Options) != 3 || p.MixKnown || !strings.HasPrefix(p.MixReason, "not enough data") {
		t.Fatalf("plan %+v", p)
	}
	if o := p.Options[1]; o.CostKnown || o.Priced || !strings.HasPrefix(o.NotEnoughData, "no price: ") || !o.Sustainable.Known {
		t.Errorf("H100 option %+v", o)
	}
}

// TestHotBand: the hot band pools the qualifying hours above 90%
// utilization, brute force over random hours; the finding is there exactly
// when their attainment is below the target and below the other hours'.
func TestHotBand(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 99))
		f := &fleet{}
		var want HotBand
		for i := range 72 {
			at := day0.Add(time.Duration(i) * time.Hour)
			util := 0.6 + 0.39*rng.Float64()
			if rng.IntN(3) == 0 {
				util = 0.9 // the boundary is not hot
			}
			requests := uint64(50 + rng.IntN(200))
			good := requests
			if util > 0.9 && seed%2 == 0 || rng.IntN(10) == 0 {
				good = requests * uint64(90+rng.IntN(10)) / 100
			}
			f.gpuHour("d", "H100", at, 4, util, 1_000_000_000)
			f.traffic("m", "d", at, requests, good, 1000, 1000)
			if requests < 100 {
				continue // not qualifying
			}
			if p := hourPoint(Query{MinHourRequests: 100}, at, &depHour{gpuSec: 4 * 3600, busySec: 4 * 3600 * util, requests: requests}); p.Utilization > 0.9 {
				want.Hours++
				want.Requests += requests
				want.GoodRequests += good
			} else {
				want.OtherHours++
				want.OtherRequests += requests
				want.OtherGoodRequests += good
			}
		}
		r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(72 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		u := unit(t, r, "d")
		if u.Hot != want {
			t.Fatalf("seed %d: hot band %+v, want %+v", seed, u.Hot, want)
		}
		// good/requests < 0.99 and < otherGood/otherRequests, in integers.
		drops := want.Requests > 0 && 100*want.GoodRequests < 99*want.Requests &&
			(want.OtherRequests == 0 || want.GoodRequests*want.OtherRequests < want.OtherGoodRequests*want.Requests)
		if got := hasFinding(r, "d", KindHot, 2); got != drops {
			t.Errorf("seed %d: hot finding %v, want %v (band %+v; findings %+v)", seed, got, drops, want, r.Findings)
		}
	}
}

// TestPlansBounded: a model unit of three deployments with max_units 2
// plans the two with the most GPU time and counts the third.
func TestPlansBounded(t *testing.T) {
	f := &fleet{}
	for i := range 48 {
		at := day0.Add(time.Duration(i) * time.Hour)
		for dep, gpus := range map[string]uint32{"a": 1, "b": 4, "c": 2} {
			f.gpuHour(dep, "H100", at, gpus, 0.5, 1_000_000_000)
			f.traffic("m", dep, at, 100, 100, 1000, 1000)
		}
	}
	r, err := Build(context.Background(), f, Query{Start: day0, End: day0.Add(48 * time.Hour), GroupBy: ByModel, MaxUnits: 2})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range r.Plans {
		names = append(names, p.Deployment)
	}
	if !slices.Equal(names, []string{"b", "c"}) || r.PlansOmitted != 1 || len(r.Units) != 1 || r.Units[0].DeploymentCount != 3 {
		t.Errorf("plans %v, %d omitted; want b and c, 1 omitted", names, r.PlansOmitted)
	}
}

// TestCheapestMixGivesUp: two types at the same price per token and a load
// of a million GPUs: every split costs the same, the search stops after
// MaxMixLeaves and answers the cheapest single type, saying so.
func TestCheapestMixGivesUp(t *testing.T) {
	mk := func(perGPU, price int64) *option {
		return &option{GPUOption: &GPUOption{PricePerHourNanos: price}, perGPU: big.NewRat(perGPU, 1), price: big.NewRat(price, 1)}
	}
	counts, exhaustive := cheapestMix(big.NewRat(1_000_000, 1), []*option{mk(1, 1), mk(2, 2)})
	if exhaustive || !slices.Equal(counts, []int64{1_000_000, 0}) {
		t.Errorf("mix %v (exhaustive %v), want the first type alone, not exhaustive", counts, exhaustive)
	}
}
