package chstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"tokenmeter/rollup"
)

// The reads and writes of the hour rollup (package rollup aggregates): the
// groups and deduplicated events of an hour, and columnar INSERTs of rollup
// rows.

// hourGroupsSQL lists the groups of one UTC hour with a 64-bit hash that
// hourEventsSQL returns instead of the six strings, so that reading an
// event allocates nothing, and their rows (duplicates included). The hash
// is the events' group_hash, computed by ClickHouse on insert (migration
// 0006). The second column is false when two groups share a hash: a second
// hash of the six strings (in another order) then differs between the
// hash's rows.
const hourGroupsSQL = `SELECT group_hash AS h,
  min(cityHash64(slo_class, gpu_type, deployment, model_version, model, tenant_id)) =
    max(cityHash64(slo_class, gpu_type, deployment, model_version, model, tenant_id)),
  count(), any(tenant_id), any(model), any(model_version), any(deployment), any(gpu_type), any(slo_class)
FROM inference_events
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)
GROUP BY h`

// hourEventsSQL reads one UTC hour of events, deduplicated: the table's key
// is (hour, tenant_id, event_id), so FINAL keeps one row per event, the
// newest ingested copy (duplicates share completed_at, hence the hour).
// The status (1 for ok, 2 + its index in errClasses, 0 for another) and the
// latencies are read as rollup.HourEvent holds them; validation keeps NaN
// out of the table, so NaN marks a missing latency; an ITL derived from an
// estimated TTFT (ttft_estimated, migration 0023: E2E taken as TTFT makes
// it 0) is missing too, a measured one is kept. Only numbers
// go through FINAL's merge: 18.16 copies every column it reads through it
// row by row, so hashing the six strings here cost four times the read.
var hourEventsSQL = `SELECT toUInt32(completed_at), group_hash,
  toUInt8(indexOf(['ok', '` + strings.Join(errClasses, "', '") + `'], status)), ttft_estimated,
  prompt_tokens, cached_prompt_tokens, output_tokens,
  ifNull(ttft_ms, nan), if(ttft_estimated AND NOT itl_measured, nan, ifNull(itl_ms, nan)), ifNull(e2e_ms, nan), ifNull(queue_ms, nan), ifNull(prefill_ms, nan)
FROM inference_events FINAL
WHERE completed_at >= toDateTime(?) AND completed_at < toDateTime(?)`

// ReadHour reads the groups of one UTC hour, then its deduplicated events,
// in no particular order: group is called once for each group before any
// event of it, event for each event (e is reused from call to call). An
// event of a group inserted after the groups were listed makes it list them
// again. It fails when two groups share a hash.
func (s *Store) ReadHour(ctx context.Context, hour time.Time, group func(rollup.HourGroup) error, event func(e *rollup.HourEvent) error) error {
	hour = hour.UTC().Truncate(time.Hour)
	known := map[uint64]bool{}
	if err := s.readHourGroups(ctx, hour, known, group); err != nil {
		return err
	}
	rows, err := s.conn.Query(ctx, hourEventsSQL, hour.Unix(), hour.Add(time.Hour).Unix())
	if err != nil {
		return fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	var e rollup.HourEvent
	dest := []any{&e.CompletedAt, &e.Group, &e.Status, &e.TTFTEstimated, &e.Prompt, &e.Cached, &e.Output}
	for i := range e.Latency {
		dest = append(dest, &e.Latency[i])
	}
	dest = append(dest, &e.Prefill)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("scan events of %s: %w", hour.Format(time.RFC3339), err)
		}
		if !known[e.Group] {
			if err := s.readHourGroups(ctx, hour, known, group); err != nil {
				return err
			}
			if !known[e.Group] {
				return fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), errUnknownGroup)
			}
		}
		if err := event(&e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read events of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	return nil
}

// errUnknownGroup marks an event whose group is not listed.
var errUnknownGroup = errors.New("event of an unlisted group")

// readHourGroups calls group for each group of the hour not known yet.
func (s *Store) readHourGroups(ctx context.Context, hour time.Time, known map[uint64]bool, group func(rollup.HourGroup) error) error {
	rows, err := s.conn.Query(ctx, hourGroupsSQL, hour.Unix(), hour.Add(time.Hour).Unix())
	if err != nil {
		return fmt.Errorf("read groups of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			g   rollup.HourGroup
			one bool
		)
		if err := rows.Scan(&g.Hash, &one, &g.Rows, &g.Dims[0], &g.Dims[1], &g.Dims[2], &g.Dims[3], &g.Dims[4], &g.Dims[5]); err != nil {
			return fmt.Errorf("scan groups of %s: %w", hour.Format(time.RFC3339), err)
		}
		if !one {
			return fmt.Errorf("groups of %s: two groups share the hash %x; this hour cannot be rolled up", hour.Format(time.RFC3339), g.Hash)
		}
		if !known[g.Hash] {
			known[g.Hash] = true
			if err := group(g); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read groups of %s: %w", hour.Format(time.RFC3339), classify(err))
	}
	return nil
}

// RollupTables are the tables an hour's rollup writes.
var RollupTables = []string{"rollup_minute_recent", "rollup_hour", "rollup_tenant_hour", "rollup_total_hour", "rollup_deployment_hour"}

// rollupBlock holds the columns of rollupColumns for a block of rows,
// reused from block to block.
type rollupBlock struct {
	bucket                 []time.Time
	dims                   [6][]string
	requests, errs         []uint64
	errsBy                 [8][]uint64
	prompt, cached, output []uint64
	counts                 [4][]uint64
	sums                   [4][]float64
	hkeys                  [4][][]int16
	hcounts                [4][][]uint64
	slo                    []uint32
	good, goodOut, ver     []uint64
	peakReq, peakOut       []uint64
	minReq, minOut         [][]uint64
	hourKeys               [rollup.NumHourDists][][]int16
	hourCounts             [rollup.NumHourDists][][]uint64
	kept                   []uint8
}

// fill lays rows out as the columns of rollupColumns, followed, with
// hourCols, by those of peakColumns, minuteColumns and hourHistColumns,
// and with kept by decode_kept, 1 on every row (decodeKept).
func (b *rollupBlock) fill(rows []rollup.RollupRecord, sloVersion uint32, version uint64, hourCols, kept bool) []any {
	n := len(rows)
	b.bucket = reuse(b.bucket, n)
	for d := range b.dims {
		b.dims[d] = reuse(b.dims[d], n)
	}
	b.requests, b.errs = reuse(b.requests, n), reuse(b.errs, n)
	for c := range b.errsBy {
		b.errsBy[c] = reuse(b.errsBy[c], n)
	}
	b.prompt, b.cached, b.output = reuse(b.prompt, n), reuse(b.cached, n), reuse(b.output, n)
	for m := range 4 {
		b.counts[m], b.sums[m], b.hkeys[m], b.hcounts[m] = reuse(b.counts[m], n), reuse(b.sums[m], n), reuse(b.hkeys[m], n), reuse(b.hcounts[m], n)
	}
	b.slo, b.good, b.goodOut, b.ver = reuse(b.slo, n), reuse(b.good, n), reuse(b.goodOut, n), reuse(b.ver, n)
	for i := range rows {
		r := &rows[i]
		b.bucket = append(b.bucket, r.Bucket)
		for d := range b.dims {
			b.dims[d] = append(b.dims[d], r.Dims[d])
		}
		b.requests, b.errs = append(b.requests, r.Requests), append(b.errs, r.Errors)
		for c := range b.errsBy {
			b.errsBy[c] = append(b.errsBy[c], r.ErrorsBy[c])
		}
		b.prompt, b.cached, b.output = append(b.prompt, r.Prompt), append(b.cached, r.Cached), append(b.output, r.Output)
		for m := range 4 {
			b.counts[m], b.sums[m] = append(b.counts[m], r.Count[m]), append(b.sums[m], r.Sum[m])
			b.hkeys[m], b.hcounts[m] = append(b.hkeys[m], r.Keys[m]), append(b.hcounts[m], r.Counts[m])
		}
		b.slo, b.good = append(b.slo, sloVersion), append(b.good, r.Good)
		b.goodOut, b.ver = append(b.goodOut, r.GoodOutput), append(b.ver, version)
	}
	if hourCols {
		b.peakReq, b.peakOut, b.minReq, b.minOut = reuse(b.peakReq, n), reuse(b.peakOut, n), reuse(b.minReq, n), reuse(b.minOut, n)
		for i := range rows {
			r := &rows[i]
			b.peakReq, b.peakOut = append(b.peakReq, r.PeakRequests), append(b.peakOut, r.PeakOutput)
			b.minReq, b.minOut = append(b.minReq, r.MinuteRequests), append(b.minOut, r.MinuteOutput)
		}
		for d := range b.hourKeys {
			b.hourKeys[d], b.hourCounts[d] = reuse(b.hourKeys[d], n), reuse(b.hourCounts[d], n)
			for i := range rows {
				b.hourKeys[d], b.hourCounts[d] = append(b.hourKeys[d], rows[i].HourKeys[d]), append(b.hourCounts[d], rows[i].HourCounts[d])
			}
		}
	}
	cols := []any{b.bucket}
	for _, d := range b.dims {
		cols = append(cols, d)
	}
	cols = append(cols, b.requests, b.errs)
	for _, c := range b.errsBy {
		cols = append(cols, c)
	}
	cols = append(cols, b.prompt, b.cached, b.output)
	for m := range 4 {
		cols = append(cols, b.counts[m], b.sums[m], b.hkeys[m], b.hcounts[m])
	}
	cols = append(cols, b.slo, b.good, b.goodOut, b.ver)
	if hourCols {
		cols = append(cols, b.peakReq, b.peakOut, b.minReq, b.minOut)
		for d := range b.hourKeys {
			cols = append(cols, b.hourKeys[d], b.hourCounts[d])
		}
	}
	if kept {
		b.kept = reuse(b.kept, n)
		for range rows {
			b.kept = append(b.kept, 1)
		}
		cols = append(cols, b.kept)
	}
	return cols
}

// reuse returns s emptied, with room for n elements.
func reuse[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// InsertRollupRecords writes rows into table in one INSERT, with the SLO
// version their goodput was counted with and the version of their
// computation.
func (s *Store) InsertRollupRecords(ctx context.Context, table string, rows []rollup.RollupRecord, sloVersion uint32, version uint64) error {
	from := 0
	return s.insertRollupRows(ctx, table, func() ([]rollup.RollupRecord, error) {
		block := rows[from:min(from+rollup.RollupBlockRows, len(rows))]
		from += len(block)
		if len(block) == 0 {
			return nil, nil
		}
		return block, nil
	}, sloVersion, version)
}

// InsertRollupBlocks writes the blocks of rows received from blocks into
// table, in one INSERT, until blocks is closed; it sends each block on to
// free (when not nil, and if there is room) once the driver holds a copy.
// It writes nothing if no block comes, and fails without finishing the
// INSERT if ctx ends first.
func (s *Store) InsertRollupBlocks(ctx context.Context, table string, blocks <-chan []rollup.RollupRecord, free chan<- []rollup.RollupRecord, sloVersion uint32, version uint64) error {
	var last []rollup.RollupRecord
	return s.insertRollupRows(ctx, table, func() ([]rollup.RollupRecord, error) {
		if last != nil && free != nil {
			select {
			case free <- last:
			default:
			}
		}
		select {
		case rows := <-blocks:
			last = rows
			return rows, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}, sloVersion, version)
}

// insertRollupRows writes the blocks next returns into table, in one INSERT,
// until it returns nil; the driver holds a copy of a block by the time next
// is called again. Nothing is written if the first block is nil.
func (s *Store) insertRollupRows(ctx context.Context, table string, next func() ([]rollup.RollupRecord, error), sloVersion uint32, version uint64) error {
	if !slices.Contains(RollupTables, table) {
		return fmt.Errorf("insert rollup rows: unknown table %q", table)
	}
	first, err := next()
	if err != nil || first == nil {
		return err
	}
	var b rollupBlock
	cols := columnsOf(table)
	hourCols := table != "rollup_minute_recent"
	return s.sendBlocks(ctx, "insert rows into "+table, "INSERT INTO "+table+" ("+strings.Join(cols, ", ")+")", cols, func() ([]any, error) {
		rows := first
		first = nil
		if rows == nil {
			var err error
			if rows, err = next(); err != nil || rows == nil {
				return nil, err
			}
		}
		return b.fill(rows, sloVersion, version, hourCols, decodeKept(table)), nil
	})
}
