package sink

import (
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The batches are the store's: it lays their rows out as it writes them
// (internal/adapter/chstore fills one column per field, so that a batch is
// sent in one columnar INSERT), makes empty ones (ingest.EventWriter's
// NewEventBatch and the like) and writes only batches it made. The
// consumer appends validated rows to them, and reads back what
// deduplication needs. A batch is reused after Reset.

// EventBatch is a batch of validated inference events.
type EventBatch interface {
	// AppendKeyedRow adds r, which the caller has validated, with its ITL,
	// the time the pipeline received it, where it came from, its EventKey
	// and its Fingerprint. The row is not kept (its labels are copied), so
	// the caller may reuse it.
	AppendKeyedRow(r *EventRow, itl ITL, ingestedAt time.Time, src Source, key, fingerprint uint64)
	// Len is the number of rows in the batch.
	Len() int
	// Reset empties the batch, keeping its memory.
	Reset()
	// KeyHashes are the rows' EventKeys, in row order (not to be
	// modified).
	KeyHashes() []uint64
	// Stored is row i as the event id index would record it.
	Stored(i int) StoredEvent
	// Source is where row i came from.
	Source(i int) Source
	// Event rebuilds row i as a message: the event as stored.
	Event(i int) *meterv1.InferenceEvent
	// Keep removes the rows i for which keep[i] is false, in place,
	// keeping the others in order.
	Keep(keep []bool)
}

// GPUBatch is a batch of validated GPU samples.
type GPUBatch interface {
	// AppendRow adds r, which the caller has validated; ingestedAt is the
	// time the pipeline received it. The row is not kept.
	AppendRow(r *GPURow, ingestedAt time.Time)
	Len() int
	Reset()
}

// EngineBatch is a batch of validated engine samples.
type EngineBatch interface {
	// Append adds s, which the caller has validated; ingestedAt is the
	// time the pipeline received it. The batch may keep pointers into s:
	// s must not change until the batch is reset.
	Append(s *meterv1.EngineSample, ingestedAt time.Time)
	Len() int
	Reset()
}
