package rollup_test

import (
	"context"
	"testing"
	"time"

	"tokenmeter/rollup"
)

// progressStore is a rollup.ProgressStore with inserts stamped at given
// server times.
type progressStore struct {
	wm           time.Time
	ok           bool
	now          time.Time
	events, gpus []time.Time // stamps
}

func (s *progressStore) ServerNow(context.Context) (time.Time, error) { return s.now, nil }
func (s *progressStore) Watermark(_ context.Context, job string) (time.Time, bool, error) {
	if job != rollup.JobName {
		return time.Time{}, false, nil
	}
	return s.wm, s.ok, nil
}
func (s *progressStore) DirtyHours(_ context.Context, since, until time.Time) ([]time.Time, error) {
	return stamped(s.events, since, until), nil
}
func (s *progressStore) GPUDirtyHours(_ context.Context, since, until time.Time) ([]time.Time, error) {
	return stamped(s.gpus, since, until), nil
}

// stamped is the hours of the stamps in [since, until), by whole seconds
// as ClickHouse compares them.
func stamped(stamps []time.Time, since, until time.Time) []time.Time {
	var out []time.Time
	for _, t := range stamps {
		if !t.Before(since.Truncate(time.Second)) && t.Before(until.Truncate(time.Second)) {
			out = append(out, t.Truncate(time.Hour))
		}
	}
	return out
}

func TestCosted(t *testing.T) {
	wm := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	settle := 5 * time.Second
	for _, c := range []struct {
		name   string
		store  progressStore
		want   time.Time
		wantOK bool
	}{
		{"before the first run", progressStore{now: wm}, time.Time{}, false},
		{"quiet since the watermark", progressStore{wm: wm, ok: true, now: wm.Add(10 * time.Minute)}, wm.Add(10*time.Minute - settle), true},
		{"quiet, until's second not covered", progressStore{wm: wm, ok: true, now: wm.Add(time.Minute + 1500*time.Millisecond)}, wm.Add(time.Minute - 4*time.Second), true},
		{"inserts before the watermark only", progressStore{wm: wm, ok: true, now: wm.Add(time.Hour),
			events: []time.Time{wm.Add(-time.Second)}, gpus: []time.Time{wm.Add(-30 * time.Second)}}, wm.Add(time.Hour - settle), true},
		{"an event at the watermark", progressStore{wm: wm, ok: true, now: wm.Add(time.Hour), events: []time.Time{wm}}, wm, true},
		{"a GPU sample since the watermark", progressStore{wm: wm, ok: true, now: wm.Add(time.Hour), gpus: []time.Time{wm.Add(20 * time.Minute)}}, wm, true},
		{"an event in the settle window", progressStore{wm: wm, ok: true, now: wm.Add(time.Hour), events: []time.Time{wm.Add(time.Hour - 2*time.Second)}},
			wm.Add(time.Hour - settle), true},
		{"server clock within settle of the watermark", progressStore{wm: wm, ok: true, now: wm.Add(2 * time.Second)}, wm, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := rollup.Costed(t.Context(), &c.store, settle)
			if err != nil || ok != c.wantOK || !got.Equal(c.want) {
				t.Errorf("Costed = %s, %v, %v; want %s, %v", got.Format(time.RFC3339Nano), ok, err, c.want.Format(time.RFC3339Nano), c.wantOK)
			}
		})
	}
}
