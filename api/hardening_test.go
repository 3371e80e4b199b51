package api_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"tokenmeter/api"
	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// recordingPublisher accepts every event it is given and remembers them.
type recordingPublisher struct {
	mu     sync.Mutex
	calls  int
	events []*meterv1.InferenceEvent
}

func (p *recordingPublisher) Publish(_ context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.events = append(p.events, events...)
	return len(events), nil, nil
}

// emptyUsage answers every usage query with no rows and remembers the last.
type emptyUsage struct {
	mu   sync.Mutex
	last query.UsageQuery
}

func (u *emptyUsage) Usage(_ context.Context, q query.UsageQuery) ([]query.UsageRow, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.last = q
	return nil, nil
}

// emptyRollups answers every rollup query with no rows and remembers the last.
type emptyRollups struct {
	mu   sync.Mutex
	last query.RollupQuery
}

func (e *emptyRollups) Rollups(_ context.Context, q query.RollupQuery) ([]query.RollupRow, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last = q
	return nil, nil
}

func (e *emptyRollups) RawLatency(context.Context, query.RollupQuery) ([]query.RawLatencyRow, error) {
	return nil, nil
}

func (e *emptyRollups) Traffic(context.Context, query.RollupQuery) ([]query.TrafficRow, error) {
	return nil, nil
}

// Stores whose methods must never be reached: the embedded nil interface
// panics if one is.
type (
	unreachableCost  struct{ api.CostReader }
	unreachableAdmin struct{ api.AdminStore }
)

// bareStores are the stores behind a bare server.
type bareStores struct {
	pub     *recordingPublisher
	usage   *emptyUsage
	rollups *emptyRollups
}

// newBareServer runs an api.Server without Kafka or ClickHouse: a recording
// publisher, empty usage, and stores that must not be reached.
func newBareServer(t testing.TB, cfg api.Config, ready func(context.Context) error) (*api.Server, *recordingPublisher) {
	srv, stores := newBareServerStores(t, cfg, ready)
	return srv, stores.pub
}

func newBareServerStores(t testing.TB, cfg api.Config, ready func(context.Context) error) (*api.Server, bareStores) {
	t.Helper()
	keys := testKeySet(t)
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	}
	if ready == nil {
		ready = func(context.Context) error { return nil }
	}
	stores := bareStores{pub: &recordingPublisher{}, usage: &emptyUsage{}, rollups: &emptyRollups{}}
	ctx, cancel := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := api.New(ctx, cfg, &api.Services{
		Keys: keys, Publisher: stores.pub, Usage: stores.usage,
		Rollups: stores.rollups, Cost: unreachableCost{}, Prices: unreachableAdmin{}, Admin: unreachableAdmin{},
	}, ready, prometheus.NewRegistry(), logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv, stores
}

// countingReader yields n bytes of filler and counts how many were read.
type countingReader struct {
	n, read int
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.read >= r.n {
		return 0, io.EOF
	}
	k := min(len(p), r.n-r.read)
	for i := range p[:k] {
		p[i] = ' '
	}
	r.read += k
	return k, nil
}

// A request without a valid key, or with a key whose role may not call the
// route, is refused before a byte of its body is read.
func TestRefusedBeforeBodyIsRead(t *testing.T) {
	srv, pub := newBareServer(t, api.Config{}, nil)
	h := srv.HTTPHandler()
	for _, tt := range []struct {
		name, key string
		want      int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"unknown key", "key-nobody", http.StatusUnauthorized},
		{"role may not publish", testKeys["finance"], http.StatusForbidden},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := &countingReader{n: 15 << 20}
			req := httptest.NewRequest(http.MethodPost, "/v1/events", body)
			req.ContentLength = -1 // as a chunked upload: nothing declares the size
			if tt.key != "" {
				req.Header.Set("Authorization", "Bearer "+tt.key)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("got %d %s, want %d", rec.Code, rec.Body, tt.want)
			}
			if body.read != 0 {
				t.Errorf("read %d bytes of the body, want 0", body.read)
			}
		})
	}
	if pub.calls != 0 {
		t.Errorf("publisher called %d times, want 0", pub.calls)
	}
}

// BenchmarkKeylessPost15MB is the cost of refusing a key-less 15 MB post.
func BenchmarkKeylessPost15MB(b *testing.B) {
	srv, _ := newBareServer(b, api.Config{}, nil)
	h := srv.HTTPHandler()
	b.ReportAllocs()
	for b.Loop() {
		body := &countingReader{n: 15 << 20}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/events", body))
		if rec.Code != http.StatusUnauthorized || body.read != 0 {
			b.Fatalf("got %d after reading %d bytes", rec.Code, body.read)
		}
	}
}

// A key-less gRPC call is refused before its message is decoded or handled.
func TestGRPCRefusedWithoutKey(t *testing.T) {
	srv, pub := newBareServer(t, api.Config{MaxRequestBytes: 32 << 20}, nil)
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(32<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	big := &meterv1.InferenceEvent{EventId: strings.Repeat("x", 15<<20)}
	_, err = meterv1.NewIngestServiceClient(conn).PublishEvents(context.Background(), &meterv1.PublishEventsRequest{Events: []*meterv1.InferenceEvent{big}})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("got %v, want UNAUTHENTICATED", err)
	}
	// A message that does not decode: refused as unauthenticated, so it was
	// never decoded (decoding first answers INTERNAL "error unmarshalling").
	err = conn.Invoke(context.Background(), meterv1.IngestService_PublishEvents_FullMethodName, garbage{}, &meterv1.PublishEventsResponse{},
		grpc.ForceCodecV2(garbageCodec{}))
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("undecodable message without a key: got %v, want UNAUTHENTICATED", err)
	}
	_, err = meterv1.NewIngestServiceClient(conn).PublishEvents(withKey(testKeys["tenant"]), &meterv1.PublishEventsRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("tenant key: got %v, want PERMISSION_DENIED", err)
	}
	if pub.calls != 0 {
		t.Errorf("publisher called %d times, want 0", pub.calls)
	}
}

// garbage is a request whose bytes are not protobuf.
type garbage struct{}

// garbageCodec sends garbage as bytes that no message decodes from.
type garbageCodec struct{}

func (garbageCodec) Marshal(any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer([]byte{0xff, 0xff, 0xff, 0xff})}, nil
}
func (garbageCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (garbageCodec) Name() string                         { return "proto" }

// A client that drips its request is disconnected after the read timeout.
func TestSlowDripIsDisconnected(t *testing.T) {
	srv, _ := newBareServer(t, api.Config{ReadTimeout: 500 * time.Millisecond}, nil)
	conn, err := net.Dial("tcp", srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100000\r\n\r\n", testKeys["ingest"])
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, conn)
		close(closed)
	}()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-closed:
			return
		case <-deadline:
			t.Fatal("slow-drip connection still open after 10 s with a 500 ms read timeout")
		case <-time.After(100 * time.Millisecond):
			conn.Write([]byte("{"))
		}
	}
}

// An event that does not decode is rejected on its own, with its index and
// reason; the rest of the batch is published.
func TestSchemaErrorRejectsOnlyItsEvent(t *testing.T) {
	srv, pub := newBareServer(t, api.Config{}, nil)
	valid := func(id string) string {
		return fmt.Sprintf(`{"event_id":%q,"tenant_id":"acme","model":"m","completed_at":"2026-01-01T00:00:00Z"}`, id)
	}
	body := `{"events":[` + strings.Join([]string{
		valid("a"),
		`{"event_id":"b","tenant_id":"acme","colour":"red"}`, // unknown field
		`{"eventId":"c","prompt_tokens":"many"}`,             // wrong type
		valid("d"),
		`{"event_id":"e","model":"m","model":"n"}`, // duplicate key
		`{"event_id":"f","status":"STATUS_BOGUS"}`, // unknown enum value
		valid("g"),
	}, ",") + `]}`
	code, resp := restTo(t, srv, "POST", "/v1/events", testKeys["ingest"], body)
	if code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", code, resp)
	}
	var got meterv1.PublishEventsResponse
	if err := protojson.Unmarshal(resp, &got); err != nil {
		t.Fatal(err)
	}
	if got.Accepted != 3 {
		t.Errorf("accepted %d, want 3", got.Accepted)
	}
	want := []struct {
		index   int32
		id, msg string
	}{{1, "b", "colour"}, {2, "c", "promptTokens"}, {4, "e", "model"}, {5, "f", "STATUS_BOGUS"}}
	if len(got.Rejected) != len(want) {
		t.Fatalf("rejected %v, want %d events", got.Rejected, len(want))
	}
	for i, w := range want {
		r := got.Rejected[i]
		if r.Index != w.index || r.EventId != w.id || !strings.Contains(r.Reason, w.msg) {
			t.Errorf("rejected[%d] = %v, want index %d, id %q, reason naming %q", i, r, w.index, w.id, w.msg)
		}
	}
	var ids []string
	for _, e := range pub.events {
		ids = append(ids, e.EventId)
	}
	if strings.Join(ids, ",") != "a,d,g" {
		t.Errorf("published %v, want a,d,g", ids)
	}
	// The envelope itself must still be well formed.
	for _, bad := range []string{`{"events":[`, `{"evnts":[]}`, `{"events":[],"events":[]}`, `[]`, `{"events":{}}`, `{"events":[]} x`} {
		if code, resp := restTo(t, srv, "POST", "/v1/events", testKeys["ingest"], bad); code != http.StatusBadRequest {
			t.Errorf("%s: got %d %s, want 400", bad, code, resp)
		}
	}
}

// Unknown query parameters are refused with 400, naming them; both field
// spellings of known ones are accepted.
func TestUnknownQueryParameters(t *testing.T) {
	srv, _ := newBareServer(t, api.Config{}, nil)
	const rng = "start=2026-01-01T00:00:00Z&end=2026-01-02T00:00:00Z"
	for _, tt := range []struct {
		path   string
		want   int
		naming string
	}{
		{"/v1/usage?" + rng + "&tenantid=globex", 400, `tenantid`},
		{"/v1/usage?" + rng + "&tenant_id=globex&granularity=hour&group_by=model", 200, ""},
		{"/v1/usage?" + rng + "&tenantId=globex&groupBy=model", 200, ""},
		{"/v1/latency?selector.start=2026-01-01T00:00:00Z&selector.tenantid=x&foo=1", 400, `\"foo\", \"selector.tenantid\"`},
		{"/v1/cost?" + rng + "&tenant=globex", 400, `\"tenant\"`},
		{"/v1/admin/price-book?version=3", 400, `\"version\"`},
	} {
		code, body := restTo(t, srv, "GET", tt.path, testKeys["admin"], "")
		if code != tt.want || !strings.Contains(string(body), tt.naming) {
			t.Errorf("%s: got %d %s, want %d naming %s", tt.path, code, body, tt.want, tt.naming)
		}
	}
}

// Times may be plain dates and must say what is wanted when they do not
// parse; the metrics routes take the plain parameter names; step and
// granularity are one parameter.
func TestQuerySpellings(t *testing.T) {
	srv, stores := newBareServerStores(t, api.Config{}, nil)
	day := func(d int) time.Time { return time.Date(2026, 11, d, 0, 0, 0, 0, time.UTC) }
	for _, tt := range []struct {
		path       string
		wantCode   int
		wantMsg    string
		start, end time.Time
		step       string
	}{
		{"/v1/latency?start=2026-11-23&end=2026-11-24&step=hour", 200, "", day(23), day(24), "hour"},
		{"/v1/latency?selector.start=2026-11-23T00:00:00Z&selector.end=2026-11-24&granularity=day", 200, "", day(23), day(24), "day"},
		{"/v1/usage?start=2026-11-22&end=2026-11-23T00:00:00%2B00:00&step=hour", 200, "", day(22), day(23), "hour"},
		{"/v1/usage?start=2026-11-22&end=2026-11-23&granularity=day", 200, "", day(22), day(23), "day"},
		{"/v1/usage?start=23/11/2026&end=2026-11-24", 400, "2026-11-23T00:00:00Z", time.Time{}, time.Time{}, ""},
		{"/v1/latency?start=2026-11-23T10:00&end=2026-11-24", 400, "want an RFC 3339 time", time.Time{}, time.Time{}, ""},
		{"/v1/latency?start=2026-11-23&selector.start=2026-11-23&end=2026-11-24", 400, "given twice", time.Time{}, time.Time{}, ""},
		{"/v1/usage?start=2026-11-22&end=2026-11-23&step=hour&granularity=day", 400, "given twice", time.Time{}, time.Time{}, ""},
	} {
		code, body := restTo(t, srv, "GET", tt.path, testKeys["admin"], "")
		if code != tt.wantCode || !strings.Contains(string(body), tt.wantMsg) || strings.Contains(string(body), "2006-01-02") {
			t.Errorf("%s: got %d %s, want %d mentioning %q", tt.path, code, body, tt.wantCode, tt.wantMsg)
			continue
		}
		if code != 200 {
			continue
		}
		var start, end time.Time
		var step string
		if strings.HasPrefix(tt.path, "/v1/usage") {
			start, end, step = stores.usage.last.Start, stores.usage.last.End, stores.usage.last.Granularity
		} else {
			start, end, step = stores.rollups.last.Start, stores.rollups.last.End, stores.rollups.last.Step
		}
		if !start.Equal(tt.start) || !end.Equal(tt.end) || step != tt.step {
			t.Errorf("%s: store got %s..%s step %q, want %s..%s step %q", tt.path, start, end, step, tt.start, tt.end, tt.step)
		}
	}
}

// Smaller ones: deep documents are 400 without internals, oversized chunked
// bodies 413, wrong methods 405, and readiness hides the reason.
func TestRequestEdges(t *testing.T) {
	secret := errors.New("dial tcp 10.9.8.7:9000: connect: connection refused")
	srv, _ := newBareServer(t, api.Config{MaxRequestBytes: 1 << 20}, func(context.Context) error { return secret })

	deep := strings.Repeat(`{"a":`, 9000) + "1" + strings.Repeat("}", 9000)
	code, body := restTo(t, srv, "PUT", "/v1/admin/slo-set", testKeys["admin"], deep)
	if code != http.StatusBadRequest || strings.Contains(strings.ToLower(string(body)), "grpc") {
		t.Errorf("deep document: got %d %s, want 400 without internals", code, body)
	}

	// A chunked body (no Content-Length) over the limit.
	req, _ := http.NewRequest("POST", "http://"+srv.HTTPAddr()+"/v1/events", io.MultiReader(strings.NewReader(`{"events":[`), &countingReader{n: 2 << 20}))
	req.Header.Set("Authorization", "Bearer "+testKeys["ingest"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || len(resp.TransferEncoding) != 0 && req.ContentLength > 0 {
		t.Errorf("chunked oversized body: got %d %s, want 413", resp.StatusCode, b)
	}

	code, body = restTo(t, srv, "GET", "/v1/events", testKeys["admin"], "")
	if code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/events: got %d %s, want 405", code, body)
	}
	req, _ = http.NewRequest("DELETE", "http://"+srv.HTTPAddr()+"/v1/admin/price-book", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, PUT" {
		t.Errorf("DELETE /v1/admin/price-book: got %d Allow %q, want 405 Allow \"GET, PUT\"", resp.StatusCode, resp.Header.Get("Allow"))
	}

	code, body = restTo(t, srv, "GET", "/healthz/ready", "", "")
	if code != http.StatusServiceUnavailable || strings.Contains(string(body), "10.9.8.7") {
		t.Errorf("ready: got %d %q, want 503 without the reason", code, body)
	}
}

// A deeply nested document sent over gRPC is refused, never a crash.
func TestDeepDocumentOverGRPC(t *testing.T) {
	srv, _ := newBareServer(t, api.Config{}, nil)
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	v := structpb.NewNumberValue(1)
	for range 6000 {
		v = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": v}})
	}
	_, err = meterv1.NewAdminServiceClient(conn).PutSloSet(withKey(testKeys["admin"]), &meterv1.PutSloSetRequest{Document: v.GetStructValue()})
	if err == nil {
		t.Fatal("a 6000-deep document was accepted")
	}
}

func restTo(t *testing.T, srv *api.Server, method, path, key, body string) (int, []byte) {
	t.Helper()
	resp, b := restCall(t, srv, method, path, key, body)
	return resp.StatusCode, b
}

// restCall sends a JSON request with key (none when "") and returns the
// response and as much of its body as could be read.
func restCall(t *testing.T, srv *api.Server, method, path, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+srv.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(bufio.NewReader(resp.Body)) // a cut answer is checked by its body
	return resp, b
}
