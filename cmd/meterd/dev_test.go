package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// startDev builds meterd and starts it in dev mode; it is stopped with
// SIGTERM when the test ends, if the test has not stopped it.
func startDev(t *testing.T) *meterd {
	t.Helper()
	chtest.RequireLocal(t)
	bin := filepath.Join(t.TempDir(), "meterd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	m := &meterd{bin: bin, dir: t.TempDir(), http: freeAddr(t), grpc: freeAddr(t), kafka: freeAddr(t)}
	m.start(t)
	t.Cleanup(func() {
		if m.cmd.ProcessState == nil {
			m.cmd.Process.Signal(syscall.SIGTERM)
			m.cmd.Wait()
		}
	})
	return m
}

func (m *meterd) ready() bool {
	resp, err := http.Get("http://" + m.http + "/healthz/ready")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitUsage waits until /v1/usage over [from, to) counts want requests.
func (m *meterd) waitUsage(t *testing.T, from, to time.Time, want int) {
	t.Helper()
	q := fmt.Sprintf("/v1/usage?start=%s&end=%s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	wantBody := fmt.Sprintf(`"requests":"%d"`, want)
	var body []byte
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var code int
		code, body, _ = m.do("GET", q, m.key(t, "finance"), nil)
		if code == http.StatusOK && bytes.Contains(body, []byte(wantBody)) {
			return
		}
	}
	t.Fatalf("usage %s, want %s\nlog:\n%s", body, wantBody, m.log)
}

// TestDevClickHouseRestarted kills meterd --dev's private ClickHouse: meterd
// logs the exit at ERROR, starts it again on the same port and data, and
// serves queries again; a graceful stop of meterd then stops it for good.
func TestDevClickHouseRestarted(t *testing.T) {
	m := startDev(t)
	now := time.Now().UTC()
	var req meterv1.PublishEventsRequest
	for i := range 50 {
		req.Events = append(req.Events, &meterv1.InferenceEvent{
			EventId: fmt.Sprintf("e-%d", i), TenantId: "acme", Model: "m",
			CompletedAt:  timestamppb.New(now.Add(-time.Duration(i) * time.Second)),
			PromptTokens: proto.Int64(10), OutputTokens: proto.Int64(1), TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
		})
	}
	body, _ := protojson.Marshal(&req)
	if code, b, err := m.do("POST", "/v1/events", m.key(t, "ingest"), body); err != nil || code != http.StatusOK {
		t.Fatalf("publish: %d %s %v", code, b, err)
	}
	m.waitUsage(t, now.Add(-time.Hour), now.Add(time.Hour), 50)

	pidFile := filepath.Join(m.dir, "clickhouse", "clickhouse.pid")
	readPID := func() int {
		b, _ := os.ReadFile(pidFile)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	}
	pid := readPID()
	if pid == 0 {
		t.Fatalf("no pid in %s", pidFile)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for p := readPID(); p == 0 || p == pid || !m.ready(); p = readPID() {
		if time.Now().After(deadline) {
			t.Fatalf("ClickHouse not back 90s after pid %d was killed\nlog:\n%s", pid, m.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	m.waitUsage(t, now.Add(-time.Hour), now.Add(time.Hour), 50)

	restarted := readPID()
	m.cmd.Process.Signal(syscall.SIGTERM)
	if err := m.cmd.Wait(); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, m.log)
	}
	if alive(restarted) {
		t.Errorf("ClickHouse pid %d still running after meterd stopped", restarted)
	}
	// One exit logged at ERROR, with its status; the stop is not one.
	exits := strings.Count(m.log.String(), `"level":"ERROR","msg":"ClickHouse exited unexpectedly; restarting it"`)
	if exits != 1 || !strings.Contains(m.log.String(), `"status":"signal: killed"`) {
		t.Errorf("got %d exits logged at ERROR, want 1 with its status\nlog:\n%s", exits, m.log)
	}
}

// alive reports whether pid runs (and is not a zombie waiting to be reaped).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// TestDevKcatOversizedRecord is issue 13's end-to-end case on meterd --dev:
// kcat writes valid events, a record of about 1 MB (under the dev broker's
// limit, but whose whole dead-letter copy is not) and more valid events to
// one partition. Ingestion goes on, the events are counted exactly, meterd
// stays ready, and the rejection is in the DLQ topic with its size and
// SHA-256.
func TestDevKcatOversizedRecord(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kcat not installed; CI must install it (apt-get install kcat)")
		}
		t.Skip("kcat not installed")
	}
	m := startDev(t)
	produce := func(lines ...[]byte) {
		t.Helper()
		cmd := exec.Command(kcat, "-P", "-b", m.kafka, "-t", ingest.DefaultEventsTopic, "-p", "0",
			"-X", "message.max.bytes=1048588", "-H", "content-type=application/json")
		cmd.Stdin = bytes.NewReader(append(bytes.Join(lines, []byte("\n")), '\n'))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kcat: %v\n%s", err, out)
		}
	}
	now := time.Now().UTC()
	var lines [][]byte
	for i := range 300 {
		b, err := protojson.Marshal(&meterv1.InferenceEvent{
			EventId: fmt.Sprintf("k-%d", i), TenantId: "acme", Model: "m",
			CompletedAt:  timestamppb.New(now.Add(-time.Duration(i) * time.Second)),
			PromptTokens: proto.Int64(10), OutputTokens: proto.Int64(1), TtftMs: proto.Float64(5), E2EMs: proto.Float64(50),
		})
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b)
	}
	big := bytes.Repeat([]byte("x"), 1_048_400)
	copy(big, `{"event_id":"big","pad":"`)
	copy(big[len(big)-2:], `"}`)
	produce(lines[:100]...)
	produce(big)
	produce(lines[100:]...)

	m.waitUsage(t, now.Add(-time.Hour), now.Add(time.Hour), 300)
	if !m.ready() {
		t.Errorf("meterd not ready after the oversized record\nlog:\n%s", m.log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{m.kafka}, Topic: ingest.DefaultDLQTopic, GroupID: "test-dlq", StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	dead, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatalf("read DLQ: %v", err)
	}
	sum := sha256.Sum256(big)
	for k, want := range map[string]string{
		"dlq-source-offset": "100", "dlq-source-partition": "0", "dlq-reason-code": "oversized",
		"dlq-original-size": strconv.Itoa(len(big)), "dlq-original-sha256": hex.EncodeToString(sum[:]),
	} {
		var got string
		for _, h := range dead.Headers {
			if h.Key == k {
				got = string(h.Value)
			}
		}
		if got != want {
			t.Errorf("DLQ header %s: got %q, want %q", k, got, want)
		}
	}
	if !bytes.HasPrefix(big, dead.Value) || len(dead.Value) == 0 || len(dead.Value) > 64<<10 {
		t.Errorf("DLQ value: got %d bytes, want a prefix of the record of at most 64 KiB", len(dead.Value))
	}
}
