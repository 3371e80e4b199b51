package ident

import "strings"

// Key joins parts into one string that identifies the tuple: two different
// tuples never share a key, whatever bytes the parts hold (a NUL included),
// and keys compare (as strings) as the tuples do, part by part. Each part is
// written with its 0x00 bytes as 0x00 0xFF and ends with 0x00 0x01.
func Key(parts ...string) string {
	n := 0
	for _, p := range parts {
		n += len(p) + 2
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range parts {
		for {
			i := strings.IndexByte(p, 0)
			if i < 0 {
				break
			}
			b.WriteString(p[:i+1])
			b.WriteByte(0xFF)
			p = p[i+1:]
		}
		b.WriteString(p)
		b.WriteString("\x00\x01")
	}
	return b.String()
}
