package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chcluster"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// TestIngestClusterEventIDCountedOnce is TestDevEventIDCountedOnce on a
// ClickHouse cluster of two shards (the first with two replicas), with two
// real `meterd --role ingest` in cluster mode: the first copies of events
// of September are counted; one replica is killed with SIGKILL; copies of
// the same ids then arrive, equal ones, ones completed two hours later,
// ones completed in October and ones with other tokens, keyed by event id
// as the publish path keys them. Usage of September, of October and of both
// counts each event once, as its first copy, on every shard. (Cost and
// statements over the same store are TestDevEventIDCountedOnce's.)
func TestIngestClusterEventIDCountedOnce(t *testing.T) {
	c := chcluster.Start(t, chcluster.Layout{})
	db := c.NewDB(t)
	const partitions = 6
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Partitions: partitions,
		Topics: []string{ingest.DefaultEventsTopic, ingest.DefaultDLQTopic, ingest.DefaultGPUTopic, ingest.DefaultEngineTopic}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	fleet := newIngestFleet(t, broker.Addr(), c.Addr(1, 0), db, c.Name())
	fleet.start(t)
	fleet.start(t)

	sep := time.Date(2026, 9, 10, 12, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	const n = 600
	event := func(i int) *meterv1.InferenceEvent {
		return &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("e-%d", i), TenantId: fmt.Sprintf("tenant-%d", i%7), Model: "m", Deployment: "d",
			CompletedAt:  timestamppb.New(sep.Add(time.Duration(i) * time.Second)),
			PromptTokens: proto.Int64(int64(100 + i)), OutputTokens: proto.Int64(10),
			TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
		}
	}
	w := &kafka.Writer{Addr: kafka.TCP(broker.Addr()), Topic: ingest.DefaultEventsTopic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000}
	defer w.Close()
	produce := func(events []*meterv1.InferenceEvent) {
		t.Helper()
		msgs := make([]kafka.Message, len(events))
		for i, ev := range events {
			b, err := proto.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			msgs[i] = kafka.Message{Key: []byte(ev.GetEventId()), Value: b,
				Headers: []kafka.Header{{Key: ingest.HeaderContentType, Value: []byte(ingest.ContentTypeProtobuf)}}}
		}
		if err := w.WriteMessages(context.Background(), msgs...); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}

	store, err := chstore.Open(chstore.Config{Addr: []string{c.Addr(1, 0)}, Database: db, Cluster: c.Name()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reads := query.New(store, query.Config{})
	usage := func(from, to time.Time) (requests, prompt, output int64) {
		t.Helper()
		rows, err := reads.Usage(context.Background(), query.UsageQuery{Start: from, End: to})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			return 0, 0, 0
		}
		return rows[0].Requests, rows[0].PromptTokens, rows[0].OutputTokens
	}
	waitRequests := func(from, to time.Time, want int64) {
		t.Helper()
		for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if got, _, _ := usage(from, to); got == want {
				return
			}
			if time.Now().After(deadline) {
				got, _, _ := usage(from, to)
				logs := ""
				for i, r := range fleet.replicas {
					logs += fmt.Sprintf("replica %d:\n%s\n", i, r.log)
				}
				t.Fatalf("usage of [%s, %s): %d requests, want %d\n%s", from, to, got, want, logs)
			}
		}
	}

	var first []*meterv1.InferenceEvent
	var wantPrompt int64
	for i := range n {
		first = append(first, event(i))
		wantPrompt += int64(100 + i)
	}
	produce(first)
	waitRequests(sep.AddDate(0, 0, -9), oct, n)

	// A crash, and the copies, which the other replica takes.
	fleet.replicas[0].cmd.Process.Kill()
	fleet.replicas[0].cmd.Wait()
	var copies []*meterv1.InferenceEvent
	for i := range n {
		cp := event(i)
		switch i % 4 {
		case 1:
			cp.CompletedAt = timestamppb.New(sep.Add(time.Duration(i)*time.Second + 2*time.Hour))
		case 2:
			cp.CompletedAt = timestamppb.New(oct.Add(time.Duration(i) * time.Minute))
		case 3:
			cp.OutputTokens = proto.Int64(999)
		}
		copies = append(copies, cp)
	}
	produce(copies)
	// Markers on every partition after the copies: once they are counted,
	// every copy before them has been through a consumer.
	var markers []*meterv1.InferenceEvent
	for i := range 4 * partitions {
		m := event(100_000 + i)
		m.CompletedAt = timestamppb.New(oct.AddDate(0, 1, 0).Add(time.Duration(i) * time.Second))
		markers = append(markers, m)
	}
	produce(markers)
	november := oct.AddDate(0, 1, 0)
	waitRequests(november, november.AddDate(0, 1, 0), int64(len(markers)))

	for _, c := range []struct {
		name     string
		from, to time.Time
	}{{"september", sep.AddDate(0, 0, -9), oct}, {"september and october", sep.AddDate(0, 0, -9), november}} {
		req, prompt, output := usage(c.from, c.to)
		if req != n || prompt != wantPrompt || output != 10*n {
			t.Errorf("usage of %s: %d requests, %d prompt and %d output tokens; want %d, %d and %d", c.name, req, prompt, output, n, wantPrompt, 10*n)
		}
	}
	if req, _, _ := usage(oct, november); req != 0 {
		t.Errorf("usage of October: %d requests, want none (the copies moved there are not counted)", req)
	}
}
