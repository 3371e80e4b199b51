package ingest

import (
	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// ITL is the request's inter-token latency per ARCHITECTURE "Latency
// definitions": itl_ms if the engine measured it (Measured), else
// (e2e − ttft) / (output_tokens − 1); none (not Valid) for fewer than 2
// output tokens or without TTFT or E2E.
func ITL(ev *meterv1.InferenceEvent) sink.ITL {
	var r sink.EventRow
	r.FromProto(ev)
	return RowITL(&r)
}

// RowITL is ITL of an event row.
func RowITL(ev *sink.EventRow) sink.ITL {
	if ev.ITLMs.Set {
		return sink.ITL{Ms: ev.ITLMs.V, Valid: true, Measured: true}
	}
	out := ev.OutputTokens.V
	if out < 2 || !ev.TTFTMs.Set || !ev.E2EMs.Set {
		return sink.ITL{}
	}
	return sink.ITL{Ms: (ev.E2EMs.V - ev.TTFTMs.V) / float64(out-1), Valid: true}
}
