package ingest

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// An idle partition's fetch timeout is debug, other reader errors warnings.
func TestReaderLogLevels(t *testing.T) {
	var buf bytes.Buffer
	log := readerLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	log("the kafka reader got an unknown error reading partition %d of %s at offset %d: %s", 3, "meter.events.v1", 42, "read tcp 127.0.0.1:1->127.0.0.1:9092: i/o timeout")
	if buf.Len() != 0 {
		t.Errorf("an idle fetch timeout was logged at info or above: %s", buf.String())
	}
	log("the kafka reader got an unknown error reading partition %d of %s at offset %d: %s", 3, "meter.events.v1", 42, "[3] Unknown Topic Or Partition")
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "Unknown Topic") {
		t.Errorf("a real reader error was not a warning: %q", buf.String())
	}
}
