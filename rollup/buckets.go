package rollup

import "time"

// Time buckets: the steps queries are answered in and the hours and days
// the rollups are kept in, all aligned in UTC.

// Granularities maps a granularity name to its bucket width in seconds;
// "total" (0) is one bucket for the whole range, "month" (-1) calendar
// months. Buckets are aligned in UTC.
var Granularities = map[string]int64{"minute": 60, "hour": 3600, "day": 86400, "month": -1, "total": 0}

// StepStart is the start of the step of the given granularity that holds t;
// for "total", rangeStart.
func StepStart(step string, t, rangeStart time.Time) time.Time {
	switch w := Granularities[step]; {
	case w > 0:
		return time.Unix(t.Unix()/w*w, 0).UTC()
	case w < 0:
		t = t.UTC()
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return rangeStart.UTC()
}

// StepEnd is the end of the step starting at start, clipped to rangeEnd.
func StepEnd(step string, start, rangeEnd time.Time) time.Time {
	var end time.Time
	switch w := Granularities[step]; {
	case w > 0:
		end = start.Add(time.Duration(w) * time.Second)
	case w < 0:
		end = start.AddDate(0, 1, 0)
	default:
		return rangeEnd
	}
	if end.After(rangeEnd) {
		return rangeEnd
	}
	return end
}

// Day is the span of a rollup_tenant_day row: a UTC day.
const Day = 24 * time.Hour

// DayOf returns the UTC day holding t: the start of its step of a day.
func DayOf(t time.Time) time.Time {
	return StepStart("day", t, time.Time{})
}
