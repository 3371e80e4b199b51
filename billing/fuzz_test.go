package billing

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"tokenmeter/internal/ident"
)

// FuzzParsePriceBook: ParsePriceBook never panics, fails only with
// ErrInvalidPriceBook, and a book it accepts is valid, names only
// identifiers, and survives its canonical form: that form parses again to
// the same book (same bytes, same version).
func FuzzParsePriceBook(f *testing.F) {
	example, err := os.ReadFile("../testdata/billing/prices/example.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ParsePriceBook(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidPriceBook) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidPriceBook", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted %q, which is not one JSON document", data)
		}
		if err := b.Validate(); err != nil {
			t.Fatalf("accepted book does not validate: %v", err)
		}
		name := func(s string, required bool) {
			if (required && s == "") || s == "*" || strings.Contains(s, "|") || ident.Check("", s) != nil {
				t.Fatalf("accepted name %q", s)
			}
		}
		for _, p := range b.GPUPrices {
			name(p.GPUType, true)
			name(p.Pool, false)
			name(p.Region, false)
			if p.PerHour < 0 || p.EffectiveFrom.IsZero() {
				t.Fatalf("accepted GPU price %+v", p)
			}
		}
		for _, p := range b.TokenPrices {
			name(p.Model, true)
			if p.InputPer1M < 0 || p.CachedInputPer1M < 0 || p.OutputPer1M < 0 || p.EffectiveFrom.IsZero() {
				t.Fatalf("accepted token price %+v", p)
			}
		}
		canon, err := b.MarshalJSON()
		if err != nil {
			t.Fatalf("canonical form of an accepted book: %v", err)
		}
		b2, err := ParsePriceBook(canon)
		if err != nil {
			t.Fatalf("canonical form %s of an accepted book does not parse: %v", canon, err)
		}
		canon2, err := b2.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(canon, canon2) || b.Version() != b2.Version() {
			t.Fatalf("canonical form changes when parsed again:\n%s\n%s", canon, canon2)
		}
	})
}
