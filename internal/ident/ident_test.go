package ident

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		field, s string
		want     string // "" = valid, else the whole message
	}{
		{"tenant_id", "", ""},
		{"tenant_id", "acme", ""},
		{"model", "llama-3.1-70b@2026/01:a_b+c", ""},
		{"gpu_type", "NVIDIA H100 80GB HBM3", ""},
		{"tenant_id", "Zürich-東京-🚀", ""},
		{"tenant_id", "\uFFFD", ""}, // a real replacement character is printable
		{"tenant_id", "nulA\x00b", `tenant_id "nulA\x00b": byte 4 is a control character U+0000`},
		{"model", "b\x00c", `model "b\x00c": byte 1 is a control character U+0000`},
		{"tenant_id", "a\tb", `tenant_id "a\tb": byte 1 is a control character U+0009`},
		{"tenant_id", "a\nb", `tenant_id "a\nb": byte 1 is a control character U+000A`},
		{"tenant_id", "a\u0085b", `tenant_id "a\u0085b": byte 1 is a control character U+0085`},
		{"tenant_id", "a\x7f", `tenant_id "a\x7f": byte 1 is a control character U+007F`},
		{"tenant_id", "\u200b__idle__", `tenant_id "\u200b__idle__": byte 0 is an invisible format character U+200B`},
		{"tenant_id", "acme\ufeff", `tenant_id "acme\ufeff": byte 4 is an invisible format character U+FEFF`},
		{"tenant_id", "ac\u2060me", `tenant_id "ac\u2060me": byte 2 is an invisible format character U+2060`},
		{"tenant_id", "\u202eemca", `tenant_id "\u202eemca": byte 0 is an invisible format character U+202E`},
		{"tenant_id", "a\u00adb", `tenant_id "a\u00adb": byte 1 is an invisible format character U+00AD`},
		{"tenant_id", "a\u3164", `tenant_id "a\u3164": byte 1 is an invisible character U+3164`},
		{"tenant_id", "a\ufe0f", `tenant_id "a\ufe0f": byte 1 is an invisible character U+FE0F`},
		{"tenant_id", "a\u00a0b", `tenant_id "a\u00a0b": byte 1 is a space other than U+0020 U+00A0`},
		{"tenant_id", "a\u3000b", `tenant_id "a\u3000b": byte 1 is a space other than U+0020 U+3000`},
		{"tenant_id", "a\u2028b", `tenant_id "a\u2028b": byte 1 is a line or paragraph separator U+2028`},
		{"tenant_id", "a\ue000", `tenant_id "a\ue000": byte 1 is a private-use character U+E000`},
		{"tenant_id", "a\U000e0001", `tenant_id "a\U000e0001": byte 1 is an invisible format character U+E0001`},
		{"tenant_id", "a\uffff", `tenant_id "a\uffff": byte 1 is not a printable character U+FFFF`},
		{"tenant_id", "acme\xff", `tenant_id "acme\xff": byte 4 is not valid UTF-8 (0xFF)`},
		{"tenant_id", "\xc3", `tenant_id "\xc3": byte 0 is not valid UTF-8 (0xC3)`},
		{"tenant_id", " acme", `tenant_id " acme": byte 0 is a leading space U+0020`},
		{"tenant_id", "acme ", `tenant_id "acme ": byte 4 is a trailing space U+0020`},
		{"tenant_id", " ", `tenant_id " ": byte 0 is a leading space U+0020`},
		{"tenant_id", "acme corp", ""},
		{"", "x\x00", `"x\x00": byte 1 is a control character U+0000`},
		{"tenant_id", strings.Repeat("a", 100) + "\x00", `tenant_id "` + strings.Repeat("a", 64) + `"...: byte 100 is a control character U+0000`},
	}
	for _, tt := range tests {
		err := Check(tt.field, tt.s)
		if tt.want == "" {
			if err != nil {
				t.Errorf("Check(%q, %q): got %v, want nil", tt.field, tt.s, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("Check(%q, %q): got nil, want %s", tt.field, tt.s, tt.want)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Check(%q, %q): got %v, want an error wrapping ErrInvalid", tt.field, tt.s, err)
		}
		if got := err.Error(); got != tt.want {
			t.Errorf("Check(%q, %q):\ngot  %s\nwant %s", tt.field, tt.s, got, tt.want)
		}
	}
}

func TestCheckText(t *testing.T) {
	for s, ok := range map[string]bool{
		"":                  true,
		"search team":       true,
		" padded ":          true,
		"non\u00a0breaking": true,
		"Mozilla/5.0 (X11)": true,
		"a\x00b":            false,
		"line\nbreak":       false,
		"tab\t":             false,
		"\u200bhidden":      false,
		"bidi\u202e":        false,
		"bad\xff":           false,
	} {
		err := CheckText("label", s)
		if (err == nil) != ok {
			t.Errorf("CheckText(%q): got %v, want ok=%v", s, err, ok)
		}
	}
}

// TestCheckAcceptsOnlyPrintable checks the rule against its definition for
// every code point of planes 0 and 1, the tags plane, and the edges of the
// private-use planes.
func TestCheckAcceptsOnlyPrintable(t *testing.T) {
	for _, span := range [][2]rune{{0, 0x1FFFF}, {0xE0000, 0xE0FFF}, {0xF0000, 0xF00FF}, {0x10FF00, 0x10FFFF}} {
		for r := span[0]; r <= span[1]; r++ {
			if !utf8.ValidRune(r) {
				continue
			}
			printable := unicode.IsPrint(r) && !unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
			if err := Check("f", "a"+string(r)+"b"); (err == nil) != printable {
				t.Fatalf("Check of U+%04X inside an id: got %v, want accepted=%v", r, err, printable)
			}
		}
	}
}

func TestKeyUnambiguousAndOrdered(t *testing.T) {
	crafted := [][]string{
		{"nulA\x00b", "c"}, {"nulA", "b\x00c"}, {"nulA\x00b\x00c"}, {"nulA", "b", "c"},
		{"", ""}, {""}, {"\x00"}, {"\x00", ""}, {"", "\x00"}, {"\x00\x01"}, {"\x00", "\x01"},
		{"a\xff", ""}, {"a", "\xff"}, {"a\x00\xff"}, {"a", ""}, {"a"}, {"ab"}, {"a", "b"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"", "\x00", "\x01", "\xff", "a", "b", "\x00\xff", "\x00\x01"}
	for range 800 {
		parts := make([]string, 1+rng.IntN(3))
		for i := range parts {
			for range rng.IntN(4) {
				parts[i] += alphabet[rng.IntN(len(alphabet))]
			}
		}
		crafted = append(crafted, parts)
	}
	keys := make([]string, len(crafted))
	for i, parts := range crafted {
		keys[i] = Key(parts...)
	}
	for i, a := range crafted {
		for j, b := range crafted[i+1:] {
			ka, kb := keys[i], keys[i+1+j]
			if len(a) != len(b) {
				// Keys of one query always have as many parts; a shorter
				// tuple must still differ.
				if ka == kb {
					t.Fatalf("Key(%q) == Key(%q)", a, b)
				}
				continue
			}
			got, want := strings.Compare(ka, kb), slices.Compare(a, b)
			if got != want {
				t.Fatalf("compare Key(%q), Key(%q): got %d, want %d (tuple order)", a, b, got, want)
			}
		}
	}
}

// BenchmarkCheck is the identifier rule over an event's usual ids (ASCII,
// about 140 bytes) and over ids with non-ASCII letters.
func BenchmarkCheck(b *testing.B) {
	for _, tt := range []struct {
		name string
		ids  []string
	}{
		{"ascii", []string{"0f8fad5b-d9cb-469f-a165-70867728950e", "req-7c9e6679-7425-40de", "acme-corp", "llama-3.1-70b-instruct",
			"2024-07-23", "llama70b-prod-us-east", "vllm", "H100-SXM5-80GB", "node-17", "us-east-1", "interactive"}},
		{"unicode", []string{"Zürich-AG", "模型-70b", "café-prod", "région-ouest"}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			for b.Loop() {
				for _, id := range tt.ids {
					if err := Check("f", id); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
