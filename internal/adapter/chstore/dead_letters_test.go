package chstore_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore/chstoretest"

	"github.com/google/go-cmp/cmp"
)

// TestDeadLetters stores dead letters, one of them twice (a redelivered
// batch), with binary payloads, and reads each back once, in source order.
func TestDeadLetters(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	big := sink.DeadLetter{
		SourceTopic: "meter.events.v1", SourcePartition: 2, SourceOffset: 41, ReasonCode: "oversized",
		Reason: "record is 1048000 bytes, limit is 65536", OriginalSize: 1048000, OriginalSHA256: strings.Repeat("ab", 32),
		Key: []byte("k\x00\xff"), Payload: []byte{0, 1, 2, 0xff, '{'}, Truncated: true,
		DLQError: "[10] Message Size Too Large", RecordedAt: at,
	}
	small := sink.DeadLetter{
		SourceTopic: "meter.events.v1", SourcePartition: 0, SourceOffset: 7, ReasonCode: "decode",
		Reason: "malformed JSON event", OriginalSize: 3, OriginalSHA256: strings.Repeat("cd", 32),
		Key: []byte{}, Payload: []byte(`{"x`), DLQError: "[29] Topic Authorization Failed", RecordedAt: at,
	}
	other := small
	other.SourceTopic = "meter.gpu.v1"
	if err := s.InsertDeadLetters(ctx, []sink.DeadLetter{big, small, other}); err != nil {
		t.Fatal(err)
	}
	again := big
	again.RecordedAt = at.Add(time.Minute)
	if err := s.InsertDeadLetters(ctx, []sink.DeadLetter{again}); err != nil {
		t.Fatal(err)
	}
	got, err := s.DeadLetters(ctx, "meter.events.v1", 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []sink.DeadLetter{small, again}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
}
