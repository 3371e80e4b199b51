package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chcluster"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// issueRecordBytes is the value size of the record of issue 13: the record
// fits the broker's default limit (1048588 bytes per record batch), but
// its whole copy with the dead-letter headers does not.
const issueRecordBytes = 1_048_400

func TestDeadLetterBounds(t *testing.T) {
	c := &Consumer{cfg: ConsumerConfig{DLQMaxValueBytes: 100, DLQMaxHeaderBytes: 64}}
	big := bytes.Repeat([]byte("v"), 250)
	sum := sha256.Sum256(big)
	verr := &ValidationError{Reason: ReasonOversized, Message: strings.Repeat("m", 5000)}
	tests := []struct {
		name        string
		msg         kafka.Message
		wantValue   []byte
		wantKey     []byte
		wantHeaders []string // original headers kept, by key
		wantCut     string
		wantMinCut  string
	}{
		{
			name:        "small record whole",
			msg:         kafka.Message{Key: []byte("k"), Value: []byte("{bad"), Headers: []kafka.Header{{Key: "content-type", Value: []byte("application/json")}}},
			wantValue:   []byte("{bad"),
			wantKey:     []byte("k"),
			wantHeaders: []string{"content-type"},
			wantMinCut:  "key,value,headers",
		},
		{
			name:       "value cut",
			msg:        kafka.Message{Value: big},
			wantValue:  big[:100],
			wantCut:    "value",
			wantMinCut: "value",
		},
		{
			name:        "key and headers cut",
			msg:         kafka.Message{Key: bytes.Repeat([]byte("k"), 5000), Value: []byte("x"), Headers: []kafka.Header{{Key: "a", Value: []byte("1")}, {Key: "huge", Value: make([]byte, 1000)}, {Key: "b", Value: []byte("2")}}},
			wantValue:   []byte("x"),
			wantKey:     bytes.Repeat([]byte("k"), maxDLQKeyBytes),
			wantHeaders: []string{"a", "b"},
			wantCut:     "key,headers",
			wantMinCut:  "key,value,headers",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.msg.Topic, tt.msg.Partition, tt.msg.Offset = DefaultEventsTopic, 2, 41
			d := c.deadLetter(tt.msg, verr)
			if !bytes.Equal(d.msg.Value, tt.wantValue) || !bytes.Equal(d.msg.Key, tt.wantKey) {
				t.Errorf("value %.20q (%d bytes), key %d bytes; want %.20q (%d bytes), key %d bytes",
					d.msg.Value, len(d.msg.Value), len(d.msg.Key), tt.wantValue, len(tt.wantValue), len(tt.wantKey))
			}
			var kept []string
			for _, h := range d.msg.Headers {
				if !strings.HasPrefix(h.Key, "dlq-") {
					kept = append(kept, h.Key)
				}
			}
			if diff := cmp.Diff(tt.wantHeaders, kept); diff != "" {
				t.Errorf("original headers kept (-want +got):\n%s", diff)
			}
			valueSum := sha256.Sum256(tt.msg.Value)
			want := map[string]string{
				HeaderDLQReasonCode: ReasonOversized, HeaderDLQTopic: DefaultEventsTopic, HeaderDLQPartition: "2", HeaderDLQOffset: "41",
				HeaderDLQOriginalSize: strconv.Itoa(len(tt.msg.Value)), HeaderDLQOriginalSHA256: hex.EncodeToString(valueSum[:]),
				HeaderDLQTruncated: tt.wantCut,
			}
			for k, v := range want {
				if got := headerValue(d.msg.Headers, k); got != v {
					t.Errorf("header %s: got %q, want %q", k, got, v)
				}
			}
			if got := len(headerValue(d.msg.Headers, HeaderDLQReason)); got != maxDLQReasonBytes {
				t.Errorf("reason header: got %d bytes, want %d", got, maxDLQReasonBytes)
			}
			minimal := d.minimal()
			if minimal.Key != nil || minimal.Value != nil {
				t.Errorf("minimal record has key %q, value %.20q; want neither", minimal.Key, minimal.Value)
			}
			want[HeaderDLQTruncated] = tt.wantMinCut
			for k, v := range want {
				if got := headerValue(minimal.Headers, k); got != v {
					t.Errorf("minimal record header %s: got %q, want %q", k, got, v)
				}
			}
		})
	}
	if got := hex.EncodeToString(sum[:]); got != headerValue(c.deadLetter(kafka.Message{Value: big}, verr).msg.Headers, HeaderDLQOriginalSHA256) {
		t.Errorf("SHA-256 is not the whole value's")
	}
}

func TestPermanent(t *testing.T) {
	timeout := &net.OpError{Op: "write", Err: os.ErrDeadlineExceeded}
	tests := []struct {
		err  error
		want bool
	}{
		{kafka.MessageSizeTooLarge, true},
		{fmt.Errorf("%w: The message is too large.", kafka.MessageSizeTooLarge), true},
		{kafka.RecordListTooLarge, true},
		{kafka.InvalidRecord, true},
		{kafka.TopicAuthorizationFailed, true},
		{kafka.MessageTooLargeError{}, true},
		{kafka.LeaderNotAvailable, false},
		{kafka.NotLeaderForPartition, false},
		{kafka.RequestTimedOut, false},
		{kafka.UnknownTopicOrPartition, false},
		{io.ErrUnexpectedEOF, false},
		{timeout, false},
		{errors.New("something else"), false},
	}
	for _, tt := range tests {
		if got := permanent(tt.err); got != tt.want {
			t.Errorf("permanent(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	werrs := perMessage(kafka.WriteErrors{nil, kafka.MessageSizeTooLarge}, 2)
	if werrs[0] != nil || !permanent(werrs[1]) {
		t.Errorf("perMessage(WriteErrors) = %v", werrs)
	}
	all := perMessage(kafka.LeaderNotAvailable, 3)
	if len(all) != 3 || !errors.Is(all[2], kafka.LeaderNotAvailable) {
		t.Errorf("perMessage(one error) = %v", all)
	}
}

// faultEnv is a kfake cluster the test configures (topic limits, injected
// errors) and a migrated ClickHouse database.
type faultEnv struct {
	cluster *kfake.Cluster
	addr    string
	store   *chstore.Store
	logger  *slog.Logger
}

func newFaultEnv(t *testing.T, topics map[string]map[string]string) *faultEnv {
	t.Helper()
	addr, db := chtest.NewDB(t)
	e := newEnvStore(t, addr, db)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	for _, topic := range []string{DefaultEventsTopic, DefaultGPUTopic, DefaultDLQTopic} {
		if err := cluster.CreateTopic(topic, 1, topics[topic]); err != nil {
			t.Fatal(err)
		}
	}
	return &faultEnv{cluster: cluster, addr: cluster.ListenAddrs()[0], store: e.store, logger: e.logger}
}

// newEnvStore opens a migrated store in db, with the tests' logger.
func newEnvStore(t *testing.T, chAddr, db string) *env {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	cfg := chstore.Config{Addr: []string{chAddr}, Database: db, DialTimeout: time.Second}
	if os.Getenv(chtest.EnvCluster) == "1" {
		// The exactness tests of ingest, run on a cluster in cluster mode
		// (make test does): a new database of the binary's shared cluster,
		// through the server of its second shard, instead of chAddr's.
		c := chcluster.Shared(t)
		cfg = chstore.Config{Addr: []string{c.Addr(1, 0)}, Database: c.NewDB(t), Cluster: c.Name(), DialTimeout: time.Second}
	}
	store, err := chstore.Open(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &env{store: store, logger: logger}
}

// write produces msgs in one call; each call is its own produce request.
func (e *faultEnv) write(t *testing.T, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(e.addr), Topic: topic, Balancer: &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 10_000, BatchBytes: 32 << 20}
	defer w.Close()
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// run runs c until the test ends or the returned stop is called.
func run(t *testing.T, c *Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	var err error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitCommitted waits until group has committed offset want on partition 0 of topic.
func waitCommitted(t *testing.T, addr, group, topic string, want int64) {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second}
	var got int64 = -2
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
		if err != nil || len(resp.Topics[topic]) == 0 {
			continue
		}
		if got = resp.Topics[topic][0].CommittedOffset; got == want {
			return
		}
	}
	t.Fatalf("committed offset of %s/0: got %d, want %d", topic, got, want)
}

// deadLetterCounts reads meter_ingest_dead_letters_total by outcome.
func deadLetterCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "meter_ingest_dead_letters_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// bigRecord is a rejected record of n bytes: JSON too large for an event.
func bigRecord(n int) []byte {
	b := bytes.Repeat([]byte("x"), n)
	copy(b, `{"event_id":"big","pad":"`)
	copy(b[n-2:], `"}`)
	return b
}

// checkDeadLetter checks that the rejection of big (at offset, in partition
// 0 of topic) is durable where outcome says, and identifiable.
func checkDeadLetter(t *testing.T, addr string, store *chstore.Store, topic string, offset int64, big []byte, outcome string) {
	t.Helper()
	sum := sha256.Sum256(big)
	wantSHA := hex.EncodeToString(sum[:])
	prefix := big[:min(len(big), 64<<10)]
	if outcome == OutcomeTable {
		rows, err := store.DeadLetters(context.Background(), topic, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 {
			t.Fatalf("dead_letters rows of %s: got %d, want 1", topic, len(rows))
		}
		r := rows[0]
		if r.SourcePartition != 0 || r.SourceOffset != offset || r.OriginalSize != uint64(len(big)) || r.OriginalSHA256 != wantSHA ||
			!bytes.Equal(r.Payload, prefix) || r.Truncated != (len(big) > len(prefix)) || r.ReasonCode == "" || r.DLQError == "" {
			t.Errorf("dead_letters row: got %s/%d@%d size %d sha %s payload %d bytes truncated %v reason %q dlq error %q; want offset %d size %d sha %s payload %d bytes",
				r.SourceTopic, r.SourcePartition, r.SourceOffset, r.OriginalSize, r.OriginalSHA256, len(r.Payload), r.Truncated, r.ReasonCode, r.DLQError,
				offset, len(big), wantSHA, len(prefix))
		}
		return
	}
	m := readAll(t, addr, DefaultDLQTopic, 1)[0]
	wantValue := prefix
	if outcome == OutcomeDLQMinimal {
		wantValue = nil
	}
	if !bytes.Equal(m.Value, wantValue) {
		t.Errorf("DLQ value: got %d bytes, want %d", len(m.Value), len(wantValue))
	}
	want := map[string]string{
		HeaderDLQTopic: topic, HeaderDLQPartition: "0", HeaderDLQOffset: strconv.FormatInt(offset, 10),
		HeaderDLQOriginalSize: strconv.Itoa(len(big)), HeaderDLQOriginalSHA256: wantSHA,
	}
	for k, v := range want {
		if got := headerValue(m.Headers, k); got != v {
			t.Errorf("DLQ header %s: got %q, want %q", k, got, v)
		}
	}
	if !strings.Contains(headerValue(m.Headers, HeaderDLQTruncated), "value") {
		t.Errorf("DLQ header %s: got %q, want it to name the value", HeaderDLQTruncated, headerValue(m.Headers, HeaderDLQTruncated))
	}
}

// TestOversizedRecordDoesNotStopPartition sends a rejected record between
// valid events on one partition, in the ways the dead-letter topic can
// refuse its copy, and checks that the later events are counted exactly,
// every offset is committed and the rejection is durable: in the DLQ topic,
// cut, or smaller, or in ClickHouse.
func TestOversizedRecordDoesNotStopPartition(t *testing.T) {
	refuse := func(code *kerr.Error) *kfake.Fault {
		return &kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: DefaultDLQTopic, Err: code, Count: -1}
	}
	tests := []struct {
		name     string
		topics   map[string]map[string]string
		fault    *kfake.Fault
		retryFor time.Duration
		size     int
		want     string
	}{
		// The record of issue 13: its whole copy is over the broker's limit.
		{name: "copy over the broker limit", size: issueRecordBytes, want: OutcomeDLQ},
		{name: "DLQ topic refuses the cut copy", size: issueRecordBytes, want: OutcomeDLQMinimal,
			topics: map[string]map[string]string{DefaultDLQTopic: {"max.message.bytes": "4096"}}},
		{name: "DLQ topic refuses every record", size: 70_000, want: OutcomeTable,
			fault: refuse(kerr.TopicAuthorizationFailed)},
		{name: "DLQ topic unavailable past the budget", size: 70_000, want: OutcomeTable,
			fault: refuse(kerr.LeaderNotAvailable), retryFor: 500 * time.Millisecond},
		// Over the reader's 8 MiB MaxBytes: a fetch still returns it whole.
		{name: "record over the fetch size", size: 9 << 20, want: OutcomeDLQ,
			topics: map[string]map[string]string{DefaultEventsTopic: {"max.message.bytes": strconv.Itoa(16 << 20)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFaultEnv(t, tt.topics)
			var events []*meterv1.InferenceEvent
			for i := range 400 {
				events = append(events, testEvent(i))
			}
			msgs := protoMessages(t, events)
			big := bigRecord(tt.size)
			e.write(t, DefaultEventsTopic, msgs[:200]...)
			e.write(t, DefaultEventsTopic, kafka.Message{Key: []byte("big"), Value: big,
				Headers: []kafka.Header{{Key: HeaderContentType, Value: []byte(ContentTypeJSON)}}})
			e.write(t, DefaultEventsTopic, msgs[200:]...)
			if tt.fault != nil {
				e.cluster.Fault(*tt.fault)
			}

			reg := prometheus.NewRegistry()
			c, err := NewConsumer(ConsumerConfig{
				Brokers: []string{e.addr}, BatchSize: 150, BatchTimeout: 100 * time.Millisecond,
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, DLQRetryFor: tt.retryFor,
			}, e.store, reg, e.logger, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			want := expect(events)
			waitTotals(t, e.store, want, 60*time.Second)
			waitCommitted(t, e.addr, DefaultGroupID, DefaultEventsTopic, 401)
			if !c.Healthy() {
				t.Error("consumer unhealthy after the batch was committed")
			}
			if err := stop(); err != nil {
				t.Fatalf("consumer: %v", err)
			}
			stable(t, e.store, want)
			wantCounts := map[string]float64{OutcomeDLQ: 0, OutcomeDLQMinimal: 0, OutcomeTable: 0}
			wantCounts[tt.want] = 1
			if diff := cmp.Diff(wantCounts, deadLetterCounts(t, reg)); diff != "" {
				t.Errorf("meter_ingest_dead_letters_total by outcome (-want +got):\n%s", diff)
			}
			checkDeadLetter(t, e.addr, e.store, DefaultEventsTopic, 200, big, tt.want)
		})
	}
}

// TestGPUConsumerDLQRefused: the GPU sample consumer shares the rule; a
// rejected sample whose dead letter the topic refuses lands in ClickHouse
// and the later samples are stored.
func TestGPUConsumerDLQRefused(t *testing.T) {
	e := newFaultEnv(t, nil)
	var msgs []kafka.Message
	for i := range 80 {
		b, err := proto.Marshal(testSample(i))
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, kafka.Message{Value: b})
	}
	big := bigRecord(issueRecordBytes)
	e.write(t, DefaultGPUTopic, msgs[:40]...)
	e.write(t, DefaultGPUTopic, kafka.Message{Value: big})
	e.write(t, DefaultGPUTopic, msgs[40:]...)
	e.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: DefaultDLQTopic, Err: kerr.TopicAuthorizationFailed, Count: -1})

	c, err := NewGPUConsumer(ConsumerConfig{Brokers: []string{e.addr}, BatchSize: 30, BatchTimeout: 100 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		e.store, prometheus.NewRegistry(), e.logger, func() time.Time { return base.Add(2 * time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitCommitted(t, e.addr, DefaultGPUGroupID, DefaultGPUTopic, 81)
	if err := stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}
	rows, err := e.store.GPUSamplesOfHour(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 80 {
		t.Errorf("GPU samples: got %d, want 80", len(rows))
	}
	checkDeadLetter(t, e.addr, e.store, DefaultGPUTopic, 40, big, OutcomeTable)
}

// TestKcatOversizedRecord is issue 13's end-to-end case: a third-party
// producer (librdkafka's kcat) writes a record of about 1 MB, under the
// broker's limit, then valid events, to one partition of the dev broker.
// Ingestion goes on, the later events are counted exactly, and the
// rejection is in the DLQ topic with the whole value's size and SHA-256.
func TestKcatOversizedRecord(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kcat not installed; CI must install it (apt-get install kcat)")
		}
		t.Skip("kcat not installed")
	}
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)
	produce := func(lines ...[]byte) {
		t.Helper()
		cmd := exec.Command(kcat, "-P", "-b", e.broker.Addr(), "-t", DefaultEventsTopic, "-p", "0",
			"-X", "message.max.bytes=1048588", "-H", "content-type=application/json")
		cmd.Stdin = bytes.NewReader(append(bytes.Join(lines, []byte("\n")), '\n'))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kcat: %v\n%s", err, out)
		}
	}
	var events []*meterv1.InferenceEvent
	var lines [][]byte
	for i := range 400 {
		ev := testEvent(i)
		events = append(events, ev)
		b, err := protojson.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b)
	}
	big := bigRecord(issueRecordBytes)
	produce(lines[:200]...)
	produce(big)
	produce(lines[200:]...)

	c, err := NewConsumer(ConsumerConfig{Brokers: []string{e.broker.Addr()}, BatchSize: 1000, BatchTimeout: 100 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, e.store, prometheus.NewRegistry(), e.logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	waitTotals(t, e.store, expect(events), 60*time.Second)
	waitCommitted(t, e.broker.Addr(), DefaultGroupID, DefaultEventsTopic, 401)
	if !c.Healthy() {
		t.Error("consumer unhealthy after the oversized record")
	}
	checkDeadLetter(t, e.broker.Addr(), e.store, DefaultEventsTopic, 200, big, OutcomeDLQ)
}

// TestDeadLettersRefusedTogetherFitAlone: three dead letters that the DLQ
// topic refuses as one batch, though each fits alone, are written whole,
// not cut down to minimal records.
func TestDeadLettersRefusedTogetherFitAlone(t *testing.T) {
	e := newFaultEnv(t, map[string]map[string]string{DefaultDLQTopic: {"max.message.bytes": "100000"}})
	var events []*meterv1.InferenceEvent
	for i := range 60 {
		events = append(events, testEvent(i))
	}
	msgs := protoMessages(t, events)
	for k := range 3 {
		e.write(t, DefaultEventsTopic, msgs[k*20:(k+1)*20]...)
		e.write(t, DefaultEventsTopic, kafka.Message{Key: []byte(fmt.Sprint("big", k)), Value: bigRecord(70_000),
			Headers: []kafka.Header{{Key: HeaderContentType, Value: []byte(ContentTypeJSON)}}})
	}
	reg := prometheus.NewRegistry()
	c, err := NewConsumer(ConsumerConfig{
		Brokers: []string{e.addr}, BatchSize: 1000, BatchTimeout: time.Second,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	}, e.store, reg, e.logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitTotals(t, e.store, expect(events), 60*time.Second)
	waitCommitted(t, e.addr, DefaultGroupID, DefaultEventsTopic, 63)
	if err := stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}
	want := map[string]float64{OutcomeDLQ: 3, OutcomeDLQMinimal: 0, OutcomeTable: 0}
	if diff := cmp.Diff(want, deadLetterCounts(t, reg)); diff != "" {
		t.Errorf("meter_ingest_dead_letters_total by outcome (-want +got):\n%s", diff)
	}
}
