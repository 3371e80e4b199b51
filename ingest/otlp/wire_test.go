package otlp_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"tokenmeter/ingest/otlp"
)

// wireSeeds are export requests covering the mapping's branches.
func wireSeeds() []*coltracepb.ExportTraceServiceRequest {
	errSpan := without(chatSpan(str("error.type", "openai.RateLimitError")), "gen_ai.usage.input_tokens")
	errSpan.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "slow down"}
	withEvents := without(chatSpan(), "gen_ai.response.time_to_first_chunk")
	withEvents.Events = []*tracepb.Span_Event{
		{Name: "gen_ai.first_token", TimeUnixNano: withEvents.StartTimeUnixNano + 5e8},
		{Name: "gen_ai.first_token", TimeUnixNano: withEvents.StartTimeUnixNano + 3e8, Attributes: []*commonpb.KeyValue{str("a", "b")}},
		{Name: "other", TimeUnixNano: withEvents.StartTimeUnixNano + 1e8},
	}
	withEvents.Links = []*tracepb.Span_Link{{TraceId: traceID, SpanId: spanID}}
	vllm := without(chatSpan(num("gen_ai.usage.prompt_tokens", 7), num("gen_ai.usage.completion_tokens", 3),
		dbl("gen_ai.latency.time_to_first_token", 0.5), dbl("gen_ai.latency.time_in_queue", 0.125), boolean("gen_ai.request.stream", true),
		&commonpb.KeyValue{Key: "gen_ai.prompt", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{{Value: &commonpb.AnyValue_StringValue{StringValue: "hi"}}}}}}}),
		"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.operation.name")
	badTokens := chatSpan(str("gen_ai.usage.output_tokens", "many"), &commonpb.KeyValue{Key: "gen_ai.usage.input_tokens",
		Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: []byte{1}}}})
	httpSpan := &tracepb.Span{TraceId: traceID, SpanId: spanID, Name: "GET", StartTimeUnixNano: 1, EndTimeUnixNano: 2,
		Attributes: []*commonpb.KeyValue{str("http.request.method", "GET")}}
	resource := []*commonpb.KeyValue{str("service.name", "gw"), str("k8s.node.name", "n1"), str("cloud.region", "r"),
		num("tenant.id", 42), str("k8s.deployment.name", "dep")}
	return []*coltracepb.ExportTraceServiceRequest{
		request(nil, chatSpan()),
		request(resource, chatSpan(), errSpan, withEvents, vllm, badTokens, httpSpan,
			chatSpan(str("gen_ai.operation.name", "execute_tool")), without(chatSpan(), "tenant.id")),
		request(resource, without(chatSpan(), "tenant.id", "gen_ai.response.model")),
		benchRequest(0),
		{},
	}
}

// TestConvertWireMatchesConvert: the wire reader and proto.Unmarshal +
// Convert give the same batch.
func TestConvertWireMatchesConvert(t *testing.T) {
	for i, req := range wireSeeds() {
		data, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		for _, keyTenant := range []string{"", "acme"} {
			for _, m := range []otlp.Mapping{{}, {TTFTFromE2E: true, TenantAttribute: "service.name"}} {
				want := m.Convert(req, keyTenant)
				got, err := m.ConvertWire(data, keyTenant)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
					t.Errorf("request %d, key tenant %q, %+v (-Convert +ConvertWire):\n%s", i, keyTenant, m, diff)
				}
			}
		}
	}
}

// TestConvertWireMalformed: what does not parse is an error, like
// proto.Unmarshal's.
func TestConvertWireMalformed(t *testing.T) {
	data, err := proto.Marshal(request(nil, chatSpan()))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{data[:len(data)-3], {0xff, 0xff, 0xff}, {0x0a, 0x05, 0x01}} {
		if proto.Unmarshal(bad, &coltracepb.ExportTraceServiceRequest{}) == nil {
			t.Fatalf("%x: proto.Unmarshal accepts it; pick another", bad)
		}
		if _, err := (otlp.Mapping{}).ConvertWire(bad, ""); err == nil {
			t.Errorf("%x: got no error", bad)
		}
	}
}

// FuzzConvertWire: for any input that proto.Unmarshal accepts, the wire
// reader gives the batch of Convert.
func FuzzConvertWire(f *testing.F) {
	for _, req := range wireSeeds() {
		data, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req coltracepb.ExportTraceServiceRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		got, err := otlp.Mapping{}.ConvertWire(data, "k")
		if err != nil {
			t.Fatalf("proto.Unmarshal accepts it, ConvertWire: %v", err)
		}
		if diff := cmp.Diff(otlp.Mapping{}.Convert(&req, "k"), got, protocmp.Transform()); diff != "" {
			t.Errorf("(-Convert +ConvertWire):\n%s", diff)
		}
	})
}
