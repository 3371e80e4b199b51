package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/tlsfiles"
)

// TestRunReplayToSecureKafka replays the demo file into a broker that
// speaks only TLS and requires SCRAM-SHA-256, the password read from a
// file; a wrong password stops the agent at start.
func TestRunReplayToSecureKafka(t *testing.T) {
	ca := certtest.NewCA(t, "kafka")
	cert, key := ca.Issue(t, "broker", "127.0.0.1").Files(t)
	srvTLS, err := tlsfiles.Server{CertFile: cert, KeyFile: key}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultGPUTopic}, Partitions: 1, TLS: srvTLS,
		Users: []devenv.KafkaUser{{Mechanism: kafkaconn.ScramSHA256, Name: "agent", Password: "agent-pass"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("agent-pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--source", "replay", "--file", filepath.Join(testdata, "replay-demo.jsonl"), "--interval", "1ms", "--http-addr", "",
		"--kafka-brokers", broker.Addr(), "--kafka-tls-ca", ca.CertFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "agent", "--kafka-sasl-password-file", pwFile,
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	if err := run(ctx, args, noEnv, io.Discard, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	conn, err := kafkaconn.New(kafkaconn.Config{TLS: tlsfiles.Client{CAFile: ca.CertFile}, SASLMechanism: kafkaconn.ScramSHA256,
		Username: "agent", Password: "agent-pass"}, tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker.Addr()}, Topic: ingest.DefaultGPUTopic, Partition: 0,
		Dialer: conn.Dialer(), MaxWait: 50 * time.Millisecond})
	defer r.Close()
	for i := range 300 {
		if _, err := r.ReadMessage(ctx); err != nil {
			t.Fatalf("read record %d of 300: %v", i, err)
		}
	}

	if err := os.WriteFile(pwFile, []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = run(ctx, args, noEnv, io.Discard, io.Discard)
	if !errors.Is(err, kafka.SASLAuthenticationFailed) {
		t.Fatalf("run with a wrong password: got %v, want %v", err, kafka.SASLAuthenticationFailed)
	}
}

func TestKafkaSecurityConfig(t *testing.T) {
	base := []string{"--source", "replay", "--file", "f", "--node", "n"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"PLAIN with the password in the environment", append(base, "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u"),
			map[string]string{"METER_KAFKA_SASL_PASSWORD": "p"}, nil},
		{"unknown mechanism, unreadable password file, cert without key",
			append(base, "--kafka-sasl-mechanism", "OAUTHBEARER", "--kafka-sasl-password-file", "/nonexistent", "--kafka-tls-cert", "c.pem"), nil,
			[]string{"--kafka-sasl-password-file:", `--kafka-sasl-mechanism "OAUTHBEARER"`, "--kafka-tls-cert and --kafka-tls-key go together"}},
		{"unknown mechanism", append(base, "--kafka-sasl-mechanism", "OAUTHBEARER", "--kafka-sasl-user", "u"),
			map[string]string{"METER_KAFKA_SASL_PASSWORD": "p"}, []string{`--kafka-sasl-mechanism "OAUTHBEARER"`}},
		{"--once needs no Kafka", append(base, "--once", "--kafka-sasl-mechanism", "OAUTHBEARER"), nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig(tt.args, envOf(tt.env), io.Discard)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("parseConfig() = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("parseConfig() = nil, want errors %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
