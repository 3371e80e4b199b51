package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"
	"tokenmeter/billing"
	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// prices is the price book of the API tests: an H100's hour, and list
// prices for models m and m1 (0.60, 0.30 cached and 1.80 per 1M input,
// cached input and output tokens: 600, 300 and 1,800 nanos a token); other
// models have no list price.
const prices = `{"currency":"USD","gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}],
 "token_prices":[{"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"},
  {"model":"m1","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"}]}`

func TestAdminPriceBookAndSLOSet(t *testing.T) {
	s := newStack(t, false)
	code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["finance"], []byte(prices))
	if code != 403 {
		t.Fatalf("finance PUT price book: %d %s, want 403", code, body)
	}
	code, body = s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(`{"gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"-1"}]}`))
	if code != 400 || !strings.Contains(string(body), "gpu_prices[0].per_hour") {
		t.Fatalf("bad price book: %d %s, want 400 naming gpu_prices[0].per_hour", code, body)
	}
	var put meterv1.PutPriceBookResponse
	code, body = s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices))
	if code != 200 || protojson.Unmarshal(body, &put) != nil || !put.GetChanged() || put.GetVersion() == "" {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	code, body = s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices))
	var again meterv1.PutPriceBookResponse
	if code != 200 || protojson.Unmarshal(body, &again) != nil || again.GetChanged() || again.GetVersion() != put.GetVersion() {
		t.Fatalf("PUT the same price book again: %d %s, want unchanged version %s", code, body, put.GetVersion())
	}
	var got meterv1.GetPriceBookResponse
	code, body = s.rest(t, "GET", "/v1/admin/price-book", testKeys["finance"], nil)
	if code != 200 || protojson.Unmarshal(body, &got) != nil || got.GetVersion() != put.GetVersion() {
		t.Fatalf("GET price book: %d %s", code, body)
	}
	if p := got.GetDocument().AsMap()["gpu_prices"].([]any)[0].(map[string]any)["per_hour"]; p != "3.6" {
		t.Errorf("stored per_hour %v, want the canonical 3.6", p)
	}

	code, body = s.rest(t, "PUT", "/v1/admin/slo-set", testKeys["admin"], []byte(`{"rules":[{"slo_class":"interactive","ttft_ms":-5}]}`))
	if code != 400 {
		t.Fatalf("bad SLO set: %d %s, want 400", code, body)
	}
	var slo meterv1.PutSloSetResponse
	code, body = s.rest(t, "PUT", "/v1/admin/slo-set", testKeys["admin"], []byte(`{"rules":[{"slo_class":"interactive","ttft_ms":300}]}`))
	if code != 200 || protojson.Unmarshal(body, &slo) != nil || slo.GetVersion() != 1 || !slo.GetChanged() {
		t.Fatalf("PUT SLO set: %d %s", code, body)
	}
	if code, _ := s.rest(t, "GET", "/v1/admin/slo-set", testKeys["tenant"], nil); code != 403 {
		t.Errorf("tenant GET SLO set: %d, want 403", code)
	}
	var sloGot meterv1.GetSloSetResponse
	code, body = s.rest(t, "GET", "/v1/admin/slo-set", testKeys["admin"], nil)
	if code != 200 || protojson.Unmarshal(body, &sloGot) != nil || sloGot.GetVersion() != 1 {
		t.Fatalf("GET SLO set: %d %s", code, body)
	}
}

func TestCostEndpoints(t *testing.T) {
	s := newStack(t, false)
	ctx := context.Background()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	hour := now.Truncate(time.Hour).Add(-2 * time.Hour)
	var events chstore.EventBatch
	listCharge, listUnpriced := map[string]int64{}, map[string]uint64{} // by tenant
	for i := range 60 {
		tenant := []string{"acme", "globex", "initech"}[i%3]
		e := ev(i, tenant)
		e.CompletedAt = timestamppb.New(hour.Add(time.Duration(i) * time.Minute))
		if i%6 == 5 {
			e.Model = "unpriced"
			listUnpriced[tenant]++
		} else {
			in, cached, out := e.GetPromptTokens(), e.GetCachedPromptTokens(), e.GetOutputTokens()
			listCharge[tenant] += (in-cached)*600 + cached*300 + out*1800
		}
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	// Requests of a deployment without GPU samples: their cost is unknown
	// (unattributed), their tokens still have a list price.
	var unattributed uint64
	for i := range 4 {
		e := ev(100+i, "acme")
		e.Deployment, e.CompletedAt = "no-gpus", timestamppb.New(hour.Add(time.Duration(i)*time.Minute))
		in, cached, out := e.GetPromptTokens(), e.GetCachedPromptTokens(), e.GetOutputTokens()
		listCharge["acme"] += (in-cached)*600 + cached*300 + out*1800
		unattributed++
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	var gpus chstore.GPUBatch
	for k := range 360 {
		gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprint(k), GpuUuid: "GPU-1", GpuType: "H100", Deployment: "d",
			SampledAt: timestamppb.New(hour.Add(time.Duration(k) * 10 * time.Second)), IntervalS: 10, Utilization: 0.5,
			EnergyJoules: 7000}, time.Now())
	}
	if err := s.store.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	if err := s.store.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s.store)

	costC := meterv1.NewCostServiceClient(s.gconn)
	req := &meterv1.GetCostRequest{Start: timestamppb.New(hour), End: timestamppb.New(hour.Add(time.Hour)),
		GroupBy: []string{"tenant_id"}, IdlePolicy: "separate"}
	restPath := func(r *meterv1.GetCostRequest) string {
		v := url.Values{"start": {r.GetStart().AsTime().Format(time.RFC3339)}, "end": {r.GetEnd().AsTime().Format(time.RFC3339)}}
		for _, g := range r.GetGroupBy() {
			v.Add("group_by", g)
		}
		if r.GetTenantId() != "" {
			v.Set("tenant_id", r.GetTenantId())
		}
		if r.GetIdlePolicy() != "" {
			v.Set("idle_policy", r.GetIdlePolicy())
		}
		return "/v1/cost?" + v.Encode()
	}
	viaGRPC, err := costC.GetCost(withKey(testKeys["finance"]), req)
	if err != nil {
		t.Fatal(err)
	}
	code, body := s.rest(t, "GET", restPath(req), testKeys["finance"], nil)
	var viaREST meterv1.GetCostResponse
	if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
		t.Fatalf("REST cost: %d %s", code, body)
	}
	if diff := cmp.Diff(viaGRPC, &viaREST, protocmp.Transform()); diff != "" {
		t.Errorf("gRPC and REST differ (-grpc +rest):\n%s", diff)
	}
	// One H100 for an hour at 3.60, half busy: 1.80 busy split by tokens
	// among three tenants, 1.80 on the idle line.
	var total, idle int64
	for _, s := range viaGRPC.GetSeries() {
		total += s.GetSummary().GetCost().GetNanos()
		if s.GetGroup()["tenant_id"] == billing.IdleTenant {
			idle = s.GetSummary().GetCost().GetNanos()
		}
	}
	if total != 3_600_000_000 || idle != 1_800_000_000 || len(viaGRPC.GetSeries()) != 4 {
		t.Errorf("total %d idle %d over %d series, want 3.6e9, 1.8e9 and 4 series", total, idle, len(viaGRPC.GetSeries()))
	}
	// Each line's usage at list prices, exact, and its requests without a
	// list price (GET /v1/cost once left both out).
	for _, s := range viaGRPC.GetSeries() {
		tenant := s.GetGroup()["tenant_id"]
		want := &meterv1.Money{Currency: "USD", Nanos: listCharge[tenant], Amount: nanosAmount(listCharge[tenant])}
		if got := s.GetSummary().GetListCharge(); !proto.Equal(got, want) || s.GetSummary().GetListUnpricedRequests() != listUnpriced[tenant] {
			t.Errorf("%s: list charge %v with %d unpriced requests, want %v and %d", tenant, got, s.GetSummary().GetListUnpricedRequests(), want, listUnpriced[tenant])
		}
		if tenant == "acme" && s.GetSummary().GetUnattributedRequests() != unattributed {
			t.Errorf("acme: %d unattributed requests, want %d", s.GetSummary().GetUnattributedRequests(), unattributed)
		}
	}

	// A tenant key gets its own line whatever it asks, without the
	// provider's cost (no --tenant-cost here: TestTenantCostHidden), and no
	// GPU usage.
	own, err := costC.GetCost(withKey(testKeys["tenant"]), &meterv1.GetCostRequest{Start: req.GetStart(), End: req.GetEnd()})
	if err != nil || len(own.GetSeries()) != 1 {
		t.Fatalf("tenant cost: %v %v", own, err)
	}
	for _, s := range viaGRPC.GetSeries() {
		if s.GetGroup()["tenant_id"] != "acme" {
			continue
		}
		want := proto.Clone(s.GetSummary()).(*meterv1.CostPoint)
		want.Cost, want.BusyCost, want.IdleCost = nil, nil, nil
		want.CostPer_1KOutputTokens, want.CostPer_1KTokens, want.CostPer_1KGoodOutputTokens = "", "", ""
		want.BusyCostPer_1KOutputTokens, want.BusyCostPer_1KTokens = "", ""
		want.UnattributedRequests, want.UnattributedInputTokens, want.UnattributedOutputTokens = 0, 0, 0
		want.CostPerRequest, want.GpuSeconds, want.GpuHours, want.BusyGpuHours, want.IdleGpuHours = "", "", 0, 0, 0
		if got := own.GetSeries()[0].GetSummary(); !proto.Equal(got, want) {
			t.Errorf("acme's own line %v, want finance's without the provider's cost: %v", got, want)
		}
	}
	if _, err := costC.GetCost(withKey(testKeys["tenant"]), &meterv1.GetCostRequest{TenantId: "globex", Start: req.GetStart(), End: req.GetEnd()}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("tenant reading globex: %v, want PermissionDenied", err)
	}
	if code, _ := s.rest(t, "GET", "/v1/gpu-usage?start="+url.QueryEscape(hour.Format(time.RFC3339))+"&end="+url.QueryEscape(hour.Add(time.Hour).Format(time.RFC3339)), testKeys["tenant"], nil); code != 403 {
		t.Errorf("tenant GPU usage: %d, want 403", code)
	}
	code, body = s.rest(t, "GET", "/v1/gpu-usage?group_by=deployment&start="+url.QueryEscape(hour.Format(time.RFC3339))+"&end="+url.QueryEscape(hour.Add(time.Hour).Format(time.RFC3339)), testKeys["finance"], nil)
	var gu meterv1.GetGpuUsageResponse
	if code != 200 || protojson.Unmarshal(body, &gu) != nil || len(gu.GetSeries()) != 1 {
		t.Fatalf("GPU usage: %d %s", code, body)
	}
	if p := gu.GetSeries()[0].GetSummary(); p.GetGpuHours() != 1 || p.GetUtilization() != 0.5 || p.GetCoverage() != 1 || p.GetCost().GetAmount() != "3.600000000" || p.GetTokensPerGpuHour() == 0 ||
		math.Abs(p.GetEnergyKwh()-0.7) > 1e-12 { // 360 samples of 7 kJ
		t.Errorf("GPU usage summary %v", p)
	}

	// Clear errors for bad queries.
	for _, bad := range []string{"busy_policy=fair", "idle_policy=none", "group_by=node", "step=minute"} {
		code, body := s.rest(t, "GET", restPath(req)+"&"+bad, testKeys["finance"], nil)
		var st map[string]any
		_ = json.Unmarshal(body, &st)
		if code != 400 {
			t.Errorf("%s: %d %s, want 400", bad, code, body)
		}
	}
}
