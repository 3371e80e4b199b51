package otlp

import (
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DefaultTenantAttribute is the span or resource attribute that names the
// tenant unless Mapping.TenantAttribute says otherwise.
const DefaultTenantAttribute = "tenant.id"

// Reason codes of rejected spans: the "reason" label of
// meter_otlp_spans_rejected_total. Spans that the publisher's validation
// rejects carry the ingest.Reason* code instead.
const (
	ReasonInvalidSpan    = "invalid_span"    // ids or times unusable
	ReasonInvalidValue   = "invalid_value"   // an attribute of the wrong type
	ReasonMissingModel   = "missing_model"   // neither response nor request model
	ReasonMissingTokens  = "missing_tokens"  // a successful call without input or output tokens
	ReasonMissingTTFT    = "missing_ttft"    // a successful call without time to first token
	ReasonMissingTenant  = "missing_tenant"  // no tenant attribute and a key without tenant
	ReasonTenantMismatch = "tenant_mismatch" // the tenant attribute names another tenant than the key's
)

// Span results: the "result" label of meter_otlp_spans_total.
const (
	ResultAccepted     = "accepted"      // published as an event
	ResultRejected     = "rejected"      // a GenAI inference span that could not become an event
	ResultNotGenAI     = "not_genai"     // no GenAI attribute: ignored
	ResultNotInference = "not_inference" // a GenAI agent or tool span: ignored
)

// Mapping says how spans become events.
type Mapping struct {
	// TenantAttribute names the attribute holding the tenant, looked up on
	// the span, then on its resource. Default DefaultTenantAttribute.
	TenantAttribute string
	// TTFTFromE2E sets ttft_ms to e2e_ms, and the label ttft_source=e2e,
	// on a successful span that carries no time to first token. When false
	// such spans are rejected (ReasonMissingTTFT): the event contract
	// requires ttft_ms, and no number is made up unless asked for.
	TTFTFromE2E bool
}

// Span names one span of an export request: the ids as hex, as trace
// viewers show them.
type Span struct {
	TraceID, SpanID string
}

func (s Span) String() string { return s.TraceID + "/" + s.SpanID }

// Rejection is a GenAI inference span that did not become an event.
type Rejection struct {
	Span    Span
	Reason  string
	Message string
}

// Batch is what an export request becomes.
type Batch struct {
	// Events are the events of the GenAI inference spans, and Spans the
	// span each came from (same index).
	Events []*meterv1.InferenceEvent
	Spans  []Span
	// Rejected are the GenAI inference spans that could not become events.
	Rejected []Rejection
	// NotGenAI and NotInference count the spans ignored: without any GenAI
	// attribute, and GenAI agent or tool spans (whose usage, when they
	// carry any, sums that of the inference calls beneath them).
	NotGenAI, NotInference int
}

// EventID is the event id of a span: its trace id and span id in lowercase
// hex, joined by "-" (32 + 1 + 16 characters). The same span sent again
// has the same id, so the pipeline counts it once.
func EventID(traceID, spanID []byte) string {
	b := make([]byte, 0, 49)
	b = hex.AppendEncode(b, traceID)
	b = append(b, '-')
	b = hex.AppendEncode(b, spanID)
	return string(b)
}

// Convert turns the spans of an export request into events. keyTenant is
// the tenant of the caller's key, "" when the key is not bound to one: it
// is the tenant of spans without the tenant attribute, and the only tenant
// such a key may publish for.
func (m Mapping) Convert(req *coltracepb.ExportTraceServiceRequest, keyTenant string) Batch {
	tenantAttr := m.TenantAttribute
	if tenantAttr == "" {
		tenantAttr = DefaultTenantAttribute
	}
	var b Batch
	for _, rs := range req.GetResourceSpans() {
		res := readResource(rs.GetResource().GetAttributes(), tenantAttr)
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				a, err := readSpan(sp.GetAttributes(), tenantAttr)
				switch {
				case !a.genAI:
					b.NotGenAI++
					continue
				case !a.inference():
					b.NotInference++
					continue
				}
				ev, rej := m.event(sp, &a, err, &res, keyTenant)
				if rej != nil {
					b.Rejected = append(b.Rejected, *rej)
					continue
				}
				b.Events = append(b.Events, ev)
				b.Spans = append(b.Spans, spanOf(sp))
			}
		}
	}
	return b
}

func spanOf(sp *tracepb.Span) Span {
	return Span{TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId())}
}

// event builds the event of one GenAI inference span, or says why not.
// attrErr is the first attribute of the span that could not be read.
func (m Mapping) event(sp *tracepb.Span, a *spanAttrs, attrErr error, res *resourceAttrs, keyTenant string) (*meterv1.InferenceEvent, *Rejection) {
	reject := func(reason, format string, args ...any) (*meterv1.InferenceEvent, *Rejection) {
		return nil, &Rejection{Span: spanOf(sp), Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	if len(sp.GetTraceId()) != 16 || len(sp.GetSpanId()) != 8 || allZero(sp.GetTraceId()) || allZero(sp.GetSpanId()) {
		return reject(ReasonInvalidSpan, "trace id (%d bytes) and span id (%d bytes) must be 16 and 8 bytes, not all zero", len(sp.GetTraceId()), len(sp.GetSpanId()))
	}
	start, end := sp.GetStartTimeUnixNano(), sp.GetEndTimeUnixNano()
	if start == 0 || end < start || end > math.MaxInt64 {
		return reject(ReasonInvalidSpan, "span times start %d, end %d (ns since 1970): want 0 < start <= end", start, end)
	}
	if attrErr != nil {
		return reject(ReasonInvalidValue, "%v", attrErr)
	}
	tenant := a.tenant
	if tenant == "" {
		tenant = res.tenant
	}
	switch {
	case tenant == "" && keyTenant == "":
		return reject(ReasonMissingTenant, "no tenant: the span and its resource lack attribute %q and the API key is not bound to a tenant", m.tenantAttr())
	case tenant == "":
		tenant = keyTenant
	case keyTenant != "" && tenant != keyTenant:
		return reject(ReasonTenantMismatch, "attribute %q names tenant %q, but the API key publishes only for tenant %q", m.tenantAttr(), tenant, keyTenant)
	}
	model := a.str[attrResponseModel]
	if model == "" {
		model = a.str[attrRequestModel]
	}
	if model == "" {
		return reject(ReasonMissingModel, "no model: the span has neither gen_ai.response.model nor gen_ai.request.model")
	}
	status := statusOf(sp.GetStatus().GetCode(), a.str[attrErrorType])
	ok := status == meterv1.Status_STATUS_OK
	input := a.num[numInputTokens].or(a.num[numPromptTokens])
	output := a.num[numOutputTokens].or(a.num[numCompletionTokens])
	if !output.set && a.str[attrOperation] == "embeddings" {
		output = number{set: true} // an embedding generates no tokens
	}
	if ok && (!input.set || !output.set) {
		return reject(ReasonMissingTokens, "a successful call needs gen_ai.usage.input_tokens and gen_ai.usage.output_tokens (or the older prompt_tokens and completion_tokens)")
	}

	ev := &meterv1.InferenceEvent{
		EventId:     EventID(sp.GetTraceId(), sp.GetSpanId()),
		RequestId:   a.str[attrRequestID],
		TenantId:    tenant,
		Model:       model,
		Deployment:  res.deployment,
		Engine:      a.str[attrProvider],
		Node:        res.node,
		Region:      res.region,
		ReceivedAt:  timestampOf(start),
		CompletedAt: timestampOf(end),
		Streaming:   a.stream,
	}
	if ev.RequestId == "" {
		ev.RequestId = a.str[attrResponseID]
	}
	if ev.Engine == "" {
		ev.Engine = a.str[attrSystem]
	}
	if !ok {
		ev.Status = status
	}
	if input.set {
		ev.PromptTokens = &input.i
	}
	if output.set {
		ev.OutputTokens = &output.i
	}
	if c := a.num[numCacheRead].or(a.num[numCacheReadOld]).or(a.num[numCachedTokens]); c.set {
		ev.CachedPromptTokens = &c.i
	}
	e2e := float64(end-start) / 1e6
	ev.E2EMs = &e2e
	if t := a.num[numTTFTLatency].or(a.num[numTTFTChunk]).or(a.num[numTTFTServer]).or(a.num[numTTFTLLM]); t.set {
		ms := t.f * 1000
		ev.TtftMs = &ms
	} else if first := firstTokenEvent(sp); first != 0 {
		ms := float64(int64(first)-int64(start)) / 1e6
		ev.TtftMs = &ms
	} else if ok && m.TTFTFromE2E {
		ev.TtftMs = &e2e
		ev.Labels = map[string]string{"ttft_source": "e2e"}
	} else if ok {
		return reject(ReasonMissingTTFT, "a successful call needs a time to first token (gen_ai.response.time_to_first_chunk, gen_ai.latency.time_to_first_token, gen_ai.server.time_to_first_token or llm.response.time_to_first_token in seconds, or a %q event); meterd --otlp-ttft-from-e2e takes e2e instead", eventFirstToken)
	}
	if q := a.num[numQueue]; q.set {
		ms := q.f * 1000
		ev.QueueMs = &ms
	}
	if p := a.num[numPrefill]; p.set {
		ms := p.f * 1000
		ev.PrefillMs = &ms
	}
	if t := a.num[numTPOT]; t.set {
		ms := t.f * 1000
		ev.ItlMs = &ms
	}
	return ev, nil
}

func (m Mapping) tenantAttr() string {
	if m.TenantAttribute == "" {
		return DefaultTenantAttribute
	}
	return m.TenantAttribute
}

// eventFirstToken is the span event whose time, when no TTFT attribute is
// set, marks the first output token.
const eventFirstToken = "gen_ai.first_token"

// firstTokenEvent is the time of the span's first "gen_ai.first_token"
// event, 0 when it has none.
func firstTokenEvent(sp *tracepb.Span) uint64 {
	var first uint64
	for _, e := range sp.GetEvents() {
		if e.GetName() == eventFirstToken && e.GetTimeUnixNano() >= sp.GetStartTimeUnixNano() && (first == 0 || e.GetTimeUnixNano() < first) {
			first = e.GetTimeUnixNano()
		}
	}
	return first
}

func timestampOf(ns uint64) *timestamppb.Timestamp {
	return &timestamppb.Timestamp{Seconds: int64(ns / 1e9), Nanos: int32(ns % 1e9)}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// statusOf maps the span status and the error.type attribute to the event
// status. error.type is free text in the conventions (an HTTP status code,
// an exception class, a provider's error code), so it is matched by what it
// contains, once lowercased and stripped of everything but letters and
// digits.
func statusOf(code tracepb.Status_StatusCode, errorType string) meterv1.Status {
	if code != tracepb.Status_STATUS_CODE_ERROR && errorType == "" {
		return meterv1.Status_STATUS_OK
	}
	t := normalize(errorType)
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(t, w) {
				return true
			}
		}
		return false
	}
	switch {
	case t == "429" || has("ratelimit", "toomanyrequests", "quota"):
		return meterv1.Status_STATUS_RATE_LIMITED
	case t == "408" || t == "504" || has("timeout", "timedout", "deadline"):
		return meterv1.Status_STATUS_TIMEOUT
	case has("contextlength", "contextwindow", "maxtokens", "toolong"):
		return meterv1.Status_STATUS_CONTEXT_LENGTH
	case t == "499" || has("cancel"):
		return meterv1.Status_STATUS_CANCELLED
	case has("outofmemory", "oom"):
		return meterv1.Status_STATUS_OOM
	case has("cuda"):
		return meterv1.Status_STATUS_CUDA
	case t == "400" || t == "404" || t == "413" || t == "422" || has("badrequest", "invalid", "notfound", "unprocessable"):
		return meterv1.Status_STATUS_BAD_REQUEST
	default:
		return meterv1.Status_STATUS_INTERNAL
	}
}

func normalize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The attributes read, per the OpenTelemetry GenAI semantic conventions
// (and the older or engine-specific names still emitted: vLLM's and
// SGLang's gen_ai.usage.prompt_tokens and gen_ai.latency.*, OpenLLMetry's
// llm.response.time_to_first_token).
const (
	attrOperation = iota
	attrSystem
	attrProvider
	attrRequestModel
	attrResponseModel
	attrRequestID
	attrResponseID
	attrErrorType
	numStrAttrs
)

const (
	numInputTokens = iota
	numPromptTokens
	numOutputTokens
	numCompletionTokens
	numCacheRead
	numCacheReadOld
	numCachedTokens
	numTTFTLatency // seconds, like every duration below
	numTTFTChunk
	numTTFTServer
	numTTFTLLM
	numQueue
	numPrefill
	numTPOT
	numNumAttrs
)

var strAttrs = map[string]int{
	"gen_ai.operation.name": attrOperation,
	"gen_ai.system":         attrSystem,
	"gen_ai.provider.name":  attrProvider,
	"gen_ai.request.model":  attrRequestModel,
	"gen_ai.response.model": attrResponseModel,
	"gen_ai.request.id":     attrRequestID,
	"gen_ai.response.id":    attrResponseID,
	"error.type":            attrErrorType,
}

var numAttrs = map[string]struct {
	i       int
	integer bool
}{
	"gen_ai.usage.input_tokens":            {numInputTokens, true},
	"gen_ai.usage.prompt_tokens":           {numPromptTokens, true},
	"gen_ai.usage.output_tokens":           {numOutputTokens, true},
	"gen_ai.usage.completion_tokens":       {numCompletionTokens, true},
	"gen_ai.usage.cache_read.input_tokens": {numCacheRead, true},
	"gen_ai.usage.cache_read_input_tokens": {numCacheReadOld, true},
	"gen_ai.usage.cached_tokens":           {numCachedTokens, true},
	"gen_ai.latency.time_to_first_token":   {numTTFTLatency, false},
	"gen_ai.response.time_to_first_chunk":  {numTTFTChunk, false},
	"gen_ai.server.time_to_first_token":    {numTTFTServer, false},
	"llm.response.time_to_first_token":     {numTTFTLLM, false},
	"gen_ai.latency.time_in_queue":         {numQueue, false},
	"gen_ai.latency.time_in_model_prefill": {numPrefill, false},
	"gen_ai.server.time_per_output_token":  {numTPOT, false},
}

// number is an attribute read as a token count (i) or seconds (f).
type number struct {
	set bool
	i   int64
	f   float64
}

func (n number) or(o number) number {
	if n.set {
		return n
	}
	return o
}

// spanAttrs holds what one pass over a span's attributes found.
type spanAttrs struct {
	genAI  bool
	str    [numStrAttrs]string
	num    [numNumAttrs]number
	stream bool
	tenant string
}

// inference tells whether the span is a call to a model. Agent and tool
// spans (gen_ai.operation.name invoke_agent, create_agent, execute_tool,
// ...) are not: their usage, when they carry one, is the sum of the calls
// beneath them, which are metered themselves.
func (a *spanAttrs) inference() bool {
	switch a.str[attrOperation] {
	case "", "chat", "text_completion", "generate_content", "embeddings", "completion":
		return true
	}
	return false
}

// readSpan reads a span's attributes in one pass. A span is GenAI when it
// has gen_ai.operation.name, gen_ai.system, gen_ai.provider.name,
// gen_ai.request.model or any gen_ai.usage.* attribute. err is the first
// attribute of a known name whose value has the wrong type.
func readSpan(kvs []*commonpb.KeyValue, tenantAttr string) (a spanAttrs, err error) {
	for _, kv := range kvs {
		k := kv.GetKey()
		if k == tenantAttr {
			a.tenant = stringOf(kv.GetValue())
			continue
		}
		if !strings.HasPrefix(k, "gen_ai.") && !strings.HasPrefix(k, "llm.") && k != "error.type" {
			continue
		}
		if strings.HasPrefix(k, "gen_ai.usage.") {
			a.genAI = true
		}
		if i, ok := strAttrs[k]; ok {
			a.str[i] = stringOf(kv.GetValue())
			if i == attrOperation || i == attrSystem || i == attrProvider || i == attrRequestModel {
				a.genAI = true
			}
			continue
		}
		if n, ok := numAttrs[k]; ok {
			v, perr := numberOf(kv.GetValue(), n.integer)
			if perr != nil && err == nil {
				err = fmt.Errorf("attribute %s: %w", k, perr)
			}
			a.num[n.i] = v
			continue
		}
		if k == "gen_ai.request.stream" {
			a.stream = kv.GetValue().GetBoolValue()
		}
	}
	return a, err
}

// stringOf reads a string attribute; other scalar types are formatted.
func stringOf(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	}
	return ""
}

// numberOf reads a count (integer: an int, a double without fraction or a
// decimal string) or a duration in seconds (an int, a double or a decimal
// string).
func numberOf(v *commonpb.AnyValue, integer bool) (number, error) {
	var f float64
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_IntValue:
		return number{set: true, i: x.IntValue, f: float64(x.IntValue)}, nil
	case *commonpb.AnyValue_DoubleValue:
		f = x.DoubleValue
	case *commonpb.AnyValue_StringValue:
		if i, err := strconv.ParseInt(x.StringValue, 10, 64); err == nil {
			return number{set: true, i: i, f: float64(i)}, nil
		}
		var err error
		if f, err = strconv.ParseFloat(x.StringValue, 64); err != nil {
			return number{}, fmt.Errorf("%q is not a number", x.StringValue)
		}
	default:
		return number{}, fmt.Errorf("want a number, got %T", v.GetValue())
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return number{}, fmt.Errorf("%v is not a finite number", f)
	}
	if integer {
		if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return number{}, fmt.Errorf("%v is not a whole number", f)
		}
		return number{set: true, i: int64(f), f: f}, nil
	}
	return number{set: true, f: f}, nil
}

// resourceAttrs holds what a resource says about where the spans ran.
type resourceAttrs struct {
	tenant, deployment, node, region string
}

// readResource maps resource attributes: deployment from
// k8s.deployment.name, else service.name; node from host.name, else
// k8s.node.name; region from cloud.region.
func readResource(kvs []*commonpb.KeyValue, tenantAttr string) resourceAttrs {
	var r resourceAttrs
	var service, k8sNode string
	for _, kv := range kvs {
		switch k := kv.GetKey(); k {
		case tenantAttr:
			r.tenant = stringOf(kv.GetValue())
		case "k8s.deployment.name":
			r.deployment = stringOf(kv.GetValue())
		case "service.name":
			service = stringOf(kv.GetValue())
		case "host.name":
			r.node = stringOf(kv.GetValue())
		case "k8s.node.name":
			k8sNode = stringOf(kv.GetValue())
		case "cloud.region":
			r.region = stringOf(kv.GetValue())
		}
	}
	if r.deployment == "" {
		r.deployment = service
	}
	if r.node == "" {
		r.node = k8sNode
	}
	return r
}
