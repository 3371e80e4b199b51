package closing_test

import (
	"testing"
	"time"
)

// BenchmarkCloseCredits closes November for 200 tenants (four at a time,
// as a close does) without credits and with three grants per tenant (two
// of them drawn on), and reports the close's time per tenant: what credits
// add to a close (reading the ledger, reconciling, writing the draws).
// Run with -benchtime=1x: each iteration needs a fresh database.
//
//	go test -run '^$' -bench BenchmarkCloseCredits -benchtime=1x ./billing/closing/
func BenchmarkCloseCredits(b *testing.B) {
	for _, withGrants := range []bool{false, true} {
		name := "no_grants"
		if withGrants {
			name = "grants"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				f := newCreditsFixtureTB(b, 200, withGrants)
				c := f.closer(f.store)
				if !withGrants {
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
