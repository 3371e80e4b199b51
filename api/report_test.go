package api_test

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// TestCapacityReport runs the report through real ClickHouse rollups: two
// deployments over 26 hours, one busy and one idle. Its figures must agree
// with the GPU usage and goodput endpoints over the same range, gRPC and
// REST must answer the same, and bad requests get clear errors.
func TestCapacityReport(t *testing.T) {
	s := newStack(t, false)
	ctx := context.Background()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	const hours = 26
	start := now.Truncate(time.Hour).Add(-(hours + 1) * time.Hour)
	end := start.Add(hours * time.Hour)
	var events chstore.EventBatch
	var gpus chstore.GPUBatch
	for h := range hours {
		at := start.Add(time.Duration(h) * time.Hour)
		for i := range 100 + 10*h {
			e := ev(h*1000+i, []string{"acme", "globex"}[i%2])
			e.Deployment = "busy"
			e.CompletedAt = timestamppb.New(at.Add(time.Duration(i) * time.Second))
			events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
		}
		for k := range 360 {
			for g, dep := range []string{"busy", "busy", "spare"} {
				util := 0.6
				if dep == "spare" {
					util = 0
				}
				gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprint(h, k, g), GpuUuid: fmt.Sprint("GPU-", g), GpuType: "H100", Deployment: dep,
					SampledAt: timestamppb.New(at.Add(time.Duration(k) * 10 * time.Second)), IntervalS: 10, Utilization: util}, time.Now())
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
	req := &meterv1.GetCapacityReportRequest{Start: timestamppb.New(start), End: timestamppb.New(end), Growth: "1.5"}
	got, err := reports.GetCapacityReport(withKey(testKeys["finance"]), req)
	if err != nil {
		t.Fatal(err)
	}
	r := got.GetReport()
	if r.GetCurrency() != "USD" || len(r.GetUnits()) != 2 || r.GetNotEnoughData() != "" {
		t.Fatalf("report: currency %q, %d units, not enough data %q", r.GetCurrency(), len(r.GetUnits()), r.GetNotEnoughData())
	}
	busy, spare := r.GetUnits()[0], r.GetUnits()[1]
	if busy.GetName() != "busy" || spare.GetName() != "spare" {
		t.Fatalf("units %q, %q", busy.GetName(), spare.GetName())
	}

	// The same range from the GPU usage and goodput endpoints.
	cost := meterv1.NewCostServiceClient(s.gconn)
	gu, err := cost.GetGpuUsage(withKey(testKeys["finance"]), &meterv1.GetGpuUsageRequest{Start: req.Start, End: req.End, GroupBy: []string{"deployment"}})
	if err != nil {
		t.Fatal(err)
	}
	metrics := meterv1.NewMetricsServiceClient(s.gconn)
	gp, err := metrics.GetGoodput(withKey(testKeys["finance"]), &meterv1.GetGoodputRequest{Selector: &meterv1.SeriesSelector{Start: req.Start, End: req.End, GroupBy: []string{"deployment"}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range []*meterv1.CapacityUnit{busy, spare} {
		want := gu.GetSeries()[i].GetSummary()
		if u.GetGpuHours() != want.GetGpuHours() || u.GetBusyGpuHours() != want.GetBusyGpuHours() || u.GetUtilization() != want.GetUtilization() ||
			!proto.Equal(u.GetCost(), want.GetCost()) || !proto.Equal(u.GetIdleCost(), want.GetIdleCost()) || u.GetMaxGpus() != want.GetMaxGpus() {
			t.Errorf("%s: report %v GPU-h, %v busy, util %v, cost %v, idle %v, max %d; GPU usage %v", u.GetName(), u.GetGpuHours(), u.GetBusyGpuHours(),
				u.GetUtilization(), u.GetCost(), u.GetIdleCost(), u.GetMaxGpus(), want)
		}
	}
	g := gp.GetSeries()[0].GetSummary()
	if busy.GetRequests() != g.GetRequests() || busy.GetGoodRequests() != g.GetGoodRequests() || busy.GetAttainment() != g.GetAttainment() {
		t.Errorf("busy: %d requests, %d good; goodput %d, %d", busy.GetRequests(), busy.GetGoodRequests(), g.GetRequests(), g.GetGoodRequests())
	}
	// 26 hours with 2 GPUs each (3.60 an hour: the spare GPU's idle cost is 26 × 3.60): the busiest hour is the last (350 requests).
	if busy.GetHoursWithGpus() != hours || busy.GetMeanGpus() != 2 || !busy.GetPeak().GetStart().AsTime().Equal(end.Add(-time.Hour)) {
		t.Errorf("busy: %d hours with GPUs, mean %v GPUs, peak %v", busy.GetHoursWithGpus(), busy.GetMeanGpus(), busy.GetPeak())
	}
	if s := busy.GetSustainable(); !s.GetKnown() || !s.GetLowerBound() || s.GetQualifyingHours() != hours {
		t.Errorf("busy sustainable %v: want a lower bound from %d hours", s, hours)
	}
	if len(busy.GetGpusNeeded()) < 2 || busy.GetGpusNeeded()[1].GetFor() != "growth 1.5" || busy.GetGpusNeeded()[1].GetGpus() != 3 {
		t.Errorf("busy GPUs needed %v: growth 1.5 of a peak at the sustainable load on 2 GPUs needs 3", busy.GetGpusNeeded())
	}
	if spare.GetIdleShare() != 1 || spare.GetRequests() != 0 || spare.GetIdleCost().GetAmount() != "93.600000000" {
		t.Errorf("spare: idle share %v, %d requests, idle cost %v", spare.GetIdleShare(), spare.GetRequests(), spare.GetIdleCost())
	}
	if f := r.GetFindings(); len(f) == 0 || f[0].GetUnit() != "spare" || f[0].GetKind() != "over_provisioned" {
		t.Errorf("findings %v: want spare over-provisioned first", f)
	}
	if math.Abs(r.GetFleet().GetGpuHours()-3*hours) > 1e-9 {
		t.Errorf("fleet GPU-hours %v", r.GetFleet().GetGpuHours())
	}

	// REST answers the same.
	v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}, "growth": {"1.5"}}
	code, body := s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	var viaREST meterv1.GetCapacityReportResponse
	if code != 200 || protojson.Unmarshal(body, &viaREST) != nil {
		t.Fatalf("REST: %d %.300s", code, body)
	}
	if diff := cmp.Diff(got, &viaREST, protocmp.Transform()); diff != "" {
		t.Errorf("gRPC and REST differ (-grpc +rest):\n%s", diff)
	}

	// Errors.
	if _, err := reports.GetCapacityReport(withKey(testKeys["tenant"]), req); status.Code(err) != codes.PermissionDenied {
		t.Errorf("tenant key: %v, want PermissionDenied", err)
	}
	for _, c := range []struct {
		query string
		code  int
		want  string
	}{
		{"growth=-1", 400, `growth \"-1\"`},
		{"growth=abc", 400, `growth \"abc\"`},
		{"deployment=nope", 404, `deployment \"nope\" has neither GPU samples nor traffic`},
		{"group_by=tenant_id", 400, "want deployment, model or gpu_type"},
		{"target=2", 400, "target 2"},
	} {
		v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}}
		code, body := s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode()+"&"+c.query, testKeys["finance"], nil)
		if code != c.code || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s, want %d naming %s", c.query, code, body, c.code, c.want)
		}
	}
	empty := url.Values{"start": {start.Format(time.RFC3339)}, "end": {start.Format(time.RFC3339)}}
	if code, body := s.rest(t, "GET", "/v1/reports/capacity?"+empty.Encode(), testKeys["finance"], nil); code != 400 || !strings.Contains(string(body), "the range is empty") {
		t.Errorf("empty range: %d %s", code, body)
	}
	old, err := reports.GetCapacityReport(withKey(testKeys["finance"]), &meterv1.GetCapacityReportRequest{
		Start: timestamppb.New(start.Add(-72 * time.Hour)), End: timestamppb.New(start.Add(-48 * time.Hour))})
	if err != nil || old.GetReport().GetNotEnoughData() == "" || len(old.GetReport().GetUnits()) != 0 {
		t.Errorf("a range without data: %v %v, want not enough data", old, err)
	}
	if _, err := reports.GetCapacityReport(withKey(testKeys["finance"]), &meterv1.GetCapacityReportRequest{Start: req.Start, End: req.End, Format: "html"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("format html over gRPC: %v, want InvalidArgument", err)
	}
}
