package api_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/api"
	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// publishRecorder accepts every event and keeps them.
type publishRecorder struct {
	mu  sync.Mutex
	got []*meterv1.InferenceEvent
}

func (p *publishRecorder) Publish(_ context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, events...)
	return len(events), nil, nil
}

// TestIngestKeyBoundToTenant: an ingest key with a tenant_id publishes
// that tenant's events only; the others are rejected with their request
// index (over REST too), the rest go through. A key without a tenant
// publishes for any.
func TestIngestKeyBoundToTenant(t *testing.T) {
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "acme-gateway", SHA256: api.HashKey("key-acme-gw"), Role: api.RoleIngest, TenantID: "acme"},
		{Name: "gateway", SHA256: api.HashKey("key-gw"), Role: api.RoleIngest},
	}})
	if err != nil {
		t.Fatal(err)
	}
	pub := &publishRecorder{}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, &api.Services{Keys: keys, Publisher: pub},
		func(context.Context) error { return nil }, prometheus.NewRegistry(), logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	body := eventsJSON(t, ev(1, "acme"), ev(2, "globex"), ev(3, "acme"), ev(4, "initech"))
	code, out := restTo(t, srv, "POST", "/v1/events", "key-acme-gw", string(body))
	var resp meterv1.PublishEventsResponse
	if code != 200 || protojson.Unmarshal(out, &resp) != nil {
		t.Fatalf("POST /v1/events: %d %s", code, out)
	}
	if resp.GetAccepted() != 2 || len(resp.GetRejected()) != 2 || resp.GetRejected()[0].GetIndex() != 1 || resp.GetRejected()[1].GetIndex() != 3 {
		t.Fatalf("got %v; want 2 accepted, events 1 and 3 rejected", &resp)
	}
	for _, e := range pub.got {
		if e.GetTenantId() != "acme" {
			t.Errorf("published an event of %s with acme's key", e.GetTenantId())
		}
	}
	if code, out := restTo(t, srv, "POST", "/v1/events", "key-gw", string(body)); code != 200 || len(pub.got) != 6 {
		t.Fatalf("a key without tenant: %d %s, %d published; want every event", code, out, len(pub.got))
	}
}
