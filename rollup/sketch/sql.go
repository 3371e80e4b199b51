package sketch

import (
	"fmt"
	"strconv"
)

// SQLKey returns a ClickHouse expression of type Int16 that computes Key of
// the Float64 expression x (milliseconds, not Nullable), portable from
// ClickHouse 18.16 on. x appears in it more than once, so it should be a
// column or a cheap expression.
//
// It divides by ln γ written as the float64 literal of the number Key
// divides by, so that the two agree whatever ClickHouse's log(1.01 / 0.99)
// rounds to. They then agree for every value as long as ClickHouse's log
// rounds as Go's math.Log does: TestClickHouse checks 100k values on
// ClickHouse 18.16, every bucket bound and its float64 neighbours included.
// A log rounding differently by one ulp could only move a value lying
// within an ulp of a bound to the adjacent bucket, still within α of it.
//
// NaN is tested for explicitly, because greatest(nan, c) is c but
// greatest(c, nan) is nan in ClickHouse.
func SQLKey(x string) string {
	return fmt.Sprintf("toInt16(ceil(log(least(greatest(if(isNaN(%[1]s), 0, %[1]s), %[2]s), %[3]s)) / %[4]s))",
		x, sqlFloat(MinValue), sqlFloat(MaxValue), sqlFloat(lnGamma))
}

// SQLHistogram returns a ClickHouse aggregate expression that builds the
// histogram of the expression x (milliseconds, Float64 or Nullable(Float64))
// over the rows of a group: a Tuple(Array(Int16), Array(UInt64)) of keys and
// counts, sorted by key, in which NULL values do not count. Split it as
//
//	(<SQLHistogram(x)> AS h).1 AS keys, h.2 AS counts
//
// It works from ClickHouse 18.16 on (sumMap with the If combinator).
func SQLHistogram(x string) string {
	return fmt.Sprintf("sumMapIf([%s], [toUInt64(1)], isNotNull(%s))", SQLKey("ifNull("+x+", 0)"), x)
}

// SQLMerge returns a ClickHouse aggregate expression that merges the stored
// histograms of the array columns keys and counts exactly, as
// Histogram.Merge does: a Tuple(Array(Int16), Array(UInt64)), split as
// SQLHistogram's is.
func SQLMerge(keys, counts string) string {
	return fmt.Sprintf("sumMap(%s, %s)", keys, counts)
}

// sqlFloat writes v as a ClickHouse literal that parses to the same float64.
func sqlFloat(v float64) string {
	return strconv.FormatFloat(v, 'g', -1, 64)
}
