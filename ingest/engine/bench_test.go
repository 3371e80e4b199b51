package engine_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"tokenmeter/ingest/engine"
)

// vllmPage is a vLLM /metrics page of about the size a real one has (tens
// of histograms of some 30 buckets each, every series labelled with the
// model): the golden file and 24 more histograms.
func vllmPage(b *testing.B) []byte {
	b.Helper()
	base, err := os.ReadFile("testdata/vllm_v1_b.prom")
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	sb.Write(base)
	for h := range 24 {
		name := fmt.Sprintf("vllm:request_stat_%d_seconds", h)
		fmt.Fprintf(&sb, "# HELP %s A request histogram.\n# TYPE %s histogram\n", name, name)
		for i := range 30 {
			fmt.Fprintf(&sb, "%s_bucket{engine=\"0\",le=\"%g\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} %d.0\n", name, 0.001*float64(int(1)<<i), 100*i)
		}
		fmt.Fprintf(&sb, "%s_bucket{engine=\"0\",le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3000.0\n", name)
		fmt.Fprintf(&sb, "%s_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3000.0\n", name)
		fmt.Fprintf(&sb, "%s_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1234.5\n", name)
	}
	return []byte(sb.String())
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScrapeRound100 scrapes 100 vLLM endpoints once per op, as the
// agent does every interval. It reports the CPU time of a round (this
// process's, so the 100 stand-in servers' share is included: an upper
// bound of the agent's) and the share of one core that costs at a 10 s
// interval (the target: under 5%).
func BenchmarkScrapeRound100(b *testing.B) {
	page := vllmPage(b)
	var targets []engine.Target
	for i := range 100 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			w.Write(page)
		}))
		b.Cleanup(srv.Close)
		targets = append(targets, engine.Target{Deployment: fmt.Sprintf("d%d", i%10), URL: srv.URL + "/metrics", Replica: fmt.Sprintf("r%d", i)})
	}
	sc := engine.NewScraper(engine.ScraperConfig{Interval: 10 * time.Second})
	ctx := context.Background()
	now := time.Now()
	b.SetBytes(int64(len(page) * len(targets)))
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		samples, errs := sc.Scrape(ctx, targets, now.Add(time.Duration(i)*10*time.Second))
		if len(errs) > 0 || len(samples) != len(targets) {
			b.Fatalf("%d samples, errors %v", len(samples), errs)
		}
	}
	cpu := cpuTime(b) - cpu0
	perRound := cpu / time.Duration(b.N)
	b.ReportMetric(float64(perRound.Microseconds())/1000, "cpu-ms/round")
	b.ReportMetric(100*perRound.Seconds()/10, "%core@10s")
	b.ReportMetric(float64(len(page))/1024, "KiB/page")
}
