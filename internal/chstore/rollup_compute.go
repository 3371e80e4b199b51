package chstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"tokenmeter/rollup/sketch"
)

// An hour is rolled up in Go from one read of its deduplicated events:
// ClickHouse 18.16's sumMap costs about a microsecond per value, so building
// histograms there took 14 s for an hour of 1M events, while reading the
// hour (FINAL on the hour-first key deduplicates by (tenant_id, event_id))
// and aggregating here takes about 2.5 s. Every level (minute, hour, tenant
// hour, all-tenant hour) comes from the same pass, so they always agree.

// hourGroupsSQL lists the groups of one UTC hour with a 64-bit hash that
// hourEventsSQL returns instead of the six strings, so that reading an
// event allocates nothing. A hash shared by two groups is reported (the
// second column counts the groups behind a hash).
const hourGroupsSQL = `SELECT cityHash64(tenant_id, model, model_version, deployment, gpu_type, slo_class) AS h,
  uniqExact(tenant_id, model, model_version, deployment, gpu_type, slo_class),
  any(tenant_id), any(model), any(model_version), any(deployment), any(gpu_type), any(slo_class)
FROM inference_events
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)
GROUP BY h`

// hourEventsSQL reads one UTC hour of events, deduplicated: the table's key
// is (hour, tenant_id, event_id), so FINAL keeps one row per event, the
// newest ingested copy. Duplicates share completed_at, hence the hour.
// status is 1 for ok, 2 + its index in StatusClasses, or 0 for another
// error; a missing latency is NaN (validation keeps NaN out of the table).
var hourEventsSQL = `SELECT toUInt32(completed_at), cityHash64(tenant_id, model, model_version, deployment, gpu_type, slo_class),
  toUInt8(indexOf(['ok', '` + strings.Join(StatusClasses, "', '") + `'], status)),
  prompt_tokens, cached_prompt_tokens, output_tokens,
  ifNull(ttft_ms, nan), ifNull(itl_ms, nan), ifNull(e2e_ms, nan), ifNull(queue_ms, nan)
FROM inference_events FINAL
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)`

// hourEvent is one deduplicated event as the rollup reads it.
type hourEvent struct {
	completedAt uint32
	group       uint64
	status      uint8
	prompt      uint64
	cached      uint64
	output      uint64
	latency     [4]float64 // LatencyMetrics order; NaN: missing
}

func (e *hourEvent) ok() bool { return e.status == 1 }

// rollupAcc accumulates one rollup row.
type rollupAcc struct {
	bucket                 time.Time
	dims                   [6]string
	requests, errors       uint64
	errorsBy               [8]uint64 // StatusClasses order
	prompt, cached, output uint64
	count                  [4]uint64
	sum                    [4]float64
	// keys holds one key per value, in minute rows only; histograms of the
	// coarser rows are merged from those of the finer ones.
	keys             [4][]int16
	hist             [4]histogram
	good, goodOutput uint64
}

// histogram is a sparse sketch histogram: keys ascending, with their counts.
type histogram struct {
	keys   []int16
	counts []uint64
}

func (a *rollupAcc) add(e *hourEvent, keys *[4]int16, good bool) {
	a.requests++
	if !e.ok() {
		a.errors++
		if e.status >= 2 {
			a.errorsBy[e.status-2]++
		}
	}
	a.prompt += e.prompt
	a.cached += e.cached
	a.output += e.output
	for m, v := range e.latency {
		if !math.IsNaN(v) {
			a.count[m]++
			a.sum[m] += v
			if keys != nil {
				a.keys[m] = append(a.keys[m], keys[m])
			}
		}
	}
	if good {
		a.good++
		a.goodOutput += e.output
	}
}

// histMerger adds histograms up, exactly, as sumMap does.
type histMerger struct {
	counts     [int(sketch.MaxKey) - int(sketch.MinKey) + 1]uint64
	touched    []int16
	keyArena   []int16
	countArena []uint64
}

func (h *histMerger) addKey(k int16, n uint64) {
	i := int(k) - int(sketch.MinKey)
	if h.counts[i] == 0 {
		h.touched = append(h.touched, k)
	}
	h.counts[i] += n
}

func (h *histMerger) add(o histogram) {
	for i, k := range o.keys {
		h.addKey(k, o.counts[i])
	}
}

// take returns the sum so far and starts a new one. The histograms it
// returns share a few large arrays (one allocation per thousands of rows).
func (h *histMerger) take() histogram {
	slices.Sort(h.touched)
	n := len(h.touched)
	if cap(h.keyArena)-len(h.keyArena) < n {
		h.keyArena = make([]int16, 0, max(n, 1<<16))
		h.countArena = make([]uint64, 0, max(n, 1<<16))
	}
	start := len(h.keyArena)
	for _, k := range h.touched {
		j := int(k) - int(sketch.MinKey)
		h.keyArena, h.countArena = append(h.keyArena, k), append(h.countArena, h.counts[j])
		h.counts[j] = 0
	}
	h.touched = h.touched[:0]
	return histogram{keys: h.keyArena[start:len(h.keyArena):len(h.keyArena)], counts: h.countArena[start:len(h.countArena):len(h.countArena)]}
}

// hourGroup is one (tenant, model, model_version, deployment, gpu_type,
// slo_class) of the hour, with its SLO thresholds and minute rows.
type hourGroup struct {
	acc            rollupAcc
	tenant         *rollupAcc
	minutes        [60]*rollupAcc
	ttft, itl, e2e float64 // thresholds; < 0: not checked
}

// hourRollup aggregates one hour into every rollup level.
type hourRollup struct {
	hour    time.Time
	spec    GoodputSpec
	groups  map[uint64]*hourGroup
	order   []*hourGroup
	tenants map[string]*rollupAcc
	total   rollupAcc
}

func newHourRollup(hour time.Time, spec GoodputSpec) *hourRollup {
	return &hourRollup{hour: hour, spec: spec, groups: map[uint64]*hourGroup{}, tenants: map[string]*rollupAcc{},
		total: rollupAcc{bucket: hour}}
}

// threshold returns the threshold pick chooses from the first rule matching
// (tenant, model, class), or -1 when none does or it is not set.
func (g GoodputSpec) threshold(tenant, model, class string, pick func(GoodputRule) float64) float64 {
	for _, r := range g.Rules {
		if (r.Tenant == "" || r.Tenant == tenant) && (r.Model == "" || r.Model == model) && (r.Class == "" || r.Class == class) {
			if t := pick(r); t > 0 {
				return t
			}
			return -1
		}
	}
	return -1
}

// goodRequest reports whether a request is good under the thresholds
// (ARCHITECTURE "Goodput"): status OK and every configured threshold met. A
// missing TTFT or E2E (NaN, which compares false) fails its threshold; a
// missing ITL (fewer than two output tokens) does not.
func goodRequest(ok bool, ttft, itl, e2e float64, tTTFT, tITL, tE2E float64) bool {
	return ok &&
		(tTTFT < 0 || ttft <= tTTFT) &&
		(tITL < 0 || math.IsNaN(itl) || itl <= tITL) &&
		(tE2E < 0 || e2e <= tE2E)
}

// addGroup registers a group of the hour under its hash.
func (h *hourRollup) addGroup(hash uint64, dims [6]string) {
	g := &hourGroup{acc: rollupAcc{bucket: h.hour, dims: dims}}
	tenant, model, class := dims[0], dims[1], dims[5]
	if class == "" {
		class = h.spec.DefaultClass
	}
	g.ttft = h.spec.threshold(tenant, model, class, func(r GoodputRule) float64 { return r.TTFTMs })
	g.itl = h.spec.threshold(tenant, model, class, func(r GoodputRule) float64 { return r.ITLMs })
	g.e2e = h.spec.threshold(tenant, model, class, func(r GoodputRule) float64 { return r.E2EMs })
	g.tenant = h.tenants[tenant]
	if g.tenant == nil {
		g.tenant = &rollupAcc{bucket: h.hour, dims: [6]string{tenant}}
		h.tenants[tenant] = g.tenant
	}
	h.groups[hash] = g
	h.order = append(h.order, g)
}

// add counts one event; its group must have been added.
func (h *hourRollup) add(e *hourEvent) error {
	g := h.groups[e.group]
	if g == nil {
		return errUnknownGroup
	}
	var keys [4]int16
	for m, v := range e.latency {
		if !math.IsNaN(v) {
			keys[m] = sketch.Key(v)
		}
	}
	good := goodRequest(e.ok(), e.latency[0], e.latency[1], e.latency[2], g.ttft, g.itl, g.e2e)
	minute := (int64(e.completedAt) - h.hour.Unix()) / 60
	if minute < 0 || minute >= 60 {
		return fmt.Errorf("event at %d outside the hour %s", e.completedAt, h.hour.Format(time.RFC3339))
	}
	mr := g.minutes[minute]
	if mr == nil {
		mr = &rollupAcc{bucket: h.hour.Add(time.Duration(minute) * time.Minute), dims: g.acc.dims}
		g.minutes[minute] = mr
	}
	mr.add(e, &keys, good)
	g.acc.add(e, nil, good)
	g.tenant.add(e, nil, good)
	h.total.add(e, nil, good)
	return nil
}

// levels returns the rows of every rollup table of the hour, with their
// histograms: counted for minutes, merged from minutes for the hour groups,
// from groups for tenants, from tenants for the total.
func (h *hourRollup) levels() map[string][]*rollupAcc {
	out := map[string][]*rollupAcc{}
	var merge histMerger
	var tenants []string
	for m := range LatencyMetrics {
		for _, g := range h.order {
			for _, r := range g.minutes {
				if r != nil {
					for _, k := range r.keys[m] {
						merge.addKey(k, 1)
					}
					r.keys[m] = nil
					r.hist[m] = merge.take()
				}
			}
			for _, r := range g.minutes {
				if r != nil {
					merge.add(r.hist[m])
				}
			}
			g.acc.hist[m] = merge.take()
		}
	}
	for t := range h.tenants {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	byTenant := map[string][]*hourGroup{}
	for _, g := range h.order {
		byTenant[g.acc.dims[0]] = append(byTenant[g.acc.dims[0]], g)
	}
	for m := range LatencyMetrics {
		for _, t := range tenants {
			for _, g := range byTenant[t] {
				merge.add(g.acc.hist[m])
			}
			h.tenants[t].hist[m] = merge.take()
		}
		for _, t := range tenants {
			merge.add(h.tenants[t].hist[m])
		}
		h.total.hist[m] = merge.take()
	}
	for _, g := range h.order {
		out["rollup_hour"] = append(out["rollup_hour"], &g.acc)
		for _, r := range g.minutes {
			if r != nil {
				out["rollup_minute"] = append(out["rollup_minute"], r)
			}
		}
	}
	for _, t := range tenants {
		out["rollup_tenant_hour"] = append(out["rollup_tenant_hour"], h.tenants[t])
	}
	if h.total.requests > 0 {
		out["rollup_total_hour"] = []*rollupAcc{&h.total}
	}
	return out
}

// rollupTables are the tables an hour's rollup writes.
var rollupTables = []string{"rollup_minute", "rollup_hour", "rollup_tenant_hour", "rollup_total_hour"}

// rollupColumnValues lays rows out as the columns of rollupColumns.
func rollupColumnValues(rows []*rollupAcc, sloVersion uint32, version uint64) []any {
	n := len(rows)
	bucket := make([]time.Time, n)
	var dims [6][]string
	for i := range dims {
		dims[i] = make([]string, n)
	}
	requests, errs := make([]uint64, n), make([]uint64, n)
	var errsBy [8][]uint64
	for i := range errsBy {
		errsBy[i] = make([]uint64, n)
	}
	prompt, cached, output := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	var counts [4][]uint64
	var sums [4][]float64
	var hkeys [4][][]int16
	var hcounts [4][][]uint64
	for m := range 4 {
		counts[m], sums[m], hkeys[m], hcounts[m] = make([]uint64, n), make([]float64, n), make([][]int16, n), make([][]uint64, n)
	}
	slo, good, goodOut, ver := make([]uint32, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i, r := range rows {
		bucket[i] = r.bucket
		for d := range dims {
			dims[d][i] = r.dims[d]
		}
		requests[i], errs[i] = r.requests, r.errors
		for c := range errsBy {
			errsBy[c][i] = r.errorsBy[c]
		}
		prompt[i], cached[i], output[i] = r.prompt, r.cached, r.output
		for m := range 4 {
			counts[m][i], sums[m][i] = r.count[m], r.sum[m]
			hkeys[m][i], hcounts[m][i] = r.hist[m].keys, r.hist[m].counts
		}
		slo[i], good[i], goodOut[i], ver[i] = sloVersion, r.good, r.goodOutput, version
	}
	cols := []any{bucket}
	for _, d := range dims {
		cols = append(cols, d)
	}
	cols = append(cols, requests, errs)
	for _, c := range errsBy {
		cols = append(cols, c)
	}
	cols = append(cols, prompt, cached, output)
	for m := range 4 {
		cols = append(cols, counts[m], sums[m], hkeys[m], hcounts[m])
	}
	return append(cols, slo, good, goodOut, ver)
}

// RollupHourTimed is RollupHour, returning how long reading and aggregating
// the hour ("read") and writing each table took, for benchmarks.
func (s *Store) RollupHourTimed(ctx context.Context, hour time.Time, spec GoodputSpec, version uint64) (map[string]time.Duration, error) {
	hour = hour.UTC().Truncate(time.Hour)
	start := time.Now()
	agg := newHourRollup(hour, spec)
	if err := s.readHourGroups(ctx, agg); err != nil {
		return nil, err
	}
	rows, err := s.conn.Query(ctx, hourEventsSQL, hour.Unix(), hour.Add(time.Hour).Unix())
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	var e hourEvent
	dest := []any{&e.completedAt, &e.group, &e.status, &e.prompt, &e.cached, &e.output}
	for i := range e.latency {
		dest = append(dest, &e.latency[i])
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan events of %s: %w", hour.Format(time.RFC3339), err)
		}
		err := agg.add(&e)
		if errors.Is(err, errUnknownGroup) {
			// Inserted after the groups were listed: list them again.
			if err = s.readHourGroups(ctx, agg); err == nil {
				err = agg.add(&e)
			}
		}
		if err != nil {
			rows.Close()
			return nil, err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	levels := agg.levels()
	took := map[string]time.Duration{"read": time.Since(start)}
	// The tables are written at once, the minute rows (as many as the
	// events when groups are sparse) in several inserts: while ClickHouse
	// sorts and writes one, this process encodes the next.
	durations := make([]time.Duration, len(rollupTables))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for i, table := range rollupTables {
		rows := levels[table]
		chunk := len(rows) // one INSERT: queries read an hour's newest version
		if table == "rollup_minute" {
			chunk = max(len(rows)/rollupInserts+1, minRollupInsert)
		}
		for from := 0; from < len(rows); from += chunk {
			part := rows[from:min(from+chunk, len(rows))]
			g.Go(func() error {
				t0 := time.Now()
				what := fmt.Sprintf("roll up %s into %s", hour.Format(time.RFC3339), table)
				err := s.sendColumns(gctx, what, "INSERT INTO "+table+" ("+rollupColumnList+")", rollupColumns(),
					rollupColumnValues(part, spec.Version, version))
				mu.Lock()
				durations[i] = max(durations[i], time.Since(t0)) // the longest insert of the table
				mu.Unlock()
				return err
			})
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i, table := range rollupTables {
		took[table] = durations[i]
	}
	return took, nil
}

// Inserts of the minute rows of an hour: at most rollupInserts, of at
// least minRollupInsert rows each. The hour tables get one INSERT each.
const (
	rollupInserts   = 4
	minRollupInsert = 50_000
)

// errUnknownGroup marks an event whose group was not listed before the
// events were read: one inserted in between.
var errUnknownGroup = errors.New("event of an unlisted group")

// readHourGroups registers the hour's groups and their hashes, those not
// registered yet.
func (s *Store) readHourGroups(ctx context.Context, agg *hourRollup) error {
	rows, err := s.conn.Query(ctx, hourGroupsSQL, agg.hour.Unix(), agg.hour.Add(time.Hour).Unix())
	if err != nil {
		return fmt.Errorf("read groups of %s: %w", agg.hour.Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			hash uint64
			n    uint64
			dims [6]string
		)
		if err := rows.Scan(&hash, &n, &dims[0], &dims[1], &dims[2], &dims[3], &dims[4], &dims[5]); err != nil {
			return fmt.Errorf("scan groups of %s: %w", agg.hour.Format(time.RFC3339), err)
		}
		if n != 1 {
			return fmt.Errorf("groups of %s: %d groups share the hash %x; this hour cannot be rolled up", agg.hour.Format(time.RFC3339), n, hash)
		}
		if agg.groups[hash] == nil {
			agg.addGroup(hash, dims)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read groups of %s: %w", agg.hour.Format(time.RFC3339), classify(err))
	}
	return nil
}
