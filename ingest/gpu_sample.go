package ingest

import (
	"math"
	"time"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DefaultGPUTopic carries GpuSample records from gpu-agent.
const DefaultGPUTopic = "meter.gpu.v1"

// MaxSampleInterval bounds interval_s of one GPU sample.
const MaxSampleInterval = time.Hour

// DecodeGPUSample fills s from a record value in protobuf or JSON (chosen as
// for events: content-type header, else a leading '{' means JSON).
func DecodeGPUSample(s *meterv1.GpuSample, value []byte, contentType string, limits Limits) error {
	return decodeRecord(s, "GPU sample", value, contentType, limits)
}

// ValidateGPUSample checks a GPU sample against ARCHITECTURE "GPU time and
// cost" and the limits. An empty deployment is valid: the GPU's time is
// reported as unattributed. It returns nil or a *ValidationError.
func (l Limits) ValidateGPUSample(s *meterv1.GpuSample, now time.Time) error {
	var r sink.GPURow
	r.FromProto(s)
	return l.ValidateGPURow(&r, now)
}

// ValidateGPURow is ValidateGPUSample of a sample row: the one set of rules.
func (l Limits) ValidateGPURow(s *sink.GPURow, now time.Time) error {
	for _, f := range [...]struct{ name, v string }{{"sample_id", s.SampleID}, {"gpu_uuid", s.GPUUUID}} {
		if f.v == "" {
			return invalid(ReasonMissingField, "%s is required", f.name)
		}
	}
	for _, f := range [...]struct{ name, v string }{
		{"sample_id", s.SampleID}, {"node", s.Node}, {"gpu_uuid", s.GPUUUID},
		{"gpu_type", s.GPUType}, {"mig_profile", s.MIGProfile}, {"deployment", s.Deployment},
		{"pod", s.Pod}, {"namespace", s.Namespace}, {"region", s.Region},
		{"pool", s.Pool}, {"source", s.Source},
	} {
		if len(f.v) > l.MaxStringLen {
			return invalid(ReasonOutOfRange, "%s is %d bytes, limit is %d", f.name, len(f.v), l.MaxStringLen)
		}
		if err := ident.Check(f.name, f.v); err != nil {
			return invalid(ReasonInvalidValue, "%v", err)
		}
	}
	if !s.SampledAt.Set {
		return invalid(ReasonMissingField, "sampled_at is required")
	}
	if err := checkTimestamp(s.SampledAt); err != nil {
		return invalid(ReasonInvalidValue, "sampled_at: %v", err)
	}
	at := s.SampledAt.Time()
	if at.Before(l.MinTime) || at.After(now.Add(l.MaxFuture)) {
		return invalid(ReasonOutOfRange, "sampled_at %s is outside [%s, now+%s]", at.Format(time.RFC3339), l.MinTime.Format(time.RFC3339), l.MaxFuture)
	}
	iv := s.IntervalS
	if !(iv > 0) || iv > MaxSampleInterval.Seconds() || math.IsInf(iv, 0) {
		return invalid(ReasonOutOfRange, "interval_s %v must be in (0, %v]", iv, MaxSampleInterval.Seconds())
	}
	if u := s.Utilization; !(u >= 0 && u <= 1) {
		return invalid(ReasonOutOfRange, "utilization %v must be in [0, 1]", u)
	}
	if f := s.MIGFraction; !(f >= 0 && f <= 1) {
		return invalid(ReasonOutOfRange, "mig_fraction %v must be in [0, 1]", f)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"power_watts", s.PowerWatts}, {"energy_joules", s.EnergyJoules}, {"sm_clock_mhz", s.SMClockMHz}, {"sm_clock_max_mhz", s.SMClockMaxMHz}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return invalid(ReasonOutOfRange, "%s %v must be a non-negative number", f.name, f.v)
		}
	}
	if t := s.TemperatureC; math.IsNaN(t) || math.IsInf(t, 0) {
		return invalid(ReasonInvalidValue, "temperature_c %v is not a number", t)
	}
	if a := s.SMActive; a.Set && !(a.V >= 0 && a.V <= 1) {
		return invalid(ReasonOutOfRange, "sm_active %v must be in [0, 1]", a.V)
	}
	if s.FBTotalBytes > 0 && s.FBUsedBytes > s.FBTotalBytes {
		return invalid(ReasonOutOfRange, "fb_used_bytes %d exceeds fb_total_bytes %d", s.FBUsedBytes, s.FBTotalBytes)
	}
	return nil
}
