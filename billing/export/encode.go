package export

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"tokenmeter/billing"
)

// decimal16 is a DECIMAL(38, 9) Parquet value: 16 bytes, big-endian two's
// complement of the unscaled value.
type decimal16 = [16]byte

// moneyDecimal encodes m: its unscaled value at scale 9 is its nano-units.
func moneyDecimal(m billing.Money) decimal16 {
	var b decimal16
	v := int64(m)
	if v < 0 {
		binary.BigEndian.PutUint64(b[:8], ^uint64(0))
	}
	binary.BigEndian.PutUint64(b[8:], uint64(v))
	return b
}

func moneyDecimalPtr(m billing.Money) *decimal16 {
	b := moneyDecimal(m)
	return &b
}

// scaledDecimal encodes n × 10^-shift at scale 9: unscaled n × 10^(9-shift).
func scaledDecimal(n uint64, shift int) decimal16 {
	var b decimal16
	mul := uint64(1)
	for range 9 - shift {
		mul *= 10
	}
	hi, lo := bits.Mul64(n, mul)
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return b
}

// scaledText is n × 10^-shift as the shortest exact decimal: 1234567 with
// shift 6 is "1.234567".
func scaledText(n uint64, shift int) string {
	s := strconv.FormatUint(n, 10)
	if shift == 0 {
		return s
	}
	if len(s) <= shift {
		s = strings.Repeat("0", shift-len(s)+1) + s
	}
	whole, frac := s[:len(s)-shift], strings.TrimRight(s[len(s)-shift:], "0")
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}

// isNumberColumn reports whether a CSV column of any dataset (statement
// lines, usage and cost, FOCUS) holds numbers: counts, quantities, prices
// and amounts. The CSV writes their cells as plain numbers ("-12.5" stays a
// number in a spreadsheet); every other column is text, escaped by safecsv
// so that no cell opens as a formula.
func isNumberColumn(column string) bool {
	switch column {
	case "requests", "input_tokens", "cached_input_tokens", "output_tokens",
		"input_per_1m", "cached_input_per_1m", "output_per_1m", "charge", "list_charge", "allocated_cost", "margin",
		"BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "ListCost",
		"ListUnitPrice", "PricingQuantity", "x_Tokens", "x_Requests", "x_AllocatedCost", "x_Margin":
		return true
	}
	return false
}

// timeText formats times in UTC, remembering the last one: consecutive rows
// of an hourly export share their hours.
type timeText struct {
	layout string
	last   time.Time
	text   string
}

func (c *timeText) format(t time.Time) string {
	if c.text != "" && t.Equal(c.last) {
		return c.text
	}
	c.last, c.text = t, t.UTC().Format(c.layout)
	return c.text
}

func rfc3339() timeText { return timeText{layout: time.RFC3339Nano} }

// focusTime is FOCUS's date/time format: UTC, to the second, with Z.
const focusTime = "2006-01-02T15:04:05Z"

func utcMicros(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func uintText(n uint64) string { return strconv.FormatUint(n, 10) }

// appendMoney appends m as billing.Money.String writes it, the shortest
// exact decimal, without allocating.
func appendMoney(b []byte, m billing.Money) []byte {
	u := uint64(m)
	if m < 0 {
		b = append(b, '-')
		u = -u
	}
	b = strconv.AppendUint(b, u/1e9, 10)
	frac := u % 1e9
	if frac == 0 {
		return b
	}
	var d [9]byte
	for i := 8; i >= 0; i-- {
		d[i] = '0' + byte(frac%10)
		frac /= 10
	}
	n := 9
	for d[n-1] == '0' {
		n--
	}
	return append(append(b, '.'), d[:n]...)
}

// fieldText formats a row's numeric fields into one buffer and hands them
// out as substrings of one string: one allocation per row instead of one
// per field.
type fieldText struct {
	buf  []byte
	ends []int
	out  []string
}

func (f *fieldText) reset() {
	f.buf, f.ends, f.out = f.buf[:0], f.ends[:0], f.out[:0]
}

func (f *fieldText) money(m billing.Money) {
	f.buf = appendMoney(f.buf, m)
	f.ends = append(f.ends, len(f.buf))
}

func (f *fieldText) uint(n uint64) {
	f.buf = strconv.AppendUint(f.buf, n, 10)
	f.ends = append(f.ends, len(f.buf))
}

// fields is the fields formatted since reset, in order.
func (f *fieldText) fields() []string {
	s := string(f.buf)
	start := 0
	for _, end := range f.ends {
		f.out = append(f.out, s[start:end])
		start = end
	}
	return f.out
}
