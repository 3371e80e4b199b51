package api_test

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// latencyEvent has log-normal-ish latencies, spread over the last 50 minutes.
func latencyEvent(i int, tenant string) *meterv1.InferenceEvent {
	ttft := 40 * math.Exp(float64((i*7919)%1000)/250)
	out := int64(2 + i%200)
	itl := 5 + float64((i*104729)%600)/10
	return &meterv1.InferenceEvent{
		EventId: fmt.Sprintf("lat-%s-%d", tenant, i), TenantId: tenant, Model: []string{"m1", "m2"}[i%2], Deployment: "d",
		SloClass: []string{"interactive", "batch"}[i%2], CompletedAt: timestamppb.New(now.Add(-time.Duration(i%3000) * time.Second)),
		PromptTokens: proto.Int64(100), OutputTokens: proto.Int64(out),
		TtftMs: proto.Float64(ttft), E2EMs: proto.Float64(ttft + itl*float64(out-1)), ItlMs: proto.Float64(itl),
		QueueMs: proto.Float64(float64(1 + i%40)),
	}
}

// metricsSLO is the SLO set of TestMetricsEndpoints, stored before the
// events are rolled up: goodput answers its version.
const metricsSLO = `{"rules":[{"slo_class":"interactive","ttft_ms":300,"itl_ms":40},{"slo_class":"batch","e2e_ms":5000}]}`

func selector(tenant string, step string, group ...string) *meterv1.SeriesSelector {
	start := now.Truncate(time.Minute).Add(-time.Hour)
	return &meterv1.SeriesSelector{TenantId: tenant, Step: step, GroupBy: group,
		Start: timestamppb.New(start), End: timestamppb.New(now.Truncate(time.Minute).Add(2 * time.Minute))}
}

func selectorQuery(sel *meterv1.SeriesSelector) string {
	v := url.Values{"selector.start": {sel.Start.AsTime().Format(time.RFC3339)}, "selector.end": {sel.End.AsTime().Format(time.RFC3339)}}
	if sel.TenantId != "" {
		v.Set("selector.tenant_id", sel.TenantId)
	}
	if sel.Step != "" {
		v.Set("selector.step", sel.Step)
	}
	for _, g := range sel.GroupBy {
		v.Add("selector.group_by", g)
	}
	return v.Encode()
}

func TestMetricsEndpoints(t *testing.T) {
	s := newStack(t, false)
	if code, body := s.rest(t, "PUT", "/v1/admin/slo-set", testKeys["admin"], []byte(metricsSLO)); code != 200 {
		t.Fatalf("PUT SLO set: %d %s", code, body)
	}
	ingestC := meterv1.NewIngestServiceClient(s.gconn)
	var events []*meterv1.InferenceEvent
	for _, tenant := range []string{"acme", "globex"} {
		for i := range 3000 {
			events = append(events, latencyEvent(i, tenant))
		}
	}
	publishBatches(t, ingestC, events, 100)
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := query.New(s.store, query.Config{}).Usage(ctx, query.UsageQuery{Start: now.Add(-2 * time.Hour), End: now.Add(time.Hour)})
		if err == nil && len(rows) == 1 && rows[0].Requests == int64(len(events)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not ingested: %v %v", rows, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	billingtest.RollUp(t, s.store)

	mc := meterv1.NewMetricsServiceClient(s.gconn)
	finance := withKey(testKeys["finance"])

	// Histogram quantiles within 1% of exact ones, per tenant, per step and overall.
	sel := selector("", "hour", "tenant_id")
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
		if got.Count != want.Count || got.Count == 0 {
			t.Errorf("%s: count %d, exact %d", what, got.Count, want.Count)
		}
		for _, q := range [][3]any{{"p50", got.P50, want.P50}, {"p90", got.P90, want.P90}, {"p95", got.P95, want.P95}, {"p99", got.P99, want.P99}} {
			g, w := q[1].(float64), q[2].(float64)
			if math.Abs(g-w)/w > 0.01+1e-9 {
				t.Errorf("%s %s: %g, exact %g: relative error %.4f > 1%%", what, q[0], g, w, math.Abs(g-w)/w)
			}
		}
		if math.Abs(got.Mean-want.Mean)/want.Mean > 1e-9 {
			t.Errorf("%s mean: %g, exact %g", what, got.Mean, want.Mean)
		}
	}
	for i := range approx.Series {
		a, e := approx.Series[i], exact.Series[i]
		for _, m := range []struct {
			name string
			get  func(*meterv1.LatencyPoint) *meterv1.LatencyStats
		}{{"ttft", (*meterv1.LatencyPoint).GetTtft}, {"itl", (*meterv1.LatencyPoint).GetItl}, {"e2e", (*meterv1.LatencyPoint).GetE2E}} {
			within(a.Group["tenant_id"]+" summary "+m.name, m.get(a.Summary), m.get(e.Summary))
			if len(a.Points) != len(e.Points) {
				t.Fatalf("points: %d vs %d", len(a.Points), len(e.Points))
			}
			for j := range a.Points {
				within(fmt.Sprintf("%s step %d %s", a.Group["tenant_id"], j, m.name), m.get(a.Points[j]), m.get(e.Points[j]))
			}
		}
	}

	// REST answers exactly what gRPC answers.
	for _, path := range []string{"/v1/latency?", "/v1/goodput?", "/v1/traffic?"} {
		code, body := s.rest(t, "GET", path+selectorQuery(sel), testKeys["finance"], nil)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		var rest, grpcResp proto.Message
		var err error
		switch {
		case strings.HasPrefix(path, "/v1/latency"):
			rest, grpcResp = &meterv1.GetLatencyResponse{}, approx
		case strings.HasPrefix(path, "/v1/goodput"):
			rest = &meterv1.GetGoodputResponse{}
			grpcResp, err = mc.GetGoodput(finance, &meterv1.GetGoodputRequest{Selector: sel})
		default:
			rest = &meterv1.GetTrafficResponse{}
			grpcResp, err = mc.GetTraffic(finance, &meterv1.GetTrafficRequest{Selector: sel})
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := protojson.Unmarshal(body, rest); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(grpcResp, rest, protocmp.Transform()); diff != "" {
			t.Errorf("%s REST vs gRPC (-grpc +rest):\n%s", path, diff)
		}
	}

	// Goodput and traffic count every request once; goodput follows the SLO.
	gp, err := mc.GetGoodput(finance, &meterv1.GetGoodputRequest{Selector: selector("", "total")})
	if err != nil {
		t.Fatal(err)
	}
	var wantGood uint64
	set, err := rollup.ParseSLOSet([]byte(metricsSLO))
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		r, _ := set.Resolve(ev.GetTenantId(), ev.GetModel(), ev.GetSloClass())
		if (r.TTFTMs <= 0 || ev.GetTtftMs() <= r.TTFTMs) && (r.ITLMs <= 0 || ev.GetItlMs() <= r.ITLMs) && (r.E2EMs <= 0 || ev.GetE2EMs() <= r.E2EMs) {
			wantGood++
		}
	}
	if sum := gp.Series[0].Summary; sum.Requests != uint64(len(events)) || sum.GoodRequests != wantGood || sum.SloVersionMin != 1 || sum.SloVersionMax != 1 {
		t.Errorf("goodput: %d requests, %d good under SLO versions %d to %d; want %d, %d under version 1",
			sum.Requests, sum.GoodRequests, sum.SloVersionMin, sum.SloVersionMax, len(events), wantGood)
	}
	tr, err := mc.GetTraffic(finance, &meterv1.GetTrafficRequest{Selector: selector("", "hour")})
	if err != nil {
		t.Fatal(err)
	}
	if sum := tr.Series[0].Summary; sum.Requests != uint64(len(events)) || sum.PeakRequestsPerSecond <= sum.RequestsPerSecond {
		t.Errorf("traffic summary: %+v", sum)
	}

	// Traffic over 90 days (129,600 minutes: refused at every step while
	// traffic read minute rows) at day, month and total steps: each
	// series' busiest minute is the busiest of the minute steps of the
	// short range holding every event, for every form of group_by.
	end := now.Truncate(time.Hour).Add(time.Hour)
	for _, group := range [][]string{nil, {"tenant_id"}, rollup.RollupGroupFields, {"model"}} {
		minutes, err := mc.GetTraffic(finance, &meterv1.GetTrafficRequest{Selector: selector("", "minute", group...)})
		if err != nil {
			t.Fatal(err)
		}
		type busiest struct {
			Requests             uint64
			PeakReqs, PeakOutput float64
		}
		want := map[string]busiest{}
		for _, s := range minutes.Series {
			var b busiest
			for _, p := range s.Points {
				b.Requests += p.Requests
				b.PeakReqs, b.PeakOutput = max(b.PeakReqs, p.RequestsPerSecond), max(b.PeakOutput, p.OutputTokensPerSecond)
			}
			want[fmt.Sprint(s.Group)] = b
		}
		for _, step := range []string{"day", "month", "total"} {
			sel := &meterv1.SeriesSelector{Step: step, GroupBy: group, Start: timestamppb.New(end.Add(-90 * 24 * time.Hour)), End: timestamppb.New(end)}
			long, err := mc.GetTraffic(finance, &meterv1.GetTrafficRequest{Selector: sel})
			if err != nil {
				t.Errorf("traffic over 90 days at step %s, group_by %v: %v", step, group, err)
				continue
			}
			got := map[string]busiest{}
			for _, s := range long.Series {
				var b busiest
				for _, p := range s.Points {
					b.PeakReqs, b.PeakOutput = max(b.PeakReqs, p.PeakRequestsPerSecond), max(b.PeakOutput, p.PeakOutputTokensPerSecond)
				}
				if sum := s.Summary; sum.PeakRequestsPerSecond != b.PeakReqs || sum.PeakOutputTokensPerSecond != b.PeakOutput {
					t.Errorf("step %s, group_by %v, series %v: summary peaks %g, %g; want the steps' largest %g, %g",
						step, group, s.Group, sum.PeakRequestsPerSecond, sum.PeakOutputTokensPerSecond, b.PeakReqs, b.PeakOutput)
				}
				b.Requests = s.Summary.Requests
				got[fmt.Sprint(s.Group)] = b
			}
			if diff := cmp.Diff(want, got); diff != "" || len(want) == 0 {
				t.Errorf("traffic over 90 days at step %s, group_by %v: (-minute steps +long range):\n%s", step, group, diff)
			}
		}
	}

	// Tenant isolation on every endpoint.
	tenant := withKey(testKeys["tenant"])
	own, err := mc.GetLatency(tenant, &meterv1.GetLatencyRequest{Selector: selector("", "total", "tenant_id")})
	if err != nil || len(own.Series) != 1 || own.Series[0].Group["tenant_id"] != "acme" {
		t.Errorf("tenant key latency: %v %v", own, err)
	}
	for name, call := range map[string]func() error{
		"latency": func() error {
			_, err := mc.GetLatency(tenant, &meterv1.GetLatencyRequest{Selector: selector("globex", "total")})
			return err
		},
		"goodput": func() error {
			_, err := mc.GetGoodput(tenant, &meterv1.GetGoodputRequest{Selector: selector("globex", "total")})
			return err
		},
		"traffic": func() error {
			_, err := mc.GetTraffic(tenant, &meterv1.GetTrafficRequest{Selector: selector("globex", "total")})
			return err
		},
		"ingest key": func() error {
			_, err := mc.GetTraffic(withKey(testKeys["ingest"]), &meterv1.GetTrafficRequest{Selector: selector("", "total")})
			return err
		},
	} {
		if status.Code(call()) != codes.PermissionDenied {
			t.Errorf("%s: got %v, want PERMISSION_DENIED", name, call())
		}
	}

	// Clear errors for bad requests; pagination.
	bad := selector("", "week", "color")
	_, err = mc.GetLatency(finance, &meterv1.GetLatencyRequest{Selector: bad})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "color") || !strings.Contains(err.Error(), "week") {
		t.Errorf("bad selector: %v", err)
	}
	paged := selector("", "total", "tenant_id")
	paged.PageSize = 1
	p1, err := mc.GetLatency(finance, &meterv1.GetLatencyRequest{Selector: paged})
	if err != nil || len(p1.Series) != 1 || p1.NextPageToken == "" {
		t.Fatalf("page 1: %v %v", p1, err)
	}
	paged.PageToken = p1.NextPageToken
	p2, err := mc.GetLatency(finance, &meterv1.GetLatencyRequest{Selector: paged})
	if err != nil || len(p2.Series) != 1 || p2.NextPageToken != "" || p2.Series[0].Group["tenant_id"] == p1.Series[0].Group["tenant_id"] {
		t.Fatalf("page 2: %v %v", p2, err)
	}
}

// publishBatches publishes events with the ingest key in batches of n (the
// last may be shorter), failing the test on the first error.
func publishBatches(t *testing.T, ingestC meterv1.IngestServiceClient, events []*meterv1.InferenceEvent, n int) {
	t.Helper()
	for i := 0; i < len(events); i += n {
		if _, err := ingestC.PublishEvents(withKey(testKeys["ingest"]), &meterv1.PublishEventsRequest{Events: events[i:min(i+n, len(events))]}); err != nil {
			t.Fatal(err)
		}
	}
}
