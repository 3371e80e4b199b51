package chstore_test

import (
	"context"
	"testing"
	"time"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"
)

// TestGPUUsageGroupsWithNULKeepTheirTokens: two (deployment, gpu_type)
// groups that a "\x00"-joined key merges each get their own tokens.
func TestGPUUsageGroupsWithNULKeepTheirTokens(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	hour := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	groups := [][2]string{{"a\x00b", "c"}, {"a", "b\x00c"}}
	var gpu []rollup.GPUHourRow
	var cost []rollup.CostRow
	for i, g := range groups {
		gpu = append(gpu, rollup.GPUHourRow{Hour: hour, Deployment: g[0], GPUType: g[1], GPUs: 1, Samples: 1, GPUSeconds: 3600, CoveredSeconds: 3600})
		cost = append(cost, rollup.CostRow{Hour: hour, TenantID: "t", Deployment: g[0], Model: "m", GPUType: g[1],
			Requests: 1, InputTokens: uint64(10 * (i + 1)), OutputTokens: uint64(i + 1)})
	}
	if err := s.WriteCost(ctx, gpu, cost, 1); err != nil {
		t.Fatal(err)
	}
	rows, err := query.New(s, query.Config{}).GPUUsage(ctx, query.GPUUsageQuery{Start: hour, End: hour.Add(time.Hour), GroupBy: []string{"deployment", "gpu_type"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[[2]string][2]uint64{}
	for _, r := range rows {
		got[[2]string{r.Group["deployment"], r.Group["gpu_type"]}] = [2]uint64{r.InputTokens, r.OutputTokens}
	}
	want := map[[2]string][2]uint64{groups[0]: {10, 1}, groups[1]: {20, 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tokens per group (-want +got):\n%s", diff)
	}
}
