package ingest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func testSample(i int) *meterv1.GpuSample {
	gpu := i % 4
	return &meterv1.GpuSample{
		SampleId:    fmt.Sprintf("node-a/GPU-%d/%d", gpu, i/4),
		Node:        "node-a",
		GpuUuid:     fmt.Sprintf("GPU-%d", gpu),
		GpuIndex:    uint32(gpu),
		GpuType:     "H100-SXM-80GB",
		Deployment:  []string{"llama", "mistral"}[gpu%2],
		SampledAt:   timestamppb.New(base.Add(time.Duration(i/4+1) * 10 * time.Second)),
		IntervalS:   10,
		Utilization: float64(i%10) / 10,
		Source:      "replay",
	}
}

func TestGPUConsumerExactAndDLQ(t *testing.T) {
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{DefaultGPUTopic, DefaultDLQTopic}, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)

	var samples []*meterv1.GpuSample
	var msgs []kafka.Message
	for i := range 400 {
		s := testSample(i)
		samples = append(samples, s)
		b, _ := proto.Marshal(s)
		msgs = append(msgs, kafka.Message{Key: []byte(s.GetGpuUuid()), Value: b})
	}
	// Re-sent samples (the agent retries after a lost ack), as JSON.
	for i := 0; i < 400; i += 9 {
		b, _ := protojson.Marshal(samples[i])
		msgs = append(msgs, kafka.Message{Key: []byte(samples[i].GetGpuUuid()), Value: b})
	}
	bad := map[string]string{
		`{"sample_id":"x","gpu_uuid":"GPU-9","sampled_at":"2026-11-22T10:00:10Z","interval_s":10,"utilization":1.5}`: ReasonOutOfRange,
		`{"sample_id":"y","gpu_uuid":"GPU-9","interval_s":10}`:                                                       ReasonMissingField,
		`{"sample_id":"z","gpu_uuid":"GPU-9","sampled_at":"2026-11-22T10:00:10Z","interval_s":0}`:                    ReasonOutOfRange,
		`{"sample_id":`: ReasonDecode,
	}
	for v := range bad {
		msgs = append(msgs, kafka.Message{Key: []byte("bad"), Value: []byte(v)})
	}
	w := &kafka.Writer{Addr: kafka.TCP(broker.Addr()), Topic: DefaultGPUTopic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()

	c, err := NewGPUConsumer(ConsumerConfig{Brokers: []string{broker.Addr()}, BatchSize: 100, BatchTimeout: 100 * time.Millisecond},
		e.store, prometheus.NewRegistry(), e.logger, func() time.Time { return base.Add(2 * time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	// 100 intervals of 10 s for 4 GPUs, each sample once despite the re-sends.
	deadline := time.Now().Add(30 * time.Second)
	var got int
	for time.Now().Before(deadline) {
		rows, err := e.store.GPUSamplesOfHour(context.Background(), base)
		if err != nil {
			t.Fatal(err)
		}
		if got = len(rows); got == len(samples) {
			var seconds, busy float64
			for _, r := range rows {
				seconds += r.IntervalS
				busy += r.IntervalS * r.Utilization
			}
			if seconds != 4000 || busy < 1799.999 || busy > 1800.001 {
				t.Errorf("GPU-seconds %v busy %v, want 4000 and 1800", seconds, busy)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got != len(samples) {
		t.Fatalf("got %d distinct samples, want %d", got, len(samples))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
	dead := readAll(t, broker.Addr(), DefaultDLQTopic, len(bad))
	for _, m := range dead {
		want, ok := bad[string(m.Value)]
		if !ok {
			t.Errorf("unexpected DLQ record %q", m.Value)
			continue
		}
		if code := headerValue(m.Headers, HeaderDLQReasonCode); code != want {
			t.Errorf("DLQ %q: reason %q, want %q", m.Value, code, want)
		}
		if src := headerValue(m.Headers, HeaderDLQTopic); src != DefaultGPUTopic {
			t.Errorf("DLQ source topic %q, want %q", src, DefaultGPUTopic)
		}
	}
}
