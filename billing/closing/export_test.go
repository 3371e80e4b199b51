package closing

import (
	"testing"
	"time"
)

// TestRegionMap: a deployment's one region; a line not per deployment
// gets the one region of every deployment; several or none: null.
func TestRegionMap(t *testing.T) {
	one := regionMap{"a": {"us-east-1"}, "b": {"us-east-1"}}
	two := regionMap{"a": {"us-east-1"}, "b": {"eu-west-1", "us-east-1"}}
	for _, tt := range []struct {
		m          regionMap
		deployment string
		want       string
	}{
		{one, "a", "us-east-1"}, {one, "", "us-east-1"}, {one, "c", ""},
		{two, "a", "us-east-1"}, {two, "b", ""}, {two, "", ""}, {nil, "", ""}, {nil, "a", ""},
	} {
		if got := tt.m.of(tt.deployment); got != tt.want {
			t.Errorf("%v.of(%q) = %q, want %q", tt.m, tt.deployment, got, tt.want)
		}
	}
}

// TestRegionCache: a range's regions are reused for regionsFresh, then
// read again; other ranges are their own.
func TestRegionCache(t *testing.T) {
	var c regionCache
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	k1 := [2]time.Time{at.AddDate(0, -1, 0), at}
	k2 := [2]time.Time{at.AddDate(0, -1, 0).Add(-5*time.Hour - 30*time.Minute), at.Add(-5*time.Hour - 30*time.Minute)}
	if _, ok := c.get(k1, at); ok {
		t.Fatal("empty cache answered")
	}
	c.put(k1, regionMap{"a": {"r"}}, at)
	if m, ok := c.get(k1, at.Add(regionsFresh)); !ok || m.of("a") != "r" {
		t.Errorf("fresh entry: %v %v", m, ok)
	}
	if _, ok := c.get(k1, at.Add(regionsFresh+time.Second)); ok {
		t.Error("stale entry answered")
	}
	if _, ok := c.get(k2, at); ok {
		t.Error("another range answered")
	}
	for i := range 100 {
		c.put([2]time.Time{at.Add(time.Duration(i) * time.Hour), at}, nil, at)
	}
	if len(c.entries) > 64 {
		t.Errorf("%d entries, want at most 64", len(c.entries))
	}
}
