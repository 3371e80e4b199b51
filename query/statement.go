package query

import (
	"context"
	"slices"
	"time"

	"tokenmeter/billing"
)

// StatementUsage reads tenant's usage of [start, end) per model and
// deployment, for a statement: the range is cut at cuts (the models' price
// changes inside it) so that each slice lies under one price, and each
// slice is read as Usage reads it (rollups for the hours the job has
// finished, raw events for the rest), whole hours from the hour rollups
// and the parts of hours at its ends (a +05:30 month starts at :30) from
// the minute rollups. The slices therefore add up exactly to Usage of the
// range.
func (s *Service) StatementUsage(ctx context.Context, tenant string, start, end time.Time, cuts []time.Time) ([]billing.StatementUsage, error) {
	bounds := []time.Time{start}
	for _, c := range cuts {
		if c.After(start) && c.Before(end) {
			bounds = append(bounds, c)
		}
	}
	bounds = append(bounds, end)
	slices.SortFunc(bounds, time.Time.Compare)
	bounds = slices.CompactFunc(bounds, time.Time.Equal)
	var out []billing.StatementUsage
	for i := 0; i+1 < len(bounds); i++ {
		for _, piece := range hourPieces(bounds[i], bounds[i+1]) {
			rows, err := s.Usage(ctx, UsageQuery{TenantID: tenant, Start: piece[0], End: piece[1], GroupBy: []string{"model", "deployment"}})
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				out = append(out, billing.StatementUsage{Start: piece[0], End: piece[1], Model: r.Model, Deployment: r.Deployment,
					Requests: uint64(r.Requests), InputTokens: uint64(r.PromptTokens), CachedInputTokens: uint64(r.CachedPromptTokens),
					OutputTokens: uint64(r.OutputTokens)})
			}
		}
	}
	return out, nil
}

// hourPieces splits [start, end) into the part before its first whole hour,
// its whole hours, and the part after its last, leaving out empty parts.
func hourPieces(start, end time.Time) [][2]time.Time {
	first := start.Truncate(time.Hour)
	if first.Before(start) {
		first = first.Add(time.Hour)
	}
	last := end.Truncate(time.Hour)
	if !first.Before(last) {
		return [][2]time.Time{{start, end}}
	}
	var out [][2]time.Time
	for _, p := range [][2]time.Time{{start, first}, {first, last}, {last, end}} {
		if p[1].After(p[0]) {
			out = append(out, p)
		}
	}
	return out
}
