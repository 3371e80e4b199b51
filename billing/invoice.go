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
	"strconv"
	"time"

	"golang.org/x/text/currency"

	"tokenmeter/internal/numtext"
)

// An invoice is the printable document of one closed statement revision:
// numbered, dated, with seller and buyer, its lines in the currency's minor
// unit, a tax line and the amount due. A credit note negates an invoice
// when its statement is voided and reissued. This file computes both from a
// statement and the accounts file; numbering (a gap-free sequence per
// issuer), storing and serving them are not here (billing/closing, chstore,
// api).
//
// Rounding, the one rule of every document:
//   - each line's exact amount (nano-units) is cut to the minor unit by the
//     largest-remainder method: every line is floored, and the units the
//     floors lack to reach the statement's Total (itself the exact Charge
//     rounded once, half away from zero) go one each to the lines with the
//     largest remainders (ties: the earlier line). So the printed lines add
//     up exactly to the printed subtotal, which is the statement's Total,
//     and no printed line is a whole minor unit off its exact amount;
//   - the tax is the subtotal times the tenant's rate, rounded once to the
//     minor unit, half away from zero;
//   - the total is subtotal plus tax.

// ErrInvalidInvoice marks a statement or numbering an invoice cannot be
// made of.
var ErrInvalidInvoice = errors.New("invalid invoice input")

// InvoiceKind says what a document is.
type InvoiceKind string

const (
	// KindInvoice bills a statement revision.
	KindInvoice InvoiceKind = "invoice"
	// KindCreditNote negates the invoice of a voided revision.
	KindCreditNote InvoiceKind = "credit_note"
)

// LineRoundingRule and TaxRoundingRule are written in every document.
const (
	LineRoundingRule = "each line's exact amount floored to the minor unit; the units missing to reach the subtotal (the statement's total) go one each to the lines with the largest remainders, earlier lines first on ties"
	TaxRoundingRule  = "subtotal × tax rate, rounded once to the minor unit, half away from zero"
)

// Invoice is an invoice or a credit note. Amounts are in nano-units of
// Currency, each a whole number of minor units except the lines' Exact.
type Invoice struct {
	Kind InvoiceKind `json:"kind"`
	// Number is Issuer followed by Seq, zero-padded to six digits.
	Number string `json:"number"`
	// Issuer is the numbering's prefix (Operator.InvoicePrefix): numbers
	// are gap-free per issuer, invoices and credit notes in one sequence.
	Issuer string `json:"issuer"`
	Seq    uint64 `json:"seq"`
	Tenant string `json:"tenant"`
	Period string `json:"period"`
	// Revision and StatementHash name the statement revision billed (for a
	// credit note: the one voided).
	Revision      int    `json:"revision"`
	StatementHash string `json:"statement_hash"`
	// IssuedAt is the close of the revision (the void, for a credit
	// note); IssueDate and DueDate are dates in Zone, the tenant's zone.
	IssuedAt  time.Time `json:"issued_at"`
	Zone      string    `json:"zone"`
	IssueDate string    `json:"issue_date"`
	DueDate   string    `json:"due_date,omitempty"`
	// PeriodStart and PeriodEnd are the billing period's first instants.
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	Seller      Party     `json:"seller"`
	Buyer       Party     `json:"buyer"`
	// BillingAccountID is the buyer's billing account.
	BillingAccountID string        `json:"billing_account_id"`
	Currency         string        `json:"currency"`
	MinorDigits      int           `json:"minor_digits"`
	Lines            []InvoiceLine `json:"lines"`
	// Subtotal is the sum of the lines' amounts: the statement's Total.
	Subtotal Money  `json:"subtotal"`
	TaxName  string `json:"tax_name,omitempty"`
	TaxRate  Weight `json:"tax_rate"`
	Tax      Money  `json:"tax"`
	Total    Money  `json:"total"`
	// LineRounding and TaxRounding state the rules (LineRoundingRule,
	// TaxRoundingRule).
	LineRounding string `json:"line_rounding"`
	TaxRounding  string `json:"tax_rounding"`
	// Credits is, on a credit note, the number of the invoice it negates,
	// and Reason why its statement was voided.
	Credits string `json:"credits,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Replaces is, on the invoice of a reissued revision, the number of
	// the voided revision's invoice.
	Replaces string `json:"replaces,omitempty"`
}

// InvoiceLine is one printed line: a statement line or one of its Charges.
type InvoiceLine struct {
	// Kind is the statement line's kind (usage, adjustment, repricing) or
	// the charge's (discount, commitment, dedicated, credit).
	Kind           string `json:"kind"`
	Description    string `json:"description"`
	Model          string `json:"model,omitempty"`
	Deployment     string `json:"deployment,omitempty"`
	OriginalPeriod string `json:"original_period,omitempty"`
	// Quantity, Unit and UnitPrice are informative (the amount is the
	// statement's, not their product).
	Quantity  string `json:"quantity,omitempty"`
	Unit      string `json:"unit,omitempty"`
	UnitPrice string `json:"unit_price,omitempty"`
	// Exact is the statement's amount in nano-units; Amount is it in
	// whole minor units (the rounding rule above).
	Exact  Money `json:"exact"`
	Amount Money `json:"amount"`
}

// InvoiceNumber is the printed number of seq under issuer.
func InvoiceNumber(issuer string, seq uint64) string {
	return issuer + fmt.Sprintf("%06d", seq)
}

// MinorUnit is the number of decimals of the currency's minor unit (0 for
// JPY, 2 for USD, 3 for KWD) and that unit in nano-units.
func MinorUnit(code string) (digits int, unit int64, err error) {
	u, err := currency.ParseISO(code)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: currency %q: %v", ErrInvalidInvoice, code, err)
	}
	scale, _ := currency.Standard.Rounding(u)
	return scale, pow10(9 - scale), nil
}

// NewInvoice is the invoice of st (a closed statement revision, closed at
// closedAt) numbered seq under the operator's prefix, with the seller and
// payment terms of acc's operator and the buyer and tax of st's tenant.
func NewInvoice(st Statement, closedAt time.Time, acc *Accounts, seq uint64) (Invoice, error) {
	var op Operator
	if acc != nil {
		op = acc.Operator
	}
	ta := acc.Tenant(st.Tenant)
	zone, err := ParseZone(st.Zone)
	if err != nil {
		return Invoice{}, fmt.Errorf("%w: statement zone: %v", ErrInvalidInvoice, err)
	}
	digits, unit, err := MinorUnit(st.Currency)
	if err != nil {
		return Invoice{}, err
	}
	if seq == 0 {
		return Invoice{}, fmt.Errorf("%w: sequence numbers start at 1", ErrInvalidInvoice)
	}
	terms := op.PaymentTermsDays
	if terms == 0 {
		terms = DefaultPaymentTermsDays
	}
	closedAt = closedAt.UTC().Truncate(time.Second)
	issued := closedAt.In(zone)
	buyer := ta.Buyer
	if buyer.Name == "" {
		buyer.Name = ta.DisplayName()
	}
	inv := Invoice{
		Kind: KindInvoice, Number: InvoiceNumber(op.InvoicePrefix, seq), Issuer: op.InvoicePrefix, Seq: seq,
		Tenant: st.Tenant, Period: st.Period, Revision: st.Revision, StatementHash: st.Hash,
		IssuedAt: closedAt.UTC(), Zone: st.Zone, IssueDate: issued.Format(time.DateOnly),
		DueDate:     time.Date(issued.Year(), issued.Month(), issued.Day()+terms, 0, 0, 0, 0, zone).Format(time.DateOnly),
		PeriodStart: st.PeriodStart, PeriodEnd: st.PeriodEnd,
		Seller: op.Seller, Buyer: buyer, BillingAccountID: cmp.Or(ta.BillingAccountID, st.Tenant),
		Currency: st.Currency, MinorDigits: digits,
		TaxName: ta.TaxName, TaxRate: ta.TaxRate, LineRounding: LineRoundingRule, TaxRounding: TaxRoundingRule,
	}
	if inv.TaxName == "" && inv.TaxRate > 0 {
		inv.TaxName = "Tax"
	}
	inv.Lines = invoiceLines(st)
	exact := make([]Money, len(inv.Lines))
	for i, l := range inv.Lines {
		exact[i] = l.Exact
	}
	amounts, err := SplitToMinorUnit(exact, st.Total, unit)
	if err != nil {
		return Invoice{}, fmt.Errorf("%w: %s's %s statement: %v", ErrInvalidInvoice, st.Tenant, st.Period, err)
	}
	for i := range inv.Lines {
		inv.Lines[i].Amount = amounts[i]
	}
	inv.Subtotal = st.Total
	if inv.Tax, err = TaxOf(st.Total, ta.TaxRate, unit); err != nil {
		return Invoice{}, err
	}
	total, ok := addMoney(inv.Subtotal, inv.Tax)
	if !ok {
		return Invoice{}, fmt.Errorf("%w: total out of range", ErrInvalidInvoice)
	}
	inv.Total = total
	return inv, nil
}

// invoiceLines are st's lines and charges as invoice lines, in the
// statement's order, amounts not yet rounded.
func invoiceLines(st Statement) []InvoiceLine {
	out := make([]InvoiceLine, 0, len(st.Lines)+len(st.Charges))
	for _, l := range st.Lines {
		il := InvoiceLine{Kind: string(l.Kind), Model: l.Model, Deployment: l.Deployment, OriginalPeriod: l.OriginalPeriod, Exact: l.Charge}
		what := l.Model
		if l.Deployment != "" {
			what += " on " + l.Deployment
		}
		switch l.Kind {
		case LineUsage:
			il.Description = what
		case LineAdjustment:
			il.Description = what + ": late usage of " + l.OriginalPeriod
		default:
			il.Description = what + ": repricing of " + l.OriginalPeriod
		}
		if l.Kind != LineRepricing {
			il.Quantity = fmt.Sprintf("%s input (%s cached), %s output", numtext.Group(strconv.FormatUint(l.InputTokens, 10)), numtext.Group(strconv.FormatUint(l.CachedInputTokens, 10)), numtext.Group(strconv.FormatUint(l.OutputTokens, 10)))
			il.Unit = "tokens"
			if l.Priced {
				il.UnitPrice = fmt.Sprintf("%s / %s / %s per 1M", l.InputPer1M, l.CachedInputPer1M, l.OutputPer1M)
			} else {
				il.UnitPrice = "no list price"
			}
		}
		out = append(out, il)
	}
	for _, c := range st.Charges {
		out = append(out, InvoiceLine{Kind: string(c.Kind), Description: cmp.Or(c.Description, string(c.Kind)), Model: c.Model, Deployment: c.Deployment,
			Quantity: c.Quantity, Unit: c.Unit, UnitPrice: c.UnitPrice, Exact: c.Amount})
	}
	return out
}

// SplitToMinorUnit cuts exact amounts (nano-units) to whole minor units
// (unit nano-units each) that add up to total, a whole number of minor
// units, by the largest-remainder method (LineRoundingRule). total must be
// the sum of exact rounded to the minor unit (either way): then every
// amount is its exact amount floored or raised by one unit.
func SplitToMinorUnit(exact []Money, total Money, unit int64) ([]Money, error) {
	if unit <= 0 || int64(total)%unit != 0 {
		return nil, fmt.Errorf("total %s is not a whole number of minor units of %s", total, Money(unit))
	}
	out := make([]Money, len(exact))
	floors := new(big.Int)
	type rem struct {
		i int
		r int64
	}
	rems := make([]rem, 0, len(exact))
	for i, e := range exact {
		f := floorDiv(int64(e), unit)
		out[i] = Money(f * unit)
		floors.Add(floors, big.NewInt(f))
		if r := int64(e) - f*unit; r != 0 {
			rems = append(rems, rem{i, r})
		}
	}
	k := new(big.Int).Sub(big.NewInt(int64(total)/unit), floors)
	if k.Sign() < 0 || k.Cmp(big.NewInt(int64(len(rems)))) > 0 {
		return nil, fmt.Errorf("total %s is not the lines' sum rounded to the minor unit", total)
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.r, a.r) })
	for _, r := range rems[:k.Int64()] {
		out[r.i] += Money(unit)
	}
	return out, nil
}

// floorDiv is ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// TaxOf is subtotal × rate rounded once to the minor unit (unit nano-units),
// half away from zero (TaxRoundingRule).
func TaxOf(subtotal Money, rate Weight, unit int64) (Money, error) {
	num := new(big.Int).Mul(big.NewInt(int64(subtotal)), big.NewInt(int64(rate)))
	den := new(big.Int).Mul(big.NewInt(nanosPerUnit), big.NewInt(unit))
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if twice := new(big.Int).Abs(new(big.Int).Lsh(r, 1)); twice.Cmp(den) >= 0 {
		if num.Sign() < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	tax := q.Mul(q, big.NewInt(unit))
	if !tax.IsInt64() {
		return 0, fmt.Errorf("%w: tax out of range", ErrInvalidInvoice)
	}
	return Money(tax.Int64()), nil
}

// NewCreditNote is the credit note numbered seq that negates inv, issued at
// for reason: the same lines, every amount negated.
func NewCreditNote(inv Invoice, seq uint64, at time.Time, reason string) (Invoice, error) {
	if inv.Kind != KindInvoice {
		return Invoice{}, fmt.Errorf("%w: %s is a %s, not an invoice", ErrInvalidInvoice, inv.Number, inv.Kind)
	}
	if seq == 0 {
		return Invoice{}, fmt.Errorf("%w: sequence numbers start at 1", ErrInvalidInvoice)
	}
	zone, err := ParseZone(inv.Zone)
	if err != nil {
		return Invoice{}, fmt.Errorf("%w: invoice zone: %v", ErrInvalidInvoice, err)
	}
	at = at.UTC().Truncate(time.Second)
	cn := inv
	cn.Kind, cn.Number, cn.Seq = KindCreditNote, InvoiceNumber(inv.Issuer, seq), seq
	cn.IssuedAt, cn.IssueDate, cn.DueDate = at.UTC(), at.In(zone).Format(time.DateOnly), ""
	cn.Credits, cn.Reason, cn.Replaces = inv.Number, reason, ""
	cn.Lines = slices.Clone(inv.Lines)
	for i := range cn.Lines {
		cn.Lines[i].Exact, cn.Lines[i].Amount = -cn.Lines[i].Exact, -cn.Lines[i].Amount
	}
	cn.Subtotal, cn.Tax, cn.Total = -inv.Subtotal, -inv.Tax, -inv.Total
	return cn, nil
}

// StoredInvoice is an issued document as stored: its canonical JSON,
// which every re-read returns byte for byte, and its hash.
type StoredInvoice struct {
	Kind           InvoiceKind
	Issuer, Number string
	Seq            uint64
	Tenant, Period string
	Revision       int
	StatementHash  string
	IssuedAt       time.Time
	Hash           string
	Content        []byte
}

// Encode is inv as stored: its canonical JSON and SHA-256.
func (inv Invoice) Encode() (StoredInvoice, error) {
	b, err := json.Marshal(inv)
	if err != nil {
		return StoredInvoice{}, fmt.Errorf("encode invoice %s: %w", inv.Number, err)
	}
	sum := sha256.Sum256(b)
	return StoredInvoice{Kind: inv.Kind, Issuer: inv.Issuer, Number: inv.Number, Seq: inv.Seq, Tenant: inv.Tenant, Period: inv.Period,
		Revision: inv.Revision, StatementHash: inv.StatementHash, IssuedAt: inv.IssuedAt.UTC().Truncate(time.Second),
		Hash: hex.EncodeToString(sum[:]), Content: b}, nil
}

// Decode reads a stored document.
func (s StoredInvoice) Decode() (Invoice, error) {
	var inv Invoice
	if err := json.Unmarshal(s.Content, &inv); err != nil {
		return Invoice{}, fmt.Errorf("invoice %s: %w", s.Number, err)
	}
	return inv, nil
}
