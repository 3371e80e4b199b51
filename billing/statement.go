package billing

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"golang.org/x/text/currency"
)

// A statement is what a tenant is billed for one period (ARCHITECTURE
// "Money and prices"): its usage of each model at list prices, one line per
// model (and deployment, when asked) and token price in force, plus
// adjustment lines for late usage of periods already closed. This file
// computes a statement from usage the caller has read; storing, closing and
// exporting statements are not here.

// ErrInvalidStatement marks usage a statement cannot be computed from.
var ErrInvalidStatement = errors.New("invalid statement input")

// StatementUsage is one tenant's usage of one model (on one deployment)
// over [Start, End), all of it under one token price: the caller splits
// its usage at the model's price changes (TokenPriceChanges).
type StatementUsage struct {
	Start, End        time.Time
	Model, Deployment string
	Requests          uint64
	// InputTokens includes CachedInputTokens.
	InputTokens, CachedInputTokens, OutputTokens uint64
	// OriginalPeriod names the closed period late usage belongs to; empty
	// for usage of the statement's own period.
	OriginalPeriod string
	// Book prices late usage with the book its period was billed with;
	// nil: the statement's book.
	Book *PriceBook
	// Repricing, when not nil, makes this a repricing of the closed period
	// OriginalPeriod: no usage, a charge of *Repricing (positive or
	// negative), the difference between the period's usage under the
	// statement's book and what was billed for it.
	Repricing *Money
	// Repriced, with Repricing, breaks it down by token kind (nil: not
	// broken down).
	Repriced *Repriced
	// RepricingDiscount, with Repricing, is what the tenant's contract
	// changes in it, by token kind: the contract's discounts of the
	// period's usage under the statement's book less those under the book
	// that billed it (Contract.Apply makes them the repricing line's
	// discount charges). Nil: no contract, the line is at list.
	RepricingDiscount *KindAmounts
}

// KindAmounts are amounts by token kind, in nano-units.
type KindAmounts struct {
	Input, CachedInput, Output Money
}

// LineKind says what a statement line bills.
type LineKind string

const (
	// LineUsage bills usage of the statement's period.
	LineUsage LineKind = "usage"
	// LineAdjustment bills usage of an earlier, closed period that arrived
	// after its close, at the price that applied then.
	LineAdjustment LineKind = "adjustment"
	// LineRepricing bills (or credits) the difference a price book change
	// makes to an earlier, closed period, when an admin asks for it.
	LineRepricing LineKind = "repricing"
)

// StatementLine is one line of a statement: a model's (and deployment's)
// usage under one token price.
type StatementLine struct {
	Kind       LineKind `json:"kind"`
	Model      string   `json:"model"`
	Deployment string   `json:"deployment,omitempty"`
	// Region is the region of the line's usage as its close found it (FOCUS
	// RegionId): its deployment's one region, or for a line not per
	// deployment the one region of every deployment; empty when unknown or
	// several, and on statements closed before regions were recorded (so
	// outside their hash).
	Region string `json:"region,omitempty"`
	// OriginalPeriod is the period an adjustment's usage belongs to.
	OriginalPeriod string `json:"original_period,omitempty"`
	// ChargeStart and ChargeEnd span the line's usage.
	ChargeStart time.Time `json:"charge_start"`
	ChargeEnd   time.Time `json:"charge_end"`
	// PriceID identifies the token price applied (TokenPrice.ID); empty,
	// with Priced false and a zero charge, when the model had no price.
	PriceID           string `json:"price_id,omitempty"`
	Priced            bool   `json:"priced"`
	Requests          uint64 `json:"requests"`
	InputTokens       uint64 `json:"input_tokens"`
	CachedInputTokens uint64 `json:"cached_input_tokens"`
	OutputTokens      uint64 `json:"output_tokens"`
	InputPer1M        Money  `json:"input_per_1m"`
	CachedInputPer1M  Money  `json:"cached_input_per_1m"`
	OutputPer1M       Money  `json:"output_per_1m"`
	// Charge is the line's list-price charge in nano-units (ListCharge of
	// its summed tokens: rounded half to even to a nano-unit once).
	Charge Money `json:"charge"`
	// PriceBook is the version of the book that priced an adjustment when
	// it is not the statement's (its period was billed with another).
	PriceBook string `json:"price_book,omitempty"`
	// ContractedCharge is the line's charge under the tenant's contract
	// (its exact contracted cost rounded half to even to a nano-unit once)
	// and Discount is ContractedCharge − Charge: the sum of the line's
	// ChargeDiscount amounts. Absent without a contract (Contract.Apply).
	ContractedCharge *Money `json:"contracted_charge,omitempty"`
	Discount         *Money `json:"discount,omitempty"`
	// Repriced breaks a repricing line down by token kind (absent on
	// other lines, and on repricings closed before it existed).
	Repriced *Repriced `json:"repriced,omitempty"`
	// repricingDiscount is the sum of the line's usages'
	// RepricingDiscount, for Contract.Apply (not stored).
	repricingDiscount *KindAmounts
}

// Repriced is a repricing line by token kind: the repriced period's tokens
// (its usage now, InputTokens including CachedInputTokens) and the part of
// the line's charge each kind makes: the kind's exact cost under the book
// in force less its exact cost as billed, rounded half to even to a
// nano-unit, the rest of the line's charge on the kind of the largest part,
// so that the three add up to the line's charge exactly. The FOCUS export
// makes a row of each (PricingQuantity the kind's tokens).
type Repriced struct {
	InputTokens       uint64 `json:"input_tokens"`
	CachedInputTokens uint64 `json:"cached_input_tokens"`
	OutputTokens      uint64 `json:"output_tokens"`
	InputCharge       Money  `json:"input_charge"`
	CachedInputCharge Money  `json:"cached_input_charge"`
	OutputCharge      Money  `json:"output_charge"`
}

// Statement is one tenant's bill for one period.
type Statement struct {
	Tenant string `json:"tenant"`
	Period string `json:"period"`
	// Revision counts the reissues of the period's statement (0: the one
	// its close stored); Replaces is the hash of the revision it voids and
	// VoidReason why. Absent on revision 0, and so outside the hash of
	// statements closed before reissues existed.
	Revision   int    `json:"revision,omitempty"`
	Replaces   string `json:"replaces,omitempty"`
	VoidReason string `json:"void_reason,omitempty"`
	Zone       string `json:"zone"`
	// PeriodStart and PeriodEnd are the period's first instants.
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	Currency    string    `json:"currency"`
	// PriceBook is the version of the price book the lines were priced with.
	PriceBook string          `json:"price_book"`
	Lines     []StatementLine `json:"lines"`
	// Charge is the sum of the lines' charges, exact in nano-units; Total
	// is Charge rounded once to the currency's minor unit by Rounding.
	Charge           Money  `json:"charge"`
	Total            Money  `json:"total"`
	Rounding         string `json:"rounding"`
	UnpricedRequests uint64 `json:"unpriced_requests"`
	// Charges are the bill's amounts that are not usage at list price
	// (ChargeKind): what a contract or credits change, in order. Absent
	// (and so outside the hash of statements closed before them) when
	// there are none.
	Charges []Charge `json:"charges,omitempty"`
	// Credits is what the statement did to the tenant's credit grants: the
	// balance of each before and after it, what it drew (its ChargeCredit
	// charges) and what expired with its close (ApplyCredits). Absent, and
	// so outside the hash, when the tenant has no grant in force.
	Credits []CreditUse `json:"credits,omitempty"`
	// Hash is the SHA-256 of the statement's canonical JSON without it and
	// without Finance: it identifies the bill as the tenant sees it.
	Hash string `json:"hash,omitempty"`
	// Finance is what finance sees beyond the bill (AttachFinance); nil in
	// the tenant's view.
	Finance *StatementFinance `json:"finance,omitempty"`
}

// ChargeKind says what a Charge is.
type ChargeKind string

const (
	// ChargeDiscount lowers a usage line from list to contracted price
	// (rate card override, percentage discount, free allowance, volume
	// tier): Amount ≤ 0, Line names the usage line (or adjustment line).
	// On a repricing line (rule contract_repricing) it is what the
	// contract changes in the list-price difference, of either sign.
	ChargeDiscount ChargeKind = "discount"
	// ChargeCommitment is the true-up of a committed spend not reached.
	ChargeCommitment ChargeKind = "commitment"
	// ChargeDedicated bills a dedicated deployment's GPU-hours at a
	// contracted rate.
	ChargeDedicated ChargeKind = "dedicated"
	// ChargeCredit draws on a credit grant: Amount < 0.
	ChargeCredit ChargeKind = "credit"
)

// Charge is one amount of a statement besides its usage lines' list
// charges. A statement's Charge is the sum of its lines' charges and of
// these amounts.
type Charge struct {
	Kind        ChargeKind `json:"kind"`
	Description string     `json:"description"`
	// Line is the index in Lines of the usage line a discount applies to;
	// -1 when the charge is not about one line.
	Line int `json:"line"`
	// Model and Deployment name what the charge is about, when it is.
	Model      string `json:"model,omitempty"`
	Deployment string `json:"deployment,omitempty"`
	// TokenKind is "input", "cached_input" or "output" for a per-token
	// price; empty otherwise.
	TokenKind string `json:"token_kind,omitempty"`
	// Quantity in Unit ("tokens", "GPU-hours", ...) at UnitPrice, when the
	// charge is a price times a quantity; Rule names the contract term or
	// grant ("rate_card:acme/llama@2026-11-01T00:00:00Z", "tier:2",
	// "grant:g-123").
	Quantity  string `json:"quantity,omitempty"`
	Unit      string `json:"unit,omitempty"`
	UnitPrice string `json:"unit_price,omitempty"`
	Rule      string `json:"rule,omitempty"`
	// OriginalPeriod is the earlier period a charge is about: on a
	// commitment charge, the period whose true-up late usage of it
	// absorbed (Contract.Apply). Absent otherwise.
	OriginalPeriod string `json:"original_period,omitempty"`
	// ChargeStart and ChargeEnd span what the charge is for.
	ChargeStart time.Time `json:"charge_start"`
	ChargeEnd   time.Time `json:"charge_end"`
	// Amount is exact, in nano-units: negative for discounts and credits.
	Amount Money `json:"amount"`
}

// StatementFinance is the finance-only part of a statement: the GPU cost
// allocated to the tenant over the period, under the price book's policies,
// and the margin.
type StatementFinance struct {
	BusyPolicy string `json:"busy_policy"`
	IdlePolicy string `json:"idle_policy"`
	// HourRule says which hours' cost the period holds.
	HourRule string `json:"hour_rule"`
	// AllocatedCost is the allocated GPU cost, BusyCost its busy share
	// and IdleCost its idle share (AllocatedCost = BusyCost + IdleCost).
	AllocatedCost Money `json:"allocated_cost"`
	BusyCost      Money `json:"busy_cost"`
	IdleCost      Money `json:"idle_cost"`
	// UsageCharge is the charge of the usage lines (adjustments left out:
	// their cost belongs to the periods they were used in), each at its
	// contracted charge when the tenant has a contract (ContractedCharge),
	// else at list. DedicatedCharge and CommitmentCharge are the contract's
	// revenue that is on no line: its dedicated GPU-hours and commitment
	// true-up (their charges' amounts; absent when none; a charge about an
	// earlier period, OriginalPeriod, left out like adjustments). Margin is
	// UsageCharge + DedicatedCharge + CommitmentCharge − AllocatedCost:
	// what the tenant pays for the period's usage less its GPU cost.
	// Credits drawn are not in it (a way of paying, not a price).
	UsageCharge      Money `json:"usage_charge"`
	DedicatedCharge  Money `json:"dedicated_charge,omitempty"`
	CommitmentCharge Money `json:"commitment_charge,omitempty"`
	Margin           Money `json:"margin"`
	// CostPer1K is AllocatedCost per 1,000 tokens (input and output) of
	// the usage lines; absent without tokens.
	CostPer1K *Money `json:"cost_per_1k_tokens,omitempty"`
	// Lines holds the cost of each usage line, by its index in Lines.
	Lines []LineCost `json:"lines"`
	// Unassigned is cost of hours whose model (and deployment) has no
	// usage line in the period: its usage fell outside the period, in the
	// part of a boundary hour after it (zones off whole hours).
	Unassigned Money `json:"unassigned,omitempty"`
}

// LineCost is the GPU cost allocated to one usage line and its margin:
// the line's contracted charge (its list charge without a contract) less
// its allocated cost. A dedicated deployment's lines have a contracted
// charge of 0, so their margin is their cost's negative; the deployment's
// GPU-hours charge is the statement's DedicatedCharge.
type LineCost struct {
	Line          int   `json:"line"`
	AllocatedCost Money `json:"allocated_cost"`
	BusyCost      Money `json:"busy_cost"`
	IdleCost      Money `json:"idle_cost"`
	Margin        Money `json:"margin"`
}

// HourCost is the GPU cost allocated to a tenant's use of one model on one
// deployment over one UTC hour: Cost in all, Busy its busy share.
type HourCost struct {
	Hour              time.Time
	Model, Deployment string
	Cost, Busy        Money
}

// HourCostRule is the rule AttachFinance applies, written in statements.
const HourCostRule = "GPU cost is allocated per UTC hour; a period holds the cost of the hours that start in it, and each hour's cost goes to the usage line of its model (and deployment) whose price was in force at the hour's start"

// AttachFinance adds the finance part to st from the tenant's allocated
// cost per hour under the busy and idle policies named: the hours that
// start in the period count (a zone off whole hours splits its boundary
// hours, and each goes whole to the period holding its start), each to the
// usage line of its model (and deployment, when the lines have one) under
// the price in force at the hour's start, or else to the line of that
// model nearest in time. The statement's Hash is unchanged: finance is not
// part of the bill.
func AttachFinance(st *Statement, busy, idle string, costs []HourCost) error {
	f := &StatementFinance{BusyPolicy: busy, IdlePolicy: idle, HourRule: HourCostRule}
	byLine := map[int]*LineCost{}
	var tokens uint64
	var errs []error
	add := func(a *Money, b Money) {
		s, ok := addMoney(*a, b)
		if !ok {
			errs = append(errs, fmt.Errorf("%w: %s's allocated cost is out of range", ErrInvalidStatement, st.Tenant))
		}
		*a = s
	}
	for _, l := range st.Lines {
		if l.Kind == LineUsage {
			add(&f.UsageCharge, l.contracted())
			tokens += l.InputTokens + l.OutputTokens
		}
	}
	for _, c := range st.Charges {
		if c.OriginalPeriod != "" {
			continue // an earlier period's, like adjustments
		}
		switch c.Kind {
		case ChargeDedicated:
			add(&f.DedicatedCharge, c.Amount)
		case ChargeCommitment:
			add(&f.CommitmentCharge, c.Amount)
		}
	}
	for _, c := range costs {
		if c.Hour.Before(st.PeriodStart) || !c.Hour.Before(st.PeriodEnd) {
			continue
		}
		idleShare := c.Cost - c.Busy
		add(&f.AllocatedCost, c.Cost)
		add(&f.BusyCost, c.Busy)
		add(&f.IdleCost, idleShare)
		i := lineOfHour(st.Lines, c)
		if i < 0 {
			add(&f.Unassigned, c.Cost)
			continue
		}
		lc := byLine[i]
		if lc == nil {
			lc = &LineCost{Line: i}
			byLine[i] = lc
		}
		add(&lc.AllocatedCost, c.Cost)
		add(&lc.BusyCost, c.Busy)
		add(&lc.IdleCost, idleShare)
	}
	for i, l := range st.Lines {
		if l.Kind != LineUsage {
			continue
		}
		lc := byLine[i]
		if lc == nil {
			lc = &LineCost{Line: i}
		}
		m, ok := addMoney(l.contracted(), -lc.AllocatedCost)
		if !ok {
			errs = append(errs, fmt.Errorf("%w: margin of %s's %s line is out of range", ErrInvalidStatement, st.Tenant, l.Model))
		}
		lc.Margin = m
		f.Lines = append(f.Lines, *lc)
	}
	m, ok := addMoney(f.UsageCharge, -f.AllocatedCost)
	if ok {
		m, ok = addMoney(m, f.DedicatedCharge)
	}
	if ok {
		m, ok = addMoney(m, f.CommitmentCharge)
	}
	if !ok {
		errs = append(errs, fmt.Errorf("%w: %s's margin is out of range", ErrInvalidStatement, st.Tenant))
	}
	f.Margin = m
	if per, ok := CostPer1K(f.AllocatedCost, int64(tokens)); ok && tokens <= 1<<62 {
		f.CostPer1K = &per
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	st.Finance = f
	return nil
}

// contracted is what the line bills: its contracted charge under a
// contract, else its list charge.
func (l StatementLine) contracted() Money {
	if l.ContractedCharge != nil {
		return *l.ContractedCharge
	}
	return l.Charge
}

// lineOfHour is the index of the usage line c's cost goes to, or -1.
func lineOfHour(lines []StatementLine, c HourCost) int {
	best, bestGap := -1, time.Duration(1<<63-1)
	for i, l := range lines {
		if l.Kind != LineUsage || l.Model != c.Model || (l.Deployment != "" && l.Deployment != c.Deployment) {
			continue
		}
		var gap time.Duration
		switch {
		case c.Hour.Before(l.ChargeStart):
			gap = l.ChargeStart.Sub(c.Hour)
		case !c.Hour.Before(l.ChargeEnd):
			gap = c.Hour.Sub(l.ChargeEnd) + time.Nanosecond
		}
		if gap < bestGap {
			best, bestGap = i, gap
		}
	}
	return best
}

// StoredStatement is a closed statement as stored: its canonical JSON,
// which every re-read returns byte for byte, and its hash.
type StoredStatement struct {
	Tenant, Period string
	// Revision is the statement's (Statement.Revision): 0 for the one its
	// close stored.
	Revision int
	Hash     string
	Content  []byte
	ClosedAt time.Time
}

// TokenPriceChanges lists the instants in (from, to) at which the model's
// token price changes, in order: where statement usage must be split.
func (b *PriceBook) TokenPriceChanges(model string, from, to time.Time) []time.Time {
	var out []time.Time
	for _, p := range b.TokenPrices {
		if p.Model == model && p.EffectiveFrom.After(from) && p.EffectiveFrom.Before(to) {
			out = append(out, p.EffectiveFrom)
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return slices.CompactFunc(out, time.Time.Equal)
}

// ComputeStatement bills tenant's usage of period p with book: one line
// per (kind, original period, model, deployment when byDeployment, price),
// in that order. Usage of p must lie in p; late usage (OriginalPeriod set)
// must lie before p. Each usage slice must lie under one token price.
// Errors wrap ErrInvalidStatement.
func ComputeStatement(tenant string, p Period, book *PriceBook, usage []StatementUsage, byDeployment bool) (Statement, error) {
	return computeStatement(tenant, p, book, usage, byDeployment, nil, nil)
}

// ComputeStatementCut is ComputeStatement with the lines of p's own usage
// also cut at cuts (a contract's entries: Contract.Cuts), as a contract
// statement's are; its usage slices must not span one.
func ComputeStatementCut(tenant string, p Period, book *PriceBook, usage []StatementUsage, byDeployment bool, cuts []time.Time) (Statement, error) {
	return computeStatement(tenant, p, book, usage, byDeployment, cuts, nil)
}

// ComputeContractStatement is ComputeStatement under contract c (nil: list
// prices, the same statement): usage lines are also cut where a contract
// entry takes effect in p (Contract.Cuts; usage must be cut there too),
// adjustment lines where one took effect before p (each part of late usage
// is priced by the entry in force at its line's start; a late usage slice
// that spans one is not split), per deployment when c names deployments,
// and priced by c.Apply with the dedicated deployments' GPU hours. Late
// usage is priced as if its periods had nothing billed before
// (ComputeContractStatementLate says what was).
func ComputeContractStatement(tenant string, p Period, book *PriceBook, usage []StatementUsage, byDeployment bool, c *Contract, hours []DedicatedHour) (Statement, error) {
	return ComputeContractStatementLate(tenant, p, book, usage, byDeployment, c, hours, nil)
}

// ComputeContractStatementLate is ComputeContractStatement with what was
// billed for the periods of the late usage (Contract.ApplyLate).
func ComputeContractStatementLate(tenant string, p Period, book *PriceBook, usage []StatementUsage, byDeployment bool, c *Contract, hours []DedicatedHour, billed []LateBasis) (Statement, error) {
	if c == nil {
		return ComputeStatement(tenant, p, book, usage, byDeployment)
	}
	st, err := computeStatement(tenant, p, book, usage, byDeployment || c.NamesDeployments(), c.Cuts(p.Start, p.End), c.Cuts(time.Time{}, p.Start))
	if err != nil {
		return Statement{}, err
	}
	if err := c.ApplyLate(&st, hours, billed); err != nil {
		return Statement{}, err
	}
	return st, nil
}

// computeStatement is ComputeStatement with the lines of p's own usage
// also cut at cuts (its usage slices must not span one) and adjustment
// lines at lateCuts (a slice spanning one goes to the part of its start).
func computeStatement(tenant string, p Period, book *PriceBook, usage []StatementUsage, byDeployment bool, cuts, lateCuts []time.Time) (Statement, error) {
	type lineKey struct {
		kind                              LineKind
		original, model, dep, price, book string
		segment                           int // cuts at or before the usage's start
	}
	lines := map[lineKey]*StatementLine{}
	// A book's version is the hash of its canonical JSON: computed once
	// per book, not once per usage slice (it was most of a statement's
	// CPU: 1,440 slices of a month took 15 ms).
	versions := map[*PriceBook]string{}
	version := func(b *PriceBook) string {
		v, ok := versions[b]
		if !ok {
			v = b.Version()
			versions[b] = v
		}
		return v
	}
	books := map[*StatementLine]*PriceBook{} // the book of each line
	var errs []error
	for i, u := range usage {
		if !u.End.After(u.Start) || u.CachedInputTokens > u.InputTokens {
			errs = append(errs, fmt.Errorf("%w: usage %d (%s, %s–%s): empty span or cached input above input", ErrInvalidStatement, i, u.Model, u.Start.Format(time.RFC3339), u.End.Format(time.RFC3339)))
			continue
		}
		if u.Repricing != nil {
			if u.OriginalPeriod == "" || u.End.After(p.Start) || u.Requests+u.InputTokens+u.OutputTokens > 0 {
				errs = append(errs, fmt.Errorf("%w: repricing %d: want a closed period before %s and no usage", ErrInvalidStatement, i, p))
				continue
			}
			k := lineKey{kind: LineRepricing, original: u.OriginalPeriod, model: u.Model, book: version(book)}
			if byDeployment {
				k.dep = u.Deployment
			}
			l := lines[k]
			if l == nil {
				l = &StatementLine{Kind: LineRepricing, Model: u.Model, Deployment: k.dep, OriginalPeriod: u.OriginalPeriod,
					ChargeStart: u.Start, ChargeEnd: u.End, Priced: true}
				lines[k] = l
			}
			// The line's breakdown by kind is its usages' (several when the
			// period was billed per deployment and this statement is not);
			// none when one of them has none.
			switch r := u.Repriced; {
			case r != nil && (r.CachedInputTokens > r.InputTokens || r.InputCharge+r.CachedInputCharge+r.OutputCharge != *u.Repricing):
				errs = append(errs, fmt.Errorf("%w: repricing %d: its kinds' tokens or charges do not add up", ErrInvalidStatement, i))
				continue
			case r == nil || (l.Repriced == nil && l.Charge != 0):
				l.Repriced = nil
			case l.Repriced == nil:
				c := *r
				l.Repriced = &c
			default:
				l.Repriced.InputTokens += r.InputTokens
				l.Repriced.CachedInputTokens += r.CachedInputTokens
				l.Repriced.OutputTokens += r.OutputTokens
				l.Repriced.InputCharge += r.InputCharge
				l.Repriced.CachedInputCharge += r.CachedInputCharge
				l.Repriced.OutputCharge += r.OutputCharge
			}
			if d := u.RepricingDiscount; d != nil {
				if l.repricingDiscount == nil {
					l.repricingDiscount = &KindAmounts{}
				}
				l.repricingDiscount.Input += d.Input
				l.repricingDiscount.CachedInput += d.CachedInput
				l.repricingDiscount.Output += d.Output
			}
			l.ChargeStart, l.ChargeEnd = minTime(l.ChargeStart, u.Start), maxTime(l.ChargeEnd, u.End)
			sum, ok := addMoney(l.Charge, *u.Repricing)
			if !ok {
				errs = append(errs, fmt.Errorf("%w: repricing %d is out of range", ErrInvalidStatement, i))
			}
			l.Charge = sum
			continue
		}
		kind := LineUsage
		switch {
		case u.OriginalPeriod != "":
			kind = LineAdjustment
			if u.End.After(p.Start) {
				errs = append(errs, fmt.Errorf("%w: late usage %d of %s ends at %s, after the start of %s", ErrInvalidStatement, i, u.OriginalPeriod, u.End.Format(time.RFC3339), p))
				continue
			}
		case u.Start.Before(p.Start) || u.End.After(p.End):
			errs = append(errs, fmt.Errorf("%w: usage %d (%s–%s) lies outside %s", ErrInvalidStatement, i, u.Start.Format(time.RFC3339), u.End.Format(time.RFC3339), p))
			continue
		}
		ub := book
		if u.Book != nil {
			ub = u.Book
		}
		if ch := ub.TokenPriceChanges(u.Model, u.Start, u.End); len(ch) > 0 {
			errs = append(errs, fmt.Errorf("%w: usage %d of %s spans a price change at %s; split it there", ErrInvalidStatement, i, u.Model, ch[0].Format(time.RFC3339)))
			continue
		}
		seg := 0
		if kind != LineUsage {
			for _, c := range lateCuts {
				if !c.After(u.Start) {
					seg++
				}
			}
		}
		for _, c := range cuts {
			if kind != LineUsage {
				break
			}
			if !c.After(u.Start) {
				seg++
			} else if c.Before(u.End) {
				errs = append(errs, fmt.Errorf("%w: usage %d of %s spans a contract entry taking effect at %s; split it there", ErrInvalidStatement, i, u.Model, c.Format(time.RFC3339)))
			}
		}
		price, priced := ub.TokenPrice(u.Model, u.Start)
		k := lineKey{kind: kind, original: u.OriginalPeriod, model: u.Model, book: version(ub), segment: seg}
		if byDeployment {
			k.dep = u.Deployment
		}
		if priced {
			k.price = price.ID()
		}
		l := lines[k]
		if l == nil {
			l = &StatementLine{Kind: kind, Model: u.Model, Deployment: k.dep, OriginalPeriod: u.OriginalPeriod,
				ChargeStart: u.Start, ChargeEnd: u.End, PriceID: k.price, Priced: priced}
			if priced {
				l.InputPer1M, l.CachedInputPer1M, l.OutputPer1M = price.InputPer1M, price.CachedInputPer1M, price.OutputPer1M
			}
			if ub != book {
				l.PriceBook = version(ub)
			}
			lines[k] = l
			books[l] = ub
		}
		l.ChargeStart, l.ChargeEnd = minTime(l.ChargeStart, u.Start), maxTime(l.ChargeEnd, u.End)
		l.Requests += u.Requests
		l.InputTokens += u.InputTokens
		l.CachedInputTokens += u.CachedInputTokens
		l.OutputTokens += u.OutputTokens
	}
	if err := errors.Join(errs...); err != nil {
		return Statement{}, err
	}
	st := Statement{
		Tenant: tenant, Period: p.Key, Zone: p.Zone.String(),
		PeriodStart: p.Start.UTC(), PeriodEnd: p.End.UTC(),
		Currency: book.Currency, PriceBook: version(book),
	}
	for _, l := range lines {
		l.ChargeStart, l.ChargeEnd = l.ChargeStart.UTC(), l.ChargeEnd.UTC()
		// A repricing's charge is the difference the caller computed.
		if l.Priced && l.Kind != LineRepricing {
			charge, _, ok := books[l].ListCharge(l.Model, l.ChargeStart, int64(l.InputTokens), int64(l.CachedInputTokens), int64(l.OutputTokens))
			if !ok {
				return Statement{}, fmt.Errorf("%w: the charge of %s's %s line is out of range", ErrInvalidStatement, tenant, l.Model)
			}
			l.Charge = charge
		} else {
			st.UnpricedRequests += l.Requests
		}
		sum, ok := addMoney(st.Charge, l.Charge)
		if !ok {
			return Statement{}, fmt.Errorf("%w: %s's charge is out of range", ErrInvalidStatement, tenant)
		}
		st.Charge = sum
		st.Lines = append(st.Lines, *l)
	}
	slices.SortFunc(st.Lines, func(a, b StatementLine) int {
		return cmp.Or(cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind)), cmp.Compare(a.OriginalPeriod, b.OriginalPeriod),
			cmp.Compare(a.Model, b.Model), cmp.Compare(a.Deployment, b.Deployment), a.ChargeStart.Compare(b.ChargeStart))
	})
	total, rule, err := roundToMinorUnit(st.Charge, st.Currency)
	if err != nil {
		return Statement{}, err
	}
	st.Total, st.Rounding = total, rule
	st.Hash, err = st.ContentHash()
	return st, err
}

// Settle recomputes st's Charge (Σ lines' Charge + Σ Charges' Amount, exact
// in nano-units), Total (Charge rounded once to the minor unit), Rounding
// and Hash after Charges were added (Contract.Apply, credits). A statement
// without Charges settles to what ComputeStatement gave it.
func (st *Statement) Settle() error {
	var sum Money
	ok := true
	for _, l := range st.Lines {
		if sum, ok = addMoney(sum, l.Charge); !ok {
			break
		}
	}
	for _, c := range st.Charges {
		if !ok {
			break
		}
		sum, ok = addMoney(sum, c.Amount)
	}
	if !ok {
		return fmt.Errorf("%w: %s's charge is out of range", ErrInvalidStatement, st.Tenant)
	}
	total, rule, err := roundToMinorUnit(sum, st.Currency)
	if err != nil {
		return err
	}
	if len(st.Charges) > 0 {
		rule = strings.Replace(rule, "the sum of the lines' charges", "the sum of the lines' charges and of the charges' amounts", 1)
	}
	st.Charge, st.Total, st.Rounding = sum, total, rule
	st.Hash, err = st.ContentHash()
	return err
}

func kindOrder(k LineKind) int {
	switch k {
	case LineUsage:
		return 0
	case LineAdjustment:
		return 1
	}
	return 2
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// addMoney adds without overflowing int64 nano-units.
func addMoney(a, b Money) (Money, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// roundToMinorUnit rounds m once to the currency's minor unit (ISO 4217,
// from golang.org/x/text/currency: 2 decimals for USD and EUR, 0 for JPY, 3
// for KWD), half away from zero, and describes the rule.
func roundToMinorUnit(m Money, code string) (Money, string, error) {
	unit, err := currency.ParseISO(code)
	if err != nil {
		return 0, "", fmt.Errorf("%w: currency %q: %v", ErrInvalidStatement, code, err)
	}
	scale, _ := currency.Standard.Rounding(unit)
	step := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(9-scale)), nil) // nano-units per minor unit
	q, r := new(big.Int).QuoRem(big.NewInt(int64(m)), step, new(big.Int))
	if twice := new(big.Int).Abs(new(big.Int).Lsh(r, 1)); twice.Cmp(step) >= 0 {
		if m < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	rounded := q.Mul(q, step)
	if !rounded.IsInt64() {
		return 0, "", fmt.Errorf("%w: total out of range", ErrInvalidStatement)
	}
	unitName := fmt.Sprintf("%s %s", Money(step.Int64()).String(), code)
	return Money(rounded.Int64()), fmt.Sprintf("the sum of the lines' charges (nano-units), rounded once to %s (the minor unit), half away from zero", unitName), nil
}

// ContentHash is the SHA-256 (hex) of st's canonical JSON with its Hash
// and Finance left out: the same bill always has the same hash.
func (st Statement) ContentHash() (string, error) {
	st.Hash, st.Finance = "", nil
	b, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("hash statement: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
