package billing

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"
)

// Contract is a tenant's contract (tenants[].contract in the billing
// accounts file): what it pays instead of list prices. Its JSON form:
//
//	"contract": {
//	  "discount_percent": "5",
//	  "rate_card": [
//	    {"model": "llama-3.1-70b", "effective_from": "2026-11-01T00:00:00Z",
//	     "input_per_1m": "1.5", "output_per_1m": "3", "discount_percent": "10"},
//	    {"model": "llama-3.1-70b", "deployment": "eu-1", "effective_from": "2026-11-15T00:00:00Z",
//	     "output_per_1m": "2.5"}
//	  ],
//	  "allowances": [{"model": "llama-3.1-8b", "token_kind": "input", "tokens": 10000000}],
//	  "tiers": [{"model": "llama-3.1-70b", "tiers": [
//	    {"up_to": 100000000},
//	    {"up_to": 1000000000, "discount_percent": "20"},
//	    {"output_per_1m": "1.2"}]}],
//	  "commitment": {"monthly_spend": "5000"},
//	  "dedicated": [{"deployment": "acme-dedicated", "effective_from": "2026-11-01T00:00:00Z",
//	                 "per_gpu_hour": "2.4"}]
//	}
//
// Every field is optional; amounts are decimal strings (Money), percents
// decimal strings from "0" to "100" ("12.5" is 12.5%), token counts JSON
// integers, times RFC 3339.
//
// # How a statement is priced under a contract (Contract.Apply)
//
// The list-price lines stay as they are; the contract adds Charges. Each
// token of a priced usage or adjustment line gets a contracted price per
// 1M tokens, by the first rule that applies:
//
//  1. Dedicated: a token served by a deployment the contract has a
//     dedicated entry for (in force at the line's start) costs 0: the
//     tenant pays that deployment's GPU-hours instead (ChargeDedicated).
//     Such tokens count toward no allowance and no tier.
//  2. Allowance: the first `tokens` tokens of the period of the model
//     (and token kind; an allowance without a kind takes every kind, after
//     the kind's own allowance) cost 0.
//  3. Otherwise the base price is the tier's price for the token kind
//     (a model with tiers; the token's position among the model's tokens
//     of the period picks the tier), else the rate card's
//     (the entry in force at the line's start for its model and
//     deployment, an entry naming the deployment before one that does not,
//     then the latest), else the list price. Then the percentage discounts
//     multiply it, in this order: the tier's, the rate-card entry's, the
//     contract's (discount_percent). The price is rounded half to even to
//     a nano-unit per 1M tokens once, after all of them.
//
// Order of the period's tokens (allowances and tiers): the usage lines of a
// model by ChargeStart, then deployment, then line index; within a line
// uncached input, then cached input, then output. Tier positions count
// every token of the model's usage lines that is not dedicated, free ones
// included: a tier with up_to 100000000 covers the first 100M tokens of the
// period, whatever part of them an allowance made free. Tokens beyond the
// last tier's up_to (when it has one) are priced as without tiers.
//
// Late usage (adjustment lines) is priced as the rest of the period it
// belongs to, by the same rules: its lines are cut where a rate-card or
// dedicated entry took effect (each part under the entry in force at its
// start; a late slice that spans one, from a period billed before the
// entry was written, goes whole to the entry at its start), and its tokens
// come after every token already billed for that period: the period's
// usage lines, then the adjustment lines for it of later statements
// (oldest first), then this statement's, each set in the order above
// (LateBasis; ApplyLate). So they take what the period's allowances left
// unused and the tier their position reaches. The allowances and tiers
// are the contract's now (an edited contract re-counts the period under
// its new terms), and a late token is last of its period, not at the
// position its timestamp would have given it: the tier prices of tokens
// billed before are not revisited (a limitation; the tokens of each tier
// are still exact).
//
// A repricing line (an admin's repricing, package closing) keeps its
// list-price difference as Charge (its Repriced kinds add up to it); under
// a contract the caller also computes what the contract changes in it
// (StatementUsage.RepricingDiscount: the contract's discounts of the
// period's usage now, priced under the statement's book, less those under
// the book that billed it, per token kind), which become
// the line's discount charges (rule contract_repricing; Amount may be
// positive): its ContractedCharge is the contracted difference, 0 for
// tokens at a fixed rate-card price, dedicated or free, half the list
// difference under a 50% discount. Repricings are not set against a
// commitment (a limitation). Unpriced lines stay as they are.
//
// Charges and rounding (all amounts in nano-units):
//
//   - A line's tokens of one kind are partitioned by contracted price and
//     rule: one ChargeDiscount per (line, token kind, rule) whose price
//     differs from list, with Quantity tokens at UnitPrice (per 1M), so no
//     token is under two charges and tokens under none are at list price.
//   - A line's contracted charge is its exact contracted cost (Σ tokens ×
//     price / 1M over its kinds) rounded half to even once, like its list
//     Charge (StatementLine.ContractedCharge; Discount = contracted − list).
//   - Each discount's Amount is its exact difference (tokens × (contracted
//     − list) / 1M) rounded half to even, except the line's last discount,
//     which takes the rest of the line's Discount: the discounts of a line
//     add up to it exactly (a line made wholly free is exactly 0).
//   - A dedicated deployment's GPU-hours are read per UTC hour that starts
//     in the period (GPUMicroHours: millionths of a GPU-hour, rounded half
//     to even per hour); one ChargeDedicated per deployment and rate entry,
//     Amount = micro-hours × per_gpu_hour / 1e6 rounded half to even once.
//   - The commitment's spend is the contracted charges of the usage lines
//     (adjustments belong to earlier periods) plus the dedicated charges;
//     when it is below monthly_spend, a ChargeCommitment bills the
//     difference (exact: both are nano-units).
//   - Late usage of a period that closed with a true-up is not billed
//     twice: the sum of its lines' contracted charges absorbs what is left
//     of that period's true-up (LateBasis.TrueUp: its statement's
//     commitment charge less what late usage of it absorbed since), as a
//     negative ChargeCommitment with OriginalPeriod the period, of
//     min(late charges, true-up left). Over all its statements the tenant
//     pays max(commitment, spend) for the period.
//
// The statement's Charge is then Σ lines' Charge + Σ charges' Amount,
// exactly; Total is Charge rounded once to the minor unit (Settle).
type Contract struct {
	// DiscountPercent applies to every token priced by rule 3.
	DiscountPercent Weight `json:"discount_percent,omitempty"`
	// RateCard overrides list prices, per model and optionally deployment,
	// from EffectiveFrom.
	RateCard []RateCardEntry `json:"rate_card,omitempty"`
	// Allowances are free tokens per period.
	Allowances []Allowance `json:"allowances,omitempty"`
	// Tiers are graduated prices per model over the period's tokens.
	Tiers []TierSchedule `json:"tiers,omitempty"`
	// Commitment is a committed monthly spend.
	Commitment *Commitment `json:"commitment,omitempty"`
	// Dedicated lists deployments billed per GPU-hour.
	Dedicated []DedicatedDeployment `json:"dedicated,omitempty"`
}

// RateCardEntry is one effective-dated override of a model's list price:
// the prices it sets (nil: list) and a percentage discount.
type RateCardEntry struct {
	Model string `json:"model"`
	// Deployment limits the entry to one deployment; empty: any.
	Deployment       string    `json:"deployment,omitempty"`
	EffectiveFrom    time.Time `json:"effective_from"`
	InputPer1M       *Money    `json:"input_per_1m,omitempty"`
	CachedInputPer1M *Money    `json:"cached_input_per_1m,omitempty"`
	OutputPer1M      *Money    `json:"output_per_1m,omitempty"`
	DiscountPercent  Weight    `json:"discount_percent,omitempty"`
}

// ID names the entry in charges' Rule: "rate_card:model[/deployment]@from".
func (e RateCardEntry) ID() string {
	s := "rate_card:" + e.Model
	if e.Deployment != "" {
		s += "/" + e.Deployment
	}
	return s + "@" + formatTime(e.EffectiveFrom)
}

// Allowance is a number of free tokens of a model per period; TokenKind
// ("input", "cached_input", "output") limits it to one kind, empty: all.
type Allowance struct {
	Model     string `json:"model"`
	TokenKind string `json:"token_kind,omitempty"`
	Tokens    uint64 `json:"tokens"`
}

// TierSchedule is a model's graduated prices over the period's tokens.
type TierSchedule struct {
	Model string `json:"model"`
	Tiers []Tier `json:"tiers"`
}

// Tier is one band of a TierSchedule: the tokens from the previous tier's
// UpTo (0 for the first) up to UpTo (0: no bound, last tier only), at the
// prices it sets (nil: rate card or list) less its discount.
type Tier struct {
	UpTo             uint64 `json:"up_to,omitempty"`
	InputPer1M       *Money `json:"input_per_1m,omitempty"`
	CachedInputPer1M *Money `json:"cached_input_per_1m,omitempty"`
	OutputPer1M      *Money `json:"output_per_1m,omitempty"`
	DiscountPercent  Weight `json:"discount_percent,omitempty"`
}

// Commitment is a committed spend per monthly period.
type Commitment struct {
	MonthlySpend Money `json:"monthly_spend"`
}

// DedicatedDeployment bills a deployment's GPU-hours at PerGPUHour from
// EffectiveFrom; the tenant's tokens on it are free (rule 1).
type DedicatedDeployment struct {
	Deployment    string    `json:"deployment"`
	EffectiveFrom time.Time `json:"effective_from"`
	PerGPUHour    Money     `json:"per_gpu_hour"`
}

// ID names the entry in charges' Rule: "dedicated:deployment@from".
func (d DedicatedDeployment) ID() string {
	return "dedicated:" + d.Deployment + "@" + formatTime(d.EffectiveFrom)
}

// Token kinds of Charge.TokenKind and Allowance.TokenKind, in the order a
// line's tokens are counted.
const (
	TokenInput       = "input"
	TokenCachedInput = "cached_input"
	TokenOutput      = "output"
)

var tokenKinds = [3]string{TokenInput, TokenCachedInput, TokenOutput}

// hundredPercent is 100 as a Weight.
const hundredPercent = Weight(100 * nanosPerUnit)

// validate returns every problem of c, each naming its field.
func (c *Contract) validate() []error {
	var errs []error
	add := func(path string, err error) { errs = append(errs, fmt.Errorf("%s: %w", path, err)) }
	pct := func(path string, w Weight) {
		if w < 0 || w > hundredPercent {
			add(path, fmt.Errorf("%w: %s is not a percent from 0 to 100", ErrInvalidField, w))
		}
	}
	price := func(path string, m *Money) {
		if m != nil && *m < 0 {
			add(path, fmt.Errorf("%w: %s", ErrNegativePrice, *m))
		}
	}
	pct("discount_percent", c.DiscountPercent)
	type rcKey struct{ model, dep, from string }
	seenRC := map[rcKey]int{}
	for i, e := range c.RateCard {
		path := fmt.Sprintf("rate_card[%d]", i)
		checkName(add, path+".model", e.Model, true)
		checkName(add, path+".deployment", e.Deployment, false)
		checkEffectiveFrom(add, path+".effective_from", e.EffectiveFrom)
		price(path+".input_per_1m", e.InputPer1M)
		price(path+".cached_input_per_1m", e.CachedInputPer1M)
		price(path+".output_per_1m", e.OutputPer1M)
		pct(path+".discount_percent", e.DiscountPercent)
		if e.InputPer1M == nil && e.CachedInputPer1M == nil && e.OutputPer1M == nil && e.DiscountPercent == 0 {
			add(path, fmt.Errorf("%w: the entry sets no price and no discount", ErrMissingField))
		}
		k := rcKey{e.Model, e.Deployment, formatTime(e.EffectiveFrom)}
		if j, ok := seenRC[k]; ok {
			add(path, fmt.Errorf("%w: same model, deployment and effective_from as rate_card[%d]", ErrDuplicatePrice, j))
		} else {
			seenRC[k] = i
		}
	}
	type alKey struct{ model, kind string }
	seenAl := map[alKey]int{}
	for i, a := range c.Allowances {
		path := fmt.Sprintf("allowances[%d]", i)
		checkName(add, path+".model", a.Model, true)
		if a.TokenKind != "" && !slices.Contains(tokenKinds[:], a.TokenKind) {
			add(path+".token_kind", fmt.Errorf("%w: %q: want input, cached_input, output or nothing (every kind)", ErrInvalidField, a.TokenKind))
		}
		if a.Tokens == 0 {
			add(path+".tokens", ErrMissingField)
		}
		if a.Tokens > math.MaxInt64 {
			add(path+".tokens", fmt.Errorf("%w: above 2^63-1", ErrInvalidField))
		}
		k := alKey{a.Model, a.TokenKind}
		if j, ok := seenAl[k]; ok {
			add(path, fmt.Errorf("%w: same model and token_kind as allowances[%d]", ErrDuplicatePrice, j))
		} else {
			seenAl[k] = i
		}
	}
	seenTier := map[string]int{}
	for i, s := range c.Tiers {
		path := fmt.Sprintf("tiers[%d]", i)
		checkName(add, path+".model", s.Model, true)
		if j, ok := seenTier[s.Model]; ok && s.Model != "" {
			add(path+".model", fmt.Errorf("%w: tiers[%d] is for the same model", ErrDuplicatePrice, j))
		} else {
			seenTier[s.Model] = i
		}
		if len(s.Tiers) == 0 {
			add(path+".tiers", ErrMissingField)
		}
		var prev uint64
		for j, t := range s.Tiers {
			tp := fmt.Sprintf("%s.tiers[%d]", path, j)
			last := j == len(s.Tiers)-1
			switch {
			case t.UpTo == 0 && !last:
				add(tp+".up_to", fmt.Errorf("%w: only the last tier may be unbounded", ErrMissingField))
			case t.UpTo != 0 && t.UpTo <= prev:
				add(tp+".up_to", fmt.Errorf("%w: %d is not above the previous tier's %d", ErrInvalidField, t.UpTo, prev))
			case t.UpTo > math.MaxInt64:
				add(tp+".up_to", fmt.Errorf("%w: above 2^63-1", ErrInvalidField))
			}
			prev = t.UpTo
			price(tp+".input_per_1m", t.InputPer1M)
			price(tp+".cached_input_per_1m", t.CachedInputPer1M)
			price(tp+".output_per_1m", t.OutputPer1M)
			pct(tp+".discount_percent", t.DiscountPercent)
		}
	}
	if c.Commitment != nil && c.Commitment.MonthlySpend <= 0 {
		add("commitment.monthly_spend", fmt.Errorf("%w: want an amount above 0", ErrInvalidField))
	}
	type dKey struct{ dep, from string }
	seenD := map[dKey]int{}
	for i, d := range c.Dedicated {
		path := fmt.Sprintf("dedicated[%d]", i)
		checkName(add, path+".deployment", d.Deployment, true)
		checkEffectiveFrom(add, path+".effective_from", d.EffectiveFrom)
		if d.PerGPUHour < 0 {
			add(path+".per_gpu_hour", fmt.Errorf("%w: %s", ErrNegativePrice, d.PerGPUHour))
		}
		k := dKey{d.Deployment, formatTime(d.EffectiveFrom)}
		if j, ok := seenD[k]; ok {
			add(path, fmt.Errorf("%w: same deployment and effective_from as dedicated[%d]", ErrDuplicatePrice, j))
		} else {
			seenD[k] = i
		}
	}
	return errs
}

// Validate returns every problem of c joined, each naming its field and
// wrapping ErrInvalidAccounts.
func (c *Contract) Validate() error {
	var errs []error
	for _, err := range c.validate() {
		errs = append(errs, fmt.Errorf("%w: contract: %w", ErrInvalidAccounts, err))
	}
	return errors.Join(errs...)
}

// NamesDeployments reports whether c prices some deployment apart (a
// rate-card entry or dedicated entry naming one): its statements must be
// computed per deployment.
func (c *Contract) NamesDeployments() bool {
	if c == nil {
		return false
	}
	return len(c.Dedicated) > 0 || slices.ContainsFunc(c.RateCard, func(e RateCardEntry) bool { return e.Deployment != "" })
}

// Cuts are the instants in (from, to) at which a rate-card or dedicated
// entry takes effect: usage must be cut there (and lines are, by
// ComputeContractStatement) so that each line lies under one entry.
func (c *Contract) Cuts(from, to time.Time) []time.Time {
	if c == nil {
		return nil
	}
	var out []time.Time
	for _, e := range c.RateCard {
		out = append(out, e.EffectiveFrom)
	}
	for _, d := range c.Dedicated {
		out = append(out, d.EffectiveFrom)
	}
	out = slices.DeleteFunc(out, func(t time.Time) bool { return !t.After(from) || !t.Before(to) })
	slices.SortFunc(out, time.Time.Compare)
	return slices.CompactFunc(out, time.Time.Equal)
}

// rateCardEntry is the entry in force at `at` for model on deployment:
// one naming the deployment before one that does not, then the latest.
func (c *Contract) rateCardEntry(model, deployment string, at time.Time) (RateCardEntry, bool) {
	best := -1
	for i, e := range c.RateCard {
		if e.Model != model || (e.Deployment != "" && e.Deployment != deployment) || e.EffectiveFrom.After(at) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := c.RateCard[best]
		if (e.Deployment != "") != (b.Deployment != "") {
			if e.Deployment != "" {
				best = i
			}
			continue
		}
		if e.EffectiveFrom.After(b.EffectiveFrom) {
			best = i
		}
	}
	if best < 0 {
		return RateCardEntry{}, false
	}
	return c.RateCard[best], true
}

// dedicated is the dedicated entry of deployment in force at `at`.
func (c *Contract) dedicated(deployment string, at time.Time) (DedicatedDeployment, bool) {
	best := -1
	for i, d := range c.Dedicated {
		if deployment == "" || d.Deployment != deployment || d.EffectiveFrom.After(at) {
			continue
		}
		if best < 0 || d.EffectiveFrom.After(c.Dedicated[best].EffectiveFrom) {
			best = i
		}
	}
	if best < 0 {
		return DedicatedDeployment{}, false
	}
	return c.Dedicated[best], true
}

// DedicatedHour is a deployment's GPU time over one UTC hour, in millionths
// of a GPU-hour (GPUMicroHours).
type DedicatedHour struct {
	Deployment string
	Hour       time.Time
	MicroHours int64
}

// GPUMicroHours converts an hour's GPU seconds (the allocation's figure,
// query.GPUUsageRow.GPUSeconds) to millionths of a GPU-hour, rounded half
// to even from the float's exact value: the quantity dedicated capacity is
// billed for, exact in decimals (6 places of GPU-hours).
func GPUMicroHours(gpuSeconds float64) int64 {
	if math.IsNaN(gpuSeconds) || math.IsInf(gpuSeconds, 0) || gpuSeconds <= 0 {
		return 0
	}
	r := new(big.Rat).SetFloat64(gpuSeconds)
	r.Mul(r, big.NewRat(1_000_000, 3600))
	q := roundRat(r)
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}

// contractPrice is base × Π(100 − p)/100 per 1M tokens, rounded half to even
// to a nano-unit once.
func contractPrice(base Money, pcts ...Weight) Money {
	r := new(big.Rat).SetInt64(int64(base))
	for _, p := range pcts {
		if p != 0 {
			r.Mul(r, big.NewRat(int64(hundredPercent-p), int64(hundredPercent)))
		}
	}
	m, _ := moneyFromRat(r) // |result| ≤ |base|: in range
	return m
}

func kindPrice(kind string, in, cached, out *Money) *Money {
	switch kind {
	case TokenInput:
		return in
	case TokenCachedInput:
		return cached
	}
	return out
}

// lineTokens returns a line's tokens of kind and its list price per 1M.
func lineTokens(l StatementLine, kind string) (uint64, Money) {
	switch kind {
	case TokenInput:
		return l.InputTokens - l.CachedInputTokens, l.InputPer1M
	case TokenCachedInput:
		return l.CachedInputTokens, l.CachedInputPer1M
	}
	return l.OutputTokens, l.OutputPer1M
}

// piece is tokens of one line and kind at one contracted price and rule.
type piece struct {
	tokens uint64
	price  Money
	rule   string
}

// LateBasis is what was billed for a closed period whose late usage a
// statement carries (its adjustment lines): ApplyLate prices the late
// usage as the rest of that period.
type LateBasis struct {
	// Period is the period's key (the adjustment lines' OriginalPeriod).
	Period string
	// Usage are the usage lines of the period's statement (none when the
	// period was never closed for the tenant).
	Usage []StatementLine
	// Adjustments are the adjustment lines for the period of the later
	// statements, one slice per statement, oldest first.
	Adjustments [][]StatementLine
	// TrueUp is what is left of the period's commitment true-up: its
	// statement's commitment charge less what late usage of it absorbed
	// since (the later statements' commitment charges for it).
	TrueUp Money
}

// periodTokens is what a period's allowances and tiers have counted.
type periodTokens struct {
	allowanceLeft map[[2]string]uint64
	tierPos       map[string]uint64
}

func (c *Contract) newPeriodTokens() *periodTokens {
	s := &periodTokens{allowanceLeft: map[[2]string]uint64{}, tierPos: map[string]uint64{}}
	for _, a := range c.Allowances {
		s.allowanceLeft[[2]string{a.Model, a.TokenKind}] = a.Tokens
	}
	return s
}

// contractOrder sorts line indexes in the order of a period's tokens: by
// ChargeStart, then deployment, then index.
func contractOrder(lines []StatementLine, idx []int) {
	slices.SortStableFunc(idx, func(a, b int) int {
		la, lb := lines[a], lines[b]
		return cmp.Or(la.ChargeStart.Compare(lb.ChargeStart), strings.Compare(la.Deployment, lb.Deployment), cmp.Compare(a, b))
	})
}

// kindPieces are a line's tokens of one kind, by contracted price.
type kindPieces struct {
	kind   string
	list   Money
	pieces []piece
}

// linePieces prices l's tokens by kind (rules 1 to 3), counting them in
// s's allowances and tier positions.
func (c *Contract) linePieces(l StatementLine, s *periodTokens) []kindPieces {
	entry, hasEntry := c.rateCardEntry(l.Model, l.Deployment, l.ChargeStart)
	ded, isDedicated := c.dedicated(l.Deployment, l.ChargeStart)
	var sched *TierSchedule
	for j := range c.Tiers {
		if c.Tiers[j].Model == l.Model {
			sched = &c.Tiers[j]
		}
	}
	// price is rule 3 for tier t (nil: none).
	price := func(kind string, list Money, t *Tier, tierNo int) (Money, string) {
		base := list
		var rules []string
		var pcts []Weight
		if t != nil {
			rules = append(rules, fmt.Sprintf("tier:%s#%d", l.Model, tierNo+1))
		}
		if hasEntry {
			rules = append(rules, entry.ID())
			if p := kindPrice(kind, entry.InputPer1M, entry.CachedInputPer1M, entry.OutputPer1M); p != nil {
				base = *p
			}
		}
		if t != nil {
			if p := kindPrice(kind, t.InputPer1M, t.CachedInputPer1M, t.OutputPer1M); p != nil {
				base = *p
			}
			pcts = append(pcts, t.DiscountPercent)
		}
		if hasEntry {
			pcts = append(pcts, entry.DiscountPercent)
		}
		if c.DiscountPercent != 0 {
			pcts = append(pcts, c.DiscountPercent)
			rules = append(rules, "contract_discount")
		}
		return contractPrice(base, pcts...), strings.Join(rules, "+")
	}
	var perKind []kindPieces
	for _, kind := range tokenKinds {
		n, list := lineTokens(l, kind)
		var ps []piece
		switch {
		case n == 0:
		case isDedicated:
			ps = append(ps, piece{n, 0, ded.ID()})
		default:
			rest := n
			for _, k := range [2][2]string{{l.Model, kind}, {l.Model, ""}} {
				if left := s.allowanceLeft[k]; left > 0 && rest > 0 {
					take := min(left, rest)
					s.allowanceLeft[k] -= take
					rest -= take
					rule := "allowance:" + l.Model
					if k[1] != "" {
						rule += "/" + k[1]
					}
					ps = append(ps, piece{take, 0, rule})
					s.tierPos[l.Model] += take
				}
			}
			for rest > 0 {
				var t *Tier
				tierNo, take := -1, rest
				if sched != nil {
					pos := s.tierPos[l.Model]
					for j, tr := range sched.Tiers {
						if tr.UpTo == 0 || pos < tr.UpTo {
							t, tierNo = &sched.Tiers[j], j
							if tr.UpTo != 0 {
								take = min(rest, tr.UpTo-pos)
							}
							break
						}
					}
				}
				p, rule := price(kind, list, t, tierNo)
				ps = append(ps, piece{take, p, rule})
				rest -= take
				s.tierPos[l.Model] += take
			}
		}
		perKind = append(perKind, kindPieces{kind, list, ps})
	}
	return perKind
}

// Apply is ApplyLate with nothing billed before for the periods of st's
// late usage.
func (c *Contract) Apply(st *Statement, hours []DedicatedHour) error {
	return c.ApplyLate(st, hours, nil)
}

// ApplyLate prices st under c (see Contract): it adds the discount,
// dedicated and commitment charges, sets the priced usage, adjustment and
// repricing lines' ContractedCharge and Discount, and settles st (Settle).
// hours are the dedicated deployments' GPU time per UTC hour; those of
// hours that do not start in the period, or of deployments without an
// entry in force, are left out. billed says what was billed for the
// periods of st's late usage (a period it does not name: nothing). A nil c
// leaves st as it is. st's usage lines must not span an entry's
// effective_from (ComputeContractStatement cuts them there).
func (c *Contract) ApplyLate(st *Statement, hours []DedicatedHour, billed []LateBasis) error {
	if c == nil {
		return nil
	}
	for i, l := range st.Lines {
		if l.Kind != LineUsage {
			continue // late usage: the entries in force at its line's start
		}
		for _, t := range c.Cuts(l.ChargeStart, l.ChargeEnd) {
			if _, ok := c.rateCardEntry(l.Model, l.Deployment, t); ok || slices.ContainsFunc(c.Dedicated, func(d DedicatedDeployment) bool { return d.EffectiveFrom.Equal(t) }) {
				return fmt.Errorf("%w: line %d (%s) spans the contract entry taking effect at %s; cut usage there", ErrInvalidStatement, i, l.Model, t.Format(time.RFC3339))
			}
		}
	}
	// The usage lines in the order of the period's tokens, then the
	// adjustment lines by period, each period's in the same order.
	order := make([]int, 0, len(st.Lines))
	for i, l := range st.Lines {
		if l.Kind == LineUsage && l.Priced {
			order = append(order, i)
		}
	}
	contractOrder(st.Lines, order)
	var late []int
	for i, l := range st.Lines {
		if l.Kind == LineAdjustment && l.Priced {
			late = append(late, i)
		}
	}
	contractOrder(st.Lines, late)
	slices.SortStableFunc(late, func(a, b int) int { return strings.Compare(st.Lines[a].OriginalPeriod, st.Lines[b].OriginalPeriod) })
	order = append(order, late...)
	// Each period's allowances and tiers: st's own, and those of the
	// periods of its late usage after what was billed for them.
	periods := map[string]*periodTokens{"": c.newPeriodTokens()}
	trueUp := map[string]Money{}
	for _, b := range billed {
		s := c.newPeriodTokens()
		var idx []int
		for i, l := range b.Usage {
			if l.Kind == LineUsage && l.Priced {
				idx = append(idx, i)
			}
		}
		contractOrder(b.Usage, idx)
		for _, i := range idx {
			c.linePieces(b.Usage[i], s)
		}
		for _, adj := range b.Adjustments {
			idx = idx[:0]
			for i, l := range adj {
				if l.Kind == LineAdjustment && l.Priced && l.OriginalPeriod == b.Period {
					idx = append(idx, i)
				}
			}
			contractOrder(adj, idx)
			for _, i := range idx {
				c.linePieces(adj[i], s)
			}
		}
		periods[b.Period] = s
		trueUp[b.Period] = b.TrueUp
	}
	var charges []Charge
	var errs []error
	contracted := map[int]Money{} // line index → contracted charge
	for _, i := range order {
		l := &st.Lines[i]
		pt := periods[l.OriginalPeriod]
		if pt == nil {
			pt = c.newPeriodTokens()
			periods[l.OriginalPeriod] = pt
		}
		exact := new(big.Int) // the line's contracted cost × 1M, in nano-units
		perKind := c.linePieces(*l, pt)
		for k, kp := range perKind {
			for _, p := range kp.pieces {
				exact.Add(exact, new(big.Int).Mul(new(big.Int).SetUint64(p.tokens), big.NewInt(int64(p.price))))
			}
			// Tokens at list price need no charge; pieces of one rule merge.
			var kept []piece
			for _, p := range kp.pieces {
				if p.price == kp.list {
					continue
				}
				if j := slices.IndexFunc(kept, func(q piece) bool { return q.rule == p.rule && q.price == p.price }); j >= 0 {
					kept[j].tokens += p.tokens
					continue
				}
				kept = append(kept, p)
			}
			perKind[k].pieces = kept
		}
		cc, err := moneyFromRat(new(big.Rat).SetFrac(exact, big.NewInt(1_000_000)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: the contracted charge of %s's %s line is out of range", ErrInvalidStatement, st.Tenant, l.Model))
			continue
		}
		discount, ok := addMoney(cc, -l.Charge)
		if !ok {
			errs = append(errs, fmt.Errorf("%w: the discount of %s's %s line is out of range", ErrInvalidStatement, st.Tenant, l.Model))
			continue
		}
		contracted[i] = cc
		var lineCharges []Charge
		var sum Money
		for _, kp := range perKind {
			for _, p := range kp.pieces {
				diff := new(big.Int).Mul(new(big.Int).SetUint64(p.tokens), big.NewInt(int64(p.price)-int64(kp.list)))
				a, err := moneyFromRat(new(big.Rat).SetFrac(diff, big.NewInt(1_000_000)))
				if err != nil {
					errs = append(errs, fmt.Errorf("%w: a discount of %s's %s line is out of range", ErrInvalidStatement, st.Tenant, l.Model))
				}
				sum += a
				lineCharges = append(lineCharges, Charge{
					Kind: ChargeDiscount, Line: i, Model: l.Model, Deployment: l.Deployment, TokenKind: kp.kind,
					Description: fmt.Sprintf("%s %s tokens at %s per 1M instead of %s (list)", l.Model, strings.ReplaceAll(kp.kind, "_", " "), p.price, kp.list),
					Quantity:    fmt.Sprint(p.tokens), Unit: "tokens", UnitPrice: p.price.String(), Rule: p.rule,
					ChargeStart: l.ChargeStart, ChargeEnd: l.ChargeEnd, Amount: a,
				})
			}
		}
		if n := len(lineCharges); n > 0 {
			lineCharges[n-1].Amount += discount - sum // the rest: a few nano-units at most
		} else if discount != 0 {
			// Cannot happen: without discounts every token is at list.
			errs = append(errs, fmt.Errorf("%w: %s's %s line: contracted and list charges differ without a discount", ErrInvalidStatement, st.Tenant, l.Model))
		}
		charges = append(charges, lineCharges...)
	}
	// Repricings: the difference the contract's discounts make (computed
	// by the caller: StatementUsage.RepricingDiscount), a charge per kind.
	for i := range st.Lines {
		l := &st.Lines[i]
		d := l.repricingDiscount
		l.repricingDiscount = nil
		if l.Kind != LineRepricing || d == nil {
			continue
		}
		cc := l.Charge
		for _, ka := range [3]struct {
			kind   string
			amount Money
			tokens uint64
		}{{TokenInput, d.Input, 0}, {TokenCachedInput, d.CachedInput, 0}, {TokenOutput, d.Output, 0}} {
			if ka.amount == 0 {
				continue
			}
			var ok bool
			if cc, ok = addMoney(cc, ka.amount); !ok {
				errs = append(errs, fmt.Errorf("%w: the contracted repricing of %s's %s line is out of range", ErrInvalidStatement, st.Tenant, l.Model))
			}
			ch := Charge{
				Kind: ChargeDiscount, Line: i, Model: l.Model, Deployment: l.Deployment, TokenKind: ka.kind,
				Description: fmt.Sprintf("repricing of %s under the contract: %s %s tokens' contracted difference, not the list difference", l.OriginalPeriod, l.Model, strings.ReplaceAll(ka.kind, "_", " ")),
				Rule:        "contract_repricing", OriginalPeriod: l.OriginalPeriod,
				ChargeStart: l.ChargeStart, ChargeEnd: l.ChargeEnd, Amount: ka.amount,
			}
			if r := l.Repriced; r != nil {
				n, _ := lineTokens(StatementLine{InputTokens: r.InputTokens, CachedInputTokens: r.CachedInputTokens, OutputTokens: r.OutputTokens}, ka.kind)
				ch.Quantity, ch.Unit = fmt.Sprint(n), "tokens"
			}
			charges = append(charges, ch)
		}
		contracted[i] = cc
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Lines in statement order for charges: sort discounts by line, keeping
	// each line's kind order.
	slices.SortStableFunc(charges, func(a, b Charge) int { return cmp.Compare(a.Line, b.Line) })
	for i := range st.Lines {
		if cc, ok := contracted[i]; ok {
			d := cc - st.Lines[i].Charge
			st.Lines[i].ContractedCharge, st.Lines[i].Discount = &cc, &d
		}
	}
	// Dedicated GPU-hours, per deployment and entry in force at each hour.
	type dedKey struct {
		dep  string
		from time.Time
	}
	type dedSum struct {
		entry      DedicatedDeployment
		micro      *big.Int
		start, end time.Time
	}
	var dedKeys []dedKey
	dedSums := map[dedKey]*dedSum{}
	first := st.PeriodStart.UTC().Truncate(time.Hour)
	if first.Before(st.PeriodStart) {
		first = first.Add(time.Hour)
	}
	for _, h := range hours {
		if h.Hour.Before(first) || !h.Hour.Before(st.PeriodEnd) || h.MicroHours <= 0 {
			continue
		}
		d, ok := c.dedicated(h.Deployment, h.Hour)
		if !ok {
			continue
		}
		k := dedKey{d.Deployment, d.EffectiveFrom}
		s := dedSums[k]
		if s == nil {
			s = &dedSum{entry: d, micro: new(big.Int), start: h.Hour, end: h.Hour.Add(time.Hour)}
			dedSums[k] = s
			dedKeys = append(dedKeys, k)
		}
		s.micro.Add(s.micro, big.NewInt(h.MicroHours))
		s.start, s.end = minTime(s.start, h.Hour), maxTime(s.end, h.Hour.Add(time.Hour))
	}
	slices.SortFunc(dedKeys, func(a, b dedKey) int { return cmp.Or(strings.Compare(a.dep, b.dep), a.from.Compare(b.from)) })
	var spend Money
	for _, i := range order {
		if st.Lines[i].Kind == LineUsage {
			s, ok := addMoney(spend, contracted[i])
			if !ok {
				return fmt.Errorf("%w: %s's spend is out of range", ErrInvalidStatement, st.Tenant)
			}
			spend = s
		}
	}
	for _, k := range dedKeys {
		s := dedSums[k]
		amt, err := moneyFromRat(new(big.Rat).SetFrac(new(big.Int).Mul(s.micro, big.NewInt(int64(s.entry.PerGPUHour))), big.NewInt(1_000_000)))
		if err != nil {
			return fmt.Errorf("%w: %s's dedicated charge for %s is out of range", ErrInvalidStatement, st.Tenant, k.dep)
		}
		qty := new(big.Rat).SetFrac(s.micro, big.NewInt(1_000_000)).FloatString(6)
		qty = strings.TrimRight(strings.TrimRight(qty, "0"), ".")
		charges = append(charges, Charge{
			Kind: ChargeDedicated, Line: -1, Deployment: k.dep,
			Description: fmt.Sprintf("dedicated deployment %s: %s GPU-hours at %s per GPU-hour", k.dep, qty, s.entry.PerGPUHour),
			Quantity:    qty, Unit: "GPU-hours", UnitPrice: s.entry.PerGPUHour.String(), Rule: s.entry.ID(),
			ChargeStart: s.start, ChargeEnd: s.end, Amount: amt,
		})
		var ok bool
		if spend, ok = addMoney(spend, amt); !ok {
			return fmt.Errorf("%w: %s's spend is out of range", ErrInvalidStatement, st.Tenant)
		}
	}
	if c.Commitment != nil && spend < c.Commitment.MonthlySpend {
		charges = append(charges, Charge{
			Kind: ChargeCommitment, Line: -1,
			Description: fmt.Sprintf("committed spend of %s a month, %s spent: true-up of the shortfall", c.Commitment.MonthlySpend, spend),
			Quantity:    "1", Unit: "commitment", UnitPrice: (c.Commitment.MonthlySpend - spend).String(), Rule: "commitment",
			ChargeStart: st.PeriodStart, ChargeEnd: st.PeriodEnd, Amount: c.Commitment.MonthlySpend - spend,
		})
	}
	// Late usage of a period that closed with a true-up counts toward that
	// period's commitment: its contracted charges absorb what is left of
	// the true-up (a negative commitment charge for the period).
	for _, q := range slices.Sorted(maps.Keys(trueUp)) {
		left := trueUp[q]
		if left <= 0 {
			continue
		}
		var lateSpend Money
		var start, end time.Time
		for _, i := range late {
			if l := st.Lines[i]; l.OriginalPeriod == q {
				lateSpend += contracted[i]
				if start.IsZero() || l.ChargeStart.Before(start) {
					start = l.ChargeStart
				}
				end = maxTime(end, l.ChargeEnd)
			}
		}
		if lateSpend <= 0 {
			continue
		}
		a := min(lateSpend, left)
		charges = append(charges, Charge{
			Kind: ChargeCommitment, Line: -1, OriginalPeriod: q,
			Description: fmt.Sprintf("late usage of %s (%s) counts toward its committed spend: %s of the %s left of its true-up", q, lateSpend, a, left),
			Quantity:    "1", Unit: "commitment", UnitPrice: (-a).String(), Rule: "commitment",
			ChargeStart: start, ChargeEnd: end, Amount: -a,
		})
	}
	st.Charges = append(st.Charges, charges...)
	return st.Settle()
}
