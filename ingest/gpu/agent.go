package gpu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// AgentConfig configures an Agent.
type AgentConfig struct {
	// Interval between two readings of the source. Default 10s.
	Interval time.Duration
	// Node is written into samples whose source named no node.
	Node string
	// MaxGap is the longest time between two samples of a GPU that the
	// later one may cover. After a longer gap (the source failed, the agent
	// was paused) the sample covers Interval and the gap stays a gap.
	// Default 3 * Interval.
	MaxGap time.Duration
	// BufferSamples bounds the samples kept while Kafka does not
	// acknowledge; beyond it the oldest are dropped and counted. Default
	// 50,000 (about 17 hours of 8 GPUs at 10s).
	BufferSamples int
	// PublishBatch is the most samples handed to the publisher at once.
	// Default 5,000.
	PublishBatch int
	// ShutdownTimeout bounds the last flush when the agent stops. Default 10s.
	ShutdownTimeout time.Duration
}

func (c AgentConfig) withDefaults() AgentConfig {
	if c.Interval <= 0 {
		c.Interval = 10 * time.Second
	}
	if c.MaxGap <= 0 {
		c.MaxGap = 3 * c.Interval
	}
	if c.BufferSamples <= 0 {
		c.BufferSamples = 50_000
	}
	if c.PublishBatch <= 0 {
		c.PublishBatch = 5_000
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	return c
}

// Publisher writes stamped samples. It returns the samples that were not
// acknowledged, which the Agent keeps and offers again; err says why.
// KafkaPublisher is the production one.
type Publisher interface {
	Publish(ctx context.Context, samples []*meterv1.GpuSample) (unacked []*meterv1.GpuSample, err error)
}

// Agent reads a Source every Interval, stamps each reading into a GpuSample
// (sampled_at, interval_s, sample_id, source, node), attributes it, checks
// it against ingest's rules and publishes it. Samples that the publisher did
// not get acknowledged stay in a bounded buffer and are offered again at the
// next tick; a re-sent sample keeps its sample_id, so the consumer
// deduplicates it.
type Agent struct {
	cfg    AgentConfig
	src    Source
	attr   *Attributor
	pub    Publisher
	logger *slog.Logger
	now    func() time.Time
	limits ingest.Limits
	m      *agentMetrics

	stampMu sync.Mutex
	last    map[sampleKey]time.Time // sampled_at of the previous sample of each GPU

	mu      sync.Mutex
	pending []*meterv1.GpuSample // oldest first

	sourceOK  atomic.Bool
	publishOK atomic.Bool
}

// NewAgent creates an Agent and registers its metrics on reg. It does not
// own src or pub: the caller closes them after Run returns.
func NewAgent(cfg AgentConfig, src Source, attr *Attributor, pub Publisher, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Agent, error) {
	if src == nil || attr == nil || pub == nil {
		return nil, errors.New("gpu agent: source, attributor and publisher are required")
	}
	m, err := newAgentMetrics(reg)
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg: cfg.withDefaults(), src: src, attr: attr, pub: pub, logger: logger, now: now,
		limits: ingest.DefaultLimits(), m: m, last: map[sampleKey]time.Time{},
	}
	a.publishOK.Store(true)
	return a, nil
}

// SampleID is the idempotency key of a sample: a digest of the node, GPU,
// MIG instance and sampled_at to the millisecond, so that the same reading
// sent twice has the same id.
func SampleID(node, gpuUUID string, migInstanceID uint32, sampledAt time.Time) string {
	h := sha256.New()
	for _, p := range []string{node, gpuUUID, strconv.FormatUint(uint64(migInstanceID), 10), strconv.FormatInt(sampledAt.UnixMilli(), 10)} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Collect reads the source once and queues the stamped, attributed and
// valid samples. It returns how many it queued. Invalid samples are
// dropped, counted and logged.
func (a *Agent) Collect(ctx context.Context) (int, error) {
	samples, err := a.src.Sample(ctx)
	if err != nil {
		if !errors.Is(err, ErrExhausted) {
			a.m.sourceErrors.Inc()
			a.sourceOK.Store(false)
		}
		return 0, err
	}
	a.sourceOK.Store(true)
	a.m.read.Add(float64(len(samples)))
	now := a.now()
	stamped := a.stamp(samples, now)
	keep := stamped[:0]
	for _, m := range stamped {
		if err := a.check(m, now); err != nil {
			a.m.dropped.WithLabelValues("invalid").Inc()
			a.logger.Warn("dropped an invalid GPU sample", "gpu_uuid", m.GetGpuUuid(), "sample_id", m.GetSampleId(), "error", err)
			continue
		}
		if m.Deployment == "" {
			a.m.unattributed.Inc()
		}
		keep = append(keep, m)
	}
	if len(keep) > 0 {
		a.m.lastSample.Set(float64(now.UnixMilli()) / 1000)
	}
	a.enqueue(keep)
	return len(keep), nil
}

func (a *Agent) check(m *meterv1.GpuSample, now time.Time) error {
	if err := a.limits.ValidateGPUSample(m, now); err != nil {
		return err
	}
	if _, err := proto.Marshal(m); err != nil { // invalid UTF-8 in a label
		return fmt.Errorf("encode: %w", err)
	}
	return nil
}

// stamp fills what the source leaves to the agent. A sample that has a
// sampled_at (a replay) keeps it and its interval_s; otherwise sampled_at is
// now, interval_s the time since the previous sample of the GPU (Interval
// for the first, or after a gap longer than MaxGap), and energy_joules, if
// the source had no counter delta, power_watts * interval_s.
func (a *Agent) stamp(samples []*meterv1.GpuSample, now time.Time) []*meterv1.GpuSample {
	a.stampMu.Lock()
	defer a.stampMu.Unlock()
	now = now.UTC().Truncate(time.Millisecond)
	out := make([]*meterv1.GpuSample, 0, len(samples))
	for _, m := range samples {
		if m == nil {
			continue
		}
		if m.Node == "" {
			m.Node = a.cfg.Node
		}
		if m.Source == "" {
			m.Source = a.src.Name()
		}
		live := m.SampledAt == nil
		at := now
		if live {
			m.SampledAt = timestamppb.New(now)
		} else {
			at = m.SampledAt.AsTime()
		}
		k := keyOf(m)
		prev, seen := a.last[k]
		if !seen || at.After(prev) {
			a.last[k] = at
		}
		if m.IntervalS == 0 {
			elapsed := at.Sub(prev)
			iv := a.cfg.Interval
			gap := seen && elapsed > a.cfg.MaxGap
			if seen && elapsed > 0 && !gap {
				iv = elapsed
			}
			m.IntervalS = iv.Seconds()
			switch {
			case !live:
			case m.EnergyJoules == 0 && m.PowerWatts > 0:
				m.EnergyJoules = m.PowerWatts * m.IntervalS
			case gap:
				// The counter delta spans the whole gap; keep the part of
				// the interval the sample covers.
				m.EnergyJoules *= m.IntervalS / elapsed.Seconds()
			}
		}
		if m.SampleId == "" {
			m.SampleId = SampleID(m.Node, m.GpuUuid, m.MigInstanceId, at)
		}
		a.attr.Apply(m)
		out = append(out, m)
	}
	return out
}

// enqueue appends samples to the buffer, dropping the oldest beyond its bound.
func (a *Agent) enqueue(samples []*meterv1.GpuSample) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, samples...)
	a.trimLocked()
}

// requeue puts unacknowledged samples back in front of the buffer.
func (a *Agent) requeue(samples []*meterv1.GpuSample) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(samples[:len(samples):len(samples)], a.pending...)
	a.trimLocked()
}

func (a *Agent) trimLocked() {
	if over := len(a.pending) - a.cfg.BufferSamples; over > 0 {
		oldest := a.pending[0].GetSampledAt().AsTime()
		clear(a.pending[:over])
		a.pending = a.pending[over:]
		a.m.dropped.WithLabelValues("buffer_full").Add(float64(over))
		a.logger.Warn("GPU sample buffer full while Kafka does not acknowledge; dropped the oldest samples",
			"dropped", over, "limit", a.cfg.BufferSamples, "oldest_dropped_sampled_at", oldest)
	}
	a.m.buffered.Set(float64(len(a.pending)))
}

func (a *Agent) take(n int) []*meterv1.GpuSample {
	a.mu.Lock()
	defer a.mu.Unlock()
	n = min(n, len(a.pending))
	batch := make([]*meterv1.GpuSample, n)
	copy(batch, a.pending[:n])
	clear(a.pending[:n])
	a.pending = a.pending[n:]
	a.m.buffered.Set(float64(len(a.pending)))
	return batch
}

// Pending is the number of samples waiting to be published.
func (a *Agent) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

// Healthy reports whether the last source reading and the last publish
// succeeded.
func (a *Agent) Healthy() bool { return a.sourceOK.Load() && a.publishOK.Load() }

// Flush publishes the buffer, oldest first, in batches of PublishBatch until
// it is empty or a batch fails; unacknowledged samples stay buffered.
func (a *Agent) Flush(ctx context.Context) error {
	for {
		batch := a.take(a.cfg.PublishBatch)
		if len(batch) == 0 {
			a.publishOK.Store(true)
			return nil
		}
		unacked, err := a.pub.Publish(ctx, batch)
		a.m.published.Add(float64(len(batch) - len(unacked)))
		if len(unacked) > 0 {
			a.requeue(unacked)
		}
		if err != nil {
			a.m.publishFailures.Inc()
			a.publishOK.Store(false)
			return fmt.Errorf("publish %d GPU samples, %d kept for retry: %w", len(batch), len(unacked), err)
		}
	}
}

// Run reads the source every Interval and publishes in the background, so
// that a slow or absent Kafka never delays a reading. It returns when ctx is
// done or the source is exhausted, after a last flush bounded by
// ShutdownTimeout; it returns an error only if samples were left unpublished
// then.
func (a *Agent) Run(ctx context.Context) error {
	kick := make(chan struct{}, 1)
	sampled := make(chan struct{})
	var exhausted atomic.Bool
	go func() {
		defer close(sampled)
		t := time.NewTicker(a.cfg.Interval)
		defer t.Stop()
		for {
			if _, err := a.Collect(ctx); errors.Is(err, ErrExhausted) {
				exhausted.Store(true)
				return
			} else if err != nil && ctx.Err() == nil {
				a.logger.Warn("read GPU source", "source", a.src.Name(), "error", err)
			}
			if a.Pending() > 0 {
				select {
				case kick <- struct{}{}:
				default:
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	for running := true; running; {
		select {
		case <-kick:
			if err := a.Flush(ctx); err != nil && ctx.Err() == nil {
				a.logger.Warn("publish GPU samples; will retry at the next tick", "pending", a.Pending(), "error", err)
			}
		case <-sampled:
			running = false
		}
	}
	// Shutdown work that must outlive a cancelled ctx.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.Flush(fctx); err != nil {
		return fmt.Errorf("stop GPU agent with %d samples unpublished: %w", a.Pending(), err)
	}
	if exhausted.Load() {
		a.logger.Info("GPU source exhausted; agent stopped", "source", a.src.Name())
	}
	return nil
}

// agentMetrics are the Agent's Prometheus series.
type agentMetrics struct {
	read            prometheus.Counter
	published       prometheus.Counter
	dropped         *prometheus.CounterVec
	unattributed    prometheus.Counter
	sourceErrors    prometheus.Counter
	publishFailures prometheus.Counter
	buffered        prometheus.Gauge
	lastSample      prometheus.Gauge
}

func newAgentMetrics(reg prometheus.Registerer) (*agentMetrics, error) {
	m := &agentMetrics{
		read: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_gpu_agent_samples_total", Help: "GPU samples read from the source.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_gpu_agent_samples_published_total", Help: "GPU samples acknowledged by Kafka (re-sends included).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_gpu_agent_samples_dropped_total", Help: "GPU samples dropped, by reason: invalid, or buffer_full while Kafka did not acknowledge.",
		}, []string{"reason"}),
		unattributed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_gpu_agent_samples_unattributed_total", Help: "GPU samples queued without a deployment.",
		}),
		sourceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_gpu_agent_source_errors_total", Help: "Failed readings of the GPU source.",
		}),
		publishFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_gpu_agent_publish_failures_total", Help: "Publish attempts that left samples unacknowledged.",
		}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meter_gpu_agent_buffered_samples", Help: "GPU samples waiting for a Kafka acknowledgement.",
		}),
		lastSample: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meter_gpu_agent_last_sample_timestamp_seconds", Help: "Unix time of the last successful reading of the source.",
		}),
	}
	for _, reason := range []string{"invalid", "buffer_full"} {
		m.dropped.WithLabelValues(reason)
	}
	for _, c := range []prometheus.Collector{m.read, m.published, m.dropped, m.unattributed, m.sourceErrors, m.publishFailures, m.buffered, m.lastSample} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register GPU agent metrics: %w", err)
		}
	}
	return m, nil
}
