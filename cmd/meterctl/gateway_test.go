package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/api"
	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// validatingPublisher stands in for Kafka behind the real API: it applies
// ingest's validation and keeps the valid events.
type validatingPublisher struct {
	mu       sync.Mutex
	accepted map[string]*meterv1.InferenceEvent
}

func (p *validatingPublisher) Publish(_ context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rejected []ingest.Rejected
	n := 0
	for i, ev := range events {
		if err := ingest.DefaultLimits().Validate(ev, time.Now()); err != nil {
			var ve *ingest.ValidationError
			if !errors.As(err, &ve) {
				return 0, nil, err
			}
			rejected = append(rejected, ingest.Rejected{Index: i, EventID: ev.GetEventId(), Err: ve})
			continue
		}
		p.accepted[ev.GetEventId()] = ev
		n++
	}
	return n, rejected, nil
}

// fixedUsage answers every usage query with the same rows and records it.
type fixedUsage struct {
	mu    sync.Mutex
	query query.UsageQuery
	rows  []query.UsageRow
}

func (u *fixedUsage) Usage(_ context.Context, q query.UsageQuery) ([]query.UsageRow, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.query = q
	return u.rows, nil
}

// startAPI runs the real API server (grpc-gateway, auth, limits) over
// loopback with svc until the test ends, and returns its base URL.
func startAPI(t *testing.T, svc *api.Services) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MaxBatchEvents: 1000, MaxRequestBytes: 4 << 20},
		svc, func(context.Context) error { return nil }, nil, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return "http://" + srv.HTTPAddr()
}

// TestThroughGateway runs replay and usage against the real API server
// (grpc-gateway, auth, limits) with in-memory backends: it checks that the
// JSON meterctl writes and reads is what the gateway speaks.
func TestThroughGateway(t *testing.T) {
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "ingest", SHA256: hashKey("tm_ingest"), Role: api.RoleIngest},
		{Name: "finance", SHA256: hashKey("tm_finance"), Role: api.RoleFinance},
	}})
	if err != nil {
		t.Fatal(err)
	}
	pub := &validatingPublisher{accepted: map[string]*meterv1.InferenceEvent{}}
	day := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	usage := &fixedUsage{rows: []query.UsageRow{
		{Start: day, TenantID: "acme", Model: "m1", Requests: 10, Errors: 1, PromptTokens: 1000, CachedPromptTokens: 100, OutputTokens: 200},
		{Start: day, TenantID: "globex", Model: "m2", Requests: 5, PromptTokens: 500, OutputTokens: 50},
	}}
	addr := startAPI(t, &api.Services{Keys: keys, Publisher: pub, Usage: usage})

	const n = 3000
	out, _, err := runArgs(t, nil, "replay", "--addr", addr, "--key", "tm_ingest", "--synthetic", "3000", "--batch", "700")
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	accepted, rejected := summaryValue(t, out, "accepted"), summaryValue(t, out, "rejected")
	if accepted+rejected != n || rejected != 0 {
		t.Errorf("accepted %d, rejected %d, want all %d accepted:\n%s", accepted, rejected, n, out)
	}
	pub.mu.Lock()
	got := len(pub.accepted)
	pub.mu.Unlock()
	if got != n {
		t.Errorf("publisher holds %d events, want %d", got, n)
	}

	// A batch above the server's limit: 400, and replay stops.
	_, _, err = runArgs(t, nil, "replay", "--addr", addr, "--key", "tm_ingest", "--synthetic", "2000", "--batch", "1500")
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Errorf("batch above the limit: error %v, want 400", err)
	}
	// A finance key may not publish.
	_, _, err = runArgs(t, nil, "replay", "--addr", addr, "--key", "tm_finance", "--synthetic", "10")
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("finance key: error %v, want 403", err)
	}

	out, _, err = runArgs(t, nil, "usage", "--addr", addr, "--key", "tm_finance", "--output", "csv",
		"--start", "2026-11-21T00:00:00Z", "--end", "2026-11-22T00:00:00.5Z", "--granularity", "day", "--group-by", "tenant_id,model")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	want := `bucket_start,tenant_id,model,requests,errors,prompt_tokens,cached_prompt_tokens,output_tokens
2026-11-21T00:00:00Z,acme,m1,10,1,1000,100,200
2026-11-21T00:00:00Z,globex,m2,5,0,500,0,50
`
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("usage CSV (-want +got):\n%s", diff)
	}
	usage.mu.Lock()
	q := usage.query
	usage.mu.Unlock()
	wantQ := query.UsageQuery{Start: day, End: day.Add(24*time.Hour + 500*time.Millisecond), Granularity: "day", GroupBy: []string{"tenant_id", "model"}, TokenSizes: true}
	if diff := cmp.Diff(wantQ, q); diff != "" {
		t.Errorf("usage query (-want +got):\n%s", diff)
	}
}
