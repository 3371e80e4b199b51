package query_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"tokenmeter/internal/chstore"
	"tokenmeter/internal/chtest"
	"tokenmeter/query"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// openMigratedStore opens a store on a new database of the test server.
func openMigratedStore(t *testing.T) *chstore.Store {
	t.Helper()
	addr, db := chtest.NewDB(t)
	s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// reads is the read side over s.
func reads(s *chstore.Store) *query.Service { return query.New(s, query.Config{}) }

// day is the day the tests' events happen on.
var day = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
