package ingest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestPartitionLagMessages(t *testing.T) {
	tests := []struct {
		name string
		p    PartitionLag
		want int64
	}{
		{"empty, no commit", PartitionLag{Start: 0, End: 0, Committed: -1}, 0},
		{"no commit counts the whole log", PartitionLag{Start: 0, End: 7, Committed: -1}, 7},
		{"no commit, log trimmed", PartitionLag{Start: 4, End: 7, Committed: -1}, 3},
		{"committed part", PartitionLag{Start: 0, End: 7, Committed: 5}, 2},
		{"committed all", PartitionLag{Start: 0, End: 7, Committed: 7}, 0},
		{"committed below the earliest offset", PartitionLag{Start: 4, End: 7, Committed: 2}, 3},
		{"committed past the end", PartitionLag{Start: 0, End: 7, Committed: 9}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Messages(); got != tt.want {
				t.Errorf("Messages of %+v: got %d, want %d", tt.p, got, tt.want)
			}
		})
	}
}

// lagEnv is a broker whose events topic has three partitions.
type lagEnv struct {
	addr string
}

func newLagEnv(t *testing.T) *lagEnv {
	t.Helper()
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{DefaultEventsTopic, DefaultDLQTopic}, Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	return &lagEnv{addr: broker.Addr()}
}

// produce writes n records to partition p of the events topic.
func (e *lagEnv) produce(t *testing.T, p, n int) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(e.addr), Topic: DefaultEventsTopic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return p })}
	defer w.Close()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Value: []byte(strconv.Itoa(i))}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// consume reads n records as a member of group, then commits those that
// keep says, as the ingest consumer does (the committed offset is the next
// one to read); it leaves the group before returning.
func (e *lagEnv) consume(t *testing.T, group string, n int, keep func(kafka.Message) bool) {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{e.addr}, GroupID: group, Topic: DefaultEventsTopic,
		StartOffset: kafka.FirstOffset, MaxWait: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var commit []kafka.Message
	for range n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		if keep(m) {
			commit = append(commit, m)
		}
	}
	if err := r.CommitMessages(ctx, commit...); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func (e *lagEnv) checker(t *testing.T, cfg LagConfig) *LagChecker {
	t.Helper()
	cfg.Brokers = []string{e.addr}
	c, err := NewLagChecker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func partitionLags(committed [3]int64) []PartitionLag {
	ends := [3]int64{5, 3, 0}
	var out []PartitionLag
	for p := range 3 {
		out = append(out, PartitionLag{Topic: DefaultEventsTopic, Partition: p, End: ends[p], Committed: committed[p]})
	}
	return out
}

func TestLagOfCommittedGroup(t *testing.T) {
	e := newLagEnv(t)
	e.produce(t, 0, 5)
	e.produce(t, 1, 3)
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := e.checker(t, LagConfig{Now: func() time.Time { return at }, Wait: -1})
	ctx := context.Background()

	check := func(step string, want Lag, wantTotal int64, wantUncommitted int) {
		t.Helper()
		got, err := c.Lag(ctx)
		if err != nil {
			t.Fatalf("%s: lag: %v", step, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: lag (-want +got):\n%s", step, diff)
		}
		if got.Total() != wantTotal || got.Uncommitted() != wantUncommitted {
			t.Errorf("%s: total and uncommitted partitions: got %d, %d, want %d, %d", step, got.Total(), got.Uncommitted(), wantTotal, wantUncommitted)
		}
	}

	// Before the group has committed anything, the whole log is lag.
	check("before any commit", Lag{Group: DefaultGroupID, Partitions: partitionLags([3]int64{-1, -1, -1})}, 8, 2)
	_, err := c.CaughtUp(ctx)
	var lerr *LagError
	if !errors.Is(err, ErrLagging) || !errors.As(err, &lerr) || lerr.Lag.Total() != 8 {
		t.Fatalf("caught up before any commit: got %v, want a *LagError of 8 messages", err)
	}
	if got, want := err.Error(), "8 messages not yet ingested (group tokenmeter-ingest; no committed offset on 2 of 3 partitions)"; got != want {
		t.Errorf("error text: got %q, want %q", got, want)
	}

	// The group consumes everything but commits partition 0 up to offset 2.
	e.consume(t, DefaultGroupID, 8, func(m kafka.Message) bool { return m.Partition == 0 && m.Offset <= 2 })
	check("after a partial commit", Lag{Group: DefaultGroupID, Partitions: partitionLags([3]int64{3, -1, -1})}, 5, 1)
	if _, err := c.CaughtUp(ctx); !errors.Is(err, ErrLagging) {
		t.Fatalf("caught up after a partial commit: got %v, want ErrLagging", err)
	}

	// A CaughtUp that waits sees the group commit the rest.
	waiting := e.checker(t, LagConfig{Now: func() time.Time { return at }, Wait: 30 * time.Second})
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	go func() {
		t, err := waiting.CaughtUp(ctx)
		done <- result{t, err}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("caught up before the commit: got %v, %v", r.at, r.err)
	default:
	}
	e.consume(t, DefaultGroupID, 5, func(kafka.Message) bool { return true })
	if r := <-done; r.err != nil || !r.at.Equal(at) {
		t.Fatalf("caught up after the commit: got %v, %v, want %v, nil", r.at, r.err, at)
	}
	check("after the full commit", Lag{Group: DefaultGroupID, Partitions: partitionLags([3]int64{5, 3, -1})}, 0, 0)
	if got, err := c.CaughtUp(ctx); err != nil || !got.Equal(at) {
		t.Fatalf("caught up: got %v, %v, want %v, nil", got, err, at)
	}

	// Records written later are lag again.
	e.produce(t, 2, 4)
	if _, err := c.CaughtUp(ctx); !errors.As(err, &lerr) || lerr.Lag.Total() != 4 {
		t.Fatalf("caught up after new records: got %v, want a *LagError of 4 messages", err)
	}
}

func TestLagOfUnknownGroup(t *testing.T) {
	e := newLagEnv(t)
	e.produce(t, 0, 5)
	e.produce(t, 1, 3)
	e.consume(t, DefaultGroupID, 8, func(kafka.Message) bool { return true })

	c := e.checker(t, LagConfig{GroupID: "tokenmeter-nobody", Wait: -1})
	got, err := c.Lag(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := Lag{Group: "tokenmeter-nobody", Partitions: partitionLags([3]int64{-1, -1, -1})}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lag (-want +got):\n%s", diff)
	}
	_, err = c.CaughtUp(context.Background())
	var lerr *LagError
	if !errors.As(err, &lerr) || lerr.Lag.Total() != 8 || lerr.Lag.Uncommitted() != 2 {
		t.Fatalf("caught up: got %v, want a *LagError of 8 messages on 2 uncommitted partitions", err)
	}
}

func TestLagOfMissingTopic(t *testing.T) {
	e := newLagEnv(t)
	c := e.checker(t, LagConfig{Topics: []string{DefaultEventsTopic, "meter.missing.v1"}, Wait: -1})
	if _, err := c.Lag(context.Background()); !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Errorf("lag: got %v, want kafka.UnknownTopicOrPartition", err)
	}
	if _, err := c.CaughtUp(context.Background()); !errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, ErrLagging) {
		t.Errorf("caught up: got %v, want kafka.UnknownTopicOrPartition", err)
	}
}

// TestLagOfIngestConsumer: the ingest consumer's own commits (after the
// ClickHouse insert) bring the lag to zero.
func TestLagOfIngestConsumer(t *testing.T) {
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)
	var events []*meterv1.InferenceEvent
	for i := range 500 {
		events = append(events, testEvent(i))
	}
	e.produce(t, protoMessages(t, events)...)

	c, err := NewLagChecker(LagConfig{Brokers: []string{e.broker.Addr()}, Wait: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CaughtUp(context.Background()); !errors.Is(err, ErrLagging) {
		t.Fatalf("caught up before the consumer ran: got %v, want ErrLagging", err)
	}
	lag, err := c.Lag(context.Background())
	if err != nil || lag.Total() != 500 {
		t.Fatalf("lag before the consumer ran: got %d (err %v), want 500", lag.Total(), err)
	}

	e.startConsumer(t, nil, 100)
	waitTotals(t, e.store, expect(events), 30*time.Second)
	before := time.Now()
	c, err = NewLagChecker(LagConfig{Brokers: []string{e.broker.Addr()}, Wait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.CaughtUp(context.Background())
	if err != nil || got.Before(before) {
		t.Fatalf("caught up after the consumer ran: got %v, %v, want a time after %v", got, err, before)
	}
	if lag, err := c.Lag(context.Background()); err != nil || lag.Total() != 0 {
		t.Fatalf("lag after the consumer ran: got %d (err %v), want 0", lag.Total(), err)
	}
}
