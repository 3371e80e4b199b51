// Package capacitytest is an in-memory source of the capacity report's two
// reads (hourly GPU usage per deployment and GPU type, hourly counters per
// model and deployment) with a generated demo fleet, for tests that run the
// real report (capacity.Build, the API's ReportService) without ClickHouse:
// the REST files, meterctl report capacity and the HTML report in a
// browser. It keeps no price book, so amounts are in the empty book's
// currency.
package capacitytest

import (
	"context"
	"errors"
	"math"
	"time"

	"tokenmeter/query"
	"tokenmeter/query/capacity"
)

// Fleet answers the report's reads from its rows, those of the asked range.
type Fleet struct {
	GPU    []query.GPUUsageRow
	Use    []query.RollupRow
	Engine []query.EngineRow
}

var _ capacity.Source = (*Fleet)(nil)

// GPUUsage returns the GPU rows in [q.Start, q.End).
func (f *Fleet) GPUUsage(_ context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error) {
	var out []query.GPUUsageRow
	for _, r := range f.GPU {
		if !r.Start.Before(q.Start) && r.Start.Before(q.End) {
			out = append(out, r)
		}
	}
	return out, nil
}

// DeploymentHours returns the counter rows in [start, end).
func (f *Fleet) DeploymentHours(_ context.Context, start, end time.Time) ([]query.RollupRow, error) {
	var out []query.RollupRow
	for _, r := range f.Use {
		if !r.Start.Before(start) && r.Start.Before(end) {
			out = append(out, r)
		}
	}
	return out, nil
}

// EngineStats returns the engine rows in [q.Start, q.End) (the report asks
// for hour steps by deployment).
func (f *Fleet) EngineStats(_ context.Context, q query.EngineQuery) ([]query.EngineRow, error) {
	var out []query.EngineRow
	for _, r := range f.Engine {
		if !r.Start.Before(q.Start) && r.Start.Before(q.End) {
			out = append(out, r)
		}
	}
	return out, nil
}

// EngineHour adds an hour of engine samples of a deployment: each of
// replicas sampled 360 times with queue depth waiting and KV-cache usage kv.
func (f *Fleet) EngineHour(dep string, at time.Time, replicas uint64, waiting uint32, kv float64) {
	n := 360 * replicas
	r := query.EngineRow{Start: at, Group: map[string]string{"deployment": dep}, Replicas: replicas}
	r.Samples, r.SampledSeconds = n, 10*float64(n)
	r.WaitingWeighted, r.WaitingSeconds, r.WaitingMax = 10*float64(n)*float64(waiting), 10*float64(n), waiting
	r.WaitingValues, r.WaitingCounts = []uint32{waiting}, []uint64{n}
	r.KVWeighted, r.KVSeconds, r.KVMax, r.KVSamples = 10*float64(n)*kv, 10*float64(n), kv, n
	f.Engine = append(f.Engine, r)
}

// CurrentPriceBook reports that there is no price book.
func (f *Fleet) CurrentPriceBook(context.Context) (string, string, time.Time, bool, error) {
	return "", "", time.Time{}, false, nil
}

// PutPriceBook refuses: the fleet is read-only.
func (f *Fleet) PutPriceBook(context.Context, string, string, string, time.Time) error {
	return errors.New("capacitytest: the fleet keeps no price book")
}

// Hour adds an hour of gpus GPUs of a deployment at utilization util,
// each costing nanosPerGPUHour.
func (f *Fleet) Hour(dep, gpuType string, at time.Time, gpus uint32, util float64, nanosPerGPUHour int64) {
	sec := float64(gpus) * 3600
	cost := int64(gpus) * nanosPerGPUHour
	busy := int64(math.Round(float64(cost) * util))
	f.GPU = append(f.GPU, query.GPUUsageRow{Start: at, Group: map[string]string{"deployment": dep, "gpu_type": gpuType},
		GPUSeconds: sec, BusySeconds: sec * util, CoveredSeconds: sec, InstanceSeconds: sec, MaxGPUs: gpus,
		CostNanos: cost, BusyCostNanos: busy, IdleCostNanos: cost - busy})
}

// Traffic adds an hour of requests of a model on a deployment.
func (f *Fleet) Traffic(model, dep string, at time.Time, requests, good, in, out uint64) {
	f.Use = append(f.Use, query.RollupRow{Start: at, Group: map[string]string{"model": model, "deployment": dep},
		Requests: requests, GoodRequests: good, PromptTokens: in, OutputTokens: out})
}

// Deployment describes one deployment of a demo fleet.
type Deployment struct {
	Name, Model, GPUType string
	GPUs                 uint32
	// NanosPerGPUHour is the price of one GPU-hour.
	NanosPerGPUHour int64
	// PeakPerGPU is the tokens per second per GPU of the first week's
	// busiest hour; the load follows a daily wave from a tenth of it, and
	// grows by WeeklyGrowth a week.
	PeakPerGPU, WeeklyGrowth float64
	// Knee is the load per GPU above which attainment falls (0: never).
	Knee float64
}

// DemoDeployments are three deployments with known shapes: one that
// saturates at 2,000 tokens/s per GPU and grows 4% a week, one that idles,
// and one whose name is markup (user data to be escaped).
var DemoDeployments = []Deployment{
	{Name: "chat-prod", Model: "llama-3.1-70b", GPUType: "H100", GPUs: 8, NanosPerGPUHour: 3_600_000_000,
		PeakPerGPU: 2_200, WeeklyGrowth: 0.04, Knee: 2_000},
	{Name: "batch-spare", Model: "mistral-7b", GPUType: "A100", GPUs: 4, NanosPerGPUHour: 1_800_000_000,
		PeakPerGPU: 150, WeeklyGrowth: 0},
	{Name: `<script>alert(1)</script>`, Model: "qwen-2.5-32b", GPUType: "L40S", GPUs: 2, NanosPerGPUHour: 1_100_000_000,
		PeakPerGPU: 900, WeeklyGrowth: 0.02},
}

// Demo is a fleet of deps over days days from start: every hour has GPU
// samples and traffic following each deployment's daily wave (busier on
// weekdays), with 900 tokens per request.
func Demo(start time.Time, days int, deps []Deployment) *Fleet {
	f := &Fleet{}
	for _, d := range deps {
		for h := range days * 24 {
			at := start.Add(time.Duration(h) * time.Hour)
			wave := 0.55 - 0.45*math.Cos(2*math.Pi*float64(at.Hour()-2)/24) // 0.1 at 02:00, 1 at 14:00
			if wd := at.Weekday(); wd == time.Saturday || wd == time.Sunday {
				wave *= 0.7
			}
			perGPU := d.PeakPerGPU * wave * math.Pow(1+d.WeeklyGrowth, float64(h)/168)
			tokens := uint64(perGPU * float64(d.GPUs) * 3600)
			requests := tokens / 900
			att := 0.998
			if d.Knee > 0 && perGPU > d.Knee {
				att = math.Max(0.5, 0.998-(perGPU-d.Knee)/d.Knee*2)
			}
			util := math.Min(0.97, 0.05+0.9*wave*math.Max(d.PeakPerGPU/2_000, 0.05))
			f.Hour(d.Name, d.GPUType, at, d.GPUs, util, d.NanosPerGPUHour)
			f.Traffic(d.Model, d.Name, at, requests, uint64(math.Round(float64(requests)*att)), tokens*4/5, tokens-tokens*4/5)
		}
	}
	return f
}
