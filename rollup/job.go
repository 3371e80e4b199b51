package rollup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"tokenmeter/billing"
)

// Store is what the job needs of ClickHouse; *chstore.Store implements it.
type Store interface {
	ServerNow(ctx context.Context) (time.Time, error)
	DirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
	StaleSLOHours(ctx context.Context, current uint32) ([]time.Time, error)
	HoursWithoutPeaks(ctx context.Context, from, to time.Time) ([]time.Time, error)
	Watermark(ctx context.Context, job string) (time.Time, bool, error)
	SetWatermark(ctx context.Context, job string, t time.Time) error
	HourStore
	SLOStore
	DayStore
	CostStore
	EngineStore
}

// JobName keys the job's watermark in its store; usage queries read it too.
const JobName = "rollup"

// GPUBackfillJobName keys, in rollup_state, the record that the one-time
// recost of hours costed before migrations 0024 (per-GPU rows, GPU
// telemetry) and 0026 (GPU time in cost lines) is done.
const GPUBackfillJobName = "rollup-gpu-backfill-0026"

// backfillDue tells whether the one-time recost of hours costed before
// migrations 0024 and 0026 is still to do: no job recorded it as done.
func (j *Job) backfillDue(ctx context.Context) (bool, error) {
	if j.backfilled {
		return false, nil
	}
	_, done, err := j.store.Watermark(ctx, GPUBackfillJobName)
	if err != nil {
		return false, err
	}
	j.backfilled = done
	return !done, nil
}

// Overlap is how far before its watermark the job re-reads dirty hours by
// default: inserts stamped this long before it may have become visible only
// after the job's last read. Usage queries treat those hours as dirty too.
const Overlap = time.Minute

// Config tunes the job.
type Config struct {
	// Interval between runs. Default 10s.
	Interval time.Duration
	// Settle is how far behind ClickHouse's clock the watermark stays, so that
	// inserts in flight are seen by the next run. Default DefaultSettle.
	Settle time.Duration
	// Overlap re-reads dirty hours this far before the watermark. Default
	// Overlap; usage queries assume no more than that.
	Overlap time.Duration
	// MinuteRetention: once an hour, the days of minute rows wholly older
	// than this are dropped (MinuteDropper), and the job writes no minute
	// rows of those days (minute_window.go). 0 keeps them for ever.
	MinuteRetention time.Duration
}

// DefaultSettle is how far behind ClickHouse's clock the job's watermark
// stays by default: an insert is taken to be visible that long after the
// server stamped it.
const DefaultSettle = 5 * time.Second

// DefaultMinuteRetention is how long meterd keeps minute rows by default.
const DefaultMinuteRetention = 7 * 24 * time.Hour

// minuteSweepEvery is how often Run drops the minute rows outside the
// retention window.
const minuteSweepEvery = time.Hour

// MinuteDropper drops the days of minute rows wholly before a time
// (chstore.Store.DropMinuteDays), returning the days dropped (YYYYMMDD).
type MinuteDropper interface {
	DropMinuteDays(ctx context.Context, before time.Time) ([]uint32, error)
}

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = 10 * time.Second
	}
	if c.Settle == 0 {
		c.Settle = DefaultSettle
	}
	if c.Overlap == 0 {
		c.Overlap = Overlap
	}
	return c
}

// Job recomputes the rollups of the hours that changed: hours touched by
// inserts since the watermark (late events included) and hours counted with
// an old SLO version; and, a few per run, the hours rolled up before hour
// rows kept their busiest minute. Every run is idempotent: a recomputed hour replaces its
// rows, so running twice, or on two replicas, gives the same rollups.
type Job struct {
	cfg     Config
	store   Store
	logger  *slog.Logger
	now     func() time.Time
	version uint64
	replica uint64 // low bits of every version: replicas never share one
	// pricedVersion is the price book every costed hour was computed with,
	// as of this job's last successful run ("" before the first).
	pricedVersion string
	// backfilled: the one-time recost of hours costed before migrations
	// 0024 and 0026 is recorded as done (GPUBackfillJobName).
	backfilled bool
	// sloVersion is the SLO version every rolled-up hour was counted with,
	// as of the last successful run (sloChecked false before the first).
	sloVersion uint32
	sloChecked bool
	// daysBefore is the end of the days this job has brought every day
	// rollup up to, as of its last successful run (zero before the first).
	daysBefore time.Time
	// peakless are the hours rolled up before the hour rows kept their
	// busiest minute (chstore migration 0009) still to recompute, listed
	// at the first run (peaklessListed), in order.
	peakless       []time.Time
	peaklessListed bool
	// roller rolls up the hours, keeping the memory of the last hour's
	// events for the next.
	roller Roller

	runs         prometheus.Counter
	failures     prometheus.Counter
	hours        prometheus.Counter
	duration     prometheus.Histogram
	costDuration prometheus.Histogram
}

// NewJob creates the job.
func NewJob(cfg Config, store Store, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Job, error) {
	j := &Job{
		cfg: cfg.withDefaults(), store: store, logger: logger, now: now, replica: rand.Uint64N(1 << versionReplicaBits),
		runs:     prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_rollup_runs_total", Help: "Rollup job runs."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_rollup_failures_total", Help: "Rollup job runs that failed."}),
		hours:    prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_rollup_hours_total", Help: "Hours recomputed."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meter_rollup_hour_duration_seconds", Help: "Time to recompute one hour.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		costDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meter_rollup_cost_hour_duration_seconds", Help: "Time to recompute one hour's GPU usage and cost allocation.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
	}
	for _, c := range []prometheus.Collector{j.runs, j.failures, j.hours, j.duration, j.costDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register rollup metrics: %w", err)
		}
	}
	return j, nil
}

// SLOStore keeps the versioned SLO sets.
type SLOStore interface {
	CurrentSLO(ctx context.Context) (uint32, string, bool, error)
	PutSLO(ctx context.Context, rules, source string) (uint32, error)
}

// EnsureSLO makes set the SLO set in force, storing a new version when it
// differs from the newest stored one. It returns the version in force.
func EnsureSLO(ctx context.Context, store SLOStore, set SLOSet, source string) (uint32, error) {
	if err := set.Validate(); err != nil {
		return 0, err
	}
	want, err := set.Canonical()
	if err != nil {
		return 0, err
	}
	v, rules, ok, err := store.CurrentSLO(ctx)
	if err != nil {
		return 0, err
	}
	if ok && rules == string(want) {
		return v, nil
	}
	return store.PutSLO(ctx, string(want), source)
}

// currentSLO reads the set in force; without one, the defaults (version 0).
func (j *Job) currentSLO(ctx context.Context) (SLOSet, uint32, error) {
	v, rules, ok, err := j.store.CurrentSLO(ctx)
	if err != nil {
		return SLOSet{}, 0, err
	}
	if !ok {
		return DefaultSLOSet(), 0, nil
	}
	set, err := ParseSLOSet([]byte(rules))
	if err != nil {
		return SLOSet{}, 0, fmt.Errorf("stored SLO version %d: %w", v, err)
	}
	return set, v, nil
}

// RunOnce recomputes every hour that needs it and advances the watermark.
// It returns the hours recomputed.
func (j *Job) RunOnce(ctx context.Context) ([]time.Time, error) {
	j.runs.Inc()
	hours, err := j.runOnce(ctx)
	if err != nil {
		j.failures.Inc()
	}
	return hours, err
}

func (j *Job) runOnce(ctx context.Context) ([]time.Time, error) {
	set, sloVersion, err := j.currentSLO(ctx)
	if err != nil {
		return nil, err
	}
	serverNow, err := j.store.ServerNow(ctx)
	if err != nil {
		return nil, err
	}
	until := serverNow.Add(-j.cfg.Settle)
	wm, ok, err := j.store.Watermark(ctx, JobName)
	if err != nil {
		return nil, err
	}
	var since time.Time // zero: first run, every hour with events
	if ok {
		since = wm.Add(-j.cfg.Overlap)
	}
	dirty, err := j.store.DirtyHours(ctx, since, until)
	if err != nil {
		return nil, err
	}
	// Like the price check below: scanning rollup_hour for hours counted
	// with another SLO version is needed only when the version in force is
	// not the one this job last brought every hour up to.
	var stale []time.Time
	if !j.sloChecked || sloVersion != j.sloVersion {
		if stale, err = j.store.StaleSLOHours(ctx, sloVersion); err != nil {
			return nil, err
		}
	}
	if !j.peaklessListed {
		if j.peakless, err = j.store.HoursWithoutPeaks(ctx, time.Time{}, until); err != nil {
			return nil, err
		}
		j.peaklessListed = true
	}
	// Their usage is unchanged: recomputed for their peaks, not recosted.
	refill := j.peakless[max(0, len(j.peakless)-peakHoursPerRun):]
	changed := mergeHours(dirty, stale)
	hours := mergeHours(changed, refill)
	spec := set.Spec(sloVersion)
	err = j.eachChunk(ctx, hours, func(ctx context.Context, hs []time.Time, version uint64) error {
		start := time.Now()
		if _, err := j.roller.RollupHours(ctx, windowedHours{j.store, j.minutesFrom()}, hs, spec, version); err != nil {
			return err
		}
		took := time.Since(start).Seconds() / float64(len(hs))
		for range hs {
			j.duration.Observe(took)
			j.hours.Inc()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	days, daysDone, err := j.dueDays(ctx, hours, until)
	if err != nil {
		return nil, err
	}
	err = j.eachHour(ctx, days, func(ctx context.Context, d time.Time, version uint64) error {
		_, err := RollupDay(ctx, j.store, d, version)
		return err
	})
	if err != nil {
		return nil, err
	}

	// Cost follows usage: an hour is recosted when its usage was recomputed,
	// when GPU samples arrived for it, or when it was costed with another
	// price book.
	book, err := currentPrices(ctx, j.store)
	if err != nil {
		return nil, err
	}
	gpuDirty, err := j.store.GPUDirtyHours(ctx, since, until)
	if err != nil {
		return nil, err
	}
	// Looking for hours costed with another book scans the cost tables, so
	// it is done only when the book in force is not the one this job last
	// brought every hour up to (at start, and after a price change).
	var stalePrice []time.Time
	backfill := false
	if book.Version() != j.pricedVersion {
		if stalePrice, err = j.store.StalePriceHours(ctx, book.Version(), time.Time{}); err != nil {
			return nil, err
		}
		if backfill, err = j.backfillDue(ctx); err != nil {
			return nil, err
		}
	}
	if backfill {
		// Hours costed before cost lines carried their GPU time, and
		// before GPU telemetry and per-GPU rows (of those, only hours
		// whose samples are kept): once after the upgrade, recorded as
		// done in rollup_state, so that an hour this cannot fix (GPU time
		// that rounds to 0 ms) is not recosted at every start.
		noTime, err := j.store.GPUTimeMissingHours(ctx)
		if err != nil {
			return nil, err
		}
		noTelemetry, err := j.store.TelemetryMissingHours(ctx)
		if err != nil {
			return nil, err
		}
		stalePrice = mergeHours(stalePrice, noTime, noTelemetry)
	}
	costHours := mergeHours(changed, gpuDirty, stalePrice)
	err = j.eachChunk(ctx, costHours, func(ctx context.Context, hs []time.Time, version uint64) error {
		start := time.Now()
		if err := j.costHours(ctx, hs, book, version); err != nil {
			return err
		}
		took := time.Since(start).Seconds() / float64(len(hs))
		for range hs {
			j.costDuration.Observe(took)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if backfill {
		if err := j.store.SetWatermark(ctx, GPUBackfillJobName, until); err != nil {
			return nil, err
		}
		j.backfilled = true
	}
	j.pricedVersion = book.Version()
	j.sloChecked, j.sloVersion = true, sloVersion
	j.peakless = j.peakless[:len(j.peakless)-len(refill)]
	if daysDone {
		j.daysBefore = DayOf(until)
	}
	// With nothing done, the watermark is written at most once a minute: at
	// the job's interval every run wrote a part of rollup_state, nothing
	// else (an idle dev ClickHouse kept ~20 such parts about). Usage reads
	// the hours stamped after the watermark from raw rows; a minute behind
	// is still exact and hardly slower.
	// Billing closes do not wait for it either: Costed sees that nothing
	// was inserted since.
	worked := len(hours) > 0 || len(costHours) > 0 || len(days) > 0
	if worked || !ok || until.Sub(wm) >= idleWatermarkEvery {
		if err := j.store.SetWatermark(ctx, JobName, until); err != nil {
			return nil, err
		}
	}
	if worked {
		j.logger.Info("rolled up", "hours", len(hours), "days", len(days), "costed_hours", len(costHours), "slo_version", sloVersion,
			"price_version", book.Version(), "watermark", until, "hours_without_peaks_left", len(j.peakless))
	}
	// Engine rollups depend on engine samples alone and keep a watermark of
	// their own: a failure there never holds back usage and cost.
	if err := j.engineRun(ctx, until); err != nil {
		return mergeHours(hours, costHours), err
	}
	return mergeHours(hours, costHours), nil
}

// EngineJobName keys the engine rollups' watermark.
const EngineJobName = "rollup-engine"

// engineRun recomputes the engine rollups of the hours touched by engine
// sample inserts since its own watermark (less the overlap), then advances it.
func (j *Job) engineRun(ctx context.Context, until time.Time) error {
	wm, ok, err := j.store.Watermark(ctx, EngineJobName)
	if err != nil {
		return err
	}
	var since time.Time
	if ok {
		since = wm.Add(-j.cfg.Overlap)
	}
	hours, err := j.store.EngineDirtyHours(ctx, since, until)
	if err != nil {
		return err
	}
	err = j.eachChunk(ctx, hours, func(ctx context.Context, hs []time.Time, version uint64) error {
		return engineHours(ctx, windowedEngine{j.store, j.minutesFrom()}, hs, version)
	})
	if err != nil {
		return err
	}
	if len(hours) > 0 || !ok || until.Sub(wm) >= idleWatermarkEvery {
		if err := j.store.SetWatermark(ctx, EngineJobName, until); err != nil {
			return err
		}
	}
	if len(hours) > 0 {
		j.logger.Info("rolled up engine samples", "hours", len(hours), "watermark", until)
	}
	return nil
}

// idleWatermarkEvery is how often a run that found nothing to do advances
// the watermark.
const idleWatermarkEvery = time.Minute

// peakHoursPerRun bounds the hours rolled up before the hour rows kept their
// busiest minute that one run recomputes (after the upgrade, every past
// hour): the newest go first, and the hours that changed stay on schedule.
// Until an hour is recomputed, traffic queries read its peaks from the
// minute rows.
const peakHoursPerRun = 24

// daysPerRun bounds the stale days one run rolls up (the first run after
// an upgrade that added day rollups finds every past day stale): the newest
// go first, the rest in the next runs, and the hours stay on schedule.
const daysPerRun = 24

// dueDays lists the days whose day rollup a run recomputes, once the hours
// have been. Only days that have ended by until are rolled up (the current
// day would be recomputed at every run): the days of the hours just
// recomputed, and every ended day without a fresh day rollup since the
// last run's end of days (at the first run, since the beginning: a new
// deployment, or one that ran before day rollups existed; later, the day
// that has just ended, even when none of its hours changed since). done is
// false when stale days were left for the next run.
func (j *Job) dueDays(ctx context.Context, hours []time.Time, until time.Time) (days []time.Time, done bool, err error) {
	before := DayOf(until)
	var stale []time.Time
	if !j.daysBefore.Equal(before) {
		if stale, err = StaleDays(ctx, j.store, j.daysBefore, before); err != nil {
			return nil, false, err
		}
	}
	done = len(stale) <= daysPerRun
	if !done {
		stale = stale[len(stale)-daysPerRun:]
	}
	var ended []time.Time
	for _, h := range hours {
		if d := DayOf(h); d.Before(before) {
			ended = append(ended, d)
		}
	}
	return mergeHours(ended, stale), done, nil
}

// hoursAtOnce is how many hours a run recomputes at once when several are
// due (catching up, or after an SLO or price change). One at a time left
// the development VM's two cores 40% idle: each hour waits on ClickHouse
// writing its parts, then on meterd counting.
const hoursAtOnce = 2

// eachHour calls do for each hour, hoursAtOnce at a time, each with a
// version taken in the order of hours; it returns the first error, once
// every call has ended (the others' context is then canceled).
func (j *Job) eachHour(ctx context.Context, hours []time.Time, do func(ctx context.Context, hour time.Time, version uint64) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(hoursAtOnce)
	for _, h := range hours {
		version := j.nextVersion()
		g.Go(func() error { return do(gctx, h, version) })
	}
	return g.Wait()
}

// hoursPerChunk bounds the hours one rollup writes together (RollupHours,
// costHours, engineHours): a run catching up weeks of hours writes each
// table once per chunk instead of once per hour, while hoursAtOnce chunks
// are computed at once.
const hoursPerChunk = 24

// eachChunk splits hours (in order) into chunks of at most hoursPerChunk,
// small enough that hoursAtOnce chunks share the work when there are few
// hours, and calls do for each, hoursAtOnce at a time, each with a version
// taken in the order of hours; it returns the first error, once every call
// has ended (the others' context is then canceled). Queries read each
// hour's newest version, so the hours of a chunk share one.
func (j *Job) eachChunk(ctx context.Context, hours []time.Time, do func(ctx context.Context, hours []time.Time, version uint64) error) error {
	size := min(hoursPerChunk, max(1, (len(hours)+hoursAtOnce-1)/hoursAtOnce))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(hoursAtOnce)
	for len(hours) > 0 {
		n := min(size, len(hours))
		chunk := hours[:n:n]
		hours = hours[n:]
		version := j.nextVersion()
		g.Go(func() error { return do(gctx, chunk, version) })
	}
	return g.Wait()
}

// maxPendingCostRows bounds the GPU and cost rows costHours holds before it
// writes them.
const maxPendingCostRows = 50_000

// costHours recomputes the hours' GPU usage and cost allocation, reading
// their samples and usage in spans of consecutive hours (eachSpan) and
// computing each hour on its own, writing their rows with version together
// (in one write, or one per maxPendingCostRows rows).
func (j *Job) costHours(ctx context.Context, hours []time.Time, book *billing.PriceBook, version uint64) error {
	var gpus []GPUHourRow
	var costs []CostRow
	var labels []ServingHourRow
	err := eachSpan(hours, func(from, to time.Time) (int, error) {
		samples, err := j.store.GPUSamplesOfHours(ctx, from, to)
		if err != nil {
			return 0, err
		}
		usage, err := j.store.DeploymentUsageOfHours(ctx, from, to)
		if err != nil {
			return 0, err
		}
		serving, err := j.store.ServingOfHours(ctx, from, to)
		if err != nil {
			return 0, err
		}
		servingOf := map[int64][]ServingRow{}
		for _, s := range serving {
			h := s.Hour.UTC().Truncate(time.Hour).Unix()
			servingOf[h] = append(servingOf[h], s)
		}
		// Each hour's samples and usage, in the order read.
		samplesOf := map[int64][]GPUSampleRow{}
		for _, s := range samples {
			h := s.SampledAt.UTC().Truncate(time.Hour).Unix()
			samplesOf[h] = append(samplesOf[h], s)
		}
		usageOf := map[int64][]DeploymentUsageRow{}
		for _, u := range usage {
			h := u.Hour.UTC().Truncate(time.Hour).Unix()
			usageOf[h] = append(usageOf[h], u)
		}
		for hour := from; hour.Before(to); hour = hour.Add(time.Hour) {
			gpu, cost, err := ComputeCost(hour, book, samplesOf[hour.Unix()], usageOf[hour.Unix()])
			if err != nil {
				return 0, fmt.Errorf("cost of %s: %w", hour.Format(time.RFC3339), err)
			}
			LabelCost(cost, servingOf[hour.Unix()])
			gpus, costs = append(gpus, gpu...), append(costs, cost...)
			labels = append(labels, ServingLabels(hour, servingOf[hour.Unix()])...)
			if len(gpus)+len(costs)+len(labels) >= maxPendingCostRows {
				if err := j.writeCost(ctx, gpus, costs, labels, version); err != nil {
					return 0, err
				}
				gpus, costs, labels = gpus[:0], costs[:0], labels[:0]
			}
		}
		return len(samples) + len(usage) + len(serving), nil
	})
	if err != nil || len(gpus)+len(costs)+len(labels) == 0 {
		return err
	}
	return j.writeCost(ctx, gpus, costs, labels, version)
}

// writeCost writes GPU and cost rows, then the serving labels of their
// hours: a usage read that groups by engine sees an hour's labels no
// earlier than its cost.
func (j *Job) writeCost(ctx context.Context, gpus []GPUHourRow, costs []CostRow, labels []ServingHourRow, version uint64) error {
	if err := j.store.WriteCost(ctx, gpus, costs, version); err != nil {
		return err
	}
	if len(labels) == 0 {
		return nil
	}
	return j.store.WriteServing(ctx, labels, version)
}

// maxSpanRows is how many rows a span read (eachSpan) aims to stay under.
const maxSpanRows = 100_000

// eachSpan calls read for spans [from, to) of whole consecutive hours that
// together cover hours (in order, distinct, on whole hours), in order: one
// hour first, then twice as many hours while the last read returned fewer
// than maxSpanRows/2 rows (at most the rest of the run of consecutive
// hours), back to one hour when it returned more than maxSpanRows. Quiet
// hours (a replayed history) are read a day at a time, busy ones one by
// one; a query costs ClickHouse a few milliseconds whatever it reads.
func eachSpan(hours []time.Time, read func(from, to time.Time) (rows int, err error)) error {
	span := 1
	for i := 0; i < len(hours); {
		// The run of consecutive hours from hours[i], at most span long.
		n := 1
		for n < span && i+n < len(hours) && hours[i+n].Equal(hours[i+n-1].Add(time.Hour)) {
			n++
		}
		from := hours[i].UTC().Truncate(time.Hour)
		rows, err := read(from, from.Add(time.Duration(n)*time.Hour))
		if err != nil {
			return err
		}
		i += n
		switch {
		case rows > maxSpanRows:
			span = 1
		case rows < maxSpanRows/2:
			span = min(2*span, hoursPerChunk)
		}
	}
	return nil
}

// versionReplicaBits is the part of a version that names the replica.
const versionReplicaBits = 16

// nextVersion orders computations: later ones replace earlier ones. A
// version is the start time in milliseconds with a random replica id in the
// low bits, so that two replicas computing the same hour in the same
// millisecond still write distinguishable rows (the hour rollup is built
// from the minute rows of its own version).
func (j *Job) nextVersion() uint64 {
	v := uint64(j.now().UnixMilli())<<versionReplicaBits | j.replica
	if v <= j.version {
		v = j.version + 1<<versionReplicaBits
	}
	j.version = v
	return v
}

func mergeHours(lists ...[]time.Time) []time.Time {
	seen := map[int64]bool{}
	var out []time.Time
	for _, l := range lists {
		for _, h := range l {
			if !seen[h.Unix()] {
				seen[h.Unix()] = true
				out = append(out, h)
			}
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Before(out[k]) })
	return out
}

// DropOldMinutes drops the days of minute rows wholly older than
// MinuteRetention, when it is set and the store can.
func (j *Job) DropOldMinutes(ctx context.Context) error {
	d, ok := j.store.(MinuteDropper)
	if j.cfg.MinuteRetention <= 0 || !ok {
		return nil
	}
	before := j.now().Add(-j.cfg.MinuteRetention)
	days, err := d.DropMinuteDays(ctx, before)
	if len(days) > 0 {
		j.logger.Info("dropped minute rows outside the retention window", "days", days, "retention", j.cfg.MinuteRetention)
	}
	return err
}

// Run runs the job every Interval until ctx ends. Failures are logged and
// retried at the next run.
func (j *Job) Run(ctx context.Context) error {
	t := time.NewTicker(j.cfg.Interval)
	defer t.Stop()
	var swept time.Time
	for {
		if _, err := j.RunOnce(ctx); err != nil && ctx.Err() == nil {
			j.logger.Warn("rollup run failed, will retry", "error", err)
		}
		if now := j.now(); now.Sub(swept) >= minuteSweepEvery {
			if err := j.DropOldMinutes(ctx); err != nil && ctx.Err() == nil {
				j.logger.Warn("dropping minute rows outside the retention window failed, will retry", "error", err)
			} else {
				swept = now
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}
