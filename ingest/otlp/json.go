package otlp

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// convertJSON is convertWire for an export request in OTLP JSON: the same
// mapping, the same batch, and the same span limit, checked as each span
// is reached.
//
// OTLP JSON is the protobuf JSON mapping of the same messages, except that
// trace and span ids are hex, not base64 (and 32 hex digits are also valid
// base64, so protojson alone would silently read a 24-byte trace id). It is
// read here a token at a time (encoding/json's Decoder), one span after the
// other, keeping only what the mapping reads: decoding the whole document
// first (into map[string]any, or into the generated messages) costs a
// hundred bytes and more per byte of a body of many small spans, and a
// 16 MB body of empty spans took 1.9 GB. Memory is now the body, the events
// of the batch (at most maxSpans) and one span's values at a time.
//
// Like protojson it accepts field names in lowerCamelCase and as in the
// .proto file, 64-bit integers as numbers or strings, enums as numbers or
// names, and null for an absent value; unknown fields are ignored, as the
// specification asks of receivers. Like ConvertWire, and unlike protojson,
// it does not check the values of fields it does not read.
func (m Mapping) convertJSON(data []byte, keyTenant string, maxSpans int) (Batch, error) {
	if maxSpans > 0 && countJSONSpans(data, maxSpans) > maxSpans {
		st := spanCounter{max: maxSpans, n: maxSpans}
		return Batch{}, st.next()
	}
	st := &jsonState{m: m, tenantAttr: m.tenantAttr(), keyTenant: keyTenant, spans: spanCounter{max: maxSpans}}
	r := st.reader(data)
	t, err := r.dec.Token()
	if err == nil {
		if d, ok := t.(json.Delim); !ok || d != '{' {
			err = errors.New("want a JSON object")
		}
	}
	if err == nil {
		err = r.fields(func(key string) error {
			if key == "resourceSpans" || key == "resource_spans" {
				return r.array(r.resourceSpans)
			}
			return r.skip()
		})
	}
	if err == nil {
		if _, terr := r.dec.Token(); terr != io.EOF {
			err = errors.New("data after the JSON object")
		}
	}
	if errors.Is(err, errTooManySpans) {
		return Batch{}, err
	}
	if err != nil {
		return Batch{}, fmt.Errorf("decode OTLP JSON ExportTraceServiceRequest: %w", err)
	}
	return st.b, nil
}

// countJSONSpans counts the elements of the arrays under a "spans" key, at
// any depth, and stops once it has counted more than max. It reads only
// the structure (brackets, commas, strings) and allocates nothing, so that
// a body of millions of tiny spans is refused before any is decoded,
// wherever its resources are. (A "spans" key written with escapes is not
// seen here; the reader counts those spans as it reaches them.)
func countJSONSpans(data []byte, max int) int {
	n, depth := 0, 0
	var stack [4]int
	counted := stack[:0] // depths of the "spans" arrays open
	expect, spansKey := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch c {
		case ' ', '\t', '\n', '\r', ':':
			continue
		case ',':
			expect = len(counted) > 0 && counted[len(counted)-1] == depth
			continue
		case '}', ']':
			if len(counted) > 0 && counted[len(counted)-1] == depth {
				counted = counted[:len(counted)-1]
			}
			depth--
			expect, spansKey = false, false
			continue
		}
		if expect {
			if n++; n > max {
				return n
			}
			expect = false
		}
		switch c {
		case '"':
			start := i + 1
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
			j := i + 1
			for j < len(data) && (data[j] == ' ' || data[j] == '\t' || data[j] == '\n' || data[j] == '\r') {
				j++
			}
			spansKey = j < len(data) && data[j] == ':' && string(data[start:min(i, len(data))]) == "spans"
			continue
		case '[':
			depth++
			if spansKey {
				counted = append(counted, depth)
				expect = true
			}
		case '{':
			depth++
		}
		spansKey = false
	}
	return n
}

// jsonState is what the readers of one request share.
type jsonState struct {
	m          Mapping
	tenantAttr string
	keyTenant  string
	spans      spanCounter
	b          Batch
}

// jsonReader reads values from a JSON text a token at a time.
type jsonReader struct {
	st  *jsonState
	dec *json.Decoder
	// skipped holds the last value skipped, its buffer reused.
	skipped json.RawMessage
}

func (st *jsonState) reader(data []byte) *jsonReader {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // 64-bit integers stay exact
	return &jsonReader{st: st, dec: dec}
}

// object reads an object, or null, calling f for each key; f reads (or
// skips) the key's value.
func (r *jsonReader) object(f func(key string) error) error {
	t, err := r.dec.Token()
	if err != nil || t == nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("want an object, got %v", t)
	}
	return r.fields(f)
}

// fields reads the rest of an object whose '{' was read.
func (r *jsonReader) fields(f func(key string) error) error {
	for r.dec.More() {
		t, err := r.dec.Token()
		if err != nil {
			return err
		}
		if err := f(t.(string)); err != nil { // keys are strings: the decoder checks it
			return err
		}
	}
	_, err := r.dec.Token() // '}'
	return err
}

// array reads an array, or null, calling f to read each element.
func (r *jsonReader) array(f func() error) error {
	t, err := r.dec.Token()
	if err != nil || t == nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '[' {
		return fmt.Errorf("want an array, got %v", t)
	}
	for r.dec.More() {
		if err := f(); err != nil {
			return err
		}
	}
	_, err = r.dec.Token() // ']'
	return err
}

// skip reads a value of any kind without decoding it.
func (r *jsonReader) skip() error { return r.dec.Decode(&r.skipped) }

// scalar reads a string, number (json.Number), boolean or null (nil).
func (r *jsonReader) scalar() (any, error) {
	t, err := r.dec.Token()
	if err != nil {
		return nil, err
	}
	if _, ok := t.(json.Delim); ok {
		return nil, fmt.Errorf("want a scalar, got %v", t)
	}
	return t, nil
}

// resourceSpans reads a ResourceSpans: its resource, then its ScopeSpans.
// Those that come before the resource in the text (protojson and the SDKs
// write the resource first) are kept undecoded until it is read.
func (r *jsonReader) resourceSpans() error {
	var res resourceAttrs
	resourceRead := false
	var early []json.RawMessage
	err := r.object(func(key string) error {
		switch key {
		case "resource":
			err := r.object(func(key string) error {
				if key != "attributes" {
					return r.skip()
				}
				return r.array(func() error {
					k, v, err := r.keyValue(func(k string) bool { return resourceKey(k, r.st.tenantAttr) })
					if err == nil && k != "" {
						res.add(k, v.String(), r.st.tenantAttr)
					}
					return err
				})
			})
			res.fill()
			resourceRead = true
			return err
		case "scopeSpans", "scope_spans":
			if !resourceRead {
				var raw json.RawMessage
				err := r.dec.Decode(&raw)
				early = append(early, raw)
				return err
			}
			return r.array(func() error { return r.scopeSpans(&res) })
		}
		return r.skip()
	})
	if err != nil {
		return err
	}
	for _, raw := range early {
		sub := r.st.reader(raw)
		if err := sub.array(func() error { return sub.scopeSpans(&res) }); err != nil {
			return err
		}
	}
	return nil
}

// scopeSpans reads a ScopeSpans: its spans, each counted before it is read.
func (r *jsonReader) scopeSpans(res *resourceAttrs) error {
	return r.object(func(key string) error {
		if key != "spans" {
			return r.skip()
		}
		return r.array(func() error {
			if err := r.st.spans.next(); err != nil {
				return err
			}
			if err := r.span(res); err != nil {
				return fmt.Errorf("span %d: %w", r.st.spans.n-1, err)
			}
			return nil
		})
	})
}

// span reads one Span and classifies it into the batch.
func (r *jsonReader) span(res *resourceAttrs) error {
	var core spanCore
	var a spanAttrs
	var attrErr error
	var firstTokens []uint64 // noted after the span: start may come later
	err := r.object(func(key string) error {
		var err error
		switch key {
		case "traceId", "trace_id":
			core.traceID, err = r.hexID(key)
		case "spanId", "span_id":
			core.spanID, err = r.hexID(key)
		case "startTimeUnixNano", "start_time_unix_nano":
			core.start, err = r.uint64(key)
		case "endTimeUnixNano", "end_time_unix_nano":
			core.end, err = r.uint64(key)
		case "attributes":
			err = r.array(func() error {
				k, v, err := r.keyValue(func(k string) bool { _, ok := lookup(k, r.st.tenantAttr); return ok })
				if err != nil || k == "" {
					return err
				}
				sl, _ := lookup(k, r.st.tenantAttr)
				if serr := a.set(sl, v); serr != nil && attrErr == nil {
					attrErr = fmt.Errorf("attribute %s: %w", k, serr)
				}
				return nil
			})
		case "events":
			err = r.array(func() error {
				var name string
				var t uint64
				err := r.object(func(key string) error {
					var err error
					switch key {
					case "timeUnixNano", "time_unix_nano":
						t, err = r.uint64(key)
					case "name":
						name, err = r.str(key)
					default:
						err = r.skip()
					}
					return err
				})
				if name == eventFirstToken {
					firstTokens = append(firstTokens, t)
				}
				return err
			})
		case "status":
			err = r.object(func(key string) error {
				if key != "code" {
					return r.skip()
				}
				var err error
				core.status, err = r.statusCode()
				return err
			})
		default:
			err = r.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, t := range firstTokens {
		core.event(eventFirstToken, t)
	}
	r.st.m.add(&r.st.b, &core, &a, attrErr, res, r.st.keyTenant)
	return nil
}

// keyValue reads a KeyValue; its value is decoded only when want says its
// key is of use (or when the value comes before the key). k is "" when
// the attribute is of no use.
func (r *jsonReader) keyValue(want func(string) bool) (k string, v value, err error) {
	var key string
	var val value
	err = r.object(func(field string) error {
		switch field {
		case "key":
			var err error
			key, err = r.str(field)
			return err
		case "value":
			if key != "" && !want(key) {
				return r.skip()
			}
			var err error
			val, err = r.anyValue()
			return err
		}
		return r.skip()
	})
	if err != nil || key == "" || !want(key) {
		return "", value{}, err
	}
	return key, val, nil
}

// anyValue reads the scalar of an AnyValue; arrays, maps and bytes are
// valueNone, as in ConvertWire.
func (r *jsonReader) anyValue() (value, error) {
	var v value
	err := r.object(func(key string) error {
		var err error
		switch key {
		case "stringValue", "string_value":
			var s string
			s, err = r.str(key)
			v = value{kind: valueString, s: s}
		case "boolValue", "bool_value":
			var t any
			if t, err = r.scalar(); err == nil {
				b, ok := t.(bool)
				if !ok && t != nil {
					return fmt.Errorf("%s: want a boolean, got %v", key, t)
				}
				v = value{kind: valueBool, b: b}
			}
		case "intValue", "int_value":
			var i int64
			i, err = r.int64(key)
			v = value{kind: valueInt, i: i}
		case "doubleValue", "double_value":
			var f float64
			f, err = r.float64(key)
			v = value{kind: valueDouble, f: f}
		default: // arrayValue, kvlistValue, bytesValue, unknown fields
			v = value{}
			err = r.skip()
		}
		return err
	})
	return v, err
}

// str reads a string (null: "").
func (r *jsonReader) str(field string) (string, error) {
	t, err := r.scalar()
	if err != nil || t == nil {
		return "", err
	}
	s, ok := t.(string)
	if !ok {
		return "", fmt.Errorf("%s: want a string, got %v", field, t)
	}
	return s, nil
}

// hexID reads a trace or span id: hex digits, either case.
func (r *jsonReader) hexID(field string) ([]byte, error) {
	s, err := r.str(field)
	if err != nil {
		return nil, err
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%s %q is not hex", field, s)
	}
	return b, nil
}

// numberText reads a number, or a string holding one (null: "").
func (r *jsonReader) numberText(field string) (string, error) {
	t, err := r.scalar()
	if err != nil || t == nil {
		return "", err
	}
	switch x := t.(type) {
	case json.Number:
		return string(x), nil
	case string:
		return x, nil
	}
	return "", fmt.Errorf("%s: want a number, got %v", field, t)
}

// uint64 reads a fixed64 (times in nanoseconds).
func (r *jsonReader) uint64(field string) (uint64, error) {
	s, err := r.numberText(field)
	if err != nil || s == "" {
		return 0, err
	}
	u, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64) // 1.7e18: integral, in range
		if ferr != nil || f != math.Trunc(f) || f < 0 || f >= 1<<64 {
			return 0, fmt.Errorf("%s: %q is not an unsigned 64-bit integer", field, s)
		}
		u = uint64(f)
	}
	return u, nil
}

// int64 reads an int64.
func (r *jsonReader) int64(field string) (int64, error) {
	s, err := r.numberText(field)
	if err != nil || s == "" {
		return 0, err
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
			return 0, fmt.Errorf("%s: %q is not a 64-bit integer", field, s)
		}
		i = int64(f)
	}
	return i, nil
}

// float64 reads a double: a number, or a string holding one, "NaN",
// "Infinity" or "-Infinity".
func (r *jsonReader) float64(field string) (float64, error) {
	s, err := r.numberText(field)
	if err != nil || s == "" {
		return 0, err
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", field, s)
	}
	return f, nil
}

// statusCode reads Status.code: a number, or the enum value's name.
func (r *jsonReader) statusCode() (tracepb.Status_StatusCode, error) {
	t, err := r.scalar()
	if err != nil || t == nil {
		return 0, err
	}
	switch x := t.(type) {
	case json.Number:
		i, err := strconv.ParseInt(string(x), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("status code %s is not an enum number", x)
		}
		return tracepb.Status_StatusCode(i), nil
	case string:
		if i, ok := tracepb.Status_StatusCode_value[x]; ok {
			return tracepb.Status_StatusCode(i), nil
		}
		return 0, fmt.Errorf("status code %q is not a StatusCode", x)
	}
	return 0, fmt.Errorf("status code: want a number, got %v", t)
}
