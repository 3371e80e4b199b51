// Package sink declares what ingest writes to its store: the rows the
// decoders fill and the consumer validates (EventRow, GPURow, and the
// values they are made of), the batches that carry them to the store
// (EventBatch, GPUBatch, EngineBatch), the identity of an event (EventKey,
// EventRow.Fingerprint, StoredEvent) and the dead letters kept when the
// dead-letter topic refuses them (DeadLetter).
//
// It is the data half of ingest's store port; the other half, the writer
// interfaces the consumer calls (ingest.EventWriter, GPUSampleWriter,
// EngineSampleWriter, DeadLetterWriter), is in package ingest.
// internal/adapter/chstore implements both: it imports this package, and
// neither ingest nor sink imports it. It does not own the schema, the
// column layout or the SQL (chstore), nor the rules of what is valid or how
// ITL is derived (ingest).
package sink
