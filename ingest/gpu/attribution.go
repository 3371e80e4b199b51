package gpu

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DefaultPodDeploymentRegex derives a deployment from a Kubernetes pod name
// by removing what controllers append: the ReplicaSet hash and pod suffix of
// a Deployment's pod ("llama-70b-prod-7c9f8d6b5-x2k4q" -> "llama-70b-prod"),
// the suffix of a DaemonSet or Job pod ("agent-x2k4q" -> "agent") and the
// ordinal of a StatefulSet pod ("vllm-0" -> "vllm"). The hash and suffix use
// Kubernetes' safe alphabet (no vowels, no 0, 1 or 3), so that a name such
// as "mistral-7b-batch" is left alone rather than cut at "-batch".
const DefaultPodDeploymentRegex = `^(?P<deployment>.+?)(?:(?:-[bcdfghjklmnpqrstvwxz2456789]{6,10})?-[bcdfghjklmnpqrstvwxz2456789]{5}|-[0-9]+)$`

// DeploymentMap is the JSON file of gpu-agent --deployment-map, the static
// part of attribution:
//
//	{
//	  "nodes": {
//	    "gpu-node-a": {"*": "llama-70b-prod"},
//	    "gpu-node-b": {"0": "mistral-7b-batch", "GPU-5f3c...": "llama-70b-prod", "1/9": "mistral-7b-batch"}
//	  },
//	  "namespaces":   {"batch-inference": "mistral-7b-batch"},
//	  "pod_prefixes": {"vllm-llama-70b-": "llama-70b-prod"}
//	}
//
// A key under a node is a GPU UUID, a GPU index, "<UUID or index>/<GPU
// instance id>" for one MIG instance, or "*" for every GPU of the node. A
// GPU key covers the MIG instances of that GPU too.
type DeploymentMap struct {
	Nodes       map[string]map[string]string `json:"nodes"`
	Namespaces  map[string]string            `json:"namespaces"`
	PodPrefixes map[string]string            `json:"pod_prefixes"`
}

// LoadDeploymentMap reads and checks a DeploymentMap file. Unknown keys and
// empty deployments are errors, so that a typo does not silently leave GPUs
// unattributed.
func LoadDeploymentMap(path string) (DeploymentMap, error) {
	var m DeploymentMap
	data, err := os.ReadFile(path)
	if err != nil {
		return m, fmt.Errorf("deployment map: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("deployment map %s: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("deployment map %s: %w", path, err)
	}
	return m, nil
}

// Validate reports every empty name in the map.
func (m DeploymentMap) Validate() error {
	var errs []error
	for node, gpus := range m.Nodes {
		if node == "" {
			errs = append(errs, errors.New(`nodes: empty node name`))
		}
		for k, d := range gpus {
			if k == "" || d == "" {
				errs = append(errs, fmt.Errorf("nodes.%s: empty key or deployment (%q: %q)", node, k, d))
			}
		}
	}
	for k, d := range m.Namespaces {
		if k == "" || d == "" {
			errs = append(errs, fmt.Errorf("namespaces: empty key or deployment (%q: %q)", k, d))
		}
	}
	for k, d := range m.PodPrefixes {
		if k == "" || d == "" {
			errs = append(errs, fmt.Errorf("pod_prefixes: empty key or deployment (%q: %q)", k, d))
		}
	}
	return errors.Join(errs...)
}

// AttributionConfig configures an Attributor.
type AttributionConfig struct {
	Map DeploymentMap
	// PodRegex derives a deployment from a pod name: its group named
	// "deployment", else its first group. Nil derives nothing.
	PodRegex *regexp.Regexp
	// Region and Pool are written into samples that have none.
	Region, Pool string
}

// Attributor decides the deployment of a GPU sample. In order, the first
// that gives one wins:
//
//  1. the sample's own deployment (a replay file's);
//  2. the node map entry of the MIG instance, then of the GPU (UUID, index);
//  3. the longest pod_prefixes entry that prefixes the pod name;
//  4. the namespaces entry of the pod's namespace;
//  5. the pod regex;
//  6. the node's "*" entry.
//
// Otherwise the deployment stays "" and the GPU's time is reported as
// unattributed; the sample is still published.
type Attributor struct {
	cfg      AttributionConfig
	prefixes []string // longest first
	group    int
}

// NewAttributor checks the configuration.
func NewAttributor(cfg AttributionConfig) (*Attributor, error) {
	if err := cfg.Map.Validate(); err != nil {
		return nil, err
	}
	a := &Attributor{cfg: cfg}
	for p := range cfg.Map.PodPrefixes {
		a.prefixes = append(a.prefixes, p)
	}
	slices.SortFunc(a.prefixes, func(x, y string) int { return cmp.Or(cmp.Compare(len(y), len(x)), cmp.Compare(x, y)) })
	if re := cfg.PodRegex; re != nil {
		if re.NumSubexp() == 0 {
			return nil, fmt.Errorf("pod deployment regex %q has no group to take the deployment from", re)
		}
		a.group = 1
		if i := re.SubexpIndex("deployment"); i > 0 {
			a.group = i
		}
	}
	return a, nil
}

// Apply sets the deployment of m when it has none, and its region and pool
// when it has none.
func (a *Attributor) Apply(m *meterv1.GpuSample) {
	if m.Deployment == "" {
		m.Deployment = a.Deployment(m)
	}
	if m.Region == "" {
		m.Region = a.cfg.Region
	}
	if m.Pool == "" {
		m.Pool = a.cfg.Pool
	}
}

// Deployment returns the deployment of m by the rules of Attributor.
func (a *Attributor) Deployment(m *meterv1.GpuSample) string {
	if m.Deployment != "" {
		return m.Deployment
	}
	gpus := a.cfg.Map.Nodes[m.Node]
	index := strconv.FormatUint(uint64(m.GpuIndex), 10)
	if m.MigProfile != "" {
		gi := "/" + strconv.FormatUint(uint64(m.MigInstanceId), 10)
		if d := lookup(gpus, m.GpuUuid+gi, index+gi); d != "" {
			return d
		}
	}
	if d := lookup(gpus, m.GpuUuid, index); d != "" {
		return d
	}
	if m.Pod != "" {
		for _, p := range a.prefixes {
			if strings.HasPrefix(m.Pod, p) {
				return a.cfg.Map.PodPrefixes[p]
			}
		}
	}
	if d := a.cfg.Map.Namespaces[m.Namespace]; m.Namespace != "" && d != "" {
		return d
	}
	if re := a.cfg.PodRegex; re != nil && m.Pod != "" {
		if sub := re.FindStringSubmatch(m.Pod); sub != nil && sub[a.group] != "" {
			return sub[a.group]
		}
	}
	return gpus["*"]
}

func lookup(m map[string]string, keys ...string) string {
	for _, k := range keys {
		if d := m[k]; d != "" {
			return d
		}
	}
	return ""
}
