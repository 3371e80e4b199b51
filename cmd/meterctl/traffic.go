package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// topErrorClasses is how many error classes a traffic table shows per row;
// CSV shows them all.
const topErrorClasses = 3

func runTraffic(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseSelectorCommand("traffic",
		"Prints request and token rates and error rates per step and group from\n"+
			"GET /v1/traffic, with a SUMMARY row per group over the whole range. Rates are\n"+
			"means over the step; PEAK_RPS and PEAK_OUT_TPS are those of the busiest\n"+
			"minute. TOP_ERRORS lists the most frequent error classes with their counts.\n"+
			"With --step total the SUMMARY rows are the only rows.", metricsShape, args, getenv, time.Now(), stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	all := &meterv1.GetTrafficResponse{}
	err = fetchPages(ctx, newClient(cfg.connConfig, 1), "/v1/traffic", cfg.query(), cfg.pageTokenParam(), func(p *meterv1.GetTrafficResponse) {
		all.Series = append(all.Series, p.GetSeries()...)
	})
	if err != nil {
		return err
	}
	_, err = cfg.writeSeries(stdout, all, len(all.GetSeries()), func(f cellFormat) *grid { return trafficGrid(cfg, all.GetSeries(), f) })
	return err
}

// errorClasses lists the error classes of byClass as "class:count", most
// frequent first, at most limit of them (0: all).
func errorClasses(byClass map[string]uint64, limit int, f cellFormat) string {
	classes := slices.SortedFunc(maps.Keys(byClass), func(a, b string) int {
		return cmp.Or(cmp.Compare(byClass[b], byClass[a]), cmp.Compare(a, b))
	})
	classes = slices.DeleteFunc(classes, func(c string) bool { return byClass[c] == 0 })
	if len(classes) == 0 {
		return f.missing()
	}
	var parts []string
	for i, c := range classes {
		if limit > 0 && i == limit {
			parts = append(parts, fmt.Sprintf("+%d more", len(classes)-limit))
			break
		}
		parts = append(parts, fmt.Sprintf("%s:%d", c, byClass[c]))
	}
	return strings.Join(parts, " ")
}

// trafficGrid has a row per step and group and a summary row per group.
func trafficGrid(cfg selectorConfig, series []*meterv1.TrafficSeries, f cellFormat) *grid {
	g := &grid{cols: slices.Concat(groupByColumns(cfg.GroupBy),
		[]column{{head: "START", csvHead: "start"}},
		numColumns("REQUESTS", "RPS", "PEAK_RPS", "IN_TPS", "OUT_TPS", "PEAK_OUT_TPS", "ERROR_RATE"),
		[]column{{head: "TOP_ERRORS", csvHead: "errors_by_class"}})}
	limit := topErrorClasses
	if f.csv {
		limit = 0
	}
	row := func(group []string, start string, p *meterv1.TrafficPoint) {
		g.add(append(slices.Clone(group), start,
			f.count(p.GetRequests()), f.float(p.GetRequestsPerSecond()), f.float(p.GetPeakRequestsPerSecond()),
			f.float(p.GetInputTokensPerSecond()), f.float(p.GetOutputTokensPerSecond()), f.float(p.GetPeakOutputTokensPerSecond()),
			f.percent(p.GetErrorRate()), errorClasses(p.GetErrorsByClass(), limit, f))...)
	}
	seriesRows(cfg, f, series, row)
	return g
}
