package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/rollup"
)

// GPUSamplesOfHour returns the hour's samples, deduplicated by sample_id
// (the latest ingested copy wins), in a stable order.
func (s *Store) GPUSamplesOfHour(ctx context.Context, hour time.Time) ([]rollup.GPUSampleRow, error) {
	hour = hour.UTC().Truncate(time.Hour)
	return s.GPUSamplesOfHours(ctx, hour, hour.Add(time.Hour))
}

// GPUSamplesOfHours returns the samples of the hours in [from, to) (whole
// hours), deduplicated by sample_id (the latest ingested copy wins), in a
// stable order: by deployment, GPU type, sampled_at and sample_id, so that
// each hour's samples, taken in the order returned, are GPUSamplesOfHour's.
func (s *Store) GPUSamplesOfHours(ctx context.Context, from, to time.Time) ([]rollup.GPUSampleRow, error) {
	hour := from.UTC().Truncate(time.Hour)
	const query = `SELECT d_deployment, d_gpu_type, d_pool, d_region, d_mig_profile,
  if(d_mig_instance = 0 AND d_mig_profile = '', d_uuid, concat(d_uuid, '/', toString(d_mig_instance))),
  d_mig_fraction, d_sampled_at, d_interval, d_util, d_energy,
  d_node, d_fb_used, d_fb_total, d_power, d_temp, d_sm_clock, d_sm_clock_max, d_sm_active
FROM (
  SELECT sample_id,
    argMax(deployment, ingested_at) AS d_deployment, argMax(gpu_type, ingested_at) AS d_gpu_type,
    argMax(pool, ingested_at) AS d_pool, argMax(region, ingested_at) AS d_region,
    argMax(mig_profile, ingested_at) AS d_mig_profile, argMax(gpu_uuid, ingested_at) AS d_uuid,
    argMax(mig_instance_id, ingested_at) AS d_mig_instance, argMax(mig_fraction, ingested_at) AS d_mig_fraction,
    argMax(sampled_at, ingested_at) AS d_sampled_at, argMax(interval_s, ingested_at) AS d_interval,
    argMax(utilization, ingested_at) AS d_util, argMax(energy_joules, ingested_at) AS d_energy,
    argMax(node, ingested_at) AS d_node, argMax(fb_used_bytes, ingested_at) AS d_fb_used,
    argMax(fb_total_bytes, ingested_at) AS d_fb_total, argMax(power_watts, ingested_at) AS d_power,
    argMax(temperature_c, ingested_at) AS d_temp, argMax(sm_clock_mhz, ingested_at) AS d_sm_clock,
    argMax(sm_clock_max_mhz, ingested_at) AS d_sm_clock_max,
    argMax(if(sm_active = 65535, toFloat64(-1), sm_active / 10000), ingested_at) AS d_sm_active
  FROM gpu_samples
  WHERE sampled_at >= toDateTime(?) AND sampled_at < toDateTime(?)
  GROUP BY sample_id
)
ORDER BY d_deployment, d_gpu_type, d_sampled_at, sample_id`
	rows, err := s.conn.Query(ctx, query, hour.Unix(), to.UTC().Unix())
	if err != nil {
		return nil, fmt.Errorf("read GPU samples of %s to %s: %w", hour.Format(time.RFC3339), to.UTC().Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	var out []rollup.GPUSampleRow
	for rows.Next() {
		var r rollup.GPUSampleRow
		if err := rows.Scan(&r.Deployment, &r.GPUType, &r.Pool, &r.Region, &r.MIGProfile, &r.Instance,
			&r.MIGFraction, &r.SampledAt, &r.IntervalS, &r.Utilization, &r.EnergyJoules,
			&r.Node, &r.FBUsedBytes, &r.FBTotalBytes, &r.PowerWatts, &r.TemperatureC, &r.SMClockMHz, &r.SMClockMaxMHz, &r.SMActive); err != nil {
			return nil, fmt.Errorf("scan GPU samples: %w", err)
		}
		r.SampledAt = r.SampledAt.UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read GPU samples: %w", classify(err))
	}
	return out, nil
}

// DeploymentUsage returns the hour's usage per (deployment, tenant, model)
// from the newest computation of the hour rollup, which must be current.
func (s *Store) DeploymentUsage(ctx context.Context, hour time.Time) ([]rollup.DeploymentUsageRow, error) {
	hour = hour.UTC().Truncate(time.Hour)
	return s.DeploymentUsageOfHours(ctx, hour, hour.Add(time.Hour))
}

// DeploymentUsageOfHours returns the usage of the hours in [from, to) (whole
// hours) per hour and (deployment, tenant, model), in that order, from the
// newest computation of each hour's rollup, which must be current.
func (s *Store) DeploymentUsageOfHours(ctx context.Context, from, to time.Time) ([]rollup.DeploymentUsageRow, error) {
	hour := from.UTC().Truncate(time.Hour)
	// The newest computation's rows are the hour's rollup: no FINAL (which
	// would merge the whole month's partition, the table being ordered by
	// tenant first).
	rowsFrom, args := newestRows("rollup_hour", "bucket", "bucket >= toDateTime(?) AND bucket < toDateTime(?)", []any{hour.Unix(), to.UTC().Unix()}, "")
	query := `SELECT bucket, deployment, tenant_id, model, sum(requests), sum(prompt_tokens), sum(cached_prompt_tokens),
  sum(output_tokens), sum(good_output_tokens), ` + floatSum("e2e_sum") + `, max(slo_version), groupUniqArray(model_version)
FROM ` + rowsFrom + `
GROUP BY bucket, deployment, tenant_id, model
ORDER BY bucket, deployment, tenant_id, model`
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("read usage of %s to %s: %w", hour.Format(time.RFC3339), to.UTC().Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	var out []rollup.DeploymentUsageRow
	for rows.Next() {
		var r rollup.DeploymentUsageRow
		if err := rows.Scan(&r.Hour, &r.Deployment, &r.TenantID, &r.Model, &r.Requests, &r.InputTokens, &r.CachedInputTokens,
			&r.OutputTokens, &r.GoodOutputTokens, &r.E2EMs, &r.SLOVersion, &r.ModelVersions); err != nil {
			return nil, fmt.Errorf("scan usage: %w", err)
		}
		r.Hour = r.Hour.UTC()
		slices.Sort(r.ModelVersions)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read usage: %w", classify(err))
	}
	return out, nil
}

var gpuHourColumns = append([]string{"hour", "deployment", "gpu_type", "pool", "region", "mig_profile", "gpus", "samples",
	"gpu_seconds", "busy_seconds", "covered_seconds", "energy_joules", "unpriced_seconds",
	"cost_nanos", "busy_cost_nanos", "idle_cost_nanos", "price_version", "version"}, gpuTelemetryColumns...)

// gpuDeviceHourColumns are gpu_device_hour's: gpu_hour's and the GPU's.
var gpuDeviceHourColumns = append(slices.Clone(gpuHourColumns), "node", "gpu")

// gpuTelemetryColumns hold rollup.GPUTelemetry (migration 0024), in
// gpuTelemetryValues' order.
var gpuTelemetryColumns = []string{"fb_seconds", "fb_used_mib_seconds", "fb_total_mib_seconds", "fb_used_max",
	"fb_used_max_ratio", "power_seconds", "power_watt_seconds", "power_max", "temp_seconds", "temp_degree_seconds",
	"temp_max", "clock_seconds", "throttle_seconds", "sm_active_seconds", "sm_active_sum"}

func gpuTelemetryValues(t *rollup.GPUTelemetry) []any {
	return []any{t.FBSeconds, t.FBUsedMiBSeconds, t.FBTotalMiBSeconds, t.FBUsedMax,
		t.FBUsedMaxRatio, t.PowerSeconds, t.PowerWattSeconds, t.PowerMax, t.TempSeconds, t.TempDegreeSeconds,
		t.TempMax, t.ClockSeconds, t.ThrottleSeconds, t.SMActiveSeconds, t.SMActiveSum}
}

// gpuHourValues are a gpu_hour row's values in gpuHourColumns' order.
func gpuHourValues(r *rollup.GPUHourRow, version uint64) []any {
	return append([]any{r.Hour.UTC(), r.Deployment, r.GPUType, r.Pool, r.Region, r.MIGProfile, r.GPUs, r.Samples,
		r.GPUSeconds, r.BusySeconds, r.CoveredSeconds, r.EnergyJoules, r.UnpricedSeconds,
		r.CostNanos, r.BusyCostNanos, r.IdleCostNanos, r.PriceVersion, version}, gpuTelemetryValues(&r.Telemetry)...)
}

// costColumns is the column list of cost_hour's rows as WriteCost writes
// them: the allocation columns in the order of CostRow.Busy and CostRow.Cost.
func costColumns() []string {
	cols := []string{"hour", "tenant_id", "deployment", "model", "gpu_type", "unattributed", "requests",
		"input_tokens", "cached_input_tokens", "output_tokens", "good_output_tokens", "e2e_ms"}
	cols = append(cols, busyColumns[:]...)
	for _, row := range allocationColumns {
		cols = append(cols, row[:]...)
	}
	cols = append(cols, gpuBusyColumns[:]...)
	for _, row := range gpuAllocationColumns {
		cols = append(cols, row[:]...)
	}
	return append(cols, "engine", "tensor_parallelism", "model_version",
		"list_charge", "list_priced", "price_version", "slo_version", "version")
}

// WriteCost stores one hour's GPU and cost rows with version; they replace
// the rows of earlier computations with the same keys.
func (s *Store) WriteCost(ctx context.Context, gpu []rollup.GPUHourRow, cost []rollup.CostRow, version uint64) error {
	if len(gpu) > 0 {
		if err := s.sendRows(ctx, "write gpu_hour", "gpu_hour", gpuHourColumns, len(gpu), func(i int) []any {
			return gpuHourValues(&gpu[i], version)
		}); err != nil {
			return err
		}
		var devices []*rollup.GPUHourRow
		for i := range gpu {
			for j := range gpu[i].Devices {
				devices = append(devices, &gpu[i].Devices[j])
			}
		}
		if len(devices) > 0 {
			if err := s.sendRows(ctx, "write gpu_device_hour", "gpu_device_hour", gpuDeviceHourColumns, len(devices), func(i int) []any {
				d := devices[i]
				return append(gpuHourValues(d, version), d.Node, d.GPU)
			}); err != nil {
				return err
			}
		}
	}
	if len(cost) > 0 {
		return s.sendRows(ctx, "write cost_hour", "cost_hour", costColumns(), len(cost), func(i int) []any {
			r := cost[i]
			vals := []any{r.Hour.UTC(), r.TenantID, r.Deployment, r.Model, r.GPUType, boolByte(r.Unattributed), r.Requests,
				r.InputTokens, r.CachedInputTokens, r.OutputTokens, r.GoodOutputTokens, r.E2EMs}
			for _, b := range r.Busy {
				vals = append(vals, b)
			}
			for _, row := range r.Cost {
				for _, c := range row {
					vals = append(vals, c)
				}
			}
			for _, b := range r.GPUBusyMs {
				vals = append(vals, b)
			}
			for _, row := range r.GPUMs {
				for _, ms := range row {
					vals = append(vals, ms)
				}
			}
			return append(vals, r.Engine, r.TensorParallelism, r.ModelVersion,
				r.ListCharge, boolByte(r.ListPriced), r.PriceVersion, r.SLOVersion, version)
		})
	}
	return nil
}

// ServingOfHours returns the distinct (engine, tensor parallelism) the
// events of the hours in [from, to) (whole hours) carried per hour,
// deployment and model, in that order. Duplicated events carry their
// original's labels, so no deduplication is needed to list them.
func (s *Store) ServingOfHours(ctx context.Context, from, to time.Time) ([]rollup.ServingRow, error) {
	const query = `SELECT toDateTime(intDiv(toUInt32(completed_at), 3600) * 3600) AS h, deployment, model, engine, tensor_parallelism
FROM inference_events
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)
GROUP BY h, deployment, model, engine, tensor_parallelism
ORDER BY h, deployment, model, engine, tensor_parallelism`
	var (
		out []rollup.ServingRow
		r   rollup.ServingRow
	)
	err := s.each(ctx, "serving labels", query, []any{from.UTC().Truncate(time.Hour).Unix(), to.UTC().Unix()},
		[]any{&r.Hour, &r.Deployment, &r.Model, &r.Engine, &r.TensorParallelism}, func() error {
			r.Hour = r.Hour.UTC()
			out = append(out, r)
			return nil
		})
	return out, err
}

// WriteServing stores hours' serving labels with version; they replace the
// rows of earlier computations with the same keys.
func (s *Store) WriteServing(ctx context.Context, rows []rollup.ServingHourRow, version uint64) error {
	return s.sendRows(ctx, "write serving_hour", "serving_hour",
		[]string{"hour", "deployment", "model", "engine", "tensor_parallelism", "version"}, len(rows), func(i int) []any {
			r := rows[i]
			return []any{r.Hour.UTC(), r.Deployment, r.Model, r.Engine, r.TensorParallelism, version}
		})
}

// sendRows inserts n rows given row by row, in one INSERT.
func (s *Store) sendRows(ctx context.Context, what, table string, cols []string, n int, row func(i int) []any) error {
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+table+" ("+strings.Join(cols, ", ")+")")
	if err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	for i := 0; i < n; i++ {
		if err := batch.Append(row(i)...); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	return nil
}

// GPUDirtyHours lists the hours touched by GPU sample inserts stamped in
// [since, until). A zero since lists every hour holding samples.
func (s *Store) GPUDirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error) {
	query := "SELECT DISTINCT hour FROM gpu_dirty_hours WHERE ingested_at >= toDateTime(?) AND ingested_at < toDateTime(?) ORDER BY hour"
	args := []any{since.Unix(), until.Unix()}
	if since.IsZero() {
		query = "SELECT DISTINCT toDateTime(intDiv(toUInt32(sampled_at), 3600) * 3600) AS h FROM gpu_samples ORDER BY h"
		args = nil
	}
	return s.hours(ctx, query, args...)
}

// StalePriceHours lists the hours at or after from (zero: all) whose cost
// rows were computed with a price book other than version.
func (s *Store) StalePriceHours(ctx context.Context, version string, from time.Time) ([]time.Time, error) {
	since := max(from.Unix(), 0)
	return s.hours(ctx, `SELECT DISTINCT hour FROM gpu_hour FINAL WHERE price_version != ? AND hour >= toDateTime(?)
UNION ALL SELECT DISTINCT hour FROM cost_hour FINAL WHERE price_version != ? AND hour >= toDateTime(?)`,
		version, since, version, since)
}

// GPUTimeMissingHours lists the hours whose newest cost rows were computed
// before migration 0026 and that still have GPU samples: attributed lines
// (the hour had GPU samples) but no allocated GPU time in any line, which a
// computation since never leaves (the deployment-hours' milliseconds are
// all in their lines). The rollup job recosts them once, so that GPU-hours
// per tenant cover the history. An hour whose samples are gone is never
// listed: recosting it would turn its cost lines into unattributed ones.
func (s *Store) GPUTimeMissingHours(ctx context.Context) ([]time.Time, error) {
	return s.hours(ctx, `SELECT hour FROM cost_hour
WHERE (hour, version) IN (SELECT hour, max(version) FROM cost_hour GROUP BY hour)
AND hour IN (`+sampleHoursSQL+`)
GROUP BY hour
HAVING countIf(unattributed = 0) > 0 AND sum(gpu_ms_tokens_separate) = 0
ORDER BY hour`)
}

// CurrentPriceBook returns the newest stored price book; ok is false when
// none was ever stored.
func (s *Store) CurrentPriceBook(ctx context.Context) (version, book string, createdAt time.Time, ok bool, err error) {
	rows, err := s.conn.Query(ctx, "SELECT version, book, created_at FROM price_books ORDER BY seq DESC LIMIT 1")
	if err != nil {
		return "", "", time.Time{}, false, fmt.Errorf("read price book: %w", classify(err))
	}
	defer rows.Close()
	if !rows.Next() {
		return "", "", time.Time{}, false, rows.Err()
	}
	if err := rows.Scan(&version, &book, &createdAt); err != nil {
		return "", "", time.Time{}, false, fmt.Errorf("read price book: %w", err)
	}
	return version, book, createdAt.UTC(), true, nil
}

// PutPriceBook stores a price book version.
func (s *Store) PutPriceBook(ctx context.Context, version, book, source string, at time.Time) error {
	if err := s.insertRow(ctx, "INSERT INTO price_books (version, book, source, created_at, seq)", version, book, source, at.UTC().Truncate(time.Second), uint64(at.UnixNano())); err != nil {
		return fmt.Errorf("store price book: %w", err)
	}
	return nil
}

// PriceBookVersion returns the stored price book of a version (the book a
// closed statement was priced with); ok is false when no such version was
// stored.
func (s *Store) PriceBookVersion(ctx context.Context, version string) (book string, ok bool, err error) {
	err = s.each(ctx, "price book", "SELECT book FROM price_books WHERE version = ? ORDER BY seq LIMIT 1", []any{version}, []any{&book}, func() error {
		ok = true
		return nil
	})
	return book, ok, err
}
