// Package safecsv writes CSV files that a spreadsheet opens as data: no
// cell is ever taken as a formula, and numbers stay numbers. It is the one
// CSV writer of the service (billing exports, the capacity report,
// meterctl's --output csv); it owns the escaping rule and nothing about
// what the columns mean.
//
// # The rule
//
// Every column is text or numbers; the caller says which. A number cell is
// written as it is when it is a plain decimal number ("-12.5", "0", "1e-05":
// an optional minus, digits, an optional fraction and exponent), so a
// negative amount is still a number in the spreadsheet. Any other cell, of
// either kind, is text.
//
// A text cell is written as it is, except that an apostrophe (') goes in
// front of a trigger where a cell could start. The triggers are the
// characters a spreadsheet reads as the start of a formula or of a DDE
// command, after OWASP's CSV injection rule: = + - @, tab and carriage
// return, and their full-width forms ＝ ＋ － ＠ (U+FF1D, U+FF0B, U+FF0D,
// U+FF20), which East Asian input turns into formulas. A cell could start:
//
//   - at the start of the value;
//   - after a semicolon, a tab, a carriage return or a line feed in the
//     value: a spreadsheet that splits on semicolons (Excel in many European
//     locales) or tabs, or that ends a row inside a quoted value, starts a
//     new cell there. (A comma needs nothing: the CSV quoting keeps it in
//     its cell wherever commas separate.)
//
// Spaces before the trigger do not hide it (a spreadsheet may trim them),
// and apostrophes already in front of a trigger get one more, so that the
// original value is always the written one with one apostrophe taken from
// every cell start that holds apostrophes followed by a trigger:
// "=HYPERLINK(...)" is written "'=HYPERLINK(...)", "a;=1+1" "a;'=1+1",
// "-5" in a text column "'-5", and "'=1" with two apostrophes.
//
// So a text value that looks like a negative or signed number (an id "-5"
// or "+1") stays text, with its apostrophe; a text value such as "00123",
// "1e5" or "2026-11" has no trigger and is written as it is, and a
// spreadsheet may show it as a number or a date (it is not a formula). The
// apostrophe is visible in LibreOffice and in programs that read the file
// as CSV; JSON lines and Parquet exports carry every value verbatim.
package safecsv

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text returns s as a text cell: s itself unless a cell could start with a
// formula trigger in it, otherwise s with an apostrophe before each such
// trigger (see the package comment). It does not allocate when s needs
// nothing.
func Text(s string) string {
	if !needsEscape(s) {
		return s
	}
	return escape(s)
}

// escape is s with an apostrophe before each trigger at a cell start.
func escape(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 4)
	start := true
	for i := 0; i < len(s); {
		if start {
			start = false
			if at, ok := triggerAt(s, i); ok {
				b.WriteString(s[i:at])
				b.WriteByte('\'')
				i = at
				continue
			}
		}
		c := s[i]
		b.WriteByte(c)
		start = isBreak(c)
		i++
	}
	return b.String()
}

// needsEscape reports whether some cell start of s holds a trigger.
func needsEscape(s string) bool {
	if _, ok := triggerAt(s, 0); ok {
		return true
	}
	for i := 0; i < len(s); i++ {
		if isBreak(s[i]) {
			if _, ok := triggerAt(s, i+1); ok {
				return true
			}
		}
	}
	return false
}

// Classes of the bytes of a cell.
const (
	// quoteByte: the CSV quotes a field that holds it (, " CR LF).
	quoteByte uint8 = 1 << iota
	// breakByte: a cell may start after it, on a spreadsheet that splits on
	// something other than the comma or ends a row there (; TAB CR LF).
	breakByte
)

// byteClass is the class of each byte (a table: the writer looks at every
// byte of every cell).
var byteClass = [256]uint8{
	',': quoteByte, '"': quoteByte, '\r': quoteByte | breakByte, '\n': quoteByte | breakByte,
	';': breakByte, '\t': breakByte,
}

// isBreak reports whether a cell may start after c: a separator other than
// the comma, or the end of a row.
func isBreak(c byte) bool { return byteClass[c]&breakByte != 0 }

// FormulaRisk reports whether a spreadsheet could read a formula from
// cell: whether a trigger stands where a cell could start (past spaces),
// with no apostrophe in front. No cell that Text returns has one; the tests
// of every writer check their output with it.
func FormulaRisk(cell string) bool {
	for i := 0; i <= len(cell); i++ {
		if i > 0 && !isBreak(cell[i-1]) {
			continue
		}
		j := i
		for j < len(cell) && cell[j] == ' ' {
			j++
		}
		if isTrigger(cell[j:]) {
			return true
		}
	}
	return false
}

// isTrigger reports whether s starts with a trigger.
func isTrigger(s string) bool {
	if s == "" {
		return false
	}
	switch s[0] {
	case '=', '+', '-', '@', '\t', '\r':
		return true
	}
	if s[0] < utf8.RuneSelf {
		return false
	}
	switch r, _ := utf8.DecodeRuneInString(s); r {
	case '＝', '＋', '－', '＠':
		return true
	}
	return false
}

// triggerAt looks at the cell that could start at s[i:]: past spaces, then
// past apostrophes, is there a trigger? at is where the apostrophe goes
// (after the spaces).
func triggerAt(s string, i int) (at int, ok bool) {
	for i < len(s) && s[i] == ' ' {
		i++
	}
	at = i
	for i < len(s) && s[i] == '\'' {
		i++
	}
	return at, isTrigger(s[i:])
}

// IsNumber reports whether s is a plain decimal number, which a number
// column writes as it is: an optional minus, digits, an optional fraction
// of digits, an optional exponent ("e" or "E", an optional sign, digits).
func IsNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() bool {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if !digits() {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	return i == len(s)
}

// Cell is s as a cell of a number column (numeric) or of a text column: a
// plain number in a number column as it is, anything else as Text.
func Cell(s string, numeric bool) string {
	if numeric && IsNumber(s) {
		return s
	}
	return Text(s)
}

// Writer writes CSV records as encoding/csv's Writer does (RFC 4180: a
// field is quoted when it holds a comma, a quote, CR or LF, or starts with
// a space; lines end with "\n"), each cell made safe by Cell, in one pass
// over its bytes. It buffers; Flush writes the buffer out. It is not safe
// for concurrent use.
type Writer struct {
	bw      *bufio.Writer
	numeric []bool
}

// NewWriter returns a Writer to w. numeric[i] says that column i holds
// numbers; every other column is text, and so is every column past the end
// of numeric. A header row goes through Write too (its names are text).
func NewWriter(w io.Writer, numeric []bool) *Writer {
	return &Writer{bw: bufio.NewWriter(w), numeric: numeric}
}

// Numeric returns the numeric argument of NewWriter for the header: true
// for each column that isNumber names.
func Numeric(header []string, isNumber func(column string) bool) []bool {
	out := make([]bool, len(header))
	for i, h := range header {
		out[i] = isNumber(h)
	}
	return out
}

// Write writes one record, each cell through Cell. The error is the
// underlying io.Writer's, once the buffer is written out.
func (w *Writer) Write(record []string) error {
	for i, s := range record {
		if i > 0 {
			w.bw.WriteByte(',')
		}
		if i < len(w.numeric) && w.numeric[i] && IsNumber(s) {
			w.bw.WriteString(s) // digits, '-', '.', 'e', '+': never quoted
			continue
		}
		w.text(s)
	}
	if err := w.bw.WriteByte('\n'); err != nil {
		return fmt.Errorf("write csv record: %w", err)
	}
	return nil
}

// text writes s as Text, quoted where encoding/csv would quote it.
func (w *Writer) text(s string) {
	var class uint8
	for i := 0; i < len(s); i++ {
		class |= byteClass[s[i]]
	}
	if _, ok := triggerAt(s, 0); ok || class&breakByte != 0 && needsEscape(s) {
		s = escape(s)
	}
	if class&quoteByte == 0 && !leadingSpace(s) && s != `\.` {
		w.bw.WriteString(s)
		return
	}
	w.bw.WriteByte('"')
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			break
		}
		w.bw.WriteString(s[:i+1])
		w.bw.WriteByte('"')
		s = s[i+1:]
	}
	w.bw.WriteString(s)
	w.bw.WriteByte('"')
}

// leadingSpace reports whether s starts with a space character, which
// encoding/csv quotes (a reader may trim it otherwise).
func leadingSpace(s string) bool {
	if s == "" {
		return false
	}
	if s[0] < utf8.RuneSelf {
		return unicode.IsSpace(rune(s[0]))
	}
	r, _ := utf8.DecodeRuneInString(s)
	return unicode.IsSpace(r)
}

// Flush writes buffered records to the underlying io.Writer and returns
// the first error a write met.
func (w *Writer) Flush() error {
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}
