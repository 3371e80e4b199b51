// Package capacity answers the capacity planner's questions from the
// rollups: how busy the GPUs are, how much load each deployment takes while
// meeting its SLO, when the peak is, how many GPUs a growth needs, and what
// the idle time costs. Build reads the hourly GPU usage and goodput of a
// range and computes a Report; the writers render it as CSV and as one
// self-contained HTML file. Every figure is defined in docs/architecture.md
// ("Capacity report").
package capacity

import (
	"time"

	"tokenmeter/billing"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// Group names what a report's units are: a deployment (default), a model
// (each deployment counted under the model that took most of its tokens) or
// a GPU type (each deployment under the type of most of its GPU time).
type Group string

const (
	ByDeployment Group = "deployment"
	ByModel      Group = "model"
	ByGPUType    Group = "gpu_type"
)

// Query selects a report.
type Query struct {
	// Start (inclusive) and End (exclusive) lie on whole UTC hours.
	Start, End time.Time
	// GroupBy is the unit of the report (default ByDeployment).
	GroupBy Group
	// Deployment restricts the report to one deployment when non-empty; it
	// is an error when the range has neither GPU samples nor traffic of it.
	Deployment string
	// Target is the goodput attainment the sustainable throughput must
	// keep (default 0.99), in (0, 1].
	Target float64
	// Growth multiplies the observed peak for GPUs needed (default 1: none);
	// TargetTokensPerSecond, when > 0, replaces the grown peak. Growth is a
	// decimal string ("1.3") so that the arithmetic stays exact.
	Growth                string
	TargetTokensPerSecond float64
	// HorizonWeeks is how far past the range's last complete week the peak
	// is forecast (default 13: a quarter; at most 104).
	HorizonWeeks int
	// MinHourRequests is the fewest requests an hour needs for its
	// attainment to count (default 100).
	MinHourRequests uint64
	// MissTolerance is the share of hours at or below the sustainable load
	// that may miss the target (isolated incidents; nil: 0.05).
	MissTolerance *float64
	// LowUtilization and HeadroomRisk are the thresholds of the findings
	// (defaults 0.3 and 0.2).
	LowUtilization, HeadroomRisk float64
	// Currency labels the amounts (the price book's currency).
	Currency string
	// Prices is the price book whose GPU prices (an entry without pool or
	// region, in force at End) price the plans; nil: no plan is priced.
	Prices *billing.PriceBook
	// MaxUnits is the most units listed one by one (default
	// DefaultMaxUnits, at most MaxMaxUnits); the rest are summed into the
	// report's Others.
	MaxUnits int
}

// Report is the capacity report of a range.
type Report struct {
	// Query is the query answered, normalized: every parameter in force,
	// defaults filled in (MissTolerance is never nil).
	Query
	// Fleet is every unit together. Units are the MaxUnits largest units
	// (by GPU time, then tokens, then name), ordered by name.
	Fleet Unit
	Units []Unit
	// Others is the units beyond MaxUnits summed into one (named
	// OthersName; nil when none was), UnitsInOthers their number.
	Others        *Unit
	UnitsInOthers int
	// Findings are in plain words, the most urgent first.
	Findings []Finding
	// NotEnoughData is set, with the reason, when the range has neither
	// GPU samples nor traffic: the report then invents no figure.
	NotEnoughData string
	// Plans are the deployments of the listed units, in name order: the
	// cost of 1M tokens at the sustainable load on each GPU type and the
	// cheapest GPU mix for the forecast peak. At most MaxUnits of them,
	// the largest by GPU time, then tokens, then name; PlansOmitted counts
	// the others. FleetPlan sums their mixes.
	Plans        []Plan
	PlansOmitted int
	FleetPlan    FleetPlan
}

// FleetPlan is the sum of the deployments' cheapest mixes: each deployment
// carries its own forecast peak on its own GPUs, so the fleet needs their
// sum (GPUs idle in one deployment's quiet hours do not serve another's
// peak without moving them).
type FleetPlan struct {
	// Parts are the GPUs of each type over the mixes, in type order.
	Parts []MixPart
	// GPUs, TokensPerSecond and CostPerHourNanos add up the mixes.
	GPUs             int64
	TokensPerSecond  float64
	CostPerHourNanos int64
	// Deployments counts the plans with a mix; Missing names those
	// without (their reasons are in their plans).
	Deployments int
	Missing     []string
	// AtMost is set when a mix is an upper bound (a lower-bound load).
	AtMost bool
}

// Unit is the capacity of one deployment, model or GPU type (or the fleet).
type Unit struct {
	// Name is the deployment, model or GPU type ("fleet" for the fleet).
	Name string
	// Deployments, Models and GPUTypes seen in the unit, sorted: at most
	// MaxMembers of each, the first in name order; DeploymentCount,
	// ModelCount and GPUTypeCount count them all.
	Deployments, Models, GPUTypes             []string
	DeploymentCount, ModelCount, GPUTypeCount int

	// Hours is the number of hours of the range; HoursWithGPUs the hours
	// with GPU samples.
	Hours, HoursWithGPUs int
	// GPUs: MeanGPUs is GPU-hours / HoursWithGPUs, MaxGPUs the most GPUs
	// (or MIG instances) in one hour.
	MeanGPUs float64
	MaxGPUs  uint32
	// MaxGPUEquivalents is the most GPU time of one hour in whole GPUs (a
	// MIG slice counts its fraction): what GPUs needed compares with.
	MaxGPUEquivalents float64
	// GPU time in hours, and utilization = busy / all; P95Utilization is
	// the 95th percentile (nearest rank) of the hourly utilizations.
	GPUHours, BusyGPUHours, IdleGPUHours float64
	Utilization, P95Utilization          float64
	// IdleShare is IdleGPUHours / GPUHours.
	IdleShare float64
	// Cost, in nanos of Report.Currency, at the prices in force when
	// sampled; UnpricedGPUHours had no price.
	CostNanos, BusyCostNanos, IdleCostNanos int64
	UnpricedGPUHours                        float64

	// Traffic: requests and tokens (input + output) of the range.
	Requests, GoodRequests    uint64
	InputTokens, OutputTokens uint64
	// Attainment is GoodRequests / Requests.
	Attainment float64
	// TokensPerSecondPerGPU is the tokens of hours with GPU samples over
	// their GPU-seconds.
	TokensPerSecondPerGPU float64
	// Peak is the hour of the most tokens per second (nil without traffic).
	Peak *PeakHour

	// Sustainable is the SLO-bounded load estimate (its Reason says why
	// there is none).
	Sustainable Sustainable
	// Headroom is 1 − peak load per GPU / sustainable load per GPU; valid
	// when HeadroomKnown.
	Headroom      float64
	HeadroomKnown bool
	// Needed are the GPUs needed: for the observed peak, for the grown (or
	// target) peak, and for the forecast peak, each with its arithmetic.
	Needed []GPUsNeeded

	// Profile is the mean tokens per second per UTC weekday (0 Sunday) and
	// hour of day, over every hour of the range in that slot; ProfileHours
	// counts those hours (0: the slot is not in the range).
	Profile      [7][24]float64
	ProfileHours [7][24]int
	// Trend is the weekly growth and the forecast of the peak.
	Trend Trend
	// HourPoints are the unit's hours with GPU samples or traffic, in time
	// order: the data of the scatter charts.
	HourPoints []HourPoint
	// GPUTelemetry is the unit's GPU memory, power, temperature, clock
	// throttling and SM activity over the range.
	GPUTelemetry rollup.GPUTelemetrySummary
	// Days are busy and idle cost and tokens per UTC day, in time order.
	Days []DayPoint
	// Hot is the hot band: the qualifying hours whose utilization was
	// above HotUtilization, against the other qualifying hours.
	Hot HotBand
}

// HotBand compares the attainment of a unit's qualifying hours above
// HotUtilization with that of its other qualifying hours.
type HotBand struct {
	Hours, OtherHours                int
	Requests, GoodRequests           uint64
	OtherRequests, OtherGoodRequests uint64
}

// PeakHour is the busiest hour of a unit.
type PeakHour struct {
	Start time.Time
	// TokensPerSecond is the unit's tokens over the hour, per second;
	// GPUs the mean GPUs of the hour (0 without GPU samples);
	// TokensPerSecondPerGPU their quotient (valid when GPUs > 0).
	TokensPerSecond       float64
	GPUs                  float64
	TokensPerSecondPerGPU float64
	// Requests and Attainment of the hour.
	Requests   uint64
	Attainment float64
	// Saturation is the engine stats of the unit's deployments in the
	// hour (queue depth, KV cache); nil without engine samples then.
	Saturation *query.EnginePoint
}

// Sustainable is the highest per-GPU load at which attainment stayed at or
// above the target.
type Sustainable struct {
	// Known is false when the data cannot support an estimate (Reason).
	Known  bool
	Reason string
	// TokensPerSecondPerGPU is the estimate: the load of Hour.
	TokensPerSecondPerGPU float64
	Hour                  time.Time
	// SupportingHours are the qualifying hours at or below the estimate,
	// MissedHours those of them below the target; QualifyingHours every
	// hour with GPU samples and at least MinHourRequests requests.
	SupportingHours, MissedHours, QualifyingHours int
	// LowerBound is set when no qualifying hour above the estimate missed
	// the target: the deployment was never saturated, so its capacity is at
	// least this.
	LowerBound bool
	// Saturated is set, without an estimate, when the busiest qualifying
	// hour missed the target too and no load met the miss tolerance: the
	// SLO is missed under load everywhere the data reaches.
	Saturated bool
}

// GPUsNeeded is the number of GPUs a load needs at the sustainable
// throughput, with the arithmetic in words.
type GPUsNeeded struct {
	// For is "observed peak", "growth 1.3", "target 5000 tokens/s" or
	// "forecast peak".
	For string
	// TokensPerSecond is the load; GPUs = ceil(TokensPerSecond /
	// sustainable tokens per second per GPU), computed exactly.
	TokensPerSecond float64
	GPUs            int64
	// Arithmetic shows the computation, e.g.
	// "ceil(1.3 × 9,360.0 tokens/s ÷ 1,200.0 tokens/s per GPU) = ceil(10.14) = 11".
	Arithmetic string
	// Change is GPUs − the unit's MaxGPUEquivalents rounded up (whole GPUs,
	// so that MIG slices compare with GPUs).
	Change int64
}

// Trend is the weekly growth of a unit and the forecast of its peak.
type Trend struct {
	// Weeks are the complete 7-day weeks from the range start.
	Weeks []WeekPoint
	// GrowthKnown is false (Reason) with fewer than two complete weeks or
	// a week without tokens.
	GrowthKnown bool
	Reason      string
	// TokensGrowth and PeakGrowth are the compound weekly growth rates
	// (0.05 = 5% a week) of a least-squares fit of the logarithms.
	TokensGrowth, PeakGrowth float64
	// Forecast is the least-squares linear forecast of the weekly peak at
	// ForecastAt (nil when there are fewer than three complete weeks).
	Forecast *Forecast
}

// WeekPoint is one complete week of a unit.
type WeekPoint struct {
	Start                   time.Time
	Tokens                  uint64
	PeakTokensPerSecond     float64
	PeakTokensPerSecondHour time.Time
}

// Forecast is a least-squares line through the weekly peaks.
type Forecast struct {
	At time.Time
	// TokensPerSecond is the forecast peak; Slope the change per week.
	TokensPerSecond, Slope, Intercept float64
	// R2 is the coefficient of determination of the fit; Weeks its points.
	R2    float64
	Weeks int
}

// HourPoint is one hour of a unit.
type HourPoint struct {
	Start                 time.Time
	GPUs                  float64
	Utilization           float64
	TokensPerSecond       float64
	TokensPerSecondPerGPU float64
	Requests              uint64
	GoodRequests          uint64
	Attainment            float64
	// Qualifies tells whether the hour counts for the sustainable load
	// (GPU samples and at least MinHourRequests requests).
	Qualifies bool
	// GPUTelemetry is the hour's GPU memory, power, temperature, clock
	// throttling and SM activity.
	GPUTelemetry rollup.GPUTelemetrySummary
}

// DayPoint is one UTC day of a unit.
type DayPoint struct {
	Start                        time.Time
	BusyCostNanos, IdleCostNanos int64
	BusyGPUHours, GPUHours       float64
	Tokens                       uint64
}

// Finding is one conclusion in plain words.
type Finding struct {
	// Unit is the unit it is about; Kind is "at_risk", "over_provisioned",
	// "not_enough_data" or "saturated".
	Unit, Kind string
	// Severity orders the findings: 2 act now, 1 look at it, 0 for information.
	Severity int
	Text     string
}
