package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/usagemetrics"
)

// usageMetricsServer runs an API server over a store holding events of
// three tenants and two models, rolled up, with the business metrics on
// (or off, metrics false).
func usageMetricsServer(t *testing.T, metrics bool) (*api.Server, *grpc.ClientConn) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := chstoretest.OpenMigrated(t)
	hour := time.Now().UTC().Truncate(time.Hour).Add(-30 * time.Hour)
	var events []*meterv1.InferenceEvent
	for i := range 600 {
		e := &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("u%d", i), TenantId: []string{"acme", "globex", "initech"}[i%3], Model: []string{"m1", "m2"}[i/3%2],
			Deployment: "d", CompletedAt: timestamppb.New(hour.Add(time.Duration(i*53) * time.Second)),
			E2EMs: proto.Float64(float64(200 + i%50*97)),
		}
		if i%7 == 4 {
			e.Status = meterv1.Status_STATUS_RATE_LIMITED // no tokens, no TTFT, an E2E
		} else {
			e.PromptTokens, e.CachedPromptTokens, e.OutputTokens = proto.Int64(int64(1000+i*31)), proto.Int64(int64(i*7)), proto.Int64(int64(1+i%300))
			e.TtftMs = proto.Float64(float64(20 + i%40*11))
		}
		events = append(events, e)
	}
	chstoretest.Insert(t, s, events)
	chstoretest.Insert(t, s, events[:100]) // redelivered
	job, err := rollup.NewJob(rollup.Config{}, s, prometheus.NewRegistry(), logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	reads := query.New(s, query.Config{})
	reg := prometheus.NewRegistry()
	svc := &api.Services{Keys: testKeySet(t), Usage: reads, Rollups: reads}
	if metrics {
		if svc.UsageMetrics, err = usagemetrics.New(usagemetrics.Config{}, reads, reg, logger, time.Now); err != nil {
			t.Fatal(err)
		}
	}
	return serveServices(t, svc, s.Ping, reg, logger)
}

// serveServices runs an API server of svc on loopback ports until the test
// ends, and returns it with a gRPC connection to it.
func serveServices(t *testing.T, svc *api.Services, ping func(context.Context) error, reg *prometheus.Registry, logger *slog.Logger) (*api.Server, *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, svc, ping, reg, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); <-done })
	return srv, conn
}

// TestUsageMetricsAuth: the business metrics hold every tenant's usage:
// finance and admin keys scrape them, other keys and none do not.
func TestUsageMetricsAuth(t *testing.T) {
	srv, _ := usageMetricsServer(t, true)
	for _, tt := range []struct {
		name, key string
		want      int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"unknown key", "key-nobody", http.StatusUnauthorized},
		{"ingest", testKeys["ingest"], http.StatusForbidden},
		{"tenant", testKeys["tenant"], http.StatusForbidden},
		{"finance", testKeys["finance"], http.StatusOK},
		{"admin", testKeys["admin"], http.StatusOK},
	} {
		code, body := restTo(t, srv, http.MethodGet, api.UsageMetricsPath, tt.key, "")
		if code != tt.want {
			t.Errorf("%s: status %d (%s), want %d", tt.name, code, body, tt.want)
		}
		if code != http.StatusOK && bytes.Contains(body, []byte("llm_")) {
			t.Errorf("%s: refused, but the body holds metrics: %s", tt.name, body)
		}
	}
}

// TestUsageMetricsOff: without --usage-metrics the path is not routed.
func TestUsageMetricsOff(t *testing.T) {
	srv, _ := usageMetricsServer(t, false)
	if code, body := restTo(t, srv, http.MethodGet, api.UsageMetricsPath, testKeys["admin"], ""); code != http.StatusNotFound {
		t.Errorf("GET %s with the metrics off: %d %s, want 404", api.UsageMetricsPath, code, body)
	}
}

// TestUsageMetricsMatchGetUsage scrapes the business metrics over HTTP,
// parses them with Prometheus's text parser and checks each pair's
// counters against GetUsage over the same range (group_by tenant_id and
// model, granularity total), and its histograms' counts against the
// requests that reported the latency (every request an E2E, successful
// ones a TTFT) and against GetLatency's counts.
func TestUsageMetricsMatchGetUsage(t *testing.T) {
	srv, conn := usageMetricsServer(t, true)
	code, body := restTo(t, srv, http.MethodGet, api.UsageMetricsPath, testKeys["finance"], "")
	if code != http.StatusOK {
		t.Fatalf("scrape: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse the scrape: %v", err)
	}
	// value finds the sample of family name with tenant and model (and
	// status, when given).
	value := func(name, tenant, mdl, status string) (*dto.Metric, bool) {
		for _, m := range families[name].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["tenant"] == tenant && l["model"] == mdl && l["status"] == status {
				return m, true
			}
		}
		return nil, false
	}
	counter := func(name, tenant, mdl, status string) int64 {
		m, ok := value(name, tenant, mdl, status)
		if !ok {
			t.Errorf("no %s{tenant=%q,model=%q,status=%q}", name, tenant, mdl, status)
			return -1
		}
		return int64(m.GetCounter().GetValue())
	}
	histCount := func(name, tenant, mdl string) int64 {
		m, ok := value(name, tenant, mdl, "")
		if !ok {
			t.Errorf("no %s{tenant=%q,model=%q}", name, tenant, mdl)
			return -1
		}
		h := m.GetHistogram()
		if b := h.GetBucket(); len(b) == 0 || b[len(b)-1].GetCumulativeCount() > h.GetSampleCount() {
			t.Errorf("%s{tenant=%q,model=%q}: buckets %v beyond the count %d", name, tenant, mdl, b, h.GetSampleCount())
		}
		return int64(h.GetSampleCount())
	}

	start, end := usagemetrics.Range()
	ctx := withKey(testKeys["finance"])
	usage, err := meterv1.NewUsageServiceClient(conn).GetUsage(ctx, &meterv1.GetUsageRequest{
		Start: timestamppb.New(start), End: timestamppb.New(end), Granularity: "total", GroupBy: []string{"tenant_id", "model"}})
	if err != nil {
		t.Fatal(err)
	}
	lat, err := meterv1.NewMetricsServiceClient(conn).GetLatency(ctx, &meterv1.GetLatencyRequest{Selector: &meterv1.SeriesSelector{
		Start: timestamppb.New(start), End: timestamppb.New(end), Step: "total", GroupBy: []string{"tenant_id", "model"}}})
	if err != nil {
		t.Fatal(err)
	}
	e2eCount := map[[2]string]uint64{}
	for _, s := range lat.GetSeries() {
		e2eCount[[2]string{s.GetGroup()["tenant_id"], s.GetGroup()["model"]}] = s.GetSummary().GetE2E().GetCount()
	}
	if n := len(usage.GetBuckets()); n != 6 {
		t.Fatalf("GetUsage: %d pairs, want 6", n)
	}
	var pairs int
	for _, b := range usage.GetBuckets() {
		tn, md := b.GetTenantId(), b.GetModel()
		checks := []struct {
			what      string
			got, want int64
		}{
			{"llm_requests_total{status=ok}", counter("llm_requests_total", tn, md, "ok"), b.GetRequests() - b.GetErrors()},
			{"llm_requests_total{status=error}", counter("llm_requests_total", tn, md, "error"), b.GetErrors()},
			{"llm_tokens_input_total", counter("llm_tokens_input_total", tn, md, ""), b.GetPromptTokens()},
			{"llm_tokens_cached_input_total", counter("llm_tokens_cached_input_total", tn, md, ""), b.GetCachedPromptTokens()},
			{"llm_tokens_output_total", counter("llm_tokens_output_total", tn, md, ""), b.GetOutputTokens()},
			{"llm_latency_count (every request has an E2E)", histCount("llm_latency", tn, md), b.GetRequests()},
			{"llm_latency_count against GetLatency", histCount("llm_latency", tn, md), int64(e2eCount[[2]string{tn, md}])},
			{"llm_ttft_seconds_count (successful requests have a TTFT)", histCount("llm_ttft_seconds", tn, md), b.GetRequests() - b.GetErrors()},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("%s/%s %s = %d, GetUsage says %d", tn, md, c.what, c.got, c.want)
			}
		}
		if b.GetRequests() == 0 || b.GetErrors() == 0 {
			t.Errorf("%s/%s: %d requests, %d errors: the test wants both", tn, md, b.GetRequests(), b.GetErrors())
		}
		pairs++
	}
	if n := len(families["llm_tokens_output_total"].GetMetric()); n != pairs {
		t.Errorf("llm_tokens_output_total has %d series, GetUsage %d pairs", n, pairs)
	}
	if g := families["llm_usage_metrics_folded_pairs"].GetMetric(); len(g) != 1 || g[0].GetGauge().GetValue() != 0 {
		t.Errorf("llm_usage_metrics_folded_pairs = %v, want 0", g)
	}
}
