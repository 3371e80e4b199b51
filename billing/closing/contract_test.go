package closing_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
)

// TestCloseWithContract closes September through ClickHouse for a tenant
// with a contract (acme: d1 dedicated at 2.50 per GPU-hour, m on d2 at a
// rate card with 10% off from September 15, a commitment) and one without
// (beta): the draft and the closed statement agree, d1's tokens cost 0 and
// its GPU-hours (one H100 busy all of each sampled hour: 9 hours that start
// in acme's September) are billed, d2's tokens from the 15th are at the
// contracted price, and beta's statement has no charges.
func TestCloseWithContract(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	sep15 := time.Date(2026, 9, 15, 0, 0, 0, 0, time.UTC)
	contract := &billing.Contract{
		RateCard:   []billing.RateCardEntry{{Model: "m", Deployment: "d2", EffectiveFrom: sep15, InputPer1M: mustMoney(t, "0.5"), DiscountPercent: 10 * 1_000_000_000}},
		Dedicated:  []billing.DedicatedDeployment{{Deployment: "d1", EffectiveFrom: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), PerGPUHour: 2_500_000_000}},
		Commitment: &billing.Commitment{MonthlySpend: 100_000_000_000},
	}
	accounts := &billing.Accounts{Tenants: []billing.TenantAccount{{ID: "acme", Contract: contract}}}
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}, Accounts: accounts})
	if err != nil {
		t.Fatal(err)
	}
	draft, err := svc.Statement(ctx, "acme", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	if draft.Closed || len(draft.Statement.Charges) == 0 {
		t.Fatalf("draft closed %v with charges %+v, want an open draft with the contract's charges", draft.Closed, draft.Statement.Charges)
	}
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	v, err := svc.Statement(ctx, "acme", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	st := v.Statement
	if !v.Closed || st.Charge != draft.Statement.Charge || len(st.Charges) != len(draft.Statement.Charges) {
		t.Fatalf("closed statement charge %s with %d charges; the draft had %s with %d", st.Charge, len(st.Charges), draft.Statement.Charge, len(draft.Statement.Charges))
	}
	var dedicated, commitment []billing.Charge
	discounts := map[int]billing.Money{}
	for _, c := range st.Charges {
		switch c.Kind {
		case billing.ChargeDedicated:
			dedicated = append(dedicated, c)
		case billing.ChargeCommitment:
			commitment = append(commitment, c)
		case billing.ChargeDiscount:
			discounts[c.Line] += c.Amount
		}
	}
	if len(dedicated) != 1 || dedicated[0].Deployment != "d1" || dedicated[0].Quantity != "9" || dedicated[0].Amount != 22_500_000_000 {
		t.Fatalf("dedicated charges %+v, want 9 GPU-hours of d1 at 2.50", dedicated)
	}
	spend := dedicated[0].Amount
	var sum billing.Money
	var d2Late bool
	for i, l := range st.Lines {
		sum += l.Charge
		if l.ContractedCharge == nil || discounts[i] != *l.Discount || *l.ContractedCharge != l.Charge+*l.Discount {
			t.Errorf("line %d (%s): contracted %v discount %v, charges %s", i, l.Deployment, l.ContractedCharge, l.Discount, discounts[i])
			continue
		}
		spend += *l.ContractedCharge
		// Expected contracted charge, computed here from the line's tokens.
		want := new(big.Rat).SetFrac64(int64(l.InputTokens-l.CachedInputTokens)*600_000_000+int64(l.CachedInputTokens)*300_000_000+int64(l.OutputTokens)*1_800_000_000, 1_000_000)
		switch {
		case l.Deployment == "d1":
			want.SetInt64(0)
		case l.Deployment == "d2" && !l.ChargeStart.Before(sep15):
			d2Late = true
			// Input 0.5 less 10% = 0.45; cached and output at list less 10%.
			want.SetFrac64(int64(l.InputTokens-l.CachedInputTokens)*450_000_000+int64(l.CachedInputTokens)*270_000_000+int64(l.OutputTokens)*1_620_000_000, 1_000_000)
		}
		if got := new(big.Rat).SetInt64(int64(*l.ContractedCharge)); new(big.Rat).Sub(got, want).Abs(new(big.Rat).Sub(got, want)).Cmp(big.NewRat(1, 2)) > 0 {
			t.Errorf("line %d (%s from %s): contracted %s, want %s", i, l.Deployment, l.ChargeStart, l.ContractedCharge, want.FloatString(9))
		}
		if l.ChargeStart.Before(sep15) && l.ChargeEnd.After(sep15) {
			t.Errorf("line %d spans the rate card's start", i)
		}
	}
	if !d2Late {
		t.Error("no d2 line from the 15th")
	}
	if len(commitment) != 1 || commitment[0].Amount != 100_000_000_000-spend {
		t.Errorf("commitment %+v, want 100 − %s", commitment, spend)
	}
	for _, c := range st.Charges {
		sum += c.Amount
	}
	if sum != st.Charge || st.Charge != 100_000_000_000 || st.Total != 100_000_000_000 {
		t.Errorf("Σ lines + Σ charges %s, charge %s, total %s; want 100 (the commitment)", sum, st.Charge, st.Total)
	}
	beta, err := svc.Statement(ctx, "beta", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(beta.Statement.Charges) != 0 || beta.Statement.Lines[0].ContractedCharge != nil {
		t.Errorf("beta has no contract but charges %+v", beta.Statement.Charges)
	}
}

func mustMoney(t *testing.T, s string) *billing.Money {
	t.Helper()
	m, err := billing.ParseMoney(s)
	if err != nil {
		t.Fatal(err)
	}
	return &m
}
