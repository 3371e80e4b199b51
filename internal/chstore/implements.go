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

// FreshDays lists the whole days of [start, end) with a fresh day rollup,
// as rollup.FreshDays decides from the store's HourVersions and
// DayVersions: the one call of a domain rule left here, for query.Source,
// until package query calls rollup.FreshDays itself.
func (s *Store) FreshDays(ctx context.Context, start, end time.Time) ([]time.Time, error) {
	return rollup.FreshDays(ctx, s, start, end)
}
