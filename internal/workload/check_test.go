package workload

import (
	"errors"
	"fmt"
	"math"
	"time"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// checkEvent is the test's own statement of what a generated event must
// satisfy: the required fields and value rules of ARCHITECTURE.md "The
// event", and the latency definitions the generator promises. It returns
// every problem found.
func checkEvent(ev *meterv1.InferenceEvent) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if ev.GetEventId() == "" || ev.GetTenantId() == "" || ev.GetModel() == "" {
		bad("missing event_id %q, tenant_id %q or model %q", ev.GetEventId(), ev.GetTenantId(), ev.GetModel())
	}
	if ev.GetCompletedAt() == nil || ev.GetCompletedAt().CheckValid() != nil {
		bad("completed_at missing or invalid: %v", ev.GetCompletedAt())
	}
	if _, ok := meterv1.Status_name[int32(ev.GetStatus())]; !ok {
		bad("unknown status %d", ev.GetStatus())
	}
	ok := ev.GetStatus() == meterv1.Status_STATUS_OK || ev.GetStatus() == meterv1.Status_STATUS_UNSPECIFIED
	if ok && (ev.PromptTokens == nil || ev.OutputTokens == nil || ev.TtftMs == nil || ev.E2EMs == nil) {
		bad("successful request lacks prompt_tokens, output_tokens, ttft_ms or e2e_ms")
	}
	for name, v := range map[string]*int64{
		"prompt_tokens": ev.PromptTokens, "cached_prompt_tokens": ev.CachedPromptTokens, "output_tokens": ev.OutputTokens,
	} {
		if v != nil && *v < 0 {
			bad("%s is negative: %d", name, *v)
		}
	}
	if ev.GetCachedPromptTokens() > ev.GetPromptTokens() {
		bad("cached_prompt_tokens %d > prompt_tokens %d", ev.GetCachedPromptTokens(), ev.GetPromptTokens())
	}
	for name, v := range map[string]*float64{
		"ttft_ms": ev.TtftMs, "e2e_ms": ev.E2EMs, "queue_ms": ev.QueueMs, "prefill_ms": ev.PrefillMs, "itl_ms": ev.ItlMs,
	} {
		if v != nil && (*v < 0 || math.IsNaN(*v) || math.IsInf(*v, 0)) {
			bad("%s is %g", name, *v)
		}
	}
	if ev.TtftMs != nil && ev.E2EMs != nil && ev.GetTtftMs() > ev.GetE2EMs() {
		bad("ttft_ms %g > e2e_ms %g", ev.GetTtftMs(), ev.GetE2EMs())
	}
	if ev.TtftMs != nil && ev.GetQueueMs()+ev.GetPrefillMs() > ev.GetTtftMs()+1e-9 {
		bad("queue_ms %g + prefill_ms %g > ttft_ms %g", ev.GetQueueMs(), ev.GetPrefillMs(), ev.GetTtftMs())
	}
	out := ev.GetOutputTokens()
	switch {
	case ev.ItlMs != nil && out < 2:
		bad("itl_ms set with %d output tokens", out)
	case ev.ItlMs != nil && ev.TtftMs != nil && ev.E2EMs != nil:
		want := ev.GetTtftMs() + ev.GetItlMs()*float64(out-1)
		if math.Abs(ev.GetE2EMs()-want) > 0.001 {
			bad("e2e_ms %g, want ttft + itl·(output−1) = %g", ev.GetE2EMs(), want)
		}
	case ok && out < 2 && ev.GetE2EMs() != ev.GetTtftMs():
		bad("e2e_ms %g != ttft_ms %g with %d output tokens", ev.GetE2EMs(), ev.GetTtftMs(), out)
	}
	if ev.GetReceivedAt() != nil {
		gap := ev.GetCompletedAt().AsTime().Sub(ev.GetReceivedAt().AsTime())
		if gap < 0 {
			bad("received_at after completed_at")
		}
		if ev.E2EMs != nil && (gap-time.Duration(ev.GetE2EMs()*1e6)).Abs() > time.Microsecond {
			bad("completed_at − received_at = %s, e2e_ms %g", gap, ev.GetE2EMs())
		}
	}
	switch ev.GetSloClass() {
	case "interactive":
	case "batch":
		if ev.GetStreaming() {
			bad("batch request is streaming")
		}
	default:
		bad("slo_class %q", ev.GetSloClass())
	}
	switch ev.GetEngine() {
	case "vllm", "sglang", "trt-llm":
	default:
		bad("engine %q", ev.GetEngine())
	}
	if ev.GetTensorParallelism() < 1 || ev.GetDeployment() == "" || ev.GetGpuType() == "" || ev.GetNode() == "" || ev.GetRegion() == "" {
		bad("placement incomplete: deployment %q gpu %q tp %d node %q region %q",
			ev.GetDeployment(), ev.GetGpuType(), ev.GetTensorParallelism(), ev.GetNode(), ev.GetRegion())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("event %s (status %s): %w", ev.GetEventId(), ev.GetStatus(), err)
	}
	return nil
}
