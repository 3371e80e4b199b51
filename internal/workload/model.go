package workload

import (
	"errors"
	"fmt"
)

// Model describes one served model, where it runs and what its traffic looks
// like. Token counts are log-normal: Median is the median and Sigma the
// standard deviation of the logarithm.
type Model struct {
	// Name is the served model name, e.g. "llama-3.1-70b-instruct".
	Name string
	// Version is the model revision reported as model_version.
	Version string
	// Deployment names the serving deployment; it joins events to GPU samples.
	Deployment string
	// Engine is the inference engine: "vllm", "sglang" or "trt-llm".
	Engine string
	// GPUType is the accelerator model, e.g. "H100-SXM-80GB".
	GPUType string
	// TensorParallelism is the number of GPUs one replica spans.
	TensorParallelism uint32
	// Region is the cloud region of the deployment.
	Region string
	// Nodes are the hosts of the deployment; each request runs on one of them.
	Nodes []string
	// Weight is the model's share of traffic relative to the other models.
	Weight float64
	// ContextLength is the context window; longer prompts fail with
	// STATUS_CONTEXT_LENGTH.
	ContextLength int64
	// MaxOutputTokens caps the generated tokens of one request.
	MaxOutputTokens int64
	// PromptMedian and PromptSigma shape the prompt tokens.
	PromptMedian, PromptSigma float64
	// OutputMedian and OutputSigma shape the output tokens.
	OutputMedian, OutputSigma float64
	// CacheHitRate is the share of requests that hit the prefix cache.
	CacheHitRate float64
	// PrefillTokensPerMs is the prefill throughput seen by one request.
	PrefillTokensPerMs float64
	// ITLMs is the median inter-token latency in milliseconds at average load.
	ITLMs float64
	// CachedShare, when positive, is the typical share of a cache-hitting
	// prompt found in the prefix cache (conversations and agents resend
	// their history); 0 spreads it over 20–95%.
	CachedShare float64
	// Saturation, when positive, is the load (request rate relative to its
	// mean) beyond which the deployment runs out of slots: a growing share
	// of requests queues for about a second, missing the TTFT SLO, and its
	// GPUs and engines (FleetSamples, EngineSamples) run flat out.
	Saturation float64
	// Replicas, when positive, is the deployment's replica count in
	// FleetSamples and EngineSamples instead of FleetConfig.Replicas.
	Replicas int
	// Busy, when positive, is the GPU utilization of the deployment at mean
	// load in FleetSamples (and how busy its engines are); it follows the
	// load, up to flat out at Saturation.
	Busy float64
	// Pool is the GPU pool of its samples ("reserved", "spot"); empty is
	// "on-demand".
	Pool string
}

// DefaultModels returns a small fleet: five models on four GPU pools, three
// engines and three regions. The slice is new on every call.
func DefaultModels() []Model {
	return []Model{
		{
			Name: "llama-3.1-8b-instruct", Version: "fp8-2024-07-23", Deployment: "llama-8b-h100-use1",
			Engine: "vllm", GPUType: "H100-SXM-80GB", TensorParallelism: 1, Region: "us-east-1",
			Nodes: nodeNames("h100-use1", 1, 4), Weight: 0.35, ContextLength: 131072, MaxOutputTokens: 8192,
			PromptMedian: 700, PromptSigma: 1.2, OutputMedian: 160, OutputSigma: 1.0,
			CacheHitRate: 0.35, PrefillTokensPerMs: 25, ITLMs: 7,
		},
		{
			Name: "llama-3.1-70b-instruct", Version: "fp8-2024-07-23", Deployment: "llama-70b-h100-use1",
			Engine: "vllm", GPUType: "H100-SXM-80GB", TensorParallelism: 4, Region: "us-east-1",
			Nodes: nodeNames("h100-use1", 5, 8), Weight: 0.25, ContextLength: 131072, MaxOutputTokens: 8192,
			PromptMedian: 1200, PromptSigma: 1.3, OutputMedian: 280, OutputSigma: 0.9,
			CacheHitRate: 0.45, PrefillTokensPerMs: 6, ITLMs: 22,
		},
		{
			Name: "qwen2.5-72b-instruct", Version: "2024-09-19", Deployment: "qwen-72b-h200-euw1",
			Engine: "sglang", GPUType: "H200-SXM-141GB", TensorParallelism: 2, Region: "eu-west-1",
			Nodes: nodeNames("h200-euw1", 1, 6), Weight: 0.15, ContextLength: 32768, MaxOutputTokens: 8192,
			PromptMedian: 900, PromptSigma: 1.1, OutputMedian: 300, OutputSigma: 0.9,
			CacheHitRate: 0.5, PrefillTokensPerMs: 7, ITLMs: 20,
		},
		{
			Name: "mixtral-8x7b-instruct", Version: "v0.1", Deployment: "mixtral-a100-usw2",
			Engine: "trt-llm", GPUType: "A100-SXM4-80GB", TensorParallelism: 2, Region: "us-west-2",
			Nodes: nodeNames("a100-usw2", 1, 4), Weight: 0.10, ContextLength: 32768, MaxOutputTokens: 4096,
			PromptMedian: 500, PromptSigma: 1.0, OutputMedian: 200, OutputSigma: 0.8,
			CacheHitRate: 0.2, PrefillTokensPerMs: 10, ITLMs: 14,
		},
		{
			Name: "deepseek-r1-distill-llama-70b", Version: "2025-01-20", Deployment: "r1-70b-h100-use1",
			Engine: "vllm", GPUType: "H100-SXM-80GB", TensorParallelism: 4, Region: "us-east-1",
			Nodes: nodeNames("h100-use1", 13, 8), Weight: 0.15, ContextLength: 131072, MaxOutputTokens: 32768,
			PromptMedian: 600, PromptSigma: 1.0, OutputMedian: 1400, OutputSigma: 0.8,
			CacheHitRate: 0.3, PrefillTokensPerMs: 6, ITLMs: 24,
		},
	}
}

func nodeNames(prefix string, first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, first+i)
	}
	return out
}

// validate reports every problem of m.
func (m Model) validate() error {
	var errs []error
	if m.Name == "" {
		errs = append(errs, errors.New("name is empty"))
	}
	if !(m.Weight > 0) {
		errs = append(errs, fmt.Errorf("weight %g: must be positive", m.Weight))
	}
	if m.ContextLength <= 0 || m.MaxOutputTokens <= 0 {
		errs = append(errs, fmt.Errorf("context length %d and max output tokens %d: must be positive", m.ContextLength, m.MaxOutputTokens))
	}
	if !(m.PromptMedian >= 1) || !(m.OutputMedian >= 1) {
		errs = append(errs, fmt.Errorf("prompt median %g and output median %g: must be at least 1", m.PromptMedian, m.OutputMedian))
	}
	if !(m.PromptSigma >= 0) || !(m.OutputSigma >= 0) || m.PromptSigma > 4 || m.OutputSigma > 4 {
		errs = append(errs, fmt.Errorf("prompt sigma %g and output sigma %g: must be in [0, 4]", m.PromptSigma, m.OutputSigma))
	}
	if !(m.CacheHitRate >= 0 && m.CacheHitRate <= 1) {
		errs = append(errs, fmt.Errorf("cache hit rate %g: must be in [0, 1]", m.CacheHitRate))
	}
	if !(m.PrefillTokensPerMs > 0) || !(m.ITLMs > 0) {
		errs = append(errs, fmt.Errorf("prefill tokens/ms %g and ITL %g ms: must be positive", m.PrefillTokensPerMs, m.ITLMs))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("model %q: %w", m.Name, err)
	}
	return nil
}

// tenantNames are the first tenant IDs; "acme" is the largest tenant, the one
// meterd --dev issues a tenant key for.
var tenantNames = []string{
	"acme", "globex", "initech", "umbrella", "hooli", "soylent",
	"stark", "wayne", "wonka", "tyrell", "cyberdyne", "oscorp",
}

// TenantIDs returns the IDs of the first n tenants, largest share first:
// a dozen company names, then "tenant-013" and so on.
func TenantIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		if i < len(tenantNames) {
			out[i] = tenantNames[i]
		} else {
			out[i] = fmt.Sprintf("tenant-%03d", i+1)
		}
	}
	return out
}
