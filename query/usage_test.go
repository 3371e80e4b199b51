package query_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"
	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func event(i int) *meterv1.InferenceEvent {
	ev := &meterv1.InferenceEvent{
		EventId:     fmt.Sprintf("e%d", i),
		TenantId:    []string{"acme", "globex", "initech"}[i%3],
		Model:       []string{"m1", "m2"}[i%2],
		Deployment:  []string{"d1", "d2", "d3", "d4"}[i%4],
		CompletedAt: timestamppb.New(day.Add(time.Duration(i) * 37 * time.Second).Add(time.Duration(i%1000) * time.Millisecond)),
		Labels:      map[string]string{"b": "2", "a": "1"},
	}
	if i%11 == 0 {
		ev.Status = meterv1.Status_STATUS_OOM
		return ev
	}
	ev.PromptTokens = proto.Int64(int64(i % 4000))
	ev.CachedPromptTokens = proto.Int64(int64(i % 4000 / 3))
	ev.OutputTokens = proto.Int64(int64(i%500 + 1))
	ev.TtftMs = proto.Float64(100)
	ev.E2EMs = proto.Float64(900)
	return ev
}

// bruteUsage computes the expected rows in Go.
func bruteUsage(events []*meterv1.InferenceEvent, q query.UsageQuery) []query.UsageRow {
	q, _ = q.Normalize()
	seen := map[string]bool{}
	acc := map[string]*query.UsageRow{}
	for _, ev := range events {
		t := ev.GetCompletedAt().AsTime()
		if t.Before(q.Start) || !t.Before(q.End) || (q.TenantID != "" && ev.GetTenantId() != q.TenantID) {
			continue
		}
		id := ev.GetTenantId() + "/" + ev.GetEventId()
		if seen[id] {
			continue
		}
		seen[id] = true
		r := query.UsageRow{Start: rollup.StepStart(q.Granularity, t, q.Start)}
		for _, g := range q.GroupBy {
			switch g {
			case "tenant_id":
				r.TenantID = ev.GetTenantId()
			case "model":
				r.Model = ev.GetModel()
			case "deployment":
				r.Deployment = ev.GetDeployment()
			}
		}
		key := fmt.Sprint(r.Start.Unix(), r.TenantID, r.Model, r.Deployment)
		a := acc[key]
		if a == nil {
			a = &r
			acc[key] = a
		}
		a.Requests++
		if ev.GetStatus() != meterv1.Status_STATUS_UNSPECIFIED && ev.GetStatus() != meterv1.Status_STATUS_OK {
			a.Errors++
		}
		a.PromptTokens += ev.GetPromptTokens()
		a.CachedPromptTokens += ev.GetCachedPromptTokens()
		a.OutputTokens += ev.GetOutputTokens()
	}
	var out []query.UsageRow
	for _, r := range acc {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.Start.Equal(b.Start) {
			return a.Start.Before(b.Start)
		}
		return fmt.Sprint(a.TenantID, "\x00", a.Model, "\x00", a.Deployment) < fmt.Sprint(b.TenantID, "\x00", b.Model, "\x00", b.Deployment)
	})
	return out
}

func TestUsageExactWithDuplicates(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	var events []*meterv1.InferenceEvent
	for i := range 5000 {
		events = append(events, event(i))
	}
	// Insert everything, then a second copy of every 3rd event in another
	// INSERT (redelivery), so duplicates sit in different parts.
	var b chstore.EventBatch
	for _, ev := range events {
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{Partition: 0, Offset: 1})
	}
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	for i := 0; i < len(events); i += 3 {
		b.Append(events[i], ingest.ITL(events[i]), time.Now(), sink.Source{Partition: 1, Offset: int64(i)})
	}
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}

	end := day.Add(5000 * 37 * time.Second)
	queries := []query.UsageQuery{
		{Start: day, End: end},
		{Start: day, End: end, Granularity: "hour", GroupBy: []string{"tenant_id"}},
		{Start: day, End: end, Granularity: "day", GroupBy: []string{"model", "deployment"}},
		{Start: day.Add(90 * time.Minute), End: day.Add(200 * time.Minute), Granularity: "minute", TenantID: "globex"},
		// Millisecond-exact bounds: an event's own completed_at is inclusive at start, exclusive at end.
		{Start: events[100].GetCompletedAt().AsTime(), End: events[200].GetCompletedAt().AsTime(), GroupBy: []string{"tenant_id", "model", "deployment"}},
		{Start: day.Add(-48 * time.Hour), End: day.Add(-24 * time.Hour)},
		{Start: day.Add(-48 * time.Hour), End: end, Granularity: "month", GroupBy: []string{"tenant_id"}},
	}
	for i, q := range queries {
		got, err := reads(s).Usage(ctx, q)
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		want := bruteUsage(events, q)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("query %d (%+v) (-want +got):\n%s", i, q, diff)
		}
	}
}

// Month buckets are UTC calendar months.
func TestUsageMonths(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	var b chstore.EventBatch
	var events []*meterv1.InferenceEvent
	for i, at := range []time.Time{
		time.Date(2026, 10, 31, 23, 30, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 30, 0, 0, time.UTC),
		time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
	} {
		ev := event(i)
		ev.CompletedAt = timestamppb.New(at)
		events = append(events, ev)
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{})
	}
	if err := s.InsertEvents(ctx, &b); err != nil {
		t.Fatal(err)
	}
	q := query.UsageQuery{Start: time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), End: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), Granularity: "month"}
	got, err := reads(s).Usage(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var starts []time.Time
	for _, r := range got {
		starts = append(starts, r.Start)
	}
	want := []time.Time{time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	if diff := cmp.Diff(want, starts); diff != "" {
		t.Errorf("month buckets (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(bruteUsage(events, q), got); diff != "" {
		t.Errorf("month usage (-want +got):\n%s", diff)
	}
}
