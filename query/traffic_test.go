package query_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// trafficEvents are n events over the first hours of day, in bursts: each
// (tenant, model, deployment) has busy minutes of its own, so that the
// busiest minute of a merged series is often no row's busiest minute.
func trafficEvents(n int) []*meterv1.InferenceEvent {
	rng := rand.New(rand.NewPCG(13, 4))
	tenants, models, deps := []string{"acme", "globex"}, []string{"m1", "m2"}, []string{"d1", "d2"}
	var out []*meterv1.InferenceEvent
	for i := range n {
		tenant, model, dep := tenants[rng.IntN(2)], models[rng.IntN(2)], deps[rng.IntN(2)]
		minute := rng.IntN(150)
		if rng.IntN(3) == 0 { // a burst in a few minutes of the group's own
			minute = (len(tenant)*7 + len(model)*int(model[1]) + int(dep[1])*13 + rng.IntN(3)*41) % 150
		}
		ev := &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("t%d", i), TenantId: tenant, Model: model, Deployment: dep,
			CompletedAt:  timestamppb.New(day.Add(time.Duration(minute)*time.Minute + time.Duration(rng.IntN(60_000))*time.Millisecond)),
			PromptTokens: proto.Int64(int64(rng.IntN(2000))), OutputTokens: proto.Int64(int64(1 + rng.IntN(700))),
			TtftMs: proto.Float64(50), E2EMs: proto.Float64(500),
		}
		if i%13 == 0 {
			ev.Status = meterv1.Status_STATUS_TIMEOUT
		}
		out = append(out, ev)
	}
	return out
}

// bruteTraffic computes the traffic rows of q from the events, in Go: per
// step and series, the counters and the busiest minute.
func bruteTraffic(events []*meterv1.InferenceEvent, q query.RollupQuery) []query.TrafficRow {
	q, _ = q.Normalize()
	type minuteKey struct {
		row    string
		minute int64
	}
	rows := map[string]*query.TrafficRow{}
	minutes := map[minuteKey]*[2]uint64{}
	seen := map[string]bool{}
	for _, ev := range events {
		at := ev.GetCompletedAt().AsTime()
		id := ev.GetTenantId() + "/" + ev.GetEventId()
		if seen[id] || at.Before(q.Start) || !at.Before(q.End) || (q.TenantID != "" && ev.GetTenantId() != q.TenantID) {
			continue
		}
		seen[id] = true
		group := map[string]string{}
		dims := map[string]string{"tenant_id": ev.GetTenantId(), "model": ev.GetModel(), "model_version": ev.GetModelVersion(),
			"deployment": ev.GetDeployment(), "gpu_type": ev.GetGpuType(), "slo_class": ev.GetSloClass()}
		for _, f := range q.GroupBy {
			group[f] = dims[f]
		}
		start := rollup.StepStart(q.Step, at, q.Start)
		key := fmt.Sprint(start.Unix(), group)
		r := rows[key]
		if r == nil {
			r = &query.TrafficRow{Start: start, Group: group, ErrorsBy: map[string]uint64{}}
			for _, c := range rollup.StatusClasses {
				r.ErrorsBy[c] = 0
			}
			rows[key] = r
		}
		r.Requests++
		if ev.GetStatus() != meterv1.Status_STATUS_UNSPECIFIED && ev.GetStatus() != meterv1.Status_STATUS_OK {
			r.Errors++
			r.ErrorsBy["timeout"]++
		}
		r.PromptTokens += uint64(ev.GetPromptTokens())
		r.OutputTokens += uint64(ev.GetOutputTokens())
		mk := minuteKey{key, at.Unix() / 60}
		if minutes[mk] == nil {
			minutes[mk] = &[2]uint64{}
		}
		minutes[mk][0]++
		minutes[mk][1] += uint64(ev.GetOutputTokens())
		r.PeakMinuteRequests = max(r.PeakMinuteRequests, minutes[mk][0])
		r.PeakMinuteOutputTokens = max(r.PeakMinuteOutputTokens, minutes[mk][1])
	}
	var out []query.TrafficRow
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b query.TrafficRow) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		for _, f := range q.GroupBy {
			if c := strings.Compare(a.Group[f], b.Group[f]); c != 0 {
				return c
			}
		}
		return 0
	})
	return out
}

// trafficQueries are queries of every kind of source over the events of
// trafficEvents: 90 days at day, month and total steps (refused before the
// hour rows kept peaks: 129,600 minute buckets), the hours at hour step,
// and a range not on whole hours, for every form of group_by (none, the
// tenant, every dimension, some), across tenants and for one.
func trafficQueries() []query.RollupQuery {
	long := day.Add(-60 * rollup.Day)
	ranges := []struct {
		start, end time.Time
		step       string
	}{
		{long, long.Add(90 * rollup.Day), "day"},
		{long, long.Add(90 * rollup.Day), "month"},
		{long, long.Add(90 * rollup.Day), "total"},
		{day, day.Add(3 * time.Hour), "hour"},
		{day.Add(17 * time.Minute), day.Add(2*time.Hour + 5*time.Minute), "hour"},
	}
	var out []query.RollupQuery
	for _, r := range ranges {
		for _, g := range [][]string{nil, {"tenant_id"}, rollup.RollupGroupFields, {"model"}, {"tenant_id", "deployment"}} {
			for _, tenant := range []string{"", "acme"} {
				out = append(out, query.RollupQuery{TenantID: tenant, Start: r.start, End: r.end, Step: r.step, GroupBy: g})
			}
		}
	}
	// One tenant's series with every other dimension: one hour row each.
	return append(out, query.RollupQuery{TenantID: "globex", Start: long, End: long.Add(90 * rollup.Day), Step: "day",
		GroupBy: []string{"model", "model_version", "deployment", "gpu_type", "slo_class"}})
}

// checkTraffic compares every query of trafficQueries with bruteTraffic.
func checkTraffic(t *testing.T, s *chstore.Store, events []*meterv1.InferenceEvent, what string) {
	t.Helper()
	for _, q := range trafficQueries() {
		got, err := reads(s).Traffic(context.Background(), q)
		if err != nil {
			t.Fatalf("%s: %+v: %v", what, q, err)
		}
		want := bruteTraffic(events, q)
		if len(want) == 0 {
			t.Fatalf("%s: %+v: no rows expected", what, q)
		}
		// Token sizes: TestTokenSizesExact.
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(query.TrafficRow{}, "Sizes")); diff != "" {
			t.Errorf("%s: %+v (-want +got):\n%s", what, q, diff)
		}
	}
}

// TestTrafficLongRangesExactPeaks checks that traffic over 90 days is
// answered at day, month and total steps, with every step's busiest minute
// equal to the one counted from the events minute by minute, for every
// form of group_by; with and without day rollups, and from hour rows of
// several computations (only the newest counts).
func TestTrafficLongRangesExactPeaks(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	events := trafficEvents(6000)
	chstoretest.Insert(t, s, append(events, events[:300]...)) // with duplicates
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive"}
	for h := day; h.Before(day.Add(3 * time.Hour)); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	checkTraffic(t, s, events, "hour rollups")

	// A second computation of an hour after a late event, and the day
	// rolled up: the tenant series at day steps and more read the day row.
	late := trafficEvents(1)[0]
	late.EventId, late.CompletedAt = "late", timestamppb.New(day.Add(time.Hour+30*time.Minute))
	chstoretest.Insert(t, s, []*meterv1.InferenceEvent{late})
	events = append(events, late)
	if err := rollupHour(t, s, day.Add(time.Hour), spec, uint64(day.Unix())+1e6); err != nil {
		t.Fatal(err)
	}
	if ok, err := rollup.RollupDay(ctx, s, day, uint64(day.Unix())+2e6); err != nil || !ok {
		t.Fatalf("roll up %s: %v, %v", day, ok, err)
	}
	if fresh, err := rollup.FreshDays(ctx, s, day.Add(-60*rollup.Day), day.Add(30*rollup.Day)); err != nil || len(fresh) != 1 {
		t.Fatalf("fresh days: %v, %v; want %s", fresh, err, day)
	}
	checkTraffic(t, s, events, "a late event and the day rolled up")
}

// legacyStore writes the hour tables as they were before migration 0009:
// no busiest minute and no per-minute counts.
type legacyStore struct{ *chstore.Store }

func (l legacyStore) InsertRollupRecords(ctx context.Context, table string, rows []rollup.RollupRecord, sloVersion uint32, version uint64) error {
	old := slices.Clone(rows)
	for i := range old {
		old[i].MinuteRequests, old[i].MinuteOutput, old[i].PeakRequests, old[i].PeakOutput = nil, nil, 0, 0
	}
	return l.Store.InsertRollupRecords(ctx, table, old, sloVersion, version)
}

// TestTrafficHoursWithoutPeaks checks hours rolled up before migration
// 0009: they are listed for the rollup job to recompute, and until then
// queries take their peaks from the minute rows, exactly; day rows made of
// them too.
func TestTrafficHoursWithoutPeaks(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	events := trafficEvents(4000)
	chstoretest.Insert(t, s, events)
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive"}
	hours := []time.Time{day, day.Add(time.Hour), day.Add(2 * time.Hour)}
	for i, h := range hours {
		var store rollup.HourStore = s
		if i != 1 { // the middle hour recomputed after the migration
			store = legacyStore{s}
		}
		if _, err := rollup.RollupHour(ctx, store, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := rollup.RollupDay(ctx, s, day, uint64(day.Unix())+1e6); err != nil || !ok {
		t.Fatalf("roll up %s: %v, %v", day, ok, err)
	}
	got, err := s.HoursWithoutPeaks(ctx, time.Time{}, time.Unix(1<<32-1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Time{hours[0], hours[2]}; !slices.Equal(got, want) {
		t.Errorf("hours without peaks: %v, want %v", got, want)
	}
	checkTraffic(t, s, events, "two hours without peaks")

	for _, h := range []time.Time{hours[0], hours[2]} {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())+1); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.HoursWithoutPeaks(ctx, time.Time{}, time.Unix(1<<32-1, 0)); err != nil || len(got) != 0 {
		t.Errorf("hours without peaks after their recompute: %v, %v; want none", got, err)
	}
	checkTraffic(t, s, events, "every hour recomputed")
}

// TestHourPeaksEveryLevel checks the busiest minute stored at each level
// of an hour: a tenant's is the busiest minute of the sum of its groups (8
// requests in minute 5), not the largest of their own (5); the total's,
// of everything; and a series merging rows of several tenants (group_by
// model) is summed minute by minute (m1: 7 in minute 5, no row's peak).
func TestHourPeaksEveryLevel(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	hour := day.Add(4 * time.Hour)
	var events []*meterv1.InferenceEvent
	add := func(tenant, model string, minute, n int, output int64) {
		for range n {
			events = append(events, &meterv1.InferenceEvent{
				EventId: fmt.Sprintf("p%d", len(events)), TenantId: tenant, Model: model, Deployment: "d",
				CompletedAt:  timestamppb.New(hour.Add(time.Duration(minute)*time.Minute + time.Duration(len(events))*time.Second%time.Minute)),
				PromptTokens: proto.Int64(1), OutputTokens: proto.Int64(output), TtftMs: proto.Float64(5), E2EMs: proto.Float64(9),
			})
		}
	}
	add("acme", "m1", 3, 5, 100) // acme/m1: 5 requests, 500 tokens
	add("acme", "m1", 5, 4, 10)
	add("acme", "m2", 7, 5, 10)  // acme/m2: 5 requests
	add("acme", "m2", 5, 4, 10)  // acme: 8 requests in minute 5
	add("globex", "m1", 5, 3, 1) // m1: 7 requests in minute 5; total 11
	add("globex", "m1", 9, 6, 30)
	chstoretest.Insert(t, s, events)
	if err := rollupHour(t, s, hour, rollup.GoodputSpec{Version: 1}, 1); err != nil {
		t.Fatal(err)
	}
	type peak struct {
		group             string
		requests, outputs uint64
	}
	for _, tc := range []struct {
		q    query.RollupQuery
		want []peak
	}{
		{query.RollupQuery{}, []peak{{"map[]", 11, 500}}},
		{query.RollupQuery{GroupBy: []string{"tenant_id"}}, []peak{{"map[tenant_id:acme]", 8, 500}, {"map[tenant_id:globex]", 6, 180}}},
		{query.RollupQuery{TenantID: "acme"}, []peak{{"map[]", 8, 500}}},
		{query.RollupQuery{GroupBy: rollup.RollupGroupFields}, []peak{
			{"map[deployment:d gpu_type: model:m1 model_version: slo_class: tenant_id:acme]", 5, 500},
			{"map[deployment:d gpu_type: model:m2 model_version: slo_class: tenant_id:acme]", 5, 50},
			{"map[deployment:d gpu_type: model:m1 model_version: slo_class: tenant_id:globex]", 6, 180}}},
		{query.RollupQuery{GroupBy: []string{"model"}}, []peak{{"map[model:m1]", 7, 500}, {"map[model:m2]", 5, 50}}},
	} {
		q := tc.q
		q.Start, q.End, q.Step = hour, hour.Add(time.Hour), "hour"
		rows, err := reads(s).Traffic(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var got []peak
		for _, r := range rows {
			got = append(got, peak{fmt.Sprint(r.Group), r.PeakMinuteRequests, r.PeakMinuteOutputTokens})
		}
		if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(peak{})); diff != "" {
			t.Errorf("%+v: busiest minutes (-want +got):\n%s", tc.q, diff)
		}
	}
}
