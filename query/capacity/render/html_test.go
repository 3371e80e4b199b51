package render

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/html"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// doc is a parsed HTML report.
type doc struct {
	raw  string
	root *html.Node
}

func renderHTML(t *testing.T, r *meterv1.CapacityReport) doc {
	t.Helper()
	var buf bytes.Buffer
	if err := HTML(&buf, r); err != nil {
		t.Fatalf("HTML: %v", err)
	}
	raw := buf.String()
	root, err := html.Parse(strings.NewReader(raw))
	if err != nil {
		t.Fatalf("parse the HTML: %v", err)
	}
	return doc{raw: raw, root: root}
}

func attr(n *html.Node, key string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val, true
		}
	}
	return "", false
}

func hasClass(n *html.Node, class string) bool {
	c, _ := attr(n, "class")
	for _, f := range strings.Fields(c) {
		if f == class {
			return true
		}
	}
	return false
}

// find returns the elements under n named tag (any tag when "") that have
// every class of classes.
func find(n *html.Node, tag string, classes ...string) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && (tag == "" || n.Data == tag) {
			ok := true
			for _, c := range classes {
				ok = ok && hasClass(n, c)
			}
			if ok {
				out = append(out, n)
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func byID(n *html.Node, id string) *html.Node {
	for _, e := range find(n, "") {
		if v, _ := attr(e, "id"); v == id {
			return e
		}
	}
	return nil
}

func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return b.String()
}

// cardValue returns the value and data-value of the card key of a section.
func cardValue(t *testing.T, section *html.Node, key string) (shown, raw, sub string) {
	t.Helper()
	for _, c := range find(section, "div", "card") {
		if k, _ := attr(c, "data-key"); k == key {
			raw, _ = attr(c, "data-value")
			return textOf(find(c, "div", "value")[0]), raw, textOf(find(c, "div", "sub")[0])
		}
	}
	t.Fatalf("no card %q", key)
	return "", "", ""
}

// TestHTMLSelfContained checks that the file loads nothing: no script,
// no external reference, only in-page links.
func TestHTMLSelfContained(t *testing.T) {
	for name, r := range map[string]*meterv1.CapacityReport{"sample": sampleReport(), "unknown": unknownReport(), "empty": emptyReport()} {
		t.Run(name, func(t *testing.T) {
			d := renderHTML(t, r)
			for _, tag := range []string{"script", "link", "img", "iframe", "object", "embed", "use", "image"} {
				if n := len(find(d.root, tag)); n > 0 {
					t.Errorf("%d <%s> elements, want none", n, tag)
				}
			}
			for _, n := range find(d.root, "") {
				for _, a := range n.Attr {
					key := strings.ToLower(a.Key)
					switch {
					case key == "src" || key == "srcset" || key == "action" || key == "xlink:href" || key == "poster":
						t.Errorf("<%s %s=%q>: want no external reference", n.Data, a.Key, a.Val)
					case key == "href" && !strings.HasPrefix(a.Val, "#"):
						t.Errorf("<%s href=%q>: want only in-page links", n.Data, a.Val)
					case strings.HasPrefix(key, "on"):
						t.Errorf("<%s %s>: want no event handler", n.Data, a.Key)
					}
				}
			}
			for _, s := range []string{"http:", "https:", "//", "url(", "@import", "NaN", "Inf"} {
				if strings.Contains(d.raw, s) {
					i := strings.Index(d.raw, s)
					t.Errorf("the file contains %q: …%s…", s, d.raw[max(0, i-60):min(len(d.raw), i+60)])
				}
			}
		})
	}
}

// TestHTMLChartPoints checks that every chart has one mark per data point.
func TestHTMLChartPoints(t *testing.T) {
	r := sampleReport()
	d := renderHTML(t, r)
	sections := map[string]*meterv1.CapacityUnit{"fleet": r.GetFleet()}
	for i, u := range r.GetUnits() {
		sections["unit-"+string(rune('1'+i))] = u
	}
	for anchor, u := range sections {
		sec := byID(d.root, anchor)
		if sec == nil {
			t.Fatalf("no section %q", anchor)
		}
		if name, _ := attr(sec, "data-name"); name != u.GetName() {
			t.Errorf("section %s is %q, want %q", anchor, name, u.GetName())
		}
		var withGPUs, withReq, qualifying int
		for _, h := range u.GetHoursDetail() {
			if h.GetGpus() > 0 {
				withGPUs++
				if h.GetRequests() > 0 {
					withReq++
					if h.GetQualifies() {
						qualifying++
					}
				}
			}
		}
		chart := func(kind string) *html.Node {
			c := byID(sec, anchor+"-"+kind)
			if c == nil {
				t.Fatalf("%s: no %s chart", anchor, kind)
			}
			if n := len(find(c, "svg")); n != 1 {
				t.Fatalf("%s: %s chart has %d <svg>, want 1", anchor, kind, n)
			}
			return c
		}
		tests := []struct {
			kind    string
			tag     string
			classes []string
			want    int
		}{
			{"utilization", "circle", []string{"pt"}, withGPUs},
			{"attainment", "circle", []string{"pt"}, withReq},
			{"attainment", "circle", []string{"pt", "q"}, qualifying},
			{"attainment", "circle", []string{"pt", "nq"}, withReq - qualifying},
			{"attainment", "circle", []string{"sustainable-pt"}, 1},
			{"attainment", "line", []string{"target"}, 1},
			{"attainment", "text", []string{"sustainable-label"}, 1},
			{"heatmap", "rect", []string{"cell"}, 7 * 24},
			{"heatmap", "rect", []string{"legend-step"}, legendSteps},
			{"cost", "rect", []string{"bar"}, 2 * len(u.GetDays())},
			{"cost", "rect", []string{"bar", "busy"}, len(u.GetDays())},
			{"forecast", "circle", []string{"pt"}, len(u.GetTrend().GetWeeks())},
			{"forecast", "circle", []string{"forecast-pt"}, 1},
			{"forecast", "line", []string{"forecast"}, 1},
		}
		for _, tt := range tests {
			if got := len(find(chart(tt.kind), tt.tag, tt.classes...)); got != tt.want {
				t.Errorf("%s %s chart: got %d <%s class=%q>, want %d", anchor, tt.kind, got, tt.tag, strings.Join(tt.classes, " "), tt.want)
			}
		}
		// Axes have ticks and labels.
		for _, kind := range []string{"utilization", "attainment", "cost", "forecast"} {
			c := chart(kind)
			if n := len(find(c, "text", "tick")); n < 4 {
				t.Errorf("%s %s chart: %d tick labels, want at least 4", anchor, kind, n)
			}
			if n := len(find(c, "text", "axis-label")); n < 1 {
				t.Errorf("%s %s chart: no axis label", anchor, kind)
			}
		}
		// The data values of a point are the report's.
		pts := find(chart("utilization"), "circle", "pt")
		if x, _ := attr(pts[0], "data-x"); x != num(u.GetHoursDetail()[0].GetUtilization()) {
			t.Errorf("%s: first utilization point data-x %q, want %q", anchor, x, num(u.GetHoursDetail()[0].GetUtilization()))
		}
		bars := find(chart("cost"), "rect", "bar", "idle")
		if v, _ := attr(bars[0], "data-v"); v != u.GetDays()[0].GetIdleCost().GetAmount() {
			t.Errorf("%s: first idle bar data-v %q, want %q", anchor, v, u.GetDays()[0].GetIdleCost().GetAmount())
		}
	}
}

// TestHTMLCards checks the cards against the report.
func TestHTMLCards(t *testing.T) {
	r := sampleReport()
	d := renderHTML(t, r)
	u := r.GetUnits()[1] // llama-70b-prod
	sec := byID(d.root, "unit-2")
	tests := []struct {
		key, shown, raw string
	}{
		{"utilization", percent(u.GetUtilization()), num(u.GetUtilization())},
		{"gpus", human(u.GetMeanGpus()) + " / 18", num(u.GetMeanGpus())},
		{"cost", "USD 12,345.68", "12345.678901234"},
		{"requests", countU(u.GetRequests()), strconv.FormatUint(u.GetRequests(), 10)},
		{"attainment", percent(u.GetAttainment()), num(u.GetAttainment())},
		{"tokens_per_second_per_gpu", human(u.GetTokensPerSecondPerGpu()), num(u.GetTokensPerSecondPerGpu())},
		{"sustainable", human(u.GetSustainable().GetTokensPerSecondPerGpu()) + " tokens/s per GPU", num(u.GetSustainable().GetTokensPerSecondPerGpu())},
		{"headroom", percent(u.GetHeadroom()), num(u.GetHeadroom())},
		{"peak", hourText(u.GetPeak().GetStart().AsTime()), rfc3339(u.GetPeak().GetStart().AsTime())},
		{"saturation", "14", "14"},
		{"forecast", human(u.GetTrend().GetForecast().GetTokensPerSecond()) + " tokens/s", num(u.GetTrend().GetForecast().GetTokensPerSecond())},
	}
	for _, tt := range tests {
		shown, raw, _ := cardValue(t, sec, tt.key)
		if shown != tt.shown || raw != tt.raw {
			t.Errorf("card %s: shows %q (data-value %q), want %q (%q)", tt.key, shown, raw, tt.shown, tt.raw)
		}
	}
	// The GPUs needed, with the arithmetic verbatim.
	codes := find(sec, "code")
	if len(codes) != len(u.GetGpusNeeded()) {
		t.Fatalf("%d arithmetic cells, want %d", len(codes), len(u.GetGpusNeeded()))
	}
	for i, n := range u.GetGpusNeeded() {
		if got := textOf(codes[i]); got != n.GetArithmetic() {
			t.Errorf("arithmetic %d: got %q, want %q", i, got, n.GetArithmetic())
		}
	}
	// Findings: one item each, most urgent first, coloured by severity.
	items := find(d.root, "li", "finding")
	if len(items) != len(r.GetFindings()) {
		t.Fatalf("%d findings, want %d", len(items), len(r.GetFindings()))
	}
	for i, want := range []string{"sev-2", "sev-1", "sev-0"} {
		if !hasClass(items[i], want) {
			t.Errorf("finding %d: class %v, want %s", i, items[i].Attr, want)
		}
	}
	if title := textOf(find(d.root, "title")[0]); !strings.Contains(title, "2026-11-02") || !strings.Contains(title, "2026-11-23") {
		t.Errorf("title %q does not name the range", title)
	}
	if !strings.Contains(textOf(find(d.root, "dl", "params")[0]), "× 1.3") {
		t.Error("the parameters do not show the growth")
	}
}

// TestHTMLEscapesNames checks that a deployment named like a script is
// text everywhere it appears.
func TestHTMLEscapesNames(t *testing.T) {
	d := renderHTML(t, sampleReport())
	if n := len(find(d.root, "script")); n > 0 {
		t.Fatalf("%d <script> elements: a name was not escaped", n)
	}
	if strings.Contains(d.raw, evilName) {
		t.Error("the name appears unescaped in the file")
	}
	if !strings.Contains(d.raw, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("the name does not appear escaped in the file")
	}
	// Parsed back, the name is the text it was.
	found := 0
	for _, h := range find(d.root, "h2") {
		if strings.Contains(textOf(h), evilName) {
			found++
		}
	}
	if found != 1 {
		t.Errorf("the name is the text of %d headings, want 1", found)
	}
	for _, li := range find(d.root, "li", "finding") {
		if k, _ := attr(li, "data-kind"); k == "over_provisioned" && !strings.Contains(textOf(li), evilName+": utilization") {
			t.Errorf("finding text %q does not hold the name as text", textOf(li))
		}
	}
}

// TestHTMLNotEnoughData checks that a report without data says so and
// shows no figure.
func TestHTMLNotEnoughData(t *testing.T) {
	d := renderHTML(t, emptyReport())
	b := byID(d.root, "not-enough-data")
	if b == nil {
		t.Fatal("no not-enough-data banner")
	}
	if got := textOf(b); !strings.Contains(got, "Not enough data") || !strings.Contains(got, "no GPU samples and no traffic between") {
		t.Errorf("banner %q does not give the reason", got)
	}
	for _, what := range []struct{ tag, class string }{{"div", "card"}, {"svg", ""}, {"section", "unit"}, {"table", ""}} {
		var n []*html.Node
		if what.class == "" {
			n = find(d.root, what.tag)
		} else {
			n = find(d.root, what.tag, what.class)
		}
		if len(n) > 0 {
			t.Errorf("%d <%s class=%q>, want none", len(n), what.tag, what.class)
		}
	}
	if got := textOf(byID(d.root, "findings")); !strings.Contains(got, "no data to judge") {
		t.Errorf("findings of a report without data say %q", got)
	}
	if d := renderHTML(t, sampleReport()); byID(d.root, "not-enough-data") != nil {
		t.Error("a report with data has the not-enough-data banner")
	}
}

// TestHTMLUnknownFigures checks that unknown figures are shown as unknown
// with their reason, and that charts of no, one or equal points draw.
func TestHTMLUnknownFigures(t *testing.T) {
	r := unknownReport()
	d := renderHTML(t, r)
	short := byID(d.root, "unit-3")
	if name, _ := attr(short, "data-name"); name != "short" {
		t.Fatalf("unit-3 is %q, want short", name)
	}
	tests := []struct {
		sec            *html.Node
		key            string
		shown, subPart string
	}{
		{short, "sustainable", "unknown", "only 3 qualifying hours; an estimate needs 24"},
		{short, "headroom", unknown, "only 3 qualifying hours"},
		{short, "growth", unknown, "not enough data: 0 complete weeks"},
		{short, "forecast", unknown, "not enough data: 0 complete weeks"},
		{byID(d.root, "unit-1"), "utilization", unknown, "no GPU samples"},
		{byID(d.root, "unit-1"), "tokens_per_second_per_gpu", unknown, "no GPU samples"},
		{byID(d.root, "unit-2"), "attainment", unknown, "no requests"},
		{byID(d.root, "unit-2"), "peak", unknown, "no requests"},
	}
	for _, tt := range tests {
		shown, raw, sub := cardValue(t, tt.sec, tt.key)
		if shown != tt.shown || raw != "" || !strings.Contains(sub, tt.subPart) {
			t.Errorf("card %s: shows %q (data-value %q, %q), want %q with %q", tt.key, shown, raw, sub, tt.shown, tt.subPart)
		}
	}
	if n := len(find(short, "circle", "sustainable-pt")); n != 0 {
		t.Errorf("%d sustainable marks without a sustainable throughput", n)
	}
	fc := byID(short, "unit-3-forecast")
	if got := textOf(fc); !strings.Contains(got, "Not enough data: 0 complete weeks in the range; growth needs 2") {
		t.Errorf("forecast chart without weeks says %q", got)
	}
	// Two days from a Monday: the other weekdays' slots are blank.
	heat := byID(short, "unit-3-heatmap")
	if n, none := len(find(heat, "rect", "cell")), len(find(heat, "rect", "cell", "none")); n != 7*24 || none != 5*24 {
		t.Errorf("heat map of two days: %d cells, %d of them blank; want %d and %d", n, none, 7*24, 5*24)
	}
	for _, c := range find(heat, "rect", "cell", "none") {
		if v, _ := attr(c, "data-v"); v != "" {
			t.Errorf("a blank slot has the value %q", v)
		}
	}
	if !strings.Contains(textOf(short), "No GPUs-needed figure") {
		t.Error("no word on the missing GPUs-needed figure")
	}
	// No GPU samples: the GPU charts say so; one hour: one point each.
	if got := textOf(byID(d.root, "unit-1-utilization")); !strings.Contains(got, "No hour with GPU samples") {
		t.Errorf("utilization chart without GPU samples says %q", got)
	}
	one := byID(d.root, "unit-2")
	if n := len(find(byID(one, "unit-2-utilization"), "circle", "pt")); n != 1 {
		t.Errorf("one-hour unit: %d utilization points, want 1", n)
	}
	if n := len(find(byID(one, "unit-2-cost"), "rect", "bar")); n != 2 {
		t.Errorf("one-day unit: %d cost bars, want 2", n)
	}
	if got := textOf(byID(one, "unit-2-attainment")); !strings.Contains(got, "No hour with both GPU samples and requests") {
		t.Errorf("attainment chart without requests says %q", got)
	}
}

// TestHTMLLowerBound checks that a sustainable throughput that is a lower
// bound (the unit never saturated) shows as one, and its headroom too,
// without the risk colour.
func TestHTMLLowerBound(t *testing.T) {
	r := sampleReport()
	u := r.GetUnits()[0]
	u.Sustainable.LowerBound = true
	u.Headroom = 0
	d := renderHTML(t, r)
	sec := byID(d.root, "unit-1")
	if shown, _, _ := cardValue(t, sec, "sustainable"); !strings.HasPrefix(shown, "≥ ") {
		t.Errorf("sustainable card %q, want a lower bound (≥)", shown)
	}
	shown, _, sub := cardValue(t, sec, "headroom")
	if shown != "≥ 0.0%" || !strings.Contains(sub, "never saturated") {
		t.Errorf("headroom card %q (%q), want ≥ 0.0%% saying it never saturated", shown, sub)
	}
	for _, c := range find(sec, "div", "card") {
		if k, _ := attr(c, "data-key"); k == "headroom" && (hasClass(c, "warn") || hasClass(c, "bad")) {
			t.Error("a lower-bound headroom is coloured as a risk")
		}
	}
	// Against a lower bound of the sustainable load, GPUs needed are at
	// most the figure: shown as such in the unit's table and the overview.
	for _, row := range find(find(sec, "table", "needed")[0], "tr")[1:] {
		cells := find(row, "td")
		if gpus, change := textOf(cells[2]), textOf(cells[3]); !strings.HasPrefix(gpus, "≤ ") || !strings.HasPrefix(change, "≤ ") {
			t.Errorf("GPUs needed %q, change %q against a lower bound: want at most (≤)", gpus, change)
		}
	}
	for _, row := range find(find(d.root, "table", "overview")[0], "tr") {
		if cells := find(row, "td"); len(cells) > 7 && strings.Contains(textOf(cells[0]), u.GetName()) {
			if peak := textOf(cells[7]); !strings.HasPrefix(peak, "≤ ") {
				t.Errorf("overview GPUs for peak %q against a lower bound: want at most (≤)", peak)
			}
		}
	}
}

// TestHTMLWeekWithoutTraffic: a complete week without traffic has no peak
// hour (the report leaves it out); its point says so instead of naming an
// hour of 1970.
func TestHTMLWeekWithoutTraffic(t *testing.T) {
	r := sampleReport()
	u := r.GetUnits()[0]
	w := u.GetTrend().GetWeeks()[0]
	w.Tokens, w.PeakTokensPerSecond, w.PeakHour = 0, 0, nil
	u.Trend.GrowthKnown, u.Trend.Forecast = false, nil
	u.Trend.Reason = "no trend: the week of " + dayText(w.GetStart().AsTime()) + " has no traffic"
	d := renderHTML(t, r)
	pts := find(byID(d.root, "unit-1-forecast"), "circle", "pt", "week")
	if len(pts) == 0 {
		t.Fatal("no weekly points")
	}
	got, _ := attr(pts[0], "data-t")
	title := textOf(pts[0])
	if got != "" || strings.Contains(title, "1970") || !strings.Contains(title, "no traffic") {
		t.Errorf("week without traffic: data-t %q, title %q; want no peak hour and a title saying it had no traffic", got, title)
	}
}

// TestHTMLThinsLongRanges: a unit of more than a year of hours draws at
// most about maxScatterPoints dots per scatter chart, always with its peak
// and sustainable hours, and says how many it shows.
func TestHTMLThinsLongRanges(t *testing.T) {
	r := sampleReport()
	u := fixtureUnit("year", 400, 8, 9000, 1200, true)
	n := len(u.GetHoursDetail())
	if n <= 2*maxScatterPoints {
		t.Fatalf("fixture has %d hours", n)
	}
	// The peak and the sustainable hour fall between kept hours.
	u.Peak.Start = u.GetHoursDetail()[n-2].GetStart()
	u.Sustainable.Known, u.Sustainable.Hour = true, u.GetHoursDetail()[7].GetStart()
	r.Units = []*meterv1.CapacityUnit{u}
	d := renderHTML(t, r)
	sec := byID(d.root, "unit-1")
	for _, kind := range []string{"utilization", "attainment"} {
		c := byID(sec, "unit-1-"+kind)
		dots := find(c, "circle", "pt")
		if len(dots) > maxScatterPoints+2 || len(dots) < maxScatterPoints/2 {
			t.Errorf("%s: %d dots of %d hours", kind, len(dots), n)
		}
		times := map[string]bool{}
		for _, p := range dots {
			at, _ := attr(p, "data-t")
			times[at] = true
		}
		for what, at := range map[string]string{"peak": rfc3339(u.GetPeak().GetStart().AsTime()), "sustainable": rfc3339(u.GetSustainable().GetHour().AsTime())} {
			if !times[at] {
				t.Errorf("%s: the %s hour %s is not drawn", kind, what, at)
			}
		}
		if !strings.Contains(textOf(c), "Showing ") {
			t.Errorf("%s: the caption does not say the hours are thinned", kind)
		}
	}
}
