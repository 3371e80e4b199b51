package otlp

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// unmarshalJSON decodes an OTLP JSON export request.
//
// OTLP JSON is the protobuf JSON mapping of the same messages with one
// difference that protojson cannot be told about: trace and span ids are
// hex strings, not base64. Worse, 32 hex digits are also valid base64, so
// protojson alone would silently read a 24-byte trace id. The ids are
// therefore rewritten to base64 before protojson reads the message. This is
// written here because the one library that reads OTLP JSON natively (the
// collector's pdata) brings a second data model of the whole of OTLP.
// Unknown fields are ignored, as the specification asks of receivers.
func unmarshalJSON(data []byte, m *coltracepb.ExportTraceServiceRequest) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // int64 values stay exact
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	root, ok := doc.(map[string]any)
	if !ok {
		return errors.New("want a JSON object")
	}
	for _, rs := range objects(root, "resourceSpans", "resource_spans") {
		for _, ss := range objects(rs, "scopeSpans", "scope_spans") {
			for i, sp := range objects(ss, "spans") {
				if err := hexIDs(sp, "traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"); err != nil {
					return fmt.Errorf("span %d: %w", i, err)
				}
				for j, l := range objects(sp, "links") {
					if err := hexIDs(l, "traceId", "trace_id", "spanId", "span_id"); err != nil {
						return fmt.Errorf("span %d link %d: %w", i, j, err)
					}
				}
			}
		}
	}
	b, err := json.Marshal(root)
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
}

// objects returns the objects of the array under the first of names found
// in o; what is not an object is left for protojson to refuse.
func objects(o map[string]any, names ...string) []map[string]any {
	for _, n := range names {
		arr, ok := o[n].([]any)
		if !ok {
			continue
		}
		out := make([]map[string]any, 0, len(arr))
		for _, v := range arr {
			if m, ok := v.(map[string]any); ok {
				out = append(out, m)
			}
		}
		return out
	}
	return nil
}

// hexIDs rewrites the hex id fields of o to base64.
func hexIDs(o map[string]any, names ...string) error {
	for _, n := range names {
		s, ok := o[n].(string)
		if !ok {
			continue
		}
		b, err := hex.DecodeString(s)
		if err != nil {
			return fmt.Errorf("%s %q is not hex", n, s)
		}
		o[n] = base64.StdEncoding.EncodeToString(b)
	}
	return nil
}
