package export_test

import (
	"fmt"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

// testBook prices m at 0.60 / 0.30 / 1.80 per 1M tokens, then from
// 2026-11-15 12:00 UTC at 1.00 / 0.50 / 3.00, and n at 0.15 / 0.075 / 0.6;
// x has no price.
func testBook(t testing.TB) *billing.PriceBook {
	t.Helper()
	b, err := billing.ParsePriceBook([]byte(`{"currency": "USD", "token_prices": [
		{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"},
		{"model": "m", "effective_from": "2026-11-15T12:00:00Z", "input_per_1m": "1.00", "cached_input_per_1m": "0.50", "output_per_1m": "3.00"},
		{"model": "n", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.15", "cached_input_per_1m": "0.075", "output_per_1m": "0.6"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testStatement is acme's 2026-11 statement (zone +05:30, per deployment):
// m before and after its price change, n, unpriced x, and an adjustment for
// late usage of 2026-10.
func testStatement(t testing.TB, tenant string) billing.Statement {
	t.Helper()
	zone, err := billing.ParseZone("+05:30")
	if err != nil {
		t.Fatal(err)
	}
	p, err := billing.ParsePeriod("2026-11", zone)
	if err != nil {
		t.Fatal(err)
	}
	change := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	hour := func(model, dep string, start time.Time, in, cached, out uint64) billing.StatementUsage {
		return billing.StatementUsage{Start: start, End: start.Add(time.Hour), Model: model, Deployment: dep,
			Requests: 3, InputTokens: in, CachedInputTokens: cached, OutputTokens: out}
	}
	late := hour("m", "d1", p.Start.Add(-3*time.Hour), 777_777, 111_111, 33_333)
	late.OriginalPeriod = "2026-10"
	credit := billing.Money(-1_234_567_891) // a repricing of October, in the tenant's favour
	usage := []billing.StatementUsage{
		hour("m", "d1", change.Add(-2*time.Hour), 1_000_000, 400_000, 100_000),
		hour("m", "d1", change.Add(-time.Hour), 500_001, 0, 3),
		hour("m", "d2", change, 2_000_000, 1_000_000, 10),
		hour("n", "d1", change, 1_234_567, 7, 0),
		hour("x", "d1", change, 50, 0, 50),
		late,
		{Start: p.Start.AddDate(0, -1, 0), End: p.Start, Model: "m", Deployment: "d2", OriginalPeriod: "2026-10", Repricing: &credit},
	}
	st, err := billing.ComputeStatement(tenant, p, testBook(t), usage, true)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// usageRows is n detailed rows over hours of 2026-11, priced with
// testBook, with allocated costs that vary.
func usageRows(t testing.TB, n int) []export.UsageCostRow {
	t.Helper()
	book := testBook(t)
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	models := []string{"m", "n", "x"}
	rows := make([]export.UsageCostRow, 0, n)
	seed := uint64(42)
	next := func(mod uint64) uint64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return (seed >> 33) % mod
	}
	for i := range n {
		model := models[i%len(models)]
		at := start.Add(time.Duration(i/50%700) * time.Hour)
		in := next(5_000_000)
		cached := next(in + 1)
		out := next(2_000_000)
		r := export.UsageCostRow{
			ChargePeriodStart: at, ChargePeriodEnd: at.Add(time.Hour),
			BillingPeriod: "2026-11", BillingPeriodStart: start, BillingPeriodEnd: start.AddDate(0, 1, 0),
			Tenant: fmt.Sprintf("tenant-%02d", i%13), Model: model, Deployment: fmt.Sprintf("dep-%d", i%4),
			Requests: next(1000) + 1, InputTokens: in, CachedInputTokens: cached, OutputTokens: out,
			Currency: "USD", AllocatedCost: billing.Money(next(3_000_000_000)), PriceBook: book.Version(),
		}
		if p, ok := book.TokenPrice(model, at); ok {
			r.InputPer1M, r.CachedInputPer1M, r.OutputPer1M = p.InputPer1M, p.CachedInputPer1M, p.OutputPer1M
			charge, id, ok := book.ListCharge(model, at, int64(in), int64(cached), int64(out))
			if !ok {
				t.Fatalf("no list charge for %s", model)
			}
			r.ListCharge, r.PriceID = charge, id
		}
		rows = append(rows, r)
	}
	return rows
}
