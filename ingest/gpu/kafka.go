package gpu

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/kafkaconn"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// KafkaConfig configures a KafkaPublisher.
type KafkaConfig struct {
	Brokers []string
	// Kafka is how to connect (TLS, SASL); nil is plaintext.
	Kafka *kafkaconn.Conn
	// Topic defaults to ingest.DefaultGPUTopic (meter.gpu.v1); it must exist.
	Topic string
	// WriteTimeout bounds one Publish, retries included. Default 10s.
	WriteTimeout time.Duration
}

// KafkaPublisher writes samples to the GPU topic, protobuf-encoded, keyed
// by GPU UUID (so that the samples of a card stay in order on one
// partition), with acks=all.
type KafkaPublisher struct {
	cfg    KafkaConfig
	writer *kafka.Writer
}

var _ Publisher = (*KafkaPublisher)(nil)

// NewKafkaPublisher creates a KafkaPublisher; it connects on first use.
// Close flushes and releases its connections.
func NewKafkaPublisher(cfg KafkaConfig) (*KafkaPublisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("gpu publisher: no Kafka brokers")
	}
	if cfg.Topic == "" {
		cfg.Topic = ingest.DefaultGPUTopic
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	return &KafkaPublisher{cfg: cfg, writer: &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Topic:        cfg.Topic,
		Transport:    cfg.Kafka.Transport(),
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    5_000,
		BatchBytes:   16 << 20,
		BatchTimeout: 5 * time.Millisecond,
		WriteTimeout: cfg.WriteTimeout,
		MaxAttempts:  3,
		Compression:  kafka.Lz4,
	}}, nil
}

// Publish implements Publisher. A sample that cannot be encoded is dropped
// (retrying cannot help) and named in the error.
func (p *KafkaPublisher) Publish(ctx context.Context, samples []*meterv1.GpuSample) ([]*meterv1.GpuSample, error) {
	msgs := make([]kafka.Message, 0, len(samples))
	sent := make([]*meterv1.GpuSample, 0, len(samples))
	var errs []error
	for _, s := range samples {
		value, err := proto.Marshal(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("encode GPU sample %s, dropped: %w", s.GetSampleId(), err))
			continue
		}
		msgs = append(msgs, kafka.Message{
			Key:     []byte(s.GetGpuUuid()),
			Value:   value,
			Headers: []kafka.Header{{Key: ingest.HeaderContentType, Value: []byte(ingest.ContentTypeProtobuf)}},
		})
		sent = append(sent, s)
	}
	if len(msgs) == 0 {
		return nil, errors.Join(errs...)
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	err := p.writer.WriteMessages(wctx, msgs...)
	if err == nil {
		return nil, errors.Join(errs...)
	}
	unacked := sent
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == len(sent) {
		unacked = nil
		for i, e := range werrs {
			if e != nil {
				unacked = append(unacked, sent[i])
			}
		}
	}
	errs = append(errs, fmt.Errorf("write %d GPU samples to %s, %d not acknowledged: %w", len(sent), p.cfg.Topic, len(unacked), err))
	return unacked, errors.Join(errs...)
}

// Close flushes and closes the Kafka writer.
func (p *KafkaPublisher) Close() error { return p.writer.Close() }
