package api_test

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// breakdownEvent has every latency a request can report (prefill on most),
// output lengths in every output-length class, and, on every ninth, a TTFT
// taken from E2E (ttft_source=e2e).
func breakdownEvent(i int, tenant string) *meterv1.InferenceEvent {
	ev := latencyEvent(i, tenant)
	ev.EventId = fmt.Sprintf("brk-%s-%d", tenant, i)
	out := []int64{3, 120, 300, 900, 1500}[i%5] + int64(i%7)
	ev.OutputTokens = proto.Int64(out)
	ev.PromptTokens = proto.Int64(int64(50 + (i*37)%5000))
	ev.E2EMs = proto.Float64(ev.GetTtftMs() + ev.GetItlMs()*float64(out-1))
	if i%4 != 0 {
		ev.PrefillMs = proto.Float64(ev.GetTtftMs() * 0.7)
	}
	if i%9 == 4 {
		ev.TtftMs = proto.Float64(ev.GetE2EMs())
		ev.Labels = map[string]string{"ttft_source": "e2e"}
	}
	return ev
}

// TestLatencyBreakdownAnswers checks the latency breakdown and tokens per
// request over the API: the rollups' prefill, decode and per-class E2E
// within 1% of the exact answer (counts equal), TTFT without the estimated
// ones, tokens per request in usage and traffic, and REST answering exactly
// what gRPC answers.
func TestLatencyBreakdownAnswers(t *testing.T) {
	s := newStack(t, false)
	ingestC := meterv1.NewIngestServiceClient(s.gconn)
	var events []*meterv1.InferenceEvent
	for _, tenant := range []string{"acme", "globex"} {
		for i := range 1500 {
			events = append(events, breakdownEvent(i, tenant))
		}
	}
	publishBatches(t, ingestC, events, 100)
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rows, err := query.New(s.store, query.Config{}).Usage(ctx, query.UsageQuery{Start: now.Add(-2 * time.Hour), End: now.Add(time.Hour)})
		if err == nil && len(rows) == 1 && rows[0].Requests == int64(len(events)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not ingested: %v %v", rows, err)
		}
	}
	billingtest.RollUp(t, s.store)

	mc := meterv1.NewMetricsServiceClient(s.gconn)
	finance := withKey(testKeys["finance"])
	// Whole hours: the hour rollups answer.
	start, end := now.Truncate(time.Hour).Add(-time.Hour), now.Truncate(time.Hour).Add(time.Hour)
	// Per model: the all-tenant rows per model and deployment keep every
	// hour-only distribution (rollup.HourDistTables).
	sel := &meterv1.SeriesSelector{Step: "hour", GroupBy: []string{"model"}, Start: timestamppb.New(start), End: timestamppb.New(end)}
	approx, err := mc.GetLatency(finance, &meterv1.GetLatencyRequest{Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	exact, err := mc.GetLatency(finance, &meterv1.GetLatencyRequest{Selector: sel, Exact: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(approx.Series) != 2 || len(exact.Series) != 2 {
		t.Fatalf("series: %d approx, %d exact, want 2", len(approx.Series), len(exact.Series))
	}
	within := func(what string, got, want *meterv1.LatencyStats) {
		t.Helper()
		if got == nil || want == nil || got.Count != want.Count || got.Count == 0 {
			t.Errorf("%s: %v, exact %v", what, got, want)
			return
		}
		for _, q := range [][3]any{{"p50", got.P50, want.P50}, {"p90", got.P90, want.P90}, {"p95", got.P95, want.P95}, {"p99", got.P99, want.P99}, {"mean", got.Mean, want.Mean}} {
			g, w := q[1].(float64), q[2].(float64)
			if math.Abs(g-w) > (0.01+1e-9)*w {
				t.Errorf("%s %s: %g, exact %g", what, q[0], g, w)
			}
		}
	}
	metrics := []struct {
		name string
		get  func(*meterv1.LatencyPoint) *meterv1.LatencyStats
	}{
		{"ttft", (*meterv1.LatencyPoint).GetTtft}, {"prefill", (*meterv1.LatencyPoint).GetPrefill},
		{"decode", (*meterv1.LatencyPoint).GetDecode}, {"e2e_short_output", (*meterv1.LatencyPoint).GetE2EShortOutput},
		{"e2e_medium_output", (*meterv1.LatencyPoint).GetE2EMediumOutput}, {"e2e_long_output", (*meterv1.LatencyPoint).GetE2ELongOutput},
	}
	estimated, requests := map[string]uint64{}, map[string]uint64{}
	for _, ev := range events {
		requests[ev.GetModel()]++
		if ev.GetLabels()["ttft_source"] == "e2e" {
			estimated[ev.GetModel()]++
		}
	}
	for i := range approx.Series {
		a, e := approx.Series[i], exact.Series[i]
		for _, m := range metrics {
			within(a.Group["model"]+" summary "+m.name, m.get(a.Summary), m.get(e.Summary))
			for j := range a.Points {
				within(fmt.Sprintf("%s step %d %s", a.Group["model"], j, m.name), m.get(a.Points[j]), m.get(e.Points[j]))
			}
		}
		sum := a.Summary
		m := a.Group["model"]
		if got := sum.GetTtft().GetCount(); got != requests[m]-estimated[m] || estimated[m] == 0 {
			t.Errorf("%s: %d TTFTs, want %d (%d less %d estimated)", m, got, requests[m]-estimated[m], requests[m], estimated[m])
		}
		if c := sum.GetE2EShortOutput().GetCount() + sum.GetE2EMediumOutput().GetCount() + sum.GetE2ELongOutput().GetCount(); c != sum.GetE2E().GetCount() {
			t.Errorf("%s: output classes %d requests, e2e %d", a.Group["model"], c, sum.GetE2E().GetCount())
		}
	}

	// Tokens per request: every request counted; the mean exact.
	uc := meterv1.NewUsageServiceClient(s.gconn)
	usage, err := uc.GetUsage(finance, &meterv1.GetUsageRequest{Start: timestamppb.New(start), End: timestamppb.New(end), GroupBy: []string{"tenant_id"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(usage.Buckets) != 2 {
		t.Fatalf("usage: %d buckets, want 2", len(usage.Buckets))
	}
	for _, b := range usage.Buckets {
		p, o := b.GetPromptTokensPerRequest(), b.GetOutputTokensPerRequest()
		if p.GetRequests() != uint64(b.Requests) || o.GetRequests() != uint64(b.Requests) ||
			p.GetMean() != float64(b.PromptTokens)/float64(b.Requests) || o.GetMean() != float64(b.OutputTokens)/float64(b.Requests) ||
			!(o.GetP50() <= o.GetP95() && o.GetP95() <= o.GetP99() && o.GetP99() >= 0.99*1500) {
			t.Errorf("usage %s: prompt %v, output %v; %d requests, %d/%d tokens", b.TenantId, p, o, b.Requests, b.PromptTokens, b.OutputTokens)
		}
	}

	// REST answers exactly what gRPC answers.
	traffic, err := mc.GetTraffic(finance, &meterv1.GetTrafficRequest{Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	if p := traffic.Series[0].Summary.GetOutputTokensPerRequest(); p == nil || p.P99 == 0 {
		t.Errorf("traffic summary: output tokens per request %v", p)
	}
	usageQuery := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "group_by": {"tenant_id"}}
	for _, c := range []struct {
		path       string
		rest, grpc proto.Message
	}{
		{"/v1/latency?" + selectorQuery(sel), &meterv1.GetLatencyResponse{}, approx},
		{"/v1/latency?exact=true&" + selectorQuery(sel), &meterv1.GetLatencyResponse{}, exact},
		{"/v1/traffic?" + selectorQuery(sel), &meterv1.GetTrafficResponse{}, traffic},
		{"/v1/usage?" + usageQuery.Encode(), &meterv1.GetUsageResponse{}, usage},
	} {
		code, body := s.rest(t, "GET", c.path, testKeys["finance"], nil)
		if code != 200 {
			t.Fatalf("%s: %d %s", c.path, code, body)
		}
		if err := protojson.Unmarshal(body, c.rest); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.grpc, c.rest, protocmp.Transform()); diff != "" {
			t.Errorf("%s REST vs gRPC (-grpc +rest):\n%s", c.path, diff)
		}
	}
}
