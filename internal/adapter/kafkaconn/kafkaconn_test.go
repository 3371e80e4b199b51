package kafkaconn_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/tlsfiles"
)

// secureBroker starts a broker that speaks only TLS and has one SASL user
// per mechanism; the password of each is "pw-" + its name.
func secureBroker(t *testing.T, topics ...string) (*devenv.Kafka, *certtest.CA) {
	t.Helper()
	ca := certtest.NewCA(t, "kafka")
	certFile, keyFile := ca.Issue(t, "broker", "127.0.0.1", "localhost").Files(t)
	srvTLS, err := tlsfiles.Server{CertFile: certFile, KeyFile: keyFile}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := devenv.StartKafka(devenv.KafkaConfig{
		Addr: "127.0.0.1:0", Topics: topics, Partitions: 1, TLS: srvTLS,
		Users: []devenv.KafkaUser{
			{Mechanism: kafkaconn.Plain, Name: "plain", Password: "pw-plain"},
			{Mechanism: kafkaconn.ScramSHA256, Name: "scram256", Password: "pw-scram256"},
			{Mechanism: kafkaconn.ScramSHA512, Name: "scram512", Password: "pw-scram512"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, ca
}

// roundTrip writes a record with the Conn's Transport and reads it back in
// a consumer group with its Dialer.
func roundTrip(ctx context.Context, conn *kafkaconn.Conn, broker, topic, value string) error {
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, Transport: conn.Transport(), RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, MaxAttempts: 1}
	defer w.Close()
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(value)}); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, GroupID: "g-" + topic,
		Dialer: conn.Dialer(), StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	if string(m.Value) != value {
		return fmt.Errorf("got record %q, want %q", m.Value, value)
	}
	return r.CommitMessages(ctx, m)
}

func TestTLSAndSASL(t *testing.T) {
	topics := []string{"t-plain", "t-scram256", "t-scram512"}
	broker, ca := secureBroker(t, topics...)
	for i, mech := range kafkaconn.Mechanisms {
		user := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(mech, "SCRAM-"), "SHA-", "scram"))
		t.Run(mech, func(t *testing.T) {
			conn, err := kafkaconn.New(kafkaconn.Config{
				TLS:           tlsfiles.Client{CAFile: ca.CertFile},
				SASLMechanism: mech, Username: user, Password: "pw-" + user,
			}, tlsfiles.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if err := roundTrip(ctx, conn, broker.Addr(), topics[i], "hello "+mech); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRefused(t *testing.T) {
	broker, ca := secureBroker(t, "t")
	other := certtest.NewCA(t, "other")
	tests := []struct {
		name        string
		cfg         kafkaconn.Config
		wantRefused bool // else any error
	}{
		{"wrong password", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}, SASLMechanism: "scram-sha-512", Username: "scram512", Password: "nope"}, true},
		{"wrong PLAIN password", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}, SASLMechanism: "PLAIN", Username: "plain", Password: "nope"}, true},
		{"unknown user", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}, SASLMechanism: "SCRAM-SHA-256", Username: "mallory", Password: "pw"}, true},
		{"mechanism the user lacks", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}, SASLMechanism: "SCRAM-SHA-256", Username: "plain", Password: "pw-plain"}, true},
		{"broker certificate of an unknown CA", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: other.CertFile}, SASLMechanism: "PLAIN", Username: "plain", Password: "pw-plain"}, true},
		{"broker certificate for another name", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile, ServerName: "kafka.example"}, SASLMechanism: "PLAIN", Username: "plain", Password: "pw-plain"}, true},
		{"no SASL", kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}}, false},
		{"no TLS", kafkaconn.Config{SASLMechanism: "PLAIN", Username: "plain", Password: "pw-plain"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := kafkaconn.New(tt.cfg, tlsfiles.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err = conn.Check(ctx, []string{broker.Addr()})
			if err == nil {
				t.Fatal("Check: got no error")
			}
			t.Logf("Check: %v", err)
			if tt.wantRefused && !errors.Is(err, kafkaconn.ErrRefused) {
				t.Errorf("Check: got %v, want it to wrap ErrRefused", err)
			}
			if tt.wantRefused && tt.cfg.Password == "nope" && !errors.Is(err, kafka.SASLAuthenticationFailed) {
				t.Errorf("Check: got %v, want it to wrap %v", err, kafka.SASLAuthenticationFailed)
			}
			if err := roundTrip(ctx, conn, broker.Addr(), "t", "x"); err == nil {
				t.Error("write and read: got no error")
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  kafkaconn.Config
		want []string // substrings of the error; none: valid
	}{
		{"zero", kafkaconn.Config{}, nil},
		{"scram", kafkaconn.Config{SASLMechanism: "scram-sha-256", Username: "u", Password: "p"}, nil},
		{"unknown mechanism", kafkaconn.Config{SASLMechanism: "GSSAPI", Username: "u", Password: "p"}, []string{`--kafka-sasl-mechanism "GSSAPI"`}},
		{"no user, no password", kafkaconn.Config{SASLMechanism: "PLAIN"}, []string{"needs --kafka-sasl-user", "needs a password"}},
		{"user without mechanism", kafkaconn.Config{Username: "u"}, []string{"without --kafka-sasl-mechanism"}},
		{"TLS cert without key", kafkaconn.Config{TLS: tlsfiles.Client{CertFile: "c.pem"}}, []string{"--kafka-tls-cert and --kafka-tls-key go together"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

// TestClientCertificate connects to a broker that requires a client
// certificate (mutual TLS, no SASL).
func TestClientCertificate(t *testing.T) {
	ca := certtest.NewCA(t, "kafka")
	certFile, keyFile := ca.Issue(t, "broker", "127.0.0.1").Files(t)
	srvTLS, err := tlsfiles.Server{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.CertFile}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{"t"}, Partitions: 1, TLS: srvTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	clientCert, clientKey := ca.Issue(t, "meterd").Files(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	with, err := kafkaconn.New(kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile, CertFile: clientCert, KeyFile: clientKey}}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer with.Close()
	if err := roundTrip(ctx, with, broker.Addr(), "t", "signed"); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	without, err := kafkaconn.New(kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer without.Close()
	if err := without.Check(ctx, []string{broker.Addr()}); !errors.Is(err, kafkaconn.ErrRefused) {
		t.Errorf("without a client certificate: got %v, want an error wrapping ErrRefused", err)
	}
}
