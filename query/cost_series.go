package query

import (
	"slices"
	"time"

	"tokenmeter/billing"
	"tokenmeter/rollup"
)

// CostPoint is the cost and usage of a step (or, as a summary, of the
// range), with its figures per 1,000 tokens.
type CostPoint struct {
	Start time.Time
	// CostNanos is the allocated cost, BusyNanos its busy part, IdleNanos
	// the rest.
	CostNanos, BusyNanos, IdleNanos                                          int64
	Requests, InputTokens, CachedInputTokens, OutputTokens, GoodOutputTokens uint64
	UnattributedRequests, UnattributedInput, UnattributedOutput              uint64
	ListCharge                                                               int64
	ListUnpricedRequests                                                     uint64
	// Cost (and busy cost) per 1,000 output tokens, per 1,000 tokens (input
	// and output) and per 1,000 good output tokens; zero-valued Per1K when
	// there are no such tokens.
	CostPer1KOutput, CostPer1K, BusyCostPer1KOutput, BusyCostPer1K, CostPer1KGoodOutput Per1K
	// CostPerRequest is CostNanos / Requests (attributed requests); not OK
	// without requests.
	CostPerRequest Per1K
	// GPUMs is the allocated GPU time in GPU-milliseconds, GPUBusyMs its
	// busy part, GPUIdleMs the rest.
	GPUMs, GPUBusyMs, GPUIdleMs uint64
}

// Per1K is an amount per 1,000 tokens; OK is false without tokens.
type Per1K struct {
	Money billing.Money
	OK    bool
}

func per1K(nanos int64, tokens uint64) Per1K {
	m, ok := billing.CostPer1K(billing.Money(nanos), int64(tokens))
	return Per1K{Money: m, OK: ok}
}

func (p *CostPoint) add(r CostRow) {
	p.CostNanos += r.CostNanos
	p.BusyNanos += r.BusyNanos
	p.Requests += r.Requests
	p.InputTokens += r.InputTokens
	p.CachedInputTokens += r.CachedInputTokens
	p.OutputTokens += r.OutputTokens
	p.GoodOutputTokens += r.GoodOutputTokens
	p.UnattributedRequests += r.UnattributedRequests
	p.UnattributedInput += r.UnattributedInput
	p.UnattributedOutput += r.UnattributedOutput
	p.ListCharge += r.ListCharge
	p.ListUnpricedRequests += r.ListUnpricedRequests
	p.GPUMs += r.GPUMs
	p.GPUBusyMs += r.GPUBusyMs
}

func (p *CostPoint) finish(start time.Time) {
	p.Start = start
	p.IdleNanos = p.CostNanos - p.BusyNanos
	p.CostPer1KOutput = per1K(p.CostNanos, p.OutputTokens)
	p.CostPer1K = per1K(p.CostNanos, p.InputTokens+p.OutputTokens)
	p.BusyCostPer1KOutput = per1K(p.BusyNanos, p.OutputTokens)
	p.BusyCostPer1K = per1K(p.BusyNanos, p.InputTokens+p.OutputTokens)
	p.CostPer1KGoodOutput = per1K(p.CostNanos, p.GoodOutputTokens)
	// cost × 1000 / (requests × 1000): the cost of one request, rounded to
	// the nano as the figures per 1,000 tokens are.
	p.CostPerRequest = per1K(p.CostNanos, p.Requests*1000)
	p.GPUIdleMs = p.GPUMs - p.GPUBusyMs
}

// GPUUsagePoint is the GPU usage of a step (or of the range).
type GPUUsagePoint struct {
	Start                                   time.Time
	GPUHours, BusyGPUHours, IdleGPUHours    float64
	Utilization                             float64 // busy / GPU time
	EnergyKWh                               float64
	Coverage                                float64 // sampled share of the GPUs' hours
	MaxGPUs                                 uint32
	CostNanos, BusyCostNanos, IdleCostNanos int64
	UnpricedGPUHours                        float64
	// Tokens served, when TokensKnown (see GPUUsageRow): input, output,
	// their total, and the total per GPU-hour.
	TokensKnown                            bool
	InputTokens, OutputTokens, TotalTokens uint64
	TokensPerGPUHour                       float64
	// Telemetry is the GPUs' memory, power, temperature, clock and SM
	// activity over the step.
	Telemetry rollup.GPUTelemetrySummary

	gpu, busy, covered, inst, energy, unpriced float64
	telemetry                                  rollup.GPUTelemetry
}

func (p *GPUUsagePoint) add(r GPUUsageRow) {
	p.gpu += r.GPUSeconds
	p.busy += r.BusySeconds
	p.covered += r.CoveredSeconds
	p.inst += r.InstanceSeconds
	p.energy += r.EnergyJoules
	p.unpriced += r.UnpricedSeconds
	p.MaxGPUs = max(p.MaxGPUs, r.MaxGPUs)
	p.CostNanos += r.CostNanos
	p.BusyCostNanos += r.BusyCostNanos
	p.IdleCostNanos += r.IdleCostNanos
	p.InputTokens += r.InputTokens
	p.OutputTokens += r.OutputTokens
	p.TokensKnown = r.TokensKnown
	p.telemetry.Merge(r.Telemetry)
}

func (p *GPUUsagePoint) finish(start time.Time) {
	p.Start = start
	p.GPUHours, p.BusyGPUHours, p.IdleGPUHours = p.gpu/3600, p.busy/3600, (p.gpu-p.busy)/3600
	p.Utilization = Ratio(p.busy, p.gpu)
	p.EnergyKWh = p.energy / 3.6e6
	p.Coverage = Ratio(p.covered, p.inst)
	p.UnpricedGPUHours = p.unpriced / 3600
	p.Telemetry = p.telemetry.Summary()
	if p.TokensKnown {
		p.TotalTokens = p.InputTokens + p.OutputTokens
		p.TokensPerGPUHour, _ = billing.TokensPerGPUHour(int64(p.TotalTokens), p.gpu)
	}
}

// Series is one group's points (a step each, in time order) and their
// summary over the range.
type Series[P any] struct {
	Group   map[string]string
	Points  []P
	Summary P
}

// point is a CostPoint or a GPUUsagePoint being summed.
type point[R, P any] interface {
	*P
	add(R)
	finish(start time.Time)
}

// seriesOf builds the series of one page: a point per row (rows are steps
// in time order) and a summary over the range, and lists the price versions
// the rows were computed with.
func seriesOf[R, P any, PP point[R, P]](q Page, rangeStart time.Time, rows []R,
	meta func(R) (group map[string]string, start time.Time, versions []string)) ([]Series[P], string, []string) {
	keys, byKey, next := Paginate(q, rows, func(r R) map[string]string { g, _, _ := meta(r); return g })
	versions := map[string]bool{}
	var out []Series[P]
	for _, k := range keys {
		var (
			s     Series[P]
			total P
		)
		for _, r := range byKey[k] {
			group, start, vs := meta(r)
			s.Group = group
			var step P
			PP(&step).add(r)
			PP(&step).finish(start)
			PP(&total).add(r)
			s.Points = append(s.Points, step)
			for _, v := range vs {
				versions[v] = true
			}
		}
		PP(&total).finish(rangeStart)
		s.Summary = total
		out = append(out, s)
	}
	var vs []string
	for v := range versions {
		if v != "" {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return out, next, vs
}

// CostSeriesOf builds the page p of cost series of the normalized query q
// from its rows (Service.Cost), with the next page's token and the price
// versions the rows were computed with.
func CostSeriesOf(q CostQuery, p Page, rows []CostRow) (series []Series[CostPoint], next string, versions []string) {
	return seriesOf[CostRow, CostPoint](p, q.Start, rows, func(r CostRow) (map[string]string, time.Time, []string) {
		return r.Group, r.Start, r.PriceVersions
	})
}

// GPUUsageSeriesOf builds the page p of GPU usage series of the normalized
// query q from its rows (Service.GPUUsage), with the next page's token and
// the price versions.
func GPUUsageSeriesOf(q GPUUsageQuery, p Page, rows []GPUUsageRow) (series []Series[GPUUsagePoint], next string, versions []string) {
	return seriesOf[GPUUsageRow, GPUUsagePoint](p, q.Start, rows, func(r GPUUsageRow) (map[string]string, time.Time, []string) {
		return r.Group, r.Start, r.PriceVersions
	})
}
