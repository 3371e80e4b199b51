package rollup

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestEachHour(t *testing.T) {
	j := &Job{now: func() time.Time { return time.UnixMilli(1_000) }, replica: 3}
	base := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	var hours []time.Time
	for i := range 6 {
		hours = append(hours, base.Add(time.Duration(i)*time.Hour))
	}

	var (
		mu       sync.Mutex
		running  int
		most     int
		versions = map[time.Time]uint64{}
	)
	both := make(chan struct{}) // closed once hoursAtOnce calls run at once
	var once sync.Once
	err := j.eachHour(context.Background(), hours, func(ctx context.Context, h time.Time, version uint64) error {
		mu.Lock()
		running++
		most = max(most, running)
		versions[h] = version
		if running == hoursAtOnce {
			once.Do(func() { close(both) })
		}
		mu.Unlock()
		if h.Before(hours[hoursAtOnce]) {
			// The first hours wait for each other: they must run at once.
			select {
			case <-both:
			case <-time.After(5 * time.Second):
				return errors.New("the first hours did not run at once")
			}
		}
		time.Sleep(20 * time.Millisecond) // long enough for any others to start
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if most != hoursAtOnce {
		t.Errorf("at most %d hours at once, want %d", most, hoursAtOnce)
	}
	for i := 1; i < len(hours); i++ {
		if versions[hours[i]] <= versions[hours[i-1]] {
			t.Errorf("version of hour %d (%d) not above hour %d's (%d)", i, versions[hours[i]], i-1, versions[hours[i-1]])
		}
	}

	// A failure ends the run with its error; hours not started yet see a
	// canceled context.
	failed := errors.New("no ClickHouse")
	var canceled int
	err = j.eachHour(context.Background(), hours, func(ctx context.Context, h time.Time, _ uint64) error {
		switch {
		case h.Equal(hours[0]):
			return failed
		case !h.After(hours[2]):
			// Hold the other slot until the failure cancels the run, so
			// that the later hours start after it, however the goroutines
			// are scheduled.
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
				return errors.New("the failure did not cancel the run")
			}
			return ctx.Err()
		}
		mu.Lock()
		if ctx.Err() != nil {
			canceled++
		}
		mu.Unlock()
		return ctx.Err()
	})
	if !errors.Is(err, failed) {
		t.Errorf("error %v, want %v", err, failed)
	}
	if canceled != len(hours)-3 {
		t.Errorf("%d of the last %d hours saw a canceled context", canceled, len(hours)-3)
	}
}

// staleDaysStore holds the days of stale as days with an hour rollup and
// no day rollup; asked counts the reads of the hours.
type staleDaysStore struct {
	Store
	stale []time.Time
	asked int
}

func (f *staleDaysStore) HourVersions(_ context.Context, from, to time.Time) ([]HourVersion, error) {
	f.asked++
	var out []HourVersion
	for _, d := range f.stale {
		if !d.Before(from) && d.Before(to) {
			out = append(out, HourVersion{Hour: d, Version: 1})
		}
	}
	return out, nil
}

func (f *staleDaysStore) DayVersions(context.Context, time.Time, time.Time) ([]DayVersion, error) {
	return nil, nil
}

func TestDueDays(t *testing.T) {
	day := func(i int) time.Time { return time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, i) }
	f := &staleDaysStore{}
	for i := range 30 {
		f.stale = append(f.stale, day(i))
	}
	j := &Job{store: f}
	until := day(30).Add(5 * time.Hour) // day 30 has not ended

	// The first run: the newest daysPerRun stale days, and the ended days
	// of the hours recomputed; not the current day.
	hours := []time.Time{day(2).Add(3 * time.Hour), day(2).Add(4 * time.Hour), day(30).Add(time.Hour)}
	got, done, err := j.dueDays(context.Background(), hours, until)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Time{day(2)}
	for i := 30 - daysPerRun; i < 30; i++ {
		want = append(want, day(i))
	}
	if done || !slices.Equal(got, want) {
		t.Errorf("first run: %v, done %v; want %v, not done", got, done, want)
	}

	// Once the backlog is done, runs in the same day do not ask again.
	f.stale = f.stale[:30-daysPerRun]
	if got, done, _ = j.dueDays(context.Background(), nil, until); !done || len(got) != 30-daysPerRun {
		t.Errorf("second run: %v, done %v; want the %d days left, done", got, done, 30-daysPerRun)
	}
	j.daysBefore = day(30)
	f.stale, f.asked = nil, 0
	if got, _, _ = j.dueDays(context.Background(), hours[2:], until); len(got) != 0 || f.asked != 0 {
		t.Errorf("run later that day: %v, asked %d times; want none, not asked", got, f.asked)
	}

	// The next day: the day that has just ended is checked.
	f.stale = []time.Time{day(29), day(30)}
	if got, done, _ = j.dueDays(context.Background(), nil, day(31).Add(time.Minute)); !done || !slices.Equal(got, []time.Time{day(30)}) {
		t.Errorf("next day: %v, done %v; want %v, done", got, done, day(30))
	}
}
