package ingest

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// validEvent is a successful request that passes every check.
func validEvent() *meterv1.InferenceEvent {
	return &meterv1.InferenceEvent{
		EventId:            "ev-1",
		TenantId:           "acme",
		Model:              "llama-3.1-70b",
		Deployment:         "llama70b-h100",
		CompletedAt:        timestamppb.New(testNow.Add(-time.Minute)),
		ReceivedAt:         timestamppb.New(testNow.Add(-time.Minute - 2*time.Second)),
		PromptTokens:       proto.Int64(1000),
		CachedPromptTokens: proto.Int64(200),
		OutputTokens:       proto.Int64(100),
		TtftMs:             proto.Float64(250),
		E2EMs:              proto.Float64(2000),
		Labels:             map[string]string{"team": "search"},
	}
}

func TestValidate(t *testing.T) {
	limits := DefaultLimits()
	tests := []struct {
		name   string
		mutate func(ev *meterv1.InferenceEvent)
		reason string // "" = valid
		want   string // substring of the message
	}{
		{"valid", func(*meterv1.InferenceEvent) {}, "", ""},
		{"failed request without tokens", func(ev *meterv1.InferenceEvent) {
			ev.Status = meterv1.Status_STATUS_RATE_LIMITED
			ev.PromptTokens, ev.OutputTokens, ev.TtftMs, ev.E2EMs, ev.CachedPromptTokens = nil, nil, nil, nil, nil
		}, "", ""},
		{"explicit ok", func(ev *meterv1.InferenceEvent) { ev.Status = meterv1.Status_STATUS_OK }, "", ""},
		{"missing event_id", func(ev *meterv1.InferenceEvent) { ev.EventId = "" }, ReasonMissingField, "event_id is required"},
		{"missing tenant", func(ev *meterv1.InferenceEvent) { ev.TenantId = "" }, ReasonMissingField, "tenant_id is required"},
		{"reserved tenant", func(ev *meterv1.InferenceEvent) { ev.TenantId = "__idle__" }, ReasonInvalidValue, "reserved"},
		{"missing model", func(ev *meterv1.InferenceEvent) { ev.Model = "" }, ReasonMissingField, "model is required"},
		{"missing completed_at", func(ev *meterv1.InferenceEvent) { ev.CompletedAt = nil }, ReasonMissingField, "completed_at is required"},
		{"ok without prompt tokens", func(ev *meterv1.InferenceEvent) { ev.PromptTokens = nil; ev.CachedPromptTokens = nil }, ReasonMissingField, "prompt_tokens is required"},
		{"ok without output tokens", func(ev *meterv1.InferenceEvent) { ev.OutputTokens = nil }, ReasonMissingField, "output_tokens is required"},
		{"ok without ttft", func(ev *meterv1.InferenceEvent) { ev.TtftMs = nil }, ReasonMissingField, "ttft_ms is required"},
		{"ok without e2e", func(ev *meterv1.InferenceEvent) { ev.E2EMs = nil }, ReasonMissingField, "e2e_ms is required"},
		{"negative prompt", func(ev *meterv1.InferenceEvent) { ev.PromptTokens = proto.Int64(-1) }, ReasonInvalidValue, "prompt_tokens is negative"},
		{"negative output", func(ev *meterv1.InferenceEvent) { ev.OutputTokens = proto.Int64(-5) }, ReasonInvalidValue, "output_tokens is negative"},
		{"absurd tokens", func(ev *meterv1.InferenceEvent) { ev.OutputTokens = proto.Int64(limits.MaxTokens + 1) }, ReasonOutOfRange, "exceeds the limit"},
		{"cached > prompt", func(ev *meterv1.InferenceEvent) { ev.CachedPromptTokens = proto.Int64(1001) }, ReasonInvalidValue, "cached_prompt_tokens (1001) > prompt_tokens (1000)"},
		{"ttft > e2e", func(ev *meterv1.InferenceEvent) { ev.TtftMs = proto.Float64(2500) }, ReasonInvalidValue, "ttft_ms (2500) > e2e_ms (2000)"},
		{"negative ttft", func(ev *meterv1.InferenceEvent) { ev.TtftMs = proto.Float64(-1) }, ReasonInvalidValue, "ttft_ms is negative"},
		{"NaN e2e", func(ev *meterv1.InferenceEvent) { ev.E2EMs = proto.Float64(math.NaN()) }, ReasonInvalidValue, "e2e_ms is not a finite number"},
		{"absurd latency", func(ev *meterv1.InferenceEvent) { ev.E2EMs = proto.Float64(48 * 3600 * 1000) }, ReasonOutOfRange, "e2e_ms"},
		{"far future", func(ev *meterv1.InferenceEvent) { ev.CompletedAt = timestamppb.New(testNow.Add(time.Hour)) }, ReasonOutOfRange, "in the future"},
		{"ancient", func(ev *meterv1.InferenceEvent) { ev.CompletedAt = timestamppb.New(time.Unix(1000, 0)) }, ReasonOutOfRange, "is before"},
		{"received after completed", func(ev *meterv1.InferenceEvent) { ev.ReceivedAt = timestamppb.New(testNow) }, ReasonInvalidValue, "received_at"},
		{"invalid timestamp", func(ev *meterv1.InferenceEvent) { ev.CompletedAt = &timestamppb.Timestamp{Seconds: 1, Nanos: -5} }, ReasonInvalidValue, "not a valid timestamp"},
		{"unknown status", func(ev *meterv1.InferenceEvent) { ev.Status = meterv1.Status(99) }, ReasonInvalidValue, "status 99"},
		{"long tenant", func(ev *meterv1.InferenceEvent) { ev.TenantId = strings.Repeat("x", 300) }, ReasonOutOfRange, "tenant_id is 300 bytes"},
		{"too many labels", func(ev *meterv1.InferenceEvent) {
			for i := range 20 {
				ev.Labels[strings.Repeat("k", i+1)] = "v"
			}
		}, ReasonOutOfRange, "labels"},
		{"empty label key", func(ev *meterv1.InferenceEvent) { ev.Labels[""] = "v" }, ReasonInvalidValue, "empty key"},
		{"absurd tensor parallelism", func(ev *meterv1.InferenceEvent) { ev.TensorParallelism = 100000 }, ReasonOutOfRange, "tensor_parallelism"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := validEvent()
			tt.mutate(ev)
			err := limits.Validate(ev, testNow)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Validate() = %v, want an ErrInvalidEvent", err)
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || verr.Reason != tt.reason {
				t.Fatalf("Validate() reason = %v, want %s", err, tt.reason)
			}
			if !strings.Contains(verr.Message, tt.want) {
				t.Errorf("Validate() message = %q, want it to mention %q", verr.Message, tt.want)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	d := NewDecoder(DefaultLimits())
	pb, err := proto.Marshal(validEvent())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		value       []byte
		contentType string
		reason      string
	}{
		{"protobuf with header", pb, ContentTypeProtobuf, ""},
		{"protobuf sniffed", pb, "", ""},
		{"json with header", []byte(`{"event_id":"e","tenant_id":"t","model":"m","completed_at":"2026-11-22T11:00:00Z","status":"STATUS_TIMEOUT"}`), ContentTypeJSON, ""},
		{"json camelCase sniffed", []byte(` {"eventId":"e","tenantId":"t","model":"m","promptTokens":"5"}`), "", ""},
		{"json with charset", []byte(`{"event_id":"e"}`), "application/json; charset=utf-8", ""},
		{"malformed json", []byte(`{"event_id":`), ContentTypeJSON, ReasonDecode},
		{"unknown json field", []byte(`{"event_id":"e","prompt_token":5}`), "", ReasonDecode},
		{"wrong json type", []byte(`{"prompt_tokens":"many"}`), "", ReasonDecode},
		{"malformed protobuf", []byte{0x0a, 0xff, 0x01}, ContentTypeProtobuf, ReasonDecode},
		{"empty", nil, "", ReasonDecode},
		{"unsupported content type", pb, "text/csv", ReasonDecode},
		{"oversized", make([]byte, DefaultLimits().MaxRecordBytes+1), "", ReasonOversized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ev meterv1.InferenceEvent
			err := d.Decode(&ev, tt.value, tt.contentType)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("Decode() = %v, want nil", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || verr.Reason != tt.reason {
				t.Fatalf("Decode() = %v, want reason %s", err, tt.reason)
			}
		})
	}
}
