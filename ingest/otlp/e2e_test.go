package otlp_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"tokenmeter/ingest"
	"tokenmeter/ingest/otlp"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/query"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// pipeline is the whole path of an OTLP span: receiver → ingest.Publisher
// → Kafka (the in-process broker) → ingest consumer → ClickHouse.
type pipeline struct {
	receiver
	reads *query.Service
	reg   *prometheus.Registry // the publisher's and the consumer's metrics
}

func newPipeline(t testing.TB) pipeline {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEventsTopic, ingest.DefaultDLQTopic}})
	if err != nil {
		t.Fatal(err)
	}
	addr, db := chtest.NewDB(t)
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, logger)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pub, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: []string{broker.Addr()}, WriteTimeout: 5 * time.Second}, reg, logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	consumer, err := ingest.NewConsumer(ingest.ConsumerConfig{Brokers: []string{broker.Addr()}, BatchTimeout: 100 * time.Millisecond}, store, reg, logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { consumer.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		pub.Close()
		store.Close()
		broker.Close()
	})
	return pipeline{receiver: startReceiver(t, pub, otlp.Config{}), reads: query.New(store, query.Config{}), reg: reg}
}

// TestEndToEnd: spans exported by the SDK over OTLP/HTTP, then the same
// spans again over OTLP/gRPC (an exporter retrying through another
// collector), reach ClickHouse as events counted once, with exact tokens.
func TestEndToEnd(t *testing.T) {
	p := newPipeline(t)
	const n = 200
	spans := sdkSpans(t, n, acmeResource())
	want := query.UsageRow{TenantID: "acme", Model: "llama-3.1-8b", Requests: n}
	for i := range n {
		want.PromptTokens += int64(100 + i)
		want.CachedPromptTokens += int64(i)
		want.OutputTokens += int64(10 + i)
	}
	exps := exporters(t, p.receiver, "key-ingest")
	for _, name := range []string{"http protobuf gzip", "grpc"} {
		if err := exps[name].ExportSpans(context.Background(), spans); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Both copies are in Kafka (acknowledged); wait until the consumer has
	// handled them: the first stored, the second dropped as its duplicate.
	deadline := time.Now().Add(30 * time.Second)
	for handled(t, p.reg) < 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records inserted or dropped as duplicates after 30 s", handled(t, p.reg), 2*n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	q := query.UsageQuery{TenantID: "acme", Start: time.Now().Add(-time.Hour), End: time.Now().Add(time.Hour), GroupBy: []string{"tenant_id", "model"}}
	got, err := p.reads.Usage(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].Start = time.Time{}
	}
	if diff := cmp.Diff([]query.UsageRow{want}, got); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}

// inserted is meter_ingest_events_inserted_total.
func inserted(t testing.TB, reg *prometheus.Registry) int {
	return counterValue(t, reg, "meter_ingest_events_inserted_total")
}

// handled is the records the consumer stored or dropped as duplicates.
func handled(t testing.TB, reg *prometheus.Registry) int {
	return inserted(t, reg) + counterValue(t, reg, "meter_ingest_duplicates_dropped_total")
}

func counterValue(t testing.TB, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return int(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	return 0
}

// BenchmarkEndToEnd posts exports of 512 GenAI spans (protobuf, gzip) from
// concurrent clients to the OTLP/HTTP receiver and times them until
// ClickHouse holds every span: receiver → ingest.Publisher → Kafka (the
// in-process broker) → ingest consumer → ClickHouse, all on this machine.
func BenchmarkEndToEnd(b *testing.B) {
	p := newPipeline(b)
	bodies := make([][]byte, min(b.N, 64))
	for i := range bodies {
		bodies[i] = gzipped(b, encode(b, "application/x-protobuf", benchRequest(uint64(i*spansPerExport))))
	}
	url := "http://" + p.HTTPAddr() + otlp.TracesPath
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var next atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	cpu := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := bodies[int(next.Add(1))%len(bodies)]
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/x-protobuf")
			req.Header.Set("Content-Encoding", "gzip")
			req.Header.Set("Authorization", "Bearer key-ingest")
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(out) != 0 {
				b.Fatalf("got %d %q", resp.StatusCode, out)
			}
		}
	})
	want := b.N * spansPerExport
	for deadline := time.Now().Add(2 * time.Minute); inserted(b, p.reg) < want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d spans in ClickHouse after 2 minutes", inserted(b, p.reg), want)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(want)/b.Elapsed().Seconds(), "spans/s")
	// This process: clients, receiver, publisher, broker and consumer;
	// not the ClickHouse server.
	reportCPU(b, cpu, want)
}
