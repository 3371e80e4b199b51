package query_test

import (
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/chcluster"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/query/capacity"
	"tokenmeter/rollup"
)

// The data of TestClusterAnswersSame: four hours from 22:00 UTC on day, so
// that the events span two UTC days and both have day rollups.
var (
	eqStart   = day.Add(22 * time.Hour)
	eqEnd     = eqStart.Add(4 * time.Hour)
	eqTenants = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark"}
	eqClasses = []string{"interactive", "batch", ""}
	// eqServing is what serves the events: model "m3" has no token price,
	// and deployment "d-orphan" has no GPU samples, so its usage is
	// unattributed in the cost rows.
	eqServing = []struct{ model, version, deployment, gpuType string }{
		{"m", "v1", "d-h100", "H100"},
		{"m", "v2", "d-h100", "H100"},
		{"m2", "v1", "d-a100", "A100"},
		{"m3", "v1", "d-h100", "H100"},
		{"m2", "v1", "d-orphan", "L4"},
	}
)

// eqBook prices the H100s (with a price change at 00:30 on the second day,
// inside an hour), the A100s and models "m" and "m2" (whose price changes
// at 01:00); the L40S of deployment "d-idle" and model "m3" are unpriced.
const eqBook = `{"currency":"USD",
 "gpu_prices":[
  {"gpu_type":"H100","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.60"},
  {"gpu_type":"H100","effective_from":"2026-11-21T00:30:00Z","per_hour":"3.00"},
  {"gpu_type":"A100","effective_from":"2026-01-01T00:00:00Z","per_hour":"1.80"}],
 "token_prices":[
  {"model":"m","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.60","cached_input_per_1m":"0.30","output_per_1m":"1.80"},
  {"model":"m2","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"2.00","cached_input_per_1m":"1.00","output_per_1m":"6.00"},
  {"model":"m2","effective_from":"2026-11-21T01:00:00Z","input_per_1m":"1.50","cached_input_per_1m":"0.75","output_per_1m":"4.50"}]}`

// eqPriceChanges are the price changes of eqBook inside the data's range.
var eqPriceChanges = []time.Time{
	time.Date(2026, 11, 21, 0, 30, 0, 0, time.UTC),
	time.Date(2026, 11, 21, 1, 0, 0, 0, time.UTC),
}

// eqSLO has rules per class, per tenant and per model, so that goodput
// differs between tenants and models.
var eqSLO = rollup.SLOSet{DefaultClass: "interactive", Rules: []rollup.Rule{
	{SLOClass: "interactive", TTFTMs: 600, ITLMs: 200},
	{SLOClass: "batch", E2EMs: 9000},
	{TenantID: "acme", SLOClass: "interactive", TTFTMs: 300, ITLMs: 150, E2EMs: 8000},
	{Model: "m2", SLOClass: "interactive", TTFTMs: 900},
}}

// eqEvent is event id, the i-th of its kind, completed at at: every tenant
// on every model and deployment, three SLO classes, a few error statuses
// (with and without tokens) and latencies spread over many histogram keys.
func eqEvent(id string, i int, at time.Time) *meterv1.InferenceEvent {
	sv := eqServing[i%len(eqServing)]
	ev := &meterv1.InferenceEvent{
		EventId: id, TenantId: eqTenants[i%len(eqTenants)], Model: sv.model, ModelVersion: sv.version,
		Deployment: sv.deployment, GpuType: sv.gpuType, SloClass: eqClasses[(i/7)%len(eqClasses)],
		CompletedAt: timestamppb.New(at),
	}
	// Serving labels: d-h100 moves from vllm (TP 2) to sglang (TP 4) 90
	// minutes in, within an hour; d-orphan reports none.
	switch {
	case sv.deployment == "d-h100" && at.Before(eqStart.Add(90*time.Minute)):
		ev.Engine, ev.TensorParallelism = "vllm", 2
	case sv.deployment == "d-h100":
		ev.Engine, ev.TensorParallelism = "sglang", 4
	case sv.deployment == "d-a100":
		ev.Engine, ev.TensorParallelism = "trt-llm", 1
	}
	switch {
	case i%13 == 0:
		ev.Status = meterv1.Status_STATUS_TIMEOUT
		return ev
	case i%17 == 0:
		ev.Status = meterv1.Status_STATUS_RATE_LIMITED
		return ev
	case i%29 == 0:
		// An error after the prompt was read: its tokens count.
		ev.Status = meterv1.Status_STATUS_OOM
		ev.PromptTokens = proto.Int64(int64(200 + i%300))
		return ev
	}
	out := int64(i%40 + 1)
	if i%5 == 2 {
		out = int64(300 + (i*7)%900) // medium and long answers
	}
	// Fractional milliseconds, as measured: their sums depend on the
	// order they are added in.
	ttft := 50 + float64((i*37)%1000) + float64(i%97)/97
	itl := 5 + float64((i*11)%400) + float64(i%89)/89
	ev.PromptTokens, ev.OutputTokens = proto.Int64(int64(100+(i*31)%900)), proto.Int64(out)
	if i%4 == 0 {
		ev.CachedPromptTokens = proto.Int64(ev.GetPromptTokens() / 3)
	}
	ev.TtftMs = proto.Float64(ttft)
	ev.E2EMs = proto.Float64(ttft + itl*float64(out-1))
	ev.QueueMs = proto.Float64(float64(i%50) / 3)
	if i%4 == 0 && out > 1 {
		ev.ItlMs = proto.Float64(itl)
	}
	if i%3 == 1 {
		ev.PrefillMs = proto.Float64(ttft / 2)
	}
	if i%11 == 5 {
		// OTLP --otlp-ttft-from-e2e: TTFT taken from E2E.
		ev.TtftMs = proto.Float64(ev.GetE2EMs())
		ev.Labels = map[string]string{"ttft_source": "e2e"}
	}
	return ev
}

// eqSamples are 10 s samples of one GPU (or MIG slice) of dep from
// eqStart+from (inclusive) to eqStart+to (exclusive), with a utilization
// that moves around util.
func eqSamples(dep, uuid, gpuType, pool, region string, mig uint32, frac, util float64, from, to time.Duration) []*meterv1.GpuSample {
	var out []*meterv1.GpuSample
	for at := from; at < to; at += 10 * time.Second {
		k := int(at / (10 * time.Second))
		s := &meterv1.GpuSample{
			SampleId: fmt.Sprintf("%s/%d/%d", uuid, mig, k), Node: "n-" + pool, GpuUuid: uuid, GpuType: gpuType,
			Deployment: dep, Pool: pool, Region: region, SampledAt: timestamppb.New(eqStart.Add(at)), IntervalS: 10,
			Utilization: util * float64(8+k%5) / 10, EnergyJoules: 3000 + float64(k%7)*10,
			MigInstanceId: mig, MigFraction: frac, Source: "test",
			// Telemetry (rollup.GPUTelemetry): memory, power, temperature,
			// clocks below and at the normal clock, SM activity on some.
			FbTotalBytes: 80 << 30, FbUsedBytes: uint64(40+k%37) << 30, PowerWatts: 300 + float64(k%13)*21.5,
			TemperatureC: 55 + float64(k%29), SmClockMhz: 1980 - float64(k%4)*300,
		}
		if frac > 0 && frac < 1 {
			s.MigProfile = "1g.10gb"
		}
		if k%3 == 0 {
			s.SmActive = proto.Float64(util * float64(k%10) / 10)
			s.SmClockMaxMhz = 1980
		}
		out = append(out, s)
	}
	return out
}

// eqStores is one single-node store and one cluster store, written the
// same way.
type eqStores struct {
	single, cluster *chstore.Store
	jobs            map[*chstore.Store]*rollup.Job
}

// both runs f on both stores at once, failing t if either fails.
func (e *eqStores) both(t *testing.T, what string, f func(s *chstore.Store) error) {
	t.Helper()
	var g errgroup.Group
	for _, s := range []*chstore.Store{e.single, e.cluster} {
		g.Go(func() error {
			if err := f(s); err != nil {
				where := "cluster"
				if s == e.single {
					where = "one node"
				}
				return fmt.Errorf("%s: %w", where, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// insert writes events, then GPU samples, to both stores through the
// store's insert paths, as ingest does.
func (e *eqStores) insert(t *testing.T, events []*meterv1.InferenceEvent, samples []*meterv1.GpuSample) {
	t.Helper()
	e.both(t, "insert", func(s *chstore.Store) error {
		if len(events) > 0 {
			var b chstore.EventBatch
			for _, ev := range events {
				b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{})
			}
			if err := s.InsertEvents(t.Context(), &b); err != nil {
				return err
			}
		}
		if len(samples) > 0 {
			var b chstore.GPUBatch
			for _, smp := range samples {
				b.Append(smp, time.Now())
			}
			return s.InsertGPUSamples(t.Context(), &b)
		}
		return nil
	})
}

// rollUp runs the rollup job once on both stores, after the second of the
// last inserts has passed: dirty_hours stamps whole seconds, and the job
// takes the inserts of seconds before its run.
func (e *eqStores) rollUp(t *testing.T) {
	t.Helper()
	time.Sleep(1100 * time.Millisecond)
	e.both(t, "rollup job", func(s *chstore.Store) error {
		hours, err := e.jobs[s].RunOnce(t.Context())
		if err == nil && len(hours) == 0 {
			err = fmt.Errorf("the run rolled up no hour")
		}
		return err
	})
}

// shardCounts counts the rows of a local table on the first replica of
// each shard of the cluster, in database db: the replica that the cluster's
// writes go to (load_balancing in_order), so the count needs no wait for
// replication.
func shardCounts(t *testing.T, c *chcluster.Cluster, db, table string) []uint64 {
	t.Helper()
	var out []uint64
	for shard := range c.Layout().Replicas {
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr(shard, 0)}, Auth: clickhouse.Auth{Database: db}})
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		err = conn.QueryRow(t.Context(), "SELECT count() FROM "+table).Scan(&n)
		conn.Close()
		if err != nil {
			t.Fatalf("count %s on shard %d: %v", table, shard+1, err)
		}
		out = append(out, n)
	}
	return out
}

// TestClusterAnswersSame writes the same events, duplicates, late events,
// GPU samples, price book and SLO set to a single-node store and to a store
// in cluster mode (two shards, the first with two replicas), runs the
// rollup job on both, and asks both every read of query.Service and the
// capacity report: each answer must be the same, and not empty.
func TestClusterAnswersSame(t *testing.T) {
	began := time.Now()
	ctx := t.Context()
	e := &eqStores{single: chstoretest.OpenSingle(t), cluster: chstoretest.OpenCluster(t), jobs: map[*chstore.Store]*rollup.Job{}}
	cl := chcluster.Shared(t)
	e.both(t, "migrate", func(s *chstore.Store) error { _, err := s.Migrate(ctx); return err })
	t.Logf("stores migrated: %v", time.Since(began).Round(time.Millisecond))
	book, err := billing.ParsePriceBook([]byte(eqBook))
	if err != nil {
		t.Fatal(err)
	}
	bookAt := time.Now()
	e.both(t, "price book and SLO set", func(s *chstore.Store) error {
		if _, _, err := billing.EnsurePriceBook(ctx, s, book, "test", bookAt); err != nil {
			return err
		}
		_, err := rollup.EnsureSLO(ctx, s, eqSLO, "test")
		return err
	})
	for _, s := range []*chstore.Store{e.single, e.cluster} {
		j, err := rollup.NewJob(rollup.Config{Settle: -time.Second, Overlap: time.Nanosecond}, s, prometheus.NewRegistry(),
			slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
		if err != nil {
			t.Fatal(err)
		}
		e.jobs[s] = j
	}

	// The first four hours: every event once, the first 100 twice in the
	// same insert and 100 more again in an insert of their own (another
	// part, so only FINAL or the dedup key collapses them).
	var events []*meterv1.InferenceEvent
	for i := range 2400 {
		events = append(events, eqEvent(fmt.Sprintf("e%d", i), i, eqStart.Add(time.Duration(i)*6*time.Second+time.Duration(i%1000)*time.Millisecond)))
	}
	var samples []*meterv1.GpuSample
	samples = append(samples, eqSamples("d-h100", "GPU-a", "H100", "p1", "eu", 0, 0, 0.6, 0, 4*time.Hour)...)
	samples = append(samples, eqSamples("d-h100", "GPU-b", "H100", "p1", "eu", 0, 0, 0.3, 0, 4*time.Hour)...)
	// MIG slices of an A100, sampled for the first three hours only: the
	// fourth comes late.
	samples = append(samples, eqSamples("d-a100", "GPU-c", "A100", "p1", "us", 1, 1.0/7, 0.8, 0, 3*time.Hour)...)
	samples = append(samples, eqSamples("d-a100", "GPU-c", "A100", "p1", "us", 2, 1.0/7, 0.5, 0, 3*time.Hour)...)
	// A deployment with GPUs of an unpriced type and no traffic.
	samples = append(samples, eqSamples("d-idle", "GPU-d", "L40S", "p2", "us", 0, 0, 0.05, 0, 4*time.Hour)...)
	e.insert(t, append(slices.Clone(events), events[:100]...), append(slices.Clone(samples), samples[:100]...))
	e.insert(t, events[1200:1300], samples[2000:2100])
	// Engine samples of the GPU deployments and of four more (so that both
	// shards hold some), every 30 s for four hours, each sent twice.
	engineSamples := eqEngineSamples([]string{"d-h100", "d-a100", "e-1", "e-2", "e-3", "e-4"}, 4*time.Hour)
	e.both(t, "insert engine samples", func(s *chstore.Store) error {
		var b chstore.EngineBatch
		for _, m := range append(slices.Clone(engineSamples), engineSamples[:500]...) {
			b.Append(m, time.Now())
		}
		return s.InsertEngineSamples(ctx, &b)
	})

	// Every tenant's events and rollups are on the shard cityHash64(tenant_id)
	// % 2 picks: both shards must hold some, or the cluster's merge of
	// shards is not tested. GPU rows go by deployment.
	db := e.cluster.Database()
	for _, table := range []string{"inference_events_local", "gpu_samples_local", "engine_samples_local"} {
		if n := shardCounts(t, cl, db, table); slices.Contains(n, 0) {
			t.Fatalf("%s: rows per shard %v: the data must land on every shard", table, n)
		}
	}
	e.rollUp(t)
	for _, table := range []string{"rollup_hour_local", "rollup_tenant_day_local", "cost_hour_local", "gpu_hour_local", "engine_hour_local", "engine_minute_local"} {
		if n := shardCounts(t, cl, db, table); slices.Contains(n, 0) {
			t.Fatalf("%s: rows per shard %v: the rollups must land on every shard", table, n)
		}
	}

	// Late events for an hour already rolled up (23:00 on the first day),
	// duplicates of events of that hour and of others, and the A100's late
	// fourth hour: the second run recomputes those hours.
	var late []*meterv1.InferenceEvent
	for i := range 300 {
		late = append(late, eqEvent(fmt.Sprintf("late%d", i), 5000+i, eqStart.Add(time.Hour+time.Duration(i)*11*time.Second)))
	}
	late = append(late, events[600:700]...)
	late = append(late, events[2000:2050]...)
	var lateSamples []*meterv1.GpuSample
	lateSamples = append(lateSamples, eqSamples("d-a100", "GPU-c", "A100", "p1", "us", 1, 1.0/7, 0.7, 3*time.Hour, 4*time.Hour)...)
	lateSamples = append(lateSamples, eqSamples("d-a100", "GPU-c", "A100", "p1", "us", 2, 1.0/7, 0.4, 3*time.Hour, 4*time.Hour)...)
	e.insert(t, late, lateSamples)
	e.rollUp(t)
	// The job keeps a fresh day rollup of every day that has ended, the
	// first day's included after its late hour was recomputed: reads at day
	// steps and more read day rows for both days.
	e.both(t, "fresh days", func(s *chstore.Store) error {
		fresh, err := rollup.FreshDays(ctx, s, day, day.Add(48*time.Hour))
		if err == nil && !slices.EqualFunc(fresh, []time.Time{day, day.Add(24 * time.Hour)}, time.Time.Equal) {
			err = fmt.Errorf("fresh days %v, want %v and %v", fresh, day, day.Add(24*time.Hour))
		}
		return err
	})

	// Events the job has not rolled up yet, and more duplicates: usage
	// reads the hours touched since the watermark (less rollup.Overlap, as
	// Usage does) from raw events, beside the rollups of the other hours.
	var fresh []*meterv1.InferenceEvent
	for i := range 60 {
		fresh = append(fresh, eqEvent(fmt.Sprintf("fresh%d", i), 7000+i, eqStart.Add(2*time.Hour+time.Duration(i)*30*time.Second)))
	}
	fresh = append(fresh, events[1300:1320]...)
	fresh = append(fresh, late[:10]...)
	e.insert(t, fresh, nil)
	e.both(t, "dirty hours", func(s *chstore.Store) error {
		wm, ok, err := s.Watermark(ctx, rollup.JobName)
		if err != nil || !ok {
			return fmt.Errorf("watermark %v, %v", ok, err)
		}
		dirty, err := s.DirtyHours(ctx, wm.Add(-rollup.Overlap), time.Unix(1<<32-1, 0))
		if err == nil && !slices.ContainsFunc(dirty, eqStart.Add(2*time.Hour).Equal) {
			err = fmt.Errorf("dirty hours %v lack %v: usage would not read the last events raw", dirty, eqStart.Add(2*time.Hour))
		}
		return err
	})
	t.Logf("data written and rolled up: %v", time.Since(began).Round(time.Millisecond))

	compareReads(t, e)
	t.Logf("total: %v", time.Since(began).Round(time.Millisecond))
}

// compareReads asks both stores every read and compares the answers.
func compareReads(t *testing.T, e *eqStores) {
	ctx := t.Context()
	one, two := query.New(e.single, query.Config{}), query.New(e.cluster, query.Config{})
	asked := 0
	// ask runs read on both services and compares the answers, which must
	// not be empty: two empty answers prove nothing.
	ask := func(what string, read func(s *query.Service) (any, int, error)) {
		t.Helper()
		asked++
		a, n, err := read(one)
		if err != nil {
			t.Errorf("%s on one node: %v", what, err)
			return
		}
		if n == 0 {
			t.Errorf("%s: empty answer on one node: the comparison proves nothing", what)
		}
		b, _, err := read(two)
		if err != nil {
			t.Errorf("%s on the cluster: %v", what, err)
			return
		}
		if diff := cmp.Diff(a, b, floatSums); diff != "" {
			t.Errorf("%s: the cluster answers differently (-one node +cluster):\n%s", what, diff)
		}
	}
	days := [2]time.Time{day, day.Add(48 * time.Hour)}
	whole := [2]time.Time{eqStart, eqEnd}

	// Usage: every granularity, every grouping, one tenant or all, ranges on
	// whole minutes (rollups and the raw hours beside them) and not (raw
	// events only).
	for _, q := range []query.UsageQuery{
		{Start: days[0], End: days[1]},
		{Start: days[0], End: days[1], Granularity: "day", GroupBy: []string{"tenant_id"}},
		{Start: days[0], End: days[1], Granularity: "month", GroupBy: []string{"model", "deployment"}},
		{Start: whole[0], End: whole[1], Granularity: "hour", GroupBy: []string{"tenant_id", "model", "deployment"}},
		{Start: whole[0], End: whole[1], Granularity: "hour", TenantID: "globex"},
		{Start: whole[0], End: whole[1], Granularity: "day", TenantID: "acme", GroupBy: []string{"model"}},
		{Start: eqStart.Add(90 * time.Minute), End: eqStart.Add(150 * time.Minute), Granularity: "minute", GroupBy: []string{"deployment"}},
		{Start: eqStart.Add(90*time.Second + 500*time.Millisecond), End: eqEnd.Add(-time.Second), Granularity: "hour", GroupBy: []string{"tenant_id"}},
	} {
		ask(fmt.Sprintf("Usage %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.Usage(ctx, q)
			return r, len(r), err
		})
	}

	// Rollups and Traffic: every step, groupings merged here (one tenant,
	// or no grouping) and by ClickHouse, pages, the counters or the
	// latencies alone, ranges on whole hours and not.
	rollupQueries := []query.RollupQuery{
		{Start: days[0], End: days[1]},
		{Start: days[0], End: days[1], GroupBy: []string{"tenant_id"}},
		{Start: days[0], End: days[1], Step: "day"},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"tenant_id"}},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"model", "deployment"}},
		{Start: days[0], End: days[1], Step: "month", GroupBy: []string{"slo_class"}},
		{Start: whole[0], End: whole[1], Step: "hour"},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"tenant_id"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"model", "model_version"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"deployment", "gpu_type", "slo_class"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"tenant_id", "model"}, Limit: 10, Offset: 7},
		{Start: whole[0], End: whole[1], Step: "hour", TenantID: "initech", GroupBy: []string{"model"}},
		{Start: days[0], End: days[1], Step: "day", TenantID: "umbrella"},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"model"}, Columns: query.CounterColumns},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"model"}, Columns: query.LatencyColumns},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"model"}, Columns: query.LatencyBreakdownColumns},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"slo_class"}, Columns: query.LatencyBreakdownColumns},
		// Decode from the tenant hour and day rows (decode_kept).
		{Start: whole[0], End: whole[1], Step: "hour", TenantID: "initech", Columns: query.LatencyBreakdownColumns},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"tenant_id"}, Columns: query.LatencyBreakdownColumns},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"tenant_id"}, Columns: query.SizeColumns},
		{Start: eqStart.Add(time.Hour), End: eqStart.Add(2 * time.Hour), Step: "minute", GroupBy: []string{"tenant_id"}},
		{Start: eqStart.Add(30 * time.Minute), End: eqStart.Add(150 * time.Minute), Step: "hour", GroupBy: []string{"model"}},
		{Start: eqStart.Add(30 * time.Minute), End: eqStart.Add(150 * time.Minute), TenantID: "hooli"},
	}
	for _, q := range rollupQueries {
		ask(fmt.Sprintf("Rollups %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.Rollups(ctx, q)
			return r, len(r), err
		})
		ask(fmt.Sprintf("Traffic %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.Traffic(ctx, q)
			return r, len(r), err
		})
	}

	// Exact latencies: ranges of at most a day.
	for _, q := range []query.RollupQuery{
		{Start: whole[0], End: whole[1]},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"tenant_id"}},
		{Start: whole[0], End: whole[1], Step: "day", GroupBy: []string{"model", "slo_class"}},
		{Start: eqStart.Add(time.Hour), End: eqStart.Add(time.Hour + 10*time.Minute), Step: "minute", TenantID: "stark"},
	} {
		ask(fmt.Sprintf("RawLatency %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.RawLatency(ctx, q)
			return r, len(r), err
		})
	}

	// Cost: every step and grouping, and every pair of policies.
	costQueries := []query.CostQuery{
		{Start: whole[0], End: whole[1], Step: "hour"},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"tenant_id", "model", "deployment", "gpu_type"}},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"deployment"}},
		{Start: days[0], End: days[1], Step: "month", GroupBy: []string{"model"}},
		{Start: whole[0], End: whole[1], Step: "hour", TenantID: "acme", GroupBy: []string{"deployment", "gpu_type"}},
		// The serving labels (an engine changed within an hour).
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"engine", "tensor_parallelism", "model_version"}},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"tenant_id", "deployment", "engine"}},
	}
	for _, busy := range billing.BusyPolicies() {
		for _, idle := range billing.IdlePolicies() {
			costQueries = append(costQueries, query.CostQuery{Start: days[0], End: days[1], GroupBy: []string{"tenant_id"}, Busy: string(busy), Idle: string(idle)})
		}
	}
	for _, q := range costQueries {
		ask(fmt.Sprintf("Cost %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.Cost(ctx, q)
			return r, len(r), err
		})
	}

	// GPU usage: every step and grouping, with and without the tokens
	// served.
	for _, q := range []query.GPUUsageQuery{
		{Start: days[0], End: days[1]},
		{Start: days[0], End: days[1], Step: "day", GroupBy: []string{"deployment"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"deployment", "gpu_type"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"deployment", "gpu_type"}, NoTokens: true},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"gpu_type"}},
		{Start: days[0], End: days[1], Step: "month", GroupBy: []string{"pool", "region", "mig_profile"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"deployment", "node", "gpu"}},
	} {
		ask(fmt.Sprintf("GPUUsage %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.GPUUsage(ctx, q)
			return r, len(r), err
		})
	}

	for _, r := range [][2]time.Time{whole, days} {
		ask(fmt.Sprintf("DeploymentHours %s to %s", r[0].Format(time.RFC3339), r[1].Format(time.RFC3339)), func(s *query.Service) (any, int, error) {
			rows, err := s.DeploymentHours(ctx, r[0], r[1])
			return rows, len(rows), err
		})
	}

	// The usage-and-cost export, by hour and by day, under two policies.
	for _, q := range []query.CostQuery{
		{Start: whole[0], End: whole[1], Step: "hour"},
		{Start: days[0], End: days[1], Step: "day", Busy: string(billing.BusyRequestTime), Idle: string(billing.IdleSharedEven)},
	} {
		ask(fmt.Sprintf("EachUsageCost %s", describe(q)), func(s *query.Service) (any, int, error) {
			var rows []query.UsageCostRow
			err := s.EachUsageCost(ctx, q, func(r *query.UsageCostRow) error {
				c := *r
				c.PriceVersions = slices.Clone(r.PriceVersions)
				rows = append(rows, c)
				return nil
			})
			return rows, len(rows), err
		})
	}

	// Statements: each tenant's usage from 22:30 (a part of an hour at
	// the start), cut at the price changes.
	for _, tenant := range eqTenants {
		ask(fmt.Sprintf("StatementUsage %s", tenant), func(s *query.Service) (any, int, error) {
			r, err := s.StatementUsage(ctx, tenant, eqStart.Add(30*time.Minute), eqEnd, eqPriceChanges)
			return r, len(r), err
		})
	}

	// The capacity report over both, by each unit and for one deployment,
	// and with the price book (the fleet plan's prices).
	book, err := billing.ParsePriceBook([]byte(eqBook))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []capacity.Query{
		{Start: days[0], End: days[1]},
		{Start: days[0], End: days[1], GroupBy: capacity.ByModel},
		{Start: whole[0], End: whole[1], GroupBy: capacity.ByGPUType, MinHourRequests: 10},
		{Start: whole[0], End: whole[1], Deployment: "d-h100", Growth: "1.3"},
		{Start: whole[0], End: whole[1], MinHourRequests: 1, Prices: book},
	} {
		ask(fmt.Sprintf("capacity.Build %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := capacity.Build(ctx, s, q)
			if err != nil {
				return nil, 0, err
			}
			return r, len(r.Units), nil
		})
	}
	// Engine stats: minute, hour, day and total steps, several groupings.
	for _, q := range []query.EngineQuery{
		{Start: whole[0], End: whole[1]},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"deployment"}},
		{Start: whole[0], End: whole[1], Step: "day", GroupBy: []string{"engine", "replica"}},
		{Start: eqStart, End: eqStart.Add(time.Hour), Step: "minute", GroupBy: []string{"deployment", "model"}},
		{Start: whole[0], End: whole[1], Step: "hour", GroupBy: []string{"replica"}, Deployments: []string{"e-1,e-3"}},
	} {
		ask(fmt.Sprintf("EngineStats %s", describe(q)), func(s *query.Service) (any, int, error) {
			r, err := s.EngineStats(ctx, q)
			return r, len(r), err
		})
	}
	t.Logf("%d reads compared", asked)
}

// eqEngineSamples makes engine samples of deployments (two replicas each)
// every 30 s over d from eqStart, some fields unset.
func eqEngineSamples(deployments []string, d time.Duration) []*meterv1.EngineSample {
	var out []*meterv1.EngineSample
	for i := 0; time.Duration(i)*30*time.Second < d; i++ {
		at := eqStart.Add(time.Duration(i)*30*time.Second + 15*time.Second)
		for k, dep := range deployments {
			for r := range 2 {
				s := &meterv1.EngineSample{SampleId: fmt.Sprintf("%s-%d-%d", dep, r, i), Deployment: dep, Engine: []string{"vllm", "sglang"}[k%2],
					Replica: fmt.Sprintf("%s-%d", dep, r), Model: "m-" + dep, SampledAt: timestamppb.New(at), IntervalS: 30, Source: "replay",
					Running: proto.Uint32(uint32((i + k) % 40)), Waiting: proto.Uint32(uint32((i*7 + r) % 13))}
				if i%3 > 0 {
					s.KvCacheUsage = proto.Float64(float64((i+r)%100) / 100)
				}
				if i > 0 { // a first scrape knows of no restart
					var restarted uint32
					if (i+r+k)%17 == 0 {
						restarted = 1
					}
					s.Restarts = &restarted
				}
				if k%2 == 0 {
					s.PrefixCacheQueries, s.PrefixCacheHits, s.Preemptions = proto.Uint64(uint64(100+i)), proto.Uint64(uint64(i%100)), proto.Uint64(uint64(i%2))
				} else {
					s.PrefixCacheHitRate = proto.Float64(float64(i%10) / 10)
				}
				out = append(out, s)
			}
		}
	}
	return out
}

// floatSums compares with a relative tolerance of 1e-12 the float64
// values that are sums of float columns, which ClickHouse adds up in an
// order that depends on where the rows lie: on the cluster each shard sums
// its own rows and the server asked adds the shards' sums, so the last bits
// may differ from one node's sum of the same rows (seen: the latency sums
// of a rollup read grouped by model, 3.3208306472836784e+06 on one node and
// 3.32083064728368e+06 on the cluster). They are the latency sums
// (query.Dist.Sum) of rollup reads, the GPU, busy, covered, instance and
// unpriced seconds and energy of GPU usage rows (sums of the gpu_hour rows'
// floats) and their telemetry sums, and the floats of the capacity report, which are computed from
// those. Everything else is compared exactly: tokens, requests, errors and
// money (integer nanos) are integers, and the exact latencies of
// RawLatency are the stored values themselves.
var floatSums = cmp.FilterPath(func(p cmp.Path) bool {
	if p.Last().Type().Kind() != reflect.Float64 {
		return false
	}
	if f, ok := p.Last().(cmp.StructField); ok {
		switch parent := p.Index(-2).Type(); {
		case parent == reflect.TypeFor[query.Dist]() && f.Name() == "Sum", parent == reflect.TypeFor[query.GPUUsageRow](),
			parent == reflect.TypeFor[rollup.EngineRow](), parent == reflect.TypeFor[rollup.GPUTelemetry]():
			return true
		}
	}
	return slices.ContainsFunc(p, func(s cmp.PathStep) bool { return s.Type() == reflect.TypeFor[capacity.Report]() })
}, cmpopts.EquateApprox(1e-12, 0))

// describe prints a query compactly: its non-zero fields, times in RFC 3339.
func describe(q any) string {
	v := reflect.ValueOf(q)
	var fields []string
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			continue
		}
		value := v.Field(i).Interface()
		if t, ok := value.(time.Time); ok {
			value = t.Format(time.RFC3339)
		}
		fields = append(fields, fmt.Sprintf("%s:%v", v.Type().Field(i).Name, value))
	}
	return "{" + strings.Join(fields, " ") + "}"
}
