package rollup

import (
	"slices"
	"testing"
	"time"
)

// eachSpan reads runs of consecutive quiet hours in growing spans (one
// hour, then two, four...), never across a gap, and busy hours one by one;
// every hour is read exactly once, in order.
func TestEachSpan(t *testing.T) {
	h0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var hours []time.Time
	for i := range 30 {
		hours = append(hours, h0.Add(time.Duration(i)*time.Hour))
	}
	hours = append(hours, h0.Add(40*time.Hour), h0.Add(41*time.Hour))
	for _, tc := range []struct {
		name  string
		rows  int // rows each read returns
		spans []int
	}{
		{"quiet", 10, []int{1, 2, 4, 8, 15, 2}},
		{"busy", maxSpanRows + 1, slices.Repeat([]int{1}, 32)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spans []int
			next := hours[0]
			var read []time.Time
			err := eachSpan(hours, func(from, to time.Time) (int, error) {
				if from.Before(next) {
					t.Fatalf("span from %s overlaps the previous one", from)
				}
				for h := from; h.Before(to); h = h.Add(time.Hour) {
					read = append(read, h)
				}
				next = to
				spans = append(spans, int(to.Sub(from)/time.Hour))
				return tc.rows, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(spans, tc.spans) {
				t.Errorf("spans of %v hours, want %v", spans, tc.spans)
			}
			if !slices.EqualFunc(read, hours, time.Time.Equal) {
				t.Errorf("read hours %v, want %v", read, hours)
			}
		})
	}
}
