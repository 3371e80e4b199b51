package notify

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"tokenmeter/billing"
)

// Event types.
const (
	// TypeClosed is a statement stored by a period's close (revision 0).
	TypeClosed = "statement.closed"
	// TypeReissued is a reissue of a closed period's statement (revision
	// 1 and up): it replaces the revision named by Replaces, whose invoice
	// a credit note voids.
	TypeReissued = "statement.reissued"
)

// Event is the JSON of a record on the billing events topic and of a
// webhook's body (docs/architecture.md, "Events out"). It is a function of
// the stored statement and its stored invoice documents only, so every
// delivery of one statement carries the same bytes.
type Event struct {
	// ID is the idempotency key: the statement's hash. A consumer that has
	// handled an event of that ID drops the others (delivery is at least
	// once).
	ID   string `json:"id"`
	Type string `json:"type"`
	// Tenant and Period name the bill; Zone, PeriodStart and PeriodEnd
	// its period in the tenant's zone.
	Tenant      string    `json:"tenant"`
	Period      string    `json:"period"`
	Zone        string    `json:"zone"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	// Revision is 0 for the close's statement, n for its n-th reissue;
	// Replaces is the hash of the revision a reissue voids.
	Revision int    `json:"revision"`
	Replaces string `json:"replaces,omitempty"`
	// Currency is ISO 4217; Charge is the exact sum (decimal, nano-unit
	// precision), Total the payable amount before tax, Charge rounded once
	// to the currency's minor unit; TotalMinorUnits is Total in minor
	// units (cents), as payment APIs take amounts.
	Currency        string        `json:"currency"`
	Charge          billing.Money `json:"charge"`
	Total           billing.Money `json:"total"`
	TotalMinorUnits int64         `json:"total_minor_units"`
	// Hash is the SHA-256 of the statement's canonical JSON (the ID).
	Hash string `json:"hash"`
	// ClosedAt is when the statement was stored (the void, for a reissue).
	ClosedAt  time.Time `json:"closed_at"`
	PriceBook string    `json:"price_book"`
	// Lines sums the statement's lines per kind (usage, adjustment,
	// repricing), Charges its other amounts per kind (discount,
	// commitment, dedicated, credit).
	Lines            []LineSummary   `json:"lines"`
	Charges          []ChargeSummary `json:"charges,omitempty"`
	UnpricedRequests uint64          `json:"unpriced_requests,omitempty"`
	// Invoice is the statement's invoice (number, dates, tax, amount due);
	// absent when none is stored yet. CreditNote is, on a reissue, the
	// credit note that voids the replaced revision's invoice.
	Invoice    *InvoiceSummary `json:"invoice,omitempty"`
	CreditNote *InvoiceSummary `json:"credit_note,omitempty"`
}

// LineSummary sums a statement's lines of one kind.
type LineSummary struct {
	Kind              billing.LineKind `json:"kind"`
	Lines             int              `json:"lines"`
	Requests          uint64           `json:"requests"`
	InputTokens       uint64           `json:"input_tokens"`
	CachedInputTokens uint64           `json:"cached_input_tokens"`
	OutputTokens      uint64           `json:"output_tokens"`
	// Charge is the lines' list-price charge, exact.
	Charge billing.Money `json:"charge"`
}

// ChargeSummary sums a statement's charges of one kind.
type ChargeSummary struct {
	Kind    billing.ChargeKind `json:"kind"`
	Charges int                `json:"charges"`
	Amount  billing.Money      `json:"amount"`
}

// InvoiceSummary is what a collection system needs of an invoice or
// credit note; the document itself is served by the API.
type InvoiceSummary struct {
	Number           string        `json:"number"`
	IssueDate        string        `json:"issue_date"`
	DueDate          string        `json:"due_date,omitempty"`
	BillingAccountID string        `json:"billing_account_id"`
	Subtotal         billing.Money `json:"subtotal"`
	TaxName          string        `json:"tax_name,omitempty"`
	Tax              billing.Money `json:"tax"`
	// Total is the amount due (Subtotal + Tax; negative on a credit
	// note), TotalMinorUnits the same in minor units.
	Total           billing.Money `json:"total"`
	TotalMinorUnits int64         `json:"total_minor_units"`
}

// NewEvent is the event of st, a stored statement revision, with the
// invoice documents of its tenant's period (any order; those of other
// revisions are ignored).
func NewEvent(st billing.StoredStatement, docs []billing.StoredInvoice) (Event, error) {
	var bill billing.Statement
	if err := json.Unmarshal(st.Content, &bill); err != nil {
		return Event{}, fmt.Errorf("statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	_, unit, err := billing.MinorUnit(bill.Currency)
	if err != nil {
		return Event{}, fmt.Errorf("statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	ev := Event{ID: st.Hash, Type: TypeClosed, Tenant: st.Tenant, Period: st.Period, Zone: bill.Zone,
		PeriodStart: bill.PeriodStart.UTC(), PeriodEnd: bill.PeriodEnd.UTC(), Revision: st.Revision, Replaces: bill.Replaces,
		Currency: bill.Currency, Charge: bill.Charge, Total: bill.Total, TotalMinorUnits: int64(bill.Total) / unit,
		Hash: st.Hash, ClosedAt: st.ClosedAt.UTC(), PriceBook: bill.PriceBook, UnpricedRequests: bill.UnpricedRequests,
		Lines: []LineSummary{}}
	if st.Revision > 0 {
		ev.Type = TypeReissued
	}
	for _, l := range bill.Lines {
		i := slices.IndexFunc(ev.Lines, func(s LineSummary) bool { return s.Kind == l.Kind })
		if i < 0 {
			ev.Lines = append(ev.Lines, LineSummary{Kind: l.Kind})
			i = len(ev.Lines) - 1
		}
		s := &ev.Lines[i]
		s.Lines++
		s.Requests += l.Requests
		s.InputTokens += l.InputTokens
		s.CachedInputTokens += l.CachedInputTokens
		s.OutputTokens += l.OutputTokens
		s.Charge += l.Charge // the statement's Charge holds the sum: no overflow
	}
	for _, c := range bill.Charges {
		i := slices.IndexFunc(ev.Charges, func(s ChargeSummary) bool { return s.Kind == c.Kind })
		if i < 0 {
			ev.Charges = append(ev.Charges, ChargeSummary{Kind: c.Kind})
			i = len(ev.Charges) - 1
		}
		ev.Charges[i].Charges++
		ev.Charges[i].Amount += c.Amount
	}
	for _, d := range docs {
		if d.Tenant != st.Tenant || d.Period != st.Period {
			continue
		}
		switch {
		case d.Kind == billing.KindInvoice && d.Revision == st.Revision && d.StatementHash == st.Hash:
			ev.Invoice, err = summary(d, unit)
		case d.Kind == billing.KindCreditNote && st.Revision > 0 && d.StatementHash == bill.Replaces:
			ev.CreditNote, err = summary(d, unit)
		}
		if err != nil {
			return Event{}, err
		}
	}
	return ev, nil
}

// summary is the InvoiceSummary of a stored document.
func summary(d billing.StoredInvoice, unit int64) (*InvoiceSummary, error) {
	inv, err := d.Decode()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", d.Kind, d.Number, err)
	}
	return &InvoiceSummary{Number: inv.Number, IssueDate: inv.IssueDate, DueDate: inv.DueDate, BillingAccountID: inv.BillingAccountID,
		Subtotal: inv.Subtotal, TaxName: inv.TaxName, Tax: inv.Tax, Total: inv.Total, TotalMinorUnits: int64(inv.Total) / unit}, nil
}
