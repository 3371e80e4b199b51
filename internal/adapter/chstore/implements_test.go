package chstore_test

import (
	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/chstore"
)

// The store implements the writers ingest's consumers declare. (Asserted
// here, not in implements.go: chstore does not import ingest, so that
// ingest's own tests can open a Store.)
var (
	_ ingest.EventWriter        = (*chstore.Store)(nil)
	_ ingest.GPUSampleWriter    = (*chstore.Store)(nil)
	_ ingest.EngineSampleWriter = (*chstore.Store)(nil)
	_ ingest.DeadLetterWriter   = (*chstore.Store)(nil)
)
