package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"tokenmeter/internal/adapter/kafkaconn"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// ErrUnavailable means Kafka did not acknowledge the batch; nothing of it may
// be counted as accepted. Retrying is safe: events are deduplicated by id.
var ErrUnavailable = errors.New("event log unavailable")

// PublisherConfig configures the publish path.
type PublisherConfig struct {
	Brokers []string
	Topic   string // default DefaultEventsTopic
	// Kafka is how to connect (TLS, SASL); nil is plaintext.
	Kafka *kafkaconn.Conn
	// WriteTimeout bounds one publish, retries included. Default 10s.
	WriteTimeout time.Duration
	Limits       Limits
}

// Rejected is one event of a batch that failed validation.
type Rejected struct {
	Index   int
	EventID string
	Err     *ValidationError
}

// Publisher validates events and writes the valid ones to the events topic
// with acks=all.
type Publisher struct {
	cfg      PublisherConfig
	writer   *kafka.Writer
	logger   *slog.Logger
	now      func() time.Time
	accepted prometheus.Counter
	rejected *prometheus.CounterVec
	failures prometheus.Counter
}

// NewPublisher creates a Publisher. Close releases its connections.
func NewPublisher(cfg PublisherConfig, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("publisher: no Kafka brokers")
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultEventsTopic
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits()
	}
	p := &Publisher{
		cfg: cfg,
		writer: &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Topic:        cfg.Topic,
			Transport:    cfg.Kafka.Transport(),
			Balancer:     &kafka.Hash{},
			RequiredAcks: kafka.RequireAll,
			// kafka-go allocates room for BatchSize messages in every
			// batch, however few it gets (100,000 was 16 MB per publish
			// call, half the CPU of an OTLP export of 512 spans); the API
			// takes at most --max-batch-events (10,000) per call.
			BatchSize:    10_000,
			BatchBytes:   64 << 20,
			BatchTimeout: 2 * time.Millisecond,
			WriteTimeout: cfg.WriteTimeout,
			MaxAttempts:  3,
			Compression:  kafka.Lz4,
		},
		logger: logger,
		now:    now,
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_publish_events_accepted_total", Help: "Events acknowledged by Kafka through the API.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_publish_events_rejected_total", Help: "Events rejected by the API, by reason code.",
		}, []string{"reason"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_publish_failures_total", Help: "Publish calls that failed because Kafka did not acknowledge them.",
		}),
	}
	for _, c := range []prometheus.Collector{p.accepted, p.rejected, p.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register publish metrics: %w", err)
		}
	}
	return p, nil
}

// Close flushes and closes the Kafka writer.
func (p *Publisher) Close() error { return p.writer.Close() }

// Publish validates events and writes the valid ones to Kafka, returning after
// Kafka acknowledged all of them. On a Kafka failure it returns an error
// wrapping ErrUnavailable and accepted is 0; the rejected list is still valid.
func (p *Publisher) Publish(ctx context.Context, events []*meterv1.InferenceEvent) (accepted int, rejected []Rejected, err error) {
	now := p.now()
	msgs := make([]kafka.Message, 0, len(events))
	for i, ev := range events {
		verr := p.check(ev, now)
		if verr != nil {
			p.rejected.WithLabelValues(verr.Reason).Inc()
			rejected = append(rejected, Rejected{Index: i, EventID: ev.GetEventId(), Err: verr})
			continue
		}
		value, err := proto.Marshal(ev)
		if err != nil {
			return 0, rejected, fmt.Errorf("encode event %d: %w", i, err)
		}
		msgs = append(msgs, kafka.Message{
			Key:     []byte(ev.GetEventId()),
			Value:   value,
			Headers: []kafka.Header{{Key: HeaderContentType, Value: []byte(ContentTypeProtobuf)}},
		})
	}
	if len(msgs) == 0 {
		return 0, rejected, nil
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	if err := p.writer.WriteMessages(wctx, msgs...); err != nil {
		p.failures.Inc()
		return 0, rejected, fmt.Errorf("%w: write %d events to %s: %v", ErrUnavailable, len(msgs), p.cfg.Topic, err)
	}
	p.accepted.Add(float64(len(msgs)))
	return len(msgs), rejected, nil
}

func (p *Publisher) check(ev *meterv1.InferenceEvent, now time.Time) *ValidationError {
	if size := proto.Size(ev); size > p.cfg.Limits.MaxRecordBytes {
		return invalid(ReasonOversized, "event is %d bytes encoded, limit is %d", size, p.cfg.Limits.MaxRecordBytes)
	}
	if err := p.cfg.Limits.Validate(ev, now); err != nil {
		var verr *ValidationError
		if errors.As(err, &verr) {
			return verr
		}
		return invalid(ReasonInvalidValue, "%v", err)
	}
	return nil
}
