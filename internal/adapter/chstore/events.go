package chstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// eventColumns is the explicit column list of every insert into inference_events,
// in the order EventBatch appends them.
var eventColumns = []string{
	"tenant_id", "event_id", "request_id", "model", "model_version", "deployment",
	"engine", "gpu_type", "tensor_parallelism", "node", "region",
	"completed_at", "completed_at_ms", "received_at_ms",
	"prompt_tokens", "cached_prompt_tokens", "output_tokens",
	"ttft_ms", "e2e_ms", "queue_ms", "prefill_ms", "itl_ms", "itl_measured",
	"status", "streaming", "slo_class", "label_keys", "label_values",
	"ingested_at", "source_partition", "source_offset",
}

// InsertEventsSQL is the statement every event batch is sent with.
var InsertEventsSQL = "INSERT INTO inference_events (" + strings.Join(eventColumns, ", ") + ")"

// StatusName is the stored form of an event status: "ok" or an error class
// such as "rate_limited". An unspecified status is "ok".
func StatusName(s meterv1.Status) string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return statusName(s)
}

// statusNames holds StatusName of the statuses 0 to 63, so that the hot
// path neither looks up a map nor builds a string.
var statusNames = func() []string {
	names := make([]string, 64)
	for i := range names {
		names[i] = statusName(meterv1.Status(i))
	}
	return names
}()

func statusName(s meterv1.Status) string {
	if s == meterv1.Status_STATUS_UNSPECIFIED {
		return "ok"
	}
	name, ok := meterv1.Status_name[int32(s)]
	if !ok {
		return "unknown"
	}
	return strings.ToLower(strings.TrimPrefix(name, "STATUS_"))
}

// EventBatch accumulates validated events column by column, so that a batch
// is sent in one columnar INSERT without per-row reflection. Reset reuses the
// memory for the next batch.
type EventBatch struct {
	tenantID, eventID, requestID, model, modelVersion, deployment []string
	engine, gpuType                                               []string
	tp                                                            []uint32
	node, region                                                  []string
	completedAt                                                   []time.Time
	completedMs, receivedMs                                       []int64
	prompt, cached, output                                        []uint64
	ttft, e2e, queue, prefill, itl                                nullFloats
	itlMeasured                                                   []uint8
	status                                                        []string
	streaming                                                     []uint8
	sloClass                                                      []string
	labelKeys, labelValues                                        [][]string
	ingestedAt                                                    []time.Time
	partition                                                     []int32
	offset                                                        []int64
	// keyHash and fingerprint are each row's EventKey and
	// EventRow.Fingerprint: the event id index's columns (event_ids).
	keyHash, fingerprint []uint64
	scratch              []byte
	// labels holds the rows' label_keys and label_values slices, one
	// allocation for many rows (labelColumns); labelsUsed counts the
	// strings the batch's rows took from it and the blocks before it.
	labels     []string
	labelsUsed int
}

// Len is the number of rows in the batch.
func (b *EventBatch) Len() int { return len(b.eventID) }

// Reset empties the batch, keeping its memory (but not a block of labels
// far larger than the batch used: one label-heavy batch would keep it).
func (b *EventBatch) Reset() {
	labels := resetStrings(b.labels)
	if cap(labels) > 4*max(b.labelsUsed, minLabelBlock) {
		labels = nil
	}
	*b = EventBatch{
		tenantID: b.tenantID[:0], eventID: b.eventID[:0], requestID: b.requestID[:0],
		model: b.model[:0], modelVersion: b.modelVersion[:0], deployment: b.deployment[:0],
		engine: b.engine[:0], gpuType: b.gpuType[:0], tp: b.tp[:0], node: b.node[:0],
		region: b.region[:0], completedAt: b.completedAt[:0], completedMs: b.completedMs[:0],
		receivedMs: b.receivedMs[:0], prompt: b.prompt[:0], cached: b.cached[:0],
		output: b.output[:0], ttft: b.ttft.reset(), e2e: b.e2e.reset(), queue: b.queue.reset(),
		prefill: b.prefill.reset(), itl: b.itl.reset(), itlMeasured: b.itlMeasured[:0],
		status: b.status[:0], streaming: b.streaming[:0], sloClass: b.sloClass[:0],
		labelKeys: b.labelKeys[:0], labelValues: b.labelValues[:0],
		ingestedAt: b.ingestedAt[:0], partition: b.partition[:0], offset: b.offset[:0],
		keyHash: b.keyHash[:0], fingerprint: b.fingerprint[:0],
		scratch: b.scratch, labels: labels,
	}
}

// resetStrings empties s, keeping its memory but not the strings (which
// may hold the memory of the records they were decoded from).
func resetStrings(s []string) []string {
	clear(s)
	return s[:0]
}

// Append adds one event, which the caller has validated, with its ITL.
// ingestedAt is the time the pipeline received it.
func (b *EventBatch) Append(ev *meterv1.InferenceEvent, itl sink.ITL, ingestedAt time.Time, src sink.Source) {
	var r sink.EventRow
	r.FromProto(ev)
	b.AppendRow(&r, itl, ingestedAt, src)
}

// AppendRow adds one event row, which the caller has validated, with its
// ITL. The row's strings and label slice are not kept (its labels are
// copied), so the caller may reuse the row.
func (b *EventBatch) AppendRow(r *sink.EventRow, itl sink.ITL, ingestedAt time.Time, src sink.Source) {
	b.AppendKeyedRow(r, itl, ingestedAt, src, sink.EventKey(r.TenantID, r.EventID), r.Fingerprint(&b.scratch))
}

// AppendKeyedRow is AppendRow for a caller that has computed the row's
// EventKey and Fingerprint already (sink.EventBatch).
func (b *EventBatch) AppendKeyedRow(r *sink.EventRow, itl sink.ITL, ingestedAt time.Time, src sink.Source, key, fingerprint uint64) {
	b.keyHash = append(b.keyHash, key)
	b.fingerprint = append(b.fingerprint, fingerprint)
	b.tenantID = append(b.tenantID, r.TenantID)
	b.eventID = append(b.eventID, r.EventID)
	b.requestID = append(b.requestID, r.RequestID)
	b.model = append(b.model, r.Model)
	b.modelVersion = append(b.modelVersion, r.ModelVersion)
	b.deployment = append(b.deployment, r.Deployment)
	b.engine = append(b.engine, r.Engine)
	b.gpuType = append(b.gpuType, r.GPUType)
	b.tp = append(b.tp, r.TensorParallelism)
	b.node = append(b.node, r.Node)
	b.region = append(b.region, r.Region)
	b.completedAt = append(b.completedAt, time.Unix(r.CompletedAt.Seconds, 0).UTC())
	b.completedMs = append(b.completedMs, unixMilli(r.CompletedAt))
	var received int64
	if r.ReceivedAt.Set {
		received = unixMilli(r.ReceivedAt)
	}
	b.receivedMs = append(b.receivedMs, received)
	b.prompt = append(b.prompt, uint64(r.PromptTokens.V))
	b.cached = append(b.cached, uint64(r.CachedPromptTokens.V))
	b.output = append(b.output, uint64(r.OutputTokens.V))
	b.ttft.addValue(r.TTFTMs.V, r.TTFTMs.Set)
	b.e2e.addValue(r.E2EMs.V, r.E2EMs.Set)
	b.queue.addValue(r.QueueMs.V, r.QueueMs.Set)
	b.prefill.addValue(r.PrefillMs.V, r.PrefillMs.Set)
	b.itl.addValue(itl.Ms, itl.Valid)
	b.itlMeasured = append(b.itlMeasured, boolByte(itl.Measured))
	b.status = append(b.status, StatusName(meterv1.Status(r.Status)))
	b.streaming = append(b.streaming, boolByte(r.Streaming))
	b.sloClass = append(b.sloClass, r.SLOClass)
	keys, values := b.labelColumns(r.Labels)
	b.labelKeys = append(b.labelKeys, keys)
	b.labelValues = append(b.labelValues, values)
	b.ingestedAt = append(b.ingestedAt, ingestedAt.Truncate(time.Second))
	b.partition = append(b.partition, src.Partition)
	b.offset = append(b.offset, src.Offset)
}

// unixMilli is t in milliseconds since the epoch, as t.Time().UnixMilli()
// for a valid timestamp (0 <= Nanos < 1e9).
func unixMilli(t sink.Timestamp) int64 { return t.Seconds*1000 + int64(t.Nanos)/1_000_000 }

// nullFloats is a Nullable(Float64) column: values and validity. (clickhouse-go
// ignores Valid in []sql.NullFloat64, so the insert sends []*float64 built
// from these at the last moment, in p, which is reused.)
type nullFloats struct {
	v  []float64
	ok []bool
	p  []*float64
}

func (n *nullFloats) add(p *float64) {
	if p == nil {
		n.v, n.ok = append(n.v, 0), append(n.ok, false)
		return
	}
	n.v, n.ok = append(n.v, *p), append(n.ok, true)
}

func (n *nullFloats) addValue(v float64, ok bool) {
	n.v, n.ok = append(n.v, v), append(n.ok, ok)
}

func (n nullFloats) reset() nullFloats {
	clear(n.p)
	return nullFloats{v: n.v[:0], ok: n.ok[:0], p: n.p[:0]}
}

// ptrs points into n.v, which must not grow while the result is in use;
// the next call reuses the result's memory.
func (n *nullFloats) ptrs() []*float64 {
	n.p = slices.Grow(n.p[:0], len(n.v))[:len(n.v)]
	for i := range n.v {
		n.p[i] = nil
		if n.ok[i] {
			n.p[i] = &n.v[i]
		}
	}
	return n.p
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// minLabelBlock is the size of the first block of labels (strings).
const minLabelBlock = 4096

// labelColumns splits labels, sorted by key, into the label_keys and
// label_values arrays of a row (sorted, so that duplicates of an event
// store identical rows): nil for none (so that the insert passes the
// driver an empty array without allocating), else slices of b.labels.
func (b *EventBatch) labelColumns(labels []sink.Label) (keys, values []string) {
	n := len(labels)
	if n == 0 {
		return nil, nil
	}
	if cap(b.labels)-len(b.labels) < 2*n {
		// A new block; the rows before keep the old one.
		b.labels = make([]string, 0, max(2*cap(b.labels), minLabelBlock, 2*n))
	}
	b.labelsUsed += 2 * n
	start := len(b.labels)
	for _, l := range labels {
		b.labels = append(b.labels, l.Key)
	}
	for _, l := range labels {
		b.labels = append(b.labels, l.Value)
	}
	return b.labels[start : start+n : start+n], b.labels[start+n : start+2*n : start+2*n]
}

func (b *EventBatch) columns() []any {
	return []any{
		b.tenantID, b.eventID, b.requestID, b.model, b.modelVersion, b.deployment,
		b.engine, b.gpuType, b.tp, b.node, b.region,
		b.completedAt, b.completedMs, b.receivedMs,
		b.prompt, b.cached, b.output,
		b.ttft.ptrs(), b.e2e.ptrs(), b.queue.ptrs(), b.prefill.ptrs(), b.itl.ptrs(), b.itlMeasured,
		b.status, b.streaming, b.sloClass, b.labelKeys, b.labelValues,
		b.ingestedAt, b.partition, b.offset,
	}
}

// NewEventBatch implements ingest.EventWriter: an empty *EventBatch.
func (s *Store) NewEventBatch() sink.EventBatch { return new(EventBatch) }

// InsertEvents writes the batch, an *EventBatch, in one INSERT with an explicit column list,
// then records its ids in the event id index (event_ids) in a second one:
// in that order, so that an id in the index is an event stored (a failure
// between the two leaves ids unrecorded, and the retry or redelivery that
// follows stores the same rows again, which the hour's deduplication
// absorbs). An empty batch is a no-op. The batch is left as it is (the
// caller resets it after a successful insert, or retries with it).
func (s *Store) InsertEvents(ctx context.Context, batch sink.EventBatch) error {
	b, ok := batch.(*EventBatch)
	if !ok {
		return fmt.Errorf("insert events batch: %w", errForeignBatch(batch))
	}
	if b.Len() == 0 {
		return nil
	}
	ctx = s.ingestContext(ctx)
	if err := s.sendColumns(ctx, "insert events batch", InsertEventsSQL, eventColumns, b.columns()); err != nil {
		return err
	}
	return s.sendColumns(ctx, "insert event ids", InsertEventIDsSQL, eventIDColumns, b.keyColumns())
}
