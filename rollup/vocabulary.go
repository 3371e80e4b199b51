package rollup

// What a rollup row counts: its dimensions, error classes and latency
// distributions, in the column order of the rollup tables.

// StatusClasses are the error classes counted per rollup row, in column order
// (err_<class>).
var StatusClasses = []string{"context_length", "rate_limited", "oom", "cuda", "timeout", "cancelled", "bad_request", "internal"}

// LatencyMetrics are the distributions kept per rollup row, in column order
// (<metric>_count, _sum, _keys, _counts).
var LatencyMetrics = []string{"ttft", "itl", "e2e", "queue"}

// HourDists are the distributions kept by hour-level rollup rows only (not
// by minute rows; which hour table keeps which: HourDistTables), in column
// order (<dist>_keys, _counts: histograms only;
// a distribution's count is the sum of its counts): prefill and decode
// latency (ms), prompt and output tokens per request, and E2E latency per
// output-length class (OutputClass). A minute row would hold about 5
// events, whose histograms cost more per event than an hour row's 17; see
// docs/architecture.md "Latency breakdown and token sizes".
var HourDists = []string{"prefill", "decode", "prompt_size", "output_size", "e2e_short", "e2e_medium", "e2e_long"}

// HourDistTables lists, per hour table, the HourDists its rows keep (the
// others are empty arrays there), chosen for what they cost per event
// (docs/performance.md): the all-tenant rows (per hour, and per model and
// deployment) are few and keep every one; the rows per group (17 events
// each at the query benchmark's scale) keep decode; the tenant rows, and
// the day rows made of them, keep the token sizes and decode (so that a
// tenant's latency breakdown, or every tenant's by tenant, need not merge
// every group row of rollup_hour; rows written before they kept decode say
// so: migration 0029's decode_kept).
var HourDistTables = map[string][]string{
	"rollup_hour":            {"decode"},
	"rollup_tenant_hour":     {"decode", "prompt_size", "output_size"},
	"rollup_tenant_day":      {"decode", "prompt_size", "output_size"},
	"rollup_total_hour":      HourDists,
	"rollup_deployment_hour": HourDists,
}

// The positions of HourDists.
const (
	DistPrefill = iota
	DistDecode
	DistPromptSize
	DistOutputSize
	DistE2EShort
	DistE2EMedium
	DistE2ELong
	NumHourDists
)

// The output-length classes of E2E latency: a request with fewer than
// MediumOutputTokens output tokens is short (failed ones without output
// too), one with LongOutputTokens or more is long, any other medium.
const (
	MediumOutputTokens = 256
	LongOutputTokens   = 1024
)

// OutputClass returns the HourDists position of the E2E distribution of a
// request with output output tokens.
func OutputClass(output uint64) int {
	switch {
	case output < MediumOutputTokens:
		return DistE2EShort
	case output < LongOutputTokens:
		return DistE2EMedium
	}
	return DistE2ELong
}

// RollupGroupFields are the dimensions rollup queries can group by.
var RollupGroupFields = []string{"tenant_id", "model", "model_version", "deployment", "gpu_type", "slo_class"}
