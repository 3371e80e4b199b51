package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var latencyMetrics = []string{"ttft", "itl", "e2e", "queue"}

// hourLatencyMetrics are the latency breakdown's metrics, kept at hour
// steps and coarser only (query.HourLatencyMetrics): prefill, decode
// (E2E - TTFT) and E2E per output-length class. --metric may name them;
// the default shows latencyMetrics.
var hourLatencyMetrics = []string{"prefill", "decode", "e2e_short", "e2e_medium", "e2e_long"}

// knownLatencyMetrics are all the names --metric accepts.
var knownLatencyMetrics = slices.Concat(latencyMetrics, hourLatencyMetrics)

// maxExactRange is the longest range the API computes exact quantiles for
// (query.MaxExactRange).
const maxExactRange = 24 * time.Hour

// latencyConfig is the configuration of "latency".
type latencyConfig struct {
	selectorConfig
	// Exact asks for quantiles from raw events instead of histograms.
	Exact bool
	// Metrics are the latencies shown in tables and CSV, in order.
	Metrics []string
}

// Validate reports every problem at once.
func (c latencyConfig) Validate() error {
	errs := c.selectorConfig.validate()
	if len(c.Metrics) == 0 {
		errs = append(errs, fmt.Errorf("--metric: want any of %s", strings.Join(knownLatencyMetrics, ", ")))
	}
	for _, m := range c.Metrics {
		if !slices.Contains(knownLatencyMetrics, m) {
			errs = append(errs, fmt.Errorf("--metric %q: want any of %s", m, strings.Join(knownLatencyMetrics, ", ")))
		}
	}
	if c.Exact && c.End.Sub(c.Start) > maxExactRange {
		errs = append(errs, fmt.Errorf("--exact: the range is %s, exact quantiles need at most %s", c.End.Sub(c.Start), maxExactRange))
	}
	return errors.Join(errs...)
}

func parseLatency(args []string, getenv func(string) string, now time.Time, stderr io.Writer) (latencyConfig, error) {
	var c latencyConfig
	var metrics *string
	err := parseSelectorFlags(&c.selectorConfig, "latency",
		"Prints TTFT, inter-token, end-to-end and queue latency (count, mean, p50, p90,\n"+
			"p95, p99 in milliseconds) per step, group and metric from GET /v1/latency,\n"+
			"with a SUMMARY row per group and metric over the whole range. Quantiles come\n"+
			"from histograms within 1% relative error, or with --exact from raw events.\n"+
			"With --step total the SUMMARY rows are the only rows.", metricsShape,
		func(fs *flag.FlagSet) {
			fs.BoolVar(&c.Exact, "exact", false, "exact quantiles from raw events (ranges of at most 24h; slower)")
			metrics = fs.String("metric", strings.Join(latencyMetrics, ","), "comma-separated latencies to show: ttft, itl, e2e, queue, and at hour steps\n"+
				"or coarser prefill, decode, e2e_short, e2e_medium, e2e_long (E2E by output\n"+
				"length: <256, 256-1023, >=1024 tokens) (json holds all)")
		}, args, getenv, now, stderr)
	if err != nil {
		return c, err
	}
	c.Metrics = splitList(*metrics)
	return c, c.Validate()
}

func runLatency(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseLatency(args, getenv, time.Now(), stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	q := cfg.query()
	if cfg.Exact {
		q.Set("exact", "true")
	}
	all := &meterv1.GetLatencyResponse{}
	err = fetchPages(ctx, newClient(cfg.connConfig, 1), "/v1/latency", q, cfg.pageTokenParam(), func(p *meterv1.GetLatencyResponse) {
		all.Series = append(all.Series, p.GetSeries()...)
		all.RelativeAccuracy = p.GetRelativeAccuracy()
	})
	if err != nil {
		return err
	}
	table, err := cfg.writeSeries(stdout, all, len(all.GetSeries()), func(f cellFormat) *grid { return latencyGrid(cfg, all.GetSeries(), f) })
	if err != nil || !table {
		return err
	}
	accuracy := "exact (from raw events)"
	if a := all.GetRelativeAccuracy(); a > 0 {
		accuracy = "within " + strconv.FormatFloat(a*100, 'f', -1, 64) + "% relative error (histograms; --exact for exact ones)"
	}
	_, err = fmt.Fprintf(stdout, "\nLatencies in ms. TAIL is p99/p50, MAX_P99 the largest p99 of the steps. Quantiles %s.\n", accuracy)
	return err
}

// metricStats returns the distribution of metric m in p.
func metricStats(p *meterv1.LatencyPoint, m string) *meterv1.LatencyStats {
	switch m {
	case "ttft":
		return p.GetTtft()
	case "itl":
		return p.GetItl()
	case "e2e":
		return p.GetE2E()
	case "queue":
		return p.GetQueue()
	case "prefill":
		return p.GetPrefill()
	case "decode":
		return p.GetDecode()
	case "e2e_short":
		return p.GetE2EShortOutput()
	case "e2e_medium":
		return p.GetE2EMediumOutput()
	case "e2e_long":
		return p.GetE2ELongOutput()
	}
	return nil
}

// latencyGrid has a row per step, group and metric, and a summary row per
// group and metric. With step total the one step is the summary, so only
// the summary rows are written.
func latencyGrid(cfg latencyConfig, series []*meterv1.LatencySeries, f cellFormat) *grid {
	g := &grid{cols: slices.Concat(groupByColumns(cfg.GroupBy),
		[]column{{head: "START", csvHead: "start"}, {head: "METRIC", csvHead: "metric"}},
		numColumns("COUNT", "MEAN", "P50", "P90", "P95", "P99", "TAIL", "MAX_P99"))}
	row := func(group []string, start string, m string, st *meterv1.LatencyStats, summary bool) {
		cells := append(slices.Clone(group), start, m, f.count(st.GetCount()))
		if st.GetCount() == 0 {
			for range 6 {
				cells = append(cells, f.missing())
			}
		} else {
			cells = append(cells, f.float(st.GetMean()), f.float(st.GetP50()), f.float(st.GetP90()),
				f.float(st.GetP95()), f.float(st.GetP99()), f.fixed(st.GetTailRatio(), 2))
		}
		switch {
		case !summary:
			cells = append(cells, "")
		case st.GetCount() == 0:
			cells = append(cells, f.missing())
		default:
			cells = append(cells, f.float(st.GetMaxP99()))
		}
		g.add(cells...)
	}
	for _, s := range series {
		group := f.group(cfg.GroupBy, s.GetGroup())
		if cfg.Step != "total" {
			for _, p := range s.GetPoints() {
				for _, m := range cfg.Metrics {
					row(group, f.time(p.GetStart().AsTime()), m, metricStats(p, m), false)
				}
			}
		}
		for _, m := range cfg.Metrics {
			row(group, f.summaryStart(), m, metricStats(s.GetSummary(), m), true)
		}
	}
	return g
}
