package main

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestEngineStatsDeploymentsAndColumns checks that engine-stats sends
// --deployment as the API's deployment parameters and prints the KV-cache
// minimum and the restarts.
func TestEngineStatsDeploymentsAndColumns(t *testing.T) {
	p := &meterv1.EngineStatsPoint{Start: timestamppb.New(t10), Samples: 360, Replicas: 2, WaitingMean: 1.5, WaitingP95: 4, WaitingMax: 7,
		RunningMean: 12, RunningMax: 30, KvCacheSamples: 360, KvCacheUsageMean: 0.5, KvCacheUsageMax: 0.875, KvCacheUsageMin: 0.125,
		Preemptions: 3, Restarts: 2}
	f, srv := newFakeMetrics(t, map[string][]proto.Message{"/v1/engine-stats": {&meterv1.GetEngineStatsResponse{Series: []*meterv1.EngineStatsSeries{
		{Group: map[string]string{"deployment": "qwen"}, Points: []*meterv1.EngineStatsPoint{p}, Summary: p},
	}}}})
	out, _, err := runArgs(t, nil, "engine-stats", "--addr", srv.URL, "--key", testKey, "--deployment", "qwen, llama,qwen",
		"--group-by", "deployment", "--start", t10.Format("2006-01-02T15:04:05Z"), "--end", t11.Format("2006-01-02T15:04:05Z"))
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.got()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	if got := reqs[0].Query()["deployment"]; strings.Join(got, ",") != "qwen,llama" {
		t.Errorf("deployment parameters %q, want qwen and llama", got)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	head := strings.Fields(lines[0])
	row := strings.Fields(lines[1])
	col := func(name string) string {
		for i, h := range head {
			if h == name && i < len(row) {
				return row[i]
			}
		}
		t.Fatalf("no column %s in %q", name, lines[0])
		return ""
	}
	if got := col("KV_MIN"); got != "12.50%" {
		t.Errorf("KV_MIN %s, want 12.50%%\n%s", got, out)
	}
	if got := col("RESTARTS"); got != "2" {
		t.Errorf("RESTARTS %s, want 2\n%s", got, out)
	}
}
