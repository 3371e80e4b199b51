package chstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"tokenmeter/billing"
)

// StatementRevisions returns every revision of tenant's statement of
// period, oldest first (the first row stored of each): revision 0 as its
// close stored it, then the reissues.
func (s *Store) StatementRevisions(ctx context.Context, tenant, period string) ([]billing.StoredStatement, error) {
	var (
		out      []billing.StoredStatement
		st       billing.StoredStatement
		content  string
		revision uint32
	)
	stmt := `SELECT revision, argMin(hash, (closed_at, hash)), argMin(content, (closed_at, hash)), min(closed_at)
FROM (` + revisionsOf("tenant_id = ? AND period = ?") + `)
GROUP BY revision
ORDER BY revision`
	err := s.each(ctx, "statement revisions", stmt, []any{tenant, period, tenant, period}, []any{&revision, &st.Hash, &content, &st.ClosedAt}, func() error {
		out = append(out, billing.StoredStatement{Tenant: tenant, Period: period, Revision: int(revision), Hash: st.Hash,
			Content: []byte(content), ClosedAt: st.ClosedAt.UTC()})
		return nil
	})
	return out, err
}

// SaveRevision stores st, a reissue (st.Revision ≥ 1) of its tenant's
// period reissued at closedAt, unless that revision is stored already, and
// returns the statement in force. Like SaveStatement it checks and inserts
// under the store's save lock; which revision may follow which is the
// caller's (billing/closing) to decide, under its close lock.
func (s *Store) SaveRevision(ctx context.Context, st billing.Statement, closedAt time.Time) (billing.StoredStatement, error) {
	if st.Revision < 1 {
		return billing.StoredStatement{}, fmt.Errorf("store revision %d of %s for %s: reissues are revisions 1 and up", st.Revision, st.Tenant, st.Period)
	}
	s.saving.Lock()
	defer s.saving.Unlock()
	cur, ok, err := s.Statement(ctx, st.Tenant, st.Period)
	if err != nil {
		return billing.StoredStatement{}, err
	}
	if !ok {
		return billing.StoredStatement{}, fmt.Errorf("store revision %d of %s for %s: the period is not closed", st.Revision, st.Tenant, st.Period)
	}
	if cur.Revision >= st.Revision {
		return cur, nil
	}
	content, err := json.Marshal(st)
	if err != nil {
		return billing.StoredStatement{}, fmt.Errorf("encode statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	if err := s.insertRow(ctx, "INSERT INTO statement_revisions (tenant_id, period, revision, hash, content, closed_at)",
		st.Tenant, st.Period, uint32(st.Revision), st.Hash, string(content), closedAt.UTC().Truncate(time.Second)); err != nil {
		return billing.StoredStatement{}, fmt.Errorf("store revision %d of %s for %s: %w", st.Revision, st.Tenant, st.Period, err)
	}
	cur, ok, err = s.Statement(ctx, st.Tenant, st.Period)
	if err == nil && !ok {
		err = fmt.Errorf("statement of %s for %s not found after storing revision %d", st.Tenant, st.Period, st.Revision)
	}
	return cur, err
}

// LastInvoiceSeq is the highest sequence number issued under issuer; 0
// before the first.
func (s *Store) LastInvoiceSeq(ctx context.Context, issuer string) (uint64, error) {
	var seq uint64
	err := s.each(ctx, "last invoice number", "SELECT max(seq) FROM invoices WHERE issuer = ?", []any{issuer}, []any{&seq}, func() error { return nil })
	return seq, err
}

// SaveInvoices stores docs, numbered by the caller, in one INSERT: one
// part of the unpartitioned table, stored whole or not at all.
func (s *Store) SaveInvoices(ctx context.Context, docs []billing.StoredInvoice) error {
	if len(docs) == 0 {
		return nil
	}
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO invoices (issuer, seq, number, kind, tenant_id, period, revision, statement_hash, issued_at, hash, content)")
	if err != nil {
		return fmt.Errorf("store invoices: %w", classify(err))
	}
	for _, d := range docs {
		if err := batch.Append(d.Issuer, d.Seq, d.Number, string(d.Kind), d.Tenant, d.Period, uint32(d.Revision), d.StatementHash,
			d.IssuedAt.UTC().Truncate(time.Second), d.Hash, string(d.Content)); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("store invoice %s: %w", d.Number, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("store invoices: %w", classify(err))
	}
	return nil
}

// Invoices returns the invoices and credit notes of period's statements,
// of tenant only when tenant is not empty, by issuer and sequence number.
// Should two documents share a number (two meterd closing without a shared
// lease), the first stored keeps it and the other is not returned.
func (s *Store) Invoices(ctx context.Context, period, tenant string) ([]billing.StoredInvoice, error) {
	var (
		out           []billing.StoredInvoice
		d             billing.StoredInvoice
		kind, content string
		revision      uint32
	)
	err := s.each(ctx, "invoices", `SELECT issuer, seq, number, kind, tenant_id, period, revision, statement_hash, issued_at, hash, content
FROM invoices
WHERE period = ? AND (? = '' OR tenant_id = ?)
ORDER BY issuer, seq, issued_at, hash`, []any{period, tenant, tenant},
		[]any{&d.Issuer, &d.Seq, &d.Number, &kind, &d.Tenant, &d.Period, &revision, &d.StatementHash, &d.IssuedAt, &d.Hash, &content}, func() error {
			if n := len(out); n > 0 && out[n-1].Issuer == d.Issuer && out[n-1].Seq == d.Seq {
				return nil // a number is the first document stored with it
			}
			o := d
			o.Kind, o.Revision, o.Content, o.IssuedAt = billing.InvoiceKind(kind), int(revision), []byte(content), d.IssuedAt.UTC()
			out = append(out, o)
			return nil
		})
	return out, err
}
