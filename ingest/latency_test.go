package ingest

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestITL(t *testing.T) {
	tests := []struct {
		name string
		ev   *meterv1.InferenceEvent
		want sink.ITL
	}{
		{"measured", &meterv1.InferenceEvent{ItlMs: proto.Float64(12.5), TtftMs: proto.Float64(100), E2EMs: proto.Float64(900), OutputTokens: proto.Int64(5)},
			sink.ITL{Ms: 12.5, Valid: true, Measured: true}},
		{"measured with one token", &meterv1.InferenceEvent{ItlMs: proto.Float64(0), OutputTokens: proto.Int64(1)},
			sink.ITL{Ms: 0, Valid: true, Measured: true}},
		{"derived", &meterv1.InferenceEvent{TtftMs: proto.Float64(100), E2EMs: proto.Float64(900), OutputTokens: proto.Int64(5)},
			sink.ITL{Ms: 200, Valid: true}},
		{"two tokens", &meterv1.InferenceEvent{TtftMs: proto.Float64(100), E2EMs: proto.Float64(130), OutputTokens: proto.Int64(2)},
			sink.ITL{Ms: 30, Valid: true}},
		{"one token", &meterv1.InferenceEvent{TtftMs: proto.Float64(100), E2EMs: proto.Float64(900), OutputTokens: proto.Int64(1)}, sink.ITL{}},
		{"no TTFT", &meterv1.InferenceEvent{E2EMs: proto.Float64(900), OutputTokens: proto.Int64(5)}, sink.ITL{}},
		{"no E2E", &meterv1.InferenceEvent{TtftMs: proto.Float64(100), OutputTokens: proto.Int64(5)}, sink.ITL{}},
	}
	for _, tt := range tests {
		if got := ITL(tt.ev); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
