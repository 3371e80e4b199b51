package ingest

import (
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The JSON fast path (see RowDecoder). Every function returns false for
// input it does not handle, and the record then goes to protojson.

// jscan reads JSON from b at i.
type jscan struct {
	b []byte
	i int
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jscan) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// expect consumes c after optional whitespace.
func (s *jscan) expect(c byte) bool {
	s.ws()
	if s.peek() != c {
		return false
	}
	s.i++
	s.ws()
	return true
}

// str reads a string without escapes or control characters, in valid
// UTF-8, and returns its bytes (which alias the input).
func (s *jscan) str() ([]byte, bool) {
	if s.peek() != '"' {
		return nil, false
	}
	start := s.i + 1
	ascii := true
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := s.b[start:j]
			if !ascii && !utf8.Valid(v) {
				return nil, false
			}
			s.i = j + 1
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number reads a number in JSON's grammar and returns its text.
func (s *jscan) number() ([]byte, bool) {
	b, j := s.b, s.i
	digits := func() int {
		k := j
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		return j - k
	}
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		digits()
	default:
		return nil, false
	}
	if j < len(b) && b[j] == '.' {
		j++
		if digits() == 0 {
			return nil, false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return nil, false
		}
	}
	v := b[s.i:j]
	s.i = j
	return v, true
}

// plainUint parses digits without sign, fraction, exponent or leading
// zero, at most maxDigits of them (so that the value cannot overflow).
func plainUint(b []byte, maxDigits int) (uint64, bool) {
	if len(b) == 0 || len(b) > maxDigits || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// uintValue reads an unsigned integer sent as a number or a string, as
// protojson accepts both for integer fields.
func (s *jscan) uintValue(maxDigits int) (uint64, bool) {
	var raw []byte
	var ok bool
	if s.peek() == '"' {
		raw, ok = s.str()
	} else {
		raw, ok = s.number()
	}
	if !ok {
		return 0, false
	}
	return plainUint(raw, maxDigits)
}

// keep returns b as a string of the row: shared through the intern table
// for the fields whose values repeat, a copy for the others (IDs).
func (d *RowDecoder) keep(b []byte, intern bool) string {
	if intern {
		return d.strs.get(b)
	}
	return string(b)
}

// unsafeString views b as a string for a call that does not keep it.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// float reads a double sent as a number (strings, such as "NaN", fall back).
func (s *jscan) float() (float64, bool) {
	raw, ok := s.number()
	if !ok {
		return 0, false
	}
	if v, ok := exactDecimal(raw); ok {
		return v, true
	}
	v, err := strconv.ParseFloat(unsafeString(raw), 64)
	return v, err == nil
}

// pow10 are the powers of ten a float64 holds exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// exactDecimal reads a number of the form -?D+(.D+)? with at most 15
// digits in all, without strconv: the digits as an integer and the power
// of ten are both exact in a float64, so one division rounds correctly
// (Clinger's fast path, the same that strconv.ParseFloat takes first),
// and the result is ParseFloat's. false for any other form.
func exactDecimal(b []byte) (float64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	var mant uint64
	digits, frac := 0, -1
	for i, c := range b {
		switch {
		case isDigit(c):
			mant = mant*10 + uint64(c-'0')
			digits++
			if frac >= 0 {
				frac++
			}
		case c == '.' && frac < 0 && i > 0:
			frac = 0
		default:
			return 0, false
		}
	}
	if digits == 0 || digits > 15 || frac == 0 {
		return 0, false
	}
	v := float64(mant)
	if frac > 0 {
		v /= pow10[frac]
	}
	if neg {
		v = -v
	}
	return v, true
}

func (s *jscan) boolean() (bool, bool) {
	rest := s.b[s.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		s.i += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		s.i += 5
		return false, true
	}
	return false, false
}

// timestamp reads an RFC 3339 timestamp as protojson does: time.Parse with
// time.RFC3339Nano, seconds within years 1 to 9999, at most nine digits of
// fraction.
func (s *jscan) timestamp() (sink.Timestamp, bool) {
	raw, ok := s.str()
	if !ok {
		return sink.Timestamp{}, false
	}
	if ts, ok := utcTimestamp(raw); ok {
		return ts, true
	}
	str := unsafeString(raw)
	t, err := time.Parse(time.RFC3339Nano, str)
	if err != nil {
		return sink.Timestamp{}, false
	}
	secs := t.Unix()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds {
		return sink.Timestamp{}, false
	}
	if dot := strings.LastIndexByte(str, '.'); dot >= 0 {
		if zone := strings.LastIndexAny(str, "Z-+"); zone >= dot && zone-dot > 10 {
			return sink.Timestamp{}, false
		}
	}
	return sink.Timestamp{Seconds: secs, Nanos: int32(t.Nanosecond()), Set: true}, true
}

// utcTimestamp reads the one form producers write,
// YYYY-MM-DDTHH:MM:SS[.F{1,9}]Z, without time.Parse; false for any other
// text (the caller then asks time.Parse). It accepts what time.Parse
// accepts in that form, and reads it to the same instant.
func utcTimestamp(b []byte) (sink.Timestamp, bool) {
	const shortest = len("2006-01-02T15:04:05Z")
	if len(b) < shortest || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' || b[len(b)-1] != 'Z' {
		return sink.Timestamp{}, false
	}
	num := func(i, n int) (int, bool) {
		v := 0
		for _, c := range b[i : i+n] {
			if !isDigit(c) {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 2)
	day, ok3 := num(8, 2)
	hour, ok4 := num(11, 2)
	minute, ok5 := num(14, 2)
	sec, ok6 := num(17, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		month < 1 || month > 12 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return sink.Timestamp{}, false
	}
	var nanos int
	switch frac := b[19 : len(b)-1]; {
	case len(frac) == 0:
	case len(frac) < 2 || len(frac) > 10 || frac[0] != '.':
		return sink.Timestamp{}, false
	default:
		v, ok := num(20, len(frac)-1)
		if !ok {
			return sink.Timestamp{}, false
		}
		for range 10 - len(frac) {
			v *= 10
		}
		nanos = v
	}
	secs := time.Date(year, time.Month(month), day, hour, minute, sec, 0, time.UTC).Unix()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds {
		return sink.Timestamp{}, false
	}
	return sink.Timestamp{Seconds: secs, Nanos: int32(nanos), Set: true}, true
}

// daysIn is the number of days of month in year (proleptic Gregorian).
func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// The setters read the value at the scanner into dst, as protojson reads
// it for a field of that type; false for a form left to protojson.

func (s *jscan) setStr(d *RowDecoder, dst *string, intern bool) bool {
	v, ok := s.str()
	*dst = d.keep(v, intern)
	return ok
}

func (s *jscan) setU32(dst *uint32) bool {
	v, ok := s.uintValue(10)
	*dst = uint32(v)
	return ok && v <= math.MaxUint32
}

func (s *jscan) setU64(dst *uint64) bool {
	var ok bool
	*dst, ok = s.uintValue(19)
	return ok
}

func (s *jscan) setF64(dst *float64) bool {
	var ok bool
	*dst, ok = s.float()
	return ok
}

func (s *jscan) setOptInt(dst *sink.OptInt) bool {
	v, ok := s.uintValue(18)
	*dst = sink.OptInt{V: int64(v), Set: true}
	return ok
}

func (s *jscan) setOptFloat(dst *sink.OptFloat) bool {
	v, ok := s.float()
	*dst = sink.OptFloat{V: v, Set: true}
	return ok
}

// object reads a JSON object, calling field for each member with the scanner
// at the value; it refuses a field number seen before (protojson refuses
// duplicates, in either name form) and anything after the object.
func (s *jscan) object(keys *keyOrder, field func(num int32) bool) bool {
	var seen uint64
	if !s.expect('{') {
		return false
	}
	if s.peek() == '}' {
		s.i++
	} else {
		var prev int32
		for {
			key, ok := s.str()
			if !ok {
				return false
			}
			num, ok := keys.lookup(prev, key)
			prev = num
			if !ok || num >= 64 || seen&(1<<num) != 0 {
				return false
			}
			seen |= 1 << num
			if !s.expect(':') || !field(num) {
				return false
			}
			s.ws()
			c := s.peek()
			s.i++
			if c == '}' {
				break
			}
			if c != ',' {
				return false
			}
			s.ws()
		}
	}
	s.ws()
	return s.i == len(s.b)
}

// keyOrder finds the field number of a member by its name. Producers
// write the members of their records in one order, so it first compares
// the name with the one that followed the previous member last time, and
// hashes for the map only when they differ.
type keyOrder struct {
	names map[string]orderedKey // both JSON names of each field
	// next is, by the field number of a member (0: the start of the
	// object), the member that followed it last time.
	next [64]orderedKey
}

type orderedKey struct {
	name string
	num  int32
}

func newKeyOrder(numbers map[string]int32) keyOrder {
	o := keyOrder{names: make(map[string]orderedKey, len(numbers))}
	for name, num := range numbers {
		o.names[name] = orderedKey{name: name, num: num}
	}
	return o
}

// lookup returns the field number of key, the member after the one of
// field number prev (0 for the first member).
func (o *keyOrder) lookup(prev int32, key []byte) (int32, bool) {
	if uint32(prev) >= uint32(len(o.next)) {
		e, ok := o.names[string(key)]
		return e.num, ok
	}
	if e := o.next[prev]; len(e.name) == len(key) && e.name == string(key) {
		return e.num, true
	}
	e, ok := o.names[string(key)]
	if ok {
		o.next[prev] = e
	}
	return e.num, ok
}

// maxFastLabels bounds the labels the fast path reads (each is checked for
// a duplicate against those before it); more go to protojson, and
// validation refuses them anyway.
const maxFastLabels = 64

func (d *RowDecoder) jsonEvent(r *sink.EventRow, b []byte) bool {
	s := jscan{b: b}
	return s.object(&d.eventKeys, func(num int32) bool {
		var ok bool
		str := func(dst *string, intern bool) bool { return s.setStr(d, dst, intern) }
		switch num {
		case 1:
			return str(&r.EventID, false)
		case 2:
			return str(&r.RequestID, false)
		case 3:
			return str(&r.TenantID, true)
		case 4:
			return str(&r.Model, true)
		case 5:
			return str(&r.ModelVersion, true)
		case 6:
			return str(&r.Deployment, true)
		case 7:
			return str(&r.Engine, true)
		case 8:
			return str(&r.GPUType, true)
		case 9:
			return s.setU32(&r.TensorParallelism)
		case 10:
			return str(&r.Node, true)
		case 11:
			return str(&r.Region, true)
		case 12:
			r.ReceivedAt, ok = s.timestamp()
			return ok
		case 13:
			r.CompletedAt, ok = s.timestamp()
			return ok
		case 14:
			return s.setOptInt(&r.PromptTokens)
		case 15:
			return s.setOptInt(&r.CachedPromptTokens)
		case 16:
			return s.setOptInt(&r.OutputTokens)
		case 17:
			return s.setOptFloat(&r.TTFTMs)
		case 18:
			return s.setOptFloat(&r.E2EMs)
		case 19:
			return s.setOptFloat(&r.QueueMs)
		case 20:
			return s.setOptFloat(&r.PrefillMs)
		case 21:
			return s.setOptFloat(&r.ITLMs)
		case 22:
			if s.peek() == '"' {
				v, ok := s.str()
				if !ok {
					return false
				}
				r.Status, ok = meterv1.Status_value[string(v)]
				return ok
			}
			v, ok := s.uintValue(10)
			r.Status = int32(v)
			return ok && v <= math.MaxInt32
		case 23:
			r.Streaming, ok = s.boolean()
			return ok
		case 24:
			return str(&r.SLOClass, true)
		case 25:
			return d.jsonLabels(r, &s)
		}
		return false
	})
}

// jsonLabels reads the labels object; a repeated key falls back (protojson
// refuses it).
func (d *RowDecoder) jsonLabels(r *sink.EventRow, s *jscan) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		k, ok := s.str()
		if !ok || !s.expect(':') {
			return false
		}
		v, ok := s.str()
		if !ok || len(r.Labels) >= maxFastLabels {
			return false
		}
		for _, l := range r.Labels {
			if l.Key == string(k) {
				return false
			}
		}
		r.Labels = append(r.Labels, sink.Label{Key: d.strs.get(k), Value: d.strs.get(v)})
		s.ws()
		c := s.peek()
		s.i++
		if c == '}' {
			return true
		}
		if c != ',' {
			return false
		}
		s.ws()
	}
}

func (d *RowDecoder) jsonGPU(r *sink.GPURow, b []byte) bool {
	s := jscan{b: b}
	return s.object(&d.gpuKeys, func(num int32) bool {
		var ok bool
		str := func(dst *string, intern bool) bool { return s.setStr(d, dst, intern) }
		switch num {
		case 1:
			return str(&r.SampleID, false)
		case 2:
			return str(&r.Node, true)
		case 3:
			return str(&r.GPUUUID, true)
		case 4:
			return s.setU32(&r.GPUIndex)
		case 5:
			return str(&r.GPUType, true)
		case 6:
			return str(&r.MIGProfile, true)
		case 7:
			return s.setU32(&r.MIGInstanceID)
		case 8:
			return s.setF64(&r.MIGFraction)
		case 9:
			return str(&r.Deployment, true)
		case 10:
			return str(&r.Pod, true)
		case 11:
			return str(&r.Namespace, true)
		case 12:
			return str(&r.Region, true)
		case 13:
			return str(&r.Pool, true)
		case 14:
			r.SampledAt, ok = s.timestamp()
			return ok
		case 15:
			return s.setF64(&r.IntervalS)
		case 16:
			return s.setF64(&r.Utilization)
		case 17:
			return s.setU64(&r.FBUsedBytes)
		case 18:
			return s.setU64(&r.FBTotalBytes)
		case 19:
			return s.setF64(&r.PowerWatts)
		case 20:
			return s.setF64(&r.EnergyJoules)
		case 21:
			return s.setF64(&r.TemperatureC)
		case 22:
			return s.setF64(&r.SMClockMHz)
		case 23:
			return str(&r.Source, true)
		case 24:
			return s.setOptFloat(&r.SMActive)
		case 25:
			return s.setF64(&r.SMClockMaxMHz)
		}
		return false
	})
}
