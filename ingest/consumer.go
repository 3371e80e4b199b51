package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/chstore"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Default topics and consumer group.
const (
	DefaultEventsTopic = "meter.events.v1"
	DefaultDLQTopic    = "meter.dlq.v1"
	DefaultGroupID     = "tokenmeter-ingest"
)

// DLQ record headers, beside the original record's own headers.
const (
	HeaderDLQReason     = "dlq-reason"
	HeaderDLQReasonCode = "dlq-reason-code"
	HeaderDLQTopic      = "dlq-source-topic"
	HeaderDLQPartition  = "dlq-source-partition"
	HeaderDLQOffset     = "dlq-source-offset"
)

// EventWriter stores a batch of validated events; *chstore.Store implements it.
type EventWriter interface {
	InsertEvents(ctx context.Context, b *chstore.EventBatch) error
}

var _ EventWriter = (*chstore.Store)(nil)

// ConsumerConfig configures the Kafka → ClickHouse consumer.
type ConsumerConfig struct {
	Brokers  []string
	Topic    string // default DefaultEventsTopic
	GroupID  string // default DefaultGroupID
	DLQTopic string // default DefaultDLQTopic
	// BatchSize flushes a batch when it holds this many records. Default 50,000.
	BatchSize int
	// BatchTimeout flushes a non-empty batch this long after its first record. Default 500ms.
	BatchTimeout time.Duration
	// MinBackoff and MaxBackoff bound the retry delay of failed inserts,
	// DLQ writes and commits. Defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// ShutdownTimeout bounds the final flush after the context is cancelled. Default 30s.
	ShutdownTimeout time.Duration
	Limits          Limits
}

// Validate reports every problem of the configuration at once.
func (c ConsumerConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("ingest: no Kafka brokers"))
	}
	if c.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("ingest: batch size %d is negative", c.BatchSize))
	}
	if c.BatchTimeout < 0 {
		errs = append(errs, fmt.Errorf("ingest: batch timeout %s is negative", c.BatchTimeout))
	}
	if c.Topic != "" && c.Topic == c.DLQTopic {
		errs = append(errs, fmt.Errorf("ingest: events topic and DLQ topic are both %q", c.Topic))
	}
	return errors.Join(errs...)
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.Topic == "" {
		c.Topic = DefaultEventsTopic
	}
	if c.GroupID == "" {
		c.GroupID = DefaultGroupID
	}
	if c.DLQTopic == "" {
		c.DLQTopic = DefaultDLQTopic
	}
	if c.BatchSize == 0 {
		c.BatchSize = 50_000
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = 500 * time.Millisecond
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 10 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.Limits == (Limits{}) {
		c.Limits = DefaultLimits()
	}
	return c
}

// Consumer reads event records from Kafka in a consumer group and writes them
// to ClickHouse exactly once in effect: offsets are committed only after the
// batch's insert (and its DLQ records) succeeded, and every aggregate
// deduplicates the redelivered rows.
type Consumer struct {
	cfg     ConsumerConfig
	reader  *kafka.Reader
	dlq     *kafka.Writer
	store   EventWriter
	decoder *Decoder
	metrics *consumerMetrics
	logger  *slog.Logger
	now     func() time.Time

	healthy atomic.Bool

	// Batch in hand.
	batch   chstore.EventBatch
	dead    []kafka.Message
	last    map[int]kafka.Message // last message per partition, value dropped
	records int
	ev      meterv1.InferenceEvent

	// crash, when set by tests, is asked at each step whether to stop right
	// there as if the process had died: no flush, no commit.
	crash func(point string) bool
}

// errCrashed is returned by Run when a test's crash point fired.
var errCrashed = errors.New("simulated crash")

// NewConsumer creates a consumer; Run starts it.
func NewConsumer(cfg ConsumerConfig, store EventWriter, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	metrics, err := newConsumerMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("register ingest metrics: %w", err)
	}
	c := &Consumer{
		cfg:     cfg,
		store:   store,
		decoder: NewDecoder(cfg.Limits),
		metrics: metrics,
		logger:  logger,
		now:     now,
		last:    map[int]kafka.Message{},
	}
	c.reader = kafka.NewReader(kafka.ReaderConfig{
		Brokers:        cfg.Brokers,
		GroupID:        cfg.GroupID,
		Topic:          cfg.Topic,
		MinBytes:       1,
		MaxBytes:       32 << 20,
		MaxWait:        100 * time.Millisecond,
		QueueCapacity:  min(cfg.BatchSize, 20_000),
		CommitInterval: 0, // synchronous commits, only after the insert
		StartOffset:    kafka.FirstOffset,
		ErrorLogger:    kafka.LoggerFunc(func(msg string, args ...any) { logger.Warn("kafka reader", "detail", fmt.Sprintf(msg, args...)) }),
	})
	c.dlq = &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Topic:        cfg.DLQTopic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		BatchBytes:   64 << 20,
		WriteTimeout: 10 * time.Second,
	}
	c.healthy.Store(true)
	return c, nil
}

// Healthy is false while inserts or DLQ writes are failing.
func (c *Consumer) Healthy() bool { return c.healthy.Load() }

// Run consumes until ctx is cancelled, then flushes the batch in hand,
// commits it and closes its Kafka clients. It returns nil after a clean
// shutdown.
func (c *Consumer) Run(ctx context.Context) error {
	err := c.loop(ctx)
	if errors.Is(err, errCrashed) {
		// A simulated crash: drop the connections without flushing or committing.
		c.reader.Close()
		c.dlq.Close()
		return err
	}
	// Shutdown work must outlive the cancelled context.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ShutdownTimeout)
	defer cancel()
	if ferr := c.flush(sctx); ferr != nil && !errors.Is(ferr, errCrashed) {
		err = errors.Join(err, fmt.Errorf("final flush: %w", ferr))
	}
	err = errors.Join(err, c.reader.Close(), c.dlq.Close())
	return err
}

func (c *Consumer) loop(ctx context.Context) error {
	var deadline time.Time
	for {
		fctx, cancel := ctx, context.CancelFunc(func() {})
		if c.records > 0 {
			fctx, cancel = context.WithDeadline(ctx, deadline)
		}
		m, err := c.reader.FetchMessage(fctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, context.DeadlineExceeded):
			if err := c.flush(ctx); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("fetch from %s: %w", c.cfg.Topic, err)
		}
		if c.records == 0 {
			deadline = time.Now().Add(c.cfg.BatchTimeout)
		}
		c.add(m)
		if c.shouldCrash("after-fetch") {
			return errCrashed
		}
		if c.records >= c.cfg.BatchSize || !time.Now().Before(deadline) {
			if err := c.flush(ctx); err != nil {
				return err
			}
		}
	}
}

func (c *Consumer) shouldCrash(point string) bool { return c.crash != nil && c.crash(point) }

// add decodes and validates one record into the batch or the DLQ list.
func (c *Consumer) add(m kafka.Message) {
	c.records++
	c.metrics.consumed.Inc()
	now := c.now()
	err := c.decoder.Decode(&c.ev, m.Value, headerValue(m.Headers, HeaderContentType))
	if err == nil {
		err = c.cfg.Limits.Validate(&c.ev, now)
	}
	if err != nil {
		var verr *ValidationError
		if !errors.As(err, &verr) {
			verr = &ValidationError{Reason: ReasonDecode, Message: err.Error()}
		}
		c.metrics.rejected.WithLabelValues(verr.Reason).Inc()
		c.dead = append(c.dead, c.deadLetter(m, verr))
	} else {
		c.batch.Append(&c.ev, now, chstore.Source{Partition: int32(m.Partition), Offset: m.Offset})
	}
	m.Value, m.Key, m.Headers = nil, nil, nil
	c.last[m.Partition] = m
}

func (c *Consumer) deadLetter(m kafka.Message, verr *ValidationError) kafka.Message {
	headers := make([]kafka.Header, 0, len(m.Headers)+5)
	headers = append(headers, m.Headers...)
	headers = append(headers,
		kafka.Header{Key: HeaderDLQReason, Value: []byte(verr.Message)},
		kafka.Header{Key: HeaderDLQReasonCode, Value: []byte(verr.Reason)},
		kafka.Header{Key: HeaderDLQTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(m.Partition))},
		kafka.Header{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
	)
	return kafka.Message{Key: m.Key, Value: m.Value, Headers: headers}
}

// flush writes the DLQ records, inserts the batch and commits its offsets,
// retrying each step until it succeeds or ctx ends. Nothing is committed
// unless both writes succeeded.
func (c *Consumer) flush(ctx context.Context) error {
	if c.records == 0 {
		return nil
	}
	if len(c.dead) > 0 {
		if err := c.retry(ctx, "write dead letters", func() error { return c.dlq.WriteMessages(ctx, c.dead...) }); err != nil {
			return err
		}
		c.metrics.dlq.Add(float64(len(c.dead)))
	}
	if c.shouldCrash("after-dlq") {
		return errCrashed
	}
	if c.batch.Len() > 0 {
		err := c.retry(ctx, "insert events", func() error {
			start := time.Now()
			if err := c.store.InsertEvents(ctx, &c.batch); err != nil {
				c.metrics.insertErrors.Inc()
				return err
			}
			c.metrics.insertDuration.Observe(time.Since(start).Seconds())
			return nil
		})
		if err != nil {
			return err
		}
		c.metrics.inserted.Add(float64(c.batch.Len()))
	}
	if c.shouldCrash("after-insert") {
		return errCrashed
	}
	msgs := make([]kafka.Message, 0, len(c.last))
	for _, m := range c.last {
		msgs = append(msgs, m)
	}
	if err := c.reader.CommitMessages(ctx, msgs...); err != nil {
		// The rows are in ClickHouse; a lost commit means redelivery, which the
		// deduplicating queries absorb. Log and go on rather than block.
		c.metrics.commitErrors.Inc()
		c.logger.Warn("commit offsets", "error", err, "records", c.records)
	}
	if c.shouldCrash("after-commit") {
		return errCrashed
	}
	c.metrics.batchSize.Observe(float64(c.records))
	c.metrics.lag.Set(float64(c.reader.Stats().Lag))
	c.batch.Reset()
	c.dead = c.dead[:0]
	clear(c.last)
	c.records = 0
	return nil
}

// retry runs op until it succeeds or ctx ends, with exponential backoff.
// While it fails the consumer reports itself unhealthy.
func (c *Consumer) retry(ctx context.Context, what string, op func() error) error {
	backoff := c.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil {
			if attempt > 1 {
				c.logger.Info(what+" recovered", "attempts", attempt)
			}
			c.healthy.Store(true)
			return nil
		}
		c.healthy.Store(false)
		c.logger.Warn(what+" failed, will retry", "error", err, "attempt", attempt, "backoff", backoff, "records", c.records)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: gave up after %d attempts: %w", what, attempt, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, c.cfg.MaxBackoff)
	}
}
