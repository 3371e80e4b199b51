package main

import (
	"strings"
	"testing"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The cost table's footer adds the rows' gross margin (list charge against
// GPU cost) when the answer priced their tokens, and nothing otherwise.
func TestCostNotesMargin(t *testing.T) {
	money := func(nanos int64) *meterv1.Money { return &meterv1.Money{Currency: "USD", Nanos: nanos} }
	all := &meterv1.GetCostResponse{Currency: "USD", BusyPolicy: "tokens", IdlePolicy: "separate", Series: []*meterv1.CostSeries{
		{Summary: &meterv1.CostPoint{Cost: money(600e9), ListCharge: money(1000e9)}},
		{Summary: &meterv1.CostPoint{Cost: money(300e9), ListCharge: money(500e9)}},
		{Summary: &meterv1.CostPoint{Cost: money(300e9)}}, // idle: cost, no charge
	}}
	footer, _ := costNotes(all)
	if want := "\nList charge USD 1500.00 against GPU cost USD 1200.00: gross margin 20.0%."; !strings.HasSuffix(footer, want) {
		t.Errorf("footer %q, want it to end with %q", footer, want)
	}
	for _, s := range all.Series {
		s.Summary.ListCharge = nil
	}
	if footer, _ := costNotes(all); strings.Contains(footer, "margin") {
		t.Errorf("footer %q names a margin without list charges", footer)
	}
}
