package engine_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/engine"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// server serves the scrape files named by files[target], one per request,
// in turn (the last one again once they run out).
type server struct {
	mu    sync.Mutex
	files map[string][]string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	list := s.files[r.URL.Path]
	if len(list) == 0 {
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	name := list[0]
	if len(list) > 1 {
		s.files[r.URL.Path] = list[1:]
	}
	s.mu.Unlock()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write(data)
}

func f64(v float64) *float64 { return &v }
func u32(v uint32) *uint32   { return &v }
func u64(v uint64) *uint64   { return &v }

const llama = "meta-llama/Llama-3.1-8B-Instruct"

// TestScrapeGoldenFiles scrapes the golden files of each engine (both vLLM
// metric-name generations), over HTTP, and checks every field of every
// sample, counter deltas across scrapes and a counter reset included.
func TestScrapeGoldenFiles(t *testing.T) {
	srv := &server{files: map[string][]string{
		"/v1":     {"vllm_v1_a.prom", "vllm_v1_b.prom", "vllm_v1_c_restarted.prom"},
		"/v0":     {"vllm_v0.prom"},
		"/sglang": {"sglang.prom"},
		"/tgi":    {"tgi.prom"},
	}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	targets := []engine.Target{
		{Deployment: "llama-8b", URL: hs.URL + "/v1", Replica: "llama-8b-0", Node: "gpu-node-1"},
		{Deployment: "llama-8b-old", URL: hs.URL + "/v0"},
		{Deployment: "qwen-7b", URL: hs.URL + "/sglang", Replica: "qwen-7b-0"},
		{Deployment: "bloom", URL: hs.URL + "/tgi", Replica: "bloom-0"},
	}
	host := hs.Listener.Addr().String()
	sc := engine.NewScraper(engine.ScraperConfig{Interval: 10 * time.Second})
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

	sample := func(dep, replica, eng, model, node string, at time.Time, iv float64) *meterv1.EngineSample {
		return &meterv1.EngineSample{SampleId: engine.SampleID(dep, replica, at), Deployment: dep, Engine: eng, Replica: replica,
			Model: model, Node: node, SampledAt: timestamppb.New(at), IntervalS: iv, Source: "scrape"}
	}
	first := []*meterv1.EngineSample{}
	s := sample("llama-8b", "llama-8b-0", "vllm", llama, "gpu-node-1", t0, 10)
	s.Running, s.Waiting, s.KvCacheUsage = u32(12), u32(3), f64(0.4375) // counters unknown at the first scrape
	first = append(first, s)
	s = sample("llama-8b-old", host, "vllm", llama, "", t0, 10)
	s.Running, s.Waiting, s.KvCacheUsage, s.PrefixCacheHitRate = u32(4), u32(17), f64(0.9875), f64(0.25)
	first = append(first, s)
	s = sample("qwen-7b", "qwen-7b-0", "sglang", "Qwen/Qwen2.5-7B-Instruct", "", t0, 10)
	s.Running, s.Waiting, s.KvCacheUsage, s.PrefixCacheHitRate = u32(24), u32(5), f64(0.62), f64(0.31)
	first = append(first, s)
	s = sample("bloom", "bloom-0", "tgi", "", "", t0, 10)
	s.Running, s.Waiting = u32(32), u32(6)
	first = append(first, s)

	got, errs := sc.Scrape(t.Context(), targets, t0)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if d := cmp.Diff(first, got, protocmp.Transform()); d != "" {
		t.Fatalf("first scrape (-want +got):\n%s", d)
	}

	// Second scrape, 10 s later: deltas of the vLLM V1 counters, and the
	// mean tokens per iteration, (2,096,000 - 2,000,000) / (10,400 - 10,000).
	t1 := t0.Add(10 * time.Second)
	got, errs = sc.Scrape(t.Context(), targets[:1], t1)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	s = sample("llama-8b", "llama-8b-0", "vllm", llama, "gpu-node-1", t1, 10)
	s.Running, s.Waiting, s.KvCacheUsage = u32(9), u32(0), f64(0.5)
	s.PrefixCacheQueries, s.PrefixCacheHits, s.Preemptions, s.BatchTokens = u64(6400), u64(2400), u64(2), f64(240)
	s.Restarts = u32(0)
	if d := cmp.Diff([]*meterv1.EngineSample{s}, got, protocmp.Transform()); d != "" {
		t.Fatalf("second scrape (-want +got):\n%s", d)
	}

	// The engine restarted: every counter is below its previous value, so
	// the delta is the new value (12,000 tokens over 40 iterations: 300).
	// 40 s later, beyond MaxGap (30 s): the sample covers one interval,
	// the counters their whole increase.
	t2 := t1.Add(40 * time.Second)
	got, _ = sc.Scrape(t.Context(), targets[:1], t2)
	s = sample("llama-8b", "llama-8b-0", "vllm", llama, "gpu-node-1", t2, 10)
	s.Running, s.Waiting, s.KvCacheUsage = u32(2), u32(1), f64(0.0625)
	s.PrefixCacheQueries, s.PrefixCacheHits, s.Preemptions, s.BatchTokens = u64(800), u64(200), u64(0), f64(300)
	s.Restarts = u32(1) // the counters went down: the restart is counted
	if d := cmp.Diff([]*meterv1.EngineSample{s}, got, protocmp.Transform()); d != "" {
		t.Fatalf("scrape after a restart (-want +got):\n%s", d)
	}

	limits := ingest.DefaultLimits()
	for _, s := range append(first, got...) {
		if err := limits.ValidateEngineSample(s, t2); err != nil {
			t.Errorf("sample of %s does not validate: %v", s.GetDeployment(), err)
		}
	}
}

// TestScrapeDataParallelRestart scrapes a data-parallel vLLM 0.8 (two
// engines, counters named gpu_prefix_cache_*) whose engine 1 restarted
// between two scrapes: engine 0's counters add their increase, engine 1's
// their new values; gauges add up, the KV-cache ratio is averaged.
func TestScrapeDataParallelRestart(t *testing.T) {
	hs := httptest.NewServer(&server{files: map[string][]string{"/m": {"vllm_0_8_dp_a.prom", "vllm_0_8_dp_b.prom"}}})
	defer hs.Close()
	tg := []engine.Target{{Deployment: "qwen", URL: hs.URL + "/m", Replica: "qwen-0"}}
	sc := engine.NewScraper(engine.ScraperConfig{Interval: 10 * time.Second})
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	if _, errs := sc.Scrape(t.Context(), tg, t0); len(errs) > 0 {
		t.Fatal(errs)
	}
	got, errs := sc.Scrape(t.Context(), tg, t0.Add(10*time.Second))
	if len(errs) > 0 || len(got) != 1 {
		t.Fatalf("%v %v", got, errs)
	}
	s := got[0]
	// queries: (5600-5000) + 300; hits: (1100-1000) + 100; preemptions: (5-4) + 1.
	// Engine 1's restart is a restart of the replica.
	want := map[string]float64{"running": 14, "waiting": 3, "kv": 0.5, "queries": 900, "hits": 200, "preemptions": 2, "restarts": 1}
	have := map[string]float64{"running": float64(s.GetRunning()), "waiting": float64(s.GetWaiting()), "kv": s.GetKvCacheUsage(),
		"queries": float64(s.GetPrefixCacheQueries()), "hits": float64(s.GetPrefixCacheHits()), "preemptions": float64(s.GetPreemptions()),
		"restarts": float64(s.GetRestarts())}
	if d := cmp.Diff(want, have); d != "" || s.PrefixCacheQueries == nil {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// TestScrapeNIMAndDynamo scrapes the golden files of NVIDIA NIM for LLMs
// (its unprefixed vLLM-style names) and NVIDIA Dynamo (a vLLM worker with
// Dynamo's kvstats and the backend's names passed through, and a
// frontend), over HTTP, checking every field: restarts are 0 between
// scrapes of a running engine and 1 after a restart that only the process
// start time (NIM) or the uptime (Dynamo) shows, the counters having
// already climbed past their old values; after such a restart every
// counter delta is its new value.
func TestScrapeNIMAndDynamo(t *testing.T) {
	srv := &server{files: map[string][]string{
		"/nim":      {"nim_a.prom", "nim_b.prom", "nim_c_restarted.prom"},
		"/worker":   {"dynamo_worker_a.prom", "dynamo_worker_b_restarted.prom"},
		"/frontend": {"dynamo_frontend.prom"},
	}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	targets := []engine.Target{
		{Deployment: "llama-nim", URL: hs.URL + "/nim", Replica: "llama-nim-0"},
		{Deployment: "qwen-dyn", URL: hs.URL + "/worker", Replica: "qwen-dyn-worker-0"},
		{Deployment: "qwen-dyn", URL: hs.URL + "/frontend", Replica: "qwen-dyn-frontend"},
	}
	sc := engine.NewScraper(engine.ScraperConfig{Interval: 10 * time.Second})
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	sample := func(tg engine.Target, eng, model string, at time.Time) *meterv1.EngineSample {
		return &meterv1.EngineSample{SampleId: engine.SampleID(tg.Deployment, tg.Replica, at), Deployment: tg.Deployment, Engine: eng,
			Replica: tg.Replica, Model: model, SampledAt: timestamppb.New(at), IntervalS: 10, Source: "scrape"}
	}
	const nimModel, qwen = "meta/llama-3.1-8b-instruct", "Qwen/Qwen3-0.6B"
	nim := sample(targets[0], "nim", nimModel, t0)
	nim.Running, nim.Waiting, nim.KvCacheUsage = u32(7), u32(2), f64(0.355)
	worker := sample(targets[1], "dynamo", qwen, t0)
	// Dynamo's own kvstats win over vLLM's passed-through kv_cache_usage_perc (0.99).
	worker.Running, worker.Waiting, worker.KvCacheUsage, worker.PrefixCacheHitRate = u32(8), u32(1), f64(0.25), f64(0.4)
	frontend := sample(targets[2], "dynamo", "qwen/qwen3-0.6b", t0)
	// The HTTP queue is the queue; in flight less queued (10 - 7) are running.
	frontend.Running, frontend.Waiting = u32(3), u32(7)
	want := []*meterv1.EngineSample{nim, worker, frontend}
	got, errs := sc.Scrape(t.Context(), targets, t0)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Fatalf("first scrape (-want +got):\n%s", d)
	}

	t1 := t0.Add(10 * time.Second)
	nim = sample(targets[0], "nim", nimModel, t1)
	nim.Running, nim.Waiting, nim.KvCacheUsage, nim.Restarts = u32(5), u32(0), f64(0.3), u32(0)
	// The worker restarted (uptime 3600.5 s, then 20 s) and its counters
	// are above their old values: deltas are the new values, not the
	// differences (12,000 queries, not 2,000).
	worker = sample(targets[1], "dynamo", qwen, t1)
	worker.Running, worker.Waiting, worker.KvCacheUsage, worker.PrefixCacheHitRate = u32(3), u32(0), f64(0.125), f64(0.5)
	worker.PrefixCacheQueries, worker.PrefixCacheHits, worker.Preemptions, worker.Restarts = u64(12000), u64(6000), u64(5), u32(1)
	frontend = sample(targets[2], "dynamo", "qwen/qwen3-0.6b", t1)
	frontend.Running, frontend.Waiting, frontend.Restarts = u32(3), u32(7), u32(0)
	got, errs = sc.Scrape(t.Context(), targets, t1)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if d := cmp.Diff([]*meterv1.EngineSample{nim, worker, frontend}, got, protocmp.Transform()); d != "" {
		t.Fatalf("second scrape (-want +got):\n%s", d)
	}

	// NIM restarted: a later process start time, every counter higher.
	t2 := t1.Add(10 * time.Second)
	nim = sample(targets[0], "nim", nimModel, t2)
	nim.Running, nim.Waiting, nim.KvCacheUsage, nim.Restarts = u32(3), u32(1), f64(0.125), u32(1)
	got, errs = sc.Scrape(t.Context(), targets[:1], t2)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if d := cmp.Diff([]*meterv1.EngineSample{nim}, got, protocmp.Transform()); d != "" {
		t.Fatalf("NIM after a restart (-want +got):\n%s", d)
	}
	limits := ingest.DefaultLimits()
	for _, s := range append(want, got...) {
		if err := limits.ValidateEngineSample(s, t2); err != nil {
			t.Errorf("sample of %s/%s does not validate: %v", s.GetDeployment(), s.GetReplica(), err)
		}
	}
}

// TestParseEngineNames maps one page of each engine to its Reading's
// gauges, and checks which engine a page is: NIM's or Dynamo's own names
// decide over their vLLM backend's on the same page, vLLM and SGLang
// together are refused.
func TestParseEngineNames(t *testing.T) {
	for _, tc := range []struct {
		file, engine, model        string
		running, waiting, kv, rate *float64
	}{
		{"vllm_v1_a.prom", "vllm", llama, f64(12), f64(3), f64(0.4375), nil},
		{"sglang.prom", "sglang", "Qwen/Qwen2.5-7B-Instruct", f64(24), f64(5), f64(0.62), f64(0.31)},
		{"tgi.prom", "tgi", "", f64(32), f64(6), nil, nil},
		{"nim_a.prom", "nim", "meta/llama-3.1-8b-instruct", f64(7), f64(2), f64(0.355), nil},
		// vllm:num_requests_running (99) is the backend's: NIM's 11 is read.
		{"nim_with_vllm.prom", "nim", "meta/llama-3.1-70b-instruct", f64(11), f64(4), f64(0.81), nil},
		{"dynamo_worker_a.prom", "dynamo", "Qwen/Qwen3-0.6B", f64(8), f64(1), f64(0.25), f64(0.4)},
		{"dynamo_frontend.prom", "dynamo", "qwen/qwen3-0.6b", f64(3), f64(7), nil, nil},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			r, err := engine.Parse(f)
			if err != nil {
				t.Fatal(err)
			}
			type gauges struct {
				Engine, Model              string
				Running, Waiting, KV, Rate *float64
			}
			want := gauges{tc.engine, tc.model, tc.running, tc.waiting, tc.kv, tc.rate}
			if d := cmp.Diff(want, gauges{r.Engine, r.Model, r.Running, r.Waiting, r.KVCacheUsage, r.PrefixHitRate}); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	mixed := "vllm:num_requests_running 1\nsglang:num_running_reqs 2\n"
	if _, err := engine.Parse(strings.NewReader(mixed)); err == nil || errors.Is(err, engine.ErrNoEngineMetrics) {
		t.Errorf("vLLM and SGLang on one page: got %v, want the several-engines error", err)
	}
}

// TestScrapeFailuresReported checks that a target that does not answer, or
// answers something that is not an engine's metrics, is reported and gets
// no sample, while the others are sampled.
func TestScrapeFailuresReported(t *testing.T) {
	srv := &server{files: map[string][]string{"/ok": {"tgi.prom"}, "/dcgm": {"not_an_engine.prom"}}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/metrics"
	ln.Close()
	targets := []engine.Target{
		{Deployment: "a", URL: closed, Replica: "a-0"},
		{Deployment: "b", URL: hs.URL + "/ok", Replica: "b-0"},
		{Deployment: "c", URL: hs.URL + "/dcgm", Replica: "c-0"},
		{Deployment: "d", URL: hs.URL + "/missing", Replica: "d-0"},
	}
	sc := engine.NewScraper(engine.ScraperConfig{Interval: time.Second})
	got, errs := sc.Scrape(context.Background(), targets, time.Now())
	if len(got) != 1 || got[0].GetDeployment() != "b" {
		t.Fatalf("got samples %v, want one of b", got)
	}
	if len(errs) != 3 {
		t.Fatalf("got %d errors (%v), want 3", len(errs), errs)
	}
	for i, want := range []string{"a", "c", "d"} {
		if errs[i].Target.Deployment != want {
			t.Errorf("error %d is of %s, want %s", i, errs[i].Target.Deployment, want)
		}
	}
	if !errors.Is(errs[1], engine.ErrNoEngineMetrics) {
		t.Errorf("a dcgm-exporter page: got %v, want ErrNoEngineMetrics", errs[1])
	}
}

func TestParseTargets(t *testing.T) {
	got, err := engine.ParseTargets("llama=http://10.0.0.7:8000/metrics@llama-0, llama=http://10.0.0.8:8000/metrics,qwen=https://q:30000/metrics")
	if err != nil {
		t.Fatal(err)
	}
	want := []engine.Target{
		{Deployment: "llama", URL: "http://10.0.0.7:8000/metrics", Replica: "llama-0"},
		{Deployment: "llama", URL: "http://10.0.0.8:8000/metrics", Replica: "10.0.0.8:8000"},
		{Deployment: "qwen", URL: "https://q:30000/metrics", Replica: "q:30000"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	for _, bad := range []string{"http://x:1/metrics", "a=ftp://x/metrics", "a=http://x:1/m,a=http://x:1/m", "=http://x:1/m"} {
		if _, err := engine.ParseTargets(bad); err == nil {
			t.Errorf("ParseTargets(%q): no error", bad)
		}
	}
}
