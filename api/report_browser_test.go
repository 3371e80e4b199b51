package api_test

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/internal/testkit/browsertest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// chartCounts are the marks of one chart, counted in the browser's DOM.
type chartCounts struct {
	Points     int  `json:"points"`
	Qualifying int  `json:"qualifying"`
	Bars       int  `json:"bars"`
	Cells      int  `json:"cells"`
	Blank      int  `json:"blank"`
	Forecast   int  `json:"forecast"`
	Sustain    int  `json:"sustainable"`
	Height     int  `json:"height"`
	Note       bool `json:"note"`
}

// countCharts counts every chart's marks by its element id.
const countCharts = `Object.fromEntries(Array.from(document.querySelectorAll("figure.chart")).map(f => [f.id, {
	points: f.querySelectorAll("circle.pt").length,
	qualifying: f.querySelectorAll("circle.pt.q").length,
	bars: f.querySelectorAll("rect.bar").length,
	cells: f.querySelectorAll("rect.cell").length,
	blank: f.querySelectorAll("rect.cell.none").length,
	forecast: f.querySelectorAll("circle.forecast-pt").length,
	sustainable: f.querySelectorAll("circle.sustainable-pt").length,
	height: Math.round(f.querySelector("svg") ? f.querySelector("svg").getBoundingClientRect().height : 0),
	note: f.querySelector("p.note") !== null,
}]))`

// unitCards are a section's name, heading and cards, read in the browser.
type unitCards struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Heading string `json:"heading"`
	Cards   map[string]struct {
		Value string `json:"value"`
		Shown string `json:"shown"`
	} `json:"cards"`
}

const readCards = `Array.from(document.querySelectorAll("section.unit")).map(s => ({
	id: s.id, name: s.dataset.name, heading: s.querySelector("h2").textContent,
	cards: Object.fromEntries(Array.from(s.querySelectorAll(".card")).map(c => [c.dataset.key,
		{value: c.dataset.value, shown: c.querySelector(".value").textContent}])),
}))`

// TestCapacityReportInBrowser opens the HTML report the API serves for the
// demo fleet in headless Chromium, from a file as a user would: it loads
// without an error, its charts have one mark per data point of the JSON
// report and are drawn, its cards show the JSON report's numbers, and the
// deployment named like a script is text. Screenshots go to the artifacts.
func TestCapacityReportInBrowser(t *testing.T) {
	b := browsertest.New(t)
	start := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	srv := startReportAPI(t, start, 22)
	q := url.Values{"start": {"2026-10-05T00:00:00Z"}, "end": {"2026-10-27T00:00:00Z"}, "growth": {"1.3"}}
	resp, body := getReport(t, srv, q, testKeys["finance"])
	var answer meterv1.GetCapacityReportResponse
	if resp.StatusCode != 200 || protojson.Unmarshal(body, &answer) != nil {
		t.Fatalf("JSON report: %d %.300s", resp.StatusCode, body)
	}
	report := answer.GetReport()
	q.Set("format", "html")
	resp, page := getReport(t, srv, q, testKeys["finance"])
	if resp.StatusCode != 200 {
		t.Fatalf("HTML report: %d %.300s", resp.StatusCode, page)
	}
	file := filepath.Join(t.TempDir(), "capacity.html")
	if err := os.WriteFile(file, page, 0o644); err != nil {
		t.Fatal(err)
	}

	p := b.Open(t, "file://"+file)
	p.Run(t, chromedp.WaitVisible(chromedp.CSS("#fleet")))
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
	if n := browsertest.Value(t, p, chromedp.Evaluate[int](`document.scripts.length + document.querySelectorAll("[src],link,img,iframe").length`)); n != 0 {
		t.Errorf("%d scripts or external elements, want none", n)
	}

	// One mark per data point, and every chart drawn.
	charts := browsertest.Value(t, p, chromedp.Evaluate[map[string]chartCounts](countCharts))
	units := map[string]*meterv1.CapacityUnit{"fleet": report.GetFleet()}
	for i, u := range report.GetUnits() {
		units["unit-"+strconv.Itoa(i+1)] = u
	}
	if len(charts) != 5*len(units) {
		t.Errorf("%d charts, want 5 for each of %d sections", len(charts), len(units))
	}
	for id, u := range units {
		var gpuHours, loadHours, qualifying int
		for _, h := range u.GetHoursDetail() {
			if h.GetGpus() > 0 {
				gpuHours++
				if h.GetRequests() > 0 {
					loadHours++
					if h.GetQualifies() {
						qualifying++
					}
				}
			}
		}
		blank := 0
		for _, d := range u.GetLoadProfile() {
			for _, n := range d.GetHours() {
				if n == 0 {
					blank++
				}
			}
		}
		sustainable, forecast := 0, 0
		if u.GetSustainable().GetKnown() {
			sustainable = 1
		}
		if u.GetTrend().GetForecast() != nil {
			forecast = 1
		}
		for _, c := range []struct {
			chart string
			what  string
			got   int
			want  int
		}{
			{"utilization", "points", charts[id+"-utilization"].Points, gpuHours},
			{"attainment", "points", charts[id+"-attainment"].Points, loadHours},
			{"attainment", "qualifying points", charts[id+"-attainment"].Qualifying, qualifying},
			{"attainment", "sustainable marks", charts[id+"-attainment"].Sustain, sustainable},
			{"heatmap", "cells", charts[id+"-heatmap"].Cells, 7 * 24},
			{"heatmap", "blank cells", charts[id+"-heatmap"].Blank, blank},
			{"cost", "bars", charts[id+"-cost"].Bars, 2 * len(u.GetDays())},
			{"forecast", "points", charts[id+"-forecast"].Points, len(u.GetTrend().GetWeeks())},
			{"forecast", "forecast marks", charts[id+"-forecast"].Forecast, forecast},
		} {
			if c.got != c.want {
				t.Errorf("%s %s chart: %d %s, want %d", id, c.chart, c.got, c.what, c.want)
			}
		}
		for _, kind := range []string{"utilization", "attainment", "heatmap", "cost", "forecast"} {
			if c := charts[id+"-"+kind]; c.Height < 150 || c.Note {
				t.Errorf("%s %s chart: %d px high, note %v; want it drawn", id, kind, c.Height, c.Note)
			}
		}
	}

	// The cards show the JSON report's numbers.
	sections := browsertest.Value(t, p, chromedp.Evaluate[[]unitCards](readCards))
	if len(sections) != len(units) {
		t.Fatalf("%d sections, want %d", len(sections), len(units))
	}
	for _, s := range sections {
		u := units[s.ID]
		if s.Name != u.GetName() {
			t.Errorf("section %s is %q, want %q", s.ID, s.Name, u.GetName())
		}
		same := func(key string, want float64) {
			got, err := strconv.ParseFloat(s.Cards[key].Value, 64)
			if err != nil || got != want {
				t.Errorf("%s card %s: data-value %q, want %v", s.ID, key, s.Cards[key].Value, want)
			}
		}
		same("utilization", u.GetUtilization())
		same("attainment", u.GetAttainment())
		same("tokens_per_second_per_gpu", u.GetTokensPerSecondPerGpu())
		same("gpu_hours", u.GetGpuHours())
		if got, want := s.Cards["utilization"].Shown, strconv.FormatFloat(u.GetUtilization()*100, 'f', 1, 64)+"%"; got != want {
			t.Errorf("%s utilization card shows %q, want %q", s.ID, got, want)
		}
		if got, want := s.Cards["requests"].Value, strconv.FormatUint(u.GetRequests(), 10); got != want {
			t.Errorf("%s requests card: %q, want %q", s.ID, got, want)
		}
		if got, want := s.Cards["cost"].Value, u.GetCost().GetAmount(); got != want {
			t.Errorf("%s cost card: %q, want the exact amount %q", s.ID, got, want)
		}
		if sus := u.GetSustainable(); sus.GetKnown() {
			same("sustainable", sus.GetTokensPerSecondPerGpu())
		} else if s.Cards["sustainable"].Shown != "unknown" {
			t.Errorf("%s sustainable card shows %q without an estimate", s.ID, s.Cards["sustainable"].Shown)
		}
	}
	// The deployment named like a script is a heading's text.
	evil := 0
	for _, s := range sections {
		if s.Name == "<script>alert(1)</script>" && strings.HasSuffix(s.Heading, "<script>alert(1)</script>") {
			evil++
		}
	}
	if evil != 1 {
		t.Errorf("%d sections show the name <script>alert(1)</script> as text, want 1", evil)
	}
	p.Screenshot(t, "capacity-report")

	// A range without data: the banner, no card, no chart.
	q = url.Values{"start": {"2026-09-01T00:00:00Z"}, "end": {"2026-09-08T00:00:00Z"}, "format": {"html"}}
	_, page = getReport(t, srv, q, testKeys["finance"])
	empty := filepath.Join(t.TempDir(), "empty.html")
	if err := os.WriteFile(empty, page, 0o644); err != nil {
		t.Fatal(err)
	}
	p = b.Open(t, "file://"+empty)
	p.Run(t, chromedp.WaitVisible(chromedp.CSS("#not-enough-data")))
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
	if n := browsertest.Value(t, p, chromedp.Evaluate[int](`document.querySelectorAll(".card, svg, section.unit").length`)); n != 0 {
		t.Errorf("the report without data shows %d cards, charts or sections, want none", n)
	}
	p.Screenshot(t, "capacity-report-not-enough-data")
}
