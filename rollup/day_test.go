package rollup_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"tokenmeter/rollup"
)

// dayFake holds hour computations and day rows in memory.
type dayFake struct {
	hours   []rollup.HourVersion // newest computation per hour
	days    map[int64]uint64     // day → HourVersions of its newest row
	written []rollup.DayRollup
}

func (f *dayFake) HourVersions(_ context.Context, from, to time.Time) ([]rollup.HourVersion, error) {
	var out []rollup.HourVersion
	for _, h := range f.hours {
		if !h.Hour.Before(from) && h.Hour.Before(to) {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b rollup.HourVersion) int { return a.Hour.Compare(b.Hour) })
	return out, nil
}

func (f *dayFake) DayVersions(_ context.Context, from, to time.Time) ([]rollup.DayVersion, error) {
	var out []rollup.DayVersion
	for d, hv := range f.days {
		if day := time.Unix(d, 0).UTC(); !day.Before(from) && day.Before(to) {
			out = append(out, rollup.DayVersion{Day: day, HourVersions: hv})
		}
	}
	return out, nil
}

func (f *dayFake) WriteDay(_ context.Context, d rollup.DayRollup, _ uint64) error {
	f.days[d.Day.Unix()] = d.HourVersions
	f.written = append(f.written, d)
	return nil
}

// recompute records a new computation of hour.
func (f *dayFake) recompute(hour time.Time, version uint64, slo uint32) {
	for i, h := range f.hours {
		if h.Hour.Equal(hour) {
			f.hours[i] = rollup.HourVersion{Hour: hour, Version: version, SLOVersion: slo}
			return
		}
	}
	f.hours = append(f.hours, rollup.HourVersion{Hour: hour, Version: version, SLOVersion: slo})
}

// TestDayPolicy checks which days are stale and fresh, and what rolling up
// a day writes: a day is fresh while its row's HourVersions is the sum of
// its hours' newest versions; a day of hours counted with two SLO
// versions, or without hours, is not rolled up.
func TestDayPolicy(t *testing.T) {
	ctx := context.Background()
	day0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	days := func(ds ...int) []time.Time {
		var out []time.Time
		for _, d := range ds {
			out = append(out, day0.Add(time.Duration(d)*rollup.Day))
		}
		return out
	}
	f := &dayFake{days: map[int64]uint64{}}
	for h := range 60 { // days 0 and 1, half of day 2
		f.recompute(day0.Add(time.Duration(h)*time.Hour), uint64(100+h), 1)
	}
	check := func(what string, wantStale, wantFresh []time.Time) {
		t.Helper()
		stale, err := rollup.StaleDays(ctx, f, time.Time{}, day0.Add(10*rollup.Day))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantStale, stale, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: stale days (-want +got):\n%s", what, diff)
		}
		fresh, err := rollup.FreshDays(ctx, f, day0, day0.Add(10*rollup.Day))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantFresh, fresh, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: fresh days (-want +got):\n%s", what, diff)
		}
	}
	check("no day rolled up", days(0, 1, 2), nil)

	// Rolling up day 0 from any time in it writes the sum of its hours'
	// versions, from its 24 hours.
	if ok, err := rollup.RollupDay(ctx, f, day0.Add(5*time.Hour+3*time.Minute), 7); err != nil || !ok {
		t.Fatalf("roll up day 0: %v, %v", ok, err)
	}
	var sum uint64
	for h := range 24 {
		sum += uint64(100 + h)
	}
	if w := f.written[0]; !w.Day.Equal(day0) || len(w.Hours) != 24 || w.HourVersions != sum {
		t.Errorf("day 0 written as %v with %d hours, sum %d; want %v, 24 hours, sum %d", w.Day, len(w.Hours), w.HourVersions, day0, sum)
	}
	check("day 0 rolled up", days(1, 2), days(0))
	// Only whole days of the range are fresh days of it.
	for _, r := range []struct{ start, end time.Time }{
		{day0.Add(time.Second), day0.Add(10 * rollup.Day)},
		{day0, day0.Add(rollup.Day - time.Second)},
	} {
		if fresh, err := rollup.FreshDays(ctx, f, r.start, r.end); err != nil || len(fresh) != 0 {
			t.Errorf("fresh days of [%s, %s): %v, %v; want none", r.start, r.end, fresh, err)
		}
	}
	// A day ends where before's day starts.
	if stale, err := rollup.StaleDays(ctx, f, day0, day0.Add(2*rollup.Day+5*time.Hour)); err != nil || !slices.Equal(stale, days(1)) {
		t.Errorf("stale days before day 2's 5 am: %v, %v; want %v", stale, err, days(1))
	}

	// An hour of day 0 recomputed: day 0 is stale until rolled up again.
	f.recompute(day0.Add(5*time.Hour), 1000, 1)
	check("an hour of day 0 recomputed", days(0, 1, 2), nil)
	if ok, err := rollup.RollupDay(ctx, f, day0, 8); err != nil || !ok {
		t.Fatalf("roll up day 0 again: %v, %v", ok, err)
	}
	check("day 0 rolled up again", days(1, 2), days(0))

	// An hour of day 1 counted with another SLO version: not rolled up.
	f.recompute(day0.Add(rollup.Day+3*time.Hour), 1001, 2)
	if ok, err := rollup.RollupDay(ctx, f, day0.Add(rollup.Day), 9); err != nil || ok {
		t.Errorf("roll up a day of two SLO versions: %v, %v; want not rolled up", ok, err)
	}
	if ok, err := rollup.RollupDay(ctx, f, day0.Add(5*rollup.Day), 10); err != nil || ok {
		t.Errorf("roll up a day without hours: %v, %v; want not rolled up", ok, err)
	}
	if len(f.written) != 2 {
		t.Errorf("%d day rollups written, want 2", len(f.written))
	}
	check("day 1 of two SLO versions", days(1, 2), days(0))
}
