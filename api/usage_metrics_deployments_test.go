package api_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/usagemetrics"
)

// TestUsageMetricsMatchAPI loads events of three deployments (SLO classes
// interactive, batch and none), engine samples of a few replicas over the
// last minutes and GPU samples of the hour in progress, rolls them up and
// checks that each series of the deployment view on /metrics/usage equals
// the API's answer for the same data, which is the same over gRPC and REST:
// the engine gauges GetEngineStats' newest minute (step minute, group_by
// deployment and model), the GPU gauges GetGpuUsage's hour in progress
// (group_by deployment, node, gpu: utilization and telemetry),
// the ITL and TTFT histograms' counts and means GetLatency's (total, group_by
// deployment, model, slo_class), the SLO counters GetGoodput's.
func TestUsageMetricsMatchAPI(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := chstoretest.OpenMigrated(t)
	now := time.Now().UTC()
	minute, hour := now.Truncate(time.Minute), now.Truncate(time.Hour)

	var events []*meterv1.InferenceEvent
	past := hour.Add(-20 * time.Hour)
	for i := range 300 {
		e := &meterv1.InferenceEvent{
			EventId: fmt.Sprint("x", i), TenantId: []string{"acme", "globex"}[i%2], Model: []string{"m1", "m2"}[i/2%2],
			Deployment: []string{"d1", "d2", "d3"}[i%3], SloClass: []string{"interactive", "batch", ""}[i/5%3],
			CompletedAt: timestamppb.New(past.Add(time.Duration(i*97) * time.Second)),
		}
		if i%13 == 7 {
			e.Status = meterv1.Status_STATUS_TIMEOUT
		} else {
			e.PromptTokens, e.OutputTokens = proto.Int64(int64(100+i)), proto.Int64(int64(2+i%90))
			e.TtftMs = proto.Float64(float64(40 + i%30*23))
			e.E2EMs = proto.Float64(float64(900 + i%30*23 + i%90*(30+i%11*20)))
		}
		events = append(events, e)
	}
	chstoretest.Insert(t, s, events)

	var engine chstore.EngineBatch
	for i := range 40 {
		dep, rep := []string{"d1", "d2"}[i%2], fmt.Sprint("r", i%3)
		at := minute.Add(-time.Duration(1+i%4) * time.Minute).Add(time.Duration(i%4*13) * time.Second)
		engine.Append(&meterv1.EngineSample{SampleId: fmt.Sprint("s", i), Deployment: dep, Engine: "vllm", Replica: dep + "-" + rep,
			Model: "m1", SampledAt: timestamppb.New(at), IntervalS: 15, Running: proto.Uint32(uint32(3 + i%9)),
			Waiting: proto.Uint32(uint32(i % 17)), KvCacheUsage: proto.Float64(float64(i%10) / 10),
			PrefixCacheQueries: proto.Uint64(uint64(100 + i)), PrefixCacheHits: proto.Uint64(uint64(i % 50))}, time.Now())
	}
	if err := s.InsertEngineSamples(t.Context(), &engine); err != nil {
		t.Fatal(err)
	}
	var gpus chstore.GPUBatch
	step := now.Sub(hour) / 10
	for i := range 20 {
		gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprint("g", i), GpuUuid: fmt.Sprint("GPU-", i%4), GpuType: "H100", Node: "n1",
			Deployment: []string{"d1", "d2"}[i%4/2], SampledAt: timestamppb.New(hour.Add(step * time.Duration(i/2))), IntervalS: 10,
			Utilization: float64(i%7) / 7, FbUsedBytes: uint64(10+i) << 30, FbTotalBytes: 80 << 30, TemperatureC: float64(50 + i*3%37),
			PowerWatts: float64(100 + i*17)}, time.Now())
	}
	if err := s.InsertGPUSamples(t.Context(), &gpus); err != nil {
		t.Fatal(err)
	}
	job, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, s, prometheus.NewRegistry(), logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}

	reads := query.New(s, query.Config{})
	reg := prometheus.NewRegistry()
	metrics, err := usagemetrics.New(usagemetrics.Config{}, reads, reg, logger, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	srv, conn := serveServices(t,
		&api.Services{Keys: testKeySet(t), Usage: reads, Rollups: reads, Cost: reads, Prices: s, Engine: reads, UsageMetrics: metrics},
		s.Ping, reg, logger)

	code, body := restTo(t, srv, http.MethodGet, api.UsageMetricsPath, testKeys["finance"], "")
	if code != http.StatusOK {
		t.Fatalf("scrape: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse the scrape: %v", err)
	}
	// sample finds the one sample of family name with exactly labels.
	sample := func(name string, labels map[string]string) *dto.Metric {
		t.Helper()
		for _, m := range families[name].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				if p.GetValue() != "" {
					l[p.GetName()] = p.GetValue()
				}
			}
			if fmt.Sprint(l) == fmt.Sprint(labels) {
				return m
			}
		}
		t.Errorf("no %s%v in the scrape", name, labels)
		return &dto.Metric{}
	}
	// Every sample served is checked below: count them as they are.
	served := map[string]int{}
	for _, name := range []string{"llm_batch_size", "llm_queue_depth", "llm_kv_cache_usage_ratio", "llm_kv_cache_hit_ratio",
		"gpu_utilization", "gpu_memory_used_bytes", "gpu_memory_used_ratio", "gpu_temperature_celsius", "gpu_power_watts", "llm_itl_seconds", "llm_deployment_ttft_seconds", "llm_slo_requests_total", "llm_slo_good_requests_total"} {
		served[name] = len(families[name].GetMetric())
	}
	checked := map[string]int{}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s: Prometheus %v, API %v", what, got, want)
		}
	}
	fin := withKey(testKeys["finance"])
	rfc := func(t time.Time) string { return t.Format(time.RFC3339) }

	// Engine gauges: the newest minute of each (deployment, model).
	engineReq := &meterv1.GetEngineStatsRequest{Start: timestamppb.New(minute.Add(-usagemetrics.EngineLookback)), End: timestamppb.New(minute),
		Step: "minute", GroupBy: []string{"deployment", "model"}, PageSize: 1000}
	eng, err := meterv1.NewEngineServiceClient(conn).GetEngineStats(fin, engineReq)
	if err != nil {
		t.Fatal(err)
	}
	sameOverREST(t, srv, "/v1/engine-stats?"+url.Values{"start": {rfc(minute.Add(-usagemetrics.EngineLookback))}, "end": {rfc(minute)},
		"step": {"minute"}, "group_by": {"deployment,model"}, "page_size": {"1000"}}.Encode(), eng, &meterv1.GetEngineStatsResponse{})
	if len(eng.GetSeries()) != 2 {
		t.Fatalf("GetEngineStats: %d series, want 2", len(eng.GetSeries()))
	}
	for _, sr := range eng.GetSeries() {
		p := sr.GetPoints()[len(sr.GetPoints())-1]
		l := map[string]string{"deployment": sr.GetGroup()["deployment"], "model": sr.GetGroup()["model"]}
		near(fmt.Sprint("llm_batch_size", l), sample("llm_batch_size", l).GetGauge().GetValue(), p.GetRunningMean())
		near(fmt.Sprint("llm_queue_depth", l), sample("llm_queue_depth", l).GetGauge().GetValue(), p.GetWaitingMean())
		near(fmt.Sprint("llm_kv_cache_usage_ratio", l), sample("llm_kv_cache_usage_ratio", l).GetGauge().GetValue(), p.GetKvCacheUsageMean())
		near(fmt.Sprint("llm_kv_cache_hit_ratio", l), sample("llm_kv_cache_hit_ratio", l).GetGauge().GetValue(), p.GetPrefixCacheHitRate())
		for _, n := range []string{"llm_batch_size", "llm_queue_depth", "llm_kv_cache_usage_ratio", "llm_kv_cache_hit_ratio"} {
			checked[n]++
		}
	}

	// GPU gauges: the hour in progress of each GPU.
	gpuReq := &meterv1.GetGpuUsageRequest{Start: timestamppb.New(hour), End: timestamppb.New(hour.Add(time.Hour)), Step: "hour",
		GroupBy: []string{"deployment", "node", "gpu"}}
	gu, err := meterv1.NewCostServiceClient(conn).GetGpuUsage(fin, gpuReq)
	if err != nil {
		t.Fatal(err)
	}
	sameOverREST(t, srv, "/v1/gpu-usage?"+url.Values{"start": {rfc(hour)}, "end": {rfc(hour.Add(time.Hour))}, "step": {"hour"},
		"group_by": {"deployment,node,gpu"}}.Encode(), gu, &meterv1.GetGpuUsageResponse{})
	if len(gu.GetSeries()) != 4 {
		t.Fatalf("GetGpuUsage: %d series, want 4", len(gu.GetSeries()))
	}
	for _, sr := range gu.GetSeries() {
		l := map[string]string{"deployment": sr.GetGroup()["deployment"], "node": sr.GetGroup()["node"], "gpu": sr.GetGroup()["gpu"]}
		p, tel := sr.GetSummary(), sr.GetSummary().GetTelemetry()
		for _, g := range []struct {
			name string
			want float64
		}{
			{"gpu_utilization", p.GetUtilization()}, {"gpu_memory_used_bytes", tel.GetMemoryUsedMeanBytes()},
			{"gpu_memory_used_ratio", tel.GetMemoryUsedRatio()}, {"gpu_temperature_celsius", tel.GetTemperatureMaxC()},
			{"gpu_power_watts", tel.GetPowerMeanWatts()},
		} {
			near(fmt.Sprint(g.name, l), sample(g.name, l).GetGauge().GetValue(), g.want)
			checked[g.name]++
		}
	}

	// Latency histograms and SLO counters, since the first event.
	start, end := usagemetrics.Range()
	sel := &meterv1.SeriesSelector{Start: timestamppb.New(start), End: timestamppb.New(end), Step: "total",
		GroupBy: []string{"deployment", "model", "slo_class"}, PageSize: 1000}
	selREST := url.Values{"selector.start": {rfc(start)}, "selector.end": {rfc(end)}, "selector.step": {"total"},
		"selector.group_by": {"deployment,model,slo_class"}, "selector.page_size": {"1000"}}.Encode()
	lat, err := meterv1.NewMetricsServiceClient(conn).GetLatency(fin, &meterv1.GetLatencyRequest{Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	sameOverREST(t, srv, "/v1/latency?"+selREST, lat, &meterv1.GetLatencyResponse{})
	good, err := meterv1.NewMetricsServiceClient(conn).GetGoodput(fin, &meterv1.GetGoodputRequest{Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	sameOverREST(t, srv, "/v1/goodput?"+selREST, good, &meterv1.GetGoodputResponse{})
	if len(lat.GetSeries()) != 18 || len(good.GetSeries()) != 18 {
		t.Fatalf("GetLatency %d series, GetGoodput %d: want 3 deployments × 2 models × 3 classes", len(lat.GetSeries()), len(good.GetSeries()))
	}
	labelsOf := func(g map[string]string) map[string]string {
		l := map[string]string{"deployment": g["deployment"], "model": g["model"]}
		if c := g["slo_class"]; c != "" {
			l["slo_class"] = c
		}
		return l
	}
	for _, sr := range lat.GetSeries() {
		l := labelsOf(sr.GetGroup())
		for _, h := range []struct {
			name  string
			stats *meterv1.LatencyStats
		}{{"llm_itl_seconds", sr.GetSummary().GetItl()}, {"llm_deployment_ttft_seconds", sr.GetSummary().GetTtft()}} {
			m := sample(h.name, l).GetHistogram()
			if m.GetSampleCount() != h.stats.GetCount() || h.stats.GetCount() == 0 {
				t.Errorf("%s%v count: Prometheus %d, GetLatency %d (want some)", h.name, l, m.GetSampleCount(), h.stats.GetCount())
			}
			near(fmt.Sprint(h.name, l, " mean (ms)"), m.GetSampleSum()/float64(m.GetSampleCount())*1000, h.stats.GetMean())
			checked[h.name]++
		}
	}
	for _, sr := range good.GetSeries() {
		l := labelsOf(sr.GetGroup())
		if g, w := sample("llm_slo_requests_total", l).GetCounter().GetValue(), sr.GetSummary().GetRequests(); g != float64(w) {
			t.Errorf("llm_slo_requests_total%v: Prometheus %v, GetGoodput %d", l, g, w)
		}
		if g, w := sample("llm_slo_good_requests_total", l).GetCounter().GetValue(), sr.GetSummary().GetGoodRequests(); g != float64(w) || w == 0 {
			t.Errorf("llm_slo_good_requests_total%v: Prometheus %v, GetGoodput %d (want some)", l, g, w)
		}
		checked["llm_slo_requests_total"]++
		checked["llm_slo_good_requests_total"]++
	}
	for name, n := range served {
		if checked[name] != n || n == 0 {
			t.Errorf("%s: %d samples served, %d checked against the API", name, n, checked[name])
		}
	}
}

// sameOverREST gets path over REST with a finance key into into and checks
// it equals the gRPC answer want.
func sameOverREST(t *testing.T, srv *api.Server, path string, want, into proto.Message) {
	t.Helper()
	code, body := restTo(t, srv, http.MethodGet, path, testKeys["finance"], "")
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := protojson.Unmarshal(body, into); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if !proto.Equal(want, into) {
		t.Errorf("GET %s differs from gRPC:\nREST %s\ngRPC %s", strings.SplitN(path, "?", 2)[0], into, want)
	}
}
