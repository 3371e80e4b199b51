package workload

import "time"

// The demo fleet (`make run`, meterctl's --fleet demo): five weeks of a
// small provider serving long-context agents, RAG, reasoning and chat, with
// one deployment that outgrows its GPU and one that sits nearly idle.
//
// It is a scale model. A few hundred thousand events keep the replay and
// the data directory of the demo small, which is about a hundredth of the
// requests its GPUs would serve; so that tokens per GPU-hour, cost per
// token and margins still look like a real provider's, its requests are
// the large ones of today's traffic: coding agents that resend a long,
// mostly cached conversation at every turn (the first turn of a session
// misses the cache, and is short), retrieval prompts of ten thousand
// tokens, reasoning traces of thousands of output tokens. The GPUs' busy
// time (FleetSamples) and the engines' queues and KV cache
// (EngineSamples) follow the same load as the events: the day/night cycle
// and the weekly growth.
const (
	// DemoDuration is the span of the demo history: five weeks, so that
	// weekly growth and a forecast (3 complete weeks) are known and the
	// previous calendar month always has traffic.
	DemoDuration = 35 * 24 * time.Hour
	// DemoWeeklyGrowth is the demo traffic's growth per week.
	DemoWeeklyGrowth = 0.05
	// DemoErrorRate is the demo's share of failed requests (a healthy
	// fleet: what fails is mostly rate limiting at peaks).
	DemoErrorRate = 0.0005
	// DemoSampleInterval is the interval of the demo's GPU and engine
	// samples.
	DemoSampleInterval = 10 * time.Minute
)

// DemoSaturated and DemoIdle name the demo deployment that saturates at its
// busiest hours and the one that idles.
const (
	DemoSaturated = "llama-70b-h200-use1"
	DemoIdle      = "mixtral-a100-usw2"
)

// DemoModels returns the demo fleet; the slice is new on every call.
func DemoModels() []Model {
	return []Model{
		{
			// Coding agents: the busiest deployment, on one H200, which
			// runs out of slots at the peaks of the last weeks.
			Name: "llama-3.1-70b-instruct", Version: "fp8-2024-07-23", Deployment: DemoSaturated,
			Engine: "vllm", GPUType: "H200-SXM-141GB", TensorParallelism: 1, Region: "us-east-1", Replicas: 1, Pool: "reserved",
			Nodes: nodeNames("h200-use1", 1, 1), Weight: 0.26, ContextLength: 131072, MaxOutputTokens: 8192,
			PromptMedian: 70000, PromptSigma: 0.35, OutputMedian: 450, OutputSigma: 0.8,
			CacheHitRate: 0.92, CachedShare: 0.93, PrefillTokensPerMs: 22, ITLMs: 20,
			Saturation: 1.4, Busy: 0.62,
		},
		{
			// Retrieval-augmented answers in Europe: long, mostly fresh prompts.
			Name: "qwen2.5-72b-instruct", Version: "2024-09-19", Deployment: "qwen-72b-h200-euw1",
			Engine: "sglang", GPUType: "H200-SXM-141GB", TensorParallelism: 1, Region: "eu-west-1", Replicas: 1, Pool: "reserved",
			Nodes: nodeNames("h200-euw1", 1, 1), Weight: 0.30, ContextLength: 131072, MaxOutputTokens: 8192,
			PromptMedian: 60000, PromptSigma: 0.3, OutputMedian: 400, OutputSigma: 0.8,
			CacheHitRate: 0.8, CachedShare: 0.8, PrefillTokensPerMs: 24, ITLMs: 20, Busy: 0.5,
		},
		{
			// Reasoning agents: long outputs on one H100.
			Name: "deepseek-r1-distill-llama-70b", Version: "2025-01-20", Deployment: "r1-70b-h100-use1",
			Engine: "vllm", GPUType: "H100-SXM-80GB", TensorParallelism: 1, Region: "us-east-1", Replicas: 1, Pool: "reserved",
			Nodes: nodeNames("h100-use1", 1, 1), Weight: 0.28, ContextLength: 131072, MaxOutputTokens: 32768,
			PromptMedian: 50000, PromptSigma: 0.4, OutputMedian: 3500, OutputSigma: 0.5,
			CacheHitRate: 0.85, CachedShare: 0.85, PrefillTokensPerMs: 20, ITLMs: 22, Busy: 0.5,
		},
		{
			// Extraction and chat on one L4: cheap, smaller requests.
			Name: "llama-3.1-8b-instruct", Version: "fp8-2024-07-23", Deployment: "llama-8b-l4-use1",
			Engine: "vllm", GPUType: "L4-24GB", TensorParallelism: 1, Region: "us-east-1", Replicas: 1, Pool: "reserved",
			Nodes: nodeNames("l4-use1", 1, 1), Weight: 0.20, ContextLength: 131072, MaxOutputTokens: 8192,
			PromptMedian: 10000, PromptSigma: 0.4, OutputMedian: 250, OutputSigma: 0.8,
			CacheHitRate: 0.6, CachedShare: 0.5, PrefillTokensPerMs: 14, ITLMs: 12, Busy: 0.45,
		},
		{
			// A model being retired, kept for one customer's moderation
			// checks: short requests that leave its A100 nearly idle.
			Name: "mixtral-8x7b-instruct", Version: "v0.1", Deployment: DemoIdle,
			Engine: "trt-llm", GPUType: "A100-SXM4-80GB", TensorParallelism: 1, Region: "us-west-2", Replicas: 1,
			Nodes: nodeNames("a100-usw2", 1, 1), Weight: 0.32, ContextLength: 32768, MaxOutputTokens: 4096,
			PromptMedian: 400, PromptSigma: 0.5, OutputMedian: 20, OutputSigma: 0.5,
			CacheHitRate: 0.2, PrefillTokensPerMs: 12, ITLMs: 14, Busy: 0.04,
		},
	}
}

// Fleets are the synthetic fleets by name: "default" (DefaultModels, a
// level day/night cycle) and "demo" (DemoModels, growing DemoWeeklyGrowth
// a week, with DemoErrorRate). The generator's and the samples' configs of
// one fleet agree, so that GPUs are busy when its traffic is high.
var Fleets = []string{"default", "demo"}

// FleetNamed returns the models, weekly growth and error rate (0: the
// default) of the fleet called name, and whether there is one.
func FleetNamed(name string) (models []Model, growth, errorRate float64, ok bool) {
	switch name {
	case "", "default":
		return DefaultModels(), 0, 0, true
	case "demo":
		return DemoModels(), DemoWeeklyGrowth, DemoErrorRate, true
	}
	return nil, 0, 0, false
}
