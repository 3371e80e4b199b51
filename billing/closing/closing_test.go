package closing_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/chstore/chstoretest"
	"tokenmeter/internal/chtest"
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
