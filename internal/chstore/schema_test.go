package chstore

import (
	"slices"
	"testing"

	"tokenmeter/rollup"
)

// TestSchemaMatchesRollup holds the tables' column stems equal to the
// vocabulary of the rollup package, which the records carry by position.
func TestSchemaMatchesRollup(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"dimensions", dimColumns, rollup.RollupGroupFields},
		{"error classes", errClasses, rollup.StatusClasses},
		{"distributions", distColumns, rollup.LatencyMetrics},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: columns %v, rollup has %v", c.name, c.got, c.want)
		}
	}
}
