package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest"
	"tokenmeter/ingest/gpu"
	"tokenmeter/internal/adapter/devenv"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

const testdata = "../../testdata/gpu"

func noEnv(string) string { return "" }

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestRunReplayToKafka replays the demo file through the binary's run into
// an in-process Kafka broker and reads every record back with kafka-go.
func TestRunReplayToKafka(t *testing.T) {
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultGPUTopic}, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err = run(ctx, []string{
		"--source", "replay", "--file", filepath.Join(testdata, "replay-demo.jsonl"), "--interval", "1ms",
		"--http-addr", "127.0.0.1:0", "--node", "agent-host", "--region", "eu-west-1", "--pool", "on-demand",
	}, envOf(map[string]string{"METER_KAFKA_BROKERS": broker.Addr()}), &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}

	msgs := readAll(t, ctx, broker.Addr(), ingest.DefaultGPUTopic, 4)
	if len(msgs) != 300 {
		t.Fatalf("read %d records, want the 300 of the file", len(msgs))
	}
	ids := map[string]bool{}
	deps := map[string]int{}
	nodes := map[string]bool{}
	for _, msg := range msgs {
		m := &meterv1.GpuSample{}
		if err := proto.Unmarshal(msg.Value, m); err != nil {
			t.Fatal(err)
		}
		if string(msg.Key) != m.GpuUuid {
			t.Errorf("record key %q, want the GPU UUID %q", msg.Key, m.GpuUuid)
		}
		if err := ingest.DefaultLimits().ValidateGPUSample(m, time.Now()); err != nil {
			t.Errorf("sample %s: %v", m.SampleId, err)
		}
		if ids[m.SampleId] {
			t.Errorf("sample id %s twice", m.SampleId)
		}
		ids[m.SampleId] = true
		deps[m.Deployment]++
		nodes[m.Node] = true
		// The file is authoritative: its nodes, regions and pools stay.
		if m.Source != gpu.SourceReplay || m.Region != "us-east-1" || m.IntervalS != 10 {
			t.Errorf("sample %s: source %q region %q interval %v", m.SampleId, m.Source, m.Region, m.IntervalS)
		}
	}
	want := map[string]int{"llama-70b-prod": 60, "mistral-7b-batch": 30 + 5*30, "": 2 * 30}
	if fmt.Sprint(deps) != fmt.Sprint(want) {
		t.Errorf("samples per deployment: got %v, want %v", deps, want)
	}
	if len(nodes) != 2 || nodes["agent-host"] {
		t.Errorf("nodes %v, want the file's two", nodes)
	}
}

// TestRunEnginesToKafka runs gpu-agent --source none against two engine
// stand-ins and reads their samples back from the engine topic.
func TestRunEnginesToKafka(t *testing.T) {
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEngineTopic}, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	pages := map[string]string{"/vllm": "../../ingest/engine/testdata/vllm_v1_a.prom", "/tgi": "../../ingest/engine/testdata/tgi.prom"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, pages[r.URL.Path])
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err = run(ctx, []string{"--source", "none", "--interval", "200ms", "--http-addr", "",
		"--engine-endpoints", "llama=" + srv.URL + "/vllm@llama-0,bloom=" + srv.URL + "/tgi@bloom-0"},
		envOf(map[string]string{"METER_KAFKA_BROKERS": broker.Addr()}), &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	bg, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	msgs := readAll(t, bg, broker.Addr(), ingest.DefaultEngineTopic, 2)
	per := map[string]int{}
	for _, msg := range msgs {
		s := &meterv1.EngineSample{}
		if err := proto.Unmarshal(msg.Value, s); err != nil {
			t.Fatal(err)
		}
		if err := ingest.DefaultLimits().ValidateEngineSample(s, time.Now()); err != nil {
			t.Errorf("sample %s: %v", s.GetSampleId(), err)
		}
		if want := s.GetDeployment() + "/" + s.GetReplica(); string(msg.Key) != want {
			t.Errorf("record key %q, want %q", msg.Key, want)
		}
		per[s.GetEngine()+" "+s.GetReplica()]++
	}
	// About seven scrapes in 1.5 s at 200 ms: each replica's, none invented.
	if len(per) != 2 || per["vllm llama-0"] < 3 || per["vllm llama-0"] != per["tgi bloom-0"] {
		t.Errorf("samples per replica %v, want the same number (at least 3) of vllm llama-0 and tgi bloom-0", per)
	}
}

func readAll(t *testing.T, ctx context.Context, addr, topic string, partitions int) []kafka.Message {
	t.Helper()
	var out []kafka.Message
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Topic: topic, Partition: p, MaxWait: 50 * time.Millisecond})
		for range last {
			msg, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatalf("partition %d: %v", p, err)
			}
			out = append(out, msg)
		}
		r.Close()
	}
	return out
}

// TestRunOnceExporter scrapes a dcgm-exporter stand-in once and checks the
// printed samples: one per GPU, stamped, attributed by the map, no Kafka.
func TestRunOnceExporter(t *testing.T) {
	scrape, err := os.ReadFile(filepath.Join(testdata, "exporter-h100-hostname.prom"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(scrape) }))
	defer srv.Close()
	depMap := filepath.Join(t.TempDir(), "deployments.json")
	if err := os.WriteFile(depMap, []byte(`{"nodes": {"gpu-h100-07": {"*": "llama-70b-prod", "6": "spare"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{
		"--source", "dcgm-exporter", "--exporter-url", srv.URL + "/metrics", "--once",
		"--deployment-map", depMap, "--region", "us-east-1", "--pool", "reserved",
	}, noEnv, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var got []*meterv1.GpuSample
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		m := &meterv1.GpuSample{}
		if err := protojson.Unmarshal(sc.Bytes(), m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 8 {
		t.Fatalf("printed %d samples, want 8", len(got))
	}
	for i, m := range got {
		wantDep := "llama-70b-prod"
		if i == 6 {
			wantDep = "spare"
		}
		if m.Node != "gpu-h100-07" || m.Deployment != wantDep || m.Source != gpu.SourceExporter || m.IntervalS != 10 ||
			m.SampleId == "" || m.SampledAt == nil || m.Region != "us-east-1" || m.Pool != "reserved" || m.GpuIndex != uint32(i) {
			t.Errorf("sample %d: %v", i, m)
		}
		// First reading: no counter baseline, so energy is power x interval.
		if d := m.EnergyJoules - m.PowerWatts*10; d > 1e-6 || d < -1e-6 {
			t.Errorf("sample %d: energy %v J, want %v", i, m.EnergyJoules, m.PowerWatts*10)
		}
	}
}

// TestRunDCGMUnavailable runs --source dcgm where there is no libdcgm (this
// machine, CI): a clean error that says what to do, never a crash.
func TestRunDCGMUnavailable(t *testing.T) {
	for _, mode := range []string{"embedded", "standalone"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{"--source", "dcgm", "--dcgm-mode", mode, "--once"}, noEnv, &stdout, &stderr)
		if err == nil {
			t.Skip("DCGM is available on this machine")
		}
		if !errors.Is(err, gpu.ErrDCGMUnavailable) {
			t.Errorf("%s: got %v, want an error wrapping gpu.ErrDCGMUnavailable", mode, err)
		}
		for _, s := range []string{"DCGM not available", "libdcgm.so", "use --source dcgm-exporter or replay"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not say %q", mode, err, s)
			}
		}
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string // substrings, all reported at once
	}{
		{name: "defaults are valid", args: nil},
		{name: "replay from env", args: nil, env: map[string]string{"METER_SOURCE": "replay", "METER_FILE": "x.jsonl", "METER_LOOP": "true"}},
		{name: "once needs no Kafka", args: []string{"--once", "--kafka-brokers", ""}},
		{
			name:    "every problem at once",
			args:    []string{"--source", "replay", "--interval", "0s", "--kafka-brokers", "kafka", "--pod-deployment-regex", "^llama$", "--log-level", "loud"},
			wantErr: []string{"--file is required", "--interval 0s", `--kafka-brokers "kafka"`, "needs a group", "--log-level"},
		},
		{name: "bad source", args: []string{"--source", "nvidia-smi"}, wantErr: []string{`--source "nvidia-smi"`}},
		{name: "bad exporter URL", args: []string{"--source", "dcgm-exporter", "--exporter-url", "localhost:9400"}, wantErr: []string{"--exporter-url"}},
		{name: "bad DCGM mode", args: []string{"--dcgm-mode", "remote"}, wantErr: []string{"--dcgm-mode"}},
		{name: "flag wins over env", args: []string{"--source", "dcgm"}, env: map[string]string{"METER_SOURCE": "nvml"}},
		{name: "bad env value", env: map[string]string{"METER_INTERVAL": "soon"}, wantErr: []string{"METER_INTERVAL"}},
		{name: "engines only", args: []string{"--source", "none", "--engine-endpoints", "llama=http://10.0.0.7:8000/metrics@llama-0"}},
		{name: "engines by pod label", args: []string{"--source", "none", "--engine-pod-selector", "app=vllm", "--engine-pod-port", "8000"}},
		{name: "nothing to do", args: []string{"--source", "none"}, wantErr: []string{"--engine-endpoints or --engine-pod-selector"}},
		{name: "pod selector without a port", args: []string{"--engine-pod-selector", "app=vllm"}, wantErr: []string{"--engine-pod-port 0"}},
		{name: "bad engine endpoint", args: []string{"--engine-endpoints", "http://x:1/metrics"}, wantErr: []string{"--engine-endpoints", "want deployment=http"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, err := parseConfig(tt.args, envOf(tt.env), &stderr)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("got %v", err)
				}
				if c.Node == "" {
					t.Error("node did not default to the hostname")
				}
				return
			}
			if err == nil {
				t.Fatal("got nil error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestRunValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	for path, text := range map[string]string{good: `{"nodes": {"n": {"*": "d"}}}`, bad: `{"nodes": {"n": {"*": ""}}}`} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--validate", "--deployment-map", good}, noEnv, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != "configuration is valid\n" {
		t.Errorf("stdout %q", got)
	}
	if err := run(context.Background(), []string{"--validate", "--deployment-map", bad}, noEnv, &stdout, &stderr); err == nil {
		t.Error("--validate with an invalid deployment map: got nil error")
	}
}
