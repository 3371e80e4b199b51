package chstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chcluster"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
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

	// Data on both shards, then every migration run again, as a meterd
	// that read no record of them would: 0004's drop of gpu_samples must
	// not drop the table it created, nor anything else lose a row.
	var gpus chstore.GPUBatch
	var events chstore.EventBatch
	now := time.Now().UTC().Truncate(time.Second)
	for i := range 40 {
		gpus.Append(&meterv1.GpuSample{SampleId: fmt.Sprintf("g%d", i), Node: "n", GpuUuid: fmt.Sprintf("GPU-%d", i),
			Deployment: fmt.Sprintf("d%d", i%5), SampledAt: timestamppb.New(now.Add(-time.Duration(i) * time.Second)), IntervalS: 1}, now)
		ev := &meterv1.InferenceEvent{EventId: fmt.Sprintf("e%d", i), TenantId: fmt.Sprintf("t%d", i%7), Model: "m", Deployment: "d",
			CompletedAt: timestamppb.New(now.Add(-time.Duration(i) * time.Second))}
		events.Append(ev, sink.ITL{}, now, sink.Source{})
	}
	if err := s.InsertGPUSamples(ctx, &gpus); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertEvents(ctx, &events); err != nil {
		t.Fatal(err)
	}
	if err := other.Reapply(ctx); err != nil {
		t.Fatalf("migrations run again: %v", err)
	}
	for table, want := range map[string]uint64{"gpu_samples": 40, "inference_events": 40} {
		if n, err := s.Count(ctx, table); err != nil || n != want {
			t.Errorf("%s after the migrations ran again: %d rows (%v), want %d", table, n, err, want)
		}
	}

	// Read after write across replicas: a store on shard 1's second
	// replica, which fetches nothing from the first, still reads what a
	// store on another server has just written (both go to the first
	// live replica of each shard; the second's own copy is not read).
	if err := c.Exec(0, 1, "SYSTEM STOP FETCHES "+db+".inference_events_local"); err != nil {
		t.Fatal(err)
	}
	var more chstore.EventBatch
	for i := range 60 {
		ev := &meterv1.InferenceEvent{EventId: fmt.Sprintf("late%d", i), TenantId: fmt.Sprintf("t%d", i%7), Model: "m", Deployment: "d",
			CompletedAt: timestamppb.New(now)}
		more.Append(ev, sink.ITL{}, now, sink.Source{})
	}
	if err := s.InsertEvents(ctx, &more); err != nil {
		t.Fatal(err)
	}
	if n, err := other.Count(ctx, "inference_events"); err != nil || n != 100 {
		t.Errorf("a store on shard 1's second replica reads %d events (%v) right after a store on shard 2 wrote 100", n, err)
	}
	if err := c.Exec(0, 1, "SYSTEM START FETCHES "+db+".inference_events_local"); err != nil {
		t.Fatal(err)
	}
}
