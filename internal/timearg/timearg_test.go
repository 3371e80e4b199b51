package timearg

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Time
	}{
		{"2026-11-23", time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)},
		{"2026-11-23T00:00:00Z", time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)},
		{"2026-11-23T09:30:00.5+05:30", time.Date(2026, 11, 23, 4, 0, 0, 5e8, time.UTC)},
	} {
		got, err := Parse("start", tt.in)
		if err != nil || !got.Equal(tt.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "23/11/2026", "2026-11-23 10:00", "2026-11-23T10:00", "2026-13-01", "yesterday"} {
		_, err := Parse("start", in)
		if !errors.Is(err, ErrBadTime) {
			t.Errorf("Parse(%q): got %v, want ErrBadTime", in, err)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "2006") || !strings.Contains(msg, "2026-11-23T00:00:00Z") || !strings.Contains(msg, "start") {
			t.Errorf("Parse(%q): message %q should name the parameter and give an example, without Go layouts", in, msg)
		}
	}
}
