package rollup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// blockSink is an HourStore whose InsertRollupBlocks records the buckets
// of the rows it is sent, by table, and how many INSERTs it was asked for.
type blockSink struct {
	HourStore
	inserts int
	got     map[string][]time.Time
	err     error // returned after the first block
}

func (s *blockSink) InsertRollupBlocks(ctx context.Context, table string, blocks <-chan []RollupRecord, free chan<- []RollupRecord, _ uint32, _ uint64) error {
	s.inserts++
	for rows := range blocks {
		for _, r := range rows {
			s.got[table] = append(s.got[table], r.Bucket)
		}
		if s.err != nil {
			return s.err
		}
	}
	return nil
}

func TestWindowedHoursDropsMinutesBeforeTheWindow(t *testing.T) {
	from := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	before, at, after := from.Add(-time.Minute), from, from.Add(time.Hour)
	send := func(s HourStore, table string, blocks ...[]RollupRecord) error {
		ch := make(chan []RollupRecord, len(blocks))
		for _, b := range blocks {
			ch <- b
		}
		close(ch)
		return s.InsertRollupBlocks(context.Background(), table, ch, make(chan []RollupRecord, len(blocks)), 1, 1)
	}
	rows := func(buckets ...time.Time) []RollupRecord {
		var rs []RollupRecord
		for _, b := range buckets {
			rs = append(rs, RollupRecord{Bucket: b})
		}
		return rs
	}

	sink := &blockSink{got: map[string][]time.Time{}}
	w := windowedHours{sink, from}
	if err := send(w, minuteTable, rows(before, at), rows(before), rows(after, before)); err != nil {
		t.Fatal(err)
	}
	if err := send(w, "rollup_hour", rows(before, after)); err != nil {
		t.Fatal(err)
	}
	want := map[string][]time.Time{minuteTable: {at, after}, "rollup_hour": {before, after}}
	if diff := cmp.Diff(want, sink.got); diff != "" {
		t.Errorf("rows written (-want +got):\n%s", diff)
	}

	// Every row before the window: the minute INSERT gets no block, so the
	// store writes nothing (chstore writes nothing for no block).
	sink = &blockSink{got: map[string][]time.Time{}}
	if err := send(windowedHours{sink, from}, minuteTable, rows(before), rows(before, before)); err != nil {
		t.Fatal(err)
	}
	if len(sink.got[minuteTable]) != 0 {
		t.Errorf("got minute rows %v, want none", sink.got[minuteTable])
	}

	// Minutes kept for ever: everything goes through.
	sink = &blockSink{got: map[string][]time.Time{}}
	if err := send(windowedHours{sink, time.Time{}}, minuteTable, rows(before, after)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]time.Time{before, after}, sink.got[minuteTable]); diff != "" {
		t.Errorf("rows kept for ever (-want +got):\n%s", diff)
	}

	// The store's error comes back, even while blocks are still waiting.
	boom := errors.New("boom")
	sink = &blockSink{got: map[string][]time.Time{}, err: boom}
	if err := send(windowedHours{sink, from}, minuteTable, rows(at), rows(after), rows(after)); !errors.Is(err, boom) {
		t.Errorf("got error %v, want %v", err, boom)
	}
}

// engineSink is an EngineStore that records the rows it is asked to write.
type engineSink struct {
	EngineStore
	minutes, hours []time.Time
}

func (s *engineSink) WriteEngineRows(_ context.Context, minutes, hours []EngineRow, _ uint64) error {
	for _, r := range minutes {
		s.minutes = append(s.minutes, r.Bucket)
	}
	for _, r := range hours {
		s.hours = append(s.hours, r.Bucket)
	}
	return nil
}

func TestWindowedEngineDropsMinutesBeforeTheWindow(t *testing.T) {
	from := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	old, kept := from.Add(-time.Hour), from.Add(time.Minute)
	sink := &engineSink{}
	minutes := []EngineRow{{Bucket: old}, {Bucket: kept}, {Bucket: old.Add(time.Minute)}}
	hours := []EngineRow{{Bucket: old}, {Bucket: from}}
	if err := (windowedEngine{sink, from}).WriteEngineRows(context.Background(), minutes, hours, 1); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]time.Time{kept}, sink.minutes); diff != "" {
		t.Errorf("minute rows written (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]time.Time{old, from}, sink.hours); diff != "" {
		t.Errorf("hour rows written (-want +got):\n%s", diff)
	}
}

func TestMinutesFrom(t *testing.T) {
	now := time.Date(2026, 11, 27, 9, 30, 0, 0, time.UTC)
	j := &Job{now: func() time.Time { return now }, cfg: Config{MinuteRetention: 7 * 24 * time.Hour}}
	if got, want := j.minutesFrom(), time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("minutesFrom() = %v, want %v (the day DropOldMinutes keeps first)", got, want)
	}
	j.cfg.MinuteRetention = 0
	if got := j.minutesFrom(); !got.IsZero() {
		t.Errorf("minutesFrom() with minutes kept for ever = %v, want zero", got)
	}
}
