package chstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"tokenmeter/query"
)

// Exec runs a statement on the store's database, for tests that change
// what the store sees.
func (s *Store) Exec(ctx context.Context, stmt string) error { return s.conn.Exec(ctx, stmt) }

// Reapply runs every migration's statements again, as a meterd that
// found none recorded would.
func (s *Store) Reapply(ctx context.Context) error {
	migs, err := Migrations()
	if err != nil {
		return err
	}
	for _, m := range migs {
		if err := s.apply(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// Count counts the rows of table as the store reads it.
func (s *Store) Count(ctx context.Context, table string) (uint64, error) {
	var n uint64
	err := s.conn.QueryRow(ctx, "SELECT count() FROM "+table).Scan(&n)
	return n, err
}

// SetUsageCostChunkRows bounds the rows of one query of EachUsageCost.
func (s *Store) SetUsageCostChunkRows(n int) { s.usageCostChunk = n }

// EachUsageCostGrouped streams q's usage-and-cost rows as ClickHouse sums
// them (the wider steps' read), for any step: what the hour step's rows
// summed in Go must equal.
func (s *Store) EachUsageCostGrouped(ctx context.Context, q query.CostQuery, row func(r *query.UsageCostRow) error) error {
	q, err := q.Normalize()
	if err != nil {
		return err
	}
	chunks, err := s.usageCostChunks(ctx, q)
	if err != nil {
		return err
	}
	return s.eachUsageCostGrouped(ctx, q, chunks, row)
}

// UsageCostResultRows returns the rows each finished usage-and-cost query
// (the hour step's read of cost_hour's rows, a wider step's GROUP BY)
// returned that ran with max_query_size set to marker (a harmless setting
// that tells a test's queries apart in system.query_log; they must run with
// log_queries).
func (s *Store) UsageCostResultRows(ctx context.Context, marker uint64) ([]uint64, error) {
	if err := s.conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		return nil, err
	}
	var (
		out []uint64
		n   uint64
	)
	err := s.each(ctx, "query log", `SELECT result_rows FROM system.query_log
WHERE type = 2 AND Settings.Values[indexOf(Settings.Names, 'max_query_size')] = ?
  AND query LIKE '%AS b, tenant_id, model, deployment,%'
ORDER BY event_time`, []any{strconv.FormatUint(marker, 10)}, []any{&n}, func() error {
		out = append(out, n)
		return nil
	})
	return out, err
}

// MigrateThrough applies and records the migrations up to version, as a
// meterd of that version would have.
func (s *Store) MigrateThrough(ctx context.Context, version int) error {
	if err := s.ensureDatabase(ctx); err != nil {
		return err
	}
	migs, err := Migrations()
	if err != nil {
		return err
	}
	ddl, err := s.statements(0, schemaMigrationsDDL)
	if err != nil {
		return err
	}
	for _, stmt := range ddl {
		if err := s.conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	for _, m := range migs {
		if m.Version > version {
			break
		}
		if err := s.apply(ctx, m); err != nil {
			return err
		}
		if err := s.insertRow(ctx, "INSERT INTO schema_migrations (version, name, applied_at)", uint32(m.Version), m.Name, time.Unix(0, 0).UTC()); err != nil {
			return err
		}
	}
	return nil
}

// ApplyOnce applies migration version as Migrate does, reporting whether
// another meterd's record of it stood in for a failure.
func (s *Store) ApplyOnce(ctx context.Context, version int) (bool, error) {
	migs, err := Migrations()
	if err != nil {
		return false, err
	}
	for _, m := range migs {
		if m.Version == version {
			return s.applyOnce(ctx, m)
		}
	}
	return false, fmt.Errorf("no migration %d", version)
}

// QueryUint64 runs a query of one UInt64 value on the store's database.
func (s *Store) QueryUint64(ctx context.Context, stmt string, args ...any) (uint64, error) {
	var v uint64
	err := s.conn.QueryRow(ctx, stmt, args...).Scan(&v)
	return v, err
}
