package closing_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// serviceBook prices model m at whole nano-units per token (so that a
// statement's charge, rounded once per line, equals the cost rollups' sum
// of hourly charges) and H100 hours; idle cost is shared, so tenants carry
// it.
const serviceBook = `{"currency": "USD",
	"gpu_prices": [{"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.60"}],
	"token_prices": [{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"}],
	"allocation": {"busy_policy": "tokens", "idle_policy": "shared_weighted"}}`

type serviceFixture struct {
	store *chstore.Store
	reads *query.Service
	svc   *closing.Service
	zone  *time.Location
}

// newServiceFixture stores the price book, September 2026 usage of acme
// (UTC) and beta (+05:30) on d1 (with GPU samples) and d2 (without), and
// rolls it up.
func newServiceFixture(t *testing.T) *serviceFixture {
	t.Helper()
	ctx := t.Context()
	s := chstoretest.OpenMigrated(t)
	book, err := billing.ParsePriceBook([]byte(serviceBook))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(ctx, s, book, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	plus0530, err := billing.ParseZone("+05:30")
	if err != nil {
		t.Fatal(err)
	}
	// Hours on both sides of September's edges in both zones, on both
	// deployments.
	var hours []time.Time
	for _, edge := range []time.Time{time.Date(2026, 8, 31, 18, 0, 0, 0, time.UTC), time.Date(2026, 9, 30, 18, 0, 0, 0, time.UTC)} {
		for h := range 8 {
			hours = append(hours, edge.Add(time.Duration(h-2)*time.Hour))
		}
	}
	hours = append(hours, time.Date(2026, 9, 15, 12, 0, 0, 0, time.UTC))
	var events []*meterv1.InferenceEvent
	for i, h := range hours {
		for j, tenant := range []string{"acme", "beta"} {
			for k, dep := range []string{"d1", "d2"} {
				for m := range 4 { // minutes 5, 20, 35, 50
					at := h.Add(time.Duration(5+15*m) * time.Minute)
					e := ev(fmt.Sprintf("%s-%d-%s-%d", tenant, i, dep, m), tenant, "m", at, int64(1000+100*i+10*j+k), int64(100*k), int64(500+m))
					e.Deployment = dep
					events = append(events, e)
				}
			}
		}
	}
	chstoretest.Insert(t, s, events)
	var gpus chstore.GPUBatch
	for i, h := range hours {
		for k := range 360 {
			gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprintf("g%d-%d", i, k), GpuUuid: "GPU-1", GpuType: "H100", Deployment: "d1",
				SampledAt: timestamppb.New(h.Add(time.Duration(k) * 10 * time.Second)), IntervalS: 10, Utilization: 0.25}, time.Now())
		}
	}
	if err := s.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	f := &serviceFixture{store: s, reads: query.New(s, query.Config{}), zone: plus0530}
	f.rollUp(t)
	f.svc = f.newService(t, nil)
	return f
}

// rollUp runs the rollup job over everything inserted so far.
func (f *serviceFixture) rollUp(t *testing.T) {
	t.Helper()
	billingtest.RollUp(t, f.store)
}

func (f *serviceFixture) newService(t *testing.T, lock closing.Locker) *closing.Service {
	t.Helper()
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Lock: lock,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}, ByDeployment: true})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestServiceStatementMatchesUsageAndCost closes September and checks each
// statement against GetUsage and GetCost for the same tenant and range,
// exactly: tokens, list charge, allocated cost (busy and idle), for a UTC
// tenant and a +05:30 one (whose cost hours are those starting in its
// month: 19:00 UTC on August 31 to 19:00 UTC on September 30).
func TestServiceStatementMatchesUsageAndCost(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	stored, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-09"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 2 || stored[0].Tenant != "acme" || stored[1].Tenant != "beta" {
		t.Fatalf("closed %+v, want acme's and beta's statements", stored)
	}
	costHours := map[string][2]time.Time{
		"acme": {time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)},
		"beta": {time.Date(2026, 8, 31, 19, 0, 0, 0, time.UTC), time.Date(2026, 9, 30, 19, 0, 0, 0, time.UTC)},
	}
	for _, tenant := range []string{"acme", "beta"} {
		v, err := f.svc.Statement(ctx, tenant, "2026-09", true)
		if err != nil {
			t.Fatal(err)
		}
		st := v.Statement
		if !v.Closed || st.Finance == nil {
			t.Fatalf("%s: closed %v, finance %v", tenant, v.Closed, st.Finance)
		}
		usage, err := f.reads.Usage(ctx, query.UsageQuery{TenantID: tenant, Start: st.PeriodStart, End: st.PeriodEnd})
		if err != nil {
			t.Fatal(err)
		}
		var req, in, cached, out uint64
		for _, l := range st.Lines {
			req, in, cached, out = req+l.Requests, in+l.InputTokens, cached+l.CachedInputTokens, out+l.OutputTokens
		}
		if len(usage) != 1 || uint64(usage[0].Requests) != req || uint64(usage[0].PromptTokens) != in ||
			uint64(usage[0].CachedPromptTokens) != cached || uint64(usage[0].OutputTokens) != out {
			t.Errorf("%s: statement %d requests, %d/%d/%d tokens; GetUsage %+v", tenant, req, in, cached, out, usage)
		}
		if req == 0 {
			t.Fatalf("%s: empty statement", tenant)
		}
		span := costHours[tenant]
		cost, err := f.reads.Cost(ctx, query.CostQuery{TenantID: tenant, Start: span[0], End: span[1], Busy: "tokens", Idle: "shared_weighted"})
		if err != nil {
			t.Fatal(err)
		}
		if len(cost) != 1 {
			t.Fatalf("%s: GetCost rows %+v", tenant, cost)
		}
		c := cost[0]
		fin := st.Finance
		if int64(fin.AllocatedCost) != c.CostNanos || int64(fin.BusyCost) != c.BusyNanos || int64(fin.IdleCost) != c.CostNanos-c.BusyNanos {
			t.Errorf("%s: finance cost %s (busy %s, idle %s), GetCost %d (busy %d)", tenant, fin.AllocatedCost, fin.BusyCost, fin.IdleCost, c.CostNanos, c.BusyNanos)
		}
		if fin.AllocatedCost <= 0 || fin.IdleCost <= 0 {
			t.Errorf("%s: no allocated cost or no idle share: %+v", tenant, fin)
		}
		if fin.Margin != fin.UsageCharge-fin.AllocatedCost || fin.UsageCharge != st.Charge {
			t.Errorf("%s: margin %s of charge %s − cost %s (statement charge %s)", tenant, fin.Margin, fin.UsageCharge, fin.AllocatedCost, st.Charge)
		}
		if tenant == "acme" && int64(st.Charge) != c.ListCharge {
			t.Errorf("acme: statement charge %s, GetCost list charge %d", st.Charge, c.ListCharge)
		}
		var lines billing.Money
		for _, lc := range fin.Lines {
			lines += lc.AllocatedCost
		}
		if lines+fin.Unassigned != fin.AllocatedCost {
			t.Errorf("%s: line costs %s + unassigned %s ≠ %s", tenant, lines, fin.Unassigned, fin.AllocatedCost)
		}
		// The tenant's view has no finance part and the same hash; both
		// views re-read byte for byte.
		tv, err := f.svc.Statement(ctx, tenant, "2026-09", false)
		if err != nil {
			t.Fatal(err)
		}
		if tv.Statement.Finance != nil || bytes.Contains(tv.Content, []byte(`"finance"`)) || tv.Statement.Hash != st.Hash {
			t.Errorf("%s: the tenant's view has finance or another hash: %s", tenant, tv.Content)
		}
		again, _ := f.svc.Statement(ctx, tenant, "2026-09", false)
		fagain, _ := f.svc.Statement(ctx, tenant, "2026-09", true)
		if !bytes.Equal(again.Content, tv.Content) || !bytes.Equal(fagain.Content, v.Content) {
			t.Errorf("%s: a re-read changed the bytes", tenant)
		}
	}

	// The detailed export of September's hours adds up to the cost rollups
	// and names each row's billing period in its tenant's zone.
	var rows int
	var charge, cost billing.Money
	periods := map[string]bool{}
	err = f.svc.EachUsageCost(ctx, closing.UsageCostQuery{Tenant: "beta", Start: costHours["beta"][0], End: costHours["beta"][1]}, func(r *export.UsageCostRow) error {
		rows++
		charge += r.ListCharge
		cost += r.AllocatedCost
		periods[r.BillingPeriod] = true
		if r.ChargePeriodStart.Equal(time.Date(2026, 9, 30, 18, 0, 0, 0, time.UTC)) && r.BillingPeriod != "2026-09" ||
			r.ChargePeriodStart.Equal(time.Date(2026, 8, 31, 18, 0, 0, 0, time.UTC)) {
			t.Errorf("row %+v in the wrong billing period or outside the range", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	bv, _ := f.svc.Statement(ctx, "beta", "2026-09", true)
	if rows == 0 || cost != bv.Statement.Finance.AllocatedCost || !periods["2026-09"] {
		t.Errorf("export: %d rows, cost %s (statement %s), charge %s, periods %v", rows, cost, bv.Statement.Finance.AllocatedCost, charge, periods)
	}
}

// TestServiceLateUsageAndErrors closes September, ingests late September
// events, and closes October: September's statement keeps its bytes, and
// October's adjustment lines add up exactly to the late usage. Closes of
// two service instances at once (two replicas sharing a lock) give one set
// of statements; bad requests get clear errors.
func TestServiceLateUsageAndErrors(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	lock := &mutexLock{}
	a, b := f.newService(t, lock), f.newService(t, lock)
	var (
		wg     sync.WaitGroup
		closes [2][]billing.StoredStatement
		errs   [2]error
	)
	for i, svc := range []*closing.Service{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			closes[i], errs[i] = svc.Close(ctx, closing.CloseRequest{Period: "2026-09"})
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if len(closes[0]) != 2 || len(closes[1]) != 2 {
		t.Fatalf("closes %+v", closes)
	}
	for i := range closes[0] {
		if !bytes.Equal(closes[0][i].Content, closes[1][i].Content) || !closes[0][i].ClosedAt.Equal(closes[1][i].ClosedAt) {
			t.Errorf("the two closes returned different statements for %s", closes[0][i].Tenant)
		}
	}
	before, err := f.svc.Statement(ctx, "acme", "2026-09", true)
	if err != nil {
		t.Fatal(err)
	}

	// The price book changes after the close: new amounts for the entry
	// September was billed with, and a new price from September 18.
	// September's late usage is still priced as September was billed.
	oldVersion := before.Statement.PriceBook
	repriced, err := billing.ParsePriceBook([]byte(strings.Replace(serviceBook,
		`"token_prices": [{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60"`,
		`"token_prices": [{"model": "m", "effective_from": "2026-09-18T00:00:00Z", "input_per_1m": "0.90", "output_per_1m": "2.70"},
			{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.70"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, stored, err := billing.EnsurePriceBook(ctx, f.store, repriced, "test", time.Now()); err != nil || !stored {
		t.Fatalf("new price book: stored %v, %v", stored, err)
	}

	// Late events: acme's September on d1 and d2.
	late := []*meterv1.InferenceEvent{
		ev("late-1", "acme", "m", time.Date(2026, 9, 15, 12, 30, 0, 0, time.UTC), 7_000, 1_000, 300),
		ev("late-2", "acme", "m", time.Date(2026, 9, 20, 3, 0, 0, 0, time.UTC), 11_000, 0, 900),
	}
	late[1].Deployment = "d2"
	chstoretest.Insert(t, f.store, late)
	f.rollUp(t)

	after, err := f.svc.Statement(ctx, "acme", "2026-09", true)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after.Content, before.Content) {
		t.Fatalf("late events changed the closed statement")
	}
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{"beta"}}); err != nil {
		t.Fatal(err)
	}
	// acme's October close reprices September with the new book.
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{"acme"}, Reprice: []string{"2026-09"}}); err != nil {
		t.Fatal(err)
	}
	oct, err := f.svc.Statement(ctx, "acme", "2026-10", false)
	if err != nil {
		t.Fatal(err)
	}
	var adj struct{ requests, in, cached, out uint64 }
	var charge billing.Money
	if oct.Statement.PriceBook != repriced.Version() {
		t.Errorf("October priced with %s, want the book in force %s", oct.Statement.PriceBook, repriced.Version())
	}
	for _, l := range oct.Statement.Lines {
		if l.Kind == billing.LineAdjustment {
			if l.OriginalPeriod != "2026-09" || l.PriceBook != oldVersion {
				t.Errorf("adjustment of %q priced with %q, want 2026-09 with %s", l.OriginalPeriod, l.PriceBook, oldVersion)
			}
			adj.requests, adj.in, adj.cached, adj.out = adj.requests+l.Requests, adj.in+l.InputTokens, adj.cached+l.CachedInputTokens, adj.out+l.OutputTokens
			charge += l.Charge
		}
	}
	// 6,000 uncached × 0.60 + 1,000 cached × 0.30 + 300 × 1.80, and
	// 11,000 × 0.60 + 900 × 1.80, per 1M.
	wantCharge := billing.Money((6_000*600 + 1_000*300 + 300*1_800) + (11_000*600 + 900*1_800))
	if adj.requests != 2 || adj.in != 18_000 || adj.cached != 1_000 || adj.out != 1_200 || charge != wantCharge {
		t.Errorf("adjustments %+v charging %s, want the late usage: 2 requests, 18,000/1,000/1,200 tokens, %s", adj, charge, wantCharge)
	}

	// The repricing lines bring what is billed for September (its lines,
	// the adjustments and the repricings) to its usage under the new book,
	// exactly.
	octF, err := f.svc.Statement(ctx, "acme", "2026-10", true)
	if err != nil {
		t.Fatal(err)
	}
	billed := before.Statement.Charge
	var repricings int
	for _, l := range octF.Statement.Lines {
		if l.OriginalPeriod == "2026-09" {
			billed += l.Charge
		}
		if l.Kind == billing.LineRepricing {
			repricings++
			if l.InputTokens+l.OutputTokens+l.Requests != 0 || l.Charge == 0 {
				t.Errorf("repricing line %+v", l)
			}
		}
	}
	sep, _ := billing.ParsePeriod("2026-09", time.UTC)
	cut := time.Date(2026, 9, 18, 0, 0, 0, 0, time.UTC)
	nowUsage, err := f.reads.StatementUsage(ctx, "acme", sep.Start, sep.End, []time.Time{cut})
	if err != nil {
		t.Fatal(err)
	}
	underNew, err := billing.ComputeStatement("acme", sep, repriced, nowUsage, true)
	if err != nil {
		t.Fatal(err)
	}
	if repricings != 2 || billed != underNew.Charge {
		t.Errorf("%d repricing lines; September billed %s in all, its usage under the new book %s", repricings, billed, underNew.Charge)
	}

	// Periods: September and October closed (with their hashes), then open
	// months up to now.
	ps, err := f.svc.Periods(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) < 3 || !ps[0].Closed || ps[0].Period != "2026-09" || ps[0].Hash != before.Statement.Hash || !ps[1].Closed || ps[2].Closed {
		t.Errorf("periods %+v", ps)
	}

	// A zone change after a close is refused, not silently overlapped.
	moved, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := moved.Close(ctx, closing.CloseRequest{Period: "2026-11", Tenants: []string{"beta"}, Grace: new(time.Duration)}); err == nil {
		t.Error("closing November (not over) succeeded")
	}
	if _, err := moved.Statement(ctx, "beta", "2026-11", false); !errors.Is(err, closing.ErrZoneChanged) {
		t.Errorf("beta's November in UTC after a +05:30 close of October: err = %v, want ErrZoneChanged", err)
	}

	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"malformed period", closeErr(f.svc, "2026-13"), billing.ErrInvalidPeriod},
		{"period not over", closeErr(f.svc, billing.PeriodOf(time.Now(), time.UTC).Key), billing.ErrPeriodNotEnded},
		{"unknown tenant", statementErr(f.svc, "nobody", "2026-09"), closing.ErrNotFound},
		{"bad tenant id", statementErr(f.svc, "bad\ttenant", "2026-09"), closing.ErrInvalidRequest},
		{"export of an open period", f.svc.EachStatement(ctx, "2026-08", "", false, func(closing.StatementView) error { return nil }), closing.ErrNotClosed},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.want)
		} else if strings.TrimSpace(c.err.Error()) == "" {
			t.Errorf("%s: empty message", c.name)
		}
	}
}

// TestServiceWaitsForIngest checks that a close waits out a short ingest
// lag, and gives up with ErrIngestBehind after CatchUpWait.
func TestServiceWaitsForIngest(t *testing.T) {
	f := newServiceFixture(t)
	calls := 0
	caughtUp := func(context.Context) (time.Time, error) {
		calls++
		if calls < 3 {
			return time.Time{}, fmt.Errorf("%w: 12 messages not yet ingested", billing.ErrIngestBehind)
		}
		return time.Now().Add(-time.Minute), nil // the rollup job has run since
	}
	prices := func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }
	patient, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Prices: prices, CaughtUp: caughtUp}, closing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := patient.Close(t.Context(), closing.CloseRequest{Period: "2026-09", Tenants: []string{"acme"}}); err != nil || len(st) != 1 || calls != 3 {
		t.Fatalf("close after a lag: %d statements, %d calls, %v", len(st), calls, err)
	}
	calls = -100
	hasty, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Prices: prices, CaughtUp: caughtUp}, closing.Config{CatchUpWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hasty.Close(t.Context(), closing.CloseRequest{Period: "2026-09", Tenants: []string{"beta"}}); !errors.Is(err, billing.ErrIngestBehind) || calls != -99 {
		t.Errorf("close while ingest lags: err = %v after %d calls, want ErrIngestBehind at once", err, calls+100)
	}
}

func closeErr(svc *closing.Service, period string) error {
	_, err := svc.Close(context.Background(), closing.CloseRequest{Period: period})
	return err
}

func statementErr(svc *closing.Service, tenant, period string) error {
	_, err := svc.Statement(context.Background(), tenant, period, false)
	return err
}

// mutexLock is a Locker shared by the services of one test, as the
// replicas of a deployment share the Kafka lock.
type mutexLock struct{ mu sync.Mutex }

func (l *mutexLock) Lock(context.Context, string) (func(), error) {
	l.mu.Lock()
	return l.mu.Unlock, nil
}

// TestServiceCloseOrderAndGaps covers what a reviewer found: a tenant left
// out of a close as empty still gets its late usage billed at its next
// close; an earlier period may not close after a later one; a closed
// period is compared the way it was closed (per deployment or not) when
// --billing-by-deployment changes; a repricing named twice counts once and
// one asked on an already closed period is refused; an explicit close of
// an unknown tenant is 404.
func TestServiceCloseOrderAndGaps(t *testing.T) {
	f := newServiceFixture(t)
	ctx := t.Context()
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-08"}); err != nil {
		t.Fatal(err)
	}
	// gamma had nothing in August when it closed; its late August event
	// arrives after.
	chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("gamma-late", "gamma", "m", time.Date(2026, 8, 20, 0, 0, 0, 0, time.UTC), 4_000, 0, 40)})
	f.rollUp(t)
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"nobody"}}); !errors.Is(err, closing.ErrNotFound) {
		t.Errorf("explicit close of an unknown tenant: err = %v, want ErrNotFound", err)
	}
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	gamma, err := f.svc.Statement(ctx, "gamma", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	if ls := gamma.Statement.Lines; !gamma.Closed || len(ls) != 1 || ls[0].Kind != billing.LineAdjustment || ls[0].OriginalPeriod != "2026-08" || ls[0].InputTokens != 4_000 {
		t.Errorf("gamma's September %+v, want its late August usage as an adjustment", gamma.Statement.Lines)
	}
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-08", Tenants: []string{"gamma"}}); !errors.Is(err, closing.ErrLaterClosed) {
		t.Errorf("closing gamma's August after its September: err = %v, want ErrLaterClosed", err)
	}
	if _, err := f.svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"acme"}, Reprice: []string{"2026-08"}}); !errors.Is(err, closing.ErrInvalidRequest) {
		t.Errorf("repricing in a closed period: err = %v, want ErrInvalidRequest", err)
	}

	// August and September were closed per deployment; October closes
	// without: one late event is one request late, not a month.
	chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("acme-late", "acme", "m", time.Date(2026, 9, 30, 20, 0, 0, 0, time.UTC), 1, 0, 0)})
	f.rollUp(t)
	flat, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Zones: map[string]*time.Location{"beta": f.zone}})
	if err != nil {
		t.Fatal(err)
	}
	// A new book, then October for acme with September repriced, named
	// twice.
	repriced, err := billing.ParsePriceBook([]byte(strings.Replace(serviceBook, `"input_per_1m": "0.60"`, `"input_per_1m": "0.80"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(ctx, f.store, repriced, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := flat.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{"acme"}, Reprice: []string{"2026-09", "2026-09"}}); err != nil {
		t.Fatal(err)
	}
	oct, err := flat.Statement(ctx, "acme", "2026-10", false)
	if err != nil {
		t.Fatal(err)
	}
	sepSt, err := flat.Statement(ctx, "acme", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	billed := sepSt.Statement.Charge
	var lateRequests uint64
	for _, l := range oct.Statement.Lines {
		if l.OriginalPeriod == "2026-09" {
			billed += l.Charge
			if l.Kind == billing.LineAdjustment {
				lateRequests += l.Requests
			}
		}
	}
	sep, _ := billing.ParsePeriod("2026-09", time.UTC)
	nowUsage, err := f.reads.StatementUsage(ctx, "acme", sep.Start, sep.End, nil)
	if err != nil {
		t.Fatal(err)
	}
	underNew, err := billing.ComputeStatement("acme", sep, repriced, nowUsage, false)
	if err != nil {
		t.Fatal(err)
	}
	if lateRequests != 1 || billed != underNew.Charge {
		t.Errorf("October: %d late requests of September (want 1); September billed %s in all, its usage under the new book %s",
			lateRequests, billed, underNew.Charge)
	}
}
