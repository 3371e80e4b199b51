// Package workload produces inference events for replays, tests and
// benchmarks: deterministic synthetic traffic (Generator) and events built
// from the public Azure LLM inference traces (ReadAzureCSV, AzureReader).
//
// Synthetic traffic looks like a small multi-tenant serving fleet: tenants
// with Zipf-skewed shares, several models each on its own deployment (engine,
// GPU type, tensor parallelism, region, nodes), log-normal prompt and output
// lengths, prefix-cache hits, a day/night cycle, latencies that obey the
// definitions of ARCHITECTURE.md (TTFT ≥ queue + prefill, E2E = TTFT +
// ITL × (output_tokens − 1), received_at = completed_at − E2E) and a small
// mix of failed requests. The same Config always yields the same events.
//
// The package owns no I/O beyond reading a trace from an io.Reader: sending
// events is the caller's business (cmd/meterctl replay), and what the server
// accepts is decided by package ingest, not here.
package workload
