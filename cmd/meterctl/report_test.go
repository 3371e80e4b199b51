package main

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
	"google.golang.org/protobuf/encoding/protojson"

	"tokenmeter/api"
	"tokenmeter/internal/testkit/capacitytest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query/capacity/render"
)

// TestReportCapacity runs "report capacity" against the real API server,
// whose report reads a demo fleet: each format's output, the parameters
// sent, -o FILE, and the errors.
func TestReportCapacity(t *testing.T) {
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "finance", SHA256: hashKey("tm_finance"), Role: api.RoleFinance},
		{Name: "acme", SHA256: hashKey("tm_acme"), Role: api.RoleTenant, TenantID: "acme"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	addr := startAPI(t, &api.Services{Keys: keys, Reports: capacitytest.Demo(start, 22, capacitytest.DemoDeployments)})
	base := []string{"report", "capacity", "--addr", addr, "--key", "tm_finance", "--start", "2026-10-05", "--end", "2026-10-27", "--growth", "1.3"}
	run := func(t *testing.T, extra ...string) (string, string) {
		t.Helper()
		out, errOut, err := runArgs(t, nil, append(append([]string{}, base...), extra...)...)
		if err != nil {
			t.Fatalf("report capacity %s: %v (stderr %s)", strings.Join(extra, " "), err, errOut)
		}
		return out, errOut
	}

	// JSON: the API's answer, with the parameters sent.
	out, _ := run(t, "--format", "json", "--target", "0.95", "--horizon-weeks", "8", "--target-tps", "30000")
	var resp meterv1.GetCapacityReportResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("JSON output: %v\n%.500s", err, out)
	}
	r := resp.GetReport()
	if len(r.GetUnits()) != 3 || r.GetTarget() != 0.95 || r.GetHorizonWeeks() != 8 || r.GetGrowth() != "1.3" || r.GetTargetTokensPerSecond() != 30000 ||
		!r.GetStart().AsTime().Equal(start) || !r.GetEnd().AsTime().Equal(start.AddDate(0, 0, 22)) {
		t.Errorf("report of %d units, target %v, horizon %d, growth %q, target load %v, range %v – %v; want the flags' values",
			len(r.GetUnits()), r.GetTarget(), r.GetHorizonWeeks(), r.GetGrowth(), r.GetTargetTokensPerSecond(), r.GetStart().AsTime(), r.GetEnd().AsTime())
	}
	if !strings.Contains(out, "\n  \"report\": {") || !strings.Contains(out, `"hours_with_gpus"`) {
		t.Errorf("JSON output is not indented with proto names:\n%.300s", out)
	}

	// The same report, without the extra parameters, for the files.
	out, _ = run(t, "--format", "json")
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	r = resp.GetReport()

	// CSV on standard output: parses, one row per unit, the renderer's bytes.
	out, errOut := run(t, "--format", "csv", "-o", "-")
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatalf("CSV output: %v", err)
	}
	if len(rows) != 1+1+len(r.GetUnits()) || rows[1][0] != "fleet" {
		t.Errorf("CSV: %d rows (first cells %q), want header, fleet and %d units", len(rows), rows[1][0], len(r.GetUnits()))
	}
	var want bytes.Buffer
	if err := render.CSV(&want, r); err != nil {
		t.Fatal(err)
	}
	if out != want.String() {
		t.Error("CSV output differs from the rendered report")
	}
	if errOut != "" {
		t.Errorf("stderr %q, want nothing when writing to standard output", errOut)
	}

	// Table: a row per unit, the fleet first, each unit's headline figures
	// (known ones are numbers, not "-"), then the findings.
	out, _ = run(t, "--format", "table")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2+len(r.GetUnits()) || !strings.HasPrefix(lines[0], "UNIT") || !strings.HasPrefix(lines[1], "fleet ") {
		t.Fatalf("table: want a header, the fleet and %d units:\n%s", len(r.GetUnits()), out)
	}
	for i, u := range r.GetUnits() {
		row := lines[2+i]
		if !strings.HasPrefix(row, u.GetName()+" ") {
			t.Errorf("table row %d is %q, want unit %s", i+2, row, u.GetName())
			continue
		}
		if s := u.GetSustainable(); s.GetKnown() && strings.Count(row, " - ") > 1 {
			t.Errorf("table row of %s, whose sustainable load is known, leaves figures out: %q", u.GetName(), row)
		}
		if u.GetTrend().GetGrowthKnown() && !strings.Contains(row, "%") {
			t.Errorf("table row of %s lacks its weekly growth: %q", u.GetName(), row)
		}
	}
	if len(r.GetFindings()) > 0 && !strings.Contains(out, "\nFindings:\n  [") {
		t.Errorf("table lacks the findings:\n%s", out)
	}
	// Then the fleet plan: this API has no price book, so every GPU type
	// says so and no deployment has a mix.
	if !strings.Contains(out, "\nFleet plan (") || !strings.Contains(out, "\n  chat-prod: forecast peak ") || !strings.Contains(out, "H100: no price: ") ||
		!strings.Contains(out, "    no mix: not enough data: no GPU type has both") {
		t.Errorf("table lacks the fleet plan:\n%s", out)
	}
	if testing.Verbose() {
		t.Logf("table:\n%s", out)
	}

	// HTML to a file: parses, the renderer's bytes, nothing else left behind.
	dir := t.TempDir()
	file := filepath.Join(dir, "capacity.html")
	_, errOut = run(t, "--format", "html", "-o", file)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := html.Parse(bytes.NewReader(data)); err != nil {
		t.Fatalf("HTML output: %v", err)
	}
	want.Reset()
	if err := render.HTML(&want, r); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, want.Bytes()) {
		t.Error("HTML file differs from the rendered report")
	}
	if !bytes.Contains(data, []byte(`id="unit-1-attainment"`)) || bytes.Contains(data, []byte("<script>")) {
		t.Error("HTML file lacks the charts or holds a script")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in the output directory, want only %s", len(entries), file)
	}
	if !strings.Contains(errOut, "wrote "+file) || !strings.Contains(errOut, "3 units") {
		t.Errorf("stderr %q, want a line naming the file and its units", errOut)
	}

	// A range without data: the file says so, and so does stderr.
	out, errOut, err = runArgs(t, nil, "report", "capacity", "--addr", addr, "--key", "tm_finance", "--start", "2026-09-01", "--end", "2026-09-08", "--format", "csv")
	if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(errOut, "warning: not enough data: no GPU samples and no traffic") {
		t.Errorf("range without data: %v, %q, stderr %q; want the header alone and a warning", err, out, errOut)
	}

	// Errors: the flags' before any request, the server's after.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "pdf"}, `--format "pdf": want html, json, csv or table`},
		{[]string{"--group-by", "tenant_id"}, `--group-by "tenant_id": want deployment, model or gpu_type`},
		{[]string{"--target", "1.5"}, "--target 1.5"},
		{[]string{"--start", "2026-10-05T00:30:00Z"}, "must be a whole hour"},
		{[]string{"--growth", "-2"}, `400 Bad Request: invalid query: growth "-2"`},
		{[]string{"--deployment", "nope"}, "404 Not Found"},
		{[]string{"--key", "tm_acme"}, "403 Forbidden"},
		{[]string{"-o", filepath.Join(dir, "missing", "x.html")}, "-o " + filepath.Join(dir, "missing", "x.html")},
	} {
		_, _, err := runArgs(t, nil, append(append([]string{}, base...), c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	if out, _, err := runArgs(t, nil, append(append([]string{}, base...), "--validate")...); err != nil || out != "configuration ok\n" {
		t.Errorf("--validate: %q, %v", out, err)
	}
	if out, _, err := runArgs(t, nil, "help", "report"); err != nil || !strings.Contains(out, "capacity [--start S --end E]") {
		t.Errorf("help report: %q, %v", out, err)
	}
}
