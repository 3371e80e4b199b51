package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestMain(m *testing.M) { chtest.Main(m) }

var base = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// testEvent returns a deterministic valid event; failed requests every 17th.
func testEvent(i int) *meterv1.InferenceEvent {
	ev := &meterv1.InferenceEvent{
		EventId:     fmt.Sprintf("ev-%06d", i),
		TenantId:    fmt.Sprintf("tenant-%d", i%3),
		Model:       []string{"llama-70b", "mixtral-8x7b"}[i%2],
		Deployment:  []string{"dep-a", "dep-b"}[i%2],
		CompletedAt: timestamppb.New(base.Add(time.Duration(i) * 1500 * time.Millisecond)),
	}
	if i%17 == 0 {
		ev.Status = meterv1.Status_STATUS_TIMEOUT
		return ev
	}
	ev.PromptTokens = proto.Int64(int64(100 + i%1000))
	ev.CachedPromptTokens = proto.Int64(int64(i % 50))
	ev.OutputTokens = proto.Int64(int64(1 + i%300))
	ev.TtftMs = proto.Float64(float64(50 + i%200))
	ev.E2EMs = proto.Float64(float64(500 + i%2000))
	return ev
}

// totals is the brute-force expectation: distinct events by (tenant, id).
type totals struct{ Requests, Errors, Prompt, Cached, Output int64 }

func expect(events []*meterv1.InferenceEvent) totals {
	seen := map[string]bool{}
	var t totals
	for _, ev := range events {
		k := ev.GetTenantId() + "\x00" + ev.GetEventId()
		if seen[k] {
			continue
		}
		seen[k] = true
		t.Requests++
		if s := ev.GetStatus(); s != meterv1.Status_STATUS_OK && s != meterv1.Status_STATUS_UNSPECIFIED {
			t.Errors++
		}
		t.Prompt += ev.GetPromptTokens()
		t.Cached += ev.GetCachedPromptTokens()
		t.Output += ev.GetOutputTokens()
	}
	return t
}

func queryTotals(ctx context.Context, store *chstore.Store) (totals, error) {
	rows, err := query.New(store, query.Config{}).Usage(ctx, query.UsageQuery{Start: base.Add(-time.Hour), End: base.Add(48 * time.Hour)})
	if err != nil || len(rows) == 0 {
		return totals{}, err
	}
	r := rows[0]
	return totals{r.Requests, r.Errors, r.PromptTokens, r.CachedPromptTokens, r.OutputTokens}, nil
}

type env struct {
	broker *devenv.Kafka
	store  *chstore.Store
	logger *slog.Logger
}

func newEnv(t *testing.T, chAddr, db string) *env {
	t.Helper()
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{DefaultEventsTopic, DefaultDLQTopic}, Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	e := newEnvStore(t, chAddr, db)
	e.broker = broker
	return e
}

func (e *env) produce(t *testing.T, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(e.broker.Addr()), Topic: DefaultEventsTopic, Balancer: &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 10_000}
	defer w.Close()
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func protoMessages(t *testing.T, events []*meterv1.InferenceEvent) []kafka.Message {
	t.Helper()
	msgs := make([]kafka.Message, len(events))
	for i, ev := range events {
		b, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = kafka.Message{Key: []byte(ev.GetEventId()), Value: b,
			Headers: []kafka.Header{{Key: HeaderContentType, Value: []byte(ContentTypeProtobuf)}}}
	}
	return msgs
}

// startConsumer runs a consumer until the returned stop is called or it
// returns by itself; stop returns Run's error.
func (e *env) startConsumer(t *testing.T, crash func(string) bool, batch int) (stop func() error) {
	t.Helper()
	c, err := NewConsumer(ConsumerConfig{
		Brokers: []string{e.broker.Addr()}, BatchSize: batch, BatchTimeout: 100 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	}, e.store, prometheus.NewRegistry(), e.logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	c.crash = crash
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once atomic.Bool
	stop = func() error {
		if once.Swap(true) {
			return nil
		}
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			return errors.New("consumer did not stop")
		}
	}
	t.Cleanup(func() { stop() })
	return stop
}

func waitTotals(t *testing.T, store *chstore.Store, want totals, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got totals
	var err error
	for time.Now().Before(deadline) {
		got, err = queryTotals(context.Background(), store)
		if err == nil && got == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("totals after %s: got %+v (err %v), want %+v", timeout, got, err, want)
}

// stable asserts the totals stay at want (nothing arrives twice later).
func stable(t *testing.T, store *chstore.Store, want totals) {
	t.Helper()
	time.Sleep(500 * time.Millisecond)
	got, err := queryTotals(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("totals changed after settling (-want +got):\n%s", diff)
	}
}

func TestConsumerExactTotalsAndDLQ(t *testing.T) {
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)

	var events []*meterv1.InferenceEvent
	for i := range 3000 {
		events = append(events, testEvent(i))
	}
	msgs := protoMessages(t, events)
	// Client retries: 200 events sent a second time, some as JSON.
	for i := 0; i < 200; i++ {
		ev := events[i*7]
		if i%2 == 0 {
			msgs = append(msgs, protoMessages(t, []*meterv1.InferenceEvent{ev})...)
		} else {
			b, _ := protojson.Marshal(ev)
			msgs = append(msgs, kafka.Message{Value: b})
		}
	}
	// Bad records, each with a distinct reason.
	bad := []struct {
		value  []byte
		ct     string
		reason string
	}{
		{[]byte(`{"event_id":"broken"`), ContentTypeJSON, ReasonDecode},
		{[]byte{0x0a, 0xff, 0xff, 0xff}, ContentTypeProtobuf, ReasonDecode},
		{[]byte(`{"event_id":"x","tenant_id":"t","model":"m","completed_at":"2026-11-22T10:00:00Z","prompt_tokens":"5","output_tokens":"1","ttft_ms":900,"e2e_ms":800}`), "", ReasonInvalidValue},
		{[]byte(`{"event_id":"y","tenant_id":"t","model":"m"}`), "", ReasonMissingField},
		{make([]byte, 70_000), "", ReasonOversized},
	}
	for _, b := range bad {
		m := kafka.Message{Key: []byte("bad"), Value: b.value}
		if b.ct != "" {
			m.Headers = []kafka.Header{{Key: HeaderContentType, Value: []byte(b.ct)}}
		}
		msgs = append(msgs, m)
	}
	e.produce(t, msgs...)

	stop := e.startConsumer(t, nil, 1000)
	want := expect(events)
	waitTotals(t, e.store, want, 30*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("consumer stop: %v", err)
	}
	stable(t, e.store, want)

	// Every bad record is in the DLQ with its original bytes and reason.
	got := readAll(t, e.broker.Addr(), DefaultDLQTopic, len(bad))
	reasons := map[string]int{}
	for _, m := range got {
		reasons[headerValue(m.Headers, HeaderDLQReasonCode)]++
		if headerValue(m.Headers, HeaderDLQReason) == "" || headerValue(m.Headers, HeaderDLQTopic) != DefaultEventsTopic {
			t.Errorf("DLQ record without reason or source: %v", m.Headers)
		}
		if _, err := strconv.ParseInt(headerValue(m.Headers, HeaderDLQOffset), 10, 64); err != nil {
			t.Errorf("DLQ record offset header: %v", err)
		}
		// Values over the DLQ value limit (64 KiB) are cut to a prefix.
		cut := strings.Contains(headerValue(m.Headers, HeaderDLQTruncated), "value")
		found := false
		for _, b := range bad {
			found = found || string(b.value) == string(m.Value) ||
				cut && len(b.value) > len(m.Value) && strings.HasPrefix(string(b.value), string(m.Value)) &&
					headerValue(m.Headers, HeaderDLQOriginalSize) == strconv.Itoa(len(b.value))
		}
		if !found {
			t.Errorf("DLQ record value %.40q is not one of the bad records", m.Value)
		}
	}
	wantReasons := map[string]int{ReasonDecode: 2, ReasonInvalidValue: 1, ReasonMissingField: 1, ReasonOversized: 1}
	if diff := cmp.Diff(wantReasons, reasons); diff != "" {
		t.Errorf("DLQ reasons (-want +got):\n%s", diff)
	}
}

// readAll reads n records from every partition of topic.
func readAll(t *testing.T, addr, topic string, n int) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, GroupID: "test-reader-" + strconv.FormatInt(time.Now().UnixNano(), 10), StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var out []kafka.Message
	for len(out) < n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("read %s: got %d of %d records: %v", topic, len(out), n, err)
		}
		out = append(out, m)
	}
	return out
}

// TestConsumerCrashRecovery kills the consumer at each step of a flush and
// checks that a restarted consumer ends with exact totals: nothing lost,
// nothing counted twice.
func TestConsumerCrashRecovery(t *testing.T) {
	for _, point := range []string{"after-fetch", "after-dlq", "after-insert", "after-commit"} {
		t.Run(point, func(t *testing.T) {
			addr, db := chtest.NewDB(t)
			e := newEnv(t, addr, db)
			var events []*meterv1.InferenceEvent
			for i := range 2000 {
				events = append(events, testEvent(i))
			}
			msgs := protoMessages(t, events)
			msgs = append(msgs, kafka.Message{Value: []byte(`{"event_id":`)}) // one DLQ record
			e.produce(t, msgs...)

			// Crash at the point on the third batch.
			var hits atomic.Int32
			stop := e.startConsumer(t, func(p string) bool {
				return p == point && hits.Add(1) == 3
			}, 300)
			deadline := time.Now().Add(30 * time.Second)
			for hits.Load() < 3 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := stop(); !errors.Is(err, errCrashed) {
				t.Fatalf("first consumer: got %v, want the simulated crash", err)
			}
			e.startConsumer(t, nil, 300)
			want := expect(events)
			waitTotals(t, e.store, want, 30*time.Second)
			stable(t, e.store, want)
		})
	}
}

// TestClickHouseOutage stops ClickHouse mid-stream: the consumer keeps the
// data in Kafka, reports unhealthy, and delivers everything once the server is
// back.
func TestClickHouseOutage(t *testing.T) {
	srv := chtest.StartPrivate(t)
	e := newEnv(t, srv.Addr(), "outage")
	var events []*meterv1.InferenceEvent
	for i := range 4000 {
		events = append(events, testEvent(i))
	}
	c, err := NewConsumer(ConsumerConfig{
		Brokers: []string{e.broker.Addr()}, BatchSize: 500, BatchTimeout: 50 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	}, e.store, prometheus.NewRegistry(), e.logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e.produce(t, protoMessages(t, events[:1000])...)
	waitTotals(t, e.store, expect(events[:1000]), 30*time.Second)

	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := srv.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	e.produce(t, protoMessages(t, events[1000:])...)
	deadline := time.Now().Add(20 * time.Second)
	for c.Healthy() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if c.Healthy() {
		t.Fatal("consumer still healthy with ClickHouse down")
	}
	time.Sleep(500 * time.Millisecond) // several failed attempts
	if err := srv.Start(stopCtx); err != nil {
		t.Fatal(err)
	}
	waitTotals(t, e.store, expect(events), 60*time.Second)
	if !c.Healthy() {
		t.Error("consumer not healthy after ClickHouse came back")
	}
	stable(t, e.store, expect(events))
}

// TestKcatInterop has librdkafka (kcat) produce JSON events to the broker.
func TestKcatInterop(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kcat not installed; CI must install it (apt-get install kcat)")
		}
		t.Skip("kcat not installed")
	}
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)
	var events []*meterv1.InferenceEvent
	var lines []string
	for i := range 500 {
		ev := testEvent(i)
		events = append(events, ev)
		b, err := protojson.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
	}
	cmd := exec.Command(kcat, "-P", "-b", e.broker.Addr(), "-t", DefaultEventsTopic, "-H", "content-type=application/json")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	e.startConsumer(t, nil, 1000)
	waitTotals(t, e.store, expect(events), 30*time.Second)
}
