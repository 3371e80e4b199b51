package query

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"tokenmeter/internal/ident"
	"tokenmeter/rollup"
)

// Page sizes of series answers.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Page selects Size series from Offset, in group order.
type Page struct {
	groupBy []string
	Offset  int
	Size    int
}

// NewPage checks a page of series grouped by groupBy: size 0 is
// DefaultPageSize; token is the NextPage of the page before ("" first).
// Errors wrap ErrInvalidQuery.
func NewPage(groupBy []string, size int, token string) (Page, error) {
	p := Page{groupBy: groupBy, Size: size}
	switch {
	case p.Size == 0:
		p.Size = DefaultPageSize
	case p.Size < 0 || p.Size > MaxPageSize:
		return Page{}, fmt.Errorf("%w: page_size %d: want 1 to %d", ErrInvalidQuery, p.Size, MaxPageSize)
	}
	if token != "" {
		var err error
		if p.Offset, err = strconv.Atoi(token); err != nil || p.Offset < 0 {
			return Page{}, fmt.Errorf("%w: bad page_token", ErrInvalidQuery)
		}
	}
	return p, nil
}

// groupKey orders and identifies a series by its group values: different
// groups have different keys whatever bytes their values hold, and keys sort
// as the groups do, value by value in group_by order.
func groupKey(fields []string, g map[string]string) string {
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = g[f]
	}
	return ident.Key(parts...)
}

// Paginate splits rows (sorted by step) into series ordered by group, and
// returns the keys of the page's series, every series by key, and the
// token of the next page ("" on the last).
func Paginate[R any](p Page, rows []R, group func(R) map[string]string) (keys []string, series map[string][]R, next string) {
	series = map[string][]R{}
	for _, r := range rows {
		k := groupKey(p.groupBy, group(r))
		if _, ok := series[k]; !ok {
			keys = append(keys, k)
		}
		series[k] = append(series[k], r)
	}
	slices.Sort(keys)
	if p.Offset >= len(keys) {
		return nil, series, ""
	}
	end := min(len(keys), p.Offset+p.Size)
	if end < len(keys) {
		next = strconv.Itoa(end)
	}
	return keys[p.Offset:end], series, next
}

// StepSecondsAt is the length of q's step starting at start, clipped to
// the range.
func StepSecondsAt(q RollupQuery, start time.Time) float64 {
	from, to := start, rollup.StepEnd(q.Step, start, q.End)
	if from.Before(q.Start) {
		from = q.Start
	}
	return to.Sub(from).Seconds()
}

// Ratio is a / b, 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
