package engine_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"tokenmeter/ingest"
	"tokenmeter/ingest/engine"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// TestAgentToClickHouse runs the whole engine path: the agent scrapes two
// replicas (one restarts, one endpoint is down) three times, publishes to
// an in-process Kafka broker (twice: a re-send after a lost ack), and the
// meterd consumer stores each sample once in ClickHouse; a bad record goes
// to the DLQ.
func TestAgentToClickHouse(t *testing.T) {
	ctx := t.Context()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEngineTopic, ingest.DefaultDLQTopic}, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	addr, db := chtest.NewDB(t)
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	srv := &server{files: map[string][]string{
		"/a": {"vllm_v1_a.prom", "vllm_v1_b.prom", "vllm_v1_c_restarted.prom"},
		"/b": {"sglang.prom"},
	}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	targets := []engine.Target{
		{Deployment: "llama-8b", URL: hs.URL + "/a", Replica: "llama-8b-0"},
		{Deployment: "qwen-7b", URL: hs.URL + "/b", Replica: "qwen-7b-0"},
		{Deployment: "qwen-7b", URL: hs.URL + "/down", Replica: "qwen-7b-1"},
	}
	kpub, err := engine.NewKafkaPublisher([]string{broker.Addr()}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	defer kpub.Close()
	pub := &loseAckOnce{Publisher: kpub}
	t0 := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	clock := t0
	reg := prometheus.NewRegistry()
	agent, err := engine.NewAgent(engine.AgentConfig{Targets: targets, Scraper: engine.ScraperConfig{Interval: 10 * time.Second}},
		pub, reg, logger, func() time.Time { return clock })
	if err != nil {
		t.Fatal(err)
	}
	var sent int
	for i := range 3 {
		clock = t0.Add(time.Duration(i) * 10 * time.Second)
		n, err := agent.Collect(ctx)
		if err == nil {
			t.Fatal("the endpoint that is down was not reported")
		}
		sent += n
		err = agent.Flush(ctx)
		if i == 1 {
			// The second publish lost its ack: the samples stay buffered
			// and are sent again by the next flush.
			if err == nil || agent.Pending() != 2 {
				t.Fatalf("after a lost ack: err %v, %d pending, want an error and 2", err, agent.Pending())
			}
			err = agent.Flush(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := gauge(t, reg, "meter_engine_target_up", "qwen-7b-1"); got != 0 {
		t.Errorf("meter_engine_target_up of the down endpoint = %v, want 0", got)
	}
	if got := gauge(t, reg, "meter_engine_target_up", "qwen-7b-0"); got != 1 {
		t.Errorf("meter_engine_target_up of a live endpoint = %v, want 1", got)
	}
	// A record that is not a sample goes to the DLQ, not into the table.
	w := &kafka.Writer{Addr: kafka.TCP(broker.Addr()), Topic: ingest.DefaultEngineTopic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(`{"sample_id":"x","deployment":"d","replica":"r","engine":"llamacpp","interval_s":10}`)}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	c, err := ingest.NewEngineConsumer(ingest.ConsumerConfig{Brokers: []string{broker.Addr()}, BatchTimeout: 100 * time.Millisecond}, store, prometheus.NewRegistry(), logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	// Two replicas answered at each of the three scrape times (and the
	// second scrape was sent twice): 6 distinct samples, 9 sent.
	deadline := time.Now().Add(30 * time.Second)
	var rows int
	for time.Now().Before(deadline) {
		got, err := store.EngineSamplesOfHour(ctx, t0)
		if err != nil {
			t.Fatal(err)
		}
		if rows = len(got); rows == 6 {
			var preempt, queries uint64
			for _, r := range got {
				if r.Preemptions != nil {
					preempt += *r.Preemptions
				}
				if r.PrefixQueries != nil {
					queries += *r.PrefixQueries
				}
			}
			// Scrapes a→b: 2 preemptions and 6,400 queried tokens; b→c
			// (the engine restarted): 0 and 800.
			if preempt != 2 || queries != 6400+800 {
				t.Errorf("preemptions %d, prefix queries %d; want 2 and 7200", preempt, queries)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rows != 6 || sent != 6 {
		t.Fatalf("stored %d distinct samples (agent queued %d), want 6", rows, sent)
	}
	if pub.calls < 4 {
		t.Errorf("%d publishes, want 4 (one re-send)", pub.calls)
	}
	var dead int64
	for time.Now().Before(deadline) && dead == 0 {
		dead = 0
		for p := range 2 {
			conn, err := kafka.DialLeader(ctx, "tcp", broker.Addr(), ingest.DefaultDLQTopic, p)
			if err != nil {
				t.Fatal(err)
			}
			last, err := conn.ReadLastOffset()
			conn.Close()
			if err != nil {
				t.Fatal(err)
			}
			dead += last
		}
		time.Sleep(100 * time.Millisecond)
	}
	if dead != 1 {
		t.Errorf("%d records in the DLQ, want the 1 bad record", dead)
	}
}

// loseAckOnce publishes through Publisher, but reports the second publish
// as unacknowledged (its records did reach Kafka).
type loseAckOnce struct {
	engine.Publisher
	calls int
}

func (p *loseAckOnce) Publish(ctx context.Context, samples []*meterv1.EngineSample) ([]*meterv1.EngineSample, error) {
	p.calls++
	unacked, err := p.Publisher.Publish(ctx, samples)
	if p.calls == 2 && err == nil {
		return samples, errors.New("ack lost")
	}
	return unacked, err
}

// gauge reads the value of a gauge family's series whose labels include value.
func gauge(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s series with %q", name, value)
	return 0
}
