package otlp_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"tokenmeter/ingest/otlp"
)

// TestConvertJSONMatchesConvert: the OTLP JSON reader and protojson +
// Convert give the same batch, whatever the field names (JSON or proto)
// and wherever the resource comes in its ResourceSpans.
func TestConvertJSONMatchesConvert(t *testing.T) {
	for i, req := range wireSeeds() {
		texts := map[string][]byte{}
		for name, opts := range map[string]protojson.MarshalOptions{"json names": {}, "proto names": {UseProtoNames: true}} {
			b, err := opts.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			texts[name] = otlpJSONIDs(t, b)
		}
		// The resource last: its spans are read after it.
		if len(req.GetResourceSpans()) == 1 {
			rs := req.GetResourceSpans()[0]
			res, err := protojson.Marshal(rs.GetResource())
			if err != nil {
				t.Fatal(err)
			}
			var scopes [][]byte
			for _, ss := range rs.GetScopeSpans() {
				b, err := protojson.Marshal(ss)
				if err != nil {
					t.Fatal(err)
				}
				scopes = append(scopes, otlpJSONIDs(t, fmt.Appendf(nil, `{"resourceSpans":[{"scopeSpans":[%s]}]}`, b)))
			}
			var inner []string
			for _, s := range scopes {
				s = bytes.TrimPrefix(s, []byte(`{"resourceSpans":[{"scopeSpans":[`))
				inner = append(inner, string(bytes.TrimSuffix(s, []byte(`]}]}`))))
			}
			texts["resource last"] = fmt.Appendf(nil, `{"resourceSpans":[{"scopeSpans":[%s],"schemaUrl":"x","resource":%s}]}`, strings.Join(inner, ","), res)
		}
		for name, data := range texts {
			for _, keyTenant := range []string{"", "acme"} {
				for _, m := range []otlp.Mapping{{}, {TTFTFromE2E: true, TenantAttribute: "service.name"}} {
					want := m.Convert(req, keyTenant)
					got, err := m.ConvertJSON(data, keyTenant)
					if err != nil {
						t.Fatalf("request %d (%s): %v\n%s", i, name, err, data)
					}
					if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
						t.Errorf("request %d (%s), key tenant %q, %+v (-Convert +ConvertJSON):\n%s", i, name, keyTenant, m, diff)
					}
				}
			}
		}
	}
}

// TestConvertJSONMalformed: what is not an OTLP JSON export is an error.
func TestConvertJSONMalformed(t *testing.T) {
	for _, bad := range []string{
		``, `[]`, `null`, `{"resourceSpans":7}`, `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}`,
		`{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":"soon"}]}]}]}`,
		`{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":true}}]}]}]}]}`,
		`{"resourceSpans":[{"scopeSpans":[{"spans":[{"status":{"code":"BAD"}}]}]}]}`,
		`{"resourceSpans":[]} {}`, `{"resourceSpans":[{"scopeSpans":[{"spans":[{}`,
	} {
		if _, err := (otlp.Mapping{}).ConvertJSON([]byte(bad), ""); err == nil {
			t.Errorf("%s: got no error", bad)
		}
	}
}

// emptySpans is an export request of n empty spans in the encoding of ct:
// the cheapest spans to send, and once the costliest per byte to decode.
func emptySpans(ct string, n int) []byte {
	if ct == "application/json" {
		return []byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[` + strings.TrimSuffix(strings.Repeat("{},", n), ",") + `]}]}]}`)
	}
	spans := bytes.Repeat([]byte{0x12, 0x00}, n) // ScopeSpans.spans, empty
	var b []byte
	b = append(b, 0x12) // ResourceSpans.scope_spans
	b = appendLen(b, len(spans))
	scope := append(b, spans...)
	b = []byte{0x0a} // ExportTraceServiceRequest.resource_spans
	b = appendLen(b, len(scope))
	return append(b, scope...)
}

func appendLen(b []byte, n int) []byte {
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// allocated is the memory the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestSpanLimit: an export of more spans than MaxSpans is refused (HTTP
// 400 with a google.rpc.Status, gRPC InvalidArgument) on every path; one
// of MaxSpans goes through.
func TestSpanLimit(t *testing.T) {
	const limit = 10
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{MaxSpans: limit})
	now := time.Now()
	export := func(n int) *coltracepb.ExportTraceServiceRequest {
		var spans []*tracepb.Span
		for i := range n {
			sp := chatSpan()
			sp.SpanId = []byte{1, 2, 3, 4, 5, 6, byte(n), byte(i + 1)}
			sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
			spans = append(spans, sp)
		}
		return request(nil, spans...)
	}
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer key-ingest")
	for _, n := range []int{limit, limit + 1} {
		for _, ct := range []string{"application/x-protobuf", "application/json"} {
			code, body, _ := post(t, r, ct, "key-ingest", "", encode(t, ct, export(n)))
			if n == limit {
				if code != http.StatusOK {
					t.Errorf("%s, %d spans: got %d %s, want 200", ct, n, code, body)
				}
				continue
			}
			var st spb.Status
			decode(t, ct, body, &st)
			if code != http.StatusBadRequest || !strings.Contains(st.GetMessage(), "more than 10 spans") {
				t.Errorf("%s, %d spans: got %d %v, want 400 naming the limit", ct, n, code, &st)
			}
		}
		_, err := coltracepb.NewTraceServiceClient(conn).Export(ctx, export(n))
		if n == limit && err != nil {
			t.Errorf("gRPC, %d spans: %v", n, err)
		}
		if n > limit && (status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "more than 10 spans")) {
			t.Errorf("gRPC, %d spans: got %v, want InvalidArgument naming the limit", n, err)
		}
	}
	if got := len(pub.got()); got != 3*limit {
		t.Errorf("published %d events, want %d (the exports within the limit)", got, 3*limit)
	}
}

// TestEmptySpansBomb: a body of a million empty spans (3 MB of JSON) is
// refused at the default span limit, having cost a small multiple of its
// bytes: the JSON path once decoded it whole into maps (hundreds of bytes
// per byte) and accepted it; the protobuf paths accepted it too.
func TestEmptySpansBomb(t *testing.T) {
	const spans = 1_000_000
	r := startReceiver(t, &recorder{}, otlp.Config{})
	for _, ct := range []string{"application/json", "application/x-protobuf"} {
		t.Run(ct, func(t *testing.T) {
			body := emptySpans(ct, spans)
			var code int
			var answer []byte
			n := allocated(func() { code, answer, _ = post(t, r, ct, "key-ingest", "", body) })
			t.Logf("%d-byte body: %d bytes allocated", len(body), n)
			if code != http.StatusBadRequest {
				t.Errorf("got %d %q, want 400", code, answer)
			}
			if limit := uint64(16 * len(body)); n > limit {
				t.Errorf("a %d-byte body of %d spans allocated %d bytes (%d per byte), want at most %d", len(body), spans, n, n/uint64(len(body)), limit)
			}
		})
	}
	t.Run("grpc", func(t *testing.T) {
		conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		msg := emptySpans("application/x-protobuf", spans)
		var out []byte
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer key-ingest")
		err = conn.Invoke(ctx, coltracepb.TraceService_Export_FullMethodName, &msg, &out, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("got %v, want InvalidArgument", err)
		}
	})
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	tooLarge := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if mf.GetName() == "meter_otlp_exports_total" && lp.GetName() == "answer" && lp.GetValue() == "too_large" {
					tooLarge += m.GetCounter().GetValue()
				}
			}
		}
	}
	if tooLarge != 3 {
		t.Errorf(`meter_otlp_exports_total{answer="too_large"}: got %v, want 3 (HTTP JSON and protobuf, gRPC)`, tooLarge)
	}
}

// slowExport starts an OTLP/HTTP export whose body arrives in part and then
// stops, as from a client that sends a byte now and then: its body is
// never complete until the test ends. The export's error is sent on done.
func slowExport(t *testing.T, r receiver, first []byte) (done <-chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	ch := make(chan error, 1)
	req, err := http.NewRequest(http.MethodPost, "http://"+r.HTTPAddr()+otlp.TracesPath, pr) // chunked: no length declared
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer key-ingest")
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		ch <- err
	}()
	if _, err := pw.Write(first); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF); <-ch })
	return ch
}

// waitBuffered waits until the receiver's bodies hold at least n bytes,
// that is until the slow exports' first bytes have reached it.
func waitBuffered(t *testing.T, r receiver, n float64) {
	t.Helper()
	g := counterGauge(r, "meter_otlp_http_buffered_bytes")
	for deadline := time.Now().Add(20 * time.Second); testutil.ToFloat64(g) < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the bodies hold %v bytes, want %v: the slow exports never reached the receiver", testutil.ToFloat64(g), n)
		}
	}
}

// TestSlowBodiesHoldNoSlot: exports whose bodies arrive slowly, more of
// them than there are conversion slots, do not delay another export: a
// slot is taken only once a body is whole. (Slots were taken before the
// body was read: 16 clients sending a byte a second held all 16 until the
// read timeout, and every other export waited.)
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{MaxInFlight: 2})
	now := time.Now()
	sp := chatSpan()
	sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
	body, err := proto.Marshal(request(nil, sp))
	if err != nil {
		t.Fatal(err)
	}
	var slow []<-chan error
	for range 3 {
		slow = append(slow, slowExport(t, r, body[:5]))
	}
	waitBuffered(t, r, 2*16<<10) // at least as many bodies as slots are being read
	// A generous bound, for a loaded machine: the export does not wait on
	// the slow ones, which never finish.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.HTTPAddr()+otlp.TracesPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer key-ingest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("an export behind %d slow ones: %v", len(slow), err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(pub.got()) != 1 {
		t.Fatalf("got HTTP %d and %d events, want 200 and 1", resp.StatusCode, len(pub.got()))
	}
	for _, done := range slow {
		select {
		case err := <-done:
			t.Errorf("a slow export ended early: %v", err)
		default:
		}
	}
}

// TestBufferedBytesBounded: the bodies of the exports in progress hold at
// most MaxBufferedBytes. An export that would pass it is answered 503 with
// Retry-After (exporters retry) rather than waiting; once the bodies
// ahead of it are gone, it goes through.
func TestBufferedBytesBounded(t *testing.T) {
	pub := &recorder{}
	r := startReceiver(t, pub, otlp.Config{MaxBufferedBytes: 64 << 10})
	now := time.Now()
	sp := chatSpan(str("padding", strings.Repeat("x", 40<<10)))
	sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(now.Add(-time.Second).UnixNano()), uint64(now.UnixNano())
	body, err := proto.Marshal(request(nil, sp))
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	held := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.HTTPAddr()+otlp.TracesPath, pr)
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Authorization", "Bearer key-ingest")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	pw.Write(body[:32<<10]) // 32 KiB arrived: its buffer holds 32 KiB
	waitBuffered(t, r, 32<<10)
	code, answer, h := post(t, r, "application/x-protobuf", "key-ingest", "", body) // needs 41 KiB more
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Fatalf("got %d %q (Retry-After %q), want 503 with Retry-After", code, answer, h.Get("Retry-After"))
	}
	pw.CloseWithError(io.ErrUnexpectedEOF) // the client holding them gives up
	<-held
	waitReleased(t, r)
	if code, answer, _ = post(t, r, "application/x-protobuf", "key-ingest", "", body); code != http.StatusOK {
		t.Fatalf("after the bodies ahead were gone: got %d %q, want 200", code, answer)
	}
	if got := testutil.ToFloat64(counter(r.reg, "meter_otlp_exports_total", "answer", "busy")); got != 1 {
		t.Errorf(`meter_otlp_exports_total{answer="busy"}: got %v, want 1`, got)
	}
}

// waitReleased waits until no body holds any bytes.
func waitReleased(t *testing.T, r receiver) {
	t.Helper()
	g := counterGauge(r, "meter_otlp_http_buffered_bytes")
	for deadline := time.Now().Add(20 * time.Second); testutil.ToFloat64(g) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the bodies still hold %v bytes", testutil.ToFloat64(g))
		}
	}
}

// counterGauge reads a gauge without labels through Gather, as /metrics
// would show it.
func counterGauge(r receiver, name string) prometheus.Collector {
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := r.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.GaugeValue, mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
	})
}

// FuzzConvertJSON: the OTLP JSON reader never panics, and for any input
// protojson reads as an export request (with ids of valid hex), it gives
// Convert's batch.
func FuzzConvertJSON(f *testing.F) {
	for _, req := range wireSeeds()[:3] {
		b, err := protojson.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(otlpJSONIDs(f, b))
	}
	f.Add([]byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{}]}],"resource":{"attributes":[{"value":{"intValue":"7"},"key":"tenant.id"}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := otlp.Mapping{}.ConvertJSON(data, "k")
		if err != nil {
			return
		}
		// Ids in hex read as bytes by protojson only where there are none.
		if bytes.Contains(data, []byte("Id")) || bytes.Contains(data, []byte("_id")) || bytes.Contains(data, []byte(`\u`)) {
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if protojson.Unmarshal(data, &req) != nil {
			return // protojson checks what the reader skips
		}
		if diff := cmp.Diff(otlp.Mapping{}.Convert(&req, "k"), got, protocmp.Transform()); diff != "" {
			t.Errorf("(-protojson+Convert +ConvertJSON):\n%s", diff)
		}
	})
}
