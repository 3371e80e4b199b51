package chstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/rollup"
)

// TestReadHourHashCollision checks that an hour whose events of two
// different groups carry the same group_hash is refused rather than rolled
// up as one group. group_hash is made insertable for the test (a DEFAULT
// instead of a MATERIALIZED column) to force the collision.
func TestReadHourHashCollision(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	if err := s.Exec(ctx, "ALTER TABLE inference_events MODIFY COLUMN group_hash UInt64 DEFAULT cityHash64(tenant_id, model, model_version, deployment, gpu_type, slo_class)"); err != nil {
		t.Fatal(err)
	}
	hour := readDay.Add(5 * time.Hour)
	read := func() error {
		return s.ReadHour(ctx, hour, func(rollup.HourGroup) error { return nil }, func(*rollup.HourEvent) error { return nil })
	}
	at := hour.Add(10 * time.Minute).Unix()
	insert := func(tenant, eventID string) {
		t.Helper()
		// INSERT … SELECT: the driver sends INSERT … VALUES as a batch.
		if err := s.Exec(ctx, fmt.Sprintf(`INSERT INTO inference_events (tenant_id, event_id, model, completed_at, status, group_hash)
SELECT '%s', '%s', 'm1', toDateTime(%d), 'ok', toUInt64(42)`, tenant, eventID, at)); err != nil {
			t.Fatal(err)
		}
	}
	// Two events of one group sharing its hash: fine.
	insert("acme", "e1")
	insert("acme", "e2")
	if err := read(); err != nil {
		t.Fatalf("one group: %v", err)
	}
	insert("globex", "e3")
	if err := read(); err == nil || !strings.Contains(err.Error(), "share the hash") {
		t.Errorf("two groups with one hash: err = %v, want them refused", err)
	}
}

// readDay is the day of the test's events.
var readDay = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
