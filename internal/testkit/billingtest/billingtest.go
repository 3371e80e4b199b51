// Package billingtest fills a test database with billable usage: events of
// two tenants on two models, GPU samples and a price book, rolled up and
// costed, and returns the billing service over it, for the tests of the
// packages that serve billing (api, meterctl).
package billingtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// Book prices models "m" and "m2" and the H100s of deployment "d".
const Book = `{"currency":"USD",
 "gpu_prices":[{"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"}],
 "token_prices":[
  {"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"},
  {"model":"m2","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"2.00","cached_input_per_1m":"1.00","output_per_1m":"6.00"}]}`

// Hour is the first of the two hours of usage, in October 2026: a period
// that has ended, with its grace delay passed.
var Hour = time.Date(2026, 10, 20, 10, 0, 0, 0, time.UTC)

// Period is the billing period of the usage.
const Period = "2026-10"

// Tenants are the tenants with usage.
var Tenants = []string{"acme", "globex"}

// New fills a new database with two hours from Hour of usage of Tenants on
// models "m" and "m2" (deployment "d"), one H100's GPU samples and Book,
// runs the rollup job once (which costs the usage and moves its watermark
// past the period), and returns the store and a billing service over it
// (UTC zones, the default grace, the real clock).
func New(t testing.TB) (*chstore.Store, *closing.Service) {
	t.Helper()
	ctx := t.Context()
	store := chstoretest.OpenMigrated(t)
	book, err := billing.ParsePriceBook([]byte(Book))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(ctx, store, book, "billingtest", time.Now()); err != nil {
		t.Fatal(err)
	}
	var events []*meterv1.InferenceEvent
	for i := range 120 {
		events = append(events, &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("e%d", i), TenantId: Tenants[i%2], Model: []string{"m", "m2"}[(i/2)%2], Deployment: "d",
			CompletedAt:  timestamppb.New(Hour.Add(time.Duration(i) * time.Minute)),
			PromptTokens: proto.Int64(int64(1000 + i)), CachedPromptTokens: proto.Int64(int64(i % 100)), OutputTokens: proto.Int64(int64(100 + i)),
			TtftMs: proto.Float64(10), E2EMs: proto.Float64(20),
		})
	}
	chstoretest.Insert(t, store, events)
	var gpus chstore.GPUBatch
	for k := range 720 {
		gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprint(k), GpuUuid: "GPU-1", GpuType: "H100", Deployment: "d",
			SampledAt: timestamppb.New(Hour.Add(time.Duration(k) * 10 * time.Second)), IntervalS: 10, Utilization: 0.5}, time.Now())
	}
	if err := store.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	RollUp(t, store)
	prices := func(ctx context.Context) (*billing.PriceBook, error) { return book, nil }
	svc, err := closing.NewService(closing.Deps{Reads: query.New(store, query.Config{}), Store: store, Prices: prices, Credits: store}, closing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return store, svc
}

// RollUp runs the rollup job once over everything inserted so far: usage
// rolled up and costed, the watermark past the inserts.
func RollUp(t testing.TB, store *chstore.Store) {
	t.Helper()
	// The rollup job takes the inserts of whole seconds before its run.
	time.Sleep(1100 * time.Millisecond)
	job, err := rollup.NewJob(rollup.Config{Settle: -time.Second}, store, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
}
