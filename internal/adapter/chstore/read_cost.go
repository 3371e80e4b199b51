package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/query"
)

// costSQL builds the query of a normalized cost query.
func costSQL(q query.CostQuery) (string, []any, error) {
	b, i := q.Policies()
	if b < 0 || i < 0 {
		return "", nil, fmt.Errorf("%w: cost query with policies %q and %q: normalize it first", query.ErrInvalidQuery, q.Busy, q.Idle)
	}
	bucket, args := stepExpr("hour", q.StepSeconds(), q.Start)
	sel := []string{bucket + " AS b"}
	sel = append(sel, q.GroupBy...)
	sel = append(sel,
		"sum("+allocationColumns[b][i]+") AS c", "sum("+busyColumns[b]+")",
		"sumIf(requests, unattributed = 0)", "sumIf(input_tokens, unattributed = 0)",
		"sumIf(cached_input_tokens, unattributed = 0)", "sumIf(output_tokens, unattributed = 0)",
		"sumIf(good_output_tokens, unattributed = 0)",
		"sumIf(requests, unattributed = 1)", "sumIf(input_tokens, unattributed = 1)", "sumIf(output_tokens, unattributed = 1)",
		"sum(list_charge)", "sumIf(requests, list_priced = 0)",
		"groupUniqArray(price_version)", "sum("+gpuAllocationColumns[b][i]+") AS g", "sum("+gpuBusyColumns[b]+")")
	where, whereArgs := scope("hour", q.Start, q.End, q.TenantID)
	from, fromArgs := newestRows("cost_hour", "hour", where, whereArgs, "")
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	// Lines with neither cost, GPU time nor usage (the idle line when idle
	// cost is shared) are left out.
	return fmt.Sprintf("SELECT %s\nFROM %s\nGROUP BY %s\nHAVING c != 0 OR g != 0 OR sum(requests) > 0\nORDER BY %s",
		strings.Join(sel, ", "), from, groupBy, groupBy), append(args, fromArgs...), nil
}

// CostRows runs a normalized cost query.
func (s *Store) CostRows(ctx context.Context, q query.CostQuery) ([]query.CostRow, error) {
	stmt, args, err := costSQL(q)
	if err != nil {
		return nil, err
	}
	var (
		out []query.CostRow
		r   query.CostRow
		k   = newStepKey(len(q.GroupBy))
	)
	dest := k.dest(&r.CostNanos, &r.BusyNanos, &r.Requests, &r.InputTokens, &r.CachedInputTokens,
		&r.OutputTokens, &r.GoodOutputTokens, &r.UnattributedRequests, &r.UnattributedInput, &r.UnattributedOutput,
		&r.ListCharge, &r.ListUnpricedRequests, &r.PriceVersions, &r.GPUMs, &r.GPUBusyMs)
	err = s.each(ctx, "cost", stmt, args, dest, func() error {
		r.Start = k.start(q.StepSeconds(), q.Start)
		r.Group = groupMap(q.GroupBy, k.groups)
		slices.Sort(r.PriceVersions)
		out = append(out, r)
		r.PriceVersions = nil // kept by the row appended
		return nil
	})
	return out, err
}

// usageCostSQL builds the detailed usage-and-cost read of a normalized cost
// query: every line of cost_hour (attributed or not) per step, tenant,
// model and deployment; under the separate idle policy the idle cost is the
// idle tenant's (billing.IdleTenant) lines.
func usageCostSQL(q query.CostQuery) (string, []any, error) {
	b, i := q.Policies()
	if b < 0 || i < 0 {
		return "", nil, fmt.Errorf("%w: cost query with policies %q and %q: normalize it first", query.ErrInvalidQuery, q.Busy, q.Idle)
	}
	bucket, args := stepExpr("hour", q.StepSeconds(), q.Start)
	where, whereArgs := scope("hour", q.Start, q.End, q.TenantID)
	from, fromArgs := newestRows("cost_hour", "hour", where, whereArgs, "")
	return fmt.Sprintf(`SELECT %s AS b, tenant_id, model, deployment,
  sum(requests), sum(input_tokens), sum(cached_input_tokens), sum(output_tokens),
  sum(list_charge), sumIf(requests, list_priced = 0), sum(%s), sum(%s), groupUniqArray(price_version)
FROM %s
GROUP BY b, tenant_id, model, deployment
ORDER BY b, tenant_id, model, deployment`, bucket, allocationColumns[b][i], busyColumns[b], from),
		append(args, fromArgs...), nil
}

// usageCostChunkRows bounds the cost_hour rows one query of EachUsageCost
// reads (of the newest computation of each hour). Each query reads most of
// the month's partition again (cost_hour is ordered by tenant first), so
// chunks are not smaller; the hourly export holds two chunks' rows (about
// 100 bytes a row: one read while the last is streamed). On the bench's
// month of 1,000 tenants (2.8M rows, 2026-11-27, 2-core machine under load),
// 128k-row chunks took ClickHouse 4.2-4.5 s of CPU with a peak RSS of
// 125 MiB (CSV) and 151 MiB (Parquet); 256k rows 2.5 s, 206 and 237 MiB.
const usageCostChunkRows = 128 * 1024

// EachUsageCost streams the detailed usage-and-cost rows of a normalized
// cost query.
//
// ClickHouse (18.16) sends the result of a sorted GROUP BY as one block,
// and the driver decodes a block whole before the first row is scanned: one
// query of a month of 1,000 tenants' hours (2.9M rows) held 1.1 GiB in
// memory for 30-40 s before the first row came. The range is read in
// chunks of whole steps instead, each of at most about usageCostChunkRows
// rows of cost_hour (a step with more is a chunk of its own), one query
// each, in order.
func (s *Store) EachUsageCost(ctx context.Context, q query.CostQuery, row func(r *query.UsageCostRow) error) error {
	if _, _, err := usageCostSQL(q); err != nil {
		return err
	}
	chunks, err := s.usageCostChunks(ctx, q)
	if err != nil {
		return err
	}
	if q.StepSeconds() == 3600 {
		// An hour's rows are read as stored and sorted here (one row per
		// tenant, deployment and model an hour): see usage_cost.go.
		return s.eachUsageCostRows(ctx, q, chunks, row)
	}
	// A wider step's rows are summed by ClickHouse: it sends a day's rows
	// in one row per tenant, model and deployment.
	return s.eachUsageCostGrouped(ctx, q, chunks, row)
}

// eachUsageCostGrouped streams the rows of the ranges chunks of q summed
// by ClickHouse (usageCostSQL), one query a chunk.
func (s *Store) eachUsageCostGrouped(ctx context.Context, q query.CostQuery, chunks []usageCostRange, row func(r *query.UsageCostRow) error) error {
	var (
		r     query.UsageCostRow
		start uint32
	)
	dest := []any{&start, &r.Tenant, &r.Model, &r.Deployment, &r.Requests, &r.InputTokens, &r.CachedInputTokens,
		&r.OutputTokens, &r.ListCharge, &r.ListUnpricedRequests, &r.CostNanos, &r.BusyNanos, &r.PriceVersions}
	for _, c := range chunks {
		cq := q
		cq.Start, cq.End = c.start, c.end
		stmt, args, err := usageCostSQL(cq)
		if err != nil {
			return err
		}
		err = s.each(ctx, "usage and cost", stmt, args, dest, func() error {
			r.Start = time.Unix(int64(start), 0).UTC()
			slices.Sort(r.PriceVersions)
			return row(&r)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// usageCostRange is a chunk of a usage-and-cost read: a range of whole
// steps and the rows of cost_hour that it reads.
type usageCostRange struct {
	start, end time.Time
	rows       uint64
}

// usageCostChunks splits q's range at step boundaries into consecutive
// ranges of at most s's chunk of cost_hour rows each, counting the rows of
// the newest computation of each hour (those read; a computation since
// adds few if any). A step with more rows is a range of its own.
func (s *Store) usageCostChunks(ctx context.Context, q query.CostQuery) ([]usageCostRange, error) {
	limit := uint64(s.usageCostChunk)
	if limit == 0 {
		limit = usageCostChunkRows
	}
	bucket, args := stepExpr("hour", q.StepSeconds(), q.Start)
	where, whereArgs := scope("hour", q.Start, q.End, q.TenantID)
	stmt := fmt.Sprintf(`SELECT %s AS b, toUInt32(hour) AS h, version, count() FROM cost_hour WHERE %s
GROUP BY b, h, version ORDER BY b, h, version`, bucket, where)
	var (
		out            []usageCostRange
		from           = q.Start
		rows, stepRows uint64 // rows of the range so far, of the step so far
		lastB, lastH   uint32
		started        bool
		b, h           uint32
		version, count uint64
		hourRows       uint64 // the rows of the newest version of hour lastH so far
	)
	endStep := func() {
		// A step's bucket starts on the step grid: cutting there keeps each
		// step whole in one range.
		if step := time.Unix(int64(lastB), 0).UTC(); rows > 0 && rows+stepRows > limit && step.After(from) {
			out = append(out, usageCostRange{from, step, rows})
			from, rows = step, 0
		}
		rows += stepRows
	}
	err := s.each(ctx, "usage and cost rows per step", stmt, append(args, whereArgs...), []any{&b, &h, &version, &count}, func() error {
		if started && h != lastH {
			stepRows += hourRows
		}
		if started && b != lastB {
			endStep()
			stepRows = 0
		}
		lastB, lastH, hourRows, started = b, h, count, true // versions ascend: the last is the newest
		return nil
	})
	if err != nil {
		return nil, err
	}
	if started {
		stepRows += hourRows
		endStep()
	}
	return append(out, usageCostRange{from, q.End, rows}), nil
}
