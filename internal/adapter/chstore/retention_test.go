package chstore_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// TestMinuteRetention: migration 0012 moves the minute rows of an existing
// store into the day-partitioned table (0013 drops the old one), and
// DropMinuteDays drops whole days before the cutoff and nothing after it,
// on one server and (METER_TEST_CLUSTER=1) on every shard of a cluster.
func TestMinuteRetention(t *testing.T) {
	ctx := t.Context()
	s := chstoretest.Open(t)
	if err := s.MigrateThrough(ctx, 11); err != nil {
		t.Fatal(err)
	}
	day0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	// Four days, 24 rows each (one per hour, minute 59), for 12 tenants:
	// the tenants spread over both shards in cluster mode.
	insert := fmt.Sprintf(`INSERT INTO rollup_minute (bucket, tenant_id, requests, version)
SELECT toDateTime(%d + intDiv(number, 24) * 86400 + (number %% 24) * 3600 + 59 * 60), concat('tenant-', toString(number %% 12)), 3, 1
FROM system.numbers LIMIT 96`, day0.Unix())
	if err := s.Exec(ctx, insert); err != nil {
		t.Fatal(err)
	}
	applied, err := s.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) < 2 || !slices.Equal(applied[:2], []int{12, 13}) {
		t.Fatalf("applied %v, want 12, 13 and the later ones", applied)
	}
	// Engine minute rows of the same four days (one per hour), for two
	// deployments: dropped with the others.
	engine := fmt.Sprintf(`INSERT INTO %s (bucket, deployment, samples, version)
SELECT toDateTime(%d + intDiv(number, 24) * 86400 + (number %% 24) * 3600), concat('dep-', toString(number %% 2)), 1, 1
FROM system.numbers LIMIT 96`, chstore.EngineMinuteTable, day0.Unix())
	if err := s.Exec(ctx, engine); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Count(ctx, chstore.MinuteTable); err != nil || n != 96 {
		t.Fatalf("%s holds %d rows (%v), want the 96 copied", chstore.MinuteTable, n, err)
	}
	if _, err := s.Count(ctx, "rollup_minute"); err == nil {
		t.Fatal("rollup_minute still exists after 0013")
	}
	// A meterd that read the applied migrations before this one finished
	// runs 0012 again: its copy fails (0013 dropped the source) and the
	// record of 0012 stands in.
	if elsewhere, err := s.ApplyOnce(ctx, 12); err != nil || !elsewhere {
		t.Fatalf("0012 again after 0013: elsewhere %v, error %v; want the record to stand in", elsewhere, err)
	}
	// The cutoff lies inside day 2: days 0 and 1 go, day 2 (partly newer
	// than the cutoff) stays.
	dropped, err := s.DropMinuteDays(ctx, day0.Add(2*24*time.Hour+5*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dropped, []uint32{20261101, 20261102}) {
		t.Fatalf("dropped %v, want days 20261101 and 20261102", dropped)
	}
	if n, err := s.Count(ctx, chstore.MinuteTable); err != nil || n != 48 {
		t.Fatalf("%s holds %d rows (%v) after the drop, want 48 (days 3 and 4)", chstore.MinuteTable, n, err)
	}
	if n, err := s.Count(ctx, chstore.EngineMinuteTable); err != nil || n != 48 {
		t.Fatalf("%s holds %d rows (%v) after the drop, want 48 (days 3 and 4)", chstore.EngineMinuteTable, n, err)
	}
	// Again: nothing left to drop.
	if dropped, err := s.DropMinuteDays(ctx, day0.Add(2*24*time.Hour)); err != nil || len(dropped) != 0 {
		t.Fatalf("second drop: %v, %v; want nothing", dropped, err)
	}
	// In cluster mode a day may lie on one shard only, and the other
	// shard's server is asked to drop it too: a day without rows is no
	// error (checked here on a single server).
	single := chstoretest.OpenSingle(t)
	if _, err := single.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := single.Exec(ctx, "ALTER TABLE "+chstore.MinuteTable+" DROP PARTITION 20200101"); err != nil {
		t.Fatalf("dropping a day without rows: %v", err)
	}
}
