package usagemetrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/usagemetrics"
)

func TestMain(m *testing.M) { chtest.Main(m) }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// base is the hour the tests' events start in: two days ago, so that the
// rollup job has settled it.
var base = time.Now().UTC().Truncate(time.Hour).Add(-48 * time.Hour)

// Latencies (ms) away from every default bucket bound by far more than 1%,
// so that the expected buckets are exact.
var (
	ttftValues = []float64{30, 70, 300, 1500}
	e2eValues  = []float64{700, 3000, 12_000, 45_000}
)

// pairEvents returns n events of one tenant and model, ids prefixed with
// id, spread over a few hours: every 7th fails (with an E2E for every other
// failure, none for the rest, as a gateway reports them), the others carry
// tokens and both latencies.
func pairEvents(id, tenant, model string, n int) []*meterv1.InferenceEvent {
	var out []*meterv1.InferenceEvent
	for i := range n {
		ev := &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("%s-%d", id, i), TenantId: tenant, Model: model, Deployment: "d" + model,
			CompletedAt: timestamppb.New(base.Add(time.Duration(i*397) * time.Second)),
		}
		if i%7 == 3 {
			ev.Status = meterv1.Status_STATUS_TIMEOUT
			if i%2 == 0 {
				ev.E2EMs = proto.Float64(e2eValues[i%4])
			}
		} else {
			ev.PromptTokens = proto.Int64(int64(100 + 37*i))
			ev.CachedPromptTokens = proto.Int64(int64(11 * i))
			ev.OutputTokens = proto.Int64(int64(5 + 13*i))
			ev.TtftMs = proto.Float64(ttftValues[i%4])
			ev.E2EMs = proto.Float64(e2eValues[(i+1)%4])
		}
		out = append(out, ev)
	}
	return out
}

// fleet is 4 tenants × 3 models, pair k having 5·(k+1) events, so that
// the pairs' sizes all differ.
func fleet(prefix string) []*meterv1.InferenceEvent {
	var out []*meterv1.InferenceEvent
	for k := range 12 {
		out = append(out, pairEvents(fmt.Sprintf("%s%d", prefix, k), fmt.Sprintf("t%d", k%4), fmt.Sprintf("m%d", k/4), 5*(k+1))...)
	}
	return out
}

// rollUp runs the rollup job once over s.
func rollUp(t *testing.T, s *chstore.Store) {
	t.Helper()
	job, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, s, prometheus.NewRegistry(), discard, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// expo is an exposition as "name{label="value",...}" → value, for
// comparing whole scrapes.
type expo map[string]float64

// seriesName writes a series' name and labels in a fixed order.
func seriesName(name string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(name + "{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%s=%q", k, labels[k])
	}
	b.WriteString("}")
	return b.String()
}

// parse reads a text exposition with Prometheus's parser into an expo,
// every histogram as its _bucket, _sum and _count series.
func parse(t *testing.T, body io.Reader) expo {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(body)
	if err != nil {
		t.Fatalf("parse the exposition: %v", err)
	}
	out := expo{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[seriesName(name, labels)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[seriesName(name, labels)] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				out[seriesName(name+"_count", labels)] = float64(h.GetSampleCount())
				out[seriesName(name+"_sum", labels)] = h.GetSampleSum()
				for _, b := range h.GetBucket() {
					bl := map[string]string{"le": fmt.Sprint(b.GetUpperBound())}
					for k, v := range labels {
						bl[k] = v
					}
					out[seriesName(name+"_bucket", bl)] = float64(b.GetCumulativeCount())
				}
			default:
				t.Fatalf("family %s: unexpected type %s", name, f.GetType())
			}
		}
	}
	return out
}

// scrape gets the text exposition from url.
func scrape(t *testing.T, url string) expo {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("Content-Type %q, want the text format", ct)
	}
	return parse(t, resp.Body)
}

// want is the exposition expected of events, brute force, pairs not in
// shown being folded into __other__ (shown nil: every pair shown).
func want(events []*meterv1.InferenceEvent, shown map[[2]string]bool) expo {
	out := expo{}
	seen := map[string]bool{}
	pairs := map[[2]string]bool{}
	folded := map[[2]string]bool{}
	hist := func(name string, tm map[string]string, v float64, bounds []float64) {
		out[seriesName(name+"_count", tm)]++
		out[seriesName(name+"_sum", tm)] += v / 1000
		for _, b := range append(slices.Clone(bounds), 0) {
			le := "+Inf"
			if b != 0 {
				le = fmt.Sprint(b)
			}
			bl := map[string]string{"le": le, "tenant": tm["tenant"], "model": tm["model"]}
			if b == 0 || v/1000 <= b {
				out[seriesName(name+"_bucket", bl)]++
			} else {
				out[seriesName(name+"_bucket", bl)] += 0
			}
		}
	}
	for _, ev := range events {
		if seen[ev.GetTenantId()+"/"+ev.GetEventId()] {
			continue
		}
		seen[ev.GetTenantId()+"/"+ev.GetEventId()] = true
		p := [2]string{ev.GetTenantId(), ev.GetModel()}
		pairs[p] = true
		if shown != nil && !shown[p] {
			folded[p] = true
			p = [2]string{usagemetrics.Other, usagemetrics.Other}
		}
		tm := map[string]string{"tenant": p[0], "model": p[1]}
		ok := ev.GetStatus() == meterv1.Status_STATUS_UNSPECIFIED || ev.GetStatus() == meterv1.Status_STATUS_OK
		for _, st := range []string{"ok", "error"} {
			out[seriesName("llm_requests_total", map[string]string{"tenant": p[0], "model": p[1], "status": st})] += 0
		}
		status := "ok"
		if !ok {
			status = "error"
		}
		out[seriesName("llm_requests_total", map[string]string{"tenant": p[0], "model": p[1], "status": status})]++
		out[seriesName("llm_tokens_input_total", tm)] += float64(ev.GetPromptTokens())
		out[seriesName("llm_tokens_cached_input_total", tm)] += float64(ev.GetCachedPromptTokens())
		out[seriesName("llm_tokens_output_total", tm)] += float64(ev.GetOutputTokens())
		for _, h := range []struct {
			name   string
			v      *float64
			bounds []float64
		}{{"llm_ttft_seconds", ev.TtftMs, usagemetrics.DefaultTTFTBuckets}, {"llm_latency", ev.E2EMs, usagemetrics.DefaultE2EBuckets}} {
			if h.v != nil {
				hist(h.name, tm, *h.v, h.bounds)
			} else {
				// The series exist, with what other events put in them.
				out[seriesName(h.name+"_count", tm)] += 0
				out[seriesName(h.name+"_sum", tm)] += 0
				for _, b := range append(slices.Clone(h.bounds), 0) {
					le := "+Inf"
					if b != 0 {
						le = fmt.Sprint(b)
					}
					out[seriesName(h.name+"_bucket", map[string]string{"le": le, "tenant": tm["tenant"], "model": tm["model"]})] += 0
				}
			}
		}
	}
	out["llm_usage_metrics_folded_pairs{}"] = float64(len(folded))
	out["llm_usage_metrics_pairs{}"] = float64(len(pairs))
	return out
}

// withoutClock keeps the (tenant, model) pair view: it drops the
// computation time, which only the clock decides, and the deployment view
// (TestDeploymentView checks it).
func withoutClock(e expo) expo {
	c := expo{}
	for k, v := range e {
		if k != "llm_usage_metrics_computed_timestamp_seconds{}" && k != "llm_usage_metrics_deployments_computed_timestamp_seconds{}" && !deploymentView(k) && !strings.HasPrefix(k, "llm_usage_metrics_rollup_watermark_timestamp_seconds{") {
			c[k] = v
		}
	}
	return c
}

// clock is a settable now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// serve runs an Exporter over s on a loopback HTTP server.
func serve(t *testing.T, src usagemetrics.Reader, cfg usagemetrics.Config, reg *prometheus.Registry, c *clock) string {
	t.Helper()
	e, err := usagemetrics.New(cfg, src, reg, discard, c.now)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

var approx = cmpopts.EquateApprox(1e-12, 1e-9)

// TestScrapeMatchesUsage loads events (duplicates among them), rolls them
// up, scrapes over HTTP and checks every series: the counters against
// GetUsage's read (query.Service.Usage over usagemetrics.Range, by tenant
// and model, granularity total) and against the events themselves, the
// histograms against the events' latencies (their counts against the
// requests that reported one).
func TestScrapeMatchesUsage(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	events := fleet("a")
	chstoretest.Insert(t, s, events)
	chstoretest.Insert(t, s, events[:40]) // redelivered
	rollUp(t, s)
	reads := query.New(s, query.Config{})
	c := &clock{t: time.Now()}
	url := serve(t, reads, usagemetrics.Config{}, prometheus.NewRegistry(), c)
	got := scrape(t, url)

	if diff := cmp.Diff(want(events, nil), withoutClock(got), approx); diff != "" {
		t.Errorf("scrape (-want +got):\n%s", diff)
	}
	if ts := got["llm_usage_metrics_computed_timestamp_seconds{}"]; ts != float64(c.now().UnixMilli())/1000 {
		t.Errorf("computed at %v, want %v", ts, c.now())
	}

	start, end := usagemetrics.Range()
	rows, err := reads.Usage(t.Context(), query.UsageQuery{Start: start, End: end, Granularity: "total", GroupBy: []string{"tenant_id", "model"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 12 {
		t.Fatalf("usage rows: %d, want 12", len(rows))
	}
	for _, r := range rows {
		tm := map[string]string{"tenant": r.TenantID, "model": r.Model}
		for name, v := range map[string]int64{
			seriesName("llm_requests_total", map[string]string{"tenant": r.TenantID, "model": r.Model, "status": "ok"}):    r.Requests - r.Errors,
			seriesName("llm_requests_total", map[string]string{"tenant": r.TenantID, "model": r.Model, "status": "error"}): r.Errors,
			seriesName("llm_tokens_input_total", tm):        r.PromptTokens,
			seriesName("llm_tokens_cached_input_total", tm): r.CachedPromptTokens,
			seriesName("llm_tokens_output_total", tm):       r.OutputTokens,
		} {
			if g, ok := got[name]; !ok || g != float64(v) {
				t.Errorf("%s = %v (present %v), GetUsage says %d", name, g, ok, v)
			}
		}
	}
}

// TestCardinalityCap: with more pairs than the cap, the largest pairs keep
// their series, the others are summed into __other__ with nothing lost, the
// gauge counts them, and the choice sticks when a new pair outgrows them.
func TestCardinalityCap(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	events := fleet("a")
	chstoretest.Insert(t, s, events)
	rollUp(t, s)
	c := &clock{t: time.Now()}
	url := serve(t, query.New(s, query.Config{}), usagemetrics.Config{MaxSeries: 4, Interval: time.Minute}, prometheus.NewRegistry(), c)
	got := scrape(t, url)

	// Pairs 9, 10 and 11 are the largest (5·(k+1) events, tokens growing
	// with the event's position).
	shown := map[[2]string]bool{{"t1", "m2"}: true, {"t2", "m2"}: true, {"t3", "m2"}: true}
	if diff := cmp.Diff(want(events, shown), withoutClock(got), approx); diff != "" {
		t.Errorf("capped scrape (-want +got):\n%s", diff)
	}
	if g := got["llm_usage_metrics_folded_pairs{}"]; g != 9 {
		t.Errorf("folded pairs %v, want 9", g)
	}
	// Totals over every series equal the totals of every event.
	total := func(e expo, prefix string) float64 {
		var sum float64
		for k, v := range e {
			if strings.HasPrefix(k, prefix+"{") {
				sum += v
			}
		}
		return sum
	}
	all := want(events, nil)
	for _, m := range []string{"llm_requests_total", "llm_tokens_input_total", "llm_tokens_cached_input_total", "llm_tokens_output_total", "llm_latency_count", "llm_ttft_seconds_count"} {
		if g, w := total(got, m), total(all, m); g != w {
			t.Errorf("Σ %s = %v, want %v", m, g, w)
		}
	}

	// A new pair larger than any: it is folded (the exposed ones stay),
	// and every counter of the second scrape is at least the first's.
	big := pairEvents("big", "t9", "m9", 200)
	chstoretest.Insert(t, s, big)
	rollUp(t, s)
	c.add(time.Minute)
	again := scrape(t, url)
	if diff := cmp.Diff(want(append(slices.Clone(events), big...), shown), withoutClock(again), approx); diff != "" {
		t.Errorf("scrape after a new large pair (-want +got):\n%s", diff)
	}
	for k, v := range withoutClock(got) {
		if w, ok := again[k]; !ok || w < v {
			t.Errorf("%s went from %v to %v (present %v)", k, v, w, ok)
		}
	}
}

// TestCacheInterval: scrapes within the interval are served from the cache
// (new events do not show, ClickHouse is not read); the first scrape after
// it reads again.
func TestCacheInterval(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	first := pairEvents("a", "t0", "m0", 20)
	chstoretest.Insert(t, s, first)
	rollUp(t, s)
	reg := prometheus.NewRegistry()
	c := &clock{t: time.Now()}
	url := serve(t, query.New(s, query.Config{}), usagemetrics.Config{Interval: 30 * time.Second}, reg, c)
	refreshes := func() float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "meter_usage_metrics_refreshes_total" {
				for _, m := range f.GetMetric() {
					if m.GetLabel()[0].GetValue() == "ok" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		t.Fatal("no meter_usage_metrics_refreshes_total{result=\"ok\"}")
		return 0
	}
	before := scrape(t, url)
	more := pairEvents("b", "t0", "m0", 10)
	chstoretest.Insert(t, s, more)
	rollUp(t, s)
	c.add(29 * time.Second)
	cached := scrape(t, url)
	if diff := cmp.Diff(before, cached); diff != "" {
		t.Errorf("scrape within the interval differs (-first +second):\n%s", diff)
	}
	if n := refreshes(); n != 1 {
		t.Errorf("%v computations after two scrapes within the interval, want 1", n)
	}
	c.add(time.Second)
	fresh := scrape(t, url)
	if diff := cmp.Diff(want(append(first, more...), nil), withoutClock(fresh), approx); diff != "" {
		t.Errorf("scrape after the interval (-want +got):\n%s", diff)
	}
	if n := refreshes(); n != 2 {
		t.Errorf("%v computations, want 2", n)
	}
}

// TestUnavailable: a store that cannot be read answers 503 until a first
// computation succeeds; once one has, a failed one serves the cached
// metrics and is counted.
func TestUnavailable(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	chstoretest.Insert(t, s, pairEvents("a", "t0", "m0", 10))
	rollUp(t, s)
	broken := chstoretest.OpenSingle(t) // a database without tables
	c := &clock{t: time.Now()}

	e, err := usagemetrics.New(usagemetrics.Config{}, query.New(broken, query.Config{}), prometheus.NewRegistry(), discard, c.now)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics/usage", nil))
	if rec.Code != http.StatusServiceUnavailable || strings.Contains(rec.Body.String(), "inference_events") {
		t.Errorf("unreadable store: %d %q, want 503 without the backend's text", rec.Code, rec.Body.String())
	}

	src := &switchable{r: query.New(s, query.Config{})}
	reg := prometheus.NewRegistry()
	url := serve(t, src, usagemetrics.Config{}, reg, c)
	good := scrape(t, url)
	src.set(query.New(broken, query.Config{}))
	c.add(time.Minute)
	stale := scrape(t, url)
	if diff := cmp.Diff(good, stale); diff != "" {
		t.Errorf("a failed computation should serve the cached metrics (-cached +got):\n%s", diff)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var errorsCounted float64
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == "meter_usage_metrics_refreshes_total" && m.GetLabel()[0].GetValue() == "error" {
				errorsCounted = m.GetCounter().GetValue()
			}
		}
	}
	if errorsCounted != 1 {
		t.Errorf("meter_usage_metrics_refreshes_total{result=\"error\"} = %v, want 1", errorsCounted)
	}
}

// switchable is a Reader whose store a test replaces (a store going away).
type switchable struct {
	mu sync.Mutex
	r  usagemetrics.Reader
}

func (s *switchable) set(r usagemetrics.Reader) { s.mu.Lock(); s.r = r; s.mu.Unlock() }

func (s *switchable) get() usagemetrics.Reader { s.mu.Lock(); defer s.mu.Unlock(); return s.r }

func (s *switchable) Usage(ctx context.Context, q query.UsageQuery) ([]query.UsageRow, error) {
	return s.get().Usage(ctx, q)
}

func (s *switchable) Rollups(ctx context.Context, q query.RollupQuery) ([]query.RollupRow, error) {
	return s.get().Rollups(ctx, q)
}

func (s *switchable) EngineStats(ctx context.Context, q query.EngineQuery) ([]query.EngineRow, error) {
	return s.get().EngineStats(ctx, q)
}

func (s *switchable) Watermark(ctx context.Context, job string) (time.Time, bool, error) {
	return s.get().Watermark(ctx, job)
}

func (s *switchable) GPUUsage(ctx context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error) {
	return s.get().GPUUsage(ctx, q)
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  usagemetrics.Config
		ok   bool
	}{
		{"defaults", usagemetrics.Config{}, true},
		{"negative cap", usagemetrics.Config{MaxSeries: -1}, false},
		{"negative interval", usagemetrics.Config{Interval: -time.Second}, false},
		{"buckets not ascending", usagemetrics.Config{E2EBuckets: []float64{1, 1}}, false},
		{"zero bucket", usagemetrics.Config{TTFTBuckets: []float64{0, 1}}, false},
		{"own buckets", usagemetrics.Config{TTFTBuckets: []float64{0.1, 1}, E2EBuckets: []float64{1, 10}}, true},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}
