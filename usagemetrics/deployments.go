package usagemetrics

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// The deployment view: per (deployment, model), what an SRE watching the
// fleet alerts on. Engine gauges (batch size, queue depth, KV cache) are
// the newest rolled-up minute of engine stats, GPU gauges the hour in
// progress of GPU usage, and the latency histograms and SLO counters
// (by slo_class) cumulative since the first event, as the pair view's.

// DefaultITLBuckets are the ITL histogram's bounds in seconds: vLLM's
// inter-token latency scale, with 0.25 s (the interactive SLO) a bound.
var DefaultITLBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2.5}

// EngineLookback is how far back from the read's minute the engine gauges
// look for a deployment's newest minute: a deployment whose engines sent
// nothing for that long has no engine gauges (Prometheus then marks them
// stale) rather than old values.
const EngineLookback = 5 * time.Minute

// depKey is a (deployment, model) series of the deployment view.
type depKey struct{ deployment, model string }

// depSeries is everything exposed for one (deployment, model).
type depSeries struct {
	// engine holds the rows of the newest minute (one row for an exposed
	// key, the newest minute of each key for the folded ones).
	engine []query.EngineRow
	// byClass holds the latency histograms and SLO counts per slo_class.
	byClass map[string]*classSeries
	size    int64
}

type classSeries struct {
	requests, good uint64
	ttft, itl      hist
}

func (s *depSeries) class(c string) *classSeries {
	if s.byClass == nil {
		s.byClass = map[string]*classSeries{}
	}
	cs := s.byClass[c]
	if cs == nil {
		cs = &classSeries{}
		s.byClass[c] = cs
	}
	return cs
}

func (s *depSeries) add(o *depSeries) {
	s.engine = append(s.engine, o.engine...)
	for c, oc := range o.byClass {
		cs := s.class(c)
		cs.requests += oc.requests
		cs.good += oc.good
		cs.ttft.add(oc.ttft)
		cs.itl.add(oc.itl)
	}
}

// gpuKey is a GPU (or MIG instance) of a deployment on a node.
type gpuKey struct{ deployment, node, gpu string }

// gpuSeries is the GPU usage of one GPU in its newest hour (the rows of
// the folded GPUs for the "__other__" key).
type gpuSeries struct{ rows []query.GPUUsageRow }

// depDescs are the deployment view's descriptions.
type depDescs struct {
	batch, queue, kvUsage, kvHit, ttft, itl, sloRequests, sloGood, folded, keys *prometheus.Desc
	gpuUtil, gpuMemUsed, gpuMemRatio, gpuTemp, gpuPower, gpuFolded              *prometheus.Desc
}

func newDepDescs() depDescs {
	dm := []string{"deployment", "model"}
	dmc := []string{"deployment", "model", "slo_class"}
	g := []string{"deployment", "node", "gpu"}
	hour := " of the GPU (or MIG instance) in the hour in progress (GetGpuUsage, hour step, group_by deployment, node, gpu)"
	return depDescs{
		batch: prometheus.NewDesc("llm_batch_size",
			"Running requests per engine replica (the batch it decodes), time-weighted mean over the newest rolled-up minute of engine stats (GetEngineStats running_mean).", dm, nil),
		queue: prometheus.NewDesc("llm_queue_depth",
			"Waiting requests per engine replica, time-weighted mean over the newest rolled-up minute of engine stats (GetEngineStats waiting_mean).", dm, nil),
		kvUsage: prometheus.NewDesc("llm_kv_cache_usage_ratio",
			"KV cache usage (0..1), time-weighted mean over the newest rolled-up minute of engine stats (GetEngineStats kv_cache_mean).", dm, nil),
		kvHit: prometheus.NewDesc("llm_kv_cache_hit_ratio",
			"Prefix-cache hit ratio (hits / queries, else the engines' hit-rate gauge) over the newest rolled-up minute of engine stats (GetEngineStats prefix_cache_hit_rate).", dm, nil),
		ttft: prometheus.NewDesc("llm_deployment_ttft_seconds",
			"Time to first token by deployment, model and SLO class, since the first event; buckets within 1% of the bounds.", dmc, nil),
		itl: prometheus.NewDesc("llm_itl_seconds",
			"Inter-token latency (mean time per output token after the first) by deployment, model and SLO class, since the first event; buckets within 1% of the bounds.", dmc, nil),
		sloRequests: prometheus.NewDesc("llm_slo_requests_total",
			"Requests counted for goodput (every finished request) by deployment, model and SLO class, since the first event.", dmc, nil),
		sloGood: prometheus.NewDesc("llm_slo_good_requests_total",
			"Requests that met their SLO (GetGoodput's good requests) by deployment, model and SLO class, since the first event.", dmc, nil),
		folded: prometheus.NewDesc("llm_usage_metrics_folded_deployments",
			"(deployment, model) keys added to the deployment=\"__other__\" model=\"__other__\" series by the cardinality cap.", nil, nil),
		keys: prometheus.NewDesc("llm_usage_metrics_deployments",
			"(deployment, model) keys with traffic or engine stats, folded ones included.", nil, nil),
		gpuUtil: prometheus.NewDesc("gpu_utilization",
			"GPU utilization (0..1): busy GPU-seconds / GPU-seconds"+hour+".", g, nil),
		gpuMemUsed: prometheus.NewDesc("gpu_memory_used_bytes",
			"Framebuffer memory in use, time-weighted mean"+hour+".", g, nil),
		gpuMemRatio: prometheus.NewDesc("gpu_memory_used_ratio",
			"Framebuffer memory in use over the memory there is (0..1), time-weighted"+hour+".", g, nil),
		gpuTemp: prometheus.NewDesc("gpu_temperature_celsius",
			"Highest GPU temperature of one sample"+hour+".", g, nil),
		gpuPower: prometheus.NewDesc("gpu_power_watts",
			"Power draw, time-weighted mean"+hour+".", g, nil),
		gpuFolded: prometheus.NewDesc("llm_usage_metrics_folded_gpus",
			"GPUs whose gauges are pooled into deployment=\"__other__\" node=\"__other__\" gpu=\"__other__\" by the cardinality cap.", nil, nil),
	}
}

// refreshDeployments reads the deployment view within its own
// Config.Timeout and keeps it for appendDeployments. On failure it logs and
// counts the error and keeps the last good read, so that a slow or failing
// read of the view never stops the (tenant, model) series.
func (e *Exporter) refreshDeployments(base context.Context, now time.Time) {
	ctx, cancel := context.WithTimeout(base, e.cfg.Timeout)
	defer cancel()
	deps, gpus, watermarks, err := e.readDeployments(ctx, now)
	if err != nil {
		e.depsFailed.Inc()
		e.logger.Warn("usage metrics: read the deployment view", "error", err, "serving_last", !e.depsRead.IsZero())
		return
	}
	e.deps, e.gpus, e.watermarks, e.depsRead = deps, gpus, watermarks, now
}

// sloClasses are the slo_class values the deployment view exposes under
// the SLO set in force: "" (no class), the set's default class and every
// class a rule names. The others are folded into Other.
func (e *Exporter) sloClasses(ctx context.Context) (map[string]bool, error) {
	set := rollup.DefaultSLOSet()
	if e.cfg.SLOs != nil {
		v, rules, ok, err := e.cfg.SLOs.CurrentSLO(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the SLO set: %w", err)
		}
		if ok {
			if set, err = rollup.ParseSLOSet([]byte(rules)); err != nil {
				return nil, fmt.Errorf("SLO set version %d: %w", v, err)
			}
		}
	}
	named := map[string]bool{"": true, set.Spec(0).DefaultClass: true}
	for _, r := range set.Rules {
		if r.SLOClass != "" {
			named[r.SLOClass] = true
		}
	}
	return named, nil
}

// readDeployments reads the deployment view: the rollups by deployment,
// model and slo_class over all time (classes the SLO set does not name
// folded into Other), the newest engine minute of each (deployment,
// model), the GPU usage of the hour in progress and the rollup watermarks.
func (e *Exporter) readDeployments(ctx context.Context, now time.Time) (map[depKey]*depSeries, map[gpuKey]*gpuSeries, []prometheus.Metric, error) {
	named, err := e.sloClasses(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	all := map[depKey]*depSeries{}
	get := func(k depKey) *depSeries {
		s := all[k]
		if s == nil {
			s = &depSeries{}
			all[k] = s
		}
		return s
	}
	groupBy := []string{"deployment", "model", "slo_class"}
	for offset := 0; ; offset += latencyPage {
		// AllColumns is what the view needs and no more: the counters
		// (requests, goodput, tokens for the cap's order) and the latency
		// distributions (TTFT, ITL); never the hour levels' token sizes or
		// latency breakdown (query.RollupQuery.Reads).
		rows, err := e.src.Rollups(ctx, query.RollupQuery{Start: origin, End: end, Step: "total", GroupBy: groupBy,
			Columns: query.AllColumns, Limit: latencyPage, Offset: offset})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read the rollups by deployment: %w", err)
		}
		for _, r := range rows {
			s := get(depKey{r.Group["deployment"], r.Group["model"]})
			class := r.Group["slo_class"]
			if !named[class] {
				class = Other
			}
			cs := s.class(class)
			cs.requests += r.Requests
			cs.good += r.GoodRequests
			s.size += int64(r.PromptTokens + r.OutputTokens)
			ttft, err := toHist(r.Latency["ttft"], e.cfg.TTFTBuckets)
			if err != nil {
				return nil, nil, nil, err
			}
			itl, err := toHist(r.Latency["itl"], e.cfg.ITLBuckets)
			if err != nil {
				return nil, nil, nil, err
			}
			cs.ttft.add(ttft)
			cs.itl.add(itl)
		}
		if len(rows) < latencyPage {
			break
		}
	}

	minute := now.UTC().Truncate(time.Minute)
	engine, err := e.src.EngineStats(ctx, query.EngineQuery{Start: minute.Add(-EngineLookback), End: minute, Step: "minute",
		GroupBy: []string{"deployment", "model"}, Limit: 1 << 20})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read engine stats: %w", err)
	}
	for _, r := range engine {
		s := get(depKey{r.Group["deployment"], r.Group["model"]})
		// Rows come in time order per group: the last one is the newest.
		if len(s.engine) == 0 || r.Start.After(s.engine[0].Start) {
			s.engine = []query.EngineRow{r}
		}
	}

	hour := now.UTC().Truncate(time.Hour)
	gpus, err := e.src.GPUUsage(ctx, query.GPUUsageQuery{Start: hour.Add(-time.Hour), End: hour.Add(time.Hour), Step: "hour",
		GroupBy: []string{"deployment", "node", "gpu"}, NoTokens: true, Limit: 1 << 20})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read GPU usage: %w", err)
	}
	gpu := map[gpuKey]*gpuSeries{}
	for _, r := range gpus {
		k := gpuKey{r.Group["deployment"], r.Group["node"], r.Group["gpu"]}
		g := gpu[k]
		if g == nil {
			g = &gpuSeries{}
			gpu[k] = g
		}
		if len(g.rows) == 0 || r.Start.After(g.rows[0].Start) {
			g.rows = []query.GPUUsageRow{r}
		}
	}
	var watermarks []prometheus.Metric
	for _, job := range []string{rollup.JobName, rollup.EngineJobName} {
		wm, ok, err := e.src.Watermark(ctx, job)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read the %s watermark: %w", job, err)
		}
		if ok {
			watermarks = append(watermarks, prometheus.MustNewConstMetric(e.descs.watermark, prometheus.GaugeValue, float64(wm.UnixMilli())/1000, job))
		}
	}
	return all, gpu, watermarks, nil
}

// appendDeployments appends the deployment view's metrics, folding the
// keys beyond the cap.
func (e *Exporter) appendDeployments(out []prometheus.Metric, all map[depKey]*depSeries, gpu map[gpuKey]*gpuSeries) []prometheus.Metric {
	d := e.depDescs
	shown, folded := chooseSticky(e.exposedDeps, all, depKey{Other, Other}, e.cfg.MaxSeries,
		func(s *depSeries) int64 { return s.size },
		func(a, b depKey) int {
			return cmp.Or(strings.Compare(a.deployment, b.deployment), strings.Compare(a.model, b.model))
		})
	other := &depSeries{}
	for _, k := range folded {
		other.add(all[k])
	}
	series := func(k depKey, s *depSeries) {
		if len(s.engine) > 0 {
			p := query.EnginePointOf(s.engine, s.engine[0].Start)
			out = append(out,
				prometheus.MustNewConstMetric(d.batch, prometheus.GaugeValue, p.RunningMean, k.deployment, k.model),
				prometheus.MustNewConstMetric(d.queue, prometheus.GaugeValue, p.WaitingMean, k.deployment, k.model))
			if p.KVSamples > 0 {
				out = append(out, prometheus.MustNewConstMetric(d.kvUsage, prometheus.GaugeValue, p.KVMean, k.deployment, k.model))
			}
			if p.HitRateOK {
				out = append(out, prometheus.MustNewConstMetric(d.kvHit, prometheus.GaugeValue, p.PrefixHitRate, k.deployment, k.model))
			}
		}
		classes := make([]string, 0, len(s.byClass))
		for c := range s.byClass {
			classes = append(classes, c)
		}
		slices.Sort(classes)
		for _, c := range classes {
			cs := s.byClass[c]
			lv := []string{k.deployment, k.model, c}
			out = append(out,
				prometheus.MustNewConstMetric(d.sloRequests, prometheus.CounterValue, float64(cs.requests), lv...),
				prometheus.MustNewConstMetric(d.sloGood, prometheus.CounterValue, float64(cs.good), lv...),
				constHistogram(d.ttft, cs.ttft, e.cfg.TTFTBuckets, lv...),
				constHistogram(d.itl, cs.itl, e.cfg.ITLBuckets, lv...))
		}
	}
	for _, k := range shown {
		series(k, all[k])
	}
	if len(folded) > 0 {
		series(depKey{Other, Other}, other)
	}

	gshown, gfolded := chooseSticky(e.exposedGPUs, gpu, gpuKey{Other, Other, Other}, e.cfg.MaxSeries,
		func(g *gpuSeries) int64 { return int64(g.rows[0].GPUSeconds) },
		func(a, b gpuKey) int {
			return cmp.Or(strings.Compare(a.deployment, b.deployment), strings.Compare(a.node, b.node), strings.Compare(a.gpu, b.gpu))
		})
	gpuSeriesOf := func(k gpuKey, rows []query.GPUUsageRow) {
		var (
			gpuSeconds, busy float64
			tel              rollup.GPUTelemetry
		)
		for _, r := range rows {
			gpuSeconds += r.GPUSeconds
			busy += r.BusySeconds
			tel.Merge(r.Telemetry)
		}
		lv := []string{k.deployment, k.node, k.gpu}
		if gpuSeconds > 0 {
			out = append(out, prometheus.MustNewConstMetric(d.gpuUtil, prometheus.GaugeValue, busy/gpuSeconds, lv...))
		}
		t := tel.Summary()
		if t.MemoryHours > 0 {
			out = append(out,
				prometheus.MustNewConstMetric(d.gpuMemUsed, prometheus.GaugeValue, t.MemoryUsedMeanBytes, lv...),
				prometheus.MustNewConstMetric(d.gpuMemRatio, prometheus.GaugeValue, t.MemoryUsedRatio, lv...))
		}
		if t.TemperatureHours > 0 {
			out = append(out, prometheus.MustNewConstMetric(d.gpuTemp, prometheus.GaugeValue, t.TemperatureMaxC, lv...))
		}
		if t.PowerHours > 0 {
			out = append(out, prometheus.MustNewConstMetric(d.gpuPower, prometheus.GaugeValue, t.PowerMeanWatts, lv...))
		}
	}
	for _, k := range gshown {
		gpuSeriesOf(k, gpu[k].rows)
	}
	if len(gfolded) > 0 {
		var rows []query.GPUUsageRow
		for _, k := range gfolded {
			rows = append(rows, gpu[k].rows...)
		}
		gpuSeriesOf(gpuKey{Other, Other, Other}, rows)
	}
	return append(out,
		prometheus.MustNewConstMetric(d.folded, prometheus.GaugeValue, float64(len(folded))),
		prometheus.MustNewConstMetric(d.keys, prometheus.GaugeValue, float64(len(all))),
		prometheus.MustNewConstMetric(d.gpuFolded, prometheus.GaugeValue, float64(len(gfolded))))
}

// chooseSticky splits the keys of all into those exposed on their own
// (sorted by order) and those folded into other. At most max−1 keys are
// exposed on their own, one series being kept for other. The choice is
// sticky (exposed is updated in place): a key exposed once stays exposed
// while it is in all, and new keys take the free places, largest first
// (size, then order). So each series, other included, only grows from
// scrape to scrape: a key moving between its own series and other would
// look like a counter reset to rate(). A real key equal to other is
// always folded.
func chooseSticky[K comparable, V any](exposed map[K]bool, all map[K]V, other K, max int, size func(V) int64, order func(a, b K) int) (shown, folded []K) {
	for k := range exposed {
		if _, ok := all[k]; !ok {
			delete(exposed, k)
		}
	}
	var fresh []K
	for k := range all {
		if !exposed[k] && k != other {
			fresh = append(fresh, k)
		}
	}
	slices.SortFunc(fresh, func(a, b K) int {
		return cmp.Or(cmp.Compare(size(all[b]), size(all[a])), order(a, b))
	})
	room := max - 1
	for _, k := range fresh {
		if len(exposed) >= room {
			break
		}
		exposed[k] = true
	}
	for k := range all {
		if exposed[k] {
			shown = append(shown, k)
		} else {
			folded = append(folded, k)
		}
	}
	slices.SortFunc(shown, order)
	slices.SortFunc(folded, order)
	return shown, folded
}
