package api_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/html"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	"tokenmeter/api"
	"tokenmeter/internal/testkit/capacitytest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query/capacity/render"
)

// startReportAPI runs an api.Server whose capacity report reads the demo
// fleet: the real service, guard and gateway, without ClickHouse.
func startReportAPI(t *testing.T, start time.Time, days int) *api.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		&api.Services{Keys: testKeySet(t), Reports: capacitytest.Demo(start, days, capacitytest.DemoDeployments)},
		func(context.Context) error { return nil }, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

func getReport(t *testing.T, srv *api.Server, query url.Values, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+srv.HTTPAddr()+"/v1/reports/capacity?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// TestCapacityReportFiles checks GET /v1/reports/capacity?format=csv and
// format=html: the files, their headers, that they hold the report the
// JSON answer holds, rendered exactly as meterctl renders it, and that
// errors keep the gateway's JSON form.
func TestCapacityReportFiles(t *testing.T) {
	start := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	srv := startReportAPI(t, start, 22)
	q := func(kv ...string) url.Values {
		v := url.Values{"start": {"2026-10-05T00:00:00Z"}, "end": {"2026-10-27T00:00:00Z"}, "growth": {"1.3"}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}

	// The JSON answer, with format=json or none.
	resp, body := getReport(t, srv, q(), testKeys["finance"])
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("JSON: %d %s %.300s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var report meterv1.GetCapacityReportResponse
	if err := protojson.Unmarshal(body, &report); err != nil {
		t.Fatal(err)
	}
	if n := len(report.GetReport().GetUnits()); n != 3 {
		t.Fatalf("JSON report has %d units, want 3", n)
	}
	resp, body = getReport(t, srv, q("format", "json"), testKeys["finance"])
	var again meterv1.GetCapacityReportResponse
	if resp.StatusCode != 200 || protojson.Unmarshal(body, &again) != nil {
		t.Fatalf("format=json: %d %.300s", resp.StatusCode, body)
	}
	if diff := cmp.Diff(&report, &again, protocmp.Transform()); diff != "" {
		t.Errorf("format=json and no format differ (-none +json):\n%s", diff)
	}

	for _, f := range []struct {
		format, contentType, file string
		render                    func(io.Writer, *meterv1.CapacityReport) error
	}{
		{"csv", "text/csv; charset=utf-8", "capacity-20261005T00Z-20261027T00Z.csv", render.CSV},
		{"html", "text/html; charset=utf-8", "capacity-20261005T00Z-20261027T00Z.html", render.HTML},
	} {
		resp, body := getReport(t, srv, q("format", f.format), testKeys["finance"])
		if resp.StatusCode != 200 {
			t.Fatalf("format=%s: %d %.300s", f.format, resp.StatusCode, body)
		}
		if got := resp.Header.Get("Content-Type"); got != f.contentType {
			t.Errorf("format=%s: Content-Type %q, want %q", f.format, got, f.contentType)
		}
		disp, params, err := mime.ParseMediaType(resp.Header.Get("Content-Disposition"))
		if err != nil || disp != "attachment" || params["filename"] != f.file {
			t.Errorf("format=%s: Content-Disposition %q, want an attachment named %s", f.format, resp.Header.Get("Content-Disposition"), f.file)
		}
		if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("format=%s: X-Content-Type-Options %q, want nosniff", f.format, got)
		}
		// The same bytes as the renderer gives the JSON answer's report
		// (what meterctl report capacity writes).
		var want bytes.Buffer
		if err := f.render(&want, report.GetReport()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(body, want.Bytes()) {
			t.Errorf("format=%s: the file (%d bytes) differs from the JSON report rendered (%d bytes)", f.format, len(body), want.Len())
		}
	}

	// The CSV reads back: a header and the fleet and 3 units.
	_, body = getReport(t, srv, q("format", "csv"), testKeys["finance"])
	rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatalf("read the CSV: %v", err)
	}
	if len(rows) != 5 || rows[0][0] != "name" || rows[1][0] != "fleet" || rows[2][0] != "<script>alert(1)</script>" {
		t.Errorf("CSV rows %d, first cells %q", len(rows), func() []string {
			var s []string
			for _, r := range rows {
				s = append(s, r[0])
			}
			return s
		}())
	}

	// The HTML parses, names its units, escaped, and forbids any resource.
	resp, body = getReport(t, srv, q("format", "html"), testKeys["finance"])
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("HTML Content-Security-Policy %q, want default-src 'none'", csp)
	}
	doc, err := html.Parse(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse the HTML: %v", err)
	}
	var sections, scripts int
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			switch n.Data {
			case "script":
				scripts++
			case "section":
				for _, a := range n.Attr {
					if a.Key == "class" && a.Val == "unit" {
						sections++
					}
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if sections != 4 || scripts != 0 {
		t.Errorf("HTML: %d unit sections (want 4: fleet and 3 units), %d scripts (want 0)", sections, scripts)
	}
	if !bytes.Contains(body, []byte("&lt;script&gt;alert(1)&lt;/script&gt;")) {
		t.Error("HTML: the markup deployment name is not escaped")
	}

	// Errors: the gateway's JSON, with its codes.
	for _, c := range []struct {
		name   string
		query  url.Values
		key    string
		status int
		want   string
	}{
		{"bad format", q("format", "xml"), testKeys["finance"], 400, `format "xml": want json, csv or html`},
		{"tenant key", q("format", "csv"), testKeys["tenant"], 403, "may not call"},
		{"tenant key, JSON", q(), testKeys["tenant"], 403, "may not call"},
		{"no key", q("format", "html"), "", 401, ""},
		{"bad growth", q("format", "csv", "growth", "-1"), testKeys["finance"], 400, `growth "-1"`},
		{"unknown deployment", q("format", "html", "deployment", "nope"), testKeys["finance"], 404, `deployment "nope"`},
		{"unknown parameter", q("format", "csv", "colour", "red"), testKeys["finance"], 400, "colour"},
	} {
		resp, body := getReport(t, srv, c.query, c.key)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if resp.StatusCode != c.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
			json.Unmarshal(body, &e) != nil || e.Code == 0 || !strings.Contains(e.Message, c.want) {
			t.Errorf("%s: %d %s %s, want %d with a JSON error naming %q", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), body, c.status, c.want)
		}
		if resp.Header.Get("Content-Disposition") != "" {
			t.Errorf("%s: an error answer is an attachment", c.name)
		}
	}

	// A range without data: the files say so and invent nothing.
	resp, body = getReport(t, srv, url.Values{"start": {"2026-09-01T00:00:00Z"}, "end": {"2026-09-08T00:00:00Z"}, "format": {"csv"}}, testKeys["finance"])
	if resp.StatusCode != 200 || strings.Count(string(body), "\n") != 1 {
		t.Errorf("CSV of a range without data: %d, %q; want only the header", resp.StatusCode, body)
	}
	resp, body = getReport(t, srv, url.Values{"start": {"2026-09-01T00:00:00Z"}, "end": {"2026-09-08T00:00:00Z"}, "format": {"html"}}, testKeys["finance"])
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`id="not-enough-data"`)) || bytes.Contains(body, []byte(`class="card`)) {
		t.Errorf("HTML of a range without data: %d; want the not-enough-data banner and no card", resp.StatusCode)
	}
}
