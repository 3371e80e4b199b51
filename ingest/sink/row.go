package sink

import (
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// EventRow is one inference event as the ingest decoders produce it: the
// fields of meterv1.InferenceEvent, flat, with explicit presence, so that a
// record is decoded, validated and appended to an EventBatch without a
// message or a pointer per field. The zero value is an empty event; Reset
// makes a used row empty again and keeps its label slice.
type EventRow struct {
	EventID, RequestID, TenantID, Model, ModelVersion, Deployment string
	Engine, GPUType, Node, Region, SLOClass                       string
	TensorParallelism                                             uint32
	ReceivedAt, CompletedAt                                       Timestamp
	PromptTokens, CachedPromptTokens, OutputTokens                OptInt
	TTFTMs, E2EMs, QueueMs, PrefillMs, ITLMs                      OptFloat
	Status                                                        int32
	Streaming                                                     bool
	// Labels are sorted by key, keys unique.
	Labels []Label
}

// Timestamp is a google.protobuf.Timestamp by value; Set is its presence.
// Seconds and Nanos are as sent (validation checks their range).
type Timestamp struct {
	Seconds int64
	Nanos   int32
	Set     bool
}

// Time is the instant (UTC); meaningful when Set and valid.
func (t Timestamp) Time() time.Time { return time.Unix(t.Seconds, int64(t.Nanos)).UTC() }

// Proto is the timestamp as a message, nil when not Set.
func (t Timestamp) Proto() *timestamppb.Timestamp {
	if !t.Set {
		return nil
	}
	return &timestamppb.Timestamp{Seconds: t.Seconds, Nanos: t.Nanos}
}

// OptInt is a proto3 optional int64.
type OptInt struct {
	V   int64
	Set bool
}

// OptFloat is a proto3 optional double.
type OptFloat struct {
	V   float64
	Set bool
}

// Label is one entry of the event's labels map.
type Label struct{ Key, Value string }

// Reset empties r, keeping the memory of its label slice.
func (r *EventRow) Reset() { *r = EventRow{Labels: r.Labels[:0]} }

// SortLabels sorts r.Labels by key and keeps the last of equal keys, as
// the protobuf wire format's map semantics do.
func (r *EventRow) SortLabels() {
	if len(r.Labels) < 2 {
		return
	}
	slices.SortStableFunc(r.Labels, func(a, b Label) int { return strings.Compare(a.Key, b.Key) })
	out := r.Labels[:0]
	for i, l := range r.Labels {
		if i+1 < len(r.Labels) && r.Labels[i+1].Key == l.Key {
			continue // a later entry of the same key wins
		}
		out = append(out, l)
	}
	r.Labels = out
}

func optInt(p *int64) OptInt {
	if p == nil {
		return OptInt{}
	}
	return OptInt{V: *p, Set: true}
}

func optFloat(p *float64) OptFloat {
	if p == nil {
		return OptFloat{}
	}
	return OptFloat{V: *p, Set: true}
}

func timestamp(t *timestamppb.Timestamp) Timestamp {
	if t == nil {
		return Timestamp{}
	}
	return Timestamp{Seconds: t.GetSeconds(), Nanos: t.GetNanos(), Set: true}
}

// FromProto fills r from ev (r's earlier contents are discarded).
func (r *EventRow) FromProto(ev *meterv1.InferenceEvent) {
	labels := r.Labels[:0]
	for k, v := range ev.GetLabels() {
		labels = append(labels, Label{Key: k, Value: v})
	}
	*r = EventRow{
		EventID: ev.GetEventId(), RequestID: ev.GetRequestId(), TenantID: ev.GetTenantId(),
		Model: ev.GetModel(), ModelVersion: ev.GetModelVersion(), Deployment: ev.GetDeployment(),
		Engine: ev.GetEngine(), GPUType: ev.GetGpuType(), Node: ev.GetNode(), Region: ev.GetRegion(),
		SLOClass: ev.GetSloClass(), TensorParallelism: ev.GetTensorParallelism(),
		ReceivedAt: timestamp(ev.GetReceivedAt()), CompletedAt: timestamp(ev.GetCompletedAt()),
		PromptTokens: optInt(ev.PromptTokens), CachedPromptTokens: optInt(ev.CachedPromptTokens),
		OutputTokens: optInt(ev.OutputTokens),
		TTFTMs:       optFloat(ev.TtftMs), E2EMs: optFloat(ev.E2EMs), QueueMs: optFloat(ev.QueueMs),
		PrefillMs: optFloat(ev.PrefillMs), ITLMs: optFloat(ev.ItlMs),
		Status: int32(ev.GetStatus()), Streaming: ev.GetStreaming(), Labels: labels,
	}
	r.SortLabels()
}

func ptrInt(o OptInt) *int64 {
	if !o.Set {
		return nil
	}
	v := o.V
	return &v
}

func ptrFloat(o OptFloat) *float64 {
	if !o.Set {
		return nil
	}
	v := o.V
	return &v
}

// Proto returns r as a message (for tests and the paths that publish).
func (r *EventRow) Proto() *meterv1.InferenceEvent {
	ev := &meterv1.InferenceEvent{
		EventId: r.EventID, RequestId: r.RequestID, TenantId: r.TenantID, Model: r.Model,
		ModelVersion: r.ModelVersion, Deployment: r.Deployment, Engine: r.Engine, GpuType: r.GPUType,
		TensorParallelism: r.TensorParallelism, Node: r.Node, Region: r.Region,
		ReceivedAt: r.ReceivedAt.Proto(), CompletedAt: r.CompletedAt.Proto(),
		PromptTokens: ptrInt(r.PromptTokens), CachedPromptTokens: ptrInt(r.CachedPromptTokens),
		OutputTokens: ptrInt(r.OutputTokens), TtftMs: ptrFloat(r.TTFTMs), E2EMs: ptrFloat(r.E2EMs),
		QueueMs: ptrFloat(r.QueueMs), PrefillMs: ptrFloat(r.PrefillMs), ItlMs: ptrFloat(r.ITLMs),
		Status: meterv1.Status(r.Status), Streaming: r.Streaming, SloClass: r.SLOClass,
	}
	if len(r.Labels) > 0 {
		ev.Labels = make(map[string]string, len(r.Labels))
		for _, l := range r.Labels {
			ev.Labels[l.Key] = l.Value
		}
	}
	return ev
}

// GPURow is one GPU sample as the ingest decoders produce it: the fields of
// meterv1.GpuSample, flat (see EventRow).
type GPURow struct {
	SampleID, Node, GPUUUID, GPUType, MIGProfile string
	GPUIndex, MIGInstanceID                      uint32
	MIGFraction                                  float64
	Deployment, Pod, Namespace, Region, Pool     string
	SampledAt                                    Timestamp
	IntervalS, Utilization                       float64
	FBUsedBytes, FBTotalBytes                    uint64
	PowerWatts, EnergyJoules, TemperatureC       float64
	SMClockMHz                                   float64
	Source                                       string
	// SMActive is DCGM_FI_PROF_SM_ACTIVE where the sample carried it;
	// SMClockMaxMHz the GPU's maximum SM clock (0: not reported).
	SMActive      OptFloat
	SMClockMaxMHz float64
}

// FromProto fills r from s.
func (r *GPURow) FromProto(s *meterv1.GpuSample) {
	*r = GPURow{
		SampleID: s.GetSampleId(), Node: s.GetNode(), GPUUUID: s.GetGpuUuid(), GPUIndex: s.GetGpuIndex(),
		GPUType: s.GetGpuType(), MIGProfile: s.GetMigProfile(), MIGInstanceID: s.GetMigInstanceId(),
		MIGFraction: s.GetMigFraction(), Deployment: s.GetDeployment(), Pod: s.GetPod(),
		Namespace: s.GetNamespace(), Region: s.GetRegion(), Pool: s.GetPool(),
		SampledAt: timestamp(s.GetSampledAt()), IntervalS: s.GetIntervalS(), Utilization: s.GetUtilization(),
		FBUsedBytes: s.GetFbUsedBytes(), FBTotalBytes: s.GetFbTotalBytes(), PowerWatts: s.GetPowerWatts(),
		EnergyJoules: s.GetEnergyJoules(), TemperatureC: s.GetTemperatureC(), SMClockMHz: s.GetSmClockMhz(),
		Source: s.GetSource(), SMActive: optFloat(s.SmActive), SMClockMaxMHz: s.GetSmClockMaxMhz(),
	}
}

// Proto returns r as a message.
func (r *GPURow) Proto() *meterv1.GpuSample {
	return &meterv1.GpuSample{
		SampleId: r.SampleID, Node: r.Node, GpuUuid: r.GPUUUID, GpuIndex: r.GPUIndex, GpuType: r.GPUType,
		MigProfile: r.MIGProfile, MigInstanceId: r.MIGInstanceID, MigFraction: r.MIGFraction,
		Deployment: r.Deployment, Pod: r.Pod, Namespace: r.Namespace, Region: r.Region, Pool: r.Pool,
		SampledAt: r.SampledAt.Proto(), IntervalS: r.IntervalS, Utilization: r.Utilization,
		FbUsedBytes: r.FBUsedBytes, FbTotalBytes: r.FBTotalBytes, PowerWatts: r.PowerWatts,
		EnergyJoules: r.EnergyJoules, TemperatureC: r.TemperatureC, SmClockMhz: r.SMClockMHz, Source: r.Source,
		SmActive: ptrFloat(r.SMActive), SmClockMaxMhz: r.SMClockMaxMHz,
	}
}

// Source records where an event came from: the Kafka partition and offset, or
// -1/-1 for rows written by other paths.
type Source struct {
	Partition int32
	Offset    int64
}

// ITL is what an event's row stores of its inter-token latency (itl_ms,
// itl_measured): Ms when Valid (NULL otherwise), and whether the event
// measured it rather than it being derived. ingest.ITL and ingest.RowITL
// compute it by the event's definition.
type ITL struct {
	Ms              float64
	Valid, Measured bool
}
