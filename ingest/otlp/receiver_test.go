package otlp_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"tokenmeter/api"
	"tokenmeter/ingest"
	"tokenmeter/ingest/otlp"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Keys of each role; "ingest-acme" is an ingest key bound to tenant acme.
var testKeys = map[string]api.KeyEntry{
	"key-ingest":      {Name: "ingest", Role: api.RoleIngest},
	"key-ingest-acme": {Name: "ingest-acme", Role: api.RoleIngest, TenantID: "acme"},
	"key-admin":       {Name: "admin", Role: api.RoleAdmin},
	"key-finance":     {Name: "finance", Role: api.RoleFinance},
	"key-tenant":      {Name: "tenant", Role: api.RoleTenant, TenantID: "acme"},
}

func keySet(t testing.TB) *api.Keys {
	t.Helper()
	var kf api.KeysFile
	for key, e := range testKeys {
		e.SHA256 = api.HashKey(key)
		kf.Keys = append(kf.Keys, e)
	}
	keys, err := api.NewKeys(kf)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// recorder is a publisher that validates like ingest.Publisher and keeps
// the valid events; down makes it answer like a Kafka that is not there.
type recorder struct {
	mu     sync.Mutex
	events []*meterv1.InferenceEvent
	down   bool
}

func (r *recorder) Publish(_ context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rejected []ingest.Rejected
	var valid []*meterv1.InferenceEvent
	for i, ev := range events {
		if err := ingest.DefaultLimits().Validate(ev, time.Now()); err != nil {
			rejected = append(rejected, ingest.Rejected{Index: i, EventID: ev.GetEventId(), Err: err.(*ingest.ValidationError)})
			continue
		}
		valid = append(valid, ev)
	}
	if r.down {
		return 0, rejected, fmt.Errorf("%w: no broker", ingest.ErrUnavailable)
	}
	r.events = append(r.events, valid...)
	return len(valid), rejected, nil
}

func (r *recorder) got() []*meterv1.InferenceEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*meterv1.InferenceEvent(nil), r.events...)
}

type receiver struct {
	*otlp.Receiver
	reg *prometheus.Registry
}

// startReceiver runs both receivers on free ports until the test ends.
func startReceiver(t testing.TB, pub otlp.Publisher, cfg otlp.Config) receiver {
	t.Helper()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	reg := prometheus.NewRegistry()
	r, err := otlp.New(cfg, pub, keySet(t), reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return receiver{r, reg}
}

// sdkSpans makes n GenAI chat spans with the OpenTelemetry SDK: span i has
// 100+i input tokens (i cached) and 10+i output tokens, and ends now.
func sdkSpans(t testing.TB, n int, res *resource.Resource) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res))
	tracer := tp.Tracer("tokenmeter-test")
	end := time.Now()
	for i := range n {
		_, sp := tracer.Start(context.Background(), "chat llama", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithTimestamp(end.Add(-time.Second)))
		sp.SetAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.provider.name", "openai"),
			attribute.String("gen_ai.request.model", "llama-3.1-8b"),
			attribute.Int("gen_ai.usage.input_tokens", 100+i),
			attribute.Int("gen_ai.usage.output_tokens", 10+i),
			attribute.Int("gen_ai.usage.cache_read.input_tokens", i),
			attribute.Float64("gen_ai.response.time_to_first_chunk", 0.125),
		)
		sp.End(trace.WithTimestamp(end))
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rec.Ended()
}

func acmeResource() *resource.Resource {
	return resource.NewSchemaless(attribute.String("service.name", "chat-app"), attribute.String("k8s.deployment.name", "chat-gw"),
		attribute.String("tenant.id", "acme"), attribute.String("host.name", "node-1"), attribute.String("cloud.region", "eu-west-1"))
}

// exporters are the SDK's OTLP exporters, each pointed at the receiver.
func exporters(t testing.TB, r receiver, key string) map[string]sdktrace.SpanExporter {
	t.Helper()
	ctx := context.Background()
	headers := map[string]string{"Authorization": "Bearer " + key}
	grpcExp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(r.GRPCAddr()), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithHeaders(headers), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	grpcGzip, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(r.GRPCAddr()), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithHeaders(headers), otlptracegrpc.WithCompressor("gzip"), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	exps := map[string]sdktrace.SpanExporter{"grpc": grpcExp, "grpc gzip": grpcGzip}
	for name, opts := range map[string][]otlptracehttp.Option{
		"http protobuf":      {},
		"http protobuf gzip": {otlptracehttp.WithCompression(otlptracehttp.GzipCompression)},
		"http json":          {otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON)},
		"http json gzip":     {otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON), otlptracehttp.WithCompression(otlptracehttp.GzipCompression)},
	} {
		exp, err := otlptracehttp.New(ctx, append(opts, otlptracehttp.WithEndpoint(r.HTTPAddr()), otlptracehttp.WithInsecure(),
			otlptracehttp.WithHeaders(headers), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))...)
		if err != nil {
			t.Fatal(err)
		}
		exps[name] = exp
	}
	t.Cleanup(func() {
		for _, e := range exps {
			e.Shutdown(context.Background())
		}
	})
	return exps
}

type totals struct{ Events, Prompt, Cached, Output int64 }

func sum(events []*meterv1.InferenceEvent) totals {
	var s totals
	for _, e := range events {
		s.Events++
		s.Prompt += e.GetPromptTokens()
		s.Cached += e.GetCachedPromptTokens()
		s.Output += e.GetOutputTokens()
	}
	return s
}

// TestSDKExporters sends spans made by the OpenTelemetry SDK through each
// of its OTLP exporters (gRPC and HTTP, protobuf and JSON, gzip or not):
// every span lands as one event with its exact tokens, ids and timings.
func TestSDKExporters(t *testing.T) {
	const n = 50
	spans := sdkSpans(t, n, acmeResource())
	want := totals{Events: n}
	for i := range n {
		want.Prompt += int64(100 + i)
		want.Cached += int64(i)
		want.Output += int64(10 + i)
	}
	for _, name := range []string{"grpc", "grpc gzip", "http protobuf", "http protobuf gzip", "http json", "http json gzip"} {
		t.Run(name, func(t *testing.T) {
			pub := &recorder{}
			r := startReceiver(t, pub, otlp.Config{})
			exp := exporters(t, r, "key-ingest")[name]
			if err := exp.ExportSpans(context.Background(), spans); err != nil {
				t.Fatal(err)
			}
			got := pub.got()
			if diff := cmp.Diff(want, sum(got)); diff != "" {
				t.Errorf("totals (-want +got):\n%s", diff)
			}
			byID := map[string]*meterv1.InferenceEvent{}
			for _, e := range got {
				byID[e.GetEventId()] = e
			}
			for _, sp := range spans {
				id := sp.SpanContext().TraceID().String() + "-" + sp.SpanContext().SpanID().String()
				e := byID[id]
				if e == nil {
					t.Fatalf("no event %s", id)
				}
				if e.GetTenantId() != "acme" || e.GetModel() != "llama-3.1-8b" || e.GetDeployment() != "chat-gw" || e.GetNode() != "node-1" ||
					e.GetRegion() != "eu-west-1" || e.GetTtftMs() != 125 || e.GetE2EMs() != 1000 || !e.GetCompletedAt().AsTime().Equal(sp.EndTime()) {
					t.Errorf("event %s: got %v", id, e)
				}
			}
			if got := testutil.ToFloat64(r.spansCounter(otlp.ResultAccepted)); got != n {
				t.Errorf("accepted spans metric: got %v, want %d", got, n)
			}
		})
	}
}

func (r receiver) spansCounter(result string) prometheus.Collector {
	return counter(r.reg, "meter_otlp_spans_total", "result", result)
}

// counter finds one series of a counter vector in a registry, through
// Gather, so that the test reads what /metrics would show.
func counter(reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == label && lp.GetValue() == value {
						ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
					}
				}
			}
		}
	})
}

// TestResentSpanKeepsItsEventID: a span exported twice (an exporter's
// retry) is published twice with one event id, which the pipeline
// deduplicates (TestEndToEnd checks the totals in ClickHouse).
func TestResentSpanKeepsItsEventID(t *testing.T) {
	spans := sdkSpans(t, 3, acmeResource())
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{})
	exps := exporters(t, r, "key-ingest")
	for _, name := range []string{"grpc", "http protobuf", "http json"} {
		if err := exps[name].ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]int{}
	for _, e := range pub.got() {
		ids[e.GetEventId()]++
	}
	want := map[string]int{}
	for _, sp := range spans {
		want[sp.SpanContext().TraceID().String()+"-"+sp.SpanContext().SpanID().String()] = 3
	}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("event ids (-want +got):\n%s", diff)
	}
}

// TestPartialSuccess: one export with a good span, a span without tenant,
// a span that fails the event validation and an HTTP span: the answer
// counts two rejected spans with both reasons, the metrics count all four.
func TestPartialSuccess(t *testing.T) {
	now := time.Now()
	mk := func(spanByte byte, attrs ...*commonpb.KeyValue) *tracepb.Span {
		sp := chatSpan(attrs...)
		sp.SpanId = []byte{1, 2, 3, 4, 5, 6, 7, spanByte}
		sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
		return sp
	}
	req := request(nil,
		mk(1),
		without(mk(2), "tenant.id"),
		mk(3, num("gen_ai.usage.cache_read.input_tokens", 500)), // more cached than input tokens
		&tracepb.Span{TraceId: traceID, SpanId: spanID, Name: "GET /", StartTimeUnixNano: 1, EndTimeUnixNano: 2},
	)
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{})
	for _, ct := range []string{"application/x-protobuf", "application/json"} {
		t.Run(ct, func(t *testing.T) {
			code, body, _ := post(t, r, ct, "key-ingest", "", encode(t, ct, req))
			if code != http.StatusOK {
				t.Fatalf("got %d %s, want 200", code, body)
			}
			var resp coltracepb.ExportTraceServiceResponse
			decode(t, ct, body, &resp)
			ps := resp.GetPartialSuccess()
			if ps.GetRejectedSpans() != 2 {
				t.Errorf("rejected spans: got %d, want 2 (%s)", ps.GetRejectedSpans(), ps.GetErrorMessage())
			}
			for _, s := range []string{otlp.ReasonMissingTenant, ingest.ReasonInvalidValue, "cached_prompt_tokens", "0af7651916cd43dd8448eb211c80319c/0102030405060702"} {
				if !strings.Contains(ps.GetErrorMessage(), s) {
					t.Errorf("error message %q does not name %q", ps.GetErrorMessage(), s)
				}
			}
		})
	}
	if got := len(pub.got()); got != 2 {
		t.Errorf("published %d events, want 2 (one per export)", got)
	}
	for result, want := range map[string]float64{otlp.ResultAccepted: 2, otlp.ResultRejected: 4, otlp.ResultNotGenAI: 2, otlp.ResultNotInference: 0} {
		if got := testutil.ToFloat64(r.spansCounter(result)); got != want {
			t.Errorf("meter_otlp_spans_total{result=%q}: got %v, want %v", result, got, want)
		}
	}
	for reason, want := range map[string]float64{otlp.ReasonMissingTenant: 2, ingest.ReasonInvalidValue: 2} {
		if got := testutil.ToFloat64(counter(r.reg, "meter_otlp_spans_rejected_total", "reason", reason)); got != want {
			t.Errorf("meter_otlp_spans_rejected_total{reason=%q}: got %v, want %v", reason, got, want)
		}
	}
}

func encode(t testing.TB, ct string, m proto.Message) []byte {
	t.Helper()
	if ct == "application/json" {
		// OTLP JSON: ids in hex. protojson writes base64; swap them.
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return otlpJSONIDs(t, b)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode(t testing.TB, ct string, body []byte, m proto.Message) {
	t.Helper()
	var err error
	if ct == "application/json" {
		err = protojson.Unmarshal(body, m)
	} else {
		err = proto.Unmarshal(body, m)
	}
	if err != nil {
		t.Fatalf("answer %q does not decode as %T: %v", body, m, err)
	}
}

// post sends an OTLP/HTTP export and returns the answer.
func post(t testing.TB, r receiver, contentType, key, encoding string, body []byte) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+r.HTTPAddr()+otlp.TracesPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestMalformedHTTP: each bad request gets its OTLP answer, with a
// google.rpc.Status body in the request's content type where it has one.
func TestMalformedHTTP(t *testing.T) {
	const limit = 64 << 10
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{MaxRequestBytes: limit})
	good := encode(t, "application/x-protobuf", request(nil, chatSpan()))
	tests := []struct {
		name, contentType, encoding string
		body                        []byte
		want                        int
		status                      codes.Code // of the google.rpc.Status body; OK: none expected
	}{
		{"bad protobuf", "application/x-protobuf", "", []byte("\xff\xff\xff"), http.StatusBadRequest, codes.InvalidArgument},
		{"bad JSON", "application/json", "", []byte(`{"resourceSpans": [`), http.StatusBadRequest, codes.InvalidArgument},
		{"JSON of another shape", "application/json", "", []byte(`{"resourceSpans": 7}`), http.StatusBadRequest, codes.InvalidArgument},
		{"JSON id not hex", "application/json", "", []byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz","spanId":"b7ad6b7169203331"}]}]}]}`), http.StatusBadRequest, codes.InvalidArgument},
		{"wrong content type", "text/plain", "", good, http.StatusUnsupportedMediaType, codes.OK},
		{"no content type", "", "", good, http.StatusUnsupportedMediaType, codes.OK},
		{"unknown encoding", "application/x-protobuf", "br", good, http.StatusUnsupportedMediaType, codes.InvalidArgument},
		{"bad gzip", "application/x-protobuf", "gzip", good, http.StatusBadRequest, codes.InvalidArgument},
		{"truncated gzip", "application/x-protobuf", "gzip", gzipped(t, good)[:20], http.StatusBadRequest, codes.InvalidArgument},
		{"oversized", "application/x-protobuf", "", make([]byte, limit+1), http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
		{"oversized once decompressed", "application/x-protobuf", "gzip", gzipped(t, make([]byte, 4*limit)), http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, _ := post(t, r, tc.contentType, "key-ingest", tc.encoding, tc.body)
			if code != tc.want {
				t.Fatalf("got %d %q, want %d", code, body, tc.want)
			}
			if tc.status == codes.OK {
				return
			}
			var st spb.Status
			decode(t, tc.contentType, body, &st)
			if codes.Code(st.GetCode()) != tc.status || st.GetMessage() == "" {
				t.Errorf("status body: got %v, want code %v with a message", &st, tc.status)
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		resp, err := http.Get("http://" + r.HTTPAddr() + otlp.TracesPath)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("got %d, want 405", resp.StatusCode)
		}
	})
	if got := pub.got(); len(got) != 0 {
		t.Errorf("published %d events from bad requests", len(got))
	}
	t.Run("gzip accepted", func(t *testing.T) {
		code, body, _ := post(t, r, "application/x-protobuf", "key-ingest", "gzip", gzipped(t, good))
		if code != http.StatusOK || len(pub.got()) != 1 {
			t.Errorf("got %d %q and %d events, want 200 and 1", code, body, len(pub.got()))
		}
	})
}

// TestJSONIDsAndNumbers: OTLP JSON with hex ids, 64-bit integers as
// strings and as numbers, enums as numbers.
func TestJSONIDsAndNumbers(t *testing.T) {
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{})
	start, end := time.Now().Add(-2*time.Second).UnixNano(), time.Now().UnixNano()
	body := fmt.Sprintf(`{"resourceSpans":[{"resource":{"attributes":[{"key":"tenant.id","value":{"stringValue":"acme"}}]},
	"scopeSpans":[{"scope":{"name":"x"},"spans":[{"traceId":"0AF7651916CD43DD8448EB211C80319C","spanId":"b7ad6b7169203331",
	"parentSpanId":"","name":"chat","kind":3,"startTimeUnixNano":"%d","endTimeUnixNano":%d,"unknownField":1,
	"attributes":[{"key":"gen_ai.request.model","value":{"stringValue":"m"}},
	{"key":"gen_ai.usage.input_tokens","value":{"intValue":"9007199254740993"}},
	{"key":"gen_ai.usage.output_tokens","value":{"intValue":7}},
	{"key":"gen_ai.response.time_to_first_chunk","value":{"doubleValue":0.5}}],
	"status":{"code":1}}]}]}]}`, start, end)
	code, resp, _ := post(t, r, "application/json", "key-ingest", "", []byte(body))
	if code != http.StatusOK {
		t.Fatalf("got %d %s", code, resp)
	}
	// 9007199254740993 (2^53+1) is over the token limit: rejected by
	// validation, but read exactly (a float64 would have made it ...992).
	var er coltracepb.ExportTraceServiceResponse
	decode(t, "application/json", resp, &er)
	if msg := er.GetPartialSuccess().GetErrorMessage(); !strings.Contains(msg, "9007199254740993") {
		t.Errorf("partial success %q: want the exact token count", msg)
	}
	code, resp, _ = post(t, r, "application/json", "key-ingest", "", []byte(strings.Replace(body, `"9007199254740993"`, `"12"`, 1)))
	if code != http.StatusOK {
		t.Fatalf("got %d %s", code, resp)
	}
	got := pub.got()
	if len(got) != 1 || got[0].GetEventId() != wantID || got[0].GetPromptTokens() != 12 || got[0].GetOutputTokens() != 7 {
		t.Errorf("got %v, want one event %s with 12 and 7 tokens", got, wantID)
	}
}

// otlpJSONIDs rewrites the base64 ids of protojson output to hex, as OTLP
// JSON writes them.
func otlpJSONIDs(t testing.TB, b []byte) []byte {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := protojson.Unmarshal(b, &req); err != nil {
		return b // not a request: leave it
	}
	out := string(b)
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				for _, id := range [][]byte{sp.GetTraceId(), sp.GetSpanId()} {
					m, _ := protojson.Marshal(&commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: id}})
					b64 := strings.TrimSuffix(strings.TrimPrefix(string(m), `{"bytesValue":"`), `"}`)
					out = strings.ReplaceAll(out, `"`+b64+`"`, fmt.Sprintf(`"%x"`, id))
				}
			}
		}
	}
	return []byte(out)
}

// TestAuth: both receivers take the keys of PublishEvents (ingest, admin)
// and refuse others.
func TestAuth(t *testing.T) {
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{})
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := coltracepb.NewTraceServiceClient(conn)
	now := time.Now()
	sp := chatSpan()
	sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
	req := request(nil, sp)
	body := encode(t, "application/x-protobuf", req)
	tests := []struct {
		key      string
		wantHTTP int
		wantGRPC codes.Code
	}{
		{"", http.StatusUnauthorized, codes.Unauthenticated},
		{"key-unknown", http.StatusUnauthorized, codes.Unauthenticated},
		{"key-finance", http.StatusForbidden, codes.PermissionDenied},
		{"key-tenant", http.StatusForbidden, codes.PermissionDenied},
		{"key-ingest", http.StatusOK, codes.OK},
		{"key-admin", http.StatusOK, codes.OK},
		{"key-ingest-acme", http.StatusOK, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			code, b, _ := post(t, r, "application/x-protobuf", tc.key, "", body)
			if code != tc.wantHTTP {
				t.Errorf("HTTP: got %d %q, want %d", code, b, tc.wantHTTP)
			}
			ctx := context.Background()
			if tc.key != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.key)
			}
			_, err := client.Export(ctx, req)
			if got := status.Code(err); got != tc.wantGRPC {
				t.Errorf("gRPC: got %v (%v), want %v", got, err, tc.wantGRPC)
			}
		})
	}
	if got, want := len(pub.got()), 6; got != want {
		t.Errorf("published %d events, want %d (3 keys, 2 receivers)", got, want)
	}
}

// TestUnavailable: when Kafka does not take the events, OTLP/HTTP answers
// 503 with Retry-After and OTLP/gRPC Unavailable, both retryable.
func TestUnavailable(t *testing.T) {
	pub := &recorder{down: true}
	r := startReceiver(t, pub, otlp.Config{})
	spans := sdkSpans(t, 1, acmeResource())
	exps := exporters(t, r, "key-ingest")
	if err := exps["grpc"].ExportSpans(context.Background(), spans); status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC: got %v, want Unavailable", err)
	}
	now := time.Now()
	sp := chatSpan()
	sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
	code, body, h := post(t, r, "application/x-protobuf", "key-ingest", "", encode(t, "application/x-protobuf", request(nil, sp)))
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Errorf("HTTP: got %d %q (Retry-After %q), want 503 with Retry-After", code, body, h.Get("Retry-After"))
	}
}

// TestGRPCMessageTooLarge: gRPC refuses a message over the limit.
func TestGRPCMessageTooLarge(t *testing.T) {
	r := startReceiver(t, &recorder{}, otlp.Config{MaxRequestBytes: 4 << 10})
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sp := chatSpan(str("big", strings.Repeat("x", 8<<10)))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer key-ingest")
	_, err = coltracepb.NewTraceServiceClient(conn).Export(ctx, request(nil, sp))
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Errorf("got %v, want ResourceExhausted", err)
	}
}

// rawCodec sends bytes as they are, to send gRPC messages that do not
// decode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// TestMalformedGRPC: a gRPC message that is not an export request is
// InvalidArgument, with nothing published; a good one sent the same way
// goes through.
func TestMalformedGRPC(t *testing.T) {
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{})
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer key-ingest")
	now := time.Now()
	sp := chatSpan()
	sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
	good := encode(t, "application/x-protobuf", request(nil, sp))
	for _, tc := range []struct {
		name string
		msg  []byte
		want codes.Code
	}{
		{"not protobuf", []byte("\xff\xff\xff"), codes.InvalidArgument},
		{"truncated", good[:len(good)-5], codes.InvalidArgument},
		{"good", good, codes.OK},
	} {
		var out []byte
		err := conn.Invoke(ctx, coltracepb.TraceService_Export_FullMethodName, &tc.msg, &out, grpc.ForceCodecV2(rawCodec{}))
		if got := status.Code(err); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := len(pub.got()); got != 1 {
		t.Errorf("published %d events, want 1", got)
	}
}
