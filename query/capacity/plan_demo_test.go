package capacity_test

import (
	"context"
	"math/big"
	"strings"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/internal/testkit/capacitytest"
	"tokenmeter/query/capacity"
)

// TestPlanOverTheDemoFleet runs the fleet plan over the demo fleet (five
// weeks of capacitytest.DemoDeployments, each on one GPU type): a
// deployment's only measured type needs, for its forecast peak, exactly
// the GPUs its unit's "forecast peak" GPUs-needed figure gives (the same
// load, the same estimate); its cost per 1M tokens is the list price over
// the sustainable load, exact; the mix is that type alone; the book's other
// types say "not enough data"; the fleet sums the mixes.
func TestPlanOverTheDemoFleet(t *testing.T) {
	start := time.Date(2026, 9, 7, 0, 0, 0, 0, time.UTC)
	const days = 35
	fleet := capacitytest.Demo(start, days, capacitytest.DemoDeployments)
	book := &billing.PriceBook{Currency: "USD", GPUPrices: []billing.GPUPrice{
		{GPUType: "H100", EffectiveFrom: start, PerHour: 3_600_000_000},
		{GPUType: "A100", EffectiveFrom: start, PerHour: 1_800_000_000},
		{GPUType: "L40S", EffectiveFrom: start, PerHour: 1_100_000_000},
		{GPUType: "H200", EffectiveFrom: start, PerHour: 4_500_000_000},
	}}
	r, err := capacity.Build(context.Background(), fleet, capacity.Query{Start: start, End: start.Add(days * 24 * time.Hour), Currency: "USD", Prices: book})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Plans) != len(capacitytest.DemoDeployments) {
		t.Fatalf("%d plans, want %d", len(r.Plans), len(capacitytest.DemoDeployments))
	}
	var gpus, cost int64
	for _, p := range r.Plans {
		var d capacitytest.Deployment
		for _, dd := range capacitytest.DemoDeployments {
			if dd.Name == p.Deployment {
				d = dd
			}
		}
		var u *capacity.Unit
		for i := range r.Units {
			if r.Units[i].Name == p.Deployment {
				u = &r.Units[i]
			}
		}
		if u == nil || u.Trend.Forecast == nil || !p.LoadKnown || p.LoadTokensPerSecond != u.Trend.Forecast.TokensPerSecond {
			t.Fatalf("%s: plan load %v, unit %+v", p.Deployment, p.LoadTokensPerSecond, u)
		}
		o := p.Options[0]
		if o.GPUType != d.GPUType || !o.Measured || o.Sustainable != u.Sustainable || len(p.Options) != 4 {
			t.Fatalf("%s: first option %+v, want %s with the unit's estimate %+v", p.Deployment, o, d.GPUType, u.Sustainable)
		}
		for _, other := range p.Options[1:] {
			if other.Measured || other.CostKnown || !strings.HasPrefix(other.NotEnoughData, "not enough data: ") {
				t.Errorf("%s: unmeasured option %+v", p.Deployment, other)
			}
		}
		var forecast *capacity.GPUsNeeded
		for i := range u.Needed {
			if strings.HasPrefix(u.Needed[i].For, "forecast peak") {
				forecast = &u.Needed[i]
			}
		}
		if forecast == nil || o.GPUs != forecast.GPUs {
			t.Errorf("%s: %d GPUs alone, the unit's forecast needs %+v", p.Deployment, o.GPUs, forecast)
		}
		// The estimate's hour: its tokens over its GPU-seconds.
		var tokens uint64
		for _, row := range fleet.Use {
			if row.Group["deployment"] == d.Name && row.Start.Equal(o.Sustainable.Hour) {
				tokens += row.PromptTokens + row.OutputTokens
			}
		}
		perGPU := new(big.Rat).SetFrac(new(big.Int).SetUint64(tokens), big.NewInt(int64(d.GPUs)*3600))
		// The book's list price, not the price the samples paid.
		price, _ := book.GPUPrice(d.GPUType, "", "", r.End)
		want := new(big.Rat).Quo(new(big.Rat).Mul(big.NewRat(int64(price.PerHour), 1), big.NewRat(1_000_000, 3600)), perGPU)
		diff := new(big.Rat).Sub(new(big.Rat).SetInt64(o.CostPer1MNanos), want)
		if !o.CostKnown || diff.Cmp(big.NewRat(1, 2)) > 0 || diff.Cmp(big.NewRat(-1, 2)) < 0 {
			t.Errorf("%s: cost per 1M %d nanos, want %s", p.Deployment, o.CostPer1MNanos, want.FloatString(3))
		}
		if !p.MixKnown || len(p.Mix) != 1 || p.Mix[0].GPUType != d.GPUType || p.Mix[0].GPUs != o.GPUs || p.MixCostPerHourNanos != o.CostPerHourNanos ||
			p.MixAtMost != o.Sustainable.LowerBound {
			t.Errorf("%s: mix %+v (%d per hour, at most %v), want %d × %s", p.Deployment, p.Mix, p.MixCostPerHourNanos, p.MixAtMost, o.GPUs, d.GPUType)
		}
		gpus += p.MixGPUs
		cost += p.MixCostPerHourNanos
	}
	// chat-prod saturates (an estimate), batch-spare never does (a bound).
	for _, p := range r.Plans {
		switch p.Deployment {
		case "chat-prod":
			if p.Options[0].Sustainable.LowerBound || p.MixAtMost {
				t.Errorf("chat-prod: %+v, want an estimate", p.Options[0].Sustainable)
			}
		case "batch-spare":
			if !p.Options[0].Sustainable.LowerBound || !strings.Contains(p.Options[0].CostArithmetic, "= at most USD ") {
				t.Errorf("batch-spare: %+v, want a lower bound", p.Options[0])
			}
		}
	}
	if f := r.FleetPlan; f.Deployments != len(r.Plans) || f.GPUs != gpus || f.CostPerHourNanos != cost || len(f.Missing) != 0 || !f.AtMost {
		t.Errorf("fleet plan %+v, want %d GPUs at %d per hour", f, gpus, cost)
	}
}
