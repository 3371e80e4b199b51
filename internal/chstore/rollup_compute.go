package chstore

import (
	"cmp"
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
// histograms there took 14 s for an hour of 1M events. The events are
// gathered per group and ordered by time here (cheaper than ClickHouse's
// ORDER BY, 0.5–0.8 s for 1M events on 18.16); then each group's minute
// rows are counted one after the other, their histograms in a dense array,
// and the finished rows stream to ClickHouse while the next are counted.
// Every level (minute, hour, tenant hour, all-tenant hour) comes from the
// same pass, the coarser histograms merged exactly from the finer ones, so
// the levels always agree. Memory: about 80 bytes per event of the hour.

// hourGroupsSQL lists the groups of one UTC hour with a 64-bit hash that
// hourEventsSQL returns instead of the six strings, so that reading an
// event allocates nothing, and their rows (duplicates included). A hash
// shared by two groups is reported (the second column counts the groups
// behind a hash).
const hourGroupsSQL = `SELECT cityHash64(tenant_id, model, model_version, deployment, gpu_type, slo_class) AS h,
  uniqExact(tenant_id, model, model_version, deployment, gpu_type, slo_class), count(),
  any(tenant_id), any(model), any(model_version), any(deployment), any(gpu_type), any(slo_class)
FROM inference_events
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)
GROUP BY h`

// hourEventsSQL reads one UTC hour of events, deduplicated: the table's key
// is (hour, tenant_id, event_id), so FINAL keeps one row per event, the
// newest ingested copy. Duplicates share
// completed_at, hence the hour. status is 1 for ok, 2 + its index in
// StatusClasses, or 0 for another error; a missing latency is NaN
// (validation keeps NaN out of the table).
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
	hist                   [4]histogram
	good, goodOutput       uint64
}

// histogram is a sparse sketch histogram: keys ascending, with their counts.
type histogram struct {
	keys   []int16
	counts []uint64
}

// add counts one event in the row.
func (a *rollupAcc) add(e *hourEvent, good bool) {
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
		}
	}
	if good {
		a.good++
		a.goodOutput += e.output
	}
}

// addTotals adds the counters and sums of o (not its histograms) to a.
func (a *rollupAcc) addTotals(o *rollupAcc) {
	a.requests += o.requests
	a.errors += o.errors
	for c := range a.errorsBy {
		a.errorsBy[c] += o.errorsBy[c]
	}
	a.prompt += o.prompt
	a.cached += o.cached
	a.output += o.output
	for m := range a.count {
		a.count[m] += o.count[m]
		a.sum[m] += o.sum[m]
	}
	a.good += o.good
	a.goodOutput += o.goodOutput
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
// slo_class) of the hour, with its SLO thresholds and, until they are
// counted, its events.
type hourGroup struct {
	acc            rollupAcc
	tenant         *rollupAcc
	events         []hourEvent
	ttft, itl, e2e float64 // thresholds; < 0: not checked
	done           bool    // its events have all been counted
}

// hourRollup aggregates one hour into every rollup level. Events must come
// grouped by group and ordered by time within a group.
type hourRollup struct {
	hour    time.Time
	spec    GoodputSpec
	groups  map[uint64]*hourGroup
	order   []*hourGroup
	tenants map[string]*rollupAcc
	total   rollupAcc

	// The group and minute being counted, with the histograms of the
	// minute row and of the group's finished minutes.
	cur        *hourGroup
	minute     int64
	row        rollupAcc
	minuteHist [4]histMerger
	groupHist  [4]histMerger
	// Finished minute rows go out in blocks of rollupBlockRows.
	block   []rollupAcc
	minutes int
	emit    func([]rollupAcc) error
	newRows func() []rollupAcc
}

// newHourRollup starts the rollup of an hour; emit receives each full
// block of finished minute rows, and newRows gives the next empty block.
func newHourRollup(hour time.Time, spec GoodputSpec, emit func([]rollupAcc) error, newRows func() []rollupAcc) *hourRollup {
	return &hourRollup{hour: hour, spec: spec, groups: map[uint64]*hourGroup{}, tenants: map[string]*rollupAcc{},
		total: rollupAcc{bucket: hour}, emit: emit, newRows: newRows}
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
func (h *hourRollup) addGroup(hash uint64, dims [6]string, rows uint64) {
	g := &hourGroup{acc: rollupAcc{bucket: h.hour, dims: dims}, events: make([]hourEvent, 0, rows)}
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

// errOutOfOrder marks events that do not come grouped by group and ordered
// by time: counting on would write a minute or group row twice.
var errOutOfOrder = errors.New("events of the hour are not ordered by group and time")

// gather keeps an event for its group, to be counted by countAll; its
// group must have been added.
func (h *hourRollup) gather(e *hourEvent) error {
	g := h.groups[e.group]
	if g == nil {
		return errUnknownGroup
	}
	g.events = append(g.events, *e)
	return nil
}

// countAll counts the gathered events, group by group in time order, and
// finishes the rollup.
func (h *hourRollup) countAll() error {
	for _, g := range h.order {
		slices.SortFunc(g.events, func(a, b hourEvent) int { return cmp.Compare(a.completedAt, b.completedAt) })
		for i := range g.events {
			if err := h.add(&g.events[i]); err != nil {
				return err
			}
		}
		g.events = nil
	}
	return h.finish()
}

// add counts one event; its group must have been added, and events must
// come group by group, in time order within a group.
func (h *hourRollup) add(e *hourEvent) error {
	g := h.groups[e.group]
	if g == nil {
		return errUnknownGroup
	}
	minute := (int64(e.completedAt) - h.hour.Unix()) / 60
	if minute < 0 || minute >= 60 {
		return fmt.Errorf("event at %d outside the hour %s", e.completedAt, h.hour.Format(time.RFC3339))
	}
	if g != h.cur || minute != h.minute {
		if g.done || (g == h.cur && minute < h.minute) {
			return errOutOfOrder
		}
		if err := h.endMinute(); err != nil {
			return err
		}
		if g != h.cur {
			h.endGroup()
			h.cur = g
		}
		h.minute = minute
		h.row = rollupAcc{bucket: h.hour.Add(time.Duration(minute) * time.Minute), dims: g.acc.dims}
	}
	for m, v := range e.latency {
		if !math.IsNaN(v) {
			h.minuteHist[m].addKey(sketch.Key(v), 1)
		}
	}
	h.row.add(e, goodRequest(e.ok(), e.latency[0], e.latency[1], e.latency[2], g.ttft, g.itl, g.e2e))
	return nil
}

// endMinute finishes the minute row being counted, if any.
func (h *hourRollup) endMinute() error {
	if h.cur == nil {
		return nil
	}
	for m := range h.row.hist {
		h.row.hist[m] = h.minuteHist[m].take()
		h.groupHist[m].add(h.row.hist[m])
	}
	h.cur.acc.addTotals(&h.row)
	if h.block == nil {
		h.block = h.newRows()[:0]
	}
	h.block = append(h.block, h.row)
	h.minutes++
	if len(h.block) == rollupBlockRows {
		block := h.block
		h.block = nil
		return h.emit(block)
	}
	return nil
}

// endGroup finishes the group being counted, if any: its histograms are
// those of its minutes merged.
func (h *hourRollup) endGroup() {
	g := h.cur
	if g == nil {
		return
	}
	for m := range g.acc.hist {
		g.acc.hist[m] = h.groupHist[m].take()
	}
	g.tenant.addTotals(&g.acc)
	h.total.addTotals(&g.acc)
	g.done = true
	h.cur = nil
}

// finish finishes the last minute row and group and emits the last block.
func (h *hourRollup) finish() error {
	if err := h.endMinute(); err != nil {
		return err
	}
	h.endGroup()
	if len(h.block) > 0 {
		block := h.block
		h.block = nil
		return h.emit(block)
	}
	return nil
}

// levels returns the rows of the hour tables, with their histograms: those
// of the groups (merged from their minutes when counted), merged from the
// groups for the tenants, and from the tenants for the total.
func (h *hourRollup) levels() map[string][]rollupAcc {
	out := map[string][]rollupAcc{}
	var merge histMerger
	var tenants []string
	for t := range h.tenants {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	byTenant := map[string][]*hourGroup{}
	for _, g := range h.order {
		if g.acc.requests > 0 {
			byTenant[g.acc.dims[0]] = append(byTenant[g.acc.dims[0]], g)
			out["rollup_hour"] = append(out["rollup_hour"], g.acc)
		}
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
	for _, t := range tenants {
		if h.tenants[t].requests > 0 {
			out["rollup_tenant_hour"] = append(out["rollup_tenant_hour"], *h.tenants[t])
		}
	}
	if h.total.requests > 0 {
		out["rollup_total_hour"] = []rollupAcc{h.total}
	}
	return out
}

// rollupTables are the tables an hour's rollup writes.
var rollupTables = []string{"rollup_minute", "rollup_hour", "rollup_tenant_hour", "rollup_total_hour"}

// rollupBlock holds the columns of rollupColumns for a block of rows,
// reused from block to block.
type rollupBlock struct {
	bucket                 []time.Time
	dims                   [6][]string
	requests, errs         []uint64
	errsBy                 [8][]uint64
	prompt, cached, output []uint64
	counts                 [4][]uint64
	sums                   [4][]float64
	hkeys                  [4][][]int16
	hcounts                [4][][]uint64
	slo                    []uint32
	good, goodOut, ver     []uint64
}

// fill lays rows out as the columns of rollupColumns.
func (b *rollupBlock) fill(rows []rollupAcc, sloVersion uint32, version uint64) []any {
	n := len(rows)
	b.bucket = reuse(b.bucket, n)
	for d := range b.dims {
		b.dims[d] = reuse(b.dims[d], n)
	}
	b.requests, b.errs = reuse(b.requests, n), reuse(b.errs, n)
	for c := range b.errsBy {
		b.errsBy[c] = reuse(b.errsBy[c], n)
	}
	b.prompt, b.cached, b.output = reuse(b.prompt, n), reuse(b.cached, n), reuse(b.output, n)
	for m := range 4 {
		b.counts[m], b.sums[m], b.hkeys[m], b.hcounts[m] = reuse(b.counts[m], n), reuse(b.sums[m], n), reuse(b.hkeys[m], n), reuse(b.hcounts[m], n)
	}
	b.slo, b.good, b.goodOut, b.ver = reuse(b.slo, n), reuse(b.good, n), reuse(b.goodOut, n), reuse(b.ver, n)
	for i := range rows {
		r := &rows[i]
		b.bucket = append(b.bucket, r.bucket)
		for d := range b.dims {
			b.dims[d] = append(b.dims[d], r.dims[d])
		}
		b.requests, b.errs = append(b.requests, r.requests), append(b.errs, r.errors)
		for c := range b.errsBy {
			b.errsBy[c] = append(b.errsBy[c], r.errorsBy[c])
		}
		b.prompt, b.cached, b.output = append(b.prompt, r.prompt), append(b.cached, r.cached), append(b.output, r.output)
		for m := range 4 {
			b.counts[m], b.sums[m] = append(b.counts[m], r.count[m]), append(b.sums[m], r.sum[m])
			b.hkeys[m], b.hcounts[m] = append(b.hkeys[m], r.hist[m].keys), append(b.hcounts[m], r.hist[m].counts)
		}
		b.slo, b.good = append(b.slo, sloVersion), append(b.good, r.good)
		b.goodOut, b.ver = append(b.goodOut, r.goodOutput), append(b.ver, version)
	}
	cols := []any{b.bucket}
	for _, d := range b.dims {
		cols = append(cols, d)
	}
	cols = append(cols, b.requests, b.errs)
	for _, c := range b.errsBy {
		cols = append(cols, c)
	}
	cols = append(cols, b.prompt, b.cached, b.output)
	for m := range 4 {
		cols = append(cols, b.counts[m], b.sums[m], b.hkeys[m], b.hcounts[m])
	}
	return append(cols, b.slo, b.good, b.goodOut, b.ver)
}

// reuse returns s emptied, with room for n elements.
func reuse[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// rollupBlockRows is the size of the blocks rollup rows are sent in.
const rollupBlockRows = 16_384

// insertRollupRows writes rows into table in one INSERT.
func (s *Store) insertRollupRows(ctx context.Context, what, table string, rows []rollupAcc, sloVersion uint32, version uint64) error {
	blocks := make(chan []rollupAcc, 1)
	go func() {
		for from := 0; from < len(rows); from += rollupBlockRows {
			blocks <- rows[from:min(from+rollupBlockRows, len(rows))]
		}
		close(blocks)
	}()
	return s.insertRollupBlocks(ctx, what, table, blocks, nil, sloVersion, version)
}

// insertRollupBlocks writes the blocks of rows received from blocks into
// table, in one INSERT, until blocks is closed; it sends each block on to
// free (when not nil) once the driver holds a copy. It writes nothing if no
// block comes, and fails without finishing the INSERT if ctx ends first.
func (s *Store) insertRollupBlocks(ctx context.Context, what, table string, blocks <-chan []rollupAcc, free chan<- []rollupAcc, sloVersion uint32, version uint64) error {
	var b rollupBlock
	receive := func() ([]rollupAcc, error) {
		select {
		case rows := <-blocks:
			return rows, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	first, err := receive()
	if err != nil || first == nil {
		return err
	}
	var last []rollupAcc
	return s.sendBlocks(ctx, what, "INSERT INTO "+table+" ("+rollupColumnList+")", rollupColumns(), func() ([]any, error) {
		if last != nil && free != nil {
			select {
			case free <- last:
			default:
			}
		}
		rows := first
		first = nil
		if rows == nil {
			if rows, err = receive(); err != nil || rows == nil {
				return nil, err
			}
		}
		last = rows
		return b.fill(rows, sloVersion, version), nil
	})
}

// RollupHourTimed is RollupHour, returning how long reading and aggregating
// the hour ("read") and writing each table took, for benchmarks. The
// minute rows are written while the hour is read, by rollupInserts INSERTs
// at once; the hour tables are written once it is read, in one INSERT each,
// at once.
func (s *Store) RollupHourTimed(ctx context.Context, hour time.Time, spec GoodputSpec, version uint64) (map[string]time.Duration, error) {
	hour = hour.UTC().Truncate(time.Hour)
	start := time.Now()
	var (
		took = map[string]time.Duration{}
		mu   sync.Mutex
	)
	timed := func(key string, t0 time.Time) {
		mu.Lock()
		took[key] = max(took[key], time.Since(t0))
		mu.Unlock()
	}
	g, gctx := errgroup.WithContext(ctx)
	blocks := make(chan []rollupAcc, rollupInserts)
	free := make(chan []rollupAcc, 2*rollupInserts)
	what := fmt.Sprintf("roll up %s into rollup_minute", hour.Format(time.RFC3339))
	for range rollupInserts {
		g.Go(func() error {
			defer timed("rollup_minute", start)
			return s.insertRollupBlocks(gctx, what, "rollup_minute", blocks, free, spec.Version, version)
		})
	}
	agg := newHourRollup(hour, spec, func(rows []rollupAcc) error {
		select {
		case blocks <- rows:
			return nil
		case <-gctx.Done():
			return gctx.Err()
		}
	}, func() []rollupAcc {
		select {
		case rows := <-free:
			return rows
		default:
			return make([]rollupAcc, 0, rollupBlockRows)
		}
	})
	g.Go(func() error {
		// On failure blocks stays open: the minute INSERTs end with the
		// context, unfinished, rather than writing part of the hour.
		if err := s.readHour(gctx, agg); err != nil {
			return err
		}
		close(blocks)
		timed("read", start)
		for table, rows := range agg.levels() {
			what := fmt.Sprintf("roll up %s into %s", hour.Format(time.RFC3339), table)
			g.Go(func() error {
				t0 := time.Now()
				defer timed(table, t0)
				return s.insertRollupRows(gctx, what, table, rows, spec.Version, version)
			})
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return took, nil
}

// readHour reads the hour's groups and events into agg, and finishes it.
func (s *Store) readHour(ctx context.Context, agg *hourRollup) error {
	hour := agg.hour
	if err := s.readHourGroups(ctx, agg); err != nil {
		return err
	}
	rows, err := s.conn.Query(ctx, hourEventsSQL, hour.Unix(), hour.Add(time.Hour).Unix())
	if err != nil {
		return fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	var e hourEvent
	dest := []any{&e.completedAt, &e.group, &e.status, &e.prompt, &e.cached, &e.output}
	for i := range e.latency {
		dest = append(dest, &e.latency[i])
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("scan events of %s: %w", hour.Format(time.RFC3339), err)
		}
		err := agg.gather(&e)
		if errors.Is(err, errUnknownGroup) {
			// Inserted after the groups were listed: list them again.
			if err = s.readHourGroups(ctx, agg); err == nil {
				err = agg.gather(&e)
			}
		}
		if err != nil {
			return fmt.Errorf("roll up %s: %w", hour.Format(time.RFC3339), err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	return agg.countAll()
}

// rollupInserts is the number of INSERTs the minute rows of an hour are
// written with at once.
const rollupInserts = 2

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
			hash, n, count uint64
			dims           [6]string
		)
		if err := rows.Scan(&hash, &n, &count, &dims[0], &dims[1], &dims[2], &dims[3], &dims[4], &dims[5]); err != nil {
			return fmt.Errorf("scan groups of %s: %w", agg.hour.Format(time.RFC3339), err)
		}
		if n != 1 {
			return fmt.Errorf("groups of %s: %d groups share the hash %x; this hour cannot be rolled up", agg.hour.Format(time.RFC3339), n, hash)
		}
		if agg.groups[hash] == nil {
			agg.addGroup(hash, dims, count)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read groups of %s: %w", agg.hour.Format(time.RFC3339), classify(err))
	}
	return nil
}
