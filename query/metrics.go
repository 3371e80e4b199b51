package query

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"tokenmeter/rollup"
	"tokenmeter/rollup/sketch"
)

// Quantiles are the percentiles a latency answer gives: p50, p90, p95, p99.
var Quantiles = []float64{0.5, 0.9, 0.95, 0.99}

// LatencyStats summarizes one latency distribution.
type LatencyStats struct {
	Count              uint64
	Mean               float64
	P50, P90, P95, P99 float64
	TailRatio          float64 // P99 / P50
	MaxP99             float64 // the largest step P99 (summaries only)
}

// LatencyPoint is the stats of each of rollup.LatencyMetrics in one step
// (or, as a summary, over the range).
type LatencyPoint struct {
	Start   time.Time
	Metrics map[string]*LatencyStats
}

// LatencySeries is one group's latency per step, and over the range.
type LatencySeries struct {
	Group   map[string]string
	Points  []LatencyPoint
	Summary LatencyPoint
}

// statsOf summarizes a distribution given its count, sum and quantiles.
func statsOf(count uint64, sum float64, q []float64) *LatencyStats {
	st := &LatencyStats{Count: count}
	if count == 0 {
		return st
	}
	st.Mean = sum / float64(count)
	st.P50, st.P90, st.P95, st.P99 = q[0], q[1], q[2], q[3]
	st.TailRatio = Ratio(st.P99, st.P50)
	return st
}

// distribution is one metric's latencies in one step: exact values or a
// histogram. Both give stats and merge into the summary of a range.
type distribution interface {
	stats() (*LatencyStats, error)
	merge(other distribution)
}

// histDist is a rollup histogram with its exact count and sum. Merged
// into, it keeps the sum in a sketch.Merger until its stats are read. With
// noSum (the distributions of rollup.HourDists keep no sum), the mean is
// read from the histogram: each bucket's value is within α of every value
// in it, so the mean of the values is within α too.
type histDist struct {
	count uint64
	sum   float64
	noSum bool
	h     sketch.Histogram
	acc   *sketch.Merger
}

// HourLatencyMetrics are the latency distributions of rollup.HourDists that
// a latency answer gives beside rollup.LatencyMetrics, at hour and coarser
// steps: prefill, decode and E2E per output-length class.
var HourLatencyMetrics = []string{"prefill", "decode", "e2e_short", "e2e_medium", "e2e_long"}

// bucketValues holds sketch.Value of every key, MinKey first: histMean
// reads each bucket of every breakdown histogram of an answer, and
// math.Pow was a fifth of the Go side of every tenant's latency.
var bucketValues = func() []float64 {
	v := make([]float64, int(sketch.MaxKey)-int(sketch.MinKey)+1)
	for i := range v {
		v[i] = sketch.Value(int16(i + int(sketch.MinKey)))
	}
	return v
}()

// histMean is the mean of the values of h read from its buckets' values.
func histMean(h sketch.Histogram) float64 {
	var sum float64
	var n uint64
	for i, k := range h.Keys {
		sum += bucketValues[int(k)-int(sketch.MinKey)] * float64(h.Counts[i])
		n += h.Counts[i]
	}
	return Ratio(sum, float64(n))
}

// mergers recycles the Mergers of histDist (about 12 KB each; a query with
// many series merges as many summaries).
var mergers = sync.Pool{New: func() any { return new(sketch.Merger) }}

func (d *histDist) stats() (*LatencyStats, error) {
	if d.acc != nil {
		d.h = d.acc.Take()
		mergers.Put(d.acc) // empty again; what Take returned stays as it is
		d.acc = nil
	}
	if d.h.Count() == 0 {
		return &LatencyStats{Count: d.count}, nil
	}
	q, err := d.h.Quantiles(Quantiles...)
	if err != nil {
		return nil, err
	}
	sum := d.sum
	if d.noSum {
		sum = histMean(d.h) * float64(d.count)
	}
	return statsOf(d.count, sum, q), nil
}

func (d *histDist) merge(o distribution) {
	x := o.(*histDist)
	d.count += x.count
	d.sum += x.sum
	d.noSum = d.noSum || x.noSum
	if d.acc == nil {
		d.acc = mergers.Get().(*sketch.Merger)
		d.acc.Add(d.h)
	}
	d.acc.Add(x.h)
}

// exactDist holds every value, for exact quantiles.
type exactDist struct{ values []float64 }

func (d *exactDist) stats() (*LatencyStats, error) {
	if len(d.values) == 0 {
		return &LatencyStats{}, nil
	}
	slices.Sort(d.values)
	q := make([]float64, len(Quantiles))
	var sum float64
	for _, v := range d.values {
		sum += v
	}
	for i, p := range Quantiles {
		v, err := sketch.ExactQuantile(d.values, p)
		if err != nil {
			return nil, err
		}
		q[i] = v
	}
	return statsOf(uint64(len(d.values)), sum, q), nil
}

func (d *exactDist) merge(o distribution) { d.values = append(d.values, o.(*exactDist).values...) }

// latencyStep is one step of a series: a distribution per LatencyMetrics entry.
type latencyStep struct {
	start time.Time
	dists map[string]distribution
}

// latencySeries builds a series from its steps: stats per step, and the
// summary of the merged distributions with the largest step p99.
func latencySeries(group map[string]string, rangeStart time.Time, steps []latencyStep, empty func() distribution) (LatencySeries, error) {
	out := LatencySeries{Group: group, Summary: LatencyPoint{Start: rangeStart, Metrics: map[string]*LatencyStats{}}}
	total := map[string]distribution{}
	// The metrics every step has: HourLatencyMetrics only where no step
	// comes from minute rows.
	metrics := slices.Clone(rollup.LatencyMetrics)
	for _, m := range HourLatencyMetrics {
		if !slices.ContainsFunc(steps, func(st latencyStep) bool { return st.dists[m] == nil }) {
			metrics = append(metrics, m)
		}
	}
	for _, m := range metrics {
		total[m] = empty()
	}
	for _, st := range steps {
		p := LatencyPoint{Start: st.start, Metrics: map[string]*LatencyStats{}}
		for _, m := range metrics {
			stats, err := st.dists[m].stats()
			if err != nil {
				return LatencySeries{}, err
			}
			p.Metrics[m] = stats
			total[m].merge(st.dists[m])
		}
		out.Points = append(out.Points, p)
	}
	for _, m := range metrics {
		stats, err := total[m].stats()
		if err != nil {
			return LatencySeries{}, err
		}
		for _, p := range out.Points {
			stats.MaxP99 = math.Max(stats.MaxP99, p.Metrics[m].P99)
		}
		out.Summary.Metrics[m] = stats
	}
	return out, nil
}

// LatencySeriesOf builds the page p of latency series of the normalized
// query q from its rollup rows (Service.Rollups with LatencyColumns): the
// percentiles of each step's histogram, and of the range's merged one.
func LatencySeriesOf(q RollupQuery, p Page, rows []RollupRow) (series []LatencySeries, next string, err error) {
	keys, byKey, next := Paginate(p, rows, func(r RollupRow) map[string]string { return r.Group })
	for _, k := range keys {
		var steps []latencyStep
		for _, r := range byKey[k] {
			st := latencyStep{start: r.Start, dists: map[string]distribution{}}
			for _, m := range rollup.LatencyMetrics {
				d := r.Latency[m]
				h, err := sketch.FromArrays(d.Keys, d.Counts)
				if err != nil {
					return nil, "", fmt.Errorf("histogram %s: %w", m, err)
				}
				st.dists[m] = &histDist{count: d.Count, sum: d.Sum, h: h}
			}
			for _, m := range HourLatencyMetrics {
				d, ok := r.HourDists[m]
				if !ok {
					continue // a minute row
				}
				h, err := sketch.FromArrays(d.Keys, d.Counts)
				if err != nil {
					return nil, "", fmt.Errorf("histogram %s: %w", m, err)
				}
				st.dists[m] = &histDist{count: h.Count(), noSum: true, h: h}
			}
			steps = append(steps, st)
		}
		s, err := latencySeries(byKey[k][0].Group, q.Start, steps, func() distribution { return &histDist{} })
		if err != nil {
			return nil, "", err
		}
		series = append(series, s)
	}
	return series, next, nil
}

// ExactLatencySeriesOf builds the page p of latency series of the
// normalized query q from every latency value (Service.RawLatency): exact
// percentiles.
func ExactLatencySeriesOf(q RollupQuery, p Page, rows []RawLatencyRow) (series []LatencySeries, next string, err error) {
	keys, byKey, next := Paginate(p, rows, func(r RawLatencyRow) map[string]string { return r.Group })
	for _, k := range keys {
		var steps []latencyStep
		for _, r := range byKey[k] {
			st := latencyStep{start: r.Start, dists: map[string]distribution{}}
			for _, m := range slices.Concat(rollup.LatencyMetrics, HourLatencyMetrics) {
				st.dists[m] = &exactDist{values: r.Values[m]}
			}
			steps = append(steps, st)
		}
		s, err := latencySeries(byKey[k][0].Group, q.Start, steps, func() distribution { return &exactDist{} })
		if err != nil {
			return nil, "", err
		}
		series = append(series, s)
	}
	return series, next, nil
}

// GoodputPoint is goodput in one step (or over the range).
type GoodputPoint struct {
	Start                          time.Time
	Requests, GoodRequests         uint64
	Attainment                     float64 // good requests / requests
	GoodputRequestsPerSecond       float64
	OutputTokens, GoodOutputTokens uint64
	GoodputOutputTokensPerSecond   float64
	GoodputRatio                   float64 // good output tokens / output tokens
	SLOVersionMin, SLOVersionMax   uint32
}

// GoodputSeries is one group's goodput per step, and over the range.
type GoodputSeries struct {
	Group   map[string]string
	Points  []GoodputPoint
	Summary GoodputPoint
}

func goodputPoint(start time.Time, seconds float64, requests, good, output, goodOut uint64, minV, maxV uint32) GoodputPoint {
	return GoodputPoint{
		Start: start, Requests: requests, GoodRequests: good,
		Attainment:                   Ratio(float64(good), float64(requests)),
		GoodputRequestsPerSecond:     Ratio(float64(good), seconds),
		OutputTokens:                 output,
		GoodOutputTokens:             goodOut,
		GoodputOutputTokensPerSecond: Ratio(float64(goodOut), seconds),
		GoodputRatio:                 Ratio(float64(goodOut), float64(output)),
		SLOVersionMin:                minV, SLOVersionMax: maxV,
	}
}

// GoodputSeriesOf builds the page p of goodput series of the normalized
// query q from its rollup rows (Service.Rollups with CounterColumns).
func GoodputSeriesOf(q RollupQuery, p Page, rows []RollupRow) (series []GoodputSeries, next string) {
	keys, byKey, next := Paginate(p, rows, func(r RollupRow) map[string]string { return r.Group })
	for _, k := range keys {
		rs := byKey[k]
		out := GoodputSeries{Group: rs[0].Group}
		var req, good, output, goodOut uint64
		minV, maxV := uint32(math.MaxUint32), uint32(0)
		for _, r := range rs {
			out.Points = append(out.Points, goodputPoint(r.Start, StepSecondsAt(q, r.Start), r.Requests, r.GoodRequests, r.OutputTokens, r.GoodOutputTokens, r.MinSLO, r.MaxSLO))
			req += r.Requests
			good += r.GoodRequests
			output += r.OutputTokens
			goodOut += r.GoodOutputTokens
			minV, maxV = min(minV, r.MinSLO), max(maxV, r.MaxSLO)
		}
		out.Summary = goodputPoint(q.Start, q.End.Sub(q.Start).Seconds(), req, good, output, goodOut, minV, maxV)
		series = append(series, out)
	}
	return series, next
}

// TrafficPoint is traffic in one step (or over the range) as rates: per
// second over the step, peaks per second of its busiest minute.
type TrafficPoint struct {
	Start                     time.Time
	Requests                  uint64
	RequestsPerSecond         float64
	PeakRequestsPerSecond     float64
	InputTokensPerSecond      float64
	OutputTokensPerSecond     float64
	PeakOutputTokensPerSecond float64
	ErrorRate                 float64
	ErrorsByClass             map[string]uint64 // classes with errors only
	// Tokens per request (nil where the rollups keep no token sizes).
	PromptTokensPerRequest, OutputTokensPerRequest *TokenStats
}

// TrafficSeries is one group's traffic per step, and over the range.
type TrafficSeries struct {
	Group   map[string]string
	Points  []TrafficPoint
	Summary TrafficPoint
}

// trafficPoint is r as rates over seconds; its peaks are per second of its
// busiest minute.
func trafficPoint(r TrafficRow, seconds float64) (TrafficPoint, error) {
	byClass := map[string]uint64{}
	for c, n := range r.ErrorsBy {
		if n > 0 {
			byClass[c] = n
		}
	}
	p := TrafficPoint{
		Start: r.Start, Requests: r.Requests,
		RequestsPerSecond:         Ratio(float64(r.Requests), seconds),
		PeakRequestsPerSecond:     float64(r.PeakMinuteRequests) / 60,
		InputTokensPerSecond:      Ratio(float64(r.PromptTokens), seconds),
		OutputTokensPerSecond:     Ratio(float64(r.OutputTokens), seconds),
		PeakOutputTokensPerSecond: float64(r.PeakMinuteOutputTokens) / 60,
		ErrorRate:                 Ratio(float64(r.Errors), float64(r.Requests)),
		ErrorsByClass:             byClass,
	}
	if r.Sizes != nil {
		var err error
		if p.PromptTokensPerRequest, err = TokenStatsOf(r.Sizes.Prompt, r.PromptTokens, r.Requests); err != nil {
			return TrafficPoint{}, err
		}
		if p.OutputTokensPerRequest, err = TokenStatsOf(r.Sizes.Output, r.OutputTokens, r.Requests); err != nil {
			return TrafficPoint{}, err
		}
	}
	return p, nil
}

// TrafficSeriesOf builds the page p of traffic series of the normalized
// query q from its traffic rows (Service.Traffic).
func TrafficSeriesOf(q RollupQuery, p Page, rows []TrafficRow) (series []TrafficSeries, next string, err error) {
	keys, byKey, next := Paginate(p, rows, func(r TrafficRow) map[string]string { return r.Group })
	for _, k := range keys {
		out := TrafficSeries{Group: byKey[k][0].Group}
		total := TrafficRow{Start: q.Start}
		if !slices.ContainsFunc(byKey[k], func(r TrafficRow) bool { return r.Sizes == nil }) {
			total.Sizes = &TokenSizes{} // every step has them
		}
		for _, r := range byKey[k] {
			pt, err := trafficPoint(r, StepSecondsAt(q, r.Start))
			if err != nil {
				return nil, "", err
			}
			out.Points = append(out.Points, pt)
			total.Add(r)
		}
		if out.Summary, err = trafficPoint(total, q.End.Sub(q.Start).Seconds()); err != nil {
			return nil, "", err
		}
		series = append(series, out)
	}
	return series, next, nil
}
