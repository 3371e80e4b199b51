package chstore

import (
	"context"
	"time"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// The store implements what the rollup job and the read side declare they
// need.
var (
	_ rollup.Store = (*Store)(nil)
	_ query.Source = (*Store)(nil)
)

// FreshDays lists the whole days of [start, end) with a fresh day rollup.
func (s *Store) FreshDays(ctx context.Context, start, end time.Time) ([]time.Time, error) {
	return s.freshDays(ctx, start, end)
}
