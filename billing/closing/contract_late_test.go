package closing_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestCloseContractLateUsageAndRepricing closes September for acme (a
// fixed rate card changing on September 15 and a committed 100 a month)
// and beta (50% off), ingests late September usage on both sides of the
// 15th, changes September's list prices and closes October repricing
// September. October's late usage is cut at the rate card's change, each
// part at its entry; acme's late usage is absorbed by what is left of
// September's true-up (a negative commitment charge for 2026-09), not
// billed on top of it; acme's repricing is 0 under its fixed prices and
// beta's half the list difference.
func TestCloseContractLateUsageAndRepricing(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	sep15 := time.Date(2026, 9, 15, 0, 0, 0, 0, time.UTC)
	acme := &billing.Contract{
		RateCard: []billing.RateCardEntry{
			{Model: "m", EffectiveFrom: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), InputPer1M: mustMoney(t, "0.40"), CachedInputPer1M: mustMoney(t, "0.20"), OutputPer1M: mustMoney(t, "1.00")},
			{Model: "m", EffectiveFrom: sep15, InputPer1M: mustMoney(t, "0.30"), CachedInputPer1M: mustMoney(t, "0.10"), OutputPer1M: mustMoney(t, "0.50")},
		},
		Commitment: &billing.Commitment{MonthlySpend: 100_000_000_000},
	}
	beta := &billing.Contract{DiscountPercent: 50 * 1_000_000_000}
	accounts := &billing.Accounts{Tenants: []billing.TenantAccount{{ID: "acme", Contract: acme}, {ID: "beta", Contract: beta}}}
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}, Accounts: accounts})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	sep, err := svc.Statement(ctx, "acme", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	var trueUp billing.Money
	for _, c := range sep.Statement.Charges {
		if c.Kind == billing.ChargeCommitment {
			trueUp += c.Amount
		}
	}
	if trueUp <= 0 {
		t.Fatalf("September closed without a true-up: %+v", sep.Statement.Charges)
	}

	// Late September usage, before and after the 15th, the same price.
	evs := []struct {
		tenant string
		at     time.Time
	}{{"acme", time.Date(2026, 9, 10, 12, 0, 0, 0, time.UTC)}, {"acme", time.Date(2026, 9, 20, 3, 0, 0, 0, time.UTC)},
		{"beta", time.Date(2026, 9, 10, 12, 0, 0, 0, time.UTC)}, {"beta", time.Date(2026, 9, 20, 3, 0, 0, 0, time.UTC)}}
	for i, e := range evs {
		chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("contract-late-"+e.tenant+string(rune('a'+i)), e.tenant, "m", e.at, 7_000+int64(i)*1_000, 1_000, 300+int64(i))})
	}
	f.rollUp(t)
	// September's list prices change in place.
	repriced, err := billing.ParsePriceBook([]byte(strings.Replace(serviceBook,
		`"input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"`,
		`"input_per_1m": "0.70", "cached_input_per_1m": "0.35", "output_per_1m": "2.00"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, stored, err := billing.EnsurePriceBook(ctx, f.store, repriced, "test", time.Now()); err != nil || !stored {
		t.Fatalf("new price book: stored %v, %v", stored, err)
	}
	f.rollUp(t)
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Reprice: []string{"2026-09"}}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "beta"} {
		v, err := svc.Statement(ctx, tenant, "2026-10", false)
		if err != nil {
			t.Fatal(err)
		}
		st := v.Statement
		var sum, lateContracted, absorbed billing.Money
		var parts, repricings int
		for i, l := range st.Lines {
			sum += l.Charge
			switch l.Kind {
			case billing.LineAdjustment:
				parts++
				if tenant == "acme" && l.ChargeStart.Before(sep15) && l.ChargeEnd.After(sep15) {
					t.Errorf("%s: adjustment line %d spans the rate card's change on the 15th", tenant, i)
				}
				if l.ContractedCharge == nil {
					t.Fatalf("%s: adjustment line %d has no contracted charge", tenant, i)
				}
				lateContracted += *l.ContractedCharge
				if tenant == "acme" {
					// The entry in force at the line's start, exactly.
					in, cached, out := int64(400_000_000), int64(200_000_000), int64(1_000_000_000)
					if !l.ChargeStart.Before(sep15) {
						in, cached, out = 300_000_000, 100_000_000, 500_000_000
					}
					want := new(big.Rat).SetFrac64(int64(l.InputTokens-l.CachedInputTokens)*in+int64(l.CachedInputTokens)*cached+int64(l.OutputTokens)*out, 1_000_000)
					if got := new(big.Rat).SetInt64(int64(*l.ContractedCharge)); new(big.Rat).Abs(new(big.Rat).Sub(got, want)).Cmp(big.NewRat(1, 2)) > 0 {
						t.Errorf("acme: adjustment from %s contracted %s, want %s", l.ChargeStart, l.ContractedCharge, want.FloatString(9))
					}
				}
			case billing.LineRepricing:
				repricings++
				if l.Charge == 0 || l.ContractedCharge == nil {
					t.Fatalf("%s: repricing line %+v: want a list difference and a contracted one", tenant, l)
				}
				if r := l.Repriced; r == nil || r.InputCharge+r.CachedInputCharge+r.OutputCharge != l.Charge {
					t.Errorf("%s: repricing kinds %+v do not add up to %s", tenant, r, l.Charge)
				}
				want := billing.Money(0) // acme: fixed rate-card prices
				if tenant == "beta" {
					want = l.Charge / 2
				}
				if d := *l.ContractedCharge - want; d < -10 || d > 10 {
					t.Errorf("%s: repricing contracted %s (list %s), want %s", tenant, l.ContractedCharge, l.Charge, want)
				}
			}
		}
		for _, c := range st.Charges {
			sum += c.Amount
			if c.Kind == billing.ChargeCommitment && c.OriginalPeriod == "2026-09" {
				absorbed += c.Amount
			}
		}
		if (tenant == "acme" && parts != 2) || parts == 0 || repricings == 0 {
			t.Errorf("%s: %d adjustment lines and %d repricings, want late usage (acme's cut on the 15th) and a repricing", tenant, parts, repricings)
		}
		if sum != st.Charge {
			t.Errorf("%s: Σ lines + Σ charges %s, charge %s", tenant, sum, st.Charge)
		}
		// The FOCUS statement file ties out: the repricing rows at the
		// contracted difference, BilledCost adding up to the total.
		rows, err := svc.StatementRows(ctx, v)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		w, err := export.NewStatementWriter(&buf, export.FocusCSV, svc.ExportOptions(false))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if err := w.Write(r); err != nil {
				t.Fatalf("%s: FOCUS row: %v", tenant, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		recs, err := csv.NewReader(&buf).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		col := slices.Index(recs[0], "BilledCost")
		billed := new(big.Rat)
		for _, rec := range recs[1:] {
			if v, ok := new(big.Rat).SetString(rec[col]); ok {
				billed.Add(billed, v)
			}
		}
		if want := big.NewRat(int64(st.Total), 1_000_000_000); billed.Cmp(want) != 0 {
			t.Errorf("%s: FOCUS BilledCost adds up to %s, total %s", tenant, billed.FloatString(9), st.Total)
		}
		wantAbsorbed := billing.Money(0)
		if tenant == "acme" {
			wantAbsorbed = -min(lateContracted, trueUp)
		}
		if absorbed != wantAbsorbed || (tenant == "acme" && absorbed == 0) {
			t.Errorf("%s: September's true-up absorbed %s, want %s (late usage %s, true-up %s)", tenant, absorbed, wantAbsorbed, lateContracted, trueUp)
		}
	}
}
