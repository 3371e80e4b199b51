package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"dev ok", []string{"--dev", "--data-dir", "/tmp/x"}, nil, nil},
		{"dev without dir", []string{"--dev"}, nil, []string{"--dev needs --data-dir"}},
		{"prod needs clickhouse and keys", nil, nil, []string{"--clickhouse is required", "--auth-keys is required"}},
		{"ingest only needs no keys", []string{"--role", "ingest", "--clickhouse", "h:9000"}, nil, nil},
		{"env fallback", []string{"--role", "ingest"}, map[string]string{"METER_CLICKHOUSE": "h:9000"}, nil},
		{"flag beats env", []string{"--batch-size", "10", "--dev", "--data-dir", "d"}, map[string]string{"METER_BATCH_SIZE": "x"}, nil},
		{"bad env", []string{"--dev", "--data-dir", "d"}, map[string]string{"METER_BATCH_SIZE": "x"}, []string{"METER_BATCH_SIZE"}},
		{"unknown role and bad values", []string{"--role", "ingest,billing", "--clickhouse", "h:9000", "--batch-size", "0", "--log-level", "loud"},
			nil, []string{`unknown role "billing"`, "--batch-size 0", "--log-level"}},
		{"minute retention", []string{"--dev", "--data-dir", "d", "--minute-retention", "720h"}, nil, nil},
		{"minute retention for ever", []string{"--dev", "--data-dir", "d", "--minute-retention", "0"}, nil, nil},
		{"minute retention under a day", []string{"--dev", "--data-dir", "d", "--minute-retention", "12h"}, nil,
			[]string{"--minute-retention 12h0m0s: must be 0 (keep for ever) or at least 24h"}},
		{"minute retention from the environment", []string{"--dev", "--data-dir", "d"}, map[string]string{"METER_MINUTE_RETENTION": "-1h"},
			[]string{"--minute-retention -1h0m0s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, tt.args, tt.env, tt.wantErr)
		})
	}
}

// checkParse parses args with env and checks that it succeeds, or, with
// wantErr, that the error mentions each of them.
func checkParse(t *testing.T, args []string, env map[string]string, wantErr []string) {
	t.Helper()
	_, err := parseConfig(args, func(k string) string { return env[k] }, io.Discard)
	if len(wantErr) == 0 {
		if err != nil {
			t.Fatalf("parseConfig() = %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("parseConfig() = nil, want errors %q", wantErr)
	}
	for _, w := range wantErr {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// meterd runs the real binary in dev mode.
type meterd struct {
	bin, dir, http, grpc, kafka string
	cmd                         *exec.Cmd
	log                         *bytes.Buffer
}

func (m *meterd) start(t *testing.T) {
	t.Helper()
	m.log = &bytes.Buffer{}
	m.cmd = exec.Command(m.bin, "--dev", "--data-dir", m.dir, "--http-addr", m.http, "--grpc-addr", m.grpc,
		"--kafka-brokers", m.kafka, "--batch-timeout", "100ms", "--rollup-interval", "1s", "--log-level", "warn")
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + m.http + "/healthz/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("meterd not ready:\n%s", m.log)
}

func (m *meterd) key(t *testing.T, name string) string {
	b, err := os.ReadFile(filepath.Join(m.dir, "keys", name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (m *meterd) do(method, path, key string, body []byte) (int, []byte, error) {
	req, _ := http.NewRequest(method, "http://"+m.http+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// TestDevRestartExact publishes through a real meterd --dev, kills it with
// SIGKILL mid-stream, restarts it on the same data dir, re-sends what was not
// acknowledged (as a client would) and checks exact totals; then stops it
// gracefully and checks again after another restart.
func TestDevRestartExact(t *testing.T) {
	m := startDev(t)
	key := m.key(t, "ingest")

	now := time.Now().UTC()
	const batches, perBatch = 40, 250
	var wantReq, wantOut int64
	batch := func(b int) []byte {
		var req meterv1.PublishEventsRequest
		for i := range perBatch {
			n := b*perBatch + i
			req.Events = append(req.Events, &meterv1.InferenceEvent{
				EventId: fmt.Sprintf("e-%d", n), TenantId: fmt.Sprintf("t%d", n%5), Model: "m",
				CompletedAt:  timestamppb.New(now.Add(-time.Duration(n) * time.Millisecond)),
				PromptTokens: proto.Int64(int64(n % 700)), OutputTokens: proto.Int64(int64(n%90 + 1)),
				TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
			})
		}
		body, _ := protojson.Marshal(&req)
		return body
	}
	for n := range batches * perBatch {
		wantReq++
		wantOut += int64(n%90 + 1)
	}
	pending := []int{}
	for b := range batches {
		if b == batches/2 {
			// Crash: no graceful shutdown, no flush, no commit.
			m.cmd.Process.Kill()
			m.cmd.Wait()
			m.start(t)
		}
		code, body, err := m.do("POST", "/v1/events", key, batch(b))
		if err != nil || code != 200 {
			pending = append(pending, b) // not acknowledged: the client retries later
			continue
		}
		if !strings.Contains(string(body), fmt.Sprintf(`"accepted":"%d"`, perBatch)) {
			t.Fatalf("batch %d: %s", b, body)
		}
		// Re-send some acknowledged batches too: client retries after a lost response.
		if b%7 == 0 {
			pending = append(pending, b)
		}
	}
	for _, b := range pending {
		if code, body, err := m.do("POST", "/v1/events", key, batch(b)); err != nil || code != 200 {
			t.Fatalf("retry batch %d: %d %s %v", b, code, body, err)
		}
	}
	check := func(stage string) {
		t.Helper()
		q := fmt.Sprintf("/v1/usage?start=%s&end=%s", now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339))
		want := fmt.Sprintf(`"requests":"%d"`, wantReq)
		wantTokens := fmt.Sprintf(`"output_tokens":"%d"`, wantOut)
		var body []byte
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			var code int
			code, body, _ = m.do("GET", q, m.key(t, "finance"), nil)
			if code == 200 && strings.Contains(string(body), want) && strings.Contains(string(body), wantTokens) {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("%s: usage %s, want %s and %s\nlog:\n%s", stage, body, want, wantTokens, m.log)
	}
	check("after crash and retries")

	// The rollup role (it holds the Kafka lease alone) rolls everything up:
	// traffic over the rollups counts every request once.
	sel := url.Values{
		"selector.start": {now.Truncate(time.Minute).Add(-time.Hour).Format(time.RFC3339)},
		"selector.end":   {now.Truncate(time.Minute).Add(2 * time.Minute).Format(time.RFC3339)},
	}
	wantRollup := fmt.Sprintf(`"requests":"%d"`, wantReq)
	var body []byte
	deadline := time.Now().Add(60 * time.Second)
	for {
		var code int
		code, body, _ = m.do("GET", "/v1/traffic?"+sel.Encode(), m.key(t, "finance"), nil)
		if code == 200 && strings.Contains(string(body), wantRollup) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollups never reached %s: %.300s\nlog:\n%s", wantRollup, body, m.log)
		}
		time.Sleep(300 * time.Millisecond)
	}

	// Graceful restart keeps everything, and counts nothing twice.
	m.cmd.Process.Signal(syscall.SIGTERM)
	if err := m.cmd.Wait(); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, m.log)
	}
	m.start(t)
	check("after graceful restart")
}
