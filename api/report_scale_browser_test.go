package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/api"
	"tokenmeter/internal/testkit/browsertest"
	"tokenmeter/internal/testkit/capacitytest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestCapacityReportOf15000DeploymentsInBrowser is the report of the
// attack: 15,000 deployment names. The JSON answer and the HTML file are
// bounded (20 units and the others), and the HTML opens in Chromium with
// the note saying how many deployments the others sum. A screenshot goes to
// the artifacts.
func TestCapacityReportOf15000DeploymentsInBrowser(t *testing.T) {
	b := browsertest.New(t)
	const deployments = 15_000
	start := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	fleet := &capacitytest.Fleet{}
	for i := range deployments {
		dep := fmt.Sprintf("tenant-made-%05d", i)
		for h := range 2 {
			at := start.Add(time.Duration(h) * time.Hour)
			fleet.Hour(dep, "H100", at, uint32(1+i%4), 0.2+float64(i%7)/10, 3_600_000_000)
			fleet.Traffic("llama-3.1-70b", dep, at, uint64(200+i%100), uint64(198+i%100), uint64(1000+i), 500)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		&api.Services{Keys: testKeySet(t), Reports: fleet},
		func(context.Context) error { return nil }, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	q := url.Values{"start": {"2026-10-05T00:00:00Z"}, "end": {"2026-10-05T02:00:00Z"}}
	resp, body := getReport(t, srv, q, testKeys["finance"])
	var answer meterv1.GetCapacityReportResponse
	if resp.StatusCode != 200 || protojson.Unmarshal(body, &answer) != nil {
		t.Fatalf("JSON report: %d %.300s", resp.StatusCode, body)
	}
	r := answer.GetReport()
	t.Logf("JSON: %d bytes, %d units, %d in others", len(body), len(r.GetUnits()), r.GetUnitsInOthers())
	if len(r.GetUnits()) != 20 || r.GetUnitsInOthers() != deployments-20 || len(body) > 1<<20 {
		t.Errorf("JSON report: %d bytes, %d units, %d in others; want at most 1 MiB, 20 units", len(body), len(r.GetUnits()), r.GetUnitsInOthers())
	}
	q.Set("format", "html")
	resp, page := getReport(t, srv, q, testKeys["finance"])
	t.Logf("HTML: %d bytes", len(page))
	if resp.StatusCode != 200 || len(page) > 4<<20 {
		t.Fatalf("HTML report: %d, %d bytes; want 200 and at most 4 MiB", resp.StatusCode, len(page))
	}
	file := filepath.Join(t.TempDir(), "capacity.html")
	if err := os.WriteFile(file, page, 0o644); err != nil {
		t.Fatal(err)
	}
	p := b.Open(t, "file://"+file)
	p.Run(t, chromedp.WaitVisible(chromedp.CSS("#others")))
	if errs := p.Errors(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
	got := browsertest.Value(t, p, chromedp.Evaluate[map[string]string](`({
		sections: String(document.querySelectorAll("section.unit").length),
		rows: String(document.querySelectorAll("#overview tbody tr").length),
		note: document.getElementById("others-note").textContent,
		members: document.querySelector("#others p.members").textContent,
	})`))
	if got["sections"] != "22" || got["rows"] != "21" || !strings.Contains(got["note"], "14,980 deployments beyond the 20 largest") ||
		!strings.Contains(got["members"], "and 14,880 more") {
		t.Errorf("HTML of 15,000 deployments: %v; want 22 sections, 21 rows, the others note and members", got)
	}
	p.Screenshot(t, "capacity-report-15000-deployments")
}
