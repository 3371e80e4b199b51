package closing_test

import (
	"context"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
)

// TestCloseContractWithoutUsage closes September through ClickHouse, with
// no tenant list, for two tenants of the accounts file that sent no token
// and have no earlier statement: gamma, with a 50 commitment, and delta,
// with d1 dedicated at 2 per GPU-hour (9 sampled hours start in its UTC
// September). Each gets a statement without lines whose charges are what
// its contract owes: the whole commitment, the GPU-hours (and gamma's
// draft showed it before the close). A tenant of the file with neither
// (epsilon) gets none.
func TestCloseContractWithoutUsage(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	accounts := &billing.Accounts{Tenants: []billing.TenantAccount{
		{ID: "gamma", Contract: &billing.Contract{Commitment: &billing.Commitment{MonthlySpend: 50_000_000_000}}},
		{ID: "delta", Contract: &billing.Contract{Dedicated: []billing.DedicatedDeployment{
			{Deployment: "d1", EffectiveFrom: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), PerGPUHour: 2_000_000_000}}}},
		{ID: "epsilon", Contract: &billing.Contract{DiscountPercent: 10 * 1_000_000_000}},
	}}
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}, Accounts: accounts})
	if err != nil {
		t.Fatal(err)
	}
	// Before the close, gamma's draft shows what it will owe.
	draft, err := svc.Statement(ctx, "gamma", "2026-09", false)
	if err != nil {
		t.Fatalf("gamma's draft: %v", err)
	}
	if draft.Closed || len(draft.Statement.Charges) != 1 || draft.Statement.Total != 50_000_000_000 {
		t.Fatalf("gamma's draft: closed %v, charges %+v, total %s; want an open draft of the 50 commitment", draft.Closed, draft.Statement.Charges, draft.Statement.Total)
	}
	stored, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"})
	if err != nil {
		t.Fatal(err)
	}
	closed := map[string]bool{}
	for _, s := range stored {
		closed[s.Tenant] = true
	}
	if !closed["gamma"] || !closed["delta"] || closed["epsilon"] || !closed["acme"] || !closed["beta"] {
		t.Fatalf("closed %v, want acme, beta, gamma and delta (not epsilon)", closed)
	}
	want := map[string]struct {
		kind   billing.ChargeKind
		amount billing.Money
	}{"gamma": {billing.ChargeCommitment, 50_000_000_000}, "delta": {billing.ChargeDedicated, 18_000_000_000}}
	for tenant, w := range want {
		v, err := svc.Statement(ctx, tenant, "2026-09", false)
		if err != nil {
			t.Fatal(err)
		}
		st := v.Statement
		if !v.Closed || len(st.Lines) != 0 || len(st.Charges) != 1 || st.Charges[0].Kind != w.kind || st.Charges[0].Amount != w.amount ||
			st.Charge != w.amount || st.Total != w.amount {
			t.Errorf("%s: closed %v, %d lines, charges %+v, charge %s, total %s; want one %s charge of %s",
				tenant, v.Closed, len(st.Lines), st.Charges, st.Charge, st.Total, w.kind, w.amount)
		}
	}
}
