package query

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func TestUsageQueryNormalize(t *testing.T) {
	tests := []struct {
		name    string
		q       UsageQuery
		wantErr string
		group   []string
	}{
		{"defaults", UsageQuery{Start: t0, End: t0.Add(time.Hour)}, "", nil},
		{"canonical order and commas", UsageQuery{Start: t0, End: t0.Add(time.Hour), GroupBy: []string{"deployment,tenant_id", "model", "tenant_id"}}, "", []string{"tenant_id", "model", "deployment"}},
		{"unknown field", UsageQuery{Start: t0, End: t0.Add(time.Hour), GroupBy: []string{"region"}}, `unknown group_by field "region"`, nil},
		{"bad granularity", UsageQuery{Start: t0, End: t0.Add(time.Hour), Granularity: "week"}, `granularity "week"`, nil},
		{"end before start", UsageQuery{Start: t0, End: t0.Add(-time.Hour)}, "must be after start", nil},
		{"missing range", UsageQuery{}, "start and end are required", nil},
		{"too many buckets", UsageQuery{Start: t0, End: t0.Add(24 * 365 * time.Hour), Granularity: "minute"}, "coarser granularity", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.q.Normalize()
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidQuery) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Normalize() error = %v, want ErrInvalidQuery mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Normalize() = %v", err)
			}
			if diff := cmp.Diff(tt.group, got.GroupBy); diff != "" {
				t.Errorf("GroupBy (-want +got):\n%s", diff)
			}
		})
	}
}
