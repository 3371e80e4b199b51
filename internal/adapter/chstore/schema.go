package chstore

// The tables' column stems and names, as the migrations create them. They
// are the tables' layout, not rules: which error classes and distributions
// a rollup row counts is the rollup package's (rollup.StatusClasses,
// rollup.LatencyMetrics, rollup.RollupGroupFields), which allocation
// policies a cost line is computed under is the billing package's
// (billing.BusyPolicies, billing.IdlePolicies), in the same order; the
// records carry them by position, and schema_test.go holds them equal.
var (
	// dimColumns are the dimensions of a rollup row (RollupRecord.Dims).
	dimColumns = []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}
	// errClasses are the err_<class> columns (RollupRecord.ErrorsBy) and
	// the status values an event's status is classed by.
	errClasses = []string{"context_length", "rate_limited", "oom", "cuda", "timeout", "cancelled", "bad_request", "internal"}
	// distColumns are the <metric>_count, _sum, _keys, _counts columns
	// (RollupRecord.Count, Sum, Keys, Counts).
	distColumns = []string{"ttft", "itl", "e2e", "queue"}
	// hourDistColumns are the <dist>_keys, _counts columns of the hour
	// levels only (migration 0023; RollupRecord.HourKeys, HourCounts).
	hourDistColumns = []string{"prefill", "decode", "prompt_size", "output_size", "e2e_short", "e2e_medium", "e2e_long"}
)

// cost_hour's allocation columns (migration 0004): busy_<busy> is a line's
// busy share under a busy policy, cost_<busy>_<idle> its total under a busy
// and an idle policy; the weighted_tokens policy's columns say "weighted".
// busyColumns[b] holds CostRow.Busy[b] and allocationColumns[b][i]
// CostRow.Cost[b][i], where b and i follow billing.BusyPolicies() and
// billing.IdlePolicies().
var (
	busyColumns       = [3]string{"busy_tokens", "busy_weighted", "busy_request_time"}
	allocationColumns = [3][3]string{
		{"cost_tokens_separate", "cost_tokens_shared_weighted", "cost_tokens_shared_even"},
		{"cost_weighted_separate", "cost_weighted_shared_weighted", "cost_weighted_shared_even"},
		{"cost_request_time_separate", "cost_request_time_shared_weighted", "cost_request_time_shared_even"},
	}
)

// cost_hour's GPU time columns (migration 0026), in GPU-milliseconds:
// gpu_ms_busy_<busy> holds CostRow.GPUBusyMs[b], gpu_ms_<busy>_<idle>
// CostRow.GPUMs[b][i], named and ordered as busyColumns and
// allocationColumns.
var (
	gpuBusyColumns       = [3]string{"gpu_ms_busy_tokens", "gpu_ms_busy_weighted", "gpu_ms_busy_request_time"}
	gpuAllocationColumns = [3][3]string{
		{"gpu_ms_tokens_separate", "gpu_ms_tokens_shared_weighted", "gpu_ms_tokens_shared_even"},
		{"gpu_ms_weighted_separate", "gpu_ms_weighted_shared_weighted", "gpu_ms_weighted_shared_even"},
		{"gpu_ms_request_time_separate", "gpu_ms_request_time_shared_weighted", "gpu_ms_request_time_shared_even"},
	}
)
