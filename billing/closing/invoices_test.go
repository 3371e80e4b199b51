package closing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// invoiceFixture is a store with September and October 2026 usage of
// tenants t00, t01, ... (UTC), rolled up, and the price book in force.
type invoiceFixture struct {
	store *chstore.Store
	reads *query.Service
}

func newInvoiceFixture(t *testing.T, tenants int) *invoiceFixture {
	t.Helper()
	s := chstoretest.OpenMigrated(t)
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := billing.EnsurePriceBook(t.Context(), s, b, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	var events []*meterv1.InferenceEvent
	for i := range tenants {
		for j, at := range []time.Time{time.Date(2026, 9, 3, 10, 0, 0, 0, time.UTC), time.Date(2026, 10, 7, 11, 0, 0, 0, time.UTC)} {
			events = append(events, ev(fmt.Sprintf("e%d-%d", i, j), fmt.Sprintf("t%02d", i), "m", at.Add(time.Duration(i)*time.Minute),
				int64(1_000_003+7_919*i), int64(1_000*i), int64(333_331+13*i)))
		}
	}
	chstoretest.Insert(t, s, events)
	billingtest.RollUp(t, s)
	return &invoiceFixture{store: s, reads: query.New(s, query.Config{})}
}

func (f *invoiceFixture) service(t *testing.T, lock closing.Locker, acc *billing.Accounts) *closing.Service {
	t.Helper()
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Lock: lock,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Accounts: acc})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func accounts(prefix, rate string) *billing.Accounts {
	r, _ := billing.ParseWeight(rate)
	a := &billing.Accounts{Operator: billing.Operator{InvoicePrefix: prefix, Seller: billing.Party{Name: "Example Inference Ltd"}}}
	for i := range 40 {
		a.Tenants = append(a.Tenants, billing.TenantAccount{ID: fmt.Sprintf("t%02d", i), Name: fmt.Sprintf("Tenant %d", i), TaxName: "VAT", TaxRate: r})
	}
	return a
}

// checkNumbering: the documents of issuer are numbered 1..n, each number
// once; every statement revision of periods has exactly one invoice and
// every revision replaced exactly one credit note.
func checkNumbering(t *testing.T, store *chstore.Store, issuer string, periods ...string) []billing.StoredInvoice {
	t.Helper()
	ctx := t.Context()
	var docs []billing.StoredInvoice
	for _, p := range periods {
		d, err := store.Invoices(ctx, p, "")
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, d...)
	}
	slices.SortFunc(docs, func(a, b billing.StoredInvoice) int { return int(a.Seq) - int(b.Seq) })
	for i, d := range docs {
		if d.Issuer != issuer || d.Seq != uint64(i+1) || d.Number != billing.InvoiceNumber(issuer, d.Seq) {
			t.Fatalf("document %d is %s (seq %d): numbers are not 1..%d without gaps", i, d.Number, d.Seq, len(docs))
		}
		inv, err := d.Decode()
		if err != nil || inv.Number != d.Number || inv.Tenant != d.Tenant {
			t.Fatalf("document %s: %v, content number %s", d.Number, err, inv.Number)
		}
	}
	// Raw rows: no number stored twice (Invoices would hide a duplicate).
	seen := map[uint64]int{}
	for _, p := range periods {
		rows, err := store.Invoices(ctx, p, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range rows {
			seen[d.Seq]++
		}
	}
	for seq, n := range seen {
		if n > 1 {
			t.Fatalf("number %d stored %d times", seq, n)
		}
	}
	type key struct {
		tenant, period string
		revision       int
		kind           billing.InvoiceKind
	}
	count := map[key]int{}
	for _, d := range docs {
		count[key{d.Tenant, d.Period, d.Revision, d.Kind}]++
	}
	for _, p := range periods {
		err := store.EachStatement(ctx, p, "", func(st billing.StoredStatement) error {
			for r := 0; r <= st.Revision; r++ {
				if n := count[key{st.Tenant, p, r, billing.KindInvoice}]; n != 1 {
					t.Errorf("%s %s revision %d: %d invoices, want 1", st.Tenant, p, r, n)
				}
				if n := count[key{st.Tenant, p, r, billing.KindCreditNote}]; (r < st.Revision) != (n == 1) || n > 1 {
					t.Errorf("%s %s revision %d (in force: %d): %d credit notes", st.Tenant, p, r, st.Revision, n)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return docs
}

// TestInvoiceNumbersGapFreeUnderConcurrentCloses: two services (two
// replicas sharing one close lock) close September for overlapping sets of
// 24 tenants at once, while readers ask for invoices (issuing them lazily
// for statements that have none) and voids run; every number from 1 to
// the last is used once, each statement revision has one invoice and each
// voided one one credit note.
func TestInvoiceNumbersGapFreeUnderConcurrentCloses(t *testing.T) {
	const n = 24
	f := newInvoiceFixture(t, n)
	ctx := t.Context()
	lock := &mutexLock{}
	acc := accounts("EI-", "0.2")
	svcs := []*closing.Service{f.service(t, lock, acc), f.service(t, lock, acc)}
	r := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	for w := range 8 {
		var tenants []string
		for range 6 {
			tenants = append(tenants, fmt.Sprintf("t%02d", r.IntN(n)))
		}
		svc := svcs[w%2]
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: tenants}); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			for _, tenant := range tenants {
				_, err := svc.Invoice(ctx, tenant, "2026-09")
				if err != nil && !errors.Is(err, closing.ErrNotClosed) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	// Every tenant closed; then voids (two racing on each of three
	// tenants, with the same hash) and lazy reads race again.
	if _, err := svcs[0].Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"t03", "t11", "t19"} {
		st, ok, err := f.store.Statement(ctx, tenant, "2026-09")
		if err != nil || !ok {
			t.Fatal(err)
		}
		results := make([]closing.VoidResult, 2)
		for i, svc := range svcs {
			wg.Add(2)
			go func() {
				defer wg.Done()
				var err error
				if results[i], err = svc.Void(ctx, closing.VoidRequest{Tenant: tenant, Period: "2026-09", Hash: st.Hash, Reason: "test"}); err != nil {
					t.Error(err)
				}
			}()
			go func() {
				defer wg.Done()
				if _, err := svc.Invoice(ctx, tenant, "2026-09"); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if results[0].Invoice.Number != results[1].Invoice.Number || results[0].CreditNote.Number != results[1].CreditNote.Number {
			t.Errorf("%s: two voids of one revision issued %s/%s and %s/%s", tenant, results[0].CreditNote.Number, results[0].Invoice.Number,
				results[1].CreditNote.Number, results[1].Invoice.Number)
		}
	}
	docs := checkNumbering(t, f.store, "EI-", "2026-09")
	if len(docs) != n+2*3 {
		t.Errorf("%d documents, want %d invoices and 3 × (credit note + invoice)", len(docs), n)
	}
}

// TestVoidAndReissue: a void leaves the original statement's stored bytes
// and hash as they were, readable as revision 0; the statement in force is
// the reissue, computed as a close would now (late usage included, the
// accounts in force: a new tax rate); the credit note negates the
// original invoice exactly; a retry returns the same documents, a void of
// a revision no longer in force is ErrConflict, an earlier period with a
// later one closed is ErrLaterClosed.
func TestVoidAndReissue(t *testing.T) {
	f := newInvoiceFixture(t, 2)
	ctx := t.Context()
	lock := &mutexLock{}
	before := f.service(t, lock, accounts("INV-", "0.1"))
	if _, err := before.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	orig, ok, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil || !ok {
		t.Fatal(err)
	}
	origInv, err := before.Invoice(ctx, "t00", "2026-09")
	if err != nil {
		t.Fatal(err)
	}
	// Late usage of September arrives after its close.
	chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("late", "t00", "m", time.Date(2026, 9, 29, 9, 0, 0, 0, time.UTC), 5_000_000, 0, 1_000_000)})
	billingtest.RollUp(t, f.store)

	after := f.service(t, lock, accounts("INV-", "0.18"))
	if _, err := after.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash}); !errors.Is(err, closing.ErrInvalidRequest) {
		t.Errorf("void without a reason: %v, want ErrInvalidRequest", err)
	}
	res, err := after.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "tax rate was 10%, is 18%"})
	if err != nil {
		t.Fatal(err)
	}
	// The original, byte for byte.
	revs, err := f.store.StatementRevisions(ctx, "t00", "2026-09")
	if err != nil || len(revs) != 2 {
		t.Fatalf("%d revisions, %v", len(revs), err)
	}
	if !bytes.Equal(revs[0].Content, orig.Content) || revs[0].Hash != orig.Hash || !bytes.Equal(res.Voided.Content, orig.Content) {
		t.Fatal("the voided statement's stored bytes changed")
	}
	var o billing.Statement
	if err := json.Unmarshal(revs[0].Content, &o); err != nil {
		t.Fatal(err)
	}
	if h, _ := o.ContentHash(); h != orig.Hash {
		t.Errorf("revision 0 hashes to %s, stored as %s", h, orig.Hash)
	}
	// The statement in force is the reissue.
	v, err := after.Statement(ctx, "t00", "2026-09", false)
	if err != nil {
		t.Fatal(err)
	}
	re := v.Statement
	if re.Revision != 1 || re.Replaces != orig.Hash || re.VoidReason == "" || v.Statement.Hash != res.Reissued.Hash {
		t.Errorf("in force: revision %d replaces %q (%q), hash %s", re.Revision, re.Replaces, re.VoidReason, re.Hash)
	}
	if re.Lines[0].InputTokens != o.Lines[0].InputTokens+5_000_000 || re.Total <= o.Total {
		t.Errorf("reissue has %d input tokens (total %s), the original %d (%s): want the late usage in it",
			re.Lines[0].InputTokens, re.Total, o.Lines[0].InputTokens, o.Total)
	}
	cn, err := res.CreditNote.Decode()
	if err != nil {
		t.Fatal(err)
	}
	inv, err := res.Invoice.Decode()
	if err != nil {
		t.Fatal(err)
	}
	oi := origInv.Invoice
	if cn.Credits != oi.Number || cn.Total != -oi.Total || cn.Tax != -oi.Tax || cn.Subtotal != -oi.Subtotal || cn.Reason == "" {
		t.Errorf("credit note %s credits %s: %s/%s/%s, the invoice %s/%s/%s", cn.Number, cn.Credits, cn.Subtotal, cn.Tax, cn.Total, oi.Subtotal, oi.Tax, oi.Total)
	}
	if cn.Seq != 3 || inv.Seq != 4 || inv.Replaces != oi.Number || inv.Revision != 1 || inv.Subtotal != re.Total || inv.TaxRate != 180_000_000 {
		t.Errorf("reissued invoice %s (seq %d, replaces %s, revision %d, subtotal %s, rate %s); credit note seq %d",
			inv.Number, inv.Seq, inv.Replaces, inv.Revision, inv.Subtotal, inv.TaxRate, cn.Seq)
	}
	if got, err := after.Invoice(ctx, "t00", "2026-09"); err != nil || got.Invoice.Number != inv.Number {
		t.Errorf("invoice in force: %s, %v; want %s", got.Invoice.Number, err, inv.Number)
	}
	// The original invoice's stored bytes are those read before.
	docs, err := after.Documents(ctx, "2026-09", "t00")
	if err != nil || len(docs) != 3 || !bytes.Equal(docs[0].Content, origInv.Stored.Content) {
		t.Errorf("documents: %d, %v; the first must be the original invoice, unchanged", len(docs), err)
	}
	// A retry returns the same documents; a stale hash is a conflict.
	again, err := after.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "retry"})
	if err != nil || again.Invoice.Number != inv.Number || again.CreditNote.Number != cn.Number {
		t.Errorf("retried void: %s/%s, %v", again.CreditNote.Number, again.Invoice.Number, err)
	}
	if _, err := after.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: "feed", Reason: "x"}); !errors.Is(err, closing.ErrConflict) {
		t.Errorf("void of an unknown hash: %v, want ErrConflict", err)
	}
	// Once October is closed, September may not be voided.
	if _, err := after.Close(ctx, closing.CloseRequest{Period: "2026-10"}); err != nil {
		t.Fatal(err)
	}
	if _, err := after.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: res.Reissued.Hash, Reason: "x"}); !errors.Is(err, closing.ErrLaterClosed) {
		t.Errorf("void of September after October's close: %v, want ErrLaterClosed", err)
	}
	// October's close compared September's usage with the reissue: the
	// late usage is billed once (in the reissue), not again as an
	// adjustment.
	oct, err := after.Statement(ctx, "t00", "2026-10", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range oct.Statement.Lines {
		if l.Kind == billing.LineAdjustment {
			t.Errorf("October bills September's late usage again: %+v", l)
		}
	}
	if _, err := after.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-08", Hash: "x", Reason: "x"}); !errors.Is(err, closing.ErrNotClosed) {
		t.Errorf("void of an open period: %v, want ErrNotClosed", err)
	}
	checkNumbering(t, f.store, "INV-", "2026-09", "2026-10")
}
