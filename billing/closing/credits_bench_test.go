package closing_test

import (
	"context"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
)

// BenchmarkCloseCredits closes November for 200 tenants (four at a time,
// as a close does) without credits and with three grants per tenant (two
// of them drawn on), and reports the close's time per tenant: what credits
// add to a close (reading the grants and ledger once, drawing, writing the
// draws in one insert).
// Run with -benchtime=1x: each iteration needs a fresh database.
//
//	go test -run '^$' -bench BenchmarkCloseCredits -benchtime=1x ./billing/closing/
func BenchmarkCloseCredits(b *testing.B) {
	for _, bc := range []struct {
		name             string
		grants, credited bool
	}{
		{"no_grants", false, false},
		// The grants stored (600 single-row inserts, merged in the
		// background meanwhile), the closer without credits: the baseline
		// of the next.
		{"grants_unused", true, false},
		{"grants", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				f := newCreditsFixtureTB(b, 200, bc.grants)
				c := f.closer(f.store)
				if !bc.credited {
					c = f.closer(nil)
				}
				b.StartTimer()
				start := time.Now()
				got, err := c.Close(b.Context(), f.request("2026-11"))
				if err != nil || len(got) != 200 {
					b.Fatal(len(got), err)
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/1000/200, "ms/tenant")
			}
		})
	}
}

// BenchmarkDraftCredits reads one tenant's draft of an open month through
// Service.Statement without credits and with three grants (two drawn on):
// what credits add to a draft (two small reads).
//
//	go test -run '^$' -bench BenchmarkDraftCredits ./billing/closing/
func BenchmarkDraftCredits(b *testing.B) {
	f := newCreditsFixtureTB(b, 1, true)
	for _, withCredits := range []bool{false, true} {
		name := "no_credits"
		deps := closing.Deps{Reads: f.reads, Store: f.store, Prices: func(context.Context) (*billing.PriceBook, error) { return f.book, nil }}
		if withCredits {
			name, deps.Credits = "grants", f.store
		}
		svc, err := closing.NewService(deps, closing.Config{Now: func() time.Time { return time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC) }})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				v, err := svc.Statement(b.Context(), "t00", "2026-11", false)
				if err != nil || v.Closed || (withCredits != (len(v.Statement.Credits) > 0)) {
					b.Fatal(v.Statement.Credits, err)
				}
			}
		})
	}
}
