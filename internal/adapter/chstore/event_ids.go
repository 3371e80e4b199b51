package chstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The event id index (migration 0015, table event_ids) records every
// (tenant_id, event_id) stored in inference_events, so that an event is
// counted once whatever completed_at a later copy carries: the key of
// inference_events starts with the hour, so its ReplacingMergeTree and the
// reads that group by (tenant_id, event_id) within an hour cannot see a
// copy stored in another hour or month.

// eventIDColumns is the explicit column list of every insert into event_ids,
// in the order EventBatch.keyColumns gives them.
var eventIDColumns = []string{
	"key_hash", "tenant_id", "event_id", "completed_at_ms", "fingerprint",
	"ingested_at", "source_partition", "source_offset",
}

// InsertEventIDsSQL is the statement that records a batch's ids.
var InsertEventIDsSQL = "INSERT INTO event_ids (" + strings.Join(eventIDColumns, ", ") + ")"

// The key_hash of a row is sink.EventKey, its fingerprint
// sink.EventRow.Fingerprint: ingest computes both as it batches a row.

// storedEventsSQL reads the first stored copy of each id whose key is in
// the external table batch_keys. The index is ordered by key_hash, so
// ClickHouse reads only the granules that may hold the batch's keys.
const storedEventsSQL = `SELECT key_hash, tenant_id, event_id,
    argMin(completed_at_ms, ingested_at), argMin(fingerprint, ingested_at), min(ingested_at)
FROM event_ids
WHERE key_hash IN (SELECT key_hash FROM batch_keys)
GROUP BY key_hash, tenant_id, event_id`

// StoredEvents implements ingest.EventWriter: the first stored copy of
// every event whose key_hash (sink.EventKey) is in keys; a key may match more than one id (a hash
// collision), so callers compare tenant and event ids. The keys travel as
// an external table (a block of UInt64, sent with the query): in the SQL
// text, 10,000 keys cost 18.16 about 0.3 s to parse, and max_query_size
// bounds the text.
func (s *Store) StoredEvents(ctx context.Context, keys []uint64) ([]sink.StoredEvent, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	table, err := ext.NewTable("batch_keys", ext.Column("key_hash", "UInt64"))
	if err != nil {
		return nil, fmt.Errorf("stored event ids: %w", err)
	}
	for _, k := range keys {
		if err := table.Append(k); err != nil {
			return nil, fmt.Errorf("stored event ids: %w", err)
		}
	}
	// On the replicas the inserts went to (ingestContext): in cluster mode
	// another replica of the local shard may not have the rows of the batch
	// before yet.
	ctx = clickhouse.Context(s.ingestContext(ctx), clickhouse.WithExternalTable(table))
	rows, err := s.conn.Query(ctx, storedEventsSQL)
	if err != nil {
		return nil, fmt.Errorf("stored event ids: %w", classify(err))
	}
	defer rows.Close()
	var out []sink.StoredEvent
	for rows.Next() {
		var e sink.StoredEvent
		if err := rows.Scan(&e.KeyHash, &e.TenantID, &e.EventID, &e.CompletedAtMs, &e.Fingerprint, &e.IngestedAt); err != nil {
			return nil, fmt.Errorf("stored event ids: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stored event ids: %w", classify(err))
	}
	return out, nil
}

// KeyHashes is the batch's key_hash column (not to be modified).
func (b *EventBatch) KeyHashes() []uint64 { return b.keyHash }

// Stored is row i as the event id index records it.
func (b *EventBatch) Stored(i int) sink.StoredEvent {
	return sink.StoredEvent{KeyHash: b.keyHash[i], TenantID: b.tenantID[i], EventID: b.eventID[i],
		CompletedAtMs: b.completedMs[i], Fingerprint: b.fingerprint[i], IngestedAt: b.ingestedAt[i]}
}

// Source is where row i came from.
func (b *EventBatch) Source(i int) sink.Source {
	return sink.Source{Partition: b.partition[i], Offset: b.offset[i]}
}

// keyColumns are the batch's columns for InsertEventIDsSQL.
func (b *EventBatch) keyColumns() []any {
	return []any{b.keyHash, b.tenantID, b.eventID, b.completedMs, b.fingerprint, b.ingestedAt, b.partition, b.offset}
}

// Keep removes the rows i for which keep[i] is false, in place, keeping
// the others in order.
func (b *EventBatch) Keep(keep []bool) {
	b.tenantID, b.eventID, b.requestID = compact(b.tenantID, keep), compact(b.eventID, keep), compact(b.requestID, keep)
	b.model, b.modelVersion, b.deployment = compact(b.model, keep), compact(b.modelVersion, keep), compact(b.deployment, keep)
	b.engine, b.gpuType, b.tp = compact(b.engine, keep), compact(b.gpuType, keep), compact(b.tp, keep)
	b.node, b.region = compact(b.node, keep), compact(b.region, keep)
	b.completedAt, b.completedMs, b.receivedMs = compact(b.completedAt, keep), compact(b.completedMs, keep), compact(b.receivedMs, keep)
	b.prompt, b.cached, b.output = compact(b.prompt, keep), compact(b.cached, keep), compact(b.output, keep)
	for _, n := range []*nullFloats{&b.ttft, &b.e2e, &b.queue, &b.prefill, &b.itl} {
		n.v, n.ok = compact(n.v, keep), compact(n.ok, keep)
	}
	b.itlMeasured, b.status, b.streaming = compact(b.itlMeasured, keep), compact(b.status, keep), compact(b.streaming, keep)
	b.sloClass, b.labelKeys, b.labelValues = compact(b.sloClass, keep), compact(b.labelKeys, keep), compact(b.labelValues, keep)
	b.ingestedAt, b.partition, b.offset = compact(b.ingestedAt, keep), compact(b.partition, keep), compact(b.offset, keep)
	b.keyHash, b.fingerprint = compact(b.keyHash, keep), compact(b.fingerprint, keep)
}

func compact[T any](s []T, keep []bool) []T {
	out := s[:0]
	for i, v := range s {
		if keep[i] {
			out = append(out, v)
		}
	}
	clear(s[len(out):])
	return out
}

// Event rebuilds row i as a message: the event as stored (times to the
// millisecond; itl_ms only where the event sent it). The consumer sends
// it to the dead letters when the row conflicts with a stored copy.
func (b *EventBatch) Event(i int) *meterv1.InferenceEvent {
	r := sink.EventRow{
		EventID: b.eventID[i], RequestID: b.requestID[i], TenantID: b.tenantID[i],
		Model: b.model[i], ModelVersion: b.modelVersion[i], Deployment: b.deployment[i],
		Engine: b.engine[i], GPUType: b.gpuType[i], Node: b.node[i], Region: b.region[i],
		SLOClass: b.sloClass[i], TensorParallelism: b.tp[i],
		CompletedAt:  msTimestamp(b.completedMs[i]),
		PromptTokens: sink.OptInt{V: int64(b.prompt[i]), Set: true}, CachedPromptTokens: sink.OptInt{V: int64(b.cached[i]), Set: true},
		OutputTokens: sink.OptInt{V: int64(b.output[i]), Set: true},
		TTFTMs:       b.ttft.opt(i), E2EMs: b.e2e.opt(i), QueueMs: b.queue.opt(i), PrefillMs: b.prefill.opt(i),
		Status:    statusNumber(b.status[i]),
		Streaming: b.streaming[i] == 1,
	}
	if b.receivedMs[i] != 0 {
		r.ReceivedAt = msTimestamp(b.receivedMs[i])
	}
	if b.itlMeasured[i] == 1 {
		r.ITLMs = b.itl.opt(i)
	}
	for j, k := range b.labelKeys[i] {
		r.Labels = append(r.Labels, sink.Label{Key: k, Value: b.labelValues[i][j]})
	}
	return r.Proto()
}

func (n nullFloats) opt(i int) sink.OptFloat { return sink.OptFloat{V: n.v[i], Set: n.ok[i]} }

// msTimestamp is the timestamp of ms Unix milliseconds.
func msTimestamp(ms int64) sink.Timestamp {
	sec, rem := ms/1000, ms%1000
	if rem < 0 {
		sec, rem = sec-1, rem+1000
	}
	return sink.Timestamp{Seconds: sec, Nanos: int32(rem) * 1_000_000, Set: true}
}

// statusNumber is the status whose StatusName is name ("ok" is STATUS_OK).
func statusNumber(name string) int32 {
	if v, ok := meterv1.Status_value["STATUS_"+strings.ToUpper(name)]; ok {
		return v
	}
	return int32(meterv1.Status_STATUS_INTERNAL)
}
