// Package timearg reads the times users type, in query parameters and
// command-line flags: RFC 3339 (the API's format), or a plain date meaning
// that day's midnight UTC. Its errors say what is wanted with an example,
// not Go's layout strings.
package timearg

import (
	"errors"
	"fmt"
	"time"
)

// ErrBadTime is wrapped by every error of Parse.
var ErrBadTime = errors.New("bad time")

// Parse reads s as an RFC 3339 time (fractional seconds allowed, any
// offset) or as a date YYYY-MM-DD, which is midnight UTC of that day. name
// is what the error calls the value (a flag or parameter name).
func Parse(name, s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%w: %s %q: want an RFC 3339 time such as 2026-11-23T00:00:00Z (or 2026-11-23T09:30:00+05:30), or a date such as 2026-11-23 for midnight UTC", ErrBadTime, name, s)
}
