package chstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"tokenmeter/internal/adapter/chstore/chstoretest"
)

// BenchmarkServingOfHours times the cost step's read of one hour's serving
// labels (engine and TP per deployment and model) over 1M events of 1,000
// tenants, 4 models and 8 deployments: what costing an hour now reads on
// top of its GPU samples and usage rows.
//
//	go test -run '^$' -bench ServingOfHours -benchtime 5x ./internal/adapter/chstore
func BenchmarkServingOfHours(b *testing.B) {
	s := chstoretest.OpenMigrated(b)
	ctx := context.Background()
	hour := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	if err := s.Exec(ctx, fmt.Sprintf(`INSERT INTO inference_events (tenant_id, event_id, model, model_version, deployment, engine,
  tensor_parallelism, gpu_type, slo_class, completed_at, completed_at_ms, status, ingested_at)
SELECT concat('tenant-', toString(number %% 1000)), toString(number), concat('m', toString(number %% 4)), 'v1',
  concat('d', toString(number %% 8)), if(number %% 8 = 0 AND number > 500000, 'sglang', 'vllm'), toUInt32(2 + 2 * (number %% 2)),
  'H100', 'interactive', toDateTime(%d + intDiv(number * 3600, 1000000)), (%d + intDiv(number * 3600, 1000000)) * 1000, 'ok', now()
FROM system.numbers LIMIT 1000000`, hour.Unix(), hour.Unix())); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rows, err := s.ServingOfHours(ctx, hour, hour.Add(time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		if len(rows) == 0 {
			b.Fatal("no serving rows")
		}
	}
}
