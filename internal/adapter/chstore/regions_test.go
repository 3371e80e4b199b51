package chstore

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRegionsSQL checks the query of DeploymentRegions: the hours of the
// range as arguments, samples without a region left out.
func TestRegionsSQL(t *testing.T) {
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	end := start.AddDate(0, 1, 0)
	stmt, args := regionsSQL(start, end)
	want := "SELECT deployment, arraySort(groupUniqArray(region)) FROM gpu_hour WHERE hour >= toDateTime(?) AND hour < toDateTime(?) AND region != '' GROUP BY deployment ORDER BY deployment"
	if stmt != want {
		t.Errorf("SQL\n got %s\nwant %s", stmt, want)
	}
	if diff := cmp.Diff([]any{start.Unix(), end.Unix()}, args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
}
