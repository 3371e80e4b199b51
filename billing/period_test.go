package billing

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	z, err := ParseZone(name)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// TestPeriodBoundaries checks that a month's first instants are exact in
// every kind of zone: UTC, offsets that are not whole hours, and a zone
// with daylight saving time (November starts in summer time, December in
// winter time).
func TestPeriodBoundaries(t *testing.T) {
	for _, tc := range []struct {
		zone, key  string
		start, end string // UTC
	}{
		{"UTC", "2026-11", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"},
		{"", "2026-12", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"+05:30", "2026-11", "2026-10-31T18:30:00Z", "2026-11-30T18:30:00Z"},
		{"+0545", "2026-02", "2026-01-31T18:15:00Z", "2026-02-28T18:15:00Z"},
		{"-03:30", "2028-02", "2028-02-01T03:30:00Z", "2028-03-01T03:30:00Z"},
		{"America/New_York", "2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"},
		{"Asia/Kolkata", "2027-01", "2026-12-31T18:30:00Z", "2027-01-31T18:30:00Z"},
	} {
		t.Run(tc.zone+" "+tc.key, func(t *testing.T) {
			p, err := ParsePeriod(tc.key, mustZone(t, tc.zone))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Start.UTC().Format(time.RFC3339); got != tc.start {
				t.Errorf("start %s, want %s", got, tc.start)
			}
			if got := p.End.UTC().Format(time.RFC3339); got != tc.end {
				t.Errorf("end %s, want %s", got, tc.end)
			}
			if p.Key != tc.key {
				t.Errorf("key %q, want %q", p.Key, tc.key)
			}
			// The first instant belongs to the period, the one before to
			// the previous period, and the end to the next.
			if got := PeriodOf(p.Start, p.Zone); got.Key != tc.key || !got.Contains(p.Start) {
				t.Errorf("PeriodOf(start) = %s", got)
			}
			before := PeriodOf(p.Start.Add(-time.Nanosecond), p.Zone)
			if before.Key == tc.key || !before.End.Equal(p.Start) {
				t.Errorf("PeriodOf(start - 1ns) = %s ending %s, want the month before ending at %s", before, before.End, p.Start)
			}
			if next := p.Next(); !next.Start.Equal(p.End) || PeriodOf(p.End, p.Zone).Key != next.Key {
				t.Errorf("Next() = %s from %s, want the month from %s", next, next.Start, p.End)
			}
			if p.Contains(p.End) {
				t.Error("the period contains its end")
			}
		})
	}
}

func TestNextAcrossYears(t *testing.T) {
	p, err := ParsePeriod("2026-12", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Next().Key; got != "2027-01" {
		t.Errorf("after 2026-12: %s, want 2027-01", got)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, key := range []string{"", "2026-13", "2026-00", "2026-1", "26-11", "2026/11", "1969-12", "2026-11-01"} {
		if _, err := ParsePeriod(key, time.UTC); !errors.Is(err, ErrInvalidPeriod) {
			t.Errorf("ParsePeriod(%q): err = %v, want ErrInvalidPeriod", key, err)
		}
	}
	for _, zone := range []string{"+25:00", "+14:01", "+05:60", "5:30", "Mars/Olympus", "+5"} {
		if _, err := ParseZone(zone); !errors.Is(err, ErrInvalidPeriod) {
			t.Errorf("ParseZone(%q): err = %v, want ErrInvalidPeriod", zone, err)
		}
	}
	if z, err := ParseZone("-14:00"); err != nil || z.String() != "-14:00" {
		t.Errorf("ParseZone(-14:00) = %v, %v", z, err)
	}
}

// TestCheckClose checks the close rule: ended plus grace, and ingest caught
// up past the end.
func TestCheckClose(t *testing.T) {
	p, err := ParsePeriod("2026-11", mustZone(t, "+05:30"))
	if err != nil {
		t.Fatal(err)
	}
	end := p.End
	for _, tc := range []struct {
		name     string
		now      time.Time
		grace    time.Duration
		caughtUp time.Time
		want     error
	}{
		{"inside the period", end.Add(-time.Hour), DefaultGrace, end.Add(-time.Hour), ErrPeriodNotEnded},
		{"ended, within grace", end.Add(23 * time.Hour), DefaultGrace, end.Add(23 * time.Hour), ErrPeriodNotEnded},
		{"grace over, ingest behind", end.Add(25 * time.Hour), DefaultGrace, end.Add(-time.Second), ErrIngestBehind},
		{"grace over, ingest caught up", end.Add(25 * time.Hour), DefaultGrace, end, nil},
		{"exactly at the end of grace", end.Add(DefaultGrace), DefaultGrace, end.Add(DefaultGrace), nil},
		{"no grace asked", end, 0, end, nil},
		{"negative grace", end.Add(48 * time.Hour), -time.Hour, end.Add(48 * time.Hour), ErrInvalidPeriod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.CheckClose(tc.now, tc.grace, tc.caughtUp)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CheckClose = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("CheckClose = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "2026-11") {
				t.Errorf("error %q does not name the period", err)
			}
		})
	}
}
