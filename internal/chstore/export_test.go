package chstore

import (
	"context"
	"strconv"
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

// UsageCostResultRows returns the rows each finished usage-and-cost query
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
  AND query LIKE '%GROUP BY b, tenant_id, model, deployment%'
ORDER BY event_time`, []any{strconv.FormatUint(marker, 10)}, []any{&n}, func() error {
		out = append(out, n)
		return nil
	})
	return out, err
}
