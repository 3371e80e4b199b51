package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// usageIn is the usage of every tenant with completed_at in [start, end).
func usageIn(t *testing.T, store *chstore.Store, start, end time.Time) totals {
	t.Helper()
	rows, err := query.New(store, query.Config{}).Usage(context.Background(), query.UsageQuery{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		return totals{}
	}
	r := rows[0]
	return totals{r.Requests, r.Errors, r.PromptTokens, r.CachedPromptTokens, r.OutputTokens}
}

// TestConsumerCountsEachEventIDOnce sends copies of stored events with
// another completed_at (later hours, the month before), with other tokens,
// and equal copies, in the same batch as the first copy and in later
// batches after a crash: each (tenant_id, event_id) is counted once, as
// its first copy, in every range that is read, and every copy that differs
// is a dead letter with reason duplicate_conflict. Before the event id
// index, a copy in another hour was stored and counted in its own hour and
// month.
func TestConsumerCountsEachEventIDOnce(t *testing.T) {
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)

	var first []*meterv1.InferenceEvent
	for i := range 600 {
		first = append(first, testEvent(i))
	}
	// changed returns a copy of ev changed by f.
	changed := func(ev *meterv1.InferenceEvent, f func(*meterv1.InferenceEvent)) *meterv1.InferenceEvent {
		c := proto.Clone(ev).(*meterv1.InferenceEvent)
		f(c)
		return c
	}
	laterHour := func(ev *meterv1.InferenceEvent) {
		ev.CompletedAt = timestamppb.New(ev.GetCompletedAt().AsTime().Add(2 * time.Hour))
	}
	lastMonth := func(ev *meterv1.InferenceEvent) {
		ev.CompletedAt = timestamppb.New(ev.GetCompletedAt().AsTime().AddDate(0, -1, 0))
	}
	moreTokens := func(ev *meterv1.InferenceEvent) { ev.OutputTokens = proto.Int64(ev.GetOutputTokens() + 1000) }

	// Round 1: the first copies, and in the same produce (so mostly the same
	// batch) a conflicting copy of every 10th and an equal copy of every
	// 7th, after the first.
	round1 := append([]*meterv1.InferenceEvent(nil), first...)
	conflicts := 0
	for i := 0; i < len(first); i += 10 {
		round1 = append(round1, changed(first[i], laterHour))
		conflicts++
	}
	for i := 0; i < len(first); i += 7 {
		round1 = append(round1, first[i])
	}
	e.produce(t, keyedMessages(t, round1)...)

	// The first consumer crashes right after its first insert.
	var inserts atomic.Int32
	stop := e.startConsumer(t, func(p string) bool { return p == "after-insert" && inserts.Add(1) == 2 }, 5000)
	deadline := time.Now().Add(60 * time.Second)
	for inserts.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); !errors.Is(err, errCrashed) {
		// Everything fitted one batch: it finished without crashing.
		if err != nil {
			t.Fatalf("first consumer: %v", err)
		}
	}

	// Round 2, after the crash: copies of stored events in a later hour, in
	// the month before, with more tokens, and equal copies.
	var round2 []*meterv1.InferenceEvent
	for i := 3; i < len(first); i += 10 {
		round2 = append(round2, changed(first[i], laterHour), changed(first[i], lastMonth), changed(first[i], moreTokens), first[i])
		conflicts += 3
	}
	// Then markers, new events, after round 2 on every partition (the
	// writer deals records out round-robin): once they are counted, every
	// copy before them has been through the consumer.
	var markers []*meterv1.InferenceEvent
	for i := range 6 {
		markers = append(markers, testEvent(10_000+i))
	}
	e.produce(t, keyedMessages(t, round2)...)
	e.produce(t, keyedMessages(t, markers)...)
	stop = e.startConsumer(t, nil, 5000)

	want := expect(append(append([]*meterv1.InferenceEvent(nil), first...), markers...))
	waitTotals(t, e.store, want, 90*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("consumer stop: %v", err)
	}
	stable(t, e.store, want)

	// Every month read alone agrees with the whole range.
	nov := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	if got := usageIn(t, e.store, nov.AddDate(0, -1, 0), nov); got != (totals{}) {
		t.Errorf("usage of October (copies moved a month back): got %+v, want none", got)
	}
	if diff := cmp.Diff(want, usageIn(t, e.store, nov, nov.AddDate(0, 1, 0))); diff != "" {
		t.Errorf("usage of November (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, usageIn(t, e.store, nov.AddDate(0, -1, 0), nov.AddDate(0, 1, 0))); diff != "" {
		t.Errorf("usage of both months (-want +got):\n%s", diff)
	}

	// Each conflicting copy is a dead letter with its reason, its value the
	// copy as decoded.
	dead := readPartitions(t, e.broker.Addr(), DefaultDLQTopic)
	// A dead letter the topic refused for 30 s (a loaded machine) is a row
	// of dead_letters instead.
	table, err := e.store.DeadLetters(context.Background(), DefaultEventsTopic, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range table {
		if d.ReasonCode != ReasonDuplicateConflict {
			t.Errorf("dead letter row with reason %q, want %q", d.ReasonCode, ReasonDuplicateConflict)
		}
		dead = append(dead, kafka.Message{Key: []byte(d.Key), Value: []byte(d.Payload),
			Headers: []kafka.Header{{Key: HeaderDLQReasonCode, Value: []byte(d.ReasonCode)},
				{Key: HeaderDLQPartition, Value: []byte(fmt.Sprint(d.SourcePartition))}, {Key: HeaderDLQOffset, Value: []byte(fmt.Sprint(d.SourceOffset))}}})
	}
	// A batch redelivered after the crash sends its dead letters again:
	// one per source record.
	bySource := map[string]bool{}
	unique := dead[:0]
	for _, m := range dead {
		src := headerValue(m.Headers, HeaderDLQPartition) + "/" + headerValue(m.Headers, HeaderDLQOffset)
		if !bySource[src] {
			bySource[src] = true
			unique = append(unique, m)
		}
	}
	dead = unique
	if len(dead) != conflicts {
		t.Errorf("%d dead letters (%d rows of dead_letters among them), want %d", len(dead), len(table), conflicts)
	}
	byID := map[string]int{}
	for _, m := range dead {
		if got := headerValue(m.Headers, HeaderDLQReasonCode); got != ReasonDuplicateConflict {
			t.Errorf("dead letter reason %q, want %q", got, ReasonDuplicateConflict)
			continue
		}
		var ev meterv1.InferenceEvent
		if err := proto.Unmarshal(m.Value, &ev); err != nil {
			t.Errorf("dead letter value: %v", err)
			continue
		}
		byID[ev.GetEventId()]++
	}
	for i := 0; i < len(first); i++ {
		wantN := 0
		if i%10 == 0 {
			wantN = 1
		} else if i%10 == 3 {
			wantN = 3
		}
		if byID[first[i].GetEventId()] != wantN {
			t.Errorf("event %s: %d dead letters, want %d", first[i].GetEventId(), byID[first[i].GetEventId()], wantN)
		}
	}
}

// keyedMessages encodes events as protobuf records keyed by event_id, as
// the publish path writes them (so the copies of an id share a partition).
func keyedMessages(t *testing.T, events []*meterv1.InferenceEvent) []kafka.Message {
	t.Helper()
	msgs := protoMessages(t, events)
	for i := range msgs {
		msgs[i].Key = []byte(events[i].GetEventId())
	}
	return msgs
}

// readPartitions reads every record of topic, partition by partition up to
// its end offset, without a consumer group (whose join can take long on a
// loaded machine).
func readPartitions(t *testing.T, addr, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := kafka.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out []kafka.Message
	for _, p := range parts {
		pc, err := kafka.DialLeader(ctx, "tcp", addr, topic, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		last, err := pc.ReadLastOffset()
		if err != nil {
			t.Fatal(err)
		}
		pc.Close()
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: p.ID, MaxWait: 100 * time.Millisecond})
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatalf("read %s partition %d: %v", topic, p.ID, err)
			}
			out = append(out, m)
			if m.Offset+1 >= last {
				break
			}
		}
		r.Close()
	}
	return out
}
