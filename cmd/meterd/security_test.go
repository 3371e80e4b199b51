package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/adapter/kafkaconn"
	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/internal/tlsfiles"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup"
)

// syncBuffer is a log that run writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestSecureDeployment runs meterd (every role) the way a production
// deployment does: HTTPS and gRPC over TLS, Kafka over TLS with SCRAM,
// ClickHouse over TLS with a user and password, the passwords from a file
// and the environment. Events published over HTTPS are counted exactly; a
// wrong Kafka or ClickHouse password stops meterd at start with an error
// that says so.
func TestSecureDeployment(t *testing.T) {
	ca := certtest.NewCA(t, "prod")
	dir := t.TempDir()
	chCert, chKey := ca.Issue(t, "clickhouse", "127.0.0.1").Files(t)
	ch := chtest.StartPrivateWith(t, devenv.ClickHouseConfig{
		Users: []devenv.ClickHouseUser{{Name: "meterd", Password: "ch-pass"}},
		TLS:   &devenv.ClickHouseTLS{CertFile: chCert, KeyFile: chKey},
	})
	brokerCert, brokerKey := ca.Issue(t, "kafka", "127.0.0.1").Files(t)
	brokerTLS, err := tlsfiles.Server{CertFile: brokerCert, KeyFile: brokerKey}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	broker, err := devenv.StartKafka(devenv.KafkaConfig{
		Addr: "127.0.0.1:0", TLS: brokerTLS,
		Topics:                []string{ingest.DefaultEventsTopic, ingest.DefaultDLQTopic, ingest.DefaultGPUTopic},
		SinglePartitionTopics: []string{rollup.DefaultLeaseTopic},
		Users:                 []devenv.KafkaUser{{Mechanism: kafkaconn.ScramSHA512, Name: "meterd", Password: "kafka-pass"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	apiCert, apiKey := ca.Issue(t, "meterd", "127.0.0.1").Files(t)
	chPassFile := filepath.Join(dir, "ch-password")
	if err := os.WriteFile(chPassFile, []byte("ch-pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{"ingest": "k-ingest", "finance": "k-finance"}
	var kf api.KeysFile
	for role, k := range keys {
		kf.Keys = append(kf.Keys, api.KeyEntry{Name: role, SHA256: api.HashKey(k), Role: api.Role(role)})
	}
	keysFile := filepath.Join(dir, "keys.json")
	b, _ := json.Marshal(kf)
	if err := os.WriteFile(keysFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := freeAddr(t)
	args := func(clickhouse string) []string {
		return []string{
			"--http-addr", httpAddr, "--grpc-addr", freeAddr(t), "--auth-keys", keysFile,
			"--tls-cert", apiCert, "--tls-key", apiKey,
			"--kafka-brokers", broker.Addr(), "--kafka-tls-ca", ca.CertFile,
			"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "meterd",
			"--clickhouse", clickhouse, "--clickhouse-database", "secure", "--clickhouse-user", "meterd",
			"--clickhouse-password-file", chPassFile, "--clickhouse-tls-ca", ca.CertFile,
			"--batch-timeout", "100ms", "--rollup-interval", "1s", "--log-level", "warn",
		}
	}
	env := func(kafkaPass string) func(string) string {
		return func(k string) string {
			if k == "METER_KAFKA_SASL_PASSWORD" {
				return kafkaPass
			}
			return ""
		}
	}

	t.Run("wrong Kafka password", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		err := run(ctx, args(ch.SecureAddr()), env("nope"), io.Discard, io.Discard)
		if !errors.Is(err, kafkaconn.ErrRefused) {
			t.Fatalf("got %v, want an error wrapping %v", err, kafkaconn.ErrRefused)
		}
	})
	t.Run("wrong ClickHouse password", func(t *testing.T) {
		wrong := filepath.Join(t.TempDir(), "pw")
		if err := os.WriteFile(wrong, []byte("nope"), 0o600); err != nil {
			t.Fatal(err)
		}
		a := args(ch.SecureAddr())
		for i := range a {
			if a[i] == chPassFile {
				a[i] = wrong
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		err := run(ctx, a, env("kafka-pass"), io.Discard, io.Discard)
		if err == nil || !chstore.Refused(err) {
			t.Fatalf("got %v, want ClickHouse's refusal", err)
		}
	})

	ctx, cancel := context.WithCancel(t.Context())
	log := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args(ch.SecureAddr()), env("kafka-pass"), io.Discard, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	do := func(method, path, key string, body []byte) (int, string) {
		req, _ := http.NewRequest(method, "https://"+httpAddr+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := do("GET", "/healthz/ready", "", nil)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("meterd not ready: %d %s\nlog:\n%s", code, body, log)
		}
		time.Sleep(200 * time.Millisecond)
	}

	now := time.Now().UTC()
	var req meterv1.PublishEventsRequest
	var wantOut int64
	for i := range 300 {
		req.Events = append(req.Events, &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("e-%d", i), TenantId: fmt.Sprintf("t%d", i%3), Model: "m",
			CompletedAt:  timestamppb.New(now.Add(-time.Duration(i) * time.Millisecond)),
			PromptTokens: proto.Int64(int64(i)), OutputTokens: proto.Int64(int64(i%50 + 1)),
			TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
		})
		wantOut += int64(i%50 + 1)
	}
	body, _ := protojson.Marshal(&req)
	if code, resp := do("POST", "/v1/events", keys["ingest"], body); code != 200 || !strings.Contains(resp, `"accepted":"300"`) {
		t.Fatalf("publish over HTTPS: %d %s", code, resp)
	}
	q := fmt.Sprintf("/v1/usage?start=%s&end=%s", now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339))
	want := []string{`"requests":"300"`, fmt.Sprintf(`"output_tokens":"%d"`, wantOut)}
	var got string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var code int
		code, got = do("GET", q, keys["finance"], nil)
		if code == 200 && strings.Contains(got, want[0]) && strings.Contains(got, want[1]) {
			return
		}
	}
	t.Fatalf("usage: got %s, want %q\nlog:\n%s", got, want, log)
}

func TestSecurityConfig(t *testing.T) {
	ca := certtest.NewCA(t, "cfg")
	cert, key := ca.Issue(t, "meterd", "127.0.0.1").Files(t)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	prod := []string{"--clickhouse", "h:9440", "--auth-keys", "keys.json"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"everything", append(prod, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca.CertFile,
			"--kafka-tls-ca", ca.CertFile, "--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-user", "u",
			"--clickhouse-user", "meterd", "--clickhouse-password-file", pwFile, "--clickhouse-tls"),
			map[string]string{"METER_KAFKA_SASL_PASSWORD": "p"}, nil},
		{"from the environment", prod, map[string]string{
			"METER_TLS_CERT": cert, "METER_TLS_KEY": key, "METER_KAFKA_SASL_MECHANISM": "PLAIN", "METER_KAFKA_SASL_USER": "u",
			"METER_KAFKA_SASL_PASSWORD_FILE": pwFile, "METER_CLICKHOUSE_PASSWORD": "p", "METER_CLICKHOUSE_TLS_CA": ca.CertFile,
		}, nil},
		{"every problem at once", append(prod, "--tls-cert", cert, "--tls-client-ca", missing,
			"--kafka-sasl-mechanism", "GSSAPI", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", pwFile,
			"--clickhouse-password-file", missing, "--clickhouse-tls-cert", cert),
			map[string]string{"METER_KAFKA_SASL_PASSWORD": "p"},
			[]string{"--tls-cert and --tls-key go together", "--tls-client-ca:", "--kafka-sasl-password-file and METER_KAFKA_SASL_PASSWORD are both set",
				"--clickhouse-password-file:", "--clickhouse-tls-cert and --clickhouse-tls-key go together"}},
		{"unknown mechanism, no password", append(prod, "--kafka-sasl-mechanism", "GSSAPI"), nil,
			[]string{`--kafka-sasl-mechanism "GSSAPI"`}},
		{"SCRAM without password", append(prod, "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u"), nil,
			[]string{"needs a password"}},
		{"empty password file", append(prod, "--clickhouse-password-file", os.DevNull), nil, []string{"the file is empty"}},
		{"dev broker and private ClickHouse take no credentials", []string{"--dev", "--data-dir", "d", "--kafka-tls",
			"--clickhouse-user", "u"}, nil, []string{"do not apply to --dev", "need --clickhouse"}},
		{"dev with TLS listeners", []string{"--dev", "--data-dir", "d", "--tls-cert", cert, "--tls-key", key}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, tt.args, tt.env, tt.wantErr)
		})
	}
}
