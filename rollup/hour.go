package rollup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"time"
	"unsafe"

	"tokenmeter/rollup/sketch"

	"golang.org/x/sync/errgroup"
)

// An hour is rolled up here from one read of its deduplicated events
// (ClickHouse 18.16's sumMap costs about a microsecond per value, so
// building the histograms there took 14 s for an hour of 1M events). The
// events are gathered per group and ordered by minute (cheaper here than
// ClickHouse's ORDER BY, 0.5–0.8 s for 1M events on 18.16); then each
// group's minute rows are counted one after the other, their histograms in
// a dense array, groups in the order of the tables' key, and the finished
// rows stream to ClickHouse, in that order, while the next are counted.
// Every level (minute, hour, tenant hour, all-tenant hour)
// comes from the same pass, the coarser histograms merged exactly from the
// finer ones, so the levels always agree. Each hour row also keeps its
// requests and output tokens per minute, summed from the minute rows, and
// its busiest minute: a tenant's is the busiest minute of its groups' sum,
// not the largest of their own. Memory: about 100 bytes per event of the
// hour, and 1 KB per group for its per-minute counts.

// HourStore is what rolling up an hour needs of ClickHouse; *chstore.Store
// implements it.
type HourStore interface {
	ReadHour(ctx context.Context, hour time.Time, group func(HourGroup) error, event func(*HourEvent) error) error
	InsertRollupRecords(ctx context.Context, table string, rows []RollupRecord, sloVersion uint32, version uint64) error
	InsertRollupBlocks(ctx context.Context, table string, blocks <-chan []RollupRecord, free chan<- []RollupRecord, sloVersion uint32, version uint64) error
}

// GoodputRule is one SLO rule compiled for a rollup: empty Tenant, Model or
// Class match anything; a threshold ≤ 0 is not checked. Rules are given most
// specific first; the first match decides.
type GoodputRule struct {
	Tenant, Model, Class string
	TTFTMs, ITLMs, E2EMs float64
}

// GoodputSpec is the SLO set a rollup counts good requests with.
type GoodputSpec struct {
	Version uint32
	Rules   []GoodputRule
	// DefaultClass is the class of events without slo_class.
	DefaultClass string
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

// addEvent counts one event in the row r (not in its histograms).
func addEvent(r *RollupRecord, e *HourEvent, good bool) {
	r.Requests++
	if !e.OK() {
		r.Errors++
		if e.Status >= 2 {
			r.ErrorsBy[e.Status-2]++
		}
	}
	r.Prompt += e.Prompt
	r.Cached += e.Cached
	r.Output += e.Output
	for m, v := range e.Latency {
		if !math.IsNaN(v) {
			r.Count[m]++
			r.Sum[m] += v
		}
	}
	if good {
		r.Good++
		r.GoodOutput += e.Output
	}
}

// addTotals adds the counters and sums of o (not its histograms) to r.
func addTotals(r, o *RollupRecord) {
	r.Requests += o.Requests
	r.Errors += o.Errors
	for c := range r.ErrorsBy {
		r.ErrorsBy[c] += o.ErrorsBy[c]
	}
	r.Prompt += o.Prompt
	r.Cached += o.Cached
	r.Output += o.Output
	for m := range r.Count {
		r.Count[m] += o.Count[m]
		r.Sum[m] += o.Sum[m]
	}
	r.Good += o.Good
	r.GoodOutput += o.GoodOutput
	if o.MinuteRequests != nil {
		for m := range MinutesPerHour {
			addMinute(r, m, o.MinuteRequests[m], o.MinuteOutput[m])
		}
	}
}

// addMinute adds requests and output tokens to minute m of the hour row r.
func addMinute(r *RollupRecord, m int, requests, output uint64) {
	if r.MinuteRequests == nil {
		both := make([]uint64, 2*MinutesPerHour)
		r.MinuteRequests, r.MinuteOutput = both[:MinutesPerHour:MinutesPerHour], both[MinutesPerHour:]
	}
	r.MinuteRequests[m] += requests
	r.MinuteOutput[m] += output
}

// setPeaks sets the busiest minute of the hour row r from its minutes: each
// level's own (a tenant's is the busiest minute of its groups' sum, not the
// largest of their peaks).
func setPeaks(r *RollupRecord) {
	r.PeakRequests, r.PeakOutput = 0, 0
	for m := range r.MinuteRequests {
		r.PeakRequests = max(r.PeakRequests, r.MinuteRequests[m])
		r.PeakOutput = max(r.PeakOutput, r.MinuteOutput[m])
	}
}

// hourGroup is one (tenant, model, model_version, deployment, gpu_type,
// slo_class) of the hour, with its SLO thresholds and, until they are
// counted, its events.
type hourGroup struct {
	acc            RollupRecord
	tenant         *RollupRecord
	events         []HourEvent
	listed         uint64  // its events when the groups were listed
	ttft, itl, e2e float64 // thresholds; < 0: not checked
	done           bool    // its events have all been counted
}

// hourRollup aggregates one hour into every rollup level: its events are
// gathered per group (gather), then counted group by group (countAll).
type hourRollup struct {
	// slab holds the gathered events: each group's are carved from it, in
	// one allocation reused from hour to hour (Roller).
	slab    []HourEvent
	listed  uint64 // the events of the groups listed so far
	hour    time.Time
	spec    GoodputSpec
	groups  map[uint64]*hourGroup
	order   []*hourGroup
	tenants map[string]*RollupRecord
	total   RollupRecord

	// The group and minute being counted (its row is the last of
	// pending), with the histograms of the minute row and of the group's
	// finished minutes.
	cur        *hourGroup
	minute     int64
	minuteHist [4]sketch.Merger
	groupHist  [4]sketch.Merger
	// The HourDists of the group being counted (kept per group, not per
	// minute).
	hourHist [NumHourDists]sketch.Merger
	// The minute rows of the tenant being counted, put in the table's key
	// order (bucket, then group) when it is done; they go out in blocks of
	// RollupBlockRows.
	pending      []RollupRecord
	pendingOrder []int32 // pending in minute order
	eventOrder   []int32 // a group's events in minute order
	eventMinute  []uint8 // the minute of each of a group's events
	rowMinute    []uint8 // the minute of each pending row
	tokenKeys    []int16 // tokenKeys()
	block        []RollupRecord
	emit         func([]RollupRecord) error
	newRows      func() []RollupRecord
}

// newHourRollup starts the rollup of an hour; emit receives each full
// block of finished minute rows, and newRows gives the next empty block.
func newHourRollup(hour time.Time, spec GoodputSpec, emit func([]RollupRecord) error, newRows func() []RollupRecord) *hourRollup {
	return &hourRollup{hour: hour, spec: spec, groups: map[uint64]*hourGroup{}, tenants: map[string]*RollupRecord{},
		total: RollupRecord{Bucket: hour}, emit: emit, newRows: newRows, tokenKeys: tokenKeys()}
}

// addGroup registers a group of the hour under its hash, with the number
// of its events when listed; their memory is carved out at its first event
// (carve).
func (h *hourRollup) addGroup(hash uint64, dims [6]string, rows uint64) {
	g := &hourGroup{acc: RollupRecord{Bucket: h.hour, Dims: dims}, listed: rows}
	h.listed += rows
	tenant, model, class := dims[0], dims[1], dims[5]
	if class == "" {
		class = h.spec.DefaultClass
	}
	g.ttft = h.spec.threshold(tenant, model, class, func(r GoodputRule) float64 { return r.TTFTMs })
	g.itl = h.spec.threshold(tenant, model, class, func(r GoodputRule) float64 { return r.ITLMs })
	g.e2e = h.spec.threshold(tenant, model, class, func(r GoodputRule) float64 { return r.E2EMs })
	g.tenant = h.tenants[tenant]
	if g.tenant == nil {
		g.tenant = &RollupRecord{Bucket: h.hour, Dims: [6]string{tenant}}
		h.tenants[tenant] = g.tenant
	}
	h.groups[hash] = g
	h.order = append(h.order, g)
}

// Roller rolls up hours (RollupHour), keeping the memory that held the
// last hour's events for the next: the rollup job recomputes the current
// hour every few seconds, and memory the Go runtime has handed back to the
// kernel in between costs again to touch (0.6 s of CPU per hour of 1M
// events on the development VM). It is kept up to keptEvents events and
// half the soft memory limit (--memory-limit-mib): a rollup needs it
// anyway, and meterd's memory when idle grows by what the largest recent
// hour needed. A Job has its own; the zero Roller is ready to use, and
// safe for concurrent use.
type Roller struct {
	mu     sync.Mutex
	events []HourEvent // the kept memory, empty
}

// keptEvents bounds the capacity a Roller keeps (88 bytes an event).
const keptEvents = 2_000_000

// takeSlab returns the kept memory for events (nil if none), emptied.
func (r *Roller) takeSlab() []HourEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.events
	r.events = nil
	return s[:0]
}

// keepSlab keeps s for the next rollup, unless it is too large or a larger
// one is kept.
func (r *Roller) keepSlab(s []HourEvent) {
	if cap(s) > keptEvents || int64(cap(s))*int64(unsafe.Sizeof(HourEvent{})) > debug.SetMemoryLimit(-1)/2 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cap(s) > cap(r.events) {
		r.events = s
	}
}

// errUnknownGroup marks an event of a group that was not added.
var errUnknownGroup = errors.New("event of an unlisted group")

// errOutOfOrder marks events that do not come grouped by group and ordered
// by time: counting on would write a minute or group row twice.
var errOutOfOrder = errors.New("events of the hour are not ordered by group and time")

// gather keeps an event for its group, to be counted by countAll; its
// group must have been added.
func (h *hourRollup) gather(e *HourEvent) error {
	g := h.groups[e.Group]
	if g == nil {
		return errUnknownGroup
	}
	if g.events == nil {
		g.events = h.carve(g.listed)
	}
	g.events = append(g.events, *e)
	return nil
}

// carve returns room for a group's rows events, from the slab when it has
// room left. The first time, an empty slab too small for every group listed
// so far (the hour's events, once the groups are read) is replaced by one
// allocation that holds them all, with room for late inserts. Events beyond
// a group's room make append move its events out, leaving its neighbours'
// alone.
func (h *hourRollup) carve(rows uint64) []HourEvent {
	if len(h.slab) == 0 && uint64(cap(h.slab)) < h.listed {
		h.slab = make([]HourEvent, 0, h.listed+h.listed/8)
	}
	if n := len(h.slab); uint64(cap(h.slab)-n) >= rows {
		h.slab = h.slab[:n+int(rows)]
		return h.slab[n : n : n+int(rows)]
	}
	return make([]HourEvent, 0, rows)
}

// countAll counts the gathered events, group by group and minute by
// minute, and finishes the rollup. Groups are counted in the order of
// their dimensions, so that the minute rows go out in the order of the
// tables' key (tenant, bucket, then the other dimensions): ClickHouse sorts
// every INSERT by the key, which took about half of the minute INSERTs'
// time (0.8 s for an hour of 1M events on 18.16) while the rows came
// unsorted.
func (h *hourRollup) countAll() error {
	slices.SortFunc(h.order, func(a, b *hourGroup) int { return slices.Compare(a.acc.Dims[:], b.acc.Dims[:]) })
	base := h.hour.Unix()
	for _, g := range h.order {
		// count needs the events of a minute together, no finer order.
		h.eventMinute = slices.Grow(h.eventMinute[:0], len(g.events))[:len(g.events)]
		for i := range g.events {
			m := (int64(g.events[i].CompletedAt) - base) / 60
			if m < 0 || m >= MinutesPerHour {
				return h.add(&g.events[i]) // its error
			}
			h.eventMinute[i] = uint8(m)
		}
		h.eventOrder = byMinute(h.eventOrder, h.eventMinute)
		for _, i := range h.eventOrder {
			if err := h.count(g, &g.events[i], int64(h.eventMinute[i])); err != nil {
				return err
			}
		}
		g.events = nil
	}
	return h.finish()
}

// add counts one event; its group must have been added, and events must
// come group by group, in minute order within a group.
func (h *hourRollup) add(e *HourEvent) error {
	g := h.groups[e.Group]
	if g == nil {
		return errUnknownGroup
	}
	minute := (int64(e.CompletedAt) - h.hour.Unix()) / 60
	if minute < 0 || minute >= MinutesPerHour {
		return fmt.Errorf("event at %d outside the hour %s", e.CompletedAt, h.hour.Format(time.RFC3339))
	}
	return h.count(g, e, minute)
}

// count counts the event e of the group g in its minute of the hour, as
// add does.
func (h *hourRollup) count(g *hourGroup, e *HourEvent, minute int64) error {
	if g != h.cur || minute != h.minute {
		if g.done || (g == h.cur && minute < h.minute) {
			return errOutOfOrder
		}
		if err := h.endMinute(); err != nil {
			return err
		}
		if g != h.cur {
			h.endGroup()
			if len(h.pending) > 0 && h.pending[0].Dims[0] != g.acc.Dims[0] {
				if err := h.endTenant(); err != nil {
					return err
				}
			}
			h.cur = g
		}
		h.minute = minute
		// The row is made where it stays until its tenant is done.
		h.pending = slices.Grow(h.pending, 1)[:len(h.pending)+1]
		row := &h.pending[len(h.pending)-1]
		*row = RollupRecord{}
		row.Bucket, row.Dims = h.hour.Add(time.Duration(minute)*time.Minute), g.acc.Dims
		h.rowMinute = append(h.rowMinute, uint8(minute))
	}
	tTTFT := g.ttft
	if e.TTFTEstimated {
		// E2E taken as TTFT: not a TTFT (ARCHITECTURE "Estimated TTFT").
		e.Latency[0], tTTFT = math.NaN(), -1
	}
	e2eKey := int16(0)
	for m, v := range e.Latency {
		if !math.IsNaN(v) {
			k := sketch.Key(v)
			h.minuteHist[m].AddKey(k, 1)
			if m == 2 {
				e2eKey = k
			}
		}
	}
	h.addHourDists(e, e2eKey)
	addEvent(&h.pending[len(h.pending)-1], e, goodRequest(e.OK(), e.Latency[0], e.Latency[1], e.Latency[2], tTTFT, g.itl, g.e2e))
	return nil
}

// addHourDists counts e in the HourDists of its group: prefill, decode
// (E2E − TTFT, with both), prompt and output tokens, and E2E (whose key is
// e2eKey) in its output-length class.
func (h *hourRollup) addHourDists(e *HourEvent, e2eKey int16) {
	if !math.IsNaN(e.Prefill) {
		h.hourHist[DistPrefill].AddKey(sketch.Key(e.Prefill), 1)
	}
	ttft, e2e := e.Latency[0], e.Latency[2]
	if !math.IsNaN(ttft) && !math.IsNaN(e2e) {
		h.hourHist[DistDecode].AddKey(sketch.Key(max(e2e-ttft, 0)), 1)
	}
	h.hourHist[DistPromptSize].AddKey(h.tokenKey(e.Prompt), 1)
	h.hourHist[DistOutputSize].AddKey(h.tokenKey(e.Output), 1)
	if !math.IsNaN(e2e) {
		h.hourHist[OutputClass(e.Output)].AddKey(e2eKey, 1)
	}
}

// tokenKeys holds sketch.Key of every token count below 1<<16: a logarithm
// per event and count was a tenth of the hour rollup's CPU.
var tokenKeys = sync.OnceValue(func() []int16 {
	keys := make([]int16, 1<<16)
	for n := range keys {
		keys[n] = sketch.Key(float64(n))
	}
	return keys
})

// tokenKey is sketch.Key of the token count n, from tokenKeys (looked up
// once per hour: a call of the sync.OnceValue per count cost as much as the
// lookup).
func (h *hourRollup) tokenKey(n uint64) int16 {
	if n < uint64(len(h.tokenKeys)) {
		return h.tokenKeys[n]
	}
	return sketch.Key(float64(n))
}

// byMinute returns the positions of minutes ordered by their minute, which
// must lie in [0, MinutesPerHour), and in order within a minute (a
// counting sort), in dst's memory.
func byMinute(dst []int32, minutes []uint8) []int32 {
	var at [MinutesPerHour + 1]int32
	for _, m := range minutes {
		at[m+1]++
	}
	for m := 1; m < len(at); m++ {
		at[m] += at[m-1]
	}
	dst = slices.Grow(dst[:0], len(minutes))[:len(minutes)]
	for i, m := range minutes {
		dst[at[m]] = int32(i)
		at[m]++
	}
	return dst
}

// endMinute finishes the minute row being counted, if any.
func (h *hourRollup) endMinute() error {
	if h.cur == nil {
		return nil
	}
	row := &h.pending[len(h.pending)-1]
	for m := range row.Keys {
		mh := h.minuteHist[m].Take()
		row.Keys[m], row.Counts[m] = mh.Keys, mh.Counts
		h.groupHist[m].Add(mh)
	}
	addTotals(&h.cur.acc, row)
	addMinute(&h.cur.acc, int(h.minute), row.Requests, row.Output)
	return nil
}

// endTenant sends the minute rows of the tenant counted so far on, in
// blocks, ordered by minute; rows of one minute keep the order they were
// counted in (the order of their groups).
func (h *hourRollup) endTenant() error {
	h.pendingOrder = byMinute(h.pendingOrder, h.rowMinute)
	for _, i := range h.pendingOrder {
		if h.block == nil {
			h.block = h.newRows()[:0]
		}
		h.block = append(h.block, h.pending[i])
		if len(h.block) == RollupBlockRows {
			block := h.block
			h.block = nil
			if err := h.emit(block); err != nil {
				return err
			}
		}
	}
	// The rows left behind are overwritten by the next tenant's; the
	// histograms they hold live until then (a few of the arrays Take
	// shares), or until the hour's rollup is dropped.
	h.pending, h.rowMinute = h.pending[:0], h.rowMinute[:0]
	return nil
}

// endGroup finishes the group being counted, if any: its histograms are
// those of its minutes merged.
func (h *hourRollup) endGroup() {
	g := h.cur
	if g == nil {
		return
	}
	for m := range g.acc.Keys {
		gh := h.groupHist[m].Take()
		g.acc.Keys[m], g.acc.Counts[m] = gh.Keys, gh.Counts
	}
	for d := range g.acc.HourKeys {
		gh := h.hourHist[d].Take()
		g.acc.HourKeys[d], g.acc.HourCounts[d] = gh.Keys, gh.Counts
	}
	addTotals(g.tenant, &g.acc)
	addTotals(&h.total, &g.acc)
	g.done = true
	h.cur = nil
}

// finish finishes the last minute row, group and tenant and emits the last
// block.
func (h *hourRollup) finish() error {
	if err := h.endMinute(); err != nil {
		return err
	}
	h.endGroup()
	if err := h.endTenant(); err != nil {
		return err
	}
	if len(h.block) > 0 {
		block := h.block
		h.block = nil
		return h.emit(block)
	}
	return nil
}

// levels returns the rows of the hour tables, with their histograms: those
// of the groups (merged from their minutes when counted), merged from the
// groups for the tenants and for each model and deployment, and from the
// latter for the total (a few rows rather than a thousand tenants'); and
// with their per-minute counts (summed the same way) and busiest minute.
// A tenant row gets only the HourDists rollup_tenant_hour keeps.
func (h *hourRollup) levels() map[string][]RollupRecord {
	out := map[string][]RollupRecord{}
	var merge sketch.Merger
	tenants := make([]string, 0, len(h.tenants))
	for t := range h.tenants {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	byTenant := make(map[string][]*hourGroup, len(h.tenants))
	groups := make([]RollupRecord, 0, len(h.order))
	for _, g := range h.order {
		if g.acc.Requests > 0 {
			setPeaks(&g.acc)
			byTenant[g.acc.Dims[0]] = append(byTenant[g.acc.Dims[0]], g)
			groups = append(groups, g.acc)
		}
	}
	if len(groups) > 0 {
		out["rollup_hour"] = groups
	}
	tenantDists := make([]bool, NumHourDists)
	for d, name := range HourDists {
		tenantDists[d] = slices.Contains(HourDistTables["rollup_tenant_hour"], name)
	}
	rows := make([]RollupRecord, 0, len(tenants))
	for _, t := range tenants {
		tr := h.tenants[t]
		for m := range LatencyMetrics {
			for _, g := range byTenant[t] {
				merge.Add(sketch.Histogram{Keys: g.acc.Keys[m], Counts: g.acc.Counts[m]})
			}
			th := merge.Take()
			tr.Keys[m], tr.Counts[m] = th.Keys, th.Counts
		}
		for d := range NumHourDists {
			if !tenantDists[d] {
				continue
			}
			for _, g := range byTenant[t] {
				merge.Add(sketch.Histogram{Keys: g.acc.HourKeys[d], Counts: g.acc.HourCounts[d]})
			}
			th := merge.Take()
			tr.HourKeys[d], tr.HourCounts[d] = th.Keys, th.Counts
		}
		if tr.Requests > 0 {
			setPeaks(tr)
			rows = append(rows, *tr)
		}
	}
	if len(rows) > 0 {
		out["rollup_tenant_hour"] = rows
	}
	deps := h.deploymentLevel(&merge)
	if len(deps) > 0 {
		out["rollup_deployment_hour"] = deps
	}
	if h.total.Requests > 0 {
		for m := range LatencyMetrics {
			for _, r := range deps {
				merge.Add(sketch.Histogram{Keys: r.Keys[m], Counts: r.Counts[m]})
			}
			th := merge.Take()
			h.total.Keys[m], h.total.Counts[m] = th.Keys, th.Counts
		}
		for d := range NumHourDists {
			for _, r := range deps {
				merge.Add(sketch.Histogram{Keys: r.HourKeys[d], Counts: r.HourCounts[d]})
			}
			th := merge.Take()
			h.total.HourKeys[d], h.total.HourCounts[d] = th.Keys, th.Counts
		}
		setPeaks(&h.total)
		out["rollup_total_hour"] = []RollupRecord{h.total}
	}
	for table, rows := range out {
		keepHourDists(table, rows)
	}
	return out
}

// keepHourDists empties the HourDists of rows that table does not keep
// (HourDistTables).
func keepHourDists(table string, rows []RollupRecord) {
	var drop []int
	for d, name := range HourDists {
		if !slices.Contains(HourDistTables[table], name) {
			drop = append(drop, d)
		}
	}
	for i := range rows {
		for _, d := range drop {
			rows[i].HourKeys[d], rows[i].HourCounts[d] = nil, nil
		}
	}
}

// deploymentLevel is the hour per model and deployment, every tenant
// together (the other dimensions left empty), in the table's key order
// (deployment, then model).
func (h *hourRollup) deploymentLevel(merge *sketch.Merger) []RollupRecord {
	type key struct{ deployment, model string }
	groups := map[key][]*hourGroup{}
	var keys []key
	for _, g := range h.order {
		if g.acc.Requests == 0 {
			continue
		}
		k := key{g.acc.Dims[3], g.acc.Dims[1]}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], g)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.deployment, b.deployment), cmp.Compare(a.model, b.model))
	})
	out := make([]RollupRecord, 0, len(keys))
	for _, k := range keys {
		r := RollupRecord{Bucket: h.hour, Dims: [6]string{1: k.model, 3: k.deployment}}
		for _, g := range groups[k] {
			addTotals(&r, &g.acc)
		}
		for m := range LatencyMetrics {
			for _, g := range groups[k] {
				merge.Add(sketch.Histogram{Keys: g.acc.Keys[m], Counts: g.acc.Counts[m]})
			}
			d := merge.Take()
			r.Keys[m], r.Counts[m] = d.Keys, d.Counts
		}
		for d := range NumHourDists {
			for _, g := range groups[k] {
				merge.Add(sketch.Histogram{Keys: g.acc.HourKeys[d], Counts: g.acc.HourCounts[d]})
			}
			dh := merge.Take()
			r.HourKeys[d], r.HourCounts[d] = dh.Keys, dh.Counts
		}
		setPeaks(&r)
		out = append(out, r)
	}
	return out
}

// rollupInserts is the number of INSERTs the minute rows of an hour are
// written with at once.
const rollupInserts = 2

// RollupHour recomputes the rollups of one UTC hour from its events (see
// the comment at the top of this file), in memory kept from the last hour
// r rolled up, counting goodput with spec and writing every row with
// version. It returns how long reading and
// aggregating the hour ("read") and writing each table took (for
// benchmarks): the minute rows are written while the hour is counted, by
// rollupInserts INSERTs at once, and the hour tables once it is counted, in
// one INSERT each (queries read an hour's newest version), at once.
func (r *Roller) RollupHour(ctx context.Context, store HourStore, hour time.Time, spec GoodputSpec, version uint64) (map[string]time.Duration, error) {
	return r.RollupHours(ctx, store, []time.Time{hour}, spec, version)
}

// maxPendingRows bounds the hour-table rows RollupHours holds before it
// writes them: hours are counted one after another and their rows written
// together once the hours end or the rows reach this many.
const maxPendingRows = 8192

// RollupHours recomputes the rollups of several UTC hours, one after
// another, as RollupHour does each, but writes each table for them
// together: the minute rows of every hour through rollupInserts INSERTs,
// and the hour tables in one INSERT each once the hours are counted (or
// once maxPendingRows rows are waiting, one table after another), every row with version. An INSERT
// costs ClickHouse a part of every column whatever its rows (about 70 ms of
// CPU for a rollup table on the development VM), so catching up weeks of
// quiet hours one INSERT per hour and table took 0.3 s an hour; queries
// read each hour's newest version, so one version for several hours is
// enough. Nothing of an hour table is written when reading an hour fails
// before its rows are due; the job then recomputes every hour.
func (r *Roller) RollupHours(ctx context.Context, store HourStore, hours []time.Time, spec GoodputSpec, version uint64) (map[string]time.Duration, error) {
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
	span := ""
	if len(hours) > 0 {
		span = hours[0].UTC().Truncate(time.Hour).Format(time.RFC3339)
		if len(hours) > 1 {
			span += fmt.Sprintf(" and %d more hours", len(hours)-1)
		}
	}
	fail := func(err error) error { return fmt.Errorf("roll up %s: %w", span, err) }
	g, gctx := errgroup.WithContext(ctx)
	blocks := make(chan []RollupRecord, rollupInserts)
	free := make(chan []RollupRecord, 2*rollupInserts)
	for range rollupInserts {
		g.Go(func() error {
			defer timed("rollup_minute_recent", start)
			if err := store.InsertRollupBlocks(gctx, "rollup_minute_recent", blocks, free, spec.Version, version); err != nil {
				return fail(err)
			}
			return nil
		})
	}
	emit := func(rows []RollupRecord) error {
		select {
		case blocks <- rows:
			return nil
		case <-gctx.Done():
			return gctx.Err()
		}
	}
	newRows := func() []RollupRecord {
		select {
		case rows := <-free:
			return rows
		default:
			return make([]RollupRecord, 0, RollupBlockRows)
		}
	}
	// write sends the hour tables' rows, one INSERT per table, at once.
	write := func(levels map[string][]RollupRecord) {
		for table, rows := range levels {
			g.Go(func() error {
				t0 := time.Now()
				defer timed(table, t0)
				if err := store.InsertRollupRecords(gctx, table, rows, spec.Version, version); err != nil {
					return fail(err)
				}
				return nil
			})
		}
	}
	g.Go(func() error {
		// On failure blocks stays open: the minute INSERTs end with the
		// context, unfinished, rather than writing part of the hours.
		slab := r.takeSlab()
		defer func() { r.keepSlab(slab) }()
		pending, rows := map[string][]RollupRecord{}, 0
		for _, hour := range hours {
			hour = hour.UTC().Truncate(time.Hour)
			agg := newHourRollup(hour, spec, emit, newRows)
			agg.slab = slab[:0]
			err := store.ReadHour(gctx, hour, func(g HourGroup) error {
				agg.addGroup(g.Hash, g.Dims, g.Rows)
				return nil
			}, agg.gather)
			if err == nil {
				err = agg.countAll()
			}
			slab = agg.slab
			if err != nil {
				return fmt.Errorf("roll up %s: %w", hour.Format(time.RFC3339), err)
			}
			for table, level := range agg.levels() {
				pending[table] = append(pending[table], level...)
				rows += len(level)
			}
			if rows >= maxPendingRows {
				// One table after another, while the next hours wait: the
				// connections held stay those of one hour's rollup.
				for table, level := range pending {
					t0 := time.Now()
					if err := store.InsertRollupRecords(gctx, table, level, spec.Version, version); err != nil {
						return fail(err)
					}
					timed(table, t0)
				}
				pending, rows = map[string][]RollupRecord{}, 0
			}
		}
		timed("read", start)
		close(blocks)
		write(pending)
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return took, nil
}

// RollupHour recomputes the rollups of one UTC hour as Roller.RollupHour
// does, with memory of its own for the hour's events.
func RollupHour(ctx context.Context, store HourStore, hour time.Time, spec GoodputSpec, version uint64) (map[string]time.Duration, error) {
	var r Roller
	return r.RollupHour(ctx, store, hour, spec, version)
}
