package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
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

// Send writes out's records in one request (a record the broker took
// whose acknowledgement was lost is sent again: at least once). A record
// too large for the writer or the broker fails for good
// (PermanentError) and the others go on; a failure of the request, or of
// the brokers before any record was written, is the topic's
// (UnavailableError).
func (k *KafkaSink) Send(ctx context.Context, out []Outgoing) []error {
	errs := make([]error, len(out))
	idx := make([]int, len(out)) // the events still to write
	for i := range idx {
		idx[i] = i
	}
	wctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	for len(idx) > 0 {
		msgs := make([]kafka.Message, len(idx))
		for j, i := range idx {
			o := out[i]
			msgs[j] = kafka.Message{Key: []byte(o.Event.Tenant + "/" + o.Event.Period), Value: o.Body, Headers: []kafka.Header{
				{Key: HeaderContentType, Value: []byte("application/json")},
				{Key: HeaderEventType, Value: []byte(o.Event.Type)},
				{Key: HeaderIdempotencyKey, Value: []byte(o.Event.ID)},
			}}
		}
		err := k.writer.WriteMessages(wctx, msgs...)
		var (
			tooLarge kafka.MessageTooLargeError
			each     kafka.WriteErrors
		)
		switch {
		case err == nil:
			return errs
		case errors.As(err, &tooLarge):
			// Checked before anything is written: that one fails, the
			// others are written again without it.
			j := slices.IndexFunc(msgs, func(m kafka.Message) bool { return bytes.Equal(m.Value, tooLarge.Message.Value) })
			if j < 0 {
				break
			}
			errs[idx[j]] = &PermanentError{fmt.Errorf("write billing event of %s to %s: %w", out[idx[j]].Event.Tenant, k.cfg.Topic, err)}
			idx = slices.Delete(idx, j, j+1)
			continue
		case errors.As(err, &each) && len(each) == len(idx):
			for j, e := range each {
				var code kafka.Error
				switch {
				case e == nil:
				case errors.As(e, &code) && code == kafka.MessageSizeTooLarge:
					errs[idx[j]] = &PermanentError{fmt.Errorf("write billing event to %s: %w", k.cfg.Topic, e)}
				case errors.As(e, &code):
					errs[idx[j]] = fmt.Errorf("write billing event to %s: %w", k.cfg.Topic, e)
				default:
					errs[idx[j]] = &UnavailableError{fmt.Errorf("write billing event to %s: %w", k.cfg.Topic, e)}
				}
			}
			return errs
		}
		for _, i := range idx {
			errs[i] = &UnavailableError{fmt.Errorf("write %d billing events to %s: %w", len(idx), k.cfg.Topic, err)}
		}
		return errs
	}
	return errs
}

// Close flushes and closes the writer.
func (k *KafkaSink) Close() error { return k.writer.Close() }
