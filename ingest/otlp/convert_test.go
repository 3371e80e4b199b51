package otlp_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest/otlp"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var (
	t0      = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	traceID = []byte{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c}
	spanID  = []byte{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31}
)

const wantID = "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"

func str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func num(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

func dbl(k string, v float64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v}}}
}

func boolean(k string, v bool) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v}}}
}

// chatSpan is a successful chat span of 2 s: 120 input tokens (20 cached),
// 30 output tokens, first chunk after 0.25 s, tenant acme; extra
// attributes replace those of the same key.
func chatSpan(extra ...*commonpb.KeyValue) *tracepb.Span {
	attrs := []*commonpb.KeyValue{
		str("gen_ai.operation.name", "chat"), str("gen_ai.provider.name", "openai"),
		str("gen_ai.request.model", "llama-3.1-8b"), str("gen_ai.response.model", "llama-3.1-8b-instruct"),
		str("gen_ai.response.id", "chatcmpl-1"), str("tenant.id", "acme"),
		num("gen_ai.usage.input_tokens", 120), num("gen_ai.usage.output_tokens", 30),
		num("gen_ai.usage.cache_read.input_tokens", 20), dbl("gen_ai.response.time_to_first_chunk", 0.25),
	}
next:
	for _, e := range extra {
		for i, kv := range attrs {
			if kv.Key == e.Key {
				attrs[i] = e
				continue next
			}
		}
		attrs = append(attrs, e)
	}
	return &tracepb.Span{
		TraceId: traceID, SpanId: spanID, Name: "chat llama",
		StartTimeUnixNano: uint64(t0.UnixNano()), EndTimeUnixNano: uint64(t0.Add(2 * time.Second).UnixNano()),
		Attributes: attrs,
	}
}

// without returns sp with the attributes named removed.
func without(sp *tracepb.Span, keys ...string) *tracepb.Span {
	sp = proto.Clone(sp).(*tracepb.Span)
	var kept []*commonpb.KeyValue
next:
	for _, kv := range sp.Attributes {
		for _, k := range keys {
			if kv.Key == k {
				continue next
			}
		}
		kept = append(kept, kv)
	}
	sp.Attributes = kept
	return sp
}

func request(resource []*commonpb.KeyValue, spans ...*tracepb.Span) *coltracepb.ExportTraceServiceRequest {
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: resource},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}},
	}}}
}

func i64(v int64) *int64                        { return &v }
func f64(v float64) *float64                    { return &v }
func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }

// wantEvent is the event of chatSpan() under the resource of TestConvert:
// no deployment (service.name names the calling application) and no
// engine (the provider, openai, is the API called, not a serving engine).
func wantEvent() *meterv1.InferenceEvent {
	return &meterv1.InferenceEvent{
		EventId: wantID, RequestId: "chatcmpl-1", TenantId: "acme", Model: "llama-3.1-8b-instruct",
		Node: "node-7", Region: "eu-west-1",
		ReceivedAt: ts(0), CompletedAt: ts(2 * time.Second),
		PromptTokens: i64(120), CachedPromptTokens: i64(20), OutputTokens: i64(30),
		TtftMs: f64(250), E2EMs: f64(2000),
	}
}

func TestConvert(t *testing.T) {
	resource := []*commonpb.KeyValue{str("service.name", "chat-gw"), str("host.name", "node-7"), str("cloud.region", "eu-west-1")}
	tests := []struct {
		name      string
		mapping   otlp.Mapping
		keyTenant string
		resource  []*commonpb.KeyValue
		span      *tracepb.Span
		want      func(*meterv1.InferenceEvent) // edits wantEvent(); nil: no event
		reason    string                        // the rejection's reason, when rejected
		ignored   string                        // otlp.ResultNotGenAI or ResultNotInference
	}{
		{name: "chat span", span: chatSpan(), want: func(*meterv1.InferenceEvent) {}},
		{name: "request model when no response model", span: without(chatSpan(), "gen_ai.response.model"),
			want: func(e *meterv1.InferenceEvent) { e.Model = "llama-3.1-8b" }},
		{name: "k8s deployment, never service name", resource: append(resource, str("k8s.deployment.name", "vllm-8b")), span: chatSpan(),
			want: func(e *meterv1.InferenceEvent) { e.Deployment = "vllm-8b" }},
		{name: "tenant on the resource", resource: append(resource, str("tenant.id", "beta")), span: without(chatSpan(), "tenant.id"),
			want: func(e *meterv1.InferenceEvent) { e.TenantId = "beta" }},
		{name: "span tenant over resource tenant", resource: append(resource, str("tenant.id", "beta")), span: chatSpan(),
			want: func(*meterv1.InferenceEvent) {}},
		{name: "configured tenant attribute", mapping: otlp.Mapping{TenantAttribute: "app.customer"},
			span: chatSpan(str("app.customer", "gamma")), want: func(e *meterv1.InferenceEvent) { e.TenantId = "gamma" }},
		{name: "tenant of the key", keyTenant: "acme", span: without(chatSpan(), "tenant.id"), want: func(*meterv1.InferenceEvent) {}},
		{name: "same tenant as the key", keyTenant: "acme", span: chatSpan(), want: func(*meterv1.InferenceEvent) {}},
		{name: "another tenant than the key", keyTenant: "beta", span: chatSpan(), reason: otlp.ReasonTenantMismatch},
		{name: "no tenant", span: without(chatSpan(), "tenant.id"), reason: otlp.ReasonMissingTenant},
		{name: "older token names (vLLM, SGLang) and vLLM latencies",
			span: without(chatSpan(num("gen_ai.usage.prompt_tokens", 7), num("gen_ai.usage.completion_tokens", 3),
				dbl("gen_ai.latency.time_to_first_token", 0.5), dbl("gen_ai.latency.time_in_queue", 0.125),
				dbl("gen_ai.latency.time_in_model_prefill", 0.0625), str("gen_ai.request.id", "vllm-req-9"),
				num("gen_ai.usage.cached_tokens", 4)),
				"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens"),
			want: func(e *meterv1.InferenceEvent) {
				e.PromptTokens, e.OutputTokens, e.CachedPromptTokens = i64(7), i64(3), i64(4)
				e.TtftMs, e.QueueMs, e.PrefillMs, e.RequestId = f64(500), f64(125), f64(62.5), "vllm-req-9"
			}},
		{name: "newer token names win over older ones", span: chatSpan(num("gen_ai.usage.prompt_tokens", 7), num("gen_ai.usage.completion_tokens", 3)),
			want: func(*meterv1.InferenceEvent) {}},
		{name: "tokens as a whole double and as a string",
			span: chatSpan(dbl("gen_ai.usage.input_tokens", 120), str("gen_ai.usage.output_tokens", "30")),
			want: func(*meterv1.InferenceEvent) {}},
		{name: "tokens as a fraction", span: chatSpan(dbl("gen_ai.usage.output_tokens", 30.5)),
			reason: otlp.ReasonInvalidValue},
		{name: "tokens as a word", span: chatSpan(str("gen_ai.usage.output_tokens", "many")),
			reason: otlp.ReasonInvalidValue},
		{name: "TTFT from a first-token event", span: func() *tracepb.Span {
			sp := without(chatSpan(), "gen_ai.response.time_to_first_chunk")
			sp.Events = []*tracepb.Span_Event{
				{Name: "gen_ai.first_token", TimeUnixNano: uint64(t0.Add(400 * time.Millisecond).UnixNano())},
				{Name: "gen_ai.first_token", TimeUnixNano: uint64(t0.Add(300 * time.Millisecond).UnixNano())},
			}
			return sp
		}(), want: func(e *meterv1.InferenceEvent) { e.TtftMs = f64(300) }},
		{name: "no TTFT", span: without(chatSpan(), "gen_ai.response.time_to_first_chunk"), reason: otlp.ReasonMissingTTFT},
		{name: "no TTFT, e2e taken when asked", mapping: otlp.Mapping{TTFTFromE2E: true}, span: without(chatSpan(), "gen_ai.response.time_to_first_chunk"),
			want: func(e *meterv1.InferenceEvent) {
				e.TtftMs = f64(2000)
				e.Labels = map[string]string{"ttft_source": "e2e"}
			}},
		{name: "no output tokens", span: without(chatSpan(), "gen_ai.usage.output_tokens"), reason: otlp.ReasonMissingTokens},
		{name: "no input tokens", span: without(chatSpan(), "gen_ai.usage.input_tokens"), reason: otlp.ReasonMissingTokens},
		{name: "no model", span: without(chatSpan(), "gen_ai.request.model", "gen_ai.response.model"), reason: otlp.ReasonMissingModel},
		{name: "embeddings have no output tokens", span: without(chatSpan(str("gen_ai.operation.name", "embeddings")), "gen_ai.usage.output_tokens"),
			want: func(e *meterv1.InferenceEvent) { e.OutputTokens = i64(0) }},
		{name: "rate limited, no tokens needed",
			span: func() *tracepb.Span {
				sp := without(chatSpan(str("error.type", "429")), "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens", "gen_ai.response.time_to_first_chunk")
				sp.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR}
				return sp
			}(),
			want: func(e *meterv1.InferenceEvent) {
				e.Status = meterv1.Status_STATUS_RATE_LIMITED
				e.PromptTokens, e.OutputTokens, e.CachedPromptTokens, e.TtftMs = nil, nil, nil, nil
			}},
		{name: "streaming flag", span: chatSpan(boolean("gen_ai.request.stream", true)), want: func(e *meterv1.InferenceEvent) { e.Streaming = true }},
		{name: "time per output token", span: chatSpan(dbl("gen_ai.server.time_per_output_token", 0.02)), want: func(e *meterv1.InferenceEvent) { e.ItlMs = f64(20) }},
		{name: "vLLM span without operation name", span: without(chatSpan(), "gen_ai.operation.name", "gen_ai.provider.name"),
			want: func(*meterv1.InferenceEvent) {}},
		{name: "older gen_ai.system as engine", span: without(chatSpan(str("gen_ai.system", "vllm")), "gen_ai.provider.name"),
			want: func(e *meterv1.InferenceEvent) { e.Engine = "vllm" }},
		{name: "a serving engine as provider", span: chatSpan(str("gen_ai.provider.name", "SGLang")),
			want: func(e *meterv1.InferenceEvent) { e.Engine = "sglang" }},
		{name: "HTTP span", span: &tracepb.Span{TraceId: traceID, SpanId: spanID, StartTimeUnixNano: 1, EndTimeUnixNano: 2,
			Attributes: []*commonpb.KeyValue{str("http.request.method", "GET"), str("tenant.id", "acme")}}, ignored: otlp.ResultNotGenAI},
		{name: "tool span", span: chatSpan(str("gen_ai.operation.name", "execute_tool")), ignored: otlp.ResultNotInference},
		{name: "agent span with the usage of its calls", span: chatSpan(str("gen_ai.operation.name", "invoke_agent")),
			ignored: otlp.ResultNotInference},
		{name: "zero span id", span: func() *tracepb.Span { sp := chatSpan(); sp.SpanId = make([]byte, 8); return sp }(), reason: otlp.ReasonInvalidSpan},
		{name: "short trace id", span: func() *tracepb.Span { sp := chatSpan(); sp.TraceId = traceID[:8]; return sp }(), reason: otlp.ReasonInvalidSpan},
		{name: "end before start", span: func() *tracepb.Span { sp := chatSpan(); sp.EndTimeUnixNano = sp.StartTimeUnixNano - 1; return sp }(), reason: otlp.ReasonInvalidSpan},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := resource
			if tc.resource != nil {
				res = tc.resource
			}
			b := tc.mapping.Convert(request(res, tc.span), tc.keyTenant)
			var want []*meterv1.InferenceEvent
			if tc.want != nil {
				ev := wantEvent()
				tc.want(ev)
				want = append(want, ev)
			}
			if diff := cmp.Diff(want, b.Events, protocmp.Transform()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			var reasons []string
			for _, r := range b.Rejected {
				reasons = append(reasons, r.Reason)
				if r.Message == "" || r.Span.TraceID == "" {
					t.Errorf("rejection %+v: want a message and the span", r)
				}
			}
			var wantReasons []string
			if tc.reason != "" {
				wantReasons = []string{tc.reason}
			}
			if diff := cmp.Diff(wantReasons, reasons); diff != "" {
				t.Errorf("rejection reasons (-want +got):\n%s", diff)
			}
			gotIgnored := map[string]int{otlp.ResultNotGenAI: b.NotGenAI, otlp.ResultNotInference: b.NotInference}
			wantIgnored := map[string]int{otlp.ResultNotGenAI: 0, otlp.ResultNotInference: 0}
			if tc.ignored != "" {
				wantIgnored[tc.ignored] = 1
			}
			if diff := cmp.Diff(wantIgnored, gotIgnored); diff != "" {
				t.Errorf("ignored (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStatusFromErrorType(t *testing.T) {
	tests := []struct {
		code      tracepb.Status_StatusCode
		errorType string
		want      meterv1.Status
	}{
		{tracepb.Status_STATUS_CODE_UNSET, "", meterv1.Status_STATUS_UNSPECIFIED},
		{tracepb.Status_STATUS_CODE_OK, "", meterv1.Status_STATUS_UNSPECIFIED},
		{tracepb.Status_STATUS_CODE_ERROR, "", meterv1.Status_STATUS_INTERNAL},
		{tracepb.Status_STATUS_CODE_ERROR, "_OTHER", meterv1.Status_STATUS_INTERNAL},
		{tracepb.Status_STATUS_CODE_ERROR, "429", meterv1.Status_STATUS_RATE_LIMITED},
		{tracepb.Status_STATUS_CODE_ERROR, "openai.RateLimitError", meterv1.Status_STATUS_RATE_LIMITED},
		{tracepb.Status_STATUS_CODE_UNSET, "timeout", meterv1.Status_STATUS_TIMEOUT},
		{tracepb.Status_STATUS_CODE_ERROR, "httpx.ReadTimeout", meterv1.Status_STATUS_TIMEOUT},
		{tracepb.Status_STATUS_CODE_ERROR, "504", meterv1.Status_STATUS_TIMEOUT},
		{tracepb.Status_STATUS_CODE_ERROR, "context_length_exceeded", meterv1.Status_STATUS_CONTEXT_LENGTH},
		{tracepb.Status_STATUS_CODE_ERROR, "asyncio.CancelledError", meterv1.Status_STATUS_CANCELLED},
		{tracepb.Status_STATUS_CODE_ERROR, "torch.OutOfMemoryError", meterv1.Status_STATUS_OOM},
		{tracepb.Status_STATUS_CODE_ERROR, "CUDA error", meterv1.Status_STATUS_CUDA},
		{tracepb.Status_STATUS_CODE_ERROR, "openai.BadRequestError", meterv1.Status_STATUS_BAD_REQUEST},
		{tracepb.Status_STATUS_CODE_ERROR, "400", meterv1.Status_STATUS_BAD_REQUEST},
		{tracepb.Status_STATUS_CODE_ERROR, "500", meterv1.Status_STATUS_INTERNAL},
	}
	for _, tc := range tests {
		sp := without(chatSpan(str("error.type", tc.errorType)), "gen_ai.usage.input_tokens")
		if tc.errorType == "" {
			sp = without(sp, "error.type")
		}
		sp.Status = &tracepb.Status{Code: tc.code}
		b := otlp.Mapping{}.Convert(request(nil, sp), "")
		if tc.want == meterv1.Status_STATUS_UNSPECIFIED {
			// A successful span without input tokens is rejected: the
			// status was read as OK.
			if len(b.Rejected) != 1 || b.Rejected[0].Reason != otlp.ReasonMissingTokens {
				t.Errorf("%v %q: got %+v, want a successful span rejected for its tokens", tc.code, tc.errorType, b.Rejected)
			}
			continue
		}
		if len(b.Events) != 1 {
			t.Errorf("%v %q: got %d events (rejected %+v), want 1", tc.code, tc.errorType, len(b.Events), b.Rejected)
			continue
		}
		if got := b.Events[0].Status; got != tc.want {
			t.Errorf("%v %q: got status %v, want %v", tc.code, tc.errorType, got, tc.want)
		}
	}
}

func TestEventIDIsStable(t *testing.T) {
	if got := otlp.EventID(traceID, spanID); got != wantID {
		t.Errorf("got %q, want %q", got, wantID)
	}
	other := append([]byte(nil), spanID...)
	other[7]++
	if otlp.EventID(traceID, other) == wantID {
		t.Error("two spans share an event id")
	}
}
