package billing

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// Billing periods (ARCHITECTURE "Rollups, late data, periods"): a tenant is
// billed per calendar month of its own time zone. A period closes into
// immutable statements once it has ended, a grace delay has passed and
// ingest has caught up past its end; this file holds the calendar and that
// rule, not the statements or their storage.

// Errors of periods.
var (
	// ErrInvalidPeriod marks a period key or time zone that does not parse.
	ErrInvalidPeriod = errors.New("invalid billing period")
	// ErrPeriodNotEnded marks a close asked before the period ended and its
	// grace delay passed.
	ErrPeriodNotEnded = errors.New("billing period not over")
	// ErrIngestBehind marks a close asked while ingest has not yet caught up
	// past the period's end: events still in flight could be missed.
	ErrIngestBehind = errors.New("ingest has not caught up past the period's end")
)

// DefaultGrace is how long after its end a period may be closed by default:
// late events within it land in the period itself.
const DefaultGrace = 24 * time.Hour

// Period is one calendar month of a time zone, the span a statement bills.
type Period struct {
	// Key names the month, "2026-11".
	Key string
	// Zone is the tenant's time zone; Start and End are its month's first
	// instants, Start inclusive, End exclusive.
	Zone       *time.Location
	Start, End time.Time
}

// offsetZone matches a fixed offset from UTC: "+05:30", "-08:00", "+0530".
var offsetZone = regexp.MustCompile(`^([+-])(\d{2}):?(\d{2})$`)

// ParseZone reads a tenant's time zone: "UTC" (or empty), a fixed offset
// such as "+05:30" or "-08:00" (any whole minute up to ±14:00), or an IANA
// name such as "Europe/Berlin", whose offset follows the zone's rules
// (daylight saving time included). Errors wrap ErrInvalidPeriod.
func ParseZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" || name == "Z" {
		return time.UTC, nil
	}
	if m := offsetZone.FindStringSubmatch(name); m != nil {
		h, _ := strconv.Atoi(m[2])
		min, _ := strconv.Atoi(m[3])
		if min > 59 || h*60+min > 14*60 {
			return nil, fmt.Errorf("%w: time zone offset %q: want at most ±14:00", ErrInvalidPeriod, name)
		}
		secs := (h*60 + min) * 60
		if m[1] == "-" {
			secs = -secs
		}
		return time.FixedZone(m[1]+m[2]+":"+m[3], secs), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w: time zone %q: want UTC, an offset such as +05:30, or an IANA name such as Europe/Berlin", ErrInvalidPeriod, name)
	}
	return loc, nil
}

// monthOf is the period of the month starting at year and month in zone.
func monthOf(year int, month time.Month, zone *time.Location) Period {
	start := time.Date(year, month, 1, 0, 0, 0, 0, zone)
	return Period{
		Key:   fmt.Sprintf("%04d-%02d", start.Year(), int(start.Month())),
		Zone:  zone,
		Start: start,
		End:   start.AddDate(0, 1, 0),
	}
}

// PeriodOf is the period of zone holding the instant t.
func PeriodOf(t time.Time, zone *time.Location) Period {
	local := t.In(zone)
	return monthOf(local.Year(), local.Month(), zone)
}

// periodKey matches a month key, "2026-11".
var periodKey = regexp.MustCompile(`^(\d{4})-(\d{2})$`)

// ParsePeriod reads a period key ("2026-11") in zone. Errors wrap
// ErrInvalidPeriod.
func ParsePeriod(key string, zone *time.Location) (Period, error) {
	m := periodKey.FindStringSubmatch(key)
	if m == nil {
		return Period{}, fmt.Errorf("%w: %q: want a month as YYYY-MM, such as 2026-11", ErrInvalidPeriod, key)
	}
	year, _ := strconv.Atoi(m[1])
	month, _ := strconv.Atoi(m[2])
	if year < 1970 || month < 1 || month > 12 {
		return Period{}, fmt.Errorf("%w: %q: want a month from 1970-01 on", ErrInvalidPeriod, key)
	}
	return monthOf(year, time.Month(month), zone), nil
}

// Next is the period after p.
func (p Period) Next() Period { return monthOf(p.Start.Year(), p.Start.Month()+1, p.Zone) }

// Contains reports whether the instant t falls in p.
func (p Period) Contains(t time.Time) bool { return !t.Before(p.Start) && t.Before(p.End) }

// String is the period's key and zone, "2026-11 (+05:30)".
func (p Period) String() string { return fmt.Sprintf("%s (%s)", p.Key, p.Zone) }

// CheckClose says whether p may be closed at now: it must have ended at
// least grace ago, and ingest must have caught up past its end (caughtUp is
// the instant up to which every event has been ingested, e.g. the oldest
// completed_at still in flight, or now when nothing is). Errors wrap
// ErrPeriodNotEnded or ErrIngestBehind and say when to try again.
func (p Period) CheckClose(now time.Time, grace time.Duration, caughtUp time.Time) error {
	if grace < 0 {
		return fmt.Errorf("%w: closing %s with a negative grace (%s)", ErrInvalidPeriod, p, grace)
	}
	if closable := p.End.Add(grace); now.Before(closable) {
		return fmt.Errorf("%w: %s ends at %s and may close %s after, from %s", ErrPeriodNotEnded,
			p, p.End.UTC().Format(time.RFC3339), grace, closable.UTC().Format(time.RFC3339))
	}
	if caughtUp.Before(p.End) {
		return fmt.Errorf("%w: %s ends at %s, ingest has caught up to %s", ErrIngestBehind,
			p, p.End.UTC().Format(time.RFC3339), caughtUp.UTC().Format(time.RFC3339))
	}
	return nil
}
