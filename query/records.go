package query

import (
	"cmp"
	"slices"
	"time"

	"tokenmeter/billing"
	"tokenmeter/rollup"
)

// UsageQuery selects exact usage totals.
type UsageQuery struct {
	// TenantID restricts to one tenant when non-empty.
	TenantID string
	// Start (inclusive) and End (exclusive) bound completed_at, to the millisecond.
	Start, End time.Time
	// Granularity is "minute", "hour", "day", "month" or "total" (default).
	Granularity string
	// GroupBy lists fields of UsageGroupFields.
	GroupBy []string
	// TokenSizes also reads tokens per request (UsageRow.Sizes), where the
	// rollups keep them: one more rollup read, which GetUsage makes and
	// internal callers need not pay for.
	TokenSizes bool
}

// StepSeconds is the width of the query's step in seconds: 0 for "total"
// (one step for the range), -1 for calendar months.
func (q UsageQuery) StepSeconds() int64 { return rollup.Granularities[q.Granularity] }

// UsageRow is the usage of one group in one bucket.
type UsageRow struct {
	Start        time.Time
	TenantID     string
	Model        string
	Deployment   string
	ModelVersion string
	// Engine and TensorParallelism are the serving labels of the rows'
	// hour, deployment and model (rollup.ServingLabel).
	Engine             string
	TensorParallelism  string
	Requests           int64
	Errors             int64
	PromptTokens       int64
	CachedPromptTokens int64
	OutputTokens       int64
	// Sizes are the tokens per request, from the hour-level rollups (nil
	// where they are not kept: Service.tokenSizes).
	Sizes *TokenSizes
}

// RollupQuery selects rollup rows merged per (step, group).
type RollupQuery struct {
	// TenantID restricts to one tenant when non-empty.
	TenantID string
	// Start (inclusive) and End (exclusive) must lie on minute boundaries;
	// the hour rollups are read when both lie on hour boundaries and Step
	// is not "minute".
	Start, End time.Time
	// Step is "minute", "hour", "day", "month" or "total".
	Step string
	// GroupBy lists fields of rollup.RollupGroupFields.
	GroupBy []string
	// Limit bounds the rows returned (0: no bound); Offset skips rows.
	Limit, Offset int
	// Columns chooses what is read (default: everything); what is not read
	// is zero in the rows.
	Columns RollupColumns
	// TokenSizes makes Service.Traffic also read tokens per request
	// (TrafficRow.Sizes), where the rollups keep them.
	TokenSizes bool
}

// StepSeconds is the width of the query's step in seconds: 0 for "total",
// -1 for calendar months.
func (q RollupQuery) StepSeconds() int64 { return rollup.Granularities[q.Step] }

// RollupColumns chooses the columns a rollup query reads.
type RollupColumns int

const (
	// AllColumns reads everything.
	AllColumns RollupColumns = iota
	// CounterColumns reads requests, errors, tokens and goodput: no latency.
	CounterColumns
	// LatencyColumns reads the latency distributions only.
	LatencyColumns
	// SizeColumns reads the rollup.HourDists histograms kept at the level
	// that keeps the token sizes for the query's grouping, if any (see
	// RollupQuery.level).
	SizeColumns
	// BreakdownColumns reads the rollup.HourDists histograms kept at the
	// level that keeps the most of prefill, decode and E2E per output
	// class for the query's grouping (see RollupQuery.level).
	BreakdownColumns
	// LatencyBreakdownColumns reads what LatencyColumns reads, and
	// Service.Rollups adds the rollup.HourDists it can for the query's
	// grouping (a BreakdownColumns read): GetLatency's read.
	LatencyBreakdownColumns
)

// Reads reports whether the query reads the counters, the latency columns
// and, at the hour levels, the histograms of rollup.HourDists that the
// level's table keeps (rollup.HourDistTables).
func (q RollupQuery) Reads() (counters, latency, hourDists bool) {
	return q.Columns == AllColumns || q.Columns == CounterColumns,
		q.Columns == AllColumns || q.Columns == LatencyColumns || q.Columns == LatencyBreakdownColumns,
		q.Columns == SizeColumns || q.Columns == BreakdownColumns
}

// Dist is one latency distribution: count, sum and sparse histogram.
type Dist struct {
	Count  uint64
	Sum    float64
	Keys   []int16
	Counts []uint64
}

// RollupRow is the merged rollup of one group in one step.
type RollupRow struct {
	Start        time.Time
	Group        map[string]string
	Requests     uint64
	Errors       uint64
	ErrorsBy     map[string]uint64 // per rollup.StatusClasses entry
	PromptTokens uint64
	CachedTokens uint64
	OutputTokens uint64
	Latency      map[string]Dist // per rollup.LatencyMetrics entry
	// HourDists holds the distributions of rollup.HourDists that the level
	// read keeps (rollup.HourDistTables; none at the minute level):
	// histograms, with Count their sum of counts and no Sum.
	HourDists map[string]Dist
	// DecodeUnkept says that HourDists["decode"] came from tenant rows
	// (hour or day) of which some were rolled up before those rows kept
	// decode (their decode arrays are empty, not "no decode"): the store
	// sets it, and Service.Rollups then reads decode from the group rows.
	DecodeUnkept bool
	// Goodput, counted with SLO versions MinSLO..MaxSLO (equal unless a
	// recomputation after an SLO change is still under way).
	GoodRequests     uint64
	GoodOutputTokens uint64
	MinSLO, MaxSLO   uint32
}

// TrafficRow is the traffic of one group in one step.
type TrafficRow struct {
	Start        time.Time
	Group        map[string]string
	Requests     uint64
	Errors       uint64
	ErrorsBy     map[string]uint64 // per rollup.StatusClasses entry
	PromptTokens uint64
	OutputTokens uint64
	// PeakMinuteRequests and PeakMinuteOutputTokens are the requests and
	// the output tokens of the step's busiest minute for each (the two may
	// come from different minutes).
	PeakMinuteRequests     uint64
	PeakMinuteOutputTokens uint64
	// Sizes are the tokens per request, from the hour-level rollups (nil
	// where they are not kept: Service.tokenSizes).
	Sizes *TokenSizes
}

// Add merges o, another step of the same series, into r: the counters add
// up and the busiest minute is the busier of the two (the steps of a series
// do not overlap, so this is the busiest minute of both).
func (r *TrafficRow) Add(o TrafficRow) {
	r.Requests += o.Requests
	r.Errors += o.Errors
	if r.ErrorsBy == nil {
		r.ErrorsBy = map[string]uint64{}
	}
	for c, n := range o.ErrorsBy {
		r.ErrorsBy[c] += n
	}
	r.PromptTokens += o.PromptTokens
	r.OutputTokens += o.OutputTokens
	r.PeakMinuteRequests = max(r.PeakMinuteRequests, o.PeakMinuteRequests)
	r.PeakMinuteOutputTokens = max(r.PeakMinuteOutputTokens, o.PeakMinuteOutputTokens)
	if r.Sizes != nil && o.Sizes != nil {
		r.Sizes.merge(o.Sizes)
	}
}

// RawLatencyRow holds the exact latency values of one group in one step,
// each list sorted.
type RawLatencyRow struct {
	Start  time.Time
	Group  map[string]string
	Values map[string][]float64 // per rollup.LatencyMetrics entry
}

// CostQuery selects allocated cost per (step, group).
type CostQuery struct {
	// TenantID restricts to one tenant when non-empty.
	TenantID string
	// Start (inclusive) and End (exclusive) lie on hour boundaries.
	Start, End time.Time
	// Step is "hour", "day", "month" or "total" (default).
	Step string
	// GroupBy lists fields of CostGroupFields.
	GroupBy []string
	// Busy and Idle name the policies (billing.BusyPolicies,
	// billing.IdlePolicies); defaults "tokens" and "separate".
	Busy, Idle string
}

// StepSeconds is the width of the query's step in seconds: 0 for "total",
// -1 for calendar months.
func (q CostQuery) StepSeconds() int64 { return rollup.Granularities[q.Step] }

// CostRow is the cost and usage of one group in one step.
type CostRow struct {
	Start time.Time
	Group map[string]string
	// CostNanos is the allocated cost, BusyNanos its busy part.
	CostNanos, BusyNanos                     int64
	Requests, InputTokens, CachedInputTokens uint64
	OutputTokens, GoodOutputTokens           uint64
	UnattributedRequests, UnattributedInput  uint64
	UnattributedOutput                       uint64
	// ListCharge is the usage at list prices; ListUnpricedRequests counts
	// requests of models without a list price.
	ListCharge           int64
	ListUnpricedRequests uint64
	PriceVersions        []string
	// GPUMs is the allocated GPU time in GPU-milliseconds, GPUBusyMs its
	// busy part (under the query's policies, as CostNanos and BusyNanos).
	GPUMs, GPUBusyMs uint64
}

// GPUUsageQuery selects GPU usage per (step, group).
type GPUUsageQuery struct {
	// Start (inclusive) and End (exclusive) lie on hour boundaries.
	Start, End time.Time
	// Step is "hour", "day", "month" or "total" (default).
	Step string
	// GroupBy lists fields of GPUGroupFields.
	GroupBy []string
	// NoTokens leaves out the tokens served, for a caller that reads them
	// elsewhere (the join reads every cost row of the range).
	NoTokens bool
	// Limit bounds the rows read (0: Service.GPUUsage applies
	// Config.MaxSeriesRows, and fails beyond it).
	Limit int
}

// StepSeconds is the width of the query's step in seconds: 0 for "total",
// -1 for calendar months.
func (q GPUUsageQuery) StepSeconds() int64 { return rollup.Granularities[q.Step] }

// GPUUsageRow is the GPU usage of one group in one step.
type GPUUsageRow struct {
	Start                                   time.Time
	Group                                   map[string]string
	GPUSeconds, BusySeconds, CoveredSeconds float64
	// InstanceSeconds is gpus × 3600 summed over hours: the denominator of coverage.
	InstanceSeconds                         float64
	EnergyJoules, UnpricedSeconds           float64
	MaxGPUs                                 uint32
	CostNanos, BusyCostNanos, IdleCostNanos int64
	// Tokens served, only when TokensKnown (grouped by deployment and/or gpu_type).
	InputTokens, OutputTokens uint64
	TokensKnown               bool
	PriceVersions             []string
	// Telemetry is the GPUs' memory, power, temperature, clock and SM
	// activity sums (rollup.GPUTelemetry).
	Telemetry rollup.GPUTelemetry
}

// Coverage is the share of the GPUs' hours that had samples.
func (r GPUUsageRow) Coverage() float64 {
	if r.InstanceSeconds == 0 {
		return 0
	}
	return r.CoveredSeconds / r.InstanceSeconds
}

// WithDefaults fills the policies the query leaves empty with those of the
// price book in force (its allocation section).
func (q CostQuery) WithDefaults(book *billing.PriceBook) CostQuery {
	q.Busy = cmp.Or(q.Busy, string(book.Allocation.Busy))
	q.Idle = cmp.Or(q.Idle, string(book.Allocation.Idle))
	return q
}

// Policies are the positions of q's busy and idle policies in
// billing.BusyPolicies() and billing.IdlePolicies() (the order the stored
// cost rows keep them in); -1 for an unknown one (Normalize refuses it).
func (q CostQuery) Policies() (busy, idle int) {
	busy = slices.Index(billing.BusyPolicies(), billing.BusyPolicy(q.Busy))
	idle = slices.Index(billing.IdlePolicies(), billing.IdlePolicy(q.Idle))
	return busy, idle
}

// UsageCostRow is one tenant's usage of one model on one deployment over
// one step (hour or day) with its list charge and allocated cost, from the
// cost rollups: a row of the detailed usage-and-cost export.
type UsageCostRow struct {
	Start                                    time.Time
	Tenant, Model, Deployment                string
	Requests, InputTokens, CachedInputTokens uint64
	OutputTokens                             uint64
	// ListCharge is the usage at list prices, ListUnpricedRequests the
	// requests of models without a price; CostNanos the allocated cost
	// under the query's policies and BusyNanos its busy share.
	ListCharge           int64
	ListUnpricedRequests uint64
	CostNanos, BusyNanos int64
	PriceVersions        []string
}
