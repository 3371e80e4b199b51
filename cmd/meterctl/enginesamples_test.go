package main

import (
	"bufio"
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/devenv"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestEngineSamples writes the demo's engine samples (valid, the vLLM and
// SGLang deployments only, deterministic) and publishes them to Kafka.
func TestEngineSamples(t *testing.T) {
	args := []string{"engine-samples", "--end", "2026-11-24T12:00:00Z", "--duration", "1h", "--interval", "10m"}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	engines := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	n := 0
	for sc.Scan() {
		s := &meterv1.EngineSample{}
		if err := protojson.Unmarshal(sc.Bytes(), s); err != nil {
			t.Fatal(err)
		}
		if err := ingest.DefaultLimits().ValidateEngineSample(s, time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)); err != nil {
			t.Errorf("%s: %v", s.GetSampleId(), err)
		}
		engines[s.GetEngine()]++
		n++
	}
	// 6 intervals, 2 replicas, the default fleet's vLLM and SGLang deployments.
	if n == 0 || n%12 != 0 || engines["tgi"] > 0 || engines["vllm"] == 0 || engines["sglang"] == 0 {
		t.Errorf("%d samples by engine %v", n, engines)
	}
	var again bytes.Buffer
	if err := run(context.Background(), args, func(string) string { return "" }, &again, &errOut); err != nil || again.String() != out.String() {
		t.Errorf("a second run wrote other samples (err %v)", err)
	}

	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEngineTopic}, Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	if err := run(context.Background(), append(args, "--kafka-brokers", broker.Addr()), func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("publish: %v", err)
	}
	conn, err := kafka.DialLeader(context.Background(), "tcp", broker.Addr(), ingest.DefaultEngineTopic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if last, err := conn.ReadLastOffset(); err != nil || last != int64(n) {
		t.Errorf("published %d records (%v), want %d", last, err, n)
	}
}
