package billing

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// nanosPerUnit is the number of nano-units in one unit of currency (or of a
// weight).
const nanosPerUnit = 1_000_000_000

// Money is an exact amount in nano-units (1e-9) of the price book's currency:
// Money(1_500_000_000) is 1.5 USD in a USD book. The range is
// ±9,223,372,036.854775807 units; math.MinInt64 is not a valid Money (so that
// every amount can be negated).
//
// Its text and JSON form is the shortest exact decimal (see String); its
// JSON form is always a string, never a JSON number.
type Money int64

// ParseMoney parses a decimal amount: an optional '-', at least one digit,
// and optionally '.' followed by 1 to 9 digits ("12", "12.345", "-0.000000001").
// It rejects more than 9 decimals (it never rounds), exponents ("1e3"),
// signs other than a leading '-', spaces, separators, and amounts outside the
// range of Money. Errors wrap ErrInvalidMoney; out-of-range errors also wrap
// ErrOutOfRange.
func ParseMoney(s string) (Money, error) {
	n, err := parseNanos(s, ErrInvalidMoney)
	if err != nil {
		return 0, err
	}
	return Money(n), nil
}

// String returns the shortest exact decimal: trailing zero decimals and a
// trailing '.' are trimmed, so 1.5 USD is "1.5", 2 USD is "2" and one nano-unit
// is "0.000000001". ParseMoney(m.String()) == m for every valid m.
func (m Money) String() string { return formatNanos(int64(m)) }

// StringFixed returns m rounded half to even to places decimals (0 to 9) and
// written with exactly that many decimals: Money(4_105_000_000).StringFixed(2)
// is "4.10". It is for display (statements); it never feeds arithmetic.
func (m Money) StringFixed(places int) string {
	places = min(max(places, 0), 9)
	unit := pow10(9 - places)
	q := roundDivHalfEven(int64(m), unit)
	neg := q < 0
	if neg {
		q = -q
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	if places == 0 {
		b.WriteString(strconv.FormatInt(q, 10))
		return b.String()
	}
	scale := pow10(places)
	b.WriteString(strconv.FormatInt(q/scale, 10))
	b.WriteByte('.')
	frac := strconv.FormatInt(q%scale, 10)
	b.WriteString(strings.Repeat("0", places-len(frac)))
	b.WriteString(frac)
	return b.String()
}

// MarshalText writes m as String does; encoding/json then writes a string.
func (m Money) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText parses text as ParseMoney does. encoding/json calls it for
// JSON strings only, so a JSON number is an error.
func (m *Money) UnmarshalText(text []byte) error {
	v, err := ParseMoney(string(text))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Weight is an exact non-negative decimal weight of the weighted_tokens
// policy, in nano-units like Money: Weight(3_000_000_000) is a weight of 3.
// Its text form is that of Money.
type Weight int64

// ParseWeight parses a weight with the grammar of ParseMoney; it also rejects
// negative weights. Errors wrap ErrInvalidWeight (and ErrOutOfRange when out
// of range).
func ParseWeight(s string) (Weight, error) {
	n, err := parseNanos(s, ErrInvalidWeight)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: %q is negative", ErrInvalidWeight, s)
	}
	return Weight(n), nil
}

// String returns the shortest exact decimal, like Money.String.
func (w Weight) String() string { return formatNanos(int64(w)) }

// MarshalText writes w as String does.
func (w Weight) MarshalText() ([]byte, error) { return []byte(w.String()), nil }

// UnmarshalText parses text as ParseWeight does.
func (w *Weight) UnmarshalText(text []byte) error {
	v, err := ParseWeight(string(text))
	if err != nil {
		return err
	}
	*w = v
	return nil
}

// parseNanos parses the decimal grammar of ParseMoney into nano-units. Its
// errors wrap kind.
func parseNanos(s string, kind error) (int64, error) {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", kind, s, why) }
	rest := s
	neg := false
	if strings.HasPrefix(rest, "-") {
		neg = true
		rest = rest[1:]
	}
	intPart, fracPart, hasDot := strings.Cut(rest, ".")
	if intPart == "" {
		return 0, bad("want at least one digit before the decimal point")
	}
	if hasDot && fracPart == "" {
		return 0, bad("want at least one digit after the decimal point")
	}
	if len(fracPart) > 9 {
		return 0, bad("more than 9 decimals")
	}
	if !allDigits(intPart) || !allDigits(fracPart) {
		return 0, bad("want digits, an optional leading '-' and an optional '.'")
	}
	// Leading zeros carry no value; dropping them keeps the length check
	// below about the value, not the spelling.
	intPart = strings.TrimLeft(intPart, "0")
	if len(intPart) > 10 {
		return 0, fmt.Errorf("%w: %w %q", kind, ErrOutOfRange, s)
	}
	var units uint64
	for _, c := range intPart {
		units = units*10 + uint64(c-'0')
	}
	var frac uint64
	for _, c := range fracPart {
		frac = frac*10 + uint64(c-'0')
	}
	frac *= uint64(pow10(9 - len(fracPart)))
	// units < 1e10, so units*1e9 + frac < 1e19 < 2^64: no overflow here.
	n := units*nanosPerUnit + frac
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %w %q", kind, ErrOutOfRange, s)
	}
	if neg {
		return -int64(n), nil
	}
	return int64(n), nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// formatNanos writes n nano-units as the shortest exact decimal.
func formatNanos(n int64) string {
	var b strings.Builder
	u := uint64(n)
	if n < 0 {
		b.WriteByte('-')
		u = uint64(-n) // n != MinInt64 for valid amounts; uint64 wraps correctly anyway
	}
	b.WriteString(strconv.FormatUint(u/nanosPerUnit, 10))
	if frac := u % nanosPerUnit; frac != 0 {
		digits := strconv.FormatUint(frac, 10)
		digits = strings.Repeat("0", 9-len(digits)) + digits
		b.WriteByte('.')
		b.WriteString(strings.TrimRight(digits, "0"))
	}
	return b.String()
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// roundDivHalfEven returns n / d rounded half to even, for d > 0.
func roundDivHalfEven(n, d int64) int64 {
	q, r := n/d, n%d
	if r < 0 { // Go truncates toward zero; make r ≥ 0 and q the floor
		q--
		r += d
	}
	switch c := 2 * r; {
	case c > d, c == d && q%2 != 0:
		q++
	}
	return q
}

// roundRat returns r rounded half to even to an integer.
func roundRat(r *big.Rat) *big.Int {
	num, den := r.Num(), r.Denom()
	q, m := new(big.Int).DivMod(num, den, new(big.Int)) // Euclidean: 0 ≤ m < den, q = floor
	m.Lsh(m, 1)
	switch c := m.Cmp(den); {
	case c > 0, c == 0 && q.Bit(0) == 1:
		q.Add(q, big.NewInt(1))
	}
	return q
}

// moneyFromRat rounds r half to even to a nano-unit. r is in nano-units.
func moneyFromRat(r *big.Rat) (Money, error) {
	q := roundRat(r)
	if !q.IsInt64() || q.Int64() == math.MinInt64 {
		return 0, fmt.Errorf("%w: %s nano-units", ErrOutOfRange, q)
	}
	return Money(q.Int64()), nil
}
