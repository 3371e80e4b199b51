package sheettest

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOpen checks that the spreadsheet reads what the package says: a
// formula as a formula, numbers as floats, text as shown, and fields split
// on the separator asked for.
func TestOpen(t *testing.T) {
	file := []byte("name,amount,note\n=1+1,-12.5,\"a;=2+2\"\n'=1+1,3,  x\ty\n")
	sheets := Open(t, Comma, file, file)
	if len(sheets) != 2 {
		t.Fatalf("got %d sheets, want 2", len(sheets))
	}
	got := sheets[1]
	want := Sheet{
		{{Row: 0, Col: 0, Type: "string", Text: "name"}, {Row: 0, Col: 1, Type: "string", Text: "amount"}, {Row: 0, Col: 2, Type: "string", Text: "note"}},
		{{Row: 1, Col: 0, Type: "float", Value: "2", Formula: "of:=1+1", Text: "2"}, {Row: 1, Col: 1, Type: "float", Value: "-12.5", Text: "-12.5"},
			{Row: 1, Col: 2, Type: "string", Text: "a;=2+2"}},
		{{Row: 2, Col: 0, Type: "string", Text: "'=1+1"}, {Row: 2, Col: 1, Type: "float", Value: "3", Text: "3"},
			{Row: 2, Col: 2, Type: "string", Text: "  x\ty"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sheet (-want +got):\n%s", diff)
	}

	// Split on semicolons, "a;=2+2" starts a cell with =2+2.
	semi := Open(t, Semicolon, file)[0]
	var formulas []string
	for _, c := range semi.Cells() {
		if c.Formula != "" {
			formulas = append(formulas, c.Formula)
		}
	}
	if !slices.ContainsFunc(formulas, func(f string) bool { return strings.HasPrefix(f, "of:=2+2") }) {
		t.Errorf("semicolon-separated formulas %q, want one of =2+2", formulas)
	}
}
