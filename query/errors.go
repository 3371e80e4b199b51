package query

import (
	"errors"
	"fmt"
)

// ErrInvalidQuery marks a query the caller must fix: a bad range, an unknown
// step or group-by field. Errors wrapping it carry a readable reason.
var ErrInvalidQuery = errors.New("invalid query")

// ErrTooManySeries marks a query whose answer would have more (step,
// series) rows than the service answers at once; it wraps ErrInvalidQuery.
var ErrTooManySeries = fmt.Errorf("%w: too many series", ErrInvalidQuery)

// ErrUnavailable marks a query that failed because the store could not be
// reached or did not answer; retrying later may succeed. Stores wrap their
// transport errors with it.
var ErrUnavailable = errors.New("clickhouse unavailable")

// tooManySeries is the error of a query over max (step, series) rows.
func tooManySeries(max int) error {
	return fmt.Errorf("%w: the query selects more than %d series × steps; narrow the range, use a coarser step or fewer group_by fields",
		ErrTooManySeries, max)
}
