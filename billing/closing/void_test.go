package closing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// faultyStore fails SaveRevision and SaveInvoices while told to.
type faultyStore struct {
	*chstore.Store
	failRevision, failInvoices atomic.Bool
}

var errInjected = errors.New("injected failure")

func (s *faultyStore) SaveRevision(ctx context.Context, st billing.Statement, closedAt time.Time) (billing.StoredStatement, error) {
	if s.failRevision.Load() {
		return billing.StoredStatement{}, errInjected
	}
	return s.Store.SaveRevision(ctx, st, closedAt)
}

func (s *faultyStore) SaveInvoices(ctx context.Context, docs []billing.StoredInvoice) error {
	if s.failInvoices.Load() {
		return errInjected
	}
	return s.Store.SaveInvoices(ctx, docs)
}

// countingLock is a mutex that counts its takers.
type countingLock struct {
	mutexLock
	taken atomic.Int64
}

func (l *countingLock) Lock(ctx context.Context, name string) (func(), error) {
	l.taken.Add(1)
	return l.mutexLock.Lock(ctx, name)
}

// voidService is a service over store with t00's credit grant of 1.00
// (when cr is not nil) and acc.
func voidService(t *testing.T, f *invoiceFixture, store closing.Statements, cr closing.Credits, lock closing.Locker, acc *billing.Accounts) *closing.Service {
	t.Helper()
	d := closing.Deps{Reads: f.reads, Store: store, Lock: lock,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }}
	if cr != nil {
		d.Credits = cr
	}
	svc, err := closing.NewService(d, closing.Config{Accounts: acc})
	if err != nil {
		t.Fatal(err)
	}
	if cr != nil {
		g := billing.CreditGrant{ID: "t00-prepaid", Tenant: "t00", Kind: billing.CreditPrepaid, Amount: 1_000_000_000,
			EffectiveFrom: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)}
		if _, _, err := svc.CreateGrant(t.Context(), g); err != nil {
			t.Fatal(err)
		}
	}
	return svc
}

// ledgerOf is t00's ledger as "kind whose amount", whose being the
// statement's revision in rev (by hash), sorted.
func ledgerOf(t *testing.T, svc *closing.Service, rev map[string]string) []string {
	t.Helper()
	entries, err := svc.CreditLedger(t.Context(), "t00")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if e.Period != "2026-09" {
			continue
		}
		got = append(got, fmt.Sprintf("%s %s %s", e.Kind, rev[e.Statement], e.Amount))
	}
	slices.Sort(got)
	return got
}

// TestVoidKeepsContract: the reissue of a contract tenant's statement is
// priced with its contract, as its close was (a commitment of 100.00: the
// true-up is billed again, not the usage at list price alone).
func TestVoidKeepsContract(t *testing.T) {
	f := newInvoiceFixture(t, 1)
	ctx := t.Context()
	acc := accounts("INV-", "0.1")
	acc.Tenants[0].Contract = &billing.Contract{Commitment: &billing.Commitment{MonthlySpend: 100_000_000_000}}
	svc := voidService(t, f, f.store, nil, &mutexLock{}, acc)
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	orig, ok, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	res, err := svc.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "buyer address"})
	if err != nil {
		t.Fatal(err)
	}
	var before, after billing.Statement
	if err := json.Unmarshal(orig.Content, &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(res.Reissued.Content, &after); err != nil {
		t.Fatal(err)
	}
	if before.Total != 100_000_000_000 {
		t.Fatalf("the close billed %s, want the commitment, 100.00", before.Total)
	}
	if after.Total != before.Total || after.Charge != before.Charge || len(after.Charges) != len(before.Charges) ||
		!slices.ContainsFunc(after.Charges, func(c billing.Charge) bool { return c.Kind == billing.ChargeCommitment }) {
		t.Errorf("reissue: total %s, charge %s, charges %+v; the close's: %s, %s, %+v", after.Total, after.Charge, after.Charges,
			before.Total, before.Charge, before.Charges)
	}
	inv, err := res.Invoice.Decode()
	if err != nil || inv.Subtotal != 100_000_000_000 {
		t.Errorf("reissue's invoice subtotal %s (%v), want 100.00", inv.Subtotal, err)
	}
}

// TestVoidRefusesUnpricedUsage: a statement closed with unpriced usage
// flagged (an admin's choice) is reissued only when the void flags it
// too; otherwise the void is refused and changes nothing.
func TestVoidRefusesUnpricedUsage(t *testing.T) {
	f := newInvoiceFixture(t, 1)
	ctx := t.Context()
	chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("x1", "t00", "unpriced", time.Date(2026, 9, 4, 10, 0, 0, 0, time.UTC), 1000, 0, 100)})
	billingtest.RollUp(t, f.store)
	svc := voidService(t, f, f.store, nil, &mutexLock{}, accounts("INV-", "0.1"))
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09", FlagUnpriced: true}); err != nil {
		t.Fatal(err)
	}
	orig, ok, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	req := closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "price missing"}
	if _, err := svc.Void(ctx, req); !errors.Is(err, closing.ErrUnpricedUsage) {
		t.Fatalf("void of unpriced usage unflagged: %v, want ErrUnpricedUsage", err)
	}
	if cur, _, _ := f.store.Statement(ctx, "t00", "2026-09"); cur.Hash != orig.Hash {
		t.Fatal("a refused void changed the statement in force")
	}
	req.FlagUnpriced = true
	res, err := svc.Void(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var st billing.Statement
	if err := json.Unmarshal(res.Reissued.Content, &st); err != nil {
		t.Fatal(err)
	}
	if st.UnpricedRequests != 1 {
		t.Errorf("reissue flags %d unpriced requests, want 1", st.UnpricedRequests)
	}
}

// TestFailedVoidGivesNothingBack: a void whose new revision fails to be
// stored leaves the ledger as it was (no return of the draws of the
// revision still in force: the next close would draw them again); its
// retry gives back and draws again, once.
func TestFailedVoidGivesNothingBack(t *testing.T) {
	f := newInvoiceFixture(t, 1)
	ctx := t.Context()
	store := &faultyStore{Store: f.store}
	svc := voidService(t, f, store, f.store, &mutexLock{}, accounts("INV-", "0.1"))
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	orig, _, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil {
		t.Fatal(err)
	}
	store.failRevision.Store(true)
	req := closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "wrong buyer address"}
	if _, err := svc.Void(ctx, req); !errors.Is(err, errInjected) {
		t.Fatalf("void with the revision insert failing: %v, want errInjected", err)
	}
	rev := map[string]string{orig.Hash: "original"}
	if got, want := ledgerOf(t, svc, rev), []string{"draw original 1"}; !slices.Equal(got, want) {
		t.Fatalf("ledger after the failed void %v, want %v", got, want)
	}
	if bal, err := svc.CreditBalance(ctx, "t00"); err != nil || len(bal) != 1 || bal[0].Remaining != 0 {
		t.Fatalf("balance after the failed void %+v (%v), want nothing left", bal, err)
	}
	store.failRevision.Store(false)
	res, err := svc.Void(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rev[res.Reissued.Hash] = "reissue"
	if got, want := ledgerOf(t, svc, rev), []string{"draw original 1", "draw reissue 1", "return original 1"}; !slices.Equal(got, want) {
		t.Errorf("ledger after the void %v, want %v", got, want)
	}
	if bal, err := svc.CreditBalance(ctx, "t00"); err != nil || len(bal) != 1 || bal[0].Drawn != 1_000_000_000 || bal[0].Remaining != 0 {
		t.Errorf("balance %+v (%v), want 1.00 drawn once", bal, err)
	}
}

// TestVoidLedgerFailureCompleted: a void stores its revision and fails to
// write its ledger. Its retry (the revision in force is the reissue), or
// else the tenant's next close, completes the ledger: the original's
// return and the reissue's draw, each once, so the balance is neither
// inflated nor spent twice.
func TestVoidLedgerFailureCompleted(t *testing.T) {
	for _, by := range []string{"retry", "next close"} {
		t.Run(by, func(t *testing.T) {
			f := newInvoiceFixture(t, 1)
			ctx := t.Context()
			cr := &failingCredits{Credits: f.store}
			svc := voidService(t, f, f.store, cr, &mutexLock{}, accounts("INV-", "0.1"))
			if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09", Tenants: []string{"t00"}}); err != nil {
				t.Fatal(err)
			}
			orig, _, err := f.store.Statement(ctx, "t00", "2026-09")
			if err != nil {
				t.Fatal(err)
			}
			cr.fail = true
			req := closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "wrong buyer address"}
			if _, err := svc.Void(ctx, req); !errors.Is(err, errLedgerDown) {
				t.Fatalf("void with the ledger down: %v, want errLedgerDown", err)
			}
			cur, _, err := f.store.Statement(ctx, "t00", "2026-09")
			if err != nil || cur.Hash == orig.Hash {
				t.Fatalf("the reissue was not stored (%v)", err)
			}
			cr.fail = false
			if by == "retry" {
				if _, err := svc.Void(ctx, req); err != nil {
					t.Fatal(err)
				}
			} else if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-10", Tenants: []string{"t00"}}); err != nil {
				t.Fatal(err)
			}
			rev := map[string]string{orig.Hash: "original", cur.Hash: "reissue"}
			if got, want := ledgerOf(t, svc, rev), []string{"draw original 1", "draw reissue 1", "return original 1"}; !slices.Equal(got, want) {
				t.Errorf("September's ledger %v, want %v", got, want)
			}
			if bal, err := svc.CreditBalance(ctx, "t00"); err != nil || len(bal) != 1 || bal[0].Drawn != 1_000_000_000 || bal[0].Remaining != 0 {
				t.Errorf("balance %+v (%v), want 1.00 drawn once", bal, err)
			}
		})
	}
}

// TestInvoiceDatedWhenIssued: an invoice issued late (its close failed
// to issue it) is dated when it is issued, after the invoices numbered
// before it, not at its statement's close: numbers and issue dates run
// in the same order.
func TestInvoiceDatedWhenIssued(t *testing.T) {
	f := newInvoiceFixture(t, 1)
	ctx := t.Context()
	store := &faultyStore{Store: f.store}
	svc := voidService(t, f, store, nil, &mutexLock{}, accounts("INV-", "0.1"))
	store.failInvoices.Store(true)
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); !errors.Is(err, errInjected) {
		t.Fatalf("close with invoices failing: %v, want errInjected", err)
	}
	store.failInvoices.Store(false)
	sep, _, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil {
		t.Fatal(err)
	}
	// Until ClickHouse's clock is a second past September's close (issue
	// times are whole seconds).
	for {
		now, err := f.store.ServerNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if now.Truncate(time.Second).After(sep.ClosedAt.Truncate(time.Second)) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-10"}); err != nil {
		t.Fatal(err)
	}
	oct, err := svc.Invoice(ctx, "t00", "2026-10")
	if err != nil {
		t.Fatal(err)
	}
	late, err := svc.Invoice(ctx, "t00", "2026-09")
	if err != nil {
		t.Fatal(err)
	}
	if late.Invoice.Seq <= oct.Invoice.Seq {
		t.Fatalf("September's invoice %s numbered before October's %s", late.Invoice.Number, oct.Invoice.Number)
	}
	if late.Invoice.IssuedAt.Before(oct.Invoice.IssuedAt) || late.Invoice.IssueDate < oct.Invoice.IssueDate ||
		!late.Invoice.IssuedAt.After(sep.ClosedAt) {
		t.Errorf("September's invoice %s issued %s (%s), October's %s issued %s (%s), September closed %s: want issued when issued",
			late.Invoice.Number, late.Invoice.IssuedAt, late.Invoice.IssueDate, oct.Invoice.Number, oct.Invoice.IssuedAt, oct.Invoice.IssueDate, sep.ClosedAt)
	}
}

// TestTenantReadDoesNotIssue: a tenant's read of an invoice not issued
// yet takes no close lock and allocates no number (ErrInvoiceNotIssued);
// an admin's read issues it, and the tenant's reads see it then.
func TestTenantReadDoesNotIssue(t *testing.T) {
	f := newInvoiceFixture(t, 1)
	ctx := t.Context()
	store := &faultyStore{Store: f.store}
	lock := &countingLock{}
	svc := voidService(t, f, store, nil, lock, accounts("INV-", "0.1"))
	store.failInvoices.Store(true)
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); !errors.Is(err, errInjected) {
		t.Fatalf("close with invoices failing: %v, want errInjected", err)
	}
	store.failInvoices.Store(false)
	taken := lock.taken.Load()
	for range 3 {
		if _, err := svc.IssuedInvoice(ctx, "t00", "2026-09"); !errors.Is(err, closing.ErrInvoiceNotIssued) {
			t.Fatalf("tenant's read: %v, want ErrInvoiceNotIssued", err)
		}
	}
	if got := lock.taken.Load(); got != taken {
		t.Errorf("tenant's reads took the close lock %d times", got-taken)
	}
	if seq, err := f.store.LastInvoiceSeq(ctx, "INV-"); err != nil || seq != 0 {
		t.Errorf("after tenant's reads the last number is %d (%v), want none", seq, err)
	}
	admin, err := svc.Invoice(ctx, "t00", "2026-09")
	if err != nil {
		t.Fatal(err)
	}
	v, err := svc.IssuedInvoice(ctx, "t00", "2026-09")
	if err != nil || v.Invoice.Number != admin.Invoice.Number || v.Stored.Hash != admin.Stored.Hash {
		t.Errorf("tenant's read after the admin's: %s (%v), want %s", v.Invoice.Number, err, admin.Invoice.Number)
	}
	if _, err := svc.IssuedInvoice(ctx, "t00", "2026-11"); !errors.Is(err, closing.ErrNotClosed) {
		t.Errorf("tenant's read of an open period: %v, want ErrNotClosed", err)
	}
}
