package ingest

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DefaultEngineTopic carries EngineSample records from gpu-agent's engine
// scraper.
const DefaultEngineTopic = "meter.engine.v1"

// DefaultEngineGroupID is the consumer group of the engine sample consumer.
const DefaultEngineGroupID = "tokenmeter-ingest-engine"

// Engines are the engine names an EngineSample may carry.
var Engines = []string{"vllm", "sglang", "tgi", "nim", "dynamo"}

// EngineSampleWriter makes and stores batches of validated engine
// samples, and stores the dead letters the DLQ topic refuses.
type EngineSampleWriter interface {
	NewEngineBatch() sink.EngineBatch
	// InsertEngineSamples stores b, a batch NewEngineBatch made.
	InsertEngineSamples(ctx context.Context, b sink.EngineBatch) error
	DeadLetterWriter
}

// DecodeEngineSample fills s from a record value in protobuf or JSON
// (chosen as for events: content-type header, else a leading '{' means
// JSON).
func DecodeEngineSample(s *meterv1.EngineSample, value []byte, contentType string, limits Limits) error {
	return decodeRecord(s, "engine sample", value, contentType, limits)
}

// ValidateEngineSample checks an engine sample against ARCHITECTURE
// "Engine samples" and the limits. It returns nil or a *ValidationError.
func (l Limits) ValidateEngineSample(s *meterv1.EngineSample, now time.Time) error {
	for _, f := range [...]struct{ name, v string }{{"sample_id", s.GetSampleId()}, {"deployment", s.GetDeployment()}, {"replica", s.GetReplica()}, {"engine", s.GetEngine()}} {
		if f.v == "" {
			return invalid(ReasonMissingField, "%s is required", f.name)
		}
	}
	for _, f := range [...]struct{ name, v string }{
		{"sample_id", s.GetSampleId()}, {"deployment", s.GetDeployment()}, {"engine", s.GetEngine()},
		{"replica", s.GetReplica()}, {"model", s.GetModel()}, {"node", s.GetNode()}, {"source", s.GetSource()},
	} {
		if len(f.v) > l.MaxStringLen {
			return invalid(ReasonOutOfRange, "%s is %d bytes, limit is %d", f.name, len(f.v), l.MaxStringLen)
		}
		if err := ident.Check(f.name, f.v); err != nil {
			return invalid(ReasonInvalidValue, "%v", err)
		}
	}
	known := false
	for _, e := range Engines {
		known = known || s.GetEngine() == e
	}
	if !known {
		return invalid(ReasonInvalidValue, "engine %q: want one of %s", s.GetEngine(), strings.Join(Engines, ", "))
	}
	ts := s.GetSampledAt()
	if ts == nil {
		return invalid(ReasonMissingField, "sampled_at is required")
	}
	if err := ts.CheckValid(); err != nil {
		return invalid(ReasonInvalidValue, "sampled_at: %v", err)
	}
	at := ts.AsTime()
	if at.Before(l.MinTime) || at.After(now.Add(l.MaxFuture)) {
		return invalid(ReasonOutOfRange, "sampled_at %s is outside [%s, now+%s]", at.Format(time.RFC3339), l.MinTime.Format(time.RFC3339), l.MaxFuture)
	}
	if iv := s.GetIntervalS(); !(iv > 0) || iv > MaxSampleInterval.Seconds() {
		return invalid(ReasonOutOfRange, "interval_s %v must be in (0, %v]", iv, MaxSampleInterval.Seconds())
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"kv_cache_usage", s.KvCacheUsage}, {"prefix_cache_hit_rate", s.PrefixCacheHitRate}} {
		if f.v != nil && !(*f.v >= 0 && *f.v <= 1) {
			return invalid(ReasonOutOfRange, "%s %v must be in [0, 1]", f.name, *f.v)
		}
	}
	if b := s.BatchTokens; b != nil && (!(*b >= 0) || math.IsInf(*b, 0)) {
		return invalid(ReasonOutOfRange, "batch_tokens %v must be a non-negative number", *b)
	}
	if r := s.Restarts; r != nil && *r > 1 {
		return invalid(ReasonOutOfRange, "restarts %d: a scrape sees at most 1", *r)
	}
	if (s.PrefixCacheQueries == nil) != (s.PrefixCacheHits == nil) {
		return invalid(ReasonMissingField, "prefix_cache_queries and prefix_cache_hits come together")
	}
	if s.PrefixCacheQueries != nil && *s.PrefixCacheHits > *s.PrefixCacheQueries {
		return invalid(ReasonOutOfRange, "prefix_cache_hits %d exceeds prefix_cache_queries %d", *s.PrefixCacheHits, *s.PrefixCacheQueries)
	}
	return nil
}

// engineRows batches engine samples. Each record is decoded into a
// message of its own: the batch keeps pointers to its optional fields.
type engineRows struct {
	limits Limits
	store  EngineSampleWriter
	batch  sink.EngineBatch // made by store
}

func (r *engineRows) add(m kafka.Message, now time.Time) *ValidationError {
	s := &meterv1.EngineSample{}
	err := DecodeEngineSample(s, m.Value, headerValue(m.Headers, HeaderContentType), r.limits)
	if err == nil {
		err = r.limits.ValidateEngineSample(s, now)
	}
	if err != nil {
		return asValidation(err)
	}
	r.batch.Append(s, now)
	return nil
}

func (r *engineRows) len() int { return r.batch.Len() }
func (r *engineRows) reset()   { r.batch.Reset() }
func (r *engineRows) insert(ctx context.Context) error {
	return r.store.InsertEngineSamples(ctx, r.batch)
}
