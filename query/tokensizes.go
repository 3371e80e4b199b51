package query

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"time"

	"tokenmeter/rollup"
	"tokenmeter/rollup/sketch"
)

// TokenSizes are the distributions of prompt and output tokens per request
// of a step and group (rollup.HourDists prompt_size and output_size), kept
// by the hour-level rollups only.
type TokenSizes struct {
	Prompt, Output sketch.Histogram
}

// merge adds o's histograms to z's.
func (z *TokenSizes) merge(o *TokenSizes) {
	z.Prompt.Merge(o.Prompt)
	z.Output.Merge(o.Output)
}

// TokenStats summarizes tokens per request: Requests the requests of the
// row (every one, failed ones too), Mean exact (tokens / requests), the
// percentiles from a 1% histogram rounded to whole tokens.
type TokenStats struct {
	Requests      uint64
	Mean          float64
	P50, P95, P99 float64
}

// TokenStatsOf summarizes the histogram h of a row of requests with tokens
// in all; nil unless h counts exactly those requests, so that the
// percentiles never describe other requests than Requests and Mean: nil
// when h is empty or covers only some of them, as in steps with hours
// rolled up before the rollups kept token sizes (migration 0023: empty
// histograms, also in the day rows made from them; nothing recomputes
// them) and the hour in progress (its histogram is the rollup job's last
// run's, its requests every event so far).
func TokenStatsOf(h sketch.Histogram, tokens, requests uint64) (*TokenStats, error) {
	if n := h.Count(); n == 0 || n != requests {
		return nil, nil
	}
	q, err := h.Quantiles(0.5, 0.95, 0.99)
	if err != nil {
		return nil, err
	}
	// A bucket's value is within 1% of its tokens; tokens 0 map to the
	// lowest bucket, whose value (1e-3) rounds to 0.
	return &TokenStats{Requests: requests, Mean: Ratio(float64(tokens), float64(requests)),
		P50: math.Round(q[0]), P95: math.Round(q[1]), P99: math.Round(q[2])}, nil
}

// tokenSizes reads the token-size histograms of q's steps and groups from
// the hour-level rollups, by sizeKey; nil where they are not kept:
// minute steps, ranges not on whole hours, groupings that neither the
// tenant rows nor the all-tenant rows answer (rollup.HourDistTables: per
// tenant, per model and deployment, or everything), and queries whose rows
// are more than Config.MaxSeriesRows.
func (s *Service) tokenSizes(ctx context.Context, q RollupQuery) (map[string]*TokenSizes, error) {
	for _, f := range q.GroupBy {
		if !slices.Contains(rollup.RollupGroupFields, f) {
			return nil, nil
		}
	}
	q.Columns = SizeColumns
	q, err := q.Normalize()
	if err != nil {
		return nil, nil //nolint:nilerr // no sizes for what the rollups cannot answer
	}
	switch q.level() {
	case LevelTotalHour, LevelDeploymentHour, LevelTenantHour:
		// The levels whose tables keep the token sizes
		// (rollup.HourDistTables).
	default:
		return nil, nil
	}
	rows, err := s.Rollups(ctx, q)
	if errors.Is(err, ErrTooManySeries) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]*TokenSizes, len(rows))
	for _, r := range rows {
		if _, ok := r.HourDists["prompt_size"]; !ok {
			return nil, nil // not kept at the level of this grouping
		}
		var z TokenSizes
		for _, d := range []struct {
			name string
			h    *sketch.Histogram
		}{{"prompt_size", &z.Prompt}, {"output_size", &z.Output}} {
			dist := r.HourDists[d.name]
			if *d.h, err = sketch.FromArrays(dist.Keys, dist.Counts); err != nil {
				return nil, err
			}
		}
		out[sizeKey(r.Start, r.Group)] = &z
	}
	return out, nil
}

// sizeKey identifies a step and group of tokenSizes' answer, whatever the
// order of the group-by fields.
func sizeKey(start time.Time, group map[string]string) string {
	fields := slices.Sorted(maps.Keys(group))
	return stepID(start, fields, group)
}
