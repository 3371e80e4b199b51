// Package ingest owns the path of an inference event from a producer to a
// ClickHouse row: validation (the rules of ARCHITECTURE "The event"),
// decoding of Kafka records (protobuf or JSON), the publish path used by the
// API (validate, then write to Kafka with acks=all), and the consumer that
// batches records into one ClickHouse INSERT per batch, sends bad records to
// the dead-letter topic, and commits offsets only after the insert.
//
// It declares what it writes: the writers its consumers call
// (EventWriter, GPUSampleWriter, EngineSampleWriter, DeadLetterWriter)
// and, in ingest/sink, the rows and batches they carry;
// internal/adapter/chstore implements them, and ingest does not import it.
//
// It does not own the schema or the SQL (internal/adapter/chstore), nor
// authentication or the mapping of errors to status codes (api).
package ingest
