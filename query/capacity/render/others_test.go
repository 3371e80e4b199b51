package render

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// othersReport is sampleReport with units beyond its max_units summed
// into others, and a fleet of more deployments than it lists.
func othersReport() *meterv1.CapacityReport {
	r := sampleReport()
	o := fixtureUnit("(others)", 21, 40, 20_000, 2_000, true)
	o.Deployments = []string{"dep-0000", "dep-0001"}
	o.DeploymentCount = 14_980
	o.Sustainable = &meterv1.SustainableLoad{Reason: "not estimated for (others): it sums 14980 deployments of different loads"}
	o.GpusNeeded = nil
	r.Others, r.UnitsInOthers, r.MaxUnits = o, 14_980, 2
	r.Fleet.DeploymentCount = 14_982
	return r
}

// TestHTMLOthers: the file says how many units are summed into the others,
// lists them in the table of units and gives them a section, last; member
// lists longer than the report holds say how many more there are.
func TestHTMLOthers(t *testing.T) {
	d := renderHTML(t, othersReport())
	note := byID(d.root, "others-note")
	if note == nil || !strings.Contains(textOf(note), "14,980 deployments beyond the 2 largest (by GPU time, then tokens) are summed into (others)") {
		t.Fatalf("others note: %v", note)
	}
	sections := find(d.root, "section", "unit")
	if len(sections) != 4 {
		t.Fatalf("%d sections, want the fleet, 2 units and the others", len(sections))
	}
	last := sections[3]
	if id, _ := attr(last, "id"); id != "others" || textOf(find(last, "h2")[0]) != "Others: 14,980 deployments summed" {
		t.Errorf("last section %q: %q", id, textOf(find(last, "h2")[0]))
	}
	if shown, raw, _ := cardValue(t, last, "requests"); raw == "" || shown == "" {
		t.Errorf("others requests card: %q %q", shown, raw)
	}
	if got := textOf(find(last, "p", "members")[0]); !strings.Contains(got, "dep-0000, dep-0001 and 14,978 more") {
		t.Errorf("others members: %q", got)
	}
	if got := textOf(find(sections[0], "p", "members")[0]); !strings.Contains(got, "and 14,980 more") {
		t.Errorf("fleet members: %q", got)
	}
	var linked bool
	for _, a := range find(byID(d.root, "overview"), "a") {
		if href, _ := attr(a, "href"); href == "#others" && textOf(a) == "(others)" {
			linked = true
		}
	}
	if !linked {
		t.Error("the table of units has no row for the others")
	}

	// Every unit listed: no note, no others section.
	d = renderHTML(t, sampleReport())
	if byID(d.root, "others-note") != nil || byID(d.root, "others") != nil {
		t.Error("a report without others shows an others note or section")
	}
}

// TestCSVOthers: the others are the last row, after the units.
func TestCSVOthers(t *testing.T) {
	rows := readCSV(t, othersReport())
	if len(rows) != 4 || rows[3]["name"] != "(others)" || rows[3]["deployments"] != "dep-0000|dep-0001" {
		t.Fatalf("%d rows, last %q %q", len(rows), rows[len(rows)-1]["name"], rows[len(rows)-1]["deployments"])
	}
}

// heapWriter records the most live heap seen at its writes (after a
// collection), less the live heap when it was made.
type heapWriter struct {
	base, peak uint64
	n, writes  int
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func (w *heapWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	if w.writes++; w.writes%8 == 0 {
		if h := liveHeap(); h > w.base {
			w.peak = max(w.peak, h-w.base)
		}
	}
	return len(p), nil
}

// TestHTMLWritesOneSectionAtATime: the HTML of 100 units of 30 days (about
// 40 MB) is written as it is laid out: what the renderer holds while
// writing stays a small part of the file (a section's layout, the buffer),
// not the whole file's layout.
func TestHTMLWritesOneSectionAtATime(t *testing.T) {
	if testing.Short() {
		t.Skip("renders 40 MB")
	}
	r := sampleReport()
	r.Units = nil
	for i := range 100 {
		r.Units = append(r.Units, fixtureUnit(fmt.Sprintf("deployment-%03d", i), 30, 8, 9000, 1200, true))
	}
	w := &heapWriter{base: liveHeap()}
	if err := HTML(w, r); err != nil {
		t.Fatal(err)
	}
	t.Logf("%.1f MiB written in %d writes; at most %.1f MiB live while writing", float64(w.n)/(1<<20), w.writes, float64(w.peak)/(1<<20))
	if w.n < 20<<20 {
		t.Fatalf("the file is %d bytes; the test wants a large one", w.n)
	}
	if w.peak > uint64(w.n/10) {
		t.Errorf("%d bytes live while writing a file of %d: the renderer holds more than a section at a time", w.peak, w.n)
	}
}
