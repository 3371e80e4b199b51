package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/kafkaconn"
)

// DefaultTopic is the billing events topic meterd suggests
// (--billing-events-topic; off unless set).
const DefaultTopic = "meter.billing.v1"

// Record headers.
const (
	HeaderContentType    = "content-type"
	HeaderEventType      = "event-type"
	HeaderIdempotencyKey = "idempotency-key"
)

// KafkaConfig configures a KafkaSink.
type KafkaConfig struct {
	Brokers []string
	Topic   string
	// Kafka is how to connect (TLS, SASL); nil is plaintext.
	Kafka *kafkaconn.Conn
	// WriteTimeout bounds one send, the client's retries included
	// (default 10s).
	WriteTimeout time.Duration
}

// KafkaSink writes events to a topic, a record per statement keyed
// "tenant/period" (a tenant's period stays on one partition, in order,
// and a compacted topic keeps its latest revision), acknowledged by every
// in-sync replica.
type KafkaSink struct {
	cfg    KafkaConfig
	writer *kafka.Writer
}

// NewKafkaSink returns a sink writing to cfg.Topic; it connects on first
// use. Close releases its connections.
func NewKafkaSink(cfg KafkaConfig) (*KafkaSink, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" {
		return nil, errors.New("billing events: Kafka brokers and a topic are required")
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	return &KafkaSink{cfg: cfg, writer: &kafka.Writer{
		Addr: kafka.TCP(cfg.Brokers...), Topic: cfg.Topic, Transport: cfg.Kafka.Transport(),
		Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		// Sends are synchronous and small: a batch goes at once.
		BatchTimeout: time.Millisecond, BatchSize: 1000, WriteTimeout: cfg.WriteTimeout, MaxAttempts: 3,
	}}, nil
}

// Name is "kafka:<topic>": the sink's delivery state.
func (k *KafkaSink) Name() string { return "kafka:" + k.cfg.Topic }

// Send writes out's records in one request; they are delivered all or,
// on an error, none is counted (a record the broker did take is sent
// again: at least once).
func (k *KafkaSink) Send(ctx context.Context, out []Outgoing) (int, error) {
	msgs := make([]kafka.Message, len(out))
	for i, o := range out {
		msgs[i] = kafka.Message{Key: []byte(o.Event.Tenant + "/" + o.Event.Period), Value: o.Body, Headers: []kafka.Header{
			{Key: HeaderContentType, Value: []byte("application/json")},
			{Key: HeaderEventType, Value: []byte(o.Event.Type)},
			{Key: HeaderIdempotencyKey, Value: []byte(o.Event.ID)},
		}}
	}
	wctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	if err := k.writer.WriteMessages(wctx, msgs...); err != nil {
		return 0, fmt.Errorf("write %d billing events to %s: %w", len(msgs), k.cfg.Topic, err)
	}
	return len(out), nil
}

// Close flushes and closes the writer.
func (k *KafkaSink) Close() error { return k.writer.Close() }
