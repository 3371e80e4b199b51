package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"tokenmeter/rollup"
)

// EngineGroupFields are the dimensions engine stats can be grouped by.
var EngineGroupFields = []string{"deployment", "engine", "model", "replica"}

// EngineSource reads engine rollup rows.
type EngineSource interface {
	EngineRows(ctx context.Context, q EngineQuery) ([]EngineRow, error)
}

// EngineQuery selects engine stats per (step, group).
type EngineQuery struct {
	// Start (inclusive) and End (exclusive): whole minutes for a minute
	// step, else whole hours.
	Start, End time.Time
	// Step is "minute", "hour", "day", "month" or "total" (default).
	Step string
	// GroupBy lists fields of EngineGroupFields.
	GroupBy []string
}

// StepSeconds is the width of the query's step in seconds: 0 for "total",
// -1 for calendar months.
func (q EngineQuery) StepSeconds() int64 { return rollup.Granularities[q.Step] }

// Normalize fills defaults and checks the query; errors wrap ErrInvalidQuery.
func (q EngineQuery) Normalize() (EngineQuery, error) {
	var errs []error
	if q.Step == "" {
		q.Step = "total"
	}
	step, ok := rollup.Granularities[q.Step]
	if !ok {
		errs = append(errs, fmt.Errorf("%w: step %q: want minute, hour, day, month or total", ErrInvalidQuery, q.Step))
	}
	if rerrs := checkRange(q.Start, q.End, q.Step, step, ok); len(rerrs) > 0 {
		errs = append(errs, rerrs...)
	} else {
		unit, what := time.Hour, "whole hours (engine rows of coarser steps are read per hour)"
		if q.Step == "minute" {
			unit, what = time.Minute, "whole minutes"
		}
		if !q.Start.Truncate(unit).Equal(q.Start) || !q.End.Truncate(unit).Equal(q.End) {
			errs = append(errs, fmt.Errorf("%w: start and end must lie on %s", ErrInvalidQuery, what))
		}
	}
	group, gerrs := parseGroupBy(q.GroupBy, EngineGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	return q, errors.Join(errs...)
}

// EngineRow is the engine rollup of one group in one step: the sums of
// rollup.EngineRow, and the replicas sampled in the step.
type EngineRow struct {
	Start    time.Time
	Group    map[string]string
	Replicas uint64
	rollup.EngineRow
}

// EngineStats runs an engine stats query. Minute steps read the minute
// rows, which are kept for the minute retention window only.
func (s *Service) EngineStats(ctx context.Context, q EngineQuery) ([]EngineRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	if q.Step == "minute" {
		if err := s.checkMinuteWindow(q.Start); err != nil {
			return nil, err
		}
	}
	return s.src.EngineRows(ctx, q)
}

// EnginePoint is the engine statistics of a step (or of the range).
type EnginePoint struct {
	Start time.Time
	// Samples and SampledSeconds count the samples; Replicas is the
	// distinct replicas of the step (in a summary: the most of any step).
	Samples, Replicas      uint64
	SampledSeconds         float64
	WaitingMean            float64
	WaitingMax, WaitingP95 uint32
	RunningMean            float64
	RunningMax             uint32
	KVMean, KVMax          float64
	KVSamples              uint64
	PrefixQueries          uint64
	PrefixHits             uint64
	// PrefixHitRate is hits / queries, else the mean of the engines'
	// hit-rate gauges; HitRateOK is false when neither is known.
	PrefixHitRate  float64
	HitRateOK      bool
	Preemptions    uint64
	BatchTokens    float64
	BatchTokensOK  bool
	sum            rollup.EngineRow
	waitingByValue map[uint32]uint64
}

func (p *EnginePoint) add(r EngineRow) {
	s := &p.sum
	s.Samples += r.Samples
	s.SampledSeconds += r.SampledSeconds
	s.RunningWeighted += r.RunningWeighted
	s.RunningSeconds += r.RunningSeconds
	s.RunningMax = max(s.RunningMax, r.RunningMax)
	s.WaitingWeighted += r.WaitingWeighted
	s.WaitingSeconds += r.WaitingSeconds
	s.WaitingMax = max(s.WaitingMax, r.WaitingMax)
	s.KVWeighted += r.KVWeighted
	s.KVSeconds += r.KVSeconds
	s.KVMax = max(s.KVMax, r.KVMax)
	s.KVSamples += r.KVSamples
	s.PrefixQueries += r.PrefixQueries
	s.PrefixHits += r.PrefixHits
	s.HitRateWeighted += r.HitRateWeighted
	s.HitRateSeconds += r.HitRateSeconds
	s.Preemptions += r.Preemptions
	s.BatchWeighted += r.BatchWeighted
	s.BatchSeconds += r.BatchSeconds
	p.Replicas = max(p.Replicas, r.Replicas)
	if p.waitingByValue == nil {
		p.waitingByValue = map[uint32]uint64{}
	}
	for i, v := range r.WaitingValues {
		p.waitingByValue[v] += r.WaitingCounts[i]
	}
}

func (p *EnginePoint) finish(start time.Time) {
	s := &p.sum
	p.Start = start
	p.Samples, p.SampledSeconds = s.Samples, s.SampledSeconds
	p.WaitingMean = ratio(s.WaitingWeighted, s.WaitingSeconds)
	p.WaitingMax = s.WaitingMax
	values := make([]uint32, 0, len(p.waitingByValue))
	for v := range p.waitingByValue {
		values = append(values, v)
	}
	slices.Sort(values)
	counts := make([]uint64, len(values))
	for i, v := range values {
		counts[i] = p.waitingByValue[v]
	}
	p.WaitingP95, _ = rollup.ValueQuantile(values, counts, 0.95)
	p.RunningMean = ratio(s.RunningWeighted, s.RunningSeconds)
	p.RunningMax = s.RunningMax
	p.KVMean, p.KVMax, p.KVSamples = ratio(s.KVWeighted, s.KVSeconds), s.KVMax, s.KVSamples
	p.PrefixQueries, p.PrefixHits = s.PrefixQueries, s.PrefixHits
	switch {
	case s.PrefixQueries > 0:
		p.PrefixHitRate, p.HitRateOK = float64(s.PrefixHits)/float64(s.PrefixQueries), true
	case s.HitRateSeconds > 0:
		p.PrefixHitRate, p.HitRateOK = s.HitRateWeighted/s.HitRateSeconds, true
	}
	p.Preemptions = s.Preemptions
	if s.BatchSeconds > 0 {
		p.BatchTokens, p.BatchTokensOK = s.BatchWeighted/s.BatchSeconds, true
	}
	p.waitingByValue = nil
}

func ratio(num, den float64) float64 {
	if den == 0 {
		return 0
	}
	return num / den
}

// EngineSeriesOf builds the page p of engine series of the normalized
// query q from its rows (Service.EngineStats), with the next page's token.
func EngineSeriesOf(q EngineQuery, p Page, rows []EngineRow) (series []Series[EnginePoint], next string) {
	series, next, _ = seriesOf[EngineRow, EnginePoint](p, q.Start, rows, func(r EngineRow) (map[string]string, time.Time, []string) {
		return r.Group, r.Start, nil
	})
	return series, next
}

// EnginePointOf merges the rows of one step of several groups (distinct
// deployments of a capacity unit) into one point starting at start: their
// replicas add up.
func EnginePointOf(rows []EngineRow, start time.Time) EnginePoint {
	var (
		p        EnginePoint
		replicas uint64
	)
	for _, r := range rows {
		p.add(r)
		replicas += r.Replicas
	}
	p.finish(start)
	p.Replicas = replicas
	return p
}
