package main

import (
	"context"
	"flag"
	"io"
	"slices"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// engineShape is the selector of GET /v1/engine-stats read on whole hours
// (the API also answers minute steps, for the minute retention window).
var engineShape = selectorShape{unit: time.Hour, unitName: "hour", steps: hourSteps,
	groupFields: []string{"deployment", "engine", "model", "replica"}, nothing: "engine samples"}

func runEngineStats(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		cfg         selectorConfig
		deployments string
	)
	err := parseSelectorFlags(&cfg, "engine-stats",
		"Prints the inference engines' saturation per step and group from\n"+
			"GET /v1/engine-stats, with a SUMMARY row per group over the whole range:\n"+
			"REPLICAS sampled, queue depth (WAIT_MEAN, WAIT_P95, WAIT_MAX: requests\n"+
			"waiting per replica), RUN_MEAN running requests, KV cache usage (KV_MEAN,\n"+
			"KV_MAX, KV_MIN), prefix-cache HIT_RATE, PREEMPT(ions) and engine RESTARTS.\n"+
			"In a SUMMARY row REPLICAS is the most of any step. --start and --end lie\n"+
			"on whole hours.",
		engineShape, func(fs *flag.FlagSet) {
			fs.StringVar(&deployments, "deployment", "", "only these deployments (comma-separated); default all")
		}, args, getenv, time.Now(), stderr)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	all := &meterv1.GetEngineStatsResponse{}
	q := cfg.query()
	for _, d := range splitList(deployments) {
		q.Add("deployment", d)
	}
	err = fetchPages(ctx, newClient(cfg.connConfig, 1), "/v1/engine-stats", q, cfg.pageTokenParam(), func(p *meterv1.GetEngineStatsResponse) {
		all.Series = append(all.Series, p.GetSeries()...)
	})
	if err != nil {
		return err
	}
	_, err = cfg.writeSeries(stdout, all, len(all.GetSeries()), func(f cellFormat) *grid { return engineGrid(cfg, all.GetSeries(), f) })
	return err
}

// engineGrid has a row per step and group and a summary row per group.
func engineGrid(cfg selectorConfig, series []*meterv1.EngineStatsSeries, f cellFormat) *grid {
	g := &grid{cols: slices.Concat(groupByColumns(cfg.GroupBy),
		[]column{{head: "START", csvHead: "start"}},
		numColumns("REPLICAS", "SAMPLES", "WAIT_MEAN", "WAIT_P95", "WAIT_MAX", "RUN_MEAN", "RUN_MAX", "KV_MEAN", "KV_MAX", "KV_MIN", "HIT_RATE", "PREEMPT", "RESTARTS"))}
	row := func(group []string, start string, p *meterv1.EngineStatsPoint) {
		kvMean, kvMax, kvMin, hit := f.missing(), f.missing(), f.missing(), f.missing()
		if p.GetKvCacheSamples() > 0 {
			kvMean, kvMax, kvMin = f.percent(p.GetKvCacheUsageMean()), f.percent(p.GetKvCacheUsageMax()), f.percent(p.GetKvCacheUsageMin())
		}
		if p.PrefixCacheHitRate != nil {
			hit = f.percent(p.GetPrefixCacheHitRate())
		}
		g.add(append(slices.Clone(group), start,
			f.count(p.GetReplicas()), f.count(p.GetSamples()), f.float(p.GetWaitingMean()), f.count(uint64(p.GetWaitingP95())),
			f.count(uint64(p.GetWaitingMax())), f.float(p.GetRunningMean()), f.count(uint64(p.GetRunningMax())), kvMean, kvMax, kvMin, hit,
			f.count(p.GetPreemptions()), f.count(p.GetRestarts()))...)
	}
	seriesRows(cfg, f, series, row)
	return g
}
