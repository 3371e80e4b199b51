// Package chstoretest opens stores on the test ClickHouse of package chtest,
// one new database each, and fills them with events, for the tests of the
// packages that read and write through internal/chstore.
package chstoretest

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"tokenmeter/ingest"
	"tokenmeter/internal/chstore"
	"tokenmeter/internal/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Open opens a store on a new database of the test server, closed when the
// test ends.
func Open(t testing.TB) *chstore.Store {
	t.Helper()
	addr, db := chtest.NewDB(t)
	s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// OpenMigrated is Open with every migration applied.
func OpenMigrated(t testing.TB) *chstore.Store {
	t.Helper()
	s := Open(t)
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// Insert writes events to s in one INSERT, as ingest would (its ITL).
func Insert(t testing.TB, s *chstore.Store, events []*meterv1.InferenceEvent) {
	t.Helper()
	var b chstore.EventBatch
	for _, ev := range events {
		b.Append(ev, ingest.ITL(ev), time.Now(), chstore.Source{})
	}
	if err := s.InsertEvents(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
}
