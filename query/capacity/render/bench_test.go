package render

import (
	"fmt"
	"io"
	"testing"
)

// BenchmarkHTML renders the report of 50 deployments over 30 days: every
// hour of each is a point of two scatter charts.
func BenchmarkHTML(b *testing.B) {
	r := sampleReport()
	r.Units = nil
	for i := range 50 {
		r.Units = append(r.Units, fixtureUnit(fmt.Sprintf("deployment-%02d", i), 30, 8, 9000, 1200, true))
	}
	w := &countingWriter{}
	b.ReportAllocs()
	for b.Loop() {
		w.n = 0
		if err := HTML(w, r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(w.n)/(1<<20), "MiB/file")
}

// BenchmarkCSV renders the same report as CSV.
func BenchmarkCSV(b *testing.B) {
	r := sampleReport()
	r.Units = nil
	for i := range 50 {
		r.Units = append(r.Units, fixtureUnit(fmt.Sprintf("deployment-%02d", i), 30, 8, 9000, 1200, true))
	}
	for b.Loop() {
		if err := CSV(io.Discard, r); err != nil {
			b.Fatal(err)
		}
	}
}

type countingWriter struct{ n int }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
