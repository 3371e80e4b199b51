package api_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/browsertest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/query/capacity"
)

// TestCapacityReportManyDeployments runs the capacity report over 2,000
// deployments in real ClickHouse rollups (as many names as one ingest key
// can create). The answer is bounded: max_units units (20 by default), the
// rest summed into the others unit, whose integer sums (requests, tokens,
// cost nanos, GPUs) are exactly those of the folded deployments, read
// from the GPU usage endpoint and from what was sent; the report says how
// many units it folded. The files are bounded too, and the hour reads are
// capped like the other series reads: a service whose MaxSeriesRows is
// below the range's deployment-hours refuses the report.
func TestCapacityReportManyDeployments(t *testing.T) {
	const deployments, hours = 2000, 3
	s := newStack(t, false)
	ctx := context.Background()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	start := now.Truncate(time.Hour).Add(-(hours + 1) * time.Hour)
	end := start.Add(hours * time.Hour)
	type sent struct{ requests, in, out uint64 }
	want := map[string]*sent{}
	var events chstore.EventBatch
	var gpus chstore.GPUBatch
	for i := range deployments {
		dep := fmt.Sprintf("dep-%04d", i)
		want[dep] = &sent{}
		for h := range hours {
			at := start.Add(time.Duration(h) * time.Hour)
			e := ev(i*hours+h, []string{"acme", "globex"}[i%2])
			e.Deployment, e.Model = dep, fmt.Sprintf("model-%02d", i%40)
			e.CompletedAt = timestamppb.New(at.Add(time.Duration(i%3000) * time.Second))
			e.PromptTokens, e.OutputTokens = proto.Int64(int64(100+i)), proto.Int64(int64(1+i%50))
			events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
			w := want[dep]
			w.requests++
			w.in += uint64(100 + i)
			w.out += uint64(1 + i%50)
			for g := range 1 + i%3 { // 1 to 3 GPUs, H100 (priced) or A100 (not)
				gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprint(dep, h, g), GpuUuid: fmt.Sprint("GPU-", dep, "-", g),
					GpuType: []string{"H100", "A100"}[i%2], Deployment: dep, SampledAt: timestamppb.New(at.Add(time.Duration(g) * time.Minute)),
					IntervalS: 10, Utilization: float64(i%10) / 10}, time.Now())
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

	v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {end.Format(time.RFC3339)}}
	code, body := s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	var answer meterv1.GetCapacityReportResponse
	if code != 200 || protojson.Unmarshal(body, &answer) != nil {
		t.Fatalf("REST: %d %.300s", code, body)
	}
	r := answer.GetReport()
	t.Logf("JSON report of %d deployments: %d bytes, %d units, %d in others", deployments, len(body), len(r.GetUnits()), r.GetUnitsInOthers())
	if len(r.GetUnits()) != capacity.DefaultMaxUnits || r.GetMaxUnits() != capacity.DefaultMaxUnits ||
		r.GetUnitsInOthers() != deployments-capacity.DefaultMaxUnits || r.GetOthers().GetName() != capacity.OthersName {
		t.Fatalf("%d units (max %d), %d in others (%q); want %d and the rest in %s", len(r.GetUnits()), r.GetMaxUnits(),
			r.GetUnitsInOthers(), r.GetOthers().GetName(), capacity.DefaultMaxUnits, capacity.OthersName)
	}
	if len(body) > 1<<20 {
		t.Errorf("the JSON report is %d bytes: want it bounded by the listed units, under 1 MiB", len(body))
	}

	// The listed units are the largest by GPU time: 3 priced or unpriced
	// GPUs each (i%3 == 2), the most tokens first.
	listed := map[string]bool{}
	for _, u := range r.GetUnits() {
		listed[u.GetName()] = true
		if u.GetMaxGpus() != 3 || u.GetDeploymentCount() != 1 || u.GetModelCount() != 1 || u.GetGpuTypeCount() != 1 {
			t.Errorf("listed unit %s: %d GPUs, %d deployments, %d models, %d GPU types; want one of the largest (3 GPUs)",
				u.GetName(), u.GetMaxGpus(), u.GetDeploymentCount(), u.GetModelCount(), u.GetGpuTypeCount())
		}
	}
	if !listed["dep-1997"] || listed["dep-1999"] {
		t.Errorf("listed %v: want dep-1997 (3 GPUs, most tokens), not dep-1999 (2 GPUs)", listed)
	}

	// The others' integer sums are the folded deployments', exactly.
	cost := meterv1.NewCostServiceClient(s.gconn)
	var series []*meterv1.GpuUsageSeries
	for page := ""; ; {
		gu, err := cost.GetGpuUsage(withKey(testKeys["finance"]), &meterv1.GetGpuUsageRequest{Start: timestamppb.New(start), End: timestamppb.New(end),
			GroupBy: []string{"deployment"}, PageSize: 1000, PageToken: page})
		if err != nil {
			t.Fatal(err)
		}
		series = append(series, gu.GetSeries()...)
		if page = gu.GetNextPageToken(); page == "" {
			break
		}
	}
	if len(series) != deployments {
		t.Fatalf("GPU usage: %d deployments, want %d", len(series), deployments)
	}
	var foldedCost, foldedIdle int64
	var foldedGPUs uint32
	for _, se := range series {
		if !listed[se.GetGroup()["deployment"]] {
			foldedCost += se.GetSummary().GetCost().GetNanos()
			foldedIdle += se.GetSummary().GetIdleCost().GetNanos()
			foldedGPUs += se.GetSummary().GetMaxGpus()
		}
	}
	var folded sent
	for dep, w := range want {
		if !listed[dep] {
			folded.requests += w.requests
			folded.in += w.in
			folded.out += w.out
		}
	}
	o := r.GetOthers()
	if got := (sent{o.GetRequests(), o.GetInputTokens(), o.GetOutputTokens()}); got != folded {
		t.Errorf("others: requests and tokens %+v, want the folded deployments' %+v", got, folded)
	}
	if o.GetCost().GetNanos() != foldedCost || o.GetIdleCost().GetNanos() != foldedIdle || foldedCost == 0 {
		t.Errorf("others: cost %d, idle %d nanos; the folded deployments' GPU usage says %d, %d", o.GetCost().GetNanos(), o.GetIdleCost().GetNanos(), foldedCost, foldedIdle)
	}
	if o.GetMaxGpus() != foldedGPUs {
		t.Errorf("others: %d GPUs at most in an hour, want the folded deployments' %d (every hour has them all)", o.GetMaxGpus(), foldedGPUs)
	}
	var unitsNanos int64
	var unitsRequests uint64
	for _, u := range r.GetUnits() {
		unitsNanos += u.GetCost().GetNanos()
		unitsRequests += u.GetRequests()
	}
	if f := r.GetFleet(); f.GetCost().GetNanos() != unitsNanos+o.GetCost().GetNanos() || f.GetRequests() != unitsRequests+o.GetRequests() ||
		f.GetRequests() != deployments*hours {
		t.Errorf("fleet: %d nanos, %d requests; units + others %d, %d", f.GetCost().GetNanos(), f.GetRequests(), unitsNanos+o.GetCost().GetNanos(), unitsRequests+o.GetRequests())
	}
	if o.GetDeploymentCount() != deployments-capacity.DefaultMaxUnits || len(o.GetDeployments()) != capacity.MaxMembers ||
		o.GetModelCount() != 40 || o.GetGpuTypeCount() != 2 || r.GetFleet().GetDeploymentCount() != deployments || len(r.GetFleet().GetDeployments()) != capacity.MaxMembers {
		t.Errorf("members: others %d deployments (%d listed), %d models, %d GPU types; fleet %d deployments (%d listed)", o.GetDeploymentCount(),
			len(o.GetDeployments()), o.GetModelCount(), o.GetGpuTypeCount(), r.GetFleet().GetDeploymentCount(), len(r.GetFleet().GetDeployments()))
	}
	if o.GetSustainable().GetKnown() || len(o.GetGpusNeeded()) > 0 {
		t.Errorf("others has a capacity estimate: %v", o.GetSustainable())
	}

	// max_units: up to 100, and the answer follows it.
	v.Set("max_units", "100")
	code, body = s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	var hundred meterv1.GetCapacityReportResponse
	if code != 200 || protojson.Unmarshal(body, &hundred) != nil {
		t.Fatalf("max_units=100: %d %.300s", code, body)
	}
	if h := hundred.GetReport(); len(h.GetUnits()) != 100 || h.GetUnitsInOthers() != deployments-100 || h.GetMaxUnits() != 100 ||
		h.GetOthers().GetRequests() != h.GetFleet().GetRequests()-sumRequests(h.GetUnits()) {
		t.Errorf("max_units=100: %d units, %d in others", len(h.GetUnits()), h.GetUnitsInOthers())
	}
	v.Set("max_units", "101")
	if code, body := s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil); code != 400 || !strings.Contains(string(body), "max_units 101") {
		t.Errorf("max_units=101: %d %s, want 400", code, body)
	}
	v.Del("max_units")

	// The files: one CSV row and one HTML section per listed unit, the
	// fleet and the others.
	v.Set("format", "csv")
	code, body = s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll()
	if code != 200 || err != nil || len(rows) != 1+1+capacity.DefaultMaxUnits+1 || rows[len(rows)-1][0] != capacity.OthersName {
		t.Errorf("CSV: %d, %d rows (%v), last %q", code, len(rows), err, rows[len(rows)-1][0])
	}
	v.Set("format", "html")
	code, body = s.rest(t, "GET", "/v1/reports/capacity?"+v.Encode(), testKeys["finance"], nil)
	t.Logf("HTML report: %d bytes", len(body))
	if code != 200 || bytes.Count(body, []byte(`<section class="unit"`)) != capacity.DefaultMaxUnits+2 ||
		!bytes.Contains(body, []byte("1,980 deployments beyond the 20 largest")) || len(body) > 8<<20 {
		t.Errorf("HTML: %d, %d bytes, %d sections", code, len(body), bytes.Count(body, []byte(`<section class="unit"`)))
	}

	// The hour reads are capped: the range holds 6,000 deployment-hours.
	small := query.New(s.store, query.Config{MaxSeriesRows: 5000})
	if _, err := capacity.Build(ctx, small, capacity.Query{Start: start, End: end}); !errors.Is(err, query.ErrTooManySeries) || !errors.Is(err, query.ErrInvalidQuery) {
		t.Errorf("report over 6,000 deployment-hours with a 5,000-row cap: %v, want ErrTooManySeries", err)
	}
	if _, err := small.GPUUsage(ctx, query.GPUUsageQuery{Start: start, End: end, Step: "hour", GroupBy: []string{"deployment", "gpu_type"}}); !errors.Is(err, query.ErrTooManySeries) {
		t.Errorf("GPU usage of 6,000 deployment-hours with a 5,000-row cap: %v, want ErrTooManySeries", err)
	}
	if rows, err := small.GPUUsage(ctx, query.GPUUsageQuery{Start: start, End: end, Step: "total", GroupBy: []string{"deployment"}}); err != nil || len(rows) != deployments {
		t.Errorf("GPU usage of 2,000 deployments with a 5,000-row cap: %d rows, %v", len(rows), err)
	}

	// The dashboard stays usable: the unit picker lists the fleet, the
	// units and the others, and a chart grouped by deployment draws the
	// largest series and names how many more there are.
	t.Run("dashboard", func(t *testing.T) {
		b := browsertest.New(t)
		base := "http://" + s.server.HTTPAddr()
		p := b.Open(t, base+"/ui/#tab=capacity&range=custom&start="+start.Format(time.RFC3339)+"&end="+end.Format(time.RFC3339))
		signIn(t, p, testKeys["finance"])
		waitReady(t, p)
		options := browsertest.Value(t, p, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#unit option")].map(o => o.textContent)`))
		if len(options) != capacity.DefaultMaxUnits+2 || options[len(options)-1] != "(others): 1,980 summed" {
			t.Errorf("unit picker: %d options, last %q", len(options), options[len(options)-1])
		}
		note := browsertest.Value(t, p, chromedp.Evaluate[string](`document.getElementById("capacity-note").hidden ? "" : document.getElementById("capacity-note").textContent`))
		if !strings.Contains(note, "1,980 deployments beyond the 20 largest") {
			t.Errorf("capacity note %q", note)
		}
		selectValue(t, p, "#unit", "\x00others")
		cards := dashCards(t, p, "#capacity-cards")
		checkFloat(t, cards, "cap_gpus", o.GetMeanGpus())
		if got := cards["cap_cost"]; got != o.GetCost().GetAmount() {
			t.Errorf("others' cost card %q, want %q", got, o.GetCost().GetAmount())
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-capacity-2000-deployments")

		p = b.Open(t, base+"/ui/#tab=metrics&group=deployment&range=custom&start="+start.Format(time.RFC3339)+"&end="+end.Format(time.RFC3339))
		signIn(t, p, testKeys["finance"])
		waitReady(t, p)
		legend := browsertest.Value(t, p, chromedp.Evaluate[map[string]string](`(f => ({
			series: f.dataset.series, more: f.dataset.moreSeries,
			items: String(f.querySelectorAll("ul.legend li").length),
			last: f.querySelector("ul.legend li:last-child").textContent,
			paths: String(f.querySelectorAll("path.series").length),
		}))(document.querySelector('[data-chart="traffic-requests"]'))`))
		if legend["series"] != "12" || legend["more"] != "1988" || legend["items"] != "13" || legend["paths"] != "12" ||
			legend["last"] != "and 1,988 more series, smaller at their peak, not drawn" {
			t.Errorf("requests by deployment: %v; want 12 series drawn and the legend naming 1,988 more", legend)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-2000-deployments")
	})
}

func sumRequests(units []*meterv1.CapacityUnit) uint64 {
	var n uint64
	for _, u := range units {
		n += u.GetRequests()
	}
	return n
}
