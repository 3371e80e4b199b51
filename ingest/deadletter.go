package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/ingest/sink"
)

// Dead-letter headers that identify the whole original value and say what
// the dead letter left out, beside HeaderDLQReason and the other source headers.
const (
	// HeaderDLQOriginalSize is the size of the original value in bytes (decimal).
	HeaderDLQOriginalSize = "dlq-original-size"
	// HeaderDLQOriginalSHA256 is the hex SHA-256 of the whole original value.
	HeaderDLQOriginalSHA256 = "dlq-original-sha256"
	// HeaderDLQTruncated lists, comma-separated, what the dead letter cut:
	// "key", "value" (the value is a prefix of the original), "headers"
	// (some original headers are missing). Absent when nothing was cut.
	HeaderDLQTruncated = "dlq-truncated"
)

// Outcomes of a dead letter, the label outcome of meter_ingest_dead_letters_total.
const (
	// OutcomeDLQ: the record (value and headers bounded) is in the DLQ topic.
	OutcomeDLQ = "dlq"
	// OutcomeDLQMinimal: the DLQ topic refused that copy for good; a record
	// without key, value or original headers, with the reason, the source
	// position and the value's size and SHA-256, is there instead.
	OutcomeDLQMinimal = "dlq_minimal"
	// OutcomeTable: the DLQ topic refused the minimal record too, or stayed
	// unreachable for DLQRetryFor; the rejection is a row of the ClickHouse
	// table dead_letters.
	OutcomeTable = "table"
)

const (
	// maxDLQKeyBytes bounds the key a dead letter keeps.
	maxDLQKeyBytes = 1 << 10
	// maxDLQReasonBytes bounds the reason text of a dead letter.
	maxDLQReasonBytes = 1 << 10
	// headerOverhead is what a record header costs beside its key and value.
	headerOverhead = 8
	// dlqBatchBytes bounds one produce request of the DLQ writer below the
	// broker's default message.max.bytes (1 MiB + 12), so that dead letters
	// that fit one by one are never refused for being sent together.
	dlqBatchBytes = 1_000_000
	// maxPendingDeadBytes hands a batch to the writer early once its dead
	// letters hold this much, bounding the memory a flood of oversized
	// records can take.
	maxPendingDeadBytes = 16 << 20
)

// deadLetter is a rejected record: the bounded copy sent to the DLQ topic,
// and what identifies it if the topic refuses that copy.
type deadLetter struct {
	msg        kafka.Message // the bounded copy
	topic      string
	partition  int
	offset     int64
	reasonCode string
	reason     string
	size       int    // of the original value
	sha256     string // hex, of the original value
	truncated  bool   // msg.Value is a prefix of the original value
	minimalCut string // HeaderDLQTruncated of the minimal record
}

// bytes is about what the dead letter holds in memory.
func (d *deadLetter) bytes() int {
	n := len(d.msg.Key) + len(d.msg.Value)
	for _, h := range d.msg.Headers {
		n += len(h.Key) + len(h.Value) + headerOverhead
	}
	return n
}

// deadLetter builds the dead letter of a rejected record. The value is cut to
// DLQMaxValueBytes, the key to maxDLQKeyBytes, and original headers that do
// not fit in DLQMaxHeaderBytes are left out; cut parts are copied, so that
// the dead letter holds no reference to a large original.
func (c *Consumer) deadLetter(m kafka.Message, verr *ValidationError) deadLetter {
	sum := sha256.Sum256(m.Value)
	d := deadLetter{
		topic: m.Topic, partition: m.Partition, offset: m.Offset,
		reasonCode: verr.Reason, reason: truncate(verr.Message, maxDLQReasonBytes),
		size: len(m.Value), sha256: hex.EncodeToString(sum[:]),
	}
	var cut, minimalCut []string
	key := m.Key
	if len(key) > maxDLQKeyBytes {
		key = bytes.Clone(key[:maxDLQKeyBytes])
		cut = append(cut, "key")
	}
	value := m.Value
	if len(value) > c.cfg.DLQMaxValueBytes {
		value = bytes.Clone(value[:c.cfg.DLQMaxValueBytes])
		cut = append(cut, "value")
		d.truncated = true
	}
	headers := make([]kafka.Header, 0, len(m.Headers)+10)
	budget, dropped := c.cfg.DLQMaxHeaderBytes, false
	for _, h := range m.Headers {
		n := len(h.Key) + len(h.Value) + headerOverhead
		if n > budget {
			dropped = true
			continue
		}
		budget -= n
		headers = append(headers, h)
	}
	if dropped {
		cut = append(cut, "headers")
	}
	headers = append(headers, d.headers()...)
	if len(cut) > 0 {
		headers = append(headers, kafka.Header{Key: HeaderDLQTruncated, Value: []byte(strings.Join(cut, ","))})
	}
	d.msg = kafka.Message{Key: key, Value: value, Headers: headers}

	if len(m.Key) > 0 {
		minimalCut = append(minimalCut, "key")
	}
	if len(m.Value) > 0 {
		minimalCut = append(minimalCut, "value")
	}
	if len(m.Headers) > 0 {
		minimalCut = append(minimalCut, "headers")
	}
	d.minimalCut = strings.Join(minimalCut, ",")
	return d
}

// headers are the dead-letter headers every copy carries.
func (d *deadLetter) headers() []kafka.Header {
	return []kafka.Header{
		{Key: HeaderDLQReason, Value: []byte(d.reason)},
		{Key: HeaderDLQReasonCode, Value: []byte(d.reasonCode)},
		{Key: HeaderDLQTopic, Value: []byte(d.topic)},
		{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(d.partition))},
		{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(d.offset, 10))},
		{Key: HeaderDLQOriginalSize, Value: []byte(strconv.Itoa(d.size))},
		{Key: HeaderDLQOriginalSHA256, Value: []byte(d.sha256)},
	}
}

// minimal is the dead letter without key, value or original headers.
func (d *deadLetter) minimal() kafka.Message {
	headers := d.headers()
	if d.minimalCut != "" {
		headers = append(headers, kafka.Header{Key: HeaderDLQTruncated, Value: []byte(d.minimalCut)})
	}
	return kafka.Message{Headers: headers}
}

// row is the dead letter as a row of the dead_letters table.
func (d *deadLetter) row(dlqErr error, now time.Time) sink.DeadLetter {
	return sink.DeadLetter{
		SourceTopic: d.topic, SourcePartition: int32(d.partition), SourceOffset: d.offset,
		ReasonCode: d.reasonCode, Reason: d.reason,
		OriginalSize: uint64(d.size), OriginalSHA256: d.sha256,
		Key: d.msg.Key, Payload: d.msg.Value, Truncated: d.truncated,
		DLQError: truncate(fmt.Sprint(dlqErr), maxDLQReasonBytes), RecordedAt: now,
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// writeDeadLetters makes every dead letter of a batch durable before the
// batch is committed: in the DLQ topic as built; where the topic refuses
// that copy for good, as a minimal record; where it refuses that too, or
// stays unreachable for DLQRetryFor, as a row of the dead_letters table.
// Only transient errors are retried, so no record can stop a partition. It
// fails only when ctx ends.
func (c *Consumer) writeDeadLetters(ctx context.Context, dead []deadLetter, records int) error {
	deadline := time.Now().Add(c.cfg.DLQRetryFor)
	msgs := make([]kafka.Message, len(dead))
	for i := range dead {
		msgs[i] = dead[i].msg
	}
	errs, err := c.produce(ctx, msgs, deadline)
	if err != nil {
		return err
	}
	var refused, toTable []int
	for i, e := range errs {
		switch {
		case e == nil:
			c.metrics.deadLetters.WithLabelValues(OutcomeDLQ).Inc()
		case permanent(e):
			refused = append(refused, i)
		default:
			toTable = append(toTable, i)
		}
	}
	if len(refused) > 0 {
		msgs = msgs[:0]
		for _, i := range refused {
			msgs = append(msgs, dead[i].minimal())
		}
		minErrs, err := c.produce(ctx, msgs, deadline)
		if err != nil {
			return err
		}
		for j, e := range minErrs {
			i := refused[j]
			if e != nil {
				errs[i] = fmt.Errorf("dead letter: %w; minimal record: %w", errs[i], e)
				toTable = append(toTable, i)
				continue
			}
			c.metrics.deadLetters.WithLabelValues(OutcomeDLQMinimal).Inc()
			c.logDeadLetter(&dead[i], OutcomeDLQMinimal, errs[i])
		}
	}
	if n := len(errs) - len(toTable); n > 0 {
		c.metrics.dlq.Add(float64(n))
	}
	if len(toTable) > 0 {
		now := c.now()
		rows := make([]sink.DeadLetter, len(toTable))
		for j, i := range toTable {
			rows[j] = dead[i].row(errs[i], now)
		}
		err := c.retry(ctx, "record dead letters in ClickHouse", records, func() error {
			return c.deadStore.InsertDeadLetters(ctx, rows)
		})
		if err != nil {
			return err
		}
		for _, i := range toTable {
			c.metrics.deadLetters.WithLabelValues(OutcomeTable).Inc()
			c.logDeadLetter(&dead[i], OutcomeTable, errs[i])
		}
	}
	c.healthy.Store(true)
	return nil
}

func (c *Consumer) logDeadLetter(d *deadLetter, outcome string, err error) {
	where := "recorded without payload in " + c.cfg.DLQTopic
	if outcome == OutcomeTable {
		where = "recorded in ClickHouse table dead_letters"
	}
	c.logger.Warn("DLQ topic refused dead letter; "+where, "outcome", outcome,
		"partition", d.partition, "offset", d.offset, "reason_code", d.reasonCode,
		"original_size", d.size, "original_sha256", d.sha256, "error", err)
}

// produce writes msgs to the DLQ topic, retrying with backoff those that
// fail transiently until they are written or deadline passes. It returns the
// error of each message it could not write (nil for those written), or an
// error when ctx ends.
func (c *Consumer) produce(ctx context.Context, msgs []kafka.Message, deadline time.Time) ([]error, error) {
	errs := make([]error, len(msgs))
	todo := make([]int, len(msgs))
	for i := range todo {
		todo[i] = i
	}
	batch := make([]kafka.Message, 0, len(msgs))
	backoff := c.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		batch = batch[:0]
		for _, i := range todo {
			batch = append(batch, msgs[i])
		}
		err := c.dlq.WriteMessages(ctx, batch...)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("write dead letters: gave up after %d attempts: %w", attempt, errors.Join(err, ctx.Err()))
		}
		var retry []int
		var last error
		for j, e := range perMessage(err, len(batch)) {
			i := todo[j]
			if e != nil && permanent(e) && len(batch) > 1 {
				// The broker judges a partition's records as one batch:
				// a record refused with others may fit alone.
				e = c.dlq.WriteMessages(ctx, msgs[i])
			}
			errs[i] = e
			if e != nil && !permanent(e) {
				retry = append(retry, i)
				last = e
			}
		}
		if len(retry) == 0 {
			if attempt > 1 {
				c.logger.Info("write dead letters recovered", "attempts", attempt)
			}
			return errs, nil
		}
		if !time.Now().Before(deadline) {
			c.logger.Warn("write dead letters: retry budget spent", "error", last, "attempts", attempt, "records", len(retry), "budget", c.cfg.DLQRetryFor)
			return errs, nil
		}
		c.healthy.Store(false)
		c.logger.Warn("write dead letters failed, will retry", "error", last, "attempt", attempt, "backoff", backoff, "records", len(retry))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("write dead letters: gave up after %d attempts: %w", attempt, last)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, c.cfg.MaxBackoff)
		todo = retry
	}
}

// perMessage spreads the error of a write of n messages over them: kafka-go
// reports a failed produce as kafka.WriteErrors, one entry per message;
// any other error concerns them all.
func perMessage(err error, n int) []error {
	out := make([]error, n)
	if err == nil {
		return out
	}
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == n {
		copy(out, werrs)
		return out
	}
	for i := range out {
		out[i] = err
	}
	return out
}

// permanent reports whether sending the same record again cannot succeed:
// a Kafka error code the protocol does not mark retriable
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_RECORD,
// TOPIC_AUTHORIZATION_FAILED...) or a record over the writer's own size
// limit. Anything else (network errors, timeouts, retriable codes such as
// LEADER_NOT_AVAILABLE) is transient.
func permanent(err error) bool {
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return true
	}
	var code kafka.Error
	return errors.As(err, &code) && !code.Temporary()
}
