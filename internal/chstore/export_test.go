package chstore

import (
	"context"
	"time"
)

// RollupsInClickHouse runs a rollup query with every merge done by
// ClickHouse, for comparison with Rollups.
func (s *Store) RollupsInClickHouse(ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	return s.rollups(ctx, q, func(RollupQuery) bool { return false }, true)
}

// RollupsFromHours runs a rollup query without reading day rollups.
func (s *Store) RollupsFromHours(ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	return s.rollups(ctx, q, RollupQuery.mergeHere, false)
}

// FreshDays lists the whole days of [start, end) with a fresh day rollup.
func (s *Store) FreshDays(ctx context.Context, start, end time.Time) ([]time.Time, error) {
	return s.freshDays(ctx, start, end)
}

// MergesHere reports whether Rollups merges the rows of q in this process.
func (q RollupQuery) MergesHere() bool {
	q, _ = q.Normalize()
	return q.mergeHere()
}

// Exec runs a statement on the store's database, for tests that change
// what the store sees.
func (s *Store) Exec(ctx context.Context, stmt string) error { return s.conn.Exec(ctx, stmt) }
