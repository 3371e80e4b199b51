package query

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/rollup"
)

// EngineGroupFields are the dimensions engine stats can be grouped by.
var EngineGroupFields = []string{"deployment", "engine", "model", "replica"}

// EngineSource reads engine rollup rows.
type EngineSource interface {
	EngineRows(ctx context.Context, q EngineQuery) ([]EngineRow, error)
}

// MaxEngineDeployments bounds the deployments an engine query may name.
const MaxEngineDeployments = 100

// EngineQuery selects engine stats per (step, group).
type EngineQuery struct {
	// Start (inclusive) and End (exclusive): whole minutes for a minute
	// step, else whole hours.
	Start, End time.Time
	// Step is "minute", "hour", "day", "month" or "total" (default).
	Step string
	// GroupBy lists fields of EngineGroupFields.
	GroupBy []string
	// Deployments keeps only these deployments (entries may be
	// comma-separated lists); none: every deployment. Normalize sorts them
	// and drops duplicates.
	Deployments []string
	// Limit bounds the rows read (0: Service.EngineStats applies
	// Config.MaxSeriesRows, and fails beyond it).
	Limit int
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
	var deps []string
	for _, d := range q.Deployments {
		for _, f := range strings.Split(d, ",") {
			if f = strings.TrimSpace(f); f != "" {
				deps = append(deps, f)
			}
		}
	}
	slices.Sort(deps)
	q.Deployments = slices.Compact(deps)
	if len(q.Deployments) > MaxEngineDeployments {
		errs = append(errs, fmt.Errorf("%w: %d deployments: at most %d", ErrInvalidQuery, len(q.Deployments), MaxEngineDeployments))
	}
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
// rows, which are kept for the minute retention window only. Without a
// Limit, a query selecting more than Config.MaxSeriesRows (step, group)
// rows fails with ErrTooManySeries.
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
	bounded := q.Limit == 0
	if bounded {
		q.Limit = s.cfg.MaxSeriesRows + 1
	}
	out, err := s.src.EngineRows(ctx, q)
	if err == nil && bounded && len(out) > s.cfg.MaxSeriesRows {
		return nil, tooManySeries(s.cfg.MaxSeriesRows)
	}
	return out, err
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
	// KVMin is the smallest KV-cache usage sampled (0 without KV samples);
	// KVMinOK is false where a row rolled up before migration 0025 does
	// not know its minimum.
	KVMin     float64
	KVMinOK   bool
	KVSamples uint64
	// Restarts is the engine restarts counted (summed over replicas).
	Restarts      uint64
	PrefixQueries uint64
	PrefixHits    uint64
	// PrefixHitRate is hits / queries, else the mean of the engines'
	// hit-rate gauges; HitRateOK is false when neither is known.
	PrefixHitRate float64
	HitRateOK     bool
	Preemptions   uint64
	BatchTokens   float64
	BatchTokensOK bool
}

// engineSum adds up engine rows into a point.
type engineSum struct {
	sum      rollup.EngineRow
	replicas uint64
	waiting  map[uint32]uint64
	// kvMin is the least KVMin of the rows added that had KV samples.
	kvMin float64
}

// add adds r; its replicas add up (sumReplicas: rows of distinct groups in
// one step) or the most is kept (rows of successive steps).
func (a *engineSum) add(r EngineRow, sumReplicas bool) {
	s := &a.sum
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
	if r.KVSamples > 0 && (s.KVSamples == 0 || r.KVMin < a.kvMin) {
		a.kvMin = r.KVMin
	}
	s.KVSamples += r.KVSamples
	s.Restarts += r.Restarts
	s.PrefixQueries += r.PrefixQueries
	s.PrefixHits += r.PrefixHits
	s.HitRateWeighted += r.HitRateWeighted
	s.HitRateSeconds += r.HitRateSeconds
	s.Preemptions += r.Preemptions
	s.BatchWeighted += r.BatchWeighted
	s.BatchSeconds += r.BatchSeconds
	if sumReplicas {
		a.replicas += r.Replicas
	} else {
		a.replicas = max(a.replicas, r.Replicas)
	}
	if a.waiting == nil {
		a.waiting = map[uint32]uint64{}
	}
	for i, v := range r.WaitingValues {
		a.waiting[v] += r.WaitingCounts[i]
	}
}

// point is the statistics of what was added, starting at start.
func (a *engineSum) point(start time.Time) EnginePoint {
	s := &a.sum
	p := EnginePoint{Start: start, Samples: s.Samples, Replicas: a.replicas, SampledSeconds: s.SampledSeconds,
		WaitingMean: ratio(s.WaitingWeighted, s.WaitingSeconds), WaitingMax: s.WaitingMax,
		RunningMean: ratio(s.RunningWeighted, s.RunningSeconds), RunningMax: s.RunningMax,
		KVMean: ratio(s.KVWeighted, s.KVSeconds), KVMax: s.KVMax, KVSamples: s.KVSamples,
		PrefixQueries: s.PrefixQueries, PrefixHits: s.PrefixHits, Preemptions: s.Preemptions, Restarts: s.Restarts}
	if s.KVSamples > 0 && a.kvMin >= 0 {
		p.KVMin, p.KVMinOK = a.kvMin, true
	}
	values := make([]uint32, 0, len(a.waiting))
	for v := range a.waiting {
		values = append(values, v)
	}
	slices.Sort(values)
	counts := make([]uint64, len(values))
	for i, v := range values {
		counts[i] = a.waiting[v]
	}
	p.WaitingP95, _ = rollup.ValueQuantile(values, counts, 0.95)
	switch {
	case s.PrefixQueries > 0:
		p.PrefixHitRate, p.HitRateOK = float64(s.PrefixHits)/float64(s.PrefixQueries), true
	case s.HitRateSeconds > 0:
		p.PrefixHitRate, p.HitRateOK = s.HitRateWeighted/s.HitRateSeconds, true
	}
	if s.BatchSeconds > 0 {
		p.BatchTokens, p.BatchTokensOK = s.BatchWeighted/s.BatchSeconds, true
	}
	return p
}

func ratio(num, den float64) float64 {
	if den == 0 {
		return 0
	}
	return num / den
}

// EngineSeriesOf builds the page p of engine series of the normalized
// query q from its rows (Service.EngineStats, a row per step and group in
// time order), with the next page's token.
func EngineSeriesOf(q EngineQuery, p Page, rows []EngineRow) (series []Series[EnginePoint], next string) {
	keys, byKey, next := Paginate(p, rows, func(r EngineRow) map[string]string { return r.Group })
	for _, k := range keys {
		var (
			s     Series[EnginePoint]
			total engineSum
		)
		for _, r := range byKey[k] {
			s.Group = r.Group
			var step engineSum
			step.add(r, true)
			s.Points = append(s.Points, step.point(r.Start))
			total.add(r, false)
		}
		s.Summary = total.point(q.Start)
		series = append(series, s)
	}
	return series, next
}

// EnginePointOf merges the rows of one step of several groups (distinct
// deployments of a capacity unit) into one point starting at start: their
// replicas add up.
func EnginePointOf(rows []EngineRow, start time.Time) EnginePoint {
	var a engineSum
	for _, r := range rows {
		a.add(r, true)
	}
	return a.point(start)
}
