package capacitytest

import (
	"context"
	"testing"
	"time"

	"tokenmeter/query/capacity"
)

// TestDemoReport checks that the demo fleet gives the report its tests
// expect: a saturating deployment with a sustainable throughput below its
// peak and a forecast, an over-provisioned one, and the three units.
func TestDemoReport(t *testing.T) {
	start := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC) // a Monday
	r, err := capacity.Build(context.Background(), Demo(start, 22, DemoDeployments),
		capacity.Query{Start: start, End: start.AddDate(0, 0, 22), Growth: "1.3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Units) != 3 || r.NotEnoughData != "" {
		t.Fatalf("%d units, not enough data %q; want 3 units", len(r.Units), r.NotEnoughData)
	}
	byName := map[string]capacity.Unit{}
	for _, u := range r.Units {
		byName[u.Name] = u
	}
	chat := byName["chat-prod"]
	// Attainment falls below 99% at 2,008 tokens/s per GPU (0.998 − 2·x/2,000).
	if s := chat.Sustainable; !s.Known || s.LowerBound || s.TokensPerSecondPerGPU > 2_008 || s.TokensPerSecondPerGPU < 1_950 {
		t.Errorf("chat-prod sustainable %+v: want a known estimate just below 2,008", s)
	}
	if !chat.HeadroomKnown || chat.Headroom >= 0 {
		t.Errorf("chat-prod headroom %v (known %v): want negative, its peak is past the knee", chat.Headroom, chat.HeadroomKnown)
	}
	if chat.Trend.Forecast == nil || len(chat.Trend.Weeks) != 3 {
		t.Errorf("chat-prod trend %+v: want 3 weeks and a forecast", chat.Trend)
	}
	over := false
	for _, f := range r.Findings {
		over = over || (f.Unit == "batch-spare" && f.Kind == "over_provisioned")
	}
	if !over {
		t.Errorf("findings %+v: want batch-spare over-provisioned", r.Findings)
	}
}
