package export_test

import (
	"io"
	"runtime"
	"testing"
	"time"

	"tokenmeter/billing/export"
)

// BenchmarkUsageCostRows encodes b.N detailed rows (run it with
// -benchtime=1000000x for a million) to io.Discard in each format and
// reports rows/s and the peak heap in use.
func BenchmarkUsageCostRows(b *testing.B) {
	rows := usageRows(b, 4096)
	for _, f := range export.Formats() {
		b.Run(string(f), func(b *testing.B) {
			b.ReportAllocs()
			runtime.GC()
			w, err := export.NewUsageCostWriter(io.Discard, f, export.Options{Finance: true})
			if err != nil {
				b.Fatal(err)
			}
			var peak uint64
			var ms runtime.MemStats
			start := time.Now()
			b.ResetTimer()
			for i := range b.N {
				r := rows[i%len(rows)]
				r.ChargePeriodStart = r.ChargePeriodStart.Add(time.Duration(i/len(rows)) * time.Hour)
				r.ChargePeriodEnd = r.ChargePeriodStart.Add(time.Hour)
				if err := w.Write(r); err != nil {
					b.Fatal(err)
				}
				if i%200_000 == 0 {
					runtime.ReadMemStats(&ms)
					peak = max(peak, ms.HeapInuse)
				}
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// TestParquetMemoryBounded checks that the Parquet writer's heap does not
// grow with the export: after 300,000 rows in row groups of 10,000 it holds
// about as much as after 30,000.
func TestParquetMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 300,000 rows")
	}
	rows := usageRows(t, 1000)
	for _, f := range []export.Format{export.Parquet, export.CSV, export.FocusParquet} {
		w, err := export.NewUsageCostWriter(io.Discard, f, export.Options{Finance: true, RowGroupRows: 10_000})
		if err != nil {
			t.Fatal(err)
		}
		heap := func() uint64 {
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		var early uint64
		for i := range 300_000 {
			if err := w.Write(rows[i%len(rows)]); err != nil {
				t.Fatal(err)
			}
			if i == 30_000 {
				early = heap()
			}
		}
		late := heap()
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if late > early+16<<20 {
			t.Errorf("%s: heap %d MiB after 300,000 rows, %d MiB after 30,000: it grows with the export", f, late>>20, early>>20)
		}
	}
}
