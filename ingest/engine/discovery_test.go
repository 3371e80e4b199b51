package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tokenmeter/ingest/engine"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// apiServer stands in for the Kubernetes API's pods list (no cluster runs
// here): it checks the token, the namespace and the label selector, and
// answers pods in the shape of a real PodList.
func apiServer(t *testing.T, pods []map[string]any) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sa-token" {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/api/v1/namespaces/serving/pods" || r.URL.Query().Get("labelSelector") != "app.kubernetes.io/component=vllm" {
			http.Error(w, "unexpected "+r.URL.String(), http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1", "items": pods})
	}))
}

func pod(name, dep, phase, ip, node string) map[string]any {
	labels := map[string]string{"app.kubernetes.io/component": "vllm"}
	if dep != "" {
		labels["app.kubernetes.io/instance"] = dep
	}
	return map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "serving", "labels": labels, "uid": "x"},
		"spec":     map[string]any{"nodeName": node, "containers": []any{map[string]any{"name": "vllm"}}},
		"status":   map[string]any{"phase": phase, "podIP": ip, "hostIP": "10.0.0.1"},
	}
}

// TestPodDiscovery finds the running, labelled pods with an IP, and the
// agent scrapes them next to a static target, each replica once.
func TestPodDiscovery(t *testing.T) {
	engineSrv := httptest.NewServer(&server{files: map[string][]string{"/metrics": {"vllm_v1_a.prom"}}})
	defer engineSrv.Close()
	_, portText, _ := net.SplitHostPort(engineSrv.Listener.Addr().String())
	port, _ := strconv.Atoi(portText)
	api := apiServer(t, []map[string]any{
		pod("llama-1", "llama", "Running", "127.0.0.1", "gpu-b"),
		pod("llama-0", "llama", "Running", "127.0.0.1", "gpu-a"),
		pod("llama-2", "llama", "Pending", "", ""),
		pod("stray", "", "Running", "127.0.0.1", "gpu-a"),
	})
	defer api.Close()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := engine.NewPodDiscovery(engine.PodDiscoveryConfig{APIServer: api.URL, TokenFile: token, Namespace: "serving",
		Selector: "app.kubernetes.io/component=vllm", Port: port, Client: api.Client()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Targets(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	want := []engine.Target{
		{Deployment: "llama", URL: url, Replica: "llama-0", Node: "gpu-a"},
		{Deployment: "llama", URL: url, Replica: "llama-1", Node: "gpu-b"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("targets (-want +got):\n%s", d)
	}

	// The agent scrapes the discovered pods and a static target; a static
	// target naming a discovered replica is scraped once.
	pub := &recorder{}
	agent, err := engine.NewAgent(engine.AgentConfig{Targets: []engine.Target{
		{Deployment: "llama", URL: url, Replica: "llama-0"},
		{Deployment: "other", URL: url, Replica: "other-0"},
	}, Discover: d.Targets}, pub, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := agent.Collect(t.Context()); err != nil || n != 3 {
		t.Fatalf("collect: %d samples, %v; want 3 (llama-0, other-0, llama-1)", n, err)
	}

	// A pod gone: its replica is no longer scraped, and its up series is deleted.
	reg := prometheus.NewRegistry()
	pods := &podSource{targets: want}
	agent2, err := engine.NewAgent(engine.AgentConfig{Discover: pods.list}, pub, reg, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := agent2.Collect(t.Context()); err != nil || n != 2 {
		t.Fatalf("collect: %d, %v", n, err)
	}
	pods.targets = want[:1]
	if n, err := agent2.Collect(t.Context()); err != nil || n != 1 {
		t.Fatalf("collect after a pod left: %d, %v", n, err)
	}
	if n := testutil.CollectAndCount(reg, "meter_engine_target_up"); n != 1 {
		t.Errorf("%d meter_engine_target_up series, want 1 (llama-1 left)", n)
	}

	// A refused token is an error, not an empty fleet.
	if err := os.WriteFile(token, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Targets(t.Context()); err == nil {
		t.Fatal("a refused token listed pods")
	}
	// The agent keeps scraping the pods it found last, and reports the failure.
	if n, err := agent.Collect(t.Context()); err == nil || n != 3 {
		t.Fatalf("collect with discovery failing: %d samples, %v; want 3 and the error", n, err)
	}
}

type podSource struct{ targets []engine.Target }

func (p *podSource) list(context.Context) ([]engine.Target, error) { return p.targets, nil }

type recorder struct{ got []*meterv1.EngineSample }

func (r *recorder) Publish(_ context.Context, s []*meterv1.EngineSample) ([]*meterv1.EngineSample, error) {
	r.got = append(r.got, s...)
	return nil, nil
}
