package chstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestEventKeyMatchesClickHouse holds sink.EventKey equal to the
// cityHash64 that migration 0015 computes in SQL for the ids stored before
// it, for short ids, ids longer than EventKey's stack buffer, and UTF-8.
func TestEventKeyMatchesClickHouse(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	for _, id := range [][2]string{{"t", "e"}, {"", ""}, {"tenant-1", "ev-000001"}, {"acme", fmt.Sprintf("%0200d", 7)}, {"ü-tenant", "🙂 x"}} {
		got, err := s.QueryUint64(context.Background(), "SELECT cityHash64(concat(?, '\\0', ?))", id[0], id[1])
		if err != nil {
			t.Fatal(err)
		}
		if want := sink.EventKey(id[0], id[1]); got != want {
			t.Errorf("EventKey(%q, %q) = %d, ClickHouse says %d", id[0], id[1], want, got)
		}
	}
}

// TestStoredEvents: InsertEvents records each event's ids with its
// fingerprint; StoredEvents finds them by key (the first copy when there
// are several), and the ids of events stored before migration 0015 (copied
// by its INSERT, without fingerprint) are found by completion time.
func TestStoredEvents(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	at := time.Date(2026, 11, 3, 10, 15, 0, 0, time.UTC)
	ev := func(i int, tokens int64) *meterv1.InferenceEvent {
		return &meterv1.InferenceEvent{EventId: fmt.Sprintf("ev-%d", i), TenantId: "t1", Model: "m",
			CompletedAt: timestamppb.New(at.Add(time.Duration(i) * time.Second)), PromptTokens: proto.Int64(10), OutputTokens: proto.Int64(tokens)}
	}
	chstoretest.Insert(t, s, []*meterv1.InferenceEvent{ev(1, 5), ev(2, 5)})
	// A redelivered copy of ev-1: the index has two rows of it, and one answer.
	chstoretest.Insert(t, s, []*meterv1.InferenceEvent{ev(1, 5)})

	var r sink.EventRow
	r.FromProto(ev(1, 5))
	var b chstore.EventBatch
	b.AppendRow(&r, sink.ITL{}, at, sink.Source{})
	fp1 := b.Stored(0).Fingerprint
	r.FromProto(ev(1, 6))
	if fp := r.Fingerprint(new([]byte)); fp == fp1 {
		t.Fatal("fingerprints of copies with other tokens are equal")
	}

	got, err := s.StoredEvents(ctx, []uint64{sink.EventKey("t1", "ev-1"), sink.EventKey("t1", "ev-2"), sink.EventKey("t1", "ev-3")})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("stored events: got %d, want ev-1 and ev-2: %+v", len(got), got)
	}
	for _, g := range got {
		if g.EventID == "ev-1" && (!g.Same(fp1, at.Add(time.Second).UnixMilli()) || g.Same(fp1+1, at.Add(time.Second).UnixMilli())) {
			t.Errorf("ev-1: %+v is not the first copy's fingerprint", g)
		}
	}

	// Ids stored before the index: events inserted without it, then the
	// migration's INSERT run again (Reapply).
	if err := s.Exec(ctx, "INSERT INTO inference_events (tenant_id, event_id, completed_at, completed_at_ms, ingested_at) SELECT 't2', 'old-1', toDateTime('2026-10-05 08:00:00', 'UTC'), 1791187200123, now()"); err != nil {
		t.Fatal(err)
	}
	if err := s.Reapply(ctx); err != nil {
		t.Fatal(err)
	}
	got, err = s.StoredEvents(ctx, []uint64{sink.EventKey("t2", "old-1")})
	if err != nil {
		t.Fatal(err)
	}
	want := []sink.StoredEvent{{KeyHash: sink.EventKey("t2", "old-1"), TenantID: "t2", EventID: "old-1", CompletedAtMs: 1791187200123}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(sink.StoredEvent{}, "IngestedAt")); diff != "" {
		t.Errorf("backfilled id (-want +got):\n%s", diff)
	}
	if !got[0].Same(12345, 1791187200123) || got[0].Same(12345, 1791187200124) {
		t.Errorf("a backfilled id is the same event exactly when completed_at_ms is equal")
	}
}
