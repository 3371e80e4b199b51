package query_test

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/rollup/sketch"
)

// BenchmarkLatencySeriesOf builds the answer of every tenant's latency by
// tenant (1,000 series of one step) from rollup rows shaped as the 100M
// query benchmark's: each of rollup.LatencyMetrics and decode a histogram
// of a month of a tenant's ~100k values. Its Go side only: the rows are
// built once.
func BenchmarkLatencySeriesOf(b *testing.B) {
	start := time.Date(2026, 10, 28, 0, 0, 0, 0, time.UTC)
	q, err := query.RollupQuery{Start: start, End: start.Add(30 * 24 * time.Hour), GroupBy: []string{"tenant_id"}}.Normalize()
	if err != nil {
		b.Fatal(err)
	}
	page, err := query.NewPage(q.GroupBy, 1000, "")
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	hist := func(median float64) query.Dist {
		var h sketch.Histogram
		for range 2000 { // the shape; the counts are scaled below
			h.Add(median * (0.2 + rng.ExpFloat64()))
		}
		d := query.Dist{Keys: h.Keys}
		for _, c := range h.Counts {
			d.Counts = append(d.Counts, c*50)
			d.Count += c * 50
		}
		d.Sum = float64(d.Count) * median
		return d
	}
	var rows []query.RollupRow
	for t := range 1000 {
		r := query.RollupRow{Start: start, Group: map[string]string{"tenant_id": "tenant-" + strconv.Itoa(t)},
			Latency: map[string]query.Dist{}, HourDists: map[string]query.Dist{"decode": hist(800)}}
		for i, m := range rollup.LatencyMetrics {
			r.Latency[m] = hist(float64(50 * (i + 1)))
		}
		rows = append(rows, r)
	}
	b.ReportAllocs()
	for b.Loop() {
		series, _, err := query.LatencySeriesOf(q, page, rows)
		if err != nil || len(series) != 1000 {
			b.Fatal(len(series), err)
		}
	}
}
