package chstore

import "context"

// RollupsInClickHouse runs a rollup query with every merge done by
// ClickHouse, for comparison with Rollups.
func (s *Store) RollupsInClickHouse(ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	return s.rollups(ctx, q, func(RollupQuery) bool { return false })
}

// MergesHere reports whether Rollups merges the rows of q in this process.
func (q RollupQuery) MergesHere() bool {
	q, _ = q.Normalize()
	return q.mergeHere()
}

// Exec runs a statement on the store's database, for tests that change
// what the store sees.
func (s *Store) Exec(ctx context.Context, stmt string) error { return s.conn.Exec(ctx, stmt) }
