package chstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CostGroupFields are the dimensions cost can be grouped by.
var CostGroupFields = []string{"tenant_id", "model", "deployment", "gpu_type"}

// GPUGroupFields are the dimensions GPU usage can be grouped by.
var GPUGroupFields = []string{"deployment", "gpu_type", "pool", "region", "mig_profile"}

// CostQuery selects allocated cost per (step, group).
type CostQuery struct {
	// TenantID restricts to one tenant when non-empty.
	TenantID string
	// Start (inclusive) and End (exclusive) lie on hour boundaries.
	Start, End time.Time
	// Step is "hour", "day" or "total" (default).
	Step string
	// GroupBy lists fields of CostGroupFields.
	GroupBy []string
	// Busy and Idle name the policies (BusyPolicies, IdlePolicies); defaults
	// "tokens" and "separate".
	Busy, Idle string
}

// CostRowOut is the cost and usage of one group in one step.
type CostRowOut struct {
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
}

// normalizeHours checks an hour-aligned range and a step of hour, day, month or total.
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
	switch {
	case start.IsZero() || end.IsZero():
		errs = append(errs, fmt.Errorf("%w: start and end are required", ErrInvalidQuery))
	case !end.After(start):
		errs = append(errs, fmt.Errorf("%w: end (%s) must be after start (%s)", ErrInvalidQuery, end.Format(time.RFC3339), start.Format(time.RFC3339)))
	case start.Unix() < 0 || end.Unix() > 1<<32-1:
		errs = append(errs, fmt.Errorf("%w: range must lie between 1970 and 2106", ErrInvalidQuery))
	case !start.Truncate(time.Hour).Equal(start) || !end.Truncate(time.Hour).Equal(end):
		errs = append(errs, fmt.Errorf("%w: start and end must lie on whole hours (cost is computed per hour)", ErrInvalidQuery))
	case step == "hour" && end.Sub(start)/time.Hour > MaxUsageBuckets:
		errs = append(errs, fmt.Errorf("%w: range of %s is more than %d hours; use step day or total", ErrInvalidQuery, end.Sub(start), MaxUsageBuckets))
	}
	return step, errs
}

// Normalize fills defaults and checks the query; errors wrap ErrInvalidQuery.
func (q CostQuery) Normalize() (CostQuery, error) {
	step, errs := normalizeHours(q.Start, q.End, q.Step)
	q.Step = step
	if q.Busy == "" {
		q.Busy = BusyPolicies[0]
	}
	if q.Idle == "" {
		q.Idle = IdlePolicies[0]
	}
	if !slices.Contains(BusyPolicies, q.Busy) {
		errs = append(errs, fmt.Errorf("%w: busy_policy %q: want one of %s", ErrInvalidQuery, q.Busy, strings.Join(BusyPolicies, ", ")))
	}
	if !slices.Contains(IdlePolicies, q.Idle) {
		errs = append(errs, fmt.Errorf("%w: idle_policy %q: want one of %s", ErrInvalidQuery, q.Idle, strings.Join(IdlePolicies, ", ")))
	}
	group, gerrs := parseGroupBy(q.GroupBy, CostGroupFields)
	q.GroupBy = group
	errs = append(errs, gerrs...)
	return q, errors.Join(errs...)
}

// SQL builds the query for a normalized CostQuery.
func (q CostQuery) SQL() (string, []any) {
	bucket, args := stepExpr("hour", q.Step, q.Start)
	b := busyColumn(q.Busy)
	sel := []string{bucket + " AS b"}
	sel = append(sel, q.GroupBy...)
	sel = append(sel,
		fmt.Sprintf("sum(cost_%s_%s) AS c", b, q.Idle), fmt.Sprintf("sum(busy_%s)", b),
		"sumIf(requests, unattributed = 0)", "sumIf(input_tokens, unattributed = 0)",
		"sumIf(cached_input_tokens, unattributed = 0)", "sumIf(output_tokens, unattributed = 0)",
		"sumIf(good_output_tokens, unattributed = 0)",
		"sumIf(requests, unattributed = 1)", "sumIf(input_tokens, unattributed = 1)", "sumIf(output_tokens, unattributed = 1)",
		"sum(list_charge)", "sumIf(requests, list_priced = 0)",
		"groupUniqArray(price_version)")
	where := "hour >= toDateTime(?) AND hour < toDateTime(?)"
	whereArgs := []any{q.Start.Unix(), q.End.Unix()}
	if q.TenantID != "" {
		where += " AND tenant_id = ?"
		whereArgs = append(whereArgs, q.TenantID)
	}
	from, fromArgs := newestRows("cost_hour", "hour", where, whereArgs, "")
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	// Lines with neither cost nor usage (the idle line when idle cost is
	// shared) are left out.
	return fmt.Sprintf("SELECT %s\nFROM %s\nGROUP BY %s\nHAVING c != 0 OR sum(requests) > 0\nORDER BY %s",
		strings.Join(sel, ", "), from, groupBy, groupBy), append(args, fromArgs...)
}

// Cost runs a cost query.
func (s *Store) Cost(ctx context.Context, q CostQuery) ([]CostRowOut, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	query, args := q.SQL()
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query cost: %w", classify(err))
	}
	defer rows.Close()
	var out []CostRowOut
	for rows.Next() {
		var r CostRowOut
		k := newStepKey(len(q.GroupBy))
		dest := k.dest(&r.CostNanos, &r.BusyNanos, &r.Requests, &r.InputTokens, &r.CachedInputTokens,
			&r.OutputTokens, &r.GoodOutputTokens, &r.UnattributedRequests, &r.UnattributedInput, &r.UnattributedOutput,
			&r.ListCharge, &r.ListUnpricedRequests, &r.PriceVersions)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan cost: %w", err)
		}
		r.Start = k.start()
		r.Group = groupMap(q.GroupBy, k.groups)
		slices.Sort(r.PriceVersions)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read cost: %w", classify(err))
	}
	return out, nil
}

func groupMap(fields, values []string) map[string]string {
	g := make(map[string]string, len(fields))
	for i, f := range fields {
		g[f] = values[i]
	}
	return g
}

// GPUUsageQuery selects GPU usage per (step, group).
type GPUUsageQuery struct {
	// Start (inclusive) and End (exclusive) lie on hour boundaries.
	Start, End time.Time
	// Step is "hour", "day" or "total" (default).
	Step string
	// GroupBy lists fields of GPUGroupFields.
	GroupBy []string
}

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

// tokensJoinable says whether cost_hour can give the tokens of these groups.
func (q GPUUsageQuery) tokensJoinable() bool {
	for _, f := range q.GroupBy {
		if f != "deployment" && f != "gpu_type" {
			return false
		}
	}
	return true
}

// SQL builds the GPU usage query for a normalized GPUUsageQuery: hour
// totals per group first (for the largest GPU count), then steps.
func (q GPUUsageQuery) SQL() (string, []any) {
	bucket, args := stepExpr("hour", q.Step, q.Start)
	inner := append([]string{"hour"}, q.GroupBy...)
	innerSel := append(slices.Clone(inner),
		"sum(gpus) AS h_gpus", "sum(gpu_seconds) AS h_gpu", "sum(busy_seconds) AS h_busy", "sum(covered_seconds) AS h_cov",
		"toFloat64(sum(gpus) * 3600) AS h_inst", "sum(energy_joules) AS h_energy", "sum(unpriced_seconds) AS h_unpriced",
		"sum(cost_nanos) AS h_cost", "sum(busy_cost_nanos) AS h_busy_cost", "sum(idle_cost_nanos) AS h_idle_cost",
		"groupUniqArray(price_version) AS h_versions")
	sel := []string{bucket + " AS b"}
	sel = append(sel, q.GroupBy...)
	sel = append(sel, "sum(h_gpu)", "sum(h_busy)", "sum(h_cov)", "sum(h_inst)", "sum(h_energy)", "sum(h_unpriced)",
		"toUInt32(max(h_gpus))", "sum(h_cost)", "sum(h_busy_cost)", "sum(h_idle_cost)", "groupUniqArrayArray(h_versions)")
	from, fromArgs := newestRows("gpu_hour", "hour", "hour >= toDateTime(?) AND hour < toDateTime(?)", []any{q.Start.Unix(), q.End.Unix()}, "")
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	return fmt.Sprintf(`SELECT %s
FROM (SELECT %s FROM %s GROUP BY %s)
GROUP BY %s
ORDER BY %s`, strings.Join(sel, ", "), strings.Join(innerSel, ", "), from, strings.Join(inner, ", "), groupBy, groupBy), append(args, fromArgs...)
}

// tokensSQL sums the tokens served per (step, group) from cost_hour.
func (q GPUUsageQuery) tokensSQL() (string, []any) {
	bucket, args := stepExpr("hour", q.Step, q.Start)
	sel := append([]string{bucket + " AS b"}, q.GroupBy...)
	sel = append(sel, "sum(input_tokens)", "sum(output_tokens)")
	from, fromArgs := newestRows("cost_hour", "hour", "hour >= toDateTime(?) AND hour < toDateTime(?)", []any{q.Start.Unix(), q.End.Unix()},
		fmt.Sprintf("unattributed = 0 AND tenant_id != '%s'", IdleTenant))
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	return fmt.Sprintf(`SELECT %s FROM %s
GROUP BY %s`, strings.Join(sel, ", "), from, groupBy), append(args, fromArgs...)
}

// GPUUsage runs a GPU usage query.
func (s *Store) GPUUsage(ctx context.Context, q GPUUsageQuery) ([]GPUUsageRow, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	query, args := q.SQL()
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query GPU usage: %w", classify(err))
	}
	defer rows.Close()
	var out []GPUUsageRow
	index := map[string]int{}
	for rows.Next() {
		var r GPUUsageRow
		k := newStepKey(len(q.GroupBy))
		dest := k.dest(&r.GPUSeconds, &r.BusySeconds, &r.CoveredSeconds, &r.InstanceSeconds, &r.EnergyJoules,
			&r.UnpricedSeconds, &r.MaxGPUs, &r.CostNanos, &r.BusyCostNanos, &r.IdleCostNanos, &r.PriceVersions)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan GPU usage: %w", err)
		}
		r.Start = k.start()
		r.Group = groupMap(q.GroupBy, k.groups)
		slices.Sort(r.PriceVersions)
		index[k.id()] = len(out)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read GPU usage: %w", classify(err))
	}
	if !q.tokensJoinable() {
		return out, nil
	}
	for i := range out {
		out[i].TokensKnown = true
	}
	query, args = q.tokensSQL()
	trows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("query tokens per GPU group: %w", classify(err))
	}
	defer trows.Close()
	for trows.Next() {
		var in, outT uint64
		k := newStepKey(len(q.GroupBy))
		if err := trows.Scan(k.dest(&in, &outT)...); err != nil {
			return nil, fmt.Errorf("scan tokens per GPU group: %w", err)
		}
		if i, ok := index[k.id()]; ok {
			out[i].InputTokens, out[i].OutputTokens = in, outT
		}
	}
	return out, trows.Err()
}

// Coverage is the share of the GPUs' hours that had samples.
func (r GPUUsageRow) Coverage() float64 {
	if r.InstanceSeconds == 0 {
		return 0
	}
	return r.CoveredSeconds / r.InstanceSeconds
}

// stepKey reads the leading columns of a grouped row: the step's start
// (Unix seconds) and the group-by values.
type stepKey struct {
	b      uint32
	groups []string
}

func newStepKey(fields int) *stepKey { return &stepKey{groups: make([]string, fields)} }

// dest returns scan destinations for the key columns, then more.
func (k *stepKey) dest(more ...any) []any {
	d := make([]any, 0, 1+len(k.groups)+len(more))
	d = append(d, &k.b)
	for i := range k.groups {
		d = append(d, &k.groups[i])
	}
	return append(d, more...)
}

func (k *stepKey) start() time.Time { return time.Unix(int64(k.b), 0).UTC() }

// id identifies the step and group, as a map key: each value is prefixed
// with its length, so no two keys share an id.
func (k *stepKey) id() string {
	id := strconv.AppendUint(nil, uint64(k.b), 10)
	for _, g := range k.groups {
		id = append(strconv.AppendInt(append(id, ' '), int64(len(g)), 10), ':')
		id = append(id, g...)
	}
	return string(id)
}
