package ingest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/internal/tlsfiles"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestSecureKafka runs the publish path and the consumer (reader, DLQ
// writer) against a broker that speaks only TLS and requires SASL, with
// each mechanism; a publisher with a wrong password fails as unavailable.
func TestSecureKafka(t *testing.T) {
	ca := certtest.NewCA(t, "kafka")
	certFile, keyFile := ca.Issue(t, "broker", "127.0.0.1").Files(t)
	srvTLS, err := tlsfiles.Server{CertFile: certFile, KeyFile: keyFile}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	users := []devenv.KafkaUser{
		{Mechanism: kafkaconn.Plain, Name: "meterd-plain", Password: "p1"},
		{Mechanism: kafkaconn.ScramSHA256, Name: "meterd-256", Password: "p2"},
		{Mechanism: kafkaconn.ScramSHA512, Name: "meterd-512", Password: "p3"},
	}
	addr, db := chtest.NewDB(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return base.Add(time.Hour) }

	var all []*meterv1.InferenceEvent
	for n, u := range users {
		t.Run(u.Mechanism, func(t *testing.T) {
			broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{DefaultEventsTopic, DefaultDLQTopic},
				Partitions: 2, TLS: srvTLS, Users: users})
			if err != nil {
				t.Fatal(err)
			}
			defer broker.Close()
			brokers := []string{broker.Addr()}
			conn, err := kafkaconn.New(kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile},
				SASLMechanism: u.Mechanism, Username: u.Name, Password: u.Password}, tlsfiles.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.Check(t.Context(), brokers); err != nil {
				t.Fatalf("Check: %v", err)
			}

			pub, err := NewPublisher(PublisherConfig{Brokers: brokers, Kafka: conn, WriteTimeout: 5 * time.Second},
				prometheus.NewRegistry(), logger, now)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			var events []*meterv1.InferenceEvent
			for i := range 200 {
				events = append(events, testEvent(n*1000+i))
			}
			if got, _, err := pub.Publish(t.Context(), events); err != nil || got != len(events) {
				t.Fatalf("Publish: got %d accepted, error %v; want %d, nil", got, err, len(events))
			}
			// A bad record, for the dead-letter writer.
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: DefaultEventsTopic, Transport: conn.Transport(), BatchTimeout: time.Millisecond}
			if err := w.WriteMessages(t.Context(), kafka.Message{Value: []byte(`{"event_id":`)}); err != nil {
				t.Fatalf("write bad record: %v", err)
			}
			w.Close()

			c, err := NewConsumer(ConsumerConfig{Brokers: brokers, Kafka: conn, BatchTimeout: 100 * time.Millisecond},
				store, prometheus.NewRegistry(), logger, now)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			all = append(all, events...)
			waitTotals(t, store, expect(all), 30*time.Second)

			// The DLQ record went through the secure writer: read it back.
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: DefaultDLQTopic, Dialer: conn.Dialer(),
				GroupID: "dlq-check", StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			rctx, rcancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer rcancel()
			if _, err := r.FetchMessage(rctx); err != nil {
				t.Errorf("read DLQ: %v", err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("consumer: %v", err)
			}

			// The same user with a wrong password.
			bad, err := kafkaconn.New(kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile},
				SASLMechanism: u.Mechanism, Username: u.Name, Password: "wrong"}, tlsfiles.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer bad.Close()
			if err := bad.Check(t.Context(), brokers); !errors.Is(err, kafka.SASLAuthenticationFailed) {
				t.Errorf("Check with a wrong password: got %v, want %v", err, kafka.SASLAuthenticationFailed)
			}
			badPub, err := NewPublisher(PublisherConfig{Brokers: brokers, Kafka: bad, WriteTimeout: 2 * time.Second},
				prometheus.NewRegistry(), logger, now)
			if err != nil {
				t.Fatal(err)
			}
			defer badPub.Close()
			if _, _, err := badPub.Publish(t.Context(), events[:1]); !errors.Is(err, ErrUnavailable) {
				t.Errorf("Publish with a wrong password: got %v, want %v", err, ErrUnavailable)
			}
		})
	}
}
