package rollup

import (
	"testing"
	"time"
)

var day = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)

func TestStepBounds(t *testing.T) {
	at := time.Date(2026, 2, 14, 13, 45, 10, 0, time.UTC)
	rangeEnd := time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		step       string
		start, end time.Time
	}{
		{"minute", time.Date(2026, 2, 14, 13, 45, 0, 0, time.UTC), time.Date(2026, 2, 14, 13, 46, 0, 0, time.UTC)},
		{"day", time.Date(2026, 2, 14, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 15, 0, 0, 0, 0, time.UTC)},
		{"month", time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		{"total", day, rangeEnd},
	} {
		start := StepStart(tt.step, at, day)
		if !start.Equal(tt.start) || !StepEnd(tt.step, start, rangeEnd).Equal(tt.end) {
			t.Errorf("%s: [%s, %s), want [%s, %s)", tt.step, start, StepEnd(tt.step, start, rangeEnd), tt.start, tt.end)
		}
	}
}
