package billing_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"tokenmeter/billing"
)

// creditStatement is a statement of p whose usage charges charge: one
// line, as ComputeStatement would make it.
func creditStatement(t *testing.T, tenant string, p billing.Period, charge billing.Money) billing.Statement {
	t.Helper()
	st := billing.Statement{Tenant: tenant, Period: p.Key, Zone: p.Zone.String(), PeriodStart: p.Start.UTC(), PeriodEnd: p.End.UTC(),
		Currency: "USD", PriceBook: "v1", Charge: charge,
		Lines: []billing.StatementLine{{Kind: billing.LineUsage, Model: "m", ChargeStart: p.Start.UTC(), ChargeEnd: p.End.UTC(), Priced: true, Charge: charge}}}
	st.Total = billing.Money(refRound(big.NewInt(int64(charge))).Int64())
	st.Hash, _ = st.ContentHash()
	return st
}

// refGrant is the brute force's own view of a grant: what is left of it.
type refGrant struct {
	g    billing.CreditGrant
	left *big.Int
}

// refRound rounds nanos to cents, half away from zero, with big.Rat.
func refRound(nanos *big.Int) *big.Int {
	r := new(big.Rat).SetFrac(nanos, big.NewInt(10_000_000))
	abs := new(big.Rat).Abs(r)
	q := new(big.Int).Quo(abs.Num(), abs.Denom())
	rem := new(big.Rat).Sub(abs, new(big.Rat).SetInt(q))
	if rem.Cmp(big.NewRat(1, 2)) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if r.Sign() < 0 {
		q.Neg(q)
	}
	return q.Mul(q, big.NewInt(10_000_000))
}

// TestApplyCreditsBruteForce closes a year of generated months for
// generated tenants and grants (both kinds, priorities, expiries inside
// periods and exactly on their boundaries, grants taking effect on a
// boundary, zones off whole hours, grants in another currency or of
// another tenant, negative charges), one close after the other as closes
// run, writing each statement's ledger (CreditEntriesOf) and reading the
// balances back (Balances). Each statement is checked against a brute
// force written from the rule, not from ApplyCredits: the same draws to the
// nano, the same expiries booked by the same close, lines plus charges
// equal to the charge, the total rounded once to the cent; and every
// balance is granted − drawn − expired, never negative. (Mutations of the
// draw order, of the expiry and of the expiry's boundary each fail it.)
func TestApplyCreditsBruteForce(t *testing.T) {
	zones := []string{"UTC", "+05:30", "-08:00"}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 32))
		zone, err := billing.ParseZone(zones[rng.IntN(len(zones))])
		if err != nil {
			t.Fatal(err)
		}
		first, err := billing.ParsePeriod("2026-01", zone)
		if err != nil {
			t.Fatal(err)
		}
		var grants []billing.CreditGrant
		for i := range rng.IntN(6) {
			g := billing.CreditGrant{ID: fmt.Sprintf("g%d", i), Tenant: "acme", Kind: billing.CreditPrepaid, Currency: "USD",
				Amount:        billing.Money(1 + rng.Int64N(50_000_000_000)),
				EffectiveFrom: first.Start.Add(time.Duration(rng.Int64N(int64(200 * 24 * time.Hour)))).Truncate(time.Second), Priority: int32(rng.IntN(3))}
			if rng.IntN(2) == 0 {
				g.Kind = billing.CreditPromotional
			}
			boundary := func() time.Time { // a period's first instant
				b := first
				for range rng.IntN(10) {
					b = b.Next()
				}
				return b.Start
			}
			if rng.IntN(4) == 0 {
				g.EffectiveFrom = boundary()
			}
			if rng.IntN(2) == 0 {
				g.ExpiresAt = g.EffectiveFrom.Add(time.Duration(1+rng.Int64N(120*24*3600)) * time.Second)
				if b := boundary(); rng.IntN(2) == 0 && b.After(g.EffectiveFrom) {
					g.ExpiresAt = b // expires as a period starts: in force up to its end
				}
			}
			switch rng.IntN(10) {
			case 0:
				g.Currency = "EUR" // never drawn by a USD statement
			case 1:
				g.Tenant = "globex" // never drawn by acme
			}
			if err := g.Validate(); err != nil {
				t.Fatal(err)
			}
			grants = append(grants, g)
		}
		ref := make([]*refGrant, len(grants))
		for i, g := range grants {
			ref[i] = &refGrant{g: g, left: big.NewInt(int64(g.Amount))}
		}
		var entries []billing.CreditEntry
		p := first
		for range 12 {
			charge := billing.Money(rng.Int64N(30_000_000_000) - 3_000_000_000)
			st := creditStatement(t, "acme", p, charge)
			balances, err := billing.Balances(grants, entries)
			if err != nil {
				t.Fatalf("seed %d %s: %v", seed, p.Key, err)
			}
			if err := billing.ApplyCredits(&st, p, balances); err != nil {
				t.Fatal(err)
			}

			// The brute force: eligible grants by the written rule, sorted
			// by a key built here, drawn greedily.
			var eligible []*refGrant
			for _, r := range ref {
				if r.g.Tenant == "acme" && r.g.Currency == "USD" {
					eligible = append(eligible, r)
				}
			}
			sort.SliceStable(eligible, func(i, j int) bool {
				a, b := eligible[i].g, eligible[j].g
				if a.Kind != b.Kind {
					return a.Kind == billing.CreditPromotional
				}
				if a.Priority != b.Priority {
					return a.Priority < b.Priority
				}
				if a.ExpiresAt.IsZero() != b.ExpiresAt.IsZero() {
					return !a.ExpiresAt.IsZero()
				}
				if !a.ExpiresAt.Equal(b.ExpiresAt) {
					return a.ExpiresAt.Before(b.ExpiresAt)
				}
				if !a.EffectiveFrom.Equal(b.EffectiveFrom) {
					return a.EffectiveFrom.Before(b.EffectiveFrom)
				}
				return a.ID < b.ID
			})
			want := big.NewInt(int64(charge))
			wantDraws, wantExpired := map[string]int64{}, map[string]int64{}
			for _, r := range eligible {
				inForce := r.g.EffectiveFrom.Before(p.End) && (r.g.ExpiresAt.IsZero() || r.g.ExpiresAt.After(p.Start))
				if inForce && want.Sign() > 0 && r.left.Sign() > 0 {
					d := new(big.Int).Set(r.left)
					if want.Cmp(d) < 0 {
						d.Set(want)
					}
					want.Sub(want, d)
					r.left.Sub(r.left, d)
					wantDraws[r.g.ID] = d.Int64()
				}
				if !r.g.ExpiresAt.IsZero() && !r.g.ExpiresAt.After(p.End) && r.left.Sign() > 0 {
					wantExpired[r.g.ID] = r.left.Int64()
					r.left.SetInt64(0)
				}
			}

			gotDraws := map[string]int64{}
			sum := new(big.Int)
			for _, l := range st.Lines {
				sum.Add(sum, big.NewInt(int64(l.Charge)))
			}
			for _, c := range st.Charges {
				sum.Add(sum, big.NewInt(int64(c.Amount)))
				if c.Kind != billing.ChargeCredit || c.Amount >= 0 || !strings.HasPrefix(c.Rule, "grant:") || c.Line != -1 {
					t.Fatalf("seed %d %s: charge %+v is not a credit draw", seed, p.Key, c)
				}
				gotDraws[c.Rule[len("grant:"):]] = -int64(c.Amount)
			}
			if fmt.Sprint(gotDraws) != fmt.Sprint(wantDraws) {
				t.Fatalf("seed %d %s: draws %v, brute force %v", seed, p.Key, gotDraws, wantDraws)
			}
			if sum.Cmp(want) != 0 || int64(st.Charge) != want.Int64() {
				t.Fatalf("seed %d %s: lines+charges %s, charge %s, brute force %s", seed, p.Key, sum, st.Charge, want)
			}
			if got := big.NewInt(int64(st.Total)); got.Cmp(refRound(want)) != 0 {
				t.Fatalf("seed %d %s: total %s, brute force %s nanos", seed, p.Key, st.Total, refRound(want))
			}
			if charge > 0 && st.Charge < 0 {
				t.Fatalf("seed %d %s: credits drew %s from a charge of %s", seed, p.Key, charge-st.Charge, charge)
			}
			if h, _ := st.ContentHash(); h != st.Hash {
				t.Fatalf("seed %d %s: hash %s, content hash %s", seed, p.Key, st.Hash, h)
			}
			gotExpired := map[string]int64{}
			for _, u := range st.Credits {
				if u.Closing != u.Opening-u.Drawn-u.Expired || u.Closing < 0 || u.Drawn < 0 || u.Expired < 0 {
					t.Fatalf("seed %d %s: credit use %+v does not add up", seed, p.Key, u)
				}
				if u.Expired > 0 {
					gotExpired[u.Grant] = int64(u.Expired)
				}
			}
			if fmt.Sprint(gotExpired) != fmt.Sprint(wantExpired) {
				t.Fatalf("seed %d %s: expired %v, brute force %v", seed, p.Key, gotExpired, wantExpired)
			}
			// The close stores st and writes its ledger; the ledger's
			// entries of one statement are the same when written twice.
			entries = append(entries, billing.CreditEntriesOf(st, p.End)...)
			entries = dedupe(append(entries, billing.CreditEntriesOf(st, p.End)...))
			p = p.Next()
		}
		balances, err := billing.Balances(grants, entries)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for _, b := range balances {
			var r *refGrant
			for _, x := range ref {
				if x.g.ID == b.Grant.ID {
					r = x
				}
			}
			if b.Remaining < 0 || b.Remaining != b.Grant.Amount-b.Drawn-b.Expired || b.Remaining != billing.Money(r.left.Int64()) {
				t.Fatalf("seed %d: grant %s: %+v, brute force left %s", seed, b.Grant.ID, b, r.left)
			}
		}
	}
}

// dedupe keeps the first entry of each id, as the ledger's readers do.
func dedupe(entries []billing.CreditEntry) []billing.CreditEntry {
	seen := map[string]bool{}
	var out []billing.CreditEntry
	for _, e := range entries {
		if !seen[e.ID] {
			seen[e.ID] = true
			out = append(out, e)
		}
	}
	return out
}

// TestApplyCreditsExpiry: a grant expiring inside a period is drawn for
// that period, and its close expires the rest; one that expired before a
// period the tenant never closed expires with the next close; expired
// grants are not drawn again.
func TestApplyCreditsExpiry(t *testing.T) {
	nov, _ := billing.ParsePeriod("2026-11", time.UTC)
	mid := time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)
	grants := []billing.CreditGrant{
		{ID: "promo", Tenant: "acme", Kind: billing.CreditPromotional, Amount: 10_000_000_000, Currency: "USD",
			EffectiveFrom: nov.Start.AddDate(0, -1, 0), ExpiresAt: mid},
		{ID: "old", Tenant: "acme", Kind: billing.CreditPromotional, Amount: 1_000_000_000, Currency: "USD",
			EffectiveFrom: nov.Start.AddDate(0, -3, 0), ExpiresAt: nov.Start.AddDate(0, -2, 0)},
		{ID: "prepaid", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 100_000_000_000, Currency: "USD", EffectiveFrom: nov.Start},
	}
	balances, err := billing.Balances(grants, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := creditStatement(t, "acme", nov, 12_345_678_901)
	if err := billing.ApplyCredits(&st, nov, balances); err != nil {
		t.Fatal(err)
	}
	// promo draws 10, old expires whole, prepaid draws 2.345678901.
	want := []billing.CreditUse{
		{Grant: "old", Kind: billing.CreditPromotional, Opening: 1_000_000_000, Expired: 1_000_000_000, Closing: 0},
		{Grant: "promo", Kind: billing.CreditPromotional, Opening: 10_000_000_000, Drawn: 10_000_000_000, Closing: 0},
		{Grant: "prepaid", Kind: billing.CreditPrepaid, Opening: 100_000_000_000, Drawn: 2_345_678_901, Closing: 97_654_321_099},
	}
	if len(st.Credits) != len(want) {
		t.Fatalf("credits %+v, want %+v", st.Credits, want)
	}
	for i, u := range st.Credits {
		u.ExpiresAt = nil
		if u != want[i] {
			t.Errorf("credit %d: %+v, want %+v", i, u, want[i])
		}
	}
	if st.Charge != 0 || st.Total != 0 {
		t.Errorf("charge %s total %s, want 0 and 0", st.Charge, st.Total)
	}
	entries := billing.CreditEntriesOf(st, nov.End)
	after, err := billing.Balances(grants, entries)
	if err != nil {
		t.Fatal(err)
	}
	dec := nov.Next()
	st2 := creditStatement(t, "acme", dec, 1_000_000_000)
	if err := billing.ApplyCredits(&st2, dec, after); err != nil {
		t.Fatal(err)
	}
	if len(st2.Credits) != 1 || st2.Credits[0].Grant != "prepaid" || st2.Credits[0].Drawn != 1_000_000_000 {
		t.Errorf("December's credits %+v, want 1 drawn from prepaid only", st2.Credits)
	}
	// Voiding November gives back its draws and expiries.
	back, err := billing.Balances(grants, append(entries, billing.ReturnEntriesOf(st, dec.Start)...))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range back {
		if b.Remaining != b.Grant.Amount || b.Drawn != 0 || b.Expired != 0 {
			t.Errorf("after the void, %s: %+v, want its whole amount back", b.Grant.ID, b)
		}
	}
}

// TestApplyCreditsKeepsStatementsWithoutGrants: a tenant without a grant
// in force keeps the same statement, byte for byte (and hash).
func TestApplyCreditsKeepsStatementsWithoutGrants(t *testing.T) {
	nov, _ := billing.ParsePeriod("2026-11", time.UTC)
	st := creditStatement(t, "acme", nov, 5_000_000_000)
	before, _ := json.Marshal(st)
	future := billing.CreditGrant{ID: "later", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: nov.End}
	other := billing.CreditGrant{ID: "theirs", Tenant: "globex", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: nov.Start}
	balances, err := billing.Balances([]billing.CreditGrant{future, other}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := billing.ApplyCredits(&st, nov, balances); err != nil {
		t.Fatal(err)
	}
	if after, _ := json.Marshal(st); string(after) != string(before) {
		t.Errorf("statement changed:\n%s\n%s", before, after)
	}
}

// TestBalancesRefusesOverdraw: a ledger taking a grant below zero, or
// naming a grant that does not exist, is an error, never a negative
// balance.
func TestBalancesRefusesOverdraw(t *testing.T) {
	g := billing.CreditGrant{ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 10, Currency: "USD", EffectiveFrom: time.Unix(0, 0)}
	for name, entries := range map[string][]billing.CreditEntry{
		"overdrawn":     {{ID: "a", Grant: "g", Kind: billing.LedgerDraw, Amount: 6}, {ID: "b", Grant: "g", Kind: billing.LedgerDraw, Amount: 5}},
		"over-expired":  {{ID: "a", Grant: "g", Kind: billing.LedgerDraw, Amount: 6}, {ID: "b", Grant: "g", Kind: billing.LedgerExpiry, Amount: 5}},
		"over-returned": {{ID: "a", Grant: "g", Kind: billing.LedgerReturn, Amount: 1}},
		"unknown grant": {{ID: "a", Grant: "h", Kind: billing.LedgerDraw, Amount: 1}},
	} {
		if _, err := billing.Balances([]billing.CreditGrant{g}, entries); !errors.Is(err, billing.ErrCreditLedger) {
			t.Errorf("%s: err = %v, want ErrCreditLedger", name, err)
		}
	}
}

// TestDrawOrder: promotional before prepaid, then priority, earliest
// expiry (none last), earliest effective, id.
func TestDrawOrder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := func(id string, kind billing.CreditKind, prio int32, eff, exp int) billing.CreditGrant {
		out := billing.CreditGrant{ID: id, Kind: kind, Priority: prio, EffectiveFrom: t0.AddDate(0, 0, eff)}
		if exp > 0 {
			out.ExpiresAt = t0.AddDate(0, 0, exp)
		}
		return out
	}
	want := []billing.CreditGrant{
		g("p1", billing.CreditPromotional, 0, 5, 10),
		g("p2", billing.CreditPromotional, 0, 1, 20),
		g("p3", billing.CreditPromotional, 0, 1, 0),
		g("p4", billing.CreditPromotional, 1, 0, 5),
		g("q1", billing.CreditPrepaid, 0, 0, 0),
		g("q2", billing.CreditPrepaid, 0, 0, 0),
	}
	got := []billing.CreditGrant{want[5], want[3], want[1], want[4], want[0], want[2]}
	sort.SliceStable(got, func(i, j int) bool { return billing.DrawOrder(got[i], got[j]) < 0 })
	for i := range want {
		if got[i].ID != want[i].ID {
			t.Fatalf("order %v, want %v", ids(got), ids(want))
		}
	}
}

func ids(gs []billing.CreditGrant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.ID)
	}
	return out
}

// TestGrantValidate names every bad field.
func TestGrantValidate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok := billing.CreditGrant{ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: t0}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, g := range map[string]billing.CreditGrant{
		"no id":       {Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: t0},
		"kind":        {ID: "g", Tenant: "acme", Kind: "gift", Amount: 1, Currency: "USD", EffectiveFrom: t0},
		"zero amount": {ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Currency: "USD", EffectiveFrom: t0},
		"currency":    {ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "usd", EffectiveFrom: t0},
		"expiry":      {ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: t0, ExpiresAt: t0},
		"tenant":      {ID: "g", Tenant: "a\x00b", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: t0},
		"sub-second":  {ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: t0.Add(time.Millisecond)},
		"control":     {ID: "g", Tenant: "acme", Kind: billing.CreditPrepaid, Amount: 1, Currency: "USD", EffectiveFrom: t0, Description: "a\x1bb"},
	} {
		if err := g.Validate(); !errors.Is(err, billing.ErrInvalidGrant) {
			t.Errorf("%s: err = %v, want ErrInvalidGrant", name, err)
		}
	}
}
