package ingest

import (
	"tokenmeter/internal/chstore"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// ITL is the request's inter-token latency per ARCHITECTURE "Latency
// definitions": itl_ms if the engine measured it (Measured), else
// (e2e − ttft) / (output_tokens − 1); none (not Valid) for fewer than 2
// output tokens or without TTFT or E2E.
func ITL(ev *meterv1.InferenceEvent) chstore.ITL {
	if ev.ItlMs != nil {
		return chstore.ITL{Ms: *ev.ItlMs, Valid: true, Measured: true}
	}
	out := ev.GetOutputTokens()
	if out < 2 || ev.TtftMs == nil || ev.E2EMs == nil {
		return chstore.ITL{}
	}
	return chstore.ITL{Ms: (*ev.E2EMs - *ev.TtftMs) / float64(out-1), Valid: true}
}
