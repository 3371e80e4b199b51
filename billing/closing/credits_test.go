package closing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/closing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// creditsFixture is n tenants with November and December 2026 usage of m
// (book's prices: 0.60 per 1M input tokens in November, 1.00 in
// December), tenant i using (i+1)M input tokens a month ((i+1) × 0.60 USD,
// then (i+1) × 1.00), and grants: a promotional 2.00 expiring on
// December 10, a prepaid 2.50 without expiry,
// and a prepaid in EUR that a USD statement never draws on.
type creditsFixture struct {
	store   *chstore.Store
	reads   *query.Service
	book    *billing.PriceBook
	tenants []closing.Tenant
	grants  []billing.CreditGrant
}

func newCreditsFixture(t *testing.T, n int) *creditsFixture { return newCreditsFixtureTB(t, n, true) }

// newCreditsFixtureTB is newCreditsFixture, with the grants only when
// grants.
func newCreditsFixtureTB(t testing.TB, n int, grants bool) *creditsFixture {
	t.Helper()
	s := chstoretest.OpenMigrated(t)
	b, err := billing.ParsePriceBook([]byte(book))
	if err != nil {
		t.Fatal(err)
	}
	f := &creditsFixture{store: s, reads: query.New(s, query.Config{}), book: b}
	var events []*meterv1.InferenceEvent
	nov1 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		tenant := fmt.Sprintf("t%02d", i)
		f.tenants = append(f.tenants, closing.Tenant{ID: tenant, Zone: time.UTC})
		for m, at := range []time.Time{nov1.Add(36 * time.Hour), nov1.AddDate(0, 1, 2)} {
			events = append(events, ev(fmt.Sprintf("%s-%d", tenant, m), tenant, "m", at, int64(i+1)*1_000_000, 0, 0))
		}
		for _, g := range []billing.CreditGrant{
			{ID: tenant + "-promo", Kind: billing.CreditPromotional, Amount: 2_000_000_000, Currency: "USD",
				EffectiveFrom: nov1.AddDate(0, -1, 0), ExpiresAt: time.Date(2026, 12, 10, 0, 0, 0, 0, time.UTC)},
			{ID: tenant + "-prepaid", Kind: billing.CreditPrepaid, Amount: 2_500_000_000, Currency: "USD", EffectiveFrom: nov1},
			{ID: tenant + "-eur", Kind: billing.CreditPrepaid, Amount: 9_000_000_000, Currency: "EUR", EffectiveFrom: nov1},
		} {
			g.Tenant, g.CreatedAt = tenant, nov1
			if !grants {
				continue
			}
			if _, created, err := s.PutCreditGrant(t.Context(), g); err != nil || !created {
				t.Fatalf("grant %s: created %v, %v", g.ID, created, err)
			}
			f.grants = append(f.grants, g)
		}
	}
	chstoretest.Insert(t, s, events)
	return f
}

func (f *creditsFixture) request(period string) closing.Request {
	now := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	return closing.Request{Period: period, Tenants: f.tenants, Book: f.book, Grace: billing.DefaultGrace, Now: now, CaughtUp: now}
}

func (f *creditsFixture) closer(cr closing.Credits) *closing.Closer {
	c := closing.New(f.reads, f.store, nil)
	c.UseCredits(cr)
	return c
}

// checkLedger checks every tenant's ledger against its closed statements:
// the entries are exactly those the statements' Credits make (each once),
// each balance is granted − drawn − expired, never negative, and what the
// statements drew from a grant is what the ledger says was drawn.
func (f *creditsFixture) checkLedger(t *testing.T) map[string]billing.GrantBalance {
	t.Helper()
	ctx := t.Context()
	drawn := map[string]billing.Money{}
	var want []billing.CreditEntry
	for _, tn := range f.tenants {
		closed, err := f.store.TenantStatements(ctx, tn.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, stored := range closed {
			var st billing.Statement
			if err := json.Unmarshal(stored.Content, &st); err != nil {
				t.Fatal(err)
			}
			var sum billing.Money
			for _, l := range st.Lines {
				sum += l.Charge
			}
			for _, c := range st.Charges {
				sum += c.Amount
				if c.Kind == billing.ChargeCredit {
					drawn[c.Rule[len("grant:"):]] -= c.Amount
				}
			}
			if sum != st.Charge || st.Charge < 0 {
				t.Errorf("%s %s: lines and charges sum to %s, charge %s", tn.ID, st.Period, sum, st.Charge)
			}
			want = append(want, billing.CreditEntriesOf(st, stored.ClosedAt)...)
		}
	}
	got, err := f.store.CreditEntries(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	wantIDs := map[string]billing.Money{}
	for _, e := range want {
		wantIDs[e.ID] = e.Amount
	}
	gotIDs := map[string]billing.Money{}
	for _, e := range got {
		if _, dup := gotIDs[e.ID]; dup {
			t.Errorf("entry %s read twice", e.ID)
		}
		gotIDs[e.ID] = e.Amount
	}
	if fmt.Sprint(gotIDs) != fmt.Sprint(wantIDs) {
		t.Errorf("ledger %v,\nthe statements make %v", gotIDs, wantIDs)
	}
	balances, err := billing.Balances(f.grants, got)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]billing.GrantBalance{}
	for _, b := range balances {
		if b.Remaining < 0 || b.Remaining != b.Grant.Amount-b.Drawn-b.Expired || b.Drawn != drawn[b.Grant.ID] {
			t.Errorf("grant %s: %+v; the statements drew %s", b.Grant.ID, b, drawn[b.Grant.ID])
		}
		out[b.Grant.ID] = b
	}
	return out
}

// TestCloseDrawsCreditsOnce closes November for twelve tenants from eight
// closes at once (each closing four tenants at a time; half of them on
// one Closer, half on Closers of their own, as replicas would), then
// December the same way: every close returns the same statements, each
// statement draws promotional credit before prepaid, December's close
// expires what is left of the promotional grant, the ledger holds each
// statement's draws once, no balance is negative and none is spent twice;
// closing again draws nothing, and a draft of January shows its draws
// without writing them.
func TestCloseDrawsCreditsOnce(t *testing.T) {
	f := newCreditsFixture(t, 12)
	ctx := t.Context()
	shared := f.closer(f.store)
	for _, period := range []string{"2026-11", "2026-12"} {
		var wg sync.WaitGroup
		hashes := make([]map[string]string, 8)
		errs := make([]error, 8)
		for i := range 8 {
			c := shared
			if i%2 == 1 {
				c = f.closer(f.store)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := c.Close(ctx, f.request(period))
				hashes[i], errs[i] = map[string]string{}, err
				for _, st := range got {
					hashes[i][st.Tenant] = st.Hash
				}
			}()
		}
		wg.Wait()
		for i := range 8 {
			if errs[i] != nil {
				t.Fatalf("%s close %d: %v", period, i, errs[i])
			}
			if len(hashes[i]) != 12 || fmt.Sprint(hashes[i]) != fmt.Sprint(hashes[0]) {
				t.Fatalf("%s close %d returned %v, close 0 %v", period, i, hashes[i], hashes[0])
			}
		}
		f.checkLedger(t)
	}
	balances := f.checkLedger(t)
	// t00 used 0.60, then 1.00: both months drew on the promotion, and
	// December's close expired its last 0.40. t01 used 1.20, then 2.00:
	// November drew 1.20 of the promotion, December 0.80 of it and 1.20
	// of prepaid. t11 used 7.20 in November: it drew the promotion and the
	// whole prepaid grant.
	for id, want := range map[string][3]billing.Money{ // drawn, expired, remaining
		"t00-promo": {1_600_000_000, 400_000_000, 0}, "t00-prepaid": {0, 0, 2_500_000_000},
		"t01-promo": {2_000_000_000, 0, 0}, "t01-prepaid": {1_200_000_000, 0, 1_300_000_000},
		"t11-promo": {2_000_000_000, 0, 0}, "t11-prepaid": {2_500_000_000, 0, 0},
		"t00-eur": {0, 0, 9_000_000_000},
	} {
		b := balances[id]
		if got := [3]billing.Money{b.Drawn, b.Expired, b.Remaining}; got != want {
			t.Errorf("%s: drawn, expired, remaining %v, want %v", id, got, want)
		}
	}
	stored, ok, err := f.store.Statement(ctx, "t11", "2026-11")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var nov billing.Statement
	if err := json.Unmarshal(stored.Content, &nov); err != nil {
		t.Fatal(err)
	}
	if len(nov.Charges) != 2 || nov.Charges[0].Rule != "grant:t11-promo" || nov.Charges[1].Rule != "grant:t11-prepaid" ||
		nov.Total != 2_700_000_000 {
		t.Errorf("t11's November: charges %+v, total %s; want the promotion, then prepaid, 2.70 to pay", nov.Charges, nov.Total)
	}

	// Closing again returns the stored statements and draws nothing.
	before, err := f.store.CreditEntries(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Close(ctx, f.request("2026-11")); err != nil {
		t.Fatal(err)
	}
	after, err := f.store.CreditEntries(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("closing again wrote %d ledger entries", len(after)-len(before))
	}

	// January's draft draws on the balance, and writes nothing.
	chstoretest.Insert(t, f.store, []*meterv1.InferenceEvent{ev("t00-jan", "t00", "m", time.Date(2027, 1, 2, 0, 0, 0, 0, time.UTC), 1_000_000, 0, 0)})
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Credits: f.store,
		Prices: func(context.Context) (*billing.PriceBook, error) { return f.book, nil }},
		closing.Config{Now: func() time.Time { return time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC) }})
	if err != nil {
		t.Fatal(err)
	}
	draft, err := svc.Statement(ctx, "t00", "2027-01", false)
	if err != nil {
		t.Fatal(err)
	}
	if draft.Closed || len(draft.Statement.Credits) != 1 || draft.Statement.Credits[0].Drawn != 1_000_000_000 || draft.Statement.Total != 0 {
		t.Errorf("January's draft: credits %+v, total %s; want 1.00 drawn from prepaid, nothing to pay", draft.Statement.Credits, draft.Statement.Total)
	}
	if again, _ := f.store.CreditEntries(ctx, ""); len(again) != len(after) {
		t.Errorf("a draft wrote %d ledger entries", len(again)-len(after))
	}
}

// failingCredits fails AddCreditEntries while fail is set: a close that
// stored its statement and stopped before its ledger.
type failingCredits struct {
	closing.Credits
	fail bool
}

var errLedgerDown = errors.New("ledger down")

func (c *failingCredits) AddCreditEntries(ctx context.Context, entries []billing.CreditEntry) error {
	if c.fail && len(entries) > 0 {
		return errLedgerDown
	}
	return c.Credits.AddCreditEntries(ctx, entries)
}

// TestCloseReconcilesCreditLedger: November's statement is stored but its
// ledger write fails; December's close writes November's entries first,
// so December draws what is left, not the whole grants again.
func TestCloseReconcilesCreditLedger(t *testing.T) {
	f := newCreditsFixture(t, 2)
	ctx := t.Context()
	cr := &failingCredits{Credits: f.store, fail: true}
	c := f.closer(cr)
	if _, err := c.Close(ctx, f.request("2026-11")); !errors.Is(err, errLedgerDown) {
		t.Fatalf("close with the ledger down: %v, want errLedgerDown", err)
	}
	if _, ok, _ := f.store.Statement(ctx, "t01", "2026-11"); !ok {
		t.Fatal("November's statement was not stored")
	}
	cr.fail = false
	if _, err := c.Close(ctx, f.request("2026-12")); err != nil {
		t.Fatal(err)
	}
	balances := f.checkLedger(t)
	// t01 used 1.20, then 2.00: the promotion, then 1.20 of prepaid.
	if b := balances["t01-prepaid"]; b.Drawn != 1_200_000_000 || b.Remaining != 1_300_000_000 {
		t.Errorf("t01's prepaid grant: %+v, want 1.20 drawn, 1.30 left", b)
	}
}

// TestCreateGrantIdempotent: the same grant twice is stored once; its id
// with other terms is a conflict; a grant in another currency than the
// book's is refused.
func TestCreateGrantIdempotent(t *testing.T) {
	f := newCreditsFixture(t, 1)
	ctx := t.Context()
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Credits: f.store,
		Prices: func(context.Context) (*billing.PriceBook, error) { return f.book, nil }}, closing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	g := billing.CreditGrant{ID: "welcome", Tenant: "acme", Kind: billing.CreditPromotional, Amount: 5_000_000_000,
		EffectiveFrom: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), CreatedBy: "ops"}
	first, created, err := svc.CreateGrant(ctx, g)
	if err != nil || !created || first.Currency != "USD" {
		t.Fatalf("first create: %+v, created %v, %v", first, created, err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			again, created, err := svc.CreateGrant(ctx, g)
			if err != nil || created || !again.SameTerms(first) || !again.CreatedAt.Equal(first.CreatedAt) {
				t.Errorf("create again: %+v, created %v, %v", again, created, err)
			}
		}()
	}
	wg.Wait()
	grants, err := f.store.CreditGrants(ctx, "acme")
	if err != nil || len(grants) != 1 {
		t.Fatalf("acme's grants %+v, %v; want one", grants, err)
	}
	other := g
	other.Amount++
	if _, _, err := svc.CreateGrant(ctx, other); !errors.Is(err, billing.ErrGrantConflict) {
		t.Errorf("other terms: %v, want ErrGrantConflict", err)
	}
	eur := g
	eur.ID, eur.Currency = "eur", "EUR"
	if _, _, err := svc.CreateGrant(ctx, eur); !errors.Is(err, billing.ErrInvalidGrant) {
		t.Errorf("EUR grant: %v, want ErrInvalidGrant", err)
	}
	bal, err := svc.CreditBalance(ctx, "acme")
	if err != nil || len(bal) != 1 || bal[0].Remaining != 5_000_000_000 {
		t.Errorf("acme's balance %+v, %v", bal, err)
	}
}

// TestReturnCredits: voiding a closed statement gives back what it drew
// and expired, once however often it is asked (a void retried), and the
// ledger then still adds up.
func TestReturnCredits(t *testing.T) {
	f := newCreditsFixture(t, 1)
	ctx := t.Context()
	c := f.closer(f.store)
	for _, period := range []string{"2026-11", "2026-12"} {
		if _, err := c.Close(ctx, f.request(period)); err != nil {
			t.Fatal(err)
		}
	}
	dec, ok, err := f.store.Statement(ctx, "t00", "2026-12")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	at := time.Date(2027, 1, 10, 0, 0, 0, 0, time.UTC)
	for range 2 {
		if err := closing.ReturnCredits(ctx, f.store, dec, at); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := f.store.CreditEntries(ctx, "t00")
	if err != nil {
		t.Fatal(err)
	}
	balances, err := billing.Balances(f.grants[:3], entries)
	if err != nil {
		t.Fatal(err)
	}
	// t00 used 0.60 in November (promotion), 1.00 in December (the
	// promotion's last 1.40 of 2.00 covers it, 0.40 expired): voiding
	// December gives back its 1.00 and the 0.40.
	for _, b := range balances {
		want := map[string]billing.Money{"t00-promo": 1_400_000_000, "t00-prepaid": 2_500_000_000, "t00-eur": 9_000_000_000}[b.Grant.ID]
		if b.Remaining != want {
			t.Errorf("%s after the void: %+v, want %s left", b.Grant.ID, b, want)
		}
	}
	kinds := map[billing.LedgerKind]int{}
	for _, e := range entries {
		kinds[e.Kind]++
	}
	if kinds[billing.LedgerReturn] != 1 || kinds[billing.LedgerExpiryReversal] != 1 || kinds[billing.LedgerDraw] != 2 || kinds[billing.LedgerExpiry] != 1 {
		t.Errorf("ledger kinds %v, want 2 draws, 1 expiry, 1 return, 1 reversal", kinds)
	}
}

// TestVoidReturnsCredits: voiding a closed statement that drew on a grant
// gives the draw back and the reissue draws again, so the grant is spent
// once, by the revision in force; a retried void changes nothing.
func TestVoidReturnsCredits(t *testing.T) {
	f := newInvoiceFixture(t, 1)
	ctx := t.Context()
	svc, err := closing.NewService(closing.Deps{Reads: f.reads, Store: f.store, Lock: &mutexLock{}, Credits: f.store,
		Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, f.store) }},
		closing.Config{Accounts: accounts("INV-", "0.1")})
	if err != nil {
		t.Fatal(err)
	}
	g := billing.CreditGrant{ID: "t00-prepaid", Tenant: "t00", Kind: billing.CreditPrepaid, Amount: 1_000_000_000,
		EffectiveFrom: time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)}
	if _, _, err := svc.CreateGrant(ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Close(ctx, closing.CloseRequest{Period: "2026-09"}); err != nil {
		t.Fatal(err)
	}
	orig, ok, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for range 2 {
		if _, err := svc.Void(ctx, closing.VoidRequest{Tenant: "t00", Period: "2026-09", Hash: orig.Hash, Reason: "wrong buyer address"}); err != nil {
			t.Fatal(err)
		}
	}
	cur, ok, err := f.store.Statement(ctx, "t00", "2026-09")
	if err != nil || !ok || cur.Hash == orig.Hash {
		t.Fatalf("statement in force %v %v, hash %s (the original's %s)", ok, err, cur.Hash, orig.Hash)
	}
	var reissue billing.Statement
	if err := json.Unmarshal(cur.Content, &reissue); err != nil {
		t.Fatal(err)
	}
	if len(reissue.Credits) != 1 || reissue.Credits[0].Opening != 1_000_000_000 || reissue.Credits[0].Drawn != 1_000_000_000 {
		t.Errorf("the reissue's credits %+v, want the whole grant back and drawn again", reissue.Credits)
	}
	bal, err := svc.CreditBalance(ctx, "t00")
	if err != nil || len(bal) != 1 || bal[0].Drawn != 1_000_000_000 || bal[0].Remaining != 0 {
		t.Fatalf("balance %+v, %v; want 1.00 drawn once", bal, err)
	}
	entries, err := svc.CreditLedger(ctx, "t00")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		who := "original"
		if e.Statement == cur.Hash {
			who = "reissue"
		}
		got = append(got, fmt.Sprintf("%s %s %s", e.Kind, who, e.Amount))
	}
	slices.Sort(got)
	if want := []string{"draw original 1", "draw reissue 1", "return original 1"}; !slices.Equal(got, want) {
		t.Errorf("ledger %v, want %v", got, want)
	}
}

// TestReplicaClosesSpendOnce closes September for eight tenants from two
// services sharing one close lock, as two meterd replicas share the Kafka
// lock, three closes on each at once, while an admin grants more credit
// on both: every close returns the same statements, and the ledger holds
// each statement's draws once, no grant below zero.
func TestReplicaClosesSpendOnce(t *testing.T) {
	inv := newInvoiceFixture(t, 8)
	ctx := t.Context()
	lock := &mutexLock{}
	replica := func() *closing.Service {
		svc, err := closing.NewService(closing.Deps{Reads: inv.reads, Store: inv.store, Lock: lock, Credits: inv.store,
			Prices: func(ctx context.Context) (*billing.PriceBook, error) { return billing.BookInForce(ctx, inv.store) }},
			closing.Config{Accounts: accounts("INV-", "0")})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	replicas := []*closing.Service{replica(), replica()}
	f := &creditsFixture{store: inv.store}
	sep1 := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	for i := range 8 {
		tenant := fmt.Sprintf("t%02d", i)
		f.tenants = append(f.tenants, closing.Tenant{ID: tenant, Zone: time.UTC})
		g := billing.CreditGrant{ID: tenant + "-promo", Tenant: tenant, Kind: billing.CreditPromotional, Amount: 700_000_000, EffectiveFrom: sep1}
		stored, _, err := replicas[i%2].CreateGrant(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		f.grants = append(f.grants, stored)
	}
	var wg sync.WaitGroup
	hashes := make([]string, 6)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := replicas[i%2].Close(ctx, closing.CloseRequest{Period: "2026-09"})
			if err != nil {
				t.Error(err)
				return
			}
			for _, st := range got {
				hashes[i] += st.Hash
			}
		}()
	}
	for i := range 8 { // more credit, granted while the closes run
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := billing.CreditGrant{ID: fmt.Sprintf("t%02d-prepaid", i), Tenant: fmt.Sprintf("t%02d", i), Kind: billing.CreditPrepaid,
				Amount: 300_000_000, EffectiveFrom: sep1}
			if _, _, err := replicas[i%2].CreateGrant(ctx, g); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := range 6 {
		if hashes[i] == "" || hashes[i] != hashes[0] {
			t.Fatalf("close %d returned other statements than close 0", i)
		}
	}
	grants, err := inv.store.CreditGrants(ctx, "")
	if err != nil || len(grants) != 16 {
		t.Fatalf("%d grants, %v", len(grants), err)
	}
	f.grants = grants
	balances := f.checkLedger(t)
	var drawn billing.Money
	for _, b := range balances {
		drawn += b.Drawn
	}
	if drawn == 0 {
		t.Error("no close drew on the grants")
	}
}
