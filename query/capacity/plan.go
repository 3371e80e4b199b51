package capacity

import (
	"cmp"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"

	"tokenmeter/billing"
)

// Plan answers, for one deployment, which GPUs carry its forecast peak
// within the SLO for the least money: what a million tokens costs at the
// sustainable load on each GPU type it was measured on, and the cheapest
// whole-GPU mix of those types whose sustainable loads add up to the
// forecast peak. A model runs only on the GPU types it was measured on, so
// a deployment's mix uses no other type; the fleet's mix is the sum of its
// deployments' (each deployment carries its own peak on its own GPUs).
type Plan struct {
	Deployment string
	// LoadFor names the load sized for ("forecast peak 2027-02-22"), when
	// LoadKnown; LoadReason says why there is none.
	LoadFor             string
	LoadTokensPerSecond float64
	LoadKnown           bool
	LoadReason          string
	// Options are the GPU types: those the deployment ran on in the range,
	// then those the price book lists (a price without pool or region)
	// that it never ran on, each in name order.
	Options []GPUOption
	// Mix is the cheapest mix, when MixKnown; MixReason says why there is
	// none (no forecast, no GPU type with both an estimate and a price).
	Mix       []MixPart
	MixKnown  bool
	MixReason string
	// MixGPUs, MixTokensPerSecond and MixCostPerHourNanos are the mix's
	// totals: GPUs, sustainable tokens/s, and price per hour.
	MixGPUs             int64
	MixTokensPerSecond  float64
	MixCostPerHourNanos int64
	// MixAtMost is set when a type of the mix has only a lower bound of
	// its sustainable load: the load then needs at most these GPUs.
	MixAtMost bool
	// MixArithmetic shows the mix's sum and its cost.
	MixArithmetic string
}

// GPUOption is one GPU type for a deployment.
type GPUOption struct {
	GPUType string
	// Measured is set when the deployment ran on the type in the range.
	// Sustainable is the SLO-bounded load over the hours the deployment ran
	// on this type alone; MixedHours counts the hours it ran on this type
	// together with another, left out because their tokens cannot be split
	// between the types.
	Measured    bool
	Sustainable Sustainable
	MixedHours  int
	// Priced is set when the price book lists the type without pool or
	// region in force at the range's end: PricePerHourNanos is one GPU's
	// hourly price, PriceID the entry.
	Priced            bool
	PricePerHourNanos int64
	PriceID           string
	// CostPer1MNanos is the price of 1M tokens at the sustainable load,
	// rounded half to even to a nano-unit (an upper bound when the load is
	// a lower bound), when CostKnown; NotEnoughData says why not.
	CostKnown      bool
	CostPer1MNanos int64
	CostArithmetic string
	NotEnoughData  string
	// GPUs is what the plan's load needs of this type alone (when the load
	// and the cost are known), CostPerHourNanos their price per hour,
	// Arithmetic the computation as the GPUs-needed figures show it.
	GPUs             int64
	CostPerHourNanos int64
	Arithmetic       string
}

// MixPart is one GPU type of a mix.
type MixPart struct {
	GPUType          string
	GPUs             int64
	TokensPerSecond  float64
	CostPerHourNanos int64
}

// MaxMixLeaves bounds the mixes the exact search evaluates for one
// deployment; beyond it the plan falls back to the cheapest single type
// and says so.
const MaxMixLeaves = 20_000

// plans computes the plan of each deployment of deps (name order).
func plans(q Query, deps []*deployment) []Plan {
	out := make([]Plan, 0, len(deps))
	for _, d := range deps {
		out = append(out, plan(q, d))
	}
	return out
}

// option is a GPU type's figures with the exact rationals behind them.
type option struct {
	*GPUOption
	perGPU *big.Rat // sustainable tokens/s per GPU, exact
	price  *big.Rat // per GPU-hour, in nano-units
}

func plan(q Query, d *deployment) Plan {
	n := int(q.End.Sub(q.Start) / time.Hour)
	p := Plan{Deployment: d.name}
	hours := make([]depHour, n)
	for i, h := range d.hours {
		hours[i] = *h
	}
	tr := trend(q, hours)
	var load *big.Rat
	if f := tr.Forecast; f != nil {
		p.LoadKnown = true
		p.LoadFor = "forecast peak " + f.At.Format("2006-01-02")
		p.LoadTokensPerSecond = f.TokensPerSecond
		load = new(big.Rat).SetFloat64(f.TokensPerSecond)
	} else {
		p.LoadReason = "not enough data: no forecast peak (" + tr.Reason + ")"
	}

	var opts []*option
	measured := map[string]bool{}
	for _, t := range sortedKeys(d.types) {
		measured[t] = true
		o := &option{GPUOption: &GPUOption{GPUType: t, Measured: true}}
		typed := make([]depHour, n)
		var points []HourPoint
		for i, h := range d.hours {
			switch ts := d.hourTypes[i]; {
			case len(ts) == 1 && ts[0] == t:
				typed[i] = *h
				points = append(points, hourPoint(q, q.Start.Add(time.Duration(i)*time.Hour), h))
			case len(ts) > 1 && slices.Contains(ts, t):
				o.MixedHours++
			}
		}
		slices.SortFunc(points, func(a, b HourPoint) int { return a.Start.Compare(b.Start) })
		var at *depHour
		o.Sustainable, at = sustainable(q, points, typed)
		if o.MixedHours > 0 && !o.Sustainable.Known {
			o.Sustainable.Reason += fmt.Sprintf(" (%d hours on %s shared with another GPU type are left out: their tokens cannot be split between the types)", o.MixedHours, t)
		}
		if at != nil {
			o.perGPU = new(big.Rat).SetFrac(new(big.Int).SetUint64(at.tokens()), big.NewInt(1))
			o.perGPU.Quo(o.perGPU, new(big.Rat).SetFloat64(at.gpuSec))
		}
		opts = append(opts, o)
	}
	if q.Prices != nil {
		var listed []string
		for _, gp := range q.Prices.GPUPrices {
			if gp.Pool == "" && gp.Region == "" && !measured[gp.GPUType] && !slices.Contains(listed, gp.GPUType) {
				if _, ok := q.Prices.GPUPrice(gp.GPUType, "", "", q.End); ok {
					listed = append(listed, gp.GPUType)
				}
			}
		}
		slices.Sort(listed)
		for _, t := range listed {
			opts = append(opts, &option{GPUOption: &GPUOption{GPUType: t, Sustainable: Sustainable{
				Reason: fmt.Sprintf("not enough data: %s ran no hour on %s in the range, so its load there is not measured", d.name, t)}}})
		}
	}

	var usable []*option
	for _, o := range opts {
		if q.Prices != nil {
			if gp, ok := q.Prices.GPUPrice(o.GPUType, "", "", q.End); ok {
				o.Priced, o.PricePerHourNanos, o.PriceID = true, int64(gp.PerHour), gp.ID()
				o.price = new(big.Rat).SetInt64(int64(gp.PerHour))
			}
		}
		switch {
		case !o.Sustainable.Known:
			o.NotEnoughData = o.Sustainable.Reason
		case !o.Priced:
			o.NotEnoughData = fmt.Sprintf("no price: the price book has no price of %s without pool or region in force at %s", o.GPUType, q.End.Format(time.RFC3339))
		default:
			costPer1M(q, o)
			usable = append(usable, o)
			if load != nil {
				gpus := ceilRat(new(big.Rat).Quo(load, o.perGPU))
				o.GPUs = gpus
				o.CostPerHourNanos = mulNanos(gpus, o.PricePerHourNanos)
				loadF, _ := load.Float64()
				perGPUF, _ := o.perGPU.Float64()
				o.Arithmetic = fmt.Sprintf("ceil(%s tokens/s ÷ %s%s tokens/s per GPU) = ceil(%s) =%s %d GPUs; %d × %s = %s per hour",
					number(loadF, 1), atLeast(o), number(perGPUF, 1), new(big.Rat).Quo(load, o.perGPU).FloatString(4), atMostWord(o), gpus,
					gpus, money(o.PricePerHourNanos, q.Currency), money(o.CostPerHourNanos, q.Currency))
			}
		}
		p.Options = append(p.Options, *o.GPUOption)
	}

	switch {
	case load == nil:
		p.MixReason = p.LoadReason
	case len(usable) == 0:
		p.MixReason = "not enough data: no GPU type has both a sustainable-load estimate and a price (see each type)"
	default:
		counts, exhaustive := cheapestMix(load, usable)
		p.MixKnown = true
		var sum big.Rat
		var terms, costs []string
		for i, o := range usable {
			if counts[i] == 0 {
				continue
			}
			part := MixPart{GPUType: o.GPUType, GPUs: counts[i], CostPerHourNanos: mulNanos(counts[i], o.PricePerHourNanos)}
			tps := new(big.Rat).Mul(new(big.Rat).SetInt64(counts[i]), o.perGPU)
			sum.Add(&sum, tps)
			part.TokensPerSecond, _ = tps.Float64()
			perGPUF, _ := o.perGPU.Float64()
			p.Mix = append(p.Mix, part)
			p.MixGPUs += counts[i]
			p.MixCostPerHourNanos += part.CostPerHourNanos
			p.MixAtMost = p.MixAtMost || o.Sustainable.LowerBound
			terms = append(terms, fmt.Sprintf("%d × %s %s%s", counts[i], o.GPUType, atLeast(o), number(perGPUF, 1)))
			costs = append(costs, fmt.Sprintf("%d × %s", counts[i], money(o.PricePerHourNanos, q.Currency)))
		}
		slices.SortFunc(p.Mix, func(a, b MixPart) int { return cmp.Compare(a.GPUType, b.GPUType) })
		p.MixTokensPerSecond, _ = sum.Float64()
		loadF, _ := load.Float64()
		if p.MixGPUs == 0 {
			p.MixArithmetic = fmt.Sprintf("the %s is %s tokens/s: no GPU is needed", p.LoadFor, number(loadF, 1))
		} else {
			p.MixArithmetic = fmt.Sprintf("%s tokens/s = %s tokens/s ≥ %s tokens/s (%s); %s = %s per hour, the least of every whole-GPU mix of %s",
				strings.Join(terms, " + "), number(p.MixTokensPerSecond, 1), number(loadF, 1), p.LoadFor,
				strings.Join(costs, " + "), money(p.MixCostPerHourNanos, q.Currency), typeList(usable))
			if p.MixAtMost {
				p.MixArithmetic += "; at most this many GPUs, as a load marked ≥ is a lower bound of what a GPU sustains"
			}
		}
		if !exhaustive {
			p.MixArithmetic += fmt.Sprintf(" (the search stopped after %d mixes: this is the cheapest single GPU type, not a proven cheapest mix)", MaxMixLeaves)
		}
	}
	return p
}

// costPer1M sets the option's cost of 1M tokens at its sustainable load:
// price per GPU-hour ÷ (tokens/s per GPU × 3,600) × 1,000,000, exact, then
// rounded half to even to a nano-unit.
func costPer1M(q Query, o *option) {
	c := new(big.Rat).Mul(o.price, big.NewRat(1_000_000, 3600))
	c.Quo(c, o.perGPU)
	o.CostKnown, o.CostPer1MNanos = true, roundHalfEven(c)
	perGPUF, _ := o.perGPU.Float64()
	o.CostArithmetic = fmt.Sprintf("%s per GPU-hour ÷ (%s%s tokens/s per GPU × 3,600 s) × 1,000,000 =%s %s per 1M tokens",
		money(o.PricePerHourNanos, q.Currency), atLeast(o), number(perGPUF, 1), atMostWord(o), exactMoney(o.CostPer1MNanos, q.Currency))
}

// cheapestMix returns the GPUs of each option (in opts' order) of the
// cheapest mix whose sustainable loads add up to at least load: least
// price per hour, then fewest GPUs, then the most GPUs of the earliest
// option. It searches exactly, by branch and bound: every type but the one
// cheapest per token is enumerated (never beyond the GPUs that alone carry
// the load), that one fills the rest, and a branch is cut when its cost so
// far plus the rest at the cheapest rate per token already exceeds the
// best. exhaustive is false when MaxMixLeaves was reached: the answer is
// then the cheapest single type.
func cheapestMix(load *big.Rat, opts []*option) (counts []int64, exhaustive bool) {
	k := len(opts)
	rate := make([]*big.Rat, k) // price per tokens/s
	limit := make([]int64, k)
	for i, o := range opts {
		rate[i] = new(big.Rat).Quo(o.price, o.perGPU)
		limit[i] = ceilRat(new(big.Rat).Quo(load, o.perGPU))
	}
	cheap := 0
	for i := range opts {
		if c := rate[i].Cmp(rate[cheap]); c < 0 {
			cheap = i
		}
	}
	var (
		best      []int64
		bestCost  *big.Rat
		bestGPUs  int64
		leaves    int
		cur       = make([]int64, k)
		others    []int
		remaining = new(big.Rat)
	)
	for i := range opts {
		if i != cheap {
			others = append(others, i)
		}
	}
	better := func(cost *big.Rat, gpus int64, c []int64) bool {
		if best == nil {
			return true
		}
		if x := cost.Cmp(bestCost); x != 0 {
			return x < 0
		}
		if gpus != bestGPUs {
			return gpus < bestGPUs
		}
		for i := range c {
			if c[i] != best[i] {
				return c[i] > best[i]
			}
		}
		return false
	}
	var walk func(j int, carried, cost *big.Rat) bool
	walk = func(j int, carried, cost *big.Rat) bool {
		if j == len(others) {
			leaves++
			if leaves > MaxMixLeaves {
				return false
			}
			remaining.Sub(load, carried)
			cur[cheap] = 0
			if remaining.Sign() > 0 {
				cur[cheap] = ceilRat(new(big.Rat).Quo(remaining, opts[cheap].perGPU))
			}
			total := new(big.Rat).Add(cost, new(big.Rat).Mul(new(big.Rat).SetInt64(cur[cheap]), opts[cheap].price))
			var gpus int64
			for _, c := range cur {
				gpus += c
			}
			if better(total, gpus, cur) {
				best, bestCost, bestGPUs = slices.Clone(cur), total, gpus
			}
			return true
		}
		i := others[j]
		for c := int64(0); c <= limit[i]; c++ {
			cur[i] = c
			add := new(big.Rat).SetInt64(c)
			car := new(big.Rat).Add(carried, new(big.Rat).Mul(add, opts[i].perGPU))
			cst := new(big.Rat).Add(cost, new(big.Rat).Mul(add, opts[i].price))
			if best != nil {
				// The rest of the load costs at least the cheapest rate.
				rest := new(big.Rat).Sub(load, car)
				if rest.Sign() < 0 {
					rest.SetInt64(0)
				}
				bound := new(big.Rat).Add(cst, rest.Mul(rest, rate[cheap]))
				if bound.Cmp(bestCost) > 0 {
					break // more of this type only costs more
				}
			}
			if !walk(j+1, car, cst) {
				return false
			}
			if car.Cmp(load) >= 0 {
				break // this type alone carries the rest: more is waste
			}
		}
		cur[i] = 0
		return true
	}
	if walk(0, new(big.Rat), new(big.Rat)) {
		return best, true
	}
	single := 0
	for i := range opts {
		if mulNanos(limit[i], opts[i].PricePerHourNanos) < mulNanos(limit[single], opts[single].PricePerHourNanos) {
			single = i
		}
	}
	counts = make([]int64, k)
	counts[single] = limit[single]
	return counts, false
}

// atLeast is "≥ " for an option whose load is a lower bound.
func atLeast(o *option) string {
	if o.Sustainable.LowerBound {
		return "≥ "
	}
	return ""
}

// atMostWord is " at most" for an option whose load is a lower bound: its
// GPUs and cost are upper bounds.
func atMostWord(o *option) string {
	if o.Sustainable.LowerBound {
		return " at most"
	}
	return ""
}

// typeList names the types a mix was chosen from.
func typeList(opts []*option) string {
	names := make([]string, len(opts))
	for i, o := range opts {
		names[i] = o.GPUType
	}
	return strings.Join(names, ", ")
}

// mulNanos is n × price, saturating at the int64 range.
func mulNanos(n, price int64) int64 {
	r := new(big.Int).Mul(big.NewInt(n), big.NewInt(price))
	if !r.IsInt64() {
		return math.MaxInt64
	}
	return r.Int64()
}

// roundHalfEven is r rounded half to even to an integer, saturating at the
// int64 range.
func roundHalfEven(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	m.Lsh(m, 1)
	if c := m.Cmp(r.Denom()); c > 0 || c == 0 && q.Bit(0) == 1 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}

// exactMoney writes an amount exactly (to the nano-unit) with its currency.
func exactMoney(nanos int64, currency string) string {
	return strings.TrimSpace(currency + " " + billing.Money(nanos).String())
}

// sortedKeys is m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// fleetPlan adds up the plans' mixes.
func fleetPlan(ps []Plan) FleetPlan {
	var f FleetPlan
	byType := map[string]*MixPart{}
	for _, p := range ps {
		if !p.MixKnown {
			f.Missing = append(f.Missing, p.Deployment)
			continue
		}
		f.Deployments++
		f.GPUs += p.MixGPUs
		f.TokensPerSecond += p.MixTokensPerSecond
		f.CostPerHourNanos = addNanos(f.CostPerHourNanos, p.MixCostPerHourNanos)
		f.AtMost = f.AtMost || p.MixAtMost
		for _, m := range p.Mix {
			t := byType[m.GPUType]
			if t == nil {
				t = &MixPart{GPUType: m.GPUType}
				byType[m.GPUType] = t
			}
			t.GPUs += m.GPUs
			t.TokensPerSecond += m.TokensPerSecond
			t.CostPerHourNanos = addNanos(t.CostPerHourNanos, m.CostPerHourNanos)
		}
	}
	for _, t := range sortedKeys(byType) {
		f.Parts = append(f.Parts, *byType[t])
	}
	return f
}

// addNanos is a + b, saturating at the int64 range.
func addNanos(a, b int64) int64 {
	if a > 0 && b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
