// Package ident is the one rule for identifiers: the tenants, models,
// deployments, nodes, GPU types, label keys and other names that events, GPU
// samples, price books, SLO sets and queries carry, and that become series
// and cost lines.
//
// A valid identifier is valid UTF-8 made of printable characters (letters,
// marks, numbers, punctuation, symbols and the ASCII space) with no space at
// either end. So it holds no control character (a NUL would split a joined
// key), no invisible character (U+200B, U+FEFF, U+2060, bidi controls,
// Hangul fillers, variation selectors) and no other space or non-printable
// that would make two different ids look the same. Label values and other
// free text follow a looser rule (CheckText).
//
// The package owns one length, MaxLen: the limit of an event's identifiers
// (ingest's Limits.MaxStringLen by default), which every identifier a
// request names is held to as well (CheckParam). Other lengths, required
// fields and reserved names are the callers' to check. Key builds map and sort keys from several ids that no
// two different tuples share, whatever the ids hold.
package ident

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every *Error.
var ErrInvalid = errors.New("invalid identifier")

// Error says which character of which field breaks the rule.
type Error struct {
	// Field names the field, e.g. "tenant_id"; may be empty when the caller
	// reports the field itself.
	Field string
	// Value is the offending value.
	Value string
	// Offset is the byte offset of the offending character in Value.
	Offset int
	// Rune is the offending character; utf8.RuneError for a byte that is not
	// valid UTF-8 (Byte holds it then).
	Rune rune
	// Byte is the invalid byte when Rune is utf8.RuneError from bad UTF-8.
	Byte byte
	// Problem says what is wrong with the character, e.g. "a control character".
	Problem string
}

// maxShown bounds how much of the value an error message quotes (in runes).
const maxShown = 64

func (e *Error) Error() string {
	var b strings.Builder
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteByte(' ')
	}
	b.WriteString(quote(e.Value, maxShown))
	if e.Problem == problemInvalidUTF8 {
		fmt.Fprintf(&b, ": byte %d is %s (0x%02X)", e.Offset, e.Problem, e.Byte)
	} else {
		fmt.Fprintf(&b, ": byte %d is %s %U", e.Offset, e.Problem, e.Rune)
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

const (
	problemInvalidUTF8 = "not valid UTF-8"
	problemLeading     = "a leading space"
	problemTrailing    = "a trailing space"
)

// Check returns nil when s is a valid identifier (the empty string is one:
// required fields are the caller's to check), else an *Error naming field
// and the first offending character.
func Check(field, s string) error {
	if !printableASCII(s) {
		for i, r := range s {
			if p := problem(s, i, r, false); p != "" {
				return newError(field, s, i, r, p)
			}
		}
	}
	if s != "" {
		if s[0] == ' ' {
			return newError(field, s, 0, ' ', problemLeading)
		}
		if s[len(s)-1] == ' ' {
			return newError(field, s, len(s)-1, ' ', problemTrailing)
		}
	}
	return nil
}

// MaxLen bounds an identifier, in bytes: the default limit of an event's
// identifier fields (ingest.DefaultLimits's MaxStringLen). An API request
// naming a longer one names nothing that can be stored; refused up front,
// it never reaches the SQL (a tenant_id of 200 KB exceeded ClickHouse's
// max_query_size and answered 500).
const MaxLen = 256

// CheckParam is the rule for an identifier a request names (a tenant, a
// deployment to read or close): at most MaxLen bytes, and Check. Its errors
// wrap ErrInvalid and quote at most the start of s.
func CheckParam(field, s string) error {
	if len(s) > MaxLen {
		return fmt.Errorf("%w: %s %s is %d bytes long, the limit is %d (that of an event's identifiers)", ErrInvalid, field, quote(s, 16), len(s), MaxLen)
	}
	return Check(field, s)
}

// CheckText is the rule for free text such as label values: valid UTF-8
// with no control, invisible or other non-printable character, but any
// space character anywhere, leading and trailing ones included.
func CheckText(field, s string) error {
	if printableASCII(s) {
		return nil
	}
	for i, r := range s {
		if p := problem(s, i, r, true); p != "" {
			return newError(field, s, i, r, p)
		}
	}
	return nil
}

// printableASCII reports whether s is only bytes 0x20 to 0x7E, which every
// rule accepts (spaces at the ends aside): the common case, checked without
// the Unicode tables (about 29 ns a byte with them, a few µs an event).
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7E {
			return false
		}
	}
	return true
}

// Valid reports whether Check accepts s.
func Valid(s string) bool { return Check("", s) == nil }

func newError(field, s string, i int, r rune, p string) *Error {
	e := &Error{Field: field, Value: s, Offset: i, Rune: r, Problem: p}
	if p == problemInvalidUTF8 {
		e.Byte = s[i]
	}
	return e
}

// quote is strconv.Quote of the first max runes of s ("..." after the
// quotes when it cut), which also escapes the invisible characters that
// strconv deems printable (U+3164, U+FE0F...).
func quote(s string, max int) string {
	b := []byte{'"'}
	n := 0
	for i, w := 0, 0; i < len(s); i += w {
		if n == max {
			return string(b) + `"...`
		}
		var r rune
		r, w = utf8.DecodeRuneInString(s[i:])
		if w > 1 && strconv.IsPrint(r) && problem(s, i, r, true) != "" {
			if r > 0xFFFF {
				b = fmt.Appendf(b, `\U%08x`, r)
			} else {
				b = fmt.Appendf(b, `\u%04x`, r)
			}
		} else {
			q := strconv.Quote(s[i : i+w])
			b = append(b, q[1:len(q)-1]...)
		}
		n++
	}
	return string(append(b, '"'))
}

// problem says what is wrong with the character r at byte i of s, or "".
func problem(s string, i int, r rune, spaces bool) string {
	switch {
	case r == utf8.RuneError:
		if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
			return problemInvalidUTF8
		}
		return "" // a real U+FFFD is printable
	case r == ' ':
		return ""
	case unicode.Is(unicode.Cc, r):
		return "a control character"
	case unicode.Is(unicode.Cf, r):
		return "an invisible format character"
	case unicode.Is(unicode.Zs, r):
		if spaces {
			return ""
		}
		return "a space other than U+0020"
	case unicode.In(r, unicode.Zl, unicode.Zp):
		return "a line or paragraph separator"
	case unicode.Is(unicode.Co, r):
		return "a private-use character"
	case unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector):
		return "an invisible character"
	case !unicode.IsPrint(r):
		return "not a printable character"
	}
	return ""
}
