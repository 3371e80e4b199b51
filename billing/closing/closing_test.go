package closing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

func TestMain(m *testing.M) { chtest.Main(m) }

func ev(id, tenant, model string, at time.Time, in, cached, out int64) *meterv1.InferenceEvent {
	return &meterv1.InferenceEvent{EventId: id, TenantId: tenant, Model: model, Deployment: "d1",
		CompletedAt: timestamppb.New(at), PromptTokens: proto.Int64(in), CachedPromptTokens: proto.Int64(cached), OutputTokens: proto.Int64(out)}
}

const book = `{"currency": "USD", "token_prices": [
	{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"},
	{"model": "m", "effective_from": "2026-11-15T12:00:00Z", "input_per_1m": "1.00", "cached_input_per_1m": "0.50", "output_per_1m": "3.00"}]}`

// TestClosePeriod closes November for a +05:30 tenant and a UTC tenant:
// each month is exact to its zone (an event at 18:31 UTC on October 31 is
// the +05:30 tenant's November, the UTC tenant's October), a price change
// splits the line, the statement's tokens equal GetUsage's for the same
// range, a close too early or with ingest behind stores nothing, and closing
// again (after late events, or twice at once) returns the same bytes.
func TestClosePeriod(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	edge := time.Date(2026, 10, 31, 18, 30, 0, 0, time.UTC) // +05:30 November starts
	change := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
	events := []*meterv1.InferenceEvent{
		ev("a1", "acme", "m", edge.Add(-time.Minute), 1_000_000, 0, 0), // acme's October
		ev("a2", "acme", "m", edge.Add(time.Minute), 2_000_000, 500_000, 100),
		ev("a3", "acme", "m", change.Add(-time.Second), 1_000_000, 0, 10),
		ev("a4", "acme", "m", change, 3_000_000, 0, 20),
		ev("g1", "globex", "m", edge.Add(time.Minute), 7_000_000, 0, 0), // globex's October
		ev("g2", "globex", "m", time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC), 1_000_000, 0, 0),
	}
	chstoretest.Insert(t, s, events)
	reads := query.New(s, query.Config{})
	plus0530, err := billing.ParseZone("+05:30")
	if err != nil {
		t.Fatal(err)
	}
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	tenants := []closing.Tenant{{ID: "globex", Zone: time.UTC}, {ID: "acme", Zone: plus0530}}
	closer := closing.New(reads, s, nil)
	dec1 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	req := closing.Request{Period: "2026-11", Tenants: tenants, Book: b, Grace: billing.DefaultGrace, Now: dec1.Add(12 * time.Hour), CaughtUp: dec1.Add(12 * time.Hour)}

	if _, err := closer.Close(t.Context(), req); !errors.Is(err, billing.ErrPeriodNotEnded) {
		t.Fatalf("close within the grace delay: err = %v, want ErrPeriodNotEnded", err)
	}
	req.Now = dec1.Add(25 * time.Hour)
	req.CaughtUp = dec1.Add(-time.Hour)
	if _, err := closer.Close(t.Context(), req); !errors.Is(err, billing.ErrIngestBehind) {
		t.Fatalf("close with ingest behind: err = %v, want ErrIngestBehind", err)
	}
	for _, tn := range []string{"acme", "globex"} {
		if _, ok, _ := s.Statement(t.Context(), tn, "2026-11"); ok {
			t.Fatalf("a refused close stored %s's statement", tn)
		}
	}
	req.CaughtUp = req.Now
	got, err := closer.Close(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Tenant != "acme" || got[1].Tenant != "globex" {
		t.Fatalf("statements %+v, want acme's and globex's", got)
	}
	var acme, globex billing.Statement
	if err := json.Unmarshal(got[0].Content, &acme); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got[1].Content, &globex); err != nil {
		t.Fatal(err)
	}
	// acme (+05:30): a2 and a3 under the first price, a4 under the second.
	if len(acme.Lines) != 2 {
		t.Fatalf("acme's lines %+v, want two, split at the price change", acme.Lines)
	}
	// Uncached 2.5M × 0.60 + cached 0.5M × 0.30 + 110 × 1.80, per 1M:
	// 1.650198; then 3M × 1.00 + 20 × 3.00 per 1M: 3.00006.
	if acme.Lines[0].Charge != 1_650_000_000+198_000 || acme.Lines[1].Charge != 3_000_060_000 || acme.Total != 4_650_000_000 {
		t.Errorf("acme's charges %s and %s, total %s; want 1.650198, 3.00006 and 4.65", acme.Lines[0].Charge, acme.Lines[1].Charge, acme.Total)
	}
	if !acme.PeriodStart.Equal(edge) || globex.Lines[0].InputTokens != 1_000_000 {
		t.Errorf("acme's period starts %s (want %s); globex's November input %d (want only g2's 1,000,000)", acme.PeriodStart, edge, globex.Lines[0].InputTokens)
	}
	// The statement's tokens are GetUsage's for the same range.
	usage, err := reads.Usage(t.Context(), query.UsageQuery{TenantID: "acme", Start: acme.PeriodStart, End: acme.PeriodEnd})
	if err != nil {
		t.Fatal(err)
	}
	var in, cached, out uint64
	for _, l := range acme.Lines {
		in, cached, out = in+l.InputTokens, cached+l.CachedInputTokens, out+l.OutputTokens
	}
	if len(usage) != 1 || uint64(usage[0].PromptTokens) != in || uint64(usage[0].CachedPromptTokens) != cached || uint64(usage[0].OutputTokens) != out {
		t.Errorf("statement tokens %d/%d/%d, GetUsage %+v", in, cached, out, usage)
	}

	// Late events, then two closes at once: the stored statements stay.
	chstoretest.Insert(t, s, []*meterv1.InferenceEvent{ev("a5", "acme", "m", change.Add(time.Hour), 9_000_000, 0, 0)})
	var wg sync.WaitGroup
	again := make([][]billing.StoredStatement, 2)
	for i := range again {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := req
			r.Now = r.Now.Add(time.Duration(i+1) * time.Hour)
			var err error
			if again[i], err = closer.Close(t.Context(), r); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, sts := range again {
		for j, st := range sts {
			if !bytes.Equal(st.Content, got[j].Content) || st.Hash != got[j].Hash || !st.ClosedAt.Equal(got[j].ClosedAt) {
				t.Errorf("close %d changed %s's statement", i, st.Tenant)
			}
		}
	}
	if h, _ := acme.ContentHash(); h != got[0].Hash || acme.Hash != got[0].Hash {
		t.Errorf("hash %s, stored %s, in content %s", h, got[0].Hash, acme.Hash)
	}

	// December's statements bill the late event as an adjustment of
	// November at November's price, once; globex has nothing late.
	jan1 := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	chstoretest.Insert(t, s, []*meterv1.InferenceEvent{ev("a6", "acme", "m", jan1.Add(-12*time.Hour), 1_000_000, 0, 0)})
	dec := req
	dec.Period, dec.Now, dec.CaughtUp = "2026-12", jan1.Add(25*time.Hour), jan1.Add(25*time.Hour)
	decs, err := closer.Close(t.Context(), dec)
	if err != nil {
		t.Fatal(err)
	}
	var acmeDec, globexDec billing.Statement
	if err := json.Unmarshal(decs[0].Content, &acmeDec); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(decs[1].Content, &globexDec); err != nil {
		t.Fatal(err)
	}
	if len(acmeDec.Lines) != 2 {
		t.Fatalf("acme's December lines %+v, want its usage and one adjustment", acmeDec.Lines)
	}
	use, adj := acmeDec.Lines[0], acmeDec.Lines[1]
	if use.Kind != billing.LineUsage || use.InputTokens != 1_000_000 || use.Charge != 1_000_000_000 {
		t.Errorf("December usage line %+v, want a6: 1M input at 1.00", use)
	}
	if adj.Kind != billing.LineAdjustment || adj.OriginalPeriod != "2026-11" || adj.InputTokens != 9_000_000 || adj.Requests != 1 ||
		adj.Charge != 9_000_000_000 || adj.PriceID != acme.Lines[1].PriceID {
		t.Errorf("adjustment %+v, want a5: 9M input of 2026-11 at its second price (9.00)", adj)
	}
	for _, l := range globexDec.Lines {
		if l.Kind == billing.LineAdjustment {
			t.Errorf("globex has an adjustment: %+v", l)
		}
	}
}

// concurrentUsage is a UsageReader that records the most reads running at
// once; each read waits (up to a second) until another one runs beside it.
type concurrentUsage struct {
	closing.UsageReader
	mu         sync.Mutex
	now, most  int
	both       chan struct{}
	bothClosed bool
}

func (u *concurrentUsage) StatementUsage(ctx context.Context, tenant string, start, end time.Time, cuts []time.Time) ([]billing.StatementUsage, error) {
	u.mu.Lock()
	u.now++
	u.most = max(u.most, u.now)
	if u.now == 2 && !u.bothClosed {
		close(u.both)
		u.bothClosed = true
	}
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.now--
		u.mu.Unlock()
	}()
	select {
	case <-u.both:
	case <-time.After(time.Second):
	}
	return u.UsageReader.StatementUsage(ctx, tenant, start, end, cuts)
}

// TestCloseClosesTenantsAtOnce: a close computes several tenants'
// statements at once (one at a time, a month of 1,000 tenants took 80 s on
// the bench), and still returns them in tenant order.
func TestCloseClosesTenantsAtOnce(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	at := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	var events []*meterv1.InferenceEvent
	var tenants []closing.Tenant
	for i, tn := range []string{"d", "b", "a", "c"} {
		events = append(events, ev("e"+tn, tn, "m", at, int64(1000*(i+1)), 0, 10))
		tenants = append(tenants, closing.Tenant{ID: tn, Zone: time.UTC})
	}
	chstoretest.Insert(t, s, events)
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	u := &concurrentUsage{UsageReader: query.New(s, query.Config{}), both: make(chan struct{})}
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	got, err := closing.New(u, s, nil).Close(t.Context(), closing.Request{Period: "2026-11", Tenants: tenants, Book: b,
		Grace: billing.DefaultGrace, Now: now, CaughtUp: now})
	if err != nil {
		t.Fatal(err)
	}
	if u.most < 2 {
		t.Errorf("at most %d statement reads ran at once, want tenants closed concurrently", u.most)
	}
	var order []string
	for _, st := range got {
		order = append(order, st.Tenant)
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(order, want) {
		t.Errorf("statements of %v, want %v", order, want)
	}
}

// failingUsage fails the reads of one tenant.
type failingUsage struct {
	closing.UsageReader
	tenant string
}

var errUsage = errors.New("usage unavailable")

func (u failingUsage) StatementUsage(ctx context.Context, tenant string, start, end time.Time, cuts []time.Time) ([]billing.StatementUsage, error) {
	if tenant == u.tenant {
		return nil, errUsage
	}
	return u.UsageReader.StatementUsage(ctx, tenant, start, end, cuts)
}

// TestCloseStopsAtAnError: a tenant's failed close is the close's error,
// with the statements of the tenants before it, as when tenants closed one
// at a time; closing again closes the rest.
func TestCloseStopsAtAnError(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	at := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	var events []*meterv1.InferenceEvent
	var tenants []closing.Tenant
	for _, tn := range []string{"a", "b", "c", "d", "e", "f"} {
		events = append(events, ev("e"+tn, tn, "m", at, 1000, 0, 10))
		tenants = append(tenants, closing.Tenant{ID: tn, Zone: time.UTC})
	}
	chstoretest.Insert(t, s, events)
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	reads := query.New(s, query.Config{})
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	req := closing.Request{Period: "2026-11", Tenants: tenants, Book: b, Grace: billing.DefaultGrace, Now: now, CaughtUp: now}
	got, err := closing.New(failingUsage{reads, "c"}, s, nil).Close(t.Context(), req)
	if !errors.Is(err, errUsage) {
		t.Fatalf("close with c's usage failing: err = %v, want errUsage", err)
	}
	if len(got) != 2 || got[0].Tenant != "a" || got[1].Tenant != "b" {
		t.Errorf("close with c's usage failing returned %d statements, want a's and b's", len(got))
	}
	all, err := closing.New(reads, s, nil).Close(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(tenants) || !bytes.Equal(all[0].Content, got[0].Content) {
		t.Errorf("closing again: %d statements (a's the same: %v), want %d, a's as stored", len(all), len(all) > 0 && bytes.Equal(all[0].Content, got[0].Content), len(tenants))
	}
}
