package billing

import (
	"cmp"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// GPUUsage is GPU time of one deployment: one sample, or samples aggregated
// by (GPUType, Pool, Region, MIGFraction, At).
type GPUUsage struct {
	GPUType, Pool, Region string
	// MIGFraction is the share of the card the sample covers: 0 or 1 for a
	// whole GPU, 1/7 for an H100 1g.10gb slice. It is taken as the simplest
	// fraction p/q (q ≤ 64) whose nearest float64 it is, so 1.0/7 costs
	// exactly a seventh; other values are taken at their exact float64 value.
	MIGFraction float64
	// At is the sample's sampled_at, the end of the interval it covers. It
	// selects the price in force.
	At time.Time
	// GPUSeconds is Σ interval_s of the card (before MIGFraction).
	GPUSeconds float64
	// BusySeconds is Σ interval_s × utilization; it is clamped to
	// [0, GPUSeconds].
	BusySeconds float64
}

// GPUCost is the GPU time and cost of one deployment-hour. Seconds are
// effective GPU-seconds: a MIG slice counts its fraction of the card.
//
// GPUSeconds, BusySeconds and IdleSeconds cover all usage, priced or not.
// The money covers priced usage only; UnpricedSeconds is the part of
// GPUSeconds that no price matched (an unknown GPU type, or a time before its
// first price): its cost is unknown, not zero. Cost = BusyCost + IdleCost
// exactly; Cost and BusyCost are each rounded once, half to even, from the
// exact sums.
type GPUCost struct {
	// Currency is the price book's.
	Currency string `json:"currency"`
	// PriceVersion is the price book's Version.
	PriceVersion    string  `json:"price_version"`
	GPUSeconds      float64 `json:"gpu_seconds"`
	BusySeconds     float64 `json:"busy_seconds"`
	IdleSeconds     float64 `json:"idle_seconds"`
	UnpricedSeconds float64 `json:"unpriced_seconds"`
	Cost            Money   `json:"cost"`
	BusyCost        Money   `json:"busy_cost"`
	IdleCost        Money   `json:"idle_cost"`
	// PriceIDs are the ids of the price entries used, sorted.
	PriceIDs []string `json:"price_ids"`
	// Groups breaks the hour down by (GPUType, Pool, Region, MIGFraction),
	// sorted by those. Their BusyCost and IdleCost add up to the hour's
	// exactly: each is the floor or the ceiling of its exact value, the
	// difference shared by largest remainder.
	Groups []GPUGroupCost `json:"groups"`
}

// GPUGroupCost is the part of a GPUCost for one (GPU type, pool, region, MIG
// fraction).
type GPUGroupCost struct {
	GPUType string `json:"gpu_type"`
	Pool    string `json:"pool"`
	Region  string `json:"region"`
	// MIGFraction is 1 for whole GPUs.
	MIGFraction     float64  `json:"mig_fraction"`
	GPUSeconds      float64  `json:"gpu_seconds"`
	BusySeconds     float64  `json:"busy_seconds"`
	IdleSeconds     float64  `json:"idle_seconds"`
	UnpricedSeconds float64  `json:"unpriced_seconds"`
	Cost            Money    `json:"cost"`
	BusyCost        Money    `json:"busy_cost"`
	IdleCost        Money    `json:"idle_cost"`
	PriceIDs        []string `json:"price_ids"`
}

// GPUCost computes the GPU time and cost of one deployment-hour from its
// usage. Each record pays the GPU price in force at its At for its GPU type,
// pool and region, so a price change inside the hour splits it: records
// before the change pay the old price, records at or after it the new one.
// Only the seconds sampled are costed; gaps in sampling cost nothing and show
// as GPUSeconds below the hour's capacity.
//
// All arithmetic is exact (float64 inputs are exact binary fractions and are
// summed as such), so the result does not depend on the order of usage.
// Errors wrap ErrInvalidUsage (negative or non-finite seconds, a MIG fraction
// outside (0, 1]) or ErrOutOfRange.
func (b *PriceBook) GPUCost(usage []GPUUsage) (GPUCost, error) {
	c, _, _, err := b.gpuCost(usage)
	return c, err
}

// gpuCost is GPUCost, with the exact (unrounded) cost and busy cost in
// nano-units besides.
func (b *PriceBook) gpuCost(usage []GPUUsage) (GPUCost, *big.Rat, *big.Rat, error) {
	type groupKey struct {
		gpuType, pool, region string
		frac                  float64
	}
	type bucket struct {
		price     int // index in b.GPUPrices, -1 for unpriced
		gpu, busy exactSum
	}
	type group struct {
		key     groupKey
		frac    *big.Rat
		cands   []int // matching entries, best first
		buckets []*bucket
	}

	groups := map[groupKey]*group{}
	var last *group
	for i, u := range usage {
		if !(u.GPUSeconds >= 0) || math.IsInf(u.GPUSeconds, 0) || math.IsNaN(u.BusySeconds) {
			return GPUCost{}, nil, nil, fmt.Errorf("%w: usage[%d]: gpu_seconds %v, busy_seconds %v", ErrInvalidUsage, i, u.GPUSeconds, u.BusySeconds)
		}
		frac := u.MIGFraction
		if frac == 0 {
			frac = 1
		}
		if !(frac > 0 && frac <= 1) {
			return GPUCost{}, nil, nil, fmt.Errorf("%w: usage[%d]: mig_fraction %v outside (0, 1]", ErrInvalidUsage, i, u.MIGFraction)
		}
		k := groupKey{u.GPUType, u.Pool, u.Region, frac}
		g := last // samples come in runs of one group; skip the map then
		if g == nil || g.key != k {
			g = groups[k]
		}
		if g == nil {
			g = &group{key: k, frac: simpleFraction(frac), cands: b.gpuCandidates(u.GPUType, u.Pool, u.Region)}
			groups[k] = g
		}
		last = g
		price := -1
		for _, c := range g.cands {
			if !b.GPUPrices[c].EffectiveFrom.After(u.At) {
				price = c
				break
			}
		}
		var bk *bucket
		for _, x := range g.buckets {
			if x.price == price {
				bk = x
				break
			}
		}
		if bk == nil {
			bk = &bucket{price: price}
			g.buckets = append(g.buckets, bk)
		}
		busy := min(max(u.BusySeconds, 0), u.GPUSeconds)
		bk.gpu.add(u.GPUSeconds)
		bk.busy.add(busy)
	}

	sorted := make([]*group, 0, len(groups))
	for _, g := range groups {
		sorted = append(sorted, g)
	}
	slices.SortFunc(sorted, func(x, y *group) int {
		return cmp.Or(
			strings.Compare(x.key.gpuType, y.key.gpuType),
			strings.Compare(x.key.pool, y.key.pool),
			strings.Compare(x.key.region, y.key.region),
			cmp.Compare(x.key.frac, y.key.frac),
		)
	})

	out := GPUCost{Currency: b.Currency, PriceVersion: b.Version(), PriceIDs: []string{}, Groups: []GPUGroupCost{}}
	var totGPU, totBusy, totUnpriced, totCost, totBusyCost big.Rat
	groupBusy := make([]*big.Rat, len(sorted))
	groupIdle := make([]*big.Rat, len(sorted))
	perHourToPerSecond := big.NewRat(1, 3600)
	for gi, g := range sorted {
		var gpu, busy, unpriced, cost, busyCost big.Rat
		ids := []string{}
		for _, bk := range g.buckets {
			gs := bk.gpu.rat()
			gs.Mul(gs, g.frac)
			bs := bk.busy.rat()
			bs.Mul(bs, g.frac)
			gpu.Add(&gpu, gs)
			busy.Add(&busy, bs)
			if bk.price < 0 {
				unpriced.Add(&unpriced, gs)
				continue
			}
			p := b.GPUPrices[bk.price]
			rate := new(big.Rat).SetInt64(int64(p.PerHour))
			rate.Mul(rate, perHourToPerSecond)
			cost.Add(&cost, gs.Mul(gs, rate))
			busyCost.Add(&busyCost, bs.Mul(bs, rate))
			ids = append(ids, p.ID())
		}
		slices.Sort(ids)
		ids = slices.Compact(ids)
		out.PriceIDs = append(out.PriceIDs, ids...)
		totGPU.Add(&totGPU, &gpu)
		totBusy.Add(&totBusy, &busy)
		totUnpriced.Add(&totUnpriced, &unpriced)
		totCost.Add(&totCost, &cost)
		totBusyCost.Add(&totBusyCost, &busyCost)
		groupBusy[gi] = new(big.Rat).Set(&busyCost)
		groupIdle[gi] = new(big.Rat).Sub(&cost, &busyCost)
		idle := new(big.Rat).Sub(&gpu, &busy)
		out.Groups = append(out.Groups, GPUGroupCost{
			GPUType:         g.key.gpuType,
			Pool:            g.key.pool,
			Region:          g.key.region,
			MIGFraction:     g.key.frac,
			GPUSeconds:      ratFloat(&gpu),
			BusySeconds:     ratFloat(&busy),
			IdleSeconds:     ratFloat(idle),
			UnpricedSeconds: ratFloat(&unpriced),
			PriceIDs:        ids,
		})
	}
	slices.Sort(out.PriceIDs)
	out.PriceIDs = slices.Compact(out.PriceIDs)

	var err error
	if out.Cost, err = moneyFromRat(&totCost); err != nil {
		return GPUCost{}, nil, nil, fmt.Errorf("gpu cost: %w", err)
	}
	if out.BusyCost, err = moneyFromRat(&totBusyCost); err != nil {
		return GPUCost{}, nil, nil, fmt.Errorf("gpu busy cost: %w", err)
	}
	out.IdleCost = out.Cost - out.BusyCost
	out.GPUSeconds = ratFloat(&totGPU)
	out.BusySeconds = ratFloat(&totBusy)
	out.IdleSeconds = ratFloat(new(big.Rat).Sub(&totGPU, &totBusy))
	out.UnpricedSeconds = ratFloat(&totUnpriced)

	busyShares := roundKeepingTotal(int64(out.BusyCost), groupBusy)
	idleShares := roundKeepingTotal(int64(out.IdleCost), groupIdle)
	for i := range out.Groups {
		out.Groups[i].BusyCost = Money(busyShares[i])
		out.Groups[i].IdleCost = Money(idleShares[i])
		out.Groups[i].Cost = out.Groups[i].BusyCost + out.Groups[i].IdleCost
	}
	return out, &totCost, &totBusyCost, nil
}

// gpuCandidates returns the indexes of the entries matching (gpuType, pool,
// region), best first: the first one in force at a time is the price then.
func (b *PriceBook) gpuCandidates(gpuType, pool, region string) []int {
	var c []int
	for i, p := range b.GPUPrices {
		if p.matches(gpuType, pool, region) {
			c = append(c, i)
		}
	}
	slices.SortStableFunc(c, func(x, y int) int {
		px, py := b.GPUPrices[x], b.GPUPrices[y]
		return cmp.Or(cmp.Compare(py.specificity(), px.specificity()), py.EffectiveFrom.Compare(px.EffectiveFrom))
	})
	return c
}

// simpleFraction returns the fraction p/q with the smallest q ≤ 64 whose
// nearest float64 is f, or f's exact value when there is none.
func simpleFraction(f float64) *big.Rat {
	for q := int64(1); q <= 64; q++ {
		p := math.Round(f * float64(q))
		if p >= 1 && p/float64(q) == f {
			return big.NewRat(int64(p), q)
		}
	}
	return new(big.Rat).SetFloat64(f)
}

func ratFloat(r *big.Rat) float64 {
	f, _ := r.Float64()
	return f
}

// exactSum adds non-negative float64 values without rounding. The sum is
// (big + hi·2^64 + lo) × 2^exp: a 128-bit accumulator takes the common case
// (values of similar magnitude) without touching big.
type exactSum struct {
	hi, lo   uint64
	big, tmp big.Int
	exp      int
	set      bool
}

// add adds f, which must be finite and ≥ 0.
func (s *exactSum) add(f float64) {
	if f == 0 {
		return
	}
	frac, e := math.Frexp(f)      // f = frac × 2^e, 0.5 ≤ frac < 1
	m := uint64(frac * (1 << 53)) // exact: a float64 has 53 significant bits
	e -= 53                       // f = m × 2^e
	tz := bits.TrailingZeros64(m)
	m >>= tz
	e += tz
	if !s.set {
		s.exp, s.set = e, true
	}
	if e < s.exp { // rescale to the finer exponent
		s.flush()
		s.big.Lsh(&s.big, uint(s.exp-e))
		s.exp = e
	}
	d := uint(e - s.exp)
	if d > 74 { // m << d would not fit in 128 bits
		s.tmp.SetUint64(m)
		s.big.Add(&s.big, s.tmp.Lsh(&s.tmp, d))
		return
	}
	var ahi, alo uint64
	if d >= 64 {
		ahi = m << (d - 64)
	} else {
		alo, ahi = m<<d, m>>(64-d) // m>>64 is 0 in Go
	}
	lo, c := bits.Add64(s.lo, alo, 0)
	hi, c := bits.Add64(s.hi, ahi, c)
	if c != 0 {
		s.flush()
		lo, hi = alo, ahi
	}
	s.lo, s.hi = lo, hi
}

// flush moves the 128-bit accumulator into big.
func (s *exactSum) flush() {
	if s.hi == 0 && s.lo == 0 {
		return
	}
	s.tmp.SetUint64(s.hi)
	s.tmp.Lsh(&s.tmp, 64)
	s.big.Add(&s.big, &s.tmp)
	s.tmp.SetUint64(s.lo)
	s.big.Add(&s.big, &s.tmp)
	s.hi, s.lo = 0, 0
}

// rat returns the sum as a new big.Rat.
func (s *exactSum) rat() *big.Rat {
	if !s.set {
		return new(big.Rat)
	}
	s.flush()
	if s.exp >= 0 {
		return new(big.Rat).SetInt(new(big.Int).Lsh(&s.big, uint(s.exp)))
	}
	den := new(big.Int).Lsh(big.NewInt(1), uint(-s.exp))
	return new(big.Rat).SetFrac(new(big.Int).Set(&s.big), den)
}
