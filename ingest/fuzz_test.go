package ingest

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// fuzzContentTypes are the content-type headers a fuzzed record comes with,
// chosen by a byte of the input.
var fuzzContentTypes = []string{"", ContentTypeJSON, ContentTypeProtobuf, "application/json; charset=utf-8", "application/vnd.google.protobuf", "text/plain"}

// checkReason fails t unless err is a *ValidationError with a known reason.
func checkReason(t *testing.T, err error, allowed ...string) {
	t.Helper()
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("got %T %v, want a *ValidationError", err, err)
	}
	for _, r := range allowed {
		if verr.Reason == r {
			return
		}
	}
	t.Fatalf("reason %q (%s): want one of %v", verr.Reason, verr.Message, allowed)
}

var validationReasons = []string{ReasonMissingField, ReasonInvalidValue, ReasonOutOfRange}

// reencoded checks that the other encodings of an accepted record decode
// with decode to the same message, which validate accepts again.
func reencoded[M proto.Message](t *testing.T, limits Limits, m M, decode func(value []byte, contentType string) (M, error), validate func(M) error) {
	t.Helper()
	pb, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("marshal accepted message: %v", err)
	}
	js, err := protojson.Marshal(m)
	if err != nil {
		t.Fatalf("marshal accepted message as JSON: %v", err)
	}
	for _, enc := range []struct {
		ct    string
		value []byte
	}{{ContentTypeProtobuf, pb}, {ContentTypeJSON, js}, {"", js}} {
		if len(enc.value) > limits.MaxRecordBytes {
			continue // JSON of a record near the limit may be over it
		}
		got, err := decode(enc.value, enc.ct)
		if err != nil {
			t.Fatalf("%s form %q of an accepted message does not decode: %v", enc.ct, enc.value, err)
		}
		if diff := cmp.Diff(m, got, protocmp.Transform(), protocmp.IgnoreUnknown()); diff != "" {
			t.Fatalf("%s form decodes to another message (-accepted +decoded):\n%s", enc.ct, diff)
		}
		if err := validate(got); err != nil {
			t.Fatalf("%s form of an accepted message is rejected: %v", enc.ct, err)
		}
	}
}

// FuzzDecodeEvent feeds records to the consumer's path: Decoder.Decode then
// Limits.Validate. Nothing may panic; errors are *ValidationError; an
// accepted event keeps every promise of validation and decodes equal from
// its protobuf and JSON forms.
func FuzzDecodeEvent(f *testing.F) {
	limits := DefaultLimits()
	ev := validEvent()
	pb, _ := proto.Marshal(ev)
	js, _ := protojson.Marshal(ev)
	f.Add(pb, uint8(2))
	f.Add(js, uint8(0))
	f.Add(js, uint8(1))
	dec := NewDecoder(limits)
	decode := func(value []byte, ct string) (*meterv1.InferenceEvent, error) {
		var ev meterv1.InferenceEvent
		return &ev, dec.Decode(&ev, value, ct)
	}
	validate := func(ev *meterv1.InferenceEvent) error { return limits.Validate(ev, testNow) }
	f.Fuzz(func(t *testing.T, value []byte, ct uint8) {
		ev, err := decode(value, fuzzContentTypes[int(ct)%len(fuzzContentTypes)])
		if err != nil {
			checkReason(t, err, ReasonDecode, ReasonOversized)
			return
		}
		if err := validate(ev); err != nil {
			checkReason(t, err, validationReasons...)
			return
		}
		checkAcceptedEvent(t, limits, ev, len(value))
		reencoded(t, limits, ev, decode, validate)
	})
}

// checkAcceptedEvent restates what Limits.Validate promises of an event it
// accepts (ARCHITECTURE "The event").
func checkAcceptedEvent(t *testing.T, l Limits, ev *meterv1.InferenceEvent, size int) {
	t.Helper()
	if size > l.MaxRecordBytes {
		t.Fatalf("record of %d bytes accepted, limit %d", size, l.MaxRecordBytes)
	}
	if ev.GetEventId() == "" || ev.GetTenantId() == "" || ev.GetModel() == "" {
		t.Fatalf("accepted without event_id, tenant_id or model: %v", ev)
	}
	if strings.HasPrefix(ev.GetTenantId(), "__") {
		t.Fatalf("accepted reserved tenant %q", ev.GetTenantId())
	}
	for name, v := range map[string]string{
		"event_id": ev.GetEventId(), "request_id": ev.GetRequestId(), "tenant_id": ev.GetTenantId(), "model": ev.GetModel(),
		"model_version": ev.GetModelVersion(), "deployment": ev.GetDeployment(), "engine": ev.GetEngine(),
		"gpu_type": ev.GetGpuType(), "node": ev.GetNode(), "region": ev.GetRegion(), "slo_class": ev.GetSloClass(),
	} {
		if len(v) > l.MaxStringLen || ident.Check(name, v) != nil {
			t.Fatalf("accepted %s %q: %v", name, v, ident.Check(name, v))
		}
	}
	if len(ev.GetLabels()) > l.MaxLabels {
		t.Fatalf("accepted %d labels", len(ev.GetLabels()))
	}
	for k, v := range ev.GetLabels() {
		if k == "" || len(k) > l.MaxStringLen || len(v) > l.MaxStringLen || ident.Check("key", k) != nil || ident.CheckText("value", v) != nil {
			t.Fatalf("accepted label %q=%q", k, v)
		}
	}
	if err := ev.GetCompletedAt().CheckValid(); err != nil {
		t.Fatalf("accepted completed_at %v: %v", ev.GetCompletedAt(), err)
	}
	completed := ev.GetCompletedAt().AsTime()
	if completed.Before(l.MinTime) || completed.After(testNow.Add(l.MaxFuture)) {
		t.Fatalf("accepted completed_at %s", completed)
	}
	if ev.GetReceivedAt() != nil && (ev.GetReceivedAt().CheckValid() != nil || ev.GetReceivedAt().AsTime().After(completed)) {
		t.Fatalf("accepted received_at %v after completed_at %s", ev.GetReceivedAt(), completed)
	}
	if _, ok := meterv1.Status_name[int32(ev.GetStatus())]; !ok {
		t.Fatalf("accepted status %d", ev.GetStatus())
	}
	if s := ev.GetStatus(); (s == meterv1.Status_STATUS_OK || s == meterv1.Status_STATUS_UNSPECIFIED) &&
		(ev.PromptTokens == nil || ev.OutputTokens == nil || ev.TtftMs == nil || ev.E2EMs == nil) {
		t.Fatalf("accepted a successful request without tokens or latencies: %v", ev)
	}
	for _, n := range []int64{ev.GetPromptTokens(), ev.GetCachedPromptTokens(), ev.GetOutputTokens()} {
		if n < 0 || n > l.MaxTokens {
			t.Fatalf("accepted token count %d", n)
		}
	}
	if ev.GetCachedPromptTokens() > ev.GetPromptTokens() {
		t.Fatalf("accepted cached_prompt_tokens %d > prompt_tokens %d", ev.GetCachedPromptTokens(), ev.GetPromptTokens())
	}
	for _, v := range []float64{ev.GetTtftMs(), ev.GetE2EMs(), ev.GetQueueMs(), ev.GetPrefillMs(), ev.GetItlMs()} {
		if math.IsNaN(v) || v < 0 || v > float64(l.MaxLatency.Milliseconds()) {
			t.Fatalf("accepted latency %g", v)
		}
	}
	if ev.TtftMs != nil && ev.E2EMs != nil && ev.GetTtftMs() > ev.GetE2EMs() {
		t.Fatalf("accepted ttft_ms %g > e2e_ms %g", ev.GetTtftMs(), ev.GetE2EMs())
	}
	if ev.GetTensorParallelism() > l.MaxTensorParallelism {
		t.Fatalf("accepted tensor_parallelism %d", ev.GetTensorParallelism())
	}
}

// FuzzDecodeGPUSample is FuzzDecodeEvent for GPU samples: DecodeGPUSample
// then ValidateGPUSample.
func FuzzDecodeGPUSample(f *testing.F) {
	limits := DefaultLimits()
	now := base.Add(2 * time.Hour)
	s := testSample(5)
	pb, _ := proto.Marshal(s)
	js, _ := protojson.Marshal(s)
	f.Add(pb, uint8(2))
	f.Add(js, uint8(0))
	decode := func(value []byte, ct string) (*meterv1.GpuSample, error) {
		var s meterv1.GpuSample
		return &s, DecodeGPUSample(&s, value, ct, limits)
	}
	validate := func(s *meterv1.GpuSample) error { return limits.ValidateGPUSample(s, now) }
	f.Fuzz(func(t *testing.T, value []byte, ct uint8) {
		s, err := decode(value, fuzzContentTypes[int(ct)%len(fuzzContentTypes)])
		if err != nil {
			checkReason(t, err, ReasonDecode, ReasonOversized)
			return
		}
		if err := validate(s); err != nil {
			checkReason(t, err, validationReasons...)
			return
		}
		if s.GetSampleId() == "" || s.GetGpuUuid() == "" {
			t.Fatalf("accepted without sample_id or gpu_uuid: %v", s)
		}
		for name, v := range map[string]string{
			"sample_id": s.GetSampleId(), "node": s.GetNode(), "gpu_uuid": s.GetGpuUuid(), "gpu_type": s.GetGpuType(),
			"mig_profile": s.GetMigProfile(), "deployment": s.GetDeployment(), "pod": s.GetPod(), "namespace": s.GetNamespace(),
			"region": s.GetRegion(), "pool": s.GetPool(), "source": s.GetSource(),
		} {
			if len(v) > limits.MaxStringLen || ident.Check(name, v) != nil {
				t.Fatalf("accepted %s %q", name, v)
			}
		}
		at := s.GetSampledAt().AsTime()
		if s.GetSampledAt().CheckValid() != nil || at.Before(limits.MinTime) || at.After(now.Add(limits.MaxFuture)) {
			t.Fatalf("accepted sampled_at %v", s.GetSampledAt())
		}
		if iv := s.GetIntervalS(); !(iv > 0 && iv <= MaxSampleInterval.Seconds()) {
			t.Fatalf("accepted interval_s %v", iv)
		}
		for _, v := range []float64{s.GetUtilization(), s.GetMigFraction()} {
			if !(v >= 0 && v <= 1) {
				t.Fatalf("accepted fraction %v", v)
			}
		}
		for _, v := range []float64{s.GetPowerWatts(), s.GetEnergyJoules(), s.GetSmClockMhz()} {
			if !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("accepted %v", v)
			}
		}
		if t0 := s.GetTemperatureC(); math.IsNaN(t0) || math.IsInf(t0, 0) {
			t.Fatalf("accepted temperature_c %v", t0)
		}
		if s.GetFbTotalBytes() > 0 && s.GetFbUsedBytes() > s.GetFbTotalBytes() {
			t.Fatalf("accepted fb_used_bytes %d > fb_total_bytes %d", s.GetFbUsedBytes(), s.GetFbTotalBytes())
		}
		reencoded(t, limits, s, decode, validate)
	})
}
