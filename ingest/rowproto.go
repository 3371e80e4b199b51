package ingest

import (
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"tokenmeter/ingest/sink"
)

// The protobuf fast path (see RowDecoder): the wire format read with
// protowire, field by field, into the row. Proto semantics kept: the last
// occurrence of a scalar wins, a repeated timestamp merges into the one
// before, a repeated label key keeps its last value, unknown fields are
// skipped. A wire type that does not match the field, invalid UTF-8 in a
// string or a malformed tag or length returns false, and proto.Unmarshal
// decides.

// wireReader reads fields from b.
type wireReader struct {
	b   []byte
	num protowire.Number
	typ protowire.Type
}

// next reads the next tag; false at the end or on a malformed tag.
func (w *wireReader) next() bool {
	if len(w.b) == 0 {
		return false
	}
	num, typ, n := protowire.ConsumeTag(w.b)
	if n < 0 || num > protowire.MaxValidNumber {
		return false
	}
	w.b, w.num, w.typ = w.b[n:], num, typ
	return true
}

func (w *wireReader) varint() (uint64, bool) {
	if w.typ != protowire.VarintType {
		return 0, false
	}
	v, n := protowire.ConsumeVarint(w.b)
	if n < 0 {
		return 0, false
	}
	w.b = w.b[n:]
	return v, true
}

func (w *wireReader) fixed64() (uint64, bool) {
	if w.typ != protowire.Fixed64Type {
		return 0, false
	}
	v, n := protowire.ConsumeFixed64(w.b)
	if n < 0 {
		return 0, false
	}
	w.b = w.b[n:]
	return v, true
}

func (w *wireReader) bytes() ([]byte, bool) {
	if w.typ != protowire.BytesType {
		return nil, false
	}
	v, n := protowire.ConsumeBytes(w.b)
	if n < 0 {
		return nil, false
	}
	w.b = w.b[n:]
	return v, true
}

// str reads a string field: proto3 strings must be valid UTF-8.
func (w *wireReader) str() ([]byte, bool) {
	v, ok := w.bytes()
	return v, ok && utf8.Valid(v)
}

func (w *wireReader) skip() bool {
	n := protowire.ConsumeFieldValue(w.num, w.typ, w.b)
	if n < 0 {
		return false
	}
	w.b = w.b[n:]
	return true
}

// The setters read the current field's value into dst, with proto's
// conversions (a varint truncated to 32 bits, a double from its bits); a
// wire type that does not match returns false.

func (w *wireReader) setStr(d *RowDecoder, dst *string, intern bool) bool {
	v, ok := w.str()
	*dst = d.keep(v, intern)
	return ok
}

func (w *wireReader) setU32(dst *uint32) bool {
	v, ok := w.varint()
	*dst = uint32(v)
	return ok
}

func (w *wireReader) setU64(dst *uint64) bool {
	v, ok := w.varint()
	*dst = v
	return ok
}

func (w *wireReader) setF64(dst *float64) bool {
	v, ok := w.fixed64()
	*dst = math.Float64frombits(v)
	return ok
}

func (w *wireReader) setOptInt(dst *sink.OptInt) bool {
	v, ok := w.varint()
	*dst = sink.OptInt{V: int64(v), Set: true}
	return ok
}

func (w *wireReader) setOptFloat(dst *sink.OptFloat) bool {
	var f float64
	ok := w.setF64(&f)
	*dst = sink.OptFloat{V: f, Set: true}
	return ok
}

// done is true when the whole input was read (next returned false at the end).
func (w *wireReader) done() bool { return len(w.b) == 0 }

// timestamp merges a google.protobuf.Timestamp message into t.
func (w *wireReader) timestamp(t *sink.Timestamp) bool {
	b, ok := w.bytes()
	if !ok {
		return false
	}
	t.Set = true
	m := wireReader{b: b}
	for m.next() {
		switch m.num {
		case 1:
			v, ok := m.varint()
			if !ok {
				return false
			}
			t.Seconds = int64(v)
		case 2:
			v, ok := m.varint()
			if !ok {
				return false
			}
			t.Nanos = int32(v)
		default:
			if !m.skip() {
				return false
			}
		}
	}
	return m.done()
}

func (d *RowDecoder) protoEvent(r *sink.EventRow, b []byte) bool {
	w := wireReader{b: b}
	for w.next() {
		var ok bool
		str := func(dst *string, intern bool) bool { return w.setStr(d, dst, intern) }
		switch w.num {
		case 1:
			ok = str(&r.EventID, false)
		case 2:
			ok = str(&r.RequestID, false)
		case 3:
			ok = str(&r.TenantID, true)
		case 4:
			ok = str(&r.Model, true)
		case 5:
			ok = str(&r.ModelVersion, true)
		case 6:
			ok = str(&r.Deployment, true)
		case 7:
			ok = str(&r.Engine, true)
		case 8:
			ok = str(&r.GPUType, true)
		case 9:
			ok = w.setU32(&r.TensorParallelism)
		case 10:
			ok = str(&r.Node, true)
		case 11:
			ok = str(&r.Region, true)
		case 12:
			ok = w.timestamp(&r.ReceivedAt)
		case 13:
			ok = w.timestamp(&r.CompletedAt)
		case 14:
			ok = w.setOptInt(&r.PromptTokens)
		case 15:
			ok = w.setOptInt(&r.CachedPromptTokens)
		case 16:
			ok = w.setOptInt(&r.OutputTokens)
		case 17:
			ok = w.setOptFloat(&r.TTFTMs)
		case 18:
			ok = w.setOptFloat(&r.E2EMs)
		case 19:
			ok = w.setOptFloat(&r.QueueMs)
		case 20:
			ok = w.setOptFloat(&r.PrefillMs)
		case 21:
			ok = w.setOptFloat(&r.ITLMs)
		case 22:
			var v uint64
			v, ok = w.varint()
			r.Status = int32(v)
		case 23:
			var v uint64
			v, ok = w.varint()
			r.Streaming = v != 0
		case 24:
			ok = str(&r.SLOClass, true)
		case 25:
			ok = d.protoLabel(r, &w)
		default:
			ok = w.skip()
		}
		if !ok {
			return false
		}
	}
	return w.done()
}

// protoLabel reads one map entry (key 1, value 2; either may be missing).
// SortLabels later keeps the last value of a repeated key.
func (d *RowDecoder) protoLabel(r *sink.EventRow, w *wireReader) bool {
	b, ok := w.bytes()
	if !ok || len(r.Labels) >= maxFastLabels {
		return false
	}
	var l sink.Label
	m := wireReader{b: b}
	for m.next() {
		switch m.num {
		case 1, 2:
			v, ok := m.str()
			if !ok {
				return false
			}
			if m.num == 1 {
				l.Key = d.strs.get(v)
			} else {
				l.Value = d.strs.get(v)
			}
		default:
			if !m.skip() {
				return false
			}
		}
	}
	if !m.done() {
		return false
	}
	r.Labels = append(r.Labels, l)
	return true
}

func (d *RowDecoder) protoGPU(r *sink.GPURow, b []byte) bool {
	w := wireReader{b: b}
	for w.next() {
		var ok bool
		str := func(dst *string, intern bool) bool {
			v, ok := w.str()
			*dst = d.keep(v, intern)
			return ok
		}
		switch w.num {
		case 1:
			ok = str(&r.SampleID, false)
		case 2:
			ok = str(&r.Node, true)
		case 3:
			ok = str(&r.GPUUUID, true)
		case 4:
			ok = w.setU32(&r.GPUIndex)
		case 5:
			ok = str(&r.GPUType, true)
		case 6:
			ok = str(&r.MIGProfile, true)
		case 7:
			ok = w.setU32(&r.MIGInstanceID)
		case 8:
			ok = w.setF64(&r.MIGFraction)
		case 9:
			ok = str(&r.Deployment, true)
		case 10:
			ok = str(&r.Pod, true)
		case 11:
			ok = str(&r.Namespace, true)
		case 12:
			ok = str(&r.Region, true)
		case 13:
			ok = str(&r.Pool, true)
		case 14:
			ok = w.timestamp(&r.SampledAt)
		case 15:
			ok = w.setF64(&r.IntervalS)
		case 16:
			ok = w.setF64(&r.Utilization)
		case 17:
			ok = w.setU64(&r.FBUsedBytes)
		case 18:
			ok = w.setU64(&r.FBTotalBytes)
		case 19:
			ok = w.setF64(&r.PowerWatts)
		case 20:
			ok = w.setF64(&r.EnergyJoules)
		case 21:
			ok = w.setF64(&r.TemperatureC)
		case 22:
			ok = w.setF64(&r.SMClockMHz)
		case 23:
			ok = str(&r.Source, true)
		case 24:
			ok = w.setOptFloat(&r.SMActive)
		case 25:
			ok = w.setF64(&r.SMClockMaxMHz)
		default:
			ok = w.skip()
		}
		if !ok {
			return false
		}
	}
	return w.done()
}
