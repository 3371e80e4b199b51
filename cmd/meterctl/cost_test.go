package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// usd is an amount of nanos (not negative) as the API writes it.
func usd(nanos int64) *meterv1.Money {
	return &meterv1.Money{Currency: "USD", Nanos: nanos, Amount: fmt.Sprintf("%d.%09d", nanos/1e9, nanos%1e9)}
}

// costPoint is a CostPoint with its money; per1k are its cost per 1k
// output tokens, per 1k tokens and busy cost per 1k output tokens.
func costPoint(start time.Time, cost, idle int64, req, in, out uint64, per1k [3]string) *meterv1.CostPoint {
	return &meterv1.CostPoint{Start: timestamppb.New(start), Cost: usd(cost), BusyCost: usd(cost - idle), IdleCost: usd(idle),
		Requests: req, InputTokens: in, OutputTokens: out,
		CostPer_1KOutputTokens: per1k[0], CostPer_1KTokens: per1k[1], BusyCostPer_1KOutputTokens: per1k[2]}
}

// unattributed sets the usage of p that ran without GPU samples.
func unattributed(p *meterv1.CostPoint, req, in, out uint64) *meterv1.CostPoint {
	p.UnattributedRequests, p.UnattributedInputTokens, p.UnattributedOutputTokens = req, in, out
	return p
}

// costPages is a two-page cost answer by tenant and model, hourly: acme's
// usage, some of it on a deployment without GPU samples, and the idle cost
// kept apart, which has no tokens.
func costPages() []proto.Message {
	return []proto.Message{
		&meterv1.GetCostResponse{NextPageToken: "1", BusyPolicy: "tokens", IdlePolicy: "separate", Currency: "USD",
			PriceVersions: []string{"2026-11-01"},
			Series: []*meterv1.CostSeries{{
				Group: map[string]string{"tenant_id": "acme", "model": "llama-3.1-70b-instruct"},
				Points: []*meterv1.CostPoint{
					withGPUTime(costPoint(t10, 12_345_678_912, 0, 1200, 1_440_000, 336_000, [3]string{"0.036743092", "0.006951396", "0.036743092"}), "0.010288066", "7200.000"),
					withGPUTime(unattributed(costPoint(t11, 12_000, 0, 3, 300, 30, [3]string{"0.000400000", "0.000036364", "0.000400000"}), 5, 500, 50), "0.000004000", "0.250"),
				},
				Summary: withGPUTime(unattributed(costPoint(t10, 12_345_690_912, 0, 1203, 1_440_300, 336_030, [3]string{"0.036739847", "0.006950111", "0.036739847"}), 5, 500, 50), "0.010262419", "7200.250"),
			}}},
		&meterv1.GetCostResponse{BusyPolicy: "tokens", IdlePolicy: "separate", Currency: "USD",
			PriceVersions: []string{"2026-11-01", "2026-11-15"},
			Series: []*meterv1.CostSeries{{
				Group: map[string]string{"tenant_id": "__idle__", "model": ""},
				Points: []*meterv1.CostPoint{
					withGPUTime(costPoint(t10, 3_500_000_000, 3_500_000_000, 0, 0, 0, [3]string{}), "", "3600.000"),
					withGPUTime(costPoint(t11, 1_250_000_000, 1_250_000_000, 0, 0, 0, [3]string{}), "", "1285.714"),
				},
				Summary: withGPUTime(costPoint(t10, 4_750_000_000, 4_750_000_000, 0, 0, 0, [3]string{}), "", "4885.714"),
			}}},
	}
}

// withGPUTime sets a cost point's cost per request and allocated GPU time.
func withGPUTime(p *meterv1.CostPoint, perRequest, gpuSeconds string) *meterv1.CostPoint {
	p.CostPerRequest, p.GpuSeconds = perRequest, gpuSeconds
	return p
}

// gpuPoint is a GpuUsagePoint of gpu GPU-hours at utilization util
// costing costPerHour nanos per GPU-hour, of which unpriced hours have no
// price.
func gpuPoint(start time.Time, gpus uint32, gpu, util, coverage, unpriced float64, costPerHour int64, tokens uint64) *meterv1.GpuUsagePoint {
	priced := gpu - unpriced
	cost := int64(priced * float64(costPerHour))
	idle := int64(priced * (1 - util) * float64(costPerHour))
	p := &meterv1.GpuUsagePoint{Start: timestamppb.New(start), GpuHours: gpu, BusyGpuHours: gpu * util, IdleGpuHours: gpu * (1 - util),
		Utilization: util, EnergyKwh: gpu * 0.55, Coverage: coverage, MaxGpus: gpus,
		Cost: usd(cost), BusyCost: usd(cost - idle), IdleCost: usd(idle), UnpricedGpuHours: unpriced,
		OutputTokens: tokens / 5, TotalTokens: tokens}
	if gpu > 0 {
		p.TokensPerGpuHour = float64(tokens) / gpu
	}
	return p
}

// gpuPages is a two-page GPU usage answer, hourly, grouped by field with
// the values group.
func gpuPages(field string, group [2]string) []proto.Message {
	return []proto.Message{
		&meterv1.GetGpuUsageResponse{NextPageToken: "1", Currency: "USD", PriceVersions: []string{"2026-11-01"},
			Series: []*meterv1.GpuUsageSeries{{
				Group: map[string]string{field: group[0]},
				Points: []*meterv1.GpuUsagePoint{
					gpuPoint(t10, 8, 8, 0.75, 1, 0, 2_500_000_000, 43_200_000),
					gpuPoint(t11, 8, 7.5, 0.5, 0.9375, 0, 2_500_000_000, 20_000_000),
				},
				Summary: gpuPoint(t10, 8, 15.5, 0.6290322580645161, 0.96875, 0, 2_500_000_000, 63_200_000),
			}}},
		&meterv1.GetGpuUsageResponse{Currency: "USD", PriceVersions: []string{"2026-11-01"},
			Series: []*meterv1.GpuUsageSeries{{
				Group:   map[string]string{field: group[1]},
				Points:  []*meterv1.GpuUsagePoint{gpuPoint(t10, 1, 1, 0.02, 1, 1, 0, 0)},
				Summary: gpuPoint(t10, 1, 1, 0.02, 0.5, 1, 0, 0),
			}}},
	}
}

// hourArgs select two hours of 2026-11-21, hourly, one series per page.
var hourArgs = []string{"--start", "2026-11-21T10:00:00Z", "--end", "2026-11-21T12:00:00Z", "--step", "hour", "--page-size", "1"}

// hourQuery is the query of hourArgs, without the page token.
func hourQuery(more url.Values) url.Values {
	q := url.Values{"start": {"2026-11-21T10:00:00Z"}, "end": {"2026-11-21T12:00:00Z"}, "step": {"hour"}, "page_size": {"1"}}
	for k, v := range more {
		q[k] = v
	}
	return q
}

func TestCostAndGPUUsage(t *testing.T) {
	tests := []struct {
		name, path string
		pages      []proto.Message
		args       []string
		query      url.Values
		want       string
		wantStderr string
	}{{
		name: "cost table", path: "/v1/cost", pages: costPages(),
		args: []string{"cost", "--tenant", "acme", "--group-by", "tenant_id,model", "--busy-policy", "tokens", "--idle-policy", "separate"},
		query: hourQuery(url.Values{"tenant_id": {"acme"}, "group_by": {"tenant_id", "model"},
			"busy_policy": {"tokens"}, "idle_policy": {"separate"}}),
		want: `TENANT    MODEL                   START                        COST         BUSY        IDLE  REQUESTS    INPUT  OUTPUT   COST/1K_OUT   COST/1K_TOK   BUSY/1K_OUT  UNATTR_REQ      COST/REQ   GPU_SEC
acme      llama-3.1-70b-instruct  2026-11-21T10:00:00Z  USD 12.3457  USD 12.3457  USD 0.0000      1200  1440000  336000  USD 0.036743  USD 0.006951  USD 0.036743           0  USD 0.010288  7200.000
acme      llama-3.1-70b-instruct  2026-11-21T11:00:00Z  USD <0.0001  USD <0.0001  USD 0.0000         3      300      30  USD 0.000400  USD 0.000036  USD 0.000400           5  USD 0.000004     0.250
acme      llama-3.1-70b-instruct  SUMMARY               USD 12.3457  USD 12.3457  USD 0.0000      1203  1440300  336030  USD 0.036740  USD 0.006950  USD 0.036740           5  USD 0.010262  7200.250
__idle__  -                       2026-11-21T10:00:00Z   USD 3.5000   USD 0.0000  USD 3.5000         0        0       0             -             -             -           0             -  3600.000
__idle__  -                       2026-11-21T11:00:00Z   USD 1.2500   USD 0.0000  USD 1.2500         0        0       0             -             -             -           0             -  1285.714
__idle__  -                       SUMMARY                USD 4.7500   USD 0.0000  USD 4.7500         0        0       0             -             -             -           0             -  4885.714

Busy policy tokens, idle policy separate (idle cost in tenant __idle__). Amounts in USD; price versions: 2026-11-01, 2026-11-15.
warning: 5 requests ran on deployments without GPU samples: their cost is not included (500 input and 50 output tokens)
`,
	}, {
		name: "cost CSV", path: "/v1/cost", pages: costPages(),
		args:  []string{"cost", "--group-by", "tenant_id,model", "--output", "csv", "--busy-policy", "request_time", "--idle-policy", "shared_even"},
		query: hourQuery(url.Values{"group_by": {"tenant_id", "model"}, "busy_policy": {"request_time"}, "idle_policy": {"shared_even"}}),
		want: `tenant_id,model,start,currency,cost,busy_cost,idle_cost,requests,input_tokens,output_tokens,cost_per_1k_output_tokens,cost_per_1k_tokens,busy_cost_per_1k_output_tokens,unattributed_requests,cost_per_request,gpu_seconds
acme,llama-3.1-70b-instruct,2026-11-21T10:00:00Z,USD,12.345678912,12.345678912,0.000000000,1200,1440000,336000,0.036743092,0.006951396,0.036743092,0,0.010288066,7200.000
acme,llama-3.1-70b-instruct,2026-11-21T11:00:00Z,USD,0.000012000,0.000012000,0.000000000,3,300,30,0.000400000,0.000036364,0.000400000,5,0.000004000,0.250
acme,llama-3.1-70b-instruct,summary,USD,12.345690912,12.345690912,0.000000000,1203,1440300,336030,0.036739847,0.006950111,0.036739847,5,0.010262419,7200.250
__idle__,,2026-11-21T10:00:00Z,USD,3.500000000,0.000000000,3.500000000,0,0,0,,,,0,,3600.000
__idle__,,2026-11-21T11:00:00Z,USD,1.250000000,0.000000000,1.250000000,0,0,0,,,,0,,1285.714
__idle__,,summary,USD,4.750000000,0.000000000,4.750000000,0,0,0,,,,0,,4885.714
`,
		wantStderr: "warning: 5 requests ran on deployments without GPU samples: their cost is not included (500 input and 50 output tokens)\n",
	}, {
		name: "GPU usage table", path: "/v1/gpu-usage", pages: gpuPages("deployment", [2]string{"d1", "d2"}),
		args:  []string{"gpu-usage", "--group-by", "deployment"},
		query: hourQuery(url.Values{"group_by": {"deployment"}}),
		want: `DEPLOYMENT  START                 GPU_H  BUSY_H  IDLE_H    UTIL  COVERAGE  MAX_GPUS  ENERGY_KWH         COST    IDLE_COST  UNPRICED_H  TOK/GPU_H
d1          2026-11-21T10:00:00Z  8.000   6.000   2.000  75.00%   100.00%         8       4.400  USD 20.0000   USD 5.0000       0.000    5400000
d1          2026-11-21T11:00:00Z  7.500   3.750   3.750  50.00%    93.75%         8       4.125  USD 18.7500   USD 9.3750       0.000    2666667
d1          SUMMARY               15.50   9.750   5.750  62.90%    96.88%         8       8.525  USD 38.7500  USD 14.3750       0.000    4077419
d2          2026-11-21T10:00:00Z  1.000   0.020   0.980   2.00%   100.00%         1       0.550   USD 0.0000   USD 0.0000       1.000          0
d2          SUMMARY               1.000   0.020   0.980   2.00%    50.00%         1       0.550   USD 0.0000   USD 0.0000       1.000          0

Amounts in USD; price versions: 2026-11-01.
warning: 1 GPU-hours had no price in the price book: their cost is not included
`,
	}, {
		name: "GPU usage table by pool, without tokens", path: "/v1/gpu-usage", pages: gpuPages("pool", [2]string{"reserved", "spot"}),
		args:  []string{"gpu-usage", "--group-by", "pool"},
		query: hourQuery(url.Values{"group_by": {"pool"}}),
		want: `POOL      START                 GPU_H  BUSY_H  IDLE_H    UTIL  COVERAGE  MAX_GPUS  ENERGY_KWH         COST    IDLE_COST  UNPRICED_H  TOK/GPU_H
reserved  2026-11-21T10:00:00Z  8.000   6.000   2.000  75.00%   100.00%         8       4.400  USD 20.0000   USD 5.0000       0.000          -
reserved  2026-11-21T11:00:00Z  7.500   3.750   3.750  50.00%    93.75%         8       4.125  USD 18.7500   USD 9.3750       0.000          -
reserved  SUMMARY               15.50   9.750   5.750  62.90%    96.88%         8       8.525  USD 38.7500  USD 14.3750       0.000          -
spot      2026-11-21T10:00:00Z  1.000   0.020   0.980   2.00%   100.00%         1       0.550   USD 0.0000   USD 0.0000       1.000          -
spot      SUMMARY               1.000   0.020   0.980   2.00%    50.00%         1       0.550   USD 0.0000   USD 0.0000       1.000          -

Amounts in USD; price versions: 2026-11-01. TOK/GPU_H is known when grouped by nothing but deployment and gpu_type.
warning: 1 GPU-hours had no price in the price book: their cost is not included
`,
	}, {
		name: "GPU usage CSV by pool, without tokens", path: "/v1/gpu-usage", pages: gpuPages("pool", [2]string{"reserved", "spot"}),
		args:  []string{"gpu-usage", "--group-by", "pool", "--output", "csv"},
		query: hourQuery(url.Values{"group_by": {"pool"}}),
		want: `pool,start,currency,gpu_hours,busy_gpu_hours,idle_gpu_hours,utilization,coverage,max_gpus,energy_kwh,cost,idle_cost,unpriced_gpu_hours,tokens_per_gpu_hour
reserved,2026-11-21T10:00:00Z,USD,8,6,2,0.75,1,8,4.4,20.000000000,5.000000000,0,
reserved,2026-11-21T11:00:00Z,USD,7.5,3.75,3.75,0.5,0.9375,8,4.125,18.750000000,9.375000000,0,
reserved,summary,USD,15.5,9.75,5.75,0.6290322580645161,0.96875,8,8.525,38.750000000,14.375000000,0,
spot,2026-11-21T10:00:00Z,USD,1,0.02,0.98,0.02,1,1,0.55,0.000000000,0.000000000,1,
spot,summary,USD,1,0.02,0.98,0.02,0.5,1,0.55,0.000000000,0.000000000,1,
`,
		wantStderr: "warning: 1 GPU-hours had no price in the price book: their cost is not included\n",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFakeMetrics(t, map[string][]proto.Message{tt.path: tt.pages})
			out, errOut, err := runArgs(t, nil, slices.Concat(tt.args, []string{"--addr", srv.URL, "--key", testKey}, hourArgs)...)
			if err != nil {
				t.Fatalf("%s: %v", tt.args[0], err)
			}
			if diff := cmp.Diff(tt.want, out); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantStderr, errOut); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
			checkPages(t, f.got(), tt.path, tt.query, "page_token", 2)
		})
	}
}

func TestCostAndGPUUsageJSON(t *testing.T) {
	cost := &meterv1.GetCostResponse{BusyPolicy: "tokens", IdlePolicy: "separate", Currency: "USD",
		PriceVersions: []string{"2026-11-01", "2026-11-15"}}
	for _, p := range costPages() {
		cost.Series = append(cost.Series, p.(*meterv1.GetCostResponse).Series...)
	}
	gpu := &meterv1.GetGpuUsageResponse{Currency: "USD", PriceVersions: []string{"2026-11-01"}}
	for _, p := range gpuPages("deployment", [2]string{"d1", "d2"}) {
		gpu.Series = append(gpu.Series, p.(*meterv1.GetGpuUsageResponse).Series...)
	}
	tests := []struct {
		cmd        string
		pages      []proto.Message
		want, got  proto.Message
		wantFields []string
	}{
		{"cost", costPages(), cost, &meterv1.GetCostResponse{}, []string{`"amount": "12.345690912"`, `"cost_per_1k_output_tokens": ""`, `"unattributed_requests": "5"`}},
		{"gpu-usage", gpuPages("deployment", [2]string{"d1", "d2"}), gpu, &meterv1.GetGpuUsageResponse{}, []string{`"next_page_token": ""`, `"unpriced_gpu_hours": 1`}},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			_, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/" + tt.cmd: tt.pages})
			out, errOut, err := runArgs(t, nil, slices.Concat([]string{tt.cmd, "--addr", srv.URL, "--key", testKey, "--output", "json"}, hourArgs)...)
			if err != nil {
				t.Fatalf("%s: %v", tt.cmd, err)
			}
			if err := protojson.Unmarshal([]byte(out), tt.got); err != nil {
				t.Fatalf("output is not the answer: %v\n%s", err, out)
			}
			if diff := cmp.Diff(tt.want, tt.got, protocmp.Transform()); diff != "" {
				t.Errorf("JSON (-want +got):\n%s", diff)
			}
			for _, field := range tt.wantFields {
				if !strings.Contains(out, field) {
					t.Errorf("JSON lacks %s:\n%s", field, out)
				}
			}
			if !strings.HasPrefix(errOut, "warning: ") {
				t.Errorf("stderr %q, want the warning", errOut)
			}
		})
	}
}

func TestCostErrors(t *testing.T) {
	// Each case is a valid configuration with one flag changed, so that its
	// error is that flag's.
	valid := []string{"--validate", "--key", "k", "--start", "2026-11-21T10:00:00Z", "--end", "2026-11-21T12:00:00Z"}
	for _, cmd := range []string{"cost", "gpu-usage"} {
		if out, _, err := runArgs(t, nil, append([]string{cmd}, valid...)...); err != nil || out != "configuration ok\n" {
			t.Fatalf("%s: %q, %v; want configuration ok", cmd, out, err)
		}
	}
	tests := []struct {
		name string
		args []string
	}{
		{"start within an hour", []string{"cost", "--start", "2026-11-21T10:30:00Z"}},
		{"end within an hour", []string{"gpu-usage", "--end", "2026-11-21T11:00:01Z"}},
		{"end before start", []string{"cost", "--end", "2026-11-21T09:00:00Z"}},
		{"empty range", []string{"gpu-usage", "--end", "2026-11-21T10:00:00Z"}},
		{"not RFC 3339", []string{"cost", "--start", "10:00"}},
		{"step minute", []string{"cost", "--step", "minute"}},
		{"step week", []string{"gpu-usage", "--step", "week"}},
		{"cost by pool", []string{"cost", "--group-by", "tenant_id,pool"}},
		{"GPU usage by tenant", []string{"gpu-usage", "--group-by", "tenant_id"}},
		{"busy policy", []string{"cost", "--busy-policy", "flops"}},
		{"idle policy", []string{"cost", "--idle-policy", "ignore"}},
		{"idle policy on GPU usage", []string{"gpu-usage", "--idle-policy", "separate"}},
		{"tenant on GPU usage", []string{"gpu-usage", "--tenant", "acme"}},
		{"page size", []string{"cost", "--page-size", "1001"}},
		{"output", []string{"gpu-usage", "--output", "xml"}},
		{"positional", []string{"cost", "acme"}},
		{"no key", []string{"cost", "--key", ""}},
	}
	for _, tt := range tests {
		args := slices.Concat(tt.args[:1], valid, tt.args[1:])
		if _, _, err := runArgs(t, nil, args...); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}

	// What the server refuses is its error; a tenant key's 403 is told.
	srv := newFakeAPI(t, &fakeAPI{})
	var ae *apiError
	if _, _, err := runArgs(t, nil, "cost", "--addr", srv.URL, "--key", "tm_wrong"); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Errorf("wrong key: error %v, want a 401 API error", err)
	}
}

func TestRoundDecimal(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"12.345678912", "12.3457"},
		{"12.345649999", "12.3456"},
		{"0.000050000", "0.0001"},
		{"0.000049999", "<0.0001"},
		{"0.000000000", "0.0000"},
		{"-0.000012", ">-0.0001"},
		{"-2.5", "-2.5000"},
		{"1000000.1", "1000000.1000"},
		{"n/a", "n/a"},
	}
	for _, tt := range tests {
		if got := roundDecimal(tt.in, 4); got != tt.want {
			t.Errorf("roundDecimal(%q, 4) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := roundDecimal("0.4", 0); got != "<1" {
		t.Errorf("roundDecimal(0.4, 0) = %q, want <1", got)
	}
	for n, want := range map[int64]string{0: "0.000000000", 1: "0.000000001", -1_500_000_000: "-1.500000000", 12_345_678_912: "12.345678912"} {
		if got := nanosDecimal(n); got != want {
			t.Errorf("nanosDecimal(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestCostServerLists checks the lists meterctl validates against those
// of the server, which meterctl does not link.
func TestCostServerLists(t *testing.T) {
	for _, l := range []struct {
		name           string
		server, client []string
	}{
		{"cost group-by fields", query.CostGroupFields, costGroupFields},
		{"GPU usage group-by fields", query.GPUGroupFields, gpuGroupFields},
		{"busy policies", policyNames(billing.BusyPolicies()), busyPolicies},
		{"idle policies", policyNames(billing.IdlePolicies()), idlePolicies},
	} {
		if diff := cmp.Diff(l.server, l.client); diff != "" {
			t.Errorf("%s (-server +meterctl):\n%s", l.name, diff)
		}
	}
	if idleTenant != billing.IdleTenant {
		t.Errorf("idle tenant %q, server's %q", idleTenant, billing.IdleTenant)
	}
}

// policyNames returns the names of billing's policies, in order.
func policyNames[P ~string](ps []P) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}
