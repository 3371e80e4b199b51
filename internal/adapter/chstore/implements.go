package chstore

import (
	"tokenmeter/ingest/sink"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// The store implements what the rollup job and the read side declare they
// need. (It implements ingest's writers too; implements_test.go asserts
// those, as this package imports only ingest/sink, the records and batches
// of ingest's port, not ingest itself, whose tests open a Store.)
var (
	_ rollup.Store = (*Store)(nil)
	_ query.Source = (*Store)(nil)
	// The capacity report's freshness check of the deployment level.
	_ query.LevelVersionSource = (*Store)(nil)

	// The batches the store makes for ingest's writers.
	_ sink.EventBatch  = (*EventBatch)(nil)
	_ sink.GPUBatch    = (*GPUBatch)(nil)
	_ sink.EngineBatch = (*EngineBatch)(nil)
)
