package rollup

import (
	"context"
	"slices"
	"time"
)

// The day policy. A day rollup row (rollup_tenant_day) sums a tenant's
// tenant-hour rows of one UTC day and records the sum of their versions
// (DayRollup.HourVersions). A day's rollup is fresh while that sum equals
// the sum of the versions of its hours' newest computations: recomputing
// an hour (late events, an SLO change) makes the day stale until
// it is rolled up again. Queries read fresh days from their day rows and
// every other day from its hours; the job rolls up the days that have
// ended (Job.dueDays).

// DayReader reads what decides whether a day's rollup is fresh.
type DayReader interface {
	// HourVersions lists the hours in [from, to) that have tenant-hour
	// rows, with their newest computation, in hour order.
	HourVersions(ctx context.Context, from, to time.Time) ([]HourVersion, error)
	// DayVersions lists the days in [from, to) that have day rows, with
	// the HourVersions of their newest row.
	DayVersions(ctx context.Context, from, to time.Time) ([]DayVersion, error)
}

// DayStore is what rolling up days needs of ClickHouse; *chstore.Store
// implements it.
type DayStore interface {
	DayReader
	// WriteDay writes the day rows of d with version.
	WriteDay(ctx context.Context, d DayRollup, version uint64) error
}

// daySums adds up the versions of hours per day (Unix seconds of its
// start): what the HourVersions of a fresh day row holds.
func daySums(hours []HourVersion) map[int64]uint64 {
	sums := map[int64]uint64{}
	for _, h := range hours {
		sums[DayOf(h.Hour).Unix()] += h.Version
	}
	return sums
}

// dayStates splits the days in [from, to) that have hour rollups into
// those with a fresh day row and those whose day row is missing or stale,
// each in order.
func dayStates(ctx context.Context, store DayReader, from, to time.Time) (fresh, stale []time.Time, err error) {
	hours, err := store.HourVersions(ctx, from, to)
	if err != nil {
		return nil, nil, err
	}
	days, err := store.DayVersions(ctx, from, to)
	if err != nil {
		return nil, nil, err
	}
	rows := make(map[int64]uint64, len(days))
	for _, d := range days {
		rows[d.Day.Unix()] = d.HourVersions
	}
	for d, sum := range daySums(hours) {
		day := time.Unix(d, 0).UTC()
		if hv, ok := rows[d]; ok && hv == sum {
			fresh = append(fresh, day)
		} else {
			stale = append(stale, day)
		}
	}
	slices.SortFunc(fresh, time.Time.Compare)
	slices.SortFunc(stale, time.Time.Compare)
	return fresh, stale, nil
}

// StaleDays lists the UTC days in [from, before) that have hour rollups but
// no fresh day rollup: never computed, or computed before one of their
// hours was recomputed, in order. From and before are rounded down to
// days; a zero from lists every stale day.
func StaleDays(ctx context.Context, store DayReader, from, before time.Time) ([]time.Time, error) {
	if from.Before(time.Unix(0, 0)) {
		from = time.Unix(0, 0)
	}
	_, stale, err := dayStates(ctx, store, DayOf(from), DayOf(before))
	return stale, err
}

// FreshDays lists the whole UTC days inside [start, end) whose day rollup
// is fresh, in order: the days a query of that range may read from day
// rows.
func FreshDays(ctx context.Context, store DayReader, start, end time.Time) ([]time.Time, error) {
	first := DayOf(start.Add(Day - time.Second))
	last := DayOf(end) // exclusive
	if !first.Before(last) {
		return nil, nil
	}
	fresh, _, err := dayStates(ctx, store, first, last)
	return fresh, err
}

// RollupDay recomputes the day rollup of the UTC day holding day from the
// newest computation of each of its hours, written with version. It
// reports false, writing nothing, when the day has no hour rollups, or
// when its hours were counted with different SLO versions (an SLO change
// being recomputed): queries then read the day's hours.
func RollupDay(ctx context.Context, store DayStore, day time.Time, version uint64) (bool, error) {
	day = DayOf(day)
	hours, err := store.HourVersions(ctx, day, day.Add(Day))
	if err != nil || len(hours) == 0 {
		return false, err
	}
	var sum uint64
	for _, h := range hours {
		if h.SLOVersion != hours[0].SLOVersion {
			return false, nil
		}
		sum += h.Version
	}
	if err := store.WriteDay(ctx, DayRollup{Day: day, Hours: hours, HourVersions: sum}, version); err != nil {
		return false, err
	}
	return true, nil
}
