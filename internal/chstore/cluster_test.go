package chstore_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/chcluster"
	"tokenmeter/internal/chstore"
)

// TestClusterMigrate applies every migration in cluster mode on a real
// cluster of two shards (the first with two replicas): each server has the
// local tables, replicated, and the Distributed tables over them, and a
// second run (or one over migrations applied but not recorded) changes
// nothing.
func TestClusterMigrate(t *testing.T) {
	c := chcluster.Start(t, chcluster.Layout{})
	db := c.NewDB(t)
	// Every role of every replica migrates as it starts: two at once.
	open := func(addr string) *chstore.Store {
		s, err := chstore.Open(chstore.Config{Addr: []string{addr}, Database: db, Cluster: c.Name()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	s, other := open(c.Addr(1, 0)), open(c.Addr(0, 1))
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	var otherErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, otherErr = other.Migrate(ctx)
	}()
	_, err := s.Migrate(ctx)
	wg.Wait()
	if err != nil || otherErr != nil {
		t.Fatalf("two Migrates at once: %v; %v", err, otherErr)
	}
	t.Logf("cluster migration, two at once: %v", time.Since(start))
	// Both recorded each migration, in the same second: the second insert
	// of a block was dropped as a duplicate by the replicated table, and
	// the server s talks to may not have fetched the first yet.
	if err := s.Exec(ctx, "SYSTEM SYNC REPLICA "+db+".schema_migrations"); err != nil {
		t.Fatal(err)
	}
	migs, _ := chstore.Migrations()
	applied, err := s.AppliedMigrations(ctx)
	if err != nil || len(applied) != len(migs) {
		t.Fatalf("applied %v (%v), want all %d", applied, err, len(migs))
	}
	if again, err := s.Migrate(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second Migrate applied %v (%v), want none", again, err)
	}
	for _, addr := range c.Addrs() {
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, "SELECT name, engine FROM system.tables WHERE database = ?", db)
		if err != nil {
			t.Fatal(err)
		}
		engines := map[string]string{}
		for rows.Next() {
			var name, engine string
			if err := rows.Scan(&name, &engine); err != nil {
				t.Fatal(err)
			}
			engines[name] = engine
		}
		rows.Close()
		conn.Close()
		for name, want := range map[string]string{
			"inference_events": "Distributed", "inference_events_local": "ReplicatedReplacingMergeTree",
			"rollup_hour": "Distributed", "rollup_hour_local": "ReplicatedReplacingMergeTree",
			"gpu_samples": "Distributed", "gpu_samples_local": "ReplicatedReplacingMergeTree",
			"dirty_hours_local": "ReplicatedMergeTree", "dirty_hours_mv": "MaterializedView",
			"price_books": "ReplicatedMergeTree", "schema_migrations": "ReplicatedMergeTree",
		} {
			if engines[name] != want {
				t.Errorf("%s: table %s has engine %q, want %q", addr, name, engines[name], want)
			}
		}
	}
}
