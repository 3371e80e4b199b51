package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/kafkaconn"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// AgentConfig configures an Agent.
type AgentConfig struct {
	// Targets are the engine endpoints scraped every Scraper.Interval.
	Targets []Target
	// Discover, when set, lists more targets before each scrape (a
	// PodDiscovery's Targets). When it fails, the targets it listed last
	// are scraped and the failure reported.
	Discover func(ctx context.Context) ([]Target, error)
	Scraper  ScraperConfig
	// BufferSamples bounds the samples kept while Kafka does not
	// acknowledge; beyond it the oldest are dropped and counted. Default
	// 50,000 (about 80 minutes of 100 replicas at 10s).
	BufferSamples int
	// ShutdownTimeout bounds the last flush when the agent stops. Default 10s.
	ShutdownTimeout time.Duration
}

// Publisher writes samples. It returns the samples that were not
// acknowledged, which the Agent keeps and offers again; err says why.
type Publisher interface {
	Publish(ctx context.Context, samples []*meterv1.EngineSample) (unacked []*meterv1.EngineSample, err error)
}

// Agent scrapes the engine targets every interval, checks each sample
// against ingest's rules and publishes it. Samples that the publisher did
// not get acknowledged stay in a bounded buffer and are offered again
// after the next scrape; a re-sent sample keeps its sample_id, so the
// consumer deduplicates it. A target that does not answer is reported
// (log, meter_engine_target_up 0, meter_engine_scrape_errors_total) and
// gets no sample: nothing is invented for it.
type Agent struct {
	cfg     AgentConfig
	scraper *Scraper
	pub     Publisher
	logger  *slog.Logger
	now     func() time.Time
	limits  ingest.Limits

	pending    []*meterv1.EngineSample // oldest first; used by Run's goroutine only
	discovered []Target                // the last list of Discover
	upSeries   map[[2]string]bool      // the meter_engine_target_up series set
	healthy    atomic.Bool

	scraped, published, scrapeErrors prometheus.Counter
	dropped                          *prometheus.CounterVec
	up                               *prometheus.GaugeVec
	buffered                         prometheus.Gauge
	scrapeSeconds                    prometheus.Histogram
}

// NewAgent creates an Agent and registers its metrics on reg.
func NewAgent(cfg AgentConfig, pub Publisher, reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) (*Agent, error) {
	if (len(cfg.Targets) == 0 && cfg.Discover == nil) || pub == nil {
		return nil, errors.New("engine agent: targets (or their discovery) and a publisher are required")
	}
	if cfg.BufferSamples <= 0 {
		cfg.BufferSamples = 50_000
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	a := &Agent{
		cfg: cfg, scraper: NewScraper(cfg.Scraper), pub: pub, logger: logger, now: now, limits: ingest.DefaultLimits(),
		scraped:      prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_engine_agent_samples_total", Help: "Engine samples made from successful scrapes."}),
		published:    prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_engine_agent_samples_published_total", Help: "Engine samples acknowledged by Kafka (re-sends included)."}),
		scrapeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meter_engine_scrape_errors_total", Help: "Failed scrapes of engine endpoints."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meter_engine_agent_samples_dropped_total",
			Help: "Engine samples dropped, by reason: invalid, or buffer_full while Kafka did not acknowledge."}, []string{"reason"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meter_engine_target_up",
			Help: "1 when the last scrape of the engine endpoint succeeded, else 0."}, []string{"deployment", "replica"}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meter_engine_agent_buffered_samples", Help: "Engine samples waiting for a Kafka acknowledgement."}),
		scrapeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "meter_engine_scrape_round_seconds",
			Help: "Time to scrape every engine endpoint once.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}),
	}
	a.cfg.Scraper = a.scraper.cfg
	a.healthy.Store(true)
	for _, c := range []prometheus.Collector{a.scraped, a.published, a.scrapeErrors, a.dropped, a.up, a.buffered, a.scrapeSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register engine agent metrics: %w", err)
		}
	}
	return a, nil
}

// Collect scrapes every target once and queues the valid samples. It
// returns how many it queued and the failed targets, joined.
func (a *Agent) Collect(ctx context.Context) (int, error) {
	var errs []error
	if a.cfg.Discover != nil {
		found, err := a.cfg.Discover(ctx)
		if err != nil {
			errs = append(errs, err)
		} else {
			a.discovered = found
		}
	}
	targets := a.targets()
	a.scraper.Forget(targets)
	a.forgetUp(targets)
	start := time.Now()
	samples, failed := a.scraper.Scrape(ctx, targets, a.now())
	a.scrapeSeconds.Observe(time.Since(start).Seconds())
	for _, f := range failed {
		a.up.WithLabelValues(f.Target.Deployment, f.Target.Replica).Set(0)
		a.scrapeErrors.Inc()
		errs = append(errs, f)
	}
	now := a.now()
	n := 0
	for _, s := range samples {
		a.up.WithLabelValues(s.GetDeployment(), s.GetReplica()).Set(1)
		if err := a.limits.ValidateEngineSample(s, now); err != nil {
			a.dropped.WithLabelValues("invalid").Inc()
			a.logger.Warn("dropped an invalid engine sample", "deployment", s.GetDeployment(), "replica", s.GetReplica(), "error", err)
			continue
		}
		a.pending = append(a.pending, s)
		n++
	}
	a.scraped.Add(float64(n))
	a.trim()
	return n, errors.Join(errs...)
}

// forgetUp deletes the meter_engine_target_up series of the replicas no
// longer scraped (pods gone), which would otherwise stay at their last
// value for ever.
func (a *Agent) forgetUp(targets []Target) {
	keep := map[[2]string]bool{}
	for _, t := range targets {
		t = t.withDefaults()
		keep[[2]string{t.Deployment, t.Replica}] = true
	}
	for k := range a.upSeries {
		if !keep[k] {
			a.up.DeleteLabelValues(k[0], k[1])
			delete(a.upSeries, k)
		}
	}
	if a.upSeries == nil {
		a.upSeries = map[[2]string]bool{}
	}
	for k := range keep {
		a.upSeries[k] = true
	}
}

// targets are the static targets and the discovered ones, a replica
// listed in both once.
func (a *Agent) targets() []Target {
	out := slices.Clone(a.cfg.Targets)
	seen := map[string]bool{}
	for _, t := range out {
		t = t.withDefaults()
		seen[t.Deployment+"\x00"+t.Replica] = true
	}
	for _, t := range a.discovered {
		if !seen[t.Deployment+"\x00"+t.Replica] {
			out = append(out, t)
		}
	}
	return out
}

func (a *Agent) trim() {
	if over := len(a.pending) - a.cfg.BufferSamples; over > 0 {
		clear(a.pending[:over])
		a.pending = a.pending[over:]
		a.dropped.WithLabelValues("buffer_full").Add(float64(over))
		a.logger.Warn("engine sample buffer full while Kafka does not acknowledge; dropped the oldest samples", "dropped", over, "limit", a.cfg.BufferSamples)
	}
	a.buffered.Set(float64(len(a.pending)))
}

// Pending is the number of samples waiting to be published.
func (a *Agent) Pending() int { return len(a.pending) }

// Flush publishes the buffer; unacknowledged samples stay buffered.
func (a *Agent) Flush(ctx context.Context) error {
	if len(a.pending) == 0 {
		a.healthy.Store(true)
		return nil
	}
	batch := a.pending
	unacked, err := a.pub.Publish(ctx, batch)
	a.published.Add(float64(len(batch) - len(unacked)))
	a.pending = append([]*meterv1.EngineSample(nil), unacked...)
	a.trim()
	a.healthy.Store(err == nil)
	if err != nil {
		return fmt.Errorf("publish %d engine samples, %d kept for retry: %w", len(batch), len(unacked), err)
	}
	return nil
}

// Run scrapes every interval and publishes after each scrape until ctx is
// done, then flushes once more, bounded by ShutdownTimeout. It returns an
// error only if samples were left unpublished then.
func (a *Agent) Run(ctx context.Context) error {
	t := time.NewTicker(a.cfg.Scraper.Interval)
	defer t.Stop()
	for {
		if _, err := a.Collect(ctx); err != nil && ctx.Err() == nil {
			a.logger.Warn("scrape engine endpoints", "error", err)
		}
		if err := a.Flush(ctx); err != nil && ctx.Err() == nil {
			a.logger.Warn("publish engine samples; will retry after the next scrape", "pending", a.Pending(), "error", err)
		}
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
			defer cancel()
			if err := a.Flush(fctx); err != nil {
				return fmt.Errorf("stop engine agent with %d samples unpublished: %w", a.Pending(), err)
			}
			return nil
		case <-t.C:
		}
	}
}

// KafkaPublisher writes engine samples to the engine topic,
// protobuf-encoded, keyed by deployment and replica (a replica's samples
// stay in order on one partition), with acks=all.
type KafkaPublisher struct {
	topic  string
	writer *kafka.Writer
}

var _ Publisher = (*KafkaPublisher)(nil)

// NewKafkaPublisher creates a KafkaPublisher of topic (default
// ingest.DefaultEngineTopic, which must exist); it connects on first use.
func NewKafkaPublisher(brokers []string, conn *kafkaconn.Conn, topic string) (*KafkaPublisher, error) {
	if len(brokers) == 0 {
		return nil, errors.New("engine publisher: no Kafka brokers")
	}
	if topic == "" {
		topic = ingest.DefaultEngineTopic
	}
	return &KafkaPublisher{topic: topic, writer: &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Transport: conn.Transport(), Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 5_000, BatchBytes: 16 << 20, BatchTimeout: 5 * time.Millisecond,
		WriteTimeout: 10 * time.Second, MaxAttempts: 3, Compression: kafka.Lz4,
	}}, nil
}

// Publish implements Publisher.
func (p *KafkaPublisher) Publish(ctx context.Context, samples []*meterv1.EngineSample) ([]*meterv1.EngineSample, error) {
	msgs := make([]kafka.Message, 0, len(samples))
	for _, s := range samples {
		value, err := proto.Marshal(s)
		if err != nil { // checked by ValidateEngineSample: not retried
			continue
		}
		msgs = append(msgs, kafka.Message{
			Key: []byte(s.GetDeployment() + "/" + s.GetReplica()), Value: value,
			Headers: []kafka.Header{{Key: ingest.HeaderContentType, Value: []byte(ingest.ContentTypeProtobuf)}},
		})
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.writer.WriteMessages(wctx, msgs...); err != nil {
		// Re-sending the acknowledged ones too is harmless: sample_id dedups.
		return samples, fmt.Errorf("write %d engine samples to %s: %w", len(samples), p.topic, err)
	}
	return nil, nil
}

// Close flushes and closes the Kafka writer.
func (p *KafkaPublisher) Close() error { return p.writer.Close() }

// Healthy reports whether the last publish succeeded.
func (a *Agent) Healthy() bool { return a.healthy.Load() }
