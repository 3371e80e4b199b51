package closing

import (
	"fmt"
	"math/rand/v2"
	"slices"
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
	for _, closed := range []bool{false, true} {
		b.Run(fmt.Sprintf("closed=%v", closed), func(b *testing.B) { benchPricer(b, s, book, closed) })
	}
}

// benchPricer runs the benchmark; closed: the month is closed with another
// book than the one in force, so that every row is priced again.
func benchPricer(b *testing.B, s *Service, book *billing.PriceBook, closed bool) {
	x := newUsageCostPricer(s, book, query.CostQuery{}, time.Hour)
	x.closed["2026-11"] = map[string]string{} // none closed: no store read
	if closed {
		old := *book
		old.TokenPrices = old.TokenPrices[2:] // m0 unpriced, m1 and m2 as in force
		x.books["old"] = &old
		for t := range 100 {
			x.closed["2026-11"][fmt.Sprintf("t%d", t)] = "old"
		}
	}
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

// TestListChargeMatchesPriceBook checks the pricer's 128-bit list charge
// against PriceBook.ListCharge (big.Rat) on random prices of up to nine
// decimals and token counts up to 10^12, and on ties of the half-even
// rounding.
func TestListChargeMatchesPriceBook(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20000 {
		p := billing.TokenPrice{Model: "m", EffectiveFrom: at,
			InputPer1M: billing.Money(rng.Int64N(100_000_000_000)), CachedInputPer1M: billing.Money(rng.Int64N(10_000_000_000)),
			OutputPer1M: billing.Money(rng.Int64N(1_000_000_000_000))}
		scale := []uint64{10, 1_000_000, 1_000_000_000_000}[i%3]
		input, output := rng.Uint64N(scale), rng.Uint64N(scale)
		cached := rng.Uint64N(input + 1)
		if i%7 == 0 { // a tie: a charge of exactly k + 0.5 nano-units
			p = billing.TokenPrice{Model: "m", EffectiveFrom: at, InputPer1M: 1, CachedInputPer1M: 1, OutputPer1M: 1}
			input, cached, output = 500_000+uint64(i)*1_000_000, 0, 0
		}
		book := &billing.PriceBook{Currency: "USD", TokenPrices: []billing.TokenPrice{p}}
		want, _, wok := book.ListCharge("m", at, int64(input), int64(cached), int64(output))
		got, ok := listCharge(p, input-cached, cached, output)
		if ok != wok || got != want {
			t.Fatalf("%+v × %d/%d/%d: listCharge %s (%v), PriceBook.ListCharge %s (%v)", p, input, cached, output, got, ok, want, wok)
		}
	}
}

// TestCachedPriceMatchesTokenPrice: the export's cached price lookup (the
// last answer kept while the instant stays where it holds) answers what
// PriceBook.TokenPrice does, with its price's id, for instants in order
// (as the export asks), backwards and at random, including instants on
// and next to a price change and before a model's first price.
func TestCachedPriceMatchesTokenPrice(t *testing.T) {
	rng := rand.New(rand.NewPCG(34, 4))
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for round := range 200 {
		book := &billing.PriceBook{Currency: "USD"}
		for m := range 3 {
			for range rng.IntN(4) {
				book.TokenPrices = append(book.TokenPrices, billing.TokenPrice{Model: fmt.Sprintf("m%d", m),
					EffectiveFrom: base.Add(time.Duration(rng.IntN(48)) * time.Hour),
					InputPer1M:    billing.Money(rng.Int64N(1e9)), OutputPer1M: billing.Money(rng.Int64N(1e9))})
			}
		}
		x := newUsageCostPricer(&Service{}, book, query.CostQuery{}, time.Hour)
		var instants []time.Time
		for h := -2; h < 50; h++ {
			at := base.Add(time.Duration(h) * time.Hour)
			instants = append(instants, at, at.Add(-time.Nanosecond), at.Add(time.Minute))
		}
		switch round % 3 {
		case 1:
			slices.Reverse(instants)
		case 2:
			rng.Shuffle(len(instants), func(i, j int) { instants[i], instants[j] = instants[j], instants[i] })
		}
		for _, at := range instants {
			for m := range 4 {
				model := fmt.Sprintf("m%d", m)
				want, ok := book.TokenPrice(model, at)
				got := x.inForcePrice(model, at)
				if ok != (got != nil) || ok && (got.price != want || got.id != want.ID()) {
					t.Fatalf("round %d, %s at %s: cached %+v, TokenPrice %+v %v", round, model, at, got, want, ok)
				}
			}
		}
	}
}
