package rollup

import "time"

// The records the rollup job reads from and writes to its store
// (internal/adapter/chstore implements the store).

// HourGroup is one (tenant, model, model_version, deployment, gpu_type,
// slo_class) of an hour's events.
type HourGroup struct {
	// Hash is the events' group_hash (cityHash64 of the six dimensions),
	// as in HourEvent.Group.
	Hash uint64
	// Dims are the dimensions, in RollupGroupFields order.
	Dims [6]string
	// Rows counts the group's rows in the hour, duplicates included.
	Rows uint64
}

// HourEvent is one deduplicated event of an hour, as the rollup reads it.
type HourEvent struct {
	CompletedAt uint32 // Unix seconds
	Group       uint64 // HourGroup.Hash of its group
	// Status is 1 for ok, 2 + its index in StatusClasses, or 0 for another
	// error.
	Status uint8
	// TTFTEstimated marks a TTFT taken from E2E (the label
	// ttft_source=e2e, OTLP's --otlp-ttft-from-e2e): it is left out of
	// the TTFT distribution, decode and goodput's TTFT check.
	TTFTEstimated          bool
	Prompt, Cached, Output uint64
	Latency                [4]float64 // LatencyMetrics order; NaN: missing
	Prefill                float64    // ms; NaN: missing
}

// OK reports whether the request succeeded.
func (e *HourEvent) OK() bool { return e.Status == 1 }

// RollupRecord is one row of a rollup table, as written.
type RollupRecord struct {
	Bucket                 time.Time
	Dims                   [6]string // RollupGroupFields order; empty where merged
	Requests, Errors       uint64
	ErrorsBy               [8]uint64 // StatusClasses order
	Prompt, Cached, Output uint64
	// Per LatencyMetrics entry: values, their sum, and their histogram
	// (keys ascending, with their counts).
	Count      [4]uint64
	Sum        [4]float64
	Keys       [4][]int16
	Counts     [4][]uint64
	Good       uint64
	GoodOutput uint64
	// Hour rows only (ignored in minute rows): the histograms of HourDists,
	// by position.
	HourKeys   [NumHourDists][]int16
	HourCounts [NumHourDists][]uint64
	// Hour rows only (ignored in minute rows): the requests and output
	// tokens of each minute of the hour (MinutesPerHour values, minute 0
	// first; nil: none), and the largest of each, the row's busiest
	// minute.
	MinuteRequests, MinuteOutput []uint64
	PeakRequests, PeakOutput     uint64
}

// MinutesPerHour is the length of RollupRecord.MinuteRequests and
// MinuteOutput.
const MinutesPerHour = 60

// RollupBlockRows is the size of the blocks rollup rows are sent in.
const RollupBlockRows = 16_384

// GPUSampleRow is one deduplicated GPU sample of an hour.
type GPUSampleRow struct {
	Deployment, GPUType, Pool, Region, MIGProfile string
	// Instance names the GPU or MIG instance: gpu_uuid/mig_instance_id.
	Instance     string
	MIGFraction  float64
	SampledAt    time.Time
	IntervalS    float64
	Utilization  float64
	EnergyJoules float64
	// Node is the host of the GPU; the telemetry below feeds GPUTelemetry.
	Node                      string
	FBUsedBytes, FBTotalBytes uint64
	PowerWatts, TemperatureC  float64
	SMClockMHz, SMClockMaxMHz float64
	// SMActive is DCGM_FI_PROF_SM_ACTIVE in [0, 1]; negative when the
	// sample did not carry it.
	SMActive float64
}

// DeploymentUsageRow is the usage of one (deployment, tenant, model) in an hour.
type DeploymentUsageRow struct {
	// Hour is the hour of the row (CostStore.DeploymentUsageOfHours).
	Hour                        time.Time
	Deployment, TenantID, Model string
	Requests, InputTokens       uint64
	CachedInputTokens           uint64
	OutputTokens                uint64
	GoodOutputTokens            uint64
	E2EMs                       float64
	SLOVersion                  uint32
	// ModelVersions are the distinct model versions of the row's events
	// (rollup_hour's model_version), in any order.
	ModelVersions []string
}

// GPUHourRow is one row of gpu_hour.
type GPUHourRow struct {
	Hour                                          time.Time
	Deployment, GPUType, Pool, Region, MIGProfile string
	GPUs                                          uint32
	Samples                                       uint64
	GPUSeconds, BusySeconds, CoveredSeconds       float64
	EnergyJoules, UnpricedSeconds                 float64
	CostNanos, BusyCostNanos, IdleCostNanos       int64
	PriceVersion                                  string
	// Telemetry is the samples' memory, power, temperature, clock and SM
	// activity sums.
	Telemetry GPUTelemetry
	// Node and GPU are set on the rows of gpu_device_hour (one GPU or MIG
	// instance each: GPU is its UUID, "/<mig_instance_id>" for an
	// instance); Devices holds those rows of a gpu_hour row.
	Node, GPU string
	Devices   []GPUHourRow
}

// CostRow is one line of cost_hour: a (tenant, model)'s usage in a
// deployment-hour and its allocated cost under every policy pair.
type CostRow struct {
	Hour                                 time.Time
	TenantID, Deployment, Model, GPUType string
	Unattributed                         bool
	Requests, InputTokens                uint64
	CachedInputTokens, OutputTokens      uint64
	GoodOutputTokens, E2EMs              uint64
	// Busy[b] is the busy share under billing.BusyPolicies()[b]; Cost[b][i]
	// the line's total under billing.BusyPolicies()[b] and
	// billing.IdlePolicies()[i]; nano-units.
	Busy [3]int64
	Cost [3][3]int64
	// GPUBusyMs[b] and GPUMs[b][i] are the line's share of the
	// deployment-hour's GPU time in GPU-milliseconds, split as Busy and
	// Cost are (ComputeCost).
	GPUBusyMs [3]uint64
	GPUMs     [3][3]uint64
	// Engine, TensorParallelism and ModelVersion are the line's serving
	// labels in its hour (ServingLabel): engine and tensor parallelism of
	// its deployment and model, the model versions of its own events.
	Engine, TensorParallelism, ModelVersion string
	// ListCharge is the usage at the model's token list prices; ListPriced
	// is false when the model has no list price (ListCharge is then 0).
	ListCharge   int64
	ListPriced   bool
	PriceVersion string
	SLOVersion   uint32
}

// HourVersion is the newest computation of one hour of the tenant-hour
// rollup.
type HourVersion struct {
	Hour    time.Time
	Version uint64
	// SLOVersion is the SLO version that computation counted goodput with.
	SLOVersion uint32
}

// DayVersion is the newest day rollup row of a day: the sum of the
// versions of the hour computations it was rolled up from.
type DayVersion struct {
	Day          time.Time
	HourVersions uint64
}

// DayRollup is the day rollup of one UTC day to write: per tenant, the sum
// of the tenant-hour rows of the computations Hours name, in the day's
// bucket, recording HourVersions (the sum of their versions).
type DayRollup struct {
	Day          time.Time
	Hours        []HourVersion
	HourVersions uint64
}
