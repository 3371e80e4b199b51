package otlp

import (
	"encoding/hex"
	"errors"
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

// errTooManySpans is an export request of more spans than the receiver's
// limit (Config.MaxSpans).
var errTooManySpans = errors.New("too many spans")

// spanCounter counts the spans of an export request as they are reached.
type spanCounter struct {
	max int // 0: no limit
	n   int
}

// next counts one more span; beyond max it is errTooManySpans.
func (c *spanCounter) next() error {
	c.n++
	if c.max > 0 && c.n > c.max {
		return fmt.Errorf("%w: the export request has more than %d spans, the limit of one request; send smaller batches (in an OpenTelemetry Collector, the batch processor's send_batch_max_size)", errTooManySpans, c.max)
	}
	return nil
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
		var res resourceAttrs
		for _, kv := range rs.GetResource().GetAttributes() {
			res.add(kv.GetKey(), stringOf(kv.GetValue()), tenantAttr)
		}
		res.fill()
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				var a spanAttrs
				var err error
				for _, kv := range sp.GetAttributes() {
					if sl, ok := lookup(kv.GetKey(), tenantAttr); ok {
						if serr := a.set(sl, valueOf(kv.GetValue())); serr != nil && err == nil {
							err = fmt.Errorf("attribute %s: %w", kv.GetKey(), serr)
						}
					}
				}
				core := spanCore{
					traceID: sp.GetTraceId(), spanID: sp.GetSpanId(),
					start: sp.GetStartTimeUnixNano(), end: sp.GetEndTimeUnixNano(),
					status: sp.GetStatus().GetCode(),
				}
				for _, e := range sp.GetEvents() {
					core.event(e.GetName(), e.GetTimeUnixNano())
				}
				m.add(&b, &core, &a, err, &res, keyTenant)
			}
		}
	}
	return b
}

// spanCore is what a span holds besides its attributes.
type spanCore struct {
	traceID, spanID []byte
	start, end      uint64
	status          tracepb.Status_StatusCode
	// firstToken is the time of the earliest "gen_ai.first_token" event
	// at or after start, 0 for none.
	firstToken uint64
}

// event notes a span event.
func (c *spanCore) event(name string, t uint64) {
	if name == eventFirstToken && t >= c.start && (c.firstToken == 0 || t < c.firstToken) {
		c.firstToken = t
	}
}

func (c *spanCore) span() Span {
	return Span{TraceID: hex.EncodeToString(c.traceID), SpanID: hex.EncodeToString(c.spanID)}
}

// add classifies one span into b.
func (m Mapping) add(b *Batch, sp *spanCore, a *spanAttrs, attrErr error, res *resourceAttrs, keyTenant string) {
	switch {
	case !a.genAI:
		b.NotGenAI++
		return
	case !a.inference():
		b.NotInference++
		return
	}
	ev, rej := m.event(sp, a, attrErr, res, keyTenant)
	if rej != nil {
		b.Rejected = append(b.Rejected, *rej)
		return
	}
	b.Events = append(b.Events, ev)
	b.Spans = append(b.Spans, sp.span())
}

// event builds the event of one GenAI inference span, or says why not.
// attrErr is the first attribute of the span that could not be read.
func (m Mapping) event(sp *spanCore, a *spanAttrs, attrErr error, res *resourceAttrs, keyTenant string) (*meterv1.InferenceEvent, *Rejection) {
	reject := func(reason, format string, args ...any) (*meterv1.InferenceEvent, *Rejection) {
		return nil, &Rejection{Span: sp.span(), Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	if len(sp.traceID) != 16 || len(sp.spanID) != 8 || allZero(sp.traceID) || allZero(sp.spanID) {
		return reject(ReasonInvalidSpan, "trace id (%d bytes) and span id (%d bytes) must be 16 and 8 bytes, not all zero", len(sp.traceID), len(sp.spanID))
	}
	start, end := sp.start, sp.end
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
	status := statusOf(sp.status, a.str[attrErrorType])
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
		EventId:     EventID(sp.traceID, sp.spanID),
		RequestId:   a.str[attrRequestID],
		TenantId:    tenant,
		Model:       model,
		Deployment:  res.deployment,
		Engine:      servingEngine(a.str[attrProvider], a.str[attrSystem]),
		Node:        res.node,
		Region:      res.region,
		ReceivedAt:  timestampOf(start),
		CompletedAt: timestampOf(end),
		Streaming:   a.stream,
	}
	if ev.RequestId == "" {
		ev.RequestId = a.str[attrResponseID]
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
	} else if sp.firstToken != 0 {
		ms := float64(int64(sp.firstToken)-int64(start)) / 1e6
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

// slot is where an attribute goes.
type slot struct {
	kind    slotKind
	i       int  // index in spanAttrs.str or .num
	integer bool // a count, not seconds
}

type slotKind uint8

const (
	slotUsage  slotKind = iota // an unknown gen_ai.usage.* attribute: only marks the span GenAI
	slotTenant                 // the tenant attribute
	slotStr                    // spanAttrs.str[i]
	slotNum                    // spanAttrs.num[i]
	slotStream                 // gen_ai.request.stream
)

// lookup says what an attribute key is for; false: nothing. It takes the
// key as a string or as bytes (the wire decoder's), and allocates neither.
func lookup[K ~string | ~[]byte](key K, tenantAttr string) (slot, bool) {
	if string(key) == tenantAttr {
		return slot{kind: slotTenant}, true
	}
	if i, ok := strAttrs[string(key)]; ok {
		return slot{kind: slotStr, i: i}, true
	}
	if n, ok := numAttrs[string(key)]; ok {
		return slot{kind: slotNum, i: n.i, integer: n.integer}, true
	}
	if string(key) == "gen_ai.request.stream" {
		return slot{kind: slotStream}, true
	}
	if len(key) > len(usagePrefix) && string(key[:len(usagePrefix)]) == usagePrefix {
		return slot{kind: slotUsage}, true
	}
	return slot{}, false
}

const usagePrefix = "gen_ai.usage."

// value is a scalar attribute value.
type value struct {
	kind valueKind
	s    string
	i    int64
	f    float64
	b    bool
}

type valueKind uint8

const (
	valueNone valueKind = iota // absent, or an array, map or bytes
	valueString
	valueInt
	valueDouble
	valueBool
)

func valueOf(v *commonpb.AnyValue) value {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return value{kind: valueString, s: x.StringValue}
	case *commonpb.AnyValue_IntValue:
		return value{kind: valueInt, i: x.IntValue}
	case *commonpb.AnyValue_DoubleValue:
		return value{kind: valueDouble, f: x.DoubleValue}
	case *commonpb.AnyValue_BoolValue:
		return value{kind: valueBool, b: x.BoolValue}
	}
	return value{}
}

// set stores one attribute. A span is GenAI when it has
// gen_ai.operation.name, gen_ai.system, gen_ai.provider.name,
// gen_ai.request.model or any gen_ai.usage.* attribute. The error is a
// value of the wrong type.
func (a *spanAttrs) set(sl slot, v value) error {
	switch sl.kind {
	case slotUsage:
		a.genAI = true
	case slotTenant:
		a.tenant = v.String()
	case slotStr:
		a.str[sl.i] = v.String()
		if sl.i == attrOperation || sl.i == attrSystem || sl.i == attrProvider || sl.i == attrRequestModel {
			a.genAI = true
		}
	case slotNum:
		if sl.i <= numCachedTokens {
			a.genAI = true // gen_ai.usage.*
		}
		n, err := v.number(sl.integer)
		a.num[sl.i] = n
		return err
	case slotStream:
		a.stream = v.kind == valueBool && v.b
	}
	return nil
}

// String reads a string attribute; other scalar types are formatted.
func (v value) String() string {
	switch v.kind {
	case valueString:
		return v.s
	case valueInt:
		return strconv.FormatInt(v.i, 10)
	case valueDouble:
		return strconv.FormatFloat(v.f, 'g', -1, 64)
	case valueBool:
		return strconv.FormatBool(v.b)
	}
	return ""
}

func stringOf(v *commonpb.AnyValue) string { return valueOf(v).String() }

// number reads a count (integer: an int, a double without fraction or a
// decimal string) or a duration in seconds (an int, a double or a decimal
// string).
func (v value) number(integer bool) (number, error) {
	var f float64
	switch v.kind {
	case valueInt:
		return number{set: true, i: v.i, f: float64(v.i)}, nil
	case valueDouble:
		f = v.f
	case valueString:
		if i, err := strconv.ParseInt(v.s, 10, 64); err == nil {
			return number{set: true, i: i, f: float64(i)}, nil
		}
		var err error
		if f, err = strconv.ParseFloat(v.s, 64); err != nil {
			return number{}, fmt.Errorf("%q is not a number", v.s)
		}
	default:
		return number{}, errors.New("want a number")
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

// resourceAttrs holds what a resource says about where the spans ran:
// deployment from k8s.deployment.name; node from host.name, else
// k8s.node.name; region from cloud.region. service.name is not a
// deployment: for client SDKs and gateways it names the calling
// application, and an event's deployment joins GPU samples (cost).
type resourceAttrs struct {
	tenant, deployment, node, region string
	k8sNode                          string
}

// servingEngines are the gen_ai.provider.name (or gen_ai.system) values
// that name a self-hosted inference engine, the event's engine. Other
// providers (openai, aws.bedrock, …) are the API called, not an engine.
var servingEngines = map[string]bool{
	"vllm": true, "sglang": true, "tgi": true, "text-generation-inference": true,
	"trt-llm": true, "tensorrt-llm": true, "tensorrt_llm": true, "triton": true,
	"llama.cpp": true, "ollama": true,
}

// servingEngine is the first of names that is a serving engine, else "".
func servingEngine(names ...string) string {
	for _, n := range names {
		if servingEngines[strings.ToLower(n)] {
			return strings.ToLower(n)
		}
	}
	return ""
}

// resourceKey tells whether a resource attribute is one add reads.
func resourceKey[K ~string | ~[]byte](k K, tenantAttr string) bool {
	switch string(k) {
	case tenantAttr, "k8s.deployment.name", "host.name", "k8s.node.name", "cloud.region":
		return true
	}
	return false
}

func (r *resourceAttrs) add(k, v, tenantAttr string) {
	switch k {
	case tenantAttr:
		r.tenant = v
	case "k8s.deployment.name":
		r.deployment = v
	case "host.name":
		r.node = v
	case "k8s.node.name":
		r.k8sNode = v
	case "cloud.region":
		r.region = v
	}
}

// fill applies the fallbacks once every attribute is read.
func (r *resourceAttrs) fill() {
	if r.node == "" {
		r.node = r.k8sNode
	}
}
