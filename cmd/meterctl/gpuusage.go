package main

import (
	"context"
	"io"
	"slices"
	"strconv"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var (
	// gpuGroupFields are the dimensions GPU usage groups by
	// (query.GPUGroupFields).
	gpuGroupFields = []string{"deployment", "gpu_type", "pool", "region", "mig_profile", "node", "gpu"}
	// tokenGroupFields are those the server can join tokens on: grouped by
	// any other, an answer has no tokens per GPU-hour.
	tokenGroupFields = []string{"deployment", "gpu_type"}

	// gpuShape is the selector of GET /v1/gpu-usage: like cost's, without
	// a tenant (GPUs are not a tenant's).
	gpuShape = selectorShape{unit: time.Hour, unitName: "hour", steps: hourSteps,
		groupFields: gpuGroupFields, nothing: "GPU samples"}
)

func runGPUUsage(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseSelectorCommand("gpu-usage",
		"Prints GPU time, utilization, energy and GPU cost per step and group from\n"+
			"GET /v1/gpu-usage, with a SUMMARY row per group over the whole range. GPU_H\n"+
			"is the sampled GPU time (a MIG slice counts its fraction), BUSY_H that time\n"+
			"weighted by utilization, IDLE_H the rest. COVERAGE is the share of the GPUs'\n"+
			"time that had samples; MAX_GPUS the most GPUs in one hour. UNPRICED_H is GPU\n"+
			"time without a price, not in COST. TOK/GPU_H is input and output tokens per\n"+
			"GPU-hour, known when grouped by nothing but deployment and gpu_type. --start\n"+
			"and --end lie on whole hours. With --step total the SUMMARY rows are the only\n"+
			"rows.",
		gpuShape, args, getenv, time.Now(), stderr)
	if err != nil {
		return err
	}
	if validatedOnly(stdout, cfg.ValidateOnly) {
		return nil
	}
	all := &meterv1.GetGpuUsageResponse{}
	err = fetchPages(ctx, newClient(cfg.connConfig, 1), "/v1/gpu-usage", cfg.query(), cfg.pageTokenParam(), func(p *meterv1.GetGpuUsageResponse) {
		all.Series = append(all.Series, p.GetSeries()...)
		all.Currency = p.GetCurrency()
		all.PriceVersions = mergeVersions(all.PriceVersions, p.GetPriceVersions())
	})
	if err != nil {
		return err
	}
	table, err := cfg.writeSeries(stdout, all, len(all.GetSeries()), func(f cellFormat) *grid { return gpuGrid(cfg, all, f) })
	if err != nil {
		return err
	}
	footer, warning := gpuNotes(cfg.GroupBy, all)
	return writeNotes(stdout, stderr, table, footer, warning)
}

// gpuNotes returns the footer of a GPU usage table, which names the
// currency and price versions, and a warning of GPU time without a price
// ("" when there is none).
func gpuNotes(groupBy []string, all *meterv1.GetGpuUsageResponse) (footer, warning string) {
	footer = priceNote(all.GetCurrency(), all.GetPriceVersions())
	if !tokensKnown(groupBy) {
		footer += " TOK/GPU_H is known when grouped by nothing but deployment and gpu_type."
	}
	var unpriced float64
	for _, s := range all.GetSeries() {
		unpriced += s.GetSummary().GetUnpricedGpuHours()
	}
	if unpriced > 0 {
		warning = strconv.FormatFloat(unpriced, 'g', 4, 64) + " GPU-hours had no price in the price book: their cost is not included"
	}
	return footer, warning
}

// tokensKnown tells whether answers grouped by groupBy hold tokens.
func tokensKnown(groupBy []string) bool {
	for _, g := range groupBy {
		if !slices.Contains(tokenGroupFields, g) {
			return false
		}
	}
	return true
}

// gpuGrid has a row per step and group and a summary row per group.
func gpuGrid(cfg selectorConfig, all *meterv1.GetGpuUsageResponse, f cellFormat) *grid {
	g := moneyGrid(cfg.GroupBy, f,
		column{head: "GPU_H", csvHead: "gpu_hours", num: true},
		column{head: "BUSY_H", csvHead: "busy_gpu_hours", num: true},
		column{head: "IDLE_H", csvHead: "idle_gpu_hours", num: true},
		column{head: "UTIL", csvHead: "utilization", num: true},
		column{head: "COVERAGE", csvHead: "coverage", num: true},
		column{head: "MAX_GPUS", csvHead: "max_gpus", num: true},
		column{head: "ENERGY_KWH", csvHead: "energy_kwh", num: true},
		column{head: "COST", csvHead: "cost", num: true},
		column{head: "IDLE_COST", csvHead: "idle_cost", num: true},
		column{head: "UNPRICED_H", csvHead: "unpriced_gpu_hours", num: true},
		column{head: "TOK/GPU_H", csvHead: "tokens_per_gpu_hour", num: true})
	cur := all.GetCurrency()
	tokens := tokensKnown(cfg.GroupBy)
	seriesRows(cfg, f, all.GetSeries(), func(group []string, start string, p *meterv1.GpuUsagePoint) {
		perGPUHour := f.missing()
		if tokens {
			perGPUHour = f.fixed(p.GetTokensPerGpuHour(), 0)
		}
		g.add(append(f.lead(group, start, p.GetCost(), cur),
			f.float(p.GetGpuHours()), f.float(p.GetBusyGpuHours()), f.float(p.GetIdleGpuHours()),
			f.percent(p.GetUtilization()), f.percent(p.GetCoverage()), f.count(uint64(p.GetMaxGpus())),
			f.float(p.GetEnergyKwh()), f.money(p.GetCost(), cur), f.money(p.GetIdleCost(), cur),
			f.float(p.GetUnpricedGpuHours()), perGPUHour)...)
	})
	return g
}
