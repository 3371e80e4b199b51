package main

import (
	"errors"
	"time"

	"tokenmeter/internal/timearg"
)

// timeRange reads --start and --end (RFC 3339 or a plain date, see
// timearg): end defaults to defaultEnd and start to a day before end.
func timeRange(start, end string, defaultEnd time.Time) (from, to time.Time, err error) {
	var errs []error
	to = defaultEnd
	if end != "" {
		if to, err = timearg.Parse("--end", end); err != nil {
			errs = append(errs, err)
		}
	}
	from = to.Add(-24 * time.Hour)
	if start != "" {
		if from, err = timearg.Parse("--start", start); err != nil {
			errs = append(errs, err)
		}
	}
	return from, to, errors.Join(errs...)
}
