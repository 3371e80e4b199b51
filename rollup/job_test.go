package rollup_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"
	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestMain(m *testing.M) { chtest.Main(m) }

var h0 = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)

var (
	tenants = []string{"acme", "globex", "initech"}
	models  = []string{"llama-70b", "mixtral"}
	classes = []string{"interactive", "batch", ""}
)

// genEvent spreads events over three hours with varied latencies and statuses.
func genEvent(i int, at time.Time) *meterv1.InferenceEvent {
	ev := &meterv1.InferenceEvent{
		EventId: fmt.Sprintf("e%d", i), TenantId: tenants[i%3], Model: models[i%2], Deployment: "d" + models[i%2],
		SloClass: classes[i%3], CompletedAt: timestamppb.New(at),
	}
	if i%13 == 0 {
		ev.Status = meterv1.Status_STATUS_TIMEOUT
		return ev
	}
	out := int64(i%40 + 1)
	ttft := float64(50 + (i*37)%1000)
	itl := float64(5 + (i*11)%400)
	ev.PromptTokens, ev.OutputTokens = proto.Int64(int64(100+i%900)), proto.Int64(out)
	ev.TtftMs = proto.Float64(ttft)
	ev.E2EMs = proto.Float64(ttft + itl*float64(out-1))
	if i%4 == 0 && out > 1 {
		// Measured ITL on some; a single output token (i%40 == 0) has
		// none, so an ITL threshold does not apply to it.
		ev.ItlMs = proto.Float64(itl)
	}
	return ev
}

type fixture struct {
	store *chstore.Store
	job   *rollup.Job
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	store := chstoretest.OpenMigrated(t)
	return &fixture{store: store, job: newJob(t, store)}
}

func newJob(t *testing.T, store *chstore.Store) *rollup.Job {
	t.Helper()
	j, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, store, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (f *fixture) insert(t *testing.T, events []*meterv1.InferenceEvent) {
	t.Helper()
	var b chstore.EventBatch
	for _, ev := range events {
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{})
	}
	if err := f.store.InsertEvents(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	// dirty_hours is stamped with whole seconds: let this second pass so that
	// a run now sees these inserts and the next inserts get a later stamp.
	time.Sleep(1100 * time.Millisecond)
}

// expectation is the brute-force rollup per tenant.
type expectation struct {
	Requests, Errors, Output, Good, GoodOutput uint64
}

func brute(events []*meterv1.InferenceEvent, set rollup.SLOSet) map[string]expectation {
	seen := map[string]bool{}
	out := map[string]expectation{}
	for _, ev := range events {
		k := ev.GetTenantId() + "/" + ev.GetEventId()
		if seen[k] {
			continue
		}
		seen[k] = true
		e := out[ev.GetTenantId()]
		e.Requests++
		e.Output += uint64(ev.GetOutputTokens())
		ok := ev.GetStatus() == meterv1.Status_STATUS_UNSPECIFIED || ev.GetStatus() == meterv1.Status_STATUS_OK
		if !ok {
			e.Errors++
		}
		good := ok
		if r, found := set.Resolve(ev.GetTenantId(), ev.GetModel(), ev.GetSloClass()); found && ok {
			itl := ingest.ITL(ev)
			good = (r.TTFTMs <= 0 || ev.GetTtftMs() <= r.TTFTMs) &&
				(r.ITLMs <= 0 || !itl.Measured && !itl.Valid || itl.Ms <= r.ITLMs) &&
				(r.E2EMs <= 0 || ev.GetE2EMs() <= r.E2EMs)
		}
		if good {
			e.Good++
			e.GoodOutput += uint64(ev.GetOutputTokens())
		}
		out[ev.GetTenantId()] = e
	}
	return out
}

func (f *fixture) totals(t *testing.T) (map[string]expectation, []query.RollupRow) {
	t.Helper()
	rows, err := query.New(f.store, query.Config{}).Rollups(context.Background(), query.RollupQuery{Start: h0.Add(-24 * time.Hour), End: h0.Add(48 * time.Hour), Step: "hour", GroupBy: []string{"tenant_id"}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]expectation{}
	for _, r := range rows {
		e := out[r.Group["tenant_id"]]
		e.Requests += r.Requests
		e.Errors += r.Errors
		e.Output += r.OutputTokens
		e.Good += r.GoodRequests
		e.GoodOutput += r.GoodOutputTokens
		out[r.Group["tenant_id"]] = e
	}
	// The same range read at total step comes from the day rollups, which
	// the job keeps fresh for every day that has ended.
	stale, err := rollup.StaleDays(context.Background(), f.store, time.Time{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Errorf("days left without a fresh day rollup: %v", stale)
	}
	total, err := query.New(f.store, query.Config{}).Rollups(context.Background(), query.RollupQuery{Start: h0.Add(-24 * time.Hour), End: h0.Add(48 * time.Hour), GroupBy: []string{"tenant_id"}})
	if err != nil {
		t.Fatal(err)
	}
	byDays := map[string]expectation{}
	for _, r := range total {
		byDays[r.Group["tenant_id"]] = expectation{r.Requests, r.Errors, r.OutputTokens, r.GoodRequests, r.GoodOutputTokens}
	}
	if diff := cmp.Diff(out, byDays); diff != "" {
		t.Errorf("totals from the day rollups differ from the hours' (-hours +days):\n%s", diff)
	}
	return out, rows
}

func hoursOf(ts ...time.Time) []time.Time { return ts }

func TestLateEventsRecomputeExactlyTheirHour(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var events []*meterv1.InferenceEvent
	for i := range 3000 {
		events = append(events, genEvent(i, h0.Add(time.Duration(i)*3600*time.Millisecond))) // 3 hours
	}
	f.insert(t, events)
	hours, err := f.job.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(hoursOf(h0, h0.Add(time.Hour), h0.Add(2*time.Hour)), hours); diff != "" {
		t.Fatalf("first run hours (-want +got):\n%s", diff)
	}
	set := rollup.DefaultSLOSet()
	got, before := f.totals(t)
	if diff := cmp.Diff(brute(events, set), got); diff != "" {
		t.Fatalf("rollup totals (-want +got):\n%s", diff)
	}

	// Re-running changes nothing and recomputes nothing.
	hours, err = f.job.RunOnce(ctx)
	if err != nil || len(hours) != 0 {
		t.Fatalf("second run: hours %v, err %v; want none", hours, err)
	}

	// Late events (hours late, for hour 1 only) and duplicates of hour-1 events.
	var late []*meterv1.InferenceEvent
	for i := 3000; i < 3200; i++ {
		late = append(late, genEvent(i, h0.Add(time.Hour+time.Duration(i-3000)*time.Second)))
	}
	late = append(late, events[1000:1100]...) // hour 1 duplicates
	f.insert(t, late)
	all := append(append([]*meterv1.InferenceEvent{}, events...), late...)
	// Before the job runs again, usage reads hour 1 from raw events and the
	// others from rollups: exact all the same.
	f.checkUsage(t, all)
	hours, err = f.job.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(hoursOf(h0.Add(time.Hour)), hours); diff != "" {
		t.Fatalf("late run hours (-want +got):\n%s", diff)
	}
	f.checkUsage(t, all)
	got, after := f.totals(t)
	if diff := cmp.Diff(brute(all, set), got); diff != "" {
		t.Fatalf("totals after late events (-want +got):\n%s", diff)
	}
	// Hours 0 and 2 are untouched.
	keep := func(rows []query.RollupRow) []query.RollupRow {
		var out []query.RollupRow
		for _, r := range rows {
			if !r.Start.Equal(h0.Add(time.Hour)) {
				out = append(out, r)
			}
		}
		return out
	}
	if diff := cmp.Diff(keep(before), keep(after)); diff != "" {
		t.Errorf("hours without late events changed (-before +after):\n%s", diff)
	}
}

func TestGoodputMultiThresholdAndSLOChange(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var events []*meterv1.InferenceEvent
	for i := range 4000 {
		events = append(events, genEvent(i, h0.Add(time.Duration(i)*2700*time.Millisecond)))
	}
	f.insert(t, events)
	set := rollup.SLOSet{DefaultClass: "interactive", Rules: []rollup.Rule{
		{SLOClass: "interactive", TTFTMs: 600, ITLMs: 200},
		{SLOClass: "batch", E2EMs: 9000},
		{TenantID: "acme", SLOClass: "interactive", TTFTMs: 300, ITLMs: 150, E2EMs: 8000},
		{Model: "mixtral", SLOClass: "interactive", TTFTMs: 900},
		{TenantID: "globex", Model: "mixtral", ITLMs: 100},
	}}
	v1, err := rollup.EnsureSLO(ctx, f.store, set, "test")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := rollup.EnsureSLO(ctx, f.store, set, "test"); err != nil || again != v1 {
		t.Fatalf("same set again: version %d (err %v), want %d", again, err, v1)
	}
	if _, err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := f.totals(t)
	if diff := cmp.Diff(brute(events, set), got); diff != "" {
		t.Fatalf("goodput (-want +got):\n%s", diff)
	}
	// The scenario is only a test if the SLOs reject a fair share.
	for tenant, e := range got {
		if ok := e.Requests - e.Errors; e.Good == 0 || e.Good == ok {
			t.Errorf("%s: %d of %d OK requests good; the scenario should reject some and keep some", tenant, e.Good, ok)
		}
	}

	// A stricter SLO set: every hour is recomputed with the new version.
	set.Rules[0].TTFTMs = 200
	v2, err := rollup.EnsureSLO(ctx, f.store, set, "test")
	if err != nil || v2 != v1+1 {
		t.Fatalf("new set: version %d (err %v), want %d", v2, err, v1+1)
	}
	hours, err := f.job.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hours) != 3 {
		t.Errorf("SLO change recomputed %d hours, want 3", len(hours))
	}
	got, rows := f.totals(t)
	if diff := cmp.Diff(brute(events, set), got); diff != "" {
		t.Fatalf("goodput after SLO change (-want +got):\n%s", diff)
	}
	for _, r := range rows {
		if r.MinSLO != v2 || r.MaxSLO != v2 {
			t.Errorf("row %v counted with SLO %d..%d, want %d", r.Start, r.MinSLO, r.MaxSLO, v2)
		}
	}
}

func TestTwoReplicasSameTotals(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := newJob(t, f.store)
	var events []*meterv1.InferenceEvent
	for i := range 3000 {
		events = append(events, genEvent(i, h0.Add(time.Duration(i)*3600*time.Millisecond)))
	}
	f.insert(t, events[:1500])
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for _, j := range []*rollup.Job{f.job, other} {
		wg.Add(1)
		go func(j *rollup.Job) {
			defer wg.Done()
			for range 3 {
				if _, err := j.RunOnce(ctx); err != nil {
					errs <- err
				}
			}
		}(j)
	}
	wg.Wait()
	f.insert(t, events[1500:])
	for _, j := range []*rollup.Job{other, f.job} {
		if _, err := j.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, _ := f.totals(t)
	if diff := cmp.Diff(brute(events, rollup.DefaultSLOSet()), got); diff != "" {
		t.Fatalf("totals with two replicas (-want +got):\n%s", diff)
	}
}

// checkUsage compares usage per tenant and hour with a brute-force count.
func (f *fixture) checkUsage(t *testing.T, events []*meterv1.InferenceEvent) {
	t.Helper()
	type key struct {
		hour   int64
		tenant string
	}
	want := map[key]int64{}
	seen := map[string]bool{}
	for _, ev := range events {
		if seen[ev.GetTenantId()+"/"+ev.GetEventId()] {
			continue
		}
		seen[ev.GetTenantId()+"/"+ev.GetEventId()] = true
		want[key{ev.GetCompletedAt().AsTime().Truncate(time.Hour).Unix(), ev.GetTenantId()}] += ev.GetOutputTokens() + 1_000_000
	}
	rows, err := query.New(f.store, query.Config{}).Usage(context.Background(), query.UsageQuery{Start: h0.Add(-time.Hour), End: h0.Add(5 * time.Hour), Granularity: "hour", GroupBy: []string{"tenant_id"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[key]int64{}
	for _, r := range rows {
		got[key{r.Start.Unix(), r.TenantID}] = r.OutputTokens + 1_000_000*r.Requests
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}

// clockStore is the store with a server clock the test moves, counting
// watermark writes.
type clockStore struct {
	rollup.Store
	now  time.Time
	sets map[string]int // watermark writes per job
}

func (c *clockStore) ServerNow(context.Context) (time.Time, error) { return c.now, nil }

func (c *clockStore) SetWatermark(ctx context.Context, job string, t time.Time) error {
	if c.sets == nil {
		c.sets = map[string]int{}
	}
	c.sets[job]++
	return c.Store.SetWatermark(ctx, job, t)
}

// An idle job writes its watermarks (the rollups' and the engine
// rollups') at most once a minute each, not every run.
func TestIdleRunsWriteWatermarkOncePerMinute(t *testing.T) {
	f := newFixture(t)
	cs := &clockStore{Store: f.store, now: time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)}
	j, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, cs, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, tt := range []struct {
		advance  time.Duration
		wantSets int
	}{
		{0, 1},                // first run: no watermark yet
		{10 * time.Second, 1}, // idle, written 10 s ago
		{40 * time.Second, 1}, // idle, 50 s ago
		{20 * time.Second, 2}, // idle, 70 s ago: written
		{10 * time.Second, 2},
	} {
		cs.now = cs.now.Add(tt.advance)
		if _, err := j.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		for _, job := range []string{rollup.JobName, rollup.EngineJobName} {
			if cs.sets[job] != tt.wantSets {
				t.Errorf("run %d: %d writes of the %s watermark, want %d", i, cs.sets[job], job, tt.wantSets)
			}
		}
	}
}

// peaklessStore writes the hour tables as they were before the hour rows
// kept their busiest minute (chstore migration 0009).
type peaklessStore struct{ *chstore.Store }

func (p peaklessStore) InsertRollupRecords(ctx context.Context, table string, rows []rollup.RollupRecord, sloVersion uint32, version uint64) error {
	old := append([]rollup.RollupRecord(nil), rows...)
	for i := range old {
		old[i].MinuteRequests, old[i].MinuteOutput, old[i].PeakRequests, old[i].PeakOutput = nil, nil, 0, 0
	}
	return p.Store.InsertRollupRecords(ctx, table, old, sloVersion, version)
}

// TestJobRecomputesHoursWithoutPeaks checks the upgrade to hour rows with
// a busiest minute: a job started over hours rolled up before recomputes
// them, the newest rollup.PeakHoursPerRun per run, with nothing else to do, and
// then none.
func TestJobRecomputesHoursWithoutPeaks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const n = rollup.PeakHoursPerRun + 2
	var events []*meterv1.InferenceEvent
	var hours []time.Time
	for i := range 10 * n { // ten events an hour
		events = append(events, genEvent(i, h0.Add(time.Duration(i)*6*time.Minute)))
		if i%10 == 0 {
			hours = append(hours, h0.Add(time.Duration(i/10)*time.Hour))
		}
	}
	f.insert(t, events)
	if _, err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	version := uint64(time.Now().UnixMilli()) << rollup.VersionReplicaBits
	for _, h := range hours {
		if _, err := rollup.RollupHour(ctx, peaklessStore{f.store}, h, rollup.DefaultSLOSet().Spec(0), version); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Millisecond) // the next job's versions are later
	peakless, err := f.store.HoursWithoutPeaks(ctx, time.Time{}, time.Now())
	if err != nil || !cmp.Equal(peakless, hours) {
		t.Fatalf("hours without peaks: %v, %v; want %v", peakless, err, hours)
	}

	job := newJob(t, f.store) // a restart after the upgrade
	for i, want := range [][]time.Time{hours[2:], hours[:2], nil} {
		got, err := job.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("run %d: hours recomputed (-want +got):\n%s", i+1, diff)
		}
	}
	if peakless, err := f.store.HoursWithoutPeaks(ctx, time.Time{}, time.Now()); err != nil || len(peakless) != 0 {
		t.Errorf("hours without peaks after the runs: %v, %v; want none", peakless, err)
	}
	got, _ := f.totals(t)
	if diff := cmp.Diff(brute(events, rollup.DefaultSLOSet()), got); diff != "" {
		t.Errorf("rollup totals (-want +got):\n%s", diff)
	}
}
