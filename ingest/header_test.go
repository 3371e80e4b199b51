package ingest

import (
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestHeaderValueOwnsItsString: the value headerValue returns does not
// change when the header's bytes are rewritten afterwards (a reader that
// reuses its fetch buffers), and the usual content types cost no
// allocation.
func TestHeaderValueOwnsItsString(t *testing.T) {
	for _, v := range []string{ContentTypeJSON, ContentTypeProtobuf, "application/json; charset=utf-8", "text/plain"} {
		buf := []byte(v)
		headers := []kafka.Header{{Key: "trace", Value: []byte("x")}, {Key: "Content-Type", Value: buf}}
		got := headerValue(headers, HeaderContentType)
		for i := range buf {
			buf[i] = '#'
		}
		if got != v {
			t.Errorf("headerValue = %q after the header's bytes were rewritten, want %q", got, v)
		}
	}
	for _, v := range []string{ContentTypeJSON, ContentTypeProtobuf} {
		headers := []kafka.Header{{Key: HeaderContentType, Value: []byte(v)}}
		var got string
		if n := testing.AllocsPerRun(100, func() { got = headerValue(headers, HeaderContentType) }); n != 0 || got != v {
			t.Errorf("headerValue(%q) = %q with %v allocations, want no allocation", v, got, n)
		}
	}
	if got := headerValue([]kafka.Header{{Key: "other", Value: []byte("v")}}, HeaderContentType); got != "" {
		t.Errorf("headerValue without the header = %q", got)
	}
}
