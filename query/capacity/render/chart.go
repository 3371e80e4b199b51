package render

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// Chart geometry, in SVG user units (the SVG scales to its box).
const (
	chartW      = 640
	chartH      = 300
	plotLeft    = 70
	plotRight   = chartW - 20
	plotTop     = 20
	plotBottom  = chartH - 50
	heatLeft    = 50
	heatRight   = chartW - 20
	heatTop     = 20
	heatBottom  = chartH - 80
	legendTop   = chartH - 34
	legendH     = 12
	legendSteps = 10
)

// chart is what the chart template draws: a plot box with axes, and the
// marks of one kind or more. Everything is laid out here; the template
// only writes the elements.
type chart struct {
	// ID is the element id: the unit's anchor and the kind.
	ID, Title, About string
	// Kind is the chart's kind (its class and data-kind): "utilization",
	// "attainment", "heatmap", "cost" or "forecast".
	Kind string
	// Note replaces the drawing when the chart has no data.
	Note string
	// Box is the plot area.
	Box box
	// XLabel and YLabel name the axes.
	XLabel, YLabel string
	XTicks, YTicks []tick
	// Grid draws the horizontal lines of the y ticks.
	Grid   bool
	Points []point
	Bars   []bar
	Cells  []cell
	Lines  []line
	Texts  []text
	Legend []bar
	// Keys explains the marks (a list under the chart).
	Keys []key
	// Marks are Points, Bars and Cells as markup (see marks).
	Marks marks
}

// marks are the data marks of a chart, written here rather than by the
// template: a report has tens of thousands of them, and html/template's
// per-value escaping through reflection made rendering ten times slower.
// Every value is escaped with html.EscapeString.
type marks struct {
	Points, Bars, Cells template.HTML
}

// writeMarks lays out c.Marks from c.Points, c.Bars and c.Cells.
func (c *chart) writeMarks() {
	var b strings.Builder
	attr := func(name, v string) {
		b.WriteByte(' ')
		b.WriteString(name)
		b.WriteString(`="`)
		b.WriteString(html.EscapeString(v))
		b.WriteByte('"')
	}
	title := func(t string) {
		b.WriteString("<title>")
		b.WriteString(html.EscapeString(t))
		b.WriteString("</title>")
	}
	for _, p := range c.Points {
		b.WriteString("<circle")
		attr("class", p.Class)
		attr("cx", px(p.X))
		attr("cy", px(p.Y))
		attr("r", px(p.R))
		attr("data-x", p.DX)
		attr("data-y", p.DY)
		attr("data-t", p.DT)
		b.WriteByte('>')
		title(p.Title)
		b.WriteString("</circle>")
	}
	c.Marks.Points = template.HTML(b.String()) // every value is escaped above
	b.Reset()
	for _, r := range c.Bars {
		b.WriteString("<rect")
		attr("class", r.Class)
		attr("x", px(r.X))
		attr("y", px(r.Y))
		attr("width", px(r.W))
		attr("height", px(r.H))
		attr("data-t", r.DT)
		attr("data-v", r.DV)
		b.WriteByte('>')
		title(r.Title)
		b.WriteString("</rect>")
	}
	c.Marks.Bars = template.HTML(b.String()) // every value is escaped above
	b.Reset()
	for _, e := range c.Cells {
		b.WriteString("<rect")
		attr("class", e.Class)
		attr("x", px(e.X))
		attr("y", px(e.Y))
		attr("width", px(e.W))
		attr("height", px(e.H))
		attr("fill", e.Fill)
		attr("data-weekday", strconv.Itoa(e.Weekday))
		attr("data-hour", strconv.Itoa(e.Hour))
		attr("data-v", e.DV)
		b.WriteByte('>')
		title(e.Title)
		b.WriteString("</rect>")
	}
	c.Marks.Cells = template.HTML(b.String()) // every value is escaped above
}

type box struct{ Left, Top, Right, Bottom float64 }

type tick struct {
	Pos   float64
	Label string
}

// point is a data point: <circle class="pt ...">.
type point struct {
	X, Y, R float64
	Class   string
	// DX, DY and DT are the data values (data-x, data-y, data-t).
	DX, DY, DT string
	Title      string
}

// bar is a data bar (<rect class="bar ...">) or a legend step.
type bar struct {
	X, Y, W, H float64
	Class      string
	Fill       string
	DT, DV     string
	Title      string
}

// cell is a heat map cell: <rect class="cell"> ("cell none" for a slot
// outside the range).
type cell struct {
	X, Y, W, H    float64
	Class, Fill   string
	Weekday, Hour int
	DV            string
	Title         string
}

type line struct {
	X1, Y1, X2, Y2 float64
	Class          string
}

type text struct {
	X, Y   float64
	Anchor string
	Class  string
	Text   string
}

type key struct{ Class, Text string }

// scale maps [Lo, Hi] onto [P0, P1] (pixels; P1 < P0 for a y axis).
type scale struct{ Lo, Hi, P0, P1 float64 }

func (s scale) at(v float64) float64 {
	if s.Hi == s.Lo {
		return (s.P0 + s.P1) / 2
	}
	p := s.P0 + (finite(v)-s.Lo)/(s.Hi-s.Lo)*(s.P1-s.P0)
	return math.Round(p*10) / 10
}

// niceStep is the round number (1, 2 or 5 times a power of ten) nearest
// above raw.
func niceStep(raw float64) float64 {
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1
	}
	exp := math.Floor(math.Log10(raw))
	f := raw / math.Pow(10, exp)
	var nf float64
	switch {
	case f <= 1:
		nf = 1
	case f <= 2:
		nf = 2
	case f <= 5:
		nf = 5
	default:
		nf = 10
	}
	return nf * math.Pow(10, exp)
}

// niceRange widens [lo, hi] to round ticks about n apart and returns the
// range and its ticks. An empty range (lo == hi) is widened around its
// value, so that no scale divides by zero.
func niceRange(lo, hi float64, n int) (nlo, nhi float64, ticks []float64) {
	lo, hi = finite(lo), finite(hi)
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi == lo {
		if lo == 0 {
			hi = 1
		} else {
			d := math.Abs(lo) * 0.1
			lo, hi = lo-d, hi+d
		}
	}
	step := niceStep((hi - lo) / float64(max(n-1, 1)))
	nlo = math.Floor(lo/step+1e-9) * step
	nhi = math.Ceil(hi/step-1e-9) * step
	for i := 0; ; i++ {
		v := nlo + float64(i)*step
		if v > nhi+step/2 {
			break
		}
		ticks = append(ticks, v)
	}
	return nlo, nhi, ticks
}

// tickDecimals is the number of decimals that tells ticks step apart.
func tickDecimals(step float64) int {
	if !(step > 0) || step >= 1 {
		return 0
	}
	return min(int(math.Ceil(-math.Log10(step)-1e-9)), 9)
}

// valueTicks lays out ticks on s with labels of format.
func valueTicks(s scale, vals []float64, format func(float64) string) []tick {
	out := make([]tick, 0, len(vals))
	for _, v := range vals {
		out = append(out, tick{Pos: s.at(v), Label: format(v)})
	}
	return out
}

// numberFormat labels ticks step apart with thousands separators.
func numberFormat(step float64) func(float64) string {
	d := tickDecimals(step)
	return func(v float64) string { return grouped(v, d) }
}

// percentFormat labels share ticks step apart as percentages.
func percentFormat(step float64) func(float64) string {
	d := tickDecimals(step * 100)
	return func(v float64) string { return grouped(v*100, d) + "%" }
}

// linearAxis is a scale over [0, hi] (or [lo, hi] when lo < 0) with nice
// ticks, hi at least the largest value.
func linearAxis(lo, hi, p0, p1 float64, n int) (scale, []float64, float64) {
	lo, hi, ticks := niceRange(min(lo, 0), hi, n)
	step := 1.0
	if len(ticks) > 1 {
		step = ticks[1] - ticks[0]
	}
	return scale{Lo: lo, Hi: hi, P0: p0, P1: p1}, ticks, step
}

// px writes a coordinate.
func px(v float64) string { return strconv.FormatFloat(finite(v), 'f', 1, 64) }

// heatColour is the colour of a heat map share in [0, 1]: from a pale to
// a deep blue.
func heatColour(share float64) string {
	share = math.Max(0, math.Min(1, finite(share)))
	from := [3]float64{239, 246, 255}
	to := [3]float64{8, 48, 107}
	var c [3]int
	for i := range c {
		c[i] = int(math.Round(from[i] + (to[i]-from[i])*share))
	}
	return fmt.Sprintf("#%02x%02x%02x", c[0], c[1], c[2])
}

// timeTicks are about n ticks from lo to hi at whole days or weeks,
// labelled with the date.
func timeTicks(s scale, lo, hi time.Time, n int) []tick {
	span := hi.Sub(lo)
	day := 24 * time.Hour
	steps := []time.Duration{day, 2 * day, 7 * day, 14 * day, 28 * day, 91 * day, 182 * day, 364 * day}
	step := steps[len(steps)-1]
	for _, st := range steps {
		if span/st <= time.Duration(n) {
			step = st
			break
		}
	}
	first := lo.UTC().Truncate(day)
	if first.Before(lo) {
		first = first.Add(day)
	}
	var out []tick
	for t := first; !t.After(hi); t = t.Add(step) {
		out = append(out, tick{Pos: s.at(float64(t.Unix())), Label: t.UTC().Format("Jan 2")})
	}
	return out
}
