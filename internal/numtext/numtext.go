// Package numtext writes numbers for people: a decimal string with
// thousands separators. Written by hand because the one library that
// groups digits (golang.org/x/text/message) takes float64 or int and
// formats by locale; here every digit of a decimal string is kept as it is
// (exact money, uint64 counts) and the separator is always ",".
package numtext

import "strings"

// Group puts thousands separators into the whole part of a decimal string:
// "-1234567.891" is "-1,234,567.891". A leading "-" and the fraction are
// kept as they are.
func Group(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	b.Grow(len(sign) + len(s) + len(whole)/3)
	b.WriteString(sign)
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if hasFrac {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}
