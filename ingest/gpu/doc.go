// Package gpu owns the node side of GPU metering: reading GPU (and MIG
// instance) telemetry from a Source — DCGM through go-dcgm, NVML through
// go-nvml (where the driver is installed but DCGM is not), a scrape of
// NVIDIA dcgm-exporter's /metrics, or a replay file — attributing each GPU to
// a deployment, and the Agent that stamps the readings into GpuSample records
// (sampled_at, interval_s, sample_id) and publishes them to the meter.gpu.v1
// topic with acks=all, buffering what Kafka did not acknowledge.
//
// A sample covers interval_s seconds of one GPU or MIG instance (ARCHITECTURE
// "GPU time and cost"); gaps in observation are left as gaps, not stretched
// over. A MIG-enabled GPU is reported as its GPU instances only, each with
// its fraction of the card; card-wide power and energy are split by that
// fraction, and slices not carved into an instance are not reported.
//
// It does not own the consumer that writes samples to ClickHouse (ingest),
// the validation rules of a sample (ingest.Limits.ValidateGPUSample), nor
// prices, cost rollups and allocation to tenants (rollup).
package gpu
