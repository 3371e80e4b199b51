package usagemetrics_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/usagemetrics"
)

// deploymentFamilies are the deployment view's metric names.
var deploymentFamilies = []string{"llm_batch_size", "llm_queue_depth", "llm_kv_cache_usage_ratio", "llm_kv_cache_hit_ratio",
	"llm_deployment_ttft_seconds", "llm_itl_seconds", "llm_slo_requests_total", "llm_slo_good_requests_total",
	"llm_usage_metrics_folded_deployments", "llm_usage_metrics_deployments", "llm_usage_metrics_folded_gpus",
	"gpu_utilization", "gpu_memory_used_bytes", "gpu_memory_used_ratio", "gpu_temperature_celsius", "gpu_power_watts"}

// deploymentView reports whether the series named k (name{labels}) belongs
// to the deployment view.
func deploymentView(k string) bool {
	name, _, _ := strings.Cut(k, "{")
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(deploymentFamilies, base) {
			return true
		}
	}
	return slices.Contains(deploymentFamilies, name)
}

// onlyDeployments keeps the deployment view of e.
func onlyDeployments(e expo) expo {
	out := expo{}
	for k, v := range e {
		if deploymentView(k) {
			out[k] = v
		}
	}
	return out
}

// Latencies (ms) away from every default bound by far more than 1%.
var itlValues = []float64{7, 30, 120, 600}

// depEvents returns events of deployments d1 (models m1, m2) and d2 (m1),
// classes interactive, batch and none, with TTFT, ITL and E2E; some fail,
// some miss their SLO.
func depEvents(n int) []*meterv1.InferenceEvent {
	var out []*meterv1.InferenceEvent
	keys := [][2]string{{"d1", "m1"}, {"d1", "m2"}, {"d2", "m1"}}
	for i := range n {
		k := keys[i%3]
		ev := &meterv1.InferenceEvent{
			EventId: fmt.Sprint("e", i), TenantId: fmt.Sprint("t", i%5), Model: k[1], Deployment: k[0],
			SloClass:    []string{"interactive", "batch", ""}[i/3%3],
			CompletedAt: timestamppb.New(base.Add(time.Duration(i*61) * time.Second)),
		}
		if i%11 == 5 {
			ev.Status = meterv1.Status_STATUS_TIMEOUT
		} else {
			ev.PromptTokens, ev.OutputTokens = proto.Int64(int64(50+i)), proto.Int64(int64(10+i%40))
			ev.TtftMs = proto.Float64(ttftValues[i%4])
			ev.ItlMs = proto.Float64(itlValues[i/2%4])
			ev.E2EMs = proto.Float64(e2eValues[i%4])
		}
		out = append(out, ev)
	}
	return out
}

// wantDeployments is the deployment view's histograms and SLO counters
// expected of events, brute force, with the built-in SLO set (interactive:
// TTFT ≤ 500 ms and ITL ≤ 250 ms; batch: E2E ≤ 10 min; no class counts as
// interactive).
func wantDeployments(events []*meterv1.InferenceEvent) expo {
	out := expo{}
	hist := func(name string, l map[string]string, v *float64, bounds []float64) {
		out[seriesName(name+"_count", l)] += 0
		out[seriesName(name+"_sum", l)] += 0
		for _, b := range append(slices.Clone(bounds), 0) {
			bl := map[string]string{"le": "+Inf"}
			if b != 0 {
				bl["le"] = fmt.Sprint(b)
			}
			for k, x := range l {
				bl[k] = x
			}
			out[seriesName(name+"_bucket", bl)] += 0
			if v != nil && (b == 0 || *v/1000 <= b) {
				out[seriesName(name+"_bucket", bl)]++
			}
		}
		if v != nil {
			out[seriesName(name+"_count", l)]++
			out[seriesName(name+"_sum", l)] += *v / 1000
		}
	}
	keys := map[[2]string]bool{}
	for _, ev := range events {
		keys[[2]string{ev.GetDeployment(), ev.GetModel()}] = true
		l := map[string]string{"deployment": ev.GetDeployment(), "model": ev.GetModel(), "slo_class": ev.GetSloClass()}
		out[seriesName("llm_slo_requests_total", l)]++
		ok := ev.GetStatus() == meterv1.Status_STATUS_UNSPECIFIED
		good := ok && ev.GetTtftMs() <= 500 && ev.GetItlMs() <= 250
		if ev.GetSloClass() == "batch" {
			good = ok && ev.GetE2EMs() <= 600_000
		}
		out[seriesName("llm_slo_good_requests_total", l)] += 0
		if good {
			out[seriesName("llm_slo_good_requests_total", l)]++
		}
		hist("llm_deployment_ttft_seconds", l, ev.TtftMs, usagemetrics.DefaultTTFTBuckets)
		hist("llm_itl_seconds", l, ev.ItlMs, usagemetrics.DefaultITLBuckets)
	}
	out["llm_usage_metrics_folded_deployments{}"] = 0
	out["llm_usage_metrics_deployments{}"] = float64(len(keys))
	out["llm_usage_metrics_folded_gpus{}"] = 0
	return out
}

// engineSample is one engine reading of a replica.
func engineSample(id, dep, model, replica string, at time.Time, running, waiting uint32, kv float64, queries, hits uint64) *meterv1.EngineSample {
	return &meterv1.EngineSample{SampleId: id, Deployment: dep, Engine: "vllm", Replica: replica, Model: model,
		SampledAt: timestamppb.New(at), IntervalS: 15, Running: proto.Uint32(running), Waiting: proto.Uint32(waiting),
		KvCacheUsage: proto.Float64(kv), PrefixCacheQueries: proto.Uint64(queries), PrefixCacheHits: proto.Uint64(hits)}
}

// TestDeploymentView loads events, engine samples and GPU samples, rolls
// them up and checks the deployment view of a scrape against brute force:
// the engine gauges are the time-weighted means of the newest minute of
// each (deployment, model) within usagemetrics.EngineLookback (older
// minutes and the minute in progress left out), the GPU gauges (busy
// share, memory, temperature, power) each GPU's newest hour, the latency
// histograms and SLO counters those of the events by deployment, model
// and slo_class; the rollup watermarks those stored; and every llm_* and
// gpu_* series the chart's alert rules read is served.
func TestDeploymentView(t *testing.T) {
	s, c, events := deploymentFixture(t)
	reads := query.New(s, query.Config{})
	url := serve(t, reads, usagemetrics.Config{}, prometheus.NewRegistry(), c)
	all := scrape(t, url)
	got := onlyDeployments(all)

	// The rollup watermarks, as the store holds them.
	for _, job := range []string{rollup.JobName, rollup.EngineJobName} {
		wm, ok, err := reads.Watermark(t.Context(), job)
		if err != nil || !ok {
			t.Fatalf("watermark %s: %v %v", job, ok, err)
		}
		name := seriesName("llm_usage_metrics_rollup_watermark_timestamp_seconds", map[string]string{"rollup_job": job})
		if g := all[name]; g != float64(wm.UnixMilli())/1000 {
			t.Errorf("%s = %v, want %v", name, g, wm)
		}
	}

	// Every llm_* and gpu_* series the chart's alert rules read is served.
	rules, err := os.ReadFile("../deploy/helm/tokenmeter/files/alerts.rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for k := range all {
		served[strings.SplitN(k, "{", 2)[0]] = true
	}
	// Comments may name tables (gpu_hour); the rules' expressions read series.
	exprs := regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(string(rules), "")
	for _, name := range regexp.MustCompile(`\b(?:llm|gpu)_[a-z_]+`).FindAllString(exprs, -1) {
		if !served[name] {
			t.Errorf("the alert rules read %s, which /metrics/usage does not serve", name)
		}
	}

	want := wantDeployments(events)
	dm := func(name, dep, model string, v float64) {
		want[seriesName(name, map[string]string{"deployment": dep, "model": model})] = v
	}
	// Time-weighted means over d1/m1's newest minute (equal intervals):
	// running (4+6+8)/3, waiting (12+14+9)/3, KV (0.5+0.7+0.9)/3, hits
	// (40+60+20)/(100+100+200).
	dm("llm_batch_size", "d1", "m1", 6)
	dm("llm_queue_depth", "d1", "m1", 35.0/3)
	dm("llm_kv_cache_usage_ratio", "d1", "m1", 0.7)
	dm("llm_kv_cache_hit_ratio", "d1", "m1", 0.3)
	dm("llm_batch_size", "d3", "m3", 1)
	dm("llm_queue_depth", "d3", "m3", 0)
	dm("llm_kv_cache_usage_ratio", "d3", "m3", 0.25)
	want["llm_usage_metrics_deployments{}"]++ // d3/m3
	// Per GPU, its newest hour: GPU-0 and GPU-1 of d1 the hour in
	// progress (GPU-0's sample of the hour before, at 99 °C, left out),
	// GPU-2 of d2 the hour before.
	gpuWant(want, "d1", "GPU-0", (0.25+1)/2, 69, (60+78)/160.0, 85, 400)
	gpuWant(want, "d1", "GPU-1", 0.75, 40, 0.5, 60, 200)
	gpuWant(want, "d2", "GPU-2", 0.5, 20, 0.25, 75, 200)
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Errorf("deployment view (-want +got):\n%s", diff)
	}
}

// deploymentFixture loads depEvents(90), engine samples and GPU samples
// into a store and rolls them up: d1/m1's newest engine minute (within the
// lookback) has two replicas and an older minute beside it; d2/m1's engine
// samples are before the lookback or in the minute in progress; d3/m3 has
// engine stats without traffic; the GPUs of d1 are sampled in the hour in
// progress (and the hour before), those of d2 in the hour before only.
func deploymentFixture(t *testing.T) (*chstore.Store, *clock, []*meterv1.InferenceEvent) {
	t.Helper()
	s := chstoretest.OpenMigrated(t)
	events := depEvents(90)
	chstoretest.Insert(t, s, events)
	c := &clock{t: time.Now()}
	minute := c.t.Truncate(time.Minute)
	var engine chstore.EngineBatch
	add := func(m *meterv1.EngineSample) { engine.Append(m, time.Now()) }
	// d1/m1: two replicas in its newest minute (minute−2m), one in an older.
	newest := minute.Add(-2 * time.Minute)
	add(engineSample("a1", "d1", "m1", "r0", newest.Add(10*time.Second), 4, 12, 0.5, 100, 40))
	add(engineSample("a2", "d1", "m1", "r0", newest.Add(25*time.Second), 6, 14, 0.7, 100, 60))
	add(engineSample("a3", "d1", "m1", "r1", newest.Add(40*time.Second), 8, 9, 0.9, 200, 20))
	add(engineSample("a4", "d1", "m1", "r0", minute.Add(-3*time.Minute), 50, 50, 0.1, 10, 10))
	// d2/m1: only a minute before the lookback, and one in the minute in
	// progress: no engine gauges.
	add(engineSample("b1", "d2", "m1", "r0", minute.Add(-usagemetrics.EngineLookback-time.Second), 3, 3, 0.3, 1, 1))
	add(engineSample("b2", "d2", "m1", "r0", minute, 3, 3, 0.3, 1, 1))
	// d3/m3: engine stats without traffic.
	add(engineSample("c1", "d3", "m3", "r0", minute.Add(-time.Minute), 1, 0, 0.25, 0, 0))
	if err := s.InsertEngineSamples(t.Context(), &engine); err != nil {
		t.Fatal(err)
	}

	// GPUs: d1 in the hour in progress (and the hour before), d2 in the
	// hour before only.
	hour := c.t.Truncate(time.Hour)
	var gpus chstore.GPUBatch
	// usedGiB of 80 GiB in use, tempC, watts.
	gpu := func(id, dep, uuid string, at time.Time, util float64, usedGiB uint64, tempC, watts float64) {
		gpus.Append(&meterv1.GpuSample{SampleId: id, GpuUuid: uuid, GpuType: "H100", Deployment: dep, Node: "n1",
			SampledAt: timestamppb.New(at), IntervalS: 10, Utilization: util, FbUsedBytes: usedGiB << 30, FbTotalBytes: 80 << 30,
			TemperatureC: tempC, PowerWatts: watts}, time.Now())
	}
	inHour := c.t.Sub(hour) / 4
	gpu("g1", "d1", "GPU-0", hour.Add(inHour), 0.25, 60, 70, 300)
	gpu("g2", "d1", "GPU-1", hour.Add(2*inHour), 0.75, 40, 60, 200)
	gpu("g3", "d1", "GPU-0", hour.Add(3*inHour), 1, 78, 85, 500)
	gpu("g4", "d1", "GPU-0", hour.Add(-time.Minute), 0, 80, 99, 700)
	gpu("g5", "d2", "GPU-2", hour.Add(-30*time.Minute), 0.4, 10, 75, 100)
	gpu("g6", "d2", "GPU-2", hour.Add(-20*time.Minute), 0.6, 30, 65, 300)
	if err := s.InsertGPUSamples(t.Context(), &gpus); err != nil {
		t.Fatal(err)
	}
	rollUp(t, s)
	return s, c, events
}

// TestDeploymentCap: with a cap of 2, the largest (deployment, model) key
// (d2/m1, given the most tokens) and the largest GPU (GPU-0 of d1) keep
// their series; the others are folded into __other__
// with nothing lost: the counters and histograms add up to every event's,
// the engine gauges are the pooled time-weighted means of the folded keys'
// newest minutes, the GPU gauges pooled (busy share, memory, power) or the
// hottest (temperature). A new key larger
// than any is folded too (the choice sticks) and nothing goes down.
func TestDeploymentCap(t *testing.T) {
	s, c, events := deploymentFixture(t)
	more := depEvents(3)
	for i, ev := range more {
		ev.EventId, ev.Deployment, ev.Model, ev.PromptTokens = fmt.Sprint("more", i), "d2", "m1", proto.Int64(1_000_000)
	}
	chstoretest.Insert(t, s, more)
	rollUp(t, s)
	events = append(events, more...)
	url := serve(t, query.New(s, query.Config{}), usagemetrics.Config{MaxSeries: 2, Interval: time.Minute}, prometheus.NewRegistry(), c)
	got := onlyDeployments(scrape(t, url))

	// Every key but d2/m1 summed into __other__.
	var folded []*meterv1.InferenceEvent
	for _, ev := range events {
		if ev.GetDeployment() != "d2" {
			ev = proto.CloneOf(ev)
			ev.Deployment, ev.Model = usagemetrics.Other, usagemetrics.Other
		}
		folded = append(folded, ev)
	}
	want := wantDeployments(folded)
	other := map[string]string{"deployment": usagemetrics.Other, "model": usagemetrics.Other}
	// d1/m1's newest minute (running 4, 6, 8; waiting 12, 14, 9; KV 0.5,
	// 0.7, 0.9; hits 120 of 400) and d3/m3's (1, 0, 0.25, no queries), 15 s each.
	want[seriesName("llm_batch_size", other)] = (4 + 6 + 8 + 1) / 4.0
	want[seriesName("llm_queue_depth", other)] = (12 + 14 + 9 + 0) / 4.0
	want[seriesName("llm_kv_cache_usage_ratio", other)] = (0.5 + 0.7 + 0.9 + 0.25) / 4
	want[seriesName("llm_kv_cache_hit_ratio", other)] = 0.3
	want["llm_usage_metrics_folded_deployments{}"] = 3
	want["llm_usage_metrics_deployments{}"] = 4
	want["llm_usage_metrics_folded_gpus{}"] = 2
	// GPU-0 of d1 and GPU-2 of d2 have 20 GPU-seconds each (d1 first by
	// name), GPU-1 10: GPU-1 and GPU-2 pooled, 10 s per sample.
	gpuWant(want, "d1", "GPU-0", (0.25+1)/2, 69, (60+78)/160.0, 85, 400)
	gpuWant(want, usagemetrics.Other, usagemetrics.Other, (0.75+0.4+0.6)/3, (40+10+30)/3.0, (40+10+30)/240.0, 75, (200+100+300)/3.0)
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Errorf("capped deployment view (-want +got):\n%s", diff)
	}

	// A new key with more tokens than any: folded, the exposed one stays.
	big := depEvents(3)
	for i, ev := range big {
		ev.EventId, ev.Deployment, ev.Model = fmt.Sprint("big", i), "d9", "m9"
		ev.PromptTokens = proto.Int64(10_000_000)
	}
	chstoretest.Insert(t, s, big)
	rollUp(t, s)
	c.add(time.Minute)
	again := onlyDeployments(scrape(t, url))
	if g := again[seriesName("llm_slo_requests_total", map[string]string{"deployment": "d2", "model": "m1", "slo_class": "interactive"})]; g == 0 {
		t.Errorf("d2/m1 lost its series after a larger key came")
	}
	for k, v := range again {
		if strings.Contains(k, `"d9"`) {
			t.Errorf("the new key has its own series: %s = %v", k, v)
		}
	}
	for k, v := range got {
		if strings.HasSuffix(strings.SplitN(k, "{", 2)[0], "_total") || strings.Contains(k, "_count{") || strings.Contains(k, "_bucket{") {
			if again[k] < v {
				t.Errorf("%s went from %v to %v", k, v, again[k])
			}
		}
	}
}

// gpuWant sets the expected GPU gauges of one GPU of node n1 (or of the
// folded ones: every label "__other__"), memory in GiB.
func gpuWant(want expo, dep, gpu string, util, usedGiB, ratio, tempC, watts float64) {
	l := map[string]string{"deployment": dep, "node": "n1", "gpu": gpu}
	if dep == usagemetrics.Other {
		l["node"] = usagemetrics.Other
	}
	want[seriesName("gpu_utilization", l)] = util
	want[seriesName("gpu_memory_used_bytes", l)] = usedGiB * (1 << 30)
	want[seriesName("gpu_memory_used_ratio", l)] = ratio
	want[seriesName("gpu_temperature_celsius", l)] = tempC
	want[seriesName("gpu_power_watts", l)] = watts
}

// failingView is a Reader whose deployment view reads (engine stats) fail
// while fail is set.
type failingView struct {
	usagemetrics.Reader
	fail atomic.Bool
}

func (f *failingView) EngineStats(ctx context.Context, q query.EngineQuery) ([]query.EngineRow, error) {
	if f.fail.Load() {
		return nil, errors.New("engine stats: table is gone")
	}
	return f.Reader.EngineStats(ctx, q)
}

// counterValue is the value of an unlabelled counter (or the first series
// of a labelled one whose first label has value v) gathered from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, v string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == name && (v == "" || m.GetLabel()[0].GetValue() == v) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s %s", name, v)
	return 0
}

// TestDeploymentViewIsolated: a failing read of the deployment view does
// not stop the (tenant, model) series. After a good scrape the view's read
// fails and new events arrive: the next scrape serves the updated
// llm_requests_total and token counters (as brute force over every event)
// beside the view's last good values (and watermarks, and the time it was
// read), and the failure is counted; an exporter whose view never read
// serves the pairs alone.
func TestDeploymentViewIsolated(t *testing.T) {
	s, c, events := deploymentFixture(t)
	src := &failingView{Reader: query.New(s, query.Config{})}
	reg := prometheus.NewRegistry()
	url := serve(t, src, usagemetrics.Config{Interval: time.Minute}, reg, c)
	first := scrape(t, url)
	if len(onlyDeployments(first)) == 0 {
		t.Fatal("no deployment view in the first scrape")
	}

	src.fail.Store(true)
	more := pairEvents("late", "t0", "m1", 14)
	chstoretest.Insert(t, s, more)
	rollUp(t, s)
	c.add(time.Minute)
	got := scrape(t, url)
	if diff := cmp.Diff(want(append(slices.Clone(events), more...), nil), withoutClock(got), approx); diff != "" {
		t.Errorf("pair view while the deployment view fails (-want +got):\n%s", diff)
	}
	if ts := got["llm_usage_metrics_computed_timestamp_seconds{}"]; ts != float64(c.now().UnixMilli())/1000 {
		t.Errorf("pairs computed at %v, want %v", ts, c.now())
	}
	kept := func(e expo) expo {
		out := onlyDeployments(e)
		for k, v := range e {
			if strings.HasPrefix(k, "llm_usage_metrics_rollup_watermark_timestamp_seconds{") || k == "llm_usage_metrics_deployments_computed_timestamp_seconds{}" {
				out[k] = v
			}
		}
		return out
	}
	if diff := cmp.Diff(kept(first), kept(got)); diff != "" {
		t.Errorf("the deployment view's last values should be served (-first +got):\n%s", diff)
	}
	if n := counterValue(t, reg, "meter_usage_metrics_deployment_view_errors_total", ""); n != 1 {
		t.Errorf("deployment view errors %v, want 1", n)
	}
	if n := counterValue(t, reg, "meter_usage_metrics_refreshes_total", "ok"); n != 2 {
		t.Errorf("refreshes ok %v, want 2", n)
	}

	// Failing from the start: the pairs alone, no 503.
	fresh := serve(t, src, usagemetrics.Config{}, prometheus.NewRegistry(), c)
	alone := scrape(t, fresh)
	if diff := cmp.Diff(want(append(slices.Clone(events), more...), nil), withoutClock(alone), approx); diff != "" {
		t.Errorf("pair view without a deployment view (-want +got):\n%s", diff)
	}
	if d := onlyDeployments(alone); len(d) != 0 {
		t.Errorf("a deployment view never read is served: %v", d)
	}
}

// TestSLOClassFold: slo_class is a client's label, so the deployment view
// keeps the classes the SLO set in force names (here interactive, the
// default, and gold; batch is not named), and "" (no class), and folds
// every other into slo_class="__other__": 40 distinct classes give at most
// 4 classes and 4 + 4·37 series per (deployment, model), with every
// request and latency still counted.
func TestSLOClassFold(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	set := rollup.SLOSet{DefaultClass: "interactive", Rules: []rollup.Rule{
		{SLOClass: "interactive", TTFTMs: 500, ITLMs: 250}, {SLOClass: "gold", TTFTMs: 200}}}
	if _, err := rollup.EnsureSLO(t.Context(), s, set, "test"); err != nil {
		t.Fatal(err)
	}
	events := depEvents(90) // interactive, batch, none
	for i := range 120 {
		ev := depEvents(1)[0]
		ev.EventId, ev.SloClass = fmt.Sprint("many", i), fmt.Sprint("class-", i%40)
		if i%10 == 0 {
			ev.SloClass = "gold"
		}
		events = append(events, ev)
	}
	chstoretest.Insert(t, s, events)
	rollUp(t, s)
	c := &clock{t: time.Now()}
	got := onlyDeployments(scrape(t, serve(t, query.New(s, query.Config{}), usagemetrics.Config{SLOs: s}, prometheus.NewRegistry(), c)))

	named := map[string]bool{"": true, "interactive": true, "gold": true}
	wantReq := map[[3]string]float64{}
	for _, ev := range events {
		class := ev.GetSloClass()
		if !named[class] {
			class = usagemetrics.Other
		}
		wantReq[[3]string{ev.GetDeployment(), ev.GetModel(), class}]++
	}
	classRE := regexp.MustCompile(`slo_class="([^"]*)"`)
	depRE := regexp.MustCompile(`deployment="([^"]*)",(?:le="[^"]*",)?model="([^"]*)"`)
	perKey := map[[2]string]int{}
	gotReq := map[[3]string]float64{}
	for k, v := range got {
		d := depRE.FindStringSubmatch(k)
		if d == nil {
			continue
		}
		perKey[[2]string{d[1], d[2]}]++
		class := ""
		if m := classRE.FindStringSubmatch(k); m != nil {
			class = m[1]
		}
		if class != "" && !named[class] && class != usagemetrics.Other {
			t.Errorf("series of a class the SLO set does not name: %s", k)
		}
		if strings.HasPrefix(k, "llm_slo_requests_total{") {
			gotReq[[3]string{d[1], d[2], class}] = v
		}
	}
	if diff := cmp.Diff(wantReq, gotReq); diff != "" {
		t.Errorf("llm_slo_requests_total by deployment, model and folded class (-want +got):\n%s", diff)
	}
	perClass := 2 + (len(usagemetrics.DefaultTTFTBuckets) + 3) + (len(usagemetrics.DefaultITLBuckets) + 3)
	for k, n := range perKey {
		if limit := 4 + 4*perClass; n > limit {
			t.Errorf("%v has %d series, the bound is %d", k, n, limit)
		}
	}
	if n := perKey[[2]string{"d1", "m1"}]; n < 4*perClass {
		t.Errorf("d1/m1 has %d series, want its 4 classes' %d at least", n, 4*perClass)
	}
}
