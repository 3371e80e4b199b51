package query

import "context"

// RollupsInClickHouse runs a rollup query with every merge done by the
// store, for comparison with Rollups.
func RollupsInClickHouse(s *Service, ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	c := *s
	c.mergeHere = func(RollupQuery) bool { return false }
	return c.Rollups(ctx, q)
}

// RollupsFromHours runs a rollup query without reading day rollups.
func RollupsFromHours(s *Service, ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	c := *s
	c.days = false
	return c.Rollups(ctx, q)
}

// MergesHere reports whether Rollups merges the rows of q in this process.
func (q RollupQuery) MergesHere() bool {
	q, _ = q.Normalize()
	return q.mergeHere()
}
