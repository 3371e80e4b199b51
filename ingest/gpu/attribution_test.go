package gpu

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func TestDefaultPodDeploymentRegex(t *testing.T) {
	re := regexp.MustCompile(DefaultPodDeploymentRegex)
	tests := map[string]string{
		"llama-70b-prod-7c9f8d6b5-x2k4q":   "llama-70b-prod",   // Deployment
		"mistral-7b-batch-5d8b9c7f4-q7w2z": "mistral-7b-batch", // Deployment
		"node-agent-x2k4q":                 "node-agent",       // DaemonSet
		"vllm-0":                           "vllm",             // StatefulSet
		"vllm-12":                          "vllm",
		"mistral-7b-batch":                 "", // a bare name: left alone
		"llama-70b":                        "",
	}
	for pod, want := range tests {
		got := ""
		if m := re.FindStringSubmatch(pod); m != nil {
			got = m[re.SubexpIndex("deployment")]
		}
		if got != want {
			t.Errorf("%q: got %q, want %q", pod, got, want)
		}
	}
}

func TestAttributor(t *testing.T) {
	a, err := NewAttributor(AttributionConfig{
		Map: DeploymentMap{
			Nodes: map[string]map[string]string{
				"node-a": {"*": "dep-node-a"},
				"node-b": {"0": "dep-b0", "GPU-b1": "dep-b1", "GPU-b1/9": "dep-b1-gi9", "2/3": "dep-b2-gi3"},
			},
			Namespaces:  map[string]string{"batch": "dep-batch"},
			PodPrefixes: map[string]string{"vllm-": "dep-vllm", "vllm-llama-": "dep-vllm-llama"},
		},
		PodRegex: regexp.MustCompile(DefaultPodDeploymentRegex),
		Region:   "eu-west-1", Pool: "reserved",
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   *meterv1.GpuSample
		want string
	}{
		{"own deployment wins", &meterv1.GpuSample{Node: "node-b", GpuIndex: 0, Deployment: "replayed"}, "replayed"},
		{"GPU index", &meterv1.GpuSample{Node: "node-b", GpuUuid: "GPU-b0", GpuIndex: 0, Pod: "x-7c9f8d6b5-x2k4q"}, "dep-b0"},
		{"GPU UUID", &meterv1.GpuSample{Node: "node-b", GpuUuid: "GPU-b1", GpuIndex: 1}, "dep-b1"},
		{"MIG instance by UUID", &meterv1.GpuSample{Node: "node-b", GpuUuid: "GPU-b1", GpuIndex: 1, MigProfile: "1g.10gb", MigInstanceId: 9}, "dep-b1-gi9"},
		{"other MIG instance falls to its GPU", &meterv1.GpuSample{Node: "node-b", GpuUuid: "GPU-b1", GpuIndex: 1, MigProfile: "1g.10gb", MigInstanceId: 10}, "dep-b1"},
		{"MIG instance by index", &meterv1.GpuSample{Node: "node-b", GpuUuid: "GPU-b2", GpuIndex: 2, MigProfile: "3g.40gb", MigInstanceId: 3}, "dep-b2-gi3"},
		{"longest pod prefix", &meterv1.GpuSample{Node: "node-a", Pod: "vllm-llama-0"}, "dep-vllm-llama"},
		{"pod prefix", &meterv1.GpuSample{Node: "node-a", Pod: "vllm-qwen-0"}, "dep-vllm"},
		{"namespace", &meterv1.GpuSample{Node: "node-a", Pod: "job-x2k4q", Namespace: "batch"}, "dep-batch"},
		{"pod regex", &meterv1.GpuSample{Node: "node-a", Pod: "llama-70b-prod-7c9f8d6b5-x2k4q", Namespace: "prod"}, "llama-70b-prod"},
		{"node wildcard when the pod says nothing", &meterv1.GpuSample{Node: "node-a", Pod: "bare"}, "dep-node-a"},
		{"node wildcard without pod", &meterv1.GpuSample{Node: "node-a", GpuIndex: 5}, "dep-node-a"},
		{"unattributed", &meterv1.GpuSample{Node: "node-z", GpuUuid: "GPU-z"}, ""},
		{"other node's GPU index is not ours", &meterv1.GpuSample{Node: "node-c", GpuIndex: 0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a.Apply(tt.in)
			if tt.in.Deployment != tt.want {
				t.Errorf("got deployment %q, want %q", tt.in.Deployment, tt.want)
			}
			if tt.in.Region != "eu-west-1" || tt.in.Pool != "reserved" {
				t.Errorf("got region %q pool %q", tt.in.Region, tt.in.Pool)
			}
		})
	}
	// A sample's own region and pool are kept.
	m := &meterv1.GpuSample{Region: "us-east-1", Pool: "spot"}
	a.Apply(m)
	if m.Region != "us-east-1" || m.Pool != "spot" {
		t.Errorf("got region %q pool %q, want the sample's", m.Region, m.Pool)
	}
}

func TestNewAttributorRejectsRegexWithoutGroup(t *testing.T) {
	if _, err := NewAttributor(AttributionConfig{PodRegex: regexp.MustCompile(`^llama-.*$`)}); err == nil {
		t.Error("got nil error")
	}
	a, err := NewAttributor(AttributionConfig{PodRegex: regexp.MustCompile(`^(\w+)-`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Deployment(&meterv1.GpuSample{Pod: "web-1"}); got != "web" {
		t.Errorf("first group: got %q, want web", got)
	}
}

func TestLoadDeploymentMap(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"nodes": {"node-a": {"*": "dep1"}, "node-b": {"0": "dep2", "GPU-1234": "dep3"}},
		"namespaces": {"batch": "dep4"}, "pod_prefixes": {"vllm-": "dep5"}}`)
	m, err := LoadDeploymentMap(good)
	if err != nil {
		t.Fatal(err)
	}
	if m.Nodes["node-b"]["GPU-1234"] != "dep3" || m.Namespaces["batch"] != "dep4" || m.PodPrefixes["vllm-"] != "dep5" {
		t.Errorf("got %+v", m)
	}
	for name, text := range map[string]string{
		"typo.json":  `{"node": {"node-a": {"*": "dep1"}}}`,
		"empty.json": `{"nodes": {"node-a": {"*": ""}}, "namespaces": {"": "x"}}`,
		"bad.json":   `{"nodes": [`,
	} {
		if _, err := LoadDeploymentMap(write(name, text)); err == nil {
			t.Errorf("%s: got nil error", name)
		} else if !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %q does not name the file", name, err)
		}
	}
	if _, err := LoadDeploymentMap(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file: got nil error")
	}
}
