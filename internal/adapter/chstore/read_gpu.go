package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/query"
)

// gpuTable is the table a normalized GPU usage query reads: the per-GPU
// rollup when grouped by node or GPU, else gpu_hour (a row per GPU group).
// Both have the same columns but node and gpu.
func gpuTable(q query.GPUUsageQuery) string {
	if slices.Contains(q.GroupBy, "node") || slices.Contains(q.GroupBy, "gpu") {
		return "gpu_device_hour"
	}
	return "gpu_hour"
}

// gpuTelemetrySums are the telemetry columns summed (or, for the maxima,
// taken the max of) across rows, in the order of rollup.GPUTelemetry.
var gpuTelemetrySums = []struct {
	col string
	max bool
}{
	{"fb_seconds", false}, {"fb_used_mib_seconds", false}, {"fb_total_mib_seconds", false},
	{"fb_used_max", true}, {"fb_used_max_ratio", true},
	{"power_seconds", false}, {"power_watt_seconds", false}, {"power_max", true},
	{"temp_seconds", false}, {"temp_degree_seconds", false}, {"temp_max", true},
	{"clock_seconds", false}, {"throttle_seconds", false},
	{"sm_active_seconds", false}, {"sm_active_sum", false},
}

// gpuUsageSQL builds the GPU usage query of a normalized query: hour
// totals per group first (for the largest GPU count), then steps.
func gpuUsageSQL(q query.GPUUsageQuery) (string, []any) {
	bucket, args := stepExpr("hour", q.StepSeconds(), q.Start)
	inner := append([]string{"hour"}, q.GroupBy...)
	// The Float64 columns are summed with floatSum, at both levels: the
	// same read gives the same hours.
	innerSel := append(slices.Clone(inner),
		"sum(gpus) AS h_gpus", floatSum("gpu_seconds")+" AS h_gpu", floatSum("busy_seconds")+" AS h_busy", floatSum("covered_seconds")+" AS h_cov",
		"toFloat64(sum(gpus) * 3600) AS h_inst", floatSum("energy_joules")+" AS h_energy", floatSum("unpriced_seconds")+" AS h_unpriced",
		"sum(cost_nanos) AS h_cost", "sum(busy_cost_nanos) AS h_busy_cost", "sum(idle_cost_nanos) AS h_idle_cost",
		"groupUniqArray(price_version) AS h_versions")
	sel := []string{bucket + " AS b"}
	sel = append(sel, q.GroupBy...)
	sel = append(sel, floatSum("h_gpu"), floatSum("h_busy"), floatSum("h_cov"), "sum(h_inst)", floatSum("h_energy"), floatSum("h_unpriced"),
		"toUInt32(max(h_gpus))", "sum(h_cost)", "sum(h_busy_cost)", "sum(h_idle_cost)", "groupUniqArrayArray(h_versions)")
	for _, t := range gpuTelemetrySums {
		if t.max {
			innerSel = append(innerSel, "max("+t.col+") AS h_"+t.col)
			sel = append(sel, "max(h_"+t.col+")")
			continue
		}
		innerSel = append(innerSel, floatSum(t.col)+" AS h_"+t.col)
		sel = append(sel, floatSum("h_"+t.col))
	}
	where, whereArgs := scope("hour", q.Start, q.End, "")
	from, fromArgs := newestRows(gpuTable(q), "hour", where, whereArgs, "")
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	stmt := fmt.Sprintf(`SELECT %s
FROM (SELECT %s FROM %s GROUP BY %s)
GROUP BY %s
ORDER BY %s`, strings.Join(sel, ", "), strings.Join(innerSel, ", "), from, strings.Join(inner, ", "), groupBy, groupBy)
	if q.Limit > 0 {
		stmt += fmt.Sprintf("\nLIMIT %d", q.Limit)
	}
	return stmt, append(args, fromArgs...)
}

// gpuTokensSQL sums the tokens served per (step, group) from the
// attributed lines of cost_hour of every tenant but except.
func gpuTokensSQL(q query.GPUUsageQuery, except string) (string, []any) {
	bucket, args := stepExpr("hour", q.StepSeconds(), q.Start)
	sel := append([]string{bucket + " AS b"}, q.GroupBy...)
	sel = append(sel, "sum(input_tokens)", "sum(output_tokens)")
	where, whereArgs := scope("hour", q.Start, q.End, "")
	// The filter takes no arguments (newestRows repeats the scope's), so
	// the tenant is quoted as a ClickHouse string literal.
	from, fromArgs := newestRows("cost_hour", "hour", where, whereArgs,
		"unattributed = 0 AND tenant_id != "+quoteString(except))
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	return fmt.Sprintf(`SELECT %s FROM %s
GROUP BY %s`, strings.Join(sel, ", "), from, groupBy), append(args, fromArgs...)
}

// GPUUsageRows runs a normalized GPU usage query; with tokens.Join, it joins the
// tokens served per step and group from the cost rows.
func (s *Store) GPUUsageRows(ctx context.Context, q query.GPUUsageQuery, tokens query.GPUTokens) ([]query.GPUUsageRow, error) {
	stmt, args := gpuUsageSQL(q)
	var (
		out   []query.GPUUsageRow
		r     query.GPUUsageRow
		k     = newStepKey(len(q.GroupBy))
		index = map[string]int{}
	)
	t := &r.Telemetry
	dest := k.dest(&r.GPUSeconds, &r.BusySeconds, &r.CoveredSeconds, &r.InstanceSeconds, &r.EnergyJoules,
		&r.UnpricedSeconds, &r.MaxGPUs, &r.CostNanos, &r.BusyCostNanos, &r.IdleCostNanos, &r.PriceVersions,
		// gpuTelemetrySums' order
		&t.FBSeconds, &t.FBUsedMiBSeconds, &t.FBTotalMiBSeconds, &t.FBUsedMax, &t.FBUsedMaxRatio,
		&t.PowerSeconds, &t.PowerWattSeconds, &t.PowerMax, &t.TempSeconds, &t.TempDegreeSeconds, &t.TempMax,
		&t.ClockSeconds, &t.ThrottleSeconds, &t.SMActiveSeconds, &t.SMActiveSum)
	err := s.each(ctx, "GPU usage", stmt, args, dest, func() error {
		r.Start = k.start(q.StepSeconds(), q.Start)
		r.Group = groupMap(q.GroupBy, k.groups)
		slices.Sort(r.PriceVersions)
		index[k.id()] = len(out)
		out = append(out, r)
		r.PriceVersions = nil // kept by the row appended
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !tokens.Join {
		return out, nil
	}
	for i := range out {
		out[i].TokensKnown = true
	}
	stmt, args = gpuTokensSQL(q, tokens.Except)
	var in, outT uint64
	return out, s.each(ctx, "tokens per GPU group", stmt, args, k.dest(&in, &outT), func() error {
		if i, ok := index[k.id()]; ok {
			out[i].InputTokens, out[i].OutputTokens = in, outT
		}
		return nil
	})
}

// TelemetryMissingHours lists the hours costed before migration 0024 that
// still have GPU samples: they have gpu_hour rows but no per-GPU rows in
// gpu_device_hour, which every computation since writes (each GPU group has
// at least one GPU). The rollup job recosts them once, so that GPU
// telemetry covers the history. An hour whose samples are gone is never
// listed: recosting it would turn its cost lines into unattributed ones.
func (s *Store) TelemetryMissingHours(ctx context.Context) ([]time.Time, error) {
	return s.hours(ctx, `SELECT DISTINCT hour FROM gpu_hour
WHERE hour NOT IN (SELECT DISTINCT hour FROM gpu_device_hour)
AND hour IN (`+sampleHoursSQL+`)
ORDER BY hour`)
}

// sampleHoursSQL lists the hours that hold GPU samples.
const sampleHoursSQL = "SELECT DISTINCT toDateTime(intDiv(toUInt32(sampled_at), 3600) * 3600) FROM gpu_samples"
