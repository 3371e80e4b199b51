package export

import (
	"time"

	"tokenmeter/billing"
)

// StatementRowKind says what a StatementRow holds.
type StatementRowKind string

const (
	// RowLine is a statement line.
	RowLine StatementRowKind = ""
	// RowCharge is one of the statement's Charges that is not a line's
	// discount (a dedicated deployment's GPU-hours, a commitment's
	// true-up, a credit drawn): Charge holds it. The native datasets (one
	// row per line) leave it out.
	RowCharge StatementRowKind = "charge"
	// RowRounding ends a statement's rows: in FOCUS files, the statement's
	// rounding row, its payable Total less the exact costs of its other
	// rows, so that a statement's rows add up to its Total exactly. The
	// native datasets leave it out.
	RowRounding StatementRowKind = "rounding"
	// RowTax follows a statement's rounding row when its invoice has tax:
	// Tax holds it. The native datasets leave it out.
	RowTax StatementRowKind = "tax"
)

// Tax is the tax line of a statement's invoice: a FOCUS row of
// ChargeCategory "Tax" whose BilledCost is Amount, so the rows of an
// InvoiceId add up to the invoice's total.
type Tax struct {
	Name string
	// Rate is the fraction taxed ("0.18").
	Rate   billing.Weight
	Amount billing.Money
}

// StatementRow is one line of a statement with the statement's identity:
// a row of the statement-lines dataset; or, with Kind RowRounding, the end
// of a statement's rows.
type StatementRow struct {
	Kind                 StatementRowKind
	Tenant, Period, Zone string
	// PeriodStart and PeriodEnd bound the statement's period (UTC).
	PeriodStart, PeriodEnd time.Time
	Currency               string
	// PriceBook is the version of the price book the statement was priced with.
	PriceBook string
	// StatementHash is the statement's content hash.
	StatementHash string
	// Total is the statement's payable total (its Charge rounded once to
	// the currency's minor unit).
	Total billing.Money
	// InvoiceID is the number of the invoice of the statement (FOCUS
	// InvoiceId); empty (null) while it has none. The caller fills it.
	InvoiceID string
	// Region is the region of the line's usage (FOCUS RegionId): its
	// deployment's, or the one region of every deployment of the line's
	// model; empty (null) when unknown or several. The caller fills it.
	Region string
	Line   billing.StatementLine
	// Discounts are the line's discount charges (billing.ChargeDiscount):
	// the contract's prices of parts of its tokens.
	Discounts []billing.Charge
	// Charge is a RowCharge row's charge.
	Charge *billing.Charge
	// Tax is a RowTax row's tax.
	Tax *Tax
	// Finance holds the finance-only figures of the line; written only with
	// Options.Finance, as nulls when nil.
	Finance *LineFinance
}

// LineFinance is what finance sees of a line beyond its charge: the GPU
// cost allocated to it and the margin, contracted charge (list without a
// contract) − allocated cost. A RowCharge row of a dedicated deployment's
// GPU-hours or a commitment's true-up has one too: no allocated cost and
// its amount as margin (billing.StatementFinance counts them as revenue).
// Credits have none.
type LineFinance struct {
	AllocatedCost, Margin billing.Money
}

// StatementRows is the rows of st: one per line, in the statement's order,
// with its discount charges; a RowCharge row per other charge (dedicated
// GPU-hours, commitment true-up, credit); then its RowRounding row. With
// st's finance part (finance's view), each usage line carries its
// allocated cost and margin, and each dedicated or commitment charge its
// margin (LineFinance).
func StatementRows(st billing.Statement) []StatementRow {
	rows := make([]StatementRow, 0, len(st.Lines)+1)
	for _, l := range st.Lines {
		book := st.PriceBook
		if l.PriceBook != "" {
			book = l.PriceBook // an adjustment priced with its period's book
		}
		rows = append(rows, StatementRow{
			Tenant: st.Tenant, Period: st.Period, Zone: st.Zone,
			PeriodStart: st.PeriodStart, PeriodEnd: st.PeriodEnd,
			Currency: st.Currency, PriceBook: book, StatementHash: st.Hash, Total: st.Total,
			Line: l,
		})
	}
	if st.Finance != nil {
		for _, lc := range st.Finance.Lines {
			if lc.Line >= 0 && lc.Line < len(rows) {
				rows[lc.Line].Finance = &LineFinance{AllocatedCost: lc.AllocatedCost, Margin: lc.Margin}
			}
		}
	}
	for i := range st.Charges {
		c := &st.Charges[i]
		if c.Kind == billing.ChargeDiscount && c.Line >= 0 && c.Line < len(st.Lines) {
			rows[c.Line].Discounts = append(rows[c.Line].Discounts, *c)
			continue
		}
		row := StatementRow{Kind: RowCharge, Tenant: st.Tenant, Period: st.Period, Zone: st.Zone,
			PeriodStart: st.PeriodStart, PeriodEnd: st.PeriodEnd, Currency: st.Currency, PriceBook: st.PriceBook,
			StatementHash: st.Hash, Total: st.Total, Charge: c}
		if st.Finance != nil && c.OriginalPeriod == "" && (c.Kind == billing.ChargeDedicated || c.Kind == billing.ChargeCommitment) {
			row.Finance = &LineFinance{Margin: c.Amount}
		}
		rows = append(rows, row)
	}
	return append(rows, StatementRow{Kind: RowRounding, Tenant: st.Tenant, Period: st.Period, Zone: st.Zone,
		PeriodStart: st.PeriodStart, PeriodEnd: st.PeriodEnd, Currency: st.Currency, PriceBook: st.PriceBook,
		StatementHash: st.Hash, Total: st.Total})
}

// UsageCostRow is one tenant's usage of one model on one deployment over
// one hour (or day), under one token price: a row of the detailed
// usage-and-cost dataset finance loads into a warehouse.
type UsageCostRow struct {
	// ChargePeriodStart and ChargePeriodEnd span the row (UTC).
	ChargePeriodStart, ChargePeriodEnd time.Time
	// BillingPeriod is the key of the tenant's billing period holding the
	// row ("2026-11"); BillingPeriodStart and BillingPeriodEnd bound it.
	BillingPeriod                        string
	BillingPeriodStart, BillingPeriodEnd time.Time
	Tenant, Model, Deployment            string
	// Region is the deployment's region (FOCUS RegionId); empty (null)
	// when unknown.
	Region   string
	Requests uint64
	// InputTokens includes CachedInputTokens.
	InputTokens, CachedInputTokens, OutputTokens uint64
	Currency                                     string
	// The token list prices per 1M tokens applied; zero when unpriced.
	InputPer1M, CachedInputPer1M, OutputPer1M billing.Money
	// ListCharge is the list-price charge of the row's tokens.
	ListCharge billing.Money
	// AllocatedCost is the GPU cost allocated to the row (finance only).
	AllocatedCost billing.Money
	// PriceID names the token price applied (empty when unpriced);
	// PriceBook is the version of the price book of the list charge and
	// the allocated cost.
	PriceID, PriceBook string
}
