package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func runGoodput(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseSelectorCommand("goodput",
		"Prints SLO attainment and goodput per step and group from GET /v1/goodput, with\n"+
			"a SUMMARY row per group over the whole range. GOOD counts requests with status\n"+
			"OK that met every threshold of their SLO rule; GOODPUT_RPS and GOOD_OUT_TPS are\n"+
			"good requests and their output tokens per second; GOODPUT_RATIO is the share\n"+
			"of output tokens that were good. With --step total the SUMMARY rows are the\n"+
			"only rows.", metricsShape, args, getenv, time.Now(), stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	all := &meterv1.GetGoodputResponse{}
	err = fetchPages(ctx, newClient(cfg.connConfig, 1), "/v1/goodput", cfg.query(), cfg.pageTokenParam(), func(p *meterv1.GetGoodputResponse) {
		all.Series = append(all.Series, p.GetSeries()...)
	})
	if err != nil {
		return err
	}
	_, err = cfg.writeSeries(stdout, all, len(all.GetSeries()), func(f cellFormat) *grid { return goodputGrid(cfg, all.GetSeries(), f) })
	return err
}

// goodputGrid has a row per step and group and a summary row per group.
func goodputGrid(cfg selectorConfig, series []*meterv1.GoodputSeries, f cellFormat) *grid {
	g := &grid{cols: slices.Concat(groupByColumns(cfg.GroupBy),
		[]column{{head: "START", csvHead: "start"}},
		numColumns("REQUESTS", "GOOD", "ATTAINMENT", "GOODPUT_RPS", "GOOD_OUT_TPS", "GOODPUT_RATIO", "SLO_VERSION"))}
	row := func(group []string, start string, p *meterv1.GoodputPoint) {
		version := fmt.Sprint(p.GetSloVersionMin())
		if p.GetSloVersionMax() != p.GetSloVersionMin() {
			version += fmt.Sprintf("-%d", p.GetSloVersionMax())
		}
		g.add(append(slices.Clone(group), start,
			f.count(p.GetRequests()), f.count(p.GetGoodRequests()), f.percent(p.GetAttainment()),
			f.float(p.GetGoodputRequestsPerSecond()), f.float(p.GetGoodputOutputTokensPerSecond()),
			f.fixed(p.GetGoodputRatio(), 4), version)...)
	}
	seriesRows(cfg, f, series, row)
	return g
}
