package chstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"tokenmeter/billing"
)

// SaveStatement stores st, closed at closedAt, unless its tenant's period
// already has a statement, and returns the statement in force: the first
// one stored. Saves in this process run one at a time, so a second close
// gets the first one's statement; ClickHouse has no insert-if-absent, so
// closes on several replicas must hold one lease (readers still agree on
// the row with the smallest (closed_at, hash) if two slip through).
func (s *Store) SaveStatement(ctx context.Context, st billing.Statement, closedAt time.Time) (billing.StoredStatement, error) {
	s.saving.Lock()
	defer s.saving.Unlock()
	if cur, ok, err := s.Statement(ctx, st.Tenant, st.Period); err != nil || ok {
		return cur, err
	}
	content, err := json.Marshal(st)
	if err != nil {
		return billing.StoredStatement{}, fmt.Errorf("encode statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	if err := s.insertRow(ctx, "INSERT INTO statements (tenant_id, period, zone, period_start, period_end, hash, content, closed_at)",
		st.Tenant, st.Period, st.Zone, st.PeriodStart.UTC(), st.PeriodEnd.UTC(), st.Hash, string(content), closedAt.UTC().Truncate(time.Second)); err != nil {
		return billing.StoredStatement{}, fmt.Errorf("store statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	cur, ok, err := s.Statement(ctx, st.Tenant, st.Period)
	if err == nil && !ok {
		err = fmt.Errorf("statement of %s for %s not found after storing it", st.Tenant, st.Period)
	}
	return cur, err
}

// Statement reads the closed statement of tenant's period in force: its
// highest revision (revision 0 is the close's, in statements; reissues are
// in statement_revisions), the first row stored of it. ok is false while
// the period is open.
func (s *Store) Statement(ctx context.Context, tenant, period string) (billing.StoredStatement, bool, error) {
	out := billing.StoredStatement{Tenant: tenant, Period: period}
	var (
		content  string
		revision uint32
	)
	found := false
	err := s.each(ctx, "statement", `SELECT revision, hash, content, closed_at FROM (`+revisionsOf("tenant_id = ? AND period = ?")+`)
ORDER BY revision DESC, closed_at, hash
LIMIT 1`, []any{tenant, period, tenant, period}, []any{&revision, &out.Hash, &content, &out.ClosedAt}, func() error {
		found = true
		return nil
	})
	if err != nil || !found {
		return billing.StoredStatement{}, false, err
	}
	out.Revision, out.Content, out.ClosedAt = int(revision), []byte(content), out.ClosedAt.UTC()
	return out, true, nil
}

// revisionsOf is the rows of every revision of the statements matching
// where (which it holds twice: its arguments go twice): revision 0 from
// statements, the reissues from statement_revisions.
func revisionsOf(where string) string {
	return `SELECT tenant_id, period, toUInt32(0) AS revision, hash, content, closed_at FROM statements WHERE ` + where + `
UNION ALL
SELECT tenant_id, period, revision, hash, content, closed_at FROM statement_revisions WHERE ` + where
}

// EachStatement calls fn with the closed statements of period, of tenant
// only when tenant is not empty, in tenant order: for each tenant the first
// one stored.
func (s *Store) EachStatement(ctx context.Context, period, tenant string, fn func(billing.StoredStatement) error) error {
	return s.eachStatement(ctx, "period = ? AND (? = '' OR tenant_id = ?)", []any{period, tenant, tenant}, fn)
}

// TenantStatements returns tenant's closed statements, in period order.
func (s *Store) TenantStatements(ctx context.Context, tenant string) ([]billing.StoredStatement, error) {
	var out []billing.StoredStatement
	err := s.eachStatement(ctx, "tenant_id = ?", []any{tenant}, func(st billing.StoredStatement) error {
		out = append(out, st)
		return nil
	})
	return out, err
}

// eachStatement calls fn with the statement in force of each (tenant,
// period) matching where: the first stored row of its highest revision, in
// (tenant, period) order.
func (s *Store) eachStatement(ctx context.Context, where string, args []any, fn func(billing.StoredStatement) error) error {
	var (
		st       billing.StoredStatement
		content  string
		revision uint32
	)
	// argMin on the (−revision, closed_at, hash) tuple picks the highest
	// revision's first row stored, as Statement does.
	stmt := `SELECT tenant_id, period, max(revision), argMin(hash, k), argMin(content, k), argMin(closed_at, k)
FROM (SELECT tenant_id, period, revision, hash, content, closed_at, (toInt64(0) - revision, closed_at, hash) AS k
      FROM (` + revisionsOf(where) + `))
GROUP BY tenant_id, period
ORDER BY tenant_id, period`
	return s.each(ctx, "statements", stmt, append(slices.Clone(args), args...), []any{&st.Tenant, &st.Period, &revision, &st.Hash, &content, &st.ClosedAt}, func() error {
		out := st
		out.Revision, out.Content, out.ClosedAt = int(revision), []byte(content), st.ClosedAt.UTC()
		return fn(out)
	})
}

// FirstClosedPeriod is the earliest period of any closed statement; ok is
// false before the first close.
func (s *Store) FirstClosedPeriod(ctx context.Context) (period string, ok bool, err error) {
	err = s.each(ctx, "first closed period", "SELECT period FROM statements ORDER BY period LIMIT 1", nil, []any{&period}, func() error {
		ok = true
		return nil
	})
	return period, ok, err
}
