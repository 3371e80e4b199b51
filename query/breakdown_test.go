package query_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
	"tokenmeter/rollup/sketch"
)

// breakdownEvents are n events over three hours with every latency a
// request can report, some without prefill or queue, some failed, some
// whose TTFT was taken from E2E (ttft_source=e2e), and output lengths in
// every output-length class.
func breakdownEvents(n int) []*meterv1.InferenceEvent {
	rng := rand.New(rand.NewPCG(33, 1))
	var out []*meterv1.InferenceEvent
	for i := range n {
		ev := &meterv1.InferenceEvent{
			EventId:     fmt.Sprintf("b%d", i),
			TenantId:    []string{"acme", "globex", "initech"}[i%3],
			Model:       []string{"m1", "m2"}[i%2],
			Deployment:  []string{"d1", "d2"}[i%5%2],
			SloClass:    []string{"interactive", "batch"}[i%7%2],
			CompletedAt: timestamppb.New(day.Add(time.Duration(rng.IntN(3*3600_000)) * time.Millisecond)),
		}
		if i%13 == 0 {
			ev.Status = meterv1.Status_STATUS_TIMEOUT
			ev.E2EMs = proto.Float64(30_000 + rng.Float64()*1000)
			out = append(out, ev)
			continue
		}
		output := []int64{1, 40, 255, 256, 700, 1023, 1024, 3000}[rng.IntN(8)] + int64(rng.IntN(3))
		ev.PromptTokens = proto.Int64(int64(rng.IntN(9000)))
		ev.OutputTokens = proto.Int64(output)
		ttft := 20 + rng.ExpFloat64()*300
		e2e := ttft + float64(output)*(10+rng.Float64()*30)
		ev.TtftMs, ev.E2EMs = proto.Float64(ttft), proto.Float64(e2e)
		if i%4 != 0 {
			ev.QueueMs = proto.Float64(rng.ExpFloat64() * 50)
		}
		if i%5 != 0 {
			ev.PrefillMs = proto.Float64(ttft * 0.6)
		}
		if i%10 == 3 {
			// --otlp-ttft-from-e2e: no TTFT was measured.
			ev.TtftMs = proto.Float64(e2e)
			ev.Labels = map[string]string{"ttft_source": "e2e"}
		}
		out = append(out, ev)
	}
	return out
}

// estimated reports whether ev's TTFT was taken from its E2E.
func estimated(ev *meterv1.InferenceEvent) bool { return ev.GetLabels()["ttft_source"] == "e2e" }

// bruteValues are the values of each latency metric (rollup.LatencyMetrics
// and query.HourLatencyMetrics) and the prompt and output tokens of the
// events of one step and group, counted as the docs define them.
type bruteValues map[string][]float64

func (b bruteValues) add(ev *meterv1.InferenceEvent) {
	put := func(m string, v float64) { b[m] = append(b[m], v) }
	ttft, hasTTFT := ev.GetTtftMs(), ev.TtftMs != nil && !estimated(ev)
	if hasTTFT {
		put("ttft", ttft)
	}
	if ev.ItlMs != nil {
		put("itl", ev.GetItlMs())
	} else if ev.TtftMs != nil && ev.E2EMs != nil && ev.GetOutputTokens() >= 2 && !estimated(ev) {
		put("itl", (ev.GetE2EMs()-ev.GetTtftMs())/float64(ev.GetOutputTokens()-1))
	}
	if ev.E2EMs != nil {
		put("e2e", ev.GetE2EMs())
		switch out := ev.GetOutputTokens(); {
		case out < 256:
			put("e2e_short", ev.GetE2EMs())
		case out < 1024:
			put("e2e_medium", ev.GetE2EMs())
		default:
			put("e2e_long", ev.GetE2EMs())
		}
		if hasTTFT {
			put("decode", max(ev.GetE2EMs()-ttft, 0))
		}
	}
	if ev.QueueMs != nil {
		put("queue", ev.GetQueueMs())
	}
	if ev.PrefillMs != nil {
		put("prefill", ev.GetPrefillMs())
	}
	put("prompt", float64(ev.GetPromptTokens()))
	put("output", float64(ev.GetOutputTokens()))
}

// bruteBreakdown groups the values of events in [start, end) per step and
// group of q.
func bruteBreakdown(events []*meterv1.InferenceEvent, q query.RollupQuery) map[string]bruteValues {
	out := map[string]bruteValues{}
	for _, ev := range events {
		at := ev.GetCompletedAt().AsTime()
		if at.Before(q.Start) || !at.Before(q.End) || (q.TenantID != "" && ev.GetTenantId() != q.TenantID) {
			continue
		}
		dims := map[string]string{"tenant_id": ev.GetTenantId(), "model": ev.GetModel(), "deployment": ev.GetDeployment(), "slo_class": ev.GetSloClass()}
		values := []string{}
		for _, f := range q.GroupBy {
			values = append(values, dims[f])
		}
		id := query.StepID(rollup.StepStart(q.Step, at, q.Start).Unix(), values)
		if out[id] == nil {
			out[id] = bruteValues{}
		}
		out[id].add(ev)
	}
	return out
}

// histStats are the stats a 1% histogram of values gives: the exact count,
// the histogram's quantiles and the exact mean.
func histStats(t *testing.T, values []float64) (count uint64, q []float64, mean float64) {
	t.Helper()
	var h sketch.Histogram
	var sum float64
	for _, v := range values {
		h.Add(v)
		sum += v
	}
	if len(values) == 0 {
		return 0, make([]float64, 4), 0
	}
	q, err := h.Quantiles(query.Quantiles...)
	if err != nil {
		t.Fatal(err)
	}
	return h.Count(), q, sum / float64(len(values))
}

// within reports whether got is within rel of want (relative), or both 0.
func within(got, want, rel float64) bool {
	return math.Abs(got-want) <= rel*math.Abs(want)
}

// TestLatencyBreakdownExact checks the latency breakdown against a brute
// force over the events: prefill, decode, queue and E2E per output-length
// class at hour, day and total steps (hour rows, tenant rows with the day
// rollup, all-tenant rows), the quantiles equal to those of a 1% histogram
// of the values, the counts exact, the means within 1% (prefill, decode,
// classes: from the histogram) or exact; TTFTs taken from E2E are in no
// TTFT or decode figure, and goodput does not check them against the TTFT
// threshold. Exact answers equal the exact quantiles. Minute steps carry
// none of the hour-only metrics.
func TestLatencyBreakdownExact(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	events := breakdownEvents(3000)
	chstoretest.Insert(t, s, append(events, events[:200]...)) // with duplicates
	// A TTFT threshold that every estimated TTFT (its E2E) fails.
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive", Rules: []rollup.GoodputRule{{TTFTMs: 400}}}
	for h := day; h.Before(day.Add(3 * time.Hour)); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := rollup.RollupDay(ctx, s, day, uint64(day.Unix())+1e6); err != nil || !ok {
		t.Fatalf("roll up %s: %v, %v", day, ok, err)
	}
	end := day.Add(24 * time.Hour)
	svc := reads(s)
	metrics := slices.Concat(rollup.LatencyMetrics, query.HourLatencyMetrics)
	// Where each grouping reads its hour-only metrics (rollup.HourDistTables):
	// the all-tenant rows keep them all, the group rows decode.
	all, groupRows := query.HourLatencyMetrics, []string{"decode"}
	for _, c := range []struct {
		q    query.RollupQuery
		kept []string
	}{
		{query.RollupQuery{Start: day, End: end, Step: "hour", GroupBy: []string{"model", "deployment"}}, all},
		{query.RollupQuery{Start: day, End: end, Step: "day", GroupBy: []string{"tenant_id"}}, groupRows},
		{query.RollupQuery{Start: day, End: end, Step: "total"}, all},
		{query.RollupQuery{Start: day, End: end, Step: "hour", TenantID: "globex", GroupBy: []string{"slo_class"}}, groupRows},
	} {
		q := c.q
		q.Columns = query.LatencyBreakdownColumns
		rows, err := svc.Rollups(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		nq, _ := q.Normalize()
		series, _, err := query.LatencySeriesOf(nq, page(t, nq.GroupBy), rows)
		if err != nil {
			t.Fatal(err)
		}
		want := bruteBreakdown(events, nq)
		points := 0
		for _, sr := range series {
			var values []string
			for _, f := range nq.GroupBy {
				values = append(values, sr.Group[f])
			}
			for _, p := range sr.Points {
				points++
				b := want[query.StepID(p.Start.Unix(), values)]
				for _, m := range metrics {
					got := p.Metrics[m]
					if slices.Contains(query.HourLatencyMetrics, m) && !slices.Contains(c.kept, m) {
						if got != nil {
							t.Errorf("%+v: %s: %s answered where its rows do not keep it", q, p.Start, m)
						}
						continue
					}
					if got == nil {
						t.Fatalf("%+v: %s: no %s", q, p.Start, m)
					}
					n, wq, mean := histStats(t, b[m])
					if got.Count != n || !slices.Equal([]float64{got.P50, got.P90, got.P95, got.P99}, wq) {
						t.Errorf("%+v %v %s: %s count %d p50-p99 %v %v %v %v, want %d %v", q, sr.Group, p.Start, m, got.Count, got.P50, got.P90, got.P95, got.P99, n, wq)
					}
					tol := 1e-9
					if slices.Contains(query.HourLatencyMetrics, m) {
						tol = sketch.RelativeAccuracy
					}
					if !within(got.Mean, mean, tol) {
						t.Errorf("%+v %s: %s mean %v, want %v (within %v)", q, p.Start, m, got.Mean, mean, tol)
					}
				}
				if p.Metrics["e2e_short"] == nil {
					continue
				}
				if n := p.Metrics["e2e_short"].Count + p.Metrics["e2e_medium"].Count + p.Metrics["e2e_long"].Count; n != p.Metrics["e2e"].Count {
					t.Errorf("%s: output classes count %d requests, e2e %d", p.Start, n, p.Metrics["e2e"].Count)
				}
			}
		}
		if points != len(want) || points == 0 {
			t.Errorf("%+v: %d points, want %d", q, points, len(want))
		}
	}

	// Exact answers: the exact nearest-rank quantiles of the same values.
	q := query.RollupQuery{Start: day, End: day.Add(3 * time.Hour), Step: "hour", GroupBy: []string{"tenant_id"}}
	raw, err := svc.RawLatency(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	nq, _ := q.Normalize()
	series, _, err := query.ExactLatencySeriesOf(nq, page(t, nq.GroupBy), raw)
	if err != nil {
		t.Fatal(err)
	}
	want := bruteBreakdown(events, nq)
	for _, sr := range series {
		for _, p := range sr.Points {
			b := want[query.StepID(p.Start.Unix(), []string{sr.Group["tenant_id"]})]
			for _, m := range metrics {
				vals := slices.Sorted(slices.Values(b[m]))
				if len(vals) == 0 {
					t.Fatalf("exact %v %s: no %s values to compare", sr.Group, p.Start, m)
				}
				p99, err := sketch.ExactQuantile(vals, 0.99)
				if err != nil {
					t.Fatal(err)
				}
				if got := p.Metrics[m]; got.Count != uint64(len(vals)) || got.P99 != p99 {
					t.Errorf("exact %v %s: %s count %d p99 %v, want %d %v", sr.Group, p.Start, m, got.Count, got.P99, len(vals), p99)
				}
			}
		}
	}

	// Minute steps: no hour-only metric.
	mq := query.RollupQuery{Start: day, End: day.Add(10 * time.Minute), Step: "minute", Columns: query.LatencyBreakdownColumns}
	rows, err := svc.Rollups(ctx, mq)
	if err != nil {
		t.Fatal(err)
	}
	nmq, _ := mq.Normalize()
	ms, _, err := query.LatencySeriesOf(nmq, page(t, nmq.GroupBy), rows)
	if err != nil || len(ms) != 1 {
		t.Fatalf("minute latency: %d series, %v", len(ms), err)
	}
	if _, ok := ms[0].Summary.Metrics["decode"]; ok || ms[0].Summary.Metrics["ttft"] == nil {
		t.Errorf("minute steps: %v; want ttft, no decode", slices.Collect(maps.Keys(ms[0].Summary.Metrics)))
	}

	// Goodput: the TTFT threshold is not checked where TTFT was estimated.
	gq := query.RollupQuery{Start: day, End: end, Step: "total", Columns: query.CounterColumns}
	grows, err := svc.Rollups(ctx, gq)
	if err != nil || len(grows) != 1 {
		t.Fatalf("goodput rows %v, %v", grows, err)
	}
	var good, skipped uint64
	seen := map[string]bool{}
	for _, ev := range events {
		if seen[ev.GetEventId()] {
			continue
		}
		seen[ev.GetEventId()] = true
		ok := ev.GetStatus() == meterv1.Status_STATUS_UNSPECIFIED
		if ok && estimated(ev) {
			skipped++
		}
		if ok && (estimated(ev) || ev.GetTtftMs() <= 400) {
			good++
		}
	}
	if grows[0].GoodRequests != good || skipped == 0 {
		t.Errorf("good requests %d, want %d (%d with an estimated TTFT)", grows[0].GoodRequests, good, skipped)
	}
}

// TestTokenSizesExact checks tokens per request in usage and traffic
// against a brute force over the events: every request counted (failed ones
// with their tokens), the exact mean, and p50/p95/p99 equal to a 1%
// histogram's rounded to whole tokens; at hour, day (day rollups) and total
// steps, per tenant (tenant rows) and per model and deployment (all-tenant
// rows); none for groupings no rows keep them for, nor at minute steps.
func TestTokenSizesExact(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	events := breakdownEvents(2500)
	chstoretest.Insert(t, s, append(events, events[:100]...))
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive"}
	for h := day; h.Before(day.Add(3 * time.Hour)); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := rollup.RollupDay(ctx, s, day, uint64(day.Unix())+1e6); err != nil || !ok {
		t.Fatalf("roll up %s: %v, %v", day, ok, err)
	}
	svc := reads(s)
	end := day.Add(24 * time.Hour)
	check := func(what string, b bruteValues, kind string, got *query.TokenStats) {
		t.Helper()
		vals := b[kind]
		if got == nil {
			t.Errorf("%s: no %s tokens per request", what, kind)
			return
		}
		var h sketch.Histogram
		var sum float64
		for _, v := range vals {
			h.Add(v)
			sum += v
		}
		q, err := h.Quantiles(0.5, 0.95, 0.99)
		if err != nil {
			t.Fatal(err)
		}
		want := query.TokenStats{Requests: uint64(len(vals)), Mean: sum / float64(len(vals)), P50: math.Round(q[0]), P95: math.Round(q[1]), P99: math.Round(q[2])}
		if got.Requests != want.Requests || got.P50 != want.P50 || got.P95 != want.P95 || got.P99 != want.P99 || !within(got.Mean, want.Mean, 1e-12) {
			t.Errorf("%s: %s tokens per request %+v, want %+v", what, kind, *got, want)
		}
		// The rounded percentiles are within 1% (and half a token) of the exact ones.
		sorted := slices.Sorted(slices.Values(vals))
		exact, _ := sketch.ExactQuantile(sorted, 0.95)
		if math.Abs(got.P95-exact) > 0.01*exact+0.5 {
			t.Errorf("%s: %s p95 %v, exact %v", what, kind, got.P95, exact)
		}
	}
	for _, c := range []struct {
		q    query.RollupQuery
		kept bool // the rows of its grouping keep token sizes
	}{
		{query.RollupQuery{Start: day, End: end, Step: "hour", GroupBy: []string{"model"}}, true},
		{query.RollupQuery{Start: day, End: end, Step: "day", GroupBy: []string{"tenant_id"}}, true},
		{query.RollupQuery{Start: day, End: end, Step: "hour", TenantID: "acme"}, true},
		{query.RollupQuery{Start: day, End: end, Step: "total", GroupBy: []string{"model", "deployment"}}, true},
		{query.RollupQuery{Start: day, End: end, Step: "total", GroupBy: []string{"tenant_id", "model"}}, false},
		{query.RollupQuery{Start: day, End: end, Step: "hour"}, true},
	} {
		q := c.q
		all := bruteValues{} // a series' points' values
		nq, want := trafficSteps(t, svc, events, q, func(what string, p query.TrafficPoint, b bruteValues) {
			if !c.kept {
				if p.PromptTokensPerRequest != nil || p.OutputTokensPerRequest != nil {
					t.Errorf("%s: token sizes where no rows keep them", what)
				}
				return
			}
			check(what, b, "prompt", p.PromptTokensPerRequest)
			check(what, b, "output", p.OutputTokensPerRequest)
			for k, v := range b {
				all[k] = append(all[k], v...)
			}
		}, func(what string, sr query.TrafficSeries) {
			if c.kept {
				check(what, all, "output", sr.Summary.OutputTokensPerRequest)
			}
			all = bruteValues{}
		})

		if slices.Contains(q.GroupBy, "slo_class") {
			continue
		}
		usageSteps(t, svc, q, nq, want, func(what string, u query.UsageRow, b bruteValues) {
			if !c.kept {
				if u.Sizes != nil {
					t.Errorf("%s: token sizes where no rows keep them", what)
				}
				return
			}
			if u.Sizes == nil {
				t.Errorf("%s: no token sizes (%v)", what, u)
				return
			}
			for _, k := range []struct {
				name   string
				h      sketch.Histogram
				tokens int64
			}{{"prompt", u.Sizes.Prompt, u.PromptTokens}, {"output", u.Sizes.Output, u.OutputTokens}} {
				st, err := query.TokenStatsOf(k.h, uint64(k.tokens), uint64(u.Requests))
				if err != nil {
					t.Fatal(err)
				}
				check(what, b, k.name, st)
			}
		})
	}

	// Minute steps keep no token sizes.
	tr, err := svc.Traffic(ctx, query.RollupQuery{Start: day, End: day.Add(5 * time.Minute), Step: "minute", TokenSizes: true})
	if err != nil || len(tr) == 0 {
		t.Fatalf("minute traffic: %d rows, %v", len(tr), err)
	}
	for _, r := range tr {
		if r.Sizes != nil {
			t.Errorf("minute traffic %s has token sizes", r.Start)
		}
	}
}

// trafficSteps reads q's traffic with token sizes and calls point with each
// point of each series, the brute force over events of its step and its
// name in errors, then summary with each series and the name of its
// summary; it fails the test unless the points are the brute force's steps,
// one each. It returns q normalized and the brute force.
func trafficSteps(t *testing.T, svc *query.Service, events []*meterv1.InferenceEvent, q query.RollupQuery,
	point func(what string, p query.TrafficPoint, b bruteValues), summary func(what string, sr query.TrafficSeries),
) (query.RollupQuery, map[string]bruteValues) {
	t.Helper()
	nq, _ := q.Normalize()
	want := bruteBreakdown(events, nq)
	q.TokenSizes = true
	tr, err := svc.Traffic(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	series, _, err := query.TrafficSeriesOf(nq, page(t, nq.GroupBy), tr)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sr := range series {
		var values []string
		for _, f := range nq.GroupBy {
			values = append(values, sr.Group[f])
		}
		for _, p := range sr.Points {
			n++
			point(fmt.Sprintf("traffic %+v %v %s", q, sr.Group, p.Start), p, want[query.StepID(p.Start.Unix(), values)])
		}
		summary(fmt.Sprintf("traffic %+v %v summary", q, sr.Group), sr)
	}
	if n != len(want) {
		t.Errorf("traffic %+v: %d points, want %d", q, n, len(want))
	}
	return nq, want
}

// usageSteps reads the usage of q's range, tenant, step and grouping with
// token sizes and calls row with each row, the brute force of its step in
// want (by q normalized, nq) and its name in errors; it fails the test
// unless there are as many rows as steps.
func usageSteps(t *testing.T, svc *query.Service, q, nq query.RollupQuery, want map[string]bruteValues,
	row func(what string, u query.UsageRow, b bruteValues),
) {
	t.Helper()
	uq := query.UsageQuery{TenantID: q.TenantID, Start: q.Start, End: q.End, Granularity: q.Step, GroupBy: q.GroupBy, TokenSizes: true}
	usage, err := svc.Usage(t.Context(), uq)
	if err != nil {
		t.Fatal(err)
	}
	if len(usage) != len(want) {
		t.Errorf("usage %+v: %d rows, want %d", uq, len(usage), len(want))
	}
	for _, u := range usage {
		dims := map[string]string{"tenant_id": u.TenantID, "model": u.Model, "deployment": u.Deployment}
		var values []string
		for _, f := range nq.GroupBy {
			values = append(values, dims[f])
		}
		row(fmt.Sprintf("usage %+v %v", uq, u.Start), u, want[query.StepID(u.Start.Unix(), values)])
	}
}

// page is the first page of up to 1000 series.
func page(t *testing.T, groupBy []string) query.Page {
	t.Helper()
	p, err := query.NewPage(groupBy, 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
