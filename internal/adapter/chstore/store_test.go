package chstore_test

import (
	"context"
	"testing"
	"tokenmeter/internal/adapter/chstore/chstoretest"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
)

func TestMain(m *testing.M) { chtest.Main(m) }

func TestMigrateIdempotent(t *testing.T) {
	s := chstoretest.Open(t)
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
