package workload

import (
	"math"

	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// absent marks an optional value that the event does not carry.
const absent = -1

// request is the outcome of one simulated request; fields equal to absent
// are left out of the event.
type request struct {
	status                 meterv1.Status
	prompt, cached, output int64
	queue, prefill, ttft   float64 // milliseconds
	itl, e2e               float64 // milliseconds
}

// Timeouts of the two SLO classes, in milliseconds.
const (
	interactiveDeadlineMs = 60_000
	batchDeadlineMs       = 600_000
)

// simulate runs one request of m with the given status and planned token
// counts through a simple serving model: a queue that grows with load, a
// prefill proportional to the uncached prompt, and a steady decode. Failed
// requests stop where their failure strikes. The latencies obey
// ARCHITECTURE.md: ttft ≥ queue + prefill and e2e = ttft + itl·(output − 1).
func simulate(r *rng, m *Model, status meterv1.Status, prompt, output int64, batch bool, load float64) request {
	var cached int64
	hit := prompt >= 64 && r.float64() < m.CacheHitRate
	if hit {
		share := 0.2 + 0.75*r.float64()
		if m.CachedShare > 0 {
			// Agents and chats resend their conversation: most of it hits.
			share = min(0.99, m.CachedShare+0.1*(share-0.575)/0.75)
		}
		cached = int64(float64(prompt)*share) &^ 15 // whole 16-token KV blocks
	} else if prompt >= 64 && m.CachedShare > 0 {
		// A miss is the first turn of a conversation: the history that
		// later turns resend is not there yet.
		prompt = max(1, int64(float64(prompt)*(1-m.CachedShare)))
	}
	qMedian, qSigma, deadline := 4.0, 1.0, float64(interactiveDeadlineMs)
	if batch {
		qMedian, qSigma, deadline = 250, 1.3, batchDeadlineMs
	}
	pressure := 0.85 + 0.15*load
	q := r.logNormal(qMedian*math.Exp(2*(load-1)), qSigma)
	if m.Saturation > 0 && load > m.Saturation {
		// Beyond its knee the deployment has no free slot for a growing
		// share of requests: they wait for one, well past the TTFT SLO.
		over := load/m.Saturation - 1
		if r.float64() < min(0.9, 3*over) {
			q += r.logNormal(900*(1+5*over), 0.4)
		}
	}
	queue := ms(min(q, deadline/2))
	prefill := ms(1.5 + float64(prompt-cached)/m.PrefillTokensPerMs*r.logNormal(1, 0.25)*pressure)
	itl := m.ITLMs * r.logNormal(1, 0.2) * pressure
	if batch {
		itl *= 1.15 // batch traffic rides in larger decode batches
	}
	itl = max(ms(itl), 0.5)
	first := ms(itl * r.logNormal(1, 0.15))
	cut := r.float64() // where a failure strikes

	req := request{status: status, prompt: prompt, cached: cached, output: 0,
		queue: queue, prefill: prefill, ttft: absent, itl: absent, e2e: absent}
	// decoded fills in a request that produced n ≥ 1 tokens at the given ITL.
	decoded := func(n int64, itl float64) {
		req.output = n
		if n == 0 {
			// Finished without a token (e.g. max_tokens 0): the first
			// "token" is the end of prefill.
			req.ttft = ms(queue + prefill)
			req.e2e = req.ttft
			return
		}
		req.ttft = max(ms(queue+prefill+first), queue+prefill)
		req.e2e = req.ttft
		if n >= 2 {
			req.itl = itl
			req.e2e = max(ms(req.ttft+itl*float64(n-1)), req.ttft)
		}
	}
	// beforeFirstToken ends the request after a share of its prefill.
	beforeFirstToken := func(share float64) {
		req.prefill = ms(prefill * share)
		req.e2e = ms(queue + req.prefill)
	}

	switch status {
	case meterv1.Status_STATUS_OK, meterv1.Status_STATUS_UNSPECIFIED:
		decoded(output, itl)
	case meterv1.Status_STATUS_RATE_LIMITED:
		// Refused at the gateway: counted, never queued.
		req.cached, req.queue, req.prefill = absent, absent, absent
		req.e2e = ms(r.logNormal(2, 0.5))
	case meterv1.Status_STATUS_BAD_REQUEST:
		// Refused before tokenization: no tokens, no timings.
		req.prompt, req.cached, req.queue, req.prefill = absent, absent, absent, absent
	case meterv1.Status_STATUS_CONTEXT_LENGTH:
		// Tokenized, found too long, refused.
		req.prompt = m.ContextLength + 1 + int64(r.intN(int(m.ContextLength/4)+1))
		req.cached, req.queue, req.prefill = absent, absent, absent
		req.e2e = ms(3 + float64(req.prompt)/40_000*r.logNormal(1, 0.3))
	case meterv1.Status_STATUS_TIMEOUT:
		n := int64(cut * float64(output))
		if cut < 0.4 || n < 2 || queue+prefill+first >= deadline {
			// Timed out waiting for a slot.
			req.cached, req.prefill = absent, absent
			req.queue, req.e2e = deadline, deadline
			break
		}
		// A stalled stream: n tokens spread over the whole deadline.
		ttft := max(ms(queue+prefill+first), queue+prefill)
		decoded(n, max(ms((deadline-ttft)/float64(n-1)), itl))
	case meterv1.Status_STATUS_CANCELLED:
		if cut < 0.3 {
			beforeFirstToken(cut / 0.3)
			break
		}
		decoded(max(1, int64((cut-0.3)/0.7*float64(output))), itl)
	default: // OOM, CUDA, INTERNAL: half in prefill, half while decoding.
		if cut < 0.5 {
			beforeFirstToken(cut / 0.5)
			break
		}
		decoded(max(1, int64((cut-0.5)/0.5*float64(output))), itl)
	}
	return req
}

// ms rounds a duration in milliseconds to the microsecond.
func ms(x float64) float64 { return math.Round(x*1000) / 1000 }

// eventMeta is what an event carries besides the request's outcome.
type eventMeta struct {
	ids         string // event ID (36 bytes) followed by the request ID
	tenant      string
	model       *Model
	node        string
	batch       bool
	streaming   bool
	endpoint    string
	completedNs int64
}

// write overwrites every field of ev, reusing its optional-field storage.
func (req *request) write(ev *meterv1.InferenceEvent, meta eventMeta) {
	m := meta.model
	ev.EventId, ev.RequestId = meta.ids[:36], meta.ids[36:]
	ev.TenantId = meta.tenant
	ev.Model, ev.ModelVersion, ev.Deployment = m.Name, m.Version, m.Deployment
	ev.Engine, ev.GpuType, ev.TensorParallelism = m.Engine, m.GPUType, m.TensorParallelism
	ev.Node, ev.Region = meta.node, m.Region
	ev.Status = req.status
	ev.Streaming = meta.streaming
	ev.SloClass = "interactive"
	if meta.batch {
		ev.SloClass = "batch"
	}
	if ev.Labels == nil {
		ev.Labels = make(map[string]string, 1)
	} else {
		clear(ev.Labels)
	}
	ev.Labels["endpoint"] = meta.endpoint

	ev.CompletedAt = setTime(ev.CompletedAt, meta.completedNs)
	if req.e2e >= 0 {
		ev.ReceivedAt = setTime(ev.ReceivedAt, meta.completedNs-int64(math.Round(req.e2e*1e6)))
	} else {
		ev.ReceivedAt = nil
	}
	setInt(&ev.PromptTokens, req.prompt)
	setInt(&ev.CachedPromptTokens, req.cached)
	setInt(&ev.OutputTokens, req.output)
	setFloat(&ev.QueueMs, req.queue)
	setFloat(&ev.PrefillMs, req.prefill)
	setFloat(&ev.TtftMs, req.ttft)
	setFloat(&ev.ItlMs, req.itl)
	setFloat(&ev.E2EMs, req.e2e)
}

func setTime(ts *timestamppb.Timestamp, ns int64) *timestamppb.Timestamp {
	if ts == nil {
		ts = new(timestamppb.Timestamp)
	}
	sec, nsec := ns/1e9, ns%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	ts.Seconds, ts.Nanos = sec, int32(nsec)
	return ts
}

func setInt(p **int64, v int64) {
	switch {
	case v < 0:
		*p = nil
	case *p == nil:
		*p = new(int64) // not &v: that would move v to the heap on every call
		**p = v
	default:
		**p = v
	}
}

func setFloat(p **float64, v float64) {
	switch {
	case v < 0:
		*p = nil
	case *p == nil:
		*p = new(float64)
		**p = v
	default:
		**p = v
	}
}
