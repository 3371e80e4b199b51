package chstore

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// MinuteTable holds the minute rollup rows, partitioned by UTC day so that
// days outside the retention window are dropped whole (migration 0012).
const MinuteTable = "rollup_minute_recent"

// EngineMinuteTable holds the engine minute rows, partitioned by UTC day
// like MinuteTable (migration 0014).
const EngineMinuteTable = "engine_minute"

// DropMinuteDays drops the days of minute rows (of MinuteTable and
// EngineMinuteTable) that lie wholly before before (UTC days; the day
// holding before is kept) and returns the days dropped from either, as
// YYYYMMDD, in order. Each day is one partition: on a single server one
// ALTER TABLE … DROP PARTITION; in cluster mode the same on one server of
// each shard's local table, which replication takes to the shard's other
// replicas. A day that comes back (the rollup job recomputed an old hour
// after a late event) is dropped again by the next call.
func (s *Store) DropMinuteDays(ctx context.Context, before time.Time) ([]uint32, error) {
	var all []uint32
	for _, table := range []string{MinuteTable, EngineMinuteTable} {
		days, err := s.dropDays(ctx, table, before)
		all = append(all, days...)
		if err != nil {
			return all, err
		}
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

// dropDays drops the days of table's rows wholly before before.
func (s *Store) dropDays(ctx context.Context, table string, before time.Time) ([]uint32, error) {
	cutoff := before.UTC().Truncate(24 * time.Hour)
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT toYYYYMMDD(bucket, 'UTC') AS day FROM "+table+" WHERE bucket < toDateTime(?) ORDER BY day", cutoff.Unix())
	if err != nil {
		return nil, fmt.Errorf("days of %s rows before %s: %w", table, cutoff.Format(time.DateOnly), classify(err))
	}
	var days []uint32
	for rows.Next() {
		var d uint32
		if err := rows.Scan(&d); err != nil {
			rows.Close()
			return nil, fmt.Errorf("days of %s rows: %w", table, err)
		}
		days = append(days, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("days of %s rows: %w", table, classify(err))
	}
	for i, d := range days {
		var err error
		if s.cfg.Cluster == "" {
			err = s.conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DROP PARTITION %d", table, d))
		} else {
			err = s.onEachShard(ctx, fmt.Sprintf("ALTER TABLE %s.%s%s DROP PARTITION %d", s.cfg.Database, table, localSuffix, d))
		}
		if err != nil {
			return days[:i], fmt.Errorf("drop %s rows of %d: %w", table, d, classify(err))
		}
	}
	return days, nil
}
