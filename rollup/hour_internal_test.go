package rollup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"tokenmeter/rollup/sketch"
)

// TestHourRollupOrder checks the streaming aggregation: minute rows are
// finished as the events move on, the group's histogram is the sum of its
// minutes', and events that come out of (group, time) order are refused
// rather than counted into a second row for the same minute or group.
func TestHourRollupOrder(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	start := func() (*hourRollup, *[]RollupRecord) {
		var rows []RollupRecord
		h := newHourRollup(hour, GoodputSpec{}, func(b []RollupRecord) error {
			rows = append(rows, b...)
			return nil
		}, func() []RollupRecord { return nil })
		h.addGroup(1, [6]string{"acme", "m1"}, 0)
		h.addGroup(2, [6]string{"acme", "m2"}, 0)
		return h, &rows
	}
	ev := func(group uint64, sec int, ttft float64) *HourEvent {
		return &HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(sec), Group: group, Status: 1, Output: 3,
			Latency: [4]float64{ttft, math.NaN(), ttft * 2, math.NaN()}}
	}
	h, rows := start()
	// Gathered in any order, counted group by group in time order.
	for _, e := range []*HourEvent{ev(2, 70, 900), ev(1, 5, 7), ev(2, 20, 50), ev(2, 10, 50)} {
		if err := h.gather(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.countAll(); err != nil {
		t.Fatal(err)
	}
	if len(*rows) != 3 {
		t.Fatalf("%d minute rows, want 3", len(*rows))
	}
	first := (*rows)[1] // group 1 is counted first
	if (*rows)[0].Dims[1] != "m1" || (*rows)[2].Bucket != hour.Add(time.Minute) {
		t.Errorf("minute rows %+v: want m1's, then m2's in time order", *rows)
	}
	if first.Requests != 2 || first.Bucket != hour || first.Dims[1] != "m2" ||
		len(first.Keys[0]) != 1 || first.Keys[0][0] != sketch.Key(50) || first.Counts[0][0] != 2 {
		t.Errorf("first minute row %+v: want 2 requests of m2 at %s, TTFT histogram {%d: 2}", first, hour, sketch.Key(50))
	}
	levels := h.levels()
	if len(levels["rollup_hour"]) != 2 || len(levels["rollup_tenant_hour"]) != 1 || len(levels["rollup_total_hour"]) != 1 {
		t.Fatalf("levels: %d hour, %d tenant, %d total rows", len(levels["rollup_hour"]), len(levels["rollup_tenant_hour"]), len(levels["rollup_total_hour"]))
	}
	var m2 RollupRecord
	for _, r := range levels["rollup_hour"] {
		if r.Dims[1] == "m2" {
			m2 = r
		}
	}
	if m2.Requests != 3 || len(m2.Keys[0]) != 2 || m2.Counts[0][0]+m2.Counts[0][1] != 3 || m2.Count[1] != 0 {
		t.Errorf("m2 hour row %+v: want 3 requests over two TTFT keys, no ITL", m2)
	}
	if total := levels["rollup_total_hour"][0]; total.Requests != 4 || total.Output != 12 || total.Count[0] != 4 {
		t.Errorf("total row %+v: want 4 requests, 12 output tokens", total)
	}
	checkDeploymentLevel(t, levels)

	h, _ = start()
	if err := h.add(ev(2, 70, 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.add(ev(2, 10, 1)); !errors.Is(err, errOutOfOrder) {
		t.Errorf("an earlier minute after a later one: err = %v, want errOutOfOrder", err)
	}
	h, _ = start()
	var err error
	for _, e := range []*HourEvent{ev(2, 10, 1), ev(1, 10, 1), ev(2, 20, 1)} {
		if err = h.add(e); err != nil {
			break
		}
	}
	if !errors.Is(err, errOutOfOrder) {
		t.Errorf("a group coming back: err = %v, want errOutOfOrder", err)
	}
	if err := h.gather(ev(3, 10, 1)); !errors.Is(err, errUnknownGroup) {
		t.Errorf("an unlisted group: err = %v, want errUnknownGroup", err)
	}
	h, _ = start()
	for _, e := range []*HourEvent{ev(1, 10, 1), ev(1, 3600, 1)} {
		if err := h.gather(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.countAll(); err == nil || !strings.Contains(err.Error(), "outside the hour") {
		t.Errorf("an event of the next hour: err = %v, want it refused", err)
	}
}

// TestHourRollupPeaks checks the busiest minute of each level's rows: a
// tenant's is the busiest minute of the sum of its groups, not the largest
// of their own; the total's, of everything; and each row keeps its
// per-minute counts.
func TestHourRollupPeaks(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	h := newHourRollup(hour, GoodputSpec{}, func([]RollupRecord) error { return nil }, func() []RollupRecord { return nil })
	h.addGroup(1, [6]string{"acme", "m1"}, 0)
	h.addGroup(2, [6]string{"acme", "m2"}, 0)
	h.addGroup(3, [6]string{"globex", "m1"}, 0)
	add := func(group uint64, minute, n int, output uint64) {
		for i := range n {
			e := HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(minute*60+i), Group: group, Status: 1, Output: output,
				Latency: [4]float64{math.NaN(), math.NaN(), math.NaN(), math.NaN()}}
			if err := h.gather(&e); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(1, 3, 5, 100) // acme/m1: 5 requests and 500 tokens in minute 3
	add(1, 5, 4, 10)
	add(2, 7, 5, 10) // acme/m2: 5 requests in minute 7
	add(2, 5, 4, 10) // acme: 8 requests in minute 5
	add(3, 5, 3, 1)  // everything: 11 requests in minute 5
	add(3, 9, 6, 30)
	if err := h.countAll(); err != nil {
		t.Fatal(err)
	}
	type peak struct {
		Requests, Output uint64
		Minute5          uint64 // requests in minute 5
	}
	got := map[string]peak{}
	levels := h.levels()
	checkDeploymentLevel(t, levels)
	for table, rows := range levels {
		if table == "rollup_deployment_hour" {
			continue // checked against the hour rows
		}
		for _, r := range rows {
			if len(r.MinuteRequests) != MinutesPerHour || len(r.MinuteOutput) != MinutesPerHour {
				t.Fatalf("%s %v: %d and %d minutes, want %d", table, r.Dims, len(r.MinuteRequests), len(r.MinuteOutput), MinutesPerHour)
			}
			got[table+" "+strings.Join(r.Dims[:2], "/")] = peak{r.PeakRequests, r.PeakOutput, r.MinuteRequests[5]}
		}
	}
	want := map[string]peak{
		"rollup_hour acme/m1":        {5, 500, 4},
		"rollup_hour acme/m2":        {5, 50, 4},
		"rollup_hour globex/m1":      {6, 180, 3},
		"rollup_tenant_hour acme/":   {8, 500, 8},
		"rollup_tenant_hour globex/": {6, 180, 3},
		"rollup_total_hour /":        {11, 500, 11},
	}
	if !maps.Equal(got, want) {
		t.Errorf("busiest minutes:\n got %v\nwant %v", got, want)
	}
}

// TestRollupHourFailures checks RollupHour's concurrency: minute rows
// stream to several INSERTs in blocks while the hour is counted; any
// failure (reading, a minute INSERT, an hour INSERT) is returned, nothing
// waits forever, and a failed read lands no minute rows.
func TestRollupHourFailures(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	boom := errors.New("boom")
	// 500 groups × 60 minutes: 30,000 minute rows, two blocks.
	for _, tc := range []struct {
		name  string
		store *fakeHourStore
		err   error
	}{
		{"ok", &fakeHourStore{groups: 500, perGroup: 60}, nil},
		{"read fails", &fakeHourStore{groups: 500, perGroup: 60, readErr: boom}, boom},
		{"minute insert fails", &fakeHourStore{groups: 500, perGroup: 60, minuteErr: boom}, boom},
		{"hour insert fails", &fakeHourStore{groups: 500, perGroup: 60, hourErr: boom}, boom},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		took, err := RollupHour(ctx, tc.store, hour, GoodputSpec{}, 1)
		cancel()
		if !errors.Is(err, tc.err) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
			continue
		}
		if len(tc.store.ended) != rollupInserts {
			t.Errorf("%s: %d minute INSERTs ended, want %d", tc.name, len(tc.store.ended), rollupInserts)
		}
		switch tc.name {
		case "ok":
			want := map[string]int{"rollup_minute_recent": 30_000, "rollup_hour": 500, "rollup_tenant_hour": 7, "rollup_total_hour": 1, "rollup_deployment_hour": 1}
			if !maps.Equal(tc.store.landed, want) {
				t.Errorf("ok: rows landed %v, want %v", tc.store.landed, want)
			}
			if took["read"] <= 0 || took["rollup_minute_recent"] < took["read"] {
				t.Errorf("ok: timings %v", took)
			}
		case "read fails":
			if len(tc.store.landed) != 0 {
				t.Errorf("read fails: rows landed %v, want none", tc.store.landed)
			}
		case "minute insert fails":
			// The other minute INSERT must not finish with part of the
			// hour (the hour tables may land first: a retry replaces them).
			if n := tc.store.landed["rollup_minute_recent"]; n != 0 {
				t.Errorf("minute insert fails: %d minute rows landed, want none", n)
			}
		}
	}
}

// TestHourRollupKeyOrder checks that the minute rows and the hour rows go
// out in the order of the tables' key (tenant, bucket, then the other
// dimensions), whatever order the groups and events came in, with every
// event counted once.
func TestHourRollupKeyOrder(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	var rows []RollupRecord
	h := newHourRollup(hour, GoodputSpec{}, func(b []RollupRecord) error {
		rows = append(rows, b...)
		return nil
	}, func() []RollupRecord { return nil })
	rng := rand.New(rand.NewPCG(1, 2))
	const groups, events = 40, 3000
	for g := range groups {
		h.addGroup(uint64(g), [6]string{fmt.Sprintf("t%d", rng.IntN(5)), fmt.Sprintf("m%d", rng.IntN(3)), "", fmt.Sprintf("d%d", g)}, 0)
	}
	for range events {
		e := HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(rng.IntN(3600)), Group: uint64(rng.IntN(groups)), Status: 1,
			Latency: [4]float64{1 + rng.Float64(), math.NaN(), math.NaN(), math.NaN()}}
		if err := h.gather(&e); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.countAll(); err != nil {
		t.Fatal(err)
	}
	keyOrder := func(a, b RollupRecord) int {
		if c := cmp.Compare(a.Dims[0], b.Dims[0]); c != 0 {
			return c
		}
		if c := a.Bucket.Compare(b.Bucket); c != 0 {
			return c
		}
		return slices.Compare(a.Dims[1:], b.Dims[1:])
	}
	var n uint64
	for i, r := range rows {
		n += r.Requests
		if i > 0 && keyOrder(rows[i-1], r) >= 0 {
			t.Fatalf("minute row %d (%s %v) does not follow row %d (%s %v) in key order", i, r.Bucket, r.Dims, i-1, rows[i-1].Bucket, rows[i-1].Dims)
		}
	}
	if n != events {
		t.Errorf("minute rows count %d requests, want %d", n, events)
	}
	hourRows := h.levels()["rollup_hour"]
	if !slices.IsSortedFunc(hourRows, keyOrder) || len(hourRows) != groups {
		t.Errorf("%d hour rows, sorted: %v; want %d in key order", len(hourRows), slices.IsSortedFunc(hourRows, keyOrder), groups)
	}
}

// BenchmarkHourRollup times meterd's share of an hour's rollup, without
// ClickHouse: gathering 1M events of 8,000 groups (1,000 tenants × 4
// models × 2 classes, the shape of `meterbench hour`), counting them into
// minute rows (handed on in blocks, as to the INSERTs) and building the
// hour levels.
func BenchmarkHourRollup(b *testing.B) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	const tenants, perTenant, events = 1000, 8, 1_000_000
	rng := rand.New(rand.NewPCG(3, 4))
	evs := make([]HourEvent, events)
	for i := range evs {
		ttft := math.Exp(4.5 + (rng.Float64()-0.5)*3)
		itl := 10 + rng.Float64()*50
		out := uint64(1 + rng.IntN(800))
		evs[i] = HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(i*3600/events), Group: uint64(rng.IntN(tenants * perTenant)),
			Status: 1, Prompt: uint64(50 + rng.IntN(4000)), Output: out,
			Latency: [4]float64{ttft, itl, ttft + itl*float64(out-1), math.NaN()}}
	}
	spec := DefaultSLOSet().Spec(1)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var free [][]RollupRecord
		rows := 0
		h := newHourRollup(hour, spec, func(block []RollupRecord) error {
			rows += len(block)
			free = append(free, block)
			return nil
		}, func() []RollupRecord {
			if n := len(free); n > 0 {
				block := free[n-1]
				free = free[:n-1]
				return block
			}
			return make([]RollupRecord, 0, RollupBlockRows)
		})
		for g := range tenants * perTenant {
			h.addGroup(uint64(g), [6]string{fmt.Sprintf("tenant-%d", g/perTenant), []string{"llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen2.5-72b"}[g%4],
				"v1", "dep", "H100-SXM-80GB", []string{"interactive", "batch"}[g/4%2]}, events/(tenants*perTenant))
		}
		for i := range evs {
			if err := h.gather(&evs[i]); err != nil {
				b.Fatal(err)
			}
		}
		if err := h.countAll(); err != nil {
			b.Fatal(err)
		}
		if levels := h.levels(); rows == 0 || len(levels["rollup_hour"]) != tenants*perTenant {
			b.Fatalf("%d minute rows, %d hour rows", rows, len(levels["rollup_hour"]))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/events, "ns/event")
}

// TestEventSlab checks the events' memory kept from hour to hour: groups
// get their rows' room in one slab, a group with more events than it was
// counted with (inserted since) leaves its neighbours alone, and the slab
// is kept for the next hour only within bounds.
func TestEventSlab(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	h := newHourRollup(hour, GoodputSpec{}, func([]RollupRecord) error { return nil }, func() []RollupRecord { return nil })
	h.slab = make([]HourEvent, 0, 3) // kept from an hour with fewer events
	h.addGroup(1, [6]string{"acme", "m1"}, 2)
	h.addGroup(2, [6]string{"acme", "m2"}, 2)
	gather := func(groups ...uint64) {
		t.Helper()
		for i, g := range groups {
			e := HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(i), Group: g, Status: 1, Output: g,
				Latency: [4]float64{math.NaN(), math.NaN(), math.NaN(), math.NaN()}}
			if err := h.gather(&e); err != nil {
				t.Fatal(err)
			}
		}
	}
	gather(1, 2)
	if cap(h.slab) < 4 {
		t.Fatalf("slab: cap %d, want room for the 4 events listed", cap(h.slab))
	}
	slab := h.slab
	// Group 1 gets more events than it was listed with, and group 3 is
	// listed late, when the slab has no room left.
	h.addGroup(3, [6]string{"acme", "m3"}, 2)
	gather(1, 2, 1, 3)
	for hash, want := range map[uint64]int{1: 3, 2: 2, 3: 1} {
		g := h.groups[hash]
		if len(g.events) != want {
			t.Errorf("group %d: %d events, want %d", hash, len(g.events), want)
		}
		for _, e := range g.events {
			if e.Group != hash {
				t.Errorf("group %d holds an event of group %d", hash, e.Group)
			}
		}
	}
	if &h.slab[0] != &slab[0] || len(h.slab) != 4 {
		t.Errorf("slab moved or grew to %d events", len(h.slab))
	}

	var r, other Roller
	r.keepSlab(make([]HourEvent, 0, 100))
	r.keepSlab(make([]HourEvent, 0, 50)) // smaller: the larger stays
	if s := other.takeSlab(); s != nil {
		t.Errorf("another roller's slab: cap %d, want none", cap(s))
	}
	if s := r.takeSlab(); cap(s) != 100 || len(s) != 0 {
		t.Errorf("kept slab: len %d cap %d, want 0, 100", len(s), cap(s))
	}
	if s := r.takeSlab(); s != nil {
		t.Errorf("slab taken twice: cap %d, want none", cap(s))
	}
	r.keepSlab(make([]HourEvent, 0, keptEvents+1))
	if s := r.takeSlab(); cap(s) != 0 {
		t.Errorf("slab over keptEvents: cap %d kept, want none", cap(s))
	}
}

// TestRollerKeepsSlab checks that a roller keeps the memory of the last
// hour's events for the next.
func TestRollerKeepsSlab(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	var r Roller
	if _, err := r.RollupHour(context.Background(), &fakeHourStore{groups: 50, perGroup: 60}, hour, GoodputSpec{}, 1); err != nil {
		t.Fatal(err)
	}
	if got := cap(r.events); got < 50*60 {
		t.Errorf("kept slab: cap %d, want room for the hour's %d events", got, 50*60)
	}
}

// fakeHourStore serves an hour of events from memory and fails where told,
// as the real store does: a minute INSERT lands only when its blocks
// channel is closed, and gives up when the context ends.
type fakeHourStore struct {
	groups, perGroup int
	readErr          error // returned by ReadHour after its events
	minuteErr        error // returned by the first minute INSERT to get a block
	hourErr          error // returned by the rollup_hour INSERT

	mu     sync.Mutex
	failed bool           // minuteErr was returned
	landed map[string]int // rows per table of INSERTs that finished
	ended  []error        // how each minute INSERT ended
}

func (f *fakeHourStore) ReadHour(ctx context.Context, hour time.Time, group func(HourGroup) error, event func(*HourEvent) error) error {
	for g := range f.groups {
		if err := group(HourGroup{Hash: uint64(g), Dims: [6]string{fmt.Sprintf("t%d", g%7), "m"}, Rows: uint64(f.perGroup)}); err != nil {
			return err
		}
	}
	for i := range f.perGroup {
		for g := range f.groups {
			e := HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(i*3600/f.perGroup), Group: uint64(g), Status: 1,
				Output: 1, Latency: [4]float64{float64(10 + i), math.NaN(), float64(100 + i), math.NaN()}}
			if err := event(&e); err != nil {
				return err
			}
		}
	}
	return f.readErr
}

func (f *fakeHourStore) InsertRollupRecords(ctx context.Context, table string, rows []RollupRecord, _ uint32, _ uint64) error {
	if table == "rollup_hour" && f.hourErr != nil {
		return f.hourErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.land(table, len(rows))
	return nil
}

func (f *fakeHourStore) InsertRollupBlocks(ctx context.Context, table string, blocks <-chan []RollupRecord, free chan<- []RollupRecord, _ uint32, _ uint64) (err error) {
	defer func() {
		f.mu.Lock()
		f.ended = append(f.ended, err)
		f.mu.Unlock()
	}()
	n := 0
	for {
		select {
		case rows, ok := <-blocks:
			if !ok {
				if n > 0 {
					f.land(table, n)
				}
				return nil
			}
			f.mu.Lock()
			fail := f.minuteErr != nil && !f.failed
			f.failed = f.failed || fail
			f.mu.Unlock()
			if fail {
				return f.minuteErr
			}
			n += len(rows)
			select {
			case free <- rows:
			default:
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *fakeHourStore) land(table string, rows int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.landed == nil {
		f.landed = map[string]int{}
	}
	f.landed[table] += rows
}

// checkDeploymentLevel compares the per-model-and-deployment rows with the
// hour rows summed by brute force: counters, minutes, busiest minute and
// histograms.
func checkDeploymentLevel(t *testing.T, levels map[string][]RollupRecord) {
	t.Helper()
	want := map[[2]string]*RollupRecord{}
	hist := map[[2]string]map[int]map[int16]uint64{}
	for _, r := range levels["rollup_hour"] {
		k := [2]string{r.Dims[3], r.Dims[1]}
		w := want[k]
		if w == nil {
			w = &RollupRecord{Bucket: r.Bucket, Dims: [6]string{1: r.Dims[1], 3: r.Dims[3]}, MinuteRequests: make([]uint64, MinutesPerHour), MinuteOutput: make([]uint64, MinutesPerHour)}
			want[k], hist[k] = w, map[int]map[int16]uint64{}
		}
		w.Requests += r.Requests
		w.Output += r.Output
		w.Good += r.Good
		for m := range MinutesPerHour {
			w.MinuteRequests[m] += r.MinuteRequests[m]
			w.MinuteOutput[m] += r.MinuteOutput[m]
		}
		for m := range LatencyMetrics {
			if hist[k][m] == nil {
				hist[k][m] = map[int16]uint64{}
			}
			for i, key := range r.Keys[m] {
				hist[k][m][key] += r.Counts[m][i]
			}
		}
	}
	got := levels["rollup_deployment_hour"]
	if len(got) != len(want) {
		t.Fatalf("%d deployment rows, want %d", len(got), len(want))
	}
	for i, r := range got {
		k := [2]string{r.Dims[3], r.Dims[1]}
		w := want[k]
		if i > 0 && (got[i-1].Dims[3] > r.Dims[3] || got[i-1].Dims[3] == r.Dims[3] && got[i-1].Dims[1] >= r.Dims[1]) {
			t.Errorf("deployment rows out of (deployment, model) order at %d", i)
		}
		if w == nil || r.Dims != w.Dims || r.Requests != w.Requests || r.Output != w.Output || r.Good != w.Good ||
			!slices.Equal(r.MinuteRequests, w.MinuteRequests) || !slices.Equal(r.MinuteOutput, w.MinuteOutput) ||
			r.PeakRequests != slices.Max(w.MinuteRequests) || r.PeakOutput != slices.Max(w.MinuteOutput) {
			t.Errorf("deployment row %v: %+v, want %+v", k, r, w)
			continue
		}
		for m := range LatencyMetrics {
			h := map[int16]uint64{}
			for j, key := range r.Keys[m] {
				if j > 0 && r.Keys[m][j-1] >= key {
					t.Errorf("deployment row %v: %s keys not ascending", k, LatencyMetrics[m])
				}
				h[key] = r.Counts[m][j]
			}
			if !maps.Equal(h, hist[k][m]) {
				t.Errorf("deployment row %v: %s histogram %v, want %v", k, LatencyMetrics[m], h, hist[k][m])
			}
		}
	}
}
