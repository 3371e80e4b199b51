package closing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"tokenmeter/billing"
)

// Credits keeps credit grants and their ledger; *chstore.Store implements
// it.
type Credits interface {
	PutCreditGrant(ctx context.Context, g billing.CreditGrant) (billing.CreditGrant, bool, error)
	CreditGrants(ctx context.Context, tenant string) ([]billing.CreditGrant, error)
	CreditEntries(ctx context.Context, tenant string) ([]billing.CreditEntry, error)
	AddCreditEntries(ctx context.Context, entries []billing.CreditEntry) error
}

// How a close draws credits (docs/architecture.md, "Credits"):
//
//   - A tenant's close (closeOne) holds the tenant's lock in this process
//     (and Service.Close the close lock across replicas), so no two closes
//     of one tenant read its balances at once.
//   - A close reads every grant and ledger entry once (readLedger); each
//     tenant with grants also reads its closed statements, and the entries
//     of any of them that the ledger lacks (a close that stored its
//     statement and stopped before its ledger write) are counted and
//     written: a closed statement's credits are the truth, the ledger is
//     written from them.
//   - It draws the statement's charge (billing.ApplyCredits) after the
//     contract's charges, stores the statement, and records the ledger of
//     the statement stored (another close's, when that one won); the
//     close writes every entry it recorded in one insert at its end.
//   - A close of a closed period returns its statement and draws nothing;
//     drafts draw on the balances as they are and write nothing.
//   - A void (reissue) computes the new revision on the balances as they
//     would be with the voided revision's draws and expiries given back,
//     stores it, and only then writes those returns with the new
//     revision's ledger, in one insert (RecordVoid): a void that fails
//     before gives nothing back. A void whose ledger write failed is
//     completed by its retry, or by the tenant's next close: a draw or
//     expiry of a revision no longer in force without its return gets it.

// UseCredits makes c draw credits from cr at every close and draft.
func (c *Closer) UseCredits(cr Credits) { c.credits = cr }

// tenantLock serializes closes of one tenant in this process.
func (c *Closer) tenantLock(tenant string) func() {
	c.lockMu.Lock()
	if c.tenantLocks == nil {
		c.tenantLocks = map[string]*sync.Mutex{}
	}
	mu := c.tenantLocks[tenant]
	if mu == nil {
		mu = &sync.Mutex{}
		c.tenantLocks[tenant] = mu
	}
	c.lockMu.Unlock()
	mu.Lock()
	return mu.Unlock
}

// closeLedger is what one close shares of credits: every grant and ledger
// entry, read once at its start, and the entries its statements make,
// written in one insert at its end (a close that stops before that write
// leaves its statements' entries to the next close's reconciliation).
type closeLedger struct {
	grants  map[string][]billing.CreditGrant
	entries map[string][]billing.CreditEntry // as read; not changed after
	mu      sync.Mutex
	added   []billing.CreditEntry
	ids     map[string]bool // of added
}

// readLedger reads every grant and ledger entry for a close.
func (c *Closer) readLedger(ctx context.Context) (*closeLedger, error) {
	grants, err := c.credits.CreditGrants(ctx, "")
	if err != nil {
		return nil, err
	}
	l := &closeLedger{grants: map[string][]billing.CreditGrant{}, entries: map[string][]billing.CreditEntry{}, ids: map[string]bool{}}
	if len(grants) == 0 {
		return l, nil
	}
	for _, g := range grants {
		l.grants[g.Tenant] = append(l.grants[g.Tenant], g)
	}
	entries, err := c.credits.CreditEntries(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		l.entries[e.Tenant] = append(l.entries[e.Tenant], e)
	}
	return l, nil
}

// add keeps entries for the close's write, each once.
func (l *closeLedger) add(entries []billing.CreditEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range entries {
		if !l.ids[e.ID] {
			l.ids[e.ID] = true
			l.added = append(l.added, e)
		}
	}
}

// write stores what the close added; nothing for a nil l.
func (l *closeLedger) write(ctx context.Context, cr Credits) error {
	if l == nil || len(l.added) == 0 {
		return nil
	}
	if err := cr.AddCreditEntries(ctx, l.added); err != nil {
		return fmt.Errorf("credit ledger: %w", err)
	}
	return nil
}

// creditReads are a tenant's grants and ledger, and for a close its closed
// statements (to reconcile the ledger with).
type creditReads struct {
	grants  []billing.CreditGrant
	entries []billing.CreditEntry
	closed  []billing.StoredStatement
}

// readCredits reads what applyCredits needs of tenant: from req's ledger
// in a close, else from the store; nothing for a tenant without grants.
func (c *Closer) readCredits(ctx context.Context, tenant string, req Request) (creditReads, error) {
	var r creditReads
	if l := req.ledger; l != nil {
		r.grants, r.entries = l.grants[tenant], l.entries[tenant]
	} else {
		var err error
		if r.grants, err = c.credits.CreditGrants(ctx, tenant); err != nil || len(r.grants) == 0 {
			return r, err
		}
		if r.entries, err = c.credits.CreditEntries(ctx, tenant); err != nil {
			return r, err
		}
	}
	if len(r.grants) == 0 || !req.closing {
		return r, nil
	}
	var err error
	r.closed, err = req.tenantStatements(ctx, c.store, tenant)
	return r, err
}

// applyCredits draws st's charge of p from the tenant's grants in r. A
// close (req.closing) first reconciles: the entries of the tenant's closed
// statements that the ledger lacks are written (with the close's, in a
// close) and counted.
func (c *Closer) applyCredits(ctx context.Context, st *billing.Statement, p billing.Period, req Request, r creditReads) error {
	if len(r.grants) == 0 {
		return nil
	}
	entries := slices.Clone(r.entries)
	for _, stored := range r.closed {
		missing, err := missingEntries(stored, entries, false, time.Time{})
		if err != nil {
			return err
		}
		if err := c.record(ctx, req, missing); err != nil {
			return err
		}
		entries = append(entries, missing...)
	}
	// The returns of voided revisions that a void's ledger write lost.
	if returns := missingReturns(r.closed, entries); len(returns) > 0 {
		if err := c.record(ctx, req, returns); err != nil {
			return err
		}
		entries = append(entries, returns...)
	}
	// A reissue counts what its void gives back, written once it is
	// stored.
	for _, e := range req.voiding {
		if !slices.ContainsFunc(entries, func(x billing.CreditEntry) bool { return x.ID == e.ID }) {
			entries = append(entries, e)
		}
	}
	balances, err := billing.Balances(r.grants, entries)
	if err != nil {
		return err
	}
	return billing.ApplyCredits(st, p, balances)
}

// record writes entries: with the close's write in a close, at once
// otherwise.
func (c *Closer) record(ctx context.Context, req Request, entries []billing.CreditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	if req.ledger != nil {
		req.ledger.add(entries)
		return nil
	}
	return c.credits.AddCreditEntries(ctx, entries)
}

// recordStored records the ledger of the statement a close stored (or
// found stored): its entries the ledger lacks.
func (c *Closer) recordStored(ctx context.Context, stored billing.StoredStatement, req Request) error {
	if c.credits == nil || !bytes.Contains(stored.Content, []byte(`"credits":`)) {
		return nil
	}
	if req.ledger == nil {
		return c.afterSave(ctx, stored)
	}
	missing, err := missingEntries(stored, req.ledger.entries[stored.Tenant], false, time.Time{})
	if err != nil {
		return err
	}
	req.ledger.add(missing)
	return nil
}

// missingEntries is what of stored's ledger (and, with returns, of what
// voiding it gives back, at at) entries lack.
func missingEntries(stored billing.StoredStatement, entries []billing.CreditEntry, returns bool, at time.Time) ([]billing.CreditEntry, error) {
	if !bytes.Contains(stored.Content, []byte(`"credits":`)) {
		return nil, nil
	}
	var st billing.Statement
	if err := json.Unmarshal(stored.Content, &st); err != nil {
		return nil, fmt.Errorf("statement of %s for %s: %w", stored.Tenant, stored.Period, err)
	}
	want := billing.CreditEntriesOf(st, stored.ClosedAt)
	if returns {
		want = append(want, billing.ReturnEntriesOf(st, at)...)
	}
	var missing []billing.CreditEntry
	for _, e := range want {
		if !slices.ContainsFunc(entries, func(x billing.CreditEntry) bool { return x.ID == e.ID }) {
			missing = append(missing, e)
		}
	}
	return missing, nil
}

// missingReturns are the returns that entries lack of the draws and
// expiries of voided revisions: revisions of a period of closed (the
// statements in force) other than the one in force. Each is dated by the
// close of the revision in force.
func missingReturns(closed []billing.StoredStatement, entries []billing.CreditEntry) []billing.CreditEntry {
	inForce := make(map[string]billing.StoredStatement, len(closed))
	for _, st := range closed {
		inForce[st.Period] = st
	}
	have := make(map[string]bool, len(entries))
	for _, e := range entries {
		have[e.ID] = true
	}
	var out []billing.CreditEntry
	for _, e := range entries {
		cur, ok := inForce[e.Period]
		if !ok || e.Statement == cur.Hash || e.Tenant != cur.Tenant {
			continue
		}
		ret, ok := returnOf(e, cur.ClosedAt)
		if ok && !have[ret.ID] {
			have[ret.ID] = true
			out = append(out, ret)
		}
	}
	return out
}

// returnOf is the entry that gives back e, a draw or an expiry of a voided
// revision, at at: the entry billing.ReturnEntriesOf makes of it.
func returnOf(e billing.CreditEntry, at time.Time) (billing.CreditEntry, bool) {
	var kind billing.LedgerKind
	switch e.Kind {
	case billing.LedgerDraw:
		kind = billing.LedgerReturn
	case billing.LedgerExpiry:
		kind = billing.LedgerExpiryReversal
	default:
		return billing.CreditEntry{}, false
	}
	rest, ok := strings.CutPrefix(e.ID, string(e.Kind)+":")
	if !ok {
		return billing.CreditEntry{}, false
	}
	e.ID, e.Kind, e.At = string(kind)+":"+rest, kind, at.UTC()
	return e, true
}

// voidEntries is what of voided's ledger and of its returns (at at)
// entries lack: what a void of voided writes.
func voidEntries(voided billing.StoredStatement, entries []billing.CreditEntry, at time.Time) ([]billing.CreditEntry, error) {
	return missingEntries(voided, entries, true, at)
}

// RecordVoid writes the ledger of a void, once reissued (the revision
// that replaces voided) is stored: where missing, voided's draws and
// expiries, their returns (dated by reissued's close) and reissued's own
// ledger, in one insert. A void calls it after storing its revision, and
// its retry again.
func RecordVoid(ctx context.Context, cr Credits, voided, reissued billing.StoredStatement) error {
	entries, err := cr.CreditEntries(ctx, reissued.Tenant)
	if err != nil {
		return err
	}
	missing, err := voidEntries(voided, entries, reissued.ClosedAt)
	if err != nil {
		return err
	}
	own, err := missingEntries(reissued, entries, false, time.Time{})
	if err != nil {
		return err
	}
	if missing = append(missing, own...); len(missing) == 0 {
		return nil
	}
	if err := cr.AddCreditEntries(ctx, missing); err != nil {
		return fmt.Errorf("credit ledger of the void of %s's %s: %w", reissued.Tenant, reissued.Period, err)
	}
	return nil
}

// afterSave writes the ledger of a stored statement (a reissue's) where it
// is missing, at once.
func (c *Closer) afterSave(ctx context.Context, stored billing.StoredStatement) error {
	if c.credits == nil {
		return nil
	}
	return RecordCredits(ctx, c.credits, stored)
}

// RecordCredits writes the ledger of a stored statement (its draws and
// expiries, billing.CreditEntriesOf) where it is missing: a close calls it
// once the statement is stored, a reissue once its revision is.
func RecordCredits(ctx context.Context, cr Credits, stored billing.StoredStatement) error {
	if !bytes.Contains(stored.Content, []byte(`"credits":`)) {
		return nil
	}
	entries, err := cr.CreditEntries(ctx, stored.Tenant)
	if err != nil {
		return err
	}
	missing, err := missingEntries(stored, entries, false, time.Time{})
	if err != nil {
		return err
	}
	return cr.AddCreditEntries(ctx, missing)
}

// ReturnCredits gives back to their grants what the stored statement drew
// and expired, at once. A void does not call it (it writes the returns
// only once its new revision is stored, RecordVoid): it writes the statement's own ledger first, where it
// is missing, then its returns (billing.ReturnEntriesOf), each once
// whatever the retries.
func ReturnCredits(ctx context.Context, cr Credits, stored billing.StoredStatement, at time.Time) error {
	if !bytes.Contains(stored.Content, []byte(`"credits":`)) {
		return nil
	}
	entries, err := cr.CreditEntries(ctx, stored.Tenant)
	if err != nil {
		return err
	}
	missing, err := missingEntries(stored, entries, true, at)
	if err != nil {
		return err
	}
	return cr.AddCreditEntries(ctx, missing)
}

// ErrCreditsOff marks a credit request to a service without a credit
// store.
var ErrCreditsOff = errors.New("credit grants are not kept by this server")

// CreateGrant stores g, a new grant of the price book's currency (g's
// Currency, when set, must be it), and returns the grant stored: creating
// the same grant again returns it with created false; its id with other
// terms is billing.ErrGrantConflict. Grants are created under the close
// lock, so that no close reads a tenant's grants while one is stored.
func (s *Service) CreateGrant(ctx context.Context, g billing.CreditGrant) (_ billing.CreditGrant, created bool, _ error) {
	if s.d.Credits == nil {
		return billing.CreditGrant{}, false, ErrCreditsOff
	}
	book, err := s.d.Prices(ctx)
	if err != nil {
		return billing.CreditGrant{}, false, err
	}
	if g.Currency == "" {
		g.Currency = book.Currency
	}
	if g.Currency != book.Currency {
		return billing.CreditGrant{}, false, fmt.Errorf("%w: currency: %s, the price book's is %s", billing.ErrInvalidGrant, g.Currency, book.Currency)
	}
	if err := g.Validate(); err != nil {
		return billing.CreditGrant{}, false, err
	}
	if g.CreatedAt.IsZero() {
		g.CreatedAt = s.cfg.Now()
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return billing.CreditGrant{}, false, err
	}
	defer unlock()
	return s.d.Credits.PutCreditGrant(ctx, g)
}

// CreditBalance is tenant's grants and their balances, in draw order
// (every tenant's, by tenant, when tenant is empty).
func (s *Service) CreditBalance(ctx context.Context, tenant string) ([]billing.GrantBalance, error) {
	if s.d.Credits == nil {
		return nil, ErrCreditsOff
	}
	if tenant != "" {
		if err := checkTenant(tenant); err != nil {
			return nil, err
		}
	}
	grants, err := s.d.Credits.CreditGrants(ctx, tenant)
	if err != nil {
		return nil, err
	}
	entries, err := s.d.Credits.CreditEntries(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out, err := billing.Balances(grants, entries)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b billing.GrantBalance) int { return strings.Compare(a.Grant.Tenant, b.Grant.Tenant) })
	return out, nil
}

// CreditLedger is tenant's ledger in time order (every tenant's when
// tenant is empty).
func (s *Service) CreditLedger(ctx context.Context, tenant string) ([]billing.CreditEntry, error) {
	if s.d.Credits == nil {
		return nil, ErrCreditsOff
	}
	if tenant != "" {
		if err := checkTenant(tenant); err != nil {
			return nil, err
		}
	}
	return s.d.Credits.CreditEntries(ctx, tenant)
}
