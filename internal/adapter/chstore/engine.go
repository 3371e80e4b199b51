package chstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// engineColumns is the explicit column list of every insert into
// engine_samples, in the order EngineBatch appends them.
var engineColumns = []string{
	"sample_id", "deployment", "engine", "replica", "model", "node",
	"sampled_at", "sampled_at_ms", "interval_s", "running", "waiting",
	"kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits",
	"prefix_cache_hit_rate", "preemptions", "batch_tokens", "source", "ingested_at", "restarts",
}

// InsertEngineSamplesSQL is the statement every engine sample batch is sent with.
var InsertEngineSamplesSQL = "INSERT INTO engine_samples (" + strings.Join(engineColumns, ", ") + ")"

// EngineBatch accumulates validated engine samples column by column for
// one columnar INSERT; an unset optional field is a NULL. Reset reuses the
// memory.
type EngineBatch struct {
	sampleID, deployment, engine, replica, model, node []string
	sampledAt                                          []time.Time
	sampledMs                                          []int64
	interval                                           []float64
	running, waiting                                   []*uint32
	kv                                                 []*float64
	queries, hits                                      []*uint64
	hitRate                                            []*float64
	preemptions                                        []*uint64
	batchTokens                                        []*float64
	source                                             []string
	ingestedAt                                         []time.Time
	restarts                                           []*uint32
}

// Len is the number of rows in the batch.
func (b *EngineBatch) Len() int { return len(b.sampleID) }

// Reset empties the batch, keeping its memory.
func (b *EngineBatch) Reset() {
	*b = EngineBatch{
		sampleID: b.sampleID[:0], deployment: b.deployment[:0], engine: b.engine[:0], replica: b.replica[:0],
		model: b.model[:0], node: b.node[:0], sampledAt: b.sampledAt[:0], sampledMs: b.sampledMs[:0],
		interval: b.interval[:0], running: b.running[:0], waiting: b.waiting[:0], kv: b.kv[:0],
		queries: b.queries[:0], hits: b.hits[:0], hitRate: b.hitRate[:0], preemptions: b.preemptions[:0],
		batchTokens: b.batchTokens[:0], source: b.source[:0], ingestedAt: b.ingestedAt[:0], restarts: b.restarts[:0],
	}
}

// Append adds one sample, which the caller has validated. The batch keeps
// pointers into s: s must not change until the batch is reset.
func (b *EngineBatch) Append(s *meterv1.EngineSample, ingestedAt time.Time) {
	at := s.GetSampledAt()
	b.sampleID = append(b.sampleID, s.GetSampleId())
	b.deployment = append(b.deployment, s.GetDeployment())
	b.engine = append(b.engine, s.GetEngine())
	b.replica = append(b.replica, s.GetReplica())
	b.model = append(b.model, s.GetModel())
	b.node = append(b.node, s.GetNode())
	b.sampledAt = append(b.sampledAt, time.Unix(at.GetSeconds(), 0).UTC())
	b.sampledMs = append(b.sampledMs, unixMilli(sink.Timestamp{Seconds: at.GetSeconds(), Nanos: at.GetNanos()}))
	b.interval = append(b.interval, s.GetIntervalS())
	b.running = append(b.running, s.Running)
	b.waiting = append(b.waiting, s.Waiting)
	b.kv = append(b.kv, s.KvCacheUsage)
	b.queries = append(b.queries, s.PrefixCacheQueries)
	b.hits = append(b.hits, s.PrefixCacheHits)
	b.hitRate = append(b.hitRate, s.PrefixCacheHitRate)
	b.preemptions = append(b.preemptions, s.Preemptions)
	b.batchTokens = append(b.batchTokens, s.BatchTokens)
	b.source = append(b.source, s.GetSource())
	b.ingestedAt = append(b.ingestedAt, ingestedAt.Truncate(time.Second))
	b.restarts = append(b.restarts, s.Restarts)
}

func (b *EngineBatch) columns() []any {
	return []any{
		b.sampleID, b.deployment, b.engine, b.replica, b.model, b.node,
		b.sampledAt, b.sampledMs, b.interval, b.running, b.waiting,
		b.kv, b.queries, b.hits, b.hitRate, b.preemptions, b.batchTokens, b.source, b.ingestedAt, b.restarts,
	}
}

// NewEngineBatch implements ingest.EngineSampleWriter: an empty
// *EngineBatch.
func (s *Store) NewEngineBatch() sink.EngineBatch { return new(EngineBatch) }

// InsertEngineSamples writes the batch, an *EngineBatch, in one INSERT
// with an explicit column list. An empty batch is a no-op; the batch is
// left as it is.
func (s *Store) InsertEngineSamples(ctx context.Context, batch sink.EngineBatch) error {
	b, ok := batch.(*EngineBatch)
	if !ok {
		return fmt.Errorf("insert engine samples batch: %w", errForeignBatch(batch))
	}
	if b.Len() == 0 {
		return nil
	}
	return s.sendColumns(s.ingestContext(ctx), "insert engine samples batch", InsertEngineSamplesSQL, engineColumns, b.columns())
}

// EngineDirtyHours implements rollup.EngineStore.
func (s *Store) EngineDirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error) {
	query := "SELECT DISTINCT hour FROM engine_dirty_hours WHERE ingested_at >= toDateTime(?) AND ingested_at < toDateTime(?) ORDER BY hour"
	args := []any{since.Unix(), until.Unix()}
	if since.IsZero() {
		query = "SELECT DISTINCT toDateTime(intDiv(toUInt32(sampled_at), 3600) * 3600) AS h FROM engine_samples ORDER BY h"
		args = nil
	}
	return s.hours(ctx, query, args...)
}

// EngineSamplesOfHour implements rollup.EngineStore: the hour's samples,
// deduplicated by sample_id (the latest ingested copy wins), in sample_id
// order, so that the rollup's float sums come out the same on every
// computation of the hour.
func (s *Store) EngineSamplesOfHour(ctx context.Context, hour time.Time) ([]rollup.EngineSampleRow, error) {
	hour = hour.UTC().Truncate(time.Hour)
	return s.EngineSamplesOfHours(ctx, hour, hour.Add(time.Hour))
}

// EngineSamplesOfHours returns the samples of the hours in [from, to) (whole
// hours), deduplicated by sample_id, in sample_id order.
func (s *Store) EngineSamplesOfHours(ctx context.Context, from, to time.Time) ([]rollup.EngineSampleRow, error) {
	hour := from.UTC().Truncate(time.Hour)
	const query = `SELECT argMax(deployment, ingested_at), argMax(engine, ingested_at), argMax(model, ingested_at),
  argMax(replica, ingested_at), argMax(sampled_at, ingested_at), argMax(interval_s, ingested_at),
  argMax(running, ingested_at), argMax(waiting, ingested_at), argMax(kv_cache_usage, ingested_at),
  argMax(prefix_cache_queries, ingested_at), argMax(prefix_cache_hits, ingested_at),
  argMax(prefix_cache_hit_rate, ingested_at), argMax(preemptions, ingested_at), argMax(batch_tokens, ingested_at),
  argMax(restarts, ingested_at)
FROM engine_samples
WHERE sampled_at >= toDateTime(?) AND sampled_at < toDateTime(?)
GROUP BY sample_id
ORDER BY sample_id`
	rows, err := s.conn.Query(ctx, query, hour.Unix(), to.UTC().Unix())
	if err != nil {
		return nil, fmt.Errorf("read engine samples of %s to %s: %w", hour.Format(time.RFC3339), to.UTC().Format(time.RFC3339), classify(err))
	}
	defer rows.Close()
	var out []rollup.EngineSampleRow
	for rows.Next() {
		var r rollup.EngineSampleRow
		if err := rows.Scan(&r.Deployment, &r.Engine, &r.Model, &r.Replica, &r.SampledAt, &r.IntervalS,
			&r.Running, &r.Waiting, &r.KVCacheUsage, &r.PrefixQueries, &r.PrefixHits,
			&r.PrefixHitRate, &r.Preemptions, &r.BatchTokens, &r.Restarts); err != nil {
			return nil, fmt.Errorf("scan engine samples: %w", err)
		}
		r.SampledAt = r.SampledAt.UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read engine samples: %w", classify(err))
	}
	return out, nil
}

// engineRowColumns is the column list of engine_hour and engine_minute.
var engineRowColumns = []string{"bucket", "deployment", "engine", "model", "replica", "samples", "sampled_seconds",
	"running_weighted", "running_seconds", "running_max", "waiting_weighted", "waiting_seconds", "waiting_max",
	"waiting_values", "waiting_counts", "kv_weighted", "kv_seconds", "kv_max", "kv_samples",
	"prefix_queries", "prefix_hits", "hit_rate_weighted", "hit_rate_seconds", "preemptions",
	"batch_weighted", "batch_seconds", "version", "kv_min", "restarts"}

// WriteEngineRows implements rollup.EngineStore.
func (s *Store) WriteEngineRows(ctx context.Context, minutes, hours []rollup.EngineRow, version uint64) error {
	for _, t := range []struct {
		table string
		rows  []rollup.EngineRow
	}{{"engine_minute", minutes}, {"engine_hour", hours}} {
		if len(t.rows) == 0 {
			continue
		}
		err := s.sendRows(ctx, "write "+t.table, t.table, engineRowColumns, len(t.rows), func(i int) []any {
			r := &t.rows[i]
			return []any{r.Bucket.UTC(), r.Deployment, r.Engine, r.Model, r.Replica, r.Samples, r.SampledSeconds,
				r.RunningWeighted, r.RunningSeconds, r.RunningMax, r.WaitingWeighted, r.WaitingSeconds, r.WaitingMax,
				nonNil(r.WaitingValues), nonNil(r.WaitingCounts), r.KVWeighted, r.KVSeconds, r.KVMax, r.KVSamples,
				r.PrefixQueries, r.PrefixHits, r.HitRateWeighted, r.HitRateSeconds, r.Preemptions,
				r.BatchWeighted, r.BatchSeconds, version, r.KVMin, r.Restarts}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// nonNil gives an empty array for a nil slice (the driver wants a value).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// engineSQL builds the read of a normalized engine query: the newest
// computation's rows of engine_minute (minute step) or engine_hour, of the
// query's deployments if it names any, summed per step and group, queue
// depths merged per value with sumMap. The KV-cache minimum is over the
// rows that sampled a KV-cache usage (-1 where such a row was rolled up
// before migration 0025 and does not know it).
func engineSQL(q query.EngineQuery) (string, []any) {
	table := "engine_hour"
	if q.Step == "minute" {
		table = "engine_minute"
	}
	bucket, args := stepExpr("bucket", q.StepSeconds(), q.Start)
	where, whereArgs := scope("bucket", q.Start, q.End, "")
	if len(q.Deployments) > 0 {
		where += " AND deployment IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(q.Deployments)), ", ") + ")"
		for _, d := range q.Deployments {
			whereArgs = append(whereArgs, d)
		}
	}
	from, fromArgs := newestRows(table, "bucket", where, whereArgs, "")
	sel := append([]string{bucket + " AS b"}, q.GroupBy...)
	// The Float64 columns are summed with floatSum: the same read gives
	// the same means.
	sel = append(sel, "uniqExact(replica)", "sum(samples)", floatSum("sampled_seconds"),
		floatSum("running_weighted"), floatSum("running_seconds"), "max(running_max)",
		floatSum("waiting_weighted"), floatSum("waiting_seconds"), "max(waiting_max)",
		"(sumMap(waiting_values, waiting_counts) AS w).1", "w.2",
		floatSum("kv_weighted"), floatSum("kv_seconds"), "max(kv_max)", "sum(kv_samples)",
		"sum(prefix_queries)", "sum(prefix_hits)", floatSum("hit_rate_weighted"), floatSum("hit_rate_seconds"),
		"sum(preemptions)", floatSum("batch_weighted"), floatSum("batch_seconds"),
		"minIf(kv_min, kv_samples > 0)", "sum(restarts)")
	groupBy := strings.Join(append([]string{"b"}, q.GroupBy...), ", ")
	stmt := fmt.Sprintf("SELECT %s\nFROM %s\nGROUP BY %s\nORDER BY %s", strings.Join(sel, ", "), from, groupBy, groupBy)
	if q.Limit > 0 {
		stmt += fmt.Sprintf("\nLIMIT %d", q.Limit)
	}
	return stmt, append(args, fromArgs...)
}

// EngineRows implements query.EngineSource.
func (s *Store) EngineRows(ctx context.Context, q query.EngineQuery) ([]query.EngineRow, error) {
	stmt, args := engineSQL(q)
	var (
		out []query.EngineRow
		r   query.EngineRow
		k   = newStepKey(len(q.GroupBy))
	)
	e := &r.EngineRow
	dest := k.dest(&r.Replicas, &e.Samples, &e.SampledSeconds,
		&e.RunningWeighted, &e.RunningSeconds, &e.RunningMax,
		&e.WaitingWeighted, &e.WaitingSeconds, &e.WaitingMax, &e.WaitingValues, &e.WaitingCounts,
		&e.KVWeighted, &e.KVSeconds, &e.KVMax, &e.KVSamples,
		&e.PrefixQueries, &e.PrefixHits, &e.HitRateWeighted, &e.HitRateSeconds,
		&e.Preemptions, &e.BatchWeighted, &e.BatchSeconds, &e.KVMin, &e.Restarts)
	err := s.each(ctx, "engine stats", stmt, args, dest, func() error {
		r.Start = k.start(q.StepSeconds(), q.Start)
		r.Group = groupMap(q.GroupBy, k.groups)
		out = append(out, r)
		e.WaitingValues, e.WaitingCounts = nil, nil // kept by the row appended
		return nil
	})
	return out, err
}
