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
//   - It reads the tenant's grants and ledger; first it writes the ledger
//     entries of any closed statement of the tenant that has none (a close
//     that stored its statement and stopped before its ledger): a closed
//     statement's Credits are the truth, the ledger is written from them.
//   - It draws the statement's charge (billing.ApplyCredits) after the
//     contract's charges, stores the statement, and writes the ledger of
//     the statement stored (which is another close's when that one won):
//     draws never outnumber the statements that made them.
//   - A close of a closed period returns its statement and draws nothing;
//     drafts draw on the balances as they are and write nothing.

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

// applyCredits draws st's charge of p from the tenant's grants (req's,
// read once per close; a draft reads them). A close (req.closing) first
// writes the ledger of the tenant's closed statements that lack theirs.
func (c *Closer) applyCredits(ctx context.Context, st *billing.Statement, p billing.Period, req Request) error {
	if c.credits == nil {
		return nil
	}
	grants, ok := req.grants[st.Tenant]
	if req.grants == nil {
		var err error
		if grants, err = c.credits.CreditGrants(ctx, st.Tenant); err != nil {
			return err
		}
		ok = len(grants) > 0
	}
	if !ok {
		return nil
	}
	balances, err := c.balances(ctx, st.Tenant, grants, req.closing)
	if err != nil {
		return err
	}
	return billing.ApplyCredits(st, p, balances)
}

// balances are the balances of tenant's grants; with reconcile, after
// writing the missing ledger entries of its closed statements.
func (c *Closer) balances(ctx context.Context, tenant string, grants []billing.CreditGrant, reconcile bool) ([]billing.GrantBalance, error) {
	entries, err := c.credits.CreditEntries(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if reconcile {
		closed, err := c.store.TenantStatements(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, stored := range closed {
			added, err := c.recordCredits(ctx, stored, entries)
			if err != nil {
				return nil, err
			}
			entries = append(entries, added...)
		}
	}
	return billing.Balances(grants, entries)
}

// recordCredits writes the ledger entries of stored that entries lack, and
// returns them.
func (c *Closer) recordCredits(ctx context.Context, stored billing.StoredStatement, entries []billing.CreditEntry) ([]billing.CreditEntry, error) {
	return addMissing(ctx, c.credits, stored, entries, false, time.Time{})
}

// addMissing writes what of stored's ledger (and, with returns, of what
// voiding it gives back, at at) entries lack, and returns it.
func addMissing(ctx context.Context, cr Credits, stored billing.StoredStatement, entries []billing.CreditEntry, returns bool, at time.Time) ([]billing.CreditEntry, error) {
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
	if err := cr.AddCreditEntries(ctx, missing); err != nil {
		return nil, fmt.Errorf("credit ledger of %s for %s: %w", stored.Tenant, stored.Period, err)
	}
	return missing, nil
}

// afterSave writes the ledger of the statement a close stored (or found
// stored): entries already written are not written again.
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
	_, err = addMissing(ctx, cr, stored, entries, false, time.Time{})
	return err
}

// ReturnCredits gives back to their grants what the stored statement drew
// and expired (a void: the reissued statement draws again, and its ledger
// is RecordCredits'): it writes the statement's own ledger first, where it
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
	_, err = addMissing(ctx, cr, stored, entries, true, at)
	return err
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
