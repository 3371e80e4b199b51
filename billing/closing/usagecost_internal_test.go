package closing

import (
	"fmt"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
	"tokenmeter/query"
)

// BenchmarkUsageCostPricer prices hourly rows of 100 tenants (one in
// +05:30) and 3 models in an open month whose book has a price change
// of one model: the export's per-row cost of usageCostPricer, rows that
// need no split (the split ones read ClickHouse and are not measured).
func BenchmarkUsageCostPricer(b *testing.B) {
	book, err := billing.ParsePriceBook([]byte(`{"currency":"USD","token_prices":[
	 {"model":"m0","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"},
	 {"model":"m0","effective_from":"2026-11-15T12:00:00Z","input_per_1m":"0.61","cached_input_per_1m":"0.30","output_per_1m":"1.80"},
	 {"model":"m1","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"2","cached_input_per_1m":"1","output_per_1m":"6"},
	 {"model":"m2","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"1","cached_input_per_1m":"0.5","output_per_1m":"3"}]}`))
	if err != nil {
		b.Fatal(err)
	}
	plus0530, err := billing.ParseZone("+05:30")
	if err != nil {
		b.Fatal(err)
	}
	s := &Service{cfg: Config{DefaultZone: time.UTC, Zones: map[string]*time.Location{"t0": plus0530}}}
	x := newUsageCostPricer(s, book, query.CostQuery{}, time.Hour)
	x.closed["2026-11"] = map[string]string{} // none closed: no store read
	var rows []query.UsageCostRow
	for h := range 24 {
		for t := range 100 {
			for m := range 3 {
				rows = append(rows, query.UsageCostRow{Start: time.Date(2026, 11, 10, h, 0, 0, 0, time.UTC), Tenant: fmt.Sprintf("t%d", t),
					Model: fmt.Sprintf("m%d", m), Deployment: "d", Requests: 10, InputTokens: 1000, OutputTokens: 100})
			}
		}
	}
	var out export.UsageCostRow
	n := 0
	fn := func(*export.UsageCostRow) error { n++; return nil }
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := &rows[i%len(rows)]
		out = export.UsageCostRow{Tenant: r.Tenant, Model: r.Model, ChargePeriodStart: r.Start}
		if err := x.emit(b.Context(), r, &out, fn); err != nil {
			b.Fatal(err)
		}
	}
}
