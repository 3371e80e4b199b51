package api_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
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
)

// dashTenants are the tenants of the dashboard's data; the tenant key
// reads "acme".
var dashTenants = []string{"acme", "globex", "initech"}

// dashboardDays is how far back the dashboard's data goes: three complete
// weeks and a day, so that the capacity report has a trend and a forecast.
const dashboardDays = 22

// fillDashboard writes dashboardDays of traffic and GPU samples ending now
// (every hour of the last day, the daily peak hours before): three tenants
// on two models and two deployments ("busy" with a daily peak that
// qualifies for the sustainable load and misses its SLO at the top of the
// peak from the third week, "spare" nearly idle), growing week by week, with
// failed requests of every error class outside the peaks (and OOMs of
// "spare" in them), engine samples of three replicas every minute (KV
// cache, queue, batch, prefix cache, preemptions, a restart each peak hour) and
// GPU telemetry (memory, power, temperature, clocks); then it runs the
// rollups.
// It returns the first hour of the data and its end, now: the hour in
// progress has data from its first instant, so that the page marks it as
// partial.
func fillDashboard(t *testing.T, s *stack) (first, end time.Time) {
	t.Helper()
	ctx := t.Context()
	if code, body := s.rest(t, "PUT", "/v1/admin/price-book", testKeys["admin"], []byte(prices)); code != 200 {
		t.Fatalf("PUT price book: %d %s", code, body)
	}
	end = time.Now().UTC()
	start := end.Truncate(time.Hour).Add(-dashboardDays * 24 * time.Hour)
	var events chstore.EventBatch
	var gpus chstore.GPUBatch
	var engines chstore.EngineBatch
	id := 0
	full := end.Truncate(time.Hour).Add(-26 * time.Hour)
	for at := start; at.Before(end); at = at.Add(time.Hour) {
		week := int(at.Sub(start) / (7 * 24 * time.Hour))
		n := 12 + 2*week
		peak := at.Hour() >= 15 && at.Hour() < 18
		if !peak && at.Before(full) {
			// Before the last day only the daily peaks: they make the
			// trend, and fewer hours keep the rollup short.
			continue
		}
		if peak {
			n = 110 + 25*week + 10*(at.Hour()-15)
		}
		for i := range n {
			completed := at.Add(time.Duration(i) * time.Hour / time.Duration(n))
			if !completed.Before(end) {
				break
			}
			id++
			ttft := 80.0 + float64(i%7)*10
			if peak && at.Hour() == 17 && week >= 2 && i%10 == 0 {
				ttft = 900 // over the interactive SLO at the top of the peak
			}
			e := &meterv1.InferenceEvent{
				EventId: fmt.Sprintf("dash-%d", id), TenantId: dashTenants[i%3], Model: []string{"m1", "m2"}[(i/3)%2],
				Deployment:   "busy",
				CompletedAt:  timestamppb.New(completed),
				PromptTokens: proto.Int64(int64(200 + i%50)), CachedPromptTokens: proto.Int64(int64(i % 20)), OutputTokens: proto.Int64(int64(40 + i%30)),
				TtftMs: proto.Float64(ttft), E2EMs: proto.Float64(ttft + 40*float64(40+i%30)),
				QueueMs: proto.Float64(float64(5 + i%4*5)), PrefillMs: proto.Float64(ttft - 20),
				Status: meterv1.Status_STATUS_OK,
			}
			if i%5 == 4 {
				e.Deployment = "spare"
			}
			if !peak {
				switch {
				case i%7 == 3:
					e.Status = meterv1.Status_STATUS_TIMEOUT
				case i%11 == 2:
					e.Status = meterv1.Status_STATUS_OOM
				case i%13 == 6:
					e.Status = meterv1.Status_STATUS_CONTEXT_LENGTH
				case i%17 == 9:
					e.Status = meterv1.Status_STATUS_RATE_LIMITED
				case i%19 == 11:
					e.Status = meterv1.Status_STATUS_CUDA
				}
			} else if i%15 == 9 { // spare's: busy's peaks keep their attainment
				e.Status = meterv1.Status_STATUS_OOM
			}
			events.Append(e, ingest.ITL(e), time.Now(), sink.Source{})
		}
		util := 0.25
		if peak {
			util = 0.85
		}
		for k := range 60 {
			sampled := at.Add(time.Duration(k) * time.Minute)
			if !sampled.Before(end) {
				break
			}
			for g, dep := range []string{"busy", "busy", "spare"} {
				u := util
				if dep == "spare" {
					u = 0.03
				}
				clock := 1980.0
				if u > 0.8 {
					clock = 1500 // throttled at the peak
				}
				gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprint(sampled.Unix(), "-", g), GpuUuid: fmt.Sprint("GPU-", g), GpuType: "H100", Deployment: dep,
					SampledAt: timestamppb.New(sampled), IntervalS: 60, Utilization: u,
					FbTotalBytes: 80e9, FbUsedBytes: uint64((0.3 + 0.6*u + 0.001*float64(k%10)) * 80e9),
					PowerWatts: 100 + 500*u + float64(k%7), TemperatureC: 40 + 40*u + float64(k%5), SmClockMhz: clock, SmClockMaxMhz: 1980}, time.Now())
			}
			for r, dep := range []string{"busy", "busy", "spare"} {
				engines.Append(dashEngineSample(dep, r, sampled, k, peak), time.Now())
			}
		}
	}
	if err := s.store.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	if err := s.store.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	if err := s.store.InsertEngineSamples(ctx, &engines); err != nil {
		t.Fatal(err)
	}
	billingtest.RollUp(t, s.store)
	return start, end
}

// dashEngineSample is replica r's engine sample of minute k of an hour,
// taken at sampled: the busy deployment's two replicas queue, batch and
// fill their KV cache more at the peak, and preempt there; the second
// restarts at half past every peak hour (so the capacity report's peak
// hour has one); spare idles.
func dashEngineSample(dep string, r int, sampled time.Time, k int, peak bool) *meterv1.EngineSample {
	m := &meterv1.EngineSample{SampleId: fmt.Sprint(sampled.Unix(), "-", r), Deployment: dep, Engine: "vllm", Replica: fmt.Sprint(dep, "-", r), Model: "m1",
		SampledAt: timestamppb.New(sampled), IntervalS: 60, Source: "scrape"}
	var running, waiting uint32
	var kv float64
	queries := uint64(1000 + 10*k)
	hits := queries * 6 / 10
	var preempted uint64
	switch {
	case dep == "spare":
		running, kv, queries, hits = 1, 0.05+0.001*float64(k%10), 100, 50
	case peak:
		running, waiting, kv, hits = uint32(24+k%5+r), uint32((k*7+r)%13), 0.7+0.01*float64(k%20), queries*3/10
		if k%10 == 0 {
			preempted = 2
		}
	default:
		running, waiting, kv = uint32(8+k%5+r), uint32(k%3/2), 0.3+0.01*float64(k%20)
	}
	m.Running, m.Waiting, m.KvCacheUsage = proto.Uint32(running), proto.Uint32(waiting), proto.Float64(kv)
	m.PrefixCacheQueries, m.PrefixCacheHits, m.Preemptions = proto.Uint64(queries), proto.Uint64(hits), proto.Uint64(preempted)
	if dep == "busy" && r == 1 && peak && k == 30 {
		m.Restarts = proto.Uint32(1)
	}
	if dep != "spare" {
		// tokens in the running batch: about 512 a running request
		m.BatchTokens = proto.Float64(float64(512*running + uint32(k)))
	}
	return m
}

// TestDashboard opens the dashboard in a real headless Chromium against
// the real API over loopback and real ClickHouse rollups: the cards must
// show the API's own numbers for the page's range, every chart must have
// data points, a tenant key must see only its tenant, and no page may log
// an error. One database and one browser serve every subtest; each writes
// a screenshot.
func TestDashboard(t *testing.T) {
	b := browsertest.New(t)
	s := newStack(t, false)
	began := time.Now()
	first, last := fillDashboard(t, s)
	t.Logf("data written and rolled up in %v", time.Since(began).Round(time.Millisecond))
	base := "http://" + s.server.HTTPAddr()

	t.Run("files", func(t *testing.T) {
		for _, c := range []struct {
			path, key   string
			code        int
			contentType string
			body        string
		}{
			{"/ui/", "", 200, "text/html", `<script type="module" src="js/app.js">`},
			{"/ui/js/app.js", "", 200, "text/javascript", "document.body.dataset.state"},
			{"/ui/style.css", "", 200, "text/css", ".card"},
			{"/ui/session", "", 401, "application/json", "missing authorization"},
			{"/ui/session", "wrong", 401, "application/json", "unknown API key"},
			{"/ui/session", testKeys["tenant"], 200, "application/json", `{"name":"tenant","role":"tenant","tenant_id":"acme"}`},
			{"/ui/session", testKeys["finance"], 200, "application/json", `{"name":"finance","role":"finance"}`},
			{"/ui/nothing.js", "", 404, "text/plain", "404"},
		} {
			code, header, body := get(t, base+c.path, c.key)
			if code != c.code || !strings.HasPrefix(header.Get("Content-Type"), c.contentType) || !strings.Contains(body, c.body) {
				t.Errorf("GET %s (key %q) = %d %s %.80q, want %d %s containing %q", c.path, c.key, code, header.Get("Content-Type"), body, c.code, c.contentType, c.body)
			}
			if csp := header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
				t.Errorf("GET %s: Content-Security-Policy %q, want script-src 'self'", c.path, csp)
			}
		}
		noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err := noRedirect.Get(base + "/ui")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/ui/" {
			t.Errorf("GET /ui = %d to %q, want 301 to /ui/", res.StatusCode, res.Header.Get("Location"))
		}
	})

	t.Run("admin", func(t *testing.T) {
		p := b.Open(t, base+"/ui/")
		signIn(t, p, testKeys["admin"])
		waitReady(t, p)
		rg := pageRange(t, p)
		checkMetricCards(t, p, base, testKeys["admin"], rg, "", 0)
		checkEngineCards(t, p, base, testKeys["admin"], rg, "")
		checkMetricCharts(t, p, base, testKeys["admin"], rg, "")
		counts := chartPoints(t, p, "#metric-charts")
		// Exact counts where the API says how many points there are.
		var traffic meterv1.GetTrafficResponse
		apiGet(t, base, testKeys["admin"], "/v1/traffic", rg.metrics(), &traffic)
		if got, want := counts["traffic-requests"], len(traffic.Series[0].Points); got != want {
			t.Errorf("traffic-requests chart has %d points, want %d (the API's steps)", got, want)
		}
		if got, want := counts["traffic-tokens"], 2*len(traffic.Series[0].Points); got != want {
			t.Errorf("traffic-tokens chart has %d points, want %d (input and output per step)", got, want)
		}
		var gpu meterv1.GetGpuUsageResponse
		apiGet(t, base, testKeys["admin"], "/v1/gpu-usage", rg.hours(), &gpu)
		if got, want := counts["cost-busy-idle"], 2*len(gpu.Series[0].Points); got != want {
			t.Errorf("cost-busy-idle chart has %d bars, want %d (busy and idle per hour)", got, want)
		}
		// Hover: the values of the nearest step.
		p.Run(t, chromedp.ScrollIntoView(chromedp.CSS(`[data-chart="traffic-requests"]`)))
		xy := browsertest.Value(t, p, chromedp.Evaluate[[2]float64](
			`(() => { const r = document.querySelector('[data-chart="traffic-requests"] rect.overlay').getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()`))
		p.Run(t, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, xy[0], xy[1]))
		tip := browsertest.Value(t, p, chromedp.Evaluate[string](`(e => e.hidden ? "" : e.textContent)(document.getElementById("tooltip"))`))
		if !strings.Contains(tip, "all: ") || !strings.Contains(tip, "req/s") {
			t.Errorf("tooltip over the requests chart = %q, want the step's rate", tip)
		}
		checkSharedHover(t, p, "#metric-charts", "traffic-requests")
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-admin")

		// Grouped by model: one line per model, the cards unchanged.
		selectValue(t, p, "#group", "model")
		waitReady(t, p)
		checkMetricCards(t, p, base, testKeys["admin"], rg, "", 0)
		series := browsertest.Value(t, p, chromedp.Evaluate[[]string](
			`[...new Set([...document.querySelectorAll('[data-chart="latency-ttft"] circle.pt')].map(c => c.dataset.series))].sort()`))
		if !slices.Equal(series, []string{"m1", "m2"}) {
			t.Errorf("latency chart grouped by model has series %q, want [m1 m2]", series)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-by-model")

		// The first page's time: a reload with the key in the session,
		// from navigation to everything drawn.
		p.Run(t, chromedp.Reload())
		waitReady(t, p)
		ms := browsertest.Value(t, p, chromedp.Evaluate[string](`document.body.dataset.readyMs`))
		t.Logf("first page (last 24 h: %d requests; grouped by model) drawn %s ms after navigation", traffic.Series[0].Summary.GetRequests(), ms)
		selectValue(t, p, "#group", "")
		waitReady(t, p)
		p.Run(t, chromedp.Reload())
		waitReady(t, p)
		ms = browsertest.Value(t, p, chromedp.Evaluate[string](`document.body.dataset.readyMs`))
		t.Logf("first page (ungrouped, admin) drawn %s ms after navigation", ms)

		// A custom range of whole hours: metrics and cost over the same hours.
		selectValue(t, p, "#range", "custom")
		end := time.Now().UTC().Truncate(time.Hour)
		start := end.Add(-6 * time.Hour)
		browsertest.Value(t, p, chromedp.Evaluate[bool](fmt.Sprintf(
			`document.getElementById("start").value = %q; document.getElementById("end").value = %q; true`,
			start.Format("2006-01-02T15:04"), end.Format("2006-01-02T15:04"))))
		p.Run(t, chromedp.Click(chromedp.CSS(`#controls button[type="submit"]`)))
		waitReady(t, p)
		rg = pageRange(t, p)
		if want := (dashRange{start.Format(time.RFC3339), end.Format(time.RFC3339), start.Format(time.RFC3339), end.Format(time.RFC3339), "hour"}); rg != want {
			t.Errorf("custom range: page used %+v, want %+v", rg, want)
		}
		checkMetricCards(t, p, base, testKeys["admin"], rg, "", 0)
		if got := chartPoints(t, p, "#metric-charts")["traffic-requests"]; got != 6 {
			t.Errorf("custom range of 6 hours: traffic chart has %d points, want 6", got)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-custom-range")

		// The page's arithmetic: steps by range, exact counts and money.
		got := browsertest.Value(t, p, chromedp.Evaluate[[]string](`(async () => {
			const a = await import("./js/api.js");
			const f = await import("./js/format.js");
			const H = 3600e3;
			return [a.stepFor(0, 2 * H), a.stepFor(0, 2 * H + 60e3), a.stepFor(0, 168 * H), a.stepFor(0, 169 * H),
				f.count("18446744073709551615"), f.count("0"),
				f.moneySum([{nanos: "9007199254740993"}, {nanos: "1"}, {nanos: "-5"}], "USD").amount, f.nanosAmount(-5n)];
		})()`, chromedp.EvalAwaitPromise))
		wantMath := []string{"minute", "hour", "hour", "day", "18,446,744,073,709,551,615", "0", "9007199.254740989", "-0.000000005"}
		if !slices.Equal(got, wantMath) {
			t.Errorf("page arithmetic = %q, want %q", got, wantMath)
		}
	})

	t.Run("deployment", func(t *testing.T) {
		// The picker narrows every panel to one deployment: each card and
		// chart is the API's series of that deployment.
		p := b.Open(t, base+"/ui/")
		signIn(t, p, testKeys["admin"])
		waitReady(t, p)
		rg := pageRange(t, p)
		all := dashCards(t, p, "#metric-cards")
		choices := browsertest.Value(t, p, chromedp.Poll[[]string](
			`(o => o.length > 1 ? o : false)([...document.querySelectorAll("#deployment option")].map(o => o.value))`,
			chromedp.WithPollingTimeout(20*time.Second)))
		if !slices.Equal(choices, []string{"", "busy", "spare"}) {
			t.Errorf("deployment picker offers %q, want all, busy, spare", choices)
		}
		for _, dep := range []string{"busy", "spare"} {
			selectValue(t, p, "#deployment", dep)
			waitReady(t, p)
			if h := browsertest.Value(t, p, chromedp.Evaluate[string](`location.hash`)); !strings.Contains(h, "deployment="+dep) {
				t.Errorf("page fragment %q does not keep the deployment %s", h, dep)
			}
			checkMetricCards(t, p, base, testKeys["admin"], rg, dep, 0)
			checkEngineCards(t, p, base, testKeys["admin"], rg, dep)
			checkMetricCharts(t, p, base, testKeys["admin"], rg, dep)
			cards := dashCards(t, p, "#metric-cards")
			for _, name := range []string{"requests", "input_tokens", "kv_cache_mean", "running_mean"} {
				if cards[name] == all[name] {
					t.Errorf("deployment %s: card %s = %s, as for all deployments: the picker did not narrow it", dep, name, cards[name])
				}
			}
			noErrors(t, p)
			p.Screenshot(t, "dashboard-metrics-deployment-"+dep)
		}
		// Grouped by model within one deployment: one line per model, all
		// of busy; the cards still the deployment's.
		selectValue(t, p, "#deployment", "busy")
		waitReady(t, p)
		selectValue(t, p, "#group", "model")
		waitReady(t, p)
		checkMetricCards(t, p, base, testKeys["admin"], rg, "busy", 0)
		checkEngineCards(t, p, base, testKeys["admin"], rg, "busy")
		series := browsertest.Value(t, p, chromedp.Evaluate[[]string](
			`[...new Set([...document.querySelectorAll('[data-chart="traffic-requests"] circle.pt')].map(c => c.dataset.series))].sort()`))
		if !slices.Equal(series, []string{"m1", "m2"}) {
			t.Errorf("busy grouped by model: traffic series %q, want [m1 m2]", series)
		}
		var traffic meterv1.GetTrafficResponse
		apiGet(t, base, testKeys["admin"], "/v1/traffic", withParams(rg.metrics(), "group_by", "deployment,model"), &traffic)
		var want int
		for _, sr := range traffic.Series {
			if sr.Group["deployment"] == "busy" {
				want += len(sr.Points)
			}
		}
		if got := chartPoints(t, p, "#metric-charts")["traffic-requests"]; got != want {
			t.Errorf("busy grouped by model: traffic chart has %d points, want %d (busy's steps of m1 and m2)", got, want)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-deployment-busy-by-model")
	})

	t.Run("finance", func(t *testing.T) {
		p := b.Open(t, base+"/ui/")
		signIn(t, p, testKeys["finance"])
		waitReady(t, p)
		p.Run(t, chromedp.Click(chromedp.CSS("#tab-finance")))
		waitReady(t, p)
		rg := pageRange(t, p)
		var cost meterv1.GetCostResponse
		apiGet(t, base, testKeys["finance"], "/v1/cost", withParams(rg.hours(), "group_by", "tenant_id"), &cost)
		var total, idle, list int64
		lines := 0
		for _, sr := range cost.Series {
			total += sr.Summary.GetCost().GetNanos()
			list += sr.Summary.GetListCharge().GetNanos()
			if sr.Group["tenant_id"] == "__idle__" {
				idle += sr.Summary.GetCost().GetNanos()
			}
			lines++
		}
		if idle == 0 {
			t.Fatalf("the API's cost by tenant has no __idle__ line: the fixture should idle")
		}
		if list == 0 {
			t.Errorf("the API's cost by tenant has no usage at list prices: the fixture's model m1 has a list price")
		}
		cards := dashCards(t, p, "#finance-cards")
		for name, want := range map[string]int64{"finance_cost": total, "finance_idle": idle, "finance_allocated": total - idle, "finance_list_charge": list} {
			if got := cards[name]; got != nanosAmount(want) {
				t.Errorf("card %s = %q, want %q (the API's sum)", name, got, nanosAmount(want))
			}
		}
		tenants := browsertest.Value(t, p, chromedp.Evaluate[[]string](
			`[...document.querySelectorAll('#finance-charts td[data-cell="tenant"]')].map(td => td.dataset.value).sort()`))
		want := append(slices.Clone(dashTenants), "__idle__")
		slices.Sort(want)
		if !slices.Equal(tenants, want) {
			t.Errorf("cost table tenants = %q, want %q", tenants, want)
		}
		counts := chartPoints(t, p, "#finance-charts")
		checkCharts(t, counts, []string{"finance-cost-by-tenant", "finance-cost-over-time", "finance-idle-by-deployment"})
		if got, want := counts["finance-cost-by-tenant"], 2*lines; got != want {
			t.Errorf("cost by tenant has %d bars, want %d (busy and idle per line)", got, want)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-finance")
	})

	t.Run("capacity", func(t *testing.T) {
		// The whole weeks of the data: the report has a trend and a forecast.
		end := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		p := b.Open(t, base+"/ui/#tab=capacity&range=custom&start="+first.Format(time.RFC3339)+"&end="+end.Format(time.RFC3339))
		signIn(t, p, testKeys["finance"])
		waitReady(t, p)
		rg := pageRange(t, p)
		var answer meterv1.GetCapacityReportResponse
		apiGet(t, base, testKeys["finance"], "/v1/reports/capacity", url.Values{"start": {rg.HourStart}, "end": {rg.HourEnd}}, &answer)
		fleet := answer.GetReport().GetFleet()
		cards := dashCards(t, p, "#capacity-cards")
		checkFloat(t, cards, "cap_utilization", fleet.GetUtilization())
		checkFloat(t, cards, "cap_gpus", fleet.GetMeanGpus())
		checkFloat(t, cards, "cap_tokens_per_gpu", fleet.GetTokensPerSecondPerGpu())
		if got, want := cards["cap_cost"], fleet.GetCost().GetAmount(); got != want {
			t.Errorf("card cap_cost = %q, want %q", got, want)
		}
		if fleet.GetTrend().GetForecast() == nil {
			t.Fatalf("the fixture's fleet has no forecast: %s", fleet.GetTrend().GetReason())
		}
		checkCapacityTelemetry(t, p, fleet)
		counts := chartPoints(t, p, "#capacity-charts")
		checkCharts(t, counts, capacityCharts)
		if got := counts["capacity-heatmap"]; got != 7*24 {
			t.Errorf("heat map has %d cells, want %d", got, 7*24)
		}
		if got, want := counts["capacity-cost-days"], 2*len(fleet.GetDays()); got != want {
			t.Errorf("cost per day has %d bars, want %d", got, want)
		}
		nFindings := browsertest.Value(t, p, chromedp.Evaluate[int](`document.querySelectorAll('#findings li').length`))
		if nFindings != len(answer.GetReport().GetFindings()) {
			t.Errorf("page lists %d findings, the report has %d", nFindings, len(answer.GetReport().GetFindings()))
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-capacity")

		// One deployment of the report, with its sustainable load marked.
		var busy *meterv1.CapacityUnit
		for _, u := range answer.GetReport().GetUnits() {
			if u.GetName() == "busy" {
				busy = u
			}
		}
		if !busy.GetSustainable().GetKnown() {
			t.Fatalf("the fixture's deployment busy has no sustainable load: %s", busy.GetSustainable().GetReason())
		}
		selectValue(t, p, "#unit", "busy")
		cards = dashCards(t, p, "#capacity-cards")
		checkFloat(t, cards, "cap_utilization", busy.GetUtilization())
		checkFloat(t, cards, "cap_sustainable", busy.GetSustainable().GetTokensPerSecondPerGpu())
		checkFloat(t, cards, "cap_headroom", busy.GetHeadroom())
		checkCapacityTelemetry(t, p, busy)
		counts = chartPoints(t, p, "#capacity-charts")
		checkCharts(t, counts, capacityCharts)
		checkSharedHover(t, p, "#capacity-charts", "capacity-gpu-memory")
		rings := browsertest.Value(t, p, chromedp.Evaluate[int](`document.querySelectorAll('[data-chart="capacity-attainment"] circle.sustainable').length`))
		if rings != 1 {
			t.Errorf("attainment chart marks %d sustainable points, want 1", rings)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-capacity-busy")

		// The same report as files, fetched with the key and saved.
		dir := p.AllowDownloads(t)
		for _, c := range []struct{ button, ext, has string }{
			{"#download-csv", ".csv", "name,deployments,models"},
			{"#download-html", ".html", "<svg"},
		} {
			browsertest.Value(t, p, chromedp.Evaluate[bool](`delete document.body.dataset.downloaded; true`))
			p.Run(t, chromedp.Click(chromedp.CSS(c.button)))
			name := browsertest.Value(t, p, chromedp.Poll[string](`document.body.dataset.downloaded || false`, chromedp.WithPollingTimeout(20*time.Second)))
			if !strings.HasPrefix(name, "capacity-") || !strings.HasSuffix(name, c.ext) {
				t.Errorf("%s saved %q, want capacity-…%s", c.button, name, c.ext)
			}
			data := waitFile(t, filepath.Join(dir, name))
			if !strings.Contains(data, c.has) {
				t.Errorf("%s: %s holds %.100q…, want %q in it", c.button, name, data, c.has)
			}
		}
		noErrors(t, p)
	})

	t.Run("tenant", func(t *testing.T) {
		p := b.Open(t, base+"/ui/")
		signIn(t, p, testKeys["tenant"])
		waitReady(t, p)
		rg := pageRange(t, p)
		var adminUsage, tenantUsage meterv1.GetUsageResponse
		apiGet(t, base, testKeys["admin"], "/v1/usage", withParams(rg.sel(), "granularity", "total"), &adminUsage)
		apiGet(t, base, testKeys["tenant"], "/v1/usage", withParams(rg.sel(), "granularity", "total"), &tenantUsage)
		all := adminUsage.Buckets[0].GetRequests()
		checkMetricCards(t, p, base, testKeys["tenant"], rg, "", all)

		hidden := browsertest.Value(t, p, chromedp.Evaluate[[]bool](
			`["tab-finance", "tab-capacity", "tenant-label"].map(id => document.getElementById(id).hidden)`))
		if !slices.Equal(hidden, []bool{true, true, true}) {
			t.Errorf("finance tab, capacity tab, tenant filter hidden = %v, want all hidden", hidden)
		}
		counts := chartPoints(t, p, "#metric-charts")
		checkCharts(t, counts, []string{"latency-ttft", "latency-itl", "latency-e2e", "traffic-requests", "traffic-tokens", "traffic-errors",
			"goodput-attainment", "goodput-tokens"})
		if _, ok := counts["gpu-utilization"]; ok {
			t.Errorf("a tenant's page shows the fleet's GPU utilization")
		}
		// The provider's cost is the operator's (no --tenant-cost here).
		if _, ok := counts["cost-busy-idle"]; ok {
			t.Errorf("a tenant's page shows its allocated GPU cost")
		}
		// Grouped by tenant, the only group is the key's own (the phases
		// of latency are drawn ungrouped).
		selectValue(t, p, "#group", "tenant_id")
		waitReady(t, p)
		series := browsertest.Value(t, p, chromedp.Evaluate[[]string](
			`[...new Set([...document.querySelectorAll('#metric-charts figure:not([data-chart="latency-breakdown"]) circle.pt')].map(c => c.dataset.series))].sort()`))
		if !slices.Equal(series, []string{"acme"}) {
			t.Errorf("a tenant's page grouped by tenant has series %q, want [acme]", series)
		}
		text := browsertest.Value(t, p, chromedp.Evaluate[string](`document.body.innerText + document.body.innerHTML`))
		for _, other := range dashTenants[1:] {
			if strings.Contains(text, other) {
				t.Errorf("a tenant's page names tenant %q", other)
			}
		}
		// A finance view asked for by URL is not offered.
		browsertest.Value(t, p, chromedp.Evaluate[bool](`location.hash = "#tab=finance"; true`))
		p.Run(t, chromedp.Reload())
		waitReady(t, p)
		if tab := browsertest.Value(t, p, chromedp.Evaluate[string](`location.hash`)); !strings.Contains(tab, "tab=metrics") {
			t.Errorf("a tenant's page opened %q, want the metrics tab", tab)
		}
		noErrors(t, p)
		p.Screenshot(t, "dashboard-metrics-tenant")
	})

	t.Run("layout", func(t *testing.T) {
		dashboardLayout(t, b, base, first, last)
	})

	t.Run("keys", func(t *testing.T) {
		p := b.Open(t, base+"/ui/")
		// An unknown key: a clear message, no console error, the form again.
		signIn(t, p, "not-a-key")
		waitState(t, p, "signed-out")
		msg := browsertest.Value(t, p, chromedp.Evaluate[string](`document.getElementById("message").textContent`))
		if !strings.Contains(msg, "The API key was not accepted") || !strings.Contains(msg, "unknown API key") {
			t.Errorf("message for an unknown key = %q", msg)
		}
		// The only error is the 401 answer itself.
		for _, e := range p.Errors() {
			if !strings.HasPrefix(e, "HTTP 401") || !strings.Contains(e, "/ui/session") {
				t.Errorf("page error %q, want only the 401 of /ui/session", e)
			}
		}
		p.Screenshot(t, "dashboard-bad-key")
		// An ingest key may not read.
		signIn(t, p, testKeys["ingest"])
		waitState(t, p, "signed-out")
		msg = browsertest.Value(t, p, chromedp.Evaluate[string](`document.getElementById("message").textContent`))
		if !strings.Contains(msg, "role ingest") {
			t.Errorf("message for an ingest key = %q", msg)
		}
		// Sign in, then out: the key leaves the session.
		signIn(t, p, testKeys["admin"])
		waitReady(t, p)
		p.Run(t, chromedp.Click(chromedp.CSS("#sign-out")))
		waitState(t, p, "signed-out")
		if key := browsertest.Value(t, p, chromedp.Evaluate[string](`sessionStorage.getItem("tokenmeter.key") || ""`)); key != "" {
			t.Errorf("after sign out the session holds key %q", key)
		}
	})
}

// capacityCharts are the charts of the capacity tab.
var capacityCharts = []string{"capacity-attainment", "capacity-utilization", "capacity-heatmap", "capacity-cost-days", "capacity-forecast",
	"capacity-gpu-utilization", "capacity-gpu-memory", "capacity-gpu-power", "capacity-gpu-temperature"}

// checkCapacityTelemetry compares the capacity tab's GPU telemetry cards
// and charts with unit u of the report: memory, power, temperature and
// clock throttling over the range, and hour by hour beside utilization.
func checkCapacityTelemetry(t *testing.T, p *browsertest.Page, u *meterv1.CapacityUnit) {
	t.Helper()
	g := u.GetGpuTelemetry()
	if g.GetMemoryHours() == 0 || g.GetPowerHours() == 0 || g.GetTemperatureHours() == 0 || g.GetClockHours() == 0 {
		t.Errorf("unit %s: GPU telemetry %v: the fixture's samples carry memory, power, temperature and clocks", u.GetName(), g)
	}
	cards := dashCards(t, p, "#capacity-cards")
	checkFloat(t, cards, "cap_memory", g.GetMemoryUsedRatio())
	checkFloat(t, cards, "cap_power", g.GetPowerMeanWatts())
	checkFloat(t, cards, "cap_temperature", g.GetTemperatureMaxC())
	checkFloat(t, cards, "cap_throttle", g.GetClockThrottleShare())
	util := map[string]seriesOf{u.GetName(): {}}
	mem := map[string]seriesOf{"mean": {}, "max": {}}
	power := map[string]seriesOf{"mean": {}, "max": {}}
	temp := map[string]seriesOf{"mean": {}, "max": {}}
	for _, h := range u.GetHoursDetail() {
		if h.GetGpus() <= 0 {
			continue
		}
		at, tel := h.GetStart().AsTime().UnixMilli(), h.GetGpuTelemetry()
		util[u.GetName()][at] = h.GetUtilization()
		if tel.GetMemoryHours() > 0 {
			mem["mean"][at], mem["max"][at] = tel.GetMemoryUsedRatio(), tel.GetMemoryUsedMaxRatio()
		}
		if tel.GetPowerHours() > 0 {
			power["mean"][at], power["max"][at] = tel.GetPowerMeanWatts(), tel.GetPowerMaxWatts()
		}
		if tel.GetTemperatureHours() > 0 {
			temp["mean"][at], temp["max"][at] = tel.GetTemperatureMeanC(), tel.GetTemperatureMaxC()
		}
	}
	got := chartValues(t, p, "#capacity-charts")
	checkChart(t, got, "capacity-gpu-utilization", util)
	checkChart(t, got, "capacity-gpu-memory", mem)
	checkChart(t, got, "capacity-gpu-power", power)
	checkChart(t, got, "capacity-gpu-temperature", temp)
}

// waitFile waits for a download to be complete and returns its text.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Chromium writes NAME.crdownload and renames it when done.
		if data, err := os.ReadFile(path); err == nil && len(data) > 0 {
			return string(data)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no download %s", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// signIn enters key in the sign-in form and submits it.
func signIn(t *testing.T, p *browsertest.Page, key string) {
	t.Helper()
	p.Run(t,
		chromedp.WaitVisible(chromedp.CSS("#key")),
		chromedp.SendKeys(chromedp.CSS("#key"), key),
		chromedp.Click(chromedp.CSS(`#sign-in-form button[type="submit"]`)),
	)
}

// waitState waits until the page's state is want; "error" ends the wait
// at once with the page's messages.
func waitState(t *testing.T, p *browsertest.Page, want string) {
	t.Helper()
	got := browsertest.Value(t, p, chromedp.Poll[string](fmt.Sprintf(
		`(() => { const s = document.body.dataset.state; return (s === %q || s === "error") ? s : false; })()`, want),
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(45*time.Second)))
	if got != want {
		msgs := browsertest.Value(t, p, chromedp.Evaluate[string](
			`[document.getElementById("message").textContent, ...[...document.querySelectorAll(".panel-error")].map(e => e.textContent)].join(" | ")`))
		t.Fatalf("page state %q, want %q; messages: %s; page errors: %q", got, want, msgs, p.Errors())
	}
}

func waitReady(t *testing.T, p *browsertest.Page) {
	t.Helper()
	waitState(t, p, "ready")
}

func noErrors(t *testing.T, p *browsertest.Page) {
	t.Helper()
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
}

// selectValue picks an option of a select element as a person would.
func selectValue(t *testing.T, p *browsertest.Page, sel, value string) {
	t.Helper()
	p.Run(t, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](fmt.Sprintf(
			`(() => { const e = document.querySelector(%q); e.value = %q; e.dispatchEvent(new Event("change")); return true; })()`, sel, value))(ctx, tg)
		return err
	}))
}

// dashRange is the range the page used, from its body's data attributes.
type dashRange struct {
	Start, End, HourStart, HourEnd, Step string
}

func pageRange(t *testing.T, p *browsertest.Page) dashRange {
	t.Helper()
	d := browsertest.Value(t, p, chromedp.Evaluate[map[string]string](`({...document.body.dataset})`))
	r := dashRange{Start: d["start"], End: d["end"], HourStart: d["hourStart"], HourEnd: d["hourEnd"], Step: d["step"]}
	if r.Start == "" || r.HourStart == "" || r.Step == "" {
		t.Fatalf("page range %v: incomplete", d)
	}
	return r
}

func (r dashRange) sel() url.Values { return url.Values{"start": {r.Start}, "end": {r.End}} }
func (r dashRange) metrics() url.Values {
	return url.Values{"start": {r.Start}, "end": {r.End}, "step": {r.Step}}
}
func (r dashRange) hours() url.Values {
	step := r.Step
	if step == "minute" {
		step = "hour"
	}
	return url.Values{"start": {r.HourStart}, "end": {r.HourEnd}, "step": {step}}
}

func withParams(v url.Values, kv ...string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = vs
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Set(kv[i], kv[i+1])
	}
	return out
}

// dashCards returns the data-value of every data-card under sel.
func dashCards(t *testing.T, p *browsertest.Page, sel string) map[string]string {
	t.Helper()
	return browsertest.Value(t, p, chromedp.Evaluate[map[string]string](fmt.Sprintf(
		`Object.fromEntries([...document.querySelectorAll(%q)].map(e => [e.dataset.card, e.dataset.value]))`, sel+" [data-card]")))
}

// chartPoints counts the data points drawn in every chart under sel.
func chartPoints(t *testing.T, p *browsertest.Page, sel string) map[string]int {
	t.Helper()
	return browsertest.Value(t, p, chromedp.Evaluate[map[string]int](fmt.Sprintf(
		`Object.fromEntries([...document.querySelectorAll(%q)].map(f => [f.dataset.chart, f.querySelectorAll("circle.pt, rect.bar, rect.cell").length]))`, sel+" figure.chart")))
}

func checkCharts(t *testing.T, counts map[string]int, want []string) {
	t.Helper()
	for _, name := range want {
		n, ok := counts[name]
		switch {
		case !ok:
			t.Errorf("chart %s missing (charts: %v)", name, counts)
		case n == 0:
			t.Errorf("chart %s has no data points", name)
		}
	}
}

// checkMetricCards compares the metrics tab's cards with the API's answers
// for the page's range, read with key: of deployment dep ("": all; the
// API's series of dep grouped by deployment). more > 0 is the requests of
// every tenant, which a tenant's page must show fewer of.
func checkMetricCards(t *testing.T, p *browsertest.Page, base, key string, rg dashRange, dep string, more int64) {
	t.Helper()
	cards := dashCards(t, p, "#metric-cards")
	byDep := func(q url.Values) url.Values {
		if dep == "" {
			return q
		}
		return withParams(q, "group_by", "deployment")
	}
	var usage meterv1.GetUsageResponse
	apiGet(t, base, key, "/v1/usage", byDep(withParams(rg.sel(), "granularity", "total")), &usage)
	var u *meterv1.UsageBucket
	for _, b := range usage.Buckets {
		if b.GetDeployment() == dep {
			u = b
		}
	}
	if u == nil {
		t.Fatalf("usage has no bucket of deployment %q (%d buckets)", dep, len(usage.Buckets))
	}
	for name, want := range map[string]int64{"requests": u.GetRequests(), "input_tokens": u.GetPromptTokens(), "output_tokens": u.GetOutputTokens()} {
		if got := cards[name]; got != strconv.FormatInt(want, 10) {
			t.Errorf("card %s = %q, want %d", name, got, want)
		}
	}
	if more > 0 && u.GetRequests() >= more {
		t.Errorf("the page's key sees %d requests, as many as all tenants' %d", u.GetRequests(), more)
	}
	var lat meterv1.GetLatencyResponse
	apiGet(t, base, key, "/v1/latency", byDep(rg.metrics()), &lat)
	sum := pick(t, lat.Series, dep).GetSummary()
	for m, st := range map[string]*meterv1.LatencyStats{"ttft": sum.Ttft, "itl": sum.Itl, "e2e": sum.E2E} {
		checkFloat(t, cards, m+"_p50", st.GetP50())
		checkFloat(t, cards, m+"_p95", st.GetP95())
		checkFloat(t, cards, m+"_p99", st.GetP99())
		checkFloat(t, cards, m+"_tail_ratio", st.GetTailRatio())
		checkFloat(t, cards, m+"_max_p99", st.GetMaxP99())
		if m == "ttft" && (st.GetTailRatio() <= 1 || st.GetMaxP99() <= 0) {
			t.Errorf("the API's %s tail ratio %v, max p99 %v: the fixture should have a tail", m, st.GetTailRatio(), st.GetMaxP99())
		}
	}
	for m, st := range map[string]*meterv1.LatencyStats{"queue": sum.Queue, "prefill": sum.Prefill, "decode": sum.Decode} {
		// Prefill is kept for every tenant together only: a tenant's page
		// shows none (the card "–", raw 0).
		if st.GetCount() == 0 && (m != "prefill" || more == 0) {
			t.Errorf("the API's %s latency has no requests: the fixture's events carry it", m)
		}
		checkFloat(t, cards, m+"_p50", st.GetP50())
	}
	var traffic meterv1.GetTrafficResponse
	apiGet(t, base, key, "/v1/traffic", byDep(rg.metrics()), &traffic)
	checkFloat(t, cards, "error_rate", pick(t, traffic.Series, dep).GetSummary().GetErrorRate())
	var good meterv1.GetGoodputResponse
	apiGet(t, base, key, "/v1/goodput", byDep(rg.metrics()), &good)
	gs := pick(t, good.Series, dep).GetSummary()
	checkFloat(t, cards, "attainment", gs.GetAttainment())
	checkFloat(t, cards, "goodput_tokens_per_second", gs.GetGoodputOutputTokensPerSecond())
	var cost meterv1.GetCostResponse
	apiGet(t, base, key, "/v1/cost", byDep(rg.hours()), &cost)
	var nanos int64
	per1k := ""
	users := 0
	var costSeries []*meterv1.CostSeries
	for _, sr := range cost.Series {
		if dep == "" || sr.Group["deployment"] == dep {
			costSeries = append(costSeries, sr)
		}
	}
	for _, sr := range costSeries {
		nanos += sr.Summary.GetCost().GetNanos()
		if sr.Group["tenant_id"] != "__idle__" {
			per1k = sr.Summary.GetCostPer_1KTokens()
			users++
		}
	}
	if users != 1 {
		t.Fatalf("cost of deployment %q has %d lines besides the idle one, want 1", dep, users)
	}
	if costSeries[0].Summary.GetCost() == nil {
		// The provider's cost, hidden from this key: no cost cards.
		for _, name := range []string{"cost", "cost_per_1k_tokens"} {
			if v, ok := cards[name]; ok {
				t.Errorf("card %s = %q shown, but the key sees no cost", name, v)
			}
		}
		return
	}
	if got := cards["cost"]; got != nanosAmount(nanos) {
		t.Errorf("card cost = %q, want %q", got, nanosAmount(nanos))
	}
	if got := cards["cost_per_1k_tokens"]; got != per1k || per1k == "" {
		t.Errorf("card cost_per_1k_tokens = %q, want %q (not empty)", got, per1k)
	}
}

// checkEngineCards compares the metrics tab's engine cards (KV cache,
// queue, batch, prefix cache, preemptions, restarts) with GetEngineStats
// over the page's range and step, of deployment dep ("": all).
func checkEngineCards(t *testing.T, p *browsertest.Page, base, key string, rg dashRange, dep string) {
	t.Helper()
	cards := dashCards(t, p, "#metric-cards")
	q := rg.metrics()
	if dep != "" {
		q = withParams(q, "group_by", "deployment")
	}
	var eng meterv1.GetEngineStatsResponse
	apiGet(t, base, key, "/v1/engine-stats", q, &eng)
	e := pick(t, eng.Series, dep).GetSummary()
	if e.GetKvCacheSamples() == 0 || dep != "spare" && (e.GetPreemptions() == 0 || e.GetWaitingMax() == 0) {
		t.Errorf("engine stats of %q: %v: the fixture should fill the KV cache, queue and preempt", dep, e)
	}
	for name, want := range map[string]float64{
		"kv_cache_mean": e.GetKvCacheUsageMean(), "kv_cache_max": e.GetKvCacheUsageMax(), "kv_cache_min": e.GetKvCacheUsageMin(),
		"waiting_p95": e.GetWaitingP95(), "waiting_max": e.GetWaitingMax(), "waiting_mean": e.GetWaitingMean(),
		"running_mean": e.GetRunningMean(), "running_max": e.GetRunningMax(), "prefix_cache_hit_rate": e.GetPrefixCacheHitRate(),
	} {
		checkFloat(t, cards, name, want)
	}
	for name, want := range map[string]uint64{"preemptions": e.GetPreemptions(), "restarts": e.GetRestarts()} {
		if got := cards[name]; got != strconv.FormatUint(want, 10) {
			t.Errorf("card %s = %q, want %d", name, got, want)
		}
	}
}

// metricCharts are the charts of the metrics tab for a finance or admin
// key.
var metricCharts = []string{"latency-ttft", "latency-itl", "latency-e2e", "latency-breakdown",
	"engine-kv-cache", "engine-queue", "engine-running", "engine-preemptions", "engine-prefix-hit-rate", "engine-restarts",
	"traffic-requests", "traffic-tokens", "traffic-errors", "errors-by-class", "goodput-attainment", "goodput-tokens",
	"gpu-utilization", "gpu-memory", "gpu-power", "gpu-temperature", "cost-busy-idle"}

// chartValues reads every drawn point and bar under sel: chart, series
// (data-series), instant (data-t, ms) to value (data-v).
func chartValues(t *testing.T, p *browsertest.Page, sel string) map[string]map[string]map[int64]float64 {
	t.Helper()
	raw := browsertest.Value(t, p, chromedp.Evaluate[map[string]map[string][][2]float64](fmt.Sprintf(`(() => {
		const out = {};
		for (const f of document.querySelectorAll(%q)) {
			const m = out[f.dataset.chart] = {};
			for (const e of f.querySelectorAll("circle.pt, rect.bar")) (m[e.dataset.series || ""] ||= []).push([Number(e.dataset.t), Number(e.dataset.v)]);
		}
		return out;
	})()`, sel+" figure.chart")))
	out := map[string]map[string]map[int64]float64{}
	for chart, series := range raw {
		out[chart] = map[string]map[int64]float64{}
		for name, pts := range series {
			m := map[int64]float64{}
			for _, pt := range pts {
				m[int64(pt[0])] = pt[1]
			}
			out[chart][name] = m
		}
	}
	return out
}

// seriesOf is a chart series the test expects: instant (ms) to value.
type seriesOf map[int64]float64

// checkChart compares chart's series with want exactly: the same instants
// and values, and no series the test does not expect.
func checkChart(t *testing.T, got map[string]map[string]map[int64]float64, chart string, want map[string]seriesOf) {
	t.Helper()
	g, ok := got[chart]
	if !ok {
		t.Errorf("chart %s missing", chart)
		return
	}
	for name := range g {
		if _, ok := want[name]; !ok {
			t.Errorf("chart %s: series %q not expected (want %v)", chart, name, slices.Collect(maps.Keys(want)))
		}
	}
	for name, w := range want {
		if len(w) == 0 {
			t.Errorf("chart %s: the API has no points of series %q: the fixture should", chart, name)
		}
		gs := g[name]
		if len(gs) != len(w) {
			t.Errorf("chart %s: series %q has %d points, want %d", chart, name, len(gs), len(w))
		}
		for at, v := range w {
			if gv, ok := gs[at]; !ok || gv != v {
				t.Errorf("chart %s: series %q at %s = %v (drawn %v), want %v", chart, name, time.UnixMilli(at).UTC().Format(time.RFC3339), gv, ok, v)
				break
			}
		}
	}
}

// checkMetricCharts compares the metrics tab's charts (no grouping) with
// the API's answers for the page's range and deployment dep ("": all):
// the latency percentiles, engine series, error classes, traffic and GPU
// telemetry, point by point; and that every chart has points.
func checkMetricCharts(t *testing.T, p *browsertest.Page, base, key string, rg dashRange, dep string) {
	t.Helper()
	checkCharts(t, chartPoints(t, p, "#metric-charts"), metricCharts)
	got := chartValues(t, p, "#metric-charts")
	byDep := func(q url.Values) url.Values {
		if dep == "" {
			return q
		}
		return withParams(q, "group_by", "deployment")
	}
	ms := func(ts interface{ AsTime() time.Time }) int64 { return ts.AsTime().UnixMilli() }

	var lat meterv1.GetLatencyResponse
	apiGet(t, base, key, "/v1/latency", byDep(rg.metrics()), &lat)
	for m, get := range map[string]func(*meterv1.LatencyPoint) *meterv1.LatencyStats{
		"ttft": (*meterv1.LatencyPoint).GetTtft, "itl": (*meterv1.LatencyPoint).GetItl, "e2e": (*meterv1.LatencyPoint).GetE2E,
	} {
		want := map[string]seriesOf{"p50": {}, "p90": {}, "p95": {}, "p99": {}}
		for _, pt := range pick(t, lat.Series, dep).GetPoints() {
			st := get(pt)
			if st.GetCount() == 0 {
				continue
			}
			at := ms(pt.GetStart())
			want["p50"][at], want["p90"][at], want["p95"][at], want["p99"][at] = st.GetP50(), st.GetP90(), st.GetP95(), st.GetP99()
		}
		checkChart(t, got, "latency-"+m, want)
	}
	phases := map[string]seriesOf{"queue": {}, "prefill": {}, "decode": {}}
	for _, pt := range pick(t, lat.Series, dep).GetPoints() {
		for name, st := range map[string]*meterv1.LatencyStats{"queue": pt.GetQueue(), "prefill": pt.GetPrefill(), "decode": pt.GetDecode()} {
			if st.GetCount() > 0 {
				phases[name][ms(pt.GetStart())] = st.GetP50()
			}
		}
	}
	checkChart(t, got, "latency-breakdown", phases)

	var eng meterv1.GetEngineStatsResponse
	apiGet(t, base, key, "/v1/engine-stats", byDep(rg.metrics()), &eng)
	kv := map[string]seriesOf{"mean": {}, "max": {}, "min": {}}
	queue := map[string]seriesOf{"p95": {}, "max": {}}
	running := map[string]seriesOf{"mean": {}, "max": {}}
	preempt := map[string]seriesOf{"": {}}
	restarts := map[string]seriesOf{"": {}}
	hit := map[string]seriesOf{"all": {}}
	for _, pt := range pick(t, eng.Series, dep).GetPoints() {
		at := ms(pt.GetStart())
		if pt.GetKvCacheSamples() > 0 {
			kv["mean"][at], kv["max"][at], kv["min"][at] = pt.GetKvCacheUsageMean(), pt.GetKvCacheUsageMax(), pt.GetKvCacheUsageMin()
		}
		queue["p95"][at], queue["max"][at] = pt.GetWaitingP95(), pt.GetWaitingMax()
		running["mean"][at], running["max"][at] = pt.GetRunningMean(), pt.GetRunningMax()
		preempt[""][at] = float64(pt.GetPreemptions())
		restarts[""][at] = float64(pt.GetRestarts())
		if pt.PrefixCacheHitRate != nil {
			hit["all"][at] = pt.GetPrefixCacheHitRate()
		}
	}
	checkChart(t, got, "engine-kv-cache", kv)
	checkChart(t, got, "engine-queue", queue)
	checkChart(t, got, "engine-running", running)
	checkChart(t, got, "engine-preemptions", preempt)
	checkChart(t, got, "engine-restarts", restarts)
	checkChart(t, got, "engine-prefix-hit-rate", hit)

	var traffic meterv1.GetTrafficResponse
	apiGet(t, base, key, "/v1/traffic", byDep(rg.metrics()), &traffic)
	rps := map[string]seriesOf{"all": {}}
	classes := map[string]seriesOf{}
	for _, pt := range pick(t, traffic.Series, dep).GetPoints() {
		at := ms(pt.GetStart())
		rps["all"][at] = pt.GetRequestsPerSecond()
		if len(pt.GetErrorsByClass()) == 0 {
			continue
		}
		for c := range pt.GetErrorsByClass() {
			if classes[strings.ReplaceAll(c, "_", " ")] == nil {
				classes[strings.ReplaceAll(c, "_", " ")] = seriesOf{}
			}
		}
	}
	// Each step with errors has a bar of every class (0 where none).
	for _, pt := range pick(t, traffic.Series, dep).GetPoints() {
		if len(pt.GetErrorsByClass()) == 0 {
			continue
		}
		for c := range classes {
			classes[c][ms(pt.GetStart())] = float64(pt.GetErrorsByClass()[strings.ReplaceAll(c, " ", "_")])
		}
	}
	if want := map[string]int{"": 5, "busy": 4, "spare": 2}[dep]; len(classes) < want {
		t.Errorf("the API's error classes of %q: %v, want the fixture's %d", dep, slices.Collect(maps.Keys(classes)), want)
	}
	checkChart(t, got, "traffic-requests", rps)
	checkChart(t, got, "errors-by-class", classes)

	var gpu meterv1.GetGpuUsageResponse
	apiGet(t, base, key, "/v1/gpu-usage", byDep(rg.hours()), &gpu)
	util := map[string]seriesOf{"all": {}}
	mem := map[string]seriesOf{"mean": {}, "max": {}}
	power := map[string]seriesOf{"mean": {}, "max": {}}
	temp := map[string]seriesOf{"mean": {}, "max": {}}
	// Every hour of the answer is drawn (those outside a range of minutes
	// clipped).
	for _, pt := range pick(t, gpu.Series, dep).GetPoints() {
		at := pt.GetStart().AsTime()
		tel := pt.GetTelemetry()
		util["all"][at.UnixMilli()] = pt.GetUtilization()
		if tel.GetMemoryHours() > 0 {
			mem["mean"][at.UnixMilli()], mem["max"][at.UnixMilli()] = tel.GetMemoryUsedRatio(), tel.GetMemoryUsedMaxRatio()
		}
		if tel.GetPowerHours() > 0 {
			power["mean"][at.UnixMilli()], power["max"][at.UnixMilli()] = tel.GetPowerMeanWatts(), tel.GetPowerMaxWatts()
		}
		if tel.GetTemperatureHours() > 0 {
			temp["mean"][at.UnixMilli()], temp["max"][at.UnixMilli()] = tel.GetTemperatureMeanC(), tel.GetTemperatureMaxC()
		}
	}
	checkChart(t, got, "gpu-utilization", util)
	checkChart(t, got, "gpu-memory", mem)
	checkChart(t, got, "gpu-power", power)
	checkChart(t, got, "gpu-temperature", temp)
}

// checkSharedHover moves the pointer over chart's plot and checks that
// every time chart under sel then marks the same instant (data-hover-t,
// the guide shown), so that one moment reads across all of them.
func checkSharedHover(t *testing.T, p *browsertest.Page, sel, chart string) {
	t.Helper()
	c := fmt.Sprintf(`[data-chart=%q]`, chart)
	p.Run(t, chromedp.ScrollIntoView(chromedp.CSS(c)))
	xy := browsertest.Value(t, p, chromedp.Evaluate[[2]float64](fmt.Sprintf(
		`(() => { const r = document.querySelector('%s rect.overlay').getBoundingClientRect(); return [r.left + r.width * 0.8, r.top + r.height / 2]; })()`, c)))
	p.Run(t, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, xy[0], xy[1]))
	// The charts on the hovered one's time axis (the capacity tab's
	// forecast has one of its own).
	marks := browsertest.Value(t, p, chromedp.Evaluate[map[string][]string](fmt.Sprintf(`(c => Object.fromEntries([...document.querySelectorAll(%q)]
		.filter(f => f.dataset.t0 === c.dataset.t0 && f.dataset.t1 === c.dataset.t1).map(f => [f.dataset.chart, [f.dataset.hoverT || "", f.querySelector("line.hover-guide").getAttribute("visibility"),
			String(f.querySelectorAll(".hot").length)]])))(document.querySelector('%s'))`, sel+" figure.chart", c)))
	if len(marks) < 2 {
		t.Errorf("hover over %s: %d charts on its time axis, want several", chart, len(marks))
	}
	at := marks[chart][0]
	if at == "" {
		t.Fatalf("hover over %s marks no instant: %v", chart, marks)
	}
	for name, m := range marks {
		if m[0] != at || m[1] != "visible" {
			t.Errorf("hover over %s at %s: chart %s marks %q (guide %s), want the same instant shown", chart, at, name, m[0], m[1])
		}
	}
	if marks[chart][2] == "0" {
		t.Errorf("hover over %s: none of its points highlighted", chart)
	}
	p.Run(t, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, 2, 2))
}

// pick returns the series of deployment dep of an answer grouped by
// deployment, or its only series when dep is "".
func pick[S interface{ GetGroup() map[string]string }](t *testing.T, series []S, dep string) S {
	t.Helper()
	for _, s := range series {
		if dep == "" || s.GetGroup()["deployment"] == dep {
			return s
		}
	}
	t.Fatalf("no series of deployment %q among %d", dep, len(series))
	var zero S
	return zero
}

// checkFloat compares a card's value with the API's number, exactly.
func checkFloat(t *testing.T, cards map[string]string, name string, want float64) {
	t.Helper()
	s, ok := cards[name]
	if !ok {
		t.Errorf("card %s missing", name)
		return
	}
	got, err := strconv.ParseFloat(s, 64)
	if err != nil || got != want || math.IsNaN(got) {
		t.Errorf("card %s = %q, want %v", name, s, want)
	}
}

// nanosAmount writes nanos as the API's decimal amount ("12.500000000").
func nanosAmount(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	return fmt.Sprintf("%s%d.%09d", sign, n/1e9, n%1e9)
}

// apiGet calls the REST API with key and decodes the answer into m.
func apiGet(t *testing.T, base, key, path string, q url.Values, m proto.Message) {
	t.Helper()
	code, _, body := get(t, base+path+"?"+q.Encode(), key)
	if code != 200 {
		t.Fatalf("GET %s?%s: %d %s", path, q.Encode(), code, body)
	}
	if err := protojson.Unmarshal([]byte(body), m); err != nil {
		t.Fatalf("GET %s: decode: %v", path, err)
	}
}

func get(t *testing.T, url, key string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, string(body)
}
