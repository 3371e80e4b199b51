package rollup_test

import (
	"testing"
	"time"
	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/billing"
)

// TestComputeCostPairsDoNotCollide: (tenant, model) pairs whose joined
// names would be equal ("a\x1fb"+"c" and "a"+"b\x1fc") stay two cost lines,
// instead of failing the hour as a repeated tenant.
func TestComputeCostPairsDoNotCollide(t *testing.T) {
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	book, err := billing.ParsePriceBook([]byte(`{"gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	samples := []rollup.GPUSampleRow{{Deployment: "d", GPUType: "H100", Instance: "GPU-1", MIGFraction: 1, SampledAt: hour.Add(time.Minute), IntervalS: 3600, Utilization: 1}}
	usage := []rollup.DeploymentUsageRow{
		{Deployment: "d", TenantID: "a\x1fb", Model: "c", Requests: 1, InputTokens: 100, OutputTokens: 100},
		{Deployment: "d", TenantID: "a", Model: "b\x1fc", Requests: 1, InputTokens: 300, OutputTokens: 300},
	}
	_, rows, err := rollup.ComputeCost(hour, book, samples, usage)
	if err != nil {
		t.Fatal(err)
	}
	type line struct {
		tenant, model string
		input         uint64
	}
	var got []line
	for _, r := range rows {
		if r.TenantID != billing.IdleTenant {
			got = append(got, line{r.TenantID, r.Model, r.InputTokens})
		}
	}
	want := []line{{"a", "b\x1fc", 300}, {"a\x1fb", "c", 100}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(line{})); diff != "" {
		t.Errorf("cost lines (-want +got):\n%s", diff)
	}
}
