package chstore_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"tokenmeter/internal/chstore"
	"tokenmeter/internal/chtest"
)

func TestMain(m *testing.M) { chtest.Main(m) }

func openStore(t *testing.T) *chstore.Store {
	t.Helper()
	addr, db := chtest.NewDB(t)
	s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openMigratedStore is openStore with every migration applied.
func openMigratedStore(t *testing.T) *chstore.Store {
	t.Helper()
	s := openStore(t)
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMigrateIdempotent(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	first, err := s.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	migs, _ := chstore.Migrations()
	if len(first) != len(migs) {
		t.Fatalf("first Migrate applied %v, want all %d", first, len(migs))
	}
	second, err := s.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(second) != 0 {
		t.Fatalf("second Migrate applied %v, want none", second)
	}
	applied, err := s.AppliedMigrations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if !applied[m.Version] {
			t.Errorf("migration %d not recorded", m.Version)
		}
	}
	// A run that stopped before recording its migrations (or a replica
	// migrating at the same time) leaves them applied but unrecorded: they
	// run again, a column added already included.
	if err := s.Exec(ctx, "TRUNCATE TABLE schema_migrations"); err != nil {
		t.Fatal(err)
	}
	third, err := s.Migrate(ctx)
	if err != nil {
		t.Fatalf("Migrate over applied but unrecorded migrations: %v", err)
	}
	if len(third) != len(migs) {
		t.Fatalf("Migrate over unrecorded migrations applied %v, want all %d", third, len(migs))
	}
}
