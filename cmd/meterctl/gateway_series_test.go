package main

import (
	"context"
	"encoding/csv"
	"errors"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/api"
	"tokenmeter/rollup/sketch"
)

// rawMinute is one group's requests in one minute. fakeRollups derives
// both its rollup rows (histograms built with sketch) and its raw latencies
// from these, as the rollup job and the raw events do.
type rawMinute struct {
	start    time.Time
	group    map[string]string    // every field of rollup.RollupGroupFields
	latency  map[string][]float64 // ms per rollup.LatencyMetrics entry
	errorsBy map[string]uint64
	requests uint64
	prompt   uint64
	output   uint64
	good     uint64
	goodOut  uint64
	slo      uint32
}

// fakeRollups answers rollup queries over minutes the way chstore does:
// filtered by tenant and range, merged per step and group, ordered by step
// and group. It records every query.
type fakeRollups struct {
	minutes []rawMinute

	mu      sync.Mutex
	queries []query.RollupQuery
}

var _ api.RollupReader = (*fakeRollups)(nil)

func (f *fakeRollups) got() []query.RollupQuery {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.queries)
}

// merge calls add once per minute of q with the index of the minute's
// (step, group) cell, numbering new cells in order of step and group.
func (f *fakeRollups) merge(q query.RollupQuery, add func(cell int, start time.Time, group map[string]string, m rawMinute)) int {
	f.mu.Lock()
	f.queries = append(f.queries, q)
	f.mu.Unlock()
	type key struct {
		start time.Time
		group string
	}
	var minutes []rawMinute
	for _, m := range f.minutes {
		if (q.TenantID == "" || m.group["tenant_id"] == q.TenantID) && !m.start.Before(q.Start) && m.start.Before(q.End) {
			minutes = append(minutes, m)
		}
	}
	keyOf := func(m rawMinute) (key, map[string]string) {
		start := q.Start
		if w := rollup.Granularities[q.Step]; w > 0 {
			start = time.Unix(m.start.Unix()/w*w, 0).UTC()
		}
		group := map[string]string{}
		var parts []string
		for _, g := range q.GroupBy {
			group[g] = m.group[g]
			parts = append(parts, m.group[g])
		}
		return key{start, strings.Join(parts, "\x00")}, group
	}
	slices.SortStableFunc(minutes, func(a, b rawMinute) int {
		ka, _ := keyOf(a)
		kb, _ := keyOf(b)
		if c := ka.start.Compare(kb.start); c != 0 {
			return c
		}
		return strings.Compare(ka.group, kb.group)
	})
	cells := map[key]int{}
	for _, m := range minutes {
		k, group := keyOf(m)
		i, ok := cells[k]
		if !ok {
			i = len(cells)
			cells[k] = i
		}
		add(i, k.start, group, m)
	}
	return len(cells)
}

func (f *fakeRollups) Rollups(_ context.Context, q query.RollupQuery) ([]query.RollupRow, error) {
	var rows []query.RollupRow
	f.merge(q, func(i int, start time.Time, group map[string]string, m rawMinute) {
		if i == len(rows) {
			rows = append(rows, query.RollupRow{Start: start, Group: group, ErrorsBy: map[string]uint64{},
				Latency: map[string]query.Dist{}, MinSLO: m.slo, MaxSLO: m.slo})
		}
		r := &rows[i]
		r.Requests += m.requests
		for c, n := range m.errorsBy {
			r.Errors += n
			r.ErrorsBy[c] += n
		}
		r.PromptTokens += m.prompt
		r.OutputTokens += m.output
		r.GoodRequests += m.good
		r.GoodOutputTokens += m.goodOut
		r.MinSLO, r.MaxSLO = min(r.MinSLO, m.slo), max(r.MaxSLO, m.slo)
		for _, metric := range rollup.LatencyMetrics {
			d := r.Latency[metric]
			h := sketch.Histogram{Keys: d.Keys, Counts: d.Counts}
			for _, v := range m.latency[metric] {
				h.Add(v)
				d.Count++
				d.Sum += v
			}
			d.Keys, d.Counts = h.Keys, h.Counts
			r.Latency[metric] = d
		}
	})
	return rows, nil
}

func (f *fakeRollups) RawLatency(_ context.Context, q query.RollupQuery) ([]query.RawLatencyRow, error) {
	var rows []query.RawLatencyRow
	f.merge(q, func(i int, start time.Time, group map[string]string, m rawMinute) {
		if i == len(rows) {
			rows = append(rows, query.RawLatencyRow{Start: start, Group: group, Values: map[string][]float64{}})
		}
		for _, metric := range rollup.LatencyMetrics {
			rows[i].Values[metric] = append(rows[i].Values[metric], m.latency[metric]...)
		}
	})
	for _, r := range rows {
		for _, v := range r.Values {
			slices.Sort(v)
		}
	}
	return rows, nil
}

// Traffic merges the minutes per step and group as chstore does, each
// step's busiest minute being the busiest of its minutes summed over its
// groups.
func (f *fakeRollups) Traffic(_ context.Context, q query.RollupQuery) ([]query.TrafficRow, error) {
	type minute struct {
		cell int
		at   time.Time
	}
	var rows []query.TrafficRow
	sums := map[minute][2]uint64{} // requests, output tokens
	f.merge(q, func(i int, start time.Time, group map[string]string, m rawMinute) {
		if i == len(rows) {
			rows = append(rows, query.TrafficRow{Start: start, Group: group, ErrorsBy: map[string]uint64{}})
		}
		r := &rows[i]
		r.Requests += m.requests
		for c, n := range m.errorsBy {
			r.Errors += n
			r.ErrorsBy[c] += n
		}
		r.PromptTokens += m.prompt
		r.OutputTokens += m.output
		k := minute{i, m.start}
		sum := sums[k]
		sum[0], sum[1] = sum[0]+m.requests, sum[1]+m.output
		sums[k] = sum
		r.PeakMinuteRequests, r.PeakMinuteOutputTokens = max(r.PeakMinuteRequests, sum[0]), max(r.PeakMinuteOutputTokens, sum[1])
	})
	return rows, nil
}

// gatewayMinutes are two tenants' requests around 2026-11-21 10:00–12:00.
func gatewayMinutes() []rawMinute {
	acme := map[string]string{"tenant_id": "acme", "model": "m1", "model_version": "v1", "deployment": "d1", "gpu_type": "h100", "slo_class": "interactive"}
	globex := map[string]string{"tenant_id": "globex", "model": "m2", "model_version": "v7", "deployment": "d2", "gpu_type": "a100", "slo_class": "batch"}
	at := func(hh, mm int) time.Time { return time.Date(2026, 11, 21, hh, mm, 0, 0, time.UTC) }
	return []rawMinute{
		{start: at(10, 0), group: acme, requests: 4, prompt: 4000, output: 400, good: 3, goodOut: 300, slo: 1,
			errorsBy: map[string]uint64{"oom": 1},
			latency:  map[string][]float64{"ttft": {100, 200, 300, 400}, "itl": {10, 20, 30, 40}, "e2e": {1000, 2000, 3000, 4000}, "queue": {5, 15}}},
		{start: at(10, 1), group: acme, requests: 2, prompt: 2000, output: 200, good: 2, goodOut: 200, slo: 1,
			latency: map[string][]float64{"ttft": {150, 250}, "itl": {12, 18}, "e2e": {1500, 2500}}},
		{start: at(11, 30), group: acme, requests: 1, prompt: 1000, output: 100, slo: 2,
			errorsBy: map[string]uint64{"timeout": 1},
			latency:  map[string][]float64{"ttft": {900}, "itl": {90}, "e2e": {9000}, "queue": {50}}},
		{start: at(10, 0), group: globex, requests: 3, prompt: 300, output: 30, good: 1, goodOut: 10, slo: 1,
			errorsBy: map[string]uint64{"rate_limited": 1, "timeout": 1},
			latency:  map[string][]float64{"ttft": {50, 60, 70}, "itl": {5, 6, 7}, "e2e": {500, 600, 700}}},
		// After the range: never counted.
		{start: at(12, 0), group: globex, requests: 100, prompt: 100, output: 100, good: 100, goodOut: 100, slo: 1,
			latency: map[string][]float64{"ttft": {1}, "itl": {1}, "e2e": {1}}},
	}
}

// csvRecords parses CSV output keyed by its first four cells (group,
// start, metric of a latency CSV grouped by one dimension).
func csvRecords(t *testing.T, out string) (head []string, rows map[string][]string) {
	t.Helper()
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) == 0 {
		t.Fatalf("CSV %q: %v", out, err)
	}
	rows = map[string][]string{}
	for _, r := range recs[1:] {
		rows[strings.Join(r[:3], ",")] = r
	}
	return recs[0], rows
}

// TestSeriesThroughGateway runs latency, goodput and traffic against the
// real API server over rollups built with the sketch histograms: it checks
// the parameters the gateway reads, paging, and the numbers the tables
// show.
func TestSeriesThroughGateway(t *testing.T) {
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "finance", SHA256: hashKey("tm_finance"), Role: api.RoleFinance},
		{Name: "acme", SHA256: hashKey("tm_acme"), Role: api.RoleTenant, TenantID: "acme"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rollups := &fakeRollups{minutes: gatewayMinutes()}
	addr := startAPI(t, &api.Services{Keys: keys, Rollups: rollups})
	start, end := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC), time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	sel := []string{"--addr", addr, "--start", "2026-11-21T10:00:00Z", "--end", "2026-11-21T12:00:00Z"}
	cmdArgs := func(cmd, key string, args ...string) []string {
		return append(append([]string{cmd, "--key", key}, sel...), args...)
	}

	// Exact quantiles from the raw values, hourly per tenant.
	exact, _, err := runArgs(t, nil, cmdArgs("latency", "tm_finance", "--exact", "--step", "hour", "--group-by", "tenant_id", "--output", "csv")...)
	if err != nil {
		t.Fatalf("latency --exact: %v", err)
	}
	want := `tenant_id,start,metric,count,mean,p50,p90,p95,p99,tail,max_p99
acme,2026-11-21T10:00:00Z,ttft,6,233.33333333333334,200,400,400,400,2,
acme,2026-11-21T10:00:00Z,itl,6,21.666666666666668,18,40,40,40,2.2222222222222223,
acme,2026-11-21T10:00:00Z,e2e,6,2333.3333333333335,2000,4000,4000,4000,2,
acme,2026-11-21T10:00:00Z,queue,2,10,5,15,15,15,3,
acme,2026-11-21T11:00:00Z,ttft,1,900,900,900,900,900,1,
acme,2026-11-21T11:00:00Z,itl,1,90,90,90,90,90,1,
acme,2026-11-21T11:00:00Z,e2e,1,9000,9000,9000,9000,9000,1,
acme,2026-11-21T11:00:00Z,queue,1,50,50,50,50,50,1,
acme,summary,ttft,7,328.57142857142856,250,900,900,900,3.6,900
acme,summary,itl,7,31.428571428571427,20,90,90,90,4.5,90
acme,summary,e2e,7,3285.714285714286,2500,9000,9000,9000,3.6,9000
acme,summary,queue,3,23.333333333333332,15,50,50,50,3.3333333333333335,50
globex,2026-11-21T10:00:00Z,ttft,3,60,60,70,70,70,1.1666666666666667,
globex,2026-11-21T10:00:00Z,itl,3,6,6,7,7,7,1.1666666666666667,
globex,2026-11-21T10:00:00Z,e2e,3,600,600,700,700,700,1.1666666666666667,
globex,2026-11-21T10:00:00Z,queue,0,,,,,,,
globex,summary,ttft,3,60,60,70,70,70,1.1666666666666667,70
globex,summary,itl,3,6,6,7,7,7,1.1666666666666667,7
globex,summary,e2e,3,600,600,700,700,700,1.1666666666666667,700
globex,summary,queue,0,,,,,,,
`
	if diff := cmp.Diff(want, exact); diff != "" {
		t.Errorf("exact latency CSV (-want +got):\n%s", diff)
	}
	wantQuery := query.RollupQuery{Start: start, End: end, Step: "hour", GroupBy: []string{"tenant_id"}}
	if diff := cmp.Diff([]query.RollupQuery{wantQuery}, rollups.got()); diff != "" {
		t.Errorf("exact latency queries (-want +got):\n%s", diff)
	}

	// The histograms give the same counts and means, and quantiles within
	// 1%, one series per page.
	approx, _, err := runArgs(t, nil, cmdArgs("latency", "tm_finance", "--step", "hour", "--group-by", "tenant_id", "--output", "csv", "--page-size", "1")...)
	if err != nil {
		t.Fatalf("latency: %v", err)
	}
	if n := len(rollups.got()); n != 3 {
		t.Errorf("%d queries, want 3: the exact one and one per page", n)
	}
	head, exactRows := csvRecords(t, exact)
	_, approxRows := csvRecords(t, approx)
	if len(approxRows) != len(exactRows) {
		t.Fatalf("%d histogram rows, %d exact rows:\n%s", len(approxRows), len(exactRows), approx)
	}
	for k, e := range exactRows {
		a, ok := approxRows[k]
		if !ok {
			t.Errorf("no histogram row %s", k)
			continue
		}
		for i := 3; i < len(head); i++ {
			switch {
			case head[i] == "count" || head[i] == "mean" || e[i] == "":
				if a[i] != e[i] {
					t.Errorf("%s %s: %s, exact %s", k, head[i], a[i], e[i])
				}
			case head[i] == "tail":
				// A ratio of two quantiles, each within 1%.
			default:
				av, err1 := strconv.ParseFloat(a[i], 64)
				ev, err2 := strconv.ParseFloat(e[i], 64)
				if err := errors.Join(err1, err2); err != nil || math.Abs(av-ev) > ev*sketch.RelativeAccuracy {
					t.Errorf("%s %s: %s, exact %s: not within 1%% (%v)", k, head[i], a[i], e[i], err)
				}
			}
		}
	}

	// The table notes the accuracy.
	out, _, err := runArgs(t, nil, cmdArgs("latency", "tm_finance", "--metric", "ttft")...)
	if err != nil {
		t.Fatalf("latency table: %v", err)
	}
	if !strings.Contains(out, "SUMMARY  ttft") || !strings.HasSuffix(out, "Quantiles within 1% relative error (histograms; --exact for exact ones).\n") {
		t.Errorf("latency table lacks its summary row or accuracy note:\n%s", out)
	}

	tests := []struct {
		name string
		args []string
		want string
	}{{
		name: "goodput hourly per tenant",
		args: cmdArgs("goodput", "tm_finance", "--step", "hour", "--group-by", "tenant_id"),
		want: `TENANT  START                 REQUESTS  GOOD  ATTAINMENT  GOODPUT_RPS  GOOD_OUT_TPS  GOODPUT_RATIO  SLO_VERSION
acme    2026-11-21T10:00:00Z         6     5      83.33%        0.001         0.139         0.8333            1
acme    2026-11-21T11:00:00Z         1     0       0.00%        0.000         0.000         0.0000            2
acme    SUMMARY                      7     5      71.43%        0.001         0.069         0.7143          1-2
globex  2026-11-21T10:00:00Z         3     1      33.33%        0.000         0.003         0.3333            1
globex  SUMMARY                      3     1      33.33%        0.000         0.001         0.3333            1
`,
	}, {
		name: "traffic hourly per tenant",
		args: cmdArgs("traffic", "tm_finance", "--step", "hour", "--group-by", "tenant_id"),
		want: `TENANT  START                 REQUESTS    RPS  PEAK_RPS  IN_TPS  OUT_TPS  PEAK_OUT_TPS  ERROR_RATE  TOP_ERRORS
acme    2026-11-21T10:00:00Z         6  0.002     0.067   1.667    0.167         6.667      16.67%  oom:1
acme    2026-11-21T11:00:00Z         1  0.000     0.017   0.278    0.028         1.667     100.00%  timeout:1
acme    SUMMARY                      7  0.001     0.067   0.972    0.097         6.667      28.57%  oom:1 timeout:1
globex  2026-11-21T10:00:00Z         3  0.001     0.050   0.083    0.008         0.500      66.67%  rate_limited:1 timeout:1
globex  SUMMARY                      3  0.000     0.050   0.042    0.004         0.500      66.67%  rate_limited:1 timeout:1
`,
	}, {
		name: "traffic of the whole range by model, with a tenant key",
		args: cmdArgs("traffic", "tm_acme", "--group-by", "model,gpu_type", "--output", "csv"),
		want: `model,gpu_type,start,requests,rps,peak_rps,in_tps,out_tps,peak_out_tps,error_rate,errors_by_class
m1,h100,summary,7,0.0009722222222222222,0.06666666666666667,0.9722222222222222,0.09722222222222222,6.666666666666667,0.2857142857142857,oom:1 timeout:1
`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runArgs(t, nil, tt.args...)
			if err != nil {
				t.Fatalf("%s: %v", tt.args[0], err)
			}
			if diff := cmp.Diff(tt.want, out); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
		})
	}
	qs := rollups.got()
	if got, want := qs[len(qs)-1], (query.RollupQuery{TenantID: "acme", Start: start, End: end, Step: "total", GroupBy: []string{"model", "gpu_type"}, TokenSizes: true}); !cmp.Equal(want, got) {
		t.Errorf("tenant key's traffic query %+v, want %+v", got, want)
	}

	// A tenant key may not read another tenant; a range off whole minutes
	// is refused before it is sent.
	_, _, err = runArgs(t, nil, cmdArgs("goodput", "tm_acme", "--tenant", "globex")...)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("tenant key for another tenant: error %v, want 403", err)
	}
	n := len(rollups.got())
	if _, _, err := runArgs(t, nil, "latency", "--addr", addr, "--key", "tm_finance", "--end", "2026-11-21T12:00:30Z"); err == nil || len(rollups.got()) != n {
		t.Errorf("end off a whole minute: error %v, queries %d → %d", err, n, len(rollups.got()))
	}
}
