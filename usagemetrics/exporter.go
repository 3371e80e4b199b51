package usagemetrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"tokenmeter/query"
	"tokenmeter/rollup/sketch"
)

// Reader is what the exporter reads; *query.Service implements it.
type Reader interface {
	Usage(ctx context.Context, q query.UsageQuery) ([]query.UsageRow, error)
	Rollups(ctx context.Context, q query.RollupQuery) ([]query.RollupRow, error)
	EngineStats(ctx context.Context, q query.EngineQuery) ([]query.EngineRow, error)
	GPUUsage(ctx context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error)
	Watermark(ctx context.Context, job string) (time.Time, bool, error)
}

var _ Reader = (*query.Service)(nil)

// Other is the tenant and model label of the series every folded pair is
// added to. A real pair whose tenant and model are both "__other__" is
// always folded into it, so that no two series share their labels.
const Other = "__other__"

// The range the counters cover: every event the read side can hold, so that
// each counter is cumulative since a fixed origin (the first event) and
// never goes down. End lies on a whole hour, so that the rollups answer.
var (
	origin = time.Unix(0, 0).UTC()
	end    = time.Unix(1<<32-1, 0).UTC().Truncate(time.Hour)
)

// Range is the range of completed_at the counters cover (start inclusive,
// end exclusive): a GetUsage over it, grouped by tenant_id and model at
// granularity total, answers the same numbers.
func Range() (start, stop time.Time) { return origin, end }

// Default histogram bounds, in seconds: vLLM's scale for time to first
// token, and one reaching long generations for end-to-end latency.
var (
	DefaultTTFTBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80}
	DefaultE2EBuckets  = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120, 300, 600}
)

// Config tunes an Exporter.
type Config struct {
	// MaxSeries is the most (tenant, model) pairs exposed, the "__other__"
	// pair included (default DefaultMaxSeries). Each pair is a few dozen
	// time series: SeriesPerPair.
	MaxSeries int
	// Interval is the longest the exposition is served from the cache
	// before the next scrape recomputes it (default DefaultInterval); a
	// failed recomputation is not retried before an interval either.
	Interval time.Duration
	// Timeout bounds one recomputation (default 20s).
	Timeout time.Duration
	// TTFTBuckets, E2EBuckets and ITLBuckets are the histograms' upper
	// bounds in seconds, ascending (defaults DefaultTTFTBuckets,
	// DefaultE2EBuckets, DefaultITLBuckets).
	TTFTBuckets, E2EBuckets, ITLBuckets []float64
	// SLOs is where the SLO set in force is read (the store: the rollup
	// job's set); nil reads rollup.DefaultSLOSet. The deployment view keeps
	// the slo_class values the set names (and "", no class) and folds every
	// other into slo_class="__other__", so that clients cannot add series.
	SLOs SLOReader
}

// SLOReader reads the SLO set in force (*chstore.Store implements it).
type SLOReader interface {
	CurrentSLO(ctx context.Context) (version uint32, rules string, ok bool, err error)
}

// Defaults of Config.
const (
	// DefaultMaxSeries keeps the pairs near 39,000 time series (39 per pair
	// with the default buckets); with the deployment view (the same cap on
	// keys and GPUs, at most 152 series a key with the built-in SLO set's
	// classes, 5 a GPU) the exposition is at most about 196,000 series.
	DefaultMaxSeries = 1_000
	DefaultInterval  = 30 * time.Second
)

// withDefaults fills what c leaves zero.
func (c Config) withDefaults() Config {
	c.MaxSeries = cmp.Or(c.MaxSeries, DefaultMaxSeries)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Timeout = cmp.Or(c.Timeout, 20*time.Second)
	if c.TTFTBuckets == nil {
		c.TTFTBuckets = DefaultTTFTBuckets
	}
	if c.E2EBuckets == nil {
		c.E2EBuckets = DefaultE2EBuckets
	}
	if c.ITLBuckets == nil {
		c.ITLBuckets = DefaultITLBuckets
	}
	return c
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxSeries < 0 {
		errs = append(errs, fmt.Errorf("usage metrics: max series %d must not be negative", c.MaxSeries))
	}
	if c.Interval < 0 || c.Timeout < 0 {
		errs = append(errs, errors.New("usage metrics: the interval and the timeout must not be negative"))
	}
	for name, b := range map[string][]float64{"TTFT": c.TTFTBuckets, "E2E": c.E2EBuckets, "ITL": c.ITLBuckets} {
		for i, v := range b {
			if !(v > 0) || (i > 0 && v <= b[i-1]) {
				errs = append(errs, fmt.Errorf("usage metrics: %s buckets %v must be positive and ascending", name, b))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// SeriesPerPair is the number of time series one (tenant, model) pair is
// exposed as with the given numbers of histogram bounds: two request
// counters (ok, error), three token counters, and each histogram's buckets
// (+Inf included), _sum and _count.
func SeriesPerPair(ttftBuckets, e2eBuckets int) int {
	return 2 + 3 + (ttftBuckets + 3) + (e2eBuckets + 3)
}

// ErrUnavailable is the answer when the metrics could not be computed and
// none are cached; the reason is logged, never sent to the scraper.
var ErrUnavailable = errors.New("usage metrics unavailable")

// pair is a (tenant, model) series.
type pair struct{ tenant, model string }

// hist is a latency histogram in Prometheus's shape: cumulative counts per
// upper bound (seconds), the count and the sum in seconds.
type hist struct {
	cumulative []uint64
	count      uint64
	sum        float64
}

// add adds o, of the same bounds.
func (h *hist) add(o hist) {
	if h.cumulative == nil {
		h.cumulative = make([]uint64, len(o.cumulative))
	}
	for i, n := range o.cumulative {
		h.cumulative[i] += n
	}
	h.count += o.count
	h.sum += o.sum
}

// series is everything exposed for one pair.
type series struct {
	requests, errors                           int64
	inputTokens, cachedInputTokens, outputTkns int64
	ttft, e2e                                  hist
	// size orders the pairs when choosing which are exposed.
	size int64
}

func (s *series) add(o *series) {
	s.requests += o.requests
	s.errors += o.errors
	s.inputTokens += o.inputTokens
	s.cachedInputTokens += o.cachedInputTokens
	s.outputTkns += o.outputTkns
	s.ttft.add(o.ttft)
	s.e2e.add(o.e2e)
}

// Exporter serves the business metrics over HTTP in any format Prometheus
// negotiates, recomputing them from a Reader at most once an interval.
type Exporter struct {
	cfg    Config
	src    Reader
	logger *slog.Logger
	now    func() time.Time

	descs    descs
	depDescs depDescs
	opts     promhttp.HandlerOpts

	// sem lets one scrape recompute at a time; the others wait for it (or
	// for their own context) and serve what it cached.
	sem chan struct{}
	// Under sem: the cached families, when they were computed, when a
	// computation was last tried, and the pairs exposed on their own
	// (sticky, see choose).
	families []*dto.MetricFamily
	tried    time.Time
	exposed  map[pair]bool
	// exposedDeps and exposedGPUs are the deployment view's sticky
	// choices, (deployment, model) keys and GPUs.
	exposedDeps map[depKey]bool
	exposedGPUs map[gpuKey]bool
	// The deployment view's last good read (deps, gpus and the rollup
	// watermarks), when it was read (zero: never). It is read apart from
	// the pairs: a failed read keeps these, and the pairs still refresh.
	deps       map[depKey]*depSeries
	gpus       map[gpuKey]*gpuSeries
	watermarks []prometheus.Metric
	depsRead   time.Time

	refreshes  *prometheus.CounterVec
	depsFailed prometheus.Counter
	duration   prometheus.Histogram
}

type descs struct {
	requests, input, cached, output, ttft, e2e, folded, pairs, refreshed, depsRefreshed, watermark *prometheus.Desc
}

// New returns an Exporter reading src; it registers its own metrics
// (meter_usage_metrics_*) on reg.
func New(cfg Config, src Reader, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tm := []string{"tenant", "model"}
	e := &Exporter{
		cfg: cfg, src: src, logger: logger, now: now,
		sem:     make(chan struct{}, 1),
		exposed: map[pair]bool{}, exposedDeps: map[depKey]bool{}, exposedGPUs: map[gpuKey]bool{},
		depDescs: newDepDescs(),
		descs: descs{
			requests: prometheus.NewDesc("llm_requests_total",
				"Requests finished, by status: ok, or error (any error class; GetTraffic splits them), since the first event.",
				[]string{"tenant", "model", "status"}, nil),
			input: prometheus.NewDesc("llm_tokens_input_total",
				"Prompt (input) tokens, cached ones included, since the first event.", tm, nil),
			cached: prometheus.NewDesc("llm_tokens_cached_input_total",
				"Prompt tokens served from the prefix cache (a part of llm_tokens_input_total), since the first event.", tm, nil),
			output: prometheus.NewDesc("llm_tokens_output_total",
				"Output (generated) tokens, since the first event.", tm, nil),
			ttft: prometheus.NewDesc("llm_ttft_seconds",
				"Time to first token (arrival to first output token) of the requests that reported it, since the first event; buckets within 1% of the bounds.", tm, nil),
			e2e: prometheus.NewDesc("llm_latency",
				"End-to-end request latency in seconds (arrival to last token) of the requests that reported it, since the first event; buckets within 1% of the bounds.", tm, nil),
			folded: prometheus.NewDesc("llm_usage_metrics_folded_pairs",
				"(tenant, model) pairs added to the tenant=\"__other__\" model=\"__other__\" series by the cardinality cap (meterd --usage-metrics-max-series).", nil, nil),
			pairs: prometheus.NewDesc("llm_usage_metrics_pairs",
				"(tenant, model) pairs with usage, folded ones included.", nil, nil),
			refreshed: prometheus.NewDesc("llm_usage_metrics_computed_timestamp_seconds",
				"When these metrics were read from the rollups (Unix seconds): they are served from a cache between reads.", nil, nil),
			depsRefreshed: prometheus.NewDesc("llm_usage_metrics_deployments_computed_timestamp_seconds",
				"When the deployment view (llm_* series by deployment, gpu_* series, the rollup watermarks) was last read (Unix seconds): a failed read keeps its last values.", nil, nil),
			watermark: prometheus.NewDesc("llm_usage_metrics_rollup_watermark_timestamp_seconds",
				"How far the rollup job has rolled up (Unix seconds; rollup_job=rollup: events and GPU samples, rollup-engine: engine samples), as read with these metrics: every insert stamped before it is in the rollups.", []string{"rollup_job"}, nil),
		},
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_usage_metrics_refreshes_total",
			Help: "Recomputations of the business metrics (--usage-metrics), by result: ok or error.",
		}, []string{"result"}),
		depsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_usage_metrics_deployment_view_errors_total",
			Help: "Failed reads of the business metrics' deployment view (by deployment and GPU, rollup watermarks); its last values are served and the (tenant, model) series still refresh.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meter_usage_metrics_refresh_seconds",
			Help:    "Time to recompute the business metrics from the rollups.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 8),
		}),
	}
	e.refreshes.WithLabelValues("ok")
	e.refreshes.WithLabelValues("error")
	if err := errors.Join(reg.Register(e.refreshes), reg.Register(e.depsFailed), reg.Register(e.duration)); err != nil {
		return nil, fmt.Errorf("register usage metrics' own metrics: %w", err)
	}
	e.opts = promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn), ErrorHandling: promhttp.HTTPErrorOnError}
	return e, nil
}

// ServeHTTP answers a scrape: the cached metrics, recomputed first when they
// are older than the interval. Without any (the first computation failed)
// it answers 503 and logs the reason.
func (e *Exporter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	families, err := e.Gather(r.Context())
	if err != nil {
		http.Error(w, "usage metrics unavailable (the reason is in meterd's log)", http.StatusServiceUnavailable)
		return
	}
	promhttp.HandlerFor(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return families, nil }), e.opts).ServeHTTP(w, r)
}

// Gather returns the metric families, recomputed when the cached ones are
// older than the interval. A failed recomputation is logged and the older
// families are served; with none, the error wraps ErrUnavailable. The
// families returned are shared: read them, do not change them.
func (e *Exporter) Gather(ctx context.Context) ([]*dto.MetricFamily, error) {
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
	defer func() { <-e.sem }()
	now := e.now()
	if !e.tried.IsZero() && now.Sub(e.tried) < e.cfg.Interval {
		if e.families == nil {
			return nil, fmt.Errorf("%w: the last computation failed", ErrUnavailable)
		}
		return e.families, nil
	}
	e.tried = now
	// The read outlives a scraper that gives up (Prometheus's
	// scrape_timeout may be shorter than a read over all time): its result
	// is cached for the next scrape. Config.Timeout bounds each view's read.
	start := time.Now()
	families, err := e.compute(context.WithoutCancel(ctx), now)
	e.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		e.refreshes.WithLabelValues("error").Inc()
		e.logger.Warn("usage metrics: read the rollups", "error", err, "serving_cached", e.families != nil)
		if e.families == nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return e.families, nil
	}
	e.refreshes.WithLabelValues("ok").Inc()
	e.families = families
	return families, nil
}

// latencyPage is the rows read per rollup query, so that any number of
// pairs is read without Config.MaxSeriesRows refusing the query.
const latencyPage = 50_000

// compute reads the usage and the latency histograms of every pair, folds
// the pairs beyond the cap, refreshes the deployment view (its last good
// values when that fails) and gathers the metrics. Each read has
// Config.Timeout of its own.
func (e *Exporter) compute(base context.Context, now time.Time) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(base, e.cfg.Timeout)
	defer cancel()
	groupBy := []string{"tenant_id", "model"}
	usage, err := e.src.Usage(ctx, query.UsageQuery{Start: origin, End: end, Granularity: "total", GroupBy: groupBy})
	if err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	all := map[pair]*series{}
	get := func(p pair) *series {
		s := all[p]
		if s == nil {
			s = &series{}
			all[p] = s
		}
		return s
	}
	for _, r := range usage {
		s := get(pair{r.TenantID, r.Model})
		s.requests += r.Requests
		s.errors += r.Errors
		s.inputTokens += r.PromptTokens
		s.cachedInputTokens += r.CachedPromptTokens
		s.outputTkns += r.OutputTokens
	}
	for offset := 0; ; offset += latencyPage {
		rows, err := e.src.Rollups(ctx, query.RollupQuery{Start: origin, End: end, Step: "total", GroupBy: groupBy,
			Columns: query.LatencyColumns, Limit: latencyPage, Offset: offset})
		if err != nil {
			return nil, fmt.Errorf("read latency histograms: %w", err)
		}
		for _, r := range rows {
			s := get(pair{r.Group["tenant_id"], r.Group["model"]})
			if s.ttft, err = toHist(r.Latency["ttft"], e.cfg.TTFTBuckets); err != nil {
				return nil, err
			}
			if s.e2e, err = toHist(r.Latency["e2e"], e.cfg.E2EBuckets); err != nil {
				return nil, err
			}
		}
		if len(rows) < latencyPage {
			break
		}
	}
	e.refreshDeployments(base, now)
	shown, other, folded := e.choose(all)
	var metrics []prometheus.Metric
	for _, p := range shown {
		metrics = e.appendSeries(metrics, p, all[p])
	}
	if folded > 0 {
		metrics = e.appendSeries(metrics, pair{Other, Other}, other)
	}
	if !e.depsRead.IsZero() {
		metrics = e.appendDeployments(metrics, e.deps, e.gpus)
		metrics = append(metrics, e.watermarks...)
		metrics = append(metrics, prometheus.MustNewConstMetric(e.descs.depsRefreshed, prometheus.GaugeValue, float64(e.depsRead.UnixMilli())/1000))
	}
	metrics = append(metrics,
		prometheus.MustNewConstMetric(e.descs.folded, prometheus.GaugeValue, float64(folded)),
		prometheus.MustNewConstMetric(e.descs.pairs, prometheus.GaugeValue, float64(len(all))),
		prometheus.MustNewConstMetric(e.descs.refreshed, prometheus.GaugeValue, float64(now.UnixMilli())/1000),
	)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(constCollector(metrics)); err != nil {
		return nil, fmt.Errorf("usage metrics: %w", err)
	}
	families, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather usage metrics: %w", err)
	}
	return families, nil
}

// choose splits the pairs into those exposed on their own and the sum of
// the others, with their number (chooseSticky: at most MaxSeries−1 pairs
// on their own, the choice sticky, new pairs largest first by input +
// output tokens, then requests).
func (e *Exporter) choose(all map[pair]*series) (shown []pair, other *series, folded int) {
	for _, s := range all {
		s.size = s.inputTokens + s.outputTkns
	}
	shown, rest := chooseSticky(e.exposed, all, pair{Other, Other}, e.cfg.MaxSeries, func(s *series) int64 { return s.size },
		func(a, b pair) int {
			return cmp.Or(cmp.Compare(all[b].requests, all[a].requests), strings.Compare(a.tenant, b.tenant), strings.Compare(a.model, b.model))
		})
	other = &series{}
	for _, p := range rest {
		other.add(all[p])
	}
	return shown, other, len(rest)
}

// appendSeries appends the metrics of one pair.
func (e *Exporter) appendSeries(out []prometheus.Metric, p pair, s *series) []prometheus.Metric {
	counter := func(d *prometheus.Desc, v int64, labels ...string) prometheus.Metric {
		// Counts are exact in a float64 up to 2^53 (9·10^15 tokens).
		return prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	out = append(out,
		counter(e.descs.requests, s.requests-s.errors, p.tenant, p.model, "ok"),
		counter(e.descs.requests, s.errors, p.tenant, p.model, "error"),
		counter(e.descs.input, s.inputTokens, p.tenant, p.model),
		counter(e.descs.cached, s.cachedInputTokens, p.tenant, p.model),
		counter(e.descs.output, s.outputTkns, p.tenant, p.model),
		constHistogram(e.descs.ttft, s.ttft, e.cfg.TTFTBuckets, p.tenant, p.model),
		constHistogram(e.descs.e2e, s.e2e, e.cfg.E2EBuckets, p.tenant, p.model),
	)
	return out
}

func constHistogram(d *prometheus.Desc, h hist, bounds []float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(bounds))
	for i, b := range bounds {
		if h.cumulative != nil {
			buckets[b] = h.cumulative[i]
		} else {
			buckets[b] = 0
		}
	}
	return prometheus.MustNewConstHistogram(d, h.count, h.sum, buckets, labels...)
}

// toHist turns a rollup distribution (milliseconds, log buckets of 1%
// relative width, see package sketch) into cumulative counts at bounds
// (seconds). Each log bucket is counted at its estimate sketch.Value,
// within 1% of every value in it: a value within 1% of a bound may be
// counted on either side of it, and no value is lost or counted twice.
func toHist(d query.Dist, bounds []float64) (hist, error) {
	h, err := sketch.FromArrays(d.Keys, d.Counts)
	if err != nil {
		return hist{}, fmt.Errorf("latency histogram: %w", err)
	}
	out := hist{cumulative: make([]uint64, len(bounds)), count: h.Count(), sum: d.Sum / 1000}
	for i, k := range h.Keys {
		// The first bound at or above the estimate counts it (and, once
		// summed below, every bound after it).
		if j, _ := slices.BinarySearch(bounds, sketch.Value(k)/1000); j < len(bounds) {
			out.cumulative[j] += h.Counts[i]
		}
	}
	for j := 1; j < len(bounds); j++ {
		out.cumulative[j] += out.cumulative[j-1]
	}
	return out, nil
}

// constCollector collects fixed metrics; it describes none (an unchecked
// collector), as its label values are only known once read.
type constCollector []prometheus.Metric

func (c constCollector) Describe(chan<- *prometheus.Desc) {}

func (c constCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c {
		ch <- m
	}
}
