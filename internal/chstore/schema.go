package chstore

// The rollup tables' column stems, as the migrations create them. They are
// the tables' layout, not rules: which error classes and distributions a
// rollup row counts is the rollup package's (rollup.StatusClasses,
// rollup.LatencyMetrics, rollup.RollupGroupFields, in the same order; a
// test holds them equal), and the records carry them by position.
var (
	// dimColumns are the dimensions of a rollup row (RollupRecord.Dims).
	dimColumns = []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}
	// errClasses are the err_<class> columns (RollupRecord.ErrorsBy) and
	// the status values an event's status is classed by.
	errClasses = []string{"context_length", "rate_limited", "oom", "cuda", "timeout", "cancelled", "bad_request", "internal"}
	// distColumns are the <metric>_count, _sum, _keys, _counts columns
	// (RollupRecord.Count, Sum, Keys, Counts).
	distColumns = []string{"ttft", "itl", "e2e", "queue"}
)
