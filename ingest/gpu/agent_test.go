package gpu

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// scriptedSource returns, per call, fresh copies of the next scripted
// readings; past the script it repeats the last one.
type scriptedSource struct {
	mu    sync.Mutex
	calls int
	steps [][]*meterv1.GpuSample
	err   error
}

func (s *scriptedSource) Name() string { return "test" }
func (s *scriptedSource) Close() error { return nil }
func (s *scriptedSource) Sample(context.Context) ([]*meterv1.GpuSample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	step := s.steps[min(s.calls, len(s.steps)-1)]
	s.calls++
	out := make([]*meterv1.GpuSample, len(step))
	for i, m := range step {
		out[i] = proto.Clone(m).(*meterv1.GpuSample)
	}
	return out, nil
}

// memPublisher keeps what it is given; while down it acknowledges nothing.
type memPublisher struct {
	mu   sync.Mutex
	down bool
	got  []*meterv1.GpuSample
}

func (p *memPublisher) Publish(_ context.Context, samples []*meterv1.GpuSample) ([]*meterv1.GpuSample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return samples, errors.New("not acknowledged")
	}
	p.got = append(p.got, samples...)
	return nil, nil
}

// clock is an injectable now.
type clock struct{ t atomic.Pointer[time.Time] }

func newClock(t time.Time) *clock { c := &clock{}; c.set(t); return c }
func (c *clock) set(t time.Time)  { c.t.Store(&t) }
func (c *clock) now() time.Time   { return *c.t.Load() }

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func newTestAgent(t *testing.T, cfg AgentConfig, src Source, pub Publisher, now func() time.Time) (*Agent, *prometheus.Registry) {
	t.Helper()
	attr, err := NewAttributor(AttributionConfig{
		Map:      DeploymentMap{Nodes: map[string]map[string]string{"node-1": {"1": "mistral-7b-batch"}}},
		PodRegex: regexp.MustCompile(DefaultPodDeploymentRegex),
		Region:   "us-east-1", Pool: "reserved",
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a, err := NewAgent(cfg, src, attr, pub, reg, discard(), now)
	if err != nil {
		t.Fatal(err)
	}
	return a, reg
}

func TestAgentStamps(t *testing.T) {
	gpu0 := &meterv1.GpuSample{GpuUuid: "GPU-0", GpuType: "H100-SXM-80GB", Pod: "llama-70b-prod-7c9f8d6b5-x2k4q", Utilization: 0.5, PowerWatts: 500}
	gpu1 := &meterv1.GpuSample{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "H100-SXM-80GB", Utilization: 0.25, PowerWatts: 300, EnergyJoules: 3300}
	src := &scriptedSource{steps: [][]*meterv1.GpuSample{{gpu0, gpu1}}}
	pub := &memPublisher{}
	clk := newClock(t0)
	a, reg := newTestAgent(t, AgentConfig{Interval: 10 * time.Second, Node: "node-1"}, src, pub, clk.now)
	ctx := context.Background()

	// Ticks at 0 s, 11 s, then after a 79 s gap (source or agent away).
	for _, at := range []time.Duration{0, 11 * time.Second, 90 * time.Second} {
		clk.set(t0.Add(at).Add(700 * time.Microsecond)) // sub-millisecond part is dropped
		if _, err := a.Collect(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		UUID       string
		At         time.Duration
		Interval   float64
		Energy     float64
		Deployment string
	}
	var got []row
	for _, m := range pub.got {
		at := m.SampledAt.AsTime()
		got = append(got, row{m.GpuUuid, at.Sub(t0), m.IntervalS, m.EnergyJoules, m.Deployment})
		if m.SampleId != SampleID("node-1", m.GpuUuid, 0, at) || m.Source != "test" || m.Node != "node-1" ||
			m.Region != "us-east-1" || m.Pool != "reserved" {
			t.Errorf("sample %s at %v: id %q source %q node %q region %q pool %q", m.GpuUuid, at, m.SampleId, m.Source, m.Node, m.Region, m.Pool)
		}
	}
	want := []row{
		// First sample: the configured interval; GPU-0 had no energy
		// delta, so power x interval.
		{"GPU-0", 0, 10, 5000, "llama-70b-prod"},
		{"GPU-1", 0, 10, 3300, "mistral-7b-batch"},
		{"GPU-0", 11 * time.Second, 11, 5500, "llama-70b-prod"},
		{"GPU-1", 11 * time.Second, 11, 3300, "mistral-7b-batch"},
		// After a gap longer than MaxGap (30 s): the interval, not the gap,
		// and the counter delta (over 79 s) cut to it.
		{"GPU-0", 90 * time.Second, 10, 5000, "llama-70b-prod"},
		{"GPU-1", 90 * time.Second, 10, 3300 * 10 / 79.0, "mistral-7b-batch"},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("stamped samples (-want +got):\n%s", diff)
	}
	ids := map[string]bool{}
	for _, m := range pub.got {
		if ids[m.SampleId] {
			t.Errorf("duplicate sample id %s", m.SampleId)
		}
		ids[m.SampleId] = true
	}
	if n := valueOf(a.m.read); n != 6 {
		t.Errorf("meter_gpu_agent_samples_total = %v, want 6", n)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
	}
	for _, n := range []string{"meter_gpu_agent_samples_total", "meter_gpu_agent_samples_published_total",
		"meter_gpu_agent_samples_dropped_total", "meter_gpu_agent_buffered_samples"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
}

func TestAgentKeepsReplayTimes(t *testing.T) {
	at := timestamppb.New(t0.Add(-time.Hour))
	src := &scriptedSource{steps: [][]*meterv1.GpuSample{{
		{GpuUuid: "GPU-0", SampledAt: at, IntervalS: 15, PowerWatts: 100, Deployment: "x", Node: "replayed-node", SampleId: "given"},
		{GpuUuid: "GPU-1", SampledAt: at, PowerWatts: 100}, // no interval: the configured one
	}}}
	pub := &memPublisher{}
	a, _ := newTestAgent(t, AgentConfig{Interval: 10 * time.Second, Node: "node-1"}, src, pub, newClock(t0).now)
	if _, err := a.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []*meterv1.GpuSample{
		{GpuUuid: "GPU-0", SampledAt: at, IntervalS: 15, PowerWatts: 100, Deployment: "x", Node: "replayed-node", SampleId: "given",
			Source: "test", Region: "us-east-1", Pool: "reserved"},
		{GpuUuid: "GPU-1", SampledAt: at, IntervalS: 10, PowerWatts: 100, Node: "node-1", Source: "test", Region: "us-east-1", Pool: "reserved",
			SampleId: SampleID("node-1", "GPU-1", 0, at.AsTime())},
	}
	if diff := cmp.Diff(want, pub.got, protocmp.Transform()); diff != "" {
		t.Errorf("replayed samples keep their own times and energy (-want +got):\n%s", diff)
	}
}

func TestAgentDropsInvalidSamples(t *testing.T) {
	src := &scriptedSource{steps: [][]*meterv1.GpuSample{{
		{GpuUuid: "GPU-0"},
		{GpuUuid: ""},                         // no UUID
		{GpuUuid: "GPU-2", MigFraction: 2},    // out of range
		{GpuUuid: "GPU-3", Pod: "bad\xffpod"}, // not UTF-8: cannot be encoded
	}}}
	pub := &memPublisher{}
	a, _ := newTestAgent(t, AgentConfig{Node: "node-1"}, src, pub, newClock(t0).now)
	n, err := a.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || a.Pending() != 1 {
		t.Errorf("queued %d (pending %d), want 1", n, a.Pending())
	}
	if got := valueOf(a.m.dropped.WithLabelValues("invalid")); got != 3 {
		t.Errorf("invalid drops = %v, want 3", got)
	}
}

func TestAgentSourceErrorIsReturnedAndCounted(t *testing.T) {
	boom := errors.New("exporter down")
	a, _ := newTestAgent(t, AgentConfig{}, &scriptedSource{err: boom}, &memPublisher{}, newClock(t0).now)
	if _, err := a.Collect(context.Background()); !errors.Is(err, boom) {
		t.Errorf("got %v, want the source error", err)
	}
	if a.Healthy() {
		t.Error("healthy after a failed reading")
	}
	if got := valueOf(a.m.sourceErrors); got != 1 {
		t.Errorf("source errors = %v, want 1", got)
	}
}

// TestAgentKafkaOutage publishes through kafka-go to an in-process broker
// that refuses produce requests for three ticks: the samples stay buffered
// (the oldest dropped and counted beyond the bound), then go out once the
// broker is back, each exactly once in the topic, keyed by GPU UUID.
func TestAgentKafkaOutage(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, ingest.DefaultGPUTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	var refuse atomic.Bool
	refuse.Store(true)
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if refuse.Load() {
			return nil, errors.New("injected: broker refuses produce"), true
		}
		return nil, nil, false
	})
	pub, err := NewKafkaPublisher(KafkaConfig{Brokers: cluster.ListenAddrs(), WriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	src := &scriptedSource{steps: [][]*meterv1.GpuSample{{{GpuUuid: "GPU-0"}, {GpuUuid: "GPU-1", GpuIndex: 1}}}}
	clk := newClock(t0)
	a, _ := newTestAgent(t, AgentConfig{Interval: 10 * time.Second, Node: "node-1", BufferSamples: 5}, src, pub, clk.now)
	ctx := context.Background()

	var stamped []string
	for tick := range 3 {
		clk.set(t0.Add(time.Duration(tick) * 10 * time.Second))
		if _, err := a.Collect(ctx); err != nil {
			t.Fatal(err)
		}
		for _, uuid := range []string{"GPU-0", "GPU-1"} {
			stamped = append(stamped, SampleID("node-1", uuid, 0, clk.now()))
		}
		if err := a.Flush(ctx); err == nil {
			t.Fatalf("tick %d: flush succeeded while the broker refuses", tick)
		}
	}
	if a.Pending() != 5 {
		t.Errorf("pending %d, want 5 (the bound)", a.Pending())
	}
	if got := valueOf(a.m.dropped.WithLabelValues("buffer_full")); got != 1 {
		t.Errorf("buffer_full drops = %v, want 1", got)
	}
	if a.Healthy() {
		t.Error("healthy while Kafka refuses")
	}

	refuse.Store(false)
	if err := a.Flush(ctx); err != nil {
		t.Fatalf("flush after recovery: %v", err)
	}
	if a.Pending() != 0 || !a.Healthy() {
		t.Errorf("pending %d healthy %v after recovery", a.Pending(), a.Healthy())
	}
	msgs := readTopic(t, cluster.ListenAddrs()[0], ingest.DefaultGPUTopic, 2, 5)
	var ids []string
	for _, msg := range msgs {
		m := &meterv1.GpuSample{}
		if err := proto.Unmarshal(msg.Value, m); err != nil {
			t.Fatal(err)
		}
		if string(msg.Key) != m.GpuUuid {
			t.Errorf("key %q, want the GPU UUID %q", msg.Key, m.GpuUuid)
		}
		if len(msg.Headers) != 1 || string(msg.Headers[0].Value) != ingest.ContentTypeProtobuf {
			t.Errorf("headers %v", msg.Headers)
		}
		ids = append(ids, m.SampleId)
	}
	// The oldest sample (GPU-0 at tick 0) was dropped; the rest arrived once.
	if diff := cmp.Diff(stamped[1:], ids, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("sample ids in the topic (-want +got):\n%s", diff)
	}
}

// readTopic reads want records from every partition of topic.
func readTopic(t *testing.T, addr, topic string, partitions, want int) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out []kafka.Message
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: p, MaxWait: 50 * time.Millisecond})
		for i := int64(0); i < last; i++ {
			msg, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatalf("partition %d: %v", p, err)
			}
			out = append(out, msg)
		}
		r.Close()
	}
	if len(out) != want {
		t.Fatalf("read %d records from %s, want %d", len(out), topic, want)
	}
	return out
}

// TestAgentRunFlushesOnStop runs the loop until the context ends while the
// publisher is down, then lets the last flush through.
func TestAgentRunFlushesOnStop(t *testing.T) {
	src := &scriptedSource{steps: [][]*meterv1.GpuSample{{{GpuUuid: "GPU-0"}}}}
	pub := &memPublisher{down: true}
	a, _ := newTestAgent(t, AgentConfig{Interval: 5 * time.Millisecond, Node: "n"}, src, pub, time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for a.Pending() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	pub.mu.Lock()
	pub.down = false
	pub.mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if a.Pending() != 0 {
		t.Errorf("pending %d after Run returned", a.Pending())
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.got) < 3 {
		t.Errorf("published %d samples, want at least 3", len(pub.got))
	}
}

func TestAgentRunReportsUnpublishedAtStop(t *testing.T) {
	src := &scriptedSource{steps: [][]*meterv1.GpuSample{{{GpuUuid: "GPU-0"}}}}
	a, _ := newTestAgent(t, AgentConfig{Interval: time.Hour, Node: "n", ShutdownTimeout: 50 * time.Millisecond}, src, &memPublisher{down: true}, time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	for a.Pending() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("Run returned nil with a sample unpublished")
	}
}

// valueOf reads a counter or gauge.
func valueOf(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if c := d.GetCounter(); c != nil {
		return c.GetValue()
	}
	return d.GetGauge().GetValue()
}
