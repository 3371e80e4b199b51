package ingest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestValidateIdentifiers: every identifier of an event follows the one
// identifier rule (internal/ident); label values the looser text rule.
func TestValidateIdentifiers(t *testing.T) {
	limits := DefaultLimits()
	tests := []struct {
		name   string
		mutate func(ev *meterv1.InferenceEvent)
		want   string // "" = valid, else the whole message
	}{
		{"inner space", func(ev *meterv1.InferenceEvent) { ev.TenantId = "acme corp" }, ""},
		{"unicode letters", func(ev *meterv1.InferenceEvent) { ev.Model = "modèle-日本" }, ""},
		{"label value with spaces", func(ev *meterv1.InferenceEvent) { ev.Labels["ua"] = " Mozilla/5.0 (X11) " }, ""},
		{"NUL in tenant", func(ev *meterv1.InferenceEvent) { ev.TenantId = "nulA\x00b" }, `tenant_id "nulA\x00b": byte 4 is a control character U+0000`},
		{"NUL in model", func(ev *meterv1.InferenceEvent) { ev.Model = "b\x00c" }, `model "b\x00c": byte 1 is a control character U+0000`},
		{"zero-width idle", func(ev *meterv1.InferenceEvent) { ev.TenantId = "\u200b__idle__" }, `tenant_id "\u200b__idle__": byte 0 is an invisible format character U+200B`},
		{"leading space", func(ev *meterv1.InferenceEvent) { ev.TenantId = " acme" }, `tenant_id " acme": byte 0 is a leading space U+0020`},
		{"trailing space", func(ev *meterv1.InferenceEvent) { ev.Deployment = "dep " }, `deployment "dep ": byte 3 is a trailing space U+0020`},
		{"BOM event_id", func(ev *meterv1.InferenceEvent) { ev.EventId = "\ufeffev-1" }, `event_id "\ufeffev-1": byte 0 is an invisible format character U+FEFF`},
		{"tab request_id", func(ev *meterv1.InferenceEvent) { ev.RequestId = "r\t1" }, `request_id "r\t1": byte 1 is a control character U+0009`},
		{"bidi model_version", func(ev *meterv1.InferenceEvent) { ev.ModelVersion = "v\u202e1" }, `model_version "v\u202e1": byte 1 is an invisible format character U+202E`},
		{"newline engine", func(ev *meterv1.InferenceEvent) { ev.Engine = "vllm\n" }, `engine "vllm\n": byte 4 is a control character U+000A`},
		{"nbsp gpu_type", func(ev *meterv1.InferenceEvent) { ev.GpuType = "H100\u00a0SXM" }, `gpu_type "H100\u00a0SXM": byte 4 is a space other than U+0020 U+00A0`},
		{"word joiner node", func(ev *meterv1.InferenceEvent) { ev.Node = "n\u20601" }, `node "n\u20601": byte 1 is an invisible format character U+2060`},
		{"hangul filler region", func(ev *meterv1.InferenceEvent) { ev.Region = "\u3164" }, `region "\u3164": byte 0 is an invisible character U+3164`},
		{"control slo_class", func(ev *meterv1.InferenceEvent) { ev.SloClass = "batch\x7f" }, `slo_class "batch\x7f": byte 5 is a control character U+007F`},
		{"label key", func(ev *meterv1.InferenceEvent) { ev.Labels = map[string]string{"te\x00am": "x"} }, `label key "te\x00am": byte 2 is a control character U+0000`},
		{"label key space", func(ev *meterv1.InferenceEvent) { ev.Labels = map[string]string{"team ": "x"} }, `label key "team ": byte 4 is a trailing space U+0020`},
		{"label value NUL", func(ev *meterv1.InferenceEvent) { ev.Labels = map[string]string{"team": "a\x00b"} }, `label "team" value "a\x00b": byte 1 is a control character U+0000`},
		{"label value zero-width", func(ev *meterv1.InferenceEvent) { ev.Labels = map[string]string{"team": "\u200b"} }, `label "team" value "\u200b": byte 0 is an invisible format character U+200B`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := validEvent()
			tt.mutate(ev)
			err := limits.Validate(ev, testNow)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			if verr.Reason != ReasonInvalidValue || verr.Message != tt.want {
				t.Errorf("got %s: %s\nwant %s: %s", verr.Reason, verr.Message, ReasonInvalidValue, tt.want)
			}
		})
	}
}

func TestValidateGPUSampleIdentifiers(t *testing.T) {
	limits := DefaultLimits()
	now := base.Add(time.Hour)
	tests := []struct {
		name   string
		mutate func(s *meterv1.GpuSample)
		want   string
	}{
		{"valid", func(*meterv1.GpuSample) {}, ""},
		{"NUL sample_id", func(s *meterv1.GpuSample) { s.SampleId = "a\x00" }, `sample_id "a\x00": byte 1 is a control character U+0000`},
		{"NUL node", func(s *meterv1.GpuSample) { s.Node = "node\x00a" }, `node "node\x00a": byte 4 is a control character U+0000`},
		{"space gpu_uuid", func(s *meterv1.GpuSample) { s.GpuUuid = " GPU-1" }, `gpu_uuid " GPU-1": byte 0 is a leading space U+0020`},
		{"zero-width gpu_type", func(s *meterv1.GpuSample) { s.GpuType = "H100\u200b" }, `gpu_type "H100\u200b": byte 4 is an invisible format character U+200B`},
		{"mig_profile", func(s *meterv1.GpuSample) { s.MigProfile = "1g\t10gb" }, `mig_profile "1g\t10gb": byte 2 is a control character U+0009`},
		{"deployment", func(s *meterv1.GpuSample) { s.Deployment = "llama\x00" }, `deployment "llama\x00": byte 5 is a control character U+0000`},
		{"pod", func(s *meterv1.GpuSample) { s.Pod = "pod\ufeff" }, `pod "pod\ufeff": byte 3 is an invisible format character U+FEFF`},
		{"namespace", func(s *meterv1.GpuSample) { s.Namespace = "ns " }, `namespace "ns ": byte 2 is a trailing space U+0020`},
		{"region", func(s *meterv1.GpuSample) { s.Region = "eu\u2028" }, `region "eu\u2028": byte 2 is a line or paragraph separator U+2028`},
		{"pool", func(s *meterv1.GpuSample) { s.Pool = "spot\u202e" }, `pool "spot\u202e": byte 4 is an invisible format character U+202E`},
		{"source", func(s *meterv1.GpuSample) { s.Source = "dcgm\n" }, `source "dcgm\n": byte 4 is a control character U+000A`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSample(1)
			tt.mutate(s)
			err := limits.ValidateGPUSample(s, now)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || verr.Reason != ReasonInvalidValue || verr.Message != tt.want {
				t.Errorf("got %v, want %s: %s", err, ReasonInvalidValue, tt.want)
			}
		})
	}
}

// nulPair is the attack of issue 13: two different (tenant, model) pairs
// that a "\x00"-joined series key would merge.
func nulPair() []*meterv1.InferenceEvent {
	a, b := validEvent(), validEvent()
	a.EventId, a.TenantId, a.Model = "nul-1", "nulA\x00b", "c"
	b.EventId, b.TenantId, b.Model = "nul-2", "nulA", "b\x00c"
	for _, ev := range []*meterv1.InferenceEvent{a, b} {
		ev.CompletedAt = timestamppb.New(base.Add(time.Minute))
		ev.ReceivedAt = nil
	}
	return []*meterv1.InferenceEvent{a, b}
}

func TestPublishRejectsNULIdentifiers(t *testing.T) {
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{DefaultEventsTopic}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	pub, err := NewPublisher(PublisherConfig{Brokers: []string{broker.Addr()}, WriteTimeout: 5 * time.Second},
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), func() time.Time { return base.Add(time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	good := validEvent()
	good.CompletedAt, good.ReceivedAt = timestamppb.New(base.Add(time.Minute)), nil
	accepted, rejected, err := pub.Publish(context.Background(), append(nulPair(), good))
	if err != nil {
		t.Fatal(err)
	}
	if accepted != 1 || len(rejected) != 2 {
		t.Fatalf("got %d accepted and %d rejected, want 1 and 2", accepted, len(rejected))
	}
	for i, r := range rejected {
		if r.Index != i || r.Err.Reason != ReasonInvalidValue || !strings.Contains(r.Err.Message, "control character U+0000") {
			t.Errorf("rejected[%d]: got index %d, %s: %s; want index %d, %s naming U+0000", i, r.Index, r.Err.Reason, r.Err.Message, i, ReasonInvalidValue)
		}
	}
}

// TestConsumerRejectsNULIdentifiers: records written straight to Kafka by a
// producer that skips the API are dead-lettered, not counted as one series.
func TestConsumerRejectsNULIdentifiers(t *testing.T) {
	addr, db := chtest.NewDB(t)
	e := newEnv(t, addr, db)
	good := testEvent(1)
	msgs := protoMessages(t, append(nulPair(), good))
	for _, ev := range nulPair() { // and in JSON
		ev.EventId += "-json"
		b, err := protojson.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, kafka.Message{Value: b})
	}
	e.produce(t, msgs...)
	e.startConsumer(t, nil, 100)
	waitTotals(t, e.store, expect([]*meterv1.InferenceEvent{good}), 30*time.Second)
	got := readAll(t, e.broker.Addr(), DefaultDLQTopic, 4)
	for _, m := range got {
		if code, reason := headerValue(m.Headers, HeaderDLQReasonCode), headerValue(m.Headers, HeaderDLQReason); code != ReasonInvalidValue || !strings.Contains(reason, "U+0000") {
			t.Errorf("DLQ record: got reason %s: %s, want %s naming U+0000", code, reason, ReasonInvalidValue)
		}
	}
}
