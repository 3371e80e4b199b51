// Package engine owns the scraping of inference engines' own saturation
// signals: it reads vLLM, SGLang, TGI, NVIDIA NIM for LLMs and NVIDIA
// Dynamo Prometheus endpoints (Parse maps each engine's metric names, every
// generation of vLLM's, to one Reading), turns each reading into an
// EngineSample (gauges as read, counters as deltas since the replica's
// previous scrape, resets handled, engine restarts counted; Scraper), and
// the Agent that scrapes a list of targets every interval and publishes
// the samples to the meter.engine.v1 topic with acks=all, buffering what
// Kafka did not acknowledge.
//
// A target that does not answer gets no sample: it is reported down, never
// filled in. It does not own the consumer that writes samples to
// ClickHouse, the validation rules of a sample
// (ingest.Limits.ValidateEngineSample), nor the engine rollups (rollup).
package engine
