package export_test

import (
	"math/big"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
)

// TestFocusMarginUnderContract: finance's FOCUS file of a contract
// tenant's statement has x_Margin at contracted cost less allocated cost on
// each token row, and its dedicated GPU-hours and commitment true-up rows
// carry their cost as margin (no allocated cost), so the statement's
// x_Margin add up to its finance margin and its x_AllocatedCost to its
// allocated cost, exactly; the credit and rounding rows have none.
func TestFocusMarginUnderContract(t *testing.T) {
	book, err := billing.ParsePriceBook([]byte(`{"currency": "USD", "gpu_prices": [], "token_prices": [
	  {"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "2", "cached_input_per_1m": "0.5", "output_per_1m": "8"},
	  {"model": "n", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "3"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := billing.ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	at := func(day, hour int) time.Time { return time.Date(2026, 11, day, hour, 0, 0, 0, time.UTC) }
	usage := []billing.StatementUsage{
		{Start: at(2, 0), End: at(2, 1), Model: "m", Deployment: "d1", Requests: 10, InputTokens: 3_000_000, CachedInputTokens: 1_000_000, OutputTokens: 1_000_003},
		{Start: at(3, 0), End: at(3, 1), Model: "n", Deployment: "ded", Requests: 7, InputTokens: 5_000_000, OutputTokens: 1_000_000},
	}
	c := &billing.Contract{
		DiscountPercent: 33_333_333_333, // 33.333333333%: contracted costs with more than nine decimals
		Dedicated:       []billing.DedicatedDeployment{{Deployment: "ded", EffectiveFrom: at(1, 0), PerGPUHour: 2_000_000_000}},
		Commitment:      &billing.Commitment{MonthlySpend: 100_000_000_000},
	}
	hours := []billing.DedicatedHour{{Deployment: "ded", Hour: at(3, 0), MicroHours: 1_500_000}}
	st, err := billing.ComputeContractStatement("acme", p, book, usage, false, c, hours)
	if err != nil {
		t.Fatal(err)
	}
	costs := []billing.HourCost{
		{Hour: at(2, 0), Model: "m", Deployment: "d1", Cost: 3_000_000_001, Busy: 2_000_000_000},
		{Hour: at(3, 0), Model: "n", Deployment: "ded", Cost: 5_000_000_000, Busy: 4_000_000_000},
	}
	if err := billing.AttachFinance(&st, "tokens", "shared_weighted", costs); err != nil {
		t.Fatal(err)
	}
	recs := readCSV(t, encodeStatements(t, export.FocusCSV, export.Options{Finance: true}, export.StatementRows(st)))
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	margin, allocated := new(big.Rat), new(big.Rat)
	var chargeRows int
	for n, rec := range recs[1:] {
		m, a := rec[col["x_Margin"]], rec[col["x_AllocatedCost"]]
		switch rec[col["SkuId"]] {
		case "dedicated-gpu-hour":
			chargeRows++
			if a != "0" || m != rec[col["BilledCost"]] {
				t.Errorf("row %d (dedicated): allocated %q margin %q, want 0 and its cost %s", n, a, m, rec[col["BilledCost"]])
			}
		}
		if m == "" {
			continue
		}
		mr, ok1 := new(big.Rat).SetString(m)
		ar, ok2 := new(big.Rat).SetString(a)
		if !ok1 || !ok2 {
			t.Fatalf("row %d: x_Margin %q, x_AllocatedCost %q", n, m, a)
		}
		margin.Add(margin, mr)
		allocated.Add(allocated, ar)
	}
	if chargeRows != 1 {
		t.Errorf("%d dedicated rows, want 1", chargeRows)
	}
	nano := func(m billing.Money) *big.Rat { return big.NewRat(int64(m), 1_000_000_000) }
	if allocated.Cmp(nano(st.Finance.AllocatedCost)) != 0 {
		t.Errorf("Σ x_AllocatedCost %s, want %s", allocated.FloatString(15), st.Finance.AllocatedCost)
	}
	// The rows' costs are exact; each line's contracted charge is its exact
	// cost rounded to a nano-unit once: they differ by at most half a
	// nano-unit a line.
	diff := new(big.Rat).Sub(margin, nano(st.Finance.Margin))
	if diff.Abs(diff).Cmp(big.NewRat(int64(len(st.Lines)), 2_000_000_000)) > 0 || st.Finance.CommitmentCharge == 0 {
		t.Errorf("Σ x_Margin %s, finance margin %s (commitment %s)", margin.FloatString(15), st.Finance.Margin, st.Finance.CommitmentCharge)
	}
}
