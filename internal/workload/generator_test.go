package workload

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var testStart = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)

func mustNew(t testing.TB, cfg Config) *Generator {
	t.Helper()
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return g
}

func TestDeterminism(t *testing.T) {
	cfg := Config{Seed: 42, Start: testStart, Events: 2000}
	a := mustNew(t, cfg).Events(cfg.Events)
	b := mustNew(t, cfg).Events(cfg.Events)
	if diff := cmp.Diff(a, b, protocmp.Transform()); diff != "" {
		t.Fatalf("same config, different events (-first +second):\n%s", diff)
	}

	// Fill into one reused message gives the same events as Next, in any order.
	g := mustNew(t, cfg)
	var ev meterv1.InferenceEvent
	for _, i := range []int{1999, 0, 17, 17, 1000, 3} {
		g.Fill(&ev, i)
		if diff := cmp.Diff(a[i], &ev, protocmp.Transform()); diff != "" {
			t.Errorf("Fill(reused, %d) differs from Next (-next +fill):\n%s", i, diff)
		}
	}

	other := mustNew(t, Config{Seed: 43, Start: testStart, Events: 2000}).Events(2000)
	seen := map[string]bool{}
	for _, ev := range a {
		seen[ev.GetEventId()] = true
	}
	same := 0
	for i, ev := range other {
		if seen[ev.GetEventId()] {
			t.Errorf("seed 43 event %d reuses ID %s of seed 42", i, ev.GetEventId())
		}
		if ev.GetPromptTokens() == a[i].GetPromptTokens() {
			same++
		}
	}
	if same > len(a)/10 {
		t.Errorf("seeds 42 and 43 agree on prompt_tokens of %d of %d events", same, len(a))
	}
}

func TestEventsAreValid(t *testing.T) {
	limits := ingest.DefaultLimits()
	for _, seed := range []int64{1, 2, 3, 42, 1 << 40, -7} {
		for _, cfg := range []Config{
			{Seed: seed, Start: testStart, Events: 20_000},
			{Seed: seed, Start: testStart.Add(7*time.Hour + 13*time.Second + 17), Duration: 90 * time.Minute, Events: 5000, Tenants: 30, ErrorRate: 0.2},
		} {
			g := mustNew(t, cfg)
			end := cfg.Start.Add(g.cfg.Duration)
			ids := make(map[string]bool, cfg.Events)
			var prev time.Time
			for i := 0; ; i++ {
				ev := g.Next()
				if ev == nil {
					if i != cfg.Events {
						t.Fatalf("seed %d: %d events, want %d", seed, i, cfg.Events)
					}
					break
				}
				if err := checkEvent(ev); err != nil {
					t.Fatalf("seed %d event %d: %v", seed, i, err)
				}
				// The server's own validation, at the end of the span.
				if err := limits.Validate(ev, end); err != nil {
					t.Fatalf("seed %d event %d rejected by ingest: %v", seed, i, err)
				}
				at := ev.GetCompletedAt().AsTime()
				if at.Before(cfg.Start) || !at.Before(end) {
					t.Fatalf("seed %d event %d: completed_at %s outside [%s, %s)", seed, i, at, cfg.Start, end)
				}
				if at.Before(prev) {
					t.Fatalf("seed %d event %d: completed_at %s before the previous %s", seed, i, at, prev)
				}
				prev = at
				if ids[ev.GetEventId()] {
					t.Fatalf("seed %d event %d: duplicate event_id %s", seed, i, ev.GetEventId())
				}
				ids[ev.GetEventId()] = true
			}
		}
	}
}

func TestDistribution(t *testing.T) {
	const n = 200_000
	g := mustNew(t, Config{Seed: 7, Start: testStart, Duration: 48 * time.Hour, Events: n})
	var (
		errs, streaming, cachedHits, batch int
		byStatus                           = map[meterv1.Status]int{}
		byTenant                           = map[string]int{}
		byModel                            = map[string]int{}
		byHour                             [24]int
		promptByModel                      = map[string][]float64{}
	)
	var ev meterv1.InferenceEvent
	for i := range n {
		g.Fill(&ev, i)
		byStatus[ev.GetStatus()]++
		if ev.GetStatus() != meterv1.Status_STATUS_OK {
			errs++
		}
		if ev.GetStreaming() {
			streaming++
		}
		if ev.GetCachedPromptTokens() > 0 {
			cachedHits++
		}
		if ev.GetSloClass() == "batch" {
			batch++
		}
		byTenant[ev.GetTenantId()]++
		byModel[ev.GetModel()]++
		byHour[ev.GetCompletedAt().AsTime().Hour()]++
		if ev.GetStatus() == meterv1.Status_STATUS_OK {
			promptByModel[ev.GetModel()] = append(promptByModel[ev.GetModel()], float64(ev.GetPromptTokens()))
		}
	}
	share := func(k int) float64 { return float64(k) / n }

	if s := share(errs); s < 0.02 || s > 0.05 {
		t.Errorf("error share %.4f, want 2%%–5%%", s)
	}
	for st, c := range byStatus {
		if st != meterv1.Status_STATUS_OK && st != meterv1.Status_STATUS_RATE_LIMITED && c >= byStatus[meterv1.Status_STATUS_RATE_LIMITED] {
			t.Errorf("%s (%d) at least as common as STATUS_RATE_LIMITED (%d)", st, c, byStatus[meterv1.Status_STATUS_RATE_LIMITED])
		}
	}
	for _, f := range failureMix {
		if byStatus[f.status] == 0 {
			t.Errorf("no %s in %d events", f.status, n)
		}
	}
	ids := TenantIDs(DefaultTenants)
	if len(byTenant) != len(ids) {
		t.Errorf("%d tenants seen, want %d", len(byTenant), len(ids))
	}
	if top, last := byTenant[ids[0]], byTenant[ids[len(ids)-1]]; top < 4*last {
		t.Errorf("tenant %s has %d events, %s %d: want the top tenant at least 4× the smallest", ids[0], top, ids[len(ids)-1], last)
	}
	if s := share(byTenant[ids[0]]); s < 0.25 || s > 0.6 {
		t.Errorf("top tenant share %.3f, want 0.25–0.6", s)
	}
	if len(byModel) != len(DefaultModels()) {
		t.Errorf("%d models seen, want %d", len(byModel), len(DefaultModels()))
	}
	if s := share(streaming); s < 0.6 || s > 0.95 {
		t.Errorf("streaming share %.3f, want 0.6–0.95", s)
	}
	if s := share(cachedHits); s < 0.15 || s > 0.6 {
		t.Errorf("prefix-cache hit share %.3f, want 0.15–0.6", s)
	}
	if s := share(batch); s < 0.01 || s > 0.5 {
		t.Errorf("batch share %.3f, want 0.01–0.5", s)
	}
	// Day and night: the peak hour carries about (1+A)/(1−A) = 3× the trough.
	peak, trough := byHour[PeakHourUTC], byHour[(PeakHourUTC+12)%24]
	if r := float64(peak) / float64(trough); r < 2.2 || r > 4 {
		t.Errorf("peak hour %d events, trough %d: ratio %.2f, want about 3", peak, trough, r)
	}
	// Prompt lengths are log-normal around each model's median.
	for _, m := range DefaultModels() {
		if med := median(promptByModel[m.Name]); med < 0.8*m.PromptMedian || med > 1.2*m.PromptMedian {
			t.Errorf("model %s: median prompt %.0f, want about %.0f", m.Name, med, m.PromptMedian)
		}
	}
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return math.NaN()
	}
	y := slices.Clone(x)
	slices.Sort(y)
	return y[len(y)/2]
}

func TestFlatAndErrorFree(t *testing.T) {
	g := mustNew(t, Config{Seed: 1, Start: testStart, Events: 48_000, ErrorRate: -1, DiurnalAmplitude: -1})
	var byHour [24]int
	var ev meterv1.InferenceEvent
	for i := range g.Len() {
		g.Fill(&ev, i)
		if ev.GetStatus() != meterv1.Status_STATUS_OK {
			t.Fatalf("event %d has status %s with ErrorRate < 0", i, ev.GetStatus())
		}
		byHour[ev.GetCompletedAt().AsTime().Hour()]++
	}
	for h, c := range byHour {
		if c < 1900 || c > 2100 {
			t.Errorf("hour %d: %d events, want about 2000 with a flat rate", h, c)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	badModel := DefaultModels()[:1]
	badModel[0].ITLMs = 0
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"defaults", Config{Start: testStart, Events: 1}, false},
		{"no start", Config{Events: 1}, true},
		{"no events", Config{Start: testStart}, true},
		{"negative duration", Config{Start: testStart, Events: 1, Duration: -time.Hour}, true},
		{"amplitude 1", Config{Start: testStart, Events: 1, DiurnalAmplitude: 1}, true},
		{"error rate above half", Config{Start: testStart, Events: 1, ErrorRate: 0.6}, true},
		{"empty models", Config{Start: testStart, Events: 1, Models: []Model{}}, true},
		{"bad model", Config{Start: testStart, Events: 1, Models: badModel}, true},
		{"one tenant", Config{Start: testStart, Events: 1, Tenants: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if got := err != nil; got != tt.wantErr {
				t.Errorf("New: error %v, want error: %v", err, tt.wantErr)
			}
		})
	}
}

func TestFillOutOfRangePanics(t *testing.T) {
	g := mustNew(t, Config{Start: testStart, Events: 3})
	defer func() {
		if recover() == nil {
			t.Error("Fill(ev, 3) with 3 events did not panic")
		}
	}()
	g.Fill(new(meterv1.InferenceEvent), 3)
}

func TestFillAllocatesOnlyIDs(t *testing.T) {
	g := mustNew(t, Config{Seed: 5, Start: testStart, Events: 1000})
	var ev meterv1.InferenceEvent
	i := 0
	for ; ; i++ { // a successful event, so that every field is in use
		if g.Fill(&ev, i); ev.GetStatus() == meterv1.Status_STATUS_OK {
			break
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { g.Fill(&ev, i) }); allocs > 1 {
		t.Errorf("Fill into a used message: %.1f allocations, want 1 (the ID string)", allocs)
	}
}

func BenchmarkFill(b *testing.B) {
	const n = 1 << 20
	g := mustNew(b, Config{Seed: 1, Start: testStart, Events: n})
	var ev meterv1.InferenceEvent
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		g.Fill(&ev, i&(n-1))
	}
}

func BenchmarkFillParallel(b *testing.B) {
	const n = 1 << 20
	g := mustNew(b, Config{Seed: 1, Start: testStart, Events: n})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var ev meterv1.InferenceEvent
		for i := 0; pb.Next(); i++ {
			g.Fill(&ev, i&(n-1))
		}
	})
}

func BenchmarkNext(b *testing.B) {
	g := mustNew(b, Config{Seed: 1, Start: testStart, Events: 1 << 30})
	b.ReportAllocs()
	for b.Loop() {
		_ = g.Next()
	}
}
