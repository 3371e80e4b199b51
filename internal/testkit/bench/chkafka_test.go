package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestMain(m *testing.M) { chtest.Main(m) }

func TestRunClickHouseKafkaEngine(t *testing.T) {
	srv := localServer(t)
	broker := startBroker(t, "events")
	values, want := makeRecords(20_000)
	produce(t, broker.Addr(), "events", values)

	const db = "bench_kafka_engine"
	t.Cleanup(func() { dropDatabase(t, srv.Addr(), db) })
	elapsed, err := RunClickHouseKafkaEngine(t.Context(), srv.Addr(), db, broker.Addr(), "events", len(values), 2*time.Minute,
		WithLogDir(filepath.Join(srv.Dir(), "log")))
	if err != nil {
		t.Fatalf("RunClickHouseKafkaEngine: %v", err)
	}
	t.Logf("%d records in %v (%.0f records/s)", len(values), elapsed, float64(len(values))/elapsed.Seconds())

	if got := loadedSums(t, srv.Addr(), db); !cmp.Equal(got, want) {
		t.Errorf("loaded rows differ from those produced (-want +got):\n%s", cmp.Diff(want, got))
	}
	assertConsumerGone(t, srv.Addr(), db)
}

// TestRunClickHouseKafkaEngineStoreSchema checks that with WithStoreSchema
// the engine fills tokenmeter's tables as meterd's store does: the same
// records inserted by chstore into one database and by the engine into
// another give the same rows of inference_events (every column but the
// labels, which 18.16 cannot read from JSON, and the ingestion time and
// source), the same rows of event_ids and the same dirty hours.
func TestRunClickHouseKafkaEngineStoreSchema(t *testing.T) {
	srv := localServer(t)
	broker := startBroker(t, "events")
	values, _ := makeRecords(5_000)
	produce(t, broker.Addr(), "events", values)

	const engineDB, storeDB = "bench_kafka_engine_store", "bench_kafka_engine_chstore"
	t.Cleanup(func() { dropDatabase(t, srv.Addr(), engineDB); dropDatabase(t, srv.Addr(), storeDB) })
	migratedStore(t, srv.Addr(), engineDB)
	store := migratedStore(t, srv.Addr(), storeDB)
	b := &chstore.EventBatch{}
	for i, v := range values {
		ev := &meterv1.InferenceEvent{}
		if err := protojson.Unmarshal(v, ev); err != nil {
			t.Fatal(err)
		}
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{Offset: int64(i)})
	}
	if err := store.InsertEvents(t.Context(), b); err != nil {
		t.Fatalf("insert with chstore: %v", err)
	}

	if _, err := RunClickHouseKafkaEngine(t.Context(), srv.Addr(), engineDB, broker.Addr(), "events", len(values), 2*time.Minute,
		WithLogDir(filepath.Join(srv.Dir(), "log")), WithStoreSchema()); err != nil {
		t.Fatalf("RunClickHouseKafkaEngine: %v", err)
	}
	assertConsumerGone(t, srv.Addr(), engineDB)
	eventCols := []string{"tenant_id", "event_id", "request_id", "model", "model_version", "deployment",
		"engine", "gpu_type", "tensor_parallelism", "node", "region", "completed_at", "completed_at_ms", "received_at_ms",
		"prompt_tokens", "cached_prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms", "queue_ms", "prefill_ms",
		"itl_ms", "itl_measured", "status", "streaming", "slo_class", "group_hash", "ttft_estimated"}
	idCols := []string{"key_hash", "tenant_id", "event_id", "completed_at_ms"}
	for _, q := range []struct {
		table, order string
		cols         []string
	}{
		{"inference_events", "tenant_id, event_id", eventCols},
		{"event_ids", "key_hash, tenant_id, event_id", idCols},
		{"dirty_hours", "hour", []string{"hour"}},
	} {
		want := tableRows(t, srv.Addr(), storeDB, q.table, q.order, q.cols)
		got := tableRows(t, srv.Addr(), engineDB, q.table, q.order, q.cols)
		if q.table == "dirty_hours" {
			// One row per insert block and hour: compare the hours.
			want, got = slices.Compact(want), slices.Compact(got)
		}
		if len(want) == 0 {
			t.Fatalf("%s: chstore stored no rows", q.table)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: the Kafka engine's rows differ from chstore's (-chstore +engine), columns %v:\n%s", q.table, q.cols, diff)
		}
	}
}

func migratedStore(t *testing.T, addr, db string) *chstore.Store {
	t.Helper()
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Migrate(t.Context()); err != nil {
		t.Fatalf("migrate %s: %v", db, err)
	}
	return store
}

// tableRows returns the rows of db.table, cols joined by '|' (NULL as \N),
// in order.
func tableRows(t *testing.T, addr, db, table, order string, cols []string) []string {
	t.Helper()
	exprs := make([]string, len(cols))
	for i, c := range cols {
		exprs[i] = "ifNull(toString(" + c + "), '\\N')"
	}
	rows, err := open(t, addr).Query(t.Context(), "SELECT arrayStringConcat(["+strings.Join(exprs, ", ")+"], '|') FROM "+db+"."+table+" ORDER BY "+order)
	if err != nil {
		t.Fatalf("read %s.%s: %v", db, table, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRunClickHouseKafkaEngineStuck checks that a topic the engine cannot
// read (its first record has a number where a string belongs, which 18.16
// re-reads forever) ends the run early with the engine's own error.
func TestRunClickHouseKafkaEngineStuck(t *testing.T) {
	srv := localServer(t)
	broker := startBroker(t, "poison")
	values, _ := makeRecords(10)
	values = append([][]byte{[]byte(`{"eventId":42,"tenantId":"acme"}`)}, values...)
	produce(t, broker.Addr(), "poison", values)

	const db = "bench_kafka_engine_stuck"
	t.Cleanup(func() { dropDatabase(t, srv.Addr(), db) })
	_, err := RunClickHouseKafkaEngine(t.Context(), srv.Addr(), db, broker.Addr(), "poison", len(values), time.Minute,
		WithLogDir(filepath.Join(srv.Dir(), "log")))
	var kerr *KafkaEngineError
	if !errors.As(err, &kerr) {
		t.Fatalf("got error %v, want a *KafkaEngineError", err)
	}
	t.Logf("error: %v", err)
	if !kerr.Stalled || kerr.Waited >= time.Minute {
		t.Errorf("got Stalled %t after %v, want a stall found before the 1m timeout", kerr.Stalled, kerr.Waited)
	}
	if kerr.Want != uint64(len(values)) || kerr.Rows >= kerr.Want {
		t.Errorf("got %d of %d rows, want fewer than %d", kerr.Rows, kerr.Want, len(values))
	}
	if !containsLine(kerr.LogLines, "Cannot parse") {
		t.Errorf("log lines do not quote the parse error:\n%s", strings.Join(kerr.LogLines, "\n"))
	}
	assertConsumerGone(t, srv.Addr(), db)
}

// TestRunClickHouseKafkaEngineTimeout checks the error of a run that ends
// at its timeout: the topic is empty, so the engine has nothing to consume.
func TestRunClickHouseKafkaEngineTimeout(t *testing.T) {
	srv := localServer(t)
	broker := startBroker(t, "empty")

	const db = "bench_kafka_engine_empty"
	t.Cleanup(func() { dropDatabase(t, srv.Addr(), db) })
	_, err := RunClickHouseKafkaEngine(t.Context(), srv.Addr(), db, broker.Addr(), "empty", 1, 3*time.Second)
	var kerr *KafkaEngineError
	if !errors.As(err, &kerr) {
		t.Fatalf("got error %v, want a *KafkaEngineError", err)
	}
	if kerr.Rows != 0 || kerr.Stalled || kerr.Waited < 3*time.Second {
		t.Errorf("got %d rows, Stalled %t after %v; want 0 rows, not stalled, after 3s", kerr.Rows, kerr.Stalled, kerr.Waited)
	}
	assertConsumerGone(t, srv.Addr(), db)
}

func TestRunClickHouseKafkaEngineValidates(t *testing.T) {
	for _, tc := range []struct {
		name     string
		database string
		topic    string
		want     int
		opts     []Option
	}{
		{"bad database", "bench; DROP", "t", 1, nil},
		{"quote in topic", "bench", "t'", 1, nil},
		{"no rows wanted", "bench", "t", 0, nil},
		{"no consumers", "bench", "t", 1, []Option{WithConsumers(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Nothing listens on port 1: validation must fail before any dial.
			_, err := RunClickHouseKafkaEngine(t.Context(), "127.0.0.1:1", tc.database, "127.0.0.1:1", tc.topic, tc.want, time.Second, tc.opts...)
			if err == nil {
				t.Fatal("got no error, want a validation error")
			}
			var kerr *KafkaEngineError
			if errors.As(err, &kerr) {
				t.Fatalf("got %v, want a validation error", err)
			}
		})
	}
}

// BenchmarkClickHouseKafkaEngine measures the Kafka engine on 200k and 1M
// records with 1, 2 and 4 consumers (the topic has 4 partitions), as
// records/s from the view's creation to the last row, and the time to the
// first rows. Run it with -benchtime=1x or 3x; each iteration re-reads the
// topic under a new consumer group.
func BenchmarkClickHouseKafkaEngine(b *testing.B) {
	srv := localServer(b)
	broker := startBroker(b, "bench.200k", "bench.1m")
	for _, size := range []struct {
		topic string
		n     int
	}{{"bench.200k", 200_000}, {"bench.1m", 1_000_000}} {
		b.Run(fmt.Sprintf("records=%d", size.n), func(b *testing.B) {
			values, _ := makeRecords(size.n)
			produce(b, broker.Addr(), size.topic, values)
			for _, consumers := range []int{1, 2, 4} {
				b.Run(fmt.Sprintf("consumers=%d", consumers), func(b *testing.B) {
					benchKafkaEngine(b, srv, broker.Addr(), size.topic, size.n, WithConsumers(consumers))
				})
			}
		})
	}
}

func benchKafkaEngine(b *testing.B, srv *devenv.ClickHouse, brokerAddr, topic string, n int, opts ...Option) {
	const db = "bench_kafka_engine_bench"
	b.Cleanup(func() { dropDatabase(b, srv.Addr(), db) })
	var total, toFirst, first time.Duration
	opts = append(opts, WithLogDir(filepath.Join(srv.Dir(), "log")), WithProgress(func(_ uint64, since time.Duration) {
		if first == 0 {
			first = since
		}
	}))
	for b.Loop() {
		first = 0
		elapsed, err := RunClickHouseKafkaEngine(b.Context(), srv.Addr(), db, brokerAddr, topic, n, 10*time.Minute, opts...)
		if err != nil {
			b.Fatal(err)
		}
		total += elapsed
		toFirst += first
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "records/s")
	b.ReportMetric(toFirst.Seconds()/float64(b.N), "s-to-first-rows")
}

// localServer returns a ClickHouse server on this machine: the Kafka engine
// must reach the loopback broker, and the run reads the server's logs. It
// skips without ClickHouse, except under CI=true.
func localServer(tb testing.TB) *devenv.ClickHouse {
	tb.Helper()
	if srv := chtest.Server(tb); srv != nil {
		return srv
	}
	return chtest.StartPrivate(tb)
}

func startBroker(tb testing.TB, topics ...string) *devenv.Kafka {
	tb.Helper()
	b, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: topics, Partitions: 4})
	if err != nil {
		tb.Fatalf("start broker: %v", err)
	}
	tb.Cleanup(b.Close)
	return b
}

// tokenSums summarizes what a set of records should load as.
type tokenSums struct {
	Rows, PromptTokens, CachedPromptTokens, OutputTokens uint64
	OK, RateLimited                                      uint64
	TTFTMs                                               float64
	MinCompletedAt, MaxCompletedAt                       time.Time
}

// makeRecords returns n protojson InferenceEvents with some fields left out
// (no cached tokens, no status, no labels, no tokens on refused requests),
// and the sums they should load as.
func makeRecords(n int) ([][]byte, tokenSums) {
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	values := make([][]byte, 0, n)
	var s tokenSums
	for i := range n {
		completed := base.Add(time.Duration(i) * 10 * time.Millisecond)
		ev := &meterv1.InferenceEvent{
			EventId:     fmt.Sprintf("ev-%d", i),
			TenantId:    fmt.Sprintf("tenant-%d", i%10),
			Model:       "llama-70b",
			Deployment:  "dep-a",
			Engine:      "vllm",
			GpuType:     "H100",
			ReceivedAt:  timestamppb.New(completed.Add(-2 * time.Second)),
			CompletedAt: timestamppb.New(completed),
			Streaming:   i%2 == 0,
			SloClass:    "interactive",
		}
		switch {
		case i%50 == 7:
			ev.Status = meterv1.Status_STATUS_RATE_LIMITED
			s.RateLimited++
		default:
			if i%3 != 0 { // else status absent: OK
				ev.Status = meterv1.Status_STATUS_OK
			}
			prompt, output, ttft, e2e := int64(100+i%1000), int64(1+i%300), float64(i%500)+0.5, 2000.0
			ev.PromptTokens, ev.OutputTokens, ev.TtftMs, ev.E2EMs = &prompt, &output, &ttft, &e2e
			if i%4 != 0 {
				cached := prompt / 4
				ev.CachedPromptTokens = &cached
				s.CachedPromptTokens += uint64(cached)
			}
			if i%5 == 0 {
				ev.Labels = map[string]string{"team": "search", "tier": "gold"}
			}
			s.PromptTokens += uint64(prompt)
			s.OutputTokens += uint64(output)
			s.TTFTMs += ttft
			s.OK++
		}
		v, err := protojson.Marshal(ev)
		if err != nil {
			panic(err) // a fixed, valid message
		}
		values = append(values, v)
		if i == 0 {
			s.MinCompletedAt = completed.Truncate(time.Second)
		}
		s.MaxCompletedAt = completed.Truncate(time.Second)
	}
	s.Rows = uint64(n)
	return values, s
}

func produce(tb testing.TB, addr, topic string, values [][]byte) {
	tb.Helper()
	w := &kafka.Writer{
		Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.RoundRobin{}, RequiredAcks: kafka.RequireAll,
		BatchSize: 10_000, BatchBytes: 64 << 20, BatchTimeout: time.Millisecond, Compression: kafka.Lz4,
	}
	defer w.Close()
	msgs := make([]kafka.Message, 0, 10_000)
	for i, v := range values {
		msgs = append(msgs, kafka.Message{Value: v})
		if len(msgs) == cap(msgs) || i == len(values)-1 {
			if err := w.WriteMessages(tb.Context(), msgs...); err != nil {
				tb.Fatalf("produce to %s: %v", topic, err)
			}
			msgs = msgs[:0]
		}
	}
}

func loadedSums(tb testing.TB, addr, db string) tokenSums {
	tb.Helper()
	conn := open(tb, addr)
	var s tokenSums
	var ttft float64
	err := conn.QueryRow(tb.Context(), `SELECT count(), sum(prompt_tokens), sum(cached_prompt_tokens), sum(output_tokens),
		countIf(status = 'ok'), countIf(status = 'rate_limited'), sum(ttft_ms), min(completed_at), max(completed_at)
		FROM `+db+`.`+KafkaEngineTargetTable).Scan(
		&s.Rows, &s.PromptTokens, &s.CachedPromptTokens, &s.OutputTokens, &s.OK, &s.RateLimited, &ttft, &s.MinCompletedAt, &s.MaxCompletedAt)
	if err != nil {
		tb.Fatalf("sum loaded rows: %v", err)
	}
	s.TTFTMs = ttft
	s.MinCompletedAt, s.MaxCompletedAt = s.MinCompletedAt.UTC(), s.MaxCompletedAt.UTC()
	return s
}

// assertConsumerGone checks that the run dropped its Kafka table and view.
func assertConsumerGone(tb testing.TB, addr, db string) {
	tb.Helper()
	conn := open(tb, addr)
	var n uint64
	if err := conn.QueryRow(tb.Context(), "SELECT count() FROM system.tables WHERE database = ? AND name IN (?, ?, ?, ?)",
		db, KafkaEngineQueueTable, KafkaEngineViewTable, KafkaEngineIDsViewTable, KafkaEngineHoursViewTable).Scan(&n); err != nil {
		tb.Fatalf("list tables: %v", err)
	}
	if n != 0 {
		tb.Errorf("got %d of the Kafka table and view left in %s, want none", n, db)
	}
}

func dropDatabase(tb testing.TB, addr, db string) {
	// The test's context is done by now.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		tb.Errorf("open clickhouse: %v", err)
		return
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		tb.Errorf("drop database %s: %v", db, err)
	}
}

func open(tb testing.TB, addr string) clickhouse.Conn {
	tb.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		tb.Fatalf("open clickhouse: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

func containsLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func TestKafkaLogMessage(t *testing.T) {
	for _, tc := range []struct {
		line   string
		want   string
		wantOK bool
	}{
		{
			line:   "2026.11.22 18:45:59.927303 [ 40 ] {} <Error> void DB::StorageKafka::streamThread(): Code: 27, e.displayText() = DB::Exception: Cannot parse input",
			want:   "<Error> void DB::StorageKafka::streamThread(): Code: 27, e.displayText() = DB::Exception: Cannot parse input",
			wantOK: true,
		},
		{
			line:   "%3|1795373137.860|FAIL|ClickHouse 18.16.1#consumer-5| [thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
			want:   "FAIL|ClickHouse 18.16.1#consumer-5| [thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
			wantOK: true,
		},
		{line: "13. /lib/x86_64-linux-gnu/libclickhouse.so.18.16(DB::StorageKafka::streamToViews()+0x86d) [0x7f06486c113d]"},
		{line: "2026.11.22 18:45:28.468691 [ 22 ] {2bd3} <Error> executeQuery: Code: 60, e.displayText() = DB::Exception: Table x.y doesn't exist"},
	} {
		got, ok := kafkaLogMessage(tc.line)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("kafkaLogMessage(%q) = %q, %t; want %q, %t", tc.line, got, ok, tc.want, tc.wantOK)
		}
	}
}
