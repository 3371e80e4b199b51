package rollup

import (
	"context"
	"errors"
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
