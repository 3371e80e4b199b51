package workload

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"tokenmeter/billing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// demoPrices is the price book `make run` prices the demo fleet with.
var demoPrices = "../../deploy/prices.example.json"

// demoHour is one deployment-hour of the demo history.
type demoHour struct {
	requests, good  int
	tokens          int64
	charge          billing.Money
	gpuSec, busySec float64
	cost            float64
}

// TestDemoFleetEconomics replays the demo history in memory (the events of
// `make run`: DemoModels over DemoDuration) and checks what the demo must
// show: a gross margin of a real provider (list charge against GPU cost at
// deploy/prices.example.json), every deployment but the idle one with at
// least 24 hours of 100 requests, GPUs busy when traffic is high, the
// saturated deployment missing its SLO at its busiest hours and not
// before, and the idle one mostly idle.
func TestDemoFleetEconomics(t *testing.T) {
	data, err := os.ReadFile(demoPrices)
	if err != nil {
		t.Fatal(err)
	}
	book, err := billing.ParsePriceBook(data)
	if err != nil {
		t.Fatal(err)
	}
	events := 360_000
	end := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	start := end.Add(-DemoDuration)
	g, err := New(Config{Seed: 1, Start: start, Duration: DemoDuration, Events: events, Tenants: DefaultTenants,
		Models: DemoModels(), ErrorRate: DemoErrorRate, WeeklyGrowth: DemoWeeklyGrowth})
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		dep  string
		hour int64
	}
	hours := map[key]*demoHour{}
	at := func(dep string, ts time.Time) *demoHour {
		k := key{dep, ts.Truncate(time.Hour).Unix()}
		if hours[k] == nil {
			hours[k] = &demoHour{}
		}
		return hours[k]
	}
	var ev meterv1.InferenceEvent
	for i := range events {
		g.Fill(&ev, i)
		h := at(ev.GetDeployment(), ev.GetCompletedAt().AsTime())
		h.requests++
		ok := ev.GetStatus() == meterv1.Status_STATUS_OK
		if ev.GetSloClass() == "batch" {
			ok = ok && ev.GetE2EMs() <= 600_000
		} else {
			ok = ok && ev.TtftMs != nil && ev.GetTtftMs() <= 2000 && (ev.ItlMs == nil || ev.GetItlMs() <= 150)
		}
		if ok {
			h.good++
		}
		h.tokens += ev.GetPromptTokens() + ev.GetOutputTokens()
		c, _, priced := book.ListCharge(ev.GetModel(), ev.GetCompletedAt().AsTime(), ev.GetPromptTokens(), ev.GetCachedPromptTokens(), ev.GetOutputTokens())
		if !priced && ev.GetPromptTokens()+ev.GetOutputTokens() > 0 {
			t.Fatalf("no list price for %s", ev.GetModel())
		}
		h.charge += c
	}
	err = FleetSamples(FleetConfig{Start: start, Duration: DemoDuration, Interval: DemoSampleInterval, Models: DemoModels(),
		WeeklyGrowth: DemoWeeklyGrowth, Replicas: 1}, func(s *meterv1.GpuSample) error {
		h := at(s.GetDeployment(), s.GetSampledAt().AsTime().Add(-time.Nanosecond))
		h.gpuSec += s.GetIntervalS()
		h.busySec += s.GetIntervalS() * s.GetUtilization()
		p, ok := book.GPUPrice(s.GetGpuType(), s.GetPool(), s.GetRegion(), s.GetSampledAt().AsTime())
		if !ok {
			return fmt.Errorf("no GPU price for %s %s %s", s.GetGpuType(), s.GetPool(), s.GetRegion())
		}
		h.cost += float64(p.PerHour) / 1e9 * s.GetIntervalS() / 3600
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var charge, cost float64
	for _, m := range DemoModels() {
		var d demoHour
		qualifying := 0
		var list []*demoHour
		for k, h := range hours {
			if k.dep != m.Deployment {
				continue
			}
			list = append(list, h)
			d.requests += h.requests
			d.good += h.good
			d.tokens += h.tokens
			d.charge += h.charge
			d.gpuSec += h.gpuSec
			d.busySec += h.busySec
			d.cost += h.cost
			if h.requests >= 100 && h.gpuSec > 0 {
				qualifying++
			}
		}
		charge += float64(d.charge) / 1e9
		cost += d.cost
		t.Logf("%-22s %6d requests (%.2f%% good), %5.1fM tokens, %5.0f tokens/s per GPU, %3.0f%% busy, list $%8.2f, GPUs $%8.2f, margin %4.0f%%, %d qualifying hours",
			m.Deployment, d.requests, 100*float64(d.good)/float64(d.requests), float64(d.tokens)/1e6, float64(d.tokens)/d.gpuSec,
			100*d.busySec/d.gpuSec, float64(d.charge)/1e9, d.cost, 100*(1-d.cost/(float64(d.charge)/1e9)), qualifying)
		if m.Deployment != DemoIdle && qualifying < 24 {
			t.Errorf("%s: %d hours with 100 requests, want at least 24", m.Deployment, qualifying)
		}
		// By load (tokens, as the capacity report orders them): the busiest
		// tenth of the qualifying hours and the quietest half.
		slices.SortFunc(list, func(a, b *demoHour) int { return cmp.Compare(a.tokens, b.tokens) })
		var q []*demoHour
		for _, h := range list {
			if h.requests >= 100 && h.gpuSec > 0 {
				q = append(q, h)
			}
		}
		// GPUs busy when traffic is high: the busiest tenth of the hours by
		// requests against the quietest half.
		slices.SortFunc(list, func(a, b *demoHour) int { return cmp.Compare(a.requests, b.requests) })
		if busy, quiet := busyShare(list[len(list)*9/10:]), busyShare(list[:len(list)/2]); busy < quiet*1.3 {
			t.Errorf("%s: GPUs %.2f busy in the busiest tenth of the hours, %.2f in the quietest half: want them busier with traffic", m.Deployment, busy, quiet)
		}
		if len(q) > 0 {
			top := q[len(q)*9/10:]
			low := q[:len(q)/2]
			t.Logf("    attainment: quietest half %.3f, busiest tenth %.3f", attainment(low), attainment(top))
			if attainment(low) < 0.99 {
				t.Errorf("%s: attainment %.4f in the quietest hours, want at least 99%%", m.Deployment, attainment(low))
			}
			if m.Deployment == DemoSaturated && attainment(top) >= 0.97 {
				t.Errorf("%s: attainment %.4f in its busiest hours, want it to miss the SLO", m.Deployment, attainment(top))
			}
			// The others keep their SLO at every load, with room for the
			// odd failed request: an hour of 100 requests misses the 99%
			// target with two.
			if m.Deployment != DemoSaturated && attainment(top) < 0.998 {
				t.Errorf("%s: attainment %.4f in its busiest hours, want at least 99.8%% (only %s saturates)", m.Deployment, attainment(top), DemoSaturated)
			}
		}
		if m.Deployment == DemoIdle && d.busySec/d.gpuSec > 0.1 {
			t.Errorf("%s: %.0f%% busy, want an idle deployment", m.Deployment, 100*d.busySec/d.gpuSec)
		}
	}
	margin := 1 - cost/charge
	t.Logf("fleet: list charge $%.2f, GPU cost $%.2f, gross margin %.1f%%", charge, cost, 100*margin)
	if !(margin >= 0.3 && margin <= 0.7) || math.IsNaN(margin) {
		t.Errorf("gross margin %.1f%%, want a real provider's 30–70%%", 100*margin)
	}
}

func attainment(hs []*demoHour) float64 {
	var n, good int
	for _, h := range hs {
		n += h.requests
		good += h.good
	}
	return float64(good) / float64(n)
}

func busyShare(hs []*demoHour) float64 {
	var gpu, busy float64
	for _, h := range hs {
		gpu += h.gpuSec
		busy += h.busySec
	}
	return busy / gpu
}
