package billing

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// statementBook prices model m at 0.60 / 0.30 / 1.80 per 1M tokens, then,
// from 2026-11-15 12:00 UTC, at 1.00 / 0.50 / 3.00; model x has no price.
func statementBook(t *testing.T, currency string) *PriceBook {
	t.Helper()
	b, err := ParsePriceBook([]byte(`{"currency": "` + currency + `", "token_prices": [
		{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"},
		{"model": "m", "effective_from": "2026-11-15T12:00:00Z", "input_per_1m": "1.00", "cached_input_per_1m": "0.50", "output_per_1m": "3.00"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hourUsage(model, dep string, start time.Time, in, cached, out uint64) StatementUsage {
	return StatementUsage{Start: start, End: start.Add(time.Hour), Model: model, Deployment: dep, Requests: 1,
		InputTokens: in, CachedInputTokens: cached, OutputTokens: out}
}

// TestStatementSplitsAtPriceChange checks that a price change inside the
// period splits the model's line exactly there, each half priced by its
// own entry, and that the total is the exact sum rounded once.
func TestStatementSplitsAtPriceChange(t *testing.T) {
	p, err := ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	book := statementBook(t, "USD")
	change := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	usage := []StatementUsage{
		hourUsage("m", "d1", change.Add(-2*time.Hour), 1_000_000, 400_000, 100_000),
		hourUsage("m", "d1", change.Add(-time.Hour), 500_001, 0, 3),
		hourUsage("m", "d2", change, 2_000_000, 1_000_000, 10),
		hourUsage("x", "d1", change, 50, 0, 50),
	}
	st, err := ComputeStatement("acme", p, book, usage, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Lines) != 3 {
		t.Fatalf("%d lines, want 3 (m before and after the change, x): %+v", len(st.Lines), st.Lines)
	}
	before, after, unpriced := st.Lines[0], st.Lines[1], st.Lines[2]
	// Before: uncached 1,100,001 × 0.60 + cached 400,000 × 0.30 + output
	// 100,003 × 1.80, per 1M: 0.6600006 + 0.12 + 0.1800054 = 0.960006.
	if before.Charge != 960_006_000 || !before.ChargeEnd.Equal(change) || before.Requests != 2 {
		t.Errorf("line before the change: %+v, want charge 0.960006 ending %s", before, change)
	}
	// After: 1,000,000 × 1.00 + 1,000,000 × 0.50 + 10 × 3.00, per 1M: 1.50003.
	if after.Charge != 1_500_030_000 || !after.ChargeStart.Equal(change) || after.PriceID == before.PriceID {
		t.Errorf("line after the change: %+v, want charge 1.50003 from %s under another price", after, change)
	}
	if unpriced.Priced || unpriced.Charge != 0 || st.UnpricedRequests != 1 {
		t.Errorf("unpriced line %+v, unpriced requests %d", unpriced, st.UnpricedRequests)
	}
	if st.Charge != 2_460_036_000 || st.Total != 2_460_000_000 {
		t.Errorf("charge %s total %s, want 2.460036 and 2.46", st.Charge, st.Total)
	}
	if !strings.Contains(st.Rounding, "0.01 USD") {
		t.Errorf("rounding rule %q does not name the minor unit", st.Rounding)
	}
	// A slice across the change must be split by the caller.
	_, err = ComputeStatement("acme", p, book, []StatementUsage{{Start: change.Add(-time.Minute), End: change.Add(time.Minute), Model: "m"}}, false)
	if !errors.Is(err, ErrInvalidStatement) || !strings.Contains(err.Error(), "split it") {
		t.Errorf("slice across a price change: err = %v", err)
	}
	if got := book.TokenPriceChanges("m", p.Start, p.End); len(got) != 1 || !got[0].Equal(change) {
		t.Errorf("TokenPriceChanges = %v, want [%s]", got, change)
	}
}

// TestStatementDeterministic checks that the same usage in any order gives
// the same statement and hash, and that by-deployment lines add up to the
// by-model ones.
func TestStatementDeterministic(t *testing.T) {
	p, _ := ParsePeriod("2026-11", time.UTC)
	book := statementBook(t, "USD")
	var usage []StatementUsage
	for h := range 200 {
		usage = append(usage, hourUsage("m", []string{"d1", "d2", "d3"}[h%3], p.Start.Add(time.Duration(h)*time.Hour), uint64(1000+h), uint64(h), uint64(7*h)))
	}
	first, err := ComputeStatement("acme", p, book, usage, true)
	if err != nil {
		t.Fatal(err)
	}
	rand.Shuffle(len(usage), func(i, j int) { usage[i], usage[j] = usage[j], usage[i] })
	second, err := ComputeStatement("acme", p, book, usage, true)
	if err != nil {
		t.Fatal(err)
	}
	if first.Hash == "" || first.Hash != second.Hash {
		t.Errorf("hashes %q and %q, want equal and set", first.Hash, second.Hash)
	}
	byModel, err := ComputeStatement("acme", p, book, usage, false)
	if err != nil {
		t.Fatal(err)
	}
	var deps uint64
	for _, l := range first.Lines {
		deps += l.InputTokens
	}
	if len(first.Lines) != 3 || len(byModel.Lines) != 1 || byModel.Lines[0].InputTokens != deps {
		t.Errorf("%d lines by deployment, %d by model; input %d vs %d", len(first.Lines), len(byModel.Lines), deps, byModel.Lines[0].InputTokens)
	}
	if h, _ := first.ContentHash(); h != first.Hash {
		t.Errorf("ContentHash %s, want the stored %s", h, first.Hash)
	}
}

// TestStatementAdjustments checks that late usage of a closed period is
// billed on its own lines, after the period's usage, at the price that
// applied then, adding up exactly to that usage's charge.
func TestStatementAdjustments(t *testing.T) {
	dec, _ := ParsePeriod("2026-12", time.UTC)
	book := statementBook(t, "USD")
	late := hourUsage("m", "d1", time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC), 3_000_000, 0, 0)
	late.OriginalPeriod = "2026-11"
	own := hourUsage("m", "d1", dec.Start, 1_000_000, 0, 0)
	st, err := ComputeStatement("acme", dec, book, []StatementUsage{late, own}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Lines) != 2 || st.Lines[0].Kind != LineUsage || st.Lines[1].Kind != LineAdjustment {
		t.Fatalf("lines %+v, want the usage line then the adjustment", st.Lines)
	}
	adj := st.Lines[1]
	// November 10 was under the first price: 3M × 0.60 = 1.80.
	if adj.Charge != 1_800_000_000 || adj.OriginalPeriod != "2026-11" || adj.InputPer1M != 600_000_000 {
		t.Errorf("adjustment %+v, want 1.80 at 0.60 per 1M for 2026-11", adj)
	}
	if st.Lines[0].Charge != 1_000_000_000 || st.Charge != 2_800_000_000 {
		t.Errorf("usage line %s, charge %s; want 1.00 and 2.80", st.Lines[0].Charge, st.Charge)
	}
}

func TestStatementRefuses(t *testing.T) {
	p, _ := ParsePeriod("2026-11", time.UTC)
	book := statementBook(t, "USD")
	early := hourUsage("m", "", p.End.Add(-30*time.Minute), 1, 0, 1) // ends after the period
	late := hourUsage("m", "", p.Start, 1, 0, 1)
	late.OriginalPeriod = "2026-10" // but it lies in this period
	bad := hourUsage("m", "", p.Start, 1, 2, 1)
	for name, u := range map[string]StatementUsage{"outside": early, "late inside": late, "cached above input": bad} {
		if _, err := ComputeStatement("acme", p, book, []StatementUsage{u}, false); !errors.Is(err, ErrInvalidStatement) {
			t.Errorf("%s: err = %v, want ErrInvalidStatement", name, err)
		}
	}
}

// TestRoundToMinorUnit checks the once-only rounding for currencies with
// 2, 0 and 3 decimals, half away from zero.
func TestRoundToMinorUnit(t *testing.T) {
	for _, tc := range []struct {
		in       Money
		currency string
		want     Money
	}{
		{2_460_036_000, "USD", 2_460_000_000},
		{5_000_000, "USD", 10_000_000},   // 0.005 → 0.01
		{4_999_999, "USD", 0},            // 0.004999999 → 0.00
		{-5_000_000, "USD", -10_000_000}, // -0.005 → -0.01
		{1_500_000_000, "JPY", 2_000_000_000},
		{1_234_500_000, "KWD", 1_235_000_000},
		{1_234_499_999, "KWD", 1_234_000_000},
	} {
		got, rule, err := roundToMinorUnit(tc.in, tc.currency)
		if err != nil || got != tc.want {
			t.Errorf("round %s %s = %s (%v), want %s", tc.in, tc.currency, got, err, tc.want)
		}
		if !strings.Contains(rule, tc.currency) || !strings.Contains(rule, "half away from zero") {
			t.Errorf("rule %q", rule)
		}
	}
	if _, _, err := roundToMinorUnit(1, "XYZW"); !errors.Is(err, ErrInvalidStatement) {
		t.Errorf("bad currency: err = %v", err)
	}
}

// TestAttachFinance checks which hours' cost a +05:30 November holds (those
// starting in it), which line each hour goes to (the price in force at its
// start), the margin, and that the hash ignores the finance part.
func TestAttachFinance(t *testing.T) {
	zone, err := ParseZone("+05:30")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePeriod("2026-11", zone) // 2026-10-31T18:30Z to 2026-11-30T18:30Z
	if err != nil {
		t.Fatal(err)
	}
	book := statementBook(t, "USD")
	change := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	usage := []StatementUsage{
		{Start: p.Start, End: p.Start.Add(30 * time.Minute), Model: "m", Deployment: "d1", Requests: 1, InputTokens: 1_000_000},
		hourUsage("m", "d1", change.Add(-time.Hour), 1_000_000, 0, 0),
		hourUsage("m", "d1", change.Add(time.Hour), 2_000_000, 0, 0),
		hourUsage("x", "d1", change, 5, 0, 5),
	}
	st, err := ComputeStatement("acme", p, book, usage, true)
	if err != nil {
		t.Fatal(err)
	}
	hash := st.Hash
	costs := []HourCost{
		{Hour: time.Date(2026, 10, 31, 18, 0, 0, 0, time.UTC), Model: "m", Deployment: "d1", Cost: 1_000, Busy: 1_000}, // starts before the period
		{Hour: time.Date(2026, 10, 31, 19, 0, 0, 0, time.UTC), Model: "m", Deployment: "d1", Cost: 10, Busy: 7},
		{Hour: change.Add(-time.Hour), Model: "m", Deployment: "d1", Cost: 20, Busy: 20},
		{Hour: change.Add(time.Hour), Model: "m", Deployment: "d1", Cost: 40, Busy: 30},
		{Hour: time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC), Model: "m", Deployment: "d1", Cost: 80, Busy: 80}, // starts in it, ends after
		{Hour: change, Model: "y", Deployment: "d1", Cost: 3, Busy: 3},                                           // no line of model y
	}
	if err := AttachFinance(&st, "tokens", "shared_weighted", costs); err != nil {
		t.Fatal(err)
	}
	f := st.Finance
	if f.AllocatedCost != 153 || f.BusyCost != 140 || f.IdleCost != 13 || f.Unassigned != 3 {
		t.Errorf("cost %s (busy %s, idle %s, unassigned %s), want 153 (140, 13, 3)", f.AllocatedCost, f.BusyCost, f.IdleCost, f.Unassigned)
	}
	// Lines: m at the first price, m at the second, x (unpriced).
	want := map[int]Money{0: 30, 1: 120, 2: 0}
	for _, lc := range f.Lines {
		if lc.AllocatedCost != want[lc.Line] || lc.Margin != st.Lines[lc.Line].Charge-lc.AllocatedCost {
			t.Errorf("line %d (%s at %s): cost %s margin %s, want cost %s", lc.Line, st.Lines[lc.Line].Model, st.Lines[lc.Line].PriceID, lc.AllocatedCost, lc.Margin, want[lc.Line])
		}
	}
	if len(f.Lines) != 3 || f.Margin != st.Charge-153 || f.UsageCharge != st.Charge || f.CostPer1K == nil || *f.CostPer1K != 0 {
		t.Errorf("finance %+v (charge %s)", f, st.Charge)
	}
	if h, _ := st.ContentHash(); h != hash {
		t.Errorf("the finance part changed the hash")
	}
}
