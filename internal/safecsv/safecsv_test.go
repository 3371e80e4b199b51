package safecsv

import (
	"bytes"
	"encoding/csv"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"acme", "acme"},
		{"llama-3-70b", "llama-3-70b"},
		{"2026-11", "2026-11"},
		{"00123", "00123"},
		{"a=b", "a=b"},
		{"=HYPERLINK(\"http://x\",\"y\")", "'=HYPERLINK(\"http://x\",\"y\")"},
		{"=cmd|' /C calc'!A0", "'=cmd|' /C calc'!A0"},
		{"+1+1", "'+1+1"},
		{"-1+1", "'-1+1"},
		{"@SUM(1+1)", "'@SUM(1+1)"},
		{"-5", "'-5"},
		{"+1", "'+1"},
		{"-", "'-"},
		{"\t=1", "'\t'=1"},
		{"\r=1", "'\r'=1"},
		{"＝1+1", "'＝1+1"},
		{"＋1", "'＋1"},
		{"－1", "'－1"},
		{"＠SUM(1)", "'＠SUM(1)"},
		{"  =1", "  '=1"},
		{"'=1", "''=1"},
		{"''-1", "'''-1"},
		{"'abc", "'abc"},
		{"it's", "it's"},
		{"a;=1+1", "a;'=1+1"},
		{"a; =1+1", "a; '=1+1"},
		{"a;b;-2", "a;b;'-2"},
		{"a\t+1", "a\t'+1"},
		{"a\n@x", "a\n'@x"},
		{"a\r\n=1", "a\r\n'=1"},
		{"a,=1", "a,=1"}, // the quoting keeps it in its cell
		{"a;", "a;"},
		{"é=1", "é=1"},
	}
	for _, tt := range tests {
		if got := Text(tt.in); got != tt.want {
			t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestIsNumber(t *testing.T) {
	for _, s := range []string{"0", "12", "-12.5", "0.000000001", "1e-05", "2.5E+10", "-0"} {
		if !IsNumber(s) {
			t.Errorf("IsNumber(%q) = false, want true", s)
		}
	}
	for _, s := range []string{"", "-", "+1", "1.", ".5", "1e", "1e+", "--1", "1-1", "-1+1", "NaN", "+Inf", "-Inf", "1,5", " 1", "1 ", "0x10", "-5;=1"} {
		if IsNumber(s) {
			t.Errorf("IsNumber(%q) = true, want false", s)
		}
	}
}

func TestCell(t *testing.T) {
	tests := []struct {
		in      string
		numeric bool
		want    string
	}{
		{"-12.5", true, "-12.5"},
		{"-12.5", false, "'-12.5"},
		{"", true, ""},
		{"-Inf", true, "'-Inf"},
		{"=1+1", true, "'=1+1"},
		{"12", false, "12"},
	}
	for _, tt := range tests {
		if got := Cell(tt.in, tt.numeric); got != tt.want {
			t.Errorf("Cell(%q, %v) = %q, want %q", tt.in, tt.numeric, got, tt.want)
		}
	}
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, []bool{false, true, true})
	for _, rec := range [][]string{
		{"tenant", "charge", "requests"},
		{"=HYPERLINK(\"http://evil\",\"x\")", "-12.5", "3"},
		{"-5", "=1+1", "", "+1+1"}, // a cell past the mask is text
		{"a;=1,b", "1e-05", "0"},
	} {
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := "tenant,charge,requests\n" +
		"\"'=HYPERLINK(\"\"http://evil\"\",\"\"x\"\")\",-12.5,3\n" +
		"'-5,'=1+1,,'+1+1\n" +
		"\"a;'=1,b\",1e-05,0\n"
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("CSV (-want +got):\n%s", diff)
	}
}

// original undoes Text as the package comment says a reader does: one
// apostrophe comes off every cell start that holds apostrophes followed by
// a trigger.
func original(cell string) string {
	var b strings.Builder
	start := true
	for i := 0; i < len(cell); {
		if start {
			start = false
			if at, ok := triggerAt(cell, i); ok && at < len(cell) && cell[at] == '\'' {
				b.WriteString(cell[i:at])
				i = at + 1
				continue
			}
		}
		b.WriteByte(cell[i])
		start = isBreak(cell[i])
		i++
	}
	return b.String()
}

func FuzzText(f *testing.F) {
	for _, s := range []string{"=1", "a;=1", "'=1", " \t=1", "－1", "x\r\n@y", "ok", "''", "; ;-", "-12.5", "1e5", `\.`, "a,\"b\"", " x", "\u00a0y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Text(s)
		if FormulaRisk(s) != needsEscape(s) && !strings.Contains(s, "'") {
			t.Errorf("FormulaRisk(%q) = %v, needsEscape %v", s, FormulaRisk(s), needsEscape(s))
		}
		if FormulaRisk(got) {
			t.Errorf("Text(%q) = %q: a cell could start with a trigger", s, got)
		}
		if back := original(got); back != s {
			t.Errorf("original(Text(%q)) = %q", s, back)
		}
		if (got == s) == needsEscape(s) {
			t.Errorf("Text(%q) = %q, needsEscape %v", s, got, needsEscape(s))
		}
		// The writer writes the cells as encoding/csv writes Cell's
		// answers, and a CSV reader reads them back whole.
		for _, numeric := range []bool{false, true} {
			rec := []string{s, "x", s}
			var got, want bytes.Buffer
			w := NewWriter(&got, []bool{numeric, false, !numeric})
			if err := w.Write(rec); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			cw := csv.NewWriter(&want)
			if err := cw.Write([]string{Cell(s, numeric), "x", Cell(s, !numeric)}); err != nil {
				t.Fatal(err)
			}
			cw.Flush()
			if got.String() != want.String() {
				t.Fatalf("Writer wrote %q, encoding/csv %q", got.String(), want.String())
			}
		}
		if !utf8.ValidString(s) || strings.Contains(s, "\r") {
			return // encoding/csv's reader changes invalid UTF-8 and \r\n
		}
		var buf bytes.Buffer
		w := NewWriter(&buf, nil)
		if err := w.Write([]string{s, "x"}); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		recs, err := csv.NewReader(&buf).ReadAll()
		if err != nil {
			t.Fatalf("read back %q: %v", buf.String(), err)
		}
		if len(recs) != 1 || len(recs[0]) != 2 || recs[0][0] != got {
			t.Errorf("read back %q as %q, want [%q x]", buf.String(), recs, got)
		}
	})
}

func BenchmarkText(b *testing.B) {
	for _, s := range []string{"acme-prod", "=HYPERLINK(\"http://x\")"} {
		b.Run(s[:4], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Text(s)
			}
		})
	}
}

// BenchmarkWriter writes a usage-cost-like row (times, ids, counts and
// amounts), through safecsv and through encoding/csv alone.
func BenchmarkWriter(b *testing.B) {
	rec := []string{"2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", "2026-11", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z",
		"tenant-07", "llama-3.1-70b-instruct", "dep-3", "120", "1500001", "400000", "100003", "USD",
		"0.6", "0.3", "1.8", "0.960006", "1.234", "-0.273994", "token:m@2026-01-01T00:00:00Z", "v3"}
	numeric := make([]bool, len(rec))
	for i, s := range rec {
		numeric[i] = IsNumber(s)
	}
	b.Run("safecsv", func(b *testing.B) {
		w := NewWriter(io.Discard, numeric)
		b.ReportAllocs()
		for b.Loop() {
			if err := w.Write(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-csv", func(b *testing.B) { // the floor: no escaping
		w := csv.NewWriter(io.Discard)
		b.ReportAllocs()
		for b.Loop() {
			if err := w.Write(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}
