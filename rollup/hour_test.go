package rollup

import (
	"errors"
	"math"
	"testing"
	"time"

	"tokenmeter/internal/chstore"
	"tokenmeter/rollup/sketch"
)

// TestHourRollupOrder checks the streaming aggregation: minute rows are
// finished as the events move on, the group's histogram is the sum of its
// minutes', and events that come out of (group, time) order are refused
// rather than counted into a second row for the same minute or group.
func TestHourRollupOrder(t *testing.T) {
	hour := time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)
	start := func() (*hourRollup, *[]chstore.RollupRecord) {
		var rows []chstore.RollupRecord
		h := newHourRollup(hour, GoodputSpec{}, func(b []chstore.RollupRecord) error {
			rows = append(rows, b...)
			return nil
		}, func() []chstore.RollupRecord { return nil })
		h.addGroup(1, [6]string{"acme", "m1"}, 0)
		h.addGroup(2, [6]string{"acme", "m2"}, 0)
		return h, &rows
	}
	ev := func(group uint64, sec int, ttft float64) *chstore.HourEvent {
		return &chstore.HourEvent{CompletedAt: uint32(hour.Unix()) + uint32(sec), Group: group, Status: 1, Output: 3,
			Latency: [4]float64{ttft, math.NaN(), ttft * 2, math.NaN()}}
	}
	h, rows := start()
	// Gathered in any order, counted group by group in time order.
	for _, e := range []*chstore.HourEvent{ev(2, 70, 900), ev(1, 5, 7), ev(2, 20, 50), ev(2, 10, 50)} {
		if err := h.gather(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.countAll(); err != nil {
		t.Fatal(err)
	}
	if len(*rows) != 3 {
		t.Fatalf("%d minute rows, want 3", len(*rows))
	}
	first := (*rows)[1] // group 1 is counted first
	if (*rows)[0].Dims[1] != "m1" || (*rows)[2].Bucket != hour.Add(time.Minute) {
		t.Errorf("minute rows %+v: want m1's, then m2's in time order", *rows)
	}
	if first.Requests != 2 || first.Bucket != hour || first.Dims[1] != "m2" ||
		len(first.Keys[0]) != 1 || first.Keys[0][0] != sketch.Key(50) || first.Counts[0][0] != 2 {
		t.Errorf("first minute row %+v: want 2 requests of m2 at %s, TTFT histogram {%d: 2}", first, hour, sketch.Key(50))
	}
	levels := h.levels()
	if len(levels["rollup_hour"]) != 2 || len(levels["rollup_tenant_hour"]) != 1 || len(levels["rollup_total_hour"]) != 1 {
		t.Fatalf("levels: %d hour, %d tenant, %d total rows", len(levels["rollup_hour"]), len(levels["rollup_tenant_hour"]), len(levels["rollup_total_hour"]))
	}
	var m2 chstore.RollupRecord
	for _, r := range levels["rollup_hour"] {
		if r.Dims[1] == "m2" {
			m2 = r
		}
	}
	if m2.Requests != 3 || len(m2.Keys[0]) != 2 || m2.Counts[0][0]+m2.Counts[0][1] != 3 || m2.Count[1] != 0 {
		t.Errorf("m2 hour row %+v: want 3 requests over two TTFT keys, no ITL", m2)
	}
	if total := levels["rollup_total_hour"][0]; total.Requests != 4 || total.Output != 12 || total.Count[0] != 4 {
		t.Errorf("total row %+v: want 4 requests, 12 output tokens", total)
	}

	h, _ = start()
	if err := h.add(ev(2, 70, 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.add(ev(2, 10, 1)); !errors.Is(err, errOutOfOrder) {
		t.Errorf("an earlier minute after a later one: err = %v, want errOutOfOrder", err)
	}
	h, _ = start()
	var err error
	for _, e := range []*chstore.HourEvent{ev(2, 10, 1), ev(1, 10, 1), ev(2, 20, 1)} {
		if err = h.add(e); err != nil {
			break
		}
	}
	if !errors.Is(err, errOutOfOrder) {
		t.Errorf("a group coming back: err = %v, want errOutOfOrder", err)
	}
	if err := h.gather(ev(3, 10, 1)); !errors.Is(err, errUnknownGroup) {
		t.Errorf("an unlisted group: err = %v, want errUnknownGroup", err)
	}
}
