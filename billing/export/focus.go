package export

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"math/bits"
	"strconv"
	"time"

	"tokenmeter/billing"
)

// FocusVersion is the FOCUS version the focus formats follow.
const FocusVersion = "1.2"

// tokenKinds are the FOCUS rows of one source row, in order.
var tokenKinds = [3]string{"input", "cached_input", "output"}

var tokenKindWords = [3]string{"input", "cached input", "output"}

// skuMeters are the SkuMeter of each token kind: the functionality the SKU
// meters.
var skuMeters = [3]string{"Input Tokens", "Cached Input Tokens", "Output Tokens"}

// sourceKind says what a FOCUS source is.
type sourceKind int

const (
	// sourceUsage is usage of the row's own billing period.
	sourceUsage sourceKind = iota
	// sourceLate is late usage of a closed period billed in a later one.
	sourceLate
	// sourceRepricing is a repricing of a closed period: an amount only.
	sourceRepricing
	// sourceRounding is a statement's rounding row: its payable total
	// less the exact costs of its other rows.
	sourceRounding
	// sourceDedicated is a dedicated deployment's GPU-hours at a
	// contracted rate (billing.ChargeDedicated).
	sourceDedicated
	// sourceCommitment is the true-up of a committed spend not reached
	// (billing.ChargeCommitment).
	sourceCommitment
	// sourceCredit is a draw on a credit grant (billing.ChargeCredit).
	sourceCredit
	// sourceTax is the tax of a statement's invoice (RowTax).
	sourceTax
)

// focusSource is what a FOCUS row is made of, from either dataset.
type focusSource struct {
	kind                                             sourceKind
	tenant, currency, period                         string
	billingStart, billingEnd, chargeStart, chargeEnd time.Time
	originalPeriod, model, deployment, region        string
	invoiceID                                        string
	requests                                         uint64
	// tokens and list prices per kind: uncached input, cached input,
	// output.
	tokens [3]uint64
	priced bool
	prices [3]billing.Money
	// discounts are the contract's prices of parts of each kind's tokens
	// (billing.ChargeDiscount); the kind's other tokens are at list.
	discounts                         [3][]discountPart
	charge                            billing.Money
	priceID, priceBook, statementHash string
	hasCost                           bool
	allocated                         billing.Money
	// total is a rounding row's statement total.
	total billing.Money
	// taxRate is a tax row's rate.
	taxRate billing.Weight
	// repriced, on a repricing broken down by kind, is each kind's part of
	// its charge (tokens holds the kinds' tokens).
	repriced *[3]billing.Money
	// repricedDiscount, on a repricing under a contract, is what the
	// contract changes in each kind's part (discounts of rule
	// contract_repricing): the kind's contracted cost is the sum.
	repricedDiscount [3]billing.Money
	// Of a charge (dedicated, commitment, credit): its quantity in
	// millionths (GPU-hours), unit price, amount, rule and description.
	quantityMicro uint64
	unitPrice     billing.Money
	rule, text    string
}

// discountPart is tokens of one kind at a contracted price per 1M.
type discountPart struct {
	tokens uint64
	price  billing.Money
	rule   string
}

// rowKind says what a FOCUS row bills.
type rowKind int

const (
	rowTokens   rowKind = iota // tokens of one kind (kind)
	rowAmount                  // an amount without quantity: repricing, commitment, credit, rounding
	rowGPUHours                // GPU-hours of a dedicated deployment
	rowRepriced                // a repricing's part of one token kind (kind)
)

// focusLine is one FOCUS row of a source.
type focusLine struct {
	src  *focusSource
	row  rowKind
	kind int // token kind of a rowTokens row
	// quantity in units of 10^-shift: tokens (shift 0), GPU-hours
	// (shift 6).
	quantity uint64
	// listPrice and price (contracted) per pricing unit, when priced.
	priced           bool
	listPrice, price billing.Money
	// listCost and cost (contracted = effective = billed), exact; a tax
	// row's contracted (and effective) cost is its own (hasContracted).
	listCost, cost cost
	contracted     cost
	hasContracted  bool
	requests       uint64
	rule           string
	allocated      billing.Money
	margin         cost
	// account is the row's billing account; skuPrice its price's ids.
	account  *focusAccount
	skuPrice *focusPrice
}

// FocusColumns is the header of the FOCUS dataset: the FOCUS 1.2 columns,
// then the project's x_ columns (finance adds x_AllocatedCost, x_Margin).
func FocusColumns(finance bool) []string {
	cols := []string{
		"BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart",
		"ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
		"ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceId", "InvoiceIssuerName",
		"ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName",
		"RegionId", "RegionName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory",
		"SkuId", "SkuMeter", "SkuPriceDetails", "SkuPriceId", "SubAccountId", "SubAccountName",
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
	focusUsageFrequency     = "Usage-Based"
	focusOneTimeFrequency   = "One-Time"
	focusRecurringFrequency = "Recurring"
	focusPricingCategory    = "Standard"
	focusConsumedUnit       = "Tokens"
	focusPricingUnit        = "1000000 Tokens"
	focusGPUHoursUnit       = "GPU-Hours"
	focusResourceType       = "Model Deployment"
	focusDedicatedSku       = "dedicated-gpu-hour"
	focusDedicatedMeter     = "Dedicated GPU Hours"
)

// focusAccount is the billing account columns of one tenant.
type focusAccount struct {
	tenant, id, name string
}

// focusPrice is the ids of one price.
type focusPrice struct {
	skuPriceID, details string
}

// focusEncoder expands each source row into FOCUS rows and hands them to a
// CSV or Parquet encoder of focusLine.
type focusEncoder[R any] struct {
	source   func(*R) (focusSource, error)
	out      rowEncoder[focusLine]
	finance  bool
	weights  [3]uint64
	names    focusNames
	accounts *billing.Accounts
	account  focusAccount
	prices   map[focusPriceKey]*focusPrice
	lines    []focusLine
	// sum is the exact cost of the rows written since the last rounding
	// row: what the next rounding row brings to its statement's total;
	// sumList is their list cost. stList and stCost are a statement's
	// list cost and cost, kept at its rounding row for its tax row.
	sum, sumList   cost
	stList, stCost cost
}

type focusPriceKey struct {
	priceID string
	kind    int
	price   billing.Money
}

// focusNames are the operator's names on every row.
type focusNames struct {
	provider, publisher, issuer, service string
}

func newFocus[R any](w io.Writer, f Format, opts Options, source func(*R) (focusSource, error)) (*focusEncoder[R], error) {
	provider, publisher, issuer := opts.Accounts.Names()
	names := focusNames{provider: provider, publisher: publisher, issuer: issuer, service: opts.ServiceName}
	if names.service == "" {
		names.service = provider + " inference"
	}
	e := &focusEncoder[R]{source: source, finance: opts.Finance, weights: opts.gpuTimeWeights(), names: names,
		accounts: opts.Accounts, prices: map[focusPriceKey]*focusPrice{}}
	e.account.tenant = "\x00" // no tenant yet
	switch f {
	case FocusCSV:
		c := &focusCSV{names: names, finance: opts.Finance, bStart: focusTimeText(), bEnd: focusTimeText(), cStart: focusTimeText(), cEnd: focusTimeText()}
		out, err := newCSV(w, FocusColumns(opts.Finance), isNumberColumn, c.fill)
		if err != nil {
			return nil, err
		}
		e.out = out
	case FocusParquet:
		po := append(parquetOptions(opts, "focus"), focusParquetMetadata(opts)...)
		if opts.Finance {
			e.out = newParquet(w, po, func(l *focusLine, p *focusFinanceParquet) error {
				focusParquetOf(l, names, true, &p.focusParquet)
				if l.src.hasCost {
					allocated, margin := moneyDecimal(l.allocated), l.margin.decimal()
					p.AllocatedCost, p.Margin = &allocated, &margin
				}
				return nil
			})
		} else {
			e.out = newParquet(w, po, func(l *focusLine, p *focusParquet) error {
				focusParquetOf(l, names, false, p)
				return nil
			})
		}
	}
	return e, nil
}

func (e *focusEncoder[R]) write(r *R) (int, error) {
	src, err := e.source(r)
	if err != nil {
		return 0, err
	}
	acct := e.accountOf(src.tenant)
	switch src.kind {
	case sourceRounding:
		c := costOfMoney(src.total).sub(e.sum)
		l := focusLine{src: &src, row: rowAmount, listCost: c, cost: c, account: acct}
		e.stList, e.stCost = e.sumList.add(c), costOfMoney(src.total)
		e.sum, e.sumList = cost{}, cost{}
		_, err := e.out.write(&l)
		return 1, err
	case sourceTax:
		// FOCUS: a tax's list and contracted costs are computed from those
		// of the charges taxed; BilledCost is the invoice's tax.
		l := focusLine{src: &src, row: rowAmount, listCost: e.stList.mulRate(src.taxRate), cost: costOfMoney(src.charge), account: acct}
		l.contracted = e.stCost.mulRate(src.taxRate)
		l.hasContracted = true
		_, err := e.out.write(&l)
		return 1, err
	}
	e.lines, err = focusLines(&src, e.weights, e.lines[:0])
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range e.lines {
		l := &e.lines[i]
		l.account = acct
		if l.priced {
			l.skuPrice = e.priceOf(l)
		}
		if _, err := e.out.write(l); err != nil {
			return n, err
		}
		e.sum, e.sumList = e.sum.add(l.cost), e.sumList.add(l.listCost)
		n++
	}
	return n, nil
}

func (e *focusEncoder[R]) flush() error { return e.out.flush() }
func (e *focusEncoder[R]) close() error { return e.out.close() }

// accountOf is tenant's billing account columns; consecutive rows of one
// tenant share them.
func (e *focusEncoder[R]) accountOf(tenant string) *focusAccount {
	if e.account.tenant != tenant {
		a := e.accounts.Tenant(tenant)
		e.account = focusAccount{tenant: tenant, id: a.BillingAccountID, name: a.DisplayName()}
		if e.account.id == "" {
			e.account.id = tenant
		}
	}
	return &e.account
}

// priceOf is the SkuPriceId and SkuPriceDetails of l's list price. The id
// is the price entry's id, the token kind and a fingerprint of the price:
// a price edited in place (same model and start) gets a new id, so that
// one SkuPriceId always has one ListUnitPrice. A dedicated GPU-hour's is
// its contract rate's (the rule) and its fingerprint.
func (e *focusEncoder[R]) priceOf(l *focusLine) *focusPrice {
	src := l.src
	id, kindName, kind := src.priceID, "", l.kind
	fingerprint := id
	if l.row == rowGPUHours {
		// The rate's rule names the deployment: it goes into the
		// fingerprint only, so a tenant's file names no deployment.
		id, kindName, kind, fingerprint = focusDedicatedSku, "gpu_hours", -1, l.rule
	} else {
		kindName = tokenKinds[kind]
	}
	k := focusPriceKey{priceID: fingerprint, kind: kind, price: l.listPrice}
	if p, ok := e.prices[k]; ok {
		return p
	}
	sum := sha256.Sum256([]byte(fingerprint + "\x00" + kindName + "\x00" + l.listPrice.String() + "\x00" + src.currency))
	var details []byte
	if l.row == rowGPUHours {
		details, _ = json.Marshal(struct {
			Kind string `json:"x_Kind"`
		}{"dedicated GPU-hour"})
	} else {
		details, _ = json.Marshal(struct {
			Model     string `json:"x_Model"`
			TokenKind string `json:"x_TokenKind"`
		}{src.model, kindName})
	}
	p := &focusPrice{skuPriceID: id + ":" + kindName + "#" + hex.EncodeToString(sum[:4]), details: string(details)}
	if len(e.prices) > 4096 {
		clear(e.prices)
	}
	e.prices[k] = p
	return p
}

// focusLines appends src's FOCUS rows to out. A source of tokens has a row
// per token kind and contracted price: the tokens under each discount of
// the kind at its price, then the kind's other tokens at list; a kind
// without tokens has none, except uncached input, which is always written
// (its first row carries the requests). Costs are exact: quantity × unit
// price. The allocated cost is split over the kinds by GPU time
// (gpuTimeWeights), then over a kind's rows by tokens, by largest
// remainder. A repricing, commitment or credit is one row of its amount,
// a dedicated deployment one row of its GPU-hours.
func focusLines(src *focusSource, weights [3]uint64, out []focusLine) ([]focusLine, error) {
	switch src.kind {
	case sourceRepricing:
		d := src.repricedDiscount
		if src.repriced == nil {
			return append(out, focusLine{src: src, row: rowAmount, kind: -1, listCost: costOfMoney(src.charge), cost: costOfMoney(src.charge + d[0] + d[1] + d[2])}), nil
		}
		for k := range 3 {
			if k > 0 && src.tokens[k] == 0 && src.repriced[k] == 0 && d[k] == 0 {
				continue
			}
			out = append(out, focusLine{src: src, row: rowRepriced, kind: k, quantity: src.tokens[k], listCost: costOfMoney(src.repriced[k]), cost: costOfMoney(src.repriced[k] + d[k])})
		}
		return out, nil
	case sourceCommitment, sourceCredit:
		c := costOfMoney(src.charge)
		return append(out, revenueMargin(focusLine{src: src, row: rowAmount, kind: -1, listCost: c, cost: c})), nil
	case sourceDedicated:
		c, err := costOfProduct(src.quantityMicro, src.unitPrice)
		if err != nil {
			return out, fmt.Errorf("%s's dedicated GPU-hours on %s: %w", src.tenant, src.deployment, err)
		}
		return append(out, revenueMargin(focusLine{src: src, row: rowGPUHours, kind: -1, quantity: src.quantityMicro, rule: src.rule,
			priced: true, listPrice: src.unitPrice, price: src.unitPrice, listCost: c, cost: c})), nil
	}
	var allocated [3]billing.Money
	if src.hasCost {
		allocated = splitByGPUTime(src.allocated, src.tokens, weights)
	}
	for k := range 3 {
		first := len(out)
		left := src.tokens[k]
		parts := src.discounts[k]
		for _, d := range parts {
			if d.tokens > left {
				return out, fmt.Errorf("%s's %s %s tokens: discounts cover %d tokens, more than the line's %d", src.tenant, src.model, tokenKinds[k], d.tokens, src.tokens[k])
			}
			left -= d.tokens
		}
		if left > 0 || len(parts) == 0 {
			parts = append(parts[:len(parts):len(parts)], discountPart{tokens: left, price: src.prices[k]})
		}
		for _, d := range parts {
			if k > 0 && d.tokens == 0 && len(src.discounts[k]) == 0 && allocated[k] == 0 {
				continue
			}
			l := focusLine{src: src, row: rowTokens, kind: k, quantity: d.tokens, priced: src.priced, rule: d.rule}
			if src.priced {
				l.listPrice, l.price = src.prices[k], d.price
				var err error
				if l.listCost, err = costOfProduct(d.tokens, l.listPrice); err == nil {
					l.cost, err = costOfProduct(d.tokens, l.price)
				}
				if err != nil {
					return out, fmt.Errorf("%s's %s %s tokens: %w", src.tenant, src.model, tokenKinds[k], err)
				}
			}
			if k == 0 && len(out) == first {
				l.requests = src.requests
			}
			out = append(out, l)
		}
		if src.hasCost && len(out) > first {
			rows := out[first:]
			w := make([]uint64, len(rows))
			for i := range rows {
				w[i] = rows[i].quantity
			}
			for i, a := range splitByWeights(allocated[k], w) {
				rows[i].allocated = a
				rows[i].margin = rows[i].cost.sub(costOfMoney(a))
			}
		}
	}
	return out, nil
}

// revenueMargin gives a contract charge's row (dedicated GPU-hours, a
// commitment's true-up) with finance's figures (hasCost) its margin: its
// cost less its allocated cost (0: the GPU cost is on the usage rows), as
// the statement's finance counts the charge as revenue
// (billing.StatementFinance), so that a statement's x_Margin add up to its
// margin.
func revenueMargin(l focusLine) focusLine {
	if l.src.hasCost {
		l.allocated = l.src.allocated
		l.margin = l.cost.sub(costOfMoney(l.allocated))
	}
	return l
}

// splitByWeights splits total over weights by largest remainder (the
// first part takes all without weight).
func splitByWeights(total billing.Money, weights []uint64) []billing.Money {
	parts := make([]billing.Money, len(weights))
	if len(weights) == 1 {
		parts[0] = total
		return parts
	}
	bw := make([]*big.Int, len(weights))
	for k, w := range weights {
		bw[k] = new(big.Int).SetUint64(w)
	}
	splitLargestRemainder(parts, total, bw)
	return parts
}

// DefaultGPUTimeWeights is the GPU time of one token of each kind (uncached
// input, cached input, output), in tenths of an uncached input token's:
// prefill computes a prompt's uncached tokens in parallel (1), a prefix-cache
// hit skips most of that work (0.1), and decode runs one forward step per
// output token, memory-bound (4). Options.GPUTimeWeights overrides them.
var DefaultGPUTimeWeights = [3]uint64{10, 1, 40}

// splitByGPUTime splits a row's allocated GPU cost over its token kinds in
// proportion to the GPU time they took: tokens × weights.
func splitByGPUTime(total billing.Money, tokens, weights [3]uint64) [3]billing.Money {
	var w [3]uint64
	var sum uint64
	fits := true
	for k := range 3 {
		hi, lo := bits.Mul64(tokens[k], weights[k])
		var carry uint64
		sum, carry = bits.Add64(sum, lo, 0)
		fits = fits && hi == 0 && carry == 0
		w[k] = lo
	}
	if fits {
		return splitMoney64(total, w)
	}
	var big3 [3]*big.Int
	for k := range 3 {
		big3[k] = new(big.Int).Mul(new(big.Int).SetUint64(tokens[k]), new(big.Int).SetUint64(weights[k]))
	}
	return splitMoney(total, big3)
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

// splitMoney splits total over three weights: splitLargestRemainder.
func splitMoney(total billing.Money, weights [3]*big.Int) [3]billing.Money {
	var parts [3]billing.Money
	splitLargestRemainder(parts[:], total, weights[:])
	return parts
}

// splitLargestRemainder splits total over weights (non-negative) into
// parts (as many as weights) by largest remainder: the parts add up to
// total exactly, each within one nano-unit of total × weight / Σ weights;
// ties go to the earlier part. With no weight, the first part takes all.
func splitLargestRemainder(parts []billing.Money, total billing.Money, weights []*big.Int) {
	sum := new(big.Int)
	for _, w := range weights {
		sum.Add(sum, w)
	}
	if sum.Sign() == 0 {
		parts[0] = total
		return
	}
	t := big.NewInt(int64(total))
	neg := t.Sign() < 0
	t.Abs(t)
	rems := make([]*big.Int, len(weights))
	var given int64
	for k, w := range weights {
		q, r := new(big.Int).QuoRem(new(big.Int).Mul(t, w), sum, new(big.Int))
		parts[k] = billing.Money(q.Int64()) // ≤ |total|: fits
		rems[k] = r
		given += q.Int64()
	}
	for left := t.Int64() - given; left > 0; left-- { // left < len(weights)
		best := -1
		for k := range rems {
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
}

func focusTimeText() timeText { return timeText{layout: focusTime} }

// category is ChargeCategory and ChargeClass (empty: null).
func (l *focusLine) category() (category, class string) {
	switch l.src.kind {
	case sourceLate, sourceRepricing:
		return "Usage", "Correction"
	case sourceCommitment:
		if l.src.originalPeriod != "" {
			return "Adjustment", "Correction" // late usage absorbing an earlier period's true-up
		}
		return "Adjustment", ""
	case sourceRounding:
		return "Adjustment", ""
	case sourceCredit:
		return "Credit", ""
	case sourceTax:
		return "Tax", ""
	}
	return "Usage", ""
}

func (l *focusLine) frequency() string {
	switch l.src.kind {
	case sourceRounding, sourceCredit, sourceTax:
		return focusOneTimeFrequency
	case sourceCommitment:
		return focusRecurringFrequency
	}
	return focusUsageFrequency
}

// description is ChargeDescription. A tenant's view (finance false) names
// no deployment: no contract rule (a rule may name one) and a dedicated
// deployment's GPU-hours without its name.
func (l *focusLine) description(finance bool) string {
	s := l.src
	switch s.kind {
	case sourceRepricing:
		d := "repricing of " + s.originalPeriod + ": " + s.model
		if l.row == rowRepriced {
			d += " " + tokenKindWords[l.kind] + " tokens"
		}
		return d + " at the prices in force now, less what was billed"
	case sourceRounding:
		return "rounding of the statement of " + s.period + " to its payable total " + s.total.String() + " " + s.currency +
			" (the currency's minor unit, half away from zero)"
	case sourceDedicated:
		if !finance {
			return "dedicated deployment: " + scaledText(l.quantity, 6) + " GPU-hours at " + l.price.String() + " " + s.currency + " per GPU-hour"
		}
		return s.text
	case sourceCommitment, sourceCredit, sourceTax:
		return s.text
	}
	d := s.model + " " + tokenKindWords[l.kind] + " tokens"
	switch {
	case !s.priced:
		d += " (no list price)"
	case l.price != l.listPrice && finance:
		d += " at " + l.price.String() + " " + s.currency + " per 1M tokens (contract " + l.rule + "; list " + l.listPrice.String() + ")"
	case l.price != l.listPrice:
		d += " at " + l.price.String() + " " + s.currency + " per 1M tokens (contract price; list " + l.listPrice.String() + ")"
	default:
		d += " at " + l.price.String() + " " + s.currency + " per 1M tokens"
	}
	if s.kind == sourceLate {
		d = "late usage of " + s.originalPeriod + ": " + d
	}
	return d
}

func (l *focusLine) skuID() string {
	switch l.row {
	case rowTokens, rowRepriced:
		return l.src.model + ":" + tokenKinds[l.kind]
	case rowGPUHours:
		return focusDedicatedSku
	}
	return ""
}

func (l *focusLine) skuMeter() string {
	switch l.row {
	case rowTokens, rowRepriced:
		return skuMeters[l.kind]
	case rowGPUHours:
		return focusDedicatedMeter
	}
	return ""
}

func (l *focusLine) tokenKind() string {
	if l.row != rowTokens && l.row != rowRepriced {
		return ""
	}
	return tokenKinds[l.kind]
}

// tokens is x_Tokens: the tokens of a row of tokens.
func (l *focusLine) tokens() uint64 {
	if l.row != rowTokens {
		return 0
	}
	return l.quantity
}

// quantities are ConsumedQuantity and PricingQuantity as (value, decimals)
// and their units; ok false when null. A repricing's rows have a
// PricingQuantity (the tokens repriced) and a null ConsumedQuantity (the
// tokens were consumed, and counted, in the period repriced): cUnit "".
func (l *focusLine) quantities() (consumed, pricing uint64, cShift, pShift int, cUnit, pUnit string, ok bool) {
	switch l.row {
	case rowRepriced:
		return 0, l.quantity, 0, 6, "", focusPricingUnit, true
	case rowTokens:
		return l.quantity, l.quantity, 0, 6, focusConsumedUnit, focusPricingUnit, true
	case rowGPUHours:
		return l.quantity, l.quantity, 6, 6, focusGPUHoursUnit, focusGPUHoursUnit, true
	}
	return 0, 0, 0, 0, "", "", false
}

// pricingCategory is PricingCategory: "Standard" for a priced row, list or
// contract price alike (FOCUS: the agreed rate, negotiated discounts,
// tiers and flat rates included; "Committed" is for commitment discounts,
// which tokenmeter has none of); "" (null) without a price.
func (l *focusLine) pricingCategory() string {
	if !l.priced {
		return ""
	}
	return focusPricingCategory
}

// contractedCost is ContractedCost and EffectiveCost: the billed cost,
// but a tax's own.
func (l *focusLine) contractedCost() cost {
	if l.hasContracted {
		return l.contracted
	}
	return l.cost
}

// deployment is the deployment the row may show: finance's view only.
func (l *focusLine) deployment(finance bool) string {
	if !finance {
		return ""
	}
	return l.src.deployment
}

type focusCSV struct {
	names                      focusNames
	finance                    bool
	bStart, bEnd, cStart, cEnd timeText
}

// fill writes one FOCUS row; an empty field is a null.
func (c *focusCSV) fill(l *focusLine, rec []string) ([]string, error) {
	s := l.src
	category, class := l.category()
	billed := l.cost.String()
	list, contracted := billed, billed
	if l.listCost != l.cost {
		list = l.listCost.String()
	}
	if c := l.contractedCost(); c != l.cost {
		contracted = c.String()
	}
	var consumed, consumedUnit, quantity, pricingUnit string
	if cq, pq, cs, ps, cu, pu, ok := l.quantities(); ok {
		quantity, pricingUnit = scaledText(pq, ps), pu
		if cu != "" {
			consumed, consumedUnit = scaledText(cq, cs), cu
		}
	}
	var listPrice, price, skuPriceID, details string
	if l.priced {
		listPrice, price = l.listPrice.String(), l.price.String()
		skuPriceID, details = l.skuPrice.skuPriceID, l.skuPrice.details
	}
	dep := l.deployment(c.finance)
	var resourceType string
	if dep != "" {
		resourceType = focusResourceType
	}
	var book string
	if c.finance {
		book = s.priceBook
	}
	var subID, subName string
	if s.tenant != "" {
		subID, subName = s.tenant, l.account.name
	}
	rec = append(rec,
		billed, l.account.id, l.account.name, s.currency,
		c.bEnd.format(s.billingEnd), c.bStart.format(s.billingStart),
		category, class, l.description(c.finance), l.frequency(), c.cEnd.format(s.chargeEnd), c.cStart.format(s.chargeStart),
		consumed, consumedUnit, contracted, price, contracted, s.invoiceID, c.names.issuer,
		list, listPrice, l.pricingCategory(), quantity, pricingUnit,
		c.names.provider, c.names.publisher,
		s.region, s.region, dep, dep, resourceType, focusServiceCategory, c.names.service, focusServiceSubcategory,
		l.skuID(), l.skuMeter(), details, skuPriceID, subID, subName,
		s.period, s.originalPeriod, s.model, dep, l.tokenKind(), uintText(l.tokens()), uintText(l.requests),
		strconv.FormatBool(s.priced), book, s.priceID, s.statementHash)
	if c.finance {
		if s.hasCost {
			rec = append(rec, l.allocated.String(), l.margin.String())
		} else {
			rec = append(rec, "", "")
		}
	}
	return rec, nil
}

// focusParquet is a FOCUS row in Parquet: costs are DECIMAL(38, 15) (exact
// products of unit price and quantity), unit prices and quantities
// DECIMAL(38, 9), Date/Time columns TIMESTAMP(MICROS, UTC), nullable
// columns optional (pointers), the others required.
type focusParquet struct {
	BilledCost          decimal16  `parquet:"BilledCost,decimal(15:38)"`
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
	ContractedCost      decimal16  `parquet:"ContractedCost,decimal(15:38)"`
	ContractedUnitPrice *decimal16 `parquet:"ContractedUnitPrice,decimal(9:38)"`
	EffectiveCost       decimal16  `parquet:"EffectiveCost,decimal(15:38)"`
	InvoiceID           *string    `parquet:"InvoiceId"`
	InvoiceIssuerName   string     `parquet:"InvoiceIssuerName"`
	ListCost            decimal16  `parquet:"ListCost,decimal(15:38)"`
	ListUnitPrice       *decimal16 `parquet:"ListUnitPrice,decimal(9:38)"`
	PricingCategory     *string    `parquet:"PricingCategory"`
	PricingQuantity     *decimal16 `parquet:"PricingQuantity,decimal(9:38)"`
	PricingUnit         *string    `parquet:"PricingUnit"`
	ProviderName        string     `parquet:"ProviderName"`
	PublisherName       string     `parquet:"PublisherName"`
	RegionID            *string    `parquet:"RegionId"`
	RegionName          *string    `parquet:"RegionName"`
	ResourceID          *string    `parquet:"ResourceId"`
	ResourceName        *string    `parquet:"ResourceName"`
	ResourceType        *string    `parquet:"ResourceType"`
	ServiceCategory     string     `parquet:"ServiceCategory"`
	ServiceName         string     `parquet:"ServiceName"`
	ServiceSubcategory  string     `parquet:"ServiceSubcategory"`
	SkuID               *string    `parquet:"SkuId"`
	SkuMeter            *string    `parquet:"SkuMeter"`
	SkuPriceDetails     *string    `parquet:"SkuPriceDetails"`
	SkuPriceID          *string    `parquet:"SkuPriceId"`
	SubAccountID        *string    `parquet:"SubAccountId"`
	SubAccountName      *string    `parquet:"SubAccountName"`
	XPeriod             string     `parquet:"x_Period"`
	XOriginalPeriod     *string    `parquet:"x_OriginalPeriod"`
	XModel              *string    `parquet:"x_Model"`
	XDeployment         *string    `parquet:"x_Deployment"`
	XTokenKind          *string    `parquet:"x_TokenKind"`
	XTokens             uint64     `parquet:"x_Tokens"`
	XRequests           uint64     `parquet:"x_Requests"`
	XPriced             bool       `parquet:"x_Priced"`
	XPriceBook          *string    `parquet:"x_PriceBook"`
	XPriceID            *string    `parquet:"x_PriceId"`
	XStatementHash      *string    `parquet:"x_StatementHash"`
}

type focusFinanceParquet struct {
	focusParquet
	AllocatedCost *decimal16 `parquet:"x_AllocatedCost,decimal(9:38)"`
	Margin        *decimal16 `parquet:"x_Margin,decimal(15:38)"`
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func focusParquetOf(l *focusLine, names focusNames, finance bool, p *focusParquet) {
	s := l.src
	category, class := l.category()
	billed := l.cost.decimal()
	dep := l.deployment(finance)
	*p = focusParquet{
		BilledCost: billed, BillingAccountID: l.account.id, BillingAccountName: optString(l.account.name),
		BillingCurrency: s.currency, BillingPeriodEnd: utcMicros(s.billingEnd), BillingPeriodStart: utcMicros(s.billingStart),
		ChargeCategory: category, ChargeClass: optString(class), ChargeDescription: optString(l.description(finance)),
		ChargeFrequency: l.frequency(), ChargePeriodEnd: utcMicros(s.chargeEnd), ChargePeriodStart: utcMicros(s.chargeStart),
		ContractedCost: l.contractedCost().decimal(), EffectiveCost: l.contractedCost().decimal(), InvoiceID: optString(s.invoiceID), InvoiceIssuerName: names.issuer,
		ListCost: l.listCost.decimal(), PricingCategory: optString(l.pricingCategory()),
		ProviderName: names.provider, PublisherName: names.publisher,
		RegionID: optString(s.region), RegionName: optString(s.region),
		ServiceCategory: focusServiceCategory, ServiceName: names.service, ServiceSubcategory: focusServiceSubcategory,
		SkuID: optString(l.skuID()), SkuMeter: optString(l.skuMeter()), SubAccountID: optString(s.tenant),
		XPeriod: s.period, XOriginalPeriod: optString(s.originalPeriod), XModel: optString(s.model), XDeployment: optString(dep),
		XTokenKind: optString(l.tokenKind()), XTokens: l.tokens(), XRequests: l.requests, XPriced: s.priced,
		XPriceID: optString(s.priceID), XStatementHash: optString(s.statementHash),
	}
	if s.tenant != "" {
		p.SubAccountName = optString(l.account.name)
	}
	if finance {
		p.XPriceBook = optString(s.priceBook)
	}
	if cq, pq, cs, ps, cu, pu, ok := l.quantities(); ok {
		quantity := scaledDecimal(pq, ps)
		p.PricingQuantity, p.PricingUnit = &quantity, optString(pu)
		if cu != "" {
			consumed := scaledDecimal(cq, cs)
			p.ConsumedQuantity, p.ConsumedUnit = &consumed, optString(cu)
		}
	}
	if l.priced {
		list, price := moneyDecimal(l.listPrice), moneyDecimal(l.price)
		p.ListUnitPrice, p.ContractedUnitPrice = &list, &price
		p.SkuPriceID, p.SkuPriceDetails = optString(l.skuPrice.skuPriceID), optString(l.skuPrice.details)
	}
	if dep != "" {
		p.ResourceID, p.ResourceName, p.ResourceType = optString(dep), optString(dep), optString(focusResourceType)
	}
}
