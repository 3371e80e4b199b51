package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/billing"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/logsetup"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// runQueries is `meterbench queries`: it loads synthetic events straight into
// ClickHouse (generated server-side), rolls them up, and times the API's
// queries against the same questions asked of the raw rows.
func runQueries(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench queries", flag.ContinueOnError)
	fs.SetOutput(stderr)
	events := fs.Int("events", 100_000_000, "events to load")
	days := fs.Int("days", 30, "days the events span")
	tenants := fs.Int("tenants", 1000, "tenants")
	gpus := fs.Int("gpus", 200, "GPUs sampled every 10 s over the same days (4 deployments)")
	replicas := fs.Int("engine-replicas", 32, "engine replicas sampled every 15 s over the same days (4 deployments; the dashboard's engine panels)")
	reps := fs.Int("reps", 50, "repetitions of each rollup-backed query")
	rawReps := fs.Int("raw-reps", 3, "repetitions of each raw baseline query")
	reuse := fs.String("reuse", "", "time the queries only, on the ClickHouse directory of an earlier run (a copy: `cp -al` of its clickhouse folder while it runs), loaded the same day")
	keep := fs.String("keep", "", "load into a new ClickHouse directory DIR and keep it, for later runs with --reuse DIR")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed queries to this file")
	match := fs.String("match", "", "time only the queries whose description matches this regular expression")
	dashReps := fs.Int("dashboard-reps", 10, "loads of the dashboard's first page in headless Chromium (0: none)")
	dashTrace := fs.Bool("dashboard-trace", false, "print the API calls of the dashboard's last load of each view, with their times")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keep != "" && *reuse != "" {
		return errors.New("--keep and --reuse exclude each other")
	}
	only, err := regexp.Compile(*match)
	if err != nil {
		return fmt.Errorf("--match: %w", err)
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "meterbench: "+format+"\n", a...) }
	logger := logsetup.Warnings(stderr)
	chDir := *reuse
	if *keep != "" {
		if err := newFolder("keep", *keep); err != nil {
			return err
		}
		chDir = *keep
	}
	bch, err := startClickHouse(ctx, logger, chDir, "bench_q", clickhouse.Options{
		ReadTimeout: 30 * time.Minute, Settings: clickhouse.Settings{"max_execution_time": 3600}})
	if err != nil {
		return err
	}
	defer bch.close()
	store, conn := bch.store, bch.conn

	end := time.Now().UTC().Truncate(24 * time.Hour)
	start := end.Add(-time.Duration(*days) * 24 * time.Hour)
	fmt.Fprintf(stdout, "tokenmeter query benchmark — %d events over %d days, %d tenants\n\n", *events, *days, *tenants)

	if *reuse == "" {
		if err := loadAndRollUp(ctx, stdout, progress, logger, conn, store, *events, *tenants, *gpus, *replicas, start, end); err != nil {
			return err
		}
	} else {
		// A folder kept by older code may lack rollups added since (day
		// rollups): one run of the job brings it up to date.
		job, err := rollup.NewJob(rollup.Config{}, store, prometheus.NewRegistry(), logger, time.Now)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := job.RunOnce(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "rollup job run on the reused folder                  %8.1f s\n\n", time.Since(t0).Seconds())
	}

	// The API, in process, over loopback gRPC.
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "finance", SHA256: api.HashKey("finance"), Role: api.RoleFinance},
		{Name: "tenant", SHA256: api.HashKey("tenant"), Role: api.RoleTenant, TenantID: "tenant-7"},
	}})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reads := query.New(store, query.Config{MinuteRetention: rollup.DefaultMinuteRetention})
	srv, err := api.New(sctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		&api.Services{Keys: keys, Usage: reads, Rollups: reads, Cost: reads, Prices: store, Reports: reads, Engine: reads}, store.Ping, prometheus.NewRegistry(), logger)
	if err != nil {
		return err
	}
	go srv.Run(sctx)
	gc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return err
	}
	defer gc.Close()
	usage := meterv1.NewUsageServiceClient(gc)
	metrics := meterv1.NewMetricsServiceClient(gc)
	cost := meterv1.NewCostServiceClient(gc)
	reports := meterv1.NewReportServiceClient(gc)
	key := func(k string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+k)
	}
	ts := timestamppb.New
	report := func(what string, n int, fn func() error) error {
		if n <= 0 {
			return nil // --reps 0 or --raw-reps 0: load and storage report only
		}
		d, err := timeIt(n, fn)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		fmt.Fprintf(stdout, "%-68s p50 %7.1f ms  p90 %7.1f ms  p99 %7.1f ms  (n=%d)\n", what, ms(d[len(d)/2]), ms(d[len(d)*9/10]), ms(d[len(d)*99/100]), n)
		return nil
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	steps := []struct {
		what string
		n    int
		fn   func() error
	}{
		{"GetUsage, one tenant, 30 days, hour step (tenant key)", *reps, func() error {
			_, err := usage.GetUsage(key("tenant"), &meterv1.GetUsageRequest{Start: ts(start), End: ts(end), Granularity: "hour"})
			return err
		}},
		{"GetLatency, one tenant, 30 days, hour step (tenant key)", *reps, func() error {
			_, err := metrics.GetLatency(key("tenant"), &meterv1.GetLatencyRequest{Selector: &meterv1.SeriesSelector{Start: ts(start), End: ts(end), Step: "hour"}})
			return err
		}},
		{"GetUsage, all tenants, 30 days, hour step (finance)", *reps, func() error {
			_, err := usage.GetUsage(key("finance"), &meterv1.GetUsageRequest{Start: ts(start), End: ts(end), Granularity: "hour"})
			return err
		}},
		{"GetLatency, all tenants, 30 days, hour step (finance)", *reps, func() error {
			_, err := metrics.GetLatency(key("finance"), &meterv1.GetLatencyRequest{Selector: &meterv1.SeriesSelector{Start: ts(start), End: ts(end), Step: "hour"}})
			return err
		}},
		{"GetUsage, all tenants, 30 days, total by tenant (finance, 1000 rows)", *reps, func() error {
			_, err := usage.GetUsage(key("finance"), &meterv1.GetUsageRequest{Start: ts(start), End: ts(end), GroupBy: []string{"tenant_id"}})
			return err
		}},
		{"GetLatency, all tenants, 30 days, total by tenant (finance, 1000 series)", *reps, func() error {
			_, err := metrics.GetLatency(key("finance"), &meterv1.GetLatencyRequest{Selector: &meterv1.SeriesSelector{Start: ts(start), End: ts(end), GroupBy: []string{"tenant_id"}, PageSize: 1000}})
			return err
		}},
		{"GetCost, one tenant, 30 days, day step (tenant key)", *reps, func() error {
			_, err := cost.GetCost(key("tenant"), &meterv1.GetCostRequest{Start: ts(start), End: ts(end), Step: "day"})
			return err
		}},
		{"GetCost, one tenant, 30 days, hour step, shared idle (tenant key)", *reps, func() error {
			_, err := cost.GetCost(key("tenant"), &meterv1.GetCostRequest{Start: ts(start), End: ts(end), Step: "hour", IdlePolicy: "shared_weighted"})
			return err
		}},
		{"GetCost, all tenants, 30 days, total by tenant (finance, 1001 series)", *reps, func() error {
			_, err := cost.GetCost(key("finance"), &meterv1.GetCostRequest{Start: ts(start), End: ts(end), GroupBy: []string{"tenant_id"}, PageSize: 1000})
			return err
		}},
		{"GetCost, all tenants, 30 days, day step by deployment (finance)", *reps, func() error {
			_, err := cost.GetCost(key("finance"), &meterv1.GetCostRequest{Start: ts(start), End: ts(end), Step: "day", GroupBy: []string{"deployment"}})
			return err
		}},
		{"GetGpuUsage, 30 days, hour step by deployment (finance)", *reps, func() error {
			_, err := cost.GetGpuUsage(key("finance"), &meterv1.GetGpuUsageRequest{Start: ts(start), End: ts(end), Step: "hour", GroupBy: []string{"deployment"}})
			return err
		}},
		{"GetCapacityReport, all deployments, 30 days, growth 1.3 (finance)", *reps, func() error {
			_, err := reports.GetCapacityReport(key("finance"), &meterv1.GetCapacityReportRequest{Start: ts(start), End: ts(end), Growth: "1.3"})
			return err
		}},
		{"GetCapacityReport, by model, 30 days (finance)", *reps, func() error {
			_, err := reports.GetCapacityReport(key("finance"), &meterv1.GetCapacityReportRequest{Start: ts(start), End: ts(end), GroupBy: "model"})
			return err
		}},
	}
	for _, s := range steps {
		if !only.MatchString(s.what) {
			continue
		}
		// One untimed call first: the first query of a table after a
		// server start loads its marks and reads from disk.
		if s.n > 2 {
			if err := s.fn(); err != nil {
				return fmt.Errorf("%s: %w", s.what, err)
			}
		}
		if err := report(s.what, s.n, s.fn); err != nil {
			return err
		}
	}
	for _, view := range []struct{ what, fragment string }{
		{"dashboard first page (metrics, last 24 h, finance key), every API call drawn", "tab=metrics&range=24h"},
		{"dashboard metrics, 30 days (finance key), every API call drawn", "tab=metrics&range=30d"},
		{"dashboard capacity tab, 30 days (finance key), every API call drawn", "tab=capacity&range=30d"},
	} {
		if *dashReps <= 0 || !only.MatchString(view.what) {
			continue
		}
		var trace io.Writer
		if *dashTrace {
			trace = stdout
		}
		d, err := dashboardTimes(ctx, srv.HTTPAddr(), "finance", view.fragment, *dashReps, trace)
		if err != nil {
			return fmt.Errorf("%s: %w", view.what, err)
		}
		slices.Sort(d)
		fmt.Fprintf(stdout, "%-68s p50 %7.1f ms  p90 %7.1f ms  p99 %7.1f ms  (n=%d)\n", view.what, ms(d[len(d)/2]), ms(d[len(d)*9/10]), ms(d[len(d)*99/100]), len(d))
	}
	if *reuse != "" {
		return nil // the raw baselines do not change with the code
	}
	fmt.Fprintln(stdout, "\nbaseline: the same questions on raw rows in ClickHouse (deduplicated, exact quantiles)")
	// Deduplicating 100M events holds every (tenant, event) at once: without
	// spilling to disk, the all-tenant exact latency ran ClickHouse out of
	// the development machine's 24 GiB.
	rawCtx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"max_bytes_before_external_group_by": 4_000_000_000, "max_memory_usage": 16_000_000_000}))
	for _, b := range []struct{ what, sql string }{
		{"usage, one tenant, 30 days, hour step", rawUsageSQL("tenant-7", start, end)},
		{"latency (quantilesExact of TTFT/ITL/E2E), one tenant, hour step", rawLatencySQL("tenant-7", start, end)},
		{"usage, all tenants, 30 days, hour step", rawUsageSQL("", start, end)},
		{"latency (quantilesExact), all tenants, hour step", rawLatencySQL("", start, end)},
	} {
		if err := report("raw: "+b.what, *rawReps, func() error { return drain(rawCtx, conn, b.sql) }); err != nil {
			return err
		}
	}
	return nil
}

func loadSQL(off, n, total, tenants int, start time.Time, span time.Duration) string {
	return fmt.Sprintf(`INSERT INTO inference_events (tenant_id, event_id, model, model_version, deployment, engine, gpu_type,
  slo_class, completed_at, completed_at_ms, prompt_tokens, cached_prompt_tokens, output_tokens, ttft_ms, itl_ms, e2e_ms,
  itl_measured, status, streaming, ingested_at)
SELECT tenant_id, concat('e', toString(n)), model, 'v1', concat(model, '-h100'), 'vllm', 'H100-SXM-80GB',
  if(intHash32(n + 3) %% 5 = 0, 'batch', 'interactive'), toDateTime(intDiv(ms, 1000)), ms,
  prompt, intDiv(prompt * (intHash32(n + 5) %% 4), 4), output,
  if(ok, ttft, NULL), if(ok, itl, NULL), if(ok, ttft + itl * (output - 1), NULL), 1,
  if(ok, 'ok', 'timeout'), 1, now()
FROM (
  SELECT number + %[1]d AS n,
    concat('tenant-', toString(intHash32(n) %% %[4]d)) AS tenant_id,
    arrayElement(['llama-3.1-8b', 'llama-3.1-70b', 'mixtral-8x7b', 'qwen2.5-72b'], intHash32(n + 1) %% 4 + 1) AS model,
    toInt64(%[5]d) + intDiv(toInt64(n) * %[6]d, %[3]d) AS ms,
    intHash32(n + 2) %% 100 >= 3 AS ok,
    toUInt64(50 + intHash32(n + 4) %% 4000) AS prompt,
    toUInt64(1 + intHash32(n + 6) %% 800) AS output,
    exp(4.5 + (intHash32(n + 7) %% 10000 / 10000 - 0.5) * 3) AS ttft,
    10 + intHash32(n + 8) %% 1000 / 20 AS itl
  FROM numbers(%[2]d)
)`, off, n, total, tenants, start.UnixMilli(), span.Milliseconds())
}

// benchPrices prices the bench's H100s, with a price change in mid-period.
const benchPrices = `{"currency":"USD","gpu_prices":[
  {"gpu_type":"H100-SXM-80GB","effective_from":"2020-01-01T00:00:00Z","per_hour":"4.10"},
  {"gpu_type":"H100-SXM-80GB","pool":"reserved","effective_from":"2020-01-01T00:00:00Z","per_hour":"2.45"}]}`

// gpuLoadSQL generates n GPU samples of gpus H100s every 10 s from start:
// a quarter of them per model deployment of loadSQL, a fifth reserved, with
// utilization following a daily cycle.
func gpuLoadSQL(off, n, gpus int, start time.Time) string {
	return fmt.Sprintf(`INSERT INTO gpu_samples (sample_id, node, gpu_uuid, gpu_index, gpu_type, mig_profile, mig_instance_id,
  mig_fraction, deployment, pod, namespace, region, pool, sampled_at, sampled_at_ms, interval_s, utilization,
  fb_used_bytes, fb_total_bytes, power_watts, energy_joules, temperature_c, sm_clock_mhz, source, ingested_at)
SELECT concat(uuid, '/', toString(t)), concat('node-', toString(intDiv(g, 8))), uuid, g %% 8, 'H100-SXM-80GB', '', 0,
  1, dep, '', '', 'us-east-1', if(g %% 5 = 0, 'reserved', 'on-demand'), toDateTime(t), t * 1000, 10, util,
  60000000000, 85899345920, 200 + 500 * util, (200 + 500 * util) * 10, 60, 1980, 'bench', now()
FROM (
  SELECT number + %[1]d AS k, k %% %[3]d AS g, concat('GPU-', toString(g)) AS uuid,
    toUInt32(%[4]d + intDiv(k, %[3]d) * 10) AS t,
    arrayElement(['llama-3.1-8b-h100', 'llama-3.1-70b-h100', 'mixtral-8x7b-h100', 'qwen2.5-72b-h100'], g %% 4 + 1) AS dep,
    least(1, greatest(0, 0.55 + 0.35 * sin(t / 13751) + (intHash32(k) %% 100) / 500)) AS util
  FROM numbers(%[2]d)
)`, off, n, gpus, start.Unix())
}

// engineLoadSQL generates n engine samples from the off-th: replicas
// vLLM replicas over the GPUs' four deployments, one sample every 15 s,
// their queue, batch and KV cache following the GPUs' daily wave.
func engineLoadSQL(off, n, replicas int, start time.Time) string {
	return fmt.Sprintf(`INSERT INTO engine_samples (sample_id, deployment, engine, replica, model, node, sampled_at, sampled_at_ms,
  interval_s, running, waiting, kv_cache_usage, prefix_cache_queries, prefix_cache_hits, prefix_cache_hit_rate, preemptions,
  batch_tokens, source, ingested_at)
SELECT concat(rep, '/', toString(t)), dep, 'vllm', rep, 'm', concat('node-', toString(r)), toDateTime(t), t * 1000,
  15, toUInt32(load * 48), toUInt32(greatest(0, load - 0.7) * 40), least(1, 0.2 + 0.75 * load), toUInt64(4000),
  toUInt64(4000 * (0.3 + 0.4 * (1 - load))), NULL, toUInt64(if(load > 0.85 AND k %% 7 = 0, 1, 0)), 256 * load, 'bench', now()
FROM (
  SELECT number + %[1]d AS k, k %% %[3]d AS r, concat('replica-', toString(r)) AS rep,
    toUInt32(%[4]d + intDiv(k, %[3]d) * 15) AS t,
    arrayElement(['llama-3.1-8b-h100', 'llama-3.1-70b-h100', 'mixtral-8x7b-h100', 'qwen2.5-72b-h100'], r %% 4 + 1) AS dep,
    least(1, greatest(0, 0.55 + 0.35 * sin(t / 13751) + (intHash32(k) %% 100) / 500)) AS load
  FROM numbers(%[2]d)
)`, off, n, replicas, start.Unix())
}

func rawUsageSQL(tenant string, start, end time.Time) string {
	where := fmt.Sprintf("completed_at >= toDateTime(%d) AND completed_at < toDateTime(%d)", start.Unix(), end.Unix())
	if tenant != "" {
		where += fmt.Sprintf(" AND tenant_id = '%s'", tenant)
	}
	return fmt.Sprintf(`SELECT intDiv(toUInt32(t), 3600) AS h, count(), sum(p), sum(o) FROM (
  SELECT tenant_id, event_id, any(completed_at) AS t, any(prompt_tokens) AS p, any(output_tokens) AS o
  FROM inference_events WHERE %s GROUP BY tenant_id, event_id) GROUP BY h ORDER BY h`, where)
}

func rawLatencySQL(tenant string, start, end time.Time) string {
	where := fmt.Sprintf("completed_at >= toDateTime(%d) AND completed_at < toDateTime(%d)", start.Unix(), end.Unix())
	if tenant != "" {
		where += fmt.Sprintf(" AND tenant_id = '%s'", tenant)
	}
	return fmt.Sprintf(`SELECT intDiv(toUInt32(t), 3600) AS h, quantilesExact(0.5, 0.9, 0.95, 0.99)(ttft), quantilesExact(0.5, 0.9, 0.95, 0.99)(itl),
  quantilesExact(0.5, 0.9, 0.95, 0.99)(e2e) FROM (
  SELECT tenant_id, event_id, any(completed_at) AS t, any(ttft_ms) AS ttft, any(itl_ms) AS itl, any(e2e_ms) AS e2e
  FROM inference_events WHERE %s GROUP BY tenant_id, event_id) GROUP BY h ORDER BY h`, where)
}

func drain(ctx context.Context, conn driver.Conn, query string) error {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
	}
	return rows.Err()
}

// settleMerges waits until ClickHouse runs no merge (at most limit) and
// returns the active parts of the rollup tables.
func settleMerges(ctx context.Context, conn driver.Conn, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		var running uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.merges WHERE database = 'bench_q'").Scan(&running); err != nil {
			return "", err
		}
		if running == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	rows, err := conn.Query(ctx, `SELECT table, count() FROM system.parts WHERE active AND database = 'bench_q'
  AND table IN ('rollup_minute_recent', 'rollup_hour', 'rollup_tenant_hour', 'rollup_total_hour', 'cost_hour', 'gpu_hour') GROUP BY table ORDER BY table`)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var table string
		var n uint64
		if err := rows.Scan(&table, &n); err != nil {
			return "", err
		}
		out = append(out, fmt.Sprintf("%s %d", table, n))
	}
	return strings.Join(out, ", "), rows.Err()
}

func tableBytes(ctx context.Context, conn driver.Conn, table string) (uint64, error) {
	var b uint64
	err := conn.QueryRow(ctx, "SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = 'bench_q' AND table = ?", table).Scan(&b)
	return b, err
}

func timeIt(n int, fn func() error) ([]time.Duration, error) {
	var d []time.Duration
	for range n {
		t := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		d = append(d, time.Since(t))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
func mib(b uint64) float64       { return float64(b) / (1 << 20) }

// loadAndRollUp loads the synthetic events, GPU samples and engine samples
// (replicas 0: none), rolls them up, and reports the rollup timings and
// table sizes.
func loadAndRollUp(ctx context.Context, stdout io.Writer, progress func(string, ...any), logger *slog.Logger, conn driver.Conn,
	store *chstore.Store, events, tenants, gpus, replicas int, start, end time.Time) error {
	t0 := time.Now()
	const chunk = 10_000_000
	for off := 0; off < events; off += chunk {
		n := min(chunk, events-off)
		progress("loading events %d..%d", off, off+n)
		if err := conn.Exec(ctx, loadSQL(off, n, events, tenants, start, end.Sub(start))); err != nil {
			return fmt.Errorf("load events: %w", err)
		}
	}
	fmt.Fprintf(stdout, "load (INSERT … SELECT generated in ClickHouse)       %8.1f s  (%.0f rows/s)\n", time.Since(t0).Seconds(), float64(events)/time.Since(t0).Seconds())
	t0 = time.Now()
	samples := gpus * int(end.Sub(start)/(10*time.Second))
	for off := 0; off < samples; off += chunk {
		n := min(chunk, samples-off)
		progress("loading GPU samples %d..%d", off, off+n)
		if err := conn.Exec(ctx, gpuLoadSQL(off, n, gpus, start)); err != nil {
			return fmt.Errorf("load GPU samples: %w", err)
		}
	}
	fmt.Fprintf(stdout, "load of %d GPU samples (%d GPUs, 10 s)            %8.1f s\n", samples, gpus, time.Since(t0).Seconds())
	t0 = time.Now()
	samples = replicas * int(end.Sub(start)/(15*time.Second))
	for off := 0; off < samples; off += chunk {
		n := min(chunk, samples-off)
		progress("loading engine samples %d..%d", off, off+n)
		if err := conn.Exec(ctx, engineLoadSQL(off, n, replicas, start)); err != nil {
			return fmt.Errorf("load engine samples: %w", err)
		}
	}
	fmt.Fprintf(stdout, "load of %d engine samples (%d replicas, 15 s)     %8.1f s\n", samples, replicas, time.Since(t0).Seconds())
	book, err := billing.ParsePriceBook([]byte(benchPrices))
	if err != nil {
		return err
	}
	if _, _, err := billing.EnsurePriceBook(ctx, store, book, "meterbench", time.Now()); err != nil {
		return err
	}

	job, err := rollup.NewJob(rollup.Config{}, store, prometheus.NewRegistry(), logger, time.Now)
	if err != nil {
		return err
	}
	// Let the load's dirty-hour stamps fall behind the job's overlap, so that
	// the run after the first finds nothing left to do.
	time.Sleep(rollup.Overlap + 10*time.Second)
	progress("rolling up every hour")
	t0 = time.Now()
	hours, err := job.RunOnce(ctx)
	if err != nil {
		return err
	}
	el := time.Since(t0)
	fmt.Fprintf(stdout, "rollup of all %d hours                               %8.1f s  (%.2f s per hour of ~%d events)\n",
		len(hours), el.Seconds(), el.Seconds()/float64(len(hours)), events/max(1, len(hours)))
	if again, err := job.RunOnce(ctx); err != nil {
		return err
	} else if len(again) > 0 {
		progress("second run recomputed %d hours", len(again))
	}

	// Rolling up a month in minutes leaves ClickHouse a backlog of merges
	// that a month of hourly runs would have worked off long ago: the
	// queries are timed once it is done, as in steady state.
	t0 = time.Now()
	parts, err := settleMerges(ctx, conn, 15*time.Minute)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "background merges settled after                    %8.1f s  (active parts: %s)\n", time.Since(t0).Seconds(), parts)

	// One hour of 1M events, rolled up on its own.
	progress("rolling up one hour of 1,000,000 events")
	hourStart := end.Add(24 * time.Hour)
	if err := conn.Exec(ctx, loadSQL(0, 1_000_000, 1_000_000, tenants, hourStart, time.Hour)); err != nil {
		return err
	}
	if err := conn.Exec(ctx, gpuLoadSQL(0, gpus*360, gpus, hourStart)); err != nil {
		return err
	}
	t0 = time.Now()
	took, err := rollup.RollupHour(ctx, store, hourStart, rollup.DefaultSLOSet().Spec(0), uint64(time.Now().UnixMilli())<<16)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rollup of one hour of 1,000,000 events               %8.2f s  (target < 2 s; read and aggregate %.2f s, then inserts at once: minute %.2f s, hour %.2f s, tenant-hour %.2f s, total-hour %.2f s)\n",
		time.Since(t0).Seconds(), took["read"].Seconds(), took["rollup_minute_recent"].Seconds(), took["rollup_hour"].Seconds(), took["rollup_tenant_hour"].Seconds(), took["rollup_total_hour"].Seconds())
	t0 = time.Now()
	hourSamples, err := store.GPUSamplesOfHour(ctx, hourStart)
	if err != nil {
		return err
	}
	hourUsage, err := store.DeploymentUsage(ctx, hourStart)
	if err != nil {
		return err
	}
	serving, err := store.ServingOfHours(ctx, hourStart, hourStart.Add(time.Hour))
	if err != nil {
		return err
	}
	read := time.Since(t0)
	gpuRows, costRows, err := rollup.ComputeCost(hourStart, book, hourSamples, hourUsage)
	if err != nil {
		return err
	}
	rollup.LabelCost(costRows, serving)
	compute := time.Since(t0) - read
	costVersion := uint64(time.Now().UnixMilli()) << 16
	if err := store.WriteCost(ctx, gpuRows, costRows, costVersion); err != nil {
		return err
	}
	if err := store.WriteServing(ctx, rollup.ServingLabels(hourStart, serving), costVersion); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cost rollup of that hour (%d samples, %d usage rows)  %8.2f s  (read %.2f s, allocate %.2f s; target < 2 s)\n",
		len(hourSamples), len(hourUsage), time.Since(t0).Seconds(), read.Seconds(), compute.Seconds())

	return storageReport(ctx, stdout, conn, store)
}

// storageReport drops the minute rows outside the default retention window
// (as meterd's rollup job does once an hour), waits for merges, and prints
// the bytes on disk of every table of the benchmark's database, per event
// loaded.
func storageReport(ctx context.Context, stdout io.Writer, conn driver.Conn, store *chstore.Store) error {
	dropped, err := store.DropMinuteDays(ctx, time.Now().Add(-rollup.DefaultMinuteRetention))
	if err != nil {
		return err
	}
	if _, err := settleMerges(ctx, conn, 10*time.Minute); err != nil {
		return err
	}
	var events uint64
	if err := conn.QueryRow(ctx, "SELECT sum(rows) FROM system.parts WHERE active AND database = 'bench_q' AND table = 'inference_events'").Scan(&events); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT table, sum(bytes_on_disk) AS b, sum(rows) FROM system.parts
WHERE active AND database = 'bench_q' GROUP BY table ORDER BY b DESC`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintf(stdout, "\non disk, %d events, minute rows kept for %s (%d days dropped):\n", events, rollup.DefaultMinuteRetention, len(dropped))
	var total, gpu uint64
	for rows.Next() {
		var table string
		var b, n uint64
		if err := rows.Scan(&table, &b, &n); err != nil {
			return err
		}
		total += b
		if strings.HasPrefix(table, "gpu_") {
			gpu += b
		}
		fmt.Fprintf(stdout, "  %-24s %9.1f MiB %12d rows %7.2f bytes/event\n", table, mib(b), n, float64(b)/float64(events))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "  all tables               %9.1f MiB %20s %7.2f bytes/event (target <= 80); without the GPU sample tables %.2f\n",
		mib(total), "", float64(total)/float64(events), float64(total-gpu)/float64(events))
	if err := largestColumnsReport(ctx, stdout, conn, events); err != nil {
		return err
	}
	return costColumnsReport(ctx, stdout, conn, events)
}

// largestColumnsReport prints the compressed bytes per event of the 30
// largest columns over every table (system.columns, without marks): where
// the bytes of "all tables" are (docs/performance.md, "Storage in issue 34").
func largestColumnsReport(ctx context.Context, stdout io.Writer, conn driver.Conn, events uint64) error {
	rows, err := conn.Query(ctx, `SELECT table, name, type, data_compressed_bytes FROM system.columns
WHERE database = 'bench_q' ORDER BY data_compressed_bytes DESC LIMIT 30`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintf(stdout, "\nthe 30 largest columns (compressed, without marks):\n")
	for rows.Next() {
		var table, name, typ string
		var b uint64
		if err := rows.Scan(&table, &name, &typ, &b); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  %-46s %-22s %9.2f MiB %7.3f bytes/event\n", table+"."+name, typ, mib(b), float64(b)/float64(events))
	}
	return rows.Err()
}

// costColumnsReport prints the compressed bytes per event of cost_hour's
// columns, largest first: what each allocation, GPU time (migration 0026)
// and label column costs.
func costColumnsReport(ctx context.Context, stdout io.Writer, conn driver.Conn, events uint64) error {
	rows, err := conn.Query(ctx, `SELECT name, data_compressed_bytes FROM system.columns
WHERE database = 'bench_q' AND table = 'cost_hour' ORDER BY data_compressed_bytes DESC`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintf(stdout, "\ncost_hour per column (compressed, without marks):\n")
	var gpuMs uint64
	for rows.Next() {
		var name string
		var b uint64
		if err := rows.Scan(&name, &b); err != nil {
			return err
		}
		if strings.HasPrefix(name, "gpu_ms_") {
			gpuMs += b
		}
		fmt.Fprintf(stdout, "  %-36s %9.2f MiB %7.3f bytes/event\n", name, mib(b), float64(b)/float64(events))
	}
	fmt.Fprintf(stdout, "  the 12 gpu_ms_ columns together      %9.2f MiB %7.3f bytes/event\n", mib(gpuMs), float64(gpuMs)/float64(events))
	return rows.Err()
}
