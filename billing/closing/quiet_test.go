package closing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// quietStore is the fixture's store on a server whose clock reads quiet
// later: a system on which nothing was inserted for that long since the
// rollup job's last run, which wrote its watermark then (an idle job
// rewrites it only once a minute).
type quietStore struct {
	*chstore.Store
	quiet time.Duration
}

func (s quietStore) ServerNow(ctx context.Context) (time.Time, error) {
	t, err := s.Store.ServerNow(ctx)
	return t.Add(s.quiet), err
}

// TestServiceClosesOnQuietSystem: a close on a system where nothing was
// inserted since the rollup job's last run succeeds at once, although the
// job's watermark is ten minutes behind the instant ingest caught up; an
// insert since the watermark, or a price book the job has not recosted
// with, still refuses it (ErrRollupBehind) until the job has run. No wait:
// CatchUpWait is negative, so each close decides at its first look.
func TestServiceClosesOnQuietSystem(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	const quiet = 10 * time.Minute
	store := quietStore{Store: f.store, quiet: quiet}
	prices := func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }
	// Ingest caught up ten seconds ago, by the quiet server's clock.
	caughtUp := func(ctx context.Context) (time.Time, error) {
		now, err := store.ServerNow(ctx)
		return now.Add(-10 * time.Second), err
	}
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: store, Prices: prices, CaughtUp: caughtUp},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}, ByDeployment: true, CatchUpWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	wm, ok, err := f.store.Watermark(ctx, rollup.JobName)
	if err != nil || !ok {
		t.Fatalf("watermark: %v %v", ok, err)
	}
	if st, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"acme"}}); err != nil || len(st) != 1 {
		t.Fatalf("close on a quiet system, watermark %s: %d statements, err = %v; want acme's statement at the first try", wm.Format(time.RFC3339), len(st), err)
	}

	// An event inserted since the watermark (stamped at or after it) is
	// not rolled up: the close is refused, whatever the clock says.
	for {
		now, err := f.store.ServerNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !now.Before(wm) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("late-beta", "beta", "m", time.Date(2026, 9, 10, 8, 0, 0, 0, time.UTC), 1_000, 0, 100)})
	_, err = svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"beta"}})
	if !errors.Is(err, closing.ErrRollupBehind) {
		t.Fatalf("close with an insert since the watermark: err = %v, want ErrRollupBehind", err)
	}
	f.rollUp(t)
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"beta"}}); err != nil {
		t.Fatalf("close once the job has run: %v", err)
	}
	beta, err := svc.Statement(ctx, "beta", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	var requests uint64
	for _, l := range beta.Statement.Lines {
		requests += l.Requests
	}
	sep, err := billing.ParsePeriod("2026-09", f.zone)
	if err != nil {
		t.Fatal(err)
	}
	usage, err := f.reads.Usage(ctx, query.UsageQuery{TenantID: "beta", Start: sep.Start.UTC(), End: sep.End.UTC(), Granularity: "total"})
	if err != nil || len(usage) != 1 {
		t.Fatalf("beta's September usage: %v, %v", usage, err)
	}
	if int64(requests) != usage[0].Requests {
		t.Fatalf("beta's September statement bills %d requests, its usage (the late event included) is %d", requests, usage[0].Requests)
	}

	// A new price book: until the job recosts October's hours with it, an
	// October close is refused (beta's October, +05:30, starts at 18:30 UTC
	// on September 30: the fixture has hours there).
	book, err := billing.ParsePriceBook([]byte(strings.Replace(serviceBook, `"per_hour": "3.60"`, `"per_hour": "4.20"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, stored, err := billing.EnsurePriceBook(ctx, f.store, book, "test", time.Now()); err != nil || !stored {
		t.Fatalf("new price book: stored %v, %v", stored, err)
	}
	_, err = svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{"beta"}})
	if !errors.Is(err, closing.ErrRollupBehind) || !strings.Contains(err.Error(), book.Version()) {
		t.Fatalf("close before the job recosted with the new book: err = %v, want ErrRollupBehind naming %s", err, book.Version())
	}
	f.rollUp(t)
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{"beta"}}); err != nil {
		t.Fatalf("close once the job has recosted: %v", err)
	}
}
