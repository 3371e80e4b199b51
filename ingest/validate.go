package ingest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Reason codes of rejected events, used as the low-cardinality "reason" label
// of metrics and in DLQ headers. The full human-readable text is in
// ValidationError.Message.
const (
	ReasonMissingField = "missing_field"
	ReasonInvalidValue = "invalid_value"
	ReasonOutOfRange   = "out_of_range"
	ReasonDecode       = "decode"
	ReasonOversized    = "oversized"
)

// ErrInvalidEvent is wrapped by every ValidationError.
var ErrInvalidEvent = errors.New("invalid event")

// ValidationError says why one event was rejected.
type ValidationError struct {
	// Reason is one of the Reason* codes.
	Reason string
	// Message is a human-readable explanation naming the field and value.
	Message string
}

func (e *ValidationError) Error() string { return e.Message }

// Unwrap makes errors.Is(err, ErrInvalidEvent) true.
func (e *ValidationError) Unwrap() error { return ErrInvalidEvent }

func invalid(reason, format string, args ...any) *ValidationError {
	return &ValidationError{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Limits bounds what an event may hold. The zero value is not useful; start
// from DefaultLimits.
type Limits struct {
	// MaxTokens bounds prompt, cached and output tokens of one request.
	MaxTokens int64
	// MaxLatency bounds every latency field.
	MaxLatency time.Duration
	// MaxFuture is how far completed_at may lie ahead of the server clock.
	MaxFuture time.Duration
	// MinTime is the earliest acceptable completed_at.
	MinTime time.Time
	// MaxStringLen bounds every string field, label keys and values included.
	// Every identifier field and label key must also pass ident.Check, and
	// label values ident.CheckText.
	MaxStringLen int
	// MaxLabels bounds the number of labels.
	MaxLabels int
	// MaxTensorParallelism bounds tensor_parallelism.
	MaxTensorParallelism uint32
	// MaxRecordBytes bounds the encoded size of one event (API and Kafka).
	MaxRecordBytes int
}

// DefaultLimits are generous bounds that only reject absurd values.
func DefaultLimits() Limits {
	return Limits{
		MaxTokens:            10_000_000,
		MaxLatency:           24 * time.Hour,
		MaxFuture:            5 * time.Minute,
		MinTime:              time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
		MaxStringLen:         256,
		MaxLabels:            16,
		MaxTensorParallelism: 4096,
		MaxRecordBytes:       64 << 10,
	}
}

// Validate checks an event against ARCHITECTURE "The event" and the limits.
// now is the server's clock. It returns nil or a *ValidationError describing
// the first problem found.
func (l Limits) Validate(ev *meterv1.InferenceEvent, now time.Time) error {
	if ev == nil {
		return invalid(ReasonMissingField, "event is empty")
	}
	var r sink.EventRow
	r.FromProto(ev)
	return l.ValidateRow(&r, now)
}

// The range of a valid google.protobuf.Timestamp: 0001-01-01T00:00:00Z to
// 9999-12-31T23:59:59Z.
const minTimestampSeconds, maxTimestampSeconds = -62135596800, 253402300799

// checkTimestamp returns the error of t.Proto().CheckValid() without
// building the message for a valid timestamp.
func checkTimestamp(t sink.Timestamp) error {
	if t.Seconds >= minTimestampSeconds && t.Seconds <= maxTimestampSeconds && t.Nanos >= 0 && t.Nanos < 1e9 {
		return nil
	}
	return t.Proto().CheckValid()
}

// ValidateRow is Validate of an event row: the one set of rules, which
// every path (Kafka records of either encoding, the API) goes through.
func (l Limits) ValidateRow(ev *sink.EventRow, now time.Time) error {
	for _, f := range [...]struct{ name, v string }{
		{"event_id", ev.EventID}, {"tenant_id", ev.TenantID}, {"model", ev.Model},
	} {
		if f.v == "" {
			return invalid(ReasonMissingField, "%s is required", f.name)
		}
	}
	if strings.HasPrefix(ev.TenantID, "__") {
		// Reserved for lines that are not tenants, such as the idle-cost line "__idle__".
		return invalid(ReasonInvalidValue, "tenant_id %q: names starting with \"__\" are reserved", ev.TenantID)
	}
	for _, f := range [...]struct{ name, v string }{
		{"event_id", ev.EventID}, {"request_id", ev.RequestID}, {"tenant_id", ev.TenantID},
		{"model", ev.Model}, {"model_version", ev.ModelVersion}, {"deployment", ev.Deployment},
		{"engine", ev.Engine}, {"gpu_type", ev.GPUType}, {"node", ev.Node},
		{"region", ev.Region}, {"slo_class", ev.SLOClass},
	} {
		if len(f.v) > l.MaxStringLen {
			return invalid(ReasonOutOfRange, "%s is %d bytes long, limit is %d", f.name, len(f.v), l.MaxStringLen)
		}
		if err := ident.Check(f.name, f.v); err != nil {
			return invalid(ReasonInvalidValue, "%v", err)
		}
	}
	if !ev.CompletedAt.Set {
		return invalid(ReasonMissingField, "completed_at is required")
	}
	if err := checkTimestamp(ev.CompletedAt); err != nil {
		return invalid(ReasonInvalidValue, "completed_at is not a valid timestamp: %v", err)
	}
	completed := ev.CompletedAt.Time()
	if completed.Before(l.MinTime) {
		return invalid(ReasonOutOfRange, "completed_at %s is before %s", completed.Format(time.RFC3339Nano), l.MinTime.Format(time.RFC3339))
	}
	if completed.After(now.Add(l.MaxFuture)) {
		return invalid(ReasonOutOfRange, "completed_at %s is more than %s in the future", completed.Format(time.RFC3339Nano), l.MaxFuture)
	}
	if ev.ReceivedAt.Set {
		if err := checkTimestamp(ev.ReceivedAt); err != nil {
			return invalid(ReasonInvalidValue, "received_at is not a valid timestamp: %v", err)
		}
		if received := ev.ReceivedAt.Time(); received.After(completed) {
			return invalid(ReasonInvalidValue, "received_at %s is after completed_at %s", received.Format(time.RFC3339Nano), completed.Format(time.RFC3339Nano))
		}
	}
	if _, ok := meterv1.Status_name[ev.Status]; !ok {
		return invalid(ReasonInvalidValue, "status %d is not a known status", ev.Status)
	}
	ok := ev.Status == int32(meterv1.Status_STATUS_OK) || ev.Status == int32(meterv1.Status_STATUS_UNSPECIFIED)
	if ok {
		for _, f := range [...]struct {
			name    string
			present bool
		}{
			{"prompt_tokens", ev.PromptTokens.Set}, {"output_tokens", ev.OutputTokens.Set},
			{"ttft_ms", ev.TTFTMs.Set}, {"e2e_ms", ev.E2EMs.Set},
		} {
			if !f.present {
				return invalid(ReasonMissingField, "%s is required for a successful request", f.name)
			}
		}
	}
	for _, f := range [...]struct {
		name string
		v    sink.OptInt
	}{
		{"prompt_tokens", ev.PromptTokens}, {"cached_prompt_tokens", ev.CachedPromptTokens}, {"output_tokens", ev.OutputTokens},
	} {
		if !f.v.Set {
			continue
		}
		if f.v.V < 0 {
			return invalid(ReasonInvalidValue, "%s is negative (%d)", f.name, f.v.V)
		}
		if f.v.V > l.MaxTokens {
			return invalid(ReasonOutOfRange, "%s (%d) exceeds the limit of %d", f.name, f.v.V, l.MaxTokens)
		}
	}
	if ev.CachedPromptTokens.V > ev.PromptTokens.V {
		return invalid(ReasonInvalidValue, "cached_prompt_tokens (%d) > prompt_tokens (%d)", ev.CachedPromptTokens.V, ev.PromptTokens.V)
	}
	maxMs := float64(l.MaxLatency.Milliseconds())
	for _, f := range [...]struct {
		name string
		v    sink.OptFloat
	}{
		{"ttft_ms", ev.TTFTMs}, {"e2e_ms", ev.E2EMs}, {"queue_ms", ev.QueueMs}, {"prefill_ms", ev.PrefillMs}, {"itl_ms", ev.ITLMs},
	} {
		if !f.v.Set {
			continue
		}
		switch v := f.v.V; {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return invalid(ReasonInvalidValue, "%s is not a finite number", f.name)
		case v < 0:
			return invalid(ReasonInvalidValue, "%s is negative (%g)", f.name, v)
		case v > maxMs:
			return invalid(ReasonOutOfRange, "%s (%g) exceeds the limit of %g ms", f.name, v, maxMs)
		}
	}
	if ev.TTFTMs.Set && ev.E2EMs.Set && ev.TTFTMs.V > ev.E2EMs.V {
		return invalid(ReasonInvalidValue, "ttft_ms (%g) > e2e_ms (%g)", ev.TTFTMs.V, ev.E2EMs.V)
	}
	if ev.TensorParallelism > l.MaxTensorParallelism {
		return invalid(ReasonOutOfRange, "tensor_parallelism (%d) exceeds the limit of %d", ev.TensorParallelism, l.MaxTensorParallelism)
	}
	if len(ev.Labels) > l.MaxLabels {
		return invalid(ReasonOutOfRange, "%d labels, limit is %d", len(ev.Labels), l.MaxLabels)
	}
	for _, lb := range ev.Labels {
		k, v := lb.Key, lb.Value
		if k == "" {
			return invalid(ReasonInvalidValue, "label with an empty key")
		}
		if len(k) > l.MaxStringLen || len(v) > l.MaxStringLen {
			return invalid(ReasonOutOfRange, "label %.32q is longer than %d bytes", k, l.MaxStringLen)
		}
		if err := ident.Check("label key", k); err != nil {
			return invalid(ReasonInvalidValue, "%v", err)
		}
		// Values are free text: spaces anywhere, but nothing invisible.
		if err := ident.CheckText("", v); err != nil {
			return invalid(ReasonInvalidValue, "label %.32q value %v", k, err)
		}
	}
	return nil
}
