package api

import (
	"testing"
	"time"

	"tokenmeter/query/capacity"
)

// A complete week without traffic has no peak hour: the answer leaves it
// out rather than sending the zero time (0001-01-01).
func TestCapacityWeekWithoutTrafficHasNoPeakHour(t *testing.T) {
	start := time.Date(2026, 9, 6, 0, 0, 0, 0, time.UTC)
	u := capacity.Unit{Name: "d", Trend: capacity.Trend{Weeks: []capacity.WeekPoint{
		{Start: start},
		{Start: start.Add(7 * 24 * time.Hour), Tokens: 3600, PeakTokensPerSecond: 1, PeakTokensPerSecondHour: start.Add(8 * 24 * time.Hour)},
	}}}
	weeks := capacityUnit("USD", &u).GetTrend().GetWeeks()
	if got := weeks[0].GetPeakHour(); got != nil {
		t.Errorf("week without traffic: peak hour %v, want none", got.AsTime())
	}
	if got, want := weeks[1].GetPeakHour().AsTime(), start.Add(8*24*time.Hour); !got.Equal(want) {
		t.Errorf("week with traffic: peak hour %v, want %v", got, want)
	}
}
