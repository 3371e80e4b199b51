package billing

import (
	"testing"
	"time"
)

// TestAttachFinanceUnderContract: under a contract, finance's usage charge
// and each line's margin are at the contracted charge, not at list, and
// the dedicated GPU-hours and the commitment true-up count as revenue in
// the margin. The month is TestContractWorkedExample's: contracted 8.5,
// 1.35 and 0 (dedicated) on the lines, 7 of GPU-hours, 83.15 of true-up.
func TestAttachFinanceUnderContract(t *testing.T) {
	book := contractBook(t)
	p, err := ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	at := func(day, hour int) time.Time { return time.Date(2026, 11, day, hour, 0, 0, 0, time.UTC) }
	usage := []StatementUsage{
		{Start: at(2, 0), End: at(2, 1), Model: "m", Deployment: "d1", Requests: 10, InputTokens: 3_000_000, CachedInputTokens: 1_000_000, OutputTokens: 1_000_000},
		{Start: at(20, 0), End: at(20, 1), Model: "m", Deployment: "d1", Requests: 5, InputTokens: 2_000_000},
		{Start: at(3, 0), End: at(3, 1), Model: "n", Deployment: "ded", Requests: 7, InputTokens: 5_000_000, OutputTokens: 1_000_000},
	}
	c := &Contract{
		RateCard:   []RateCardEntry{{Model: "m", EffectiveFrom: at(15, 0), InputPer1M: mp("1.5"), DiscountPercent: pctW("10")}},
		Allowances: []Allowance{{Model: "m", TokenKind: TokenOutput, Tokens: 500_000}},
		Tiers:      []TierSchedule{{Model: "m", Tiers: []Tier{{UpTo: 4_000_000}, {DiscountPercent: pctW("50")}}}},
		Dedicated:  []DedicatedDeployment{{Deployment: "ded", EffectiveFrom: at(1, 0), PerGPUHour: 2_000_000_000}},
		Commitment: &Commitment{MonthlySpend: 100_000_000_000},
	}
	hours := []DedicatedHour{{Deployment: "ded", Hour: at(3, 0), MicroHours: 1_500_000}, {Deployment: "ded", Hour: at(3, 1), MicroHours: 2_000_000}}
	st, err := ComputeContractStatement("acme", p, book, usage, false, c, hours)
	if err != nil {
		t.Fatal(err)
	}
	costs := []HourCost{
		{Hour: at(2, 0), Model: "m", Deployment: "d1", Cost: 3_000_000_000, Busy: 2_000_000_000},
		{Hour: at(20, 0), Model: "m", Deployment: "d1", Cost: 1_000_000_000, Busy: 1_000_000_000},
		{Hour: at(3, 0), Model: "n", Deployment: "ded", Cost: 5_000_000_000, Busy: 4_000_000_000},
	}
	if err := AttachFinance(&st, "tokens", "shared_weighted", costs); err != nil {
		t.Fatal(err)
	}
	f := st.Finance
	// Contracted 8.5 + 1.35 + 0 (list 12.5 + 4 + 8 = 24.5).
	if f.UsageCharge != 9_850_000_000 || f.DedicatedCharge != 7_000_000_000 || f.CommitmentCharge != 83_150_000_000 {
		t.Errorf("usage charge %s, dedicated %s, commitment %s; want 9.85, 7, 83.15", f.UsageCharge, f.DedicatedCharge, f.CommitmentCharge)
	}
	// 9.85 + 7 + 83.15 − 9 of GPU cost: the tenant pays 100 (its total).
	if f.AllocatedCost != 9_000_000_000 || f.Margin != 91_000_000_000 || st.Total != 100_000_000_000 {
		t.Errorf("allocated %s, margin %s, total %s; want 9, 91, 100", f.AllocatedCost, f.Margin, st.Total)
	}
	want := map[int]Money{0: 5_500_000_000, 1: 350_000_000, 2: -5_000_000_000}
	if len(f.Lines) != 3 {
		t.Fatalf("finance lines %+v", f.Lines)
	}
	for _, lc := range f.Lines {
		if lc.Margin != want[lc.Line] || lc.Margin != *st.Lines[lc.Line].ContractedCharge-lc.AllocatedCost {
			t.Errorf("line %d: margin %s, want %s (contracted %s − cost %s)", lc.Line, lc.Margin, want[lc.Line], st.Lines[lc.Line].ContractedCharge, lc.AllocatedCost)
		}
	}
	// Without a contract, nothing changes: usage charge at list, margin
	// usage charge − cost, no contract figures.
	plain, err := ComputeStatement("acme", p, book, usage, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := AttachFinance(&plain, "tokens", "shared_weighted", costs); err != nil {
		t.Fatal(err)
	}
	if g := plain.Finance; g.UsageCharge != plain.Charge || g.Margin != plain.Charge-9_000_000_000 || g.DedicatedCharge != 0 || g.CommitmentCharge != 0 {
		t.Errorf("without a contract: finance %+v, charge %s", g, plain.Charge)
	}
}
