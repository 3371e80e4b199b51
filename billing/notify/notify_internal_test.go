package notify

import (
	"testing"
	"time"
)

// TestNextBackoff: a failing sink waits the minimum, then twice as long
// after each failure, never more than the cap.
func TestNextBackoff(t *testing.T) {
	lo, hi := time.Second, 5*time.Minute
	var got []time.Duration
	b := time.Duration(0)
	for range 12 {
		b = nextBackoff(b, lo, hi)
		got = append(got, b)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("backoffs %v, want %v seconds", got, want)
		}
	}
}
