package chstore_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestEventKeyMatchesClickHouse holds chstore.EventKey equal to the
// cityHash64 that migration 0015 computes in SQL for the ids stored before
// it, for short ids, ids longer than EventKey's stack buffer, and UTF-8.
func TestEventKeyMatchesClickHouse(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	for _, id := range [][2]string{{"t", "e"}, {"", ""}, {"tenant-1", "ev-000001"}, {"acme", fmt.Sprintf("%0200d", 7)}, {"ü-tenant", "🙂 x"}} {
		got, err := s.QueryUint64(context.Background(), "SELECT cityHash64(concat(?, '\\0', ?))", id[0], id[1])
		if err != nil {
			t.Fatal(err)
		}
		if want := chstore.EventKey(id[0], id[1]); got != want {
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

	var r chstore.EventRow
	r.FromProto(ev(1, 5))
	var b chstore.EventBatch
	b.AppendRow(&r, chstore.ITL{}, at, chstore.Source{})
	fp1 := b.Fingerprint(0)
	r.FromProto(ev(1, 6))
	if fp := r.Fingerprint(new([]byte)); fp == fp1 {
		t.Fatal("fingerprints of copies with other tokens are equal")
	}

	got, err := s.StoredEvents(ctx, []uint64{chstore.EventKey("t1", "ev-1"), chstore.EventKey("t1", "ev-2"), chstore.EventKey("t1", "ev-3")})
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
	got, err = s.StoredEvents(ctx, []uint64{chstore.EventKey("t2", "old-1")})
	if err != nil {
		t.Fatal(err)
	}
	want := []chstore.StoredEvent{{KeyHash: chstore.EventKey("t2", "old-1"), TenantID: "t2", EventID: "old-1", CompletedAtMs: 1791187200123}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(chstore.StoredEvent{}, "IngestedAt")); diff != "" {
		t.Errorf("backfilled id (-want +got):\n%s", diff)
	}
	if !got[0].Same(12345, 1791187200123) || got[0].Same(12345, 1791187200124) {
		t.Errorf("a backfilled id is the same event exactly when completed_at_ms is equal")
	}
}

// TestFingerprintSeesEveryField changes each field of an event row in turn
// (walking EventRow by reflection, so a new field is covered): every
// change gives another fingerprint, and an equal row the same one.
func TestFingerprintSeesEveryField(t *testing.T) {
	base := func() chstore.EventRow {
		var r chstore.EventRow
		r.FromProto(&meterv1.InferenceEvent{EventId: "e", TenantId: "t", Model: "m", CompletedAt: timestamppb.New(time.Unix(1e9, 5)),
			PromptTokens: proto.Int64(3), OutputTokens: proto.Int64(4), TtftMs: proto.Float64(1.5), Labels: map[string]string{"k": "v"}})
		return r
	}
	var buf []byte
	r0 := base()
	want := r0.Fingerprint(&buf)
	if r1 := base(); r1.Fingerprint(&buf) != want {
		t.Fatal("equal rows have different fingerprints")
	}
	var change func(v reflect.Value, path string)
	change = func(v reflect.Value, path string) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				change(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
			return
		case reflect.Slice: // Labels
			for i := range v.Len() {
				change(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
			}
			return
		}
		old := reflect.ValueOf(v.Interface())
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Int32, reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.Uint32:
			v.SetUint(v.Uint() + 1)
		case reflect.Float64:
			v.SetFloat(v.Float() + 0.25)
		default:
			t.Fatalf("%s: kind %s not handled", path, v.Kind())
		}
		if got := r0.Fingerprint(&buf); got == want {
			t.Errorf("changing %s left the fingerprint as it was", path)
		}
		v.Set(old)
	}
	change(reflect.ValueOf(&r0).Elem(), "EventRow")
	if got := r0.Fingerprint(&buf); got != want {
		t.Fatal("the row did not come back to its fingerprint")
	}
}
