package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest/sink"
)

// One event, one count. An event is identified by (tenant_id, event_id),
// and the first stored copy is the event: a later copy equal to it (a
// client's retry, a redelivery after a crash) is dropped, and a copy that
// differs in any field (another completed_at, other tokens) is a conflict,
// sent to the dead letters with reason ReasonDuplicateConflict and never
// stored or counted.
//
// Before a batch is inserted, its ids are looked up in the event id index
// (EventWriter.StoredEvents, table event_ids), which InsertEvents fills after
// every batch, and compared with the batch's earlier rows (the first row
// of each key hash is noted as the batch is filled). The writer writes
// batches in order, so a batch's lookup sees every batch before it. The
// publish path keys records by event_id, so the copies of an id reach one
// partition and one consumer at a time, in order; two copies of an id
// produced under different keys to two partitions in the same instant
// could both be stored (docs/architecture.md).

// ReasonDuplicateConflict is the reason code of a copy of a stored event
// (same tenant_id and event_id) whose content differs from the stored one.
const ReasonDuplicateConflict = "duplicate_conflict"

// batchIDs finds the rows of one batch that share their ids.
type batchIDs struct {
	first   map[uint64]int32 // key hash -> index of its first row in the batch
	repeat  bool             // some key hash has more than one row
	scratch []byte           // for EventRow.Fingerprint
}

func (b *batchIDs) reset() {
	clear(b.first)
	b.repeat = false
}

// appendRow appends r.row to the batch with its key hash and fingerprint,
// noting the first row of each key hash.
func (r *eventRows) appendRow(m kafka.Message, now time.Time) *ValidationError {
	key := sink.EventKey(r.row.TenantID, r.row.EventID)
	fp := r.row.Fingerprint(&r.ids.scratch)
	if r.ids.first == nil {
		r.ids.first = make(map[uint64]int32)
	}
	if _, ok := r.ids.first[key]; ok {
		r.ids.repeat = true
	} else {
		r.ids.first[key] = int32(r.batch.Len())
	}
	r.batch.AppendKeyedRow(&r.row, RowITL(&r.row), now, sink.Source{Partition: int32(m.Partition), Offset: m.Offset}, key, fp)
	return nil
}

// conflict is a batched row that differs from the stored copy of its event.
type conflict struct {
	msg  kafka.Message
	verr *ValidationError
}

// dedupStored removes the rows whose event is stored already or came
// earlier in the batch. The first copy of an event is the stored one,
// looked up in the event id index, or else the batch's first row of it.
// Rows equal to that copy are dropped (counted in dropped); the others are
// returned as conflicts, each a record rebuilt from its row (the original
// bytes are gone by now) for the dead letters. On an error the batch is
// unchanged.
func (r *eventRows) dedupStored(ctx context.Context, topic string) (conflicts []conflict, dropped int, err error) {
	n := r.batch.Len()
	if n == 0 {
		return nil, 0, nil
	}
	stored, err := r.store.StoredEvents(ctx, r.batch.KeyHashes())
	if err != nil {
		return nil, 0, err
	}
	if len(stored) == 0 && !r.ids.repeat {
		return nil, 0, nil
	}
	byKey := make(map[uint64][]sink.StoredEvent, len(stored))
	for _, s := range stored {
		byKey[s.KeyHash] = append(byKey[s.KeyHash], s)
	}
	keep := make([]bool, n)
	for i := range keep {
		keep[i] = true
		row := r.batch.Stored(i)
		var first *sink.StoredEvent
		for k, s := range byKey[row.KeyHash] {
			if s.TenantID == row.TenantID && s.EventID == row.EventID {
				first = &byKey[row.KeyHash][k]
				break
			}
		}
		if first == nil {
			j := int(r.ids.first[row.KeyHash])
			if j == i {
				continue // the first copy
			}
			earlier := r.batch.Stored(j)
			if earlier.TenantID != row.TenantID || earlier.EventID != row.EventID {
				continue // a hash shared by two ids, not found: kept
			}
			first = &earlier
		}
		keep[i] = false
		if first.Same(row.Fingerprint, row.CompletedAtMs) {
			dropped++
			continue
		}
		conflicts = append(conflicts, r.conflictRecord(i, row, *first, topic))
	}
	if dropped+len(conflicts) > 0 {
		r.batch.Keep(keep)
	}
	return conflicts, dropped, nil
}

// conflictRecord is the dead letter of row i (its ids are row), which
// conflicts with stored.
func (r *eventRows) conflictRecord(i int, row, stored sink.StoredEvent, topic string) conflict {
	src := r.batch.Source(i)
	value, err := proto.Marshal(r.batch.Event(i))
	if err != nil {
		value = nil // cannot happen for a valid event; the headers still identify it
	}
	return conflict{
		msg: kafka.Message{
			Topic: topic, Partition: int(src.Partition), Offset: src.Offset,
			Key: []byte(row.EventID), Value: value,
			Headers: []kafka.Header{{Key: HeaderContentType, Value: []byte(ContentTypeProtobuf)}},
		},
		verr: invalid(ReasonDuplicateConflict,
			"event %q of tenant %q was received first with completed_at %s (at %s); this copy (completed_at %s) differs from it and is not counted (the record is the copy as decoded)",
			row.EventID, row.TenantID,
			time.UnixMilli(stored.CompletedAtMs).UTC().Format(time.RFC3339Nano), stored.IngestedAt.UTC().Format(time.RFC3339),
			time.UnixMilli(row.CompletedAtMs).UTC().Format(time.RFC3339Nano)),
	}
}

// storedDeduper is the rows kind whose batches are checked against the
// stored ids before their insert (events).
type storedDeduper interface {
	dedupStored(ctx context.Context, topic string) ([]conflict, int, error)
}

// dedup removes the batch's copies of stored events before its insert,
// adding the conflicting ones to its dead letters; the lookup is retried
// like an insert.
func (c *Consumer) dedup(ctx context.Context, p *pending) error {
	d, ok := p.rows.(storedDeduper)
	if !ok {
		return nil
	}
	var conflicts []conflict
	var dropped int
	err := c.retry(ctx, "look up stored event ids", p.records, func() error {
		var err error
		conflicts, dropped, err = d.dedupStored(ctx, c.cfg.Topic)
		if err != nil {
			return fmt.Errorf("look up stored event ids: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.metrics.duplicates.Add(float64(dropped))
	for _, cf := range conflicts {
		c.metrics.rejected.WithLabelValues(cf.verr.Reason).Inc()
		d := c.deadLetter(cf.msg, cf.verr)
		p.dead = append(p.dead, d)
		p.deadBytes += d.bytes()
	}
	return nil
}
