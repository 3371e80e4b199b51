package otlp

import (
	"errors"
	"fmt"
	"math"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// ConvertWire is Convert of an ExportTraceServiceRequest in protobuf
// encoding, read straight from the wire: the same mapping, the same batch.
//
// It is written by hand, on protowire, for speed: proto.Unmarshal
// materializes every attribute, event and link of every span as messages
// (most of them of no use here: HTTP, database and framework spans, request
// parameters, prompts), and that decoding was the largest cost of the OTLP
// path (about a quarter of its CPU, and most of its garbage). This reader
// skips what the mapping does not read without decoding it, and allocates
// only the strings an event keeps. Like proto.Unmarshal it ignores unknown
// fields and fields of an unexpected wire type; unlike it, it does not
// check the UTF-8 of strings it skips (those it keeps are checked by the
// event validation). A message that does not parse is an error.
// TestConvertWireMatchesConvert holds the two paths to the same result.
//
// Nothing of data is kept: the caller may reuse it.
func (m Mapping) ConvertWire(data []byte, keyTenant string) (Batch, error) {
	return m.convertWire(data, keyTenant, 0)
}

// convertWire is ConvertWire that stops with errTooManySpans at span
// maxSpans+1, before reading it (0: no limit).
func (m Mapping) convertWire(data []byte, keyTenant string, maxSpans int) (Batch, error) {
	tenantAttr := m.tenantAttr()
	var b Batch
	spans := spanCounter{max: maxSpans}
	err := fields(data, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		return m.resourceSpans(&b, v, tenantAttr, keyTenant, &spans)
	})
	if errors.Is(err, errTooManySpans) {
		return Batch{}, err
	}
	if err != nil {
		return Batch{}, fmt.Errorf("decode ExportTraceServiceRequest: %w", err)
	}
	return b, nil
}

// resourceSpans reads a ResourceSpans: its resource (1), then its
// ScopeSpans (2), whatever their order on the wire.
func (m Mapping) resourceSpans(b *Batch, data []byte, tenantAttr, keyTenant string, spans *spanCounter) error {
	var res resourceAttrs
	err := fields(data, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			if num != 1 || typ != protowire.BytesType { // Resource.attributes
				return nil
			}
			key, val, err := keyValue(v)
			if err != nil || !resourceKey(key, tenantAttr) {
				return err
			}
			av, err := anyValue(val)
			if err != nil {
				return err
			}
			res.add(string(key), av.String(), tenantAttr)
			return nil
		})
	})
	if err != nil {
		return err
	}
	res.fill()
	return fields(data, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 2 || typ != protowire.BytesType {
			return nil
		}
		return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			if num != 2 || typ != protowire.BytesType { // ScopeSpans.spans
				return nil
			}
			if err := spans.next(); err != nil {
				return err
			}
			return m.span(b, v, &res, tenantAttr, keyTenant)
		})
	})
}

// span reads one Span and classifies it into b.
func (m Mapping) span(b *Batch, data []byte, res *resourceAttrs, tenantAttr, keyTenant string) error {
	var core spanCore
	var a spanAttrs
	var attrErr error
	type ev struct {
		first bool
		t     uint64
	}
	var events []ev
	err := fields(data, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			core.traceID = v
		case num == 2 && typ == protowire.BytesType:
			core.spanID = v
		case num == 7 && typ == protowire.Fixed64Type:
			core.start = x
		case num == 8 && typ == protowire.Fixed64Type:
			core.end = x
		case num == 9 && typ == protowire.BytesType:
			key, val, err := keyValue(v)
			if err != nil {
				return err
			}
			sl, ok := lookup(key, tenantAttr)
			if !ok {
				return nil
			}
			av, err := anyValue(val)
			if err != nil {
				return err
			}
			if serr := a.set(sl, av); serr != nil && attrErr == nil {
				attrErr = fmt.Errorf("attribute %s: %w", key, serr)
			}
		case num == 11 && typ == protowire.BytesType:
			// Events are noted after the loop: start may come later.
			var e ev
			err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1 && typ == protowire.Fixed64Type:
					e.t = x
				case num == 2 && typ == protowire.BytesType:
					e.first = string(v) == eventFirstToken
				}
				return nil
			})
			if err != nil {
				return err
			}
			if e.first {
				events = append(events, e)
			}
		case num == 15 && typ == protowire.BytesType:
			return fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				if num == 3 && typ == protowire.VarintType {
					core.status = tracepb.Status_StatusCode(int32(x))
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, e := range events {
		core.event(eventFirstToken, e.t)
	}
	m.add(b, &core, &a, attrErr, res, keyTenant)
	return nil
}

// keyValue splits a KeyValue into its key (1) and its AnyValue (2).
func keyValue(data []byte) (key, val []byte, err error) {
	err = fields(data, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ == protowire.BytesType {
			switch num {
			case 1:
				key = v
			case 2:
				val = v
			}
		}
		return nil
	})
	return key, val, err
}

// anyValue reads the scalar of an AnyValue; arrays, maps and bytes are
// valueNone.
func anyValue(data []byte) (value, error) {
	var v value
	err := fields(data, func(num protowire.Number, typ protowire.Type, b []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			v = value{kind: valueString, s: string(b)}
		case num == 2 && typ == protowire.VarintType:
			v = value{kind: valueBool, b: x != 0}
		case num == 3 && typ == protowire.VarintType:
			v = value{kind: valueInt, i: int64(x)}
		case num == 4 && typ == protowire.Fixed64Type:
			v = value{kind: valueDouble, f: math.Float64frombits(x)}
		case num >= 5 && num <= 7:
			v = value{}
		}
		return nil
	})
	return v, err
}

// fields calls f for each field of the message in data: its number, wire
// type, and its bytes (length-delimited) or its value (varint, fixed).
func fields(data []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(data)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(data)
		case protowire.Fixed32Type:
			var y uint32
			y, n = protowire.ConsumeFixed32(data)
			x = uint64(y)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(data)
		default: // groups, which OTLP does not use: skipped like unknown fields
			n = protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			continue
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
