package rollup

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// EngineStore is what the engine rollup needs of ClickHouse.
type EngineStore interface {
	// EngineDirtyHours lists the hours touched by engine sample inserts
	// stamped in [since, until); a zero since lists every hour with samples.
	EngineDirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
	// EngineSamplesOfHours returns the samples of the whole hours in
	// [from, to), deduplicated by sample_id.
	EngineSamplesOfHours(ctx context.Context, from, to time.Time) ([]EngineSampleRow, error)
	// WriteEngineRows stores one hour's minute and hour rows with version;
	// they replace the rows of earlier computations of the hour.
	WriteEngineRows(ctx context.Context, minutes, hours []EngineRow, version uint64) error
}

// EngineSampleRow is one deduplicated engine sample (proto EngineSample). A
// nil field was not published by the engine, or (a counter delta) not yet
// known.
type EngineSampleRow struct {
	Deployment, Engine, Model, Replica string
	SampledAt                          time.Time
	IntervalS                          float64
	Running, Waiting                   *uint32
	KVCacheUsage                       *float64
	PrefixQueries, PrefixHits          *uint64
	PrefixHitRate                      *float64
	Preemptions                        *uint64
	BatchTokens                        *float64
	// Restarts is 1 when the engine restarted since the replica's previous
	// scrape (proto EngineSample.restarts).
	Restarts *uint32
}

// EngineRow is the engine rollup of one bucket (a minute or an hour) and
// replica: sums that merge over any range and grouping. A mean is
// Weighted / Seconds, where Seconds sums the interval_s of the samples
// that carried the value; queue depths are counted per value
// (WaitingValues ascending, WaitingCounts), so that a percentile over any
// set of rows is exact.
type EngineRow struct {
	Bucket                             time.Time
	Deployment, Engine, Model, Replica string
	Samples                            uint64
	SampledSeconds                     float64
	RunningWeighted, RunningSeconds    float64
	RunningMax                         uint32
	WaitingWeighted, WaitingSeconds    float64
	WaitingMax                         uint32
	WaitingValues                      []uint32
	WaitingCounts                      []uint64
	KVWeighted, KVSeconds, KVMax       float64
	// KVMin is the smallest KV-cache usage sampled; meaningful only when
	// KVSamples > 0 (merges take the min over rows with samples).
	KVMin                           float64
	KVSamples                       uint64
	PrefixQueries, PrefixHits       uint64
	HitRateWeighted, HitRateSeconds float64
	Preemptions                     uint64
	BatchWeighted, BatchSeconds     float64
	// Restarts is the engine restarts counted in the bucket.
	Restarts uint64
}

// RollupEngine aggregates samples into one row per bucket of size step
// (time.Minute or time.Hour) and (deployment, engine, model, replica), in
// key order. A sample belongs to the bucket that contains its sampled_at.
func RollupEngine(samples []EngineSampleRow, step time.Duration) []EngineRow {
	type key struct {
		bucket                             int64
		deployment, engine, model, replica string
	}
	rows := map[key]*EngineRow{}
	waiting := map[key]map[uint32]uint64{}
	for i := range samples {
		s := &samples[i]
		b := s.SampledAt.UTC().Truncate(step)
		k := key{b.Unix(), s.Deployment, s.Engine, s.Model, s.Replica}
		r := rows[k]
		if r == nil {
			r = &EngineRow{Bucket: b, Deployment: s.Deployment, Engine: s.Engine, Model: s.Model, Replica: s.Replica}
			rows[k] = r
			waiting[k] = map[uint32]uint64{}
		}
		iv := s.IntervalS
		r.Samples++
		r.SampledSeconds += iv
		if s.Running != nil {
			r.RunningWeighted += iv * float64(*s.Running)
			r.RunningSeconds += iv
			r.RunningMax = max(r.RunningMax, *s.Running)
		}
		if s.Waiting != nil {
			r.WaitingWeighted += iv * float64(*s.Waiting)
			r.WaitingSeconds += iv
			r.WaitingMax = max(r.WaitingMax, *s.Waiting)
			waiting[k][*s.Waiting]++
		}
		if s.KVCacheUsage != nil {
			r.KVWeighted += iv * *s.KVCacheUsage
			r.KVSeconds += iv
			r.KVMax = max(r.KVMax, *s.KVCacheUsage)
			if r.KVSamples == 0 || *s.KVCacheUsage < r.KVMin {
				r.KVMin = *s.KVCacheUsage
			}
			r.KVSamples++
		}
		// Queries and hits come as a pair: a hit count without its
		// queries would bias the rate.
		if s.PrefixQueries != nil && s.PrefixHits != nil {
			r.PrefixQueries += *s.PrefixQueries
			r.PrefixHits += *s.PrefixHits
		}
		if s.PrefixHitRate != nil {
			r.HitRateWeighted += iv * *s.PrefixHitRate
			r.HitRateSeconds += iv
		}
		if s.Preemptions != nil {
			r.Preemptions += *s.Preemptions
		}
		if s.BatchTokens != nil {
			r.BatchWeighted += iv * *s.BatchTokens
			r.BatchSeconds += iv
		}
		if s.Restarts != nil {
			r.Restarts += uint64(*s.Restarts)
		}
	}
	out := make([]EngineRow, 0, len(rows))
	for k, r := range rows {
		for v := range waiting[k] {
			r.WaitingValues = append(r.WaitingValues, v)
		}
		slices.Sort(r.WaitingValues)
		for _, v := range r.WaitingValues {
			r.WaitingCounts = append(r.WaitingCounts, waiting[k][v])
		}
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b EngineRow) int {
		if c := a.Bucket.Compare(b.Bucket); c != 0 {
			return c
		}
		for _, p := range [][2]string{{a.Deployment, b.Deployment}, {a.Engine, b.Engine}, {a.Model, b.Model}, {a.Replica, b.Replica}} {
			if p[0] != p[1] {
				if p[0] < p[1] {
					return -1
				}
				return 1
			}
		}
		return 0
	})
	return out
}

// ValueQuantile returns the q-quantile (0 < q ≤ 1) of a distribution given
// as ascending values and their counts: the smallest value v such that at
// least q of the observations are ≤ v (the nearest-rank definition, exact
// for counted values). ok is false when there are no observations.
func ValueQuantile(values []uint32, counts []uint64, q float64) (v uint32, ok bool) {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0, false
	}
	// rank = ceil(q * total), at least 1.
	rank := uint64(q * float64(total))
	if float64(rank) < q*float64(total) {
		rank++
	}
	rank = max(rank, 1)
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= rank {
			return values[i], true
		}
	}
	return values[len(values)-1], true
}

// engineHours recomputes the engine rollups of several hours, reading them
// in spans of consecutive hours (eachSpan) and writing their rows with
// version together: one write of each table for them all (an INSERT costs
// a part of every column whatever its rows), or one per
// maxPendingEngineRows minute rows.
func engineHours(ctx context.Context, store EngineStore, hours []time.Time, version uint64) error {
	var minutes, hourRows []EngineRow
	write := func() error {
		if len(minutes)+len(hourRows) == 0 {
			return nil
		}
		if err := store.WriteEngineRows(ctx, minutes, hourRows, version); err != nil {
			return fmt.Errorf("engine rollup of %s and %d more hours: %w", hours[0].Format(time.RFC3339), len(hours)-1, err)
		}
		minutes, hourRows = minutes[:0], hourRows[:0]
		return nil
	}
	err := eachSpan(hours, func(from, to time.Time) (int, error) {
		samples, err := store.EngineSamplesOfHours(ctx, from, to)
		if err != nil {
			return 0, err
		}
		// Buckets are minutes and hours of sampled_at: a span's samples
		// roll up as its hours' would one by one.
		minutes = append(minutes, RollupEngine(samples, time.Minute)...)
		hourRows = append(hourRows, RollupEngine(samples, time.Hour)...)
		if len(minutes) >= maxPendingEngineRows {
			if err := write(); err != nil {
				return 0, err
			}
		}
		return len(samples), nil
	})
	if err != nil {
		return err
	}
	return write()
}

// maxPendingEngineRows bounds the engine minute rows engineHours holds
// before it writes them.
const maxPendingEngineRows = 50_000
