package query

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/billing"
	"tokenmeter/rollup"
)

// UsageGroupFields are the dimensions usage can be grouped by.
// model_version is the request's own; engine and tensor_parallelism are
// the serving labels of its hour, deployment and model, the same as cost
// lines carry (rollup.ServingLabel; UsageRead).
var UsageGroupFields = []string{"tenant_id", "model", "deployment", "model_version", "engine", "tensor_parallelism"}

// CostGroupFields are the dimensions cost can be grouped by.
// engine and tensor_parallelism are a line's deployment's and model's in
// its hour, model_version the line's own; several in one hour are one
// value joined by "+" (rollup.ServingLabel).
var CostGroupFields = []string{"tenant_id", "model", "deployment", "gpu_type", "engine", "tensor_parallelism", "model_version"}

// GPUGroupFields are the dimensions GPU usage can be grouped by.
// node and gpu read the per-GPU rollup.
var GPUGroupFields = []string{"deployment", "gpu_type", "pool", "region", "mig_profile", "node", "gpu"}

// MaxUsageBuckets bounds the number of time buckets one query may ask for.
const MaxUsageBuckets = 50_000

// MaxExactRange bounds the range of exact (raw) latency queries.
const MaxExactRange = 24 * time.Hour

// checkRange checks a range and the number of steps of width step (seconds;
// ok false: an unknown step, whose count is not checked) it holds.
func checkRange(start, end time.Time, name string, step int64, ok bool) []error {
	switch {
	case start.IsZero() || end.IsZero():
		return []error{fmt.Errorf("%w: start and end are required", ErrInvalidQuery)}
	case !end.After(start):
		return []error{fmt.Errorf("%w: end (%s) must be after start (%s)", ErrInvalidQuery, end.Format(time.RFC3339), start.Format(time.RFC3339))}
	case start.Unix() < 0 || end.Unix() > 1<<32-1:
		return []error{fmt.Errorf("%w: range must lie between 1970 and 2106", ErrInvalidQuery)}
	case ok && step > 0 && end.Sub(start)/time.Duration(step*int64(time.Second)) > MaxUsageBuckets:
		return []error{fmt.Errorf("%w: range of %s at granularity %s is more than %d buckets; use a coarser granularity",
			ErrInvalidQuery, end.Sub(start), name, MaxUsageBuckets)}
	}
	return nil
}

// Normalize fills defaults and checks the query, joining every problem.
// Errors wrap ErrInvalidQuery.
func (q UsageQuery) Normalize() (UsageQuery, error) {
	var errs []error
	if q.Granularity == "" {
		q.Granularity = "total"
	}
	step, ok := rollup.Granularities[q.Granularity]
	if !ok {
		errs = append(errs, fmt.Errorf("%w: granularity %q: want minute, hour, day, month or total", ErrInvalidQuery, q.Granularity))
	}
	errs = append(errs, checkRange(q.Start, q.End, q.Granularity, step, ok)...)
	group, gerrs := parseGroupBy(q.GroupBy, UsageGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	return q, errors.Join(errs...)
}

// Normalize fills defaults and checks the query; errors wrap ErrInvalidQuery.
func (q RollupQuery) Normalize() (RollupQuery, error) {
	var errs []error
	if q.Step == "" {
		q.Step = "total"
	}
	step, ok := rollup.Granularities[q.Step]
	if !ok {
		errs = append(errs, fmt.Errorf("%w: step %q: want minute, hour, day, month or total", ErrInvalidQuery, q.Step))
	}
	if rerrs := checkRange(q.Start, q.End, q.Step, step, ok); len(rerrs) > 0 && len(errs) == 0 {
		errs = append(errs, rerrs...)
	}
	if !q.Start.IsZero() && (q.Start.Truncate(time.Minute) != q.Start || q.End.Truncate(time.Minute) != q.End) {
		errs = append(errs, fmt.Errorf("%w: start and end must be whole minutes", ErrInvalidQuery))
	}
	group, gerrs := parseGroupBy(q.GroupBy, rollup.RollupGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	if q.Columns < AllColumns || q.Columns > LatencyBreakdownColumns {
		errs = append(errs, fmt.Errorf("%w: unknown rollup columns %d", ErrInvalidQuery, q.Columns))
	}
	if q.Limit < 0 || q.Offset < 0 {
		errs = append(errs, fmt.Errorf("%w: limit and offset must not be negative", ErrInvalidQuery))
	}
	return q, errors.Join(errs...)
}

// Normalize fills defaults and checks the query; errors wrap ErrInvalidQuery.
func (q CostQuery) Normalize() (CostQuery, error) {
	step, errs := normalizeHours(q.Start, q.End, q.Step)
	q.Step = step
	if q.Busy == "" {
		q.Busy = string(billing.BusyPolicies()[0])
	}
	if q.Idle == "" {
		q.Idle = string(billing.IdlePolicies()[0])
	}
	if _, err := billing.ParseBusyPolicy(q.Busy); err != nil {
		errs = append(errs, fmt.Errorf("%w: busy_policy %q: want one of %s", ErrInvalidQuery, q.Busy, joinPolicies(billing.BusyPolicies())))
	}
	if _, err := billing.ParseIdlePolicy(q.Idle); err != nil {
		errs = append(errs, fmt.Errorf("%w: idle_policy %q: want one of %s", ErrInvalidQuery, q.Idle, joinPolicies(billing.IdlePolicies())))
	}
	group, gerrs := parseGroupBy(q.GroupBy, CostGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	return q, errors.Join(errs...)
}

func joinPolicies[P ~string](ps []P) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// Normalize fills defaults and checks the query; errors wrap ErrInvalidQuery.
func (q GPUUsageQuery) Normalize() (GPUUsageQuery, error) {
	step, errs := normalizeHours(q.Start, q.End, q.Step)
	q.Step = step
	group, gerrs := parseGroupBy(q.GroupBy, GPUGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	return q, errors.Join(errs...)
}

// normalizeHours checks an hour-aligned range and a step of hour, day,
// month or total, the steps of cost (computed per hour).
func normalizeHours(start, end time.Time, step string) (string, []error) {
	var errs []error
	if step == "" {
		step = "total"
	}
	switch step {
	case "hour", "day", "month", "total":
	default:
		errs = append(errs, fmt.Errorf("%w: step %q: want hour, day, month or total", ErrInvalidQuery, step))
	}
	if rerrs := checkRange(start, end, step, 0, false); len(rerrs) > 0 {
		return step, append(errs, rerrs...)
	}
	switch {
	case !start.Truncate(time.Hour).Equal(start) || !end.Truncate(time.Hour).Equal(end):
		errs = append(errs, fmt.Errorf("%w: start and end must lie on whole hours (cost is computed per hour)", ErrInvalidQuery))
	case step == "hour" && end.Sub(start)/time.Hour > MaxUsageBuckets:
		errs = append(errs, fmt.Errorf("%w: range of %s is more than %d hours; use step day or total", ErrInvalidQuery, end.Sub(start), MaxUsageBuckets))
	}
	return step, errs
}

// parseGroupBy reads group-by fields (repeated or comma-separated) against
// the allowed ones, returning them in the allowed order, so that the SQL and
// the output do not depend on the order the caller listed them in.
func parseGroupBy(asked, allowed []string) ([]string, []error) {
	var errs []error
	seen := map[string]bool{}
	for _, g := range asked {
		for _, f := range strings.Split(g, ",") {
			f = strings.TrimSpace(f)
			if f == "" || seen[f] {
				continue
			}
			seen[f] = true
			if !slices.Contains(allowed, f) {
				errs = append(errs, fmt.Errorf("%w: unknown group_by field %q: want any of %s", ErrInvalidQuery, f, strings.Join(allowed, ", ")))
			}
		}
	}
	var out []string
	for _, f := range allowed {
		if seen[f] {
			out = append(out, f)
		}
	}
	return out, errs
}
