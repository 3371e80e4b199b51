package closing_test

import (
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
)

// serviceBookLater is serviceBook after September closed: m costs more
// from September 1 (a repricing no one asked for yet).
const serviceBookLater = `{"currency": "USD",
	"gpu_prices": [{"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.60"}],
	"token_prices": [{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"},
		{"model": "m", "effective_from": "2026-09-01T00:00:00Z", "input_per_1m": "0.90", "cached_input_per_1m": "0.40", "output_per_1m": "2.70"}],
	"allocation": {"busy_policy": "tokens", "idle_policy": "shared_weighted"}}`

// TestUsageCostOfClosedMonth closes September, then puts a book that
// prices m higher from September 1, and exports September's usage and
// cost by hour and by day: each tenant's rows of September add up to its
// statement's charge (priced with the book the statement was billed with,
// not the one in force), every row lies inside the billing period it is
// labelled with, and the +05:30 tenant's hours and days that straddle
// 18:30 UTC are split there, with the tokens of each side and the hour's
// allocated cost on the side its start lies in.
func TestUsageCostOfClosedMonth(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	later, err := billing.ParsePriceBook([]byte(serviceBookLater))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(ctx, f.store, later, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	f.rollUp(t)
	statements := map[string]billing.Statement{}
	for _, tenant := range []string{"acme", "beta"} {
		v, err := f.svc.Statement(ctx, tenant, "2026-09", true)
		if err != nil {
			t.Fatal(err)
		}
		statements[tenant] = v.Statement
	}
	for _, q := range []closing.UsageCostQuery{
		{Start: time.Date(2026, 8, 31, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC), Step: "hour"},
		{Start: time.Date(2026, 8, 31, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC), Step: "day"},
	} {
		t.Run(q.Step, func(t *testing.T) {
			charge := map[string]billing.Money{}
			var splitRows int
			var splitCost billing.Money
			err := f.svc.EachUsageCost(ctx, q, func(r *export.UsageCostRow) error {
				if r.Tenant == billing.IdleTenant {
					return nil // no tenant's, no statement
				}
				if r.ChargePeriodStart.Before(r.BillingPeriodStart) || r.ChargePeriodEnd.After(r.BillingPeriodEnd) {
					t.Errorf("%s %s row %s to %s outside its billing period %s (%s to %s)", r.Tenant, r.Model, r.ChargePeriodStart, r.ChargePeriodEnd,
						r.BillingPeriod, r.BillingPeriodStart, r.BillingPeriodEnd)
				}
				if r.BillingPeriod == "2026-09" {
					charge[r.Tenant] += r.ListCharge
					if r.PriceBook != statements[r.Tenant].PriceBook {
						t.Errorf("%s's September row priced with book %s, its statement with %s", r.Tenant, r.PriceBook, statements[r.Tenant].PriceBook)
					}
				}
				edge := time.Date(2026, 9, 30, 18, 30, 0, 0, time.UTC)
				if r.Tenant == "beta" && (r.ChargePeriodEnd.Equal(edge) || r.ChargePeriodStart.Equal(edge)) {
					splitRows++
					if q.Step == "hour" && r.ChargePeriodStart.Equal(edge) && r.AllocatedCost != 0 {
						t.Errorf("beta's 18:30-19:00 piece carries allocated cost %s: the hour's cost belongs to the piece of its start", r.AllocatedCost)
					}
					if r.ChargePeriodEnd.Equal(edge) {
						splitCost += r.AllocatedCost
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for tenant, st := range statements {
				if charge[tenant] != st.Charge {
					t.Errorf("%s: September's rows charge %s, its statement %s", tenant, charge[tenant], st.Charge)
				}
			}
			// Two deployments, each split at beta's edge: four pieces.
			if splitRows != 4 || splitCost <= 0 {
				t.Errorf("beta's rows at 18:30 UTC on September 30: %d pieces (want 4), allocated cost before the edge %s", splitRows, splitCost)
			}
		})
	}
}
