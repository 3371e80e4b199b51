package chstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/rollup"
)

// TestDeploymentRegions reads the regions of deployments from the GPU
// cost rows through ClickHouse: each deployment's regions in the range,
// sorted, none for samples without a region, nothing outside the range.
func TestDeploymentRegions(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	h := time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC)
	row := func(at time.Time, dep, region string) rollup.GPUHourRow {
		return rollup.GPUHourRow{Hour: at, Deployment: dep, GPUType: "H100", Region: region, GPUs: 1, Samples: 1, GPUSeconds: 3600}
	}
	gpu := []rollup.GPUHourRow{
		row(h, "a", "us-east-1"), row(h.Add(time.Hour), "a", "us-east-1"),
		row(h, "b", "eu-west-1"), row(h.Add(-time.Hour), "b", "us-east-1"),
		row(h, "c", ""),
		row(h.Add(2*time.Hour), "d", "ap-south-1"), // after the range
	}
	if err := s.WriteCost(ctx, gpu, nil, 1); err != nil {
		t.Fatal(err)
	}
	got, err := s.DeploymentRegions(ctx, h.Add(-time.Hour), h.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"a": {"us-east-1"}, "b": {"eu-west-1", "us-east-1"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("regions (-want +got):\n%s", diff)
	}
}
