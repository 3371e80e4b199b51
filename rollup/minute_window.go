package rollup

import (
	"context"
	"time"
)

// The job writes no minute rows of hours before the minute retention
// window: DropOldMinutes would drop them at the end of the run. A run that
// recomputes weeks of hours (make run's demo replays five) otherwise wrote
// a part per day and minute table at every INSERT, and a dev data
// directory held 70-110 MB of them between sweeps. Hour and day rows,
// busiest minutes included, are counted in memory from the events and are
// written whatever the hour.

// minuteTable is the table of the usage minute rows (chstore.MinuteTable).
const minuteTable = "rollup_minute_recent"

// minutesFrom returns where the minute rows the job keeps begin: the UTC
// day of now less MinuteRetention (DropOldMinutes drops the days before
// it), or the zero time when they are kept for ever.
func (j *Job) minutesFrom() time.Time {
	if j.cfg.MinuteRetention <= 0 {
		return time.Time{}
	}
	return j.now().Add(-j.cfg.MinuteRetention).UTC().Truncate(24 * time.Hour)
}

// windowedHours is an HourStore that writes no minute rows before from
// (none when from is zero).
type windowedHours struct {
	HourStore
	from time.Time
}

// InsertRollupBlocks writes the blocks of the minute table without their
// rows before from, and the other tables' as they are. A block left empty
// goes back to free; nothing is written when every row is before from.
func (s windowedHours) InsertRollupBlocks(ctx context.Context, table string, blocks <-chan []RollupRecord, free chan<- []RollupRecord, sloVersion uint32, version uint64) error {
	if table != minuteTable || s.from.IsZero() {
		return s.HourStore.InsertRollupBlocks(ctx, table, blocks, free, sloVersion, version)
	}
	kept := make(chan []RollupRecord)
	done := make(chan error, 1)
	go func() { done <- s.HourStore.InsertRollupBlocks(ctx, table, kept, free, sloVersion, version) }()
	for {
		var rows []RollupRecord
		var ok bool
		select {
		case rows, ok = <-blocks:
		case err := <-done: // the insert ended early: it failed
			return err
		case <-ctx.Done():
			// kept stays open: closed, it would read as the end of the
			// data, and the insert could send the hours so far.
			<-done
			return ctx.Err()
		}
		if !ok {
			close(kept)
			return <-done
		}
		n := 0
		for _, r := range rows {
			if !r.Bucket.Before(s.from) {
				rows[n] = r
				n++
			}
		}
		clear(rows[n:]) // drop the histograms they hold
		if rows = rows[:n]; n == 0 {
			select {
			case free <- rows:
			default:
			}
			continue
		}
		select {
		case kept <- rows:
		case err := <-done:
			return err
		case <-ctx.Done():
			// kept stays open: closed, it would read as the end of the
			// data, and the insert could send the hours so far.
			<-done
			return ctx.Err()
		}
	}
}

// windowedEngine is an EngineStore that writes no engine minute rows before
// from (none when from is zero).
type windowedEngine struct {
	EngineStore
	from time.Time
}

// WriteEngineRows writes the hour rows and the minute rows from from on.
func (s windowedEngine) WriteEngineRows(ctx context.Context, minutes, hours []EngineRow, version uint64) error {
	if !s.from.IsZero() {
		n := 0
		for _, r := range minutes {
			if !r.Bucket.Before(s.from) {
				minutes[n] = r
				n++
			}
		}
		clear(minutes[n:])
		minutes = minutes[:n]
	}
	return s.EngineStore.WriteEngineRows(ctx, minutes, hours, version)
}
