package chstore

import (
	"slices"
	"testing"

	"tokenmeter/billing"
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
		{"hour distributions", hourDistColumns, rollup.HourDists},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: columns %v, rollup has %v", c.name, c.got, c.want)
		}
	}
}

// TestSchemaMatchesBilling holds cost_hour's allocation columns equal to
// what billing's policy lists give, in their order (CostRow.Busy[b] and
// CostRow.Cost[b][i] follow them by position).
func TestSchemaMatchesBilling(t *testing.T) {
	// The migration shortens weighted_tokens to "weighted" in column names.
	stem := func(p billing.BusyPolicy) string {
		if p == billing.BusyWeightedTokens {
			return "weighted"
		}
		return string(p)
	}
	var wantBusy []string
	var wantCost [][]string
	for _, b := range billing.BusyPolicies() {
		wantBusy = append(wantBusy, "busy_"+stem(b))
		var row []string
		for _, i := range billing.IdlePolicies() {
			row = append(row, "cost_"+stem(b)+"_"+string(i))
		}
		wantCost = append(wantCost, row)
	}
	if !slices.Equal(busyColumns[:], wantBusy) {
		t.Errorf("busy columns %v, billing's policies give %v", busyColumns, wantBusy)
	}
	var gotCost [][]string
	for _, row := range allocationColumns {
		gotCost = append(gotCost, row[:])
	}
	if !slices.EqualFunc(gotCost, wantCost, slices.Equal) {
		t.Errorf("cost columns %v, billing's policies give %v", gotCost, wantCost)
	}
}
