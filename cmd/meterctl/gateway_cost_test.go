package main

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/api"
)

// fakeCost answers cost and GPU usage queries with fixed rows (those of
// the query's tenant) and no price book (so USD), and records every query.
type fakeCost struct {
	cost []query.CostRow
	gpu  []query.GPUUsageRow

	mu sync.Mutex
	cq []query.CostQuery
	gq []query.GPUUsageQuery
}

var _ api.CostReader = (*fakeCost)(nil)

func (f *fakeCost) Cost(_ context.Context, q query.CostQuery) ([]query.CostRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cq = append(f.cq, q)
	return slices.DeleteFunc(slices.Clone(f.cost), func(r query.CostRow) bool {
		return q.TenantID != "" && r.Group["tenant_id"] != q.TenantID
	}), nil
}

func (f *fakeCost) GPUUsage(_ context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gq = append(f.gq, q)
	return f.gpu, nil
}

func (f *fakeCost) CurrentPriceBook(context.Context) (string, string, time.Time, bool, error) {
	return "", "", time.Time{}, false, nil
}

func (f *fakeCost) PutPriceBook(context.Context, string, string, string, time.Time) error {
	return errors.New("read-only")
}

func (f *fakeCost) queries() ([]query.CostQuery, []query.GPUUsageQuery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cq), slices.Clone(f.gq)
}

// TestCostThroughGateway runs cost and gpu-usage against the real API
// server: it checks the parameters the gateway reads, paging, roles, and
// the amounts and costs per 1k tokens the server computes.
func TestCostThroughGateway(t *testing.T) {
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "finance", SHA256: hashKey("tm_finance"), Role: api.RoleFinance},
		{Name: "acme", SHA256: hashKey("tm_acme"), Role: api.RoleTenant, TenantID: "acme"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t10, t11 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC), time.Date(2026, 11, 21, 11, 0, 0, 0, time.UTC)
	tenant := func(id string) map[string]string { return map[string]string{"tenant_id": id} }
	store := &fakeCost{
		// Sorted by step, as chstore answers.
		cost: []query.CostRow{
			{Start: t10, Group: tenant("acme"), CostNanos: 2_500_000_000, BusyNanos: 2_000_000_000, Requests: 10, InputTokens: 1000, OutputTokens: 500, PriceVersions: []string{"v1"},
				GPUMs: 5_400_000, GPUBusyMs: 3_600_000},
			{Start: t10, Group: tenant("__idle__"), CostNanos: 500_000_000, PriceVersions: []string{"v1"}, GPUMs: 1_800_000},
			{Start: t10, Group: tenant("globex"), Requests: 3, InputTokens: 300, OutputTokens: 30,
				UnattributedRequests: 3, UnattributedInput: 300, UnattributedOutput: 30},
			{Start: t11, Group: tenant("acme"), CostNanos: 1_000_000_000, BusyNanos: 1_000_000_000, Requests: 4, InputTokens: 400, OutputTokens: 100,
				UnattributedRequests: 2, UnattributedInput: 200, UnattributedOutput: 20, PriceVersions: []string{"v2"}, GPUMs: 1_000, GPUBusyMs: 1_000},
		},
		gpu: []query.GPUUsageRow{
			{Start: t10, Group: map[string]string{"gpu_type": "h100"}, GPUSeconds: 4 * 3600, BusySeconds: 3 * 3600, CoveredSeconds: 4 * 3600,
				InstanceSeconds: 4 * 3600, EnergyJoules: 7.2e6, MaxGPUs: 4, CostNanos: 10_000_000_000, BusyCostNanos: 7_500_000_000,
				IdleCostNanos: 2_500_000_000, InputTokens: 3_000_000, OutputTokens: 1_000_000, TokensKnown: true, PriceVersions: []string{"v1"}},
		},
	}
	addr := startAPI(t, &api.Services{Keys: keys, Cost: store})
	sel := []string{"--addr", addr, "--start", "2026-11-21T10:00:00Z", "--end", "2026-11-21T12:00:00Z"}
	start, end := t10, t10.Add(2*time.Hour)

	out, errOut, err := runArgs(t, nil, slices.Concat([]string{"cost", "--key", "tm_finance", "--step", "hour", "--group-by", "tenant_id",
		"--idle-policy", "shared_even", "--page-size", "1", "--output", "csv"}, sel)...)
	if err != nil {
		t.Fatalf("cost: %v", err)
	}
	want := `tenant_id,start,currency,cost,busy_cost,idle_cost,requests,input_tokens,output_tokens,cost_per_1k_output_tokens,cost_per_1k_tokens,busy_cost_per_1k_output_tokens,unattributed_requests,cost_per_request,gpu_seconds
__idle__,2026-11-21T10:00:00Z,USD,0.500000000,0.000000000,0.500000000,0,0,0,,,,0,,1800.000
__idle__,summary,USD,0.500000000,0.000000000,0.500000000,0,0,0,,,,0,,1800.000
acme,2026-11-21T10:00:00Z,USD,2.500000000,2.000000000,0.500000000,10,1000,500,5.000000000,1.666666667,4.000000000,0,0.250000000,5400.000
acme,2026-11-21T11:00:00Z,USD,1.000000000,1.000000000,0.000000000,4,400,100,10.000000000,2.000000000,10.000000000,2,0.250000000,1.000
acme,summary,USD,3.500000000,3.000000000,0.500000000,14,1400,600,5.833333333,1.750000000,5.000000000,2,0.250000000,5401.000
globex,2026-11-21T10:00:00Z,USD,0.000000000,0.000000000,0.000000000,3,300,30,0.000000000,0.000000000,0.000000000,3,0.000000000,0.000
globex,summary,USD,0.000000000,0.000000000,0.000000000,3,300,30,0.000000000,0.000000000,0.000000000,3,0.000000000,0.000
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("cost CSV (-want +got):\n%s", diff)
	}
	if want := "warning: 5 requests ran on deployments without GPU samples: their cost is not included (500 input and 50 output tokens)\n"; errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
	wantQ := query.CostQuery{Start: start, End: end, Step: "hour", GroupBy: []string{"tenant_id"}, Busy: "tokens", Idle: "shared_even"}
	cq, _ := store.queries()
	if len(cq) != 3 {
		t.Errorf("%d cost queries, want 3 (one per page)", len(cq))
	}
	for i, q := range cq {
		if diff := cmp.Diff(wantQ, q); diff != "" {
			t.Errorf("cost query %d (-want +got):\n%s", i, diff)
		}
	}

	// A tenant key gets its own usage; the provider's cost is the
	// operator's (meterd --tenant-cost is off), so no cost comes back,
	// and the table shows it missing, not zero.
	out, _, err = runArgs(t, nil, slices.Concat([]string{"cost", "--key", "tm_acme", "--busy-policy", "weighted_tokens"}, sel)...)
	if err != nil {
		t.Fatalf("cost with a tenant key: %v", err)
	}
	want = `START    COST  BUSY  IDLE  REQUESTS  INPUT  OUTPUT  COST/1K_OUT  COST/1K_TOK  BUSY/1K_OUT  UNATTR_REQ  COST/REQ  GPU_SEC
SUMMARY     -     -     -        14   1400     600            -            -            -           0         -        -

Busy policy weighted_tokens, idle policy separate (idle cost in tenant __idle__). Amounts in USD; price versions: v1, v2.
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("tenant's cost table (-want +got):\n%s", diff)
	}
	cq, _ = store.queries()
	if got, want := cq[len(cq)-1], (query.CostQuery{TenantID: "acme", Start: start, End: end, Step: "total", Busy: "weighted_tokens", Idle: "separate"}); !cmp.Equal(want, got) {
		t.Errorf("tenant key's cost query %+v, want %+v", got, want)
	}

	out, _, err = runArgs(t, nil, slices.Concat([]string{"gpu-usage", "--key", "tm_finance", "--group-by", "gpu_type", "--output", "csv"}, sel)...)
	if err != nil {
		t.Fatalf("gpu-usage: %v", err)
	}
	want = `gpu_type,start,currency,gpu_hours,busy_gpu_hours,idle_gpu_hours,utilization,coverage,max_gpus,energy_kwh,cost,idle_cost,unpriced_gpu_hours,tokens_per_gpu_hour
h100,summary,USD,4,3,1,0.75,1,4,2,10.000000000,2.500000000,0,1000000
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("GPU usage CSV (-want +got):\n%s", diff)
	}
	if _, gq := store.queries(); !cmp.Equal(gq, []query.GPUUsageQuery{{Start: start, End: end, Step: "total", GroupBy: []string{"gpu_type"}}}) {
		t.Errorf("GPU usage queries %+v", gq)
	}

	// A tenant key may not read another tenant's cost, nor GPU usage.
	var ae *apiError
	for _, args := range [][]string{{"cost", "--tenant", "globex"}, {"gpu-usage"}} {
		_, _, err := runArgs(t, nil, slices.Concat(args, []string{"--key", "tm_acme"}, sel)...)
		if !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
			t.Errorf("%v with a tenant key: error %v, want 403", args, err)
		}
	}
}
