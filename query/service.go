package query

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"tokenmeter/billing"
	"tokenmeter/rollup"
	"tokenmeter/rollup/sketch"
)

// UsageSource reads usage rows and what decides between rollups and raw
// events: the rollup job's watermark and the hours touched since.
type UsageSource interface {
	Watermark(ctx context.Context, job string) (time.Time, bool, error)
	DirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
	UsageRows(ctx context.Context, r UsageRead) ([]UsageRow, error)
}

// RollupSource reads rollup rows, calling row for each (r is reused from
// call to call), and what decides which day rollups are fresh
// (rollup.FreshDays).
type RollupSource interface {
	RollupRows(ctx context.Context, r RollupRead, row func(r *RollupRow) error) error
	rollup.DayReader
}

// TrafficSource reads traffic rows, with the id of each row's step and
// series, and lists the hours whose rollups have no busiest minute yet.
type TrafficSource interface {
	TrafficRows(ctx context.Context, r TrafficRead) ([]TrafficRow, []string, error)
	HoursWithoutPeaks(ctx context.Context, from, to time.Time) ([]time.Time, error)
	rollup.DayReader
}

// LatencySource reads every deduplicated latency value of a range, per step
// and group, calling row for each group until it returns an error.
type LatencySource interface {
	RawLatencyRows(ctx context.Context, q RollupQuery, row func(RawLatencyRow) error) error
}

// CostSource reads allocated cost and GPU usage.
type CostSource interface {
	CostRows(ctx context.Context, q CostQuery) ([]CostRow, error)
	GPUUsageRows(ctx context.Context, q GPUUsageQuery, tokens GPUTokens) ([]GPUUsageRow, error)
}

// Source is every read a Service makes.
type Source interface {
	UsageSource
	RollupSource
	TrafficSource
	LatencySource
	CostSource
	EngineSource
}

// Config tunes a Service.
type Config struct {
	// MaxSeriesRows bounds the (step, series) rows one latency, goodput or
	// traffic query may return without a page size; a larger one fails
	// with ErrTooManySeries. Default 200,000.
	MaxSeriesRows int
	// MinuteRetention is how long the rollup job keeps minute rows (0: for
	// ever): a read of minute rows starting earlier is refused (usage is
	// read from the raw events instead, exactly, for ranges up to
	// MaxExactRange).
	MinuteRetention time.Duration
	// Now is the clock the retention window is measured from (default
	// time.Now).
	Now func() time.Time
}

// ErrOutsideMinuteWindow is wrapped by the error of a query that needs
// minute rows from before the retention window. It also wraps
// ErrInvalidQuery.
var ErrOutsideMinuteWindow = errors.New("outside the minute rows' retention window")

// checkMinuteWindow returns an error wrapping ErrOutsideMinuteWindow when a
// read of minute rows from start would reach before the retention window.
func (s *Service) checkMinuteWindow(start time.Time) error {
	if s.cfg.MinuteRetention <= 0 {
		return nil
	}
	from := s.cfg.Now().Add(-s.cfg.MinuteRetention)
	if !start.Before(from) {
		return nil
	}
	return fmt.Errorf("%w: %w: minute rows are kept for %s (meterd --minute-retention), from %s on; start %s is earlier: "+
		"ask for an hour step or coarser on whole hours, or a start within the window",
		ErrInvalidQuery, ErrOutsideMinuteWindow, s.cfg.MinuteRetention, from.UTC().Format(time.RFC3339), start.UTC().Format(time.RFC3339))
}

// Service answers the read side's questions from a Source.
type Service struct {
	src Source
	cfg Config
	// mergeHere decides who merges a rollup read (RollupQuery.mergeHere;
	// tests compare it with the store merging everything), days whether
	// day rollups are read.
	mergeHere func(RollupQuery) bool
	days      bool
}

// New returns a Service reading src.
func New(src Source, cfg Config) *Service {
	if cfg.MaxSeriesRows <= 0 {
		cfg.MaxSeriesRows = 200_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{src: src, cfg: cfg, mergeHere: RollupQuery.mergeHere, days: true}
}

// Usage runs a usage query, exact and deduplicated. Ranges on whole minutes
// read the rollups for every hour the rollup job has finished, and raw
// events for the hours touched since (late events included), so that the
// answer is the same as from raw events alone, at rollup speed. Other ranges,
// or a store the job has not run on yet, read raw events. Invalid queries
// return an error wrapping ErrInvalidQuery.
func (s *Service) Usage(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	rows, err := s.usage(ctx, q)
	if err != nil {
		return nil, err
	}
	if !q.TokenSizes {
		return rows, nil
	}
	sizes, err := s.tokenSizes(ctx, RollupQuery{TenantID: q.TenantID, Start: q.Start, End: q.End, Step: q.Granularity, GroupBy: q.GroupBy})
	if err != nil || sizes == nil {
		return rows, err
	}
	group := make(map[string]string, len(q.GroupBy))
	for i, r := range rows {
		for _, f := range q.GroupBy {
			group[f] = map[string]string{"tenant_id": r.TenantID, "model": r.Model, "deployment": r.Deployment, "model_version": r.ModelVersion}[f]
		}
		rows[i].Sizes = sizes[sizeKey(r.Start, group)]
	}
	return rows, nil
}

// usage answers the normalized usage query q (see Usage), without the
// token sizes.
func (s *Service) usage(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	if q.Start.Truncate(time.Minute).Equal(q.Start) && q.End.Truncate(time.Minute).Equal(q.End) {
		wm, ok, err := s.src.Watermark(ctx, rollup.JobName)
		if err != nil {
			return nil, err
		}
		if ok {
			level := levelFor(q.Start, q.End, q.Granularity, q.TenantID, q.GroupBy)
			if level == LevelMinute {
				if werr := s.checkMinuteWindow(q.Start); werr != nil {
					// Before the minute window: the raw events answer
					// exactly, for a range they can be read in.
					if q.End.Sub(q.Start) > MaxExactRange {
						return nil, werr
					}
					return s.src.UsageRows(ctx, UsageRead{Query: q, Raw: true})
				}
			}
			dirty, err := s.src.DirtyHours(ctx, wm.Add(-rollup.Overlap), time.Unix(1<<32-1, 0))
			if err != nil {
				return nil, err
			}
			var inRange []time.Time
			for _, h := range dirty {
				if h.Add(time.Hour).After(q.Start) && h.Before(q.End) {
					inRange = append(inRange, h)
				}
			}
			rolled, err := s.src.UsageRows(ctx, UsageRead{Query: q, Level: level, Hours: inRange})
			if err != nil || len(inRange) == 0 {
				return rolled, err
			}
			raw, err := s.src.UsageRows(ctx, UsageRead{Query: q, Raw: true, Hours: inRange})
			if err != nil {
				return nil, err
			}
			return mergeUsage(append(rolled, raw...)), nil
		}
	}
	return s.src.UsageRows(ctx, UsageRead{Query: q, Raw: true})
}

// mergeUsage sums rows of the same bucket and group, ordered by bucket,
// then tenant, model, deployment, model version, engine and tensor
// parallelism.
func mergeUsage(rows []UsageRow) []UsageRow {
	type key struct {
		start                              int64
		tenant, model, deployment, version string
		engine, tensorParallelism          string
	}
	idx := map[key]int{}
	var out []UsageRow
	for _, r := range rows {
		k := key{r.Start.Unix(), r.TenantID, r.Model, r.Deployment, r.ModelVersion, r.Engine, r.TensorParallelism}
		i, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, r)
			continue
		}
		o := &out[i]
		o.Requests += r.Requests
		o.Errors += r.Errors
		o.PromptTokens += r.PromptTokens
		o.CachedPromptTokens += r.CachedPromptTokens
		o.OutputTokens += r.OutputTokens
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return cmp.Or(a.Start.Compare(b.Start), strings.Compare(a.TenantID, b.TenantID),
			strings.Compare(a.Model, b.Model), strings.Compare(a.Deployment, b.Deployment),
			strings.Compare(a.ModelVersion, b.ModelVersion), strings.Compare(a.Engine, b.Engine),
			strings.Compare(a.TensorParallelism, b.TensorParallelism))
	})
	return out
}

// Rollups runs a rollup query. Without a Limit, a query selecting more than
// Config.MaxSeriesRows rows fails with ErrTooManySeries.
func (s *Service) Rollups(ctx context.Context, q RollupQuery) ([]RollupRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	bounded := q.Limit == 0
	if bounded {
		q.Limit = s.cfg.MaxSeriesRows + 1
	}
	read := RollupRead{Query: q, Level: q.level(), Merge: !s.mergeHere(q)}
	if read.Level == LevelMinute {
		if err := s.checkMinuteWindow(q.Start); err != nil {
			return nil, err
		}
	}
	if s.days && q.usesDays() {
		if read.Days, err = rollup.FreshDays(ctx, s.src, q.Start, q.End); err != nil {
			return nil, err
		}
	}
	out, err := s.readRollups(ctx, read, bounded)
	if errors.Is(err, errDecodeUnkept) {
		// Some tenant rows of the range were rolled up before they kept
		// decode: the group rows answer it, as they did then.
		read.Level, read.Days = LevelHour, nil
		out, err = s.readRollups(ctx, read, bounded)
	}
	if err != nil {
		return nil, err
	}
	if q.Columns == LatencyBreakdownColumns && read.Level != LevelMinute {
		if err := s.addBreakdown(ctx, q, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// errDecodeUnkept stops a read that met a row with RollupRow.DecodeUnkept.
var errDecodeUnkept = errors.New("decode not kept by every row read")

// readRollups runs read for Rollups (bounded: at most Config.MaxSeriesRows
// rows), failing with errDecodeUnkept at the first row that says its
// decode is not kept.
func (s *Service) readRollups(ctx context.Context, read RollupRead, bounded bool) ([]RollupRow, error) {
	q := read.Query
	var (
		out   []RollupRow
		index = map[string]int{} // step and group → out, when merging here
		sums  []latencySums      // the latency sums of out[i], when merging here
	)
	err := s.src.RollupRows(ctx, read, func(r *RollupRow) error {
		if r.DecodeUnkept {
			return errDecodeUnkept
		}
		if !read.Merge {
			id := stepID(r.Start, q.GroupBy, r.Group)
			if i, ok := index[id]; ok {
				sums[i].add(r)
				return out[i].add(r)
			}
			index[id] = len(out)
			sums = append(sums, latencySums{})
			sums[len(sums)-1].add(r)
		}
		out = append(out, cloneRollupRow(r))
		if bounded && len(out) > s.cfg.MaxSeriesRows {
			return tooManySeries(s.cfg.MaxSeriesRows)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !read.Merge {
		for i := range out {
			sums[i].set(&out[i])
		}
		out = pageRollups(out, q.GroupBy, q.Offset, q.Limit)
	}
	return out, nil
}

// addBreakdown sets the HourDists of the latency rows of q: prefill,
// decode and E2E per output-length class, those kept at the level that
// answers q's grouping (RollupQuery.level with BreakdownColumns).
func (s *Service) addBreakdown(ctx context.Context, q RollupQuery, rows []RollupRow) error {
	q.Columns = BreakdownColumns
	extra, err := s.Rollups(ctx, q)
	if err != nil {
		return err
	}
	byKey := make(map[string]map[string]Dist, len(extra))
	for _, r := range extra {
		byKey[sizeKey(r.Start, r.Group)] = r.HourDists
	}
	for i := range rows {
		rows[i].HourDists = byKey[sizeKey(rows[i].Start, rows[i].Group)]
	}
	return nil
}

// latencySums adds the latency sums of the rows of one step and group in
// fixed point, as the store's floatSum does when ClickHouse merges
// (chstore: each value times 10^15, truncated, summed in 128 bits, the
// total converted to Float64 and divided by 10^15), so that the total does
// not depend on the order the store sends the rows in (the same read gives
// the same bytes) and agrees with ClickHouse's, with memory per merged row,
// not per stored row.
type latencySums struct {
	acc map[string]int128
}

// int128 is a signed 128-bit integer: hi * 2^64 + lo.
type int128 struct {
	hi int64
	lo uint64
}

const two64 = 18446744073709551616.0

func (s *latencySums) add(r *RollupRow) {
	for m, d := range r.Latency {
		if s.acc == nil {
			s.acc = make(map[string]int128, len(r.Latency))
		}
		// A float64 that is a whole number splits into two exact halves.
		p := math.Trunc(d.Sum * 1e15)
		hi := math.Floor(p / two64)
		lo := p - hi*two64
		t := s.acc[m]
		var carry uint64
		t.lo, carry = bits.Add64(t.lo, uint64(lo), 0)
		t.hi += int64(hi) + int64(carry)
		s.acc[m] = t
	}
}

// set writes the sums into r (a single row too, as ClickHouse's floatSum
// would give it).
func (s *latencySums) set(r *RollupRow) {
	for m, t := range s.acc {
		v := new(big.Int).Lsh(big.NewInt(t.hi), 64)
		v.Add(v, new(big.Int).SetUint64(t.lo))
		f, _ := new(big.Float).SetInt(v).Float64()
		d := r.Latency[m]
		d.Sum = f / 1e15
		r.Latency[m] = d
	}
}

// stepID identifies a step and group, as a map key (StepID).
func stepID(start time.Time, fields []string, group map[string]string) string {
	values := make([]string, len(fields))
	for i, f := range fields {
		values[i] = group[f]
	}
	return StepID(start.Unix(), values)
}

// StepID identifies the step starting at start (Unix seconds) of the group
// with values, as a map key: each value is prefixed with its length, so no
// two keys share an id.
func StepID(start int64, values []string) string {
	id := strconv.AppendInt(nil, start, 10)
	for _, g := range values {
		id = append(strconv.AppendInt(append(id, ' '), int64(len(g)), 10), ':')
		id = append(id, g...)
	}
	return string(id)
}

// cloneRollupRow copies r, whose maps its source may reuse.
func cloneRollupRow(r *RollupRow) RollupRow {
	c := *r
	c.Group = cloneMap(r.Group)
	c.ErrorsBy = cloneMap(r.ErrorsBy)
	c.Latency = cloneMap(r.Latency)
	c.HourDists = cloneMap(r.HourDists)
	return c
}

// cloneMap copies m into a map that is never nil (unlike maps.Clone of a
// nil map), so that RollupRow.add can add to it.
func cloneMap[V any](m map[string]V) map[string]V {
	c := make(map[string]V, len(m))
	maps.Copy(c, m)
	return c
}

// mergeDist merges the distributions a and b of the metric m exactly:
// counts and sums add, histograms merge by key.
func mergeDist(a, b Dist, m string) (Dist, error) {
	h, err := sketch.FromArrays(a.Keys, a.Counts)
	if err != nil {
		return Dist{}, fmt.Errorf("rollup histogram of %s: %w", m, err)
	}
	oh, err := sketch.FromArrays(b.Keys, b.Counts)
	if err != nil {
		return Dist{}, fmt.Errorf("rollup histogram of %s: %w", m, err)
	}
	h.Merge(oh)
	return Dist{Count: a.Count + b.Count, Sum: a.Sum + b.Sum, Keys: h.Keys, Counts: h.Counts}, nil
}

// add merges the rollup row o into r, as the store's aggregation would:
// counters add up, histograms merge exactly, the SLO versions widen.
func (r *RollupRow) add(o *RollupRow) error {
	r.Requests += o.Requests
	r.Errors += o.Errors
	for c, n := range o.ErrorsBy {
		r.ErrorsBy[c] += n
	}
	r.PromptTokens += o.PromptTokens
	r.CachedTokens += o.CachedTokens
	r.OutputTokens += o.OutputTokens
	for m, od := range o.Latency {
		d, err := mergeDist(r.Latency[m], od, m)
		if err != nil {
			return err
		}
		r.Latency[m] = d
	}
	for m, od := range o.HourDists {
		d, err := mergeDist(r.HourDists[m], od, m)
		if err != nil {
			return err
		}
		r.HourDists[m] = d
	}
	r.GoodRequests += o.GoodRequests
	r.GoodOutputTokens += o.GoodOutputTokens
	r.MinSLO, r.MaxSLO = min(r.MinSLO, o.MinSLO), max(r.MaxSLO, o.MaxSLO)
	return nil
}

// pageRollups orders rows as the store does (by step, then group-by fields)
// and returns the page of limit rows (0: all) from offset.
func pageRollups(rows []RollupRow, groupBy []string, offset, limit int) []RollupRow {
	slices.SortFunc(rows, func(a, b RollupRow) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		for _, f := range groupBy {
			if c := strings.Compare(a.Group[f], b.Group[f]); c != 0 {
				return c
			}
		}
		return 0
	})
	rows = rows[min(offset, len(rows)):]
	if limit > 0 && len(rows) > limit {
		rows = rows[:limit]
	}
	return rows
}

// Traffic reads requests, errors and tokens per step and group with the
// step's busiest minute (its requests and its output tokens, each its own
// largest), exactly, at any range: the store returns one row per step and
// group, so no query reads minute buckets into this process. Which rows
// answer (RollupQuery.trafficKind):
//
//   - A range not on whole hours, or a minute step: minute rows, summed
//     per minute and group, then per step (the busiest minute is the
//     largest of those sums).
//   - Whole hours, and each series is exactly the rows of one hour level
//     (no group_by: the all-tenant hours, or the tenant hours for one
//     tenant; group_by tenant_id: the tenant hours, with the fresh day
//     rollups at day steps and more; every dimension: the hour rows):
//     each row's own busiest minute, the step's being the largest.
//   - Whole hours, and a series merges several rows of an hour (group_by
//     model, say): the hour rows, whose per-minute counts are summed per
//     hour and series, the busiest minute being the largest sum. The
//     largest of the rows' own peaks would overstate nothing but could miss
//     a minute where two rows are both busy.
//
// Hours whose rows were computed before the rollups kept their busiest
// minute (the rollup job recomputes them, newest first) have their peaks
// read from minute rows as in the first case, for those hours only.
// q.Columns is not used. Without a Limit, a query selecting more than
// Config.MaxSeriesRows rows fails with ErrTooManySeries.
func (s *Service) Traffic(ctx context.Context, q RollupQuery) ([]TrafficRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	read := PlanTraffic(q)
	if read.Kind == TrafficMinutes {
		if err := s.checkMinuteWindow(q.Start); err != nil {
			return nil, err
		}
	}
	if read.Limit == 0 {
		read.Limit = s.cfg.MaxSeriesRows + 1
	}
	var old []time.Time
	if read.Kind != TrafficMinutes {
		if old, err = s.src.HoursWithoutPeaks(ctx, q.Start, q.End); err != nil {
			return nil, err
		}
		if read.Kind == TrafficLevel && q.usesDays() {
			if read.Days, err = rollup.FreshDays(ctx, s.src, q.Start, q.End); err != nil {
				return nil, err
			}
		}
	}
	out, ids, err := s.src.TrafficRows(ctx, read)
	if err != nil {
		return nil, err
	}
	if q.Limit == 0 && len(out) > s.cfg.MaxSeriesRows {
		return nil, tooManySeries(s.cfg.MaxSeriesRows)
	}
	if q.TokenSizes {
		sizes, err := s.tokenSizes(ctx, q)
		if err != nil {
			return nil, err
		}
		for i := range out {
			out[i].Sizes = sizes[sizeKey(out[i].Start, out[i].Group)]
		}
	}
	if len(old) == 0 {
		return out, nil
	}
	// The hours without peaks, from their minute rows: the same steps and
	// series, or fewer.
	fallback, fallbackIDs, err := s.src.TrafficRows(ctx, TrafficRead{Query: q, Kind: TrafficMinutes, Level: LevelMinute, OnlyHours: old})
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	for i, id := range fallbackIDs {
		if j, ok := index[id]; ok {
			r, f := &out[j], &fallback[i]
			r.PeakMinuteRequests = max(r.PeakMinuteRequests, f.PeakMinuteRequests)
			r.PeakMinuteOutputTokens = max(r.PeakMinuteOutputTokens, f.PeakMinuteOutputTokens)
		}
	}
	return out, nil
}

// RawLatency reads every deduplicated latency value of the range, for exact
// quantiles. The range may be at most MaxExactRange; more than
// Config.MaxSeriesRows (step, series) rows fail with ErrTooManySeries.
func (s *Service) RawLatency(ctx context.Context, q RollupQuery) ([]RawLatencyRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	if q.End.Sub(q.Start) > MaxExactRange {
		return nil, fmt.Errorf("%w: exact quantiles need a range of at most %s, got %s", ErrInvalidQuery, MaxExactRange, q.End.Sub(q.Start))
	}
	var out []RawLatencyRow
	err = s.src.RawLatencyRows(ctx, q, func(r RawLatencyRow) error {
		out = append(out, r)
		if len(out) > s.cfg.MaxSeriesRows {
			return tooManySeries(s.cfg.MaxSeriesRows)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Cost runs a cost query.
func (s *Service) Cost(ctx context.Context, q CostQuery) ([]CostRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	return s.src.CostRows(ctx, q)
}

// GPUUsage runs a GPU usage query; the tokens served are joined when the
// grouping allows (GPUUsageRow.TokensKnown) and the query wants them.
// Without a Limit, a query selecting more than Config.MaxSeriesRows
// (step, group) rows fails with ErrTooManySeries.
func (s *Service) GPUUsage(ctx context.Context, q GPUUsageQuery) ([]GPUUsageRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	bounded := q.Limit == 0
	if bounded {
		q.Limit = s.cfg.MaxSeriesRows + 1
	}
	out, err := s.src.GPUUsageRows(ctx, q, GPUTokens{Join: q.tokensJoinable() && !q.NoTokens, Except: billing.IdleTenant})
	if err == nil && bounded && len(out) > s.cfg.MaxSeriesRows {
		return nil, tooManySeries(s.cfg.MaxSeriesRows)
	}
	return out, err
}

// LevelVersionSource reads the newest version of each hour of a range at an
// hour level of the rollups.
type LevelVersionSource interface {
	LevelVersions(ctx context.Context, level Level, from, to time.Time) (map[time.Time]uint64, error)
}

// DeploymentHours reads the counters (requests, goodput, tokens, errors)
// of a whole-hour range per hour, model and deployment, every tenant
// together, from the deployment level of the rollups: a few rows per hour
// instead of every tenant's. An hour whose newest rows there are older
// than its newest all-tenant row (an hour rolled up before the level
// existed and not yet backfilled, or by a replica of older code) is read
// from the hour rows instead, so the answer is the same as from the hour
// rows alone. A source without hour versions reads the hour rows. More
// than Config.MaxSeriesRows (hour, model, deployment) rows fail with
// ErrTooManySeries.
func (s *Service) DeploymentHours(ctx context.Context, start, end time.Time) ([]RollupRow, error) {
	q, err := RollupQuery{Start: start, End: end, Step: "hour", GroupBy: []string{"model", "deployment"}, Columns: CounterColumns,
		Limit: s.cfg.MaxSeriesRows + 1}.Normalize()
	if err != nil {
		return nil, err
	}
	if !q.Start.Truncate(time.Hour).Equal(q.Start) || !q.End.Truncate(time.Hour).Equal(q.End) {
		return nil, fmt.Errorf("%w: start and end must lie on whole hours", ErrInvalidQuery)
	}
	var rowsRead atomic.Int64 // by every read, the stale hours' included
	read := func(q RollupQuery, level Level) ([]RollupRow, error) {
		var out []RollupRow
		err := s.src.RollupRows(ctx, RollupRead{Query: q, Level: level, Merge: true}, func(r *RollupRow) error {
			if rowsRead.Add(1) > int64(s.cfg.MaxSeriesRows) {
				return tooManySeries(s.cfg.MaxSeriesRows)
			}
			out = append(out, cloneRollupRow(r))
			return nil
		})
		return out, err
	}
	versions, ok := s.src.(LevelVersionSource)
	if !ok {
		return read(q, LevelHour)
	}
	var (
		rows             []RollupRow
		depVers, allVers map[time.Time]uint64
	)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { rows, err = read(q, LevelDeploymentHour); return err })
	g.Go(func() (err error) {
		depVers, err = versions.LevelVersions(gctx, LevelDeploymentHour, q.Start, q.End)
		return err
	})
	g.Go(func() (err error) {
		allVers, err = versions.LevelVersions(gctx, LevelTotalHour, q.Start, q.End)
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	stale := map[time.Time]bool{}
	for h, v := range allVers {
		if depVers[h] < v {
			stale[h] = true
		}
	}
	if len(stale) == 0 {
		return rows, nil
	}
	// The stale hours from the hour rows, a run of consecutive hours per read.
	out := slices.DeleteFunc(rows, func(r RollupRow) bool { return stale[r.Start] })
	hours := slices.Collect(maps.Keys(stale))
	slices.SortFunc(hours, func(a, b time.Time) int { return a.Compare(b) })
	for i := 0; i < len(hours); {
		j := i
		for j+1 < len(hours) && hours[j+1].Equal(hours[j].Add(time.Hour)) {
			j++
		}
		run := q
		run.Start, run.End = hours[i], hours[j].Add(time.Hour)
		more, err := read(run, LevelHour)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
		i = j + 1
	}
	slices.SortStableFunc(out, func(a, b RollupRow) int { return a.Start.Compare(b.Start) })
	return out, nil
}

// UsageCostSource streams the detailed usage-and-cost rows of a normalized
// cost query (its GroupBy is ignored: rows are per tenant, model and
// deployment), calling row for each in (step, tenant, model, deployment)
// order; r is reused from call to call.
type UsageCostSource interface {
	EachUsageCost(ctx context.Context, q CostQuery, row func(r *UsageCostRow) error) error
}

// EachUsageCost streams the usage and cost of q's range per step, tenant,
// model and deployment (q.Step "hour" or "day"), without holding the rows:
// the source must be a UsageCostSource.
func (s *Service) EachUsageCost(ctx context.Context, q CostQuery, row func(r *UsageCostRow) error) error {
	if q.Step != "hour" && q.Step != "day" {
		return fmt.Errorf("%w: step %q: the usage-and-cost export is by hour or day", ErrInvalidQuery, q.Step)
	}
	q.GroupBy = nil
	q, err := q.Normalize()
	if err != nil {
		return err
	}
	src, ok := s.src.(UsageCostSource)
	if !ok {
		return fmt.Errorf("%w: this store has no usage-and-cost rows", ErrUnavailable)
	}
	return src.EachUsageCost(ctx, q, row)
}
