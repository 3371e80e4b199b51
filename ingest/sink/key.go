package sink

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-faster/city"
)

// EventKey is the key_hash of the event id index (table event_ids) for one
// event: ClickHouse's cityHash64(concat(tenant_id, '\0', event_id)).
// go-faster/city's CH64 is the CityHash64 (v1.0.2) that ClickHouse
// computes, so the store's migration can fill the index from SQL and the
// consumer from Go (chstore's TestEventKeyMatchesClickHouse holds them
// equal). Identifiers are printable, so '\0' cannot occur in them and the
// concatenation is unambiguous.
func EventKey(tenantID, eventID string) uint64 {
	var buf [160]byte
	n := len(tenantID) + 1 + len(eventID)
	b := buf[:0]
	if n > len(buf) {
		b = make([]byte, 0, n)
	}
	b = append(b, tenantID...)
	b = append(b, 0)
	b = append(b, eventID...)
	return city.CH64(b)
}

// Fingerprint is a hash of the event's content: every field of the row,
// times at full precision. Two copies of an event with equal fingerprints
// are the same event sent again (a retry or a redelivery); copies that
// differ in any field conflict. buf is scratch space: the fields are
// appended to it and hashed at once (one xxhash call, not one a field).
func (r *EventRow) Fingerprint(buf *[]byte) uint64 {
	b := (*buf)[:0]
	str := func(s string) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	for _, s := range [...]string{r.EventID, r.RequestID, r.TenantID, r.Model, r.ModelVersion,
		r.Deployment, r.Engine, r.GPUType, r.Node, r.Region, r.SLOClass} {
		str(s)
	}
	b = binary.LittleEndian.AppendUint32(b, r.TensorParallelism)
	for _, t := range [...]Timestamp{r.ReceivedAt, r.CompletedAt} {
		b = append(b, boolByte(t.Set))
		b = binary.LittleEndian.AppendUint64(b, uint64(t.Seconds))
		b = binary.LittleEndian.AppendUint32(b, uint32(t.Nanos))
	}
	for _, o := range [...]OptInt{r.PromptTokens, r.CachedPromptTokens, r.OutputTokens} {
		b = append(b, boolByte(o.Set))
		b = binary.LittleEndian.AppendUint64(b, uint64(o.V))
	}
	for _, o := range [...]OptFloat{r.TTFTMs, r.E2EMs, r.QueueMs, r.PrefillMs, r.ITLMs} {
		b = append(b, boolByte(o.Set))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(o.V))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(r.Status))
	b = append(b, boolByte(r.Streaming))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Labels)))
	for _, l := range r.Labels {
		str(l.Key)
		str(l.Value)
	}
	*buf = b
	return xxhash.Sum64(b)
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// StoredEvent is the first stored copy of one (tenant_id, event_id), as the
// event id index has it; EventBatch.Stored gives a batched row's in the
// same form.
type StoredEvent struct {
	KeyHash           uint64
	TenantID, EventID string
	CompletedAtMs     int64
	// Fingerprint is EventRow.Fingerprint of the copy; 0 for an id recorded
	// before meterd computed them (the store's migration 0015 copied those
	// from inference_events), which only CompletedAtMs identifies.
	Fingerprint uint64
	IngestedAt  time.Time
}

// Same reports whether a copy with this fingerprint and completion time is
// the stored event sent again.
func (s StoredEvent) Same(fingerprint uint64, completedAtMs int64) bool {
	if s.Fingerprint == 0 {
		return s.CompletedAtMs == completedAtMs
	}
	return s.Fingerprint == fingerprint
}
