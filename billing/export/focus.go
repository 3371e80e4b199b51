package export

import (
	"fmt"
	"io"
	"math/big"
	"math/bits"
	"strconv"
	"time"

	"github.com/parquet-go/parquet-go"

	"tokenmeter/billing"
)

// FocusVersion is the FOCUS version the focus formats follow.
const FocusVersion = "1.2"

// tokenKinds are the FOCUS rows of one source row, in order.
var tokenKinds = [3]string{"input", "cached_input", "output"}

var tokenKindWords = [3]string{"input", "cached input", "output"}

// focusSource is what a FOCUS row is made of, from either dataset.
type focusSource struct {
	tenant, currency, period                         string
	billingStart, billingEnd, chargeStart, chargeEnd time.Time
	adjustment, repricing                            bool
	originalPeriod, model, deployment                string
	requests                                         uint64
	// tokens and prices per kind: uncached input, cached input, output.
	tokens                            [3]uint64
	priced                            bool
	prices                            [3]billing.Money
	charge                            billing.Money
	priceID, priceBook, statementHash string
	hasCost                           bool
	allocated                         billing.Money
}

// focusLine is one FOCUS row: one token kind of a source.
type focusLine struct {
	src               *focusSource
	kind              int
	cost              billing.Money
	allocated, margin billing.Money
}

// FocusColumns is the header of the FOCUS dataset: the FOCUS 1.2 columns,
// then the project's x_ columns (finance adds x_AllocatedCost, x_Margin).
func FocusColumns(finance bool) []string {
	cols := []string{
		"BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart",
		"ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
		"ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceIssuerName",
		"ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName",
		"ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory",
		"SkuId", "SkuPriceId", "SubAccountId",
		"x_Period", "x_OriginalPeriod", "x_Model", "x_Deployment", "x_TokenKind", "x_Tokens", "x_Requests",
		"x_Priced", "x_PriceBook", "x_PriceId", "x_StatementHash",
	}
	if finance {
		cols = append(cols, "x_AllocatedCost", "x_Margin")
	}
	return cols
}

// Fixed values of the FOCUS mapping.
const (
	focusServiceCategory    = "AI and Machine Learning"
	focusServiceSubcategory = "Generative AI"
	focusChargeFrequency    = "Usage-Based"
	focusPricingCategory    = "Standard"
	focusConsumedUnit       = "Tokens"
	focusPricingUnit        = "1000000 Tokens"
	focusResourceType       = "Model Deployment"
)

// focusEncoder expands each source row into FOCUS rows and hands them to a
// CSV or Parquet encoder of focusLine.
type focusEncoder[R any] struct {
	source func(*R) (focusSource, error)
	out    rowEncoder[focusLine]
}

func newFocus[R any](w io.Writer, f Format, opts Options, source func(*R) (focusSource, error)) (*focusEncoder[R], error) {
	party := opts.Party.withDefaults()
	e := &focusEncoder[R]{source: source}
	switch f {
	case FocusCSV:
		c := &focusCSV{party: party, finance: opts.Finance, bStart: focusTimeText(), bEnd: focusTimeText(), cStart: focusTimeText(), cEnd: focusTimeText()}
		out, err := newCSV(w, FocusColumns(opts.Finance), isNumberColumn, c.fill)
		if err != nil {
			return nil, err
		}
		e.out = out
	case FocusParquet:
		po := append(parquetOptions(opts, "focus"), focusParquetMetadata()...)
		if opts.Finance {
			e.out = newParquet(w, po, func(l *focusLine, p *focusFinanceParquet) error {
				focusParquetOf(l, party, &p.focusParquet)
				if l.src.hasCost {
					p.AllocatedCost, p.Margin = moneyDecimalPtr(l.allocated), moneyDecimalPtr(l.margin)
				}
				return nil
			})
		} else {
			e.out = newParquet(w, po, func(l *focusLine, p *focusParquet) error {
				focusParquetOf(l, party, p)
				return nil
			})
		}
	}
	return e, nil
}

func (e *focusEncoder[R]) write(r *R) error {
	src, err := e.source(r)
	if err != nil {
		return err
	}
	lines, err := focusLines(&src)
	if err != nil {
		return err
	}
	for i := range lines {
		if lines[i].src == nil {
			continue
		}
		if err := e.out.write(&lines[i]); err != nil {
			return err
		}
	}
	return nil
}

func (e *focusEncoder[R]) flush() error { return e.out.flush() }
func (e *focusEncoder[R]) close() error { return e.out.close() }

// focusLines splits src into its token kinds: the charge by largest
// remainder of the exact per-kind charges, the allocated cost by largest
// remainder of the tokens. Kinds with no tokens are left out (nil src),
// except input, which carries the requests.
func focusLines(src *focusSource) ([3]focusLine, error) {
	costs := splitByExactCharge(src.charge, src.tokens, src.prices)
	var allocated [3]billing.Money
	if src.hasCost {
		allocated = splitByTokens(src.allocated, src.tokens)
	}
	var lines [3]focusLine
	for k := range 3 {
		if k > 0 && src.tokens[k] == 0 && costs[k] == 0 && allocated[k] == 0 {
			continue
		}
		l := focusLine{src: src, kind: k, cost: costs[k], allocated: allocated[k]}
		if src.hasCost {
			l.margin = costs[k] - allocated[k]
			if (allocated[k] > 0 && l.margin > costs[k]) || (allocated[k] < 0 && l.margin < costs[k]) {
				return lines, fmt.Errorf("margin of %s's %s: out of range", src.tenant, src.model)
			}
		}
		lines[k] = l
	}
	return lines, nil
}

// splitByExactCharge splits a charge over token kinds in proportion to
// the kinds' exact charges, tokens × price per 1M.
func splitByExactCharge(total billing.Money, tokens [3]uint64, prices [3]billing.Money) [3]billing.Money {
	var w [3]uint64
	var sum, carry uint64
	fits := true
	for k := range 3 {
		hi, lo := bits.Mul64(tokens[k], uint64(prices[k]))
		sum, carry = bits.Add64(sum, lo, 0)
		fits = fits && prices[k] >= 0 && hi == 0 && carry == 0
		w[k] = lo
	}
	if fits {
		return splitMoney64(total, w)
	}
	var exact [3]*big.Int
	for k := range 3 {
		exact[k] = new(big.Int).Mul(new(big.Int).SetUint64(tokens[k]), big.NewInt(int64(prices[k])))
	}
	return splitMoney(total, exact)
}

// splitByTokens splits an amount over token kinds in proportion to their
// tokens.
func splitByTokens(total billing.Money, tokens [3]uint64) [3]billing.Money {
	if _, carry := bits.Add64(tokens[0], tokens[1], 0); carry == 0 {
		if _, carry := bits.Add64(tokens[0]+tokens[1], tokens[2], 0); carry == 0 {
			return splitMoney64(total, tokens)
		}
	}
	var w [3]*big.Int
	for k := range 3 {
		w[k] = new(big.Int).SetUint64(tokens[k])
	}
	return splitMoney(total, w)
}

// splitMoney64 is splitMoney for weights whose sum fits in a uint64,
// without allocating.
func splitMoney64(total billing.Money, weights [3]uint64) [3]billing.Money {
	var parts [3]billing.Money
	sum := weights[0] + weights[1] + weights[2]
	if sum == 0 {
		parts[0] = total
		return parts
	}
	t := uint64(total)
	if total < 0 {
		t = -t
	}
	var rems [3]uint64
	var given uint64
	for k, w := range weights {
		// t × w / sum ≤ t < 2^64, so the quotient fits and Div64 cannot panic.
		hi, lo := bits.Mul64(t, w)
		q, r := bits.Div64(hi, lo, sum)
		parts[k], rems[k] = billing.Money(q), r
		given += q
	}
	for left := t - given; left > 0; left-- { // left < 3
		best := -1
		for k := range 3 {
			if rems[k] > 0 && (best < 0 || rems[k] > rems[best]) {
				best = k
			}
		}
		parts[best]++
		rems[best] = 0
	}
	if total < 0 {
		for k := range parts {
			parts[k] = -parts[k]
		}
	}
	return parts
}

// splitMoney splits total over weights (non-negative) by largest
// remainder: the parts add up to total exactly, each within one nano-unit
// of total × weight / Σ weights; ties go to the earlier part. With no
// weight, the first part takes all.
func splitMoney(total billing.Money, weights [3]*big.Int) [3]billing.Money {
	var parts [3]billing.Money
	sum := new(big.Int)
	for _, w := range weights {
		sum.Add(sum, w)
	}
	if sum.Sign() == 0 {
		parts[0] = total
		return parts
	}
	t := big.NewInt(int64(total))
	neg := t.Sign() < 0
	t.Abs(t)
	var rems [3]*big.Int
	var given int64
	for k, w := range weights {
		q, r := new(big.Int).QuoRem(new(big.Int).Mul(t, w), sum, new(big.Int))
		parts[k] = billing.Money(q.Int64()) // ≤ |total|: fits
		rems[k] = r
		given += q.Int64()
	}
	for left := t.Int64() - given; left > 0; left-- { // left < 3
		best := -1
		for k := range 3 {
			if rems[k].Sign() > 0 && (best < 0 || rems[k].Cmp(rems[best]) > 0) {
				best = k
			}
		}
		parts[best]++
		rems[best].SetInt64(0)
	}
	if neg {
		for k := range parts {
			parts[k] = -parts[k]
		}
	}
	return parts
}

func focusTimeText() timeText { return timeText{layout: focusTime} }

// category is ChargeCategory and ChargeClass (empty: null).
func (l *focusLine) category() (category, class string) {
	if l.src.adjustment {
		return "Adjustment", "Correction"
	}
	return "Usage", ""
}

func (l *focusLine) description() string {
	s := l.src
	d := s.model + " " + tokenKindWords[l.kind] + " tokens"
	if s.priced {
		d += " at " + s.prices[l.kind].String() + " " + s.currency + " per 1M tokens"
	} else {
		d += " (no list price)"
	}
	switch {
	case s.repricing:
		d = "repricing of " + s.originalPeriod + " with price book " + s.priceBook + ": " + s.model + " at the prices in force now, less what was billed"
	case s.adjustment:
		d = "late usage of " + s.originalPeriod + ": " + d
	}
	return d
}

func (l *focusLine) skuID() string { return l.src.model + ":" + tokenKinds[l.kind] }

func (l *focusLine) requests() uint64 {
	if l.kind == 0 {
		return l.src.requests
	}
	return 0
}

func (p FocusParty) accountID(tenant string) string {
	if p.BillingAccountID != "" {
		return p.BillingAccountID
	}
	return tenant
}

func (p FocusParty) accountName(tenant string) string {
	if p.BillingAccountName != "" {
		return p.BillingAccountName
	}
	return tenant
}

type focusCSV struct {
	party                      FocusParty
	finance                    bool
	bStart, bEnd, cStart, cEnd timeText
}

// fill writes one FOCUS row; an empty field is a null.
func (c *focusCSV) fill(l *focusLine, rec []string) ([]string, error) {
	s := l.src
	category, class := l.category()
	cost := l.cost.String()
	var consumed, consumedUnit string
	if !s.adjustment {
		consumed, consumedUnit = uintText(s.tokens[l.kind]), focusConsumedUnit
	}
	var unitPrice, skuPriceID string
	if s.priced {
		unitPrice = s.prices[l.kind].String()
		skuPriceID = s.priceID + ":" + tokenKinds[l.kind]
	}
	var resourceType string
	if s.deployment != "" {
		resourceType = focusResourceType
	}
	rec = append(rec,
		cost, c.party.accountID(s.tenant), c.party.accountName(s.tenant), s.currency,
		c.bEnd.format(s.billingEnd), c.bStart.format(s.billingStart),
		category, class, l.description(), focusChargeFrequency, c.cEnd.format(s.chargeEnd), c.cStart.format(s.chargeStart),
		consumed, consumedUnit, cost, unitPrice, cost, c.party.InvoiceIssuerName,
		cost, unitPrice, focusPricingCategory, scaledText(s.tokens[l.kind], 6), focusPricingUnit,
		c.party.ProviderName, c.party.PublisherName,
		s.deployment, s.deployment, resourceType, focusServiceCategory, c.party.ServiceName, focusServiceSubcategory,
		l.skuID(), skuPriceID, s.tenant,
		s.period, s.originalPeriod, s.model, s.deployment, tokenKinds[l.kind], uintText(s.tokens[l.kind]), uintText(l.requests()),
		strconv.FormatBool(s.priced), s.priceBook, s.priceID, s.statementHash)
	if c.finance {
		if s.hasCost {
			rec = append(rec, l.allocated.String(), l.margin.String())
		} else {
			rec = append(rec, "", "")
		}
	}
	return rec, nil
}

// focusParquet is a FOCUS row in Parquet: Decimal columns are
// DECIMAL(38, 9), Date/Time columns TIMESTAMP(MICROS, UTC), nullable
// columns optional (pointers), the others required.
type focusParquet struct {
	BilledCost          decimal16  `parquet:"BilledCost,decimal(9:38)"`
	BillingAccountID    string     `parquet:"BillingAccountId"`
	BillingAccountName  *string    `parquet:"BillingAccountName"`
	BillingCurrency     string     `parquet:"BillingCurrency"`
	BillingPeriodEnd    time.Time  `parquet:"BillingPeriodEnd,timestamp(microsecond)"`
	BillingPeriodStart  time.Time  `parquet:"BillingPeriodStart,timestamp(microsecond)"`
	ChargeCategory      string     `parquet:"ChargeCategory"`
	ChargeClass         *string    `parquet:"ChargeClass"`
	ChargeDescription   *string    `parquet:"ChargeDescription"`
	ChargeFrequency     string     `parquet:"ChargeFrequency"`
	ChargePeriodEnd     time.Time  `parquet:"ChargePeriodEnd,timestamp(microsecond)"`
	ChargePeriodStart   time.Time  `parquet:"ChargePeriodStart,timestamp(microsecond)"`
	ConsumedQuantity    *decimal16 `parquet:"ConsumedQuantity,decimal(9:38)"`
	ConsumedUnit        *string    `parquet:"ConsumedUnit"`
	ContractedCost      decimal16  `parquet:"ContractedCost,decimal(9:38)"`
	ContractedUnitPrice *decimal16 `parquet:"ContractedUnitPrice,decimal(9:38)"`
	EffectiveCost       decimal16  `parquet:"EffectiveCost,decimal(9:38)"`
	InvoiceIssuerName   string     `parquet:"InvoiceIssuerName"`
	ListCost            decimal16  `parquet:"ListCost,decimal(9:38)"`
	ListUnitPrice       *decimal16 `parquet:"ListUnitPrice,decimal(9:38)"`
	PricingCategory     *string    `parquet:"PricingCategory"`
	PricingQuantity     *decimal16 `parquet:"PricingQuantity,decimal(9:38)"`
	PricingUnit         *string    `parquet:"PricingUnit"`
	ProviderName        string     `parquet:"ProviderName"`
	PublisherName       string     `parquet:"PublisherName"`
	ResourceID          *string    `parquet:"ResourceId"`
	ResourceName        *string    `parquet:"ResourceName"`
	ResourceType        *string    `parquet:"ResourceType"`
	ServiceCategory     string     `parquet:"ServiceCategory"`
	ServiceName         string     `parquet:"ServiceName"`
	ServiceSubcategory  string     `parquet:"ServiceSubcategory"`
	SkuID               *string    `parquet:"SkuId"`
	SkuPriceID          *string    `parquet:"SkuPriceId"`
	SubAccountID        *string    `parquet:"SubAccountId"`
	XPeriod             string     `parquet:"x_Period"`
	XOriginalPeriod     *string    `parquet:"x_OriginalPeriod"`
	XModel              string     `parquet:"x_Model"`
	XDeployment         *string    `parquet:"x_Deployment"`
	XTokenKind          string     `parquet:"x_TokenKind"`
	XTokens             uint64     `parquet:"x_Tokens"`
	XRequests           uint64     `parquet:"x_Requests"`
	XPriced             bool       `parquet:"x_Priced"`
	XPriceBook          string     `parquet:"x_PriceBook"`
	XPriceID            *string    `parquet:"x_PriceId"`
	XStatementHash      *string    `parquet:"x_StatementHash"`
}

type focusFinanceParquet struct {
	focusParquet
	AllocatedCost *decimal16 `parquet:"x_AllocatedCost,decimal(9:38)"`
	Margin        *decimal16 `parquet:"x_Margin,decimal(9:38)"`
}

func focusParquetMetadata() []parquet.WriterOption {
	return []parquet.WriterOption{parquet.KeyValueMetadata("focus.version", FocusVersion)}
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func focusParquetOf(l *focusLine, party FocusParty, p *focusParquet) {
	s := l.src
	category, class := l.category()
	cost := moneyDecimal(l.cost)
	*p = focusParquet{
		BilledCost: cost, BillingAccountID: party.accountID(s.tenant), BillingAccountName: optString(party.accountName(s.tenant)),
		BillingCurrency: s.currency, BillingPeriodEnd: utcMicros(s.billingEnd), BillingPeriodStart: utcMicros(s.billingStart),
		ChargeCategory: category, ChargeClass: optString(class), ChargeDescription: optString(l.description()),
		ChargeFrequency: focusChargeFrequency, ChargePeriodEnd: utcMicros(s.chargeEnd), ChargePeriodStart: utcMicros(s.chargeStart),
		ContractedCost: cost, EffectiveCost: cost, InvoiceIssuerName: party.InvoiceIssuerName, ListCost: cost,
		PricingCategory: optString(focusPricingCategory), PricingUnit: optString(focusPricingUnit),
		ProviderName: party.ProviderName, PublisherName: party.PublisherName,
		ServiceCategory: focusServiceCategory, ServiceName: party.ServiceName, ServiceSubcategory: focusServiceSubcategory,
		SkuID: optString(l.skuID()), SubAccountID: optString(s.tenant),
		XPeriod: s.period, XOriginalPeriod: optString(s.originalPeriod), XModel: s.model, XDeployment: optString(s.deployment),
		XTokenKind: tokenKinds[l.kind], XTokens: s.tokens[l.kind], XRequests: l.requests(), XPriced: s.priced,
		XPriceBook: s.priceBook, XPriceID: optString(s.priceID), XStatementHash: optString(s.statementHash),
	}
	quantity := scaledDecimal(s.tokens[l.kind], 6)
	p.PricingQuantity = &quantity
	if !s.adjustment {
		consumed := scaledDecimal(s.tokens[l.kind], 0)
		p.ConsumedQuantity, p.ConsumedUnit = &consumed, optString(focusConsumedUnit)
	}
	if s.priced {
		price := moneyDecimal(s.prices[l.kind])
		p.ListUnitPrice, p.ContractedUnitPrice = &price, &price
		p.SkuPriceID = optString(s.priceID + ":" + tokenKinds[l.kind])
	}
	if s.deployment != "" {
		p.ResourceID, p.ResourceName, p.ResourceType = optString(s.deployment), optString(s.deployment), optString(focusResourceType)
	}
}
