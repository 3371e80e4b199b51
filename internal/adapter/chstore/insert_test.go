package chstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// insertTestEvent is event i of tenant: labels on every other one, TTFT on
// every third (a NULL otherwise).
func insertTestEvent(tenant string, i int) *meterv1.InferenceEvent {
	ev := &meterv1.InferenceEvent{EventId: fmt.Sprintf("ev-%d", i), TenantId: tenant, Model: fmt.Sprintf("m%d", i%3),
		CompletedAt:  timestamppb.New(time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)),
		PromptTokens: proto.Int64(int64(10 + i)), OutputTokens: proto.Int64(int64(i))}
	if i%2 == 0 {
		ev.Labels = map[string]string{"team": fmt.Sprintf("team-%d", i), "app": "a"}
	}
	if i%3 == 0 {
		ev.TtftMs = proto.Float64(float64(i))
	}
	return ev
}

func insertTestEvents(t testing.TB, s *chstore.Store, tenant string, from, to int) error {
	t.Helper()
	return insertTestEventsCtx(t, context.Background(), s, tenant, from, to)
}

func insertTestEventsCtx(t testing.TB, ctx context.Context, s *chstore.Store, tenant string, from, to int) error {
	t.Helper()
	b := s.NewEventBatch()
	for i := from; i < to; i++ {
		var r sink.EventRow
		r.FromProto(insertTestEvent(tenant, i))
		b.AppendKeyedRow(&r, ingest.RowITL(&r), time.Now(), sink.Source{Offset: int64(i)}, sink.EventKey(r.TenantID, r.EventID), r.Fingerprint(new([]byte)))
	}
	return s.InsertEvents(ctx, b)
}

// checkStored holds the rows of tenant in inference_events and event_ids
// equal to one copy of each of its events from to to.
func checkStored(t *testing.T, s *chstore.Store, tenant string, from, to int) {
	t.Helper()
	ctx := context.Background()
	n := uint64(to - from)
	var tokens, labelled, ttft uint64
	for i := from; i < to; i++ {
		tokens += uint64(i)
		if i%2 == 0 {
			labelled++
		}
		if i%3 == 0 {
			ttft++
		}
	}
	for _, c := range []struct {
		what, sql string
		want      uint64
	}{
		{"rows", "SELECT count() FROM inference_events WHERE tenant_id = ?", n},
		{"distinct ids", "SELECT uniqExact(event_id) FROM inference_events WHERE tenant_id = ?", n},
		{"output tokens", "SELECT sum(output_tokens) FROM inference_events WHERE tenant_id = ?", tokens},
		{"labelled rows", "SELECT countIf(label_keys = ['app', 'team'] AND label_values[2] = concat('team-', substring(event_id, 4))) FROM inference_events WHERE tenant_id = ?", labelled},
		{"rows without labels", "SELECT countIf(empty(label_keys) AND empty(label_values)) FROM inference_events WHERE tenant_id = ?", n - labelled},
		{"TTFTs", "SELECT sum(ifNull(ttft_ms = toFloat64(toUInt64(substring(event_id, 4))), 0)) FROM inference_events WHERE tenant_id = ?", ttft},
		{"NULL TTFTs", "SELECT sum(isNull(ttft_ms)) FROM inference_events WHERE tenant_id = ?", n - ttft},
		{"models", "SELECT countIf(model = concat('m', toString(toUInt64(substring(event_id, 4)) % 3))) FROM inference_events WHERE tenant_id = ?", n},
		{"index rows", "SELECT count() FROM event_ids WHERE tenant_id = ?", n},
		{"index keys", "SELECT countIf(key_hash = cityHash64(concat(tenant_id, '\\0', event_id))) FROM event_ids WHERE tenant_id = ?", n},
	} {
		got, err := s.QueryUint64(ctx, c.sql, tenant)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("tenant %s, %s: %d, want %d", tenant, c.what, got, c.want)
		}
	}
}

// TestInsertsReuseBatches: the inserts of one store reuse prepared batches
// (insert.go), so an INSERT must send exactly its own rows, whatever the
// size of the one before (larger, smaller, none), and values of one row
// (labels, NULLs) must not leak into another.
func TestInsertsReuseBatches(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	sizes := []int{7, 2, 0, 11, 1}
	from := 0
	for i, n := range sizes {
		tenant := fmt.Sprintf("t%d", i)
		if err := insertTestEvents(t, s, tenant, from, from+n); err != nil {
			t.Fatal(err)
		}
		checkStored(t, s, tenant, from, from+n)
		from += n
	}
}

// TestInsertAfterFailedInsert: an INSERT that fails (its table is away)
// returns the error, and the next INSERT, once the table is back, stores
// its rows.
func TestInsertAfterFailedInsert(t *testing.T) {
	s := chstoretest.OpenSingle(t)
	ctx := context.Background()
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := insertTestEvents(t, s, "before", 0, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Exec(ctx, "RENAME TABLE event_ids TO event_ids_away"); err != nil {
		t.Fatal(err)
	}
	if err := insertTestEvents(t, s, "during", 0, 3); err == nil {
		t.Fatal("an insert into a missing event_ids succeeded")
	}
	if err := s.Exec(ctx, "RENAME TABLE event_ids_away TO event_ids"); err != nil {
		t.Fatal(err)
	}
	if err := insertTestEvents(t, s, "after", 0, 5); err != nil {
		t.Fatal(err)
	}
	checkStored(t, s, "before", 0, 3)
	checkStored(t, s, "after", 0, 5)
}

// TestConcurrentInserts: writers inserting at once through one store (more
// than it keeps prepared batches for) each store exactly their rows.
func TestConcurrentInserts(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	const writers, inserts, per = 6, 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*inserts)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range inserts {
				errs <- insertTestEvents(t, s, fmt.Sprintf("w%d", w), i*per, (i+1)*per)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for w := range writers {
		checkStored(t, s, fmt.Sprintf("w%d", w), 0, inserts*per)
	}
}

// TestInsertEventsAllocations holds what an INSERT of 5,000 events
// allocates, after the first, under 1 KB an event: the driver's column
// buffers live from one INSERT to the next. (Built anew for each INSERT,
// they cost 1.7 KB an event at 5,000 events, 3.4 KB at 20,000.)
func TestInsertEventsAllocations(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	const n = 5000
	b := s.NewEventBatch()
	for i := range n {
		var r sink.EventRow
		r.FromProto(insertTestEvent("t", i))
		b.AppendKeyedRow(&r, ingest.RowITL(&r), time.Now(), sink.Source{Offset: int64(i)}, sink.EventKey(r.TenantID, r.EventID), r.Fingerprint(new([]byte)))
	}
	ctx := context.Background()
	if err := s.InsertEvents(ctx, b); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := s.InsertEvents(ctx, b); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 1000 {
		t.Errorf("an INSERT allocated %d bytes an event, want < 1000", per)
	}
}

// TestEventBatchReuse: a batch reused after Reset (its label memory
// shared by many rows and kept) and compacted by Keep gives back each
// row's event as appended.
func TestEventBatchReuse(t *testing.T) {
	var b chstore.EventBatch
	fill := func(from, to int) []*meterv1.InferenceEvent {
		b.Reset()
		var want []*meterv1.InferenceEvent
		for i := from; i < to; i++ {
			ev := insertTestEvent("t", i)
			if i%5 == 0 {
				ev.Labels = map[string]string{}
				for j := range 300 + i%400 { // past the first block of labels (4096 strings)
					ev.Labels[fmt.Sprintf("k%04d", j)] = fmt.Sprint(i, j)
				}
			}
			var r sink.EventRow
			r.FromProto(ev)
			b.AppendRow(&r, ingest.RowITL(&r), time.Now(), sink.Source{})
			want = append(want, ev)
		}
		return want
	}
	check := func(want []*meterv1.InferenceEvent) {
		t.Helper()
		if b.Len() != len(want) {
			t.Fatalf("%d rows, want %d", b.Len(), len(want))
		}
		for i, ev := range want {
			got := b.Event(i)
			if len(got.Labels) != len(ev.Labels) {
				t.Fatalf("row %d: %d labels, want %d", i, len(got.Labels), len(ev.Labels))
			}
			for k, v := range ev.Labels {
				if got.Labels[k] != v {
					t.Fatalf("row %d: label %s = %q, want %q", i, k, got.Labels[k], v)
				}
			}
			if got.GetEventId() != ev.GetEventId() || got.GetOutputTokens() != ev.GetOutputTokens() || (got.TtftMs == nil) != (ev.TtftMs == nil) {
				t.Fatalf("row %d: %v, want %v", i, got, ev)
			}
		}
	}
	check(fill(0, 40))
	want := fill(100, 130)
	check(want)
	keep := make([]bool, len(want))
	var kept []*meterv1.InferenceEvent
	for i := range keep {
		keep[i] = i%3 != 1
		if keep[i] {
			kept = append(kept, want[i])
		}
	}
	b.Keep(keep)
	check(kept)
	check(fill(7, 12))
}

// TestInsertAfterCancelledInsert: an INSERT whose context is cancelled as
// its Send returns does not keep its prepared batch (clickhouse-go's
// watchdog of that context could close the connection of the batch's next
// INSERT), and the next INSERT stores exactly its rows. The idle count
// fails on the old code (2 batches kept, not 1).
func TestInsertAfterCancelledInsert(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	if err := insertTestEvents(t, s, "before", 0, 3); err != nil {
		t.Fatal(err)
	}
	if n := s.IdleInserts(); n != 2 {
		t.Fatalf("%d idle batches after an insert of events and ids, want 2", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.AfterInsertSend(cancel)
	if err := insertTestEventsCtx(t, ctx, s, "during", 0, 3); err == nil {
		t.Fatal("an insert whose context was cancelled after the events' Send inserted the ids too")
	}
	s.AfterInsertSend(nil)
	// The events' batch is dropped; the ids' batch, never taken, stays.
	if n := s.IdleInserts(); n != 1 {
		t.Errorf("%d idle batches after a cancelled insert, want 1", n)
	}
	if err := insertTestEvents(t, s, "after", 0, 5); err != nil {
		t.Fatal(err)
	}
	checkStored(t, s, "before", 0, 3)
	checkStored(t, s, "after", 0, 5)
	// A context cancelled before the call inserts nothing.
	if err := insertTestEventsCtx(t, ctx, s, "cancelled", 0, 3); err == nil {
		t.Fatal("an insert with a cancelled context succeeded")
	}
	if n, err := s.QueryUint64(context.Background(), "SELECT count() FROM inference_events WHERE tenant_id = 'cancelled'"); err != nil || n != 0 {
		t.Errorf("a cancelled insert stored %d rows (%v)", n, err)
	}
}

// TestInsertMigrationWhileBatchOut: a migration (which forgets the
// prepared batches) that runs while an INSERT holds a batch makes that
// batch be dropped when it comes back, not kept for the next INSERT. The
// idle count fails on the old code (the stale batch was put back: 2, not 1).
func TestInsertMigrationWhileBatchOut(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	if err := insertTestEvents(t, s, "before", 0, 3); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	s.AfterInsertSend(func() { once.Do(s.ForgetInserts) })
	if err := insertTestEvents(t, s, "during", 0, 4); err != nil {
		t.Fatal(err)
	}
	s.AfterInsertSend(nil)
	// The events' batch was out when forgotten; the ids' was prepared
	// after and is kept.
	if n := s.IdleInserts(); n != 1 {
		t.Errorf("%d idle batches after a migration during an insert, want 1", n)
	}
	if err := insertTestEvents(t, s, "after", 0, 5); err != nil {
		t.Fatal(err)
	}
	checkStored(t, s, "before", 0, 3)
	checkStored(t, s, "during", 0, 4)
	checkStored(t, s, "after", 0, 5)
}

// TestInsertLargeBatchNotKept: a batch that sent more rows than a prepared
// batch may keep (set to 1,000 here; 1<<18 in meterd) is dropped, so its
// buffers do not stay that size, and the next, small INSERT stores exactly
// its rows. Fails on the old code (both batches kept).
func TestInsertLargeBatchNotKept(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	s.SetMaxReusedRows(1000)
	const large = 1001
	if err := insertTestEvents(t, s, "large", 0, large); err != nil {
		t.Fatal(err)
	}
	if n := s.IdleInserts(); n != 0 {
		t.Errorf("%d idle batches after an insert of %d rows, want 0", n, large)
	}
	if err := insertTestEvents(t, s, "small", 0, 7); err != nil {
		t.Fatal(err)
	}
	if n := s.IdleInserts(); n != 2 {
		t.Errorf("%d idle batches after a small insert, want 2", n)
	}
	checkStored(t, s, "large", 0, large)
	checkStored(t, s, "small", 0, 7)
}

// TestInsertSettingsOnReusedBatch: the settings of each INSERT's context
// apply to that INSERT, also through a reused prepared batch (clickhouse-go
// reads them at each Send; ingestContext depends on it). A marker setting
// tells the two INSERTs apart in system.query_log. Passes on the old code
// too: it pins clickhouse-go's behaviour down.
func TestInsertSettingsOnReusedBatch(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	marked := func(marker int) context.Context {
		return clickhouse.Context(context.Background(), clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1, "max_query_size": marker}))
	}
	if err := insertTestEventsCtx(t, marked(262_147), s, "first", 0, 3); err != nil {
		t.Fatal(err)
	}
	if err := insertTestEventsCtx(t, marked(262_149), s, "second", 0, 4); err != nil {
		t.Fatal(err)
	}
	if n := s.IdleInserts(); n != 2 {
		t.Fatalf("%d idle batches, want 2 (the second insert reused the first's)", n)
	}
	ctx := context.Background()
	if err := s.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		t.Fatal(err)
	}
	for _, marker := range []string{"262147", "262149"} {
		n, err := s.QueryUint64(ctx, `SELECT count() FROM system.query_log WHERE type = 2
  AND query LIKE 'INSERT INTO inference_events (%' AND Settings.Values[indexOf(Settings.Names, 'max_query_size')] = ?`, marker)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("no finished INSERT into inference_events ran with max_query_size %s", marker)
		}
	}
	checkStored(t, s, "first", 0, 3)
	checkStored(t, s, "second", 0, 4)
}

// TestEventBatchLabelBlockShrinks: Reset drops a block of labels far larger
// than the batch just used, so one label-heavy batch does not keep its
// memory for good. Fails on the old code (the block kept its 32,768 strings).
func TestEventBatchLabelBlockShrinks(t *testing.T) {
	var b chstore.EventBatch
	fill := func(rows, labels int) {
		b.Reset()
		for i := range rows {
			ev := insertTestEvent("t", i)
			ev.Labels = map[string]string{}
			for j := range labels {
				ev.Labels[fmt.Sprintf("k%04d", j)] = fmt.Sprint(i, j)
			}
			var r sink.EventRow
			r.FromProto(ev)
			b.AppendRow(&r, ingest.RowITL(&r), time.Now(), sink.Source{})
		}
	}
	fill(100, 200) // 40,000 strings
	big := b.LabelBlockCap()
	if big <= 4*4096 {
		t.Fatalf("label block of %d strings after 40,000, want > %d", big, 4*4096)
	}
	fill(10, 2)
	if got := b.LabelBlockCap(); got != big {
		t.Errorf("label block of %d strings after a reset of the large batch, want it kept (%d)", got, big)
	}
	fill(10, 2)
	if got := b.LabelBlockCap(); got > 4*4096 {
		t.Errorf("label block of %d strings after a batch of 20 labels, want <= %d", got, 4*4096)
	}
	if got := b.Event(3).Labels["k0001"]; got != "3 1" {
		t.Errorf("row 3 label k0001 = %q, want \"3 1\"", got)
	}
}
