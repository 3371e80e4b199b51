package gpu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tokenmeter/ingest"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "samples.jsonl")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// batches reads a replay source to exhaustion (or n batches) and returns
// "uuid@time" per sample, one slice per batch.
func batches(t *testing.T, src *ReplaySource, n int) [][]string {
	t.Helper()
	var out [][]string
	for len(out) < n {
		got, err := src.Sample(context.Background())
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var b []string
		for _, m := range got {
			at := "-"
			if m.SampledAt != nil {
				at = m.SampledAt.AsTime().Format("15:04:05")
			}
			b = append(b, m.GpuUuid+"@"+at+"#"+m.SampleId)
		}
		out = append(out, b)
	}
	return out
}

func TestReplayBatches(t *testing.T) {
	path := writeFile(t, `{"gpuUuid":"GPU-a","sampledAt":"2026-11-22T10:00:10Z","intervalS":10,"sampleId":"s1"}
{"gpuUuid":"GPU-b","sampledAt":"2026-11-22T10:00:10Z","intervalS":10,"sampleId":"s2"}

{"gpuUuid":"GPU-a","sampledAt":"2026-11-22T10:00:20Z","intervalS":10,"sampleId":"s3"}
{"gpuUuid":"GPU-a","sampledAt":"2026-11-22T10:00:20Z","intervalS":10,"sampleId":"s4"}
`)
	src, err := NewReplaySource(ReplayConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got := batches(t, src, 10)
	want := [][]string{
		{"GPU-a@10:00:10#s1", "GPU-b@10:00:10#s2"},
		{"GPU-a@10:00:20#s3"}, // a GPU repeating ends a batch
		{"GPU-a@10:00:20#s4"},
	}
	if !equalBatches(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := src.Sample(context.Background()); !errors.Is(err, ErrExhausted) {
		t.Errorf("after EOF: got %v, want ErrExhausted", err)
	}
}

func TestReplayWithoutTimesBatchesByGPU(t *testing.T) {
	path := writeFile(t, `{"gpuUuid":"GPU-a"}
{"gpuUuid":"GPU-b"}
{"gpuUuid":"GPU-a"}
`)
	src, err := NewReplaySource(ReplayConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if got, want := batches(t, src, 10), [][]string{{"GPU-a@-#", "GPU-b@-#"}, {"GPU-a@-#"}}; !equalBatches(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestReplayLoopShiftsTimeline(t *testing.T) {
	path := writeFile(t, `{"gpuUuid":"GPU-a","sampledAt":"2026-11-22T10:00:10Z","intervalS":10,"sampleId":"s1"}
{"gpuUuid":"GPU-a","sampledAt":"2026-11-22T10:00:20Z","intervalS":10,"sampleId":"s2"}
`)
	src, err := NewReplaySource(ReplayConfig{Path: path, Loop: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// The file spans 10:00:00-10:00:20: each pass is 20 s later, with its
	// ids cleared for the agent to derive.
	want := [][]string{{"GPU-a@10:00:10#s1"}, {"GPU-a@10:00:20#s2"}, {"GPU-a@10:00:30#"}, {"GPU-a@10:00:40#"}, {"GPU-a@10:00:50#"}}
	if got := batches(t, src, 5); !equalBatches(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestReplayErrorsNameTheLine(t *testing.T) {
	path := writeFile(t, `{"gpuUuid":"GPU-a"}

{"gpuUuid":"GPU-a","utilisation":0.5}
`)
	src, err := NewReplaySource(ReplayConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := src.Sample(context.Background()); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("got %v, want an error naming line 3", err)
	}
	empty, err := NewReplaySource(ReplayConfig{Path: writeFile(t, "\n"), Loop: true})
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if _, err := empty.Sample(context.Background()); err == nil {
		t.Error("looping over an empty file: got nil error")
	}
	if _, err := NewReplaySource(ReplayConfig{Path: filepath.Join(t.TempDir(), "missing.jsonl")}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: got %v", err)
	}
}

// TestReplayDemoFile checks the demo file: 2 nodes, 4 H100s, one split in
// seven 1g.10gb instances, 5 minutes of 10 s samples, the two deployments,
// every sample valid by ingest's rules.
func TestReplayDemoFile(t *testing.T) {
	src, err := NewReplaySource(ReplayConfig{Path: filepath.Join(testdataDir, "replay-demo.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	nodes, cards, deps := map[string]bool{}, map[string]bool{}, map[string]int{}
	var first, last time.Time
	n, batchCount, mig := 0, 0, 0
	limits := ingest.DefaultLimits()
	for {
		got, err := src.Sample(context.Background())
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		batchCount++
		for _, m := range got {
			n++
			nodes[m.Node], cards[m.GpuUuid] = true, true
			deps[m.Deployment]++
			if m.MigProfile == "1g.10gb" {
				mig++
			}
			at := m.SampledAt.AsTime()
			if first.IsZero() {
				first = at
			}
			last = at
			m.SampleId = SampleID(m.Node, m.GpuUuid, m.MigInstanceId, at)
			m.Source = SourceReplay
			if err := limits.ValidateGPUSample(m, at); err != nil {
				t.Fatalf("sample %d: %v", n, err)
			}
			if m.IntervalS != 10 {
				t.Fatalf("sample %d: interval %v", n, m.IntervalS)
			}
		}
	}
	if len(nodes) != 2 || len(cards) != 4 || mig != 7*30 || batchCount != 30 || n != 300 {
		t.Errorf("got %d nodes, %d GPUs, %d MIG samples, %d batches, %d samples", len(nodes), len(cards), mig, batchCount, n)
	}
	if deps["llama-70b-prod"] == 0 || deps["mistral-7b-batch"] == 0 || deps[""] == 0 {
		t.Errorf("deployments: %v, want llama-70b-prod, mistral-7b-batch and unattributed", deps)
	}
	if span := last.Sub(first); span != 290*time.Second {
		t.Errorf("span %v, want 4m50s", span)
	}
}

func equalBatches(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], ",") != strings.Join(b[i], ",") {
			return false
		}
	}
	return true
}
