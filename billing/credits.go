package billing

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/internal/ident"
)

// Credit grants are amounts a tenant may spend before it pays (prepaid
// credit it bought, promotional credit it was given). This file holds the
// pure rules: what a valid grant is, which grants a period's statement may
// draw on and in which order (DrawOrder), how a statement draws
// (ApplyCredits), and the ledger a close writes from the statement it
// stored (CreditEntriesOf). Storing grants and the ledger, and when a close
// writes it, are package closing's and chstore's.
//
// The ledger never loses a nano-unit: every amount is an exact Money, each
// grant's balance is Amount − Drawn − Expired (each net of what a void
// returned), and a draw never takes more than the balance, so no balance is
// ever negative (Balances refuses a ledger where one would be).

// CreditKind is what a grant is.
type CreditKind string

const (
	// CreditPromotional is credit given (a trial, a goodwill gesture): it
	// is drawn before prepaid credit.
	CreditPromotional CreditKind = "promotional"
	// CreditPrepaid is credit the tenant paid for in advance.
	CreditPrepaid CreditKind = "prepaid"
)

// Errors of credit grants and the ledger.
var (
	// ErrInvalidGrant: a grant with a missing or malformed field.
	ErrInvalidGrant = errors.New("invalid credit grant")
	// ErrGrantConflict: a grant id already stored with other terms (grant
	// ids are idempotency keys: the same grant again is no error).
	ErrGrantConflict = errors.New("credit grant id already used with other terms")
	// ErrCreditLedger: a ledger that would take a grant below zero or
	// names a grant that does not exist: stored data is inconsistent.
	ErrCreditLedger = errors.New("inconsistent credit ledger")
)

// MaxGrantDescription bounds a grant's description, in bytes.
const MaxGrantDescription = 500

// CreditGrant is an amount a tenant may draw on for the periods it is in
// force: from EffectiveFrom to ExpiresAt (zero: no expiry).
type CreditGrant struct {
	// ID names the grant and is its idempotency key: creating the same
	// grant twice stores it once.
	ID     string     `json:"id"`
	Tenant string     `json:"tenant"`
	Kind   CreditKind `json:"kind"`
	// Amount is what was granted, > 0, in Currency (the price book's).
	Amount   Money  `json:"amount"`
	Currency string `json:"currency"`
	// EffectiveFrom and ExpiresAt (zero: never) bound the periods the
	// grant is in force for (InForce).
	EffectiveFrom time.Time `json:"effective_from"`
	ExpiresAt     time.Time `json:"expires_at"`
	// Priority orders grants of one kind: lower first (DrawOrder).
	Priority    int32  `json:"priority"`
	Description string `json:"description,omitempty"`
	// CreatedAt and CreatedBy (the API key's name) record who granted it.
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// Validate returns every problem of g joined, each wrapping
// ErrInvalidGrant.
func (g CreditGrant) Validate() error {
	var errs []error
	bad := func(field, why string) { errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidGrant, field, why)) }
	for _, f := range []struct{ name, v string }{{"id", g.ID}, {"tenant_id", g.Tenant}} {
		if f.v == "" {
			bad(f.name, "required")
		} else if err := ident.CheckParam(f.name, f.v); err != nil {
			bad(f.name, err.Error())
		}
	}
	if g.Kind != CreditPromotional && g.Kind != CreditPrepaid {
		bad("kind", fmt.Sprintf("%q: want %q or %q", g.Kind, CreditPromotional, CreditPrepaid))
	}
	if g.Amount <= 0 {
		bad("amount", "want more than zero")
	}
	if len(g.Currency) != 3 || strings.ToUpper(g.Currency) != g.Currency {
		bad("currency", fmt.Sprintf("%q: want an ISO 4217 code", g.Currency))
	}
	if g.EffectiveFrom.IsZero() {
		bad("effective_from", "required")
	}
	if !g.EffectiveFrom.Equal(g.EffectiveFrom.Truncate(time.Second)) || !g.ExpiresAt.Equal(g.ExpiresAt.Truncate(time.Second)) {
		bad("effective_from", "effective_from and expires_at are whole seconds")
	}
	if !g.ExpiresAt.IsZero() && !g.ExpiresAt.After(g.EffectiveFrom) {
		bad("expires_at", "want after effective_from")
	}
	if len(g.Description) > MaxGrantDescription {
		bad("description", fmt.Sprintf("longer than %d bytes", MaxGrantDescription))
	} else if err := ident.CheckText("description", g.Description); err != nil {
		bad("description", err.Error()) // statements and invoices print it
	}
	return errors.Join(errs...)
}

// SameTerms reports whether g and o grant the same thing (creation time
// and author aside): creating o when g is stored is then a repeat, not a
// conflict.
func (g CreditGrant) SameTerms(o CreditGrant) bool {
	return g.ID == o.ID && g.Tenant == o.Tenant && g.Kind == o.Kind && g.Amount == o.Amount && g.Currency == o.Currency &&
		g.EffectiveFrom.Equal(o.EffectiveFrom) && g.ExpiresAt.Equal(o.ExpiresAt) && g.Priority == o.Priority && g.Description == o.Description
}

// InForce reports whether the statement of period p may draw on g: g is
// effective before p ends and has not expired when p starts. A grant that
// expires inside p is in force for p, and p is its last period.
func (g CreditGrant) InForce(p Period) bool {
	return g.EffectiveFrom.Before(p.End) && (g.ExpiresAt.IsZero() || g.ExpiresAt.After(p.Start))
}

// ExpiresBy reports whether g expires by the end of p: after p's close
// nothing can draw on it any more, and what is left of it expires.
func (g CreditGrant) ExpiresBy(p Period) bool {
	return !g.ExpiresAt.IsZero() && !g.ExpiresAt.After(p.End)
}

// DrawOrder orders grants as a statement draws on them: promotional before
// prepaid; then lower Priority first; then the earliest expiry first (no
// expiry last); then the earliest EffectiveFrom; then by id.
func DrawOrder(a, b CreditGrant) int {
	kindRank := func(k CreditKind) int {
		if k == CreditPromotional {
			return 0
		}
		return 1
	}
	expiry := func(g CreditGrant) time.Time {
		if g.ExpiresAt.IsZero() {
			return time.Unix(1<<62, 0)
		}
		return g.ExpiresAt
	}
	return cmp.Or(cmp.Compare(kindRank(a.Kind), kindRank(b.Kind)), cmp.Compare(a.Priority, b.Priority),
		expiry(a).Compare(expiry(b)), a.EffectiveFrom.Compare(b.EffectiveFrom), strings.Compare(a.ID, b.ID))
}

// LedgerKind says what a ledger entry does to a grant's balance.
type LedgerKind string

const (
	// LedgerDraw takes Amount from the grant: a statement's credit charge.
	LedgerDraw LedgerKind = "draw"
	// LedgerExpiry takes the rest of an expiring grant, booked by the
	// close of its last period.
	LedgerExpiry LedgerKind = "expiry"
	// LedgerReturn gives back a voided statement's draw.
	LedgerReturn LedgerKind = "return"
	// LedgerExpiryReversal gives back a voided statement's expiry (the
	// reissued statement books it again).
	LedgerExpiryReversal LedgerKind = "expiry_reversal"
)

// CreditEntry is one ledger entry: a movement of Amount (> 0) on a grant,
// made by the statement of Period with hash Statement.
type CreditEntry struct {
	// ID is unique per movement (kind, statement, grant): writing an entry
	// twice stores it once (readers keep one row per ID).
	ID        string     `json:"id"`
	Tenant    string     `json:"tenant"`
	Grant     string     `json:"grant_id"`
	Kind      LedgerKind `json:"kind"`
	Amount    Money      `json:"amount"`
	Period    string     `json:"period"`
	Statement string     `json:"statement_hash"`
	At        time.Time  `json:"at"`
}

// GrantBalance is a grant and what its ledger did to it. Drawn and Expired
// are net of returns and reversals; Remaining = Amount − Drawn − Expired.
type GrantBalance struct {
	Grant     CreditGrant `json:"grant"`
	Drawn     Money       `json:"drawn"`
	Expired   Money       `json:"expired"`
	Remaining Money       `json:"remaining"`
}

// Balances is each grant's balance under entries, in DrawOrder. An entry
// of an unknown grant, or one that would take a balance, drawn or expired
// amount below zero, is ErrCreditLedger.
func Balances(grants []CreditGrant, entries []CreditEntry) ([]GrantBalance, error) {
	byID := make(map[string]int, len(grants))
	out := make([]GrantBalance, len(grants))
	for i, g := range slices.SortedFunc(slices.Values(grants), DrawOrder) {
		out[i] = GrantBalance{Grant: g, Remaining: g.Amount}
		byID[g.ID] = i
	}
	var errs []error
	for _, e := range entries {
		i, ok := byID[e.Grant]
		if !ok || e.Amount <= 0 {
			errs = append(errs, fmt.Errorf("%w: entry %s: grant %q unknown or amount %s not positive", ErrCreditLedger, e.ID, e.Grant, e.Amount))
			continue
		}
		b := &out[i]
		switch e.Kind {
		case LedgerDraw:
			b.Drawn += e.Amount
		case LedgerReturn:
			b.Drawn -= e.Amount
		case LedgerExpiry:
			b.Expired += e.Amount
		case LedgerExpiryReversal:
			b.Expired -= e.Amount
		default:
			errs = append(errs, fmt.Errorf("%w: entry %s: kind %q", ErrCreditLedger, e.ID, e.Kind))
		}
	}
	for i := range out {
		b := &out[i]
		// Drawn, Expired ≤ Amount < 2^63 once checked, so no sum below
		// overflows when the ledger is consistent; check in that order.
		if b.Drawn < 0 || b.Expired < 0 || b.Drawn > b.Grant.Amount || b.Expired > b.Grant.Amount-b.Drawn {
			errs = append(errs, fmt.Errorf("%w: grant %s of %s: granted %s, drawn %s, expired %s", ErrCreditLedger, b.Grant.ID, b.Grant.Tenant, b.Grant.Amount, b.Drawn, b.Expired))
			continue
		}
		b.Remaining = b.Grant.Amount - b.Drawn - b.Expired
	}
	return out, errors.Join(errs...)
}

// CreditUse is what a statement did to one grant: its balance before the
// statement (Opening), what the statement drew and what expired with its
// close, and the balance after (Closing = Opening − Drawn − Expired).
type CreditUse struct {
	Grant       string     `json:"grant_id"`
	Kind        CreditKind `json:"kind"`
	Description string     `json:"description,omitempty"`
	// ExpiresAt is the grant's expiry; absent when it has none.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Opening   Money      `json:"opening"`
	Drawn     Money      `json:"drawn"`
	Expired   Money      `json:"expired,omitempty"`
	Closing   Money      `json:"closing"`
}

// CreditRule describes how ApplyCredits draws; statements do not repeat
// it, docs/architecture.md does.
const CreditRule = "the statement's positive charge (usage and contract charges, before rounding) is drawn from the grants in force for the period, promotional before prepaid, then by priority, earliest expiry, earliest effective_from and id; each draw is exact in nano-units and never more than the grant's balance; the rest of a grant expiring by the period's end expires with the close"

// ApplyCredits draws st's charge, if positive, from balances: the grants
// of st's tenant and currency in force for p, in DrawOrder, each as far as
// its Remaining goes. Each draw is a ChargeCredit (Amount < 0, Rule
// "grant:<id>") appended to st.Charges; st.Credits records every grant in
// force or expiring by p's end with a balance, and what p's close expires
// of it. st.Charge, Total and Hash are computed again (Statement.Settle):
// Total is what is left to pay. balances are not changed.
func ApplyCredits(st *Statement, p Period, balances []GrantBalance) error {
	left := st.Charge
	var uses []CreditUse
	for _, b := range slices.SortedFunc(slices.Values(balances), func(a, b GrantBalance) int { return DrawOrder(a.Grant, b.Grant) }) {
		g := b.Grant
		if g.Tenant != st.Tenant || g.Currency != st.Currency || b.Remaining <= 0 {
			continue
		}
		inForce, expires := g.InForce(p), g.ExpiresBy(p)
		if !inForce && !expires {
			continue
		}
		u := CreditUse{Grant: g.ID, Kind: g.Kind, Description: g.Description, Opening: b.Remaining}
		if !g.ExpiresAt.IsZero() {
			at := g.ExpiresAt.UTC()
			u.ExpiresAt = &at
		}
		if inForce && left > 0 {
			u.Drawn = min(left, b.Remaining)
			left -= u.Drawn
			st.Charges = append(st.Charges, Charge{Kind: ChargeCredit, Description: creditDescription(g), Line: -1,
				Rule: "grant:" + g.ID, ChargeStart: st.PeriodStart, ChargeEnd: st.PeriodEnd, Amount: -u.Drawn})
		}
		if expires {
			u.Expired = b.Remaining - u.Drawn
		}
		u.Closing = b.Remaining - u.Drawn - u.Expired
		uses = append(uses, u)
	}
	if len(uses) == 0 {
		return nil
	}
	st.Credits = uses
	return st.Settle()
}

func creditDescription(g CreditGrant) string {
	d := fmt.Sprintf("%s credit %s", g.Kind, g.ID)
	if g.Description != "" {
		d += ": " + g.Description
	}
	return d
}

// CreditEntriesOf is the ledger of a stored statement: a draw entry per
// grant it drew on, an expiry entry per grant its close expired, at the
// close's time. Entry ids name the statement's hash, so the entries of one
// statement are the same whenever they are written.
func CreditEntriesOf(st Statement, at time.Time) []CreditEntry {
	return creditEntries(st, LedgerDraw, LedgerExpiry, at)
}

// ReturnEntriesOf is what voiding the stored statement st gives back: a
// return per draw and a reversal per expiry it booked (a reissued
// statement draws and expires again, under its own hash).
func ReturnEntriesOf(st Statement, at time.Time) []CreditEntry {
	return creditEntries(st, LedgerReturn, LedgerExpiryReversal, at)
}

// creditEntries is an entry of kind draw per grant st drew on and of kind
// expiry per grant its close expired, in the order of st.Credits.
func creditEntries(st Statement, draw, expiry LedgerKind, at time.Time) []CreditEntry {
	var out []CreditEntry
	for _, u := range st.Credits {
		if u.Drawn > 0 {
			out = append(out, creditEntry(st, u.Grant, draw, u.Drawn, at))
		}
		if u.Expired > 0 {
			out = append(out, creditEntry(st, u.Grant, expiry, u.Expired, at))
		}
	}
	return out
}

func creditEntry(st Statement, grant string, kind LedgerKind, amount Money, at time.Time) CreditEntry {
	return CreditEntry{ID: fmt.Sprintf("%s:%s:%s:%s:%s", kind, st.Tenant, st.Period, st.Hash, grant), Tenant: st.Tenant,
		Grant: grant, Kind: kind, Amount: amount, Period: st.Period, Statement: st.Hash, At: at.UTC()}
}
