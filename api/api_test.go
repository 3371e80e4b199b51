package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// TestMain runs the tests on a shared ClickHouse, recording the fields of
// the answers; a run of every test fails if a response field was never set
// (answerfields_test.go).
func TestMain(m *testing.M) {
	fields := recordAnswerFields()
	code := chtest.Run(m)
	if c := fields.check(os.Stderr); code == 0 {
		code = c
	}
	os.Exit(code)
}

// keys of every role; the tenant key belongs to tenant "acme".
var testKeys = map[string]string{
	"ingest": "key-ingest", "tenant": "key-tenant-acme", "finance": "key-finance", "admin": "key-admin",
}

// testKeySet is the key set of testKeys; the tenant key reads tenant "acme".
func testKeySet(t testing.TB) *api.Keys {
	t.Helper()
	var kf api.KeysFile
	for role, key := range testKeys {
		e := api.KeyEntry{Name: role, SHA256: api.HashKey(key), Role: api.Role(role)}
		if role == "tenant" {
			e.TenantID = "acme"
		}
		kf.Keys = append(kf.Keys, e)
	}
	keys, err := api.NewKeys(kf)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

type stack struct {
	server *api.Server
	store  *chstore.Store
	gconn  *grpc.ClientConn
}

// newStack runs the whole path: API → Kafka (kfake) → consumer → ClickHouse.
// brokerDown points the publisher at a closed port instead.
func newStack(t *testing.T, brokerDown bool) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEventsTopic, ingest.DefaultDLQTopic}})
	if err != nil {
		t.Fatal(err)
	}
	addr, db := chtest.NewDB(t)
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, logger)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pubBrokers := []string{broker.Addr()}
	if brokerDown {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		pubBrokers = []string{ln.Addr().String()}
		ln.Close()
	}
	pub, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: pubBrokers, WriteTimeout: 3 * time.Second}, reg, logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	reads := query.New(store, query.Config{})
	consumer, err := ingest.NewConsumer(ingest.ConsumerConfig{Brokers: []string{broker.Addr()}, BatchTimeout: 100 * time.Millisecond}, store, reg, logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	keys := testKeySet(t)
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MaxBatchEvents: 100, MaxRequestBytes: 1 << 20},
		&api.Services{Keys: keys, Publisher: pub, Usage: reads, Rollups: reads, Cost: reads, Prices: store, Admin: store, Reports: reads, Engine: reads}, store.Ping, reg, logger)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { srv.Run(ctx); done <- struct{}{} }()
	go func() { consumer.Run(ctx); done <- struct{}{} }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		<-done
		<-done
		pub.Close()
		store.Close()
		broker.Close()
	})
	return &stack{server: srv, store: store, gconn: conn}
}

func (s *stack) rest(t *testing.T, method, path, key string, body []byte) (int, []byte) {
	t.Helper()
	return restTo(t, s.server, method, path, key, string(body))
}

func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

var now = time.Now().UTC().Truncate(time.Second)

func ev(i int, tenant string) *meterv1.InferenceEvent {
	return &meterv1.InferenceEvent{
		EventId: fmt.Sprintf("%s-%d", tenant, i), TenantId: tenant, Model: "m", Deployment: "d",
		CompletedAt:  timestamppb.New(now.Add(-time.Duration(i) * time.Second)),
		PromptTokens: proto.Int64(int64(10 + i)), OutputTokens: proto.Int64(int64(i + 1)),
		CachedPromptTokens: proto.Int64(int64(i % 10)),
		TtftMs:             proto.Float64(10), E2EMs: proto.Float64(20),
	}
}

func eventsJSON(t *testing.T, events ...*meterv1.InferenceEvent) []byte {
	t.Helper()
	b, err := protojson.Marshal(&meterv1.PublishEventsRequest{Events: events})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func usagePath(tenant string) string {
	v := url.Values{"start": {now.Add(-time.Hour).Format(time.RFC3339)}, "end": {now.Add(time.Hour).Format(time.RFC3339)}}
	if tenant != "" {
		v.Set("tenant_id", tenant)
	}
	v.Set("group_by", "tenant_id")
	return "/v1/usage?" + v.Encode()
}

func TestAuthMatrix(t *testing.T) {
	s := newStack(t, false)
	ingestC := meterv1.NewIngestServiceClient(s.gconn)
	usageC := meterv1.NewUsageServiceClient(s.gconn)
	type call struct {
		name string
		rest func(key string) int
		grpc func(key string) codes.Code
	}
	publish := call{"publish",
		func(key string) int {
			code, _ := s.rest(t, "POST", "/v1/events", key, eventsJSON(t, ev(1, "acme")))
			return code
		},
		func(key string) codes.Code {
			_, err := ingestC.PublishEvents(withKey(key), &meterv1.PublishEventsRequest{Events: []*meterv1.InferenceEvent{ev(1, "acme")}})
			return status.Code(err)
		}}
	usage := func(tenant string) call {
		return call{"usage " + tenant,
			func(key string) int {
				code, _ := s.rest(t, "GET", usagePath(tenant), key, nil)
				return code
			},
			func(key string) codes.Code {
				_, err := usageC.GetUsage(withKey(key), &meterv1.GetUsageRequest{TenantId: tenant,
					Start: timestamppb.New(now.Add(-time.Hour)), End: timestamppb.New(now.Add(time.Hour))})
				return status.Code(err)
			}}
	}
	tests := []struct {
		key  string
		c    call
		want codes.Code
	}{
		{"", publish, codes.Unauthenticated},
		{"wrong", publish, codes.Unauthenticated},
		{testKeys["ingest"], publish, codes.OK},
		{testKeys["admin"], publish, codes.OK},
		{testKeys["tenant"], publish, codes.PermissionDenied},
		{testKeys["finance"], publish, codes.PermissionDenied},
		{"", usage(""), codes.Unauthenticated},
		{"wrong", usage("acme"), codes.Unauthenticated},
		{testKeys["ingest"], usage("acme"), codes.PermissionDenied},
		{testKeys["tenant"], usage(""), codes.OK},
		{testKeys["tenant"], usage("acme"), codes.OK},
		{testKeys["tenant"], usage("globex"), codes.PermissionDenied},
		{testKeys["finance"], usage(""), codes.OK},
		{testKeys["finance"], usage("globex"), codes.OK},
		{testKeys["admin"], usage("globex"), codes.OK},
	}
	httpCode := map[codes.Code]int{codes.OK: 200, codes.Unauthenticated: 401, codes.PermissionDenied: 403}
	for _, tt := range tests {
		role := "none"
		for r, k := range testKeys {
			if k == tt.key {
				role = r
			}
		}
		t.Run(fmt.Sprintf("%s/%s", role, tt.c.name), func(t *testing.T) {
			if got := tt.c.grpc(tt.key); got != tt.want {
				t.Errorf("gRPC: got %s, want %s", got, tt.want)
			}
			if got := tt.c.rest(tt.key); got != httpCode[tt.want] {
				t.Errorf("REST: got %d, want %d", got, httpCode[tt.want])
			}
		})
	}
}

func TestPublishAndQueryExact(t *testing.T) {
	s := newStack(t, false)
	// REST: a batch with valid and invalid events.
	bad := ev(0, "acme")
	bad.TtftMs = proto.Float64(50) // > e2e
	missing := ev(0, "acme")
	missing.EventId = ""
	huge := ev(0, "acme")
	huge.EventId = "huge"
	huge.RequestId = strings.Repeat("r", 70_000)
	batch := []*meterv1.InferenceEvent{ev(1, "acme"), bad, ev(2, "acme"), missing, ev(3, "globex"), huge}
	code, body := s.rest(t, "POST", "/v1/events", testKeys["ingest"], eventsJSON(t, batch...))
	if code != 200 {
		t.Fatalf("publish: %d %s", code, body)
	}
	var resp struct {
		Accepted string `json:"accepted"`
		Rejected []struct {
			Index   int    `json:"index"`
			EventID string `json:"event_id"`
			Reason  string `json:"reason"`
		} `json:"rejected"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if resp.Accepted != "3" || len(resp.Rejected) != 3 || resp.Rejected[0].Index != 1 || resp.Rejected[0].EventID != "acme-0" ||
		!strings.Contains(resp.Rejected[0].Reason, "ttft_ms") || resp.Rejected[1].Index != 3 || !strings.Contains(resp.Rejected[1].Reason, "event_id is required") ||
		resp.Rejected[2].Index != 5 || resp.Rejected[2].EventID != "huge" || !strings.Contains(resp.Rejected[2].Reason, "limit is 65536") {
		t.Fatalf("publish response: %s", body)
	}
	// gRPC: more events, and a retry of two events already sent.
	var grpcBatch []*meterv1.InferenceEvent
	for i := 4; i < 40; i++ {
		grpcBatch = append(grpcBatch, ev(i, []string{"acme", "globex"}[i%2]))
	}
	grpcBatch = append(grpcBatch, ev(1, "acme"), ev(3, "globex"))
	gresp, err := meterv1.NewIngestServiceClient(s.gconn).PublishEvents(withKey(testKeys["ingest"]), &meterv1.PublishEventsRequest{Events: grpcBatch})
	if err != nil || gresp.GetAccepted() != int64(len(grpcBatch)) {
		t.Fatalf("gRPC publish: %v %v", gresp, err)
	}

	want := map[string]*meterv1.UsageBucket{}
	seen := map[string]bool{}
	for _, e := range append([]*meterv1.InferenceEvent{ev(1, "acme"), ev(2, "acme"), ev(3, "globex")}, grpcBatch...) {
		if seen[e.GetEventId()] {
			continue
		}
		seen[e.GetEventId()] = true
		b := want[e.GetTenantId()]
		if b == nil {
			b = &meterv1.UsageBucket{Start: timestamppb.New(now.Add(-time.Hour)), TenantId: e.GetTenantId()}
			want[e.GetTenantId()] = b
		}
		b.Requests++
		b.PromptTokens += e.GetPromptTokens()
		b.CachedPromptTokens += e.GetCachedPromptTokens()
		b.OutputTokens += e.GetOutputTokens()
	}
	wantResp := &meterv1.GetUsageResponse{Buckets: []*meterv1.UsageBucket{want["acme"], want["globex"]}}

	usageC := meterv1.NewUsageServiceClient(s.gconn)
	req := &meterv1.GetUsageRequest{Start: timestamppb.New(now.Add(-time.Hour)), End: timestamppb.New(now.Add(time.Hour)), GroupBy: []string{"tenant_id"}}
	var got *meterv1.GetUsageResponse
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got, err = usageC.GetUsage(withKey(testKeys["finance"]), req)
		if err == nil && proto.Equal(got, wantResp) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if diff := cmp.Diff(wantResp, got, protocmp.Transform()); diff != "" {
		t.Fatalf("gRPC usage (-want +got):\n%s", diff)
	}
	// REST answers the same numbers.
	code, body = s.rest(t, "GET", usagePath(""), testKeys["finance"], nil)
	if code != 200 {
		t.Fatalf("REST usage: %d %s", code, body)
	}
	var restResp meterv1.GetUsageResponse
	if err := protojson.Unmarshal(body, &restResp); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantResp, &restResp, protocmp.Transform()); diff != "" {
		t.Fatalf("REST usage (-want +got):\n%s", diff)
	}
	// A tenant key asking for nothing sees only its own tenant.
	code, body = s.rest(t, "GET", usagePath(""), testKeys["tenant"], nil)
	if err := protojson.Unmarshal(body, &restResp); err != nil || code != 200 {
		t.Fatalf("tenant usage: %d %s", code, body)
	}
	if diff := cmp.Diff(&meterv1.GetUsageResponse{Buckets: []*meterv1.UsageBucket{want["acme"]}}, &restResp, protocmp.Transform()); diff != "" {
		t.Fatalf("tenant usage (-want +got):\n%s", diff)
	}
	// Grouped by deployment: one bucket, of every request.
	byDep, err := usageC.GetUsage(withKey(testKeys["finance"]), &meterv1.GetUsageRequest{Start: req.GetStart(), End: req.GetEnd(), GroupBy: []string{"deployment"}})
	if err != nil || len(byDep.GetBuckets()) != 1 || byDep.GetBuckets()[0].GetDeployment() != "d" ||
		byDep.GetBuckets()[0].GetRequests() != want["acme"].GetRequests()+want["globex"].GetRequests() {
		t.Errorf("usage by deployment: %v, %v; want one bucket of deployment d with every request", byDep, err)
	}
}

func TestRequestErrors(t *testing.T) {
	s := newStack(t, false)
	var many []*meterv1.InferenceEvent
	for i := range 101 {
		many = append(many, ev(i, "acme"))
	}
	tests := []struct {
		name     string
		method   string
		path     string
		body     []byte
		wantCode int
		wantMsg  string
	}{
		{"batch too long", "POST", "/v1/events", eventsJSON(t, many...), 400, "limit is 100"},
		{"body too large", "POST", "/v1/events", bytes.Repeat([]byte(" "), 2<<20), 413, "limit"},
		{"malformed json", "POST", "/v1/events", []byte(`{"events":[{"event_id":`), 400, ""},
		{"bad granularity", "GET", "/v1/usage?start=2026-01-01T00:00:00Z&end=2026-01-02T00:00:00Z&granularity=week", nil, 400, "granularity"},
		{"unknown group_by", "GET", "/v1/usage?start=2026-01-01T00:00:00Z&end=2026-01-02T00:00:00Z&group_by=color", nil, 400, "color"},
		{"end before start", "GET", "/v1/usage?start=2026-01-02T00:00:00Z&end=2026-01-01T00:00:00Z", nil, 400, "after start"},
		{"missing range", "GET", "/v1/usage", nil, 400, "required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := s.rest(t, tt.method, tt.path, testKeys["admin"], tt.body)
			if code != tt.wantCode || !strings.Contains(string(body), tt.wantMsg) {
				t.Errorf("got %d %s, want %d mentioning %q", code, body, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func TestBrokerDownIsUnavailable(t *testing.T) {
	s := newStack(t, true)
	code, body := s.rest(t, "POST", "/v1/events", testKeys["ingest"], eventsJSON(t, ev(1, "acme"), ev(2, "acme")))
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "nothing of this batch was accepted") {
		t.Fatalf("got %d %s, want 503", code, body)
	}
	_, err := meterv1.NewIngestServiceClient(s.gconn).PublishEvents(withKey(testKeys["ingest"]), &meterv1.PublishEventsRequest{Events: []*meterv1.InferenceEvent{ev(1, "acme")}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC: got %v, want UNAVAILABLE", err)
	}
}

func TestOperationalEndpoints(t *testing.T) {
	s := newStack(t, false)
	for path, want := range map[string]string{
		"/healthz/live": "ok", "/healthz/ready": "ready", "/metrics": "meter_ingest_events_consumed_total",
	} {
		code, body := s.rest(t, "GET", path, "", nil)
		if code != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d %.200s", path, code, body)
		}
	}
}
