package chstore

import (
	"fmt"
	"math"
	"strconv"

	"tokenmeter/rollup/sketch"
)

// The ClickHouse SQL of the latency histograms of package sketch: the same
// keys as sketch.Key, histograms shaped as sketch.Histogram (keys
// Array(Int16) and counts Array(UInt64), sorted by key, without zero
// counts), and their exact merge.

// lnGamma is ln γ as sketch.Key divides by it (math.Log of sketch.Gamma);
// TestHistogramSQLOnClickHouse checks that ClickHouse's log(1.01 / 0.99)
// is the same float64.
var lnGamma = math.Log(sketch.Gamma)

// histogramKeySQL returns a ClickHouse expression of type Int16 that
// computes sketch.Key of the Float64 expression x (milliseconds, not
// Nullable), portable from ClickHouse 18.16 on. x appears in it more than
// once, so it should be a column or a cheap expression.
//
// It divides by ln γ written as the float64 literal of the number Key
// divides by, so that the two agree whatever ClickHouse's log(1.01 / 0.99)
// rounds to. They then agree for every value as long as ClickHouse's log
// rounds as Go's math.Log does: TestHistogramSQLOnClickHouse checks 100k
// values on ClickHouse 18.16, every bucket bound and its float64
// neighbours included. A log rounding differently by one ulp could only
// move a value lying within an ulp of a bound to the adjacent bucket,
// still within α of it.
//
// NaN is tested for explicitly, because greatest(nan, c) is c but
// greatest(c, nan) is nan in ClickHouse.
func histogramKeySQL(x string) string {
	return fmt.Sprintf("toInt16(ceil(log(least(greatest(if(isNaN(%[1]s), 0, %[1]s), %[2]s), %[3]s)) / %[4]s))",
		x, sqlFloat(sketch.MinValue), sqlFloat(sketch.MaxValue), sqlFloat(lnGamma))
}

// histogramSQL returns a ClickHouse aggregate expression that builds the
// histogram of the expression x (milliseconds, Float64 or Nullable(Float64))
// over the rows of a group: a Tuple(Array(Int16), Array(UInt64)) of keys and
// counts, sorted by key, in which NULL values do not count. Split it as
//
//	(<histogramSQL(x)> AS h).1 AS keys, h.2 AS counts
//
// It works from ClickHouse 18.16 on (sumMap with the If combinator).
func histogramSQL(x string) string {
	return fmt.Sprintf("sumMapIf([%s], [toUInt64(1)], isNotNull(%s))", histogramKeySQL("ifNull("+x+", 0)"), x)
}

// histogramMergeSQL returns a ClickHouse aggregate expression that merges
// the stored histograms of the array columns keys and counts exactly, as
// sketch.Histogram.Merge does: a Tuple(Array(Int16), Array(UInt64)), split
// as histogramSQL's is.
func histogramMergeSQL(keys, counts string) string {
	return fmt.Sprintf("sumMap(%s, %s)", keys, counts)
}

// sqlFloat writes v as a ClickHouse literal that parses to the same float64.
func sqlFloat(v float64) string {
	return strconv.FormatFloat(v, 'g', -1, 64)
}
