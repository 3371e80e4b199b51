package engine

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The engines whose metric names Parse knows.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTGI    = "tgi"
	// EngineNIM is NVIDIA NIM for LLMs, whose /v1/metrics publishes
	// vLLM's names without the "vllm:" prefix.
	EngineNIM = "nim"
	// EngineDynamo is NVIDIA Dynamo: a worker's /metrics holds Dynamo's
	// dynamo_component_* metrics and its backend's own (vllm:, sglang:)
	// passed through; the frontend's holds dynamo_frontend_*.
	EngineDynamo = "dynamo"
)

// ErrNoEngineMetrics is returned for a scrape that holds no metric of a
// known engine (the URL is not an engine's /metrics, or the engine is not
// one of vLLM, SGLang, TGI, NIM, Dynamo).
var ErrNoEngineMetrics = errors.New("no vLLM, SGLang, TGI, NIM or Dynamo metrics")

// Reading is what one scrape of an engine says, before counters become
// deltas: gauges as read, counters as their cumulative values per series.
// A nil field was not published. Several series of a gauge (vLLM's
// data-parallel engines, one per "engine" label) are summed, except the
// ratios (KV-cache usage, hit rate), which are averaged; counters are kept
// per series, so that one engine's restart resets its own series only.
type Reading struct {
	Engine string
	// Model is the served model (label model_name, or model_id for TGI);
	// several are joined with ",".
	Model            string
	Running, Waiting *float64
	KVCacheUsage     *float64
	PrefixHitRate    *float64
	// Cumulative counters.
	PrefixQueries, PrefixHits, Preemptions Counter
	// IterationTokensSum and IterationTokensCount are the sum and count of
	// vLLM's iteration_tokens_total histogram (tokens per engine step).
	IterationTokensSum, IterationTokensCount Counter
	// Monotonic holds counters read only to notice a restart: they go
	// down only when the engine restarts (request and token counters),
	// keyed by family name and labels.
	Monotonic Counter
	// StartTimes is process_start_time_seconds per series (Python engines)
	// and Uptime Dynamo's uptime gauge: a later start time, or a lower
	// uptime, is a restart of the whole process, even one whose counters
	// already climbed past their old values.
	StartTimes, Uptime Counter
}

// Counter is a cumulative counter's value per series, keyed by the
// series' labels; nil when the engine does not publish it.
type Counter map[string]float64

// metric maps a field of Reading to the family names that publish it, in
// order of preference (a newer name first, then the names it replaced).
// Exactly one of gauge and counter is set.
type metric struct {
	gauge   func(*Reading) **float64
	counter func(*Reading) *Counter
	names   []string
	ratio   bool // a gauge averaged over series rather than summed
}

// The metric names of each engine. vLLM's V1 engine replaced the hit-rate
// gauge gpu_prefix_cache_hit_rate with the counters
// gpu_prefix_cache_queries and gpu_prefix_cache_hits (0.8), renamed
// prefix_cache_queries and prefix_cache_hits later (0.9.2), as
// gpu_cache_usage_perc became kv_cache_usage_perc; every generation is
// read, the newest name first. Counters are looked up
// with and without the _total suffix (the Python client writes the family
// as name_total in the text format). Names are facts from the engines'
// documentation; the values are documented in docs/architecture.md.
var engineMetrics = map[string][]metric{
	EngineVLLM: {
		{gauge: func(r *Reading) **float64 { return &r.Running }, names: []string{"vllm:num_requests_running"}},
		{gauge: func(r *Reading) **float64 { return &r.Waiting }, names: []string{"vllm:num_requests_waiting"}},
		{gauge: func(r *Reading) **float64 { return &r.KVCacheUsage }, names: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, ratio: true},
		{gauge: func(r *Reading) **float64 { return &r.PrefixHitRate }, names: []string{"vllm:gpu_prefix_cache_hit_rate"}, ratio: true},
		{counter: func(r *Reading) *Counter { return &r.PrefixQueries }, names: []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
			"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"}},
		{counter: func(r *Reading) *Counter { return &r.PrefixHits }, names: []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
			"vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"}},
		{counter: func(r *Reading) *Counter { return &r.Preemptions }, names: []string{"vllm:num_preemptions_total", "vllm:num_preemptions"}},
	},
	EngineSGLang: {
		{gauge: func(r *Reading) **float64 { return &r.Running }, names: []string{"sglang:num_running_reqs"}},
		{gauge: func(r *Reading) **float64 { return &r.Waiting }, names: []string{"sglang:num_queue_reqs"}},
		{gauge: func(r *Reading) **float64 { return &r.KVCacheUsage }, names: []string{"sglang:token_usage"}, ratio: true},
		{gauge: func(r *Reading) **float64 { return &r.PrefixHitRate }, names: []string{"sglang:cache_hit_rate"}, ratio: true},
	},
	EngineTGI: {
		{gauge: func(r *Reading) **float64 { return &r.Running }, names: []string{"tgi_batch_current_size"}},
		{gauge: func(r *Reading) **float64 { return &r.Waiting }, names: []string{"tgi_queue_size"}},
	},
	// NIM for LLMs: the names of NVIDIA's "Observability for NVIDIA NIM for
	// LLMs" table (docs.nvidia.com/nim/large-language-models/latest/
	// observability.html): vLLM's without the prefix. Where a NIM build
	// also publishes its vLLM backend's own names, the prefix-cache and
	// preemption counters are read from them.
	EngineNIM: {
		{gauge: func(r *Reading) **float64 { return &r.Running }, names: []string{"num_requests_running", "vllm:num_requests_running"}},
		{gauge: func(r *Reading) **float64 { return &r.Waiting }, names: []string{"num_requests_waiting", "vllm:num_requests_waiting"}},
		{gauge: func(r *Reading) **float64 { return &r.KVCacheUsage }, names: []string{"gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, ratio: true},
		{gauge: func(r *Reading) **float64 { return &r.PrefixHitRate }, names: []string{"vllm:gpu_prefix_cache_hit_rate"}, ratio: true},
		{counter: func(r *Reading) *Counter { return &r.PrefixQueries }, names: vllmPrefixQueries},
		{counter: func(r *Reading) *Counter { return &r.PrefixHits }, names: vllmPrefixHits},
		{counter: func(r *Reading) *Counter { return &r.Preemptions }, names: []string{"vllm:num_preemptions_total", "vllm:num_preemptions"}},
	},
	// Dynamo: the names of ai-dynamo/dynamo's lib/runtime/src/metrics/
	// prometheus_names.rs and docs/observability (kvstats, frontend
	// queue): the KV-cache figures Dynamo publishes itself first, else the
	// backend's passed through; queue depth and running requests are the
	// backend's, else (a frontend's page) the frontend's HTTP queue, and
	// running is then its in-flight requests less the queued ones (Parse).
	EngineDynamo: {
		{gauge: func(r *Reading) **float64 { return &r.Running }, names: []string{"vllm:num_requests_running", "sglang:num_running_reqs"}},
		{gauge: func(r *Reading) **float64 { return &r.Waiting }, names: []string{"vllm:num_requests_waiting", "sglang:num_queue_reqs", "dynamo_frontend_queued_requests"}},
		{gauge: func(r *Reading) **float64 { return &r.KVCacheUsage }, names: []string{"dynamo_component_kvstats_gpu_cache_usage_percent",
			"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"}, ratio: true},
		{gauge: func(r *Reading) **float64 { return &r.PrefixHitRate }, names: []string{"dynamo_component_kvstats_gpu_prefix_cache_hit_rate",
			"vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"}, ratio: true},
		{counter: func(r *Reading) *Counter { return &r.PrefixQueries }, names: vllmPrefixQueries},
		{counter: func(r *Reading) *Counter { return &r.PrefixHits }, names: vllmPrefixHits},
		{counter: func(r *Reading) *Counter { return &r.Preemptions }, names: []string{"vllm:num_preemptions_total", "vllm:num_preemptions"}},
	},
}

// vLLM's prefix-cache counters, every generation, the newest first.
var (
	vllmPrefixQueries = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
		"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"}
	vllmPrefixHits = []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
		"vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"}
)

// restartSignals are, per engine, the families Parse reads into
// Reading.Monotonic: counters that every served request moves (so that
// most restarts take them below their last value). Every family present is read (not only the first): a restart
// shows in any of them. The prefix-cache, preemption and iteration
// counters are restart signals too (Scraper.Sample).
var restartSignals = map[string][]string{
	EngineVLLM: vllmRestartSignals,
	EngineSGLang: {"sglang:prompt_tokens_total", "sglang:prompt_tokens", "sglang:generation_tokens_total", "sglang:generation_tokens",
		"sglang:num_requests_total", "sglang:num_requests"},
	EngineTGI: {"tgi_request_count", "tgi_request_success"},
	EngineNIM: append([]string{"request_success_total", "request_success", "prompt_tokens_total", "prompt_tokens",
		"generation_tokens_total", "generation_tokens", "request_finish_total", "request_finish"}, vllmRestartSignals...),
	EngineDynamo: append([]string{"dynamo_component_requests_total", "dynamo_frontend_requests_total",
		"sglang:prompt_tokens_total", "sglang:generation_tokens_total"}, vllmRestartSignals...),
}

// dynamoUptime is the DistributedRuntime's uptime gauge of a Dynamo
// process, under its current and its earlier name.
var dynamoUptime = []string{"dynamo_component_uptime_seconds", "dynamo_component_system_uptime_seconds"}

var vllmRestartSignals = []string{"vllm:request_success_total", "vllm:request_success", "vllm:prompt_tokens_total", "vllm:prompt_tokens",
	"vllm:generation_tokens_total", "vllm:generation_tokens"}

// processStartTime is the Python client's process start time (Unix
// seconds), published by vLLM, SGLang and NIM.
const processStartTime = "process_start_time_seconds"

// dynamoInflight is a Dynamo frontend's in-flight requests (queued ones
// included).
const dynamoInflight = "dynamo_frontend_inflight_requests"

// nimNames are names only NIM's page holds (no prefix): one of them makes
// the page NIM's, whatever else it carries.
var nimNames = map[string]bool{"num_requests_running": true, "num_requests_waiting": true, "gpu_cache_usage_perc": true, "num_request_max": true}

// iterationTokens are the names of vLLM's tokens-per-step histogram.
var iterationTokens = []string{"vllm:iteration_tokens_total", "vllm:iteration_tokens"}

// wanted is every family name Parse reads.
var wanted = func() map[string]bool {
	w := map[string]bool{}
	for _, ms := range engineMetrics {
		for _, m := range ms {
			for _, n := range m.names {
				w[n] = true
			}
		}
	}
	for _, ns := range restartSignals {
		for _, n := range ns {
			w[n] = true
		}
	}
	for _, n := range iterationTokens {
		w[n] = true
	}
	for _, n := range dynamoUptime {
		w[n] = true
	}
	w[processStartTime], w[dynamoInflight] = true, true
	return w
}()

var enginePrefixes = []struct{ prefix, engine string }{{"vllm:", EngineVLLM}, {"sglang:", EngineSGLang}, {"tgi_", EngineTGI}, {"dynamo_", EngineDynamo}}

// filter copies the lines of a text exposition that belong to the families
// Parse reads (their HELP, TYPE and samples, histogram series included)
// and notes the engines whose names appear. An engine's page is mostly
// histograms Parse does not read (about 90 KiB for vLLM); handing the
// parser only the wanted lines made a round of 100 vLLM scrapes about ten
// times cheaper. The exposition is still parsed by expfmt: this only
// drops whole lines by their metric name.
func filter(r io.Reader) ([]byte, []string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var (
		out   []byte
		found []string
	)
	for sc.Scan() {
		line := sc.Bytes()
		var name []byte
		if len(line) > 0 && line[0] == '#' {
			f := bytes.Fields(line)
			if len(f) < 3 || (string(f[1]) != "HELP" && string(f[1]) != "TYPE") {
				continue
			}
			name = f[2]
		} else {
			end := bytes.IndexAny(line, "{ \t")
			if end < 0 {
				continue
			}
			name = line[:end]
		}
		for _, p := range enginePrefixes {
			if bytes.HasPrefix(name, []byte(p.prefix)) && !slices.Contains(found, p.engine) {
				found = append(found, p.engine)
			}
		}
		n := string(name)
		if nimNames[n] && !slices.Contains(found, EngineNIM) {
			found = append(found, EngineNIM)
		}
		if !wanted[n] {
			base, ok := histogramBase(n)
			if !ok || !wanted[base] {
				continue
			}
		}
		out = append(out, line...)
		out = append(out, '\n')
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read Prometheus text: %w", err)
	}
	return out, found, nil
}

// histogramBase is the family name of a histogram series name.
func histogramBase(n string) (string, bool) {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, suffix); ok {
			return b, true
		}
	}
	return "", false
}

// engineOf names the one engine among found. Dynamo and NIM serve through
// a backend engine whose names may appear on their page too: their own
// names decide.
func engineOf(found []string) (string, error) {
	for _, wrapper := range []string{EngineDynamo, EngineNIM} {
		if slices.Contains(found, wrapper) {
			return wrapper, nil
		}
	}
	switch len(found) {
	case 0:
		return "", ErrNoEngineMetrics
	case 1:
		return found[0], nil
	}
	slices.Sort(found)
	return "", fmt.Errorf("metrics of several engines at one endpoint (%s): scrape each engine's own endpoint", strings.Join(found, ", "))
}

// Parse reads one scrape in the Prometheus text format and maps the
// engine's metrics to a Reading.
func Parse(r io.Reader) (Reading, error) {
	text, found, err := filter(r)
	if err != nil {
		return Reading{}, err
	}
	eng, err := engineOf(found)
	if err != nil {
		return Reading{}, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Reading{}, fmt.Errorf("parse Prometheus text: %w", err)
	}
	out := Reading{Engine: eng}
	var models []string
	for _, m := range engineMetrics[eng] {
		for _, name := range m.names {
			f, ok := fams[name]
			if !ok {
				continue
			}
			if m.counter != nil {
				c := seriesValues(f, &models)
				if len(c) == 0 {
					continue
				}
				*m.counter(&out) = c
				break
			}
			v, n := sumSeries(f, &models)
			if n == 0 {
				continue
			}
			if m.ratio {
				v /= float64(n)
			}
			*m.gauge(&out) = &v
			break
		}
	}
	if eng == EngineDynamo && out.Running == nil && out.Waiting != nil {
		// A frontend's page: its in-flight requests less the queued ones
		// are past their first token, in the engines' batches.
		if f, ok := fams[dynamoInflight]; ok {
			if v, n := sumSeries(f, &models); n > 0 {
				v = max(v-*out.Waiting, 0)
				out.Running = &v
			}
		}
	}
	for _, name := range restartSignals[eng] {
		if f, ok := fams[name]; ok {
			if out.Monotonic == nil {
				out.Monotonic = Counter{}
			}
			for _, m := range f.GetMetric() {
				if v, ok := finiteValue(m); ok && v >= 0 {
					out.Monotonic[name+"\x00"+seriesKey(m)] = v
				}
			}
		}
	}
	out.StartTimes = positiveSeries(fams, []string{processStartTime})
	if eng == EngineDynamo {
		out.Uptime = positiveSeries(fams, dynamoUptime)
	}
	if eng == EngineVLLM || eng == EngineNIM || eng == EngineDynamo {
		for _, name := range iterationTokens {
			if f, ok := fams[name]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
				sum, count := Counter{}, Counter{}
				for _, m := range f.GetMetric() {
					k := seriesKey(m)
					sum[k] = m.GetHistogram().GetSampleSum()
					count[k] = float64(m.GetHistogram().GetSampleCount())
					addModel(&models, m)
				}
				if len(sum) > 0 {
					out.IterationTokensSum, out.IterationTokensCount = sum, count
				}
				break
			}
		}
	}
	slices.Sort(models)
	out.Model = strings.Join(slices.Compact(models), ",")
	return out, nil
}

// positiveSeries reads the finite, positive values of the families names
// per family and series; nil when there are none.
func positiveSeries(fams map[string]*dto.MetricFamily, names []string) Counter {
	var out Counter
	for _, name := range names {
		f, ok := fams[name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			if v, ok := finiteValue(m); ok && v > 0 {
				if out == nil {
					out = Counter{}
				}
				out[name+"\x00"+seriesKey(m)] = v
			}
		}
	}
	return out
}

// sumSeries sums the finite values of a gauge, counter or untyped family,
// returning how many series it summed, and notes each series' model.
func sumSeries(f *dto.MetricFamily, models *[]string) (float64, int) {
	var (
		sum float64
		n   int
	)
	for _, m := range f.GetMetric() {
		v, ok := finiteValue(m)
		if !ok {
			continue
		}
		sum += v
		n++
		addModel(models, m)
	}
	return sum, n
}

// finiteValue is the value of a gauge, counter or untyped sample, unless it
// is NaN or infinite.
func finiteValue(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.GetGauge().GetValue()
	case m.Counter != nil:
		v = m.GetCounter().GetValue()
	case m.Untyped != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v) && !math.IsInf(v, 0)
}

// seriesValues reads a counter family's finite, non-negative values per
// series (counter or untyped samples; a gauge is no counter).
func seriesValues(f *dto.MetricFamily, models *[]string) Counter {
	out := Counter{}
	for _, m := range f.GetMetric() {
		v, ok := finiteValue(m)
		if !ok || m.Gauge != nil || v < 0 {
			continue
		}
		out[seriesKey(m)] = v
		addModel(models, m)
	}
	return out
}

// seriesKey identifies a series by its labels (the parser sorts them by name).
func seriesKey(m *dto.Metric) string {
	var b strings.Builder
	for _, lp := range m.GetLabel() {
		b.WriteString(lp.GetName())
		b.WriteByte(0)
		b.WriteString(lp.GetValue())
		b.WriteByte(0)
	}
	return b.String()
}

// addModel notes the model a series names: label model_name, else model_id
// (TGI), else model (Dynamo's frontend).
func addModel(models *[]string, m *dto.Metric) {
	var fallback string
	for _, lp := range m.GetLabel() {
		switch lp.GetName() {
		case "model_name", "model_id":
			if lp.GetValue() != "" {
				*models = append(*models, lp.GetValue())
				return
			}
		case "model":
			fallback = lp.GetValue()
		}
	}
	if fallback != "" {
		*models = append(*models, fallback)
	}
}
