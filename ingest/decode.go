package ingest

import (
	"bytes"
	"strings"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Content types of event records. A record without a content-type header is
// read as JSON when its first non-space byte is '{', else as protobuf.
const (
	ContentTypeProtobuf = "application/x-protobuf"
	ContentTypeJSON     = "application/json"
	// HeaderContentType is the Kafka record header naming the encoding.
	HeaderContentType = "content-type"
)

// Decoder turns record values into events under its limits.
type Decoder struct {
	limits Limits
}

// NewDecoder returns a Decoder enforcing limits.MaxRecordBytes.
func NewDecoder(limits Limits) *Decoder {
	return &Decoder{limits: limits}
}

// Decode fills ev from value. contentType is the record's content-type header
// ("" when absent). Errors are *ValidationError with reason decode or oversized.
func (d *Decoder) Decode(ev *meterv1.InferenceEvent, value []byte, contentType string) error {
	return decodeRecord(ev, "event", value, contentType, d.limits)
}

// decodeRecord fills m, a record of the kind named in errors ("event"), from
// value: refused when larger than limits.MaxRecordBytes or empty, then
// decoded as JSON or protobuf as recordIsJSON decides. Errors are
// *ValidationError with reason decode or oversized.
func decodeRecord(m proto.Message, kind string, value []byte, contentType string, limits Limits) error {
	if len(value) > limits.MaxRecordBytes {
		return invalid(ReasonOversized, "record is %d bytes, limit is %d", len(value), limits.MaxRecordBytes)
	}
	if len(value) == 0 {
		return invalid(ReasonDecode, "record is empty")
	}
	isJSON, err := recordIsJSON(value, contentType)
	if err != nil {
		return err
	}
	if isJSON {
		if err := protojson.Unmarshal(value, m); err != nil {
			return invalid(ReasonDecode, "malformed JSON %s: %v", kind, err)
		}
		return nil
	}
	if err := proto.Unmarshal(value, m); err != nil {
		return invalid(ReasonDecode, "malformed protobuf %s: %v", kind, err)
	}
	return nil
}

// headerValue returns the value of the first header named key
// (case-insensitive). A known content type comes back as the package's
// constant, with no copy per record; any other value is copied, so the
// string never shares the header's bytes (a reader that reuses its fetch
// buffers may rewrite them after the record is handled).
func headerValue(headers []kafka.Header, key string) string {
	for _, h := range headers {
		if strings.EqualFold(h.Key, key) {
			switch {
			case string(h.Value) == ContentTypeJSON: // compared in place, no allocation
				return ContentTypeJSON
			case string(h.Value) == ContentTypeProtobuf:
				return ContentTypeProtobuf
			}
			return string(h.Value)
		}
	}
	return ""
}

// recordIsJSON decides a record's encoding: its content-type header, else a
// leading '{' means JSON and anything else protobuf.
func recordIsJSON(value []byte, contentType string) (bool, error) {
	if contentType == ContentTypeJSON { // the usual header, as producers write it
		return true, nil
	}
	mediaType, _, _ := strings.Cut(contentType, ";")
	switch ct := strings.ToLower(strings.TrimSpace(mediaType)); ct {
	case ContentTypeJSON:
		return true, nil
	case ContentTypeProtobuf, "application/protobuf", "application/vnd.google.protobuf":
		return false, nil
	case "":
		trimmed := bytes.TrimLeft(value, " \t\r\n")
		return len(trimmed) > 0 && trimmed[0] == '{', nil
	default:
		return false, invalid(ReasonDecode, "unsupported content-type %q: want %s or %s", contentType, ContentTypeProtobuf, ContentTypeJSON)
	}
}
