package api_test

import (
	"context"
	"fmt"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// planPrices prices four GPU types; B200 is never run.
const planPrices = `{"currency":"USD","gpu_prices":[
 {"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"},
 {"gpu_type":"H100","pool":"reserved","effective_from":"2026-01-01T00:00:00Z","per_hour":"2.10"},
 {"gpu_type":"A100","effective_from":"2026-01-01T00:00:00Z","per_hour":"1.50"},
 {"gpu_type":"L4","effective_from":"2026-01-01T00:00:00Z","per_hour":"0.80"},
 {"gpu_type":"B200","effective_from":"2026-01-01T00:00:00Z","per_hour":"6.00"}],
 "token_prices":[{"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"}]}`

// TestCapacityFleetPlan runs the fleet plan and the hot band through real
// ClickHouse rollups: 22 days of "chat", on one H100 on even days and two
// A100s on odd days (each day's first hour also on an L4), whose A100
// hours miss the SLO at their highest load; and "hot", the last 30 hours
// on an H100 at 95% utilization missing its SLO at every load. gRPC and
// REST answer the same, the HTML file shows the plan, and the figures
// hold together exactly.
func TestCapacityFleetPlan(t *testing.T) {
	s := newStack(t, false)
	ctx := context.Background()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(planPrices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	const hours = 22 * 24
	start := now.Truncate(time.Hour).Add(-(hours + 1) * time.Hour)
	end := start.Add(hours * time.Hour)
	var events chstore.EventBatch
	var gpus chstore.GPUBatch
	id := 0
	// GPU telemetry: chat's GPUs half full at 60 °C on their normal clock;
	// hot's 97% full, at 86 °C in its last hour, clocks at half their
	// normal speed.
	sample := func(dep, typ, gpu string, at time.Time, util float64) {
		for k := range 60 {
			id++
			g := &meterv1.GpuSample{SampleId: fmt.Sprint("s", id), GpuUuid: gpu, GpuType: typ, Deployment: dep,
				SampledAt: timestamppb.New(at.Add(time.Duration(k) * time.Minute)), IntervalS: 60, Utilization: util,
				FbTotalBytes: 80 << 30, FbUsedBytes: 40 << 30, TemperatureC: 60, SmClockMhz: 1980, SmClockMaxMhz: 1980}
			if dep == "hot" {
				g.FbUsedBytes, g.SmClockMhz = 80<<30*97/100, 990
				if at.Equal(end.Add(-time.Hour)) {
					g.TemperatureC = 86
				}
			}
			gpus.Append(g, time.Now())
		}
	}
	event := func(dep string, at time.Time, prompt int64, ttftMs float64) {
		id++
		e := ev(id, "acme")
		e.Deployment = dep
		e.CompletedAt = timestamppb.New(at.Add(time.Duration(id%3000) * time.Second))
		e.PromptTokens, e.OutputTokens, e.CachedPromptTokens = proto.Int64(prompt), proto.Int64(100), proto.Int64(0)
		e.TtftMs, e.E2EMs = proto.Float64(ttftMs), proto.Float64(ttftMs+200)
		events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
	}
	for h := range hours {
		at := start.Add(time.Duration(h) * time.Hour)
		day := h / 24
		util := 0.6
		if h >= hours-30 {
			util = 0.95 // the hot band
		}
		if day%2 == 0 {
			sample("chat", "H100", "GPU-H0", at, util)
		} else {
			sample("chat", "A100", "GPU-A0", at, util)
			sample("chat", "A100", "GPU-A1", at, util)
		}
		if h%24 == 0 {
			sample("chat", "L4", "GPU-L0", at, util)
		}
		// 2 to 8 requests, growing load: a forecast peak.
		n := 2 + h%7
		for i := range n {
			ttft := 10.0
			// A100: the hours above 2.5 tokens/s per GPU miss, and one quiet hour.
			if day%2 == 1 && (float64(n*(1100+4*h))/7200 > 2.5 || h == 30 && i == 0) {
				ttft = 900
			}
			event("chat", at, int64(1000+4*h), ttft)
		}
		if h >= hours-30 {
			sample("hot", "H100", "GPU-H9", at, 0.95)
			for i := range 3 {
				ttft := 900.0
				if i == 0 {
					ttft = 10
				}
				event("hot", at, 500, ttft)
			}
		}
	}
	if err := s.store.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	if err := s.store.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s.store)

	reports := meterv1.NewReportServiceClient(s.gconn)
	req := &meterv1.GetCapacityReportRequest{Start: timestamppb.New(start), End: timestamppb.New(end), MinHourRequests: 2}
	got, err := reports.GetCapacityReport(withKey(testKeys["finance"]), req)
	if err != nil {
		t.Fatal(err)
	}
	r := got.GetReport()
	if len(r.GetPlans()) != 2 || r.GetPlans()[0].GetDeployment() != "chat" || r.GetPlans()[1].GetDeployment() != "hot" {
		t.Fatalf("plans %v", r.GetPlans())
	}
	chat, hot := r.GetPlans()[0], r.GetPlans()[1]
	if !chat.GetLoadKnown() || !strings.HasPrefix(chat.GetLoadFor(), "forecast peak ") || chat.GetLoadTokensPerSecond() <= 0 {
		t.Fatalf("chat load %q %v", chat.GetLoadFor(), chat.GetLoadTokensPerSecond())
	}
	var types []string
	for _, o := range chat.GetOptions() {
		types = append(types, o.GetGpuType())
	}
	if want := []string{"A100", "H100", "L4", "B200"}; !slices.Equal(types, want) {
		t.Fatalf("chat options %v, want %v", types, want)
	}
	a100, h100, l4, b200 := chat.GetOptions()[0], chat.GetOptions()[1], chat.GetOptions()[2], chat.GetOptions()[3]
	if s := a100.GetSustainable(); !s.GetKnown() || s.GetLowerBound() || s.GetMissedHours() != 1 || a100.GetMixedHours() != 11 {
		t.Errorf("A100: sustainable %v (want known from misses, one quiet hour missed), %d mixed hours (want 11)", s, a100.GetMixedHours())
	}
	if s := h100.GetSustainable(); !s.GetKnown() || !s.GetLowerBound() || h100.GetMixedHours() != 11 {
		t.Errorf("H100: sustainable %v (want a lower bound), %d mixed hours", s, h100.GetMixedHours())
	}
	if l4.GetCostKnown() || l4.GetMixedHours() != 22 || !strings.HasPrefix(l4.GetNotEnoughData(), "not enough data") {
		t.Errorf("L4: %v", l4)
	}
	if b200.GetMeasured() || b200.GetCostKnown() || !b200.GetPriced() || !strings.Contains(b200.GetNotEnoughData(), "ran no hour on B200") {
		t.Errorf("B200: %v", b200)
	}
	// Cost per 1M tokens, exact from the estimate's hour: the hour's tokens
	// over its GPU-seconds is the load; round(price × 1e6 / (load × 3600)).
	load := new(big.Rat).SetFloat64(chat.GetLoadTokensPerSecond())
	for _, o := range []*meterv1.CapacityGpuOption{a100, h100} {
		hour := o.GetSustainable().GetHour().AsTime()
		h := int(hour.Sub(start) / time.Hour)
		n := int64(2 + h%7)
		gpuSec := int64(3600)
		if o.GetGpuType() == "A100" {
			gpuSec = 7200
		}
		perGPU := big.NewRat(n*(int64(1000+4*h)+100), gpuSec)
		if f, _ := perGPU.Float64(); f != o.GetSustainable().GetTokensPerSecondPerGpu() {
			t.Errorf("%s: sustainable %v at hour %d, want %v", o.GetGpuType(), o.GetSustainable().GetTokensPerSecondPerGpu(), h, f)
		}
		price := o.GetPricePerHour().GetNanos()
		cost := new(big.Rat).Quo(new(big.Rat).Mul(big.NewRat(price, 1), big.NewRat(1_000_000, 3600)), perGPU)
		if want := roundRat(cost); o.GetCostPer_1MTokens().GetNanos() != want || o.GetPriceId() != "gpu:"+o.GetGpuType()+"|*|*@2026-01-01T00:00:00Z" {
			t.Errorf("%s: cost per 1M %v, want %d nanos (price %v, %s)", o.GetGpuType(), o.GetCostPer_1MTokens(), want, o.GetPricePerHour(), o.GetPriceId())
		}
		q := new(big.Rat).Quo(load, perGPU)
		wantGPUs := new(big.Int).Quo(q.Num(), q.Denom()).Int64()
		if !q.IsInt() {
			wantGPUs++
		}
		if o.GetGpus() != wantGPUs || o.GetCostPerHour().GetNanos() != wantGPUs*price || o.GetArithmetic() == "" || o.GetCostArithmetic() == "" {
			t.Errorf("%s: %d GPUs for %v tokens/s, %v per hour, want %d", o.GetGpuType(), o.GetGpus(), chat.GetLoadTokensPerSecond(), o.GetCostPerHour(), wantGPUs)
		}
	}
	// The mix: its parts add up, it carries the load, and no single type
	// is cheaper.
	var sum, cost int64
	for _, m := range chat.GetMix() {
		sum += m.GetGpus()
		cost += m.GetCostPerHour().GetNanos()
	}
	if !chat.GetMixKnown() || sum != chat.GetMixGpus() || cost != chat.GetMixCostPerHour().GetNanos() || chat.GetMixTokensPerSecond() < chat.GetLoadTokensPerSecond() ||
		cost > a100.GetCostPerHour().GetNanos() || cost > h100.GetCostPerHour().GetNanos() || chat.GetMixAtMost() != slices.ContainsFunc(chat.GetMix(), func(m *meterv1.CapacityMixPart) bool { return m.GetGpuType() == "H100" }) {
		t.Errorf("chat mix %v: %d GPUs, %v per hour, %v tokens/s (at most %v): %s", chat.GetMix(), chat.GetMixGpus(), chat.GetMixCostPerHour(), chat.GetMixTokensPerSecond(), chat.GetMixAtMost(), chat.GetMixArithmetic())
	}
	// hot: no forecast (22 days, traffic only in the last 30 hours), and
	// saturated on its H100.
	if hot.GetLoadKnown() || hot.GetMixKnown() || !strings.HasPrefix(hot.GetMixReason(), "not enough data") || hot.GetLoadReason() == "" ||
		!hot.GetOptions()[0].GetSustainable().GetSaturated() || hot.GetOptions()[0].GetNotEnoughData() == "" {
		t.Errorf("hot plan %v", hot)
	}
	fp := r.GetFleetPlan()
	if fp.GetDeployments() != 1 || fp.GetGpus() != chat.GetMixGpus() || !proto.Equal(fp.GetCostPerHour(), chat.GetMixCostPerHour()) ||
		!slices.Equal(fp.GetMissing(), []string{"hot"}) || fp.GetAtMost() != chat.GetMixAtMost() || len(fp.GetParts()) != len(chat.GetMix()) || fp.GetTokensPerSecond() != chat.GetMixTokensPerSecond() {
		t.Errorf("fleet plan %v", fp)
	}
	// The hot band: the last 30 hours at 95% utilization (hot's: a third
	// of their requests good); chat's hours at 60% are its other hours.
	var hotUnit, chatUnit *meterv1.CapacityUnit
	for _, u := range r.GetUnits() {
		switch u.GetName() {
		case "hot":
			hotUnit = u
		case "chat":
			chatUnit = u
		}
	}
	if b := hotUnit.GetHotBand(); b.GetHours() != 30 || b.GetRequests() != 90 || b.GetGoodRequests() != 30 || b.GetOtherHours() != 0 {
		t.Errorf("hot band of hot %v", b)
	}
	var lastRequests uint64
	for h := hours - 30; h < hours; h++ {
		lastRequests += uint64(2 + h%7)
	}
	if b := chatUnit.GetHotBand(); b.GetHours() != 30 || b.GetRequests() != lastRequests || b.GetOtherHours() != hours-30 || b.GetOtherGoodRequests() == 0 || b.GetOtherAttainment() <= 0 {
		t.Errorf("hot band of chat %v", b)
	}
	if !slices.ContainsFunc(r.GetFindings(), func(f *meterv1.CapacityFinding) bool { return f.GetUnit() == "hot" && f.GetKind() == "hot" }) {
		t.Errorf("findings %v: want hot running hot", r.GetFindings())
	}
	// Memory pressure and thermal throttling: hot's, not chat's.
	for _, c := range []struct {
		unit, kind string
		want       bool
		text       string
	}{
		{"hot", "memory_pressure", true, "in 30 of its 30 hours with GPU samples the memory in use averaged above 95.0% (highest 97.0%"},
		{"hot", "thermal_throttling", true, "in 1 hours a GPU was above 83 °C (hottest 86.0 °C in the hour " + end.Add(-time.Hour).Format("2006-01-02 15:04 UTC")},
		{"chat", "memory_pressure", false, ""},
		{"chat", "thermal_throttling", false, ""},
	} {
		i := slices.IndexFunc(r.GetFindings(), func(f *meterv1.CapacityFinding) bool { return f.GetUnit() == c.unit && f.GetKind() == c.kind })
		if (i >= 0) != c.want || c.want && (r.GetFindings()[i].GetSeverity() != 2 || !strings.Contains(r.GetFindings()[i].GetText(), c.text)) {
			t.Errorf("%s %s finding: %v (want %v with %q)", c.unit, c.kind, r.GetFindings(), c.want, c.text)
		}
	}
	// The fleet's hot band: both deployments' last 30 hours.
	if b, c := r.GetFleet().GetHotBand(), chatUnit.GetHotBand(); b.GetHours() != 30 || b.GetRequests() != c.GetRequests()+90 || b.GetGoodRequests() != c.GetGoodRequests()+30 ||
		b.GetOtherHours() != hours-30 || b.GetOtherRequests() != c.GetOtherRequests() {
		t.Errorf("fleet hot band %v", b)
	}

	// By model with max_units 1: one unit (m) of two deployments, one plan
	// (chat, the most GPU time), the other counted.
	byModel, err := reports.GetCapacityReport(withKey(testKeys["finance"]), &meterv1.GetCapacityReportRequest{Start: req.Start, End: req.End,
		MinHourRequests: 2, GroupBy: "model", MaxUnits: 1})
	if err != nil {
		t.Fatal(err)
	}
	if m := byModel.GetReport(); len(m.GetPlans()) != 1 || m.GetPlans()[0].GetDeployment() != "chat" || m.GetPlansOmitted() != 1 {
		t.Errorf("by model: %d plans, %d omitted", len(m.GetPlans()), m.GetPlansOmitted())
	}

	// REST answers the same, and its HTML file shows the plan.
	v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "min_hour_requests": {"2"}}
	code, body := s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	var viaREST meterv1.GetCapacityReportResponse
	if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
		t.Fatalf("REST: %d %.300s", code, body)
	}
	if diff := cmp.Diff(got, &viaREST, protocmp.Transform()); diff != "" {
		t.Errorf("gRPC and REST differ (-grpc +rest):\n%s", diff)
	}
	v.Set("format", "html")
	code, body = s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	if code != 200 || !strings.Contains(string(body), `<section id="fleet-plan">`) || !strings.Contains(string(body), `data-deployment="chat"`) {
		t.Errorf("HTML: %d, no fleet plan", code)
	}
}

// roundRat is r rounded half to even to an integer.
func roundRat(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	m.Lsh(m, 1)
	if c := m.Cmp(r.Denom()); c > 0 || c == 0 && q.Bit(0) == 1 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}
