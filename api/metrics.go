package api

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup/sketch"
)

// RollupReader answers rollup queries; *chstore.Store implements it.
type RollupReader interface {
	Rollups(ctx context.Context, q query.RollupQuery) ([]query.RollupRow, error)
	RawLatency(ctx context.Context, q query.RollupQuery) ([]query.RawLatencyRow, error)
	Traffic(ctx context.Context, q query.RollupQuery) ([]query.TrafficRow, error)
}

var _ RollupReader = (*query.Service)(nil)

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// metricsService implements meterv1.MetricsServiceServer.
type metricsService struct {
	meterv1.UnimplementedMetricsServiceServer
	store RollupReader
}

// selection is a checked SeriesSelector.
type selection struct {
	q query.RollupQuery
	pager
}

func (s *metricsService) selection(ctx context.Context, sel *meterv1.SeriesSelector) (selection, error) {
	tenant, err := scopeTenant(ctx, sel.GetTenantId())
	if err != nil {
		return selection{}, err
	}
	q := query.RollupQuery{TenantID: tenant, Step: sel.GetStep(), GroupBy: sel.GetGroupBy()}
	if sel.GetStart() != nil {
		q.Start = sel.GetStart().AsTime()
	}
	if sel.GetEnd() != nil {
		q.End = sel.GetEnd().AsTime()
	}
	q, err = q.Normalize()
	if err != nil {
		return selection{}, err
	}
	pg, err := newPager(q.GroupBy, sel.GetPageSize(), sel.GetPageToken())
	if err != nil {
		return selection{}, err
	}
	return selection{q: q, pager: pg}, nil
}

// pager pages series: pageSize groups from offset, in group order.
type pager struct {
	groupBy  []string
	offset   int
	pageSize int
}

func newPager(groupBy []string, size int32, token string) (pager, error) {
	p := pager{groupBy: groupBy, pageSize: int(size)}
	switch {
	case p.pageSize == 0:
		p.pageSize = defaultPageSize
	case p.pageSize < 0 || p.pageSize > maxPageSize:
		return pager{}, fmt.Errorf("%w: page_size %d: want 1 to %d", query.ErrInvalidQuery, p.pageSize, maxPageSize)
	}
	if token != "" {
		var err error
		if p.offset, err = strconv.Atoi(token); err != nil || p.offset < 0 {
			return pager{}, fmt.Errorf("%w: bad page_token", query.ErrInvalidQuery)
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

// page splits rows (sorted by step) into series ordered by group, and
// returns those of the page and the next page token.
func page[R any](sel pager, rows []R, group func(R) map[string]string) (keys []string, series map[string][]R, next string) {
	series = map[string][]R{}
	for _, r := range rows {
		k := groupKey(sel.groupBy, group(r))
		if _, ok := series[k]; !ok {
			keys = append(keys, k)
		}
		series[k] = append(series[k], r)
	}
	sort.Strings(keys)
	if sel.offset >= len(keys) {
		return nil, series, ""
	}
	end := min(len(keys), sel.offset+sel.pageSize)
	if end < len(keys) {
		next = strconv.Itoa(end)
	}
	return keys[sel.offset:end], series, next
}

// stepSeconds is the length of a step starting at start, clipped to the range.
func stepSeconds(q query.RollupQuery, start time.Time) float64 {
	from, to := start, rollup.StepEnd(q.Step, start, q.End)
	if from.Before(q.Start) {
		from = q.Start
	}
	return to.Sub(from).Seconds()
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

var quantiles = []float64{0.5, 0.9, 0.95, 0.99}

// statsOf summarizes a distribution given its count, sum and quantile source.
func statsOf(count uint64, sum float64, q []float64) *meterv1.LatencyStats {
	st := &meterv1.LatencyStats{Count: count}
	if count == 0 {
		return st
	}
	st.Mean = sum / float64(count)
	st.P50, st.P90, st.P95, st.P99 = q[0], q[1], q[2], q[3]
	st.TailRatio = ratio(st.P99, st.P50)
	return st
}

// distribution is one metric's latencies in one step: exact values or a
// histogram. Both give stats and merge into the summary of a range.
type distribution interface {
	stats() (*meterv1.LatencyStats, error)
	merge(other distribution)
}

// histDist is a rollup histogram with its exact count and sum. Merged
// into, it keeps the sum in a sketch.Merger until its stats are read.
type histDist struct {
	count uint64
	sum   float64
	h     sketch.Histogram
	acc   *sketch.Merger
}

// mergers recycles the Mergers of histDist (about 12 KB each; a query with
// many series merges as many summaries).
var mergers = sync.Pool{New: func() any { return new(sketch.Merger) }}

func (d *histDist) stats() (*meterv1.LatencyStats, error) {
	if d.acc != nil {
		d.h = d.acc.Take()
		mergers.Put(d.acc) // empty again; what Take returned stays as it is
		d.acc = nil
	}
	if d.h.Count() == 0 {
		return &meterv1.LatencyStats{Count: d.count}, nil
	}
	q, err := d.h.Quantiles(quantiles...)
	if err != nil {
		return nil, err
	}
	return statsOf(d.count, d.sum, q), nil
}

func (d *histDist) merge(o distribution) {
	x := o.(*histDist)
	d.count += x.count
	d.sum += x.sum
	if d.acc == nil {
		d.acc = mergers.Get().(*sketch.Merger)
		d.acc.Add(d.h)
	}
	d.acc.Add(x.h)
}

// exactDist holds every value, for exact quantiles.
type exactDist struct{ values []float64 }

func (d *exactDist) stats() (*meterv1.LatencyStats, error) {
	if len(d.values) == 0 {
		return &meterv1.LatencyStats{}, nil
	}
	sort.Float64s(d.values)
	q := make([]float64, len(quantiles))
	var sum float64
	for _, v := range d.values {
		sum += v
	}
	for i, p := range quantiles {
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
func latencySeries(group map[string]string, rangeStart time.Time, steps []latencyStep, empty func() distribution) (*meterv1.LatencySeries, error) {
	out := &meterv1.LatencySeries{Group: group, Summary: &meterv1.LatencyPoint{Start: timestamppb.New(rangeStart)}}
	total := map[string]distribution{}
	for _, m := range rollup.LatencyMetrics {
		total[m] = empty()
	}
	for _, st := range steps {
		p := &meterv1.LatencyPoint{Start: timestamppb.New(st.start)}
		for _, m := range rollup.LatencyMetrics {
			stats, err := st.dists[m].stats()
			if err != nil {
				return nil, err
			}
			setMetric(p, m, stats)
			total[m].merge(st.dists[m])
		}
		out.Points = append(out.Points, p)
	}
	for _, m := range rollup.LatencyMetrics {
		stats, err := total[m].stats()
		if err != nil {
			return nil, err
		}
		setMetric(out.Summary, m, stats)
	}
	maxP99(out.Summary, out.Points)
	return out, nil
}

func setMetric(p *meterv1.LatencyPoint, metric string, st *meterv1.LatencyStats) {
	switch metric {
	case "ttft":
		p.Ttft = st
	case "itl":
		p.Itl = st
	case "e2e":
		p.E2E = st
	case "queue":
		p.Queue = st
	}
}

func maxP99(summary *meterv1.LatencyPoint, points []*meterv1.LatencyPoint) {
	for _, p := range points {
		for _, pair := range [][2]*meterv1.LatencyStats{{summary.Ttft, p.Ttft}, {summary.Itl, p.Itl}, {summary.E2E, p.E2E}, {summary.Queue, p.Queue}} {
			pair[0].MaxP99 = math.Max(pair[0].MaxP99, pair[1].P99)
		}
	}
}

func (s *metricsService) GetLatency(ctx context.Context, req *meterv1.GetLatencyRequest) (*meterv1.GetLatencyResponse, error) {
	sel, err := s.selection(ctx, req.GetSelector())
	if err != nil {
		return nil, err
	}
	resp := &meterv1.GetLatencyResponse{RelativeAccuracy: sketch.RelativeAccuracy}
	var (
		keys   []string
		groups = map[string]map[string]string{}
		steps  = map[string][]latencyStep{}
		empty  func() distribution
	)
	if req.GetExact() {
		resp.RelativeAccuracy = 0
		empty = func() distribution { return &exactDist{} }
		rows, err := s.store.RawLatency(ctx, sel.q)
		if err != nil {
			return nil, err
		}
		var series map[string][]query.RawLatencyRow
		keys, series, resp.NextPageToken = page(sel.pager, rows, func(r query.RawLatencyRow) map[string]string { return r.Group })
		for _, k := range keys {
			groups[k] = series[k][0].Group
			for _, r := range series[k] {
				st := latencyStep{start: r.Start, dists: map[string]distribution{}}
				for _, m := range rollup.LatencyMetrics {
					st.dists[m] = &exactDist{values: r.Values[m]}
				}
				steps[k] = append(steps[k], st)
			}
		}
	} else {
		empty = func() distribution { return &histDist{} }
		q := sel.q
		q.Columns = query.LatencyColumns
		rows, err := s.store.Rollups(ctx, q)
		if err != nil {
			return nil, err
		}
		var series map[string][]query.RollupRow
		keys, series, resp.NextPageToken = page(sel.pager, rows, func(r query.RollupRow) map[string]string { return r.Group })
		for _, k := range keys {
			groups[k] = series[k][0].Group
			for _, r := range series[k] {
				st := latencyStep{start: r.Start, dists: map[string]distribution{}}
				for _, m := range rollup.LatencyMetrics {
					d := r.Latency[m]
					h, err := sketch.FromArrays(d.Keys, d.Counts)
					if err != nil {
						return nil, fmt.Errorf("histogram %s: %w", m, err)
					}
					st.dists[m] = &histDist{count: d.Count, sum: d.Sum, h: h}
				}
				steps[k] = append(steps[k], st)
			}
		}
	}
	for _, k := range keys {
		series, err := latencySeries(groups[k], sel.q.Start, steps[k], empty)
		if err != nil {
			return nil, err
		}
		resp.Series = append(resp.Series, series)
	}
	return resp, nil
}

func goodputPoint(start time.Time, seconds float64, requests, good, output, goodOut uint64, minV, maxV uint32) *meterv1.GoodputPoint {
	return &meterv1.GoodputPoint{
		Start: timestamppb.New(start), Requests: requests, GoodRequests: good,
		Attainment:                   ratio(float64(good), float64(requests)),
		GoodputRequestsPerSecond:     ratio(float64(good), seconds),
		OutputTokens:                 output,
		GoodOutputTokens:             goodOut,
		GoodputOutputTokensPerSecond: ratio(float64(goodOut), seconds),
		GoodputRatio:                 ratio(float64(goodOut), float64(output)),
		SloVersionMin:                minV, SloVersionMax: maxV,
	}
}

func (s *metricsService) GetGoodput(ctx context.Context, req *meterv1.GetGoodputRequest) (*meterv1.GetGoodputResponse, error) {
	sel, err := s.selection(ctx, req.GetSelector())
	if err != nil {
		return nil, err
	}
	q := sel.q
	q.Columns = query.CounterColumns
	rows, err := s.store.Rollups(ctx, q)
	if err != nil {
		return nil, err
	}
	keys, series, next := page(sel.pager, rows, func(r query.RollupRow) map[string]string { return r.Group })
	resp := &meterv1.GetGoodputResponse{NextPageToken: next}
	for _, k := range keys {
		rs := series[k]
		out := &meterv1.GoodputSeries{Group: rs[0].Group}
		var req, good, output, goodOut uint64
		minV, maxV := uint32(math.MaxUint32), uint32(0)
		for _, r := range rs {
			out.Points = append(out.Points, goodputPoint(r.Start, stepSeconds(sel.q, r.Start), r.Requests, r.GoodRequests, r.OutputTokens, r.GoodOutputTokens, r.MinSLO, r.MaxSLO))
			req += r.Requests
			good += r.GoodRequests
			output += r.OutputTokens
			goodOut += r.GoodOutputTokens
			minV, maxV = min(minV, r.MinSLO), max(maxV, r.MaxSLO)
		}
		out.Summary = goodputPoint(sel.q.Start, sel.q.End.Sub(sel.q.Start).Seconds(), req, good, output, goodOut, minV, maxV)
		resp.Series = append(resp.Series, out)
	}
	return resp, nil
}

// GetTraffic maps the store's traffic rows (each step's counters and
// busiest minute, see chstore.Store.Traffic) to rates: per second over the
// step, and over the busiest minute.
func (s *metricsService) GetTraffic(ctx context.Context, req *meterv1.GetTrafficRequest) (*meterv1.GetTrafficResponse, error) {
	sel, err := s.selection(ctx, req.GetSelector())
	if err != nil {
		return nil, err
	}
	rows, err := s.store.Traffic(ctx, sel.q)
	if err != nil {
		return nil, err
	}
	keys, series, next := page(sel.pager, rows, func(r query.TrafficRow) map[string]string { return r.Group })
	resp := &meterv1.GetTrafficResponse{NextPageToken: next}
	for _, k := range keys {
		out := &meterv1.TrafficSeries{Group: series[k][0].Group}
		total := query.TrafficRow{Start: sel.q.Start}
		for _, r := range series[k] {
			out.Points = append(out.Points, trafficPoint(r, stepSeconds(sel.q, r.Start)))
			total.Add(r)
		}
		out.Summary = trafficPoint(total, sel.q.End.Sub(sel.q.Start).Seconds())
		resp.Series = append(resp.Series, out)
	}
	return resp, nil
}

// trafficPoint is r as rates over seconds; its peaks are per second of its
// busiest minute.
func trafficPoint(r query.TrafficRow, seconds float64) *meterv1.TrafficPoint {
	byClass := map[string]uint64{}
	for c, n := range r.ErrorsBy {
		if n > 0 {
			byClass[c] = n
		}
	}
	return &meterv1.TrafficPoint{
		Start: timestamppb.New(r.Start), Requests: r.Requests,
		RequestsPerSecond:         ratio(float64(r.Requests), seconds),
		PeakRequestsPerSecond:     float64(r.PeakMinuteRequests) / 60,
		InputTokensPerSecond:      ratio(float64(r.PromptTokens), seconds),
		OutputTokensPerSecond:     ratio(float64(r.OutputTokens), seconds),
		PeakOutputTokensPerSecond: float64(r.PeakMinuteOutputTokens) / 60,
		ErrorRate:                 ratio(float64(r.Errors), float64(r.Requests)),
		ErrorsByClass:             byClass,
	}
}
