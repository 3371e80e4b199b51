package chstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// BenchmarkStoredEvents times one batch's lookup in the event id index
// (20,000 random keys, half of them stored) as the index grows: the cost
// a consumer pays per batch on top of its inserts.
//
//	go test -run '^$' -bench StoredEvents -benchtime 5x ./internal/adapter/chstore
func BenchmarkStoredEvents(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("index=%d", n), func(b *testing.B) {
			s := chstoretest.OpenMigrated(b)
			ctx := context.Background()
			if err := s.Exec(ctx, fmt.Sprintf(`INSERT INTO event_ids (key_hash, tenant_id, event_id, completed_at_ms, fingerprint, ingested_at, source_partition, source_offset)
SELECT cityHash64(concat('t', toString(number %% 100), '\0', toString(number))), concat('t', toString(number %% 100)), toString(number), 0, number, now(), 0, 0
FROM system.numbers LIMIT %d`, n)); err != nil {
				b.Fatal(err)
			}
			if err := s.Exec(ctx, "OPTIMIZE TABLE event_ids FINAL"); err != nil {
				b.Fatal(err)
			}
			keys := make([]uint64, 20_000)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for k := range keys {
					id := rand.IntN(2 * n) // half of them stored
					keys[k] = sink.EventKey(fmt.Sprintf("t%d", id%100), fmt.Sprint(id))
				}
				b.StartTimer()
				found, err := s.StoredEvents(ctx, keys)
				if err != nil {
					b.Fatal(err)
				}
				if len(found) == 0 {
					b.Fatal("no stored key found")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(keys)), "µs/event")
		})
	}
}
