// Package otlp receives OpenTelemetry traces (OTLP over gRPC and over HTTP,
// protobuf and JSON) and turns the spans of GenAI inference calls, as the
// OpenTelemetry GenAI semantic conventions describe them, into inference
// events that it publishes on the same path as POST /v1/events.
//
// It owns the mapping from span to event (which spans are inference calls,
// which attributes give tokens, model, timings, status and tenant, the
// event id derived from the trace and span ids), the reasons a GenAI span is
// rejected, the OTLP answers (partial success, status codes) and its
// metrics. It does not own validation of the events (ingest.Limits, applied
// by the publisher), the Kafka path (ingest.Publisher) nor the API keys (the
// caller's Authorizer; api.Keys implements it).
//
// docs/architecture.md, "OTLP receiver", has the mapping table.
package otlp
