// Package sheettest opens CSV files in a real spreadsheet from tests:
// LibreOffice Calc, headless, converts each file as a user's Calc opens it
// (UTF-8, fields quoted with ", formulas evaluated) to a flat OpenDocument
// spreadsheet, and the package reads back every cell's type, value, text
// and formula. Tests use it to prove that no cell of a CSV the service
// writes opens as a formula and that numbers open as numbers.
//
// A test that needs the spreadsheet calls Open; without soffice it skips,
// except under CI=true, where it fails: CI must never go green by skipping.
//
//	sheets := sheettest.Open(t, sheettest.Comma, statementsCSV, capacityCSV)
//	for _, c := range sheets[0].Cells() {
//		if c.Formula != "" { ... }
//	}
//
// It owns no data and knows nothing about what the files hold.
package sheettest

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// EnvSoffice names the environment variable that points at the
	// LibreOffice binary; the default is DefaultSoffice.
	EnvSoffice = "SOFFICE"
	// DefaultSoffice is where Debian's libreoffice-calc-nogui installs it.
	DefaultSoffice = "/usr/bin/soffice"

	convertTimeout = 2 * time.Minute
)

// The separators a spreadsheet splits fields on.
const (
	// Comma is the separator the service's files use.
	Comma = ','
	// Semicolon is the list separator of Excel in many European locales,
	// which it uses to split a .csv file it opens.
	Semicolon = ';'
	// Tab is the separator of tab-separated text.
	Tab = '\t'
)

// Cell is one cell as the spreadsheet read it.
type Cell struct {
	// Row and Col are the cell's place, from 0.
	Row, Col int
	// Type is the cell's value type: "float", "string", "boolean", "date",
	// "time", "percentage" or "currency"; "" for an empty cell.
	Type string
	// Value is the value of a number, boolean, date or time cell as the
	// spreadsheet stores it ("-12.5").
	Value string
	// Formula is the cell's formula ("of:=1+1"): empty unless the
	// spreadsheet took the cell as a formula.
	Formula string
	// Text is the cell as shown.
	Text string
}

func (c Cell) empty() bool { return c.Type == "" && c.Value == "" && c.Formula == "" && c.Text == "" }

// Sheet is the cells of one file, row by row; trailing empty cells and
// rows are left out.
type Sheet [][]Cell

// Cells is every cell of s, row by row.
func (s Sheet) Cells() []Cell {
	var out []Cell
	for _, row := range s {
		out = append(out, row...)
	}
	return out
}

// Soffice returns the LibreOffice binary: $SOFFICE, /usr/bin/soffice, or
// soffice on the PATH.
func Soffice() (string, error) {
	if p := os.Getenv(EnvSoffice); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", EnvSoffice, err)
		}
		return p, nil
	}
	if _, err := os.Stat(DefaultSoffice); err == nil {
		return DefaultSoffice, nil
	}
	p, err := exec.LookPath("soffice")
	if err != nil {
		return "", fmt.Errorf("no LibreOffice (soffice): install libreoffice-calc-nogui or set $%s", EnvSoffice)
	}
	return p, nil
}

// Open converts each CSV file with one soffice run (a private profile, so
// that tests in parallel do not share one) splitting fields on sep, and
// returns their sheets in order. Without soffice the test skips, or fails
// under CI=true.
func Open(t testing.TB, sep byte, files ...[]byte) []Sheet {
	t.Helper()
	bin, err := Soffice()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sheettest: %v (CI=true: tests that need a spreadsheet must not skip)", err)
		}
		t.Skipf("sheettest: %v", err)
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	if err := os.Mkdir(in, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{
		"-env:UserInstallation=file://" + filepath.ToSlash(filepath.Join(dir, "profile")),
		"--headless", "--norestore",
		// Field separator, text delimiter ", UTF-8, from line 1, standard
		// column types, default language, quoted fields not forced to text,
		// special numbers detected, three export options, formulas evaluated.
		fmt.Sprintf("--infilter=CSV:%d,34,76,1,,0,false,true,false,false,false,-1,true", sep),
		"--convert-to", "fods", "--outdir", out,
	}
	for i, f := range files {
		p := filepath.Join(in, fmt.Sprintf("f%d.csv", i))
		if err := os.WriteFile(p, f, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	ctx, cancel := context.WithTimeout(t.Context(), convertTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	output, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("sheettest: soffice ran past %s: %s", convertTimeout, output)
	}
	if err != nil {
		t.Fatalf("sheettest: soffice: %v: %s", err, output)
	}
	sheets := make([]Sheet, len(files))
	for i := range files {
		p := filepath.Join(out, fmt.Sprintf("f%d.fods", i))
		f, err := os.Open(p)
		if err != nil {
			t.Fatalf("sheettest: soffice wrote no %s: %v: %s", filepath.Base(p), err, output)
		}
		sheets[i], err = ReadFODS(f)
		f.Close()
		if err != nil {
			t.Fatalf("sheettest: read %s: %v", filepath.Base(p), err)
		}
	}
	return sheets
}

// CheckCSV compares sheet, what file opened as split on commas, with the
// file (a header row, then data): no cell may be a formula; in the columns
// whose header numeric names, every cell the file fills must be a number
// of the file's value (to the 15 significant digits a spreadsheet keeps);
// every other cell that the file starts with an apostrophe must be text
// showing just what the file holds. It reports what differs with t.Errorf
// and returns how many number cells it checked.
func CheckCSV(t testing.TB, sheet Sheet, file []byte, numeric func(column string) bool) (numbers int) {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(file)).ReadAll()
	if err != nil {
		t.Fatalf("sheettest: read the CSV file: %v", err)
	}
	if len(sheet) != len(recs) {
		t.Errorf("sheettest: %d rows in the spreadsheet, %d in the file", len(sheet), len(recs))
	}
	errs := 0
	report := func(format string, args ...any) {
		t.Helper()
		if errs++; errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	for r, row := range sheet[:min(len(sheet), len(recs))] {
		for _, c := range row {
			if c.Col >= len(recs[r]) {
				report("sheettest: row %d col %d: %+v past the file's %d cells", r, c.Col, c, len(recs[r]))
				continue
			}
			want, col := recs[r][c.Col], recs[0][c.Col]
			switch {
			case c.Formula != "":
				report("sheettest: row %d %s: %q opened as the formula %q", r, col, want, c.Formula)
			case r > 0 && numeric(col) && want != "":
				numbers++
				w, err1 := strconv.ParseFloat(want, 64)
				v, err2 := strconv.ParseFloat(c.Value, 64)
				if c.Type != "float" || err1 != nil || err2 != nil || math.Abs(v-w) > 1e-14*math.Abs(w) {
					report("sheettest: row %d %s: %q opened as %s %q, want a number", r, col, want, c.Type, c.Value)
				}
			case strings.HasPrefix(want, "'") && (c.Type != "string" || c.Text != want):
				report("sheettest: row %d %s: %q opened as %s %q, want the text as it is", r, col, want, c.Type, c.Text)
			}
		}
	}
	if errs > 20 {
		t.Errorf("sheettest: %d more differences", errs-20)
	}
	return numbers
}

// maxRepeat bounds the expansion of repeated cells and rows (LibreOffice
// pads a sheet with runs of empty ones).
const maxRepeat = 1 << 12

// ReadFODS reads the first table of a flat OpenDocument spreadsheet.
func ReadFODS(r io.Reader) (Sheet, error) {
	const (
		tableNS  = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
		officeNS = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
		textNS   = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
	)
	attr := func(e xml.StartElement, space, local string) string {
		for _, a := range e.Attr {
			if a.Name.Space == space && a.Name.Local == local {
				return a.Value
			}
		}
		return ""
	}
	repeat := func(e xml.StartElement, local string) int {
		n, err := strconv.Atoi(attr(e, tableNS, local))
		if err != nil || n < 1 {
			return 1
		}
		return min(n, maxRepeat)
	}
	var (
		sheet     Sheet
		row       []Cell
		rowRepeat int
		cell      *Cell
		cellRep   int
		text      strings.Builder
		paras     int
		inP       bool
		tables    int
	)
	dec := xml.NewDecoder(r)
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch e := tok.(type) {
		case xml.StartElement:
			switch {
			case e.Name.Space == tableNS && e.Name.Local == "table":
				tables++
			case tables != 1:
			case e.Name.Space == tableNS && e.Name.Local == "table-row":
				row, rowRepeat = nil, repeat(e, "number-rows-repeated")
			case e.Name.Space == tableNS && (e.Name.Local == "table-cell" || e.Name.Local == "covered-table-cell"):
				cell = &Cell{Type: attr(e, officeNS, "value-type"), Formula: attr(e, tableNS, "formula")}
				for _, v := range []string{"value", "boolean-value", "date-value", "time-value"} {
					if s := attr(e, officeNS, v); s != "" {
						cell.Value = s
					}
				}
				cellRep = repeat(e, "number-columns-repeated")
				text.Reset()
				paras = 0
			case cell != nil && e.Name.Space == textNS && e.Name.Local == "p":
				if paras > 0 {
					text.WriteByte('\n')
				}
				paras++
				inP = true
			case cell != nil && e.Name.Space == textNS && e.Name.Local == "s":
				n, err := strconv.Atoi(attr(e, textNS, "c"))
				if err != nil || n < 1 {
					n = 1
				}
				text.WriteString(strings.Repeat(" ", min(n, maxRepeat)))
			case cell != nil && e.Name.Space == textNS && e.Name.Local == "tab":
				text.WriteByte('\t')
			case cell != nil && e.Name.Space == textNS && e.Name.Local == "line-break":
				text.WriteByte('\n')
			}
		case xml.CharData:
			if cell != nil && inP {
				text.Write(e)
			}
		case xml.EndElement:
			switch {
			case tables != 1:
			case e.Name.Space == textNS && e.Name.Local == "p":
				inP = false
			case e.Name.Space == tableNS && e.Name.Local == "table":
				tables++ // only the first table
			case e.Name.Space == tableNS && (e.Name.Local == "table-cell" || e.Name.Local == "covered-table-cell"):
				cell.Text = text.String()
				for range cellRep {
					c := *cell
					c.Col = len(row)
					row = append(row, c)
				}
				cell = nil
			case e.Name.Space == tableNS && e.Name.Local == "table-row":
				for len(row) > 0 && row[len(row)-1].empty() {
					row = row[:len(row)-1]
				}
				for range rowRepeat {
					r := make([]Cell, len(row))
					for i, c := range row {
						c.Row = len(sheet)
						r[i] = c
					}
					sheet = append(sheet, r)
				}
			}
		}
	}
	for len(sheet) > 0 && len(sheet[len(sheet)-1]) == 0 {
		sheet = sheet[:len(sheet)-1]
	}
	return sheet, nil
}
