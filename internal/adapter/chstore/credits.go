package chstore

import (
	"context"
	"fmt"
	"time"

	"tokenmeter/billing"
)

// PutCreditGrant stores g unless a grant with its id is stored, and returns
// the grant stored: g when created is true, else the earlier one. An id
// stored with other terms is billing.ErrGrantConflict. Creations (and
// statement saves) in this process run one at a time; across replicas the
// caller holds the close lock.
func (s *Store) PutCreditGrant(ctx context.Context, g billing.CreditGrant) (_ billing.CreditGrant, created bool, _ error) {
	s.saving.Lock()
	defer s.saving.Unlock()
	cur, ok, err := s.creditGrant(ctx, g.ID)
	if err != nil {
		return billing.CreditGrant{}, false, err
	}
	if ok {
		if !cur.SameTerms(g) {
			return cur, false, fmt.Errorf("%w: %s (stored for %s: %s %s from %s)", billing.ErrGrantConflict, g.ID, cur.Tenant, cur.Amount, cur.Currency,
				cur.EffectiveFrom.Format(time.RFC3339))
		}
		return cur, false, nil
	}
	var expires time.Time = time.Unix(0, 0)
	if !g.ExpiresAt.IsZero() {
		expires = g.ExpiresAt
	}
	if err := s.insertRow(ctx, "INSERT INTO credit_grants (grant_id, tenant_id, kind, amount, currency, effective_from, expires_at, priority, description, created_at, created_by)",
		g.ID, g.Tenant, string(g.Kind), int64(g.Amount), g.Currency, g.EffectiveFrom.UTC(), expires.UTC(), g.Priority, g.Description,
		g.CreatedAt.UTC().Truncate(time.Second), g.CreatedBy); err != nil {
		return billing.CreditGrant{}, false, fmt.Errorf("store credit grant %s: %w", g.ID, err)
	}
	cur, ok, err = s.creditGrant(ctx, g.ID)
	if err == nil && !ok {
		err = fmt.Errorf("credit grant %s not found after storing it", g.ID)
	}
	return cur, ok, err
}

// grantColumns reads the first row stored of each grant_id.
const grantColumns = `grant_id, argMin(tenant_id, (created_at, created_by)), argMin(kind, (created_at, created_by)),
argMin(amount, (created_at, created_by)), argMin(currency, (created_at, created_by)),
argMin(effective_from, (created_at, created_by)), argMin(expires_at, (created_at, created_by)),
argMin(priority, (created_at, created_by)), argMin(description, (created_at, created_by)),
min(created_at), argMin(created_by, (created_at, created_by))`

// creditGrant reads grant id.
func (s *Store) creditGrant(ctx context.Context, id string) (billing.CreditGrant, bool, error) {
	var (
		out   billing.CreditGrant
		found bool
	)
	err := s.eachGrant(ctx, "SELECT "+grantColumns+" FROM credit_grants WHERE grant_id = ? GROUP BY grant_id", []any{id}, func(g billing.CreditGrant) error {
		out, found = g, true
		return nil
	})
	return out, found, err
}

// CreditGrants returns tenant's grants (every tenant's when tenant is
// empty), by tenant and id.
func (s *Store) CreditGrants(ctx context.Context, tenant string) ([]billing.CreditGrant, error) {
	var out []billing.CreditGrant
	stmt := "SELECT " + grantColumns + ` FROM credit_grants WHERE ? = '' OR tenant_id = ?
GROUP BY grant_id
ORDER BY argMin(tenant_id, (created_at, created_by)), grant_id`
	err := s.eachGrant(ctx, stmt, []any{tenant, tenant}, func(g billing.CreditGrant) error {
		out = append(out, g)
		return nil
	})
	return out, err
}

func (s *Store) eachGrant(ctx context.Context, stmt string, args []any, fn func(billing.CreditGrant) error) error {
	var (
		g                 billing.CreditGrant
		kind              string
		amount            int64
		expires, eff, cre time.Time
	)
	return s.each(ctx, "credit grants", stmt, args,
		[]any{&g.ID, &g.Tenant, &kind, &amount, &g.Currency, &eff, &expires, &g.Priority, &g.Description, &cre, &g.CreatedBy}, func() error {
			out := g
			out.Kind, out.Amount = billing.CreditKind(kind), billing.Money(amount)
			out.EffectiveFrom, out.CreatedAt = eff.UTC(), cre.UTC()
			if expires.Unix() != 0 {
				out.ExpiresAt = expires.UTC()
			}
			return fn(out)
		})
}

// AddCreditEntries appends entries to the ledger in one insert. An entry
// already stored may be written again: readers keep one row per id.
func (s *Store) AddCreditEntries(ctx context.Context, entries []billing.CreditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO credit_ledger (entry_id, tenant_id, grant_id, kind, amount, period, statement_hash, at)")
	if err != nil {
		return fmt.Errorf("store credit ledger: %w", classify(err))
	}
	for _, e := range entries {
		if err := batch.Append(e.ID, e.Tenant, e.Grant, string(e.Kind), int64(e.Amount), e.Period, e.Statement, e.At.UTC().Truncate(time.Second)); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("store credit ledger: %w", err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("store credit ledger: %w", classify(err))
	}
	return nil
}

// CreditEntries returns tenant's ledger (every tenant's when tenant is
// empty), one row per entry id (the first written), in time order.
func (s *Store) CreditEntries(ctx context.Context, tenant string) ([]billing.CreditEntry, error) {
	var (
		out    []billing.CreditEntry
		e      billing.CreditEntry
		kind   string
		amount int64
	)
	stmt := `SELECT entry_id, any(tenant_id), any(grant_id), any(kind), any(amount), any(period), any(statement_hash), min(at)
FROM credit_ledger
WHERE ? = '' OR tenant_id = ?
GROUP BY entry_id
ORDER BY min(at), entry_id`
	err := s.each(ctx, "credit ledger", stmt, []any{tenant, tenant}, []any{&e.ID, &e.Tenant, &e.Grant, &kind, &amount, &e.Period, &e.Statement, &e.At}, func() error {
		x := e
		x.Kind, x.Amount, x.At = billing.LedgerKind(kind), billing.Money(amount), e.At.UTC()
		out = append(out, x)
		return nil
	})
	return out, err
}
