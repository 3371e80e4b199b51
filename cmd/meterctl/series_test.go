package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// fakeMetrics stands in for the metrics endpoints of the REST API: it
// answers pages as the gateway writes them (proto field names, zero values
// included) and records every request.
type fakeMetrics struct {
	t *testing.T
	// pages holds the answers per path: pages[path][i] answers the page
	// token strconv.Itoa(i), and the first page no token.
	pages map[string][]proto.Message

	mu       sync.Mutex
	requests []url.URL
}

func newFakeMetrics(t *testing.T, pages map[string][]proto.Message) (*fakeMetrics, *httptest.Server) {
	f := &fakeMetrics{t: t, pages: pages}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeMetrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, *r.URL)
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+testKey {
		writeGatewayError(w, http.StatusUnauthorized, 16, "unknown API key")
		return
	}
	pages, ok := f.pages[r.URL.Path]
	if r.Method != http.MethodGet || !ok {
		writeGatewayError(w, http.StatusNotFound, 5, "Not Found")
		return
	}
	i := 0
	// The metrics API takes the token in its selector, cost at top level.
	tok := r.URL.Query().Get("selector.page_token")
	if tok == "" {
		tok = r.URL.Query().Get("page_token")
	}
	if tok != "" {
		var err error
		if i, err = strconv.Atoi(tok); err != nil || i < 0 || i >= len(pages) {
			writeGatewayError(w, http.StatusBadRequest, 3, "bad page_token")
			return
		}
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}.Marshal(pages[i]) // as the gateway writes
	if err != nil {
		f.t.Errorf("marshal answer: %v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// got returns the requests so far.
func (f *fakeMetrics) got() []url.URL {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.URL(nil), f.requests...)
}

var (
	t10 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	t11 = t10.Add(time.Hour)
)

// lat is a LatencyStats with its tail ratio.
func lat(count uint64, mean, p50, p90, p95, p99 float64) *meterv1.LatencyStats {
	s := &meterv1.LatencyStats{Count: count, Mean: mean, P50: p50, P90: p90, P95: p95, P99: p99}
	if p50 > 0 {
		s.TailRatio = p99 / p50
	}
	return s
}

// withMax sets the max_p99 of a summary's stats.
func withMax(s *meterv1.LatencyStats, maxP99 float64) *meterv1.LatencyStats {
	s.MaxP99 = maxP99
	return s
}

// latencyPages is a two-page latency answer by tenant and model, hourly.
func latencyPages() []proto.Message {
	acme := map[string]string{"tenant_id": "acme", "model": "llama-3.1-70b-instruct"}
	globex := map[string]string{"tenant_id": "globex", "model": "llama-3.1-8b-instruct"}
	return []proto.Message{
		&meterv1.GetLatencyResponse{NextPageToken: "1", RelativeAccuracy: 0.01, Series: []*meterv1.LatencySeries{{
			Group: acme,
			Points: []*meterv1.LatencyPoint{
				{Start: timestamppb.New(t10), Ttft: lat(1200, 182.4, 151.2, 310.7, 402.1, 845.3), Itl: lat(1180, 24.13, 21.7, 35.02, 41.9, 66.6),
					E2E: lat(1200, 5231.9, 4410.5, 9120.4, 11020.7, 18844.1), Queue: lat(600, 3.2, 0.81, 7.45, 12.6, 40.2)},
				{Start: timestamppb.New(t11), Ttft: lat(800, 160, 140.3, 290.1, 350.6, 610.25), Itl: lat(790, 22.5, 20.1, 33.3, 39.8, 60.1),
					E2E: lat(800, 4900.2, 4205.1, 8800, 10100.3, 15333.3), Queue: lat(0, 0, 0, 0, 0, 0)},
			},
			Summary: &meterv1.LatencyPoint{Start: timestamppb.New(t10),
				Ttft: withMax(lat(2000, 173.44, 147.1, 301.2, 389.9, 790.4), 845.3), Itl: withMax(lat(1970, 23.47, 21, 34.4, 41.1, 64.2), 66.6),
				E2E: withMax(lat(2000, 5099.22, 4320.9, 9001.2, 10800.1, 17900.2), 18844.1), Queue: withMax(lat(600, 3.2, 0.81, 7.45, 12.6, 40.2), 40.2)},
		}}},
		&meterv1.GetLatencyResponse{RelativeAccuracy: 0.01, Series: []*meterv1.LatencySeries{{
			Group: globex,
			Points: []*meterv1.LatencyPoint{
				{Start: timestamppb.New(t10), Ttft: lat(3, 35.5, 31.25, 48.1, 48.1, 48.1), Itl: lat(3, 6.004, 5.9, 7.1, 7.1, 7.1),
					E2E: lat(3, 812.6, 799.9, 1012.4, 1012.4, 1012.4), Queue: lat(0, 0, 0, 0, 0, 0)},
			},
			Summary: &meterv1.LatencyPoint{Start: timestamppb.New(t10),
				Ttft: withMax(lat(3, 35.5, 31.25, 48.1, 48.1, 48.1), 48.1), Itl: withMax(lat(3, 6.004, 5.9, 7.1, 7.1, 7.1), 7.1),
				E2E: withMax(lat(3, 812.6, 799.9, 1012.4, 1012.4, 1012.4), 1012.4), Queue: lat(0, 0, 0, 0, 0, 0)},
		}}},
	}
}

// wantSelector is the query of the selector flags in the tests below,
// without the page token.
var wantSelector = url.Values{
	"selector.start": {"2026-11-21T10:00:00Z"}, "selector.end": {"2026-11-21T12:00:00Z"}, "selector.step": {"hour"},
	"selector.group_by": {"tenant_id", "model"}, "selector.page_size": {"1"}, "selector.tenant_id": {"acme"},
}

// selectorArgs select what wantSelector asks for.
var selectorArgs = []string{"--start", "2026-11-21T10:00:00Z", "--end", "2026-11-21T12:00:00Z", "--step", "hour",
	"--group-by", "tenant_id, model", "--page-size", "1", "--tenant", "acme"}

// checkPages checks that the requests asked path for the selector, the
// first without a page token and the next with the tokens of the pages in
// the parameter tokenParam.
func checkPages(t *testing.T, got []url.URL, path string, want url.Values, tokenParam string, pages int) {
	t.Helper()
	if len(got) != pages {
		t.Fatalf("%d requests, want %d (one per page)", len(got), pages)
	}
	for i, u := range got {
		if u.Path != path {
			t.Errorf("request %d: path %s, want %s", i, u.Path, path)
		}
		w := url.Values{}
		for k, v := range want {
			w[k] = v
		}
		if i > 0 {
			w.Set(tokenParam, strconv.Itoa(i))
		}
		if diff := cmp.Diff(w, u.Query()); diff != "" {
			t.Errorf("request %d query (-want +got):\n%s", i, diff)
		}
	}
}

func TestLatencyTable(t *testing.T) {
	f, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/latency": latencyPages()})
	out, _, err := runArgs(t, nil, append([]string{"latency", "--addr", srv.URL, "--key", testKey, "--metric", "ttft,e2e,queue"}, selectorArgs...)...)
	if err != nil {
		t.Fatalf("latency: %v", err)
	}
	want := `TENANT  MODEL                   START                 METRIC  COUNT    MEAN     P50     P90      P95      P99   TAIL  MAX_P99
acme    llama-3.1-70b-instruct  2026-11-21T10:00:00Z  ttft     1200   182.4   151.2   310.7    402.1    845.3   5.59
acme    llama-3.1-70b-instruct  2026-11-21T10:00:00Z  e2e      1200  5231.9  4410.5  9120.4  11020.7  18844.1   4.27
acme    llama-3.1-70b-instruct  2026-11-21T10:00:00Z  queue     600   3.200   0.810   7.450    12.60    40.20  49.63
acme    llama-3.1-70b-instruct  2026-11-21T11:00:00Z  ttft      800   160.0   140.3   290.1    350.6    610.2   4.35
acme    llama-3.1-70b-instruct  2026-11-21T11:00:00Z  e2e       800  4900.2  4205.1  8800.0  10100.3  15333.3   3.65
acme    llama-3.1-70b-instruct  2026-11-21T11:00:00Z  queue       0       -       -       -        -        -      -
acme    llama-3.1-70b-instruct  SUMMARY               ttft     2000   173.4   147.1   301.2    389.9    790.4   5.37    845.3
acme    llama-3.1-70b-instruct  SUMMARY               e2e      2000  5099.2  4320.9  9001.2  10800.1  17900.2   4.14  18844.1
acme    llama-3.1-70b-instruct  SUMMARY               queue     600   3.200   0.810   7.450    12.60    40.20  49.63    40.20
globex  llama-3.1-8b-instruct   2026-11-21T10:00:00Z  ttft        3   35.50   31.25   48.10    48.10    48.10   1.54
globex  llama-3.1-8b-instruct   2026-11-21T10:00:00Z  e2e         3   812.6   799.9  1012.4   1012.4   1012.4   1.27
globex  llama-3.1-8b-instruct   2026-11-21T10:00:00Z  queue       0       -       -       -        -        -      -
globex  llama-3.1-8b-instruct   SUMMARY               ttft        3   35.50   31.25   48.10    48.10    48.10   1.54    48.10
globex  llama-3.1-8b-instruct   SUMMARY               e2e         3   812.6   799.9  1012.4   1012.4   1012.4   1.27   1012.4
globex  llama-3.1-8b-instruct   SUMMARY               queue       0       -       -       -        -        -      -        -

Latencies in ms. TAIL is p99/p50, MAX_P99 the largest p99 of the steps. Quantiles within 1% relative error (histograms; --exact for exact ones).
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	checkPages(t, f.got(), "/v1/latency", wantSelector, "selector.page_token", 2)
}

// TestLatencyBreakdownTable shows the latency breakdown's metrics by name,
// each from its own field of the answer.
func TestLatencyBreakdownTable(t *testing.T) {
	st := func(n uint64, p50 float64) *meterv1.LatencyStats { return lat(n, p50, p50, p50, p50, p50) }
	page := &meterv1.GetLatencyResponse{RelativeAccuracy: 0.01, Series: []*meterv1.LatencySeries{{
		Group: map[string]string{"tenant_id": "acme", "model": "m"},
		Summary: &meterv1.LatencyPoint{Start: timestamppb.New(t10), Prefill: st(11, 1.5), Decode: st(12, 2.5),
			E2EShortOutput: st(13, 3.5), E2EMediumOutput: st(14, 4.5), E2ELongOutput: st(15, 5.5)},
	}}}
	_, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/latency": {page}})
	out, _, err := runArgs(t, nil, append([]string{"latency", "--addr", srv.URL, "--key", testKey, "--step", "total",
		"--metric", "prefill,decode,e2e_short,e2e_medium,e2e_long", "--output", "csv"}, selectorArgs...)...)
	if err != nil {
		t.Fatalf("latency: %v", err)
	}
	for i, m := range hourLatencyMetrics {
		want := fmt.Sprintf(",%s,%d,%g,", m, 11+i, 1.5+float64(i))
		if !strings.Contains(out, want) {
			t.Errorf("no %q row %q in:\n%s", m, want, out)
		}
	}
	if _, _, err := runArgs(t, nil, append([]string{"latency", "--addr", srv.URL, "--key", testKey, "--metric", "prefil"}, selectorArgs...)...); err == nil || !strings.Contains(err.Error(), "e2e_long") {
		t.Errorf("unknown metric: err %v, want one that lists every metric", err)
	}
}

func TestLatencyCSVExact(t *testing.T) {
	pages := latencyPages()
	for _, p := range pages {
		p.(*meterv1.GetLatencyResponse).RelativeAccuracy = 0
	}
	f, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/latency": pages})
	out, _, err := runArgs(t, map[string]string{"METER_ADDR": srv.URL, "METER_API_KEY": testKey},
		append([]string{"latency", "--exact", "--output", "csv", "--metric", "itl"}, selectorArgs...)...)
	if err != nil {
		t.Fatalf("latency: %v", err)
	}
	want := `tenant_id,model,start,metric,count,mean,p50,p90,p95,p99,tail,max_p99
acme,llama-3.1-70b-instruct,2026-11-21T10:00:00Z,itl,1180,24.13,21.7,35.02,41.9,66.6,3.0691244239631335,
acme,llama-3.1-70b-instruct,2026-11-21T11:00:00Z,itl,790,22.5,20.1,33.3,39.8,60.1,2.990049751243781,
acme,llama-3.1-70b-instruct,summary,itl,1970,23.47,21,34.4,41.1,64.2,3.0571428571428574,66.6
globex,llama-3.1-8b-instruct,2026-11-21T10:00:00Z,itl,3,6.004,5.9,7.1,7.1,7.1,1.2033898305084745,
globex,llama-3.1-8b-instruct,summary,itl,3,6.004,5.9,7.1,7.1,7.1,1.2033898305084745,7.1
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("CSV (-want +got):\n%s", diff)
	}
	q := url.Values{"exact": {"true"}}
	for k, v := range wantSelector {
		q[k] = v
	}
	checkPages(t, f.got(), "/v1/latency", q, "selector.page_token", 2)
}

func TestLatencyJSON(t *testing.T) {
	pages := latencyPages()
	_, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/latency": pages})
	out, _, err := runArgs(t, nil, append([]string{"latency", "--addr", srv.URL, "--key", testKey, "--output", "json"}, selectorArgs...)...)
	if err != nil {
		t.Fatalf("latency: %v", err)
	}
	// One answer with the series of every page, in proto field names as
	// the API writes them.
	want := &meterv1.GetLatencyResponse{RelativeAccuracy: 0.01}
	for _, p := range pages {
		want.Series = append(want.Series, p.(*meterv1.GetLatencyResponse).Series...)
	}
	var got meterv1.GetLatencyResponse
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a GetLatencyResponse: %v\n%s", err, out)
	}
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("JSON (-want +got):\n%s", diff)
	}
	for _, name := range []string{`"next_page_token": ""`, `"relative_accuracy": 0.01`, `"max_p99": 845.3`, `"tail_ratio"`} {
		if !strings.Contains(out, name) {
			t.Errorf("JSON lacks %s:\n%s", name, out)
		}
	}
}

// goodputPages is a two-page goodput answer by tenant and model, hourly.
func goodputPages() []proto.Message {
	point := func(start time.Time, req, good uint64, seconds float64, out, goodOut uint64, minV, maxV uint32) *meterv1.GoodputPoint {
		return &meterv1.GoodputPoint{Start: timestamppb.New(start), Requests: req, GoodRequests: good,
			Attainment: float64(good) / float64(req), GoodputRequestsPerSecond: float64(good) / seconds,
			OutputTokens: out, GoodOutputTokens: goodOut, GoodputOutputTokensPerSecond: float64(goodOut) / seconds,
			GoodputRatio: float64(goodOut) / float64(out), SloVersionMin: minV, SloVersionMax: maxV}
	}
	return []proto.Message{
		&meterv1.GetGoodputResponse{NextPageToken: "1", Series: []*meterv1.GoodputSeries{{
			Group: map[string]string{"tenant_id": "acme", "model": "llama-3.1-70b-instruct"},
			Points: []*meterv1.GoodputPoint{
				point(t10, 120000, 119990, 3600, 28_000_000, 27_990_000, 3, 3),
				point(t11, 90000, 81000, 3600, 21_000_000, 18_100_000, 3, 4),
			},
			Summary: point(t10, 210000, 200990, 7200, 49_000_000, 46_090_000, 3, 4),
		}}},
		&meterv1.GetGoodputResponse{Series: []*meterv1.GoodputSeries{{
			Group:   map[string]string{"tenant_id": "acme", "model": ""},
			Points:  []*meterv1.GoodputPoint{point(t10, 7, 0, 3600, 700, 0, 2, 2)},
			Summary: point(t10, 7, 0, 7200, 700, 0, 2, 2),
		}}},
	}
}

// trafficPages is a two-page traffic answer by tenant and model, hourly.
func trafficPages() []proto.Message {
	point := func(start time.Time, req uint64, seconds, peakRPS float64, in, out uint64, peakOutTPS float64, byClass map[string]uint64) *meterv1.TrafficPoint {
		var errs uint64
		for _, n := range byClass {
			errs += n
		}
		return &meterv1.TrafficPoint{Start: timestamppb.New(start), Requests: req, RequestsPerSecond: float64(req) / seconds,
			PeakRequestsPerSecond: peakRPS, InputTokensPerSecond: float64(in) / seconds, OutputTokensPerSecond: float64(out) / seconds,
			PeakOutputTokensPerSecond: peakOutTPS, ErrorRate: float64(errs) / float64(req), ErrorsByClass: byClass}
	}
	return []proto.Message{
		&meterv1.GetTrafficResponse{NextPageToken: "1", Series: []*meterv1.TrafficSeries{{
			Group: map[string]string{"tenant_id": "acme", "model": "llama-3.1-70b-instruct"},
			Points: []*meterv1.TrafficPoint{
				point(t10, 120000, 3600, 51.5, 144_000_000, 28_000_000, 9120.25, map[string]uint64{"oom": 12, "timeout": 30, "cuda": 1, "rate_limited": 30}),
				point(t11, 90000, 3600, 30, 108_000_000, 21_000_000, 6000, nil),
			},
			Summary: point(t10, 210000, 7200, 51.5, 252_000_000, 49_000_000, 9120.25, map[string]uint64{"oom": 12, "timeout": 30, "cuda": 1, "rate_limited": 30}),
		}}},
		&meterv1.GetTrafficResponse{Series: []*meterv1.TrafficSeries{{
			Group:   map[string]string{"tenant_id": "acme", "model": "llama-3.1-8b-instruct"},
			Points:  []*meterv1.TrafficPoint{point(t10, 1, 3600, 1.0/60, 100, 7, 7.0/60, map[string]uint64{"context_length": 1})},
			Summary: point(t10, 1, 7200, 1.0/60, 100, 7, 7.0/60, map[string]uint64{"context_length": 1}),
		}}},
	}
}

func TestGoodputAndTraffic(t *testing.T) {
	tests := []struct {
		name, path string
		pages      []proto.Message
		args       []string
		want       string
	}{{
		name: "goodput table", path: "/v1/goodput", pages: goodputPages(), args: []string{"goodput"},
		want: `TENANT  MODEL                   START                 REQUESTS    GOOD  ATTAINMENT  GOODPUT_RPS  GOOD_OUT_TPS  GOODPUT_RATIO  SLO_VERSION
acme    llama-3.1-70b-instruct  2026-11-21T10:00:00Z    120000  119990      99.99%        33.33        7775.0         0.9996            3
acme    llama-3.1-70b-instruct  2026-11-21T11:00:00Z     90000   81000      90.00%        22.50        5027.8         0.8619          3-4
acme    llama-3.1-70b-instruct  SUMMARY                 210000  200990      95.71%        27.92        6401.4         0.9406          3-4
acme    -                       2026-11-21T10:00:00Z         7       0       0.00%        0.000         0.000         0.0000            2
acme    -                       SUMMARY                      7       0       0.00%        0.000         0.000         0.0000            2
`,
	}, {
		name: "goodput CSV", path: "/v1/goodput", pages: goodputPages(), args: []string{"goodput", "--output", "csv"},
		want: `tenant_id,model,start,requests,good,attainment,goodput_rps,good_out_tps,goodput_ratio,slo_version
acme,llama-3.1-70b-instruct,2026-11-21T10:00:00Z,120000,119990,0.9999166666666667,33.330555555555556,7775,0.9996428571428572,3
acme,llama-3.1-70b-instruct,2026-11-21T11:00:00Z,90000,81000,0.9,22.5,5027.777777777777,0.861904761904762,3-4
acme,llama-3.1-70b-instruct,summary,210000,200990,0.9570952380952381,27.915277777777778,6401.388888888889,0.9406122448979591,3-4
acme,,2026-11-21T10:00:00Z,7,0,0,0,0,0,2
acme,,summary,7,0,0,0,0,0,2
`,
	}, {
		name: "traffic table", path: "/v1/traffic", pages: trafficPages(), args: []string{"traffic"},
		want: `TENANT  MODEL                   START                 REQUESTS    RPS  PEAK_RPS   IN_TPS  OUT_TPS  PEAK_OUT_TPS  ERROR_RATE  TOP_ERRORS
acme    llama-3.1-70b-instruct  2026-11-21T10:00:00Z    120000  33.33     51.50  40000.0   7777.8        9120.2       0.06%  rate_limited:30 timeout:30 oom:12 +1 more
acme    llama-3.1-70b-instruct  2026-11-21T11:00:00Z     90000  25.00     30.00  30000.0   5833.3        6000.0       0.00%  -
acme    llama-3.1-70b-instruct  SUMMARY                 210000  29.17     51.50  35000.0   6805.6        9120.2       0.03%  rate_limited:30 timeout:30 oom:12 +1 more
acme    llama-3.1-8b-instruct   2026-11-21T10:00:00Z         1  0.000     0.017    0.028    0.002         0.117     100.00%  context_length:1
acme    llama-3.1-8b-instruct   SUMMARY                      1  0.000     0.017    0.014    0.001         0.117     100.00%  context_length:1
`,
	}, {
		name: "traffic CSV", path: "/v1/traffic", pages: trafficPages(), args: []string{"traffic", "--output", "csv"},
		want: `tenant_id,model,start,requests,rps,peak_rps,in_tps,out_tps,peak_out_tps,error_rate,errors_by_class
acme,llama-3.1-70b-instruct,2026-11-21T10:00:00Z,120000,33.333333333333336,51.5,40000,7777.777777777777,9120.25,0.0006083333333333333,rate_limited:30 timeout:30 oom:12 cuda:1
acme,llama-3.1-70b-instruct,2026-11-21T11:00:00Z,90000,25,30,30000,5833.333333333333,6000,0,
acme,llama-3.1-70b-instruct,summary,210000,29.166666666666668,51.5,35000,6805.555555555556,9120.25,0.0003476190476190476,rate_limited:30 timeout:30 oom:12 cuda:1
acme,llama-3.1-8b-instruct,2026-11-21T10:00:00Z,1,0.0002777777777777778,0.016666666666666666,0.027777777777777776,0.0019444444444444444,0.11666666666666667,1,context_length:1
acme,llama-3.1-8b-instruct,summary,1,0.0001388888888888889,0.016666666666666666,0.013888888888888888,0.0009722222222222222,0.11666666666666667,1,context_length:1
`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFakeMetrics(t, map[string][]proto.Message{tt.path: tt.pages})
			out, _, err := runArgs(t, nil, append(append(tt.args, "--addr", srv.URL, "--key", testKey), selectorArgs...)...)
			if err != nil {
				t.Fatalf("%s: %v", tt.args[0], err)
			}
			if diff := cmp.Diff(tt.want, out); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			checkPages(t, f.got(), tt.path, wantSelector, "selector.page_token", 2)
		})
	}
}

func TestGoodputAndTrafficJSON(t *testing.T) {
	for path, pages := range map[string][]proto.Message{"/v1/goodput": goodputPages(), "/v1/traffic": trafficPages()} {
		cmd := strings.TrimPrefix(path, "/v1/")
		_, srv := newFakeMetrics(t, map[string][]proto.Message{path: pages})
		out, _, err := runArgs(t, nil, append([]string{cmd, "--addr", srv.URL, "--key", testKey, "--output", "json"}, selectorArgs...)...)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		var want, got proto.Message
		switch cmd {
		case "goodput":
			all := &meterv1.GetGoodputResponse{}
			for _, p := range pages {
				all.Series = append(all.Series, p.(*meterv1.GetGoodputResponse).Series...)
			}
			want, got = all, &meterv1.GetGoodputResponse{}
		default:
			all := &meterv1.GetTrafficResponse{}
			for _, p := range pages {
				all.Series = append(all.Series, p.(*meterv1.GetTrafficResponse).Series...)
			}
			want, got = all, &meterv1.GetTrafficResponse{}
		}
		if err := protojson.Unmarshal([]byte(out), got); err != nil {
			t.Fatalf("%s: output is not its answer: %v\n%s", cmd, err, out)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("%s JSON (-want +got):\n%s", cmd, diff)
		}
	}
}

// TestSeriesDefaults checks the query of each command without selector
// flags: the last 24 h on whole units of its selector, one step, the
// default policies, every page.
func TestSeriesDefaults(t *testing.T) {
	tests := []struct {
		cmd    string
		prefix string
		unit   time.Duration
		empty  proto.Message
		query  url.Values
		want   string
	}{
		{"latency", "selector.", time.Minute, &meterv1.GetLatencyResponse{RelativeAccuracy: 0.01},
			url.Values{"selector.step": {"total"}, "selector.page_size": {"1000"}}, "no requests in ["},
		{"goodput", "selector.", time.Minute, &meterv1.GetGoodputResponse{},
			url.Values{"selector.step": {"total"}, "selector.page_size": {"1000"}}, "no requests in ["},
		{"traffic", "selector.", time.Minute, &meterv1.GetTrafficResponse{},
			url.Values{"selector.step": {"total"}, "selector.page_size": {"1000"}}, "no requests in ["},
		{"cost", "", time.Hour, &meterv1.GetCostResponse{},
			url.Values{"step": {"total"}, "page_size": {"1000"}, "busy_policy": {"tokens"}, "idle_policy": {"separate"}}, "no cost or usage in ["},
		{"gpu-usage", "", time.Hour, &meterv1.GetGpuUsageResponse{},
			url.Values{"step": {"total"}, "page_size": {"1000"}}, "no GPU samples in ["},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			f, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/" + tt.cmd: {tt.empty}})
			before := time.Now()
			out, _, err := runArgs(t, nil, tt.cmd, "--addr", srv.URL, "--key", testKey)
			if err != nil {
				t.Fatalf("%s: %v", tt.cmd, err)
			}
			if !strings.HasPrefix(out, tt.want) {
				t.Errorf("output %q, want %q…", out, tt.want)
			}
			reqs := f.got()
			if len(reqs) != 1 {
				t.Fatalf("%d requests, want 1", len(reqs))
			}
			q := reqs[0].Query()
			start, err1 := time.Parse(time.RFC3339, q.Get(tt.prefix+"start"))
			end, err2 := time.Parse(time.RFC3339, q.Get(tt.prefix+"end"))
			if err := errors.Join(err1, err2); err != nil {
				t.Fatalf("query %v: %v", q, err)
			}
			if end.Sub(start) != 24*time.Hour || end.Truncate(tt.unit) != end || before.Sub(end) < 0 || before.Sub(end) > tt.unit {
				t.Errorf("window [%s, %s), want the last 24h in whole %s", start, end, tt.unit)
			}
			q.Del(tt.prefix + "start")
			q.Del(tt.prefix + "end")
			if diff := cmp.Diff(tt.query, q); diff != "" {
				t.Errorf("query (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSeriesErrors(t *testing.T) {
	f, srv := newFakeMetrics(t, map[string][]proto.Message{
		"/v1/latency": {&meterv1.GetLatencyResponse{NextPageToken: "0"}},
		"/v1/goodput": {&meterv1.GetGoodputResponse{NextPageToken: "7"}},
	})
	var ae *apiError
	if _, _, err := runArgs(t, nil, "traffic", "--addr", srv.URL, "--key", "tm_wrong"); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("wrong key: error %v, want a 401 API error", err)
	}
	// A server that pages in a circle is not followed forever.
	if _, _, err := runArgs(t, nil, "latency", "--addr", srv.URL, "--key", testKey); err == nil || len(f.got()) != 3 {
		t.Errorf("repeated page token: error %v after %d requests, want an error after 2", err, len(f.got())-1)
	}
	// A token the server then refuses is its error.
	if _, _, err := runArgs(t, nil, "goodput", "--addr", srv.URL, "--key", testKey); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("refused page token: error %v, want a 400 API error", err)
	}

	for name, args := range map[string][]string{
		"end before start":   {"traffic", "--start", "2026-11-22T00:00:00Z", "--end", "2026-11-21T00:00:00Z"},
		"not RFC 3339":       {"goodput", "--start", "yesterday"},
		"start within a min": {"latency", "--start", "2026-11-21T00:00:30Z", "--end", "2026-11-22T00:00:00Z"},
		"end within a min":   {"goodput", "--start", "2026-11-21T00:00:00Z", "--end", "2026-11-21T10:00:00.5Z"},
		"step":               {"traffic", "--step", "week"},
		"group by":           {"latency", "--group-by", "model,region"},
		"page size 0":        {"goodput", "--page-size", "0"},
		"page size too big":  {"traffic", "--page-size", "1001"},
		"output":             {"latency", "--output", "xml"},
		"metric":             {"latency", "--metric", "ttft,tpot"},
		"no metric":          {"latency", "--metric", ","},
		"exact beyond 24h":   {"latency", "--exact", "--start", "2026-11-20T00:00:00Z", "--end", "2026-11-21T00:01:00Z"},
		"exact on goodput":   {"goodput", "--exact"},
		"positional":         {"traffic", "acme"},
	} {
		if _, _, err := runArgs(t, nil, append(args[:1:1], append([]string{"--validate", "--key", "k"}, args[1:]...)...)...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// The largest exact range is accepted.
	out, _, err := runArgs(t, nil, "latency", "--validate", "--key", "k", "--exact", "--start", "2026-11-20T00:00:00Z", "--end", "2026-11-21T00:00:00Z")
	if err != nil || out != "configuration ok\n" {
		t.Errorf("exact over 24h: %q, %v; want configuration ok", out, err)
	}
}

func TestCellFormat(t *testing.T) {
	tests := []struct {
		v                  float64
		ms, percent, fixed string
	}{
		{0, "0.000", "0.00%", "0.00"},
		{0.00004, "0.000", "<0.01%", "0.00"},
		{0.5, "0.500", "50.00%", "0.50"},
		{0.99994, "1.000", "99.99%", "1.00"},
		{0.99996, "1.000", ">99.99%", "1.00"},
		{1, "1.000", "100.00%", "1.00"},
		{9.9994, "9.999", "999.94%", "10.00"},
		{12.3456, "12.35", "1234.56%", "12.35"},
		{123.456, "123.5", "12345.60%", "123.46"},
		{18844.06, "18844.1", "1884406.00%", "18844.06"},
	}
	var table, csv cellFormat
	csv.csv = true
	for _, tt := range tests {
		if got := table.float(tt.v); got != tt.ms {
			t.Errorf("float(%v) = %q, want %q", tt.v, got, tt.ms)
		}
		if got := table.percent(tt.v); got != tt.percent {
			t.Errorf("percent(%v) = %q, want %q", tt.v, got, tt.percent)
		}
		if got := table.fixed(tt.v, 2); got != tt.fixed {
			t.Errorf("fixed(%v, 2) = %q, want %q", tt.v, got, tt.fixed)
		}
		want := strconv.FormatFloat(tt.v, 'f', -1, 64)
		if a, b, c := csv.float(tt.v), csv.percent(tt.v), csv.fixed(tt.v, 2); a != want || b != want || c != want {
			t.Errorf("CSV cells of %v: %q, %q, %q; want %q", tt.v, a, b, c, want)
		}
	}
}

// TestServerLists checks the lists meterctl validates against those of
// the server, which meterctl does not link.
func TestServerLists(t *testing.T) {
	if diff := cmp.Diff(rollup.RollupGroupFields, seriesGroupFields); diff != "" {
		t.Errorf("group-by fields (-server +meterctl):\n%s", diff)
	}
	if diff := cmp.Diff(rollup.LatencyMetrics, latencyMetrics); diff != "" {
		t.Errorf("latency metrics (-server +meterctl):\n%s", diff)
	}
	if diff := cmp.Diff(query.HourLatencyMetrics, hourLatencyMetrics); diff != "" {
		t.Errorf("hour-only latency metrics (-server +meterctl):\n%s", diff)
	}
	if maxExactRange != query.MaxExactRange {
		t.Errorf("exact range %s, server's %s", maxExactRange, query.MaxExactRange)
	}
	for s := range rollup.Granularities {
		if !strings.Contains(strings.Join(steps, ","), s) {
			t.Errorf("step %q of the server missing", s)
		}
	}
	if len(steps) != len(rollup.Granularities) {
		t.Errorf("steps %v, server's %v", steps, rollup.Granularities)
	}
}
